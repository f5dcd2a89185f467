#include "bench_config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench_peer.h"
#include "bench_util.h"
#include "formats/format_table.h"

namespace moejit_bench {

namespace {

void require(bool ok, const std::string& why) {
  if (!ok) throw UsageError(why);
}

// Raw command-line values; `make_config` layers them over the preset (explicit options win).
struct Args {
  bool demo = false, csv = false, json = false, bias = false, hot = false, progress = false, probe = false;
  std::string preset = "qwen3-30b-a3b", activation, gate_up, layout, scale_dtype, output_dtype,
              read_variant = "best";
  std::string dedup = "on", routing = "uniform", peer = "none", baseline, plot, profile;
  int32_t hidden = 0, intermediate = 0, experts = 0, top_k = 0, group_size = 0, warmup = 3, probe_passes = 5;
  int64_t l3_bytes = 0;
  float swiglu_alpha = 0, swiglu_limit = 0;
  std::vector<std::string> formats, isas;
  std::vector<int32_t> tokens, threads;
  int64_t repeat = 5;
  double min_time = 1.0, zipf_s = 1.0, pcie_gbs = 0, miss_rate = 0;
  double gpu_gbps = kDefaultGpuGbps, gpu_fetch_gbps = kDefaultGpuFetchGbps,
         cpu_overhead_us = kDefaultCpuOverheadS * 1e6, gpu_call_us = kDefaultGpuCallS * 1e6, dram_gbs = 0;
  int32_t fetch_chunk_experts = kDefaultFetchChunkExperts;
  uint64_t seed = 1;
};

std::string preset_help() {
  std::string s = "\nPresets (H = hidden, I = expert intermediate, E = experts; routed experts only):\n";
  for (const Preset& p : presets()) {
    const Geometry& g = p.geometry;
    char buf[256];
    std::snprintf(buf, sizeof(buf), "  %-16s H=%d I=%d E=%d top_k=%d %s, %s", p.name, g.hidden,
                  g.intermediate, g.experts, g.top_k, activation_label(g.activation), format_label(p.format));
    s += buf;
    if (p.note[0]) s += std::string(" (") + p.note + ")";
    s += "\n";
  }
  return s;
}

void add_options(CLI::App& app, Args& a) {
  std::string names;
  for (const Preset& p : presets()) names += std::string(names.empty() ? "" : ", ") + p.name;
  std::string fmts;
  for (FormatChoice f : all_formats()) fmts += std::string(fmts.empty() ? "" : ",") + format_label(f);
  app.add_flag("--demo", a.demo,
               "Qwen3-30B-A3B geometry, every format, tokens 1,4,16, threads 1,2, 0.3 s per case (what `make "
               "demo` runs)");
  app.add_option("--preset", a.preset, "model geometry: " + names)->capture_default_str();
  app.add_option("--hidden", a.hidden, "hidden size H (overrides the preset)");
  app.add_option("--intermediate", a.intermediate, "expert intermediate size I");
  app.add_option("--experts", a.experts, "number of experts E");
  app.add_option("--top-k", a.top_k, "experts per token");
  app.add_option("--format", a.formats, "comma list of: " + fmts)->delimiter(',');
  app.add_option("--tokens", a.tokens, "comma list of tokens per call (default 1)")->delimiter(',');
  app.add_option("--threads", a.threads, "comma list of thread counts (default: all CPUs)")->delimiter(',');
  app.add_option(
         "--isa", a.isas,
         "comma list of tier caps: auto, scalar, avx2, avx512, avx512_bf16, avx512_amx, or all (every tier); "
         "tiers this CPU lacks are reported as skipped")
      ->delimiter(',');
  app.add_option("--dedup", a.dedup,
                 "on | off | both: expert dedup (both: each case with and without, side by side, with the "
                 "reuse factor and the traffic model; implies --hot)")
      ->capture_default_str();
  app.add_flag("--hot,!--no-hot", a.hot,
               "also time each case over one expert's memory behind every expert id (stays cached): the "
               "compute floor, and the bound max(DRAM time, hot time)");
  app.add_option("--routing", a.routing,
                 "uniform | skewed (Zipf-like expert popularity, see --zipf) | same (every token of a call "
                 "takes the same experts)")
      ->capture_default_str();
  app.add_option("--zipf", a.zipf_s, "exponent s of --routing skewed: P(rank r) ~ 1/(r+1)^s")
      ->capture_default_str();
  app.add_option("--peer", a.peer, "none | onednn: the same MoE work through oneDNN matmuls, side by side")
      ->capture_default_str();
  app.add_option("--baseline", a.baseline,
                 "PATH: another build of libmoejit (its libmoejit.so.1), loaded beside this one: every case "
                 "runs it as one more arm, interleaved in time, and reports this build's speed over it");
  app.add_option("--activation", a.activation, "silu|gelu|gelu_tanh|swiglu_oai|swiglu_clamp");
  app.add_option("--swiglu-alpha", a.swiglu_alpha, "swiglu alpha (0 = 1.702)");
  app.add_option("--swiglu-limit", a.swiglu_limit, "swiglu clamp limit (0 = none)");
  app.add_option("--gate-up", a.gate_up, "gate_up row order: concat|interleaved");
  app.add_option(
      "--layout", a.layout,
      "fused (one gate_up matrix per expert) | separate (gate and up banks of their own, as GGUF and "
      "Hugging Face checkpoints hold them; a preset's interleaving does not apply)");
  app.add_flag("--bias,!--no-bias", a.bias, "bf16 biases on gate_up and down");
  app.add_option("--group-size", a.group_size, "mxfp8 scale group: 0 (=32), 32, 64, 128");
  app.add_option("--scale-dtype", a.scale_dtype, "fp8_block scale type: bf16|f32");
  app.add_option("--output-dtype", a.output_dtype, "y type: bf16|f32");
  app.add_option("--repeat", a.repeat, "minimum timed calls per case (min and median are reported)")
      ->capture_default_str();
  app.add_option("--min-time", a.min_time, "minimum seconds of timed calls per case")->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed calls before timing")->capture_default_str();
  app.add_option("--seed", a.seed, "seed of weights, activations and routing")->capture_default_str();
  auto* csv = app.add_flag("--csv", a.csv, "CSV on stdout instead of the table");
  app.add_flag("--json", a.json, "JSON on stdout instead of the table")->excludes(csv);
  app.add_option("--plot", a.plot, "write an SVG plot of GB/s against tokens to this file");
  app.add_option("--profile", a.profile, "write a JSON profile (CPU GB/s, backend model; docs/TOOLS.md)");
  app.add_option("--pcie-gbs", a.pcie_gbs, "with --profile: host-to-GPU bandwidth the engine measured, GB/s");
  app.add_option("--miss-rate", a.miss_rate,
                 "with --profile: share of routed experts not resident on the GPU");
  app.add_option("--gpu-gbs", a.gpu_gbps,
                 "with --pcie-gbs: GB/s of expert bytes the GPU computes from the experts it holds "
                 "(examples/hybrid_moe.py measures it)")
      ->capture_default_str();
  app.add_option("--gpu-call-us", a.gpu_call_us,
                 "with --pcie-gbs: fixed time of a GPU compute part per layer call (the resident experts' "
                 "and again the fetched ones'), us")
      ->capture_default_str();
  app.add_option("--gpu-fetch-gbs", a.gpu_fetch_gbps,
                 "with --pcie-gbs: GB/s of expert bytes the GPU dequantizes and computes after a fetch")
      ->capture_default_str();
  app.add_option("--fetch-chunk-experts", a.fetch_chunk_experts,
                 "with --pcie-gbs: experts per copy the GPU waits for before computing them (0: one copy "
                 "of every fetched expert, no pipelining)")
      ->capture_default_str();
  app.add_option("--dram-gbs", a.dram_gbs,
                 "with --pcie-gbs: host DRAM GB/s with moejit and the copy engine reading at once "
                 "(examples/hybrid_moe.py measures it; default: each case's read probe)");
  app.add_option("--cpu-overhead-us", a.cpu_overhead_us,
                 "with --pcie-gbs: fixed cost of a layer call that computes on the CPU (x to the host, "
                 "submit, wait, y to the GPU), us")
      ->capture_default_str();
  app.add_flag("--progress", a.progress, "progress lines on stderr even when it is not a terminal");
  app.add_option("--l3-bytes", a.l3_bytes,
                 "size the cold expert pools (>= " + std::to_string(kPoolL3Multiple) +
                     "x L3) and the read probe's buffer from this L3 instead of the detected one (K, M, G "
                     "suffixes are binary: 300M)")
      ->transform(CLI::AsSizeValue(false));
  app.add_flag("--probe", a.probe,
               "print the read bandwidth of every read variant for each thread count (--threads, default 1 "
               "to all CPUs), with --json as JSON, and exit");
  app.add_option("--probe-passes", a.probe_passes, "passes per variant of --probe (median)")
      ->capture_default_str();
  app.add_option("--read-variant", a.read_variant,
                 "the read probe's variant: best (the fastest of the start-up set, per thread count) or a "
                 "name that --probe lists, e.g. 'avx2 x1' (the probe before variants)")
      ->capture_default_str();
  app.footer(preset_help());
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
  if (app.count("--layout")) {
    require(a.layout == "fused" || a.layout == "separate",
            "--layout: '" + a.layout + "' is not fused or separate");
    g.separate = a.layout == "separate";
    g.fused_given = !g.separate;
    require(!(g.separate && app.count("--gate-up") && g.interleaved),
            "--gate-up interleaved orders the rows of a fused gate_up: not with --layout separate");
    if (g.separate) g.interleaved = false;
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

void apply_sweeps(const CLI::App& app, const Args& a, Config* c) {
  if (!a.tokens.empty()) c->tokens = a.tokens;
  c->threads = a.threads.empty() ? std::vector<int32_t>{int32_t(affinity_cpus().size())} : a.threads;
  for (int32_t t : c->tokens) require(t >= 1, "--tokens: " + std::to_string(t) + " must be >= 1");
  for (int32_t t : c->threads)
    require(t >= 1 && t <= 1024, "--threads: " + std::to_string(t) + " must be in [1, 1024]");
  if (!a.isas.empty()) c->isas.clear();
  for (const std::string& name : a.isas) {
    if (name == "all") {
      for (moejit_isa i : api_tiers()) c->isas.push_back(i);
      continue;
    }
    moejit_isa isa;
    require(parse_isa(name, &isa), "--isa: unknown '" + name + "' (auto" + api_tier_names() + ", all)");
    c->isas.push_back(isa);
  }
  require(a.dedup == "on" || a.dedup == "off" || a.dedup == "both",
          "--dedup: '" + a.dedup + "' is not on, off or both");
  c->dedup = a.dedup == "both" ? DedupMode::both : a.dedup == "off" ? DedupMode::off : DedupMode::on;
  c->hot = app.count("--hot") || app.count("--no-hot") ? a.hot : c->dedup == DedupMode::both;
  require(parse_routing(a.routing, &c->routing),
          "--routing: '" + a.routing + "' is not uniform, skewed or same");
  require(std::isfinite(a.zipf_s) && a.zipf_s > 0 && a.zipf_s <= 8, "--zipf must be in (0, 8]");
  c->zipf_s = a.zipf_s;
  require(a.peer == "none" || a.peer == "onednn", "--peer: '" + a.peer + "' is not none or onednn");
  c->peer = a.peer == "onednn" ? PeerKind::onednn : PeerKind::none;
  require(!(c->peer == PeerKind::onednn && c->geometry.separate),
          "--peer onednn multiplies a fused gate_up: not with --layout separate");
  std::string why;
  require(peer_available(c->peer, &why), "--peer " + a.peer + ": " + why);
  if (!a.baseline.empty()) {
    c->baseline = load_api(a.baseline, &why);
    require(c->baseline != nullptr, "--baseline " + a.baseline + ": " + why);
  }
}

void apply_outputs(const CLI::App& app, const Args& a, Config* c) {
  c->output = a.json ? OutputMode::json : a.csv ? OutputMode::csv : OutputMode::table;
  c->plot_path = a.plot;
  c->profile_path = a.profile;
  const bool pcie = app.count("--pcie-gbs") > 0, miss = app.count("--miss-rate") > 0;
  require(!(pcie || miss) || !a.profile.empty(), "--pcie-gbs and --miss-rate need --profile");
  require(pcie == miss, "--pcie-gbs and --miss-rate go together (the backend model needs both)");
  const bool gpu = app.count("--gpu-gbs") + app.count("--gpu-call-us") + app.count("--gpu-fetch-gbs") +
                       app.count("--cpu-overhead-us") + app.count("--fetch-chunk-experts") +
                       app.count("--dram-gbs") >
                   0;
  require(
      !gpu || pcie,
      "--gpu-gbs, --gpu-call-us, --gpu-fetch-gbs, --cpu-overhead-us, --fetch-chunk-experts and --dram-gbs "
      "need --pcie-gbs and --miss-rate");
  if (pcie) {
    require(std::isfinite(a.pcie_gbs) && a.pcie_gbs > 0, "--pcie-gbs must be > 0");
    require(a.miss_rate >= 0 && a.miss_rate <= 1, "--miss-rate must be in [0, 1]");
    // The GPU rates may be inf (their term is then 0: a GPU whose time is all the fixed part).
    require(a.gpu_gbps > 0, "--gpu-gbs must be > 0");
    require(a.gpu_fetch_gbps > 0, "--gpu-fetch-gbs must be > 0");
    require(std::isfinite(a.gpu_call_us) && a.gpu_call_us >= 0, "--gpu-call-us must be >= 0");
    require(std::isfinite(a.cpu_overhead_us) && a.cpu_overhead_us >= 0, "--cpu-overhead-us must be >= 0");
    require(a.fetch_chunk_experts >= 0, "--fetch-chunk-experts must be >= 0");
    require(app.count("--dram-gbs") == 0 || (std::isfinite(a.dram_gbs) && a.dram_gbs > 0),
            "--dram-gbs must be > 0");
    c->pcie_gbs = a.pcie_gbs;
    c->miss_rate = a.miss_rate;
    c->gpu_gbps = a.gpu_gbps;
    c->gpu_fetch_gbps = a.gpu_fetch_gbps;
    c->cpu_overhead_s = a.cpu_overhead_us * 1e-6;
    c->gpu_call_s = a.gpu_call_us * 1e-6;
    c->fetch_chunk_experts = a.fetch_chunk_experts;
    c->dram_gbs = a.dram_gbs;
  }
  c->progress = a.progress;
}

void apply_probe(const CLI::App& app, const Args& a, Config* c) {
  c->l3_given = app.count("--l3-bytes") > 0;
  require(!c->l3_given || a.l3_bytes > 0, "--l3-bytes must be > 0");
  c->l3_bytes = c->l3_given ? a.l3_bytes : l3_cache_bytes();
  if (c->l3_bytes <= 0) {
    c->l3_bytes = int64_t(32) << 20;
    std::fprintf(stderr,
                 "moejit-bench: warning: the L3 size is unknown, pools are sized from 32 MiB (--l3-bytes)\n");
  }
  c->probe = a.probe;
  require(a.probe_passes >= 1, "--probe-passes must be >= 1");
  c->probe_passes = a.probe_passes;
  c->read_forced = a.read_variant != "best";
  if (c->read_forced) {
    std::string names;
    for (const ReadVariant& v : all_read_variants()) names += (names.empty() ? "" : ", ") + v.name();
    require(parse_read_variant(a.read_variant, &c->read_variant),
            "--read-variant: '" + a.read_variant + "' is not best or one of: " + names);
  }
  if (c->probe && !app.count("--threads")) {
    c->threads.clear();
    for (int32_t t = 1; t <= int32_t(affinity_cpus().size()); ++t) c->threads.push_back(t);
  }
}

Config make_config(const CLI::App& app, Args a) {
  if (a.demo) {  // explicit options still win over the demo's choices
    if (!app.count("--preset")) a.preset = "qwen3-30b-a3b";
    if (!app.count("--format"))
      a.formats = {"bf16", "fp8_block", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4", "ds_fp4", "q4_0",
                   "q8_0", "q4_K",      "q5_K",       "q6_K",       "q2_K",  "q3_K",  "q4_K_M"};
    if (!app.count("--tokens")) a.tokens = {1, 4, 16};
    if (!app.count("--threads")) a.threads = {1, 2};
    if (!app.count("--min-time")) a.min_time = 0.3;
  }
  const auto preset =
      std::find_if(presets().begin(), presets().end(), [&](const Preset& p) { return a.preset == p.name; });
  require(preset != presets().end(), "--preset: unknown '" + a.preset + "'");

  Config c;
  c.preset = preset->name;
  c.geometry = apply_geometry(app, a, *preset);
  if (a.formats.empty()) a.formats = {format_label(preset->format)};
  for (const std::string& name : a.formats) {
    FormatChoice f;
    require(parse_format(name, &f), "--format: unknown '" + name + "'");
    const std::string why = check_geometry(f, c.geometry);
    require(why.empty(), "--format " + name + ": " + why);
    c.formats.push_back(f);
  }
  apply_sweeps(app, a, &c);
  require(a.repeat >= 1, "--repeat must be >= 1");
  require(a.min_time >= 0 && std::isfinite(a.min_time), "--min-time must be >= 0");
  require(a.warmup >= 0, "--warmup must be >= 0");
  c.timing.min_time = a.min_time;
  c.timing.min_calls = a.repeat;
  c.timing.warmup = a.warmup;
  c.seed = a.seed;
  apply_outputs(app, a, &c);
  apply_probe(app, a, &c);
  return c;
}

std::string number(double v) { return strf("%g", v); }

}  // namespace

int parse_command_line(int argc, char** argv, Config* out) {
  CLI::App app{
      "moejit-bench: time moejit MoE decode layers with cold experts against the DRAM read bandwidth "
      "measured in the same run"};
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
    *out = make_config(app, args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "moejit-bench: error: %s\n", e.what());
    return 2;
  }
  return -1;
}

std::string repro(const Config& c, FormatChoice f, int32_t tokens, int32_t threads, moejit_isa isa) {
  const Geometry& g = c.geometry;
  std::string s = "moejit-bench --hidden " + std::to_string(g.hidden) + " --intermediate " +
                  std::to_string(g.intermediate) + " --experts " + std::to_string(g.experts) + " --top-k " +
                  std::to_string(g.top_k) + " --format " + format_label(f) + " --tokens " +
                  std::to_string(tokens) + " --threads " + std::to_string(threads);
  if (g.activation != MOEJIT_ACT_SILU) s += std::string(" --activation ") + activation_label(g.activation);
  if (g.swiglu_alpha != 0) s += " --swiglu-alpha " + number(g.swiglu_alpha);
  if (g.swiglu_limit != 0) s += " --swiglu-limit " + number(g.swiglu_limit);
  if (g.interleaved) s += " --gate-up interleaved";
  if (g.separate) s += " --layout separate";
  if (g.fused_given && is_mix(f)) s += " --layout fused";
  if (g.bias) s += " --bias";
  const moejit::formats::FormatInfo& fi =
      moejit::formats::info(moejit::formats::Format(proj_formats(f).gate));  // a mix: its gate format
  if (fi.api_groups && g.group_size) s += " --group-size " + std::to_string(g.group_size);
  if (fi.scale_code == moejit::formats::ScaleCode::bf16_f32 && g.scale_dtype == MOEJIT_DTYPE_F32)
    s += " --scale-dtype f32";
  if (g.output_dtype == MOEJIT_DTYPE_F32) s += " --output-dtype f32";
  if (isa != MOEJIT_ISA_AUTO) s += std::string(" --isa ") + moejit_isa_name(isa);
  if (c.dedup != DedupMode::on) s += std::string(" --dedup ") + dedup_label(c.dedup);
  if (c.hot != (c.dedup == DedupMode::both)) s += c.hot ? " --hot" : " --no-hot";
  if (c.routing != RoutingKind::uniform) s += std::string(" --routing ") + routing_label(c.routing);
  if (c.routing == RoutingKind::skewed && c.zipf_s != 1.0) s += " --zipf " + number(c.zipf_s);
  if (c.peer == PeerKind::onednn) s += " --peer onednn";
  if (c.baseline) s += " --baseline '" + c.baseline->path + "'";
  if (c.seed != 1) s += " --seed " + std::to_string(c.seed);
  if (c.l3_given) s += " --l3-bytes " + std::to_string(c.l3_bytes);
  if (c.read_forced) s += " --read-variant '" + c.read_variant.name() + "'";
  return s;
}

}  // namespace moejit_bench
