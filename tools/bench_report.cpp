#include "bench_report.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

namespace moejit_bench {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool usable(const std::optional<CaseResult>& r) { return r && r->ok(); }

// ---- CSV on stdout, one header line, one line per case ----
std::string csv_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string csv_num(double v, const char* f = "%.3f") { return std::isfinite(v) ? strf(f, v) : ""; }

class CsvReporter : public Reporter {
 public:
  void begin(const MachineInfo& m, const RunInfo& run) override {
    run_ = run;
    l3_ = m.l3_bytes;
    std::printf(
        "format,format_id,bytes_per_weight,hidden,intermediate,experts,top_k,routing,tokens,threads,isa_cap,"
        "isa,"
        "dedup,status,calls,median_us,min_us,mean_us,distinct_experts,routes,reuse,bytes_per_call,"
        "lib_bytes_per_call,weight_gbps,dram_gbps,dram_ratio,off_median_us,off_min_us,off_gbps,"
        "off_lib_bytes_per_call,speedup_measured,speedup_model,stream_us,hot_us,bound_us,bound_ratio,peer,"
        "peer_status,peer_median_us,peer_gbps,peer_speedup,foreign_cpus,message,repro,dram_variant,"
        "pool_slots,pool_bytes,pool_l3_multiple,base_status,base_median_us,base_gbps,base_speedup\n");
  }
  void layer(const LayerInfo&) override {}
  void row(const CaseRow& r) override {
    const CaseResult& p = r.primary();
    const Derived d = derive(r);
    const Geometry& g = run_.geometry;
    const bool both = r.on && r.off;
    const CaseResult* off = both && r.off->ok() ? &*r.off : nullptr;
    const CaseResult* ok = p.ok() ? &p : nullptr;
    const CaseResult* peer = usable(r.peer) ? &*r.peer : nullptr;
    const CaseResult* base = usable(r.base) ? &*r.base : nullptr;
    auto field = [](const CaseResult* res, double v, const char* f = "%.3f") {
      return res ? csv_num(v, f) : "";
    };
    std::string message = p.message;
    for (const std::string& w : row_warnings(r, l3_)) message += (message.empty() ? "" : "; ") + w;
    const std::string pool_l3 = l3_ > 0 ? strf("%.2f", double(r.layer.pool_bytes) / double(l3_)) : "";
    const std::vector<std::string> fields = {format_label(r.spec.format),
                                             std::to_string(is_mix(r.spec.format) ? -1 : int(r.spec.format)),
                                             strf("%.6f", r.layer.bytes_per_weight),
                                             std::to_string(g.hidden),
                                             std::to_string(g.intermediate),
                                             std::to_string(g.experts),
                                             std::to_string(g.top_k),
                                             routing_label(run_.routing),
                                             std::to_string(r.spec.tokens),
                                             std::to_string(r.spec.threads),
                                             moejit_isa_name(r.spec.max_isa),
                                             moejit_isa_name(p.isa),
                                             r.on ? "on" : "off",
                                             status_label(p.status),
                                             ok ? std::to_string(p.calls) : "",
                                             field(ok, p.median_s * 1e6),
                                             field(ok, p.min_s * 1e6),
                                             field(ok, p.mean_s * 1e6),
                                             field(ok, p.distinct_per_call),
                                             field(ok, p.routes_per_call, "%.0f"),
                                             field(ok, d.reuse, "%.4f"),
                                             field(ok, p.bytes_per_call, "%.0f"),
                                             field(ok, p.lib_bytes_per_call, "%.0f"),
                                             field(ok, p.weight_gbps),
                                             field(ok, r.dram_gbps),
                                             field(ok, d.dram_ratio, "%.4f"),
                                             field(off, off ? off->median_s * 1e6 : 0),
                                             field(off, off ? off->min_s * 1e6 : 0),
                                             field(off, off ? off->weight_gbps : 0),
                                             field(off, off ? off->lib_bytes_per_call : 0, "%.0f"),
                                             csv_num(d.measured_speedup, "%.4f"),
                                             csv_num(both ? d.model_speedup : kNaN, "%.4f"),
                                             csv_num(d.stream_s * 1e6),
                                             csv_num(d.hot_s * 1e6),
                                             csv_num(d.bound_s * 1e6),
                                             csv_num(d.bound_ratio, "%.4f"),
                                             r.peer ? r.peer_label : "",
                                             r.peer ? status_label(r.peer->status) : "",
                                             field(peer, peer ? peer->median_s * 1e6 : 0),
                                             field(peer, peer ? peer->weight_gbps : 0),
                                             csv_num(d.peer_speedup, "%.4f"),
                                             csv_num(r.foreign_cpus, "%.2f"),
                                             csv_quote(message),
                                             csv_quote(r.repro),
                                             csv_quote(r.dram_variant),
                                             std::to_string(r.layer.pool_slots),
                                             std::to_string(r.layer.pool_bytes),
                                             pool_l3,
                                             r.base ? status_label(r.base->status) : "",
                                             field(base, base ? base->median_s * 1e6 : 0),
                                             field(base, base ? base->weight_gbps : 0),
                                             csv_num(d.base_speedup, "%.4f")};
    std::string line;
    for (const std::string& f : fields) line += (line.empty() && &f == &fields.front() ? "" : ",") + f;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  void end() override {}

 private:
  RunInfo run_;
  int64_t l3_ = 0;
};

// ---- one JSON document on stdout at the end ----
using Json = nlohmann::ordered_json;

Json result_json(const CaseResult& res) {
  Json c = {
      {"status", status_label(res.status)}, {"isa", moejit_isa_name(res.isa)}, {"threads", res.threads}};
  if (!res.ok()) {
    c["message"] = res.message;
    return c;
  }
  c.update({{"calls", res.calls},
            {"median_us", res.median_s * 1e6},
            {"min_us", res.min_s * 1e6},
            {"mean_us", res.mean_s * 1e6},
            {"distinct_experts", res.distinct_per_call},
            {"routes", res.routes_per_call},
            {"bytes_per_call", res.bytes_per_call},
            {"weight_gbps", res.weight_gbps},
            {"nonfinite_outputs", res.nonfinite_outputs}});
  if (res.lib_bytes_per_call >= 0) c["lib_bytes_per_call"] = res.lib_bytes_per_call;
  if (res.lib_unique_per_call >= 0) c["lib_unique_experts_per_call"] = res.lib_unique_per_call;
  return c;
}

Json num_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

class JsonReporter : public Reporter {
 public:
  void begin(const MachineInfo& m, const RunInfo& run) override {
    l3_ = m.l3_bytes;
    Json dram = Json::array();
    for (const ProbeChoice& c : m.dram_choice)
      dram.push_back({{"threads", c.threads},
                      {"gbps", c.gbps},
                      {"variant", c.variant.name()},
                      {"plain_gbps", c.plain_gbps}});
    doc_["machine"] = {{"library_version", m.version},
                       {"cpu_model", m.cpu_model},
                       {"host_isa", moejit_isa_name(m.host_isa)},
                       {"cpus", m.cpus},
                       {"l3_bytes", m.l3_bytes},
                       {"l3_detected_bytes", m.l3_detected_bytes},
                       {"l3_given", m.l3_given},
                       {"dram_read",
                        {{"buffer_bytes", m.dram_buffer_bytes},
                         {"huge_page_bytes", m.dram_huge_page_bytes},
                         {"passes", m.dram_passes},
                         {"forced", m.dram_forced},
                         {"variants", m.dram_variants},
                         {"plain_variant", kPlainRead.name()},
                         {"bandwidth", dram}}}};
    const Geometry& g = run.geometry;
    doc_["layer"] = {{"preset", run.preset},
                     {"hidden", g.hidden},
                     {"intermediate", g.intermediate},
                     {"experts", g.experts},
                     {"top_k", g.top_k},
                     {"activation", activation_label(g.activation)},
                     {"swiglu_alpha", g.swiglu_alpha},
                     {"swiglu_limit", g.swiglu_limit},
                     {"gate_up_interleaved", g.interleaved},
                     {"layout", g.separate ? "separate" : "fused"},
                     {"bias", g.bias},
                     {"group_size", g.group_size},
                     {"scale_dtype", g.scale_dtype == MOEJIT_DTYPE_F32 ? "f32" : "bf16"},
                     {"output_dtype", g.output_dtype == MOEJIT_DTYPE_F32 ? "f32" : "bf16"}};
    doc_["run"] = {{"dedup", dedup_label(run.dedup)},
                   {"hot", run.hot},
                   {"peer", run.peer == PeerKind::onednn ? "onednn" : "none"},
                   {"routing", routing_label(run.routing)},
                   {"zipf_s", run.zipf_s}};
    if (run.peer == PeerKind::onednn) doc_["run"]["omp_wait_policy"] = m.omp_wait_policy;
    if (!run.baseline_path.empty())
      doc_["run"]["baseline"] = {{"path", run.baseline_path}, {"version", run.baseline_version}};
    if (!m.tiles_env.empty()) doc_["run"]["moejit_tiles"] = m.tiles_env;
    doc_["formats"] = Json::array();
    doc_["cases"] = Json::array();
  }
  void layer(const LayerInfo& l) override {
    Json j = {{"format", format_label(l.format)},
              {"bytes_per_weight", l.bytes_per_weight},
              {"expert_bytes", l.expert_bytes},
              {"layer_bytes", l.total_bytes},
              {"pool_slots", l.pool_slots},
              {"pool_bytes", l.pool_bytes},
              {"pool_l3_multiple", l3_ > 0 ? Json(double(l.pool_bytes) / double(l3_)) : Json(nullptr)},
              {"huge_page_bytes", l.huge_page_bytes},
              {"generate_seconds", l.generate_seconds}};
    if (l.hot_bytes) j["hot_bytes"] = l.hot_bytes;
    if (!l.peer_label.empty()) j["peer"] = {{"name", l.peer_label}, {"note", l.peer_note}};
    doc_["formats"].push_back(j);
  }
  void row(const CaseRow& r) override {
    const Derived d = derive(r);
    Json c = {{"index", r.index},
              {"format", format_label(r.spec.format)},
              {"bytes_per_weight", r.layer.bytes_per_weight},
              {"tokens", r.spec.tokens},
              {"threads", r.spec.threads},
              {"isa_cap", moejit_isa_name(r.spec.max_isa)},
              {"status", status_label(r.primary().status)},
              {"repro", r.repro}};
    if (r.on) c["dedup_on"] = result_json(*r.on);
    if (r.off) c["dedup_off"] = result_json(*r.off);
    if (r.hot) c["hot"] = result_json(*r.hot);
    if (r.peer) {
      c["peer"] = result_json(*r.peer);
      c["peer"]["name"] = r.peer_label;
    }
    if (r.base) c["baseline"] = result_json(*r.base);
    c["dram_gbps"] = r.dram_gbps;
    c["dram_variant"] = r.dram_variant;
    c["foreign_cpus"] = r.foreign_cpus;
    c["derived"] = {{"reuse", num_or_null(d.reuse)},
                    {"dram_ratio", num_or_null(d.dram_ratio)},
                    {"speedup_measured", num_or_null(d.measured_speedup)},
                    {"speedup_model", num_or_null(r.on && r.off ? d.model_speedup : kNaN)},
                    {"stream_us", num_or_null(d.stream_s * 1e6)},
                    {"hot_us", num_or_null(d.hot_s * 1e6)},
                    {"bound_us", num_or_null(d.bound_s * 1e6)},
                    {"bound_ratio", num_or_null(d.bound_ratio)},
                    {"peer_speedup", num_or_null(d.peer_speedup)},
                    {"base_speedup", num_or_null(d.base_speedup)}};
    Json warnings = Json::array();
    for (const std::string& w : row_warnings(r, l3_)) warnings.push_back(w);
    if (!warnings.empty()) c["warnings"] = warnings;
    doc_["cases"].push_back(c);
  }
  void end() override { std::cout << doc_.dump(2) << std::endl; }

