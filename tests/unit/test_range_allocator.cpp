#include "heap/range_allocator.hpp"
#include "test.hpp"

using symmem::detail::RangeAllocator;

TEST(range_allocator_is_deterministic_and_aligned) {
  RangeAllocator a(1 << 30, 2 << 20), b(1 << 30, 2 << 20);
  for (size_t bytes : {size_t(1), size_t(3) << 20, size_t(0), size_t(100)}) {
    const auto x = a.allocate(bytes), y = b.allocate(bytes);
    EXPECT(x && y && *x == *y);
    EXPECT(*x % (2 << 20) == 0);
  }
}

TEST(range_allocator_reuses_and_merges_freed_ranges) {
  RangeAllocator a(16 << 20, 2 << 20);
  const auto x = a.allocate(2 << 20), y = a.allocate(2 << 20), z = a.allocate(2 << 20);
  EXPECT(x && y && z);
  EXPECT_EQ(a.release(*y), size_t(2 << 20));
  EXPECT_EQ(a.release(*y), size_t(0));  // double free is refused
  EXPECT_EQ(*a.allocate(1), *y);        // first fit reuses the hole
  a.release(*x);
  a.release(*y);
  a.release(*z);
  EXPECT_EQ(a.free_ranges(), size_t(1));  // everything merged back
  EXPECT_EQ(a.allocated_ranges(), size_t(0));
  EXPECT(a.allocate(16 << 20).has_value());
  EXPECT(!a.allocate(1).has_value());  // full
}

TEST(range_allocator_finds_the_range_of_an_offset) {
  RangeAllocator a(16 << 20, 1 << 20);
  const auto x = a.allocate(3 << 20);
  EXPECT(a.find(*x + 5)->first == *x);
  EXPECT(a.find(*x + (3 << 20) - 1)->second == size_t(3 << 20));
  EXPECT(!a.find(*x + (3 << 20)));
}
