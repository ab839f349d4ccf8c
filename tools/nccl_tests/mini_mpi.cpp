// The minimal MPI of mpi.h: every collective is an all-gather of fixed-size blocks through rank 0
// over abstract Unix-domain sockets (one host), the rest computed locally in rank order.
#include "mpi.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Job {
  int rank = 0;
  int size = 1;
  std::vector<int> links;  // rank 0: one socket per other rank (by rank); others: [0], rank 0
  int timeout_s = 300;
};

Job& job() {
  static Job j;
  return j;
}

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "mini MPI rank %d of %d: %s\n", job().rank, job().size, why.c_str());
  std::exit(1);
}

Clock::time_point deadline() { return Clock::now() + std::chrono::seconds(job().timeout_s); }

void wait_ready(int fd, short events, Clock::time_point until) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) die("timed out waiting for a peer (MINI_MPI_TIMEOUT_S)");
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(left < 1000 ? left : 1000));
    if (rc > 0) return;
  }
}

void write_all(int fd, const void* data, size_t bytes) {
  const auto until = deadline();
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    wait_ready(fd, POLLOUT, until);
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n <= 0) die(std::string("send failed: ") + std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void read_all(int fd, void* data, size_t bytes) {
  const auto until = deadline();
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    wait_ready(fd, POLLIN, until);
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n == 0) die("a peer closed its connection (it exited or died)");
    if (n < 0) die(std::string("receive failed: ") + std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

socklen_t abstract_address(const std::string& name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  const size_t n = name.size() < sizeof(addr->sun_path) - 1 ? name.size() : sizeof(addr->sun_path) - 1;
  std::memcpy(addr->sun_path + 1, name.data(), n);  // sun_path[0] = 0: the abstract namespace
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

void start() {
  Job& j = job();
  const char* rank = std::getenv("MINI_MPI_RANK");
  const char* size = std::getenv("MINI_MPI_SIZE");
  const char* name = std::getenv("MINI_MPI_JOB");
  const char* timeout = std::getenv("MINI_MPI_TIMEOUT_S");
  if (timeout) j.timeout_s = std::atoi(timeout);
  if (!rank || !size) return;  // a job of one
  j.rank = std::atoi(rank);
  j.size = std::atoi(size);
  if (j.size < 1 || j.rank < 0 || j.rank >= j.size) die("bad MINI_MPI_RANK / MINI_MPI_SIZE");
  if (j.size == 1) return;
  if (!name || !*name) die("MINI_MPI_JOB is not set");
  sockaddr_un addr;
  const socklen_t len = abstract_address(std::string("mini-mpi-") + name, &addr);
  if (j.rank == 0) {
    const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(listener, 256) != 0)
      die(std::string("cannot listen: ") + std::strerror(errno));
    j.links.assign(j.size, -1);
    const auto until = deadline();
    for (int joined = 1; joined < j.size;) {
      wait_ready(listener, POLLIN, until);
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      int32_t who = -1;
      read_all(fd, &who, sizeof(who));
      if (who <= 0 || who >= j.size || j.links[who] >= 0) die("a bad or repeated rank joined");
      j.links[who] = fd;
      ++joined;
    }
    ::close(listener);
  } else {
    const auto until = deadline();
    int fd = -1;
    while (fd < 0) {
      fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) break;
      ::close(fd);
      fd = -1;
      if (Clock::now() >= until) die("rank 0 never listened");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const int32_t me = j.rank;
    write_all(fd, &me, sizeof(me));
    j.links.assign(1, fd);
  }
}

// all[r * bytes ...] = rank r's `mine`.
void all_gather(const void* mine, void* all, size_t bytes) {
  Job& j = job();
  char* out = static_cast<char*>(all);
  std::memmove(out + size_t(j.rank) * bytes, mine, bytes);
  if (j.size == 1) return;
  if (j.rank == 0) {
    for (int r = 1; r < j.size; ++r) read_all(j.links[r], out + size_t(r) * bytes, bytes);
    for (int r = 1; r < j.size; ++r) write_all(j.links[r], out, bytes * j.size);
  } else {
    write_all(j.links[0], mine, bytes);
    read_all(j.links[0], out, bytes * j.size);
  }
}

size_t type_bytes(MPI_Datatype type) {
  switch (type) {
    case MPI_BYTE:
    case MPI_CHAR: return 1;
    case MPI_INT:
    case MPI_FLOAT: return 4;
    case MPI_LONG: return sizeof(long);
    case MPI_LONG_LONG: return sizeof(long long);
    case MPI_INT64_T:
    case MPI_UINT64_T:
    case MPI_DOUBLE: return 8;
    default: die("unsupported datatype " + std::to_string(type));
  }
}

void require_world(MPI_Comm comm) {
  if (comm != MPI_COMM_WORLD) die("only MPI_COMM_WORLD is supported");
}

template <typename T>
void reduce(const std::vector<char>& all, int count, int size, MPI_Op op, void* out) {
  T* result = static_cast<T*>(out);
  const T* blocks = reinterpret_cast<const T*>(all.data());
  for (int i = 0; i < count; ++i) {
    T acc = blocks[i];
    for (int r = 1; r < size; ++r) {
      const T v = blocks[size_t(r) * count + i];
      if (op == MPI_SUM) acc = acc + v;
      else if (op == MPI_MIN) acc = v < acc ? v : acc;
      else if (op == MPI_MAX) acc = v > acc ? v : acc;
      else die("unsupported reduction " + std::to_string(op));
    }
    result[i] = acc;
  }
}

}  // namespace

extern "C" {

int MPI_Init(int*, char***) {
  start();
  return MPI_SUCCESS;
}

int MPI_Finalize(void) {
  MPI_Barrier(MPI_COMM_WORLD);
  for (int fd : job().links)
    if (fd >= 0) ::close(fd);
  job().links.clear();
  return MPI_SUCCESS;
}

int MPI_Comm_size(MPI_Comm comm, int* size) {
  require_world(comm);
  *size = job().size;
  return MPI_SUCCESS;
}

int MPI_Comm_rank(MPI_Comm comm, int* rank) {
  require_world(comm);
  *rank = job().rank;
  return MPI_SUCCESS;
}

int MPI_Comm_split(MPI_Comm comm, int color, int, MPI_Comm* out) {
  require_world(comm);
  std::vector<int> colors(job().size);
  all_gather(&color, colors.data(), sizeof(int));
  for (int c : colors)
    if (c != color) die("MPI_Comm_split with different colours (unset NCCL_TESTS_SPLIT*)");
  *out = MPI_COMM_WORLD;
  return MPI_SUCCESS;
}

int MPI_Comm_free(MPI_Comm* comm) {
  *comm = 0;
  return MPI_SUCCESS;
}

int MPI_Barrier(MPI_Comm comm) {
  require_world(comm);
  const char mine = 0;
  std::vector<char> all(job().size);
  all_gather(&mine, all.data(), 1);
  return MPI_SUCCESS;
}

int MPI_Bcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  require_world(comm);
  const size_t bytes = size_t(count) * type_bytes(type);
  std::vector<char> all(bytes * job().size);
  all_gather(buffer, all.data(), bytes);
  std::memcpy(buffer, all.data() + size_t(root) * bytes, bytes);
  return MPI_SUCCESS;
}

int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm) {
  require_world(comm);
  const size_t bytes = size_t(recvcount) * type_bytes(recvtype);
  const char* mine = sendbuf == MPI_IN_PLACE ? static_cast<char*>(recvbuf) + size_t(job().rank) * bytes
                                             : static_cast<const char*>(sendbuf);
  if (sendbuf != MPI_IN_PLACE && size_t(sendcount) * type_bytes(sendtype) != bytes)
    die("MPI_Allgather with different send and receive sizes");
  std::vector<char> block(mine, mine + bytes);
  all_gather(block.data(), recvbuf, bytes);
  return MPI_SUCCESS;
}

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  require_world(comm);
  const size_t bytes = size_t(count) * type_bytes(type);
  const void* mine = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
  std::vector<char> all(bytes * job().size);
  all_gather(mine, all.data(), bytes);
  switch (type) {
    case MPI_INT: reduce<int32_t>(all, count, job().size, op, recvbuf); break;
    case MPI_LONG: reduce<long>(all, count, job().size, op, recvbuf); break;
    case MPI_LONG_LONG: reduce<long long>(all, count, job().size, op, recvbuf); break;
    case MPI_INT64_T: reduce<int64_t>(all, count, job().size, op, recvbuf); break;
    case MPI_UINT64_T: reduce<uint64_t>(all, count, job().size, op, recvbuf); break;
    case MPI_DOUBLE: reduce<double>(all, count, job().size, op, recvbuf); break;
    case MPI_FLOAT: reduce<float>(all, count, job().size, op, recvbuf); break;
    default: die("unsupported datatype in MPI_Allreduce");
  }
  return MPI_SUCCESS;
}

int MPI_Gather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int, MPI_Datatype, int root,
               MPI_Comm comm) {
  require_world(comm);
  const size_t bytes = size_t(sendcount) * type_bytes(sendtype);
  std::vector<char> all(bytes * job().size);
  all_gather(sendbuf, all.data(), bytes);
  if (job().rank == root) std::memcpy(recvbuf, all.data(), all.size());
  return MPI_SUCCESS;
}

}  // extern "C"
