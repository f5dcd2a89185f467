// moejit-info: what moejit sees on this machine: CPU, the features its tiers
// need, the tier each format runs on (asked of the library itself), caches,
// cores, the affinity mask and the environment variables in effect.
#include <sched.h>
#include <unistd.h>
#include <xbyak/xbyak_util.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "jit/gemv.h"
#include "jit/tiers.h"
#include "moejit.h"
#include "runtime/matmul.h"  // kPrefetchBytes

namespace {

using nlohmann::json;

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (f) std::getline(f, s);
  return s;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(line.find_first_not_of(" \t", c + 1));
    }
  // No /proc: the CPUID brand string.
  uint32_t regs[12] = {};
  Xbyak::util::Cpu::getCpuid(0x80000000u, regs);
  if (regs[0] < 0x80000004u) return "unknown";
  for (uint32_t i = 0; i < 3; ++i) Xbyak::util::Cpu::getCpuid(0x80000002u + i, regs + 4 * i);
  std::string s(reinterpret_cast<const char*>(regs), sizeof(regs));
  s = s.c_str();
  const size_t b = s.find_first_not_of(' ');
  return b == std::string::npos ? "unknown" : s.substr(b);
}

// CPUID family/model/stepping: names the microarchitecture when the model
// name is generic (virtual machines often report just the vendor).
std::string cpu_signature() {
  Xbyak::util::Cpu cpu;
  char buf[96];
  std::snprintf(buf, sizeof(buf), "family 0x%x model 0x%x stepping %u", unsigned(cpu.displayFamily),
                unsigned(cpu.displayModel), unsigned(cpu.stepping));
  return buf;
}

// Every feature bit of the tier table (jit/tiers.h), as moejit's CPU detection
// (jit/cpu.cpp) sees it: the OS's tile-data permission included.
std::vector<std::pair<std::string, bool>> features() {
  std::vector<std::pair<std::string, bool>> r;
  for (int bit = 0; bit < moejit::jit::kFeatureCount; ++bit)
    r.emplace_back(moejit::jit::feature_name(bit), moejit::jit::host_features().has(1u << bit));
  return r;
}

bool has_feature(const std::vector<std::pair<std::string, bool>>& f, const std::string& name) {
  for (const auto& [n, v] : f)
    if (n == name) return v;
  return false;
}

// "0-3,6" from a CPU set.
std::string cpu_list(const std::vector<int>& cpus) {
  std::string s;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(cpus[i]);
    if (j > i) s += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return s;
}

struct Topology {
  int online = 0, cores = 0, sockets = 0;
  std::vector<int> affinity;
};

Topology topology() {
  Topology t;
  t.online = int(sysconf(_SC_NPROCESSORS_ONLN));
  std::set<std::pair<std::string, std::string>> cores;
  std::set<std::string> sockets;
  const long conf = sysconf(_SC_NPROCESSORS_CONF);
  for (long c = 0; c < conf; ++c) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    const std::string pkg = read_line(base + "physical_package_id"), core = read_line(base + "core_id");
    if (pkg.empty()) continue;
    sockets.insert(pkg);
    cores.insert({pkg, core});
  }
  t.cores = int(cores.size());
  t.sockets = int(sockets.size());
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mask)) t.affinity.push_back(c);
  return t;
}

struct Cache {
  int level = 0;
  std::string type, size, shared_with;
};

std::vector<Cache> caches() {
  std::vector<Cache> r;
  for (int i = 0;; ++i) {
    const std::string base = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    const std::string level = read_line(base + "level");
    if (level.empty()) break;
    Cache c;
    c.level = std::atoi(level.c_str());
    c.type = read_line(base + "type");
    c.size = read_line(base + "size");
    c.shared_with = read_line(base + "shared_cpu_list");
    r.push_back(c);
  }
  return r;
}

std::string cache_name(const Cache& c) {
  std::string n = "L" + std::to_string(c.level);
  if (c.type == "Data") n += "d";
  if (c.type == "Instruction") n += "i";
  return n;
}

struct FormatTier {
  std::string format;
  bool supported = false;
  std::string tier;    // tier a layer of this format runs on
  std::string detail;  // decode path, or why not
};

