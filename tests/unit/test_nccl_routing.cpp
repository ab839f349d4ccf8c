// libsymmem_nccl.so's routing (src/nccl/serve_plan.hpp) and cutover table
// (src/nccl/cutover_table.hpp): which NCCL calls symmem serves, from inputs equal on every rank.
#include <string>
#include <vector>

#include "common/env.hpp"
#include "nccl/cutover_table.hpp"
#include "nccl/serve_plan.hpp"
#include "nccl/shim_settings.hpp"
#include "symmem/error.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::nccl;

namespace {

constexpr size_t kWorkspace = size_t(16) << 20;

NcclCall call_of(Collective op, size_t count, ncclDataType_t type, ncclRedOp_t redop = ncclSum, int world = 2,
                 BufferKind buffers = BufferKind::kStaged, bool spans = false) {
  NcclCall c;
  c.op = op;
  c.count = count;
  c.type = type;
  c.redop = redop;
  c.world = world;
  c.buffers = buffers;
  c.spans_nodes = spans;
  return c;
}

ServeRules rules_of(Mode mode, const CutoverTable* table = nullptr, size_t workspace = kWorkspace) {
  ServeRules r;
  r.mode = mode;
  r.workspace_bytes = workspace;
  r.table = table;
  return r;
}

Route route_of(const NcclCall& c, const ServeRules& r) { return decide(c, r).route; }

}  // namespace

TEST(nccl_routing_off_forwards_everything) {
  for (Collective op : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter, Collective::kAlltoAll})
    for (size_t count : {size_t(1), size_t(1) << 10, size_t(1) << 26})
      EXPECT(route_of(call_of(op, count, ncclBfloat16), rules_of(Mode::kOff)) == Route::kNccl);
}

TEST(nccl_routing_serves_what_symmem_implements) {
  const ServeRules all = rules_of(Mode::kAll);
  for (ncclDataType_t type : {ncclFloat32, ncclFloat16, ncclBfloat16, ncclInt32})
    for (ncclRedOp_t op : {ncclSum, ncclMax, ncclMin}) {
      EXPECT(route_of(call_of(Collective::kAllReduce, 1000, type, op), all) == Route::kSymmem);
      EXPECT(route_of(call_of(Collective::kReduceScatter, 1000, type, op), all) == Route::kSymmem);
    }
  // Reductions symmem lacks: prod, pre-multiplied sums (dynamic ops), integer averages, other types.
  for (ncclRedOp_t op : {ncclProd, static_cast<ncclRedOp_t>(ncclNumOps + 1)})
    EXPECT(route_of(call_of(Collective::kAllReduce, 1000, ncclFloat32, op), all) == Route::kNccl);
  EXPECT(route_of(call_of(Collective::kAllReduce, 1000, ncclInt32, ncclAvg), all) == Route::kNccl);
  // Floating averages, float16 too: the kernels scale the float32 sum before rounding.
  for (ncclDataType_t type : {ncclFloat32, ncclFloat16, ncclBfloat16})
    for (Collective op : {Collective::kAllReduce, Collective::kReduceScatter})
      EXPECT(route_of(call_of(op, 1000, type, ncclAvg, 4), all) == Route::kSymmem);
  const auto avg = symmem_form(call_of(Collective::kReduceScatter, 10, ncclBfloat16, ncclAvg, 4));
  EXPECT(avg && avg->op == ReduceOp::kAvg && avg->count == 10);
  for (ncclDataType_t type : {ncclInt8, ncclUint8, ncclUint32, ncclInt64, ncclUint64, ncclFloat64, ncclFloat8e4m3})
    EXPECT(route_of(call_of(Collective::kAllReduce, 1000, type), all) == Route::kNccl);
  // Data movement serves every type (as bytes where symmem has no name for it).
  for (int t = 0; t < ncclNumTypes; ++t) {
    EXPECT(route_of(call_of(Collective::kAllGather, 1000, static_cast<ncclDataType_t>(t)), all) == Route::kSymmem);
    EXPECT(route_of(call_of(Collective::kAlltoAll, 1000, static_cast<ncclDataType_t>(t)), all) == Route::kSymmem);
  }
  EXPECT(route_of(call_of(Collective::kBroadcast, 1000, ncclFloat32), all) == Route::kNccl);
  EXPECT(route_of(call_of(Collective::kReduce, 1000, ncclFloat32), all) == Route::kNccl);
}

