// RAII sockets with deadlines: every blocking call polls in short slices until its deadline, so a
// dead peer becomes a kBootstrap/kTimeout error instead of a hang. No CUDA here.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace symmem::detail {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after_ms(int64_t ms) { return Clock::now() + std::chrono::milliseconds(ms); }

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

// TCP. `address` is a numeric address or host name; port 0 binds an ephemeral port.
Socket tcp_listen(const std::string& address, int port, int* bound_port);
Socket tcp_connect(const std::string& address, int port, Deadline deadline);  // retries until deadline

// Unix-domain stream sockets at a filesystem path, or in the abstract namespace when the name
// starts with '@'.
Socket unix_listen(const std::string& path);
Socket unix_connect(const std::string& path, Deadline deadline);

// Waits for a connection; returns an invalid Socket at the deadline, or early when *stop turns true.
Socket accept_until(const Socket& listener, Deadline deadline, const bool* stop = nullptr);

// Whole-buffer I/O. Throws kBootstrap on EOF/error, kTimeout at the deadline.
void send_all(const Socket& s, const void* data, size_t bytes, Deadline deadline);
void recv_all(const Socket& s, void* data, size_t bytes, Deadline deadline);

// Sends `bytes` of payload with one file descriptor attached (SCM_RIGHTS); receive returns the
// new descriptor (caller owns it) after reading exactly `bytes` of payload.
void send_with_fd(const Socket& s, const void* data, size_t bytes, int fd, Deadline deadline);
int recv_with_fd(const Socket& s, void* data, size_t bytes, Deadline deadline);

// uid of the process at the other end of a Unix-domain socket (SO_PEERCRED).
uint32_t peer_uid(const Socket& s);

// Constant-time comparison, for tokens.
bool equal_secret(const std::string& a, const std::string& b);

// Random bytes from the kernel, hex encoded.
std::string random_hex(size_t bytes);

}  // namespace symmem::detail
