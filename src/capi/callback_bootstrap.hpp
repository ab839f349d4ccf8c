// A Bootstrap whose exchanges are functions of the language binding (the Python package passes
// functions that use a torch c10d Store), so that a communicator can be built over whatever
// rendezvous the framework already has. A failed callback becomes kBootstrap.
#pragma once

#include <string>

#include "symmem/bootstrap.hpp"
#include "symmem/error.hpp"
#include "symmem/symmem_c.h"

namespace symmem::detail {

class CallbackBootstrap : public Bootstrap {
 public:
  CallbackBootstrap(int rank, int world, symmem_all_gather_fn all_gather, symmem_barrier_fn barrier, void* context)
      : rank_(rank), world_(world), all_gather_(all_gather), barrier_(barrier), context_(context) {}

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void all_gather(const void* mine, void* all, size_t bytes) override {
    if (all_gather_(context_, mine, all, bytes) != 0)
      throw Error(ErrorCode::kBootstrap, "rank " + std::to_string(rank_) +
                                             ": the binding's all-gather exchange failed (its own error says why)");
  }
  void barrier() override {
    if (barrier_(context_) != 0)
      throw Error(ErrorCode::kBootstrap,
                  "rank " + std::to_string(rank_) + ": the binding's barrier failed (its own error says why)");
  }

 private:
  int rank_;
  int world_;
  symmem_all_gather_fn all_gather_;
  symmem_barrier_fn barrier_;
  void* context_;
};

}  // namespace symmem::detail
