// Passes file descriptors (exported CUDA memory handles) among the local ranks of a job over
// Unix-domain sockets with SCM_RIGHTS.
//
// Security: each rank listens on an abstract socket whose name holds 128 random bits published
// only through the (token-authenticated) bootstrap, so no other job can predict or squat it.
// Both ends check the other's uid with SO_PEERCRED and refuse a different user; every message
// carries the job secret, so a same-user process of another job is refused too.
//
// Robustness: a rank reads all its incoming connections at once with poll(), never one after the
// other, so a connection that sends half a message, or nothing, holds one of kMaxIncoming slots
// until the exchange's timeout (or until a newer connection needs the slot) and delays nobody.
// Every wait ends at the exchange's deadline; every descriptor received and not handed to the
// caller (a refused message, a dropped connection, an uncollected round) is closed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/socket.hpp"
#include "symmem/bootstrap.hpp"

namespace symmem::detail {

class FdExchange {
 public:
  FdExchange(Bootstrap& bootstrap, int64_t timeout_ms);  // collective
  ~FdExchange();                                         // closes descriptors never collected
  FdExchange(const FdExchange&) = delete;
  FdExchange& operator=(const FdExchange&) = delete;

  // Collective: sends my_fd to every peer and returns the peers' descriptors, indexed by rank
  // (-1 at this rank). The caller owns and must close the returned descriptors. Throws kTimeout
  // naming the missing ranks when they do not all arrive within the timeout.
  std::vector<int> exchange(int my_fd);

  // Connections refused or dropped: another uid, a wrong secret, a malformed or stalled message.
  int refused() const { return refused_; }
  // The abstract socket name rank `rank` listens on (diagnostics and tests).
  std::string socket_name(int rank) const { return "@symmem-" + names_.at(rank); }

 private:
  struct Message {
    char secret[32];
    uint64_t seq;
    int32_t rank;
  };
  struct Incoming;  // an accepted connection whose message has not fully arrived

  void send_to_peers(int my_fd, uint64_t seq, Deadline deadline);
  void accept_incoming();
  bool read_incoming(Incoming& in, uint64_t seq);
  void drop_all() noexcept;

  Bootstrap& bootstrap_;
  int64_t timeout_ms_;
  std::string secret_;
  std::vector<std::string> names_;
  Socket listener_;
  uint64_t seq_ = 0;
  std::map<uint64_t, std::map<int, int>> early_;     // descriptors of rounds not yet collected
  std::vector<std::unique_ptr<Incoming>> incoming_;  // oldest first; kept across rounds
  int refused_ = 0;
};

}  // namespace symmem::detail
