#include "bootstrap/store_connection.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace symmem::detail {
namespace {

// Bytes read per recv(); a larger value is read in several turns of the loop.
constexpr size_t kReadChunk = 64 << 10;

}  // namespace

bool StoreConnection::receive(size_t limit, Clock::time_point now) {
  while (!peer_closed_ && input_.size() < limit) {
    const size_t want = std::min(kReadChunk, limit - input_.size());
    const size_t old_size = input_.size();
    input_.resize(old_size + want);
    const ssize_t n = ::recv(socket_.fd(), input_.data() + old_size, want, MSG_DONTWAIT);
    input_.resize(old_size + (n > 0 ? static_cast<size_t>(n) : 0));
    if (n == 0) {
      peer_closed_ = true;
      return true;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    progress_ = now;
    if (static_cast<size_t>(n) < want) return true;  // drained what was waiting
  }
  return true;
}

bool StoreConnection::send_pending(Clock::time_point now) {
  while (has_output()) {
    const ssize_t n = ::send(socket_.fd(), output_.data() + sent_, output_.size() - sent_, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    sent_ += static_cast<size_t>(n);
    progress_ = now;
  }
  output_.clear();
  sent_ = 0;
  return true;
}

void StoreConnection::consume(size_t bytes) {
  input_.erase(input_.begin(), input_.begin() + bytes);
  if (input_.empty() && input_.capacity() > kReadChunk) Bytes().swap(input_);  // a large value is not held on to
}

void StoreConnection::queue(Bytes bytes) {
  if (!has_output()) {
    output_ = std::move(bytes);
    sent_ = 0;
  } else {
    output_.insert(output_.end(), bytes.begin(), bytes.end());
  }
}

}  // namespace symmem::detail
