// The backend model of moejit-bench --profile (docs/TOOLS.md, "The backend model"): the expected
// time of one MoE layer call on a GPU that holds a share of the experts, served three ways.
// examples/hybrid_moe.py has a Python copy (model_backends) that behaves identically;
// tests/test_bench_model.cpp and tests/python/test_hybrid_example.py hold the two together.
// No dependency but the C++ standard library, so the tests compile it alone.
#pragma once

#include <string>

namespace moejit_bench {

// Defaults of the GPU-side inputs (moejit-bench --gpu-gbs, --gpu-call-us, --gpu-fetch-gbs,
// --cpu-overhead-us, --fetch-chunk-experts): H200 + Xeon, hybrid_run2 (docs/PERFORMANCE.md,
// "Hybrid GPU + CPU (Xeon + H200)"), its 16-token figures: an H200 (PCIe Gen5) computing fp8_block
// experts (DeepSeek-V3 geometry) dequantized to bf16, as examples/hybrid_moe.py does, beside moejit
// on 15 Emerald Rapids cores. That run measured the GPU time with every expert of a call resident
// (3.71 ms for 102 experts), the fetched experts' compute (33.25 ms) and the CPU part's fixed cost;
// the rate and the fixed time of the GPU are the line through that point and its 75%-miss case
// (1.53 ms for 25.4 resident experts), until a run measures them with 1 and with every expert
// resident. Pass what the example measures on your machine (its JSON's "inputs"); rates are GB/s of
// the format's expert bytes (weights + scales, `expert_bytes`).
constexpr double kDefaultGpuGbps = 1550;         // resident experts, ready to multiply, past the fixed time
constexpr double kDefaultGpuCallS = 8.1e-4;      // a GPU compute part's fixed time per call
constexpr double kDefaultGpuFetchGbps = 138;     // fetched experts: dequantize on arrival, then multiply
constexpr double kDefaultCpuOverheadS = 8.2e-4;  // x to the host, submit, wait, y to the GPU and the add
constexpr int kDefaultFetchChunkExperts = 8;     // experts per copy the GPU waits for (the example's --chunk)

struct ModelInputs {
  double cpu_gbps = 0;   // moejit's weight GB/s on the layer (a profile entry's cpu_gbps); 0: no CPU
  double pcie_gbs = 0;   // host-to-GPU GB/s of pinned copies
  double dram_gbps = 0;  // host DRAM read GB/s with the CPU and the copy engine reading at once
  double gpu_gbps = kDefaultGpuGbps;
  double gpu_call_s = kDefaultGpuCallS;
  double gpu_fetch_gbps = kDefaultGpuFetchGbps;
  double cpu_overhead_s = kDefaultCpuOverheadS;  // per layer call that computes anything on the CPU
  double fetch_chunk_bytes = 0;  // bytes per copy the GPU waits for (experts x expert_bytes); 0: one copy
};

// Seconds per layer call. M = missing bytes (the experts of the call the GPU does not hold),
// R = resident bytes (the call's experts it holds). Every way starts with x on the GPU and ends
// with y on the GPU; the GPU computes the resident experts in every way.
struct BackendModel {
  double missing_bytes = 0;
  double resident_bytes = 0;
  double gpu_resident_s = 0;       // a = gpu_call_s + R / gpu_gbps (0 when R is 0)
  double cpu_compute_s = 0;        // c = M / cpu_gbps
  double fetch_s = 0;              // P = M / pcie_gbs
  double gpu_fetched_s = 0;        // B = M / gpu_fetch_gbps
  double chunk_fetch_s = 0;        // p1 = fetch_chunk_bytes / pcie_gbs (infinite without chunks)
  double chunk_gpu_fetched_s = 0;  // b1 = fetch_chunk_bytes / gpu_fetch_gbps (infinite without chunks)
  // The GPU side with a share g of M fetched, the copies pipelined with the compute by chunks. The
  // fetched part is a compute part of its own (gpu_call_s again), and it ends after the resident
  // compute and all of it, after the first chunk's copy and all of it, or after every copy and the
  // last chunk's compute, whichever is latest:
  //     G(g) = gpu_call_s + max(a + g B, min(g P, p1) + g B, g P + min(g B, b1)),  G(0) = a
  // (b) every missed expert on the CPU: the x and y copies, submit and wait are in line with the
  //     GPU's compute, the CPU's compute runs beside it:
  //     cpu_s = cpu_overhead_s + max(a, c)
  double cpu_s = 0;
  // (a) every missed expert fetched: G(1)
  double pcie_s = 0;
  // (c) a share f of the missed bytes on the CPU, the rest fetched, at once. The CPU and the copy
  //     engine then share host DRAM: each runs at shared_rate x its rate alone, shared_rate =
  //     min(1, dram_capacity_gbps / (cpu_gbps + pcie_gbs)):
  //     t(f) = cpu_overhead_s + max(f c / shared_rate, G(1-f) with P, p1 / shared_rate)
  //     at the f that balances the two sides (clamped to [0, 1]; at 0 or 1 the split is the single
  //     way, pcie_s or cpu_s)
  double shared_rate = 1;
  double cpu_fraction = 0;
  double hybrid_ideal_s = 0;      // t(cpu_fraction)
  double dram_capacity_gbps = 0;  // max(dram_gbps, cpu_gbps, pcie_gbs): DRAM gave each alone that much
  double dram_floor_s = 0;        // M / dram_capacity_gbps
  double hybrid_s = 0;            // max(hybrid_ideal_s, dram_floor_s)
  std::string best;               // "cpu", "pcie", "hybrid" or "none" (nothing missing)
  double best_s = 0;
};

// hybrid is chosen only when it beats the better single way by more than `hybrid_margin`.
// A rate of +infinity makes its term 0; cpu_gbps 0 makes the CPU ways infinite.
BackendModel model_backends(double missing_bytes, double resident_bytes, const ModelInputs& in,
                            double hybrid_margin = 0.10);

}  // namespace moejit_bench
