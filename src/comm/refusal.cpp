#include "comm/refusal.hpp"

#include <algorithm>
#include <cstring>

#include "board/host_board.hpp"
#include "comm/communicator_state.hpp"
#include "common/device_guard.hpp"
#include "kernels/kernel_args.hpp"

namespace symmem::detail {
namespace {

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

std::string refusal_message(const char* op, int rank, ErrorCode code, const std::string& cause) {
  std::string why = cause;
  const std::string error_prefix = std::string("symmem ") + error_code_name(code) + ": ";
  if (starts_with(why, error_prefix)) why.erase(0, error_prefix.size());
  const std::string op_prefix = std::string(op) + ": ";
  if (starts_with(why, op_prefix)) why.erase(0, op_prefix.size());
  const std::string head = op_prefix + "rank " + std::to_string(rank) + " refused the call: ";
  const std::string tail = "; every rank raises this error and the communicator is unusable now";
  const size_t room = BoardPage::kRefusalText - 1 - head.size() - tail.size();
  if (why.size() > room) why = why.substr(0, room - 3) + "...";
  return head + why + tail;
}

void refuse_call(CommunicatorState& st, uint32_t op_code, const char* op, ErrorCode code, const std::string& cause,
                 cudaStream_t stream) {
  if (st.closed || !st.abort_reason.empty() || !st.board) throw Error(code, cause);
  const std::string message = refusal_message(op, st.layout.rank, code, cause);
  BoardPage* page = st.board->page(st.rank);
  // The text first: a peer reads it once it sees the record, which follows it (the kernel's
  // record is written after its launch; the host's below after this fence).
  if (page->refusal[0] == '\0') {
    const size_t n = std::min(message.size(), sizeof(page->refusal) - 1);
    std::memcpy(page->refusal, message.data(), n);
    page->refusal[n] = '\0';
  }
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  bool enqueued = false;
  try {
    DeviceGuard guard(st.device);
    if (!capture_id_of(stream)) {
      EnqueueScope enqueue(st, stream);
      launch_refusal(st.sync_args(op_code, kRefusalSignature), static_cast<int32_t>(code), stream);
      enqueued = true;
    }
  } catch (const Error&) {
    // (an invalidated capture, an invalid stream: the host writes the record instead)
  }
  if (!enqueued) {
    DeviceStatus record{};
    record.code = kStatusRefused;
    record.op = op_code;
    record.rank = st.rank;
    record.peer = st.rank;
    record.block = static_cast<int32_t>(code);
    record.signature = kRefusalSignature;
    record_failure(page, st.board->abort_word(), record, nullptr);
  }
  st.abort_reason = message;
  throw Error(code, message);
}

}  // namespace symmem::detail

namespace symmem {

void Communicator::refuse_call(const char* op, ErrorCode code, const std::string& cause, cudaStream_t stream) {
  detail::refuse_call(detail::state_of(*this), detail::kOpNone, op && *op ? op : "collective", code, cause, stream);
}

}  // namespace symmem
