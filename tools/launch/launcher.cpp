#include "launcher.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace symmem::launch {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot find a free port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string random_token() {
  unsigned char bytes[16];
  if (::getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes)))
    throw std::runtime_error("getrandom failed");
  char hex[33];
  for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
  return hex;
}

struct Child {
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
  std::string out_partial, err_partial;
  bool running = true;
  int status = 0;
};

void forward(Child& c, int rank, int fd, std::string& partial, FILE* sink, bool prefix, bool flush_all) {
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    partial.append(buf, static_cast<size_t>(n));
  }
  size_t start = 0, nl;
  while ((nl = partial.find('\n', start)) != std::string::npos) {
    if (prefix) std::fprintf(sink, "[rank %d] ", rank);
    std::fwrite(partial.data() + start, 1, nl - start + 1, sink);
    start = nl + 1;
  }
  partial.erase(0, start);
  if (flush_all && !partial.empty()) {
    if (prefix) std::fprintf(sink, "[rank %d] ", rank);
    std::fprintf(sink, "%s\n", partial.c_str());
    partial.clear();
  }
  std::fflush(sink);
  (void)c;
}

void signal_all(std::vector<Child>& children, int sig) {
  for (auto& c : children)
    if (c.running) ::kill(c.pid, sig);
}

}  // namespace

void disable_multicast_in_environment() {
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);
  ::setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 0);
  ::setenv("NVSHMEM_DISABLE_NVLS", "1", 0);
}

bool parse_args(const std::vector<std::string>& args, LaunchOptions* o, std::vector<std::string>* command,
                std::string* error) {
  size_t i = 0;
  auto value = [&](const std::string& flag) -> const std::string* {
    if (i + 1 >= args.size()) {
      *error = flag + " needs a value";
      return nullptr;
    }
    return &args[++i];
  };
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-n" || a == "--nproc") {
      const std::string* v = value(a);
      if (!v) return false;
      o->processes = std::atoi(v->c_str());
      if (o->processes < 1 || o->processes > 1024) {
        *error = "-n must be a positive process count, got '" + *v + "'";
        return false;
      }
    } else if (a == "--timeout") {
      const std::string* v = value(a);
      if (!v) return false;
      o->timeout_s = std::atof(v->c_str());
    } else if (a == "--simulate-nodes") {
      const std::string* v = value(a);
      if (!v) return false;
      o->simulate_nodes = std::atoi(v->c_str());
      if (o->simulate_nodes < 1) {
        *error = "--simulate-nodes must be a positive node count, got '" + *v + "'";
        return false;
      }
    } else if (a == "--no-prefix") {
      o->prefix_output = false;
    } else if (a == "--expect-killed") {
      const std::string* v = value(a);
      if (!v) return false;
      char* end = nullptr;
      const long rank = std::strtol(v->c_str(), &end, 10);
      if (v->empty() || *end != '\0' || rank < 0) {
        *error = "--expect-killed needs a rank, got '" + *v + "'";
        return false;
      }
      o->expect_killed.push_back(static_cast<int>(rank));
    } else if (!a.empty() && a[0] == '-') {
      *error = "unknown option " + a;
      return false;
    } else {
      break;
    }
  }
  command->assign(args.begin() + static_cast<long>(i), args.end());
  if (command->empty()) {
    *error = "no program given";
    return false;
  }
  if (o->simulate_nodes > 0 && o->processes % o->simulate_nodes != 0) {
    *error = "--simulate-nodes " + std::to_string(o->simulate_nodes) + " does not divide " +
             std::to_string(o->processes) + " processes";
    return false;
  }
  for (int rank : o->expect_killed)
    if (rank >= o->processes) {
      *error = "--expect-killed " + std::to_string(rank) + " names no rank of " + std::to_string(o->processes);
      return false;
    }
  return true;
}

