// Every environment variable symmem reads, declared once with its default, but the settings every
// rank must agree on (SYMMEM_ALGO, SYMMEM_CE_*, ...), whose table is comm/agreed_settings.cpp.
// docs/environment.md lists them all for users.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace symmem::env {

// SYMMEM_TIMEOUT_MS (default 30000): deadline of every device spin-wait and host wait (an agreed
// setting; the bootstrap reads it too).
int64_t timeout_ms();
// SYMMEM_DEBUG (default 0): warnings and each call's chosen algorithm go to stderr.
bool debug();
// SYMMEM_HEAP_RESERVE_GB (default 64): virtual address space reserved per rank for the heap.
size_t heap_reserve_bytes();
// SYMMEM_TUNING_FILE (default: the table shipped for the GPU): tuning table JSON (the table in force
// is an agreed setting).
std::string tuning_file();

// SYMMEM_PDL (default 1): launch kernels with programmatic dependent launch, so that a kernel's
// launch overlaps the previous kernel on its stream (device/dependent_launch.cuh).
bool programmatic_launch();

// SYMMEM_NODE_SIZE (default 0 = detect): ranks per node (NVLink domain) of a communicator covering
// the whole job (WORLD_SIZE ranks). Unset, such a communicator's nodes come from LOCAL_WORLD_SIZE;
// others' from host names. Set it to simulate several nodes on one host (docs/hierarchical.md).
int node_size();
// SYMMEM_NCCL_LIBRARY (default libnccl.so.2): the NCCL loaded for communicators spanning nodes,
// and the real NCCL that libsymmem_nccl.so forwards to when set to anything else
// (src/nccl/real_nccl.hpp says which it takes otherwise).
inline constexpr const char* kDefaultNcclLibrary = "libnccl.so.2";
std::string nccl_library();

// libsymmem_nccl.so, symmem behind NCCL's API (docs/nccl.md). Every rank must see the same values
// (the ranks of a node check them when a communicator is made and forward everything otherwise).
// SYMMEM_NCCL (default auto): "auto" serves the calls symmem does faster (the cutover table),
// "all" every call symmem can express, "off" forwards everything (pure forwarding, for A/B runs).
std::string nccl_mode();
// SYMMEM_NCCL_INIT (default lazy): "lazy" makes a communicator's symmem side at its first served
// call (or window registration); "eager" when the NCCL communicator is made.
std::string nccl_init();
// SYMMEM_NCCL_WORKSPACE_MB (default 64): the workspace budget of each symmem communicator the shim
// makes (CommConfig::workspace_bytes).
size_t nccl_workspace_bytes();
// SYMMEM_NCCL_TIMEOUT_MS (default 600000, PyTorch's collective timeout): the deadline of the shim's
// device waits and of its bootstrap, long because NCCL programs expect ranks to arrive late (a
// rank saving a checkpoint while the others wait).
int64_t nccl_timeout_ms();
// SYMMEM_NCCL_CUTOVER_FILE (default: the table shipped for the GPU, tuning/nccl/): where NCCL is
// faster than symmem, by collective, world, size and buffer kind.
std::string nccl_cutover_file();
// SYMMEM_NCCL_ROUTE_LOG (default unset): a path prefix; each process then writes
// <prefix>.<pid>.csv, one line per distinct call shape with where it went and why (for
// benchmarks: which rows symmem served).
std::string nccl_route_log();

// SYMMEM_TEST_SHARED_GPU (default 0): for tests only. Lets several ranks of one process (threads
// with make_thread_bootstrap) use the same GPU, which a real job must never do: their kernels
// would wait for each other unless they all fit on the GPU at once (each then plans with a share
// of the SMs that makes them fit: plan/shared_gpu.hpp). tests/gpu/shared_gpu_tests.cpp runs the
// multi-rank protocols this way on a one-GPU machine.
bool ranks_may_share_gpu();

// SYMMEM_TEST_NCCL_ONE_RANK (default 0): for tests only. libsymmem_nccl.so serves communicators of
// one rank, which it otherwise forwards (there is nothing to move), so that its serving path runs
// against the real NCCL, under unchanged programs, on a machine with one GPU.
bool nccl_serves_one_rank();

// Read a variable with a default; exposed for tests and the tools.
std::string get_string(const char* name, const std::string& fallback);
int64_t get_int(const char* name, int64_t fallback);

}  // namespace symmem::env
