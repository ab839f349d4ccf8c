// What the all-to-all keeps per communicator: the device table its split exchange fills for its
// move kernel (kernels/all_to_all_args.hpp). Local device memory, allocated when the communicator
// is created (a CUDA graph may reference it from its first capture on) and freed with it.
#pragma once

#include "kernels/all_to_all_args.hpp"

namespace symmem::detail {

class AllToAllState {
 public:
  explicit AllToAllState(int device);  // the communicator's device is current
  ~AllToAllState();                    // never throws
  AllToAllState(const AllToAllState&) = delete;
  AllToAllState& operator=(const AllToAllState&) = delete;

  AllToAllTable* table() const { return table_; }

 private:
  AllToAllTable* table_ = nullptr;
};

}  // namespace symmem::detail
