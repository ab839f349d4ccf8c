#include "fixture.hpp"

#include <algorithm>
#include <cstring>

#include "test.hpp"

namespace symmem::test {

Fixture& Fixture::get() {
  static Fixture* fixture = [] {
    auto* f = new Fixture();
    f->job = JobInfo::from_env();
    TEST_CUDA(cudaSetDevice(f->job.local_rank));
    f->bootstrap = make_store_bootstrap(f->job);
    f->comm = Communicator::create(f->bootstrap, f->job.local_rank);
    TEST_CUDA(cudaStreamCreateWithFlags(&f->stream, cudaStreamNonBlocking));
    TEST_CUDA(cudaDeviceGetAttribute(&f->sm_count, cudaDevAttrMultiProcessorCount, f->job.local_rank));
    ncclUniqueId id{};
    if (f->rank() == 0) TEST_NCCL(ncclGetUniqueId(&id));
    std::vector<ncclUniqueId> ids(f->world());
    f->bootstrap->all_gather(&id, ids.data(), sizeof(id));
    TEST_NCCL(ncclCommInitRank(&f->nccl, f->world(), ids[0], f->rank()));
    return f;
  }();
  return *fixture;
}

long Fixture::sum(long mine) {
  std::vector<long> all(world());
  bootstrap->all_gather(&mine, all.data(), sizeof(long));
  long total = 0;
  for (long v : all) total += v;
  return total;
}

bool Fixture::all(bool mine) { return sum(mine ? 0 : 1) == 0; }

bool Fixture::same_everywhere(uint64_t value) {
  std::vector<uint64_t> all(world());
  bootstrap->all_gather(&value, all.data(), sizeof(value));
  return std::all_of(all.begin(), all.end(), [&](uint64_t v) { return v == all[0]; });
}

void Fixture::sync() const { TEST_CUDA(cudaStreamSynchronize(stream)); }

MismatchCounter::MismatchCounter() {
  TEST_CUDA(cudaMalloc(&count_, sizeof(*count_)));
  TEST_CUDA(cudaMemset(count_, 0, sizeof(*count_)));
  TEST_CUDA(cudaDeviceSynchronize());
}
MismatchCounter::~MismatchCounter() { cudaFree(count_); }

void MismatchCounter::reset(cudaStream_t stream) { TEST_CUDA(cudaMemsetAsync(count_, 0, sizeof(*count_), stream)); }

long MismatchCounter::read(cudaStream_t stream) {
  unsigned long long host = 0;
  TEST_CUDA(cudaMemcpyAsync(&host, count_, sizeof(host), cudaMemcpyDeviceToHost, stream));
  TEST_CUDA(cudaStreamSynchronize(stream));
  return static_cast<long>(host);
}

uint64_t mix_seed(int rank, uint64_t a, uint64_t b) {
  uint64_t x = (uint64_t(rank) + 1) * 0x9E3779B97F4A7C15ull ^ (a * 0xBF58476D1CE4E5B9ull) ^ (b << 32);
  x ^= x >> 31;
  return x * 0x94D049BB133111EBull;
}

std::vector<uint8_t> download(const void* device, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  TEST_CUDA(cudaDeviceSynchronize());
  TEST_CUDA(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  return host;
}

uint64_t hash_bytes(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

}  // namespace symmem::test
