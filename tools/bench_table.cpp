// moejit-bench: the aligned table on stdout. Columns depend on what the run measures (dedup arms,
// --hot, --peer); rows stream as cases finish; layers, notes and repro lines follow the table.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_report.h"

namespace moejit_bench {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string numbered(int index, const std::string& text) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "#%-3d ", index);
  return buf + text;
}

std::string num(double v, const char* f) { return std::isfinite(v) ? strf(f, v) : "-"; }
std::string us(const std::optional<CaseResult>& r) {
  return r && r->ok() ? strf("%.1f", r->median_s * 1e6) : "-";
}
std::string gbps(const std::optional<CaseResult>& r) {
  return r && r->ok() ? strf("%.1f", r->weight_gbps) : "-";
}

struct Column {
  std::string header;
  int width;
  bool left;
  std::function<std::string(const CaseRow&, const Derived&)> value;
};

class TableReporter : public Reporter {
 public:
  void begin(const MachineInfo& m, const RunInfo& run) override {
    run_ = run;
    l3_ = m.l3_bytes;
    std::printf("moejit-bench: libmoejit %s, %s, host isa %s, %d CPUs, L3 %.0f MiB", m.version.c_str(),
                m.cpu_model.c_str(), moejit_isa_name(m.host_isa), m.cpus, double(m.l3_bytes) / kMiB);
    if (m.l3_given) std::printf(" (--l3-bytes; detected %.0f MiB)", double(m.l3_detected_bytes) / kMiB);
    std::printf(
        "\nDRAM read bandwidth (%.0f MiB buffer, %s on 2 MiB pages; ", double(m.dram_buffer_bytes) / kMiB,
        m.dram_huge_page_bytes < 0
            ? "unknown share"
            : strf("%.0f%%", 100.0 * double(m.dram_huge_page_bytes) / double(m.dram_buffer_bytes)).c_str());
    if (m.dram_forced)
      std::printf("read variant %s (--read-variant)",
                  m.dram_variants.empty() ? "?" : m.dram_variants[0].c_str());
    else
      std::printf("per thread count the fastest of %zu read variants", m.dram_variants.size());
    std::printf(
        ", median of %d passes each, interleaved; each case has its own: one pass of that variant between "
        "its "
        "rounds):",
        m.dram_passes);
    for (size_t i = 0; i < m.dram_choice.size(); ++i) {
      const ProbeChoice& c = m.dram_choice[i];
      std::printf("%s %d thread%s %.1f GB/s (%s; %s %.1f)", i ? "," : "", c.threads,
                  c.threads == 1 ? "" : "s", c.gbps, c.variant.name().c_str(), kPlainRead.name().c_str(),
                  c.plain_gbps);
    }
    std::printf("\nlayer: %s%s\n", run.preset.empty() ? "" : (run.preset + ": ").c_str(),
                describe(run.geometry).c_str());
    std::printf("routing: %s", routing_label(run.routing));
    if (run.routing == RoutingKind::skewed) std::printf(" (Zipf s=%g)", run.zipf_s);
    std::printf(", dedup %s%s%s\n", dedup_label(run.dedup), run.hot ? ", hot layer" : "",
                run.peer == PeerKind::onednn ? ", peer oneDNN" : "");
    if (!run.baseline_path.empty())
      std::printf("baseline: moejit %s from %s, in this process beside moejit %s\n",
                  run.baseline_version.c_str(), run.baseline_path.c_str(), m.version.c_str());
    if (!m.dedup_env.empty())
      std::printf("note: MOEJIT_DEDUP=%s in the environment%s\n", m.dedup_env.c_str(),
                  m.dedup_env == "0" ? ": every context runs without dedup, the 'on' arm included" : "");
    if (!m.tiles_env.empty())
      std::printf(
          "note: MOEJIT_TILES=%s in the environment: avx512_amx contexts run tile kernels for every format\n",
          m.tiles_env.c_str());
    if (run.peer == PeerKind::onednn)
      std::printf("note: oneDNN runs on OpenMP threads, OMP_WAIT_POLICY=%s\n",
                  m.omp_wait_policy.empty()
                      ? "unset (libgomp spins at barriers: on a shared machine set OMP_WAIT_POLICY=passive)"
                      : m.omp_wait_policy.c_str());
    build_columns();
    std::printf("\n");
    for (const Column& c : columns_) print_cell(c, c.header);
    std::printf("\n");
    std::fflush(stdout);
  }

  void layer(const LayerInfo& l) override { layers_.push_back(l); }

