// moejit-bench: times moejit MoE layers with cold experts and compares the weight bandwidth they
// reach with the DRAM read bandwidth measured in the same run. `moejit-bench --help` for options.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_layer.h"
#include "bench_report.h"
#include "bench_run.h"
#include "bench_util.h"
#include "moejit.h"

namespace moejit_bench {
namespace {

struct Preset {
  const char* name;
  Geometry geometry;
  moejit_format format;
};

Geometry make_geometry(int32_t h, int32_t i, int32_t e, int32_t k, moejit_activation act, bool oai) {
  Geometry g;
  g.hidden = h, g.intermediate = i, g.experts = e, g.top_k = k, g.activation = act;
  if (oai) g.swiglu_alpha = 1.702f, g.swiglu_limit = 7.0f, g.interleaved = true, g.bias = true;
  return g;
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> kPresets = {
      {"qwen3-30b-a3b", make_geometry(2048, 768, 128, 8, MOEJIT_ACT_SILU, false), MOEJIT_FORMAT_BF16},
      {"qwen3-235b-a22b", make_geometry(4096, 1536, 128, 8, MOEJIT_ACT_SILU, false), MOEJIT_FORMAT_BF16},
      {"gpt-oss-20b", make_geometry(2880, 2880, 32, 4, MOEJIT_ACT_SWIGLU_OAI, true), MOEJIT_FORMAT_MXFP4},
      {"gpt-oss-120b", make_geometry(2880, 2880, 128, 4, MOEJIT_ACT_SWIGLU_OAI, true), MOEJIT_FORMAT_MXFP4},
      {"deepseek-v3", make_geometry(7168, 2048, 256, 8, MOEJIT_ACT_SILU, false), MOEJIT_FORMAT_FP8_BLOCK},
  };
  return kPresets;
}

// Everything the command line decides.
struct Config {
  Geometry geometry;
  std::vector<moejit_format> formats;
  std::vector<int32_t> tokens{1};
  std::vector<int32_t> threads;
  moejit_isa isa = MOEJIT_ISA_AUTO;
  CaseSpec timing;  // min_time, min_calls, warmup
  uint64_t seed = 1;
  OutputMode output = OutputMode::table;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void require(bool ok, const std::string& why) {
  if (!ok) throw UsageError(why);
}

// Raw command-line values; `apply` layers them over the preset (explicit options win).
struct Args {
  bool demo = false, csv = false, json = false, bias = false;
  std::string preset = "qwen3-30b-a3b", isa = "auto", activation, gate_up, scale_dtype, output_dtype;
  int32_t hidden = 0, intermediate = 0, experts = 0, top_k = 0, group_size = 0, warmup = 3;
  float swiglu_alpha = 0, swiglu_limit = 0;
  std::vector<std::string> formats;
  std::vector<int32_t> tokens, threads;
  int64_t repeat = 5;
  double min_time = 1.0;
  uint64_t seed = 1;
};

void add_options(CLI::App& app, Args& a) {
  std::string names;
  for (const Preset& p : presets()) names += std::string(names.empty() ? "" : ", ") + p.name;
  std::string fmts;
  for (moejit_format f : all_formats()) fmts += std::string(fmts.empty() ? "" : ",") + format_label(f);
  app.add_flag(
      "--demo", a.demo,
      "Qwen3-30B-A3B geometry, bf16 and fp8_block, tokens 1,4,16, threads 1,2 (what `make demo` runs)");
  app.add_option("--preset", a.preset, "model geometry: " + names)->capture_default_str();
  app.add_option("--hidden", a.hidden, "hidden size H (overrides the preset)");
  app.add_option("--intermediate", a.intermediate, "expert intermediate size I");
  app.add_option("--experts", a.experts, "number of experts E");
  app.add_option("--top-k", a.top_k, "experts per token");
  app.add_option("--format", a.formats, "comma list of: " + fmts)->delimiter(',');
  app.add_option("--tokens", a.tokens, "comma list of tokens per call (default 1)")->delimiter(',');
  app.add_option("--threads", a.threads, "comma list of thread counts (default: all CPUs)")->delimiter(',');
  app.add_option("--isa", a.isa, "tier cap: auto|scalar|avx2|avx512|avx512_bf16")->capture_default_str();
  app.add_option("--activation", a.activation, "silu|gelu|gelu_tanh|swiglu_oai|swiglu_clamp");
  app.add_option("--swiglu-alpha", a.swiglu_alpha, "swiglu alpha (0 = 1.702)");
  app.add_option("--swiglu-limit", a.swiglu_limit, "swiglu clamp limit (0 = none)");
  app.add_option("--gate-up", a.gate_up, "gate_up row order: concat|interleaved");
  app.add_flag("--bias,!--no-bias", a.bias, "bf16 biases on gate_up and down");
  app.add_option("--group-size", a.group_size, "mxfp8 scale group: 0 (=32), 32, 64, 128");
  app.add_option("--scale-dtype", a.scale_dtype, "fp8_block scale type: bf16|f32");
  app.add_option("--output-dtype", a.output_dtype, "y type: bf16|f32");
  app.add_option("--repeat", a.repeat, "minimum timed calls per case")->capture_default_str();
  app.add_option("--min-time", a.min_time, "minimum seconds of timed calls per case")->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed calls before timing")->capture_default_str();
  app.add_option("--seed", a.seed, "seed of weights, activations and routing")->capture_default_str();
  auto* csv = app.add_flag("--csv", a.csv, "CSV on stdout instead of the table");
  app.add_flag("--json", a.json, "JSON on stdout instead of the table")->excludes(csv);
}

moejit_dtype parse_dtype(const std::string& s, const char* option) {
  require(s == "bf16" || s == "f32", std::string(option) + ": '" + s + "' is not bf16 or f32");
  return s == "f32" ? MOEJIT_DTYPE_F32 : MOEJIT_DTYPE_BF16;
}

Geometry apply_geometry(const CLI::App& app, const Args& a, const Preset& p) {
  Geometry g = p.geometry;
  if (app.count("--hidden")) g.hidden = a.hidden;
  if (app.count("--intermediate")) g.intermediate = a.intermediate;
  if (app.count("--experts")) g.experts = a.experts;
  if (app.count("--top-k")) g.top_k = a.top_k;
  if (app.count("--activation"))
    require(parse_activation(a.activation, &g.activation), "--activation: unknown '" + a.activation + "'");
  if (app.count("--swiglu-alpha")) g.swiglu_alpha = a.swiglu_alpha;
  if (app.count("--swiglu-limit")) g.swiglu_limit = a.swiglu_limit;
  if (app.count("--gate-up")) {
    require(a.gate_up == "concat" || a.gate_up == "interleaved",
            "--gate-up: '" + a.gate_up + "' is not concat or interleaved");
    g.interleaved = a.gate_up == "interleaved";
  }
  if (app.count("--bias") || app.count("--no-bias")) g.bias = a.bias;
  if (app.count("--group-size")) g.group_size = a.group_size;
  if (app.count("--scale-dtype")) g.scale_dtype = parse_dtype(a.scale_dtype, "--scale-dtype");
  if (app.count("--output-dtype")) g.output_dtype = parse_dtype(a.output_dtype, "--output-dtype");

  require(g.hidden >= 1 && g.intermediate >= 1 && g.experts >= 1,
          "--hidden, --intermediate, --experts must be >= 1");
  require(g.top_k >= 1 && g.top_k <= g.experts, "--top-k must be in [1, experts]");
  require(g.group_size == 0 || g.group_size == 32 || g.group_size == 64 || g.group_size == 128,
          "--group-size must be 0, 32, 64 or 128");
  require(std::isfinite(g.swiglu_alpha), "--swiglu-alpha must be finite");
  require(g.swiglu_limit >= 0, "--swiglu-limit must be >= 0");
  return g;
}

Config make_config(const CLI::App& app, Args a) {
  if (a.demo) {  // explicit options still win over the demo's choices
    if (!app.count("--preset")) a.preset = "qwen3-30b-a3b";
    if (!app.count("--format")) a.formats = {"bf16", "fp8_block"};
    if (!app.count("--tokens")) a.tokens = {1, 4, 16};
    if (!app.count("--threads")) a.threads = {1, 2};
  }
  const auto preset =
      std::find_if(presets().begin(), presets().end(), [&](const Preset& p) { return a.preset == p.name; });
  require(preset != presets().end(), "--preset: unknown '" + a.preset + "'");

  Config c;
  c.geometry = apply_geometry(app, a, *preset);
  if (a.formats.empty()) a.formats = {format_label(preset->format)};
  for (const std::string& name : a.formats) {
    moejit_format f;
    require(parse_format(name, &f), "--format: unknown '" + name + "'");
    const std::string why = check_geometry(f, c.geometry);
    require(why.empty(), "--format " + name + ": " + why);
    c.formats.push_back(f);
  }
  if (!a.tokens.empty()) c.tokens = a.tokens;
  c.threads = a.threads.empty() ? std::vector<int32_t>{int32_t(affinity_cpus().size())} : a.threads;
  for (int32_t t : c.tokens) require(t >= 1, "--tokens: " + std::to_string(t) + " must be >= 1");
  for (int32_t t : c.threads) require(t >= 1, "--threads: " + std::to_string(t) + " must be >= 1");
  require(parse_isa(a.isa, &c.isa), "--isa: unknown '" + a.isa + "'");
  require(a.repeat >= 1, "--repeat must be >= 1");
  require(a.min_time >= 0 && std::isfinite(a.min_time), "--min-time must be >= 0");
  require(a.warmup >= 0, "--warmup must be >= 0");
  c.timing.min_time = a.min_time;
  c.timing.min_calls = a.repeat;
  c.timing.warmup = a.warmup;
  c.timing.max_isa = c.isa;
  c.seed = a.seed;
  c.output = a.json ? OutputMode::json : a.csv ? OutputMode::csv : OutputMode::table;
  return c;
}

std::string number(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", double(v));
  return buf;
}

// One command that reruns a single case with the same layer.
std::string repro(const Config& c, moejit_format f, int32_t tokens, int32_t threads) {
  const Geometry& g = c.geometry;
  std::string s = "moejit-bench --hidden " + std::to_string(g.hidden) + " --intermediate " +
                  std::to_string(g.intermediate) + " --experts " + std::to_string(g.experts) + " --top-k " +
                  std::to_string(g.top_k) + " --format " + format_label(f) + " --tokens " +
                  std::to_string(tokens) + " --threads " + std::to_string(threads);
  if (g.activation != MOEJIT_ACT_SILU) s += std::string(" --activation ") + activation_label(g.activation);
  if (g.swiglu_alpha != 0) s += " --swiglu-alpha " + number(g.swiglu_alpha);
  if (g.swiglu_limit != 0) s += " --swiglu-limit " + number(g.swiglu_limit);
  if (g.interleaved) s += " --gate-up interleaved";
  if (g.bias) s += " --bias";
  const bool mx8 = f == MOEJIT_FORMAT_MXFP8_E4M3 || f == MOEJIT_FORMAT_MXFP8_E5M2;
  if (mx8 && g.group_size) s += " --group-size " + std::to_string(g.group_size);
  if (f == MOEJIT_FORMAT_FP8_BLOCK && g.scale_dtype == MOEJIT_DTYPE_F32) s += " --scale-dtype f32";
  if (g.output_dtype == MOEJIT_DTYPE_F32) s += " --output-dtype f32";
  if (c.isa != MOEJIT_ISA_AUTO) s += std::string(" --isa ") + moejit_isa_name(c.isa);
  if (c.seed != 1) s += " --seed " + std::to_string(c.seed);
  return s;
}

// DRAM read-bandwidth probe: one 1 GiB buffer kept for the whole run. It is measured per thread
// count at the start (the header) and again right after each case that ran (that case's ratio): a VM's
// bandwidth drifts with the host's load, so the reference is taken next to the measurement.
class DramProbe {
 public:
  static constexpr size_t kBytes = size_t(1) << 30;
  static constexpr int kPasses = 10;
  explicit DramProbe(uint64_t seed) : buffer_(kBytes) {
    fill_words(buffer_.data(), buffer_.size(), seed, [](uint64_t w) { return w; });
  }
  double measure(int threads) const { return measure_read_bandwidth(buffer_, threads, kPasses); }

