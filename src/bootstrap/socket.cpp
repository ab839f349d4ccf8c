#include "bootstrap/socket.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <thread>

#include "common/check.hpp"

namespace symmem::detail {
namespace {

// Blocking calls wake at least this often to check their deadline and stop flag.
constexpr int kPollSliceMs = 50;

int remaining_ms(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left, kPollSliceMs));
}

// Waits until fd is ready for `events`; false at the deadline.
bool wait_ready(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int ms = remaining_ms(deadline);
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) throw_errno(errno, "poll", __FILE__, __LINE__);
    if (Clock::now() >= deadline) return false;
  }
}

using AddressList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

AddressList resolve(const std::string& address, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(address.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) throw Error(ErrorCode::kBootstrap, "cannot resolve address '" + address + "': " + ::gai_strerror(rc));
  return AddressList(result, &::freeaddrinfo);
}

// A path starting with '@' names a socket in the abstract namespace (no file to clean up).
socklen_t unix_address(const std::string& path, sockaddr_un* addr) {
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr->sun_path))
    throw Error(ErrorCode::kInvalidArgument, "Unix socket path too long: " + path);
  std::memcpy(addr->sun_path, path.c_str(), path.size());
  if (path[0] == '@') addr->sun_path[0] = '\0';
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + (path[0] == '@' ? 0 : 1));
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

void Socket::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Socket tcp_listen(const std::string& address, int port, int* bound_port, int backlog) {
  AddressList list = resolve(address, port, false);
  std::string last_error = "no address";
  for (addrinfo* ai = list.get(); ai; ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!s.valid()) continue;
    int one = 1;
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.fd(), ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(s.fd(), backlog) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof(local);
      ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&local), &len);
      if (bound_port)
        *bound_port = ntohs(local.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&local)->sin6_port
                                                        : reinterpret_cast<sockaddr_in*>(&local)->sin_port);
      return s;
    }
    last_error = std::strerror(errno);
  }
  throw Error(ErrorCode::kBootstrap, "cannot listen on " + address + ":" + std::to_string(port) + ": " + last_error);
}

Socket tcp_connect(const std::string& address, int port, Deadline deadline) {
  std::string last_error;
  while (true) {
    AddressList list = resolve(address, port, false);
    for (addrinfo* ai = list.get(); ai; ai = ai->ai_next) {
      // Non-blocking, so that a flooded listener (SYNs dropped, retried for minutes by the
      // kernel) costs this caller its deadline at most.
      Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
      if (!s.valid()) continue;
      int err = ::connect(s.fd(), ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        err = ETIMEDOUT;
        if (wait_ready(s.fd(), POLLOUT, deadline)) {
          socklen_t len = sizeof(err);
          if (::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
        }
      }
      if (err == 0) {
        int one = 1;
        ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return s;
      }
      last_error = std::strerror(err);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the server may not be up yet
  }
  throw Error(ErrorCode::kTimeout, "cannot connect to store at " + address + ":" + std::to_string(port) +
                                       " before the deadline: " + last_error);
}

Socket unix_listen(const std::string& path) {
  sockaddr_un addr;
  const socklen_t len = unix_address(path, &addr);
  Socket s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  SYMMEM_SYS_CHECK(s.fd());
  if (path[0] != '@') ::unlink(path.c_str());
  SYMMEM_SYS_CHECK(::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), len));
  SYMMEM_SYS_CHECK(::listen(s.fd(), 128));
  return s;
}

Socket unix_connect(const std::string& path, Deadline deadline) {
  sockaddr_un addr;
  const socklen_t len = unix_address(path, &addr);
  std::string last_error;
  do {
    // Non-blocking: a Unix-domain connect to a full backlog fails with EAGAIN instead of waiting.
    Socket s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    SYMMEM_SYS_CHECK(s.fd());
    if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), len) == 0) return s;
    last_error = std::strerror(errno);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (Clock::now() < deadline);
  throw Error(ErrorCode::kTimeout, "cannot connect to " + path + ": " + last_error);
}

Socket accept_nonblocking(const Socket& listener, int* error) {
  *error = 0;
  for (;;) {
    int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) return Socket(fd);
    // A connection that was reset while queued is simply gone; look at the next one.
    if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) *error = errno;
    return Socket();
  }
}

void send_all(const Socket& s, const void* data, size_t bytes, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    if (!wait_ready(s.fd(), POLLOUT, deadline)) throw Error(ErrorCode::kTimeout, "socket send timed out");
    ssize_t n = ::send(s.fd(), p, bytes, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw Error(ErrorCode::kBootstrap, std::string("socket send failed: ") + std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void recv_all(const Socket& s, void* data, size_t bytes, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    if (!wait_ready(s.fd(), POLLIN, deadline)) throw Error(ErrorCode::kTimeout, "socket receive timed out");
    ssize_t n = ::recv(s.fd(), p, bytes, 0);
    if (n == 0) throw Error(ErrorCode::kBootstrap, "peer closed the connection");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw Error(ErrorCode::kBootstrap, std::string("socket receive failed: ") + std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void send_with_fd(const Socket& s, const void* data, size_t bytes, int fd, Deadline deadline) {
  if (!wait_ready(s.fd(), POLLOUT, deadline)) throw Error(ErrorCode::kTimeout, "fd send timed out");
  iovec iov{const_cast<void*>(data), bytes};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  ssize_t n;
  for (;;) {
    n = ::sendmsg(s.fd(), &msg, MSG_NOSIGNAL);
    if (n >= 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN && wait_ready(s.fd(), POLLOUT, deadline)) continue;
    break;
  }
  if (n != static_cast<ssize_t>(bytes))
    throw Error(ErrorCode::kBootstrap,
                std::string("sendmsg(SCM_RIGHTS) failed: ") + (n < 0 ? std::strerror(errno) : "short write"));
}

ssize_t recv_some_with_fds(const Socket& s, void* data, size_t bytes, std::vector<int>* fds) {
  // Room for a few descriptors: a peer that attaches more than one is dropped by the caller, and
  // the kernel releases whatever does not fit (MSG_CTRUNC) instead of installing it.
  constexpr int kMaxDescriptors = 4;
  iovec iov{data, bytes};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxDescriptors * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  fds->reserve(fds->size() + kMaxDescriptors);  // so that recording a received descriptor cannot throw
  ssize_t n;
  do {
    n = ::recvmsg(s.fd(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->push_back(fd);
      }
    }
    return n;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
  return 0;
}

uint32_t peer_uid(const Socket& s) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  SYMMEM_SYS_CHECK(::getsockopt(s.fd(), SOL_SOCKET, SO_PEERCRED, &cred, &len));
  return cred.uid;
}

bool equal_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.size() ? b.size() : 1)]);
  return diff == 0;
}

std::string random_hex(size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(buf.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(errno, "getrandom", __FILE__, __LINE__);
    }
    got += static_cast<size_t>(n);
  }
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : buf) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

}  // namespace symmem::detail
