// Stray and hostile connections against the store and the descriptor exchange: floods under an
// address-space limit, idle and half-sent hellos, forged lengths, half-sent descriptor messages.
// The tests that a regression could hang or crash run in a forked child that the parent waits for
// with a deadline and kills at its expiry, so a failure here is a report, never a hung suite.
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/fd_exchange.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/store_protocol.hpp"
#include "bootstrap/tcp_store.hpp"
#include "symmem/bootstrap.hpp"
#include "symmem/error.hpp"
#include "fd_exchange_round.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::detail;

namespace {

// Runs `body` in a forked child and returns how it ended: "exit 0", "exit N", "signal N (name)",
// or "hung: killed after S s". The child never returns into the harness.
std::string run_in_child(const std::function<int()>& body, int timeout_s) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) return std::string("fork failed: ") + std::strerror(errno);
  if (pid == 0) {
    int code = 1;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      code = 2;
    } catch (...) {
      code = 2;
    }
    std::fflush(stderr);
    ::_exit(code);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return "hung: killed after " + std::to_string(timeout_s) + " s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "signal " + std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) + ")";
  return "ended with status " + std::to_string(status);
}

// A raw TCP connection to the store, non-blocking, as a stray process would open it. -1 when the
// process is out of descriptors.
int open_stray(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));  // EINPROGRESS: not waited for
  return fd;
}

// Sends what the socket takes within a few milliseconds; a stray does not care.
void send_best_effort(int fd, const void* data, size_t bytes) {
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, 20) > 0) ::send(fd, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
}

