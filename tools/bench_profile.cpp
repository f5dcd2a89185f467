#include "bench_profile.h"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace moejit_bench {

namespace {

using Json = nlohmann::ordered_json;

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

class ProfileReporter : public Reporter {
 public:
  explicit ProfileReporter(ProfileOptions o) : opt_(std::move(o)) {}

  void begin(const MachineInfo& m, const RunInfo& run) override {
    const Geometry& g = run.geometry;
    Json dram = Json::array();
    for (const auto& [threads, gbps] : m.dram_gbps) dram.push_back({{"threads", threads}, {"gbps", gbps}});
    doc_ = {{"schema_version", kProfileSchemaVersion},
            {"generator", "moejit-bench"},
            {"library_version", m.version},
            {"created_utc", utc_now()},
            {"machine",
             {{"cpu_model", m.cpu_model},
              {"cpus", m.cpus},
              {"host_isa", moejit_isa_name(m.host_isa)},
              {"l3_bytes", m.l3_bytes},
              {"dram_read_gbps", dram}}},
            {"geometry",
             {{"preset", run.preset},
              {"hidden", g.hidden},
              {"intermediate", g.intermediate},
              {"experts", g.experts},
              {"top_k", g.top_k},
              {"activation", activation_label(g.activation)},
              {"gate_up_interleaved", g.interleaved},
              {"layout", g.separate ? "separate" : "fused"},
              {"bias", g.bias}}},
            {"routing", routing_label(run.routing)},
            {"dedup", run.dedup != DedupMode::off}};
    if (opt_.pcie_gbs > 0)
      doc_["model_inputs"] = {{"pcie_gbs", opt_.pcie_gbs},
                              {"miss_rate", opt_.miss_rate},
                              {"gpu_gbps", opt_.gpu_gbps},
                              {"gpu_call_s", opt_.gpu_call_s},
                              {"gpu_fetch_gbps", opt_.gpu_fetch_gbps},
                              {"cpu_overhead_s", opt_.cpu_overhead_s},
                              {"fetch_chunk_experts", opt_.fetch_chunk_experts},
                              {"dram_gbps", opt_.dram_gbs > 0 ? Json(opt_.dram_gbs) : Json(nullptr)}};
    else
      doc_["model_inputs"] = nullptr;
    doc_["entries"] = Json::array();
  }

  void layer(const LayerInfo&) override {}

