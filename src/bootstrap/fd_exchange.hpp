// Passes file descriptors (exported CUDA memory handles) among the local ranks of a job over
// Unix-domain sockets with SCM_RIGHTS.
//
// Security: each rank listens on an abstract socket whose name holds 128 random bits published
// only through the (token-authenticated) bootstrap, so no other job can predict or squat it.
// Both ends check the other's uid with SO_PEERCRED and refuse a different user; every message
// carries the job secret, so a same-user process of another job is refused too.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bootstrap/socket.hpp"
#include "symmem/bootstrap.hpp"

namespace symmem::detail {

class FdExchange {
 public:
  FdExchange(Bootstrap& bootstrap, int64_t timeout_ms);  // collective

  // Collective: sends my_fd to every peer and returns the peers' descriptors, indexed by rank
  // (-1 at this rank). The caller owns and must close the returned descriptors.
  std::vector<int> exchange(int my_fd);

  int refused() const { return refused_; }  // connections refused for uid or secret

 private:
  struct Message {
    char secret[32];
    uint64_t seq;
    int32_t rank;
  };

  Bootstrap& bootstrap_;
  int64_t timeout_ms_;
  std::string secret_;
  std::vector<std::string> names_;
  Socket listener_;
  uint64_t seq_ = 0;
  std::map<uint64_t, std::map<int, int>> early_;  // descriptors of rounds not yet collected
  int refused_ = 0;
};

}  // namespace symmem::detail
