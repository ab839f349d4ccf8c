// RAII sockets with deadlines: every blocking call polls in short slices until its deadline, so a
// dead peer becomes a kBootstrap/kTimeout error instead of a hang. Listeners are non-blocking, so
// that an event loop never waits in accept() for a connection that vanished. No CUDA here.
#pragma once

#include <sys/types.h>

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
Socket tcp_listen(const std::string& address, int port, int* bound_port, int backlog = 128);
Socket tcp_connect(const std::string& address, int port, Deadline deadline);  // retries until deadline

// Unix-domain stream sockets at a filesystem path, or in the abstract namespace when the name
// starts with '@'. The connected socket is non-blocking: a listener whose backlog is full makes
// the connect retry until the deadline instead of blocking without one.
Socket unix_listen(const std::string& path);
Socket unix_connect(const std::string& path, Deadline deadline);

// Accepts one waiting connection as a non-blocking socket, or returns an invalid Socket when none
// is waiting. A failure other than "none waiting" (EMFILE, ENFILE, ENOMEM, ENOBUFS...) also
// returns an invalid Socket and leaves its errno in *error, so that a server can shed load
// instead of dying; *error is 0 otherwise.
Socket accept_nonblocking(const Socket& listener, int* error);

// Whole-buffer I/O. Throws kBootstrap on EOF/error, kTimeout at the deadline.
void send_all(const Socket& s, const void* data, size_t bytes, Deadline deadline);
void recv_all(const Socket& s, void* data, size_t bytes, Deadline deadline);

// Sends `bytes` of payload with one file descriptor attached (SCM_RIGHTS).
void send_with_fd(const Socket& s, const void* data, size_t bytes, int fd, Deadline deadline);
// Reads at most `bytes` of what is waiting, without blocking, and appends every descriptor that
// came with it to *fds (the caller owns them, also when it then drops the connection). Returns
// the bytes read; 0 when the peer closed or the socket failed; -1 when nothing is waiting.
ssize_t recv_some_with_fds(const Socket& s, void* data, size_t bytes, std::vector<int>* fds);

// uid of the process at the other end of a Unix-domain socket (SO_PEERCRED).
uint32_t peer_uid(const Socket& s);

// Constant-time comparison, for tokens.
bool equal_secret(const std::string& a, const std::string& b);

// Random bytes from the kernel, hex encoded.
std::string random_hex(size_t bytes);

}  // namespace symmem::detail
