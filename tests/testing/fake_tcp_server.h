// A TCP server on 127.0.0.1 whose behaviour a test scripts byte by byte: it accepts connections
// one after another and runs `handler(fd)` for each on its own thread. For cases a real server
// will not produce on demand (a reply that stops half-way, a peer that reads slowly).
#ifndef KVTIER_TESTS_TESTING_FAKE_TCP_SERVER_H_
#define KVTIER_TESTS_TESTING_FAKE_TCP_SERVER_H_

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace kvtier::testing {

class FakeTcpServer {
 public:
  // `receive_buffer` > 0 sets SO_RCVBUF on the listening socket (inherited by accepted ones), so
  // a slow reader pushes back on the client within a few KiB instead of megabytes.
  explicit FakeTcpServer(std::function<void(int fd)> handler, int receive_buffer = 0)
      : handler_(std::move(handler)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (receive_buffer > 0) {
      setsockopt(listen_fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_fd_, 8) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      close(listen_fd_);
      listen_fd_ = -1;
      return;
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~FakeTcpServer() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
    if (listen_fd_ >= 0) close(listen_fd_);
  }
  FakeTcpServer(const FakeTcpServer&) = delete;
  FakeTcpServer& operator=(const FakeTcpServer&) = delete;

  bool ok() const { return listen_fd_ >= 0; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

  // Reads until `text` has been seen `times` times in what arrived since the call (or the peer
  // closes). Returns everything read.
  static std::string ReadUntil(int fd, const std::string& text, int times = 1) {
    std::string got;
    char buf[65536];
    int seen = 0;
    size_t scanned = 0;
    while (seen < times) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
      for (size_t at; (at = got.find(text, scanned)) != std::string::npos;) {
        ++seen;
        scanned = at + text.size();
      }
    }
    return got;
  }
  static bool WriteAll(int fd, const std::string& data) {
    for (size_t done = 0; done < data.size();) {
      const ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

 private:
  void Run() {
    // One connection at a time; the handler owns it until it returns.
    while (!stopping_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      handler_(fd);
      close(fd);
    }
  }

  std::function<void(int fd)> handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_FAKE_TCP_SERVER_H_