// True when the peer closed `fd` (a read returns 0 or a reset) within `ms`.
bool closed_within(int fd, int64_t ms) {
  const Deadline deadline = deadline_after_ms(ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char byte;
    const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

// Garbage a hostile or confused client sends, one kind per stray in turn.
void send_garbage(int fd, int kind, std::mt19937& rng) {
  switch (kind) {
    case 0: {  // random bytes
      uint8_t junk[64];
      for (auto& b : junk) b = static_cast<uint8_t>(rng());
      send_best_effort(fd, junk, sizeof(junk));
      break;
    }
    case 1: {  // the magic alone, then silence
      const uint32_t magic = store::kMagic;
      send_best_effort(fd, &magic, sizeof(magic));
      break;
    }
    case 2: {  // a well-formed hello with the wrong token
      const Bytes hello = store::encode_hello("not-the-token");
      send_best_effort(fd, hello.data(), hello.size());
      break;
    }
    case 3: {  // a token length of 4 GiB
      const uint32_t header[2] = {store::kMagic, 0xffffffffu};
      send_best_effort(fd, header, sizeof(header));
      break;
    }
    case 4: {  // half a token, then silence
      const Bytes hello = store::encode_hello("0123456789abcdef");
      send_best_effort(fd, hello.data(), hello.size() / 2);
      break;
    }
    default: break;  // connect and say nothing
  }
}

// The child of the flood test: a store under a 1 GiB address-space limit, thousands of idle and
// garbage connections, and two ranks doing a set/get/add rendezvous through it meanwhile.
int flood_child() {
  // Before the server exists, so that its thread and every connection live under the limit. A
  // thread-per-connection server reserves a stack per connection and runs out after ~100.
  const rlimit as{1ull << 30, 1ull << 30};
  if (::setrlimit(RLIMIT_AS, &as) != 0) return 10;
  // The strays' ends and the server's ends are all descriptors of this process: raise the soft
  // descriptor limit to the hard one, and flood with as many idle connections as it allows (up
  // to 3000), keeping room for the server's 1024 connections and the ranks.
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &files);
  const int idle_target = static_cast<int>(std::min<rlim_t>(3000, files.rlim_cur > 1400 ? files.rlim_cur - 1400 : 0));
  if (idle_target < 500) {
    std::fprintf(stderr, "child: RLIMIT_NOFILE hard limit %llu is too low for a flood\n",
                 static_cast<unsigned long long>(files.rlim_max));
    return 11;
  }

  const std::string token = "flood-token";
  TcpStoreServer server("127.0.0.1", 0, token);
  const int port = server.port();
  constexpr int kMinRounds = 100;
  constexpr int64_t kLegitTimeoutMs = 30000;
  // The ranks keep meeting, round after round, until the flood has run its course: rank 0 puts
  // "stop" into its value of the first round that starts after flood_done, and both stop there.
  std::atomic<bool> flood_done{false};
  std::atomic<int> finished{0}, succeeded{0};
  std::mutex errors_mutex;
  std::string errors;
  auto rank = [&](int me) {
    try {
      TcpStoreClient client("127.0.0.1", port, token, kLegitTimeoutMs);
      int rounds = 0;
      for (bool stop = false; !stop; ++rounds) {
        const std::string prefix = "round/" + std::to_string(rounds) + "/";
        stop = me == 0 && rounds + 1 >= kMinRounds && flood_done.load();
        client.set(prefix + std::to_string(me), bytes_of(std::to_string(rounds * 10 + me) + (stop ? "s" : "c")));
        const std::string other = [&] {
          const Bytes b = client.get(prefix + std::to_string(1 - me), kLegitTimeoutMs);
          return std::string(b.begin(), b.end());
        }();
        if (other.substr(0, other.size() - 1) != std::to_string(rounds * 10 + 1 - me))
          throw std::runtime_error("round " + std::to_string(rounds) + ": wrong value '" + other + "'");
        if (me == 1) stop = other.back() == 's';
        client.add("arrived", 1);
      }
      const Deadline deadline = deadline_after_ms(kLegitTimeoutMs);
      while (client.add("arrived", 0) < 2 * rounds && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (client.add("arrived", 0) != 2 * rounds) throw std::runtime_error("the arrival counter is short");
      ++succeeded;
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(errors_mutex);
      errors += std::string("rank ") + std::to_string(me) + ": " + e.what() + "\n";
    }
    ++finished;
  };

  // Flood until both ranks are done: idle connections up to the target, one in four sending
  // garbage (the kinds of send_garbage in turn); past the target the oldest strays are closed and
  // new ones keep coming. The ranks start once 200 strays are in, and stop 1000 strays after the
  // target was reached.
  std::mt19937 rng(12345);
  std::vector<int> strays;
  std::vector<std::thread> ranks;
  const Deadline deadline = deadline_after_ms(kLegitTimeoutMs + 5000);
  int opened = 0;
  while (finished.load() < 2 && Clock::now() < deadline) {
    if (opened == 200 && ranks.empty())
      for (int me = 0; me < 2; ++me) ranks.emplace_back(rank, me);
    if (opened >= idle_target + 1000) flood_done = true;
    if (static_cast<int>(strays.size()) >= idle_target) {
      ::close(strays.front());
      strays.erase(strays.begin());
    }
    const int fd = open_stray(port);
    if (fd < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (opened % 4 == 3) send_garbage(fd, (opened / 4) % 6, rng);
    strays.push_back(fd);
    ++opened;
  }
  if (finished.load() < 2) {
    std::fprintf(stderr, "child: the ranks did not finish within %lld ms; %d strays opened\n%s",
                 static_cast<long long>(kLegitTimeoutMs + 5000), opened, errors.c_str());
    std::fflush(stderr);
    ::_exit(3);  // ends the stuck threads too
  }
  for (auto& t : ranks) t.join();
  if (succeeded.load() != 2) {
    std::fprintf(stderr, "child: %s", errors.c_str());
    return 4;
  }
  if (server.refused_connections() == 0) return 5;  // wrong tokens and garbage are counted
  for (int fd : strays) ::close(fd);
  TcpStoreClient late("127.0.0.1", port, token, 5000);  // still serving after the flood
  if (late.add("arrived", 0) < 2 * kMinRounds) return 6;
  return 0;
}

}  // namespace

// ThreadSanitizer and AddressSanitizer reserve terabytes of shadow address space at start: no
// process of theirs fits under the limit this test sets (scripts/host_sanitizers.sh).
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)  // GCC, clang from 22
constexpr bool kSanitizerShadow = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)  // clang
constexpr bool kSanitizerShadow = true;
#else
constexpr bool kSanitizerShadow = false;
#endif
#else
constexpr bool kSanitizerShadow = false;
#endif

TEST(store_survives_a_flood_under_a_1_gib_address_space_limit) {
  if (kSanitizerShadow)
    SKIP("built with a sanitizer, whose shadow memory cannot live under a 1 GiB address-space limit");
  const std::string outcome = run_in_child(flood_child, 90);
  EXPECT_EQ(outcome, std::string("exit 0"));
}

