#include "common/driver_api.hpp"

#include <cuda_runtime_api.h>

#include <mutex>

#include "common/check.hpp"

namespace symmem::detail {
namespace {

// The ABI version we ask the driver for: every entry point below exists since CUDA 12.0.
constexpr unsigned int kDriverApiVersion = 12000;

template <typename Fn>
void resolve(const char* symbol, Fn* fn) {
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  void* ptr = nullptr;
  cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &ptr, kDriverApiVersion, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || ptr == nullptr) {
    throw Error(ErrorCode::kCudaError, std::string("cannot resolve CUDA driver entry point ") + symbol + ": " +
                                           (err != cudaSuccess ? cudaGetErrorName(err) : "symbol not found") +
                                           " (is an NVIDIA driver for CUDA 12 or newer installed?)");
  }
  *fn = reinterpret_cast<Fn>(ptr);
}

}  // namespace

const DriverApi& DriverApi::get() {
  static DriverApi api;
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    try {
      resolve("cuGetErrorName", &api.get_error_name);
      resolve("cuMemGetAllocationGranularity", &api.mem_get_allocation_granularity);
      resolve("cuMemCreate", &api.mem_create);
      resolve("cuMemRelease", &api.mem_release);
      resolve("cuMemAddressReserve", &api.mem_address_reserve);
      resolve("cuMemAddressFree", &api.mem_address_free);
      resolve("cuMemMap", &api.mem_map);
      resolve("cuMemUnmap", &api.mem_unmap);
      resolve("cuMemSetAccess", &api.mem_set_access);
      resolve("cuMemExportToShareableHandle", &api.mem_export_to_shareable_handle);
      resolve("cuMemImportFromShareableHandle", &api.mem_import_from_shareable_handle);
      resolve("cuMemRetainAllocationHandle", &api.mem_retain_allocation_handle);
      resolve("cuMemGetAllocationPropertiesFromHandle", &api.mem_get_allocation_properties_from_handle);
      resolve("cuMemGetAddressRange", &api.mem_get_address_range);
      resolve("cuStreamWriteValue32", &api.stream_write_value32);
      resolve("cuStreamWaitValue32", &api.stream_wait_value32);
      resolve("cuStreamBatchMemOp", &api.stream_batch_mem_op);
      resolve("cuDeviceGetAttribute", &api.device_get_attribute);
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw Error(ErrorCode::kCudaError, failure);
  return api;
}

std::string cu_error_name(CUresult result) {
  const char* name = nullptr;
  try {
    if (DriverApi::get().get_error_name(result, &name) == CUDA_SUCCESS && name) return name;
  } catch (const Error&) {
  }
  return "CUresult " + std::to_string(static_cast<int>(result));
}

void throw_cu(CUresult result, const char* expr, const char* file, int line) {
  throw Error(ErrorCode::kCudaError,
              std::string(expr) + " returned " + cu_error_name(result) + " at " + where(file, line));
}

}  // namespace symmem::detail
