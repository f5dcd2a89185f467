// moejit-bench: output as an aligned table (default), CSV or JSON.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_layer.h"
#include "bench_run.h"

namespace moejit_bench {

struct MachineInfo {
  std::string version;
  moejit_isa host_isa = MOEJIT_ISA_AUTO;
  int cpus = 0;
  int64_t l3_bytes = 0;
  int64_t dram_buffer_bytes = 0;
  int dram_passes = 0;
  std::vector<std::pair<int, double>> dram_gbps;  // (threads, GB/s)
};

struct LayerInfo {
  moejit_format format = MOEJIT_FORMAT_BF16;
  double bytes_per_weight = 0;
  int64_t expert_bytes = 0;
  int64_t total_bytes = 0;
  double generate_seconds = 0;
};

struct CaseRow {
  int index = 0;
  CaseSpec spec;
  LayerInfo layer;
  CaseResult result;
  double dram_gbps = 0;     // measured with spec.threads threads
  double foreign_cpus = 0;  // CPUs other processes used while the case ran
  std::string repro;
};

class Reporter {
 public:
  virtual ~Reporter() = default;
  virtual void begin(const MachineInfo& machine, const Geometry& g) = 0;
  virtual void layer(const LayerInfo& layer) = 0;
  virtual void row(const CaseRow& row) = 0;
  virtual void end() = 0;
};

enum class OutputMode { table, csv, json };
std::unique_ptr<Reporter> make_reporter(OutputMode mode);

std::string describe(const Geometry& g);  // one line: H=... I=... E=... top_k=... activation ...
const char* activation_label(moejit_activation a);
bool parse_activation(const std::string& name, moejit_activation* out);
bool parse_isa(const std::string& name, moejit_isa* out);

// Warnings worth a reader's attention (library byte count differs, non-finite outputs, ...).
std::vector<std::string> row_warnings(const CaseRow& row);

}  // namespace moejit_bench
