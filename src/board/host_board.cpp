// The host board (see host_board.hpp): one memfd page per rank, passed to every local rank over
// the fd exchange, mapped MAP_SHARED by every process and registered with CUDA as mapped memory,
// which is how NCCL shares host memory between processes (shm + cudaHostRegister).
//
// Creation is collective and all-or-nothing: every step can fail on one rank only (memfd limits,
// pinning limits, a peer's descriptor that is not what it should be), so the ranks agree on the
// outcome after each step and either all keep their board or all throw. Whatever was made is
// released on every path; every descriptor, received or created, is closed once its pages are
// mapped (a mapping keeps the memory alive).
#include "board/host_board.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <type_traits>
#include <vector>

#include "bootstrap/agree_on_outcome.hpp"
#include "common/check.hpp"

namespace symmem::detail {
namespace {

constexpr size_t kOsPage = 4096;
// record_call skips a signature found among this many newest entries: a steady loop of a few
// distinct calls (an FSDP step's all-gathers, a barrier) then writes nothing at all.
constexpr uint32_t kRecentCalls = 8;
// A peer's page must not shrink under our mapping (an access past the end would be SIGBUS):
// every page is sealed against resizing before it is shared, and a received one is checked.
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

static_assert(std::is_trivially_copyable<BoardPage>::value, "the board is shared raw memory");
static_assert(BoardPage::kCallLog >= static_cast<int>(kRecentCalls), "the recent-call check scans the ring");
static_assert((BoardPage::kCallLog & (BoardPage::kCallLog - 1)) == 0, "ring indices wrap with the 32-bit head");

size_t round_up(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

std::string rank_text(int rank) { return "host board: rank " + std::to_string(rank) + ": "; }

// Maps one page; throws kSystemError naming what failed.
void* map_shared(int fd, size_t bytes, int rank, const char* whose) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    throw Error(ErrorCode::kSystemError, rank_text(rank) + "mmap of " + whose + " (" + std::to_string(bytes) +
                                             " bytes) failed: " + std::strerror(errno));
  return p;
}

// A received descriptor must be a sealed page of exactly our size: a page that could shrink, or a
// smaller one, would fault this process when it touched the missing part.
void check_peer_page(int fd, size_t bytes, int rank, int peer) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw Error(ErrorCode::kSystemError,
                rank_text(rank) + "fstat of rank " + std::to_string(peer) + "'s page failed: " + std::strerror(errno));
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (static_cast<size_t>(st.st_size) != bytes || seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    throw Error(ErrorCode::kSystemError, rank_text(rank) + "rank " + std::to_string(peer) + " sent a page of " +
                                             std::to_string(st.st_size) + " bytes (expected " + std::to_string(bytes) +
                                             ", sealed against resizing); is it the same symmem build?");
}

}  // namespace

HostBoard::HostBoard(int rank, int world, Bootstrap& bootstrap, FdExchange& exchange) : rank_(rank), world_(world) {
  if (world < 1 || world > kMaxWorld || rank < 0 || rank >= world)
    throw Error(ErrorCode::kInvalidArgument,
                "host board: rank " + std::to_string(rank) + " of world " + std::to_string(world) + " is out of range");
  page_bytes_ = round_up(sizeof(BoardPage), kOsPage);

  // Pins mappings_[r] and finds the address this GPU uses for it.
  auto register_page = [&](int r) {
    SYMMEM_CUDA_CHECK(cudaHostRegister(mappings_[r], page_bytes_, cudaHostRegisterMapped | cudaHostRegisterPortable));
    registered_[r] = true;
    void* device = nullptr;
    SYMMEM_CUDA_CHECK(cudaHostGetDevicePointer(&device, mappings_[r], 0));
    device_pages_[r] = static_cast<BoardPage*>(device);
  };

  // Every rank learns whether every rank succeeded after each step, and all throw together
  // otherwise (the failing rank its own error, the others one naming it).
  const std::string what = rank_text(rank) + "creating or mapping the shared pages";
  std::exception_ptr failure;
  auto release_all = [this]() { release(); };

  // Step 1: this rank's page: created, sealed, mapped, zeroed and pinned before anyone sees it.
  try {
    fd_ = ::memfd_create("symmem-board", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd_ < 0) throw Error(ErrorCode::kSystemError, rank_text(rank) + "memfd_create failed: " + std::strerror(errno));
    if (::ftruncate(fd_, static_cast<off_t>(page_bytes_)) != 0 || ::fcntl(fd_, F_ADD_SEALS, kSeals) != 0)
      throw Error(ErrorCode::kSystemError, rank_text(rank) + "sizing the page failed: " + std::strerror(errno));
    mappings_[rank] = map_shared(fd_, page_bytes_, rank, "its own page");
    std::memset(mappings_[rank], 0, page_bytes_);
    register_page(rank);
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_outcome(bootstrap, failure, release_all, what);

  // Step 2: every peer's page. The exchange hands over one descriptor per peer; each is closed
  // right after it is mapped (or on failure), and ours once the peers hold theirs.
  std::vector<int> peer_fds;
  try {
    peer_fds = exchange.exchange(fd_);
    ::close(fd_);
    fd_ = -1;
    for (int r = 0; r < world; ++r) {
      if (r == rank) continue;
      check_peer_page(peer_fds[r], page_bytes_, rank, r);
      mappings_[r] = map_shared(peer_fds[r], page_bytes_, rank, ("rank " + std::to_string(r) + "'s page").c_str());
      ::close(peer_fds[r]);
      peer_fds[r] = -1;
      register_page(r);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  for (int& fd : peer_fds)
    if (fd >= 0) ::close(fd), fd = -1;
  agree_on_outcome(bootstrap, failure, release_all, what);
}

HostBoard::~HostBoard() { release(); }

void HostBoard::release() noexcept {
  for (int r = 0; r < kMaxWorld; ++r) {
    if (registered_[r]) SYMMEM_CUDA_CHECK_NOTHROW(cudaHostUnregister(mappings_[r]));
    registered_[r] = false;
    device_pages_[r] = nullptr;
    if (mappings_[r]) ::munmap(mappings_[r], page_bytes_);
    mappings_[r] = nullptr;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool HostBoard::recorded_recently(uint32_t signature) const {
  const BoardPage* p = page(rank_);
  const uint32_t head = p->call_head;  // only the recording thread writes it
  for (uint32_t i = 1; i <= kRecentCalls && i <= head; ++i)
    if (p->calls[(head - i) % BoardPage::kCallLog].signature == signature) return true;
  return false;
}

void HostBoard::record_call(uint32_t signature, const std::string& text) {
  if (signature == 0 || recorded_recently(signature)) return;  // 0 marks an empty slot
  BoardPage* p = page(rank_);
  const uint32_t head = p->call_head;  // only this thread writes it
  // A seqlock in one word: clear the signature, write the text, then publish the signature. A
  // reader that finds the signature before and after copying the text has a whole text.
  CallRecord& slot = p->calls[head % BoardPage::kCallLog];
  __atomic_store_n(&slot.signature, 0u, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);  // the cleared signature is visible before the text changes
  const size_t n = std::min(text.size(), sizeof(slot.text) - 1);
  std::memcpy(slot.text, text.data(), n);
  std::memset(slot.text + n, 0, sizeof(slot.text) - n);
  __atomic_store_n(&slot.signature, signature, __ATOMIC_RELEASE);  // the text is visible before it
  __atomic_store_n(&p->call_head, head + 1, __ATOMIC_RELEASE);
}

std::string HostBoard::lookup_call(int rank, uint32_t signature) const {
  if (rank < 0 || rank >= world_ || signature == 0 || !page(rank)) return "";
  const BoardPage* p = page(rank);
  const uint32_t head = __atomic_load_n(&p->call_head, __ATOMIC_ACQUIRE);
  for (uint32_t i = 1; i <= static_cast<uint32_t>(BoardPage::kCallLog); ++i) {  // newest first
    const CallRecord& slot = p->calls[(head - i) % BoardPage::kCallLog];
    if (__atomic_load_n(&slot.signature, __ATOMIC_ACQUIRE) != signature) continue;
    char text[sizeof(slot.text)];
    std::memcpy(text, slot.text, sizeof(text));
    __atomic_thread_fence(__ATOMIC_ACQUIRE);  // the copy is done before the signature is read again
    if (__atomic_load_n(&slot.signature, __ATOMIC_RELAXED) != signature) continue;  // rewritten meanwhile
    text[sizeof(text) - 1] = '\0';
    return text;
  }
  return "";
}

void record_failure(BoardPage* page, uint32_t* abort_word, const DeviceStatus& failure, const char* text) noexcept {
  DeviceStatus* status = &page->status;
  if (swap_word(&status->code, kStatusOk, failure.code)) {
    if (text && *text && page->net_failure[0] == '\0')
      std::strncpy(page->net_failure, text, sizeof(page->net_failure) - 1);
    status->op = failure.op;
    status->rank = failure.rank;
    status->peer = failure.peer;
    status->block = failure.block;
    status->phase = failure.phase;
    status->peer_signature = failure.peer_signature;
    // The signature last, released: a reader that sees it (ensure_usable waits for code and
    // signature) sees the fields before it. The code was claimed first, by the swap above.
    __atomic_store_n(&status->signature, failure.signature, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  // the record is visible before the abort word
  }
  __atomic_store_n(abort_word, 1u, __ATOMIC_SEQ_CST);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

}  // namespace symmem::detail
