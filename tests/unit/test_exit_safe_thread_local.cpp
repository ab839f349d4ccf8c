// common/exit_safe_thread_local.hpp: what runs after a thread's thread-locals were destroyed (atexit
// handlers, static destructors) gets a usable object, never the destroyed one.
#include <unistd.h>

#include <string>

#include "common/exit_safe_thread_local.hpp"
#include "test.hpp"

using symmem::detail::exit_safe_thread_local;

namespace {

struct MessageTag;

std::string& message() { return exit_safe_thread_local<std::string, MessageTag>(); }

void use_at_exit() {
  std::string& m = message();  // a fresh string: the thread's own was destroyed
  bool ok = m.empty();
  m = std::string(100, 'y');
  ok = ok && message() == std::string(100, 'y');  // and the same one for the rest of the thread
  _exit(ok ? 0 : 3);
}

}  // namespace

TEST(exit_safe_thread_local_is_usable_after_the_thread_locals_are_destroyed) {
  // On the heap: the thread's own string's destructor frees it before use_at_exit runs.
  EXPECT_EQ(symmem::test::exit_status_of_child([] { message() = std::string(100, 'x'); }, use_at_exit), 0);
}

TEST(exit_safe_thread_local_is_one_object_per_thread_and_tag) {
  message() = "main";
  EXPECT_EQ(message(), std::string("main"));
  EXPECT(&exit_safe_thread_local<std::string>() != &message());  // another tag, another object
}
