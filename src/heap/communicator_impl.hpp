// What a communicator owns. Collectives reach it through Communicator::impl().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/fd_exchange.hpp"
#include "device/device_types.hpp"
#include "heap/heap.hpp"
#include "plan/tuning_table.hpp"
#include "symmem/communicator.hpp"

namespace symmem::detail {
class CopyEngineState;
}

namespace symmem {

struct Communicator::Impl {
  Communicator* owner = nullptr;
  std::shared_ptr<Bootstrap> bootstrap;
  int device = 0;
  int rank = 0;
  int world = 1;
  int sm_count = 0;
  std::string gpu_name;
  int64_t timeout_ms = 30000;
  std::unique_ptr<detail::FdExchange> exchange;
  std::unique_ptr<detail::Heap> heap;
  std::vector<std::unique_ptr<Buffer>> buffers;

  Buffer* control = nullptr;                      // its signal pad carries every SM collective's barrier flags
  Buffer* low_latency = nullptr;                  // receive areas of the low-latency protocol
  Buffer* scratch = nullptr;                      // staging for inputs/outputs outside the heap; grows on demand
  Buffer* receive_area = nullptr;                 // one-shot push: peers store their chunks here; grows on demand
  uint32_t* epochs = nullptr;                     // per-block epoch counters (local device memory)
  detail::DeviceStatus* status_host = nullptr;    // mapped pinned memory
  detail::DeviceStatus* status_device = nullptr;  // the same, as the device sees it
  std::unique_ptr<detail::CopyEngineState> copy_engine;

  // Knobs read once at creation, so that no call pays for the environment on its hot path.
  Algo forced_algo = Algo::kAuto;               // SYMMEM_ALGO
  int forced_blocks = 0;                        // SYMMEM_BLOCKS
  bool debug = false;                           // SYMMEM_DEBUG
  bool check_args = false;                      // SYMMEM_CHECK_ARGS
  bool push_bulk = true;                        // SYMMEM_PUSH_BULK
  const detail::TuningTable* tuning = nullptr;  // for this GPU
  detail::SyncArgs sync_template{};             // sync_args() without the op
  std::string abort_reason;                     // set once a wait timed out; every later call fails with it
  bool closed = false;

  Impl();
  ~Impl();

  // Synchronisation arguments of the SM kernels for `op`.
  detail::SyncArgs sync_args(uint32_t op) const;
  // Throws if the communicator is closed or aborted, or if a device wait has timed out.
  void ensure_usable(const char* op);
  // Collective when it grows: a symmetric buffer of at least `bytes`. Not allowed during
  // CUDA graph capture of `stream` (the error says how to avoid it).
  Buffer* scratch_of(size_t bytes, cudaStream_t stream, const char* op);
  // The same for the receive area of one-shot push (two parity halves).
  Buffer* receive_area_of(size_t bytes, cudaStream_t stream, const char* op);
  // Bytes of each sender's low-latency slot.
  static constexpr size_t kLowLatencySlotBytes = size_t(1) << 20;

 private:
  Buffer* grown(Buffer*& buffer, size_t bytes, cudaStream_t stream, const char* op, const char* what,
                const char* advice);
};

}  // namespace symmem