  void row(const CaseRow& r) override {
    const CaseResult& p = r.primary();
    const Derived d = derive(r);
    for (size_t i = 0; i < columns_.size(); ++i) {
      if (!p.ok() && i >= fixed_) {  // the status replaces the measurements
        std::printf(" %s", status_label(p.status));
        notes_.push_back(numbered(r.index, p.message));
        break;
      }
      print_cell(columns_[i], columns_[i].value(r, d));
    }
    std::printf("\n");
    for (const std::string& w : row_warnings(r, l3_)) notes_.push_back(numbered(r.index, w));
    if (p.status != CaseStatus::skipped) repros_.push_back(numbered(r.index, r.repro));
    std::fflush(stdout);
  }

  void end() override {
    std::printf("\n%s", legend().c_str());
    for (const LayerInfo& l : layers_) {
      const double l3x = l3_ > 0 ? double(l.pool_bytes) / double(l3_) : 0.0;
      std::printf(
          "layer %-11s %.4f B/weight, %.2f MiB/expert, %.2f GB for its %d experts; cold pool %d slots, %.2f "
          "GB "
          "(%.1fx L3%s), %s on 2 MiB pages; generated in %.1f s\n",
          format_label(l.format), l.bytes_per_weight, double(l.expert_bytes) / kMiB,
          double(l.total_bytes) / 1e9, run_.geometry.experts, l.pool_slots, double(l.pool_bytes) / 1e9, l3x,
          l3x > 0 && l3x < kPoolL3Multiple ? ": experts may stay cached" : "",
          l.huge_page_bytes < 0 || l.pool_bytes <= 0
              ? "unknown share"
              : strf("%.0f%%", std::min(100.0, 100.0 * double(l.huge_page_bytes) / double(l.pool_bytes)))
                    .c_str(),
          l.generate_seconds);
      if (is_mix(l.format)) {
        const ProjFormats p = proj_formats(l.format);
        const bool fused = !layer_geometry(l.format, run_.geometry).separate;
        std::printf("      %s: gate %s, up %s, down %s, %s\n", format_label(l.format), format_label(p.gate),
                    format_label(p.up), format_label(p.down),
                    fused ? "gate_up fused (--layout fused)" : "separate gate and up banks");
      }
      if (!l.peer_note.empty()) std::printf("      %s: %s\n", l.peer_label.c_str(), l.peer_note.c_str());
    }
    if (!notes_.empty()) std::printf("\nnotes:\n");
    for (const std::string& n : notes_) std::printf("  %s\n", n.c_str());
    if (!repros_.empty()) std::printf("\nrepro:\n");
    for (const std::string& r : repros_) std::printf("  %s\n", r.c_str());
    std::fflush(stdout);
  }

 private:
  void print_cell(const Column& c, const std::string& v) {
    if (&c == &columns_.front()) {
      std::printf("%*s", c.width, v.c_str());
    } else {
      std::printf(c.left ? " %-*s" : " %*s", c.width, v.c_str());
    }
  }

  void add(const char* header, int width, bool left,
           std::function<std::string(const CaseRow&, const Derived&)> value) {
    columns_.push_back({header, width, left, std::move(value)});
  }

