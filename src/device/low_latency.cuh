// The low-latency line protocol shared by the low-latency all-reduce, all-gather and
// reduce-scatter: no barrier round trip. A sender stores each 4-byte word of its payload, packed
// with the call's signature as {signature << 32 | word} in one 8-byte store, into its slot of the
// receiver's area; the receiver polls each line until the tag shows, so flag and data arrive
// together.
//
// Protocol. A receive area (Workspaces::low_latency) is two parity halves of kMaxWorld sender
// slots of 8-byte lines.
//   - A line is {tag << 32 | data}; tag 0 is an empty line. The heap zeroes the area, so a new
//     area is all empty lines: no reset is ever needed.
//   - The call's parity (the communicator's call counter, device/call_counter.cuh, the same on
//     every rank whatever the grid) picks the half.
//   - A sender stores each line of a call once, tagged with the call's signature (nonzero).
//   - The receiver takes a line whose tag is its own signature and then clears it (stores 0 into
//     its own area): every line stored in a call is consumed and cleared in that call, so no line
//     ever survives its call. A nonzero tag other than its signature means the sender is in a
//     different call: a mismatch, recorded with the sender and its signature (device/wait.cuh).
// Why the clear is safe (it never erases a newer line): a sender stores into the same half again
// only two counted calls later. To finish the counted call in between, it needs something that
// exists only once this rank has started that call (its lines or its barrier arrival: every
// counted collective makes every rank wait for every other), and this rank starts it only from
// its next kernel, which begins after this kernel, clears included, has finished (stream order).
// The same chain keeps a sender at most one call ahead, so it never overwrites a line this rank
// has not read yet. Every kernel that uses this protocol must therefore receive from every peer
// in every call (all-reduce, all-gather and reduce-scatter all do).
// Why the tag is the signature, and why clearing removes the wrap: a tag that counted calls would,
// after 2^32 calls, let a stale line pass for fresh data. With clear-after-read there is no stale
// line to confuse, so the tag only has to tell this call's line from an empty one (0) and from
// another call's (a different signature).
// After a failure the area may hold unconsumed lines; the communicator is unusable then anyway.
#pragma once

#include <cstdint>

#include "device/copy.cuh"
#include "device/device_types.hpp"
#include "device/ptx.cuh"
#include "device/reduce.cuh"
#include "device/wait.cuh"

