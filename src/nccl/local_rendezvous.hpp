// How the ranks of one NCCL communicator that share this host find each other, with no port, no
// store and no environment variable: through the communicator itself.
//
// Every rank knows the communicator's key (a hash of its unique id, or of its parent's key and the
// split that made it) and its index among the candidates (its rank, or its rank in the parent).
// Before the real NCCL init each rank listens on the abstract Unix socket
// "@symmem-nccl-<key>-<index>". The real init returns only after every rank of the communicator
// entered it, so afterwards every rank of this host listens: a candidate whose socket accepts is on
// this host, one that refuses is not. The host's lowest index is its root: every other rank of the
// host connects to it and says hello (the key's secret, its rank, its settings; the peer's uid is
// checked), and the root answers with every hello of the host. What remains is a star of connected
// sockets, the bootstrap of the host's ranks (LocalBootstrap): it makes the symmem communicator and
// registers windows.
//
// Failure: every wait has a deadline. A rank whose end closes (it died, or it failed a collective
// step and closed its end on purpose) makes every exchange of the others fail at once; a failed
// exchange closes this rank's end too, so one failure reaches every rank of the host.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap/socket.hpp"
#include "nccl/shim_settings.hpp"
#include "symmem/bootstrap.hpp"

namespace symmem::nccl {

struct RendezvousKey {
  uint64_t name = 0;    // in the socket names (anyone on the host can list them)
  uint64_t secret = 0;  // in every hello: only ranks that know the communicator's origin have it

  static RendezvousKey of_unique_ids(const void* ids, size_t bytes);  // ncclCommInitRank*: the id(s)
  static RendezvousKey random();                                     // ncclCommInitAll: one process
  // The child made by this communicator's `sequence`-th split or shrink (every rank of the parent
  // counts them alike), for ranks of split colour `color` (shrinks: a colour of their own).
  RendezvousKey child(uint64_t sequence, int64_t color) const;
  std::string socket_name(int index) const;
};

// What each rank tells the others of its host.
struct Hello {
  uint64_t secret = 0;
  int32_t index = 0;  // among the candidates
  int32_t rank = 0;   // in the communicator
  int32_t world = 0;  // ranks of the communicator
  int32_t device = 0;
  ShimSettings settings;
};

// The star of a host's ranks as a symmem Bootstrap. Ranks are the host's, ordered by their rank in
// the communicator (on one node: the communicator's ranks).
class LocalBootstrap final : public Bootstrap {
 public:
  LocalBootstrap(bool root, std::vector<detail::Socket> links, int rank, int world, int64_t timeout_ms);
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void all_gather(const void* mine, void* all, size_t bytes) override;
  void barrier() override;
  // Closes this rank's end: every pending and later exchange of the other ranks fails at once.
  // Called by the thread that exchanges.
  void close() noexcept;
  // From any thread (ncclCommAbort's): this rank's exchange under way, and every later one, fail
  // at once, and so do the other ranks'. The sockets stay open until close().
  void interrupt() noexcept;

 private:
  bool root_;
  std::mutex links_mutex_;  // close() against interrupt(): a descriptor is never shut after its close
  std::vector<detail::Socket> links_;  // root: by host rank (its own slot empty); others: [0], the root
  int rank_;
  int world_;
  int64_t timeout_ms_;
  uint64_t sequence_ = 0;
  bool closed_ = false;
};

class LocalRendezvous {
 public:
  // Before the real init: listens. Throws kSystemError when the socket cannot be made.
  LocalRendezvous(const RendezvousKey& key, int index, int candidates);

  // After the real init returned here: finds this host's ranks, connects them and exchanges
  // hellos (this rank's index is filled in `mine`). `hellos` receives the host's, ordered by rank. Collective over the host's ranks; throws
  // kTimeout / kBootstrap naming what is missing. Stops listening either way.
  std::shared_ptr<LocalBootstrap> join(const Hello& mine, int64_t timeout_ms, std::vector<Hello>* hellos);

  // From any thread (ncclCommAbort's): a join under way, or a later one, throws kAborted instead of
  // waiting for a peer until the deadline (a root between its 100 ms polls, or reading a stray
  // connection's hello, first finishes that). A root tells the ranks already connected to it that it
  // was aborted; a rank aborted before it connected leaves its root waiting until the deadline.
  void interrupt() noexcept;

 private:
  void throw_if_interrupted() const;
  // The link to the host's root while a join waits on it (interrupt() shuts it down), or -1.
  void set_waiting_link(int fd);

  RendezvousKey key_;
  int index_;
  int candidates_;
  detail::Socket listener_;
  std::atomic<bool> interrupted_{false};
  std::mutex link_mutex_;  // waiting_link_ against interrupt(): a descriptor is never shut after it is handed on
  int waiting_link_ = -1;
};

}  // namespace symmem::nccl
