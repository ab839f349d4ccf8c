#include "net/nccl_library.hpp"

#include <dlfcn.h>

#include <memory>
#include <mutex>
#include <stdexcept>

#include "common/check.hpp"
#include "common/env.hpp"

namespace symmem::detail {
namespace {

template <typename F>
void resolve(void* handle, const std::string& path, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(handle, name));
  if (!*fn)
    throw Error(ErrorCode::kUnsupported,
                "NCCL (" + path + ") has no " + name + "; symmem needs NCCL 2.18 or newer between nodes");
}

NcclLibrary load() {
  NcclLibrary lib;
  lib.path = env::nccl_library();
  // RTLD_NOLOAD first: a libnccl.so.2 already in the process (torch's) is the one to share.
  void* handle = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!handle) handle = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw Error(ErrorCode::kUnsupported,
                "this communicator spans several nodes, and symmem moves data between nodes "
                "with NCCL, but " +
                    lib.path + " could not be loaded (" + (why ? why : "unknown") +
                    "); install NCCL 2.18+ or point SYMMEM_NCCL_LIBRARY at libnccl.so.2");
  }
  resolve(handle, lib.path, "ncclGetVersion", &lib.get_version);
  resolve(handle, lib.path, "ncclGetUniqueId", &lib.get_unique_id);
  resolve(handle, lib.path, "ncclCommInitRankConfig", &lib.comm_init_rank_config);
  resolve(handle, lib.path, "ncclCommGetAsyncError", &lib.comm_get_async_error);
  resolve(handle, lib.path, "ncclCommAbort", &lib.comm_abort);
  resolve(handle, lib.path, "ncclCommDestroy", &lib.comm_destroy);
  resolve(handle, lib.path, "ncclCommFinalize", &lib.comm_finalize);
  resolve(handle, lib.path, "ncclGetErrorString", &lib.get_error_string);
  resolve(handle, lib.path, "ncclGetLastError", &lib.get_last_error);
  resolve(handle, lib.path, "ncclGroupStart", &lib.group_start);
  resolve(handle, lib.path, "ncclGroupEnd", &lib.group_end);
  resolve(handle, lib.path, "ncclSend", &lib.send);
  resolve(handle, lib.path, "ncclRecv", &lib.recv);
  resolve(handle, lib.path, "ncclAllGather", &lib.all_gather);
  if (lib.get_version(&lib.version) != ncclSuccess || lib.version < 21800)
    throw Error(ErrorCode::kUnsupported, lib.path + " is NCCL version code " + std::to_string(lib.version) +
                                             "; symmem needs NCCL 2.18 or newer between nodes");
  // The handle stays open for the process: communicators may outlive any one owner.
  return lib;
}

}  // namespace

const NcclLibrary& NcclLibrary::get() {
  // A failed load is retried by the next caller (the error may be fixed by then, e.g. torch
  // imported later); a successful one is kept for the process (never destroyed: threads between
  // nodes may still use it while exit() runs the destructors of statics).
  static std::mutex mutex;
  static NcclLibrary* loaded = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (!loaded) loaded = new NcclLibrary(load());
  return *loaded;
}

std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  const NcclLibrary& lib = NcclLibrary::get();
  std::string text = lib.get_error_string(result);
  const char* last = lib.get_last_error(comm);
  if (last && *last) text += ": " + std::string(last);
  return text;
}

}  // namespace symmem::detail
