// The store client: one blocking connection per client, every call bounded by a deadline. A
// connection the server drops before answering the hello (it sheds the oldest unauthenticated
// connections when flooded) is retried until the deadline; an explicit refusal is final.
#include <cstring>
#include <thread>

#include "bootstrap/tcp_store.hpp"
#include "common/check.hpp"

namespace symmem::detail {
namespace {

// Pause before reconnecting after the server dropped a connection that had not been answered.
constexpr int64_t kReconnectPauseMs = 20;

std::string store_name(const std::string& address, int port) {
  return "store at " + address + ":" + std::to_string(port);
}

}  // namespace

TcpStoreClient::TcpStoreClient(const std::string& address, int port, const std::string& token, int64_t timeout_ms)
    : timeout_ms_(timeout_ms) {
  if (token.size() > store::kMaxTokenBytes)
    throw Error(ErrorCode::kInvalidArgument, "store token of " + std::to_string(token.size()) + " bytes exceeds " +
                                                 std::to_string(store::kMaxTokenBytes));
  const Deadline deadline = deadline_after_ms(timeout_ms);
  const Bytes hello = store::encode_hello(token);
  std::string dropped;
  for (;;) {
    Socket s = tcp_connect(address, port, deadline);
    bool answered = false;
    uint8_t verdict = store::kRefused;
    try {
      send_all(s, hello.data(), hello.size(), deadline);
      recv_all(s, &verdict, 1, deadline);
      answered = true;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kTimeout)
        throw Error(ErrorCode::kTimeout, store_name(address, port) + " did not answer the hello within " +
                                             std::to_string(timeout_ms) + " ms");
      dropped = e.what();  // closed or reset before the verdict: reconnect
    }
    if (answered && verdict == store::kOk) {
      socket_ = std::move(s);
      return;
    }
    if (answered)
      throw Error(ErrorCode::kBootstrap,
                  store_name(address, port) + " refused this process: wrong job token (SYMMEM_TOKEN)");
    if (Clock::now() >= deadline)
      throw Error(ErrorCode::kTimeout, store_name(address, port) + " dropped every connection of this process " +
                                           "before answering its hello (" + dropped + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(kReconnectPauseMs));
  }
}

Bytes TcpStoreClient::request(uint8_t op, const std::string& key, const Bytes& value, int64_t timeout_ms) {
  if (key.size() > store::kMaxKeyBytes || value.size() > store::kMaxValueBytes)
    throw Error(ErrorCode::kInvalidArgument, "store key '" + key.substr(0, 64) + "' (" + std::to_string(key.size()) +
                                                 " bytes) or its value (" + std::to_string(value.size()) +
                                                 " bytes) exceeds the store's limits");
  std::lock_guard<std::mutex> lock(mutex_);
  const Bytes message = store::encode_request(op, key, value, timeout_ms);
  // The reply may legitimately take timeout_ms (a get that waits); allow I/O slack beyond it.
  const Deadline deadline = deadline_after_ms(timeout_ms + timeout_ms_);
  send_all(socket_, message.data(), message.size(), deadline);
  uint8_t status = store::kBadRequest;
  uint64_t len = 0;
  recv_all(socket_, &status, sizeof(status), deadline);
  recv_all(socket_, &len, sizeof(len), deadline);
  if (len > store::kMaxValueBytes) throw Error(ErrorCode::kBootstrap, "store reply too large");
  Bytes reply(len);
  recv_all(socket_, reply.data(), len, deadline);
  if (status == store::kMissing)
    throw Error(ErrorCode::kTimeout,
                "store key '" + key + "' did not appear within " + std::to_string(timeout_ms) + " ms");
  if (status != store::kOk) throw Error(ErrorCode::kBootstrap, "store rejected a request for '" + key + "'");
  return reply;
}

void TcpStoreClient::set(const std::string& key, const Bytes& value) { request(store::kSet, key, value, 0); }

Bytes TcpStoreClient::get(const std::string& key, int64_t timeout_ms) {
  return request(store::kGet, key, {}, timeout_ms);
}

bool TcpStoreClient::check(const std::string& key) {
  try {
    request(store::kCheck, key, {}, 0);
    return true;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kTimeout) return false;
    throw;
  }
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  Bytes value(sizeof(delta));
  std::memcpy(value.data(), &delta, sizeof(delta));
  Bytes reply = request(store::kAdd, key, value, 0);
  int64_t result = 0;
  if (reply.size() != sizeof(result)) throw Error(ErrorCode::kBootstrap, "store answered add('" + key + "') badly");
  std::memcpy(&result, reply.data(), sizeof(result));
  return result;
}

void TcpStoreClient::erase(const std::string& key) { request(store::kErase, key, {}, 0); }

}  // namespace symmem::detail
