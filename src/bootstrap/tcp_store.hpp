// A small TCP key-value store for rendezvous. Rank 0 hosts the server; every rank (rank 0 too)
// talks to it through a client. The server binds one address only (the caller's MASTER_ADDR,
// loopback by default), never all interfaces unless that address is asked for. No CUDA here.
//
// The server is one thread running a poll() loop over non-blocking sockets, so what a stray
// process can cost it is bounded and does not grow with the number of connections it opens:
//  - a connection must present the job token within kHelloDeadlineMs; a wrong token or a malformed
//    hello is refused (counted, answered, closed) before any key is read;
//  - at most kMaxUnauthenticated connections wait for their hello and kMaxConnections are open:
//    past either cap the oldest unauthenticated connection is dropped to make room;
//  - a key, value or token over its limit (store_protocol.hpp) closes the connection as soon as its
//    length field arrives; a connection that stops mid-message for kStallMs is closed;
//  - accept() failing for lack of descriptors or memory drops the oldest unauthenticated
//    connection or pauses accepting briefly; nothing leaves the loop thread as an exception.
// A blocking get is a parked request, answered when its key is set or at its deadline.
// The constants live in tcp_store.cpp. The client retries a connection dropped before its hello
// was answered, so a flood delays a rank but does not fail it before its deadline.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/socket.hpp"
#include "bootstrap/store_connection.hpp"
#include "bootstrap/store_protocol.hpp"

namespace symmem::detail {

class TcpStoreServer {
 public:
  // Listens on address:port (port 0: ephemeral, see port()) and starts the loop thread.
  TcpStoreServer(const std::string& address, int port, std::string token);
  ~TcpStoreServer();  // stops and joins the loop thread; closes every connection
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // How many connections were refused for a wrong token or a malformed hello. Counted before the
  // refused client hears the verdict, so a client that was refused can observe its refusal.
  int refused_connections() const { return refused_.load(std::memory_order_acquire); }

 private:
  using Connections = std::map<uint64_t, StoreConnection>;  // by id: oldest first

  void run() noexcept;
  void turn();
  void accept_new(Clock::time_point now);
  void service(uint64_t id, bool readable, Clock::time_point now);
  bool handle_one(StoreConnection& c, Clock::time_point now);
  void handle_request(StoreConnection& c, store::Request& request, Clock::time_point now);
  void answer_parked(const std::string& key);
  Clock::time_point expire(Clock::time_point now);
  bool drop_oldest_unauthenticated();
  void close(uint64_t id);

  std::string token_;
  Socket listener_;
  Socket wake_;  // eventfd: the destructor writes it to interrupt poll()
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> refused_{0};

  // Loop thread only.
  Connections connections_;
  uint64_t next_id_ = 0;
  int unauthenticated_ = 0;
  Clock::time_point accept_paused_until_{};
  std::map<std::string, Bytes> data_;

  std::thread loop_;  // last: starts after everything it touches is constructed
};

class TcpStoreClient {
 public:
  // Connects (retrying until timeout_ms, since the server may start later or drop the connection
  // while flooded) and authenticates. Throws kBootstrap when the store refuses the token, kTimeout
  // when no connection was answered in time.
  TcpStoreClient(const std::string& address, int port, const std::string& token, int64_t timeout_ms);

  void set(const std::string& key, const Bytes& value);
  // Waits until the key exists; throws kTimeout naming the key at the deadline.
  Bytes get(const std::string& key, int64_t timeout_ms);
  bool check(const std::string& key);
  int64_t add(const std::string& key, int64_t delta);  // atomic; returns the new value
  void erase(const std::string& key);

 private:
  Bytes request(uint8_t op, const std::string& key, const Bytes& value, int64_t timeout_ms);

  Socket socket_;
  int64_t timeout_ms_;
  std::mutex mutex_;  // one request at a time per connection
};

}  // namespace symmem::detail
