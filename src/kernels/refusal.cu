// The device half of a refused call (comm/refusal.hpp): one thread that, in stream order (after
// every earlier kernel of the stream, so the calls before it finish as they would have), writes
// this rank's failure record as kStatusRefused and sets the communicator's abort word. Every wait
// of every rank reads that word once it has waited the quiet time (symmem/device.cuh,
// kAbortQuietNs), in its turn: the peers' kernels of the refused call leave milliseconds later,
// and every host then finds this record (board/wait_chain.hpp: a cause of its own).
#include "device/dependent_launch.cuh"
#include "device/wait.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

namespace symmem::detail {
namespace {

__global__ void refusal_kernel(SyncArgs s, int32_t error_code) {
  device::enter_kernel();
  // The first failure of a rank wins: after an earlier one, the abort word is set already.
  device::record_failure_at(s, kStatusRefused, s.rank, error_code, 0, 0);
}

}  // namespace

void launch_refusal(const SyncArgs& sync, int32_t error_code, cudaStream_t stream) {
  launch_kernel(refusal_kernel, 1, 1, 0, stream, sync, error_code);
}

}  // namespace symmem::detail
