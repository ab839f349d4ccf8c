#include "nccl/local_rendezvous.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <thread>

#include "common/check.hpp"
#include "common/hash.hpp"

namespace symmem::nccl {

using detail::Clock;
using detail::Deadline;
using detail::Socket;

namespace {

// A hello follows its connection at once; a connection that sends none within this long is a
// stray, dropped without holding up the host.
constexpr int64_t kHelloMs = 2000;

// One attempt, no retry: an invalid Socket when nobody listens at `name` (an abstract name, '@'
// first). *listening: somebody does (also when its backlog is full and the connection failed).
Socket try_connect(const std::string& name, bool* listening) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t n = std::min(name.size() - 1, sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path + 1, name.data() + 1, n);  // sun_path[0] = 0: the abstract namespace
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  Socket s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  SYMMEM_SYS_CHECK(s.fd());
  if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), len) == 0) {
    *listening = true;
    return s;
  }
  *listening = errno == EAGAIN;  // a full backlog: there is a listener
  return Socket();
}

void require_same_user(const Socket& s, const std::string& who) {
  if (detail::peer_uid(s) != ::getuid())
    throw Error(ErrorCode::kBootstrap, "the NCCL shim's rendezvous: " + who + " belongs to another user");
}

struct Header {
  uint64_t sequence;
  uint64_t bytes;
};

std::string hex(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(v));
  return text;
}

}  // namespace

RendezvousKey RendezvousKey::of_unique_ids(const void* ids, size_t bytes) {
  RendezvousKey k;
  k.name = detail::Fnv1a().text("symmem-nccl-name").bytes(ids, bytes).digest();
  k.secret = detail::Fnv1a().text("symmem-nccl-secret").bytes(ids, bytes).digest();
  return k;
}

RendezvousKey RendezvousKey::random() {
  const std::string bits = detail::random_hex(32);
  return of_unique_ids(bits.data(), bits.size());
}

RendezvousKey RendezvousKey::child(uint64_t sequence, int64_t color) const {
  RendezvousKey k;
  k.name = detail::Fnv1a().text("symmem-nccl-child-name").value(name).value(secret).value(sequence).value(color).digest();
  k.secret =
      detail::Fnv1a().text("symmem-nccl-child-secret").value(secret).value(name).value(sequence).value(color).digest();
  return k;
}

std::string RendezvousKey::socket_name(int index) const {
  return "@symmem-nccl-" + hex(name) + "-" + std::to_string(index);
}

LocalBootstrap::LocalBootstrap(bool root, std::vector<Socket> links, int rank, int world, int64_t timeout_ms)
    : root_(root), links_(std::move(links)), rank_(rank), world_(world), timeout_ms_(timeout_ms) {}

void LocalBootstrap::close() noexcept {
  std::lock_guard<std::mutex> lock(links_mutex_);
  closed_ = true;
  for (Socket& s : links_) s.reset();
}

void LocalBootstrap::interrupt() noexcept {
  std::lock_guard<std::mutex> lock(links_mutex_);
  for (Socket& s : links_)
    if (s.valid()) ::shutdown(s.fd(), SHUT_RDWR);  // a blocked poll wakes, every transfer fails
}

