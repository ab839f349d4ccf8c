#include "nccl/failure_words.hpp"

#include "board/host_board.hpp"
#include "comm/communicator_state.hpp"

namespace symmem::nccl {

bool failure_to_report(const Communicator& comm) noexcept {
  const detail::CommunicatorState& st = detail::state_of(comm);
  if (!st.board) return false;
  if (detail::load_word(&st.status_host()->code) != detail::kStatusOk) return true;
  if (detail::load_word(st.board->abort_word()) == 0) return false;
  for (int r = 0; r < st.world; ++r)
    if (detail::is_failure_cause(detail::load_word(&st.board->page(r)->status.code))) return true;
  return false;
}

void throw_failure(Communicator& comm, std::chrono::milliseconds settle, bool* provisional) {
  detail::state_of(comm).ensure_usable("check", settle, provisional);
}

uint32_t* abort_word_of(const Communicator& comm) noexcept {
  const detail::CommunicatorState& st = detail::state_of(comm);
  return st.board ? st.board->abort_word() : nullptr;
}

}  // namespace symmem::nccl
