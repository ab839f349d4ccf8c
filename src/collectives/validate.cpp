#include "collectives/validate.hpp"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/check.hpp"
#include "heap/communicator_impl.hpp"

namespace symmem::detail {

void require_device_pointer(const void* p, size_t bytes, const char* what, const char* op, Communicator& comm) {
  if (bytes == 0) return;
  if (!p) throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + what + " is null");
  if (comm.find(p, bytes)) return;
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of this query
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": " + what + " is not a CUDA pointer (" + cudaGetErrorName(err) + ")");
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + what + " is host memory; pass device memory");
  if (attr.type == cudaMemoryTypeDevice && attr.device != comm.device())
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + what + " is on device " +
                                                 std::to_string(attr.device) + ", the communicator uses device " +
                                                 std::to_string(comm.device()));
}

void require_no_partial_overlap(const void* out, size_t out_bytes, const void* in, size_t in_bytes, bool in_place,
                                const char* op) {
  if (in_place) return;
  const auto o = reinterpret_cast<uintptr_t>(out);
  const auto i = reinterpret_cast<uintptr_t>(in);
  if (o < i + in_bytes && i < o + out_bytes)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": input and output overlap but the call is not in place");
}

void check_args_across_ranks(Communicator& comm, const char* op, size_t count, DataType type, Algo algo) {
  if (!comm.impl().check_args) return;
  struct Args {
    char op[24];
    uint64_t count;
    int32_t type;
    int32_t algo;
  };
  Args mine{};
  std::strncpy(mine.op, op, sizeof(mine.op) - 1);
  mine.count = count;
  mine.type = static_cast<int32_t>(type);
  mine.algo = static_cast<int32_t>(algo);
  std::vector<Args> all(comm.world());
  comm.bootstrap().all_gather(&mine, all.data(), sizeof(Args));
  const std::string me = std::to_string(comm.rank());
  for (int r = 0; r < comm.world(); ++r) {
    const Args& a = all[r];
    const std::string them = std::to_string(r);
    if (std::strncmp(a.op, mine.op, sizeof(a.op)) != 0)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(op) + ": rank " + them + " called " + a.op + " while rank " + me + " called " + op);
    if (a.count != mine.count)
      throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": rank " + them + " has " + std::to_string(a.count) +
                                                   " elements, rank " + me + " has " + std::to_string(count));
    if (a.type != mine.type)
      throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": rank " + them + " uses " +
                                                   dtype_name(static_cast<DataType>(a.type)) + ", rank " + me +
                                                   " uses " + dtype_name(type));
    if (a.algo != mine.algo)
      throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": rank " + them + " asked for " +
                                                   algo_name(static_cast<Algo>(a.algo)) + ", rank " + me + " for " +
                                                   algo_name(algo));
  }
}

}  // namespace symmem::detail
