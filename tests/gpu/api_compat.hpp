// What differs between the API these tests are written for and the one of commit 6cf5c42, so that
// the scenario tests (test_ownership, test_mismatch, test_stress,
// test_kill) also build against the old tree, where they must fail (the negative control of
// docs/STYLE habit 13). Build the old tree's tests with -DSYMMEM_TEST_OLD_API=1; the default is
// the current API.
//
// Old API: collectives take raw pointers and infer a heap buffer from the address; there is no
// kMismatch (ranks that called different things time out, or silently compute garbage), no
// workspace budget, and a call that needs a staging buffer must run once before graph capture.
#pragma once

#include <cstddef>
#include <cstdint>

#include "symmem/symmem.hpp"

#ifndef SYMMEM_TEST_OLD_API
#define SYMMEM_TEST_OLD_API 0
#endif

namespace symmem::test {

#if SYMMEM_TEST_OLD_API

// What a collective takes as an operand, and this rank's address of it.
using OperandArg = void*;
inline void* address_of(OperandArg operand) { return operand; }
// A heap buffer at `offset`: the old API could only say it with the address.
inline void* sym(Buffer* buffer, size_t offset = 0) { return static_cast<char*>(buffer->ptr()) + offset; }
// The old tree has no kMismatch: a test that expects one fails there.
inline bool is_mismatch(const Error&) { return false; }
inline CommConfig make_config(int64_t timeout_ms, size_t /*workspace_bytes*/ = 0) {
  CommConfig c;
  c.timeout_ms = timeout_ms;
  return c;
}
// The old tree refuses to grow its scratch buffer during capture: run the call once first.
constexpr bool kWarmUpBeforeCapture = true;

#else

// What a collective takes as an operand, and this rank's address of it.
using OperandArg = Operand;
inline void* address_of(const Operand& operand) { return operand.ptr(); }
// A symmetric operand: `buffer` at `offset` (the same offset on every rank).
inline Operand sym(Buffer* buffer, size_t offset = 0) { return Operand(buffer, offset); }
inline bool is_mismatch(const Error& e) { return e.code() == ErrorCode::kMismatch; }
// `workspace_bytes` 0 keeps the default budget (SYMMEM_WORKSPACE_MB).
inline CommConfig make_config(int64_t timeout_ms, size_t workspace_bytes = 0) {
  CommConfig c;
  c.timeout_ms = timeout_ms;
  c.workspace_bytes = workspace_bytes;
  return c;
}
// Workspaces exist from creation: a call is capturable without running it first.
constexpr bool kWarmUpBeforeCapture = false;

#endif

}  // namespace symmem::test
