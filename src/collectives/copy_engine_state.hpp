// State of the copy-engine all-gather: the side streams its copies run on, the events that fork
// and join them, its handshake flags, and the watchdog that turns a dead peer into an error.
//
// Handshake (stream memory operations only, no kernel, so no SM is used):
//   ready: write 1 into every peer's ready[me]; wait until my ready[p] == 1 for every peer;
//          reset my ready[p] = 0.            -> every peer's input/output is ready for this call
//   copies: one cudaMemcpyBatchAsync on the caller's stream (the driver spreads it over the copy
//          engines); under graph capture, cudaMemcpyAsync on side streams forked and joined
//          with events (batches cannot be captured)
//   done:  the same with the done flags.     -> every peer finished reading my input
// A peer can write the next call's ready[me] only after passing this call's done wait, which
// needs my done write, which comes after my ready reset: flags are never lost, and since their
// values are constant (0/1) they stay right across CUDA graph replays.
//
// Stream waits have no deadline of their own. The watchdog thread watches each eager call; past
// the deadline it finds the peers whose flags never came, records them in the status word (the
// next call or synchronize raises kTimeout naming them) and releases the stuck stream by writing
// the missing flags itself. Calls inside a CUDA graph are not watched (documented limitation).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "device/device_types.hpp"
#include "symmem/communicator.hpp"

namespace symmem::detail {

class CopyEngineState {
 public:
  static constexpr int kMaxStreams = 16;

  CopyEngineState(Communicator::Impl& impl, Buffer* flags);

  int streams() const { return streams_count_; }
  bool push() const { return push_; }
  size_t piece_bytes() const { return piece_bytes_; }
  bool batch() const { return batch_; }
  ~CopyEngineState();  // stops the watchdog; never throws

  cudaStream_t side_stream(int i) const { return streams_[i]; }
  cudaEvent_t fork_event() const { return fork_; }
  cudaEvent_t join_event(int i) const { return joins_[i]; }
  Buffer* flags() const { return flags_; }

  // Flag word indices in the flags buffer's signal pad.
  static size_t ready_slot(int peer) { return peer; }
  static size_t done_slot(int peer) { return kMaxWorld + peer; }

  // An event from the pool; record it after a call on the caller's stream and pass it to watch().
  cudaEvent_t acquire_event();
  void watch(cudaEvent_t event);

 private:
  void watchdog_loop();
  void expire(cudaEvent_t event);

  Communicator::Impl& impl_;
  Buffer* flags_;
  int streams_count_ = 4;
  bool push_ = true;
  size_t piece_bytes_ = 0;
  bool batch_ = true;
  cudaStream_t streams_[kMaxStreams] = {};
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t joins_[kMaxStreams] = {};
  cudaStream_t rescue_stream_ = nullptr;  // non-blocking: reads and writes flags beside a stuck stream
  uint32_t* host_words_ = nullptr;        // pinned staging for those reads and writes

  std::mutex mutex_;
  std::condition_variable wake_;
  struct Watched {
    cudaEvent_t event;
    std::chrono::steady_clock::time_point deadline;
  };
  std::deque<Watched> queue_;
  std::vector<cudaEvent_t> free_events_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace symmem::detail
