// Google Benchmark: one GEMV kernel at a time through the public dense linear layer
// (moejit_linear_create / moejit_linear_forward), y[T, N] = x[T, K] W^T, per format x tier x K x
// tokens. Weights are cold: each iteration multiplies the next matrix of a pool 4x the L3.
// Counter weight_bytes: weight + scale bytes streamed per second (wall time: the work runs on the
// context's workers).
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bench_common.h"
#include "bench_layer.h"
#include "moejit.h"

namespace {

using moejit_bench::MatrixBank;

struct Shape {
  int32_t k, n;
  const char* what;
};
// The projections these K come from: Qwen3-30B-A3B gate_up and down, DeepSeek-V3 gate_up.
const Shape kShapes[] = {{2048, 1536, "qwen3-30b-a3b gate_up"},
                         {768, 2048, "qwen3-30b-a3b down"},
                         {7168, 4096, "deepseek-v3 gate_up"}};
const int32_t kTokens[] = {1, 4, 16};
const moejit_format kFormats[] = {MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_FP8_BLOCK};

// One cold pool per (format, shape), built on first use and kept for the process.
const MatrixBank& pool(moejit_format f, const Shape& s) {
  static std::map<std::tuple<int, int, int>, std::unique_ptr<MatrixBank>> pools;
  auto& slot = pools[{int(f), s.k, s.n}];
  if (!slot) {
    const moejit_bench::Geometry g;  // bf16 scales, no bias
    const int64_t bytes = moejit_bench::matrix_bytes(f, g, s.n, s.k).total();
    const int32_t count = moejit_gbench::cold_pool_count(bytes);
    slot = std::make_unique<MatrixBank>(f, g, s.n, s.k, count, count, 0x6E3 + uint64_t(s.k));
  }
  return *slot;
}

struct LinearDeleter {
  void operator()(moejit_linear* l) const { moejit_linear_destroy(l); }
};

void bm_gemv(benchmark::State& state, moejit_format f, moejit_isa isa, Shape s, int32_t tokens) {
  const moejit_gbench::ContextPtr ctx = moejit_gbench::make_context(state, isa);
  if (!ctx) return;
  const MatrixBank& bank = pool(f, s);
  std::vector<std::unique_ptr<moejit_linear, LinearDeleter>> linears;
  for (int32_t i = 0; i < bank.size(); ++i) {
    moejit_linear_desc d{};
    d.struct_size = sizeof(d);
    d.format = f;
    d.scale_dtype = MOEJIT_DTYPE_BF16;
    d.rows = s.n;
    d.cols = s.k;
    d.max_tokens = tokens;
    d.weight = bank[i];
    d.output_dtype = MOEJIT_DTYPE_BF16;
    moejit_linear* raw = nullptr;
    if (moejit_linear_create(ctx.get(), &d, &raw) != MOEJIT_OK) {
      state.SkipWithError(moejit_last_error());
      return;
    }
    linears.emplace_back(raw);
  }
  const std::vector<uint16_t> x = moejit_bench::random_activations(int64_t(tokens) * s.k, 0x5EED);
  std::vector<uint16_t> y(size_t(tokens) * size_t(s.n));
  int64_t next = 0;
  auto call = [&] {
    const moejit_linear* l = linears[size_t(next++ % int64_t(linears.size()))].get();
    return moejit_linear_forward(const_cast<moejit_linear*>(l), tokens, x.data(), y.data()) == MOEJIT_OK;
  };
  for (int i = 0; i < moejit_gbench::kWarmupCalls; ++i) call();
  for (auto _ : state) {
    if (!call()) {
      state.SkipWithError(moejit_last_error());
      break;
    }
  }
  state.counters["weight_bytes"] = benchmark::Counter(
      double(bank.matrix_bytes()) * double(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel(std::string(s.what) + ", pool " + std::to_string(bank.size()) + " x " +
                 std::to_string(bank.matrix_bytes() >> 10) + " KiB");
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  for (moejit_format f : kFormats)
    for (moejit_isa isa : moejit_gbench::all_tiers())
      for (const Shape& s : kShapes)
        for (int32_t t : kTokens) {
          const std::string name = std::string("gemv/") + moejit_format_name(f) + "/" + moejit_isa_name(isa) +
                                   "/K:" + std::to_string(s.k) + "/N:" + std::to_string(s.n) +
                                   "/tokens:" + std::to_string(t);
          benchmark::RegisterBenchmark(name.c_str(), bm_gemv, f, isa, s, t)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
