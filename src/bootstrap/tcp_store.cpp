#include "bootstrap/tcp_store.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cstring>

#include "common/check.hpp"

namespace symmem::detail {
namespace {

// Wire format. Hello: magic, token length, token -> one status byte.
// Request: op, key length, key, value length, value, timeout ms -> status byte, length, payload.
constexpr uint32_t kMagic = 0x53594d4d;  // "SYMM"
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint64_t kMaxValueBytes = 64ull << 20;
constexpr int64_t kServerIoMs = 10000;  // a client that stalls mid-message is dropped

enum Op : uint8_t { kSet = 1, kGet = 2, kCheck = 3, kAdd = 4, kErase = 5 };
enum Status : uint8_t { kOk = 0, kMissing = 1, kRefused = 2, kBadRequest = 3 };

template <typename T>
void put(Bytes* out, T value) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(&value);
  out->insert(out->end(), p, p + sizeof(T));
}

template <typename T>
T read_value(const Socket& s, Deadline deadline) {
  T value;
  recv_all(s, &value, sizeof(T), deadline);
  return value;
}

}  // namespace

// True when a request is ready to read; false when the client closed or the server stops.
bool TcpStoreServer::wait_for_request(const Socket& client) const {
  while (!__atomic_load_n(&stop_, __ATOMIC_ACQUIRE)) {
    pollfd p{client.fd(), POLLIN, 0};
    int rc = ::poll(&p, 1, 50);
    if (rc < 0 && errno != EINTR) return false;
    if (rc > 0) return (p.revents & POLLIN) != 0;
  }
  return false;
}

TcpStoreServer::TcpStoreServer(const std::string& address, int port, std::string token) : token_(std::move(token)) {
  listener_ = tcp_listen(address, port, &port_);
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  __atomic_store_n(&stop_, true, __ATOMIC_RELEASE);
  changed_.notify_all();
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    workers.swap(workers_);
  }
  for (auto& w : workers) w.join();
}

int TcpStoreServer::refused_connections() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refused_;
}

void TcpStoreServer::accept_loop() {
  while (!__atomic_load_n(&stop_, __ATOMIC_ACQUIRE)) {
    Socket client;
    try {
      client = accept_until(listener_, deadline_after_ms(100), &stop_);
    } catch (const Error&) {
      continue;
    }
    if (!client.valid()) continue;
    std::lock_guard<std::mutex> lock(mutex_);
    workers_.emplace_back([this, c = std::move(client)]() mutable { serve(std::move(c)); });
  }
}

void TcpStoreServer::serve(Socket client) {
  try {
    // Authenticate before anything else is read: a wrong magic or token ends the connection.
    const Deadline hello_deadline = deadline_after_ms(kServerIoMs);
    uint32_t magic = read_value<uint32_t>(client, hello_deadline);
    uint32_t token_len = read_value<uint32_t>(client, hello_deadline);
    std::string token;
    if (magic == kMagic && token_len <= 1024) {
      token.resize(token_len);
      recv_all(client, token.data(), token_len, hello_deadline);
    }
    const bool accepted = magic == kMagic && equal_secret(token, token_);
    if (!accepted) {  // counted before the client hears the verdict, so that it can observe the count
      std::lock_guard<std::mutex> lock(mutex_);
      ++refused_;
    }
    uint8_t verdict = accepted ? kOk : kRefused;
    send_all(client, &verdict, 1, hello_deadline);
    if (!accepted) return;

    while (wait_for_request(client)) {
      const Deadline io = deadline_after_ms(kServerIoMs);
      uint8_t op = read_value<uint8_t>(client, io);
      uint32_t key_len = read_value<uint32_t>(client, io);
      if (key_len > kMaxKeyBytes) return;
      std::string key(key_len, '\0');
      recv_all(client, key.data(), key_len, io);
      uint64_t value_len = read_value<uint64_t>(client, io);
      if (value_len > kMaxValueBytes) return;
      Bytes value(value_len);
      recv_all(client, value.data(), value_len, io);
      int64_t timeout_ms = read_value<int64_t>(client, io);

      uint8_t status = kOk;
      Bytes reply;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        switch (op) {
          case kSet:
            data_[key] = std::move(value);
            changed_.notify_all();
            break;
          case kGet: {
            const Deadline deadline = deadline_after_ms(timeout_ms);
            while (!data_.count(key) && Clock::now() < deadline && !__atomic_load_n(&stop_, __ATOMIC_ACQUIRE))
              changed_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
            auto it = data_.find(key);
            if (it == data_.end())
              status = kMissing;
            else
              reply = it->second;
            break;
          }
          case kCheck: status = data_.count(key) ? kOk : kMissing; break;
          case kAdd: {
            int64_t delta = 0, current = 0;
            if (value.size() != sizeof(int64_t)) {
              status = kBadRequest;
              break;
            }
            std::memcpy(&delta, value.data(), sizeof(delta));
            auto it = data_.find(key);
            if (it != data_.end() && it->second.size() == sizeof(int64_t))
              std::memcpy(&current, it->second.data(), sizeof(current));
            current += delta;
            Bytes stored;
            put(&stored, current);
            data_[key] = stored;
            reply = stored;
            changed_.notify_all();
            break;
          }
          case kErase: data_.erase(key); break;
          default: status = kBadRequest;
        }
      }
      Bytes header;
      put(&header, status);
      put(&header, static_cast<uint64_t>(reply.size()));
      header.insert(header.end(), reply.begin(), reply.end());
      send_all(client, header.data(), header.size(), deadline_after_ms(kServerIoMs));
      if (status == kBadRequest) return;
    }
  } catch (const Error&) {
    // A broken client only loses its own connection.
  }
}

