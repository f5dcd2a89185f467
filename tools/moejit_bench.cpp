// moejit-bench: times moejit MoE layers with cold experts and compares the weight bandwidth they
// reach with the DRAM read bandwidth measured in the same run. `moejit-bench --help` for options.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
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

constexpr double kMiB = 1024.0 * 1024.0;

// Bytes of the probe's buffer: 1 GiB, or kPoolL3Multiple x the L3 when that is more (a cyclic
// read of a buffer not much larger than the L3 finds some of it cached), in 2 MiB pages.
size_t probe_bytes(int64_t l3_bytes) {
  const size_t want =
      std::max(size_t(1) << 30, size_t(kPoolL3Multiple) * size_t(std::max<int64_t>(0, l3_bytes)));
  constexpr size_t kPage = size_t(2) << 20;
  return (want + kPage - 1) / kPage * kPage;
}

// DRAM read-bandwidth probe: one buffer kept for the whole run. Per thread count it picks, once,
// the fastest of the start-up read variants (bench_util.h; the median of kPasses passes each, the
// variants interleaved), or the --read-variant given; that figure is the header's. One pass of
// the picked variant runs after every round of a case's interleaved arms (that case's reference:
// the median of those passes). A VM's bandwidth drifts with the host's load, so the reference is
// taken during the measurement, not before or after it.
class DramProbe {
 public:
  static constexpr int kPasses = 5;
  explicit DramProbe(const Config& c)
      : buffer_(probe_bytes(c.l3_bytes)), forced_(c.read_forced), variant_(c.read_variant) {
    fill_words(buffer_.data(), buffer_.size(), c.seed, [](uint64_t w) { return w; });
  }
  const Buffer& buffer() const { return buffer_; }
  bool forced() const { return forced_; }
  std::vector<ReadVariant> candidates() const {
    return forced_ ? std::vector<ReadVariant>{variant_} : startup_read_variants();
  }

  const ProbeChoice& choose(int threads) {
    ProbeChoice& c = choice_[threads];
    if (c.threads) return c;
    std::vector<ReadVariant> set = candidates();
    const bool has_plain = std::find(set.begin(), set.end(), kPlainRead) != set.end();
    if (!has_plain) set.push_back(kPlainRead);  // for the comparison only: never picked
    const std::vector<double> gbps = measure_read_variants(buffer_, threads, kPasses, set);
    const size_t pickable = has_plain ? set.size() : set.size() - 1;
    const size_t best = size_t(std::max_element(gbps.begin(), gbps.begin() + long(pickable)) - gbps.begin());
    c.threads = threads;
    c.variant = set[best];
    c.gbps = gbps[best];
    c.plain_gbps = gbps[size_t(std::find(set.begin(), set.end(), kPlainRead) - set.begin())];
    return c;
  }
  // The variant picked for `threads` (choose() first), and one pass of it.
  const ReadVariant& variant(int threads) const { return choice_.at(threads).variant; }
  double pass(int threads) const { return measure_read_bandwidth(buffer_, threads, 1, variant(threads)); }

 private:
  Buffer buffer_;
  bool forced_;
  ReadVariant variant_;
  std::map<int, ProbeChoice> choice_;
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

MachineInfo describe_machine(const Config& c, DramProbe& dram) {
  MachineInfo m;
  m.version = moejit_version();
  m.cpu_model = cpu_model_name();
  m.host_isa = moejit_host_isa();
  m.cpus = int(affinity_cpus().size());
  m.l3_bytes = c.l3_bytes;
  m.l3_detected_bytes = l3_cache_bytes();
  m.l3_given = c.l3_given;
  m.dram_buffer_bytes = int64_t(dram.buffer().size());
  m.dram_huge_page_bytes = dram.buffer().huge_page_bytes();
  m.dram_passes = DramProbe::kPasses;
  m.dram_forced = dram.forced();
  for (const ReadVariant& v : dram.candidates()) m.dram_variants.push_back(v.name());
  for (int32_t t : std::set<int32_t>(c.threads.begin(), c.threads.end())) {
    const ProbeChoice& choice = dram.choose(t);
    m.dram_choice.push_back(choice);
    m.dram_gbps.emplace_back(t, choice.gbps);
  }
  if (const char* env = std::getenv("MOEJIT_DEDUP"); env && *env) m.dedup_env = env;
  if (const char* env = std::getenv("MOEJIT_TILES"); env && *env) m.tiles_env = env;
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
    if (c.baseline) row.base = r;
  }

