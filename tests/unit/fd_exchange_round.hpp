// One round of the fd exchange as the bootstrap tests drive it: each rank passes a memfd holding
// "rank:round" (standing in for an exported CUDA allocation) and checks what every peer passed.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "bootstrap/fd_exchange.hpp"

namespace symmem::test {

// True when every peer's descriptor arrived with its text; closes everything it received.
inline bool exchange_and_check_round(detail::FdExchange& exchange, int rank, int world, int round) {
  int fd = memfd_create("symmem-test", MFD_CLOEXEC);
  const std::string text = std::to_string(rank) + ":" + std::to_string(round);
  bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  std::vector<int> peers = exchange.exchange(fd);
  close(fd);
  for (int r = 0; r < world; ++r) {
    if (r == rank) {
      ok &= peers[r] == -1;
      continue;
    }
    char buf[32] = {};
    ok &= pread(peers[r], buf, sizeof(buf) - 1, 0) > 0;
    ok &= std::string(buf) == std::to_string(r) + ":" + std::to_string(round);
    close(peers[r]);
  }
  return ok;
}

}  // namespace symmem::test
