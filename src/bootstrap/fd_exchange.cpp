#include "bootstrap/fd_exchange.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/check.hpp"

namespace symmem::detail {
namespace {

constexpr size_t kNameChars = 32;  // hex digits of the random socket name and of the job secret
// Connections whose message has not fully arrived. A peer's message follows its connect at once,
// so only strays wait here; past the cap the oldest is dropped.
constexpr size_t kMaxIncoming = 64;
// Connections accepted per turn, so that a flood of connects cannot keep a rank from its deadline.
constexpr int kAcceptBatch = 16;

std::string gather_strings(Bootstrap& bootstrap, const std::string& mine, std::vector<std::string>* all) {
  std::vector<char> buf(kNameChars * bootstrap.world());
  bootstrap.all_gather(mine.data(), buf.data(), kNameChars);
  all->clear();
  for (int r = 0; r < bootstrap.world(); ++r) all->emplace_back(buf.data() + r * kNameChars, kNameChars);
  return (*all)[0];
}

bool same_user(const Socket& s) {
  try {
    return peer_uid(s) == ::getuid();
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

struct FdExchange::Incoming {
  Socket socket;
  Message message{};
  size_t received = 0;  // bytes of `message` so far
  int fd = -1;          // the descriptor that came with the message; owned until handed on
  Deadline deadline;
  ~Incoming() {
    if (fd >= 0) ::close(fd);
  }
};

FdExchange::FdExchange(Bootstrap& bootstrap, int64_t timeout_ms) : bootstrap_(bootstrap), timeout_ms_(timeout_ms) {
  const std::string nonce = random_hex(kNameChars / 2);
  listener_ = unix_listen("@symmem-" + nonce);
  std::vector<std::string> secrets;
  secret_ = gather_strings(bootstrap_, random_hex(kNameChars / 2), &secrets);  // rank 0's wins
  gather_strings(bootstrap_, nonce, &names_);
}

FdExchange::~FdExchange() { drop_all(); }

std::vector<int> FdExchange::exchange(int my_fd) {
  const int world = bootstrap_.world();
  const int rank = bootstrap_.rank();
  const uint64_t seq = seq_++;
  const Deadline deadline = deadline_after_ms(timeout_ms_);
  std::vector<int> fds(world, -1);
  try {
    send_to_peers(my_fd, seq, deadline);
    for (;;) {
      // Read whatever has arrived before looking at the clock, so that a message that is already
      // here is never dropped for lateness.
      for (auto& in : incoming_)
        if (read_incoming(*in, seq)) in.reset();
      const Deadline now = Clock::now();
      for (auto& in : incoming_) {
        if (in && now >= in->deadline) {
          ++refused_;
          in.reset();
        }
      }
      incoming_.erase(std::remove(incoming_.begin(), incoming_.end(), nullptr), incoming_.end());
      const std::map<int, int>& round = early_[seq];
      if (static_cast<int>(round.size()) == world - 1) break;
      if (now >= deadline) {
        std::string missing;
        for (int r = 0; r < world; ++r)
          if (r != rank && !round.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        throw Error(ErrorCode::kTimeout, "fd exchange: rank " + std::to_string(rank) + " received " +
                                             std::to_string(round.size()) + " of " + std::to_string(world - 1) +
                                             " descriptors within " + std::to_string(timeout_ms_) +
                                             " ms; missing rank(s) " + missing);
      }
      Deadline wake_at = deadline;
      std::vector<pollfd> polled{{listener_.fd(), POLLIN, 0}};
      for (const auto& in : incoming_) {
        polled.push_back({in->socket.fd(), POLLIN, 0});
        wake_at = std::min(wake_at, in->deadline);
      }
      const int64_t wait_ms = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now).count();
      const int rc = ::poll(polled.data(), polled.size(), static_cast<int>(std::clamp<int64_t>(wait_ms, 0, 1000)));
      if (rc < 0 && errno != EINTR) throw_errno(errno, "poll", __FILE__, __LINE__);
      if (rc > 0 && (polled[0].revents & POLLIN)) accept_incoming();
    }
    for (auto& [peer, fd] : early_[seq]) fds[peer] = fd;
    early_.erase(seq);
  } catch (...) {
    drop_all();
    throw;
  }
  return fds;
}

void FdExchange::send_to_peers(int my_fd, uint64_t seq, Deadline deadline) {
  const int rank = bootstrap_.rank();
  Message message{};
  std::memcpy(message.secret, secret_.data(), sizeof(message.secret));
  message.seq = seq;
  message.rank = rank;
  for (int peer = 0; peer < bootstrap_.world(); ++peer) {
    if (peer == rank) continue;
    Socket s = unix_connect(socket_name(peer), deadline);
    if (peer_uid(s) != ::getuid())
      throw Error(ErrorCode::kBootstrap,
                  "fd exchange: the socket of rank " + std::to_string(peer) + " belongs to another user");
    send_with_fd(s, &message, sizeof(message), my_fd, deadline);
  }
}

void FdExchange::accept_incoming() {
  for (int i = 0; i < kAcceptBatch; ++i) {
    int error = 0;
    Socket s = accept_nonblocking(listener_, &error);
    if (!s.valid()) {
      if (error == 0) return;  // none waiting
      if ((error == EMFILE || error == ENFILE) && !incoming_.empty()) {
        incoming_.erase(incoming_.begin());  // a descriptor held by a stray is worth more as a peer's
        ++refused_;
        continue;
      }
      throw Error(ErrorCode::kSystemError, "fd exchange: rank " + std::to_string(bootstrap_.rank()) +
                                               " cannot accept a connection: " + std::strerror(error));
    }
    if (!same_user(s)) {
      ++refused_;
      continue;
    }
    if (incoming_.size() >= kMaxIncoming) {
      incoming_.erase(incoming_.begin());
      ++refused_;
    }
    auto in = std::make_unique<Incoming>();
    in->socket = std::move(s);
    in->deadline = deadline_after_ms(timeout_ms_);
    incoming_.push_back(std::move(in));
  }
}

// Reads what the connection has without blocking. True when the connection is finished with: its
// descriptor kept for its round, or the connection refused (closed with its descriptor).
bool FdExchange::read_incoming(Incoming& in, uint64_t seq) {
  std::vector<int> received;
  char* bytes = reinterpret_cast<char*>(&in.message);
  const ssize_t n = recv_some_with_fds(in.socket, bytes + in.received, sizeof(Message) - in.received, &received);
  bool extra_descriptor = false;
  for (int fd : received) {
    if (in.fd < 0) {
      in.fd = fd;
    } else {
      ::close(fd);
      extra_descriptor = true;
    }
  }
  if (n < 0) return false;           // nothing waiting
  if (n == 0 || extra_descriptor) {  // closed early, or one descriptor too many
    ++refused_;
    return true;
  }
  in.received += static_cast<size_t>(n);
  if (in.received < sizeof(Message)) return false;
  const Message& m = in.message;
  const int world = bootstrap_.world();
  // A peer is at most one round ahead: it cannot finish round s + 1 without this rank's message.
  const bool valid = in.fd >= 0 && std::memcmp(m.secret, secret_.data(), sizeof(m.secret)) == 0 && m.rank >= 0 &&
                     m.rank < world && m.rank != bootstrap_.rank() && (m.seq == seq || m.seq == seq + 1) &&
                     !(early_.count(m.seq) && early_.at(m.seq).count(m.rank));
  if (!valid) {
    ++refused_;
    return true;
  }
  early_[m.seq][m.rank] = in.fd;
  in.fd = -1;
  return true;
}

void FdExchange::drop_all() noexcept {
  for (auto& [s, round] : early_)
    for (auto& [peer, fd] : round) ::close(fd);
  early_.clear();
  incoming_.clear();
}

}  // namespace symmem::detail
