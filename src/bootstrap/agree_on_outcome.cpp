#include "bootstrap/agree_on_outcome.hpp"

#include <cstdint>
#include <vector>

#include "symmem/error.hpp"

namespace symmem::detail {

void agree_on_outcome(Bootstrap& bootstrap, std::exception_ptr local_failure, const std::function<void()>& release,
                      const std::string& what) {
  // -1: fine; otherwise the ErrorCode of the failure (kInternal for a foreign exception).
  int32_t mine = -1;
  if (local_failure) {
    mine = static_cast<int32_t>(ErrorCode::kInternal);
    try {
      std::rethrow_exception(local_failure);
    } catch (const Error& e) {
      mine = static_cast<int32_t>(e.code());
    } catch (...) {
    }
  }
  std::vector<int32_t> outcome(bootstrap.world(), -1);
  try {
    bootstrap.all_gather(&mine, outcome.data(), sizeof(mine));
  } catch (...) {
    release();
    throw;
  }
  if (local_failure) {
    release();
    std::rethrow_exception(local_failure);
  }
  for (int r = 0; r < bootstrap.world(); ++r) {
    if (outcome[r] < 0) continue;
    release();
    throw Error(static_cast<ErrorCode>(outcome[r]), what + " failed on rank " + std::to_string(r) + " (see its error)");
  }
}

}  // namespace symmem::detail
