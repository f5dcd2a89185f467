// Google Benchmark: the compute floor of each generated GEMV kernel on one core. The kernel the
// runtime would build for a 64-row call (runtime/plan.h, the keys Matmul resolves) runs over a
// matrix small enough to stay in L2 (at most 256 KiB, or one call's rows where those are more:
// up to 896 KiB of bf16 at K = 7168), one call per 64 rows, on the calling
// thread: no pool, no layer epilogue, no DRAM. Against the one-thread read bandwidth this says
// whether a format is compute-bound on one core before it is bandwidth-bound (issue #3).
// Counter weight_bytes: weight + scale bytes per second. dram_read/threads:1 (registered first)
// measures the one-thread read bandwidth of the same run (moejit-bench's probe over 1 GiB).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_layer.h"
#include "bench_util.h"
#include "formats/formats.h"
#include "jit/gemv.h"
#include "jit/kernel_cache.h"
#include "jit/tiers.h"
#include "runtime/aligned_buffer.h"
#include "runtime/plan.h"

namespace {

using moejit::formats::Format;
namespace jit = moejit::jit;

constexpr int kRows = 64;                         // rows per call, as a pass-1 item of the Qwen3 layer
constexpr int64_t kL2Bytes = int64_t(256) << 10;  // matrix budget: a quarter of Zen 4's L2

// Qwen3-30B-A3B gate_up and down, and DeepSeek-V3 gate_up: at 7168 the x of
// two or more fp32 tokens outgrows L1 (the K-chunked kernels, jit/row_body.cpp).
const int32_t kKs[] = {2048, 768, 7168};
const int32_t kTokens[] = {1, 2, 4, 16};  // capped at the tier's tokens per call
const moejit_format kFormats[] = {MOEJIT_FORMAT_BF16,       MOEJIT_FORMAT_FP8_BLOCK, MOEJIT_FORMAT_MXFP8_E4M3,
                                  MOEJIT_FORMAT_MXFP8_E5M2, MOEJIT_FORMAT_Q8_0,      MOEJIT_FORMAT_MXFP4,
                                  MOEJIT_FORMAT_NVFP4,      MOEJIT_FORMAT_Q4_0,      MOEJIT_FORMAT_Q4_K,
                                  MOEJIT_FORMAT_Q5_K,       MOEJIT_FORMAT_Q6_K,      MOEJIT_FORMAT_Q2_K,
                                  MOEJIT_FORMAT_Q3_K};
// The tiers with kernel bodies of their own (jit/tiers.h: every tier but scalar).
std::vector<jit::Isa> kernel_tiers() {
  std::vector<jit::Isa> r;
  for (int i = 0; i < jit::kTierCount; ++i)
    if (jit::tier(i).isa != jit::Isa::scalar) r.push_back(jit::tier(i).isa);
  return r;
}

// The key the runtime resolves for a kRows-row call of a [*, k] matrix; with
// `tiles`, the avx512_amx tile kernel of a format whose layers run
// avx512_bf16's kernels on that tier (jit::kernel_isa: q8_0, mxfp8, q4_0, mxfp4).
jit::KernelKey kernel_key(moejit_format f, jit::Isa isa, int32_t k, int32_t tokens, bool tiles = false) {
  moejit::plan::Target t;
  t.isa = isa;
  jit::KernelKey key = moejit::plan::matrix_plan(t, {Format(f)}, kRows, k, 0).key(kRows, tokens);
  if (tiles) {
    key.isa = jit::Isa::avx512_amx;
    key.flags = jit::runtime_flags(key.isa, key.format, key.group);  // not avx512_bf16's
  }
  return key;
}

void bm_kernel(benchmark::State& state, moejit_format f, jit::Isa isa, int32_t k, int32_t tokens,
               bool tiles) {
  const jit::KernelKey key = kernel_key(f, isa, k, tokens, tiles);
  std::string err;
  const auto kernel = jit::global_cache().get(key, &err);
  if (!kernel) {  // among others, a tier this CPU lacks
    state.SkipWithError(("skipped: " + err).c_str());
    return;
  }
  const moejit_bench::Geometry g;  // bf16 fp8_block scales, mxfp8 groups of 32
  const int64_t call_bytes = moejit_bench::matrix_bytes(f, g, kRows, k).total();
  const int32_t calls = int32_t(std::max<int64_t>(1, kL2Bytes / call_bytes));
  const moejit_bench::MatrixBank bank(f, g, int64_t(calls) * kRows, k, 1, 1, 0x4B3 + uint64_t(k));
  const moejit_matrix& m = bank[0];
  const int64_t row_bytes = moejit::formats::row_bytes(Format(f), k);
  const int64_t scale_row_bytes =
      m.scales ? moejit::formats::scale_cols(Format(f), moejit::formats::default_group(Format(f), 0), k) *
                     moejit::formats::scale_elem_bytes(Format(f), moejit::formats::ScaleDtype::bf16)
               : 0;
  // Activations of 1.0 in any layout (bf16 0x3F80 or fp32 0x3F800000: both halves 1.0 or 0).
  const jit::XPrep prep = jit::x_prep(key.isa, key.format, key.flags);
  const size_t elem_bytes = prep.elem_bytes();
  const size_t xbytes = size_t(prep.buffer_bytes(k, tokens));
  // 64-byte aligned, as the layers' buffers (runtime/aligned_buffer.h).
  moejit::AlignedBuffer<uint16_t> x;
  x.assign(xbytes / 2, 0x3F80);
  if (elem_bytes == 4)
    for (size_t i = 0; i < x.size(); i += 2) x.data()[i] = 0;
  moejit::AlignedBuffer<float> y;
  y.assign(size_t(kRows) * size_t(tokens), 0.0f);
  std::vector<jit::GemvArgs> args(static_cast<size_t>(calls));
  for (int32_t c = 0; c < calls; ++c) {
    jit::GemvArgs& a = args[size_t(c)];
    const int64_t r0 = int64_t(c) * kRows;
    a.w = static_cast<const uint8_t*>(m.data) + r0 * row_bytes;
    a.scales = m.scales ? static_cast<const uint8_t*>(m.scales) +
                              moejit::formats::scale_row_of(Format(f), r0) * scale_row_bytes
                        : nullptr;
    a.row_scales = m.row_scales ? m.row_scales + r0 : nullptr;
    if (moejit::formats::is_kquant(Format(f))) a.scales = a.w;  // the super-blocks hold the scales
    a.x = x.data();
    a.y = y.data();
    a.w_prefetch = a.w;  // prefetches the lines this call reads: no traffic beyond the matrix
  }
  const jit::GemvFn fn = kernel->fn();
  for (const jit::GemvArgs& a : args) fn(&a);  // warm L2
  for (auto _ : state)
    for (const jit::GemvArgs& a : args) fn(&a);
  benchmark::DoNotOptimize(y.data());
  state.counters["weight_bytes"] = benchmark::Counter(double(call_bytes) * calls * double(state.iterations()),
                                                      benchmark::Counter::kIsRate);
  state.counters["read_GBps"] = moejit_gbench::kNotApplicable;
  state.SetLabel(key.name() + ", " + std::to_string(calls) + " x " + std::to_string(call_bytes >> 10) +
                 " KiB");
}

// One-thread streaming read of 1 GiB (on 2 MiB pages), one pass per iteration.
void bm_dram_read(benchmark::State& state) {
  static const moejit_bench::Buffer buffer = [] {
    moejit_bench::Buffer b(size_t(1) << 30);
    std::memset(b.data(), 1, b.size());  // touched: reads come from DRAM, not the zero page
    return b;
  }();
  double sum = 0;
  for (auto _ : state) sum += moejit_bench::measure_read_bandwidth(buffer, 1, 1);
  state.counters["read_GBps"] = sum / double(state.iterations());
  state.counters["weight_bytes"] = moejit_gbench::kNotApplicable;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RegisterBenchmark("dram_read/threads:1", bm_dram_read)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  for (moejit_format f : kFormats)
    for (jit::Isa isa : kernel_tiers())
      for (int32_t k : kKs) {
        // avx512_amx runs avx512_bf16's kernels for most formats: measured there. Those
        // with tile kernels all the same have them measured as `tiles`.
        bool tiles = false;
        if (kernel_key(f, isa, k, 1).isa != isa) {
          tiles =
              isa == jit::Isa::avx512_amx && jit::has_tile_kernels(Format(f), kernel_key(f, isa, k, 1).group);
          if (!tiles) continue;
        }
        // Tokens beyond the tier's register budget are tiled by the runtime: measure its largest.
        const int32_t most = jit::max_tokens_per_call(kernel_key(f, isa, k, 1, tiles));
        int32_t last = 0;
        for (int32_t want : kTokens) {
          const int32_t t = std::min(want, most);
          if (t == last) continue;
          last = t;
          const std::string name = std::string("kernel_l2/") + moejit_format_name(f) + "/" +
                                   (tiles ? "tiles" : jit::isa_name(isa)) + "/K:" + std::to_string(k) +
                                   "/tokens:" + std::to_string(t);
          benchmark::RegisterBenchmark(name.c_str(), bm_kernel, f, isa, k, t, tiles)
              ->Unit(benchmark::kMicrosecond);
        }
      }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
