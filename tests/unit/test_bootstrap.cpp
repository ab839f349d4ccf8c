// The TCP store, the store and thread bootstraps, and descriptor passing: all on loopback threads.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bootstrap/agree_on_outcome.hpp"
#include "bootstrap/fd_exchange.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/store_protocol.hpp"
#include "bootstrap/tcp_store.hpp"
#include "comm/node_bootstrap.hpp"
#include "comm/node_agreement.hpp"
#include "plan/node_layout.hpp"
#include "symmem/bootstrap.hpp"
#include "symmem/error.hpp"
#include "fd_exchange_round.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::detail;

namespace {

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

// Runs body(rank) on `world` threads at once and counts the ranks for which it returned true.
template <typename Body>
int ranks_that_pass(int world, Body body) {
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank)
    threads.emplace_back([&, rank] {
      if (body(rank)) ++good;
    });
  for (auto& t : threads) t.join();
  return good.load();
}

}  // namespace

TEST(store_set_get_add_erase) {
  TcpStoreServer server("127.0.0.1", 0, "secret");
  TcpStoreClient a("127.0.0.1", server.port(), "secret", 2000);
  TcpStoreClient b("127.0.0.1", server.port(), "secret", 2000);
  a.set("k", bytes_of("value"));
  EXPECT(b.get("k", 1000) == bytes_of("value"));
  EXPECT(b.check("k"));
  EXPECT(!b.check("missing"));
  EXPECT_EQ(a.add("n", 5), int64_t(5));
  EXPECT_EQ(b.add("n", -2), int64_t(3));
  b.erase("k");
  EXPECT(!a.check("k"));
}

TEST(store_moves_a_large_value_in_pieces) {
  TcpStoreServer server("127.0.0.1", 0, "secret");
  TcpStoreClient a("127.0.0.1", server.port(), "secret", 5000);
  TcpStoreClient b("127.0.0.1", server.port(), "secret", 5000);
  Bytes big(24 << 20);  // many reads and partial writes of the server's non-blocking sockets
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  a.set("big", big);
  EXPECT(b.get("big", 1000) == big);
  EXPECT_ERROR(a.set(std::string(5000, 'k'), {}), ErrorCode::kInvalidArgument, "exceeds the store's limits");
  EXPECT_EQ(a.add("n", 1), int64_t(1));  // the connection is still usable
}

TEST(store_get_waits_for_a_later_set) {
  TcpStoreServer server("127.0.0.1", 0, "secret");
  TcpStoreClient a("127.0.0.1", server.port(), "secret", 2000);
  std::thread writer([&] {
    TcpStoreClient b("127.0.0.1", server.port(), "secret", 2000);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    b.set("late", bytes_of("x"));
  });
  EXPECT(a.get("late", 5000) == bytes_of("x"));
  writer.join();
}

TEST(store_get_times_out_naming_the_key) {
  TcpStoreServer server("127.0.0.1", 0, "secret");
  TcpStoreClient a("127.0.0.1", server.port(), "secret", 2000);
  const auto start = Clock::now();
  EXPECT_ERROR(a.get("never", 200), ErrorCode::kTimeout, "'never'");
  EXPECT(Clock::now() - start < std::chrono::seconds(3));
}

TEST(store_refuses_a_wrong_token) {
  TcpStoreServer server("127.0.0.1", 0, "right");
  EXPECT_ERROR(TcpStoreClient("127.0.0.1", server.port(), "wrong", 2000), ErrorCode::kBootstrap, "wrong job token");
  EXPECT_EQ(server.refused_connections(), 1);
  // A raw client that sends garbage is dropped, and the store keeps serving others.
  Socket raw = tcp_connect("127.0.0.1", server.port(), deadline_after_ms(1000));
  const char junk[16] = "GET / HTTP/1.1\n";
  send_all(raw, junk, sizeof(junk), deadline_after_ms(1000));
  TcpStoreClient ok("127.0.0.1", server.port(), "right", 2000);
  ok.set("a", bytes_of("b"));
  EXPECT(ok.get("a", 100) == bytes_of("b"));
}

