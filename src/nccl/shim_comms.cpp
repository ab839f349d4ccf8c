// Communicators: the real one first, then its pair (comm_pair.hpp); closing closes both.
#include <cuda_runtime_api.h>

#include <climits>
#include <memory>
#include <optional>
#include <vector>

#include "common/check.hpp"
#include "common/env.hpp"
#include "nccl/comm_registry.hpp"
#include "nccl/error_map.hpp"
#include "nccl/group_queue.hpp"
#include "nccl/shim.hpp"

namespace symmem::nccl {
namespace {

// What a pair needs from before the real init: its rendezvous must listen by then.
struct Makings {
  RendezvousKey key;
  ShimSettings settings;
  const CutoverTable* table = nullptr;
  std::unique_ptr<LocalRendezvous> rendezvous;
};

// Says, once per message, why this rank stays out of a new communicator (it forwards its calls).
std::nullopt_t stays_out(const std::exception& e) {
  detail::warn_once(std::string("NCCL shim: this rank forwards every call of a new communicator: ") + e.what());
  return std::nullopt;
}

// Before a real init (or split, shrink) among `candidates` ranks, this one at `index`, on `device`:
// nothing when the shim stays out (SYMMEM_NCCL=off: pure forwarding; a single candidate). Never
// throws: a rank that failed here before its real init would leave its peers waiting inside NCCL.
// Whatever goes wrong (a setting it does not understand, an unreadable cutover table, a socket it
// cannot make) is said once as a warning, and this rank does not listen: the others of its host
// then see a communicator that spans hosts, and every rank forwards.
std::optional<Makings> prepare(const RendezvousKey& key, int index, int candidates, int device) noexcept {
  try {
    Mode mode = Mode::kAuto;
    const std::string mode_text = env::nccl_mode();
    if (!parse_mode(mode_text, &mode))
      throw Error(ErrorCode::kInvalidArgument, "SYMMEM_NCCL='" + mode_text + "' is none of auto, all, off");
    if (mode == Mode::kOff || candidates < fewest_ranks_served()) return std::nullopt;
    if (device < 0) {
      cudaGetLastError();  // current_device's failure is the real init's to report, not a stale one
      throw Error(ErrorCode::kCudaError, "CUDA cannot say which device this rank uses");
    }
    Makings m;
    m.key = key;
    m.settings = read_shim_settings(device);
    m.table = &cutover_table_of_device(device);
    m.rendezvous = std::make_unique<LocalRendezvous>(key, index, candidates);
    return m;
  } catch (const std::exception& e) {
    return stays_out(e);
  }
}

// After the real init returned `result`: the pair, registered, or nullptr.
std::shared_ptr<CommPair> adopt(ncclComm_t comm, std::optional<Makings>& makings, ncclResult_t result) {
  if (!makings || !comm || (result != ncclSuccess && result != ncclInProgress)) return nullptr;
  auto pair = std::make_shared<CommPair>(comm, makings->key, makings->settings, makings->table,
                                         std::move(makings->rendezvous));
  add_pair(comm, pair);
  return pair;
}

// The pairs' handshakes: at the outermost ncclGroupEnd when a group is open (the real inits finish
// there), else now, together (one thread may have made all of them: ncclCommInitAll). A pair of a
// non-blocking init that is still in progress shakes hands at its first collective instead.
void handshake(const std::vector<std::shared_ptr<CommPair>>& pairs, ncclResult_t result) {
  GroupQueue& group = this_thread_group();
  std::vector<GroupItem> items;
  for (const auto& pair : pairs) {
    if (!pair) continue;
    GroupItem item{pair.get(), true, [pair] {
                     pair->handshake();
                     return ncclSuccess;
                   }};
    if (group.open())
      group.defer(std::move(item));
    else if (result == ncclSuccess)
      items.push_back(std::move(item));
  }
  run_per_communicator(items);
}

// -1 when CUDA cannot say (prepare then stays out; the real init reports the error).
int current_device() noexcept {
  int device = 0;
  return cudaGetDevice(&device) == cudaSuccess ? device : -1;
}

struct CommFacts {
  int rank = 0;
  int world = 1;
  int device = 0;
};

CommFacts facts_of(ncclComm_t comm) {
  const RealNccl& real = real_nccl();
  CommFacts f;
  if (real.ncclCommUserRank(comm, &f.rank) != ncclSuccess || real.ncclCommCount(comm, &f.world) != ncclSuccess ||
      real.ncclCommCuDevice(comm, &f.device) != ncclSuccess)
    throw Error(ErrorCode::kInvalidArgument, "the NCCL communicator does not say its rank, size or device");
  return f;
}

// The child of a split or shrink: every rank of the parent counts the parent's children alike.
// Never throws (prepare).
std::optional<Makings> prepare_child(ncclComm_t parent_comm, int64_t color, bool makes_child) noexcept {
  std::shared_ptr<CommPair> parent = find_pair(parent_comm);
  if (!parent) return std::nullopt;
  const RendezvousKey key = parent->next_child_key(color);
  if (!makes_child) return std::nullopt;
  try {
    const CommFacts f = facts_of(parent_comm);
    return prepare(key, f.rank, f.world, f.device);
  } catch (const std::exception& e) {
    return stays_out(e);
  }
}

}  // namespace

ncclResult_t init_rank(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, ncclConfig_t* config,
                       bool with_config) {
  const RealNccl& real = real_nccl();
  std::optional<Makings> makings = prepare(RendezvousKey::of_unique_ids(&id, sizeof(id)), rank, nranks,
                                           current_device());
  const ncclResult_t result = with_config && real.ncclCommInitRankConfig
                                  ? real.ncclCommInitRankConfig(comm, nranks, id, rank, config)
                                  : real.ncclCommInitRank(comm, nranks, id, rank);
  handshake({adopt(comm ? *comm : nullptr, makings, result)}, result);
  return forwarded(result);
}

ncclResult_t init_all(ncclComm_t* comms, int ndev, const int* devlist) {
  const RealNccl& real = real_nccl();
  if (!real.ncclCommInitAll) throw Error(ErrorCode::kUnsupported, real.path + " has no ncclCommInitAll");
  const RendezvousKey key = RendezvousKey::random();  // every rank is in this process
  std::vector<std::optional<Makings>> makings;
  for (int i = 0; i < ndev; ++i) makings.push_back(prepare(key, i, ndev, devlist ? devlist[i] : i));
  const ncclResult_t result = real.ncclCommInitAll(comms, ndev, devlist);
  std::vector<std::shared_ptr<CommPair>> pairs;
  for (int i = 0; i < ndev && comms; ++i) pairs.push_back(adopt(comms[i], makings[i], result));
  handshake(pairs, result);
  return forwarded(result);
}

ncclResult_t init_rank_scalable(ncclComm_t* comm, int nranks, int rank, int nids, ncclUniqueId* ids,
                                ncclConfig_t* config) {
  const RealNccl& real = real_nccl();
  if (!real.ncclCommInitRankScalable)
    throw Error(ErrorCode::kUnsupported, real.path + " has no ncclCommInitRankScalable");
  std::optional<Makings> makings =
      prepare(RendezvousKey::of_unique_ids(ids, sizeof(ncclUniqueId) * static_cast<size_t>(nids > 0 ? nids : 0)), rank,
              nranks, current_device());
  const ncclResult_t result = real.ncclCommInitRankScalable(comm, nranks, rank, nids, ids, config);
  handshake({adopt(comm ? *comm : nullptr, makings, result)}, result);
  return forwarded(result);
}

ncclResult_t split(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  const RealNccl& real = real_nccl();
  if (!real.ncclCommSplit) throw Error(ErrorCode::kUnsupported, real.path + " has no ncclCommSplit");
  std::optional<Makings> makings = prepare_child(comm, color, color != NCCL_SPLIT_NOCOLOR);
  const ncclResult_t result = real.ncclCommSplit(comm, color, key, newcomm, config);
  handshake({adopt(newcomm ? *newcomm : nullptr, makings, result)}, result);
  return forwarded(result);
}

ncclResult_t shrink(ncclComm_t comm, int* exclude, int count, ncclComm_t* newcomm, ncclConfig_t* config, int flags) {
  const RealNccl& real = real_nccl();
  if (!real.ncclCommShrink) throw Error(ErrorCode::kUnsupported, real.path + " has no ncclCommShrink");
  if (flags & NCCL_SHRINK_ABORT) {
    // The parent's operations are being terminated: release its symmem waits first.
    if (std::shared_ptr<CommPair> parent = find_pair(comm)) parent->abort_waits();
  }
  std::optional<Makings> makings = prepare_child(comm, INT64_MIN, true);  // a colour no split uses
  const ncclResult_t result = real.ncclCommShrink(comm, exclude, count, newcomm, config, flags);
  handshake({adopt(newcomm ? *newcomm : nullptr, makings, result)}, result);
  return forwarded(result);
}

ncclResult_t comm_finalize(ncclComm_t comm) {
  const RealNccl& real = real_nccl();
  if (std::shared_ptr<CommPair> pair = find_pair(comm)) pair->release();
  return forwarded(real.ncclCommFinalize ? real.ncclCommFinalize(comm) : ncclSuccess);
}

ncclResult_t comm_destroy(ncclComm_t comm) {
  const RealNccl& real = real_nccl();
  if (std::shared_ptr<CommPair> pair = take_pair(comm)) pair->release();
  release_retired_pairs();
  return forwarded(real.ncclCommDestroy(comm));
}

ncclResult_t comm_abort(ncclComm_t comm) {
  const RealNccl& real = real_nccl();
  if (std::shared_ptr<CommPair> pair = take_pair(comm)) {
    pair->abort_waits();
    retire_pair(std::move(pair));
  }
  return forwarded(real.ncclCommAbort(comm));
}

ncclResult_t comm_revoke(ncclComm_t comm, int flags) {
  const RealNccl& real = real_nccl();
  if (!real.ncclCommRevoke) throw Error(ErrorCode::kUnsupported, real.path + " has no ncclCommRevoke");
  // Flags NCCL does not take (none, in 2.28) are refused there, changing nothing: so here too.
  if (flags == 0)
    if (std::shared_ptr<CommPair> pair = find_pair(comm)) pair->abort_waits();
  return forwarded(real.ncclCommRevoke(comm, flags));
}

}  // namespace symmem::nccl
