// moejit-bench --profile: a versioned JSON file an engine can read to decide where the experts it
// does not hold on its GPU should run (schema in docs/TOOLS.md, schema_version 1).
#pragma once

#include <memory>
#include <string>

#include "bench_report.h"

namespace moejit_bench {

constexpr int kProfileSchemaVersion = 1;

struct ProfileOptions {
  std::string path;
  double pcie_gbs = 0;    // 0: no backend model
  double miss_rate = -1;  // share of routed experts not resident on the GPU
};

// Expected time per call for the missing experts of one measured case. Every time is for the
// bytes of miss_rate x (distinct experts per call) experts.
struct BackendModel {
  double missing_bytes = 0;
  double cpu_s = 0;               // missing bytes at the CPU's measured GB/s
  double pcie_s = 0;              // missing bytes at the PCIe bandwidth (GPU compute assumed negligible)
  double cpu_fraction = 0;        // hybrid: share of the missing bytes computed on the CPU
  double hybrid_ideal_s = 0;      // max(f cpu, (1-f) pcie) at the balancing f
  double dram_capacity_gbps = 0;  // max(DRAM read GB/s the CPU threads reached, PCIe GB/s)
  double dram_floor_s = 0;        // missing bytes at that capacity: CPU and DMA read the same DRAM
  double hybrid_s = 0;            // max(hybrid_ideal_s, dram_floor_s)
  std::string best;               // "cpu", "pcie", "hybrid" or "none" (nothing missing)
  double best_s = 0;
};
// hybrid is chosen only when it beats the better single backend by more than `hybrid_margin`
// (its split and merge cost is not modelled).
BackendModel model_backends(double missing_bytes, double cpu_gbps, double pcie_gbs, double dram_gbps,
                            double hybrid_margin = 0.10);

std::unique_ptr<Reporter> make_profile_reporter(const ProfileOptions& options);

}  // namespace moejit_bench
