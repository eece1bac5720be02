#pragma once
// RedisServer: a private redis-server for one test, on a free loopback port, with its files in
// a temp dir; killed (SIGKILL) when the object goes away or on kill(). SilentServer: a socket
// that accepts connections and never answers (a hung Redis), for the timeout tests.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "temp_dir.hpp"

namespace mlajit::testing {

inline std::string redis_server_path() {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    std::string p = (dir.empty() ? "." : dir) + "/redis-server";
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// A port the kernel considers free right now (bind to 0, read it back, release it).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("bind");
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline bool port_accepts(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

class RedisServer {
 public:
  explicit RedisServer(const std::string& extra_args = "") : dir_("redis") {
    for (int attempt = 0; attempt < 5 && pid_ <= 0; ++attempt) {
      port_ = free_port();
      pid_ = ::fork();
      if (pid_ == 0) {
        std::string port = std::to_string(port_);
        // No persistence, loopback only, no config file: a throwaway server.
        std::string cmd = redis_server_path() + " --port " + port + " --bind 127.0.0.1 --save '' --appendonly no" +
                          " --dir " + dir_.str() + " --logfile " + dir_.str() + "/redis.log " + extra_args;
        ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
      }
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!port_accepts(port_) && std::chrono::steady_clock::now() < deadline) {
        int st;
        if (::waitpid(pid_, &st, WNOHANG) == pid_) {  // died (port taken meanwhile?): try another
          pid_ = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    if (pid_ <= 0) throw std::runtime_error("could not start redis-server");
  }
  ~RedisServer() { kill(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }

 private:
  TempDir dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// Listens on a loopback port; the kernel completes every handshake (backlog), nobody ever reads.
class SilentServer {
 public:
  SilentServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 64) != 0)
      throw std::runtime_error("silent server: bind/listen");
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~SilentServer() { ::close(fd_); }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace mlajit::testing
