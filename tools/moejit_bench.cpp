// moejit-bench: times moejit MoE layers with cold experts and compares the weight bandwidth they
// reach with the DRAM read bandwidth measured in the same run. `moejit-bench --help` for options.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_config.h"
#include "bench_layer.h"
#include "bench_peer.h"
#include "bench_plot.h"
#include "bench_profile.h"
#include "bench_report.h"
#include "bench_run.h"
#include "bench_util.h"
#include "moejit.h"

namespace moejit_bench {
namespace {

using Clock = std::chrono::steady_clock;

// DRAM read-bandwidth probe: one 1 GiB buffer kept for the whole run. It is measured per thread
// count at the start (the header), and one pass runs after every round of a case's interleaved
// arms (that case's reference: the median of those passes). A VM's bandwidth drifts with the
// host's load, so the reference is taken during the measurement, not before or after it.
class DramProbe {
 public:
  static constexpr size_t kBytes = size_t(1) << 30;
  static constexpr int kPasses = 10;
  explicit DramProbe(uint64_t seed) : buffer_(kBytes) {
    fill_words(buffer_.data(), buffer_.size(), seed, [](uint64_t w) { return w; });
  }
  double measure(int threads) const { return measure_read_bandwidth(buffer_, threads, kPasses); }
  double pass(int threads) const { return measure_read_bandwidth(buffer_, threads, 1); }