TEST(nccl_routing_forwards_what_the_communicator_cannot_serve) {
  const ServeRules all = rules_of(Mode::kAll);
  EXPECT(route_of(call_of(Collective::kAllReduce, 0, ncclFloat32), all) == Route::kNccl);  // empty
  EXPECT(route_of(call_of(Collective::kAllReduce, 10, ncclFloat32, ncclSum, 1), all) == Route::kNccl);
  // One rank is served only for tests (SYMMEM_TEST_NCCL_ONE_RANK), in both modes that serve.
  for (Mode mode : {Mode::kAll, Mode::kAuto}) {
    ServeRules one = rules_of(mode);
    one.min_world = 1;
    EXPECT(route_of(call_of(Collective::kAllReduce, 10, ncclFloat32, ncclSum, 1), one) == Route::kSymmem);
    EXPECT(route_of(call_of(Collective::kAllReduce, 0, ncclFloat32, ncclSum, 1), one) == Route::kNccl);
  }
  EXPECT(route_of(call_of(Collective::kAllReduce, 10, ncclFloat32, ncclSum, kMaxWorld + 1), all) == Route::kNccl);
  EXPECT(route_of(call_of(Collective::kAllReduce, 10, ncclFloat32, ncclSum, kMaxWorld), all) == Route::kSymmem);
  // Across nodes symmem serves the (hierarchical) all-gather only, and only where asked.
  for (Collective op : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAlltoAll})
    EXPECT(route_of(call_of(op, 10, ncclFloat32, ncclSum, 16, BufferKind::kStaged, true), all) == Route::kNccl);
  EXPECT(route_of(call_of(Collective::kAllGather, 10, ncclFloat32, ncclSum, 16, BufferKind::kStaged, true), all) ==
         Route::kSymmem);
  EXPECT(route_of(call_of(Collective::kAllGather, 10, ncclFloat32, ncclSum, 16, BufferKind::kStaged, true),
                  rules_of(Mode::kAuto)) == Route::kNccl);
}

TEST(nccl_symmem_form_maps_types_and_counts) {
  auto form = symmem_form(call_of(Collective::kAllReduce, 77, ncclBfloat16, ncclMax));
  EXPECT(form && form->type == DataType::kBFloat16 && form->op == ReduceOp::kMax && form->count == 77);
  form = symmem_form(call_of(Collective::kAllGather, 5, ncclInt64));
  EXPECT(form && form->type == DataType::kUInt8 && form->count == 40);
  form = symmem_form(call_of(Collective::kAlltoAll, 3, ncclFloat8e5m2));
  EXPECT(form && form->type == DataType::kUInt8 && form->count == 3);
  form = symmem_form(call_of(Collective::kAllGather, 9, ncclFloat16));
  EXPECT(form && form->type == DataType::kFloat16 && form->count == 9);
  EXPECT(!symmem_form(call_of(Collective::kReduceScatter, 9, ncclUint8)));
  EXPECT(!symmem_form(call_of(Collective::kAllReduce, 9, static_cast<ncclDataType_t>(ncclNumTypes))));
}

TEST(nccl_sizes_follow_nccl_tests) {
  // nccl-tests' "size": all_gather's output, reduce_scatter's input, all_reduce's and alltoall's buffer.
  EXPECT_EQ(nccl_size_bytes(call_of(Collective::kAllReduce, 100, ncclFloat32, ncclSum, 4)), size_t(400));
  EXPECT_EQ(nccl_size_bytes(call_of(Collective::kAllGather, 100, ncclFloat32, ncclSum, 4)), size_t(1600));
  EXPECT_EQ(nccl_size_bytes(call_of(Collective::kReduceScatter, 100, ncclFloat32, ncclSum, 4)), size_t(1600));
  EXPECT_EQ(nccl_size_bytes(call_of(Collective::kAlltoAll, 100, ncclFloat32, ncclSum, 4)), size_t(1600));
  const NcclCall ag = call_of(Collective::kAllGather, 100, ncclBfloat16, ncclSum, 4);
  EXPECT_EQ(send_bytes(ag), size_t(200));
  EXPECT_EQ(recv_bytes(ag), size_t(800));
  const NcclCall rs = call_of(Collective::kReduceScatter, 100, ncclBfloat16, ncclSum, 4);
  EXPECT_EQ(send_bytes(rs), size_t(800));
  EXPECT_EQ(recv_bytes(rs), size_t(200));
  const NcclCall a2a = call_of(Collective::kAlltoAll, 100, ncclBfloat16, ncclSum, 4);
  EXPECT_EQ(send_bytes(a2a), size_t(800));
  EXPECT_EQ(recv_bytes(a2a), size_t(800));
}

