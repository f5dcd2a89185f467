// moejit-bench: what a run produces (machine, layers, one row per case) and the reporters that
// write it: an aligned table (default), CSV or JSON on stdout, plus an SVG plot and a profile.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench_layer.h"
#include "bench_run.h"
#include "bench_util.h"

namespace moejit_bench {

enum class DedupMode { on, off, both };
enum class PeerKind { none, onednn };

// The read probe's pick for one thread count (moejit_bench.cpp's DramProbe).
struct ProbeChoice {
  int threads = 0;
  ReadVariant variant;
  double gbps = 0;        // the variant's median over the start-up passes: the best of the set
  double plain_gbps = 0;  // kPlainRead's (the probe before variants), same passes, interleaved
};

struct MachineInfo {
  std::string version;
  std::string cpu_model;
  moejit_isa host_isa = MOEJIT_ISA_AUTO;
  int cpus = 0;
  int64_t l3_bytes = 0;           // what pools are sized from: detected, or --l3-bytes
  int64_t l3_detected_bytes = 0;  // what sysfs says
  bool l3_given = false;
  int64_t dram_buffer_bytes = 0;
  int64_t dram_huge_page_bytes = -1;              // of the probe buffer, -1 unknown
  int dram_passes = 0;                            // per variant at start-up
  bool dram_forced = false;                       // --read-variant: one variant, not the fastest of a set
  std::vector<std::string> dram_variants;         // the start-up set
  std::vector<ProbeChoice> dram_choice;           // per thread count
  std::vector<std::pair<int, double>> dram_gbps;  // (threads, GB/s): dram_choice's gbps
  std::string dedup_env;                          // MOEJIT_DEDUP as set in the environment, "" if unset
  std::string tiles_env;                          // MOEJIT_TILES as set in the environment, "" if unset
  std::string omp_wait_policy;                    // OMP_WAIT_POLICY (the oneDNN peer's threads), "" if unset
};

// What the run measures, for reporters that choose their columns up front.
struct RunInfo {
  Geometry geometry;
  std::string preset;
  DedupMode dedup = DedupMode::on;
  bool hot = false;
  PeerKind peer = PeerKind::none;
  RoutingKind routing = RoutingKind::uniform;
  double zipf_s = 1.0;
  std::string baseline_path, baseline_version;  // --baseline: the other build (empty: none)
};

struct LayerInfo {
  FormatChoice format = MOEJIT_FORMAT_BF16;
  double bytes_per_weight = 0;
  int64_t expert_bytes = 0;
  int64_t total_bytes = 0;       // the model's experts: experts x expert_bytes
  int32_t pool_slots = 0;        // expert slots the calls cycle through (Layer::place)
  int64_t pool_bytes = 0;        // pool_slots x expert_bytes: the cold working set
  int64_t huge_page_bytes = -1;  // of the pool's weights and scales on 2 MiB pages, -1 unknown
  int64_t hot_bytes = 0;         // working set of the --hot layer, 0 without --hot
  double generate_seconds = 0;
  std::string peer_label, peer_note;  // --peer: how it runs this format (bench_peer.h)
};

struct CaseRow {
  int index = 0;
  CaseSpec spec;  // format, tokens, threads, tier cap (spec.dedup is per arm)
  LayerInfo layer;
  std::optional<CaseResult> on, off;  // the dedup arms that ran
  std::optional<CaseResult> hot;      // the primary arm over the --hot layer
  std::optional<CaseResult> peer;     // --peer, same routing and tokens
  std::string peer_label;             // "onednn bf16", ...
  std::optional<CaseResult> base;     // --baseline: the other build's arm (the primary's dedup)
  double dram_gbps = 0;               // median of the DRAM passes interleaved with the case (spec.threads)
  int dram_passes = 0;
  std::string dram_variant;  // the read variant of those passes
  double foreign_cpus = 0;   // CPUs other processes used while the case ran
  std::string repro;

  const CaseResult& primary() const { return on ? *on : *off; }  // dedup on if it ran
};

// Numbers derived from a row; NaN when an input is missing.
struct Derived {
  double reuse = 0;             // routes / distinct experts per call
  double model_speedup = 0;     // 1 / (2/3 / reuse + 1/3)
  double measured_speedup = 0;  // dedup on GB/s / dedup off GB/s
  double stream_s = 0;          // bytes the primary arm streamed per call / DRAM read bandwidth
  double hot_s = 0;             // the primary arm's median call over the --hot layer
  double bound_s = 0;           // max(stream_s, hot_s)
  double bound_ratio = 0;       // primary median / bound_s
  double peer_speedup = 0;      // primary GB/s / peer GB/s
  double base_speedup = 0;      // primary GB/s / baseline GB/s
  double dram_ratio = 0;        // primary GB/s / DRAM GB/s
};
Derived derive(const CaseRow& row);

class Reporter {
 public:
  virtual ~Reporter() = default;
  virtual void begin(const MachineInfo& machine, const RunInfo& run) = 0;
  virtual void layer(const LayerInfo& layer) = 0;
  virtual void row(const CaseRow& row) = 0;
  virtual void end() = 0;
};

enum class OutputMode { table, csv, json };
std::unique_ptr<Reporter> make_reporter(OutputMode mode);
std::unique_ptr<Reporter> make_table_reporter();  // bench_table.cpp

// Sends every event to each reporter in turn.
class FanOut : public Reporter {
 public:
  void add(std::unique_ptr<Reporter> r) { sinks_.push_back(std::move(r)); }
  void begin(const MachineInfo& m, const RunInfo& run) override {
    for (auto& s : sinks_) s->begin(m, run);
  }
  void layer(const LayerInfo& l) override {
    for (auto& s : sinks_) s->layer(l);
  }
  void row(const CaseRow& r) override {
    for (auto& s : sinks_) s->row(r);
  }
  void end() override {
    for (auto& s : sinks_) s->end();
  }

 private:
  std::vector<std::unique_ptr<Reporter>> sinks_;
};

std::string describe(const Geometry& g);  // one line: H=... I=... E=... top_k=... activation ...
const char* activation_label(moejit_activation a);
bool parse_activation(const std::string& name, moejit_activation* out);
bool parse_isa(const std::string& name, moejit_isa* out);
// Every tier the library names, lowest first, and their names as ", scalar, avx2, ...".
std::vector<moejit_isa> api_tiers();
std::string api_tier_names();
const char* dedup_label(DedupMode d);

// Warnings worth a reader's attention (library byte count differs, non-finite outputs, ...).
std::vector<std::string> row_warnings(const CaseRow& row, int64_t l3_bytes);

std::string strf(const char* format, double v);

}  // namespace moejit_bench
