// A CUTLASS sm90 persistent tile scheduler whose tiles wait for their rows of A to arrive
// (all_gather_matmul) or announce that their rows of C have left (matmul_reduce_scatter).
//
// It is CUTLASS's static persistent scheduler (raster along N: every N tile of an M band before
// the next band) with three changes, all made where a warp asks for its next tile, so that the
// producer (TMA loads of A), the consumers and the epilogue of a CTA all see the same tile:
//   - the M index is rotated so that the bands are taken from first_tile on (chunk_flags.hpp);
//   - before returning a tile to warp 0 of the CTA (the cooperative kernel's mainloop producer, the
//     only warp that loads A: flagged_gemm.cuh asserts there is no auxiliary load warp), lane 0
//     waits until the flags of every piece of A that the tile's rows touch are set; the other
//     warps wait on the mainloop pipeline as usual. The wait is an acquire load at system scope
//     (the flags are written by stream memory operations after the copies), then every lane
//     fences the async proxy so that the TMA loads issued after it see the copied rows. It has the library's deadline: after the communicator's timeout, or once any rank
//     failed (abort word), it records the failure and lets the tile run on garbage; the host
//     raises the error and the result is undefined. Never a hang.
//   - when chunks.done is set, the consumer warp groups announce each finished tile once its TMA
//     stores have completed (not only read shared memory): after the next tile's epilogue, when
//     they are long done (announce_stored), or at once after the CTA's last tile. Each consumer
//     thread waits for its older bulk store groups and fences the async proxy; after a barrier of
//     both consumer warp groups one thread adds 1 at system scope, with release, to done[] of
//     every chunk the tile's rows touch: the stream that waits for the count (a stream memory
//     operation) then lets a copy engine read the finished rows. Announcing a tile late, not at
//     once, keeps the consumers from waiting for their stores (5-22 % slower GEMMs at K <= 4096
//     measured on an H200 by the review of ffab7a7).
// Selected by the tag symmem::detail::FlagWaitingScheduler in GemmUniversal.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

#include "device/ptx.cuh"
#include "device/wait.cuh"
#include "fused/chunk_flags.hpp"

namespace symmem::detail {

struct FlagWaitingScheduler {};  // the tag

class FlagWaitingTileScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  // The cooperative kernel: one producer warp group, then two consumer (MMA + epilogue) warp groups
  // (flagged_gemm.cuh asserts it).
  static constexpr int kLoadWarpGroups = 1;
  static constexpr int kConsumerThreads = 256;

  using BaseParams = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Params;
  using WorkTileInfo = typename Base::WorkTileInfo;

  struct Arguments : Base::Arguments {
    ChunkFlags chunks{};
  };
  struct Params : BaseParams {
    ChunkFlags chunks{};
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem_shape_mnkl, TileShape tile_shape,
                                        ClusterShape cluster_shape, cutlass::KernelHardwareInfo const& hw_info,
                                        Arguments const& arguments, void* workspace = nullptr,
                                        const uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    Params params;
    static_cast<BaseParams&>(params) =
        Base::to_underlying_arguments(problem_shape_mnkl, tile_shape, cluster_shape, hw_info, arguments, workspace,
                                      epilogue_subtile, ktile_start_alignment_count);
    params.chunks = arguments.chunks;
    return params;
  }

