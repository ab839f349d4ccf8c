// In-process bootstrap: threads of one process exchange blobs through shared memory, with the
// same deadlines as the store bootstrap.
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "bootstrap/socket.hpp"
#include "symmem/bootstrap.hpp"
#include "symmem/error.hpp"

namespace symmem {

class ThreadGroup {
 public:
  ThreadGroup(int world, int64_t timeout_ms) : world_(world), timeout_ms_(timeout_ms), slots_(world) {}
  int world() const { return world_; }

  void all_gather(int rank, const void* mine, void* all, size_t bytes) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto* p = static_cast<const uint8_t*>(mine);
    slots_[rank].assign(p, p + bytes);
    arrive_and_wait(lock, rank, "all_gather");
    for (int r = 0; r < world_; ++r) {
      if (slots_[r].size() != bytes)
        throw Error(ErrorCode::kInvalidArgument, "bootstrap all_gather: rank " + std::to_string(r) + " sent " +
                                                     std::to_string(slots_[r].size()) + " bytes, expected " +
                                                     std::to_string(bytes));
      std::memcpy(static_cast<uint8_t*>(all) + r * bytes, slots_[r].data(), bytes);
    }
    // Second rendezvous: nobody overwrites a slot before everyone has read this round.
    arrive_and_wait(lock, rank, "all_gather (leave)");
  }

 private:
  void arrive_and_wait(std::unique_lock<std::mutex>& lock, int rank, const char* what) {
    const uint64_t generation = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    const auto deadline = detail::deadline_after_ms(timeout_ms_);
    if (!cv_.wait_until(lock, deadline, [&] { return generation_ != generation; })) {
      throw Error(ErrorCode::kTimeout, std::string("thread bootstrap ") + what + ": rank " + std::to_string(rank) +
                                           " waited " + std::to_string(timeout_ms_) + " ms; only " +
                                           std::to_string(arrived_) + " of " + std::to_string(world_) +
                                           " threads arrived");
    }
  }

  int world_;
  int64_t timeout_ms_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::vector<uint8_t>> slots_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

namespace {

class ThreadBootstrap final : public Bootstrap {
 public:
  ThreadBootstrap(std::shared_ptr<ThreadGroup> group, int rank, int world)
      : group_(std::move(group)), rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void all_gather(const void* mine, void* all, size_t bytes) override { group_->all_gather(rank_, mine, all, bytes); }
  void barrier() override {
    std::vector<uint8_t> all(world_);
    uint8_t one = 1;
    all_gather(&one, all.data(), 1);
  }

 private:
  std::shared_ptr<ThreadGroup> group_;
  int rank_;
  int world_;
};

}  // namespace

std::shared_ptr<ThreadGroup> make_thread_group(int world, int64_t timeout_ms) {
  if (world < 1) throw Error(ErrorCode::kInvalidArgument, "thread group needs world >= 1");
  return std::make_shared<ThreadGroup>(world, timeout_ms);
}

std::shared_ptr<Bootstrap> make_thread_bootstrap(std::shared_ptr<ThreadGroup> group, int rank) {
  if (!group) throw Error(ErrorCode::kInvalidArgument, "thread bootstrap needs a group");
  const int world = group->world();
  if (rank < 0 || rank >= world)
    throw Error(ErrorCode::kInvalidArgument,
                "thread bootstrap rank " + std::to_string(rank) + " is outside world " + std::to_string(world));
  return std::make_shared<ThreadBootstrap>(std::move(group), rank, world);
}

}  // namespace symmem
