#include "server/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace strata::server {

namespace {

using Clock = std::chrono::steady_clock;

// Waits until `sock` has one of `events` (or an error or hang-up, which the next recv/send
// reports); false when `until` passes first.
bool wait_for(socket_t sock, short events, Clock::time_point until) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{sock, events, 0};
    const int rc = ::poll(&p, 1, int(std::min<int64_t>(left, 60'000)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
  }
}

std::string address_text(const sockaddr_storage& a, int& port) {
  char text[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    ::inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text);
    port = ntohs(v4.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    ::inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text);
    port = ntohs(v6.sin6_port);
  }
  return text;
}

// One client connection. A read waits at most the read timeout and never past the current
// request's deadline; a write waits at most the write timeout.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(socket_t sock, Clock::duration read_timeout, Clock::duration write_timeout)
      : sock_(sock), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

  void start_request(Clock::time_point deadline) {
    deadline_ = deadline;
    timed_out_ = false;
  }
  bool timed_out() const { return timed_out_; }
  // False once the client has closed its end (a streamed response then stops early).
  bool peer_open() const {
    pollfd p{sock_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return true;
    char byte;
    const ssize_t n = ::recv(sock_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
  }

  // Bytes received but not read yet (the start of a pipelined request).
  bool buffered() const { return begin_ < end_; }

  bool is_readable() const override { return buffered() || wait_for(sock_, POLLIN, read_until()); }
  bool is_writable() const override {
    return wait_for(sock_, POLLOUT, Clock::now() + write_timeout_) && peer_open();
  }
  // httplib reads the request line and headers a byte at a time: they come from a buffer.
  ssize_t read(char* ptr, size_t size) override {
    if (!buffered()) {
      if (!wait_for(sock_, POLLIN, read_until())) {
        timed_out_ = Clock::now() >= deadline_;
        return -1;
      }
      ssize_t got;
      do got = ::recv(sock_, buffer_, sizeof buffer_, 0);
      while (got < 0 && errno == EINTR);
      if (got <= 0) return got;
      begin_ = 0;
      end_ = size_t(got);
    }
    const size_t n = std::min(size, end_ - begin_);
    std::memcpy(ptr, buffer_ + begin_, n);
    begin_ += n;
    return ssize_t(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!wait_for(sock_, POLLOUT, Clock::now() + write_timeout_)) return -1;
    ssize_t put;
    do put = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    while (put < 0 && errno == EINTR);
    return put;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&a), &len) == 0) ip = address_text(a, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &len) == 0) ip = address_text(a, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  Clock::time_point read_until() const { return std::min(deadline_, Clock::now() + read_timeout_); }

  socket_t sock_;
  Clock::duration read_timeout_, write_timeout_;
  Clock::time_point deadline_ = Clock::time_point::max();
  bool timed_out_ = false;
  char buffer_[4096];
  size_t begin_ = 0, end_ = 0;
};

// A connection's input from memory; what the server writes is collected.
class MemoryStream final : public httplib::Stream {
 public:
  explicit MemoryStream(std::string_view input) : input_(input) {}
  bool is_readable() const override { return pos_ < input_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, input_.size() - pos_);
    std::memcpy(ptr, input_.data() + pos_, n);
    pos_ += n;
    return ssize_t(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    output_.append(ptr, size);
    return ssize_t(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  socket_t socket() const override { return INVALID_SOCKET; }

  bool exhausted() const { return pos_ >= input_.size(); }
  std::string& output() { return output_; }

 private:
  std::string_view input_;
  size_t pos_ = 0;
  std::string output_;
};

// The stream the current thread's request is read from (null for serve_bytes).
thread_local const ConnectionStream* t_connection = nullptr;

}  // namespace

bool HttpServer::request_timed_out() { return t_connection && t_connection->timed_out(); }

bool HttpServer::client_connected() { return !t_connection || t_connection->peer_open(); }

bool HttpServer::deepen_backlog() { return ::listen(svr_sock_, SOMAXCONN) == 0; }

bool HttpServer::await_request(socket_t sock, Clock::duration wait) const {
  const auto until = Clock::now() + wait;
  // In slices, so a stopping server lets idle connections go at once.
  while (svr_sock_ != INVALID_SOCKET) {
    const auto slice = std::min(until, Clock::now() + std::chrono::milliseconds(100));
    if (wait_for(sock, POLLIN, slice)) {
      char byte;
      ssize_t n;
      do n = ::recv(sock, &byte, 1, MSG_PEEK);
      while (n < 0 && errno == EINTR);
      return n > 0;
    }
    if (Clock::now() >= until) return false;
  }
  return false;
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  ConnectionStream stream(sock,
                          std::chrono::seconds(read_timeout_sec_) +
                              std::chrono::microseconds(read_timeout_usec_),
                          std::chrono::seconds(write_timeout_sec_) +
                              std::chrono::microseconds(write_timeout_usec_));
  t_connection = &stream;
  bool ok = true;
  // A connection the client has just opened carries a request on its way: its first byte may take
  // as long as a request may (a client on a loaded machine can take more than the keep-alive
  // second to write it, and closing then drops the request unanswered). Between requests, the
  // keep-alive timeout.
  Clock::duration wait = request_read_timeout_;
  for (size_t left = keep_alive_max_count_;
       left > 0 && (stream.buffered() || await_request(sock, wait)); --left) {
    wait = std::chrono::seconds(keep_alive_timeout_sec_);
    stream.start_request(Clock::now() + request_read_timeout_);
    bool closed = false;
    ok = process_request(stream, left == 1, closed, nullptr);
    if (!ok || closed) break;
  }
  t_connection = nullptr;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

std::string HttpServer::serve_bytes(std::string_view bytes) {
  MemoryStream stream(bytes);
  // A bound on pipelined requests, as a connection's keep-alive count is.
  for (size_t left = keep_alive_max_count_; left > 0 && !stream.exhausted(); --left) {
    bool closed = false;
    if (!process_request(stream, left == 1, closed, nullptr) || closed) break;
  }
  return std::move(stream.output());
}

}  // namespace strata::server