 private:
  Json doc_;
  int64_t l3_ = 0;
};

const char* const kActivations[] = {"silu", "gelu", "gelu_tanh", "swiglu_oai", "swiglu_clamp"};

}  // namespace

std::string strf(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

Derived derive(const CaseRow& r) {
  Derived d;
  const CaseResult& p = r.primary();
  const bool ok = p.ok();
  d.reuse = ok && p.distinct_per_call > 0 ? p.routes_per_call / p.distinct_per_call : kNaN;
  d.model_speedup = std::isfinite(d.reuse) ? 1.0 / (2.0 / 3.0 / d.reuse + 1.0 / 3.0) : kNaN;
  // Ratios of GB/s, not of times: arms walk the routing pool from different offsets, so the
  // distinct experts of their calls differ slightly; GB/s normalises each call by its bytes.
  d.measured_speedup = usable(r.on) && usable(r.off) ? r.on->weight_gbps / r.off->weight_gbps : kNaN;
  const double streamed = p.lib_bytes_per_call >= 0 ? p.lib_bytes_per_call : p.bytes_per_call;
  d.stream_s = ok && r.dram_gbps > 0 ? streamed / (r.dram_gbps * 1e9) : kNaN;
  d.hot_s = ok && usable(r.hot) ? r.hot->median_s : kNaN;
  d.bound_s = std::isfinite(d.stream_s) && std::isfinite(d.hot_s) ? std::max(d.stream_s, d.hot_s) : kNaN;
  d.bound_ratio = std::isfinite(d.bound_s) ? p.median_s / d.bound_s : kNaN;
  d.peer_speedup = ok && usable(r.peer) ? p.weight_gbps / r.peer->weight_gbps : kNaN;
  d.base_speedup = ok && usable(r.base) ? p.weight_gbps / r.base->weight_gbps : kNaN;
  d.dram_ratio = ok && r.dram_gbps > 0 ? p.weight_gbps / r.dram_gbps : kNaN;
  return d;
}

std::unique_ptr<Reporter> make_reporter(OutputMode mode) {
  switch (mode) {
    case OutputMode::csv: return std::make_unique<CsvReporter>();
    case OutputMode::json: return std::make_unique<JsonReporter>();
    case OutputMode::table: break;
  }
  return make_table_reporter();
}

const char* activation_label(moejit_activation a) {
  return int(a) >= 0 && int(a) < 5 ? kActivations[int(a)] : "unknown";
}

bool parse_activation(const std::string& name, moejit_activation* out) {
  for (int i = 0; i < 5; ++i)
    if (name == kActivations[i]) return *out = moejit_activation(i), true;
  return false;
}

bool parse_isa(const std::string& name, moejit_isa* out) {
  if (name == "auto") return *out = MOEJIT_ISA_AUTO, true;
  for (moejit_isa i : api_tiers())
    if (name == moejit_isa_name(i)) return *out = i, true;
  return false;
}

std::vector<moejit_isa> api_tiers() {
  // The library names every tier it has (and "unknown" past them).
  std::vector<moejit_isa> r;
  for (int i = MOEJIT_ISA_SCALAR; std::string(moejit_isa_name(moejit_isa(i))) != "unknown"; ++i)
    r.push_back(moejit_isa(i));
  return r;
}

std::string api_tier_names() {
  std::string s;
  for (moejit_isa i : api_tiers()) s += std::string(", ") + moejit_isa_name(i);
  return s;
}

const char* dedup_label(DedupMode d) {
  switch (d) {
    case DedupMode::on: return "on";
    case DedupMode::off: return "off";
    case DedupMode::both: return "both";
  }
  return "?";
}

std::string describe(const Geometry& g) {
  std::string s = "H=" + std::to_string(g.hidden) + " I=" + std::to_string(g.intermediate) +
                  " E=" + std::to_string(g.experts) + " top_k=" + std::to_string(g.top_k) + " " +
                  activation_label(g.activation);
  if (g.swiglu_alpha != 0.0f) s += " alpha=" + strf("%g", g.swiglu_alpha);
  if (g.swiglu_limit != 0.0f) s += " limit=" + strf("%g", g.swiglu_limit);
  s += g.separate      ? ", gate and up separate"
       : g.interleaved ? ", gate_up interleaved"
                       : ", gate_up concatenated";
  s += g.bias ? ", biases" : ", no bias";
  if (g.group_size) s += ", mxfp8 group " + std::to_string(g.group_size);
  if (g.scale_dtype == MOEJIT_DTYPE_F32) s += ", fp8_block f32 scales";
  s += g.output_dtype == MOEJIT_DTYPE_F32 ? ", f32 output" : ", bf16 output";
  return s;
}

namespace {

void arm_warnings(const CaseRow& r, const CaseResult& res, bool dedup, std::vector<std::string>* w) {
  const std::string arm = r.on && r.off ? (dedup ? "dedup on: " : "dedup off: ") : "";
  if (res.threads != r.spec.threads)
    w->push_back(arm + "context runs " + std::to_string(res.threads) + " threads, asked for " +
                 std::to_string(r.spec.threads));
  if (r.spec.max_isa != MOEJIT_ISA_AUTO && res.isa != r.spec.max_isa) {
    const char* env = std::getenv("MOEJIT_MAX_ISA");
    w->push_back(arm + "context runs tier " + moejit_isa_name(res.isa) + ", asked for " +
                 moejit_isa_name(r.spec.max_isa) +
                 (env && *env ? std::string(" (MOEJIT_MAX_ISA=") + env + " caps it)" : std::string()));
  }
  const double expert = double(r.layer.expert_bytes);
  const double expected = (dedup ? res.distinct_per_call : res.routes_per_call) * expert;
  if (res.lib_bytes_per_call < 0) {
    w->push_back(arm + "moejit_moe_stats: call count does not match the timed calls");
  } else if (std::fabs(res.lib_bytes_per_call - expected) > 0.005 * expected) {
    std::string s = arm + "moejit_moe_stats: the plan streams " + strf("%.0f", res.lib_bytes_per_call) +
                    " weight bytes per call, expected " + strf("%.0f", expected) + " (" +
                    (dedup ? "distinct experts" : "one expert per route") +
                    strf(", %.2fx)", res.lib_bytes_per_call / expected);
    const double per_route = res.routes_per_call * expert;
    if (dedup && std::fabs(res.lib_bytes_per_call - per_route) < 0.005 * per_route)
      s += ": dedup is off (MOEJIT_DEDUP=0 in the environment?)";
    w->push_back(s);
  }
  if (res.nonfinite_outputs > 0)
    w->push_back(arm + std::to_string(res.nonfinite_outputs) + " non-finite values in the output");
}

}  // namespace

std::vector<std::string> row_warnings(const CaseRow& r, int64_t l3_bytes) {
  std::vector<std::string> w;
  if (usable(r.on)) arm_warnings(r, *r.on, true, &w);
  if (usable(r.off)) arm_warnings(r, *r.off, false, &w);
  if (r.on && r.off && r.on->ok() != r.off->ok()) {
    const CaseResult& bad = r.on->ok() ? *r.off : *r.on;
    w.push_back(std::string(r.on->ok() ? "dedup off: " : "dedup on: ") + status_label(bad.status) + ": " +
                bad.message);
  }
  if (r.hot && !r.hot->ok()) w.push_back("hot: " + r.hot->message);
  if (usable(r.hot) && l3_bytes > 0 && r.layer.hot_bytes > l3_bytes * 3 / 4)
    w.push_back("hot working set " + strf("%.1f MiB", double(r.layer.hot_bytes) / 1048576.0) +
                " (one expert) does not fit in the L3 of " + strf("%.0f MiB", double(l3_bytes) / 1048576.0) +
                ": 'hot' still streams from DRAM, not a compute floor");
  if (r.peer && !r.peer->ok())
    w.push_back(r.peer_label + ": " + status_label(r.peer->status) + ": " + r.peer->message);
  if (r.base && !r.base->ok() && r.primary().ok())
    w.push_back(std::string("baseline: ") + status_label(r.base->status) + ": " + r.base->message);
  if (usable(r.base) && r.primary().ok() && r.base->isa != r.primary().isa)
    w.push_back(std::string("baseline ran tier ") + moejit_isa_name(r.base->isa) + ", this build " +
                moejit_isa_name(r.primary().isa));
  if (r.foreign_cpus > 0.2)
    w.push_back("other processes used " + strf("%.1f", r.foreign_cpus) +
                " CPUs during this case: timing disturbed");
  const Derived d = derive(r);
  if (std::isfinite(d.dram_ratio) && d.dram_ratio > 1.05)
    w.push_back(
        "weight bandwidth exceeds the DRAM read bandwidth measured during the case (the probe is noisy on a "
        "shared machine; or experts not cold: with --routing skewed popular experts stay in L3)");
  return w;
}

}  // namespace moejit_bench