int run(const LaunchOptions& options, const std::vector<std::string>& command) {
  const int n = options.processes;
  const std::string addr = !options.master_addr.empty() ? options.master_addr
                           : std::getenv("MASTER_ADDR") ? std::getenv("MASTER_ADDR")
                                                        : "127.0.0.1";
  const std::string port = std::to_string(free_port());
  const std::string token = random_token();
  disable_multicast_in_environment();

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::vector<Child> children(n);
  for (int rank = 0; rank < n; ++rank) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("MASTER_ADDR", addr.c_str(), 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      ::setenv("SYMMEM_TOKEN", token.c_str(), 1);
      if (options.simulate_nodes > 0) {
        const int node_size = n / options.simulate_nodes;
        ::setenv("SYMMEM_NODE_SIZE", std::to_string(node_size).c_str(), 1);
        ::setenv("NCCL_HOSTID", ("symmem-simulated-node-" + std::to_string(rank / node_size)).c_str(), 1);
        ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
      }
      // Die with the launcher: a killed launcher must not leave ranks behind.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::vector<char*> argv;
      for (const auto& s : command) argv.push_back(const_cast<char*>(s.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "symmem-run: cannot execute %s: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);
    children[rank].pid = pid;
    children[rank].out_fd = out[0];
    children[rank].err_fd = err[0];
  }

  const auto start = Clock::now();
  int result = 0;
  bool stopping = false;
  Clock::time_point kill_at{};
  int running = n;
  while (running > 0) {
    std::vector<pollfd> fds;
    for (auto& c : children) {
      if (c.out_fd >= 0) fds.push_back({c.out_fd, POLLIN, 0});
      if (c.err_fd >= 0) fds.push_back({c.err_fd, POLLIN, 0});
    }
    ::poll(fds.data(), fds.size(), 50);
    for (int rank = 0; rank < n; ++rank) {
      Child& c = children[rank];
      if (c.out_fd >= 0) forward(c, rank, c.out_fd, c.out_partial, stdout, options.prefix_output, false);
      if (c.err_fd >= 0) forward(c, rank, c.err_fd, c.err_partial, stderr, options.prefix_output, false);
    }
    for (int rank = 0; rank < n; ++rank) {
      Child& c = children[rank];
      if (!c.running) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      --running;
      forward(c, rank, c.out_fd, c.out_partial, stdout, options.prefix_output, true);
      forward(c, rank, c.err_fd, c.err_partial, stderr, options.prefix_output, true);
      ::close(c.out_fd);
      ::close(c.err_fd);
      c.out_fd = c.err_fd = -1;
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      const bool expected =
          std::find(options.expect_killed.begin(), options.expect_killed.end(), rank) != options.expect_killed.end();
      if (expected && !stopping) {
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
          std::fprintf(stderr, "symmem-run: rank %d was killed (SIGKILL), as expected\n", rank);
          code = 0;
        } else if (code == 0) {
          code = 1;
        }
      }
      if (code != 0 && result == 0 && !stopping) {
        result = code;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
          std::fprintf(stderr,
                       "symmem-run: rank %d exited 0 but was expected to be killed (SIGKILL); "
                       "stopping the other ranks\n",
                       rank);
        else
          std::fprintf(stderr, "symmem-run: rank %d failed (%s %d); stopping the other ranks\n", rank,
                       WIFEXITED(status) ? "exit code" : "signal",
                       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        stopping = true;
        kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.grace_s * 1000));
        signal_all(children, SIGTERM);
      }
    }
    if (!stopping && options.timeout_s > 0 &&
        Clock::now() - start > std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000))) {
      std::fprintf(stderr, "symmem-run: job exceeded %.0f s; stopping every rank\n", options.timeout_s);
      result = 124;
      stopping = true;
      kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.grace_s * 1000));
      signal_all(children, SIGTERM);
    }
    if (!stopping && g_signal) {
      result = 128 + g_signal;
      stopping = true;
      kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.grace_s * 1000));
      signal_all(children, SIGTERM);
    }
    if (stopping && Clock::now() > kill_at) signal_all(children, SIGKILL);
  }
  return result;
}

}  // namespace symmem::launch
