// Turns exceptions into the C ABI's return codes (0, or 1 + ErrorCode) and keeps the message for
// symmem_last_error(). Nothing may cross the C boundary as an exception.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "symmem/error.hpp"

namespace symmem::detail {

void set_last_error(const std::string& message);

template <typename F>
int c_api_guard(F&& body) noexcept {
  try {
    body();
    return 0;
  } catch (const Error& e) {
    set_last_error(e.what());
    return 1 + static_cast<int>(e.code());
  } catch (const std::bad_alloc&) {
    set_last_error("symmem kSystemError: out of host memory");
    return 1 + static_cast<int>(ErrorCode::kSystemError);
  } catch (const std::exception& e) {
    set_last_error(std::string("symmem kInternal: ") + e.what());
    return 1 + static_cast<int>(ErrorCode::kInternal);
  } catch (...) {
    set_last_error("symmem kInternal: unknown exception");
    return 1 + static_cast<int>(ErrorCode::kInternal);
  }
}

}  // namespace symmem::detail