namespace symmem::device {

// Sender `sender`'s slot in the half of this call's parity of a receive area.
__device__ __forceinline__ uint64_t* low_latency_slot(uint64_t* area, uint32_t call, int sender, size_t slot_words) {
  return area + (size_t(call & 1u) * kMaxWorld + sender) * slot_words;
}

// Word w of a buffer of `bytes` bytes, zero-padded past the end; any alignment (a buffer that is
// not 4-byte aligned is read byte by byte).
__device__ __forceinline__ uint32_t load_word(const void* p, size_t w, size_t bytes) {
  if ((w + 1) * 4 <= bytes && reinterpret_cast<uintptr_t>(p) % 4 == 0) return static_cast<const uint32_t*>(p)[w];
  uint32_t word = 0;
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (size_t i = w * 4; i < bytes && i < w * 4 + 4; ++i) word |= uint32_t(b[i]) << (8 * (i - w * 4));
  return word;
}

// Stores the bytes of `word` (word w of a buffer of `bytes` bytes) that exist; any alignment.
__device__ __forceinline__ void store_word_bytes(void* p, size_t w, size_t bytes, uint32_t word) {
  if ((w + 1) * 4 <= bytes && reinterpret_cast<uintptr_t>(p) % 4 == 0) {
    static_cast<uint32_t*>(p)[w] = word;
    return;
  }
  uint8_t* b = static_cast<uint8_t*>(p);
  for (size_t i = w * 4; i < bytes && i < w * 4 + 4; ++i) b[i] = static_cast<uint8_t>(word >> (8 * (i - w * 4)));
}

// Stores the elements of `word` (word index w of a range of `count` elements) that exist.
template <typename T>
__device__ __forceinline__ void store_word(T* out, size_t w, size_t count, uint32_t word) {
  constexpr int kPerWord = 4 / sizeof(T);
#pragma unroll
  for (int e = 0; e < kPerWord; ++e)
    if (w * kPerWord + e < count) out[w * kPerWord + e] = reinterpret_cast<const T*>(&word)[e];
}

// The elements of word[0..world) combined in rank order, element by element.
template <typename T, int kOp>
__device__ __forceinline__ uint32_t reduce_word(const uint32_t (&word)[kMaxWorld], int world) {
  constexpr int kPerWord = 4 / sizeof(T);
  using A = typename Accum<T>::type;
  uint32_t result = 0;
#pragma unroll
  for (int e = 0; e < kPerWord; ++e) {
    A acc = to_accum(reinterpret_cast<const T*>(&word[0])[e]);
#pragma unroll
    for (int r = 1; r < kMaxWorld; ++r)
      if (r < world) acc = combine<kOp>(acc, to_accum(reinterpret_cast<const T*>(&word[r])[e]));
    reinterpret_cast<T*>(&result)[e] = finish<T, kOp>(acc, average_scale<kOp>(world));
  }
  return result;
}

// Word w of the ranks in `senders` (a bit per rank): this rank's is `own`; sender r's comes from
// its slot at slots + r * slot_words, and its line is cleared once taken. Each round loads the
// line of every peer still missing at once, so the waits for different peers overlap. The lines
// stay in registers until every one has come (static indices only: nothing goes to local
// memory). False on timeout, mismatch (`phase` names the wait in the record) or abort; a thread
// whose wait fails stops, and the others see the abort word (which every timeout or mismatch
// sets) in their turn, one thread of a block per round (every thread of the kernel may wait here),
// and then the claim word within a round.
__device__ __forceinline__ bool collect_words(const detail::SyncArgs& s, uint64_t* slots, size_t slot_words, size_t w,
                                              uint32_t senders, uint32_t own, int phase, uint32_t (&word)[kMaxWorld]) {
  uint32_t missing = senders & ~(1u << s.rank);
  uint64_t line[kMaxWorld] = {};
  const uint64_t start = global_timer_ns();
  for (uint32_t spins = 1; missing != 0; ++spins) {
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (missing >> r & 1u) line[r] = ld_relaxed_sys_u64(slots + r * slot_words + w);
    int foreign = -1;  // a sender whose line carries another call's signature
    uint32_t foreign_tag = 0;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r) {
      if (!(missing >> r & 1u)) continue;
      const uint32_t tag = static_cast<uint32_t>(line[r] >> 32);
      if (tag == s.signature) {
        missing &= ~(1u << r);
        // Consumed: empty again (after the load in this thread's order, so after the sender's store).
        st_relaxed_sys_u64(slots + r * slot_words + w, 0);
      } else if (tag != 0u) {
        foreign = r;
        foreign_tag = tag;
      }
    }
    if (foreign >= 0) {
      record_failure(s, detail::kStatusMismatch, foreign, phase, foreign_tag);
      return false;
    }
    if (missing != 0 && (spins & 255u) == 0u &&
        !keep_waiting(s, start, __ffs(missing) - 1, phase, abort_turn(spins >> 8, detail::kThreadsPerBlock)))
      return false;
  }
#pragma unroll
  for (int r = 0; r < kMaxWorld; ++r) word[r] = r == s.rank ? own : static_cast<uint32_t>(line[r]);
  return true;
}

// The word of one line from `sender`, left in place: for lines that several blocks read (the
// all-to-all's headers), which one block clears once every reader is done, still within the call
// (the clear-after-read rule above holds: no line outlives its call). Read with acquire: what the
// sender wrote before its release of the line (a fence before its store) is ordered before what
// this thread, and after a __syncthreads its block, does next. `watch` (optional): another line of
// the sender's slot whose foreign signature, while this line is still empty, tells at once that
// the sender is in another call (a line this call has the sender store later shows nothing until
// then). False on timeout, mismatch (`phase` names the wait in the record) or abort.
__device__ __forceinline__ bool read_line(const detail::SyncArgs& s, const uint64_t* line, int sender, int phase,
                                          uint32_t* word, const uint64_t* watch = nullptr) {
  const uint64_t start = global_timer_ns();
  for (uint32_t spins = 1;; ++spins) {
    const uint64_t value = ld_acquire_sys_u64(line);
    uint32_t tag = static_cast<uint32_t>(value >> 32);
    if (tag == s.signature) {
      *word = static_cast<uint32_t>(value);
      return true;
    }
    if (tag == 0u && watch != nullptr) {
      tag = static_cast<uint32_t>(ld_relaxed_sys_u64(watch) >> 32);
      if (tag == s.signature) tag = 0u;
    }
    if (tag != 0u) {
      record_failure(s, detail::kStatusMismatch, sender, phase, tag);
      return false;
    }
    if ((spins & 255u) == 0u &&
        !keep_waiting(s, start, sender, phase, abort_turn(spins >> 8, detail::kThreadsPerBlock)))
      return false;
  }
}

}  // namespace symmem::device
