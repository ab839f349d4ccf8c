// The TCP store's wire format, shared by the client and the server's event loop. Fields are in the
// host's byte order (client and server are builds of one library on one node).
//
//   hello:   u32 magic, u32 token length, token                   -> u8 status
//   request: u8 op, u32 key length, key, u64 value length, value,
//            i64 timeout ms (how long a get may wait)              -> u8 status, u64 length, payload
//
// The parsers are incremental: given the bytes received so far they say whether a whole message is
// there, more is needed, or the bytes can never become a valid message. The limits are checked as
// soon as a length field arrives, before anything is allocated, so a forged length costs nothing.
// No sockets and no CUDA here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace symmem::detail {

using Bytes = std::vector<uint8_t>;

namespace store {

constexpr uint32_t kMagic = 0x53594d4d;  // "SYMM"
constexpr uint32_t kMaxTokenBytes = 1024;
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint64_t kMaxValueBytes = 64ull << 20;
constexpr size_t kMaxHelloBytes = 2 * sizeof(uint32_t) + kMaxTokenBytes;
constexpr size_t kMaxRequestBytes = 1 + sizeof(uint32_t) + kMaxKeyBytes + 2 * sizeof(uint64_t) + kMaxValueBytes;

enum Op : uint8_t { kSet = 1, kGet = 2, kCheck = 3, kAdd = 4, kErase = 5 };
enum Status : uint8_t { kOk = 0, kMissing = 1, kRefused = 2, kBadRequest = 3 };

enum class Parse { kNeedMore, kDone, kMalformed };

struct Request {
  uint8_t op = 0;
  std::string key;
  Bytes value;
  int64_t timeout_ms = 0;
};

// kDone: *token holds the presented token and *consumed the hello's length. kMalformed: wrong
// magic or a token longer than kMaxTokenBytes (decided from the first 8 bytes).
Parse parse_hello(const uint8_t* data, size_t size, std::string* token, size_t* consumed);
// kDone: *request holds the request and *consumed its length. kMalformed: a key or value length
// over its limit. The op is not checked here (an unknown op is answered kBadRequest).
Parse parse_request(const uint8_t* data, size_t size, Request* request, size_t* consumed);

Bytes encode_hello(const std::string& token);
Bytes encode_request(uint8_t op, const std::string& key, const Bytes& value, int64_t timeout_ms);
Bytes encode_reply(uint8_t status, const Bytes& payload);

}  // namespace store
}  // namespace symmem::detail