 private:
  Buffer buffer_;
};

MachineInfo describe_machine(const Config& c, const DramProbe& dram) {
  MachineInfo m;
  m.version = moejit_version();
  m.host_isa = moejit_host_isa();
  m.cpus = int(affinity_cpus().size());
  m.l3_bytes = l3_cache_bytes();
  m.dram_buffer_bytes = int64_t(DramProbe::kBytes);
  m.dram_passes = DramProbe::kPasses;
  for (int32_t t : std::set<int32_t>(c.threads.begin(), c.threads.end()))
    m.dram_gbps.emplace_back(t, dram.measure(t));
  return m;
}

// Generates the format's layer and runs its cases; returns the number of cases that failed with an
// error (`unsupported` is not an error).
int run_format(const Config& c, moejit_format f, const DramProbe& dram, Reporter& out, int* index) {
  LayerInfo info;
  info.format = f;
  info.bytes_per_weight = bytes_per_weight(f, c.geometry);
  info.expert_bytes = expert_bytes(f, c.geometry);
  info.total_bytes = info.expert_bytes * c.geometry.experts;
  const auto t0 = std::chrono::steady_clock::now();
  const Layer layer(f, c.geometry, c.seed);
  info.generate_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.layer(info);

  int errors = 0;
  for (int32_t tokens : c.tokens) {
    const Routing routing =
        make_routing(tokens, c.geometry.top_k, c.geometry.experts, c.seed * 1000003 + tokens);
    for (int32_t threads : c.threads) {
      CaseRow row;
      row.index = ++*index;
      row.spec = c.timing;
      row.spec.format = f, row.spec.tokens = tokens, row.spec.threads = threads;
      row.layer = info;
      const CpuSample before = sample_cpu();
      row.result = run_case(layer, c.geometry, routing, row.spec);
      row.foreign_cpus = foreign_cpus(before, sample_cpu());
      if (row.result.status == CaseStatus::ok) row.dram_gbps = dram.measure(threads);
      row.repro = repro(c, f, tokens, threads);
      errors += row.result.status == CaseStatus::error;
      out.row(row);
    }
  }
  return errors;
}

// Runs every case, one layer in memory at a time; returns the number of failed cases.
int run_all(const Config& c) {
  const DramProbe dram(c.seed);
  std::unique_ptr<Reporter> out = make_reporter(c.output);
  out->begin(describe_machine(c, dram), c.geometry);
  int index = 0, errors = 0;
  for (moejit_format f : c.formats) errors += run_format(c, f, dram, *out, &index);
  out->end();
  return errors;
}

void check_memory(const Config& c) {
  int64_t largest = 0;
  for (moejit_format f : c.formats)
    largest = std::max(largest, expert_bytes(f, c.geometry) * c.geometry.experts);
  const int64_t mem = physical_memory_bytes();
  largest += int64_t(DramProbe::kBytes);
  require(largest <= mem / 10 * 9, "the largest layer and the 1 GiB bandwidth buffer need " +
                                       std::to_string(largest >> 20) + " MiB, the machine has " +
                                       std::to_string(mem >> 20) + " MiB: use fewer --experts");
}

}  // namespace
}  // namespace moejit_bench

int main(int argc, char** argv) {
  using namespace moejit_bench;
  CLI::App app{"moejit-bench: time moejit MoE decode layers with cold experts against DRAM bandwidth"};
  Args args;
  add_options(app, args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "moejit-bench: error: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    const Config config = make_config(app, args);
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
