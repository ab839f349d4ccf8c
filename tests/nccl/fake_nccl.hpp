// What the stand-in NCCL's two files share (tests/nccl/fake_nccl.cpp: communicators, groups,
// memory; tests/nccl/fake_nccl_exchange.cpp: the data its collectives move when asked to).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

struct ncclComm {
  ncclComm(int rank_, int nranks_, int device_, const ncclUniqueId& id_)
      : rank(rank_), nranks(nranks_), device(device_), id(id_) {}
  int rank;
  int nranks;
  int device;
  ncclUniqueId id;  // what its ranks met by (a split's child: derived from the parent's)
  int splits = 0;   // its splits so far (every rank of a communicator splits it in the same order)
  std::atomic<long> forwarded{0};
  // The exchange (fake_nccl_exchange.cpp): collectives so far, point-to-point messages so far per
  // peer, and this rank's files that peers may still read.
  long collectives = 0;
  std::map<int, long> sent, received;
  std::vector<std::pair<std::string, std::vector<std::string>>> unread;  // file, its readers' marks
  std::string failure;  // the first failed call's error: every later call fails with it (the caller's thread)
  std::atomic<int> failure_code{ncclSuccess};  // its code, for ncclCommGetAsyncError (any thread)
};

namespace fake_nccl {

// A file of the meeting folder (SYMMEM_FAKE_NCCL_MEETING_DIR, /tmp without it) named by the first
// 16 bytes of `id` and `what`.
std::string meeting_path(const ncclUniqueId& id, const std::string& what);

// How long a rank waits for its peers: SYMMEM_NCCL_TIMEOUT_MS, else 60 s.
std::chrono::milliseconds meeting_timeout();

// A meeting file is whole or absent: `head` then `data` written under another name, then renamed
// into place. False when it could not be written.
bool write_whole_file(const std::string& path, const void* head, size_t head_bytes, const void* data, size_t bytes);
// Whether `path` exists by `deadline` (polled).
bool wait_for_file(const std::string& path, std::chrono::steady_clock::time_point deadline);

// Whether collectives, sends and receives move data (SYMMEM_FAKE_NCCL_MOVE_DATA=1): through files
// of the meeting folder, reduced on the host in float64 (integers exactly) in rank order, rounded
// once. Without it they move nothing (the shim's tests must see that a served call never got here).
bool moves_data();

// A pre-multiplied sum's scalar: its bytes (host residence, read when it is made) or where to
// read them at each call (device residence).
struct PreMulSum {
  std::vector<unsigned char> host_value;
  const void* device_scalar;  // null for a host scalar
  ncclDataType_t type;
};
// One call of the data path; a group's calls are queued and run together at its end.
struct Call {
  enum Kind { kAllReduce, kAllGather, kReduceScatter, kAlltoAll, kBroadcast, kReduce, kGather, kScatter, kSend, kRecv };
  Kind kind;
  const void* send;
  void* recv;
  size_t count;  // NCCL's count of the call (per rank or per peer where NCCL says so)
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;  // root of rooted collectives; peer of send and receive
  ncclComm_t comm;
  cudaStream_t stream;
  std::optional<PreMulSum> pre_mul_sum;  // of op, taken when the call is made (NCCL lets the op go then)
};

// Runs `calls` as one group: every call's contribution is written before any is waited for, so
// one thread may drive several ranks' communicators (ncclCommInitAll) or pair sends with receives.
ncclResult_t run_group(const std::vector<Call>& calls);

// Removes what a communicator's peers have read (ncclCommDestroy, ncclCommAbort).
void forget(ncclComm_t comm);

// The stand-in's last error on this thread (ncclGetLastError).
std::string& last_error();

// The op handle of a new pre-multiplied sum; the sum of a handle (null when it is none); its end.
ncclRedOp_t add_pre_mul_sum(const void* scalar, ncclDataType_t type, bool on_device);
std::optional<PreMulSum> find_pre_mul_sum(ncclRedOp_t op);
void remove_pre_mul_sum(ncclRedOp_t op);

}  // namespace fake_nccl
