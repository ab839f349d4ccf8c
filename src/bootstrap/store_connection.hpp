// One client connection of the store server, touched only by the server's event-loop thread: a
// non-blocking socket, the bytes received and not yet parsed, the reply bytes not yet taken by the
// kernel, and when the connection last made progress. No policy here: the server decides what to
// read, when to park a get, and when to close (see tcp_store.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "bootstrap/socket.hpp"
#include "bootstrap/store_protocol.hpp"

namespace symmem::detail {

class StoreConnection {
 public:
  StoreConnection(Socket socket, Clock::time_point now) : socket_(std::move(socket)), opened_(now), progress_(now) {}

  int fd() const { return socket_.fd(); }
  Clock::time_point opened() const { return opened_; }

  // Set once the connection presented the job token; until then only a hello is parsed.
  bool authenticated() const { return authenticated_; }
  void authenticate() { authenticated_ = true; }

  // Set when the connection is to be closed as soon as its pending reply is sent.
  bool closing() const { return closing_; }
  void close_after_reply() { closing_ = true; }

  // Reads what the socket holds without blocking until `limit` bytes are buffered. False when the
  // socket failed; the peer's end of stream sets peer_closed() and keeps what came before it.
  bool receive(size_t limit, Clock::time_point now);
  bool peer_closed() const { return peer_closed_; }
  // Sends what the kernel takes of the pending reply. False when the socket failed.
  bool send_pending(Clock::time_point now);

  const Bytes& input() const { return input_; }
  void consume(size_t bytes);
  bool has_output() const { return sent_ < output_.size(); }
  void queue(Bytes bytes);

  // A get that waits for its key: answered by a set or add of the key, or kMissing at the deadline.
  struct ParkedGet {
    std::string key;
    Clock::time_point deadline;
  };
  std::optional<ParkedGet> parked;

  // True while the connection holds half a message or an unsent reply (a parked get is waiting,
  // not busy): a busy connection that stops moving bytes has a stalled peer.
  bool busy() const { return (!input_.empty() || has_output()) && !parked; }
  Clock::time_point progress() const { return progress_; }  // last time a byte moved either way

 private:
  Socket socket_;
  Clock::time_point opened_;
  Clock::time_point progress_;
  bool authenticated_ = false;
  bool closing_ = false;
  bool peer_closed_ = false;
  Bytes input_;
  Bytes output_;
  size_t sent_ = 0;
};

}  // namespace symmem::detail
