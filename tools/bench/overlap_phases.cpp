#include "overlap_phases.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

namespace symmem::bench {
namespace {

// The events of one iteration, on the GEMM's stream (begin, gemm_*, end) and on the stream that
// runs the all-gather (gather_*).
struct IterationEvents {
  cudaEvent_t begin, gemm_begin, gemm_end, gather_begin, gather_end, end;
};

struct Sample {
  double iteration, gemm, gather, hidden;  // us, us, us, fraction (NaN without an all-gather)
};

double since(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  BENCH_CUDA_CHECK(cudaEventElapsedTime(&ms, from, to));
  return double(ms) * 1000.0;
}

// Lays out one iteration of `row` and records its events.
void enqueue_iteration(const PhaseRow& row, const std::function<void(cudaStream_t)>& gemm, const IterationEvents& e,
                       cudaStream_t main, cudaStream_t side, cudaEvent_t fork, cudaEvent_t join) {
  BENCH_CUDA_CHECK(cudaEventRecord(e.begin, main));
  if (row.layout == Layout::kOverlapped) {
    BENCH_CUDA_CHECK(cudaEventRecord(fork, main));
    BENCH_CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
    BENCH_CUDA_CHECK(cudaEventRecord(e.gather_begin, side));
    row.gather(side);
    BENCH_CUDA_CHECK(cudaEventRecord(e.gather_end, side));
  }
  BENCH_CUDA_CHECK(cudaEventRecord(e.gemm_begin, main));
  gemm(main);
  BENCH_CUDA_CHECK(cudaEventRecord(e.gemm_end, main));
  if (row.layout == Layout::kSequential) {
    BENCH_CUDA_CHECK(cudaEventRecord(e.gather_begin, main));
    row.gather(main);
    BENCH_CUDA_CHECK(cudaEventRecord(e.gather_end, main));
  }
  if (row.layout == Layout::kOverlapped) {
    BENCH_CUDA_CHECK(cudaEventRecord(join, side));
    BENCH_CUDA_CHECK(cudaStreamWaitEvent(main, join, 0));
  }
  BENCH_CUDA_CHECK(cudaEventRecord(e.end, main));
}

Sample read_iteration(const PhaseRow& row, const IterationEvents& e) {
  Sample s;
  s.iteration = since(e.begin, e.end);
  const double gb = since(e.begin, e.gemm_begin), ge = since(e.begin, e.gemm_end);
  s.gemm = ge - gb;
  if (row.layout == Layout::kGemmOnly) {
    s.gather = s.hidden = std::numeric_limits<double>::quiet_NaN();
    return s;
  }
  const double ab = since(e.begin, e.gather_begin), ae = since(e.begin, e.gather_end);
  s.gather = ae - ab;
  // The part of the all-gather's interval that lies inside the GEMM's.
  const double overlap = std::max(0.0, std::min(ge, ae) - std::max(gb, ab));
  s.hidden = s.gather > 0 ? std::min(1.0, overlap / s.gather) : 0.0;
  return s;
}

}  // namespace

std::vector<PhaseFigures> measure_phases(BenchContext& ctx, const std::function<void(cudaStream_t)>& gemm,
                                         const std::vector<PhaseRow>& rows, int iters, int reps) {
  cudaStream_t main = ctx.stream();
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  BENCH_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  BENCH_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  BENCH_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  std::vector<IterationEvents> events(iters);
  for (auto& e : events)
    for (cudaEvent_t* p : {&e.begin, &e.gemm_begin, &e.gemm_end, &e.gather_begin, &e.gather_end, &e.end})
      BENCH_CUDA_CHECK(cudaEventCreate(p));

  // per_rep[row][rep]: the repetition's medians (iteration, gemm, gather, hidden).
  std::vector<std::vector<Sample>> per_rep(rows.size(), std::vector<Sample>(reps));
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t i = 0; i < rows.size(); ++i) {
      ctx.host_barrier();
      ctx.device_barrier(main);
      for (int it = 0; it < iters; ++it) enqueue_iteration(rows[i], gemm, events[it], main, side, fork, join);
      BENCH_CUDA_CHECK(cudaStreamSynchronize(main));
      std::vector<double> iteration, g, a, h;
      for (int it = 0; it < iters; ++it) {
        const Sample s = read_iteration(rows[i], events[it]);
        iteration.push_back(s.iteration);
        g.push_back(s.gemm);
        a.push_back(s.gather);
        h.push_back(s.hidden);
      }
      per_rep[i][rep] = {spread_of(iteration).median, spread_of(g).median, spread_of(a).median, spread_of(h).median};
    }
  }
  ctx.comm().check();
  for (auto& e : events)
    for (cudaEvent_t p : {e.begin, e.gemm_begin, e.gemm_end, e.gather_begin, e.gather_end, e.end}) cudaEventDestroy(p);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(side);

  // Every rank's repetition medians; the slowest rank's times, the lowest rank's hidden fraction.
  const int world = ctx.world();
  const size_t mine = rows.size() * size_t(reps) * 4;
  std::vector<double> flat;
  for (const auto& row : per_rep)
    for (const Sample& s : row) flat.insert(flat.end(), {s.iteration, s.gemm, s.gather, s.hidden});
  std::vector<double> all(mine * world);
  ctx.comm().bootstrap().all_gather(flat.data(), all.data(), mine * sizeof(double));
  std::vector<PhaseFigures> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<double> metric[4];
    for (int rep = 0; rep < reps; ++rep) {
      double v[4] = {0, 0, 0, 2};
      for (int r = 0; r < world; ++r)
        for (int m = 0; m < 4; ++m) {
          const double x = all[size_t(r) * mine + (i * reps + rep) * 4 + m];
          v[m] = std::isnan(x) ? x : m == 3 ? std::min(v[m], x) : std::max(v[m], x);
        }
      for (int m = 0; m < 4; ++m) metric[m].push_back(v[m]);
    }
    PhaseFigures f;
    f.impl = rows[i].impl;
    f.iteration = spread_of(metric[0]);
    f.gemm = spread_of(metric[1]);
    f.gather = spread_of(metric[2]);
    f.hidden = spread_of(metric[3]);
    out.push_back(f);
  }
  return out;
}

void write_phases_csv(const std::vector<PhaseFigures>& figures, const Meta& meta, const std::string& path) {
  std::ofstream csv(path);
  if (!csv) throw std::runtime_error("cannot write " + path);
  csv << "op,impl,world,iteration_us,iteration_min_us,iteration_max_us,gemm_us,gemm_min_us,gemm_max_us,"
         "allgather_us,allgather_min_us,allgather_max_us,hidden_fraction,hidden_min,hidden_max,gpu,commit,date,"
         "command\n";
  for (const auto& f : figures) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "overlap_phases,%s,%d,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.4f,%.4f,%.4f,",
                  f.impl.c_str(), meta.world, f.iteration.median, f.iteration.min, f.iteration.max, f.gemm.median,
                  f.gemm.min, f.gemm.max, f.gather.median, f.gather.min, f.gather.max, f.hidden.median, f.hidden.min,
                  f.hidden.max);
    csv << buf << csv_field(meta.gpu) << "," << csv_field(meta.commit) << "," << csv_field(meta.date) << ","
        << csv_field(meta.command) << "\n";
  }
}

}  // namespace symmem::bench