TEST(store_protocol_parses_incrementally_and_rejects_forged_lengths) {
  using namespace symmem::detail::store;
  const Bytes message = encode_request(kSet, "key", bytes_of("value"), 7);
  Request request;
  size_t used = 0;
  for (size_t n = 0; n < message.size(); ++n)  // every prefix asks for more
    EXPECT(parse_request(message.data(), n, &request, &used) == Parse::kNeedMore);
  EXPECT(parse_request(message.data(), message.size(), &request, &used) == Parse::kDone);
  EXPECT_EQ(used, message.size());
  EXPECT(request.op == kSet && request.key == "key" && request.value == bytes_of("value"));
  EXPECT_EQ(request.timeout_ms, int64_t(7));

  // A length over its limit is refused from the header alone, before the bytes it announces.
  Bytes huge_key = encode_request(kGet, "k", {}, 0);
  const uint32_t key_len = kMaxKeyBytes + 1;
  std::memcpy(huge_key.data() + 1, &key_len, sizeof(key_len));
  EXPECT(parse_request(huge_key.data(), 5, &request, &used) == Parse::kMalformed);
  Bytes huge_value = encode_request(kSet, "k", {}, 0);
  const uint64_t value_len = kMaxValueBytes + 1;
  std::memcpy(huge_value.data() + 6, &value_len, sizeof(value_len));
  EXPECT(parse_request(huge_value.data(), 14, &request, &used) == Parse::kMalformed);

  const Bytes hello = encode_hello("token");
  std::string token;
  EXPECT(parse_hello(hello.data(), hello.size() - 1, &token, &used) == Parse::kNeedMore);
  EXPECT(parse_hello(hello.data(), hello.size(), &token, &used) == Parse::kDone);
  EXPECT_EQ(token, std::string("token"));
  const Bytes http = bytes_of("GET / HTTP/1.1\r\n");
  EXPECT(parse_hello(http.data(), 4, &token, &used) == Parse::kMalformed);  // wrong magic
  Bytes long_token = encode_hello("t");
  const uint32_t token_len = kMaxTokenBytes + 1;
  std::memcpy(long_token.data() + 4, &token_len, sizeof(token_len));
  EXPECT(parse_hello(long_token.data(), 8, &token, &used) == Parse::kMalformed);
}

TEST(store_binds_only_the_asked_address) {
  int port = 0;
  Socket s = tcp_listen("127.0.0.1", 0, &port);
  EXPECT(port > 0);
  // Connecting through another loopback address fails: the socket is not on every interface.
  bool refused = false;
  try {
    tcp_connect("127.0.0.2", port, deadline_after_ms(100));
  } catch (const Error&) {
    refused = true;
  }
  EXPECT(refused);
}

TEST(store_bootstrap_all_gather_and_barrier_across_ranks) {
  int port = 0;
  { Socket probe = tcp_listen("127.0.0.1", 0, &port); }
  constexpr int kWorld = 4;
  const int good = ranks_that_pass(kWorld, [&](int rank) {
    JobInfo job;
    job.rank = rank;
    job.world = kWorld;
    job.local_rank = rank;
    job.local_world = kWorld;
    job.master_port = port;
    job.token = "tok";
    job.timeout_ms = 5000;
    auto b = make_store_bootstrap(job);
    for (int round = 0; round < 20; ++round) {
      uint64_t mine = rank * 1000 + round;
      std::vector<uint64_t> all(kWorld);
      b->all_gather(&mine, all.data(), sizeof(mine));
      bool ok = true;
      for (int r = 0; r < kWorld; ++r) ok &= all[r] == uint64_t(r * 1000 + round);
      if (!ok) return false;
      b->barrier();
    }
    return true;
  });
  EXPECT_EQ(good, kWorld);
}

