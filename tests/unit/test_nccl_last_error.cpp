// ncclGetLastError's messages (src/nccl/error_map.hpp): a pointer the shim hands out stays valid
// while messages change, as NCCL's own buffer does, and another thread's message never rewrites
// the text this thread was given.
#include <string>
#include <thread>

#include "nccl/error_map.hpp"
#include "test.hpp"

using namespace symmem::nccl;

TEST(nccl_last_error_pointer_stays_valid_when_a_longer_message_follows) {
  const char* first = handed_out("short");
  const std::string longer(900, 'y');
  const char* second = handed_out(longer.c_str());
  EXPECT(first == second);
  EXPECT(std::string(first) == longer);
  EXPECT(std::string(handed_out(std::string(5000, 'z').c_str())).size() == 1023);  // truncated, as NCCL's
}

TEST(nccl_process_last_error_is_this_threads_copy) {
  set_process_last_error("rank 0 timed out waiting for rank 1");
  const char* mine = process_last_error();
  EXPECT(mine != nullptr);
  std::thread([] { set_process_last_error("another thread's failure"); }).join();
  EXPECT(std::string(mine) == "rank 0 timed out waiting for rank 1");
  clear_last_error();
  EXPECT(process_last_error() == nullptr);
}
