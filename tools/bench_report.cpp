#include "bench_report.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

namespace moejit_bench {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string strf(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

std::string numbered(int index, const std::string& text) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "#%-3d ", index);
  return buf + text;
}

double ratio(const CaseRow& r) { return r.dram_gbps > 0 ? r.result.weight_gbps / r.dram_gbps : 0.0; }

// ---- aligned table on stdout: rows stream as cases finish, notes after the table ----
class TableReporter : public Reporter {
 public:
  void begin(const MachineInfo& m, const Geometry& g) override {
    std::printf("moejit-bench: libmoejit %s, host isa %s, %d CPUs, L3 %.0f MiB\n", m.version.c_str(),
                moejit_isa_name(m.host_isa), m.cpus, double(m.l3_bytes) / kMiB);
    std::printf(
        "DRAM read bandwidth (%.0f MiB streaming read, median of %d passes, re-measured after each case):",
        double(m.dram_buffer_bytes) / kMiB, m.dram_passes);
    for (size_t i = 0; i < m.dram_gbps.size(); ++i)
      std::printf("%s %d thread%s %.1f GB/s", i ? "," : "", m.dram_gbps[i].first,
                  m.dram_gbps[i].first == 1 ? "" : "s", m.dram_gbps[i].second);
    std::printf("\nlayer: %s\n\n", describe(g).c_str());
    std::printf("%3s  %-11s %6s %6s %7s %-11s %7s %11s %11s %8s %9s %7s\n", "#", "format", "B/w", "tokens",
                "threads", "isa", "experts", "median us", "min us", "GB/s", "DRAM GB/s", "of DRAM");
    std::fflush(stdout);
    l3_ = m.l3_bytes;
  }

  void layer(const LayerInfo& l) override { layers_.push_back(l); }

  void row(const CaseRow& r) override {
    const CaseResult& res = r.result;
    std::printf("%3d  %-11s %6.4f %6d %7d %-11s", r.index, format_label(r.spec.format),
                r.layer.bytes_per_weight, r.spec.tokens, r.spec.threads, moejit_isa_name(res.isa));
    if (res.status == CaseStatus::ok) {
      std::printf(" %7.1f %11.1f %11.1f %8.1f %9.1f %6.1f%%\n", res.distinct_per_call, res.median_s * 1e6,
                  res.min_s * 1e6, res.weight_gbps, r.dram_gbps, 100.0 * ratio(r));
    } else {
      std::printf(" %s\n", status_label(res.status));
      notes_.push_back(numbered(r.index, res.message));
    }
    for (const std::string& w : row_warnings(r)) notes_.push_back(numbered(r.index, w));
    repros_.push_back(numbered(r.index, r.repro));
    std::fflush(stdout);
  }

  void end() override {
    std::printf(
        "\nexperts = distinct experts per call (mean); GB/s = their weight+scale bytes / time per call "
        "(median over calls)\n");
    for (const LayerInfo& l : layers_) {
      const double l3x = l3_ > 0 ? double(l.total_bytes) / double(l3_) : 0.0;
      std::printf(
          "layer %-11s %.4f B/weight, %.2f MiB/expert, %.2f GB total (%.1fx L3%s), generated in %.1f s\n",
          format_label(l.format), l.bytes_per_weight, double(l.expert_bytes) / kMiB,
          double(l.total_bytes) / 1e9, l3x, l3x > 0 && l3x < 4 ? ": experts may stay cached" : "",
          l.generate_seconds);
    }
    if (!notes_.empty()) std::printf("\nnotes:\n");
    for (const std::string& n : notes_) std::printf("  %s\n", n.c_str());
    std::printf("\nrepro:\n");
    for (const std::string& r : repros_) std::printf("  %s\n", r.c_str());
    std::fflush(stdout);
  }

 private:
  int64_t l3_ = 0;
  std::vector<LayerInfo> layers_;
  std::vector<std::string> notes_, repros_;
};

// ---- CSV on stdout, one header line, one line per case ----
std::string csv_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

