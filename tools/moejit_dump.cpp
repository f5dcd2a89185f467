// moejit-dump: generates the kernel the runtime would use for a key (or every
// kernel of a MoE layer) and prints its Intel-syntax disassembly with the
// generator's phases marked. `moejit-dump --help` for options.
#include <sched.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "jit/gemv.h"
#include "jit/kernel_cache.h"
#include "jit/kernel_dump.h"
#include "jit/tiers.h"
#include "runtime/plan.h"

namespace {

using moejit::formats::Format;
using moejit::jit::Isa;
using nlohmann::json;
namespace plan = moejit::plan;

struct Failure {
  int code;  // 1: unsupported or generation failed; 2: bad arguments
  std::string why;
};

[[noreturn]] void fail(int code, const std::string& why) { throw Failure{code, why}; }

Format parse_format(const std::string& s, const char* option = "--format") {
  Format f;
  if (moejit::formats::format_from_name(s.c_str(), &f)) return f;
  for (int32_t id = 0; id <= moejit::formats::kMaxFormatId; ++id)
    if (s == std::to_string(id)) return Format(id);
  fail(2, std::string(option) + " " + s + " is not a format name or id (bf16, fp8_block, ... or 0.." +
              std::to_string(moejit::formats::kMaxFormatId) + ")");
}

bool isa_from_name(const std::string& s, Isa* isa) {
  const moejit::jit::TierInfo* t = moejit::jit::tier_from_name(s.c_str());  // the tier table, any case
  if (t) *isa = t->isa;
  return t != nullptr;
}

// "auto" is the tier a default context runs: the host's best, capped by
// MOEJIT_MAX_ISA like moejit_context_create. An explicit tier is taken as is.
Isa resolve_isa(const std::string& s) {
  if (s != "auto") {
    Isa isa;
    if (!isa_from_name(s, &isa)) fail(2, "--isa " + s + " is not one of auto, " + moejit::jit::tier_names());
    return isa;
  }
  Isa isa = moejit::jit::host_isa();
  const char* cap_env = std::getenv("MOEJIT_MAX_ISA");
  if (cap_env && *cap_env) {
    Isa cap;
    if (!isa_from_name(cap_env, &cap))
      fail(2, std::string("MOEJIT_MAX_ISA = ") + cap_env + " is not one of " + moejit::jit::tier_names());
    if (int(cap) < int(isa)) isa = cap;
  }
  return isa;
}

moejit::formats::ScaleDtype parse_scale_dtype(const std::string& s) {
  if (s == "bf16") return moejit::formats::ScaleDtype::bf16;
  if (s == "f32") return moejit::formats::ScaleDtype::f32;
  fail(2, "--scale-dtype " + s + " must be bf16 or f32");
}

void check_scalar(Isa isa) {
  if (isa == Isa::scalar) fail(1, "the scalar tier runs portable C++ (formats/), it has no generated code");
}

// --no-vbmi needs a kernel whose decode would use AVX512_VBMI (one of a layer's formats).
void check_no_vbmi(bool no_vbmi, std::initializer_list<Format> formats, Isa isa) {
  if (!no_vbmi) return;
  for (Format f : formats)
    if (moejit::jit::needs_vbmi(isa, moejit::formats::kernel_format(f), 0)) return;
  fail(2, "--no-vbmi applies only to 8-bit formats and q4_0 on avx512_bf16");
}

std::shared_ptr<const moejit::jit::Kernel> generate(const moejit::jit::KernelKey& key) {
  std::string err;
  auto k = moejit::jit::global_cache().get(key, &err);
  if (!k) fail(1, key.name() + ": " + err);
  return k;
}

json key_json(const moejit::jit::KernelKey& k) {
  return {{"format", k.format},
          {"format_name", moejit::formats::format_name(Format(k.format))},
          {"k", k.k},
          {"rows", k.rows},
          {"tokens", k.tokens},
          {"scale_stride", k.scale_stride},
          {"scale_dtype", k.scale_dtype},
          {"group", k.group},
          {"isa", moejit::jit::isa_name(k.isa)},
          {"flags", k.flags}};
}

json kernel_json(const moejit::jit::Kernel& k) {
  json phases = json::array();
  for (const auto& [off, name] : k.phases()) phases.push_back({{"offset", off}, {"name", name}});
  return {{"name", k.key().name()},
          {"key", key_json(k.key())},
          {"code_size", k.code_size()},
          {"generator_version", moejit::jit::kGeneratorVersion},
          {"phases", phases}};
}

std::string listing(const moejit::jit::Kernel& k) {
  std::string text, err;
  if (!moejit::jit::kernel_listing(k, &text, &err)) fail(1, err + " (use --raw or --json)");
  return text;
}

void write_raw(const moejit::jit::Kernel& k, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail(1, "--raw " + path + ": " + std::strerror(errno));
  const bool ok = std::fwrite(k.code(), 1, k.code_size(), f) == k.code_size();
  if (std::fclose(f) != 0 || !ok) fail(1, "--raw " + path + ": write failed");
}

struct Args {
  std::string format, isa = "auto", scale_dtype = "bf16", raw, out_dir, gate_up = "concat", cpu = "host";
  std::string up_format, down_format;  // layer: "" = as --format
  int64_t k = 0, scale_stride = 0;
  int32_t rows = 0, tokens = 0, group_size = 0;
  int32_t hidden = 0, intermediate = 0, experts = 0, top_k = 0, max_tokens = 1, threads = 0;
  bool json = false, layer = false, list = false, no_vbmi = false, no_dedup = false;
};

// Workers of a default context: one per CPU of the affinity mask.
int affinity_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return 1;
  return std::max(1, CPU_COUNT(&mask));
}