void LocalBootstrap::all_gather(const void* mine, void* all, size_t bytes) {
  const Deadline deadline = detail::deadline_after_ms(timeout_ms_);
  const Header header{sequence_++, bytes};
  char* out = static_cast<char*>(all);
  try {
    if (closed_) throw Error(ErrorCode::kBootstrap, "this rank's end was closed after an earlier failure");
    if (root_) {
      std::memcpy(out + size_t(rank_) * bytes, mine, bytes);
      for (int r = 0; r < world_; ++r) {
        if (r == rank_) continue;
        Header theirs{};
        detail::recv_all(links_[r], &theirs, sizeof(theirs), deadline);
        if (theirs.sequence != header.sequence || theirs.bytes != header.bytes)
          throw Error(ErrorCode::kInternal, "rank " + std::to_string(r) + " is at exchange " +
                                                std::to_string(theirs.sequence) + " of " + std::to_string(theirs.bytes) +
                                                " bytes, rank " + std::to_string(rank_) + " at exchange " +
                                                std::to_string(header.sequence) + " of " + std::to_string(bytes));
        detail::recv_all(links_[r], out + size_t(r) * bytes, bytes, deadline);
      }
      for (int r = 0; r < world_; ++r) {
        if (r == rank_) continue;
        detail::send_all(links_[r], &header, sizeof(header), deadline);
        detail::send_all(links_[r], out, bytes * world_, deadline);
      }
    } else {
      detail::send_all(links_[0], &header, sizeof(header), deadline);
      detail::send_all(links_[0], mine, bytes, deadline);
      Header theirs{};
      detail::recv_all(links_[0], &theirs, sizeof(theirs), deadline);
      if (theirs.sequence != header.sequence || theirs.bytes != header.bytes)
        throw Error(ErrorCode::kInternal, "the host's root answered exchange " + std::to_string(theirs.sequence) +
                                              " for exchange " + std::to_string(header.sequence));
      detail::recv_all(links_[0], out, bytes * world_, deadline);
    }
  } catch (const Error& e) {
    close();  // the other ranks' exchanges fail at once instead of at their deadline
    throw Error(e.code() == ErrorCode::kTimeout ? ErrorCode::kTimeout : ErrorCode::kBootstrap,
                "rank " + std::to_string(rank_) + " of this host's " + std::to_string(world_) +
                    " in the NCCL shim's bootstrap: " + e.what() + " (another rank died, or failed and closed its end)");
  }
}

void LocalBootstrap::barrier() {
  const char mine = 0;
  std::vector<char> all(world_);
  all_gather(&mine, all.data(), 1);
}

LocalRendezvous::LocalRendezvous(const RendezvousKey& key, int index, int candidates)
    : key_(key), index_(index), candidates_(candidates), listener_(detail::unix_listen(key.socket_name(index))) {}

void LocalRendezvous::interrupt() noexcept {
  interrupted_.store(true);
  std::lock_guard<std::mutex> lock(link_mutex_);
  if (waiting_link_ >= 0) ::shutdown(waiting_link_, SHUT_RDWR);  // its blocked poll wakes, the transfer fails
}

void LocalRendezvous::throw_if_interrupted() const {
  if (interrupted_.load())
    throw Error(ErrorCode::kAborted, "the NCCL shim's rendezvous: interrupted (ncclCommAbort) before the host's ranks met");
}

void LocalRendezvous::set_waiting_link(int fd) {
  std::lock_guard<std::mutex> lock(link_mutex_);
  waiting_link_ = fd;
}

namespace {
// The root's answer (the host's rank count) that says it was aborted before the ranks met.
constexpr uint32_t kRootAborted = 0;
}  // namespace

