#include "nccl/failure_words.hpp"

#include "board/host_board.hpp"
#include "comm/communicator_state.hpp"

namespace symmem::nccl {

bool failed_here(const Communicator& comm) noexcept {
  const detail::CommunicatorState& st = detail::state_of(comm);
  if (!st.board) return false;
  return detail::load_word(&st.status_host()->code) != detail::kStatusOk;
}

uint32_t* abort_word_of(const Communicator& comm) noexcept {
  const detail::CommunicatorState& st = detail::state_of(comm);
  return st.board ? st.board->abort_word() : nullptr;
}

}  // namespace symmem::nccl
