// First-fit allocator of offsets inside the heap's address range. Pure C++ and deterministic:
// ranks that make the same calls in the same order get the same offsets, which is what makes
// the heap symmetric.
#pragma once

#include <cstddef>
#include <iterator>
#include <map>
#include <optional>

namespace symmem::detail {

class RangeAllocator {
 public:
  RangeAllocator(size_t capacity, size_t alignment) : alignment_(alignment) { free_[0] = capacity; }

  // Offset of a new range of round_up(bytes, alignment), or nothing when no free range fits.
  std::optional<size_t> allocate(size_t bytes) {
    const size_t size = round_up(bytes == 0 ? 1 : bytes);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < size) continue;
      const size_t offset = it->first;
      const size_t left = it->second - size;
      free_.erase(it);
      if (left) free_[offset + size] = left;
      used_[offset] = size;
      return offset;
    }
    return std::nullopt;
  }

  // Returns the size that was freed, or 0 when offset is not an allocated range.
  size_t release(size_t offset) {
    auto it = used_.find(offset);
    if (it == used_.end()) return 0;
    const size_t freed = it->second;
    size_t size = freed;
    used_.erase(it);
    size_t start = offset;
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && next->first == offset + size) {  // merge with the range after
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {  // merge with the range before
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        size += prev->second;
        free_.erase(prev);
      }
    }
    free_[start] = size;
    return freed;
  }

  // The allocated range containing offset, if any: {start, size}.
  std::optional<std::pair<size_t, size_t>> find(size_t offset) const {
    auto it = used_.upper_bound(offset);
    if (it == used_.begin()) return std::nullopt;
    --it;
    if (offset >= it->first + it->second) return std::nullopt;
    return *it;
  }

  size_t round_up(size_t bytes) const { return (bytes + alignment_ - 1) / alignment_ * alignment_; }
  size_t allocated_ranges() const { return used_.size(); }
  size_t free_ranges() const { return free_.size(); }

 private:
  size_t alignment_;
  std::map<size_t, size_t> free_;  // offset -> size
  std::map<size_t, size_t> used_;  // offset -> size
};

}  // namespace symmem::detail