TEST(nccl_builtin_rule_stages_up_to_one_area) {
  const ServeRules autos = rules_of(Mode::kAuto);
  const size_t area = kWorkspace / 4;  // elements of 4 bytes below
  EXPECT(route_of(call_of(Collective::kAllReduce, area / 4, ncclFloat32), autos) == Route::kSymmem);
  EXPECT(route_of(call_of(Collective::kAllReduce, area / 4 + 1, ncclFloat32), autos) == Route::kNccl);
  // all_gather counts its output: 2 ranks of area / 8 elements fill the area exactly.
  EXPECT(route_of(call_of(Collective::kAllGather, area / 8, ncclFloat32), autos) == Route::kSymmem);
  EXPECT(route_of(call_of(Collective::kAllGather, area / 8 + 1, ncclFloat32), autos) == Route::kNccl);
  // Registered windows need no staging: every size.
  EXPECT(route_of(call_of(Collective::kAllReduce, size_t(1) << 28, ncclFloat32, ncclSum, 2, BufferKind::kWindow),
                  autos) == Route::kSymmem);
}

TEST(nccl_cutover_table_overrides_the_builtin_rule) {
  CutoverTable t;
  t.workspace_bytes = kWorkspace;
  t.entries.push_back({"all_reduce", 2, BufferKind::kStaged, false, 64 << 10, Route::kNccl});
  t.entries.push_back({"all_reduce", 2, BufferKind::kStaged, false, 1 << 30, Route::kSymmem});
  t.entries.push_back({"all_reduce", 2, BufferKind::kWindow, false, 1 << 20, Route::kNccl});
  t.entries.push_back({"all_gather", 4, BufferKind::kStaged, true, 1 << 30, Route::kSymmem});
  const ServeRules autos = rules_of(Mode::kAuto, &t);
  EXPECT(route_of(call_of(Collective::kAllReduce, 1024, ncclFloat32), autos) == Route::kNccl);  // 4 KiB
  EXPECT(route_of(call_of(Collective::kAllReduce, 16 << 10, ncclFloat32), autos) == Route::kNccl);  // 64 KiB
  EXPECT(route_of(call_of(Collective::kAllReduce, (16 << 10) + 1, ncclFloat32), autos) == Route::kSymmem);
  EXPECT(route_of(call_of(Collective::kAllReduce, 64 << 20, ncclFloat32), autos) == Route::kSymmem);  // > area
  EXPECT(route_of(call_of(Collective::kAllReduce, 1024, ncclFloat32, ncclSum, 2, BufferKind::kWindow), autos) ==
         Route::kNccl);
  // Past the window rows: the built-in rule.
  EXPECT(route_of(call_of(Collective::kAllReduce, 1 << 20, ncclFloat32, ncclSum, 2, BufferKind::kWindow), autos) ==
         Route::kSymmem);
  // Another world has no rows: the built-in rule.
  EXPECT(route_of(call_of(Collective::kAllReduce, 1024, ncclFloat32, ncclSum, 4), autos) == Route::kSymmem);
  EXPECT(route_of(call_of(Collective::kAllGather, 1024, ncclFloat32, ncclSum, 4, BufferKind::kStaged, true), autos) ==
         Route::kSymmem);
  // Rows hold for the workspace they were measured with only, window rows too (some algorithms run
  // in chunks of its areas on windows as well): another budget takes the built-in rule.
  const ServeRules other_budget = rules_of(Mode::kAuto, &t, kWorkspace * 2);
  EXPECT(route_of(call_of(Collective::kAllReduce, 1024, ncclFloat32), other_budget) == Route::kSymmem);
  EXPECT(route_of(call_of(Collective::kAllReduce, 1024, ncclFloat32, ncclSum, 2, BufferKind::kWindow),
                  other_budget) == Route::kSymmem);
  // SYMMEM_NCCL=all ignores the table.
  EXPECT(route_of(call_of(Collective::kAllReduce, 1024, ncclFloat32), rules_of(Mode::kAll, &t)) == Route::kSymmem);
}

TEST(nccl_routing_depends_on_agreed_inputs_only) {
  // Every rank builds the same NcclCall (no rank, address, stream or time in it): the same route
  // for the same inputs, whatever order the ranks ask in.
  CutoverTable t;
  t.workspace_bytes = kWorkspace;
  t.entries.push_back({"all_gather", 4, BufferKind::kStaged, false, 1 << 16, Route::kNccl});
  std::vector<Route> first;
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<Route> routes;
    for (size_t count = 1; count < (size_t(1) << 24); count = count * 3 + 1)
      routes.push_back(route_of(call_of(Collective::kAllGather, count, ncclBfloat16, ncclSum, 4),
                                rules_of(Mode::kAuto, &t)));
    if (pass == 0) first = routes;
    else EXPECT(routes == first);
  }
}

