#include "bootstrap/fd_exchange.hpp"

#include <unistd.h>

#include <cstring>

#include "common/check.hpp"

namespace symmem::detail {
namespace {

constexpr size_t kNameChars = 32;  // hex digits of the random socket name and of the job secret

std::string gather_strings(Bootstrap& bootstrap, const std::string& mine, std::vector<std::string>* all) {
  std::vector<char> buf(kNameChars * bootstrap.world());
  bootstrap.all_gather(mine.data(), buf.data(), kNameChars);
  all->clear();
  for (int r = 0; r < bootstrap.world(); ++r) all->emplace_back(buf.data() + r * kNameChars, kNameChars);
  return (*all)[0];
}

}  // namespace

FdExchange::FdExchange(Bootstrap& bootstrap, int64_t timeout_ms) : bootstrap_(bootstrap), timeout_ms_(timeout_ms) {
  const std::string nonce = random_hex(kNameChars / 2);
  listener_ = unix_listen("@symmem-" + nonce);
  std::vector<std::string> secrets;
  secret_ = gather_strings(bootstrap_, random_hex(kNameChars / 2), &secrets);  // rank 0's wins
  gather_strings(bootstrap_, nonce, &names_);
}

std::vector<int> FdExchange::exchange(int my_fd) {
  const int world = bootstrap_.world();
  const int rank = bootstrap_.rank();
  const uint64_t seq = seq_++;
  const Deadline deadline = deadline_after_ms(timeout_ms_);
  std::vector<int> fds(world, -1);
  try {
    Message message{};
    std::memcpy(message.secret, secret_.data(), sizeof(message.secret));
    message.seq = seq;
    message.rank = rank;
    for (int peer = 0; peer < world; ++peer) {
      if (peer == rank) continue;
      Socket s = unix_connect("@symmem-" + names_[peer], deadline);
      if (peer_uid(s) != ::getuid())
        throw Error(ErrorCode::kBootstrap,
                    "fd exchange: the socket of rank " + std::to_string(peer) + " belongs to another user");
      send_with_fd(s, &message, sizeof(message), my_fd, deadline);
    }
    auto& round = early_[seq];
    while (static_cast<int>(round.size()) < world - 1) {
      Socket s = accept_until(listener_, deadline);
      if (!s.valid())
        throw Error(ErrorCode::kTimeout, "fd exchange: rank " + std::to_string(rank) + " received " +
                                             std::to_string(round.size()) + " of " + std::to_string(world - 1) +
                                             " descriptors in time");
      if (peer_uid(s) != ::getuid()) {
        ++refused_;
        continue;
      }
      Message in{};
      int fd = -1;
      try {
        fd = recv_with_fd(s, &in, sizeof(in), deadline);
      } catch (const Error&) {
        ++refused_;
        continue;
      }
      if (std::memcmp(in.secret, secret_.data(), sizeof(in.secret)) != 0 || in.rank < 0 || in.rank >= world ||
          in.rank == rank || in.seq < seq || early_[in.seq].count(in.rank)) {
        ::close(fd);
        ++refused_;
        continue;
      }
      early_[in.seq][in.rank] = fd;  // a fast peer may already be in a later round
    }
    for (auto& [peer, fd] : round) fds[peer] = fd;
    early_.erase(seq);
  } catch (...) {
    for (auto& [s, round] : early_)
      for (auto& [peer, fd] : round) ::close(fd);
    early_.clear();
    throw;
  }
  return fds;
}

}  // namespace symmem::detail
