// moejit-bench: the command line (options, presets from bench_layer.h, validation) and the repro line of a
// case.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_layer.h"
#include "bench_model.h"
#include "bench_report.h"
#include "bench_run.h"
#include "bench_util.h"

namespace moejit_bench {

// Everything the command line decides.
struct Config {
  std::string preset;
  Geometry geometry;
  std::vector<FormatChoice> formats;
  std::vector<int32_t> tokens{1};
  std::vector<int32_t> threads;
  std::vector<moejit_isa> isas{MOEJIT_ISA_AUTO};
  DedupMode dedup = DedupMode::on;
  bool hot = false;
  PeerKind peer = PeerKind::none;
  // --baseline: another build of libmoejit, each case's extra arm (null: none)
  std::shared_ptr<const MoeApi> baseline;
  RoutingKind routing = RoutingKind::uniform;
  double zipf_s = 1.0;
  CaseSpec timing;  // min_time, min_calls, warmup
  uint64_t seed = 1;
  OutputMode output = OutputMode::table;
  std::string plot_path, profile_path;
  double pcie_gbs = 0;                // 0 = not given
  double miss_rate = -1;              // < 0 = not given
  double gpu_gbps = kDefaultGpuGbps;  // the backend model's GPU-side inputs (bench_model.h)
  double gpu_fetch_gbps = kDefaultGpuFetchGbps;
  double cpu_overhead_s = kDefaultCpuOverheadS;
  double gpu_call_s = kDefaultGpuCallS;
  int32_t fetch_chunk_experts = kDefaultFetchChunkExperts;
  double dram_gbs = 0;    // 0: each case's read probe
  bool progress = false;  // progress lines on stderr even when it is not a terminal
  int64_t l3_bytes = 0;   // the L3 the cold pools and the probe buffer are sized from
  bool l3_given = false;  // --l3-bytes (else detected)
  bool probe = false;     // --probe: every read variant per thread count, then exit
  int32_t probe_passes = 5;
  bool read_forced = false;  // --read-variant NAME (else the fastest of the start-up set)
  ReadVariant read_variant;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses the command line into *out. Returns -1 to run, else the exit code (0 after --help,
// 2 after a usage error, whose one-line reason is printed on stderr).
int parse_command_line(int argc, char** argv, Config* out);

// One command that reruns a single case with the same layer and settings.
std::string repro(const Config& c, FormatChoice f, int32_t tokens, int32_t threads, moejit_isa isa);

}  // namespace moejit_bench
