// moejit-bench: the command line (options, presets, validation) and the repro line of a case.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_layer.h"
#include "bench_model.h"
#include "bench_report.h"
#include "bench_run.h"

namespace moejit_bench {

struct Preset {
  const char* name;
  Geometry geometry;
  moejit_format format;  // the format the checkpoint ships in (the default --format)
  const char* note;      // where the geometry comes from, shown by --help
};
const std::vector<Preset>& presets();

// Everything the command line decides.
struct Config {
  std::string preset;
  Geometry geometry;
  std::vector<moejit_format> formats;
  std::vector<int32_t> tokens{1};
  std::vector<int32_t> threads;
  std::vector<moejit_isa> isas{MOEJIT_ISA_AUTO};
  DedupMode dedup = DedupMode::on;
  bool hot = false;
  PeerKind peer = PeerKind::none;
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
  bool progress = false;  // progress lines on stderr even when it is not a terminal
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses the command line into *out. Returns -1 to run, else the exit code (0 after --help,
// 2 after a usage error, whose one-line reason is printed on stderr).
int parse_command_line(int argc, char** argv, Config* out);

// One command that reruns a single case with the same layer and settings.
std::string repro(const Config& c, moejit_format f, int32_t tokens, int32_t threads, moejit_isa isa);

}  // namespace moejit_bench