// How the kernels of a format decode on a tier (docs/ARCHITECTURE.md).
std::string decode_detail(moejit::formats::Format f, moejit_isa isa, bool vbmi) {
  if (isa == MOEJIT_ISA_SCALAR) return "";
  namespace J = moejit::jit;
  const moejit::formats::Format kf = moejit::formats::kernel_format(f);
  const J::Isa tier = J::Isa(int(isa));
  const char* tiles_env = std::getenv("MOEJIT_TILES");  // what a context created now runs
  const bool all_tiles = tiles_env && std::strcmp(tiles_env, "all") == 0;
  const J::Isa kernels =
      J::kernel_isa(tier, kf, moejit::formats::default_group(f, 0), vbmi ? 0 : J::kFlagNoVbmi, all_tiles);
  uint32_t flags = kernels == J::Isa::avx512_bf16 && !vbmi ? J::kFlagNoVbmi : 0;
  // The K-quants' bf16 pairs where the runtime asks for them (AMD; q6_K and q3_K on Intel).
  flags |= J::runtime_flags(kernels, kf, moejit::formats::default_group(f, 0)) & J::kFlagBf16Pairs;
  std::string path = J::decode_path(kernels, kf, flags);
  // How formats the hardware prefetchers stream (bf16) prefetch on this CPU (jit/gemv.h).
  if (!J::streams_with_prefetch(kf))
    path += J::runtime_flags(kernels, kf, 0) & J::kFlagLinePrefetch
                ? "; prefetch: every line ~" + std::to_string(moejit::kPrefetchBytes / 1024) +
                      " KiB ahead (Intel)"
                : std::string("; prefetch: the next call (one line per KiB of it with one token)");
  // A tier without kernels of its own for the format runs its vector tier's
  // (avx512_amx: the formats it runs on avx512_bf16 kernels, docs/FORMATS.md).
  return kernels == tier ? path : std::string(J::isa_name(kernels)) + " kernels: " + path;
}

// How the row kernels of a context of tier `isa` prefetch the weights on this
// CPU (jit/gemv.h: each line of a later call, and the line ahead in the call's
// own stream, into L2 or, kFlagNearL1, into L1). Empty where no row kernels run.
std::string prefetch_note(moejit_isa isa) {
  namespace J = moejit::jit;
  if (isa == MOEJIT_ISA_SCALAR) return "";
  // q8_0 runs row kernels on every tier (avx512_amx: avx512_bf16's).
  const J::Isa rows = J::kernel_isa(J::Isa(int(isa)), moejit::formats::Format::q8_0, 32);
  const bool l1 = J::runtime_flags(rows, moejit::formats::Format::q8_0, 32) & J::kFlagNearL1;
  return "row kernels: every line ~" + std::to_string(moejit::kPrefetchBytes / 1024) +
         " KiB ahead into L2 (a later call; bf16 as its line says), and " +
         (l1 ? std::to_string(J::kNearL1PrefetchBytes / 1024) + " KiB ahead in the stream into L1 (Intel)"
             : std::to_string(J::kNearPrefetchBytes / 1024) + " KiB ahead in the stream into L2");
}

