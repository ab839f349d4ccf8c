#include "collectives/validate.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "common/check.hpp"

namespace symmem::detail {

void require_device_pointer(const void* p, size_t bytes, const char* what, const char* op, Communicator& comm) {
  if (bytes == 0 || (p && comm.find(p, bytes))) return;
  require_device_memory(p, bytes, what, op, comm);
}

void require_device_memory(const void* p, size_t bytes, const char* what, const char* op, Communicator& comm) {
  if (bytes == 0) return;
  if (!p) throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + what + " is null");
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

}  // namespace symmem::detail
