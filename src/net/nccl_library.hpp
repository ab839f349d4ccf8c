// NCCL, the engine between nodes, loaded at run time (dlopen of libnccl.so.2, or
// SYMMEM_NCCL_LIBRARY): the library links no NCCL, so a job on one node never needs it, and inside
// PyTorch the libnccl.so.2 torch already loaded is the one used. Only nccl.h's types are compiled in.
#pragma once

#include <nccl.h>

#include <string>

namespace symmem::detail {

struct NcclLibrary {
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&::ncclCommAbort) comm_abort = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommFinalize) comm_finalize = nullptr;
  decltype(&::ncclGetErrorString) get_error_string = nullptr;
  decltype(&::ncclGetLastError) get_last_error = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  decltype(&::ncclSend) send = nullptr;
  decltype(&::ncclRecv) recv = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  std::string path;  // what was loaded
  int version = 0;   // ncclGetVersion's code, e.g. 22809

  // Loads NCCL once (thread-safe). Throws kUnsupported naming the library and dlerror() when it
  // cannot be loaded or lacks a function symmem needs (NCCL 2.18 or newer).
  static const NcclLibrary& get();
};

// "ncclRemoteError: <NCCL's last error text>" for messages.
std::string nccl_error_text(ncclResult_t result, ncclComm_t comm);

}  // namespace symmem::detail