  CUTLASS_HOST_DEVICE FlagWaitingTileScheduler() {}
  CUTLASS_DEVICE explicit FlagWaitingTileScheduler(Params const& params) : Base(params), chunks_(params.chunks) {}

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return get_current_work();
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() const {
    WorkTileInfo work = Base::get_current_work();
    if (work.is_valid()) {
      work.M_idx = rotated_tile(chunks_, work.M_idx);
      wait_for_rows(work.M_idx);
    }
    return work;
  }

  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo finished) {
    Base::advance_to_next_work();
    WorkTileInfo next = get_current_work();
    if (chunks_.done != nullptr && cutlass::canonical_warp_group_idx() >= kLoadWarpGroups)
      announce_stored(finished, next.is_valid());
    return cute::make_tuple(next, true);
  }

  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work, TileSchedulerPipeline&, TileSchedulerPipelineState) {
    return fetch_next_work(work);
  }

 private:
  // Called by every consumer thread after the epilogue of `finished`. Announces the tile before it
  // (its stores are older than this tile's store groups, so waiting for all but the newest
  // chunks_.store_groups of them finds them landed: no stall), or, when no tile follows, both.
  // The wait is for completion, not for the shared-memory read the epilogue's own waits (.read)
  // cover; a thread without bulk stores (all but the epilogue's issuing warp) passes at once.
  CUTLASS_DEVICE void announce_stored(const WorkTileInfo& finished, bool more) {
    if (more) {
      wait_for_bulk_groups_but(chunks_.store_groups);
    } else {
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
    asm volatile("fence.proxy.async.global;" ::: "memory");
    cutlass::arch::NamedBarrier::sync(kConsumerThreads, kAnnounceBarrier);
    if (threadIdx.x == kLoadWarpGroups * cutlass::NumThreadsPerWarpGroup) {  // the first consumer thread
      __threadfence_system();
      if (has_pending_) announce(pending_m_, pending_n_);
      if (!more) announce(finished.M_idx, finished.N_idx);
    }
    pending_m_ = finished.M_idx;
    pending_n_ = finished.N_idx;
    has_pending_ = more;
  }

  // cp.async.bulk.wait_group takes an immediate: the counts the shipped epilogues commit per tile,
  // else all of them (waits longer, never too little).
  CUTLASS_DEVICE static void wait_for_bulk_groups_but(int newest) {
    switch (newest) {
#define SYMMEM_WAIT_BULK_BUT(n) \
  case n: asm volatile("cp.async.bulk.wait_group " #n ";" ::: "memory"); return;
      SYMMEM_WAIT_BULK_BUT(1) SYMMEM_WAIT_BULK_BUT(2) SYMMEM_WAIT_BULK_BUT(3) SYMMEM_WAIT_BULK_BUT(4)
      SYMMEM_WAIT_BULK_BUT(6) SYMMEM_WAIT_BULK_BUT(8) SYMMEM_WAIT_BULK_BUT(12) SYMMEM_WAIT_BULK_BUT(16)
      SYMMEM_WAIT_BULK_BUT(24) SYMMEM_WAIT_BULK_BUT(32)
#undef SYMMEM_WAIT_BULK_BUT
      default: asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
  }

  // One release at system scope per chunk the tile's rows touch; padding tiles (beyond M, or
  // beyond N when the scheduler rounds the N tiles up) have no rows.
  CUTLASS_DEVICE void announce(int m_idx, int n_idx) const {
    const int first_row = m_idx * chunks_.tile_rows;
    if (first_row >= chunks_.rows || n_idx >= chunks_.n_tiles) return;
    const int last_row = min(first_row + chunks_.tile_rows, chunks_.rows) - 1;
    const int last = chunk_of_row(chunks_, last_row);
    for (int chunk = chunk_of_row(chunks_, first_row); chunk <= last; ++chunk)
      asm volatile("red.release.sys.global.add.u32 [%0], 1;" ::"l"(chunks_.done + chunk) : "memory");
  }
  // A named barrier of the consumer threads, after CUTLASS's reserved ones.
  static constexpr uint32_t kAnnounceBarrier = 0;  // NamedBarrier adds the reserved count

  CUTLASS_DEVICE void wait_for_rows(int tile) const {
    if (chunks_.flags == nullptr) return;                 // nothing arrives: every row is local
    if (cutlass::canonical_warp_idx_sync() != 0) return;  // not the warp that loads A
    const int first_row = tile * chunks_.tile_rows;
    if (first_row >= chunks_.rows) return;  // cluster padding: the TMA clips it
    if ((threadIdx.x & 31) == 0) {
      const int last_row = min(first_row + chunks_.tile_rows, chunks_.rows) - 1;
      const int last = chunk_of_row(chunks_, last_row);
      for (int chunk = chunk_of_row(chunks_, first_row); chunk <= last; ++chunk) {
        if (chunk / chunks_.pieces == chunks_.ready_shard) continue;  // in place before the GEMM
        if (!wait_for_flag(chunk)) break;
      }
    }
    __syncwarp();
    // The copied rows were written by copy engines; the TMA loads that follow (issued by whichever
    // lane the mainloop elects) read through the async proxy.
    asm volatile("fence.proxy.async.global;" ::: "memory");
  }

  // False when the wait failed (recorded; the tile runs on whatever the rows hold).
  CUTLASS_DEVICE bool wait_for_flag(int chunk) const {
    const uint32_t* flag = chunks_.flags + chunk;
    if (symmem::device::ld_acquire_sys(flag) != 0u) return true;
    const uint64_t start = symmem::device::global_timer_ns();
    const int shard = chunk / chunks_.pieces;
    for (uint32_t spins = 1;; ++spins) {
      if (symmem::device::ld_acquire_sys(flag) != 0u) return true;
      if (spins > 64) __nanosleep(100);  // a piece takes microseconds: leave the issue slots to the MMA warps
      // One thread of a CTA waits here: it reads the abort word every round (keep_waiting's
      // few-thread form; the turns cost these kernels register spills).
      if ((spins & 255u) == 0u && !symmem::device::keep_waiting(chunks_.sync, start, shard, chunk)) return false;
    }
  }

  ChunkFlags chunks_{};
  // The consumer thread's last finished tile, announced after the next one (announce_stored).
  int pending_m_ = 0, pending_n_ = 0;
  bool has_pending_ = false;
};

}  // namespace symmem::detail

namespace cutlass::gemm::kernel::detail {

template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<symmem::detail::FlagWaitingScheduler, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = symmem::detail::FlagWaitingTileScheduler;
};

}  // namespace cutlass::gemm::kernel::detail