TEST(store_bootstrap_reports_a_missing_rank) {
  int port = 0;
  { Socket probe = tcp_listen("127.0.0.1", 0, &port); }
  JobInfo job;
  job.rank = 0;
  job.world = 2;
  job.local_world = 2;
  job.master_port = port;
  job.token = "tok";
  job.timeout_ms = 300;
  auto b = make_store_bootstrap(job);
  uint32_t mine = 1, all[2];
  EXPECT_ERROR(b->all_gather(&mine, all, sizeof(mine)), ErrorCode::kTimeout, "waited for rank 1");
}

TEST(thread_bootstrap_gathers_and_times_out) {
  auto group = make_thread_group(3, 2000);
  const int good = ranks_that_pass(3, [&](int rank) {
    auto b = make_thread_bootstrap(group, rank);
    for (int round = 0; round < 50; ++round) {
      int mine = rank + round, all[3];
      b->all_gather(&mine, all, sizeof(int));
      if (all[0] != round || all[1] != round + 1 || all[2] != round + 2) return false;
    }
    return true;
  });
  EXPECT_EQ(good, 3);
  auto lonely = make_thread_bootstrap(make_thread_group(2, 100), 0);
  EXPECT_ERROR(lonely->barrier(), ErrorCode::kTimeout, "only 1 of 2 threads arrived");
  EXPECT_ERROR(make_thread_bootstrap(group, 3), ErrorCode::kInvalidArgument, "outside world");
}

TEST(fd_exchange_passes_descriptors_and_leaks_none) {
  const int before = symmem::test::open_descriptors();
  constexpr int kWorld = 3;
  auto group = make_thread_group(kWorld, 5000);
  const int good = ranks_that_pass(kWorld, [&](int rank) {
    auto b = make_thread_bootstrap(group, rank);
    FdExchange exchange(*b, 5000);
    bool ok = true;
    for (int round = 0; round < 10; ++round)
      ok &= symmem::test::exchange_and_check_round(exchange, rank, kWorld, round);
    return ok && exchange.refused() == 0;
  });
  EXPECT_EQ(good, kWorld);
  EXPECT_EQ(symmem::test::open_descriptors(), before);
}

TEST(job_info_reads_torchrun_variables) {
  setenv("RANK", "2", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("LOCAL_RANK", "2", 1);
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29511", 1);
  setenv("SYMMEM_TOKEN", "abc", 1);
  JobInfo job = JobInfo::from_env();
  EXPECT_EQ(job.rank, 2);
  EXPECT_EQ(job.world, 4);
  EXPECT_EQ(job.master_port, 29511);
  EXPECT_EQ(job.token, std::string("abc"));
  setenv("RANK", "4", 1);
  EXPECT_ERROR(JobInfo::from_env(), ErrorCode::kInvalidArgument, "RANK=4 is outside WORLD_SIZE=4");
  setenv("RANK", "x", 1);
  EXPECT_ERROR(JobInfo::from_env(), ErrorCode::kInvalidArgument, "RANK='x' is not an integer");
  unsetenv("SYMMEM_TOKEN");
  setenv("RANK", "1", 1);
  EXPECT(JobInfo::from_env().token.rfind("derived:", 0) == 0);
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    unsetenv(v);
  job = JobInfo::from_env();
  EXPECT_EQ(job.world, 1);
}

namespace {

// Sets (or, for a null value, unsets) environment variables for one scope and restores what was
// there before.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
      if (value)
        setenv(name, value, 1);
      else
        unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value)
        setenv(name.c_str(), value->c_str(), 1);
      else
        unsetenv(name.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace

TEST(store_bootstrap_serves_a_job_spanning_several_nodes) {
  int port = 0;
  { Socket probe = tcp_listen("127.0.0.1", 0, &port); }
  const std::string port_text = std::to_string(port);
  {
    // Two nodes of two ranks, as torchrun describes them: JobInfo and the store accept it, and
    // every rank agrees on the nodes (LOCAL_WORLD_SIZE, since the bootstrap is the whole job);
    // each node's bootstrap sees its own ranks only.
    ScopedEnv env({{"RANK", "0"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "0"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_PORT", port_text.c_str()},
                   {"SYMMEM_TOKEN", "tok"},
                   {"SYMMEM_NODE_SIZE", nullptr}});
    JobInfo job = JobInfo::from_env();
    EXPECT_EQ(job.world, 4);
    EXPECT_EQ(job.local_world, 2);
    const int good = ranks_that_pass(4, [&](int rank) {
      JobInfo mine = job;
      mine.rank = rank;
      mine.local_rank = rank % 2;
      mine.timeout_ms = 5000;
      auto b = make_store_bootstrap(mine);
      const NodeLayout layout = agree_on_layout(0, *b);
      if (layout.nodes != 2 || layout.local_world != 2 || layout.node != rank / 2 || layout.local_rank != rank % 2)
        return false;
      NodeBootstrap node(b, layout);
      int32_t value = 100 + rank, all[2] = {};
      node.all_gather(&value, all, sizeof(value));
      return node.rank() == rank % 2 && node.world() == 2 && all[0] == 100 + rank / 2 * 2 &&
             all[1] == 101 + rank / 2 * 2;
    });
    EXPECT_EQ(good, 4);
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "6"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "4"}});
    EXPECT_ERROR(JobInfo::from_env(), ErrorCode::kInvalidArgument, "LOCAL_WORLD_SIZE=4 does not divide WORLD_SIZE=6");
  }
  JobInfo uneven;  // built by hand, bypassing from_env()
  uneven.world = 6;
  uneven.local_world = 4;
  uneven.master_port = port;
  EXPECT_ERROR(make_store_bootstrap(uneven), ErrorCode::kInvalidArgument,
               "LOCAL_WORLD_SIZE=4 does not divide WORLD_SIZE=6");
}

