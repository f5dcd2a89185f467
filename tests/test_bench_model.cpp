// The backend model of moejit-bench --profile (tools/bench_model.cpp): each term of the layer time
// (the GPU's fixed time per compute part and its resident compute, the fetch and its pipelining by
// chunks, the fetched experts' GPU compute, the CPU's compute and per-layer overhead in line with
// the GPU, the DRAM the CPU and the copy engine share) against hand-computed cases, each case one
// that fails if its term is dropped; the hybrid split against a brute-force minimum, and the
// profile a real moejit-bench run writes against the model.
// tests/python/test_hybrid_example.py holds examples/hybrid_moe.py's copy to the same cases.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "bench_model.h"

namespace {

using moejit_bench::BackendModel;
using moejit_bench::model_backends;
using moejit_bench::ModelInputs;

constexpr double kInf = INFINITY;

ModelInputs inputs(double cpu, double pcie, double dram, double gpu = kInf, double gpu_fetch = kInf,
                   double overhead = 0, double call = 0, double chunk_bytes = 0) {
  ModelInputs in;
  in.cpu_gbps = cpu;
  in.pcie_gbs = pcie;
  in.dram_gbps = dram;
  in.gpu_gbps = gpu;
  in.gpu_fetch_gbps = gpu_fetch;
  in.cpu_overhead_s = overhead;
  in.gpu_call_s = call;
  in.fetch_chunk_bytes = chunk_bytes;
  return in;
}

// G(g) and t(f) of the split with both sides at work, as bench_model.h defines them, evaluated
// directly from the model's terms.
double gpu_side(const BackendModel& m, const ModelInputs& in, double g, double fetch, double chunk_fetch) {
  if (g <= 0) return m.gpu_resident_s;
  const double a = m.gpu_resident_s, b = m.gpu_fetched_s, b1 = m.chunk_gpu_fetched_s;
  return in.gpu_call_s +
         std::max({a + g * b, std::min(g * fetch, chunk_fetch) + g * b, g * fetch + std::min(g * b, b1)});
}

double split_time(const BackendModel& m, const ModelInputs& in, double f) {
  const double k = m.shared_rate;
  return in.cpu_overhead_s +
         std::max(f * m.cpu_compute_s / k, gpu_side(m, in, 1 - f, m.fetch_s / k, m.chunk_fetch_s / k));
}

TEST(BackendModel, WithoutGpuTermsItIsTheCpuAgainstPcieModel) {
  // DRAM to spare (125 of 200 GB/s): 1 GB on the CPU in 10 ms, over PCIe in 40 ms; the split at
  // f = 0.8 takes 8 ms.
  const BackendModel m = model_backends(1e9, 0, inputs(100, 25, 200));
  EXPECT_DOUBLE_EQ(m.cpu_s, 0.01);
  EXPECT_DOUBLE_EQ(m.pcie_s, 0.04);
  EXPECT_DOUBLE_EQ(m.shared_rate, 1.0);
  EXPECT_DOUBLE_EQ(m.cpu_fraction, 0.8);
  EXPECT_DOUBLE_EQ(m.hybrid_s, 0.008);
  EXPECT_EQ(m.best, "hybrid");
  // Equal ways: the split halves the time.
  const BackendModel h = model_backends(1e9, 0, inputs(25, 25, 200));
  EXPECT_EQ(h.best, "hybrid");
  EXPECT_DOUBLE_EQ(h.cpu_fraction, 0.5);
  EXPECT_DOUBLE_EQ(h.best_s, 0.02);
  EXPECT_EQ(model_backends(1e9, 0, inputs(10, 25, 25)).best, "pcie");
}

TEST(BackendModel, TheCpuAndTheCopyEngineShareDram) {
  // 100 + 25 GB/s asked of 100: each side runs at 0.8 of its rate alone, and the split's 8 ms
  // become 10 ms, the CPU way's time (the DRAM floor, which the shares keep).
  const BackendModel m = model_backends(1e9, 0, inputs(100, 25, 100));
  EXPECT_DOUBLE_EQ(m.dram_capacity_gbps, 100);
  EXPECT_DOUBLE_EQ(m.shared_rate, 0.8);
  EXPECT_DOUBLE_EQ(m.cpu_fraction, 0.8);
  EXPECT_DOUBLE_EQ(m.hybrid_ideal_s, 0.01);
  EXPECT_DOUBLE_EQ(m.dram_floor_s, 0.01);
  EXPECT_EQ(m.best, "cpu");
  // The capacity is at least what each side pulled alone: a probe below the CPU's rate does not
  // count.
  const BackendModel low = model_backends(1e9, 0, inputs(100, 25, 60));
  EXPECT_DOUBLE_EQ(low.dram_capacity_gbps, 100);
  EXPECT_DOUBLE_EQ(low.shared_rate, 0.8);
  // The split must beat the better single way by more than 10%.
  const BackendModel close = model_backends(1e9, 0, inputs(25, 25, 27));
  EXPECT_DOUBLE_EQ(close.shared_rate, 27 / 50.0);
  EXPECT_NE(close.best, "hybrid");
  EXPECT_DOUBLE_EQ(close.hybrid_s, 1 / 27.0);
  // The single ways read alone: no share.
  EXPECT_DOUBLE_EQ(close.cpu_s, 0.04);
  EXPECT_DOUBLE_EQ(close.pcie_s, 0.04);
}

TEST(BackendModel, TheCpuOverheadIsInLineWithTheGpusCompute) {
  // 10 GB resident at 1000 GB/s: 10 ms; 0.1 GB missing: 1 ms on the CPU, 4 ms over PCIe.
  const ModelInputs in = inputs(100, 25, 200, 1000, 500, 5e-4);
  const BackendModel m = model_backends(1e8, 1e10, in);
  EXPECT_DOUBLE_EQ(m.gpu_resident_s, 0.01);
  EXPECT_DOUBLE_EQ(m.cpu_compute_s, 0.001);
  // The x and y copies, submit and wait come before and after the GPU's compute: the CPU's compute
  // hides behind the resident experts, the overhead does not.
  EXPECT_DOUBLE_EQ(m.cpu_s, 0.0105);
  EXPECT_DOUBLE_EQ(m.pcie_s, 0.01 + 2e-4);  // the fetched experts' compute after the resident ones
  EXPECT_DOUBLE_EQ(m.cpu_fraction, 1.0);    // the GPU has no time to spare for fetched experts
  EXPECT_DOUBLE_EQ(m.hybrid_s, m.cpu_s);    // at f = 1 the split is the CPU way
  EXPECT_EQ(m.best, "pcie");
  EXPECT_DOUBLE_EQ(m.best_s, 0.0102);
  // Nothing missing: the layer is the resident compute.
  const BackendModel none = model_backends(0, 1e10, in);
  EXPECT_EQ(none.best, "none");
  EXPECT_DOUBLE_EQ(none.best_s, 0.01);
  EXPECT_DOUBLE_EQ(none.cpu_s, 0.01);
  EXPECT_DOUBLE_EQ(none.cpu_fraction, 0);
}

TEST(BackendModel, TheCpuOverheadCanMakeFetchingWin) {
  // 0.1 GB missing: 1 ms on the CPU, 4 ms over PCIe + 0.2 ms of GPU compute after it; DRAM
  // shared at 0.8.
  const BackendModel cheap = model_backends(1e8, 0, inputs(100, 25, 100, kInf, 500, 0));
  EXPECT_DOUBLE_EQ(cheap.cpu_s, 0.001);
  EXPECT_EQ(cheap.best, "cpu");
  const BackendModel dear = model_backends(1e8, 0, inputs(100, 25, 100, kInf, 500, 0.004));
  EXPECT_DOUBLE_EQ(dear.cpu_s, 0.005);
  EXPECT_DOUBLE_EQ(dear.pcie_s, 0.0042);
  EXPECT_EQ(dear.best, "pcie");
  // The split pays the overhead on both sides: its balance is the overhead-free one, f 1.25 ms =
  // (1 - f)(5 ms + 0.2 ms), and it is the overhead slower.
  EXPECT_DOUBLE_EQ(dear.cpu_fraction, 0.0052 / 0.00645);
  EXPECT_NEAR(dear.hybrid_s, 0.004 + dear.cpu_fraction * 0.00125, 1e-15);
}

TEST(BackendModel, EveryGpuComputePartPaysTheFixedTime) {
  // 1 GB resident at 1000 GB/s plus 0.3 ms per compute part; 0.1 GB missing.
  const ModelInputs in = inputs(100, 25, 200, 1000, 500, 0, 3e-4);
  const BackendModel m = model_backends(1e8, 1e9, in);
  EXPECT_DOUBLE_EQ(m.gpu_resident_s, 3e-4 + 1e-3);
  EXPECT_DOUBLE_EQ(m.cpu_s, 1.3e-3);
  // The fetched experts are a second compute part: 0.3 ms again, then the 4 ms fetch and their
  // 0.2 ms of compute.
  EXPECT_DOUBLE_EQ(m.pcie_s, 3e-4 + 4e-3 + 2e-4);
  // A GPU whose time does not grow with the experts (gpu_gbps inf, as at one token): the fixed time.
  const BackendModel flat = model_backends(1e8, 1e9, inputs(100, 25, 200, kInf, 500, 0, 3e-4));
  EXPECT_DOUBLE_EQ(flat.gpu_resident_s, 3e-4);
  // Without resident experts there is no resident part to pay for.
  EXPECT_DOUBLE_EQ(model_backends(1e8, 0, in).gpu_resident_s, 0);
  EXPECT_DOUBLE_EQ(model_backends(1e8, 0, in).pcie_s, 3e-4 + 4e-3 + 2e-4);
  // The split pays it when it fetches anything: at 1 GB missing, f 10 ms = 0.3 ms + (1 - f)(40 ms +
  // 2 ms).
  const BackendModel big = model_backends(1e9, 1e9, in);
  EXPECT_DOUBLE_EQ(big.cpu_fraction, (3e-4 + 0.042) / (0.01 + 0.042));
  EXPECT_NEAR(big.hybrid_s, big.cpu_fraction * 0.01, 1e-15);
}

TEST(BackendModel, FetchedExpertsCostGpuComputeAfterTheFetch) {
  const BackendModel m = model_backends(1e9, 0, inputs(10, 25, 200, kInf, 50, 0));
  EXPECT_DOUBLE_EQ(m.fetch_s, 0.04);
  EXPECT_DOUBLE_EQ(m.gpu_fetched_s, 0.02);
  EXPECT_DOUBLE_EQ(m.pcie_s, 0.06);
  // f 0.1 cpu = (1 - f)(fetch + fetched): f = 0.06 / 0.16.
  EXPECT_DOUBLE_EQ(m.cpu_fraction, 0.375);
  EXPECT_DOUBLE_EQ(m.hybrid_ideal_s, 0.0375);
}

TEST(BackendModel, ChunksPipelineTheFetchWithTheCompute) {
  // 1 GB in chunks of 0.1 GB: 40 ms of copies, 4 ms a chunk; 20 ms of fetched compute, 2 ms a chunk.
  const ModelInputs in = inputs(10, 25, 200, 1000, 50, 0, 0, 1e8);
  const BackendModel m = model_backends(1e9, 0, in);
  EXPECT_DOUBLE_EQ(m.chunk_fetch_s, 0.004);
  EXPECT_DOUBLE_EQ(m.chunk_gpu_fetched_s, 0.002);
  EXPECT_DOUBLE_EQ(m.pcie_s, 0.042);  // all the copies, then the last chunk's compute (one copy: 60 ms)
  // The resident compute (50 ms) before the fetched: the GPU's compute is the layer.
  EXPECT_DOUBLE_EQ(model_backends(1e9, 5e10, in).pcie_s, 0.05 + 0.02);
  // A GPU slower than the copies: the first chunk, then all the compute.
  const BackendModel slow = model_backends(1e9, 0, inputs(10, 25, 200, 1000, 10, 0, 0, 1e8));
  EXPECT_DOUBLE_EQ(slow.pcie_s, 0.004 + 0.1);
  // Less than a chunk: one copy, then its compute.
  EXPECT_DOUBLE_EQ(model_backends(5e7, 0, in).pcie_s, 0.002 + 0.001);
  // The split's fetched share is pipelined too: f 0.1 = (1 - f) 0.04 + 0.002.
  EXPECT_DOUBLE_EQ(m.cpu_fraction, 0.042 / 0.14);
  EXPECT_NEAR(m.hybrid_ideal_s, 0.1 * m.cpu_fraction, 1e-15);
}

TEST(BackendModel, TheSplitIsTheMinimumOverF) {
  int cases = 0, inside = 0;
  for (double resident : {0.0, 2e8, 1e9, 5e9})
    for (double overhead : {0.0, 2e-4, 3e-3})
      for (double cpu : {20.0, 100.0, 400.0})
        for (double gpu_fetch : {100.0, 400.0, kInf})
          for (double call : {0.0, 5e-4})
            for (double chunk : {0.0, 4e7})
              for (double dram : {1e6, 90.0}) {
                const ModelInputs in = inputs(cpu, 50, dram, 1500, gpu_fetch, overhead, call, chunk);
                const BackendModel m = model_backends(5e8, resident, in);
                double best = INFINITY;
                for (int i = 1; i < 20000; ++i) best = std::min(best, split_time(m, in, i / 20000.0));
                SCOPED_TRACE(testing::Message() << "resident " << resident << " overhead " << overhead
                                                << " cpu " << cpu << " gpu_fetch " << gpu_fetch << " call "
                                                << call << " chunk " << chunk << " dram " << dram);
                // The way (b) is the split at f = 1, (a) the GPU side at f = 0, both without a share.
                EXPECT_DOUBLE_EQ(m.cpu_s, overhead + std::max(m.gpu_resident_s, m.cpu_compute_s));
                EXPECT_DOUBLE_EQ(m.pcie_s, gpu_side(m, in, 1.0, m.fetch_s, m.chunk_fetch_s));
                EXPECT_LE(m.hybrid_ideal_s, best * (1 + 1e-12));
                if (m.cpu_fraction > 0 && m.cpu_fraction < 1) {
                  ++inside;
                  EXPECT_NEAR(m.hybrid_ideal_s, split_time(m, in, m.cpu_fraction), 1e-15);
                  EXPECT_GE(m.hybrid_ideal_s,
                            best - 1e-4 * (m.cpu_compute_s + m.fetch_s + m.gpu_fetched_s) / m.shared_rate);
                } else {
                  EXPECT_DOUBLE_EQ(m.hybrid_ideal_s, m.cpu_fraction >= 1 ? m.cpu_s : m.pcie_s);
                }
                ++cases;
              }
  EXPECT_EQ(cases, 864);
  EXPECT_GT(inside, cases / 2);
}

TEST(BackendModel, NoCpuMeansFetchEverything) {
  const BackendModel m = model_backends(1e9, 0, inputs(0, 25, 30));
  EXPECT_EQ(m.cpu_s, kInf);
  EXPECT_EQ(m.best, "pcie");
  EXPECT_EQ(m.cpu_fraction, 0);
  EXPECT_DOUBLE_EQ(m.hybrid_ideal_s, m.pcie_s);
}

#ifdef MOEJIT_BENCH_EXE

struct ToolRun {
  int code = -1;
  std::string err;
};

ToolRun run_bench(const std::string& args) {
  char dir_template[] = "/tmp/moejit_bench_model_XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string err = dir + "/err";
  const int st = std::system(
      ("env -u MOEJIT_MAX_ISA " + std::string(MOEJIT_BENCH_EXE) + " " + args + " >/dev/null 2>" + err)
          .c_str());
  ToolRun r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  std::ifstream f(err);
  std::stringstream s;
  s << f.rdbuf();
  r.err = s.str();
  std::remove(err.c_str());
  rmdir(dir.c_str());
  return r;
}

TEST(ProfileRun, EveryEntryIsTheModelOfItsMeasurement) {
  char path_template[] = "/tmp/moejit_profile_XXXXXX";
  const int fd = mkstemp(path_template);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string path = path_template;
  const ToolRun r = run_bench(
      "--hidden 256 --intermediate 128 --experts 32 --top-k 4 --format fp8_block,bf16 --tokens 1,4 --threads "
      "1 "
      "--min-time 0.02 --repeat 2 --warmup 1 --profile " +
      path +
      " --pcie-gbs 25 --miss-rate 0.3 --gpu-gbs 2 --gpu-fetch-gbs 0.5 --cpu-overhead-us 30 --gpu-call-us 40 "
      "--fetch-chunk-experts 2 --dram-gbs 30");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream f(path);
  const nlohmann::json doc = nlohmann::json::parse(f);
  std::remove(path.c_str());
  EXPECT_EQ(doc["schema_version"], 2);
  const auto& mi = doc["model_inputs"];
  EXPECT_EQ(mi["pcie_gbs"], 25.0);
  EXPECT_EQ(mi["miss_rate"], 0.3);
  EXPECT_EQ(mi["gpu_gbps"], 2.0);
  EXPECT_EQ(mi["gpu_fetch_gbps"], 0.5);
  EXPECT_DOUBLE_EQ(mi["cpu_overhead_s"].get<double>(), 30e-6);
  EXPECT_DOUBLE_EQ(mi["gpu_call_s"].get<double>(), 40e-6);
  EXPECT_EQ(mi["fetch_chunk_experts"], 2);
  EXPECT_EQ(mi["dram_gbps"], 30.0);
  ASSERT_EQ(doc["entries"].size(), 4u);
  for (const auto& e : doc["entries"]) {
    const double distinct = e["distinct_experts_per_call"], eb = e["expert_bytes"];
    const double per_token = 1.0 / e["tokens"].get<int>();
    const auto& b = e["backends"];
    EXPECT_DOUBLE_EQ(b["missing_experts_per_call"].get<double>(), 0.3 * distinct);
    EXPECT_DOUBLE_EQ(b["resident_experts_per_call"].get<double>(), 0.7 * distinct);
    const ModelInputs in = inputs(e["cpu_gbps"], 25, 30, 2, 0.5, 30e-6, 40e-6, 2 * eb);
    const BackendModel m = model_backends(0.3 * distinct * eb, 0.7 * distinct * eb, in);
    EXPECT_DOUBLE_EQ(b["missing_bytes_per_call"].get<double>(), m.missing_bytes);
    EXPECT_DOUBLE_EQ(b["resident_bytes_per_call"].get<double>(), m.resident_bytes);
    EXPECT_DOUBLE_EQ(b["gpu_resident"]["time_per_token_s"].get<double>(), m.gpu_resident_s * per_token);
    EXPECT_DOUBLE_EQ(b["cpu"]["time_per_token_s"].get<double>(), m.cpu_s * per_token);
    EXPECT_DOUBLE_EQ(b["cpu"]["compute_per_token_s"].get<double>(), m.cpu_compute_s * per_token);
    EXPECT_DOUBLE_EQ(b["pcie"]["time_per_token_s"].get<double>(), m.pcie_s * per_token);
    EXPECT_DOUBLE_EQ(b["pcie"]["fetch_per_token_s"].get<double>(), m.fetch_s * per_token);
    EXPECT_DOUBLE_EQ(b["pcie"]["gpu_fetched_per_token_s"].get<double>(), m.gpu_fetched_s * per_token);
    EXPECT_DOUBLE_EQ(b["hybrid"]["cpu_fraction"].get<double>(), m.cpu_fraction);
    EXPECT_DOUBLE_EQ(b["hybrid"]["shared_rate"].get<double>(), m.shared_rate);
    EXPECT_DOUBLE_EQ(b["hybrid"]["time_per_token_s"].get<double>(), m.hybrid_s * per_token);
    EXPECT_EQ(e["recommendation"]["backend"], m.best);
    EXPECT_DOUBLE_EQ(e["recommendation"]["time_per_token_s"].get<double>(), m.best_s * per_token);
    // The GPU inputs are slow enough here that the resident compute is a visible part of the layer.
    EXPECT_GT(m.gpu_resident_s, 0);
    EXPECT_GE(m.cpu_s, m.gpu_resident_s);
  }
}

TEST(ProfileRun, GpuInputsAreCheckedAndNeedTheModel) {
  const std::string base =
      "--hidden 256 --intermediate 128 --experts 8 --top-k 2 --format bf16 --min-time 0.01 "
      "--repeat 1 --warmup 0 --profile /dev/null";
  struct Bad {
    const char* args;
    const char* message;
  };
  for (const Bad& c :
       {Bad{" --gpu-gbs 100", "need --pcie-gbs and --miss-rate"},
        Bad{" --pcie-gbs 25 --miss-rate 0.5 --gpu-gbs 0", "--gpu-gbs must be > 0"},
        Bad{" --pcie-gbs 25 --miss-rate 0.5 --gpu-fetch-gbs -1", "--gpu-fetch-gbs must be > 0"},
        Bad{" --pcie-gbs 25 --miss-rate 0.5 --cpu-overhead-us -5", "--cpu-overhead-us must be >= 0"},
        Bad{" --gpu-call-us 5", "need --pcie-gbs and --miss-rate"},
        Bad{" --dram-gbs 100", "need --pcie-gbs and --miss-rate"},
        Bad{" --pcie-gbs 25 --miss-rate 0.5 --gpu-call-us -1", "--gpu-call-us must be >= 0"},
        Bad{" --pcie-gbs 25 --miss-rate 0.5 --fetch-chunk-experts -1", "--fetch-chunk-experts must be >= 0"},
        Bad{" --pcie-gbs 25 --miss-rate 0.5 --dram-gbs 0", "--dram-gbs must be > 0"}}) {
    const ToolRun r = run_bench(base + c.args);
    EXPECT_EQ(r.code, 2) << c.args;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
  }
  // An infinite GPU rate is an input (the GPU's time is then its fixed part, as at one token).
  const ToolRun inf = run_bench(base + " --pcie-gbs 25 --miss-rate 0.5 --gpu-gbs inf --gpu-fetch-gbs inf");
  EXPECT_EQ(inf.code, 0) << inf.err;
}

#endif

}  // namespace