std::shared_ptr<LocalBootstrap> LocalRendezvous::join(const Hello& hello, int64_t timeout_ms,
                                                      std::vector<Hello>* hellos) {
  // Closed when this returns, also when it throws at once: connections still queued drop, and a
  // rank that has not connected yet finds no root here.
  Socket listener = std::move(listener_);
  throw_if_interrupted();
  Hello mine = hello;
  mine.index = index_;
  const Deadline deadline = detail::deadline_after_ms(timeout_ms);
  // The host's root is its lowest index: the first candidate below this one that listens.
  Socket link;
  int link_index = -1;
  for (int j = 0; j < index_ && !link.valid(); ++j) {
    bool listening = false;
    link_index = j;
    link = try_connect(key_.socket_name(j), &listening);
    while (listening && !link.valid()) {  // its backlog is full: it is there, try again
      throw_if_interrupted();
      if (Clock::now() >= deadline)
        throw Error(ErrorCode::kTimeout, "the NCCL shim's rendezvous: the socket of candidate " + std::to_string(j) +
                                             " stayed full");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      link = try_connect(key_.socket_name(j), &listening);
    }
  }
  hellos->clear();
  if (link.valid()) {
    require_same_user(link, "the host's root");
    uint32_t count = 0;
    {
      // interrupt() may shut the link while this waits on it, never after: the guard clears it
      // before the socket is handed on or closed, however this block ends.
      set_waiting_link(link.fd());
      struct Clear {
        LocalRendezvous* r;
        ~Clear() { r->set_waiting_link(-1); }
      } clear{this};
      try {
        throw_if_interrupted();  // (after set_waiting_link: an interrupt() from now on shuts the link)
        detail::send_all(link, &mine, sizeof(mine), deadline);
        detail::recv_all(link, &count, sizeof(count), deadline);
        if (count >= 2 && count <= 4096) {
          hellos->resize(count);
          detail::recv_all(link, hellos->data(), count * sizeof(Hello), deadline);
        }
      } catch (const Error&) {
        throw_if_interrupted();  // the cause, when an interrupt() shut the link
        throw;
      }
    }
    throw_if_interrupted();
    if (count == kRootAborted)
      throw Error(ErrorCode::kAborted, "the NCCL shim's rendezvous: the host's root (candidate " +
                                           std::to_string(link_index) + ") was aborted before the host's ranks met");
    if (count < 2 || count > 4096) throw Error(ErrorCode::kBootstrap, "the NCCL shim's rendezvous: a bad answer");
    int host_rank = -1;
    for (uint32_t i = 0; i < count; ++i)
      if ((*hellos)[i].rank == mine.rank) host_rank = static_cast<int>(i);
    if (host_rank < 0) throw Error(ErrorCode::kBootstrap, "the NCCL shim's rendezvous: the root left this rank out");
    std::vector<Socket> links;
    links.push_back(std::move(link));
    return std::make_shared<LocalBootstrap>(false, std::move(links), host_rank, static_cast<int>(count), timeout_ms);
  }

  // This rank is the root. Its host's other ranks are the candidates above it that listen.
  std::vector<int> members{index_};
  for (int j = index_ + 1; j < candidates_; ++j) {
    bool listening = false;
    Socket probe = try_connect(key_.socket_name(j), &listening);  // dropped unaccepted
    if (listening) members.push_back(j);
  }
  std::vector<std::pair<Hello, Socket>> joined;
  joined.push_back({mine, Socket()});
  while (joined.size() < members.size()) {
    if (interrupted_.load()) {
      // The ranks already here hear why at once, not from a closed socket.
      const Deadline soon = std::min(deadline, detail::deadline_after_ms(100));
      for (auto& [h, s] : joined) {
        if (!s.valid()) continue;
        try {
          detail::send_all(s, &kRootAborted, sizeof(kRootAborted), soon);
        } catch (const Error&) {  // a rank gone already: nothing to tell
        }
      }
      throw_if_interrupted();
    }
    if (Clock::now() >= deadline) {
      std::string missing;
      for (int j : members) {
        bool here = false;
        for (const auto& [h, s] : joined) here = here || h.index == j;
        if (!here) missing += (missing.empty() ? "" : ", ") + std::to_string(j);
      }
      throw Error(ErrorCode::kTimeout, "the NCCL shim's rendezvous: rank " + std::to_string(mine.rank) +
                                           " (the host's root) did not hear from candidate(s) " + missing + " within " +
                                           std::to_string(timeout_ms) + " ms");
    }
    pollfd p{listener.fd(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    int error = 0;
    Socket s = detail::accept_nonblocking(listener, &error);
    if (!s.valid()) continue;
    try {
      require_same_user(s, "a connecting process");
      Hello h{};
      detail::recv_all(s, &h, sizeof(h), std::min(deadline, detail::deadline_after_ms(kHelloMs)));
      const bool member = std::find(members.begin(), members.end(), h.index) != members.end();
      bool duplicate = false;
      for (const auto& [other, socket] : joined) duplicate = duplicate || other.index == h.index;
      if (h.secret == key_.secret && member && !duplicate) joined.push_back({h, std::move(s)});
    } catch (const Error&) {
      // a stray or a broken connection: dropped
    }
  }
  std::sort(joined.begin(), joined.end(), [](const auto& a, const auto& b) { return a.first.rank < b.first.rank; });
  const uint32_t count = static_cast<uint32_t>(joined.size());
  int host_rank = 0;
  std::vector<Socket> links;
  for (uint32_t i = 0; i < count; ++i) {
    hellos->push_back(joined[i].first);
    if (joined[i].first.index == index_) host_rank = static_cast<int>(i);
    links.push_back(std::move(joined[i].second));
  }
  for (uint32_t i = 0; i < count; ++i) {
    if (static_cast<int>(i) == host_rank) continue;
    detail::send_all(links[i], &count, sizeof(count), deadline);
    detail::send_all(links[i], hellos->data(), count * sizeof(Hello), deadline);
  }
  return std::make_shared<LocalBootstrap>(true, std::move(links), host_rank, static_cast<int>(count), timeout_ms);
}

}  // namespace symmem::nccl
