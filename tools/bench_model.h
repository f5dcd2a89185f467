// The backend model of moejit-bench --profile (docs/TOOLS.md, "The backend model"): the expected
// time of one MoE layer call on a GPU that holds a share of the experts, served three ways.
// examples/hybrid_moe.py has a Python copy (model_backends) that behaves identically;
// tests/test_bench_model.cpp and tests/python/test_hybrid_example.py hold the two together.
// No dependency but the C++ standard library, so the tests compile it alone.
#pragma once

#include <string>

namespace moejit_bench {

// Defaults of the GPU-side inputs (moejit-bench --gpu-gbs, --gpu-fetch-gbs, --cpu-overhead-us):
// rough figures for an H200 that computes fp8_block experts dequantized to bf16, as
// examples/hybrid_moe.py does. Pass what that example measured on your machine (its JSON's
// "inputs"); rates are GB/s of the format's expert bytes (weights + scales, `expert_bytes`).
constexpr double kDefaultGpuGbps = 1500;       // resident experts, ready to multiply
constexpr double kDefaultGpuFetchGbps = 400;   // fetched experts: dequantize on arrival, then multiply
constexpr double kDefaultCpuOverheadS = 1e-4;  // x to the host, submit, wait, y to the GPU and the add

struct ModelInputs {
  double cpu_gbps = 0;   // moejit's weight GB/s on the layer (a profile entry's cpu_gbps); 0: no CPU
  double pcie_gbs = 0;   // host-to-GPU GB/s of pinned copies
  double dram_gbps = 0;  // DRAM read GB/s (the entry's probe)
  double gpu_gbps = kDefaultGpuGbps;
  double gpu_fetch_gbps = kDefaultGpuFetchGbps;
  double cpu_overhead_s = kDefaultCpuOverheadS;  // per layer call that computes anything on the CPU
};

// Seconds per layer call. M = missing bytes (the experts of the call the GPU does not hold),
// R = resident bytes (the call's experts it holds). Every way starts with x on the GPU and ends
// with y on the GPU; the GPU computes the resident experts in every way.
struct BackendModel {
  double missing_bytes = 0;
  double resident_bytes = 0;
  double gpu_resident_s = 0;  // R / gpu_gbps
  double cpu_compute_s = 0;   // M / cpu_gbps
  double fetch_s = 0;         // M / pcie_gbs
  double gpu_fetched_s = 0;   // M / gpu_fetch_gbps
  // (b) every missed expert on the CPU, concurrently with the GPU:
  //     max(gpu_resident_s, cpu_overhead_s + cpu_compute_s)
  double cpu_s = 0;
  // (a) every missed expert fetched; the copies run beside the resident compute, the fetched
  //     experts are computed after they arrive: max(gpu_resident_s, fetch_s) + gpu_fetched_s
  //     (pipelining fetch and compute by chunks can hide part of the last term: an upper bound)
  double pcie_s = 0;
  // (c) a share f of the missed bytes on the CPU, the rest fetched:
  //     t(f) = max(cpu_overhead_s + f cpu_compute_s,
  //                max(gpu_resident_s, (1-f) fetch_s) + (1-f) gpu_fetched_s)
  //     at the f that balances the two sides (clamped to [0, 1])
  double cpu_fraction = 0;
  double hybrid_ideal_s = 0;      // t(cpu_fraction)
  double dram_capacity_gbps = 0;  // max(dram_gbps, pcie_gbs): CPU and DMA read the same DRAM
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
