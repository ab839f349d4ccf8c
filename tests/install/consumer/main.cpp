// Links against the installed library and runs without a GPU: the names come from the library, a
// one-rank communicator either runs a collective (a GPU is there) or fails with kUnsupported.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include <symmem/symmem.hpp>

int main() {
  symmem::Algo algo = symmem::Algo::kAuto;
  if (!symmem::parse_algo("two_shot", &algo) || std::string(symmem::algo_name(algo)) != "two_shot") {
    std::fprintf(stderr, "symmem consumer: algorithm names do not round-trip\n");
    return 1;
  }
  try {
    auto comm = symmem::Communicator::create(symmem::make_thread_bootstrap(symmem::make_thread_group(1), 0));
    symmem::Buffer* in = comm->allocate(1024);
    symmem::Buffer* out = comm->allocate(1024);
    symmem::all_gather(out, in, 256, symmem::DataType::kFloat32, *comm, nullptr);
    comm->synchronize(nullptr);
    comm->close();
    std::printf("symmem consumer: linked, ran an all-gather on a GPU\n");
  } catch (const symmem::Error& e) {
    if (e.code() != symmem::ErrorCode::kUnsupported) {
      std::fprintf(stderr, "symmem consumer: %s\n", e.what());
      return 1;
    }
    std::printf("symmem consumer: linked, no GPU here (%s)\n", e.what());
  }
  return 0;
}
