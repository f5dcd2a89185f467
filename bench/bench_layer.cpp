// Google Benchmark: the full MoE layer (Qwen3-30B-A3B geometry: H=2048, I=768, E=128, top_k=8)
// through moejit_moe_forward, per format x tokens x dedup, on the host's best tier and every CPU.
// Experts are cold: calls cycle through a pool of uniform routings over a 0.6-1.2 GB layer.
// Counter weight_bytes: weight + scale bytes of each call's distinct experts per second (wall
// time); experts: distinct experts per call.
#include "bench_layer.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "moejit.h"

namespace {

using moejit_bench::Layer;

moejit_bench::Geometry qwen3_30b() {
  moejit_bench::Geometry g;
  g.hidden = 2048, g.intermediate = 768, g.experts = 128, g.top_k = 8;
  return g;
}

const Layer& layer(moejit_format f) {  // one per format, built on first use
  static std::map<int, std::unique_ptr<Layer>> layers;
  auto& slot = layers[int(f)];
  if (!slot) slot = std::make_unique<Layer>(f, qwen3_30b(), 1);
  return *slot;
}

struct MoeDeleter {
  void operator()(moejit_moe* m) const { moejit_moe_destroy(m); }
};

void bm_layer(benchmark::State& state, moejit_format f, int32_t tokens, bool dedup) {
  const moejit_gbench::ContextPtr ctx =
      moejit_gbench::make_context(state, moejit_host_isa(), dedup ? 0u : MOEJIT_CONTEXT_NO_DEDUP);
  if (!ctx) return;
  const Layer& l = layer(f);
  const moejit_moe_desc d = l.desc(tokens);
  moejit_moe* raw = nullptr;
  if (moejit_moe_create(ctx.get(), &d, &raw) != MOEJIT_OK) {
    state.SkipWithError(moejit_last_error());
    return;
  }
  const std::unique_ptr<moejit_moe, MoeDeleter> moe(raw);
  const moejit_bench::Geometry g = qwen3_30b();
  const moejit_bench::Routing routing =
      moejit_bench::make_routing(tokens, g.top_k, g.experts, 1000003 + uint64_t(tokens));
  const std::vector<uint16_t> x = moejit_bench::random_activations(int64_t(tokens) * g.hidden, 0x5EED);
  std::vector<uint16_t> y(size_t(tokens) * size_t(g.hidden));
  const double expert = double(moejit_bench::expert_bytes(f, g));
  int64_t call = 0;
  double bytes = 0, experts = 0;
  auto forward = [&] {
    const bool ok = moejit_moe_forward(moe.get(), tokens, x.data(), routing.ids_of(call),
                                       routing.weights_of(call), y.data()) == MOEJIT_OK;
    bytes += routing.distinct_of(call) * expert;
    experts += routing.distinct_of(call);
    ++call;
    return ok;
  };
  for (int i = 0; i < moejit_gbench::kWarmupCalls; ++i) forward();
  bytes = experts = 0;
  for (auto _ : state) {
    if (!forward()) {
      state.SkipWithError(moejit_last_error());
      break;
    }
  }
  state.counters["weight_bytes"] = benchmark::Counter(bytes, benchmark::Counter::kIsRate);
  state.counters["experts"] = benchmark::Counter(experts / double(std::max<int64_t>(1, state.iterations())));
  state.SetLabel(std::string(moejit_isa_name(moejit_context_isa(ctx.get()))) + ", " +
                 std::to_string(moejit_context_num_threads(ctx.get())) + " threads");
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  for (moejit_format f : {MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_FP8_BLOCK})
    for (int32_t t : {1, 4, 16})
      for (bool dedup : {true, false}) {
        const std::string name = std::string("moe/qwen3-30b-a3b/") + moejit_format_name(f) +
                                 "/tokens:" + std::to_string(t) + "/dedup:" + (dedup ? "on" : "off");
        benchmark::RegisterBenchmark(name.c_str(), bm_layer, f, t, dedup)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
