// FNV-1a: a small, stable hash for values every rank must agree on (call signatures, settings).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace symmem::detail {

class Fnv1a {
 public:
  Fnv1a& bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) hash_ = (hash_ ^ p[i]) * 1099511628211ull;
    return *this;
  }
  template <typename T>
  Fnv1a& value(const T& v) {
    return bytes(&v, sizeof(v));
  }
  Fnv1a& text(const std::string& s) { return bytes(s.data(), s.size()); }
  uint64_t digest() const { return hash_; }

 private:
  uint64_t hash_ = 14695981039346656037ull;
};

}  // namespace symmem::detail