class CsvReporter : public Reporter {
 public:
  void begin(const MachineInfo&, const Geometry& g) override {
    g_ = g;
    std::printf(
        "format,format_id,bytes_per_weight,hidden,intermediate,experts,top_k,tokens,threads,isa,status,calls,"
        "median_us,min_us,mean_us,distinct_experts,bytes_per_call,lib_bytes_per_call,weight_gbps,dram_gbps,"
        "dram_ratio,foreign_cpus,message,repro\n");
  }
  void layer(const LayerInfo&) override {}
  void row(const CaseRow& r) override {
    const CaseResult& res = r.result;
    std::printf(
        "%s,%d,%.6f,%d,%d,%d,%d,%d,%d,%s,%s,%lld,%.3f,%.3f,%.3f,%.3f,%.0f,%.0f,%.3f,%.3f,%.4f,%.2f,%s,%s\n",
        format_label(r.spec.format), int(r.spec.format), r.layer.bytes_per_weight, g_.hidden, g_.intermediate,
        g_.experts, g_.top_k, r.spec.tokens, r.spec.threads, moejit_isa_name(res.isa),
        status_label(res.status), static_cast<long long>(res.calls), res.median_s * 1e6, res.min_s * 1e6,
        res.mean_s * 1e6, res.distinct_per_call, res.bytes_per_call, res.lib_bytes_per_call, res.weight_gbps,
        r.dram_gbps, ratio(r), r.foreign_cpus, csv_quote(res.message).c_str(), csv_quote(r.repro).c_str());
    std::fflush(stdout);
  }
  void end() override {}

 private:
  Geometry g_;
};

// ---- one JSON document on stdout at the end ----
class JsonReporter : public Reporter {
 public:
  void begin(const MachineInfo& m, const Geometry& g) override {
    nlohmann::ordered_json dram = nlohmann::ordered_json::array();
    for (const auto& [threads, gbps] : m.dram_gbps) dram.push_back({{"threads", threads}, {"gbps", gbps}});
    doc_["machine"] = {
        {"library_version", m.version},
        {"host_isa", moejit_isa_name(m.host_isa)},
        {"cpus", m.cpus},
        {"l3_bytes", m.l3_bytes},
        {"dram_read",
         {{"buffer_bytes", m.dram_buffer_bytes}, {"passes", m.dram_passes}, {"bandwidth", dram}}}};
    doc_["layer"] = {{"hidden", g.hidden},
                     {"intermediate", g.intermediate},
                     {"experts", g.experts},
                     {"top_k", g.top_k},
                     {"activation", activation_label(g.activation)},
                     {"swiglu_alpha", g.swiglu_alpha},
                     {"swiglu_limit", g.swiglu_limit},
                     {"gate_up_interleaved", g.interleaved},
                     {"bias", g.bias},
                     {"group_size", g.group_size},
                     {"scale_dtype", g.scale_dtype == MOEJIT_DTYPE_F32 ? "f32" : "bf16"},
                     {"output_dtype", g.output_dtype == MOEJIT_DTYPE_F32 ? "f32" : "bf16"}};
    doc_["formats"] = nlohmann::ordered_json::array();
    doc_["cases"] = nlohmann::ordered_json::array();
  }
  void layer(const LayerInfo& l) override {
    doc_["formats"].push_back({{"format", format_label(l.format)},
                               {"bytes_per_weight", l.bytes_per_weight},
                               {"expert_bytes", l.expert_bytes},
                               {"layer_bytes", l.total_bytes},
                               {"generate_seconds", l.generate_seconds}});
  }
  void row(const CaseRow& r) override {
    const CaseResult& res = r.result;
    nlohmann::ordered_json c = {{"index", r.index},
                                {"format", format_label(r.spec.format)},
                                {"bytes_per_weight", r.layer.bytes_per_weight},
                                {"tokens", r.spec.tokens},
                                {"threads", r.spec.threads},
                                {"isa", moejit_isa_name(res.isa)},
                                {"status", status_label(res.status)},
                                {"repro", r.repro}};
    if (res.status == CaseStatus::ok) {
      c.update({{"calls", res.calls},
                {"median_us", res.median_s * 1e6},
                {"min_us", res.min_s * 1e6},
                {"mean_us", res.mean_s * 1e6},
                {"distinct_experts", res.distinct_per_call},
                {"bytes_per_call", res.bytes_per_call},
                {"lib_bytes_per_call", res.lib_bytes_per_call},
                {"weight_gbps", res.weight_gbps},
                {"dram_gbps", r.dram_gbps},
                {"dram_ratio", ratio(r)},
                {"foreign_cpus", r.foreign_cpus},
                {"nonfinite_outputs", res.nonfinite_outputs}});
    } else {
      c["message"] = res.message;
    }
    nlohmann::ordered_json warnings = nlohmann::ordered_json::array();
    for (const std::string& w : row_warnings(r)) warnings.push_back(w);
    if (!warnings.empty()) c["warnings"] = warnings;
    doc_["cases"].push_back(c);
  }
  void end() override { std::cout << doc_.dump(2) << std::endl; }

