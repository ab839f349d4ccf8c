// The CUDA driver functions symmem uses, resolved at run time through the runtime's
// cudaGetDriverEntryPointByVersion so that no binary links libcuda: tests and tools load on
// machines without a GPU driver and fail with a clear error only when they touch the GPU.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

namespace symmem::detail {

struct DriverApi {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuMemGetAllocationGranularity) mem_get_allocation_granularity = nullptr;
  decltype(&::cuMemCreate) mem_create = nullptr;
  decltype(&::cuMemRelease) mem_release = nullptr;
  decltype(&::cuMemAddressReserve) mem_address_reserve = nullptr;
  decltype(&::cuMemAddressFree) mem_address_free = nullptr;
  decltype(&::cuMemMap) mem_map = nullptr;
  decltype(&::cuMemUnmap) mem_unmap = nullptr;
  decltype(&::cuMemSetAccess) mem_set_access = nullptr;
  decltype(&::cuMemExportToShareableHandle) mem_export_to_shareable_handle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) mem_import_from_shareable_handle = nullptr;
  decltype(&::cuMemRetainAllocationHandle) mem_retain_allocation_handle = nullptr;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) mem_get_allocation_properties_from_handle = nullptr;
  decltype(&::cuMemGetAddressRange) mem_get_address_range = nullptr;
  decltype(&::cuStreamWriteValue32) stream_write_value32 = nullptr;
  decltype(&::cuStreamWaitValue32) stream_wait_value32 = nullptr;
  decltype(&::cuStreamBatchMemOp) stream_batch_mem_op = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;

  // Resolves every entry point once (thread-safe); throws symmem::Error when the driver is
  // missing or too old.
  static const DriverApi& get();
};

// A default (system-fenced) 32-bit stream write, as one operation of a cuStreamBatchMemOp batch.
inline CUstreamBatchMemOpParams stream_write_op(const uint32_t* address, uint32_t value) {
  CUstreamBatchMemOpParams op{};
  op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op.writeValue.address = reinterpret_cast<CUdeviceptr>(address);
  op.writeValue.value = value;
  op.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  return op;
}

// A 32-bit stream wait, as one operation of a cuStreamBatchMemOp batch: until *address == value
// (CU_STREAM_WAIT_VALUE_EQ) or *address >= value (CU_STREAM_WAIT_VALUE_GEQ, cyclic:
// (int32_t)(*address - value) >= 0).
inline CUstreamBatchMemOpParams stream_wait_op(const uint32_t* address, uint32_t value, unsigned flags) {
  CUstreamBatchMemOpParams op{};
  op.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  op.waitValue.address = reinterpret_cast<CUdeviceptr>(address);
  op.waitValue.value = value;
  op.waitValue.flags = flags;
  return op;
}

[[noreturn]] void throw_cu(CUresult result, const char* expr, const char* file, int line);
std::string cu_error_name(CUresult result);

}  // namespace symmem::detail

#define SYMMEM_CU_CHECK(expr)                                                                            \
  do {                                                                                                   \
    CUresult symmem_res_ = (expr);                                                                       \
    if (symmem_res_ != CUDA_SUCCESS) ::symmem::detail::throw_cu(symmem_res_, #expr, __FILE__, __LINE__); \
  } while (0)

#define SYMMEM_CU_CHECK_NOTHROW(expr)                                                                                 \
  do {                                                                                                                \
    CUresult symmem_res_ = (expr);                                                                                    \
    if (symmem_res_ != CUDA_SUCCESS)                                                                                  \
      ::symmem::detail::log_warning(std::string(#expr) + " failed: " + ::symmem::detail::cu_error_name(symmem_res_)); \
  } while (0)