TEST(node_layout_is_agreed_or_refused_on_every_rank) {
  ScopedEnv env({{"SYMMEM_NODE_SIZE", nullptr}, {"WORLD_SIZE", nullptr}, {"LOCAL_WORLD_SIZE", nullptr}});
  // One host: grouped by host name, a single node; an explicit size simulates nodes.
  auto group = make_thread_group(4, 5000);
  std::atomic<int> one_node{0}, simulated{0}, refused{0};
  ranks_that_pass(4, [&](int rank) {
    auto b = make_thread_bootstrap(group, rank);
    if (agree_on_layout(0, *b).nodes == 1) ++one_node;
    const NodeLayout l = agree_on_layout(2, *b);
    if (l.nodes == 2 && l.node == rank / 2) ++simulated;
    // Ranks that wish different node sizes: every rank refuses, naming the sizes.
    try {
      agree_on_layout(rank == 3 ? 1 : 2, *b);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kInvalidArgument && std::string(e.what()).find("groups ranks in nodes of") !=
                                                         std::string::npos)
        ++refused;
    }
    return true;
  });
  EXPECT_EQ(one_node.load(), 4);
  EXPECT_EQ(simulated.load(), 4);
  EXPECT_EQ(refused.load(), 4);
}

TEST(agree_on_outcome_fails_every_rank_together) {
  // Rank 1's step fails: it rethrows its own error; every other rank throws one with the same code
  // naming rank 1; every rank releases. Without a failure nobody releases or throws.
  constexpr int kWorld = 3;
  auto group = make_thread_group(kWorld, 5000);
  const int good = ranks_that_pass(kWorld, [&](int rank) {
    auto b = make_thread_bootstrap(group, rank);
    int released = 0;
    bool ok = true;
    agree_on_outcome(*b, nullptr, [&] { ++released; }, "step");
    ok &= released == 0;
    std::exception_ptr mine;
    if (rank == 1) mine = std::make_exception_ptr(Error(ErrorCode::kSystemError, "rank 1's own failure"));
    try {
      agree_on_outcome(*b, mine, [&] { ++released; }, "step");
      ok = false;
    } catch (const Error& e) {
      const std::string m = e.what();
      ok &= e.code() == ErrorCode::kSystemError;
      ok &= rank == 1 ? m.find("rank 1's own failure") != std::string::npos
                      : m.find("step failed on rank 1") != std::string::npos;
    }
    return ok && released == 1;
  });
  EXPECT_EQ(good, kWorld);
}