// Asks the library: a 16 x 256 dense layer of each format on a default context.
std::vector<FormatTier> format_tiers(std::string* context_error, moejit_isa* context_isa) {
  std::vector<FormatTier> r;
  moejit_context_desc cd{};
  cd.struct_size = sizeof(cd);
  cd.num_threads = 1;
  moejit_context* ctx = nullptr;
  if (moejit_context_create(&cd, &ctx) != MOEJIT_OK) {
    *context_error = moejit_last_error();
    return r;
  }
  const moejit_isa isa = moejit_context_isa(ctx);
  *context_isa = isa;
  const bool vbmi = has_feature(features(), "avx512_vbmi");
  constexpr int32_t kRows = 16, kCols = 256;
  for (int32_t id = 0; id <= moejit_max_format_id(); ++id) {
    namespace F = moejit::formats;
    const F::Format f = F::Format(id);
    const int32_t group = F::default_group(f, 0);
    std::vector<uint8_t> data(size_t(kRows * F::row_bytes(f, kCols)));
    std::vector<uint8_t> scales(
        size_t(std::max<int64_t>(1, F::scale_rows(f, kRows) * F::scale_cols(f, group, kCols) * 4)));
    std::vector<float> row_scales(kRows, 1.0f);
    moejit_linear_desc d{};
    d.struct_size = sizeof(d);
    d.format = moejit_format(id);
    d.scale_dtype = MOEJIT_DTYPE_BF16;
    d.rows = kRows;
    d.cols = kCols;
    d.max_tokens = 1;
    d.weight.data = data.data();
    d.weight.scales = F::has_block_scales(f) ? scales.data() : nullptr;
    d.weight.row_scales = F::has_row_scales(f) ? row_scales.data() : nullptr;
    d.output_dtype = MOEJIT_DTYPE_BF16;
    FormatTier t;
    t.format = moejit_format_name(moejit_format(id));
    moejit_linear* lin = nullptr;
    const moejit_status st = moejit_linear_create(ctx, &d, &lin);
    if (st == MOEJIT_OK) {
      t.supported = true;
      t.tier = moejit_isa_name(isa);
      t.detail = decode_detail(f, isa, vbmi);
      moejit_linear_destroy(lin);
    } else {
      t.tier = "unsupported in this build";
      t.detail = std::string(moejit_status_name(st)) + ": " + moejit_last_error();
    }
    r.push_back(t);
  }
  moejit_context_destroy(ctx);
  return r;
}

const char* const kEnvVars[] = {"MOEJIT_MAX_ISA", "MOEJIT_DEDUP",    "MOEJIT_DEDUP_DEBUG",
                                "MOEJIT_TILES",   "MOEJIT_DUMP_DIR", "MOEJIT_PERF_MAP"};