TcpStoreClient::TcpStoreClient(const std::string& address, int port, const std::string& token, int64_t timeout_ms)
    : timeout_ms_(timeout_ms) {
  const Deadline deadline = deadline_after_ms(timeout_ms);
  socket_ = tcp_connect(address, port, deadline);
  Bytes hello;
  put(&hello, kMagic);
  put(&hello, static_cast<uint32_t>(token.size()));
  hello.insert(hello.end(), token.begin(), token.end());
  send_all(socket_, hello.data(), hello.size(), deadline);
  uint8_t verdict = kRefused;
  try {
    recv_all(socket_, &verdict, 1, deadline);
  } catch (const Error&) {
    verdict = kRefused;
  }
  if (verdict != kOk)
    throw Error(ErrorCode::kBootstrap, "store at " + address + ":" + std::to_string(port) +
                                           " refused this process: wrong job token (SYMMEM_TOKEN)");
}

Bytes TcpStoreClient::request(uint8_t op, const std::string& key, const Bytes& value, int64_t timeout_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  Bytes message;
  put(&message, op);
  put(&message, static_cast<uint32_t>(key.size()));
  message.insert(message.end(), key.begin(), key.end());
  put(&message, static_cast<uint64_t>(value.size()));
  message.insert(message.end(), value.begin(), value.end());
  put(&message, timeout_ms);
  // The reply may legitimately take timeout_ms (a get that waits); allow I/O slack beyond it.
  const Deadline deadline = deadline_after_ms(timeout_ms + timeout_ms_);
  send_all(socket_, message.data(), message.size(), deadline);
  uint8_t status = read_value<uint8_t>(socket_, deadline);
  uint64_t len = read_value<uint64_t>(socket_, deadline);
  if (len > kMaxValueBytes) throw Error(ErrorCode::kBootstrap, "store reply too large");
  Bytes reply(len);
  recv_all(socket_, reply.data(), len, deadline);
  if (status == kMissing)
    throw Error(ErrorCode::kTimeout,
                "store key '" + key + "' did not appear within " + std::to_string(timeout_ms) + " ms");
  if (status != kOk) throw Error(ErrorCode::kBootstrap, "store rejected a request for '" + key + "'");
  return reply;
}

void TcpStoreClient::set(const std::string& key, const Bytes& value) { request(kSet, key, value, 0); }

Bytes TcpStoreClient::get(const std::string& key, int64_t timeout_ms) { return request(kGet, key, {}, timeout_ms); }

bool TcpStoreClient::check(const std::string& key) {
  try {
    request(kCheck, key, {}, 0);
    return true;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kTimeout) return false;
    throw;
  }
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  Bytes value;
  put(&value, delta);
  Bytes reply = request(kAdd, key, value, 0);
  int64_t result = 0;
  std::memcpy(&result, reply.data(), sizeof(result));
  return result;
}

void TcpStoreClient::erase(const std::string& key) { request(kErase, key, {}, 0); }

}  // namespace symmem::detail