TEST(store_closes_an_unauthenticated_connection_at_the_hello_deadline) {
  TcpStoreServer server("127.0.0.1", 0, "secret");
  const auto start = Clock::now();
  Socket silent(open_stray(server.port()));
  Socket half(open_stray(server.port()));
  const uint32_t magic = store::kMagic;
  send_best_effort(half.fd(), &magic, sizeof(magic));
  // The hello deadline is 2 s: both are closed by the server well before 5 s.
  EXPECT(closed_within(silent.fd(), 5000));
  EXPECT(closed_within(half.fd(), 5000));
  const auto waited = Clock::now() - start;
  EXPECT(waited >= std::chrono::milliseconds(1500));
  EXPECT(waited < std::chrono::milliseconds(5000));
  TcpStoreClient ok("127.0.0.1", server.port(), "secret", 2000);
  ok.set("k", bytes_of("v"));
  EXPECT(ok.get("k", 100) == bytes_of("v"));
  EXPECT_EQ(server.refused_connections(), 0);  // silence is dropped, not counted as a refusal
}

TEST(store_drops_the_oldest_unauthenticated_connections_past_the_cap) {
  TcpStoreServer server("127.0.0.1", 0, "secret");
  constexpr int kStrays = 100;  // the cap is 64
  std::vector<Socket> strays;
  for (int i = 0; i < kStrays; ++i) {
    strays.emplace_back(open_stray(server.port()));
    EXPECT(strays.back().valid());
  }
  // A rank still gets in, at once, while every unauthenticated slot is taken.
  const auto start = Clock::now();
  TcpStoreClient ok("127.0.0.1", server.port(), "secret", 5000);
  ok.set("k", bytes_of("v"));
  EXPECT(ok.get("k", 100) == bytes_of("v"));
  EXPECT(Clock::now() - start < std::chrono::milliseconds(1000));
  // The oldest strays were evicted long before the hello deadline; the newest are still open.
  EXPECT(closed_within(strays.front().fd(), 1000));
  char byte;
  EXPECT(::recv(strays.back().fd(), &byte, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN);
}

TEST(store_closes_a_connection_announcing_a_forged_length) {
  TcpStoreServer server("127.0.0.1", 0, "secret");
  Socket raw = tcp_connect("127.0.0.1", server.port(), deadline_after_ms(2000));
  const Bytes hello = store::encode_hello("secret");
  send_all(raw, hello.data(), hello.size(), deadline_after_ms(1000));
  uint8_t verdict = store::kRefused;
  recv_all(raw, &verdict, 1, deadline_after_ms(1000));
  EXPECT_EQ(int(verdict), int(store::kOk));
  // A set whose value claims 1 TiB: closed as soon as the length arrives, nothing allocated.
  Bytes header = store::encode_request(store::kSet, "k", {}, 0);
  const uint64_t forged = 1ull << 40;
  std::memcpy(header.data() + 1 + sizeof(uint32_t) + 1, &forged, sizeof(forged));
  send_all(raw, header.data(), 1 + sizeof(uint32_t) + 1 + sizeof(uint64_t), deadline_after_ms(1000));
  EXPECT(closed_within(raw.fd(), 1000));
  TcpStoreClient ok("127.0.0.1", server.port(), "secret", 2000);
  EXPECT_EQ(ok.add("n", 2), int64_t(2));
}

namespace {

// A store whose process has run out of descriptors: accept() fails with EMFILE while strays keep
// connecting. The server must shed unauthenticated connections, keep answering the rank that was
// already connected, and admit a new rank once descriptors are free again.
int out_of_descriptors_child() {
  TcpStoreServer server("127.0.0.1", 0, "secret");
  TcpStoreClient rank("127.0.0.1", server.port(), "secret", 5000);
  rank.set("before", bytes_of("x"));
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = std::min<rlim_t>(files.rlim_max, symmem::test::open_descriptors() + 60);
  if (::setrlimit(RLIMIT_NOFILE, &files) != 0) return 10;
  std::vector<Socket> strays;
  for (int i = 0; i < 400; ++i) {  // until this process has no descriptor left
    Socket s(open_stray(server.port()));
    if (!s.valid()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the server takes some back
      continue;
    }
    strays.push_back(std::move(s));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = Clock::now();
  if (rank.get("before", 1000) != bytes_of("x")) return 3;
  if (rank.add("n", 1) != 1) return 4;
  if (Clock::now() - start > std::chrono::seconds(2)) return 5;
  strays.clear();
  TcpStoreClient late("127.0.0.1", server.port(), "secret", 5000);
  if (late.add("n", 1) != 2) return 6;
  return 0;
}

}  // namespace

TEST(store_keeps_serving_when_out_of_descriptors) {
  const std::string outcome = run_in_child(out_of_descriptors_child, 30);
  EXPECT_EQ(outcome, std::string("exit 0"));
}

namespace {

// Descriptor exchange among three in-process ranks while strays sit on every rank's socket: one
// sends half a message and waits, one half a message with a descriptor attached, one nothing,
// one a whole message with a wrong secret. The ranks must finish every round within the timeout.
int fd_exchange_child() {
  constexpr int kWorld = 3;
  constexpr int kRounds = 5;
  constexpr int64_t kTimeoutMs = 4000;
  const int before = symmem::test::open_descriptors();
  std::vector<int> stray_fds;
  int code = 0;
  {
    auto group = make_thread_group(kWorld, 10000);
    std::mutex mutex;
    std::condition_variable cv;
    std::vector<std::string> names;
    bool injected = false;
    std::atomic<int> good{0}, refusing{0};
    std::string errors;
    std::vector<std::thread> threads;
    for (int rank = 0; rank < kWorld; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          auto b = make_thread_bootstrap(group, rank);
          FdExchange exchange(*b, kTimeoutMs);
          {
            std::unique_lock<std::mutex> lock(mutex);
            if (rank == 0)
              for (int r = 0; r < kWorld; ++r) names.push_back(exchange.socket_name(r));
            cv.notify_all();
            cv.wait(lock, [&] { return injected; });
          }
          const auto start = Clock::now();
          bool ok = true;
          for (int round = 0; round < kRounds; ++round)
            ok &= symmem::test::exchange_and_check_round(exchange, rank, kWorld, round);
          ok &= Clock::now() - start < std::chrono::milliseconds(kTimeoutMs);  // no stray waited out
          if (exchange.refused() > 0) ++refusing;                              // the wrong secret at least
          if (ok) ++good;
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mutex);
          errors += std::string("rank ") + std::to_string(rank) + ": " + e.what() + "\n";
        }
      });
    }
    {
      std::unique_lock<std::mutex> lock(mutex);
      if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return names.size() == kWorld; })) ::_exit(3);
    }
    const int payload = memfd_create("symmem-stray", MFD_CLOEXEC);
    stray_fds.push_back(payload);
    char message[48] = {};  // the size of FdExchange's message; zeros are not the job secret
    for (const std::string& name : names) {
      Socket half = unix_connect(name, deadline_after_ms(2000));
      send_all(half, message, sizeof(message) / 2, deadline_after_ms(1000));
      Socket half_with_fd = unix_connect(name, deadline_after_ms(2000));
      send_with_fd(half_with_fd, message, sizeof(message) / 2, payload, deadline_after_ms(1000));
      Socket silent = unix_connect(name, deadline_after_ms(2000));
      Socket wrong_secret = unix_connect(name, deadline_after_ms(2000));
      send_with_fd(wrong_secret, message, sizeof(message), payload, deadline_after_ms(1000));
      for (Socket* s : {&half, &half_with_fd, &silent, &wrong_secret}) stray_fds.push_back(s->release());
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      injected = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
    if (good.load() != kWorld) {
      std::fprintf(stderr, "child: %d of %d ranks exchanged correctly\n%s", good.load(), kWorld, errors.c_str());
      code = 4;
    } else if (refusing.load() != kWorld) {
      code = 5;
    }
  }
  for (int fd : stray_fds) ::close(fd);
  if (code == 0 && symmem::test::open_descriptors() != before) {
    std::fprintf(stderr, "child: %d descriptors before, %d after\n", before, symmem::test::open_descriptors());
    code = 6;
  }
  return code;
}

}  // namespace

TEST(fd_exchange_is_not_blocked_by_half_sent_messages) {
  const std::string outcome = run_in_child(fd_exchange_child, 30);
  EXPECT_EQ(outcome, std::string("exit 0"));
}