  void run_row(CaseRow& row, const Layer& layer, const Layer* hot, const Routing& routing,
               std::map<std::pair<int32_t, int32_t>, CaseResult>& peer_cache) {
    const CpuSample before = sample_cpu();
    std::vector<Arm> arms_of;
    if (c.dedup != DedupMode::off) arms_of.push_back({true, nullptr});
    if (c.dedup != DedupMode::on) arms_of.push_back({false, nullptr});
    // The baseline library runs the primary arm's dedup, interleaved with the others.
    if (c.baseline) arms_of.push_back({arms_of.front().dedup, c.baseline.get()});
    progress.step(c.dedup == DedupMode::both ? "dedup on and off, interleaved with the DRAM probe"
                                             : "interleaved with the DRAM probe");
    std::vector<double> passes;  // one DRAM read pass after every round of the arms
    const std::vector<CaseResult> arms =
        run_arms(layer, arms_of, routing, row.spec, [&] { passes.push_back(dram.pass(row.spec.threads)); });
    for (size_t i = 0; i < arms.size(); ++i)
      (arms_of[i].api ? row.base : arms_of[i].dedup ? row.on : row.off) = arms[i];
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
    row.dram_variant = dram.variant(row.spec.threads).name();
    if (row.primary().ok()) row.dram_gbps = median(passes);
  }

