// The store server's event loop (the client is in tcp_store_client.cpp). One thread, one poll()
// per turn over the wake eventfd, the listener and every connection; a turn expires deadlines,
// waits, services the ready connections (read, parse, answer, write) and accepts a batch of new
// connections. Failures stay inside: a connection that misbehaves or cannot be served (even out
// of memory) is closed, and the loop goes on.
#include "bootstrap/tcp_store.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "common/check.hpp"

namespace symmem::detail {
namespace {

using std::chrono::milliseconds;

// An unauthenticated connection must complete its hello within this. A rank sends its hello as
// soon as it is connected, so this is generous even on a loaded machine; a stray connection holds
// a slot for at most this long.
constexpr int64_t kHelloDeadlineMs = 2000;
// Connections that have not yet presented the token. Past the cap the oldest is dropped: a flood
// churns through these slots, while a rank's hello, already waiting when it is accepted, passes
// at once (and a rank whose connection was dropped reconnects).
constexpr int kMaxUnauthenticated = 64;
// Open connections of any kind (a job needs one per rank): bounds descriptors and memory.
constexpr size_t kMaxConnections = 1024;
// A connection holding half a message or an unsent reply this long without progress is closed.
constexpr int64_t kStallMs = 10000;
// Connections accepted per turn, so that a flood of connects cannot starve the ranks' requests.
constexpr int kAcceptBatch = 16;
// Connections the kernel queues before accept() (capped by net.core.somaxconn).
constexpr int kListenBacklog = 1024;
// How long accepting pauses when accept() fails for lack of descriptors or memory and no
// unauthenticated connection is left to drop (the kernel keeps the queued connections).
constexpr int64_t kAcceptBackoffMs = 50;
// Longest wait a get may ask for; keeps the deadline arithmetic far from overflow.
constexpr int64_t kMaxGetWaitMs = 24ll * 3600 * 1000;
// Longest sleep of one poll() when no deadline is nearer.
constexpr int64_t kMaxSleepMs = 1000;

int poll_timeout_ms(Clock::time_point now, Clock::time_point wake_at) {
  if (wake_at <= now) return 0;
  const auto ms = std::chrono::ceil<milliseconds>(wake_at - now).count();
  return static_cast<int>(std::min<int64_t>(ms, kMaxSleepMs));
}

size_t input_limit(const StoreConnection& c) {
  return c.authenticated() ? store::kMaxRequestBytes : store::kMaxHelloBytes;
}

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& address, int port, std::string token) : token_(std::move(token)) {
  listener_ = tcp_listen(address, port, &port_, kListenBacklog);
  wake_ = Socket(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  SYMMEM_SYS_CHECK(wake_.fd());
  try {
    loop_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    throw Error(ErrorCode::kSystemError, std::string("store: cannot start the server thread: ") + e.what());
  }
}

TcpStoreServer::~TcpStoreServer() {
  stop_.store(true, std::memory_order_release);
  const uint64_t one = 1;
  // A failed write only delays the stop: poll() returns within kMaxSleepMs and the loop sees stop_.
  [[maybe_unused]] const ssize_t written = ::write(wake_.fd(), &one, sizeof(one));
  try {
    if (loop_.joinable()) loop_.join();
  } catch (...) {
  }
}

void TcpStoreServer::run() noexcept {
  while (!stop_.load(std::memory_order_acquire)) {
    try {
      turn();
    } catch (...) {
      // Only allocation can throw here (poll set, a reply): whatever was being served was closed
      // or keeps its state; keep serving, without spinning on a persistent failure.
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
}

void TcpStoreServer::turn() {
  Clock::time_point now = Clock::now();
  Clock::time_point wake_at = std::min(expire(now), now + milliseconds(kMaxSleepMs));
  const bool accepting = now >= accept_paused_until_;
  if (!accepting) wake_at = std::min(wake_at, accept_paused_until_);

  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  fds.reserve(connections_.size() + 2);
  ids.reserve(connections_.size());
  fds.push_back({wake_.fd(), POLLIN, 0});
  fds.push_back({accepting ? listener_.fd() : -1, POLLIN, 0});  // poll() skips a negative fd
  for (auto& [id, c] : connections_) {
    short events = 0;
    if (!c.peer_closed() && c.input().size() < input_limit(c)) events |= POLLIN;
    if (c.has_output()) events |= POLLOUT;
    fds.push_back({c.fd(), events, 0});
    ids.push_back(id);
  }
  const int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms(now, wake_at));
  if (rc < 0) {
    if (errno == EINTR) return;
    throw_errno(errno, "poll", __FILE__, __LINE__);  // run() backs off and tries again
  }
  if (rc == 0 || stop_.load(std::memory_order_acquire)) return;  // the wake eventfd only says stop
  now = Clock::now();
  for (size_t i = 0; i < ids.size(); ++i) {
    const short revents = fds[i + 2].revents;
    // POLLHUP: reset, or shut both ways (this end never shuts): nothing can be answered any more.
    if (revents & (POLLHUP | POLLERR | POLLNVAL))
      close(ids[i]);
    else if (revents)
      service(ids[i], (revents & POLLIN) != 0, now);
  }
  if (accepting && (fds[1].revents & POLLIN)) accept_new(now);
}

void TcpStoreServer::accept_new(Clock::time_point now) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    int error = 0;
    Socket s = accept_nonblocking(listener_, &error);
    if (!s.valid()) {
      if (error == 0) return;  // none waiting
      const bool exhausted = error == EMFILE || error == ENFILE || error == ENOMEM || error == ENOBUFS;
      if (exhausted && drop_oldest_unauthenticated()) continue;  // a descriptor is free again
      accept_paused_until_ = now + milliseconds(kAcceptBackoffMs);
      return;
    }
    while (unauthenticated_ >= kMaxUnauthenticated || connections_.size() >= kMaxConnections)
      if (!drop_oldest_unauthenticated()) break;
    if (connections_.size() >= kMaxConnections) continue;  // every slot holds a rank: `s` closes
    const uint64_t id = next_id_++;
    connections_.emplace(id, StoreConnection(std::move(s), now));
    ++unauthenticated_;
    service(id, true, now);  // a rank's hello is usually waiting already
  }
}

void TcpStoreServer::service(uint64_t id, bool readable, Clock::time_point now) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  StoreConnection& c = it->second;
  bool open = true;
  try {
    if (readable) open = c.receive(input_limit(c), now);
    // One request at a time per connection: the next is parsed once the reply is out.
    while (open) {
      open = c.send_pending(now);
      if (!open || c.has_output() || c.parked) break;
      if (c.closing()) {
        open = false;
      } else if (!handle_one(c, now)) {
        open = !c.peer_closed();  // a closed peer's last complete message has been answered
        break;
      }
    }
  } catch (...) {
    open = false;  // e.g. no memory for this connection's message: only this connection is lost
  }
  if (!open) close(id);
}

