#include "nccl/serve_plan.hpp"

namespace symmem::nccl {

bool parse_mode(const std::string& text, Mode* mode) {
  if (text == "off") *mode = Mode::kOff;
  else if (text == "auto") *mode = Mode::kAuto;
  else if (text == "all") *mode = Mode::kAll;
  else return false;
  return true;
}

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kOff: return "off";
    case Mode::kAll: return "all";
    default: return "auto";
  }
}

const char* collective_name(Collective op) {
  switch (op) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAlltoAll: return "alltoall";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduce: return "reduce";
  }
  return "unknown";
}

size_t nccl_type_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

size_t nccl_size_bytes(const NcclCall& call) {
  const size_t bytes = call.count * nccl_type_bytes(call.type);
  switch (call.op) {
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAlltoAll: return bytes * static_cast<size_t>(call.world);
    default: return bytes;
  }
}

size_t send_bytes(const NcclCall& call) {
  const size_t bytes = call.count * nccl_type_bytes(call.type);
  return call.op == Collective::kReduceScatter || call.op == Collective::kAlltoAll ? bytes * call.world : bytes;
}

size_t recv_bytes(const NcclCall& call) {
  const size_t bytes = call.count * nccl_type_bytes(call.type);
  return call.op == Collective::kAllGather || call.op == Collective::kAlltoAll ? bytes * call.world : bytes;
}

namespace {

std::optional<DataType> symmem_type(ncclDataType_t type) {
  switch (type) {
    case ncclFloat32: return DataType::kFloat32;
    case ncclFloat16: return DataType::kFloat16;
    case ncclBfloat16: return DataType::kBFloat16;
    case ncclInt32: return DataType::kInt32;
    case ncclUint8: return DataType::kUInt8;
    default: return std::nullopt;
  }
}

std::optional<ReduceOp> symmem_op(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return ReduceOp::kSum;
    case ncclMax: return ReduceOp::kMax;
    case ncclMin: return ReduceOp::kMin;
    case ncclAvg: return ReduceOp::kAvg;
    default: return std::nullopt;  // prod and pre-multiplied sums
  }
}

}  // namespace

std::optional<SymmemCall> symmem_form(const NcclCall& call) {
  const size_t elem = nccl_type_bytes(call.type);
  if (elem == 0) return std::nullopt;
  switch (call.op) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter: {
      const auto type = symmem_type(call.type);
      // uint8 has a symmem name but no reduction.
      if (!type || *type == DataType::kUInt8) return std::nullopt;
      const auto op = symmem_op(call.redop);
      if (!op) return std::nullopt;
      // Integer averages round in NCCL's own way (symmem averages floating types only): forwarded.
      // A float16 average sums in float32 and scales before rounding, so it overflows no sooner
      // than NCCL's, which scales each input first.
      if (*op == ReduceOp::kAvg && *type == DataType::kInt32) return std::nullopt;
      return SymmemCall{*type, *op, call.count};
    }
    case Collective::kAllGather:
    case Collective::kAlltoAll: {
      // Data movement only: a type symmem has no name for moves as bytes.
      if (const auto type = symmem_type(call.type)) return SymmemCall{*type, ReduceOp::kSum, call.count};
      return SymmemCall{DataType::kUInt8, ReduceOp::kSum, call.count * elem};
    }
    default: return std::nullopt;
  }
}

Decision decide(const NcclCall& call, const ServeRules& rules) {
  if (rules.mode == Mode::kOff) return {Route::kNccl, "SYMMEM_NCCL=off"};
  if (call.world < rules.min_world) return {Route::kNccl, "a communicator of one rank"};
  if (call.count == 0) return {Route::kNccl, "an empty call"};
  if (!symmem_form(call)) return {Route::kNccl, "a collective, type or reduction symmem does not implement"};
  if (call.spans_nodes && call.op != Collective::kAllGather)
    return {Route::kNccl, "across nodes symmem serves all_gather only"};
  if (!call.spans_nodes && call.world > kMaxWorld) return {Route::kNccl, "more ranks than one NVLink domain holds"};
  if (rules.mode == Mode::kAll) return {Route::kSymmem, "SYMMEM_NCCL=all"};

  const size_t bytes = nccl_size_bytes(call);
  if (rules.table) {
    if (const auto route = rules.table->lookup(collective_name(call.op), call.world, call.buffers, call.spans_nodes,
                                               bytes, rules.workspace_bytes))
      return {*route, *route == Route::kSymmem ? "cutover table: symmem" : "cutover table: NCCL is faster"};
  }
  if (call.spans_nodes) return {Route::kNccl, "built-in rule: across nodes only where the table says so"};
  if (call.buffers == BufferKind::kWindow) return {Route::kSymmem, "built-in rule: registered windows (zero copy)"};
  if (bytes <= rules.workspace_bytes / 4) return {Route::kSymmem, "built-in rule: fits one staging area"};
  return {Route::kNccl, "built-in rule: larger than one staging area"};
}

}  // namespace symmem::nccl
