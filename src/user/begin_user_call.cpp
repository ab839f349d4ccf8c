// The host half of a user kernel call (include/symmem/user_call.hpp): the same steps as a library
// collective's (usable? ordered after the previous call, signed, logged), minus the plan.
#include <string>

#include "comm/communicator_state.hpp"
#include "common/device_guard.hpp"
#include "common/hash.hpp"
#include "symmem/user_call.hpp"
#include "workspace/user_call_area.hpp"

namespace symmem {

uint32_t user_call_signature(const std::string& description, int blocks) {
  const uint64_t d = detail::Fnv1a().value(detail::kOpUser).value(blocks).text(description).digest();
  const uint32_t folded = static_cast<uint32_t>(d ^ (d >> 32));
  return folded != 0 ? folded : 1u;  // 0 marks an empty flag
}

UserSync begin_user_call(Communicator& comm, const std::string& description, int blocks, cudaStream_t stream) {
  detail::CommunicatorState& st = detail::state_of(comm);
  if (description.empty())
    throw Error(ErrorCode::kInvalidArgument, "begin_user_call: the description is empty; name the kernel and "
                                             "everything the ranks must agree on (shapes, dtypes)");
  st.ensure_usable(description.c_str());
  st.require_one_node(description.c_str());
  if (blocks < 1 || blocks > kUserMaxBlocks)
    throw Error(ErrorCode::kInvalidArgument, description + ": a user kernel runs 1 to " +
                                                 std::to_string(kUserMaxBlocks) + " blocks (its per-block flags and "
                                                 "epochs), not " + std::to_string(blocks));
  detail::DeviceGuard guard(st.device);
  st.before_enqueue(stream);
  const uint32_t signature = user_call_signature(description, blocks);
  if (!st.board->recorded_recently(signature))
    st.board->record_call(signature, description + " blocks=" + std::to_string(blocks));
  return st.user_calls->sync(signature);
}

}  // namespace symmem