  void row(const CaseRow& r) override {
    const CaseResult& p = r.primary();
    if (!p.ok()) return;
    const double per_token = 1.0 / r.spec.tokens;
    Json e = {{"format", format_label(r.spec.format)},
              {"bytes_per_weight", r.layer.bytes_per_weight},
              {"expert_bytes", r.layer.expert_bytes},
              {"tokens", r.spec.tokens},
              {"threads", r.spec.threads},
              {"isa", moejit_isa_name(p.isa)},
              {"dedup", bool(r.on)},
              {"cpu_gbps", p.weight_gbps},
              {"dram_gbps", r.dram_gbps},
              {"median_call_s", p.median_s},
              {"distinct_experts_per_call", p.distinct_per_call},
              {"routes_per_call", p.routes_per_call}};
    if (opt_.pcie_gbs > 0) {
      const double missing = opt_.miss_rate * p.distinct_per_call;
      const double resident = p.distinct_per_call - missing;
      const double eb = double(r.layer.expert_bytes);
      ModelInputs in;
      in.cpu_gbps = p.weight_gbps;
      in.pcie_gbs = opt_.pcie_gbs;
      in.dram_gbps = opt_.dram_gbs > 0 ? opt_.dram_gbs : r.dram_gbps;
      in.gpu_gbps = opt_.gpu_gbps;
      in.gpu_call_s = opt_.gpu_call_s;
      in.gpu_fetch_gbps = opt_.gpu_fetch_gbps;
      in.cpu_overhead_s = opt_.cpu_overhead_s;
      in.fetch_chunk_bytes = opt_.fetch_chunk_experts * eb;
      const BackendModel m = model_backends(missing * eb, resident * eb, in);
      e["backends"] = {
          {"missing_experts_per_call", missing},
          {"missing_bytes_per_call", m.missing_bytes},
          {"resident_experts_per_call", resident},
          {"resident_bytes_per_call", m.resident_bytes},
          {"gpu_resident", {{"time_per_token_s", m.gpu_resident_s * per_token}}},
          {"cpu",
           {{"time_per_token_s", m.cpu_s * per_token}, {"compute_per_token_s", m.cpu_compute_s * per_token}}},
          {"pcie",
           {{"time_per_token_s", m.pcie_s * per_token},
            {"fetch_per_token_s", m.fetch_s * per_token},
            {"gpu_fetched_per_token_s", m.gpu_fetched_s * per_token}}},
          {"hybrid",
           {{"cpu_fraction", m.cpu_fraction},
            {"shared_rate", m.shared_rate},
            {"time_per_token_s", m.hybrid_s * per_token},
            {"ideal_time_per_token_s", m.hybrid_ideal_s * per_token},
            {"dram_floor_per_token_s", m.dram_floor_s * per_token},
            {"dram_capacity_gbps", m.dram_capacity_gbps}}}};
      const double single = std::min(m.cpu_s, m.pcie_s);
      const auto us = [&](double s) { return strf("%.1f", s * per_token * 1e6); };
      std::string reason;
      if (m.best == "none") {
        reason = "no missing experts at miss_rate 0: the layer is the GPU's resident compute, " +
                 us(m.gpu_resident_s) + " us/token";
      } else if (m.best == "hybrid") {
        reason = "hybrid " + us(m.hybrid_s) + " us/token (cpu_fraction " + strf("%.2f", m.cpu_fraction) +
                 ") beats the better single way (" + us(single) + " us) by more than 10%";
      } else {
        reason = m.best + " " + us(m.best_s) + " us/token; cpu " + us(m.cpu_s) + ", pcie " + us(m.pcie_s) +
                 ", hybrid " + us(m.hybrid_s) +
                 (m.hybrid_s >= m.hybrid_ideal_s * 1.001 ? " (held at the DRAM floor)" : "") +
                 " does not beat it by 10%";
      }
      if (m.best != "none" && m.best_s <= m.gpu_resident_s * 1.001)
        reason += "; the GPU's resident compute (" + us(m.gpu_resident_s) + " us) bounds the layer";
      e["recommendation"] = {
          {"backend", m.best}, {"time_per_token_s", m.best_s * per_token}, {"reason", reason}};
    }
    doc_["entries"].push_back(e);
  }

  void end() override {
    // Per format and tokens: the fastest measured entry (what an engine looks up first).
    std::map<std::pair<std::string, int>, const Json*> best;
    for (const Json& e : doc_["entries"]) {
      const auto key = std::make_pair(e["format"].get<std::string>(), e["tokens"].get<int>());
      if (!best.count(key) || e["cpu_gbps"].get<double>() > (*best[key])["cpu_gbps"].get<double>())
        best[key] = &e;
    }
    Json summary = Json::array();
    for (const auto& [key, e] : best)
      summary.push_back({{"format", key.first},
                         {"tokens", key.second},
                         {"threads", (*e)["threads"]},
                         {"isa", (*e)["isa"]},
                         {"cpu_gbps", (*e)["cpu_gbps"]}});
    doc_["best_cpu_gbps"] = summary;
    std::ofstream out(opt_.path);
    out << doc_.dump(2) << "\n";
    if (!out) throw std::runtime_error("--profile: cannot write '" + opt_.path + "'");
  }

 private:
  ProfileOptions opt_;
  Json doc_;
};

}  // namespace

std::unique_ptr<Reporter> make_profile_reporter(const ProfileOptions& options) {
  return std::make_unique<ProfileReporter>(options);
}

}  // namespace moejit_bench
