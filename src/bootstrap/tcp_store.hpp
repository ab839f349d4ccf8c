// A small TCP key-value store for rendezvous. Rank 0 hosts the server; every rank (rank 0 too)
// talks to it through a client. Every connection must first present the job token; a client
// with the wrong token is refused and disconnected. The server binds one address only (the
// caller's MASTER_ADDR, loopback by default), never all interfaces unless that address is asked
// for. Every blocking call has a deadline. No CUDA here.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/socket.hpp"

namespace symmem::detail {

using Bytes = std::vector<uint8_t>;

class TcpStoreServer {
 public:
  // Listens on address:port (port 0: ephemeral, see port()).
  TcpStoreServer(const std::string& address, int port, std::string token);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  int refused_connections() const;  // how many clients presented a wrong token

 private:
  void accept_loop();
  void serve(Socket client);
  bool wait_for_request(const Socket& client) const;

  std::string token_;
  Socket listener_;
  int port_ = 0;
  bool stop_ = false;  // read with atomic builtins by the worker threads
  std::thread acceptor_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> data_;
  std::vector<std::thread> workers_;
  int refused_ = 0;
};

class TcpStoreClient {
 public:
  // Connects (retrying until timeout_ms, since the server may start later) and authenticates.
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