TEST(nccl_cutover_table_round_trips_and_hashes) {
  CutoverTable t;
  t.gpu = "NVIDIA H200";
  t.command = "scripts/nccl_tests_run.sh 2 \"x\"";
  t.date = "2026-11-28";
  t.workspace_bytes = kWorkspace;
  t.entries.push_back({"all_reduce", 2, BufferKind::kStaged, false, 8 << 20, Route::kSymmem});
  t.entries.push_back({"all_gather", 4, BufferKind::kWindow, true, 1 << 30, Route::kNccl});
  const CutoverTable back = parse_cutover_table(format_cutover_table(t));
  EXPECT_EQ(back.gpu, t.gpu);
  EXPECT_EQ(back.command, t.command);
  EXPECT_EQ(back.workspace_bytes, kWorkspace);
  EXPECT_EQ(back.entries.size(), size_t(2));
  EXPECT(back.entries[1].buffers == BufferKind::kWindow && back.entries[1].spans_nodes &&
         back.entries[1].route == Route::kNccl);
  EXPECT_EQ(cutover_table_hash(back), cutover_table_hash(t));
  CutoverTable changed = t;
  changed.entries[0].max_bytes += 1;
  EXPECT(cutover_table_hash(changed) != cutover_table_hash(t));
}

TEST(nccl_cutover_table_parse_errors_say_where) {
  EXPECT_ERROR(parse_cutover_table("{\"entries\": [{\"op\": \"all_reduce\", \"world\": 2, \"route\": \"fast\"}]}"),
               ErrorCode::kInvalidArgument, "route 'fast'");
  EXPECT_ERROR(parse_cutover_table("{\"entries\": [{\"op\": \"all_reduce\", \"world\": 2, \"buffers\": \"x\"}]}"),
               ErrorCode::kInvalidArgument, "buffers 'x'");
  EXPECT_ERROR(parse_cutover_table("{\"entries\": [{\"world\": 2}]}"), ErrorCode::kInvalidArgument, "without op");
  EXPECT_ERROR(parse_cutover_table("{\"gpu\": 1"), ErrorCode::kInvalidArgument, "NCCL cutover table");
}

TEST(nccl_shipped_cutover_tables_parse) {
  for (const char* gpu : {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}) {
    const CutoverTable& t = cutover_table_for(gpu);
    for (const auto& e : t.entries) EXPECT(e.world >= 2 && e.max_bytes > 0);
    EXPECT(t.entries.empty() || t.workspace_bytes > 0);
  }
  // SYMMEM_NCCL_CUTOVER_FILE (tests/nccl/test_nccl_tools.py points it at a table tools/nccl_cutover.py
  // made) applies to every GPU; otherwise an unknown GPU has no table.
  if (env::nccl_cutover_file().empty())
    EXPECT(cutover_table_for("No Such GPU").entries.empty());
  else
    EXPECT(!cutover_table_for("No Such GPU").entries.empty());
}

TEST(nccl_settings_differences_are_named) {
  ShimSettings a;
  a.mode = static_cast<uint8_t>(Mode::kAuto);
  ShimSettings b = a;
  EXPECT_EQ(describe_difference(a, 0, b, 1), std::string());
  b.mode = static_cast<uint8_t>(Mode::kAll);
  EXPECT(describe_difference(a, 0, b, 1).find("SYMMEM_NCCL: rank 0 has auto, rank 1 has all") != std::string::npos);
  b = a;
  b.workspace_bytes = size_t(32) << 20;
  EXPECT(describe_difference(a, 3, b, 1).find("SYMMEM_NCCL_WORKSPACE_MB") != std::string::npos);
  b = a;
  b.cutover_hash = 7;
  EXPECT(describe_difference(a, 0, b, 1).find("cutover table") != std::string::npos);
}

TEST(nccl_modes_parse) {
  Mode m = Mode::kAuto;
  EXPECT(parse_mode("off", &m) && m == Mode::kOff);
  EXPECT(parse_mode("all", &m) && m == Mode::kAll);
  EXPECT(parse_mode("auto", &m) && m == Mode::kAuto);
  EXPECT(!parse_mode("on", &m));
}