// Parses and answers one message from the connection's input; false when it is incomplete.
bool TcpStoreServer::handle_one(StoreConnection& c, Clock::time_point now) {
  size_t used = 0;
  if (!c.authenticated()) {
    std::string token;
    const store::Parse parsed = store::parse_hello(c.input().data(), c.input().size(), &token, &used);
    if (parsed == store::Parse::kNeedMore) return false;
    if (parsed == store::Parse::kDone) c.consume(used);
    if (parsed == store::Parse::kDone && equal_secret(token, token_)) {
      c.authenticate();
      --unauthenticated_;
      c.queue({store::kOk});
    } else {
      // Counted before the client can hear the verdict, so that it can observe the count.
      refused_.fetch_add(1, std::memory_order_release);
      c.queue({store::kRefused});
      c.close_after_reply();
    }
    return true;
  }
  store::Request request;
  const store::Parse parsed = store::parse_request(c.input().data(), c.input().size(), &request, &used);
  if (parsed == store::Parse::kNeedMore) return false;
  if (parsed == store::Parse::kMalformed) {
    c.close_after_reply();  // nothing queued: closes at once
    return true;
  }
  c.consume(used);
  handle_request(c, request, now);
  return true;
}

void TcpStoreServer::handle_request(StoreConnection& c, store::Request& request, Clock::time_point now) {
  uint8_t status = store::kOk;
  Bytes reply;
  switch (request.op) {
    case store::kSet:
      data_[request.key] = std::move(request.value);
      answer_parked(request.key);
      break;
    case store::kGet: {
      auto it = data_.find(request.key);
      if (it != data_.end()) {
        reply = it->second;
      } else if (request.timeout_ms <= 0) {
        status = store::kMissing;
      } else {
        const int64_t wait_ms = std::min(request.timeout_ms, kMaxGetWaitMs);
        c.parked = StoreConnection::ParkedGet{request.key, now + milliseconds(wait_ms)};
        return;  // answered by answer_parked() or expire()
      }
      break;
    }
    case store::kCheck: status = data_.count(request.key) ? store::kOk : store::kMissing; break;
    case store::kAdd: {
      int64_t delta = 0, current = 0;
      if (request.value.size() != sizeof(int64_t)) {
        status = store::kBadRequest;
        c.close_after_reply();
        break;
      }
      std::memcpy(&delta, request.value.data(), sizeof(delta));
      Bytes& stored = data_[request.key];
      if (stored.size() == sizeof(int64_t)) std::memcpy(&current, stored.data(), sizeof(current));
      current += delta;
      stored.resize(sizeof(int64_t));
      std::memcpy(stored.data(), &current, sizeof(current));
      reply = stored;
      answer_parked(request.key);
      break;
    }
    case store::kErase: data_.erase(request.key); break;
    default: status = store::kBadRequest; c.close_after_reply();
  }
  c.queue(store::encode_reply(status, reply));
}