// What a value of each variable does (runtime/capi.cpp, jit/kernel_dump.cpp).
std::string env_effect(const std::string& name, const char* v) {
  const bool set = v && *v;
  if (name == "MOEJIT_MAX_ISA") return set ? std::string("caps the context tier at ") + v : "no cap";
  if (name == "MOEJIT_DEDUP") return set && std::strcmp(v, "0") == 0 ? "expert dedup off" : "expert dedup on";
  if (name == "MOEJIT_DEDUP_DEBUG")
    return set && std::strcmp(v, "1") == 0 ? "one stderr line per MoE call" : "off";
  if (name == "MOEJIT_TILES")
    return set && std::strcmp(v, "all") == 0 ? "avx512_amx: tile kernels for every format"
                                             : "avx512_amx: each format's kernels (docs/FORMATS.md)";
  if (name == "MOEJIT_DUMP_DIR") return set ? std::string("new kernels written to ") + v : "off";
  if (name == "MOEJIT_PERF_MAP")
    return set && std::strcmp(v, "1") == 0 ? "new kernels appended to /tmp/perf-<pid>.map" : "off";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moejit-info: the CPU, tiers, formats, caches, cores and environment moejit sees."};
  bool as_json = false;
  app.add_flag("--json", as_json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "moejit-info: %s\n", e.what());
    return 2;
  }

  // Environment first: the format probe below must not dump its own kernels.
  std::vector<std::pair<std::string, std::string>> env;
  json env_j = json::object();
  for (const char* name : kEnvVars) {
    const char* v = std::getenv(name);
    env.push_back({name, v ? v : ""});
    env_j[name] = {{"value", v ? json(v) : json(nullptr)}, {"effect", env_effect(name, v)}};
  }
  unsetenv("MOEJIT_DUMP_DIR");
  unsetenv("MOEJIT_PERF_MAP");

  const std::string model = cpu_model();
  const auto feats = features();
  const Topology topo = topology();
  const auto cache_list = caches();
  std::string ctx_error;
  moejit_isa ctx_isa = MOEJIT_ISA_SCALAR;
  const auto tiers = format_tiers(&ctx_error, &ctx_isa);
  const std::string ctx_tier = moejit_isa_name(ctx_isa);
  const char* host = moejit_isa_name(moejit_host_isa());

  if (as_json) {
    json j;
    j["moejit_version"] = moejit_version();
    j["abi_version"] = moejit_abi_version();
    j["cpu_model"] = model;
    j["cpu_signature"] = cpu_signature();
    j["features"] = json::object();
    for (const auto& [n, v] : feats) j["features"][n] = v;
    j["tile_data"] = moejit::jit::host_features().tile_data_note;
    j["tiers"] = json::array();
    for (int i = 0; i < moejit::jit::kTierCount; ++i) {
      const moejit::jit::TierInfo& t = moejit::jit::tier(i);
      j["tiers"].push_back({{"name", t.name},
                            {"needs", t.needs},
                            {"available", moejit::jit::isa_available(t.isa)},
                            {"kernels", moejit::jit::isa_name(moejit::jit::kernel_isa(t.isa))}});
    }
    j["host_isa"] = host;
    j["context_isa"] = ctx_error.empty() ? json(ctx_tier) : json(nullptr);
    if (!ctx_error.empty()) j["context_error"] = ctx_error;
    j["formats"] = json::array();
    for (const auto& t : tiers)
      j["formats"].push_back(
          {{"format", t.format}, {"supported", t.supported}, {"tier", t.tier}, {"detail", t.detail}});
    j["prefetch"] = prefetch_note(ctx_isa);
    j["caches"] = json::array();
    for (const auto& c : cache_list)
      j["caches"].push_back({{"name", cache_name(c)}, {"size", c.size}, {"shared_cpu_list", c.shared_with}});
    j["cpus_online"] = topo.online;
    j["cores"] = topo.cores;
    j["sockets"] = topo.sockets;
    j["affinity"] = cpu_list(topo.affinity);
    j["affinity_count"] = topo.affinity.size();
    j["environment"] = env_j;
    std::printf("%s\n", j.dump(2).c_str());
    return ctx_error.empty() ? 0 : 1;
  }

  std::printf("moejit %s (ABI %u)\n", moejit_version(), moejit_abi_version());
  std::printf("cpu         %s (%s)\n", model.c_str(), cpu_signature().c_str());
  std::printf("features   ");
  for (const auto& [n, v] : feats) std::printf(" %s%s", v ? "+" : "-", n.c_str());
  std::printf("\ntile data   %s\n", moejit::jit::host_features().tile_data_note);
  std::printf("tiers      ");
  for (int i = 0; i < moejit::jit::kTierCount; ++i) {
    const moejit::jit::TierInfo& t = moejit::jit::tier(i);
    std::printf(" %s%s", moejit::jit::isa_available(t.isa) ? "+" : "-", t.name);
  }
  std::printf("\nhost tier   %s\n", host);
  if (ctx_error.empty())
    std::printf("context     %s (default context: host tier capped by MOEJIT_MAX_ISA)\n", ctx_tier.c_str());
  else
    std::printf("context     cannot be created: %s\n", ctx_error.c_str());
  std::printf("formats\n");
  for (const auto& t : tiers) {
    std::printf("  %-11s %s", t.format.c_str(), t.tier.c_str());
    if (t.supported && !t.detail.empty()) std::printf(", %s", t.detail.c_str());
    std::printf("\n");
  }
  if (const std::string pf = prefetch_note(ctx_isa); !pf.empty()) std::printf("prefetch    %s\n", pf.c_str());
  std::printf("caches     ");
  for (const auto& c : cache_list)
    std::printf(" %s %s (cpus %s)%s", cache_name(c).c_str(), c.size.c_str(), c.shared_with.c_str(),
                &c == &cache_list.back() ? "" : ",");
  std::printf("\ncpus        %d online, %d cores, %d socket%s\n", topo.online, topo.cores, topo.sockets,
              topo.sockets == 1 ? "" : "s");
  std::printf("affinity    %s (%zu cpus: default worker count)\n", cpu_list(topo.affinity).c_str(),
              topo.affinity.size());
  std::printf("environment\n");
  for (const auto& [n, v] : env)
    std::printf("  %-19s %-12s %s\n", n.c_str(), v.empty() ? "(unset)" : v.c_str(),
                env_effect(n, v.empty() ? nullptr : v.c_str()).c_str());
  return ctx_error.empty() ? 0 : 1;
}
