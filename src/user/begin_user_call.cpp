// The host half of a user kernel call (include/symmem/user_call.hpp): the steps of a library
// collective's call path (usable? then, inside an EnqueueScope: ordered after the previous call,
// held by a graph that captures it, signed and logged), minus the plan and the launch, which is
// the user's. The scope leaves the call's end unrecorded (communicator_state.hpp, EnqueueScope):
// the kernel is launched after it closed; end_user_call() records the end once it was.
#include <string>

#include "board/call_signature.hpp"
#include "comm/communicator_state.hpp"
#include "common/device_guard.hpp"
#include "symmem/user_call.hpp"

namespace symmem {

uint32_t user_call_signature(const std::string& description, int blocks) {
  return detail::signature_of(detail::make_user_call_descriptor(description, blocks));
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
  detail::EnqueueScope enqueue(st, stream);
  enqueue.leave_end_open();  // the kernel comes after this returns
  UserSync sync = st.user_sync;
  sync.signature = st.sign_call(detail::make_user_call_descriptor(description, blocks));
  return sync;
}

void end_user_call(Communicator& comm, cudaStream_t stream) {
  detail::CommunicatorState& st = detail::state_of(comm);
  if (st.closed || !st.call_order) return;
  detail::DeviceGuard guard(st.device);
  st.call_order->after_call(stream, detail::capture_id_of(stream));
}

}  // namespace symmem