 private:
  Buffer buffer_;
};

// One status line on stderr, rewritten in place on a terminal (or one line per step with
// --progress when stderr is not a terminal). Cleared before each table row.
class Progress {
 public:
  Progress(int total, bool forced) : total_(total), tty_(isatty(STDERR_FILENO)), on_(tty_ || forced) {}
  void set_case(int done, const std::string& what) { done_ = done, what_ = what; }
  void step(const std::string& phase) {
    if (!on_) return;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    std::string eta;
    if (done_ > 0) eta = ", ~" + clock(elapsed / done_ * (total_ - done_)) + " left";
    std::fprintf(stderr, "%s[%d/%d] %s: %s (%s elapsed%s)%s", tty_ ? "\r\033[K" : "", done_ + 1, total_,
                 what_.c_str(), phase.c_str(), clock(elapsed).c_str(), eta.c_str(), tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  void clear() {
    if (on_ && tty_) std::fprintf(stderr, "\r\033[K"), std::fflush(stderr);
  }

 private:
  static std::string clock(double s) {
    const int t = int(s + 0.5);
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%d:%02d", t / 60, t % 60);
    return buf;
  }
  int total_, done_ = 0;
  bool tty_, on_;
  std::string what_;
  Clock::time_point start_ = Clock::now();
};

MachineInfo describe_machine(const Config& c, const DramProbe& dram) {
  MachineInfo m;
  m.version = moejit_version();
  m.cpu_model = cpu_model_name();
  m.host_isa = moejit_host_isa();
  m.cpus = int(affinity_cpus().size());
  m.l3_bytes = l3_cache_bytes();
  m.dram_buffer_bytes = int64_t(DramProbe::kBytes);
  m.dram_passes = DramProbe::kPasses;
  for (int32_t t : std::set<int32_t>(c.threads.begin(), c.threads.end()))
    m.dram_gbps.emplace_back(t, dram.measure(t));
  if (const char* env = std::getenv("MOEJIT_DEDUP"); env && *env) m.dedup_env = env;
  if (const char* env = std::getenv("OMP_WAIT_POLICY"); env && *env) m.omp_wait_policy = env;
  return m;
}

struct Runner {
  const Config& c;
  const DramProbe& dram;
  Reporter& out;
  Progress& progress;
  int index = 0, errors = 0;

  // A row for a tier this CPU lacks: every arm skipped, nothing run.
  void skip(CaseRow& row, moejit_isa isa) {
    CaseResult r;
    r.status = CaseStatus::skipped;
    r.isa = isa;
    r.message = std::string("tier ") + moejit_isa_name(isa) + ": this CPU's best tier is " +
                moejit_isa_name(moejit_host_isa());
    if (c.dedup != DedupMode::off) row.on = r;
    if (c.dedup != DedupMode::on) row.off = r;
  }

  void run_row(CaseRow& row, const Layer& layer, const Layer* hot, const Routing& routing,
               std::map<std::pair<int32_t, int32_t>, CaseResult>& peer_cache) {
    const CpuSample before = sample_cpu();
    std::vector<bool> dedups;
    if (c.dedup != DedupMode::off) dedups.push_back(true);
    if (c.dedup != DedupMode::on) dedups.push_back(false);
    progress.step(c.dedup == DedupMode::both ? "dedup on and off, interleaved with the DRAM probe"
                                             : "interleaved with the DRAM probe");
    std::vector<double> passes;  // one DRAM read pass after every round of the arms
    const std::vector<CaseResult> arms =
        run_arms(layer, dedups, routing, row.spec, [&] { passes.push_back(dram.pass(row.spec.threads)); });
    for (size_t i = 0; i < arms.size(); ++i) (dedups[i] ? row.on : row.off) = arms[i];
    if (hot && row.primary().ok()) {
      progress.step("hot");
      CaseSpec spec = row.spec;
      spec.dedup = bool(row.on);
      row.hot = run_case(*hot, routing, spec);
    }
    if (c.peer != PeerKind::none) {
      row.peer_label = row.layer.peer_label;
      const auto key = std::make_pair(row.spec.tokens, row.spec.threads);
      if (!peer_cache.count(key)) {  // the peer has no tiers: once per tokens x threads
        progress.step(row.peer_label);
        peer_cache[key] = run_peer(c.peer, layer, routing, row.spec);
      }
      row.peer = peer_cache[key];
    }
    row.foreign_cpus = foreign_cpus(before, sample_cpu());
    row.dram_passes = int(passes.size());
    if (row.primary().ok()) row.dram_gbps = median(passes);
  }

  // Generates the format's layer (and the --hot one) and runs its cases.
  void run_format(moejit_format f) {
    LayerInfo info;
    info.format = f;
    info.bytes_per_weight = bytes_per_weight(f, c.geometry);
    info.expert_bytes = expert_bytes(f, c.geometry);
    info.total_bytes = info.expert_bytes * c.geometry.experts;
    const std::string what = std::string(format_label(f));
    progress.set_case(index, what);
    progress.step("generating " + strf("%.2f", double(info.total_bytes) / 1e9) + " GB of weights");
    const auto t0 = Clock::now();
    const Layer layer(f, c.geometry, c.seed);
    info.generate_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    std::unique_ptr<Layer> hot;
    if (c.hot) {
      hot = std::make_unique<Layer>(f, c.geometry, c.seed, 1);
      info.hot_bytes = hot->total_bytes();
    }
    if (c.peer != PeerKind::none) {
      progress.step("probing the peer");
      const PeerPlan plan = peer_plan(c.peer, f);
      info.peer_label = plan.label;
      info.peer_note = plan.note;
    }
    out.layer(info);

    std::map<std::pair<int32_t, int32_t>, CaseResult> peer_cache;
    for (int32_t tokens : c.tokens) {
      const Routing routing = make_routing(tokens, c.geometry.top_k, c.geometry.experts,
                                           c.seed * 1000003 + uint64_t(tokens), c.routing, c.zipf_s);
      for (int32_t threads : c.threads) {
        for (moejit_isa isa : c.isas) {
          CaseRow row;
          row.index = ++index;
          row.spec = c.timing;
          row.spec.format = f, row.spec.tokens = tokens, row.spec.threads = threads, row.spec.max_isa = isa;
          row.layer = info;
          row.repro = repro(c, f, tokens, threads, isa);
          progress.set_case(index - 1, what + " tokens=" + std::to_string(tokens) + " threads=" +
                                           std::to_string(threads) + " isa=" + moejit_isa_name(isa));
          if (isa != MOEJIT_ISA_AUTO && isa > moejit_host_isa()) {
            skip(row, isa);
          } else {
            run_row(row, layer, hot.get(), routing, peer_cache);
          }
          errors += row.primary().status == CaseStatus::error;
          progress.clear();
          out.row(row);
        }
      }
    }
  }
};

// Runs every case, one layer in memory at a time; returns the number of failed cases.
int run_all(const Config& c) {
  const int per_format = int(c.tokens.size() * c.threads.size() * c.isas.size());
  Progress progress(per_format * int(c.formats.size()), c.progress);
  progress.set_case(0, "start");
  progress.step("measuring the DRAM read bandwidth");
  const DramProbe dram(c.seed);
  FanOut out;
  out.add(make_reporter(c.output));
  if (!c.plot_path.empty()) out.add(make_plot_reporter(c.plot_path));
  if (!c.profile_path.empty())
    out.add(make_profile_reporter(
        {c.profile_path, c.pcie_gbs, c.miss_rate, c.gpu_gbps, c.gpu_fetch_gbps, c.cpu_overhead_s}));
  RunInfo run;
  run.geometry = c.geometry;
  run.preset = c.preset;
  run.dedup = c.dedup;
  run.hot = c.hot;
  run.peer = c.peer;
  run.routing = c.routing;
  run.zipf_s = c.zipf_s;
  const MachineInfo machine = describe_machine(c, dram);
  progress.clear();
  out.begin(machine, run);
  Runner runner{c, dram, out, progress};
  for (moejit_format f : c.formats) runner.run_format(f);
  progress.clear();
  out.end();
  return runner.errors;
}

void check_memory(const Config& c) {
  int64_t largest = 0;
  for (moejit_format f : c.formats)
    largest = std::max(largest, expert_bytes(f, c.geometry) * c.geometry.experts);
  const int64_t mem = physical_memory_bytes();
  largest += int64_t(DramProbe::kBytes);
  if (largest > mem / 10 * 9)
    throw UsageError("the largest layer and the 1 GiB bandwidth buffer need " +
                     std::to_string(largest >> 20) + " MiB, the machine has " + std::to_string(mem >> 20) +
                     " MiB: use fewer --experts");
}

}  // namespace
}  // namespace moejit_bench

int main(int argc, char** argv) {
  using namespace moejit_bench;
  Config config;
  if (const int rc = parse_command_line(argc, argv, &config); rc >= 0) return rc;
  try {
    check_memory(config);
    return run_all(config) == 0 ? 0 : 1;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "moejit-bench: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moejit-bench: error: %s\n", e.what());
    return 1;
  }
}
