// The HTTP/1.1 layer under strata serve: cpp-httplib parses requests and routes them, and this
// subclass owns each connection's loop so that a request has a deadline for arriving. httplib
// alone bounds each read (a client that sends one byte a second never trips it, and holds one of
// the server's threads for as long as it likes); here the request line, headers and body must all
// arrive within `request_read_timeout` of the request's first byte, else the client gets a 408
// (or, inside the request line, a closed connection). A new connection's first request may take
// the same time to begin; an idle keep-alive connection is closed after the keep-alive timeout,
// and a write waits at most the write timeout.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include <httplib.h>

namespace strata::server {

class HttpServer : public httplib::Server {
 public:
  explicit HttpServer(std::chrono::milliseconds request_read_timeout)
      : request_read_timeout_(request_read_timeout) {}

  // Lengthens the bound socket's queue of connections not yet accepted to the system's maximum.
  // httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed when the library was
  // built): a burst of more new connections while the accepting thread waits for a core (a loaded
  // machine) has the rest dropped by the kernel and retried a second or more later. False when
  // listen() fails.
  bool deepen_backlog();

  // Runs `bytes` as one connection's input through the same parsing, limits, handlers and routes a
  // socket gets (fuzzing and tests); returns everything the server wrote back.
  std::string serve_bytes(std::string_view bytes);

  // True while this thread serves a request that ran out of time to arrive: the error handler
  // answers 408 instead of httplib's 400.
  static bool request_timed_out();
  // False once the client of the request this thread serves has closed its connection (true
  // outside a connection, as under serve_bytes).
  static bool client_connected();

 private:
  bool process_and_close_socket(socket_t sock) override;
  // Waits until the client sends the next request's first byte: false when `wait` passes first,
  // the client closes, or the server stops.
  bool await_request(socket_t sock, std::chrono::steady_clock::duration wait) const;

  std::chrono::milliseconds request_read_timeout_;
};

}  // namespace strata::server