  void build_columns() {
    add("#", 3, false, [](const CaseRow& r, const Derived&) { return std::to_string(r.index); });
    add("format", 11, true, [](const CaseRow& r, const Derived&) { return format_label(r.spec.format); });
    add("B/w", 6, false,
        [](const CaseRow& r, const Derived&) { return strf("%.4f", r.layer.bytes_per_weight); });
    add("tokens", 6, false, [](const CaseRow& r, const Derived&) { return std::to_string(r.spec.tokens); });
    add("threads", 7, false, [](const CaseRow& r, const Derived&) { return std::to_string(r.spec.threads); });
    add("isa", 11, true, [](const CaseRow& r, const Derived&) { return moejit_isa_name(r.primary().isa); });
    fixed_ = columns_.size();
    add("experts", 7, false,
        [](const CaseRow& r, const Derived&) { return strf("%.1f", r.primary().distinct_per_call); });
    const bool both = run_.dedup == DedupMode::both;
    if (both || run_.routing != RoutingKind::uniform)
      add("reuse", 6, false, [](const CaseRow&, const Derived& d) { return num(d.reuse, "%.2f"); });
    if (both) {
      add("on us", 9, false, [](const CaseRow& r, const Derived&) { return us(r.on); });
      add("on GB/s", 7, false, [](const CaseRow& r, const Derived&) { return gbps(r.on); });
      add("off us", 9, false, [](const CaseRow& r, const Derived&) { return us(r.off); });
      add("off GB/s", 8, false, [](const CaseRow& r, const Derived&) { return gbps(r.off); });
      add("x meas", 6, false,
          [](const CaseRow&, const Derived& d) { return num(d.measured_speedup, "%.2f"); });
      add("x model", 7, false, [](const CaseRow&, const Derived& d) { return num(d.model_speedup, "%.2f"); });
    } else {
      add("median us", 10, false,
          [](const CaseRow& r, const Derived&) { return strf("%.1f", r.primary().median_s * 1e6); });
      add("min us", 10, false,
          [](const CaseRow& r, const Derived&) { return strf("%.1f", r.primary().min_s * 1e6); });
      add("GB/s", 7, false,
          [](const CaseRow& r, const Derived&) { return strf("%.1f", r.primary().weight_gbps); });
    }
    add("DRAM GB/s", 9, false, [](const CaseRow& r, const Derived&) { return strf("%.1f", r.dram_gbps); });
    add("of DRAM", 7, false,
        [](const CaseRow&, const Derived& d) { return num(100.0 * d.dram_ratio, "%.1f%%"); });
    if (run_.hot) {
      add("DRAM us", 9, false,
          [](const CaseRow&, const Derived& d) { return num(d.stream_s * 1e6, "%.1f"); });
      add("hot us", 9, false, [](const CaseRow&, const Derived& d) { return num(d.hot_s * 1e6, "%.1f"); });
      add("of bound", 8, false, [](const CaseRow&, const Derived& d) { return num(d.bound_ratio, "%.2fx"); });
    }
    if (!run_.baseline_path.empty()) {
      add("base us", 10, false, [](const CaseRow& r, const Derived&) {
        return r.base && !r.base->ok() ? std::string(status_label(r.base->status)) : us(r.base);
      });
      add("base GB/s", 9, false, [](const CaseRow& r, const Derived&) { return gbps(r.base); });
      add("x base", 7, false, [](const CaseRow&, const Derived& d) { return num(d.base_speedup, "%.3f"); });
    }
    if (run_.peer == PeerKind::onednn) {
      add("onednn us", 10, false, [](const CaseRow& r, const Derived&) {
        return r.peer && !r.peer->ok() ? std::string(status_label(r.peer->status)) : us(r.peer);
      });
      add("onednn GB/s", 11, false, [](const CaseRow& r, const Derived&) { return gbps(r.peer); });
      add("moejit x", 8, false, [](const CaseRow&, const Derived& d) { return num(d.peer_speedup, "%.2f"); });
    }
  }

  std::string legend() const {
    const char* arm = run_.dedup == DedupMode::off ? "dedup off" : "dedup on";
    std::string s =
        "experts = distinct experts per call (mean); GB/s = their weight+scale bytes / time per call (median "
        "over calls; the same bytes for every arm, so GB/s ratios are speedups)\n"
        "cold pool = the expert slots the calls cycle through: each call's distinct experts take the next "
        "slots of a ring over them, so every expert a call reads was last read a whole pool (>= " +
        std::to_string(kPoolL3Multiple) + "x L3) ago\n";
    if (run_.dedup == DedupMode::both || run_.routing != RoutingKind::uniform)
      s += "reuse = routes / distinct experts per call\n";
    if (run_.dedup == DedupMode::both)
      s += "on/off = with and without dedup (MOEJIT_CONTEXT_NO_DEDUP), interleaved in time; x meas = on GB/s "
           "/ off "
           "GB/s; x model = traffic model 1 / (2/3 / reuse + 1/3)\n";
    if (run_.hot)
      s += std::string("bound (") + arm +
           ") = max(DRAM us, hot us): DRAM us = bytes the plan streamed per call / DRAM GB/s, hot us = the "
           "same calls with every expert id backed by one expert's memory (cached); of bound = median us / "
           "bound\n";
    if (!run_.baseline_path.empty())
      s += std::string("base = the --baseline library (") + run_.baseline_version + ", " +
           run_.baseline_path + ") on the same layer and routing, dedup as the " + arm +
           " arm, interleaved in time with it; x base = this build's GB/s / base GB/s\n";
    if (run_.peer == PeerKind::onednn)
      s += std::string(
               "onednn = the same routing and tokens through oneDNN matmuls per distinct expert; "
               "moejit x = moejit GB/s (") +
           arm + ") / onednn GB/s\n";
    return s;
  }

  RunInfo run_;
  int64_t l3_ = 0;
  std::vector<Column> columns_;
  size_t fixed_ = 0;  // columns printed even when the case did not run
  std::vector<LayerInfo> layers_;
  std::vector<std::string> notes_, repros_;
};

}  // namespace

std::unique_ptr<Reporter> make_table_reporter() { return std::make_unique<TableReporter>(); }

}  // namespace moejit_bench
