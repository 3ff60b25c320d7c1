"""Harness for the llm-server integration tests (Python 3 standard library only).

- ServerProcess starts the real binary on 127.0.0.1 with --port 0, reads the
  port from the `listening on http://HOST:PORT` line on stderr, keeps draining
  stdout and stderr in threads (the pipes never block; the log is kept for
  failure messages), waits for GET /health 200, and stops it with SIGTERM
  expecting exit code 0 within a timeout (else SIGKILL and a failure).
- A small HTTP/1.1 client over raw sockets (Conn) so that tests control
  keep-alive, abrupt disconnects, slow senders, chunked and SSE bodies, and
  every read has a deadline.
"""
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

LISTEN_RE = re.compile(r"listening on http://([0-9A-Za-z.\-\[\]:]+):(\d+)")

_live_processes = []          # every server Popen not yet reaped
_live_lock = threading.Lock()

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _prctl = _libc.prctl
except (OSError, AttributeError):  # pragma: no cover - non-Linux
    _prctl = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    # Runs in the child between fork and exec: if the test runner dies (even
    # by SIGKILL, e.g. a ctest timeout), the kernel kills the server too.
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def kill_all_servers():
    """Last-resort cleanup (atexit / signal handlers): SIGKILL every server still alive."""
    with _live_lock:
        procs = list(_live_processes)
        _live_processes.clear()
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class HarnessError(AssertionError):
    pass


# ---------------------------------------------------------------------------
# HTTP client
# ---------------------------------------------------------------------------