// Checks the shape the way moejit_moe_create does (sizes, each projection's K
// rule: H for gate and up, I for down; ds_fp4 in every projection or none);
// *why if not.
bool layer_valid(const Args& a, const plan::MoeShape& l, std::string* why) {
  const struct {
    const char* name;
    int32_t v;
  } pos[] = {{"hidden", a.hidden},
             {"intermediate", a.intermediate},
             {"experts", a.experts},
             {"top-k", a.top_k},
             {"max-tokens", a.max_tokens}};
  for (const auto& p : pos)
    if (p.v < 1) {
      *why = std::string(p.name) + " = " + std::to_string(p.v) + " must be >= 1";
      return false;
    }
  if (a.top_k > a.experts) {
    *why = "top-k = " + std::to_string(a.top_k) + " exceeds experts = " + std::to_string(a.experts);
    return false;
  }
  if (int64_t(a.max_tokens) * a.top_k > (int64_t(1) << 24)) {
    *why = "max-tokens times top-k is too large";
    return false;
  }
  const auto ds = [](const plan::ProjFormat& p) { return moejit::formats::info(p.format).ds_numerics; };
  if (ds(l.gate) != ds(l.up) || ds(l.gate) != ds(l.down)) {
    *why = "ds_fp4's activation numerics apply to the whole layer: every projection is ds_fp4 or none is";
    return false;
  }
  const struct {
    const char* what;
    const plan::ProjFormat& f;
    int32_t k;
  } rules[] = {
      {"hidden", l.gate, a.hidden}, {"hidden", l.up, a.hidden}, {"intermediate", l.down, a.intermediate}};
  for (const auto& r : rules) {
    const char* w = "";
    if (!moejit::formats::k_is_valid(r.f.format, moejit::formats::default_group(r.f.format, r.f.group_size),
                                     r.k, &w)) {
      *why = std::string(r.what) + " = " + std::to_string(r.k) + " " + w + " (format " +
             moejit::formats::format_name(r.f.format) + ")";
      return false;
    }
  }
  return true;
}

// --cpu: this host's features, with the vendor asked for (the choices of
// jit::runtime_flags that depend on it: kFlagLinePrefetch, kFlagNearL1, the
// K-quants' decodes, kFlagRowOrder).
moejit::jit::CpuFeatures cpu_features(const std::string& cpu) {
  moejit::jit::CpuFeatures c = moejit::jit::host_features();
  if (cpu == "intel")
    c.intel = true;
  else if (cpu == "amd")
    c.intel = false;
  else if (cpu != "host")
    fail(2, "--cpu " + cpu + " must be host, intel or amd");
  return c;
}

int run_single(const Args& a, Format f, Isa isa) {
  if (a.k < 1 || a.rows < 1 || a.tokens < 1) fail(2, "--k, --rows and --tokens must be given and >= 1");
  if (a.k > INT32_MAX) fail(2, "--k " + std::to_string(a.k) + " is too large");
  const int32_t group = moejit::formats::default_group(f, a.group_size);
  const char* why = "";
  if (!moejit::formats::k_is_valid(f, group, a.k, &why)) fail(2, "--k " + std::to_string(a.k) + " " + why);
  if (a.scale_stride < 0) fail(2, "--scale-stride must be >= 0");
  plan::Target target;
  target.isa = isa;
  target.no_vbmi = a.no_vbmi;
  const moejit::jit::CpuFeatures cpu = cpu_features(a.cpu);
  target.cpu = &cpu;
  const plan::ProjFormat pf{f, parse_scale_dtype(a.scale_dtype), a.group_size};
  auto k = generate(plan::matrix_plan(target, pf, a.rows, a.k, a.scale_stride).key(a.rows, a.tokens));
  if (!a.raw.empty()) write_raw(*k, a.raw);
  if (!a.out_dir.empty()) {
    std::string err;
    if (!moejit::jit::write_kernel_files(*k, a.out_dir, &err)) fail(1, "--out-dir: " + err);
  }
  if (a.json)
    std::printf("%s\n", kernel_json(*k).dump(2).c_str());
  else
    std::fputs(listing(*k).c_str(), stdout);
  return 0;
}

