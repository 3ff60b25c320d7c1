#include "server/listener.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/strand.hpp>
#include <spdlog/spdlog.h>

#include "server/session.h"

namespace llm::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;

Listener::Listener(net::io_context& ioc, const tcp::endpoint& endpoint, std::shared_ptr<AppState> state,
                   const Router& router)
    : ioc_(ioc), acceptor_(net::make_strand(ioc)), state_(std::move(state)), router_(router) {
  acceptor_.open(endpoint.protocol());
  acceptor_.set_option(net::socket_base::reuse_address(true));
  acceptor_.bind(endpoint);
  acceptor_.listen(net::socket_base::max_listen_connections);
}

void Listener::start() {
  net::dispatch(acceptor_.get_executor(), [self = shared_from_this()] { self->do_accept(); });
}

void Listener::stop() {
  net::dispatch(acceptor_.get_executor(), [self = shared_from_this()] {
    boost::system::error_code ignored;
    self->acceptor_.close(ignored);
  });
}

void Listener::do_accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [self = shared_from_this()](boost::system::error_code ec,
                                                                             tcp::socket socket) {
    if (ec == net::error::operation_aborted || !self->acceptor_.is_open()) return;
    if (ec) {
      spdlog::warn("accept: {}", ec.message());  // e.g. out of file descriptors: keep serving the others
    } else {
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);  // tokens go out as they are written
      std::make_shared<Session>(std::move(socket), self->state_, self->router_)->start();
    }
    self->do_accept();
  });
}

}  // namespace llm::server
