// moejit-bench --profile: a versioned JSON file an engine can read to decide where the experts it
// does not hold on its GPU should run (schema in docs/TOOLS.md, schema_version 2).
#pragma once

#include <memory>
#include <string>

#include "bench_model.h"
#include "bench_report.h"

namespace moejit_bench {

// 2: the backends' times are the layer's (the GPU's resident compute, the fetched experts' GPU
// compute and the CPU's per-layer overhead included), no longer the missing experts' alone.
constexpr int kProfileSchemaVersion = 2;

struct ProfileOptions {
  std::string path;
  double pcie_gbs = 0;    // 0: no backend model
  double miss_rate = -1;  // share of routed experts not resident on the GPU
  double gpu_gbps = kDefaultGpuGbps;
  double gpu_fetch_gbps = kDefaultGpuFetchGbps;
  double cpu_overhead_s = kDefaultCpuOverheadS;
  double gpu_call_s = kDefaultGpuCallS;
  int32_t fetch_chunk_experts = kDefaultFetchChunkExperts;  // x each entry's expert_bytes
  double dram_gbs = 0;  // the DRAM capacity of the model; 0: each entry's dram_gbps
};

std::unique_ptr<Reporter> make_profile_reporter(const ProfileOptions& options);

}  // namespace moejit_bench