int run_layer(const Args& a, Format f, Isa isa) {
  if (!a.raw.empty()) fail(2, "--raw writes one kernel; use --out-dir with --layer");
  if (a.gate_up != "concat" && a.gate_up != "interleaved" && a.gate_up != "separate")
    fail(2, "--gate-up " + a.gate_up + " must be concat, interleaved or separate");
  const bool separate = a.gate_up == "separate";
  if (!a.up_format.empty() && !separate)
    fail(2, "--up-format needs --gate-up separate (a fused gate_up is one matrix in one format)");
  const moejit::formats::ScaleDtype sdt = parse_scale_dtype(a.scale_dtype);
  plan::MoeShape l;
  l.gate = {f, sdt, a.group_size};
  l.up = a.up_format.empty() ? l.gate
                             : plan::ProjFormat{parse_format(a.up_format, "--up-format"), sdt, a.group_size};
  l.down = a.down_format.empty()
               ? l.gate
               : plan::ProjFormat{parse_format(a.down_format, "--down-format"), sdt, a.group_size};
  check_no_vbmi(a.no_vbmi, {l.gate.format, l.up.format, l.down.format}, isa);
  l.hidden = a.hidden;
  l.intermediate = a.intermediate;
  l.top_k = a.top_k;
  l.max_tokens = a.max_tokens;
  l.gate_up = separate                     ? plan::GateUp::separate
              : a.gate_up == "interleaved" ? plan::GateUp::interleaved
                                           : plan::GateUp::concat;
  plan::Target target;
  const char* dedup_env = std::getenv("MOEJIT_DEDUP");
  target.dedup = !a.no_dedup && !(dedup_env && std::strcmp(dedup_env, "0") == 0);
  const char* tiles_env = std::getenv("MOEJIT_TILES");  // as a context created now would plan
  target.all_tiles = tiles_env && std::strcmp(tiles_env, "all") == 0;
  target.isa = isa;
  target.no_vbmi = a.no_vbmi;
  const moejit::jit::CpuFeatures cpu = cpu_features(a.cpu);
  target.cpu = &cpu;
  if (a.threads < 0) fail(2, "--threads must be >= 0");
  target.threads = a.threads > 0 ? a.threads : affinity_cpus();
  std::string why;
  if (!layer_valid(a, l, &why)) fail(2, why);
  const plan::MoePlan p = plan::moe_plan(l, target);
  const std::vector<moejit::jit::KernelKey> keys = p.keys();
  // Check every key before printing anything, so an unsupported layer prints one line.
  for (const auto& key : keys)
    if (!moejit::jit::gemv_supported(key, &why)) fail(1, key.name() + ": " + why);
  if (a.list) {
    if (a.json) {
      json names = json::array();
      for (const auto& key : keys) names.push_back(key.name());
      std::printf("%s\n", names.dump(2).c_str());
    } else {
      for (const auto& key : keys) std::printf("%s\n", key.name().c_str());
    }
    return 0;
  }
  json all = json::array();
  for (size_t i = 0; i < keys.size(); ++i) {
    auto k = generate(keys[i]);
    if (!a.out_dir.empty()) {
      std::string err;
      if (!moejit::jit::write_kernel_files(*k, a.out_dir, &err)) fail(1, "--out-dir: " + err);
    }
    if (a.json) {
      all.push_back(kernel_json(*k));
    } else {
      if (i) std::printf("\n");
      std::fputs(listing(*k).c_str(), stdout);
    }
  }
  if (a.json)
    std::printf("%s\n", json{{"layer",
                              {{"format", moejit::formats::format_name(f)},
                               {"up_format", moejit::formats::format_name(l.up.format)},
                               {"down_format", moejit::formats::format_name(l.down.format)},
                               {"hidden", l.hidden},
                               {"intermediate", l.intermediate},
                               {"experts", a.experts},
                               {"top_k", l.top_k},
                               {"max_tokens", l.max_tokens},
                               {"gate_up", a.gate_up},
                               {"dedup", target.dedup},
                               {"threads", target.threads},
                               {"rows_per_call_gate_up", p.rows1},
                               {"rows_per_call_down", p.rows2},
                               {"isa", moejit::jit::isa_name(isa)}}},
                             {"kernels", all}}
                            .dump(2)
                            .c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "moejit-dump: generate the kernel moejit would use for a key, or every kernel of a MoE layer, and "
      "print "
      "its disassembly (Intel syntax) with the generator's phases marked."};
  Args a;
  app.add_option("--format", a.format, "bf16, fp8_block, ... (name or id)")->required();
  app.add_option("--k", a.k, "reduction length K (single kernel)");
  app.add_option("--rows", a.rows, "rows per call (single kernel)");
  app.add_option("--tokens", a.tokens, "tokens per call (single kernel)");
  app.add_option("--isa", a.isa,
                 "auto (host tier capped by MOEJIT_MAX_ISA), or a tier: " + moejit::jit::tier_names())
      ->capture_default_str();
  app.add_option("--scale-dtype", a.scale_dtype, "fp8_block scales: bf16 or f32 (every fp8_block projection)")
      ->capture_default_str();
  app.add_option("--scale-stride", a.scale_stride,
                 "scale elements between scale rows, 0 = dense (not part of fp8_block keys)")
      ->capture_default_str();
  app.add_option("--group-size", a.group_size, "mxfp8 group size, 0 = the format's default");
  app.add_flag("--no-vbmi", a.no_vbmi,
               "8-bit formats and q4_0 on avx512_bf16: the decode without AVX512_VBMI");
  app.add_option("--cpu", a.cpu,
                 "host, or the kernels the runtime picks on an intel or amd CPU with this CPU's features "
                 "(the vendor's flags: bf16's line prefetch, q2_K's decode, the row order)")
      ->capture_default_str();
  app.add_option("--raw", a.raw, "write the code bytes of the kernel to FILE")->type_name("FILE");
  app.add_option("--out-dir", a.out_dir, "write <name>.bin and <name>.s of every kernel to DIR")
      ->type_name("DIR");
  app.add_flag("--json", a.json, "print key, code size, generator version and phases as JSON");
  app.add_flag("--layer", a.layer, "every kernel of a MoE layer (--hidden --intermediate --experts --top-k)");
  app.add_option("--hidden", a.hidden, "layer: hidden size H");
  app.add_option("--intermediate", a.intermediate, "layer: intermediate size I");
  app.add_option("--experts", a.experts, "layer: number of experts");
  app.add_option("--top-k", a.top_k, "layer: experts per token");
  app.add_option("--max-tokens", a.max_tokens, "layer: largest tokens per forward call")
      ->capture_default_str();
  app.add_option("--gate-up", a.gate_up,
                 "layer: concat or interleaved rows of one gate_up matrix, or separate gate and up banks")
      ->capture_default_str();
  app.add_option("--up-format", a.up_format, "layer, separate banks: up's format (default: --format)");
  app.add_option("--down-format", a.down_format, "layer: down's format (default: --format)");
  app.add_option("--threads", a.threads,
                 "layer: worker threads of the context, 0 = CPUs of the affinity mask (the down row block "
                 "depends on it)")
      ->capture_default_str();
  app.add_flag("--no-dedup", a.no_dedup, "layer: one token per kernel call (as MOEJIT_DEDUP=0)");
  app.add_flag("--list", a.list, "layer: print kernel names only");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "moejit-dump: %s\n", e.what());
    return 2;
  }
  try {
    const Format f = parse_format(a.format);
    const Isa isa = resolve_isa(a.isa);
    check_scalar(isa);
    if (!a.layer) check_no_vbmi(a.no_vbmi, {f}, isa);
    if (a.list && !a.layer) fail(2, "--list needs --layer");
    if (!a.layer && (!a.up_format.empty() || !a.down_format.empty()))
      fail(2, "--up-format and --down-format need --layer");
    if (!a.layer && (a.hidden || a.intermediate || a.experts || a.top_k))
      fail(2, "--hidden, --intermediate, --experts and --top-k need --layer");
    if (a.layer && (a.k || a.rows || a.tokens)) fail(2, "--k, --rows and --tokens are not used with --layer");
    return a.layer ? run_layer(a, f, isa) : run_single(a, f, isa);
  } catch (const Failure& e) {
    std::fprintf(stderr, "moejit-dump: %s\n", e.why.c_str());
    return e.code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moejit-dump: %s\n", e.what());
    return 1;
  }
}
