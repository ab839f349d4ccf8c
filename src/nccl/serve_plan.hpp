// Which NCCL calls libsymmem_nccl.so serves with symmem and which it forwards to the real NCCL.
// Pure C++ (nccl.h's enums only), tested on the CPU.
//
// The ranks must route every call alike: a call served on one rank and forwarded on another
// deadlocks both libraries. So a decision depends only on inputs equal on every rank: the
// collective, count, type, reduction, world, whether the communicator spans nodes, the buffers'
// kind (registered windows are registered collectively: every rank has them or none), and settings
// the ranks compared when the communicator was made (the mode, the workspace budget, the cutover
// table). Never on addresses, streams, capture or timing.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <optional>
#include <string>

#include "nccl/cutover_table.hpp"
#include "symmem/types.hpp"

namespace symmem::nccl {

// SYMMEM_NCCL.
enum class Mode { kOff, kAuto, kAll };
bool parse_mode(const std::string& text, Mode* mode);
const char* mode_name(Mode mode);

// The collectives that could be served; everything else is always forwarded.
enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAlltoAll, kBroadcast, kReduce };
const char* collective_name(Collective op);  // the cutover table's names: "all_reduce", "alltoall", ...

struct NcclCall {
  Collective op = Collective::kAllReduce;
  // NCCL's count: all_reduce elements, all_gather sendcount, reduce_scatter recvcount, alltoall
  // elements per peer.
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t redop = ncclSum;  // reductions only
  int world = 1;
  BufferKind buffers = BufferKind::kStaged;
  bool spans_nodes = false;
};

// nccl-tests' "size" of a call: bytes of its larger buffer (the cutover table's unit).
size_t nccl_size_bytes(const NcclCall& call);
size_t nccl_type_bytes(ncclDataType_t type);  // 0 for an unknown type
// Bytes of a call's input and output on one rank (the operands' extents).
size_t send_bytes(const NcclCall& call);
size_t recv_bytes(const NcclCall& call);

// The call as symmem runs it: its type, reduction and element count (a gather of a type symmem
// has no name for moves bytes). Nothing when symmem does not implement it (a type or reduction it
// lacks, broadcast, reduce).
struct SymmemCall {
  DataType type = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
};
std::optional<SymmemCall> symmem_form(const NcclCall& call);

struct ServeRules {
  Mode mode = Mode::kAuto;
  size_t workspace_bytes = 0;           // the symmem communicator's budget (staged calls)
  const CutoverTable* table = nullptr;  // may be empty
  int min_world = 2;                    // 1 only under SYMMEM_TEST_NCCL_ONE_RANK
};

struct Decision {
  Route route = Route::kNccl;
  const char* why = "";  // for SYMMEM_DEBUG
};

// Without a row of the table: staged calls up to one quarter of the workspace budget (one staging
// area: no chunking) and every call on registered windows go to symmem, on one node; a
// communicator that spans nodes forwards everything (its all-gather goes to symmem only where the
// table says so, or with SYMMEM_NCCL=all).
Decision decide(const NcclCall& call, const ServeRules& rules);

}  // namespace symmem::nccl
