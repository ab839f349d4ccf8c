#include "nccl/real_nccl.hpp"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/env.hpp"

// Defined by the shim's entry points (nccl/entry_points.cpp): a candidate that exports it is the
// shim itself.
extern "C" int symmem_nccl_shim_identity();

namespace symmem::nccl {
namespace {

// The directory holding this library (the wheel puts it in site-packages/symmem/).
std::string own_directory() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<const void*>(&symmem_nccl_shim_identity), &info) || !info.dli_fname) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

struct Candidate {
  std::string name;
  int flags;
  std::string why;  // shown when nothing loads
};

std::vector<Candidate> candidates() {
  std::vector<Candidate> list;
  const std::string forced = env::nccl_library();
  if (forced != env::kDefaultNcclLibrary) list.push_back({forced, RTLD_NOW | RTLD_LOCAL, "SYMMEM_NCCL_LIBRARY"});
  list.push_back({"libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, "already loaded"});
  const std::string own = own_directory();
  if (!own.empty()) list.push_back({own + "/../nvidia/nccl/lib/libnccl.so.2", RTLD_NOW | RTLD_LOCAL, "nvidia-nccl wheel"});
  list.push_back({"libnccl.so.2", RTLD_NOW | RTLD_LOCAL, "loader search path"});
  return list;
}

template <typename F>
void resolve(void* handle, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(handle, name));
}

// The loaded object holding `inside`: its path and the span of its loaded segments ([0, 0) and no
// path when none holds it).
struct LoadedObject {
  uintptr_t begin = 0, end = 0;
  std::string path;
};
LoadedObject loaded_object(const void* inside) {
  struct Search {
    uintptr_t at;
    LoadedObject found;
  } search{reinterpret_cast<uintptr_t>(inside), {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        uintptr_t lo = UINTPTR_MAX, hi = 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          lo = std::min<uintptr_t>(lo, info->dlpi_addr + ph.p_vaddr);
          hi = std::max<uintptr_t>(hi, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
        }
        if (s->at < lo || s->at >= hi) return 0;
        s->found = {lo, hi, info->dlpi_name ? info->dlpi_name : ""};
        return 1;
      },
      &search);
  return search.found;
}

std::string& failure = *new std::string();  // never destroyed either (RealNccl::get)

std::unique_ptr<RealNccl> load() {
  for (const Candidate& c : candidates()) {
    dlerror();
    void* handle = dlopen(c.name.c_str(), c.flags);
    if (!handle) {
      const char* why = dlerror();
      if (!(c.flags & RTLD_NOLOAD)) failure += c.name + " (" + c.why + "): " + (why ? why : "not found") + "; ";
      continue;
    }
    // The shim under NCCL's name would forward to itself.
    if (dlsym(handle, "symmem_nccl_shim_identity")) {
      failure += c.name + " (" + c.why + ") is libsymmem_nccl.so itself; ";
      dlclose(handle);
      continue;
    }
    auto lib = std::make_unique<RealNccl>();
#define SYMMEM_NCCL_RESOLVE(name) resolve(handle, #name, &lib->name);
    SYMMEM_NCCL_FUNCTIONS(SYMMEM_NCCL_RESOLVE)
#undef SYMMEM_NCCL_RESOLVE
    // What the shim itself relies on; the rest may be missing in an older NCCL (calling one then
    // fails with ncclInvalidUsage naming it).
    const bool usable = lib->ncclGetVersion && lib->ncclGetUniqueId && lib->ncclCommInitRank &&
                        lib->ncclCommCount && lib->ncclCommUserRank && lib->ncclCommCuDevice &&
                        lib->ncclGetErrorString && lib->ncclGetLastError && lib->ncclGroupStart &&
                        lib->ncclGroupEnd && lib->ncclCommGetAsyncError && lib->ncclCommAbort && lib->ncclCommDestroy;
    if (!usable || lib->ncclGetVersion(&lib->version) != ncclSuccess) {
      failure += c.name + " (" + c.why + ") lacks functions of NCCL 2.18+; ";
      dlclose(handle);
      continue;
    }
    const LoadedObject object = loaded_object(reinterpret_cast<const void*>(lib->ncclGetVersion));
    lib->code_begin = object.begin;
    lib->code_end = object.end;
    lib->path = object.path.empty() ? c.name : object.path;
    // The handle stays open for the process: communicators live in it.
    return lib;
  }
  return nullptr;
}

}  // namespace

const RealNccl* RealNccl::get() {
  // Never destroyed: calls may still come at process exit, after static destructors (PyTorch's
  // watchdog, atexit teardown of communicators), and the library handle stays open anyway.
  static std::once_flag once;
  static const RealNccl* loaded = nullptr;
  std::call_once(once, [] { loaded = load().release(); });
  return loaded;
}

const std::string& RealNccl::load_failure() {
  get();
  return failure;
}

}  // namespace symmem::nccl
