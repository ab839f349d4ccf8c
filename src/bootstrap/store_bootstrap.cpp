// Bootstrap over the TCP store: all_gather publishes "ag/<seq>/<rank>" and reads every rank's
// key; the last reader of a round erases the round's keys so a long job does not grow the store.
// A job spanning several nodes is served like one node: the communicator splits it into nodes
// (src/plan/node_layout.hpp), and each node's exchanges ride on the job's rounds.
#include <cstring>
#include <memory>
#include <thread>

#include "bootstrap/tcp_store.hpp"
#include "common/check.hpp"
#include "symmem/bootstrap.hpp"
#include "symmem/error.hpp"

namespace symmem {
namespace {

void require_valid(const JobInfo& job) {
  const std::string world = "WORLD_SIZE=" + std::to_string(job.world);
  SYMMEM_REQUIRE(job.world >= 1 && job.rank >= 0 && job.rank < job.world,
                 "make_store_bootstrap: RANK=" + std::to_string(job.rank) + " is outside " + world);
  SYMMEM_REQUIRE(
      job.local_world >= 1 && job.world % job.local_world == 0,
      "make_store_bootstrap: LOCAL_WORLD_SIZE=" + std::to_string(job.local_world) + " does not divide " + world);
}

class StoreBootstrap final : public Bootstrap {
 public:
  explicit StoreBootstrap(const JobInfo& job) : job_(job) {
    if (job.rank == 0) server_ = std::make_unique<detail::TcpStoreServer>(job.master_addr, job.master_port, job.token);
    client_ = std::make_unique<detail::TcpStoreClient>(job.master_addr, job.master_port, job.token, job.timeout_ms);
  }

  ~StoreBootstrap() override {
    // Rank 0 keeps serving until every rank has left the last exchange.
    if (server_) {
      try {
        client_->add("leaving", 1);
        const auto deadline = detail::deadline_after_ms(job_.timeout_ms);
        while (client_->add("leaving", 0) < job_.world && detail::Clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
      } catch (...) {
      }
    } else {
      try {
        client_->add("leaving", 1);
      } catch (...) {
      }
    }
  }

  int rank() const override { return job_.rank; }
  int world() const override { return job_.world; }

  void all_gather(const void* mine, void* all, size_t bytes) override {
    const std::string round = "ag/" + std::to_string(seq_++) + "/";
    const auto* p = static_cast<const uint8_t*>(mine);
    client_->set(round + std::to_string(job_.rank), detail::Bytes(p, p + bytes));
    for (int r = 0; r < job_.world; ++r) {
      detail::Bytes value;
      try {
        value = client_->get(round + std::to_string(r), job_.timeout_ms);
      } catch (const Error& e) {
        throw Error(e.code(), "bootstrap all_gather: rank " + std::to_string(job_.rank) + " waited for rank " +
                                  std::to_string(r) + ": " + e.what());
      }
      if (value.size() != bytes)
        throw Error(ErrorCode::kInvalidArgument, "bootstrap all_gather: rank " + std::to_string(r) + " sent " +
                                                     std::to_string(value.size()) + " bytes, rank " +
                                                     std::to_string(job_.rank) + " expected " + std::to_string(bytes));
      std::memcpy(static_cast<uint8_t*>(all) + r * bytes, value.data(), bytes);
    }
    if (client_->add(round + "read", 1) == job_.world) {
      for (int r = 0; r < job_.world; ++r) client_->erase(round + std::to_string(r));
      client_->erase(round + "read");
    }
  }

  void barrier() override {
    std::vector<uint8_t> all(job_.world);
    uint8_t mine = 1;
    all_gather(&mine, all.data(), 1);
  }

 private:
  JobInfo job_;
  std::unique_ptr<detail::TcpStoreServer> server_;
  std::unique_ptr<detail::TcpStoreClient> client_;
  uint64_t seq_ = 0;
};

}  // namespace

std::shared_ptr<Bootstrap> make_store_bootstrap(const JobInfo& job) {
  require_valid(job);
  return std::make_shared<StoreBootstrap>(job);
}

}  // namespace symmem