  // Generates the format's layer (and the --hot one) and runs its cases.
  void run_format(FormatChoice f) {
    LayerInfo info;
    info.format = f;
    info.bytes_per_weight = bytes_per_weight(f, c.geometry);
    info.expert_bytes = expert_bytes(f, c.geometry);
    info.total_bytes = info.expert_bytes * c.geometry.experts;
    info.pool_slots = cold_pool_slots(f, c.geometry, c.l3_bytes);
    info.pool_bytes = info.expert_bytes * info.pool_slots;
    const std::string what = std::string(format_label(f));
    progress.set_case(index, what);
    progress.step("generating " + strf("%.2f", double(info.pool_bytes) / 1e9) + " GB of weights");
    const auto t0 = Clock::now();
    const Layer layer(f, c.geometry, c.seed, 0, info.pool_slots);
    info.generate_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    info.huge_page_bytes = layer.huge_page_bytes();
    std::unique_ptr<Layer> hot;
    if (c.hot) {
      hot = std::make_unique<Layer>(f, c.geometry, c.seed, 1, info.pool_slots);
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
  progress.step("measuring the DRAM read bandwidth (picking the fastest read variant)");
  DramProbe dram(c);
  FanOut out;
  out.add(make_reporter(c.output));
  if (!c.plot_path.empty()) out.add(make_plot_reporter(c.plot_path));
  if (!c.profile_path.empty())
    out.add(make_profile_reporter({c.profile_path, c.pcie_gbs, c.miss_rate, c.gpu_gbps, c.gpu_fetch_gbps,
                                   c.cpu_overhead_s, c.gpu_call_s, c.fetch_chunk_experts, c.dram_gbs}));
  RunInfo run;
  run.geometry = c.geometry;
  run.preset = c.preset;
  run.dedup = c.dedup;
  run.hot = c.hot;
  run.peer = c.peer;
  if (c.baseline) {
    run.baseline_path = c.baseline->path;
    run.baseline_version = c.baseline->version_string;
  }
  run.routing = c.routing;
  run.zipf_s = c.zipf_s;
  const MachineInfo machine = describe_machine(c, dram);
  progress.clear();
  out.begin(machine, run);
  Runner runner{c, dram, out, progress};
  for (FormatChoice f : c.formats) runner.run_format(f);
  progress.clear();
  out.end();
  return runner.errors;
}

// --probe: every variant of all_read_variants() per thread count, interleaved, then the best and
// the start-up pick, and the plain and best variants again over the buffer on 2 MiB pages and one
// on 4 KiB pages, in turn pass by pass.
int run_probe(const Config& c) {
  const std::vector<ReadVariant> variants = all_read_variants();
  const std::vector<ReadVariant> startup = startup_read_variants();
  const auto in_startup = [&](size_t v) {
    return std::find(startup.begin(), startup.end(), variants[v]) != startup.end();
  };
  const size_t plain = size_t(std::find(variants.begin(), variants.end(), kPlainRead) - variants.begin());
  Progress progress(int(c.threads.size()), c.progress);
  progress.set_case(0, "start");
  progress.step("filling the buffers");
  const size_t bytes = probe_bytes(c.l3_bytes);
  Buffer huge(bytes), small(bytes, false);
  fill_words(huge.data(), huge.size(), c.seed, [](uint64_t w) { return w; });
  fill_words(small.data(), small.size(), c.seed, [](uint64_t w) { return w; });
  const int64_t huge_bytes = huge.huge_page_bytes(), small_huge_bytes = small.huge_page_bytes();
  std::vector<std::vector<double>> gbps;   // [thread count][variant]
  std::vector<size_t> best, startup_best;  // per thread count: index into variants
  // Per thread count: plain and best on 2 MiB pages, then on 4 KiB pages, the buffers in turn.
  struct Pages {
    double huge_plain, huge_best, small_plain, small_best;
  };
  std::vector<Pages> pages;
  for (size_t i = 0; i < c.threads.size(); ++i) {
    const int t = c.threads[i];
    progress.set_case(int(i), std::to_string(t) + " thread" + (t == 1 ? "" : "s"));
    progress.step(std::to_string(variants.size()) + " variants x " + std::to_string(c.probe_passes) +
                  " passes");
    gbps.push_back(measure_read_variants(huge, t, c.probe_passes, variants));
    const std::vector<double>& g = gbps.back();
    best.push_back(size_t(std::max_element(g.begin(), g.end()) - g.begin()));
    size_t sb = plain;
    for (size_t v = 0; v < variants.size(); ++v)
      if (in_startup(v) && g[v] > g[sb]) sb = v;
    startup_best.push_back(sb);
    progress.step("2 MiB against 4 KiB pages");
    std::vector<double> hp, hb, sp, sb4;
    for (int pass = 0; pass < c.probe_passes; ++pass) {
      const std::vector<double> h = measure_read_variants(huge, t, 1, {kPlainRead, variants[best.back()]});
      const std::vector<double> s = measure_read_variants(small, t, 1, {kPlainRead, variants[best.back()]});
      hp.push_back(h[0]), hb.push_back(h[1]), sp.push_back(s[0]), sb4.push_back(s[1]);
    }
    pages.push_back({median(hp), median(hb), median(sp), median(sb4)});
  }
  progress.clear();
  const auto share = [&](int64_t b) {
    return b < 0 ? std::string("unknown") : strf("%.0f%%", 100.0 * double(b) / double(bytes));
  };
  if (c.output == OutputMode::json) {
    using Json = nlohmann::ordered_json;
    Json doc = {{"cpu_model", cpu_model_name()},
                {"cpus", int(affinity_cpus().size())},
                {"l3_bytes", c.l3_bytes},
                {"l3_detected_bytes", l3_cache_bytes()},
                {"buffer_bytes", bytes},
                {"huge_page_bytes", huge_bytes},
                {"small_pages_huge_page_bytes", small_huge_bytes},
                {"passes", c.probe_passes},
                {"threads", c.threads}};
    Json vs = Json::array();
    for (size_t v = 0; v < variants.size(); ++v) {
      Json row = Json::array();
      for (size_t i = 0; i < c.threads.size(); ++i) row.push_back(gbps[i][v]);
      vs.push_back({{"variant", variants[v].name()}, {"startup", in_startup(v)}, {"gbps", row}});
    }
    doc["variants"] = vs;
    Json per = Json::array();
    for (size_t i = 0; i < c.threads.size(); ++i)
      per.push_back({{"threads", c.threads[i]},
                     {"best", variants[best[i]].name()},
                     {"best_gbps", gbps[i][best[i]]},
                     {"startup_pick", variants[startup_best[i]].name()},
                     {"startup_pick_gbps", gbps[i][startup_best[i]]},
                     {"plain_gbps", gbps[i][plain]},
                     {"pages",
                      {{"huge_plain_gbps", pages[i].huge_plain},
                       {"huge_best_gbps", pages[i].huge_best},
                       {"small_plain_gbps", pages[i].small_plain},
                       {"small_best_gbps", pages[i].small_best}}}});
    doc["per_threads"] = per;
    std::printf("%s\n", doc.dump(2).c_str());
    return 0;
  }
  std::printf("moejit-bench --probe: %s, %zu CPUs, L3 %.0f MiB%s\n", cpu_model_name().c_str(),
              affinity_cpus().size(), double(c.l3_bytes) / kMiB, c.l3_given ? " (--l3-bytes)" : "");
  std::printf(
      "buffer %.0f MiB, %s on 2 MiB pages (the 4 KiB-page buffer: %s); GB/s, median of %d passes, the "
      "variants interleaved\n",
      double(bytes) / kMiB, share(huge_bytes).c_str(), share(small_huge_bytes).c_str(), c.probe_passes);
  std::printf("* = in the start-up set moejit-bench picks from; the best of each column is marked <\n\n");
  std::printf("  %-22s", "variant");
  for (int t : c.threads) std::printf(" %7s", (std::to_string(t) + "T").c_str());
  std::printf("\n");
  for (size_t v = 0; v < variants.size(); ++v) {
    std::printf("%c %-22s", in_startup(v) ? '*' : ' ', variants[v].name().c_str());
    for (size_t i = 0; i < c.threads.size(); ++i)
      std::printf(" %6.1f%c", gbps[i][v], best[i] == v ? '<' : ' ');
    std::printf("\n");
  }
  std::printf("\n");
  for (size_t i = 0; i < c.threads.size(); ++i)
    std::printf(
        "%2d thread%s best %s %.1f GB/s; start-up pick %s %.1f (%.1f%% of best); plain %.1f (%.1f%%); "
        "2 MiB / 4 KiB pages, in turn: plain %.1f / %.1f, best %.1f / %.1f\n",
        c.threads[i], c.threads[i] == 1 ? ": " : "s:", variants[best[i]].name().c_str(), gbps[i][best[i]],
        variants[startup_best[i]].name().c_str(), gbps[i][startup_best[i]],
        100.0 * gbps[i][startup_best[i]] / gbps[i][best[i]], gbps[i][plain],
        100.0 * gbps[i][plain] / gbps[i][best[i]], pages[i].huge_plain, pages[i].small_plain,
        pages[i].huge_best, pages[i].small_best);
  return 0;
}

void check_memory(const Config& c) {
  int64_t largest = 0, largest_model = 0;
  for (FormatChoice f : c.formats) {
    largest = std::max(largest, expert_bytes(f, c.geometry) * cold_pool_slots(f, c.geometry, c.l3_bytes));
    largest_model = std::max(largest_model, expert_bytes(f, c.geometry) * c.geometry.experts);
  }
  const int64_t mem = physical_memory_bytes(), probe = int64_t(probe_bytes(c.l3_bytes));
  if (c.probe) {
    if (2 * probe > mem / 10 * 9)
      throw UsageError("--probe needs two buffers of " + std::to_string(probe >> 20) +
                       " MiB, the machine has " + std::to_string(mem >> 20) + " MiB");
    return;
  }
  if (largest + probe <= mem / 10 * 9) return;
  const std::string need = "need " + std::to_string((largest + probe) >> 20) + " MiB, the machine has " +
                           std::to_string(mem >> 20) + " MiB";
  if (largest > largest_model)
    throw UsageError("the cold expert pool (" + std::to_string(kPoolL3Multiple) + "x the L3 of " +
                     std::to_string(c.l3_bytes >> 20) + " MiB" + (c.l3_given ? ", --l3-bytes" : "") +
                     ") and the read probe's buffer " + need +
                     ": experts cannot be kept cold on this machine");
  throw UsageError("the largest layer and the " + std::to_string(probe >> 20) + " MiB bandwidth buffer " +
                   need + ": use fewer --experts");
}

}  // namespace
}  // namespace moejit_bench

int main(int argc, char** argv) {
  using namespace moejit_bench;
  Config config;
  if (const int rc = parse_command_line(argc, argv, &config); rc >= 0) return rc;
  try {
    check_memory(config);
    if (config.probe) return run_probe(config);
    return run_all(config) == 0 ? 0 : 1;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "moejit-bench: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moejit-bench: error: %s\n", e.what());
    return 1;
  }
}