class Response:
    def __init__(self, status, reason, headers, body=b""):
        self.status = status
        self.reason = reason
        self.headers = headers        # list of (lower-case name, value)
        self.body = body

    def header(self, name, default=None):
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return default

    def header_all(self, name):
        name = name.lower()
        return [v for k, v in self.headers if k == name]

    @property
    def text(self):
        return self.body.decode("utf-8", errors="replace")

    def json(self):
        try:
            return json.loads(self.body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise AssertionError("response body is not JSON (%s): %s" % (e, self.describe())) from None

    def describe(self, limit=2000):
        hdrs = "".join("\n    %s: %s" % (k, v) for k, v in self.headers)
        body = self.body[:limit].decode("utf-8", errors="replace")
        more = "" if len(self.body) <= limit else " ...(%d bytes)" % len(self.body)
        return "HTTP %s %s%s\n  body: %s%s" % (self.status, self.reason, hdrs, body, more)


class Conn:
    """One HTTP/1.1 connection over a plain socket. Reads honour a deadline."""

    def __init__(self, host, port, timeout=30.0):
        self.host, self.port = host, port
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.eof = False
        self._body_state = None

    # -- low level ---------------------------------------------------------
    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def abort(self):
        """Close abruptly (RST) as a killed client would."""
        if self.sock is not None:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            except OSError:
                pass
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def local_port(self):
        return self.sock.getsockname()[1]

    def send_raw(self, data):
        self.sock.sendall(data)

    def _fill(self, deadline):
        if self.eof:
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("deadline passed while reading from the server")
        self.sock.settimeout(min(remaining, self.timeout))
        data = self.sock.recv(65536)
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def _read_until(self, sep, deadline, limit=1 << 20):
        while sep not in self.buf:
            if len(self.buf) > limit:
                raise HarnessError("no %r within %d bytes" % (sep, limit))
            if not self._fill(deadline):
                raise EOFError("connection closed by the server (got %r)" % self.buf[:200])
        i = self.buf.index(sep) + len(sep)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def _read_exact(self, n, deadline):
        while len(self.buf) < n:
            if not self._fill(deadline):
                raise EOFError("connection closed by the server after %d of %d body bytes" % (len(self.buf), n))
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    # -- requests ------------------------------------------------------------
    def send_request(self, method, path, body=None, headers=None, content_type="application/json"):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode("utf-8")
        elif isinstance(body, str):
            body = body.encode("utf-8")
        lines = ["%s %s HTTP/1.1" % (method, path), "Host: %s:%d" % (self.host, self.port)]
        hdrs = dict(headers or {})
        names = {k.lower() for k in hdrs}
        if body is not None:
            if "content-type" not in names and content_type:
                hdrs["Content-Type"] = content_type
            if "content-length" not in names:
                hdrs["Content-Length"] = str(len(body))
        for k, v in hdrs.items():
            lines.append("%s: %s" % (k, v))
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        self.sock.sendall(data)
        self._method = method

    def read_head(self, timeout=None):
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            head = self._read_until(b"\r\n\r\n", deadline, limit=64 * 1024).decode("latin-1")
            lines = head.split("\r\n")
            m = re.match(r"HTTP/1\.[01] (\d{3}) ?(.*)", lines[0])
            if not m:
                raise HarnessError("bad status line %r" % lines[0])
            status = int(m.group(1))
            headers = []
            for ln in lines[1:]:
                if not ln:
                    continue
                k, _, v = ln.partition(":")
                headers.append((k.strip().lower(), v.strip()))
            if 100 <= status < 200:
                continue  # interim response
            resp = Response(status, m.group(2), headers)
            te = (resp.header("transfer-encoding") or "").lower()
            if self._method == "HEAD" or status in (204, 304):
                self._body_state = ("none",)
            elif "chunked" in te:
                self._body_state = ("chunked", 0)
            elif resp.header("content-length") is not None:
                self._body_state = ("length", int(resp.header("content-length")))
            else:
                self._body_state = ("eof",)
            return resp

    def read_body_piece(self, timeout=None):
        """Next piece of the body (decoded from chunked), b"" once the body ended."""
        deadline = time.monotonic() + (timeout or self.timeout)
        st = self._body_state
        if st is None or st[0] == "none":
            return b""
        if st[0] == "length":
            if st[1] == 0:
                self._body_state = ("none",)
                return b""
            if not self.buf:
                if not self._fill(deadline):
                    raise EOFError("connection closed with %d body bytes missing" % st[1])
            piece = self.buf[:st[1]]
            self.buf = self.buf[len(piece):]
            self._body_state = ("length", st[1] - len(piece))
            return piece
        if st[0] == "eof":
            if not self.buf and not self._fill(deadline):
                self._body_state = ("none",)
                return b""
            piece, self.buf = self.buf, b""
            return piece
        # chunked
        size_line = self._read_until(b"\r\n", deadline).decode("latin-1").strip()
        size = int(size_line.split(";")[0], 16)
        if size == 0:
            # trailers until an empty line
            while self._read_until(b"\r\n", deadline) != b"\r\n":
                pass
            self._body_state = ("none",)
            return b""
        piece = self._read_exact(size, deadline)
        if self._read_exact(2, deadline) != b"\r\n":
            raise HarnessError("chunk not followed by CRLF")
        return piece

    def read_body(self, timeout=None):
        deadline = time.monotonic() + (timeout or self.timeout)
        out = []
        while True:
            piece = self.read_body_piece(timeout=max(0.001, deadline - time.monotonic()))
            if not piece:
                return b"".join(out)
            out.append(piece)

    def request(self, method, path, body=None, headers=None, timeout=None, content_type="application/json"):
        self.send_request(method, path, body, headers, content_type)
        resp = self.read_head(timeout)
        resp.body = self.read_body(timeout)
        return resp


class SSEStream:
    """Reads `data:` events from a streaming response; `: comment` lines are skipped."""

    def __init__(self, conn, resp):
        self.conn, self.resp = conn, resp
        self.pending = b""
        self.ended = False
        self.comments = 0
        self.raw = []           # every event's data, for failure messages

    def next_event(self, timeout=30.0):
        """The next event's data string, or None once the body ended."""
        deadline = time.monotonic() + timeout
        while True:
            norm = self.pending.replace(b"\r\n", b"\n")
            if b"\n\n" in norm:
                block, _, rest = norm.partition(b"\n\n")
                self.pending = rest
                data = []
                for line in block.decode("utf-8").split("\n"):
                    if line.startswith(":"):
                        self.comments += 1
                    elif line.startswith("data:"):
                        v = line[5:]
                        data.append(v[1:] if v.startswith(" ") else v)
                if data:
                    ev = "\n".join(data)
                    self.raw.append(ev)
                    return ev
                continue
            if self.ended:
                if norm.strip():
                    raise HarnessError("stream ended inside an event: %r" % norm[:300])
                return None
            piece = self.conn.read_body_piece(timeout=max(0.001, deadline - time.monotonic()))
            if not piece:
                self.ended = True
            self.pending += piece

    def read_all(self, timeout=60.0):
        deadline = time.monotonic() + timeout
        events = []
        while True:
            ev = self.next_event(timeout=max(0.001, deadline - time.monotonic()))
            if ev is None:
                return events
            events.append(ev)


# ---------------------------------------------------------------------------
# Server process
# ---------------------------------------------------------------------------

class ServerProcess:
    def __init__(self, binary, model, args=(), name="server", env_remove=("LLM_API_KEY",), env_extra=None):
        self.binary = binary
        self.model = model
        self.args = list(args)
        self.name = name
        self.env_remove = env_remove
        self.env_extra = env_extra or {}
        self.proc = None
        self.host = None
        self.port = None
        self._lines = []
        self._lines_lock = threading.Lock()
        self._listening = threading.Event()
        self._threads = []

    # -- logs --------------------------------------------------------------
    def _drain(self, pipe, tag):
        try:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                with self._lines_lock:
                    self._lines.append("[%s] %s" % (tag, line))
                if tag == "stderr" and not self._listening.is_set():
                    m = LISTEN_RE.search(line)
                    if m:
                        self.host, self.port = m.group(1).strip("[]"), int(m.group(2))
                        self._listening.set()
        except (OSError, ValueError):
            pass
        finally:
            try:
                pipe.close()
            except OSError:
                pass

    def log(self, tail=60):
        with self._lines_lock:
            lines = list(self._lines)
        if tail and len(lines) > tail:
            lines = ["... (%d earlier lines)" % (len(lines) - tail)] + lines[-tail:]
        return "\n".join(lines)

    def log_lines(self):
        with self._lines_lock:
            return list(self._lines)

    def describe(self):
        return "%s (%s) pid %s\n--- server log ---\n%s\n--- end of log ---" % (
            self.name, " ".join(self.command()), self.proc.pid if self.proc else "-", self.log())

    def command(self):
        return [self.binary, "--model", self.model, "--host", "127.0.0.1", "--port", "0"] + self.args

    # -- life cycle ----------------------------------------------------------
    def start(self, ready_timeout=60.0):
        env = dict(os.environ)
        for k in self.env_remove:
            env.pop(k, None)
        env.update(self.env_extra)
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, preexec_fn=_die_with_parent)
        with _live_lock:
            _live_processes.append(self.proc)
        for pipe, tag in ((self.proc.stderr, "stderr"), (self.proc.stdout, "stdout")):
            t = threading.Thread(target=self._drain, args=(pipe, tag), daemon=True)
            t.start()
            self._threads.append(t)
        deadline = time.monotonic() + ready_timeout
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None:
                self._join_drains()
                raise HarnessError("server exited with code %s before logging 'listening on http://HOST:PORT'\n%s"
                                   % (self.proc.returncode, self.describe()))
            if time.monotonic() > deadline:
                self.kill()
                raise HarnessError("no 'listening on http://HOST:PORT' line on stderr within %.0f s\n%s"
                                   % (ready_timeout, self.describe()))
        last = None
        while True:
            if self.proc.poll() is not None:
                self._join_drains()
                raise HarnessError("server exited with code %s while loading\n%s" % (self.proc.returncode, self.describe()))
            try:
                r = self.get("/health", timeout=5)
                last = r
                if r.status == 200:
                    return self
                if r.status != 503:
                    self.kill()
                    raise HarnessError("GET /health answered %s while loading (expected 503 then 200): %s\n%s"
                                       % (r.status, r.describe(), self.describe()))
            except (OSError, EOFError) as e:
                last = e
            if time.monotonic() > deadline:
                self.kill()
                raise HarnessError("GET /health not 200 within %.0f s (last: %s)\n%s" % (
                    ready_timeout, last.describe() if isinstance(last, Response) else last, self.describe()))
            time.sleep(0.05)

    def _join_drains(self, timeout=5.0):
        for t in self._threads:
            t.join(timeout)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._forget()
        self._join_drains(2.0)

    def _forget(self):
        with _live_lock:
            if self.proc in _live_processes:
                _live_processes.remove(self.proc)

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        """Exit code, or None if still running after `timeout` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout=15.0):
        """SIGTERM; the server must exit with code 0 within `timeout` s, else it is killed and this fails."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.wait_exit(timeout)
        if code is None:
            self.kill()
            raise HarnessError("server did not exit within %.0f s of SIGTERM (killed)\n%s" % (timeout, self.describe()))
        self._forget()
        self._join_drains()
        if code != 0:
            raise HarnessError("server exited with code %s after SIGTERM (expected 0)\n%s" % (code, self.describe()))

    # -- requests ------------------------------------------------------------
    def connect(self, timeout=30.0):
        return Conn(self.host, self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=30.0, content_type="application/json"):
        with self.connect(timeout) as c:
            return c.request(method, path, body, headers, timeout=timeout, content_type=content_type)

    def get(self, path, headers=None, timeout=30.0):
        return self.request("GET", path, None, headers, timeout)

    def post(self, path, body, headers=None, timeout=30.0):
        return self.request("POST", path, body, headers, timeout)

    def open_stream(self, path, body, headers=None, timeout=30.0):
        """Sends a request and reads the response head; returns (conn, resp, SSEStream). Caller closes conn."""
        c = self.connect(timeout)
        try:
            c.send_request("POST", path, body, headers)
            resp = c.read_head(timeout)
        except BaseException:
            c.close()
            raise
        return c, resp, SSEStream(c, resp)

    def stream(self, path, body, headers=None, timeout=60.0):
        """Whole streaming exchange: (resp, [event data strings])."""
        c, resp, sse = self.open_stream(path, body, headers, timeout)
        with c:
            if resp.status != 200:
                resp.body = c.read_body(timeout)
                return resp, None
            return resp, sse.read_all(timeout)


# ---------------------------------------------------------------------------
# Prometheus text
# ---------------------------------------------------------------------------

_SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$')
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_prometheus(text):
    """[(name, {label: value}, float)] of every sample; raises on a malformed line."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            raise AssertionError("malformed Prometheus sample line: %r" % line)
        labels = dict(_LABEL_RE.findall(m.group(3) or ""))
        v = m.group(4)
        value = float("inf") if v == "+Inf" else float("-inf") if v == "-Inf" else float(v)
        out.append((m.group(1), labels, value))
    return out


def metric_sum(samples, name, **label_filters):
    """Sum of the samples called `name` whose labels match (a callable filter or an exact value)."""
    total, found = 0.0, False
    for n, labels, v in samples:
        if n != name:
            continue
        ok = True
        for k, want in label_filters.items():
            have = labels.get(k)
            if callable(want):
                ok = ok and have is not None and want(have)
            else:
                ok = ok and have == want
        if ok:
            total += v
            found = True
    return total if found else None
