// Collective steps that can fail on one rank only (an import, a map, a pinning limit): the ranks
// agree on the outcome, so that either every rank keeps what the step made or none does, and no
// rank waits for a peer that has already given up. No CUDA here.
#pragma once

#include <exception>
#include <functional>
#include <string>

#include "symmem/bootstrap.hpp"

namespace symmem::detail {

// Collective. Every rank tells every rank whether its step failed (`local_failure` set). When any
// rank failed, every rank calls `release` and throws: the failing rank its own error, the others a
// symmem::Error with the failing rank's code, "<what> failed on rank <r> (see its error)". When
// the exchange itself fails, `release` runs and that error propagates.
void agree_on_outcome(Bootstrap& bootstrap, std::exception_ptr local_failure, const std::function<void()>& release,
                      const std::string& what);

// One step of such a collective: runs `step` here, then agrees on whether it threw on any rank.
template <typename Step>
void agree_on_step(Bootstrap& bootstrap, Step&& step, const std::function<void()>& release, const std::string& what) {
  std::exception_ptr failure;
  try {
    step();
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_outcome(bootstrap, failure, release, what);
}

}  // namespace symmem::detail
