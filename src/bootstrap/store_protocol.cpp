#include "bootstrap/store_protocol.hpp"

#include <cstring>

namespace symmem::detail::store {
namespace {

void append(Bytes* out, const void* data, size_t bytes) {
  const size_t at = out->size();
  out->resize(at + bytes);
  if (bytes) std::memcpy(out->data() + at, data, bytes);
}

template <typename T>
void put(Bytes* out, T value) {
  append(out, &value, sizeof(T));
}

template <typename T>
T get(const uint8_t* data) {
  T value;
  std::memcpy(&value, data, sizeof(T));
  return value;
}

}  // namespace

Parse parse_hello(const uint8_t* data, size_t size, std::string* token, size_t* consumed) {
  if (size < sizeof(uint32_t)) return Parse::kNeedMore;
  if (get<uint32_t>(data) != kMagic) return Parse::kMalformed;
  if (size < 2 * sizeof(uint32_t)) return Parse::kNeedMore;
  const uint32_t token_len = get<uint32_t>(data + sizeof(uint32_t));
  if (token_len > kMaxTokenBytes) return Parse::kMalformed;
  const size_t total = 2 * sizeof(uint32_t) + token_len;
  if (size < total) return Parse::kNeedMore;
  token->assign(reinterpret_cast<const char*>(data) + 2 * sizeof(uint32_t), token_len);
  *consumed = total;
  return Parse::kDone;
}

Parse parse_request(const uint8_t* data, size_t size, Request* request, size_t* consumed) {
  size_t at = 1 + sizeof(uint32_t);  // op, key length
  if (size < at) return Parse::kNeedMore;
  const uint32_t key_len = get<uint32_t>(data + 1);
  if (key_len > kMaxKeyBytes) return Parse::kMalformed;
  const size_t key_at = at;
  at += key_len + sizeof(uint64_t);  // key, value length
  if (size < at) return Parse::kNeedMore;
  const uint64_t value_len = get<uint64_t>(data + at - sizeof(uint64_t));
  if (value_len > kMaxValueBytes) return Parse::kMalformed;
  const size_t value_at = at;
  at += value_len + sizeof(int64_t);  // value, timeout
  if (size < at) return Parse::kNeedMore;
  request->op = data[0];
  request->key.assign(reinterpret_cast<const char*>(data) + key_at, key_len);
  request->value.assign(data + value_at, data + value_at + value_len);
  request->timeout_ms = get<int64_t>(data + at - sizeof(int64_t));
  *consumed = at;
  return Parse::kDone;
}

Bytes encode_hello(const std::string& token) {
  Bytes out;
  out.reserve(2 * sizeof(uint32_t) + token.size());
  put(&out, kMagic);
  put(&out, static_cast<uint32_t>(token.size()));
  append(&out, token.data(), token.size());
  return out;
}

Bytes encode_request(uint8_t op, const std::string& key, const Bytes& value, int64_t timeout_ms) {
  Bytes out;
  out.reserve(1 + sizeof(uint32_t) + key.size() + 2 * sizeof(uint64_t) + value.size());
  put(&out, op);
  put(&out, static_cast<uint32_t>(key.size()));
  append(&out, key.data(), key.size());
  put(&out, static_cast<uint64_t>(value.size()));
  append(&out, value.data(), value.size());
  put(&out, timeout_ms);
  return out;
}

Bytes encode_reply(uint8_t status, const Bytes& payload) {
  Bytes out;
  out.reserve(1 + sizeof(uint64_t) + payload.size());
  put(&out, status);
  put(&out, static_cast<uint64_t>(payload.size()));
  append(&out, payload.data(), payload.size());
  return out;
}

}  // namespace symmem::detail::store
