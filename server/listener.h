#pragma once
// Accepts connections and starts a Session for each, on its own strand.
#include <boost/asio/ip/tcp.hpp>

#include <memory>

#include "server/app_state.h"

namespace llm::server {

class Router;

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  // Binds and listens; throws boost::system::system_error naming the address.
  Listener(boost::asio::io_context& ioc, const boost::asio::ip::tcp::endpoint& endpoint,
           std::shared_ptr<AppState> state, const Router& router);
  void start();
  void stop();  // closes the acceptor; open sessions continue
  boost::asio::ip::tcp::endpoint local_endpoint() const { return acceptor_.local_endpoint(); }

 private:
  void do_accept();
  boost::asio::io_context& ioc_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::shared_ptr<AppState> state_;
  const Router& router_;
};

}  // namespace llm::server