 private:
  nlohmann::ordered_json doc_;
};

const char* const kActivations[] = {"silu", "gelu", "gelu_tanh", "swiglu_oai", "swiglu_clamp"};
const char* const kIsas[] = {"auto", "scalar", "avx2", "avx512", "avx512_bf16"};

}  // namespace

std::unique_ptr<Reporter> make_reporter(OutputMode mode) {
  switch (mode) {
    case OutputMode::csv: return std::make_unique<CsvReporter>();
    case OutputMode::json: return std::make_unique<JsonReporter>();
    case OutputMode::table: break;
  }
  return std::make_unique<TableReporter>();
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
  for (int i = 0; i < 5; ++i)
    if (name == kIsas[i]) return *out = moejit_isa(i), true;
  return false;
}

std::string describe(const Geometry& g) {
  std::string s = "H=" + std::to_string(g.hidden) + " I=" + std::to_string(g.intermediate) +
                  " E=" + std::to_string(g.experts) + " top_k=" + std::to_string(g.top_k) + " " +
                  activation_label(g.activation);
  if (g.swiglu_alpha != 0.0f) s += " alpha=" + strf("%g", g.swiglu_alpha);
  if (g.swiglu_limit != 0.0f) s += " limit=" + strf("%g", g.swiglu_limit);
  s += g.interleaved ? ", gate_up interleaved" : ", gate_up concatenated";
  s += g.bias ? ", biases" : ", no bias";
  if (g.group_size) s += ", mxfp8 group " + std::to_string(g.group_size);
  if (g.scale_dtype == MOEJIT_DTYPE_F32) s += ", fp8_block f32 scales";
  s += g.output_dtype == MOEJIT_DTYPE_F32 ? ", f32 output" : ", bf16 output";
  return s;
}

std::vector<std::string> row_warnings(const CaseRow& r) {
  std::vector<std::string> w;
  const CaseResult& res = r.result;
  if (res.status != CaseStatus::ok) return w;
  if (res.threads != r.spec.threads)
    w.push_back("context runs " + std::to_string(res.threads) + " threads, asked for " +
                std::to_string(r.spec.threads));
  if (res.lib_bytes_per_call < 0) {
    w.push_back("moejit_moe_stats: call count does not match the timed calls");
  } else if (std::fabs(res.lib_bytes_per_call - res.bytes_per_call) > 0.005 * res.bytes_per_call) {
    w.push_back("moejit_moe_stats: the plan streams " + strf("%.0f", res.lib_bytes_per_call) +
                " weight bytes per call, the call's distinct experts hold " +
                strf("%.0f", res.bytes_per_call) +
                strf(" (%.2fx)", res.lib_bytes_per_call / res.bytes_per_call));
  }
  if (res.nonfinite_outputs > 0)
    w.push_back(std::to_string(res.nonfinite_outputs) + " non-finite values in the output");
  if (r.foreign_cpus > 0.2)
    w.push_back("other processes used " + strf("%.1f", r.foreign_cpus) +
                " CPUs during this case: timing disturbed");
  if (r.dram_gbps > 0 && ratio(r) > 1.05)
    w.push_back("weight bandwidth exceeds measured DRAM bandwidth (experts not cold?)");
  return w;
}

}  // namespace moejit_bench