// Answers every get parked on `key`; their replies go out when poll() finds the sockets writable.
void TcpStoreServer::answer_parked(const std::string& key) {
  auto it = data_.find(key);
  if (it == data_.end()) return;
  for (auto& [id, c] : connections_) {
    if (!c.parked || c.parked->key != key) continue;
    c.parked.reset();
    c.queue(store::encode_reply(store::kOk, it->second));
  }
}

// Closes connections past their hello deadline or stalled, answers gets past their deadline, and
// returns the nearest deadline still ahead.
Clock::time_point TcpStoreServer::expire(Clock::time_point now) {
  Clock::time_point next = Clock::time_point::max();
  std::vector<uint64_t> doomed;
  for (auto& [id, c] : connections_) {
    if (!c.authenticated()) {
      const Clock::time_point hello_deadline = c.opened() + milliseconds(kHelloDeadlineMs);
      if (now >= hello_deadline) {
        doomed.push_back(id);
        continue;
      }
      next = std::min(next, hello_deadline);
    }
    if (c.parked) {
      if (now >= c.parked->deadline) {
        c.parked.reset();
        c.queue(store::encode_reply(store::kMissing, {}));
      } else {
        next = std::min(next, c.parked->deadline);
      }
    }
    if (c.busy()) {
      const Clock::time_point stall_deadline = c.progress() + milliseconds(kStallMs);
      if (now >= stall_deadline) {
        doomed.push_back(id);
        continue;
      }
      next = std::min(next, stall_deadline);
    }
  }
  for (uint64_t id : doomed) close(id);
  return next;
}

bool TcpStoreServer::drop_oldest_unauthenticated() {
  auto it = std::find_if(connections_.begin(), connections_.end(),
                         [](const auto& entry) { return !entry.second.authenticated(); });
  if (it == connections_.end()) return false;
  close(it->first);
  return true;
}

void TcpStoreServer::close(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  if (!it->second.authenticated()) --unauthenticated_;
  connections_.erase(it);
}

}  // namespace symmem::detail
