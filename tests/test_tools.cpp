// The dump path (jit/kernel_dump.*) and the tools built on it: listings of
// every format x tier this CPU has hold the instructions that tier must use and
// none it must not; MOEJIT_DUMP_DIR and MOEJIT_PERF_MAP; the layer plan
// (runtime/plan.h, what moejit-dump --layer prints) against the kernels a real
// MoE layer generates; the tools' exit codes.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "jit/gemv.h"
#include "jit/kernel_cache.h"
#include "jit/kernel_dump.h"
#include "jit/tile_body.h"
#include "moejit.h"
#include "runtime/plan.h"

namespace {

using moejit::formats::Format;
namespace jit = moejit::jit;
namespace plan = moejit::plan;

// The key the runtime builds for one call of `rows` rows and `tokens` tokens of
// a [*, k] matrix with dense scales (runtime/plan.h).
jit::KernelKey runtime_key(Format f, int64_t k, jit::Isa isa, int rows, int tokens, bool no_vbmi = false) {
  plan::Target t;
  t.isa = isa;
  t.no_vbmi = no_vbmi;
  return plan::matrix_plan(t, {f}, rows, k, 0).key(rows, tokens);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string make_temp_dir() {
  char tmpl[] = "/tmp/moejit_test_tools_XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d ? std::string(d) : std::string();
}

void remove_tree(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") std::remove((dir + "/" + n).c_str());
    }
    closedir(d);
  }
  ::rmdir(dir.c_str());
}

std::set<std::string> files_with_suffix(const std::string& dir, const std::string& suffix) {
  std::set<std::string> r;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
        r.insert(n.substr(0, n.size() - suffix.size()));
    }
    closedir(d);
  }
  return r;
}

// Sets an environment variable for one scope, restoring the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// ---- listings per format x tier ----

struct TierCase {
  const char* name;
  Format format;
  jit::Isa isa;
  bool no_vbmi;
  std::vector<const char*> must;      // mnemonics the tier's code path uses
  std::vector<const char*> must_not;  // mnemonics or registers it must not use
};

const std::vector<TierCase>& tier_cases() {
  static const std::vector<TierCase> cases = {
      {"bf16_avx2", Format::bf16, jit::Isa::avx2, false, {"vfmadd231ps"}, {"zmm\\d+", "vdpbf16ps"}},
      // The tile kernels: the tile unit configured, used and released; the
      // 8-bit decodes' words in natural order (vpermi2b, no unpacks).
      {"bf16_avx512_amx",
       Format::bf16,
       jit::Isa::avx512_amx,
       false,
       {"ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored", "tilerelease", "vshuff32x4"},
       {"vdpbf16ps"}},
      {"fp8_block_avx512_amx",
       Format::fp8_block,
       jit::Isa::avx512_amx,
       false,
       {"ldtilecfg", "vpermi2b", "tdpbf16ps", "tilezero", "vfmadd231ps", "tilerelease"},
       {"vdpbf16ps", "vpunpcklbw"}},
      {"mxfp8_e5m2_avx512_amx",
       Format::mxfp8_e5m2,
       jit::Isa::avx512_amx,
       false,
       {"vpermi2b", "tdpbf16ps", "vfmadd231ps", "tilerelease"},
       {"vdpbf16ps", "vpunpckhbw"}},
      {"q8_0_avx512_amx",
       Format::q8_0,
       jit::Isa::avx512_amx,
       false,
       {"vpabsb", "vpermi2b", "tdpbf16ps", "vcvtph2ps", "tilerelease"},
       {"vdpbf16ps", "vcvtdq2ps"}},
      // The 4-bit tile decodes: one block or group per tile row.
      {"q4_0_avx512_amx",
       Format::q4_0,
       jit::Isa::avx512_amx,
       false,
       {"vpmovzxbw", "vpsrlvw", "vpermw", "tdpbf16ps", "vcvtph2ps", "tilerelease"},
       {"vdpbf16ps", "vpermt2b"}},
      {"mxfp4_avx512_amx",
       Format::mxfp4,
       jit::Isa::avx512_amx,
       false,
       {"vpermb", "vpsrlvw", "vpermw", "tdpbf16ps", "vfmadd231ps", "tilerelease"},
       {"vdpbf16ps"}},
      {"bf16_avx512", Format::bf16, jit::Isa::avx512, false, {"vfmadd231ps", "zmm\\d+"}, {"vdpbf16ps"}},
      {"bf16_avx512_bf16", Format::bf16, jit::Isa::avx512_bf16, false, {"vdpbf16ps", "zmm\\d+"}, {}},
      {"fp8_block_avx2",
       Format::fp8_block,
       jit::Isa::avx2,
       false,
       {"vcvtph2ps", "vfmadd231ps"},
       {"zmm\\d+", "vdpbf16ps"}},
      {"fp8_block_avx512",
       Format::fp8_block,
       jit::Isa::avx512,
       false,
       {"vcvtph2ps", "vfmadd231ps", "zmm\\d+"},
       {"vdpbf16ps"}},
      {"fp8_block_avx512_bf16",
       Format::fp8_block,
       jit::Isa::avx512_bf16,
       false,
       {"vpermi2b", "vdpbf16ps"},
       {"vpermw", "vcvtph2ps"}},
      {"fp8_block_avx512_bf16_novbmi",
       Format::fp8_block,
       jit::Isa::avx512_bf16,
       true,
       {"vpermw", "vdpbf16ps"},
       {"vpermi2b", "vpermb", "vcvtph2ps"}},
      // mxfp8 with the default group of 32: byte tables, two e8m0 scales per 64-element block
      {"mxfp8_e4m3_avx512_bf16",
       Format::mxfp8_e4m3,
       jit::Isa::avx512_bf16,
       false,
       {"vpermi2b", "vdpbf16ps", "k3"},
       {"vcvtph2ps"}},
      {"mxfp8_e4m3_avx512_bf16_novbmi",
       Format::mxfp8_e4m3,
       jit::Isa::avx512_bf16,
       true,
       {"vpermw", "vdpbf16ps"},
       {"vpermi2b"}},
      {"mxfp8_e5m2_avx512_bf16",
       Format::mxfp8_e5m2,
       jit::Isa::avx512_bf16,
       false,
       {"vpermi2b", "vdpbf16ps", "k3"},
       {"vcvtph2ps"}},
      {"mxfp8_e5m2_avx512_bf16_novbmi",
       Format::mxfp8_e5m2,
       jit::Isa::avx512_bf16,
       true,
       {"vcvtph2ps", "vfmadd231ps"},
       {"vdpbf16ps", "vpermi2b"}},
      {"mxfp8_e4m3_avx2",
       Format::mxfp8_e4m3,
       jit::Isa::avx2,
       false,
       {"vcvtph2ps", "vfmadd231ps"},
       {"zmm\\d+"}},
      {"mxfp4_avx2",
       Format::mxfp4,
       jit::Isa::avx2,
       false,
       {"vpermps", "vfmadd231ps"},
       {"zmm\\d+", "vdpbf16ps"}},
      {"mxfp4_avx512_bf16",
       Format::mxfp4,
       jit::Isa::avx512_bf16,
       false,
       {"vpsrlw", "vpermw", "vdpbf16ps", "vpermps", "vpmaxud"},
       {"vcvtdq2ps", "vpmultishiftqb", "vbroadcastss"}},
      {"nvfp4_avx2",
       Format::nvfp4,
       jit::Isa::avx2,
       false,
       {"vpermps", "vfmadd231ps", "vmulss"},
       {"zmm\\d+", "vdpbf16ps"}},
      {"nvfp4_avx512",
       Format::nvfp4,
       jit::Isa::avx512,
       false,
       {"vpermps", "vfmadd231ps", "vmulss", "zmm\\d+", "k3"},
       {"vdpbf16ps"}},
      {"nvfp4_avx512_bf16",
       Format::nvfp4,
       jit::Isa::avx512_bf16,
       false,
       {"vpsrlw", "vpermw", "vdpbf16ps", "vcvtph2ps", "vmulss"},
       {"vpmultishiftqb"}},
      {"q4_0_avx512_bf16",
       Format::q4_0,
       jit::Isa::avx512_bf16,
       false,
       {"vpermt2b", "vpsrlw", "vpermw", "vdpbf16ps", "vcvtph2ps"},
       {"vinserti32x4", "vcvtdq2ps", "vpmultishiftqb"}},
      {"q4_0_avx512_bf16_novbmi",
       Format::q4_0,
       jit::Isa::avx512_bf16,
       true,
       {"vinserti32x4", "vpsrlw", "vpermw", "vdpbf16ps", "vcvtph2ps"},
       {"vpermt2b", "vcvtdq2ps"}},
      {"q4_0_avx2",
       Format::q4_0,
       jit::Isa::avx2,
       false,
       {"vpmovzxbd", "vcvtdq2ps", "vcvtph2ps"},
       {"zmm\\d+"}},
      {"q8_0_avx512_bf16",
       Format::q8_0,
       jit::Isa::avx512_bf16,
       false,
       {"vpabsb", "vpermi2b", "vdpbf16ps", "vcvtph2ps"},
       {"vcvtdq2ps"}},
      {"q8_0_avx512_bf16_novbmi",
       Format::q8_0,
       jit::Isa::avx512_bf16,
       true,
       {"vpmovsxbd", "vcvtdq2ps", "vfmadd231ps"},
       {"vpermi2b", "vdpbf16ps"}},
      {"q8_0_avx512",
       Format::q8_0,
       jit::Isa::avx512,
       false,
       {"vpmovsxbd", "vcvtdq2ps", "zmm\\d+"},
       {"vdpbf16ps"}},
  };
  return cases;
}

// Instruction lines of a listing (comment lines and data bytes left out).
std::vector<std::string> instruction_lines(const std::string& listing) {
  std::vector<std::string> r;
  std::istringstream in(listing);
  bool data = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("; --- ", 0) == 0) data = line == "; --- data ---";
    if (line.empty() || line[0] == ';' || data) continue;
    r.push_back(line);
  }
  return r;
}

bool uses(const std::vector<std::string>& lines, const std::string& word) {
  const std::regex re("\\b" + word + "\\b");
  for (const auto& l : lines)
    if (std::regex_search(l, re)) return true;
  return false;
}

// Kernels with a tail (K % 128 != 0), several rows and tokens: every phase appears.
class TierListing : public ::testing::TestWithParam<TierCase> {};

// Only the code is read, so every tier's kernels are generated on any CPU
// (gemv_supported's run_here); without VBMI the plan picks other decodes.
TEST_P(TierListing, UsesTheTiersInstructions) {
  const TierCase& c = GetParam();
  if (!jit::disassembler_available()) GTEST_SKIP() << "this build has no Zydis: no listings";
  // The plan's flags follow the host: without VBMI it picks other decodes (and
  // avx512_amx's byte-table formats have none).
  if (!jit::host_features().avx512_vbmi &&
      (c.isa == jit::Isa::avx512_amx ||
       (c.isa == jit::Isa::avx512_bf16 && !c.no_vbmi && jit::needs_vbmi(c.isa, c.format, 0))))
    GTEST_SKIP() << "this CPU lacks AVX512_VBMI: the plan picks the decodes without byte tables";
  // K with a tail where the format allows any K; block formats need multiples of 32.
  const bool any_k = c.format == Format::bf16 || c.format == Format::fp8_block;
  jit::KernelKey key = runtime_key(c.format, any_k ? 1000 : 1024, c.isa, 5, 2, c.no_vbmi);
  // Tile kernels the layers do not run (jit/gemv.h, kernel_isa): the same key on the tile tier,
  // less the row kernels' near prefetch into L1 (Intel's kFlagNearL1; the tile body has none).
  if (c.isa == jit::Isa::avx512_amx && jit::has_tile_kernels(c.format, key.group)) {
    key.isa = c.isa;
    key.flags &= ~jit::kFlagNearL1;
  }
  ASSERT_EQ(key.isa, c.isa);
  ASSERT_EQ(key.flags, jit::runtime_flags(c.isa, c.format, key.group) | (c.no_vbmi ? jit::kFlagNoVbmi : 0u));
  std::string err;
  auto k = jit::generate_gemv(key, &err, /*run_here=*/false);
  ASSERT_TRUE(k) << key.name() << ": " << err;
  std::string listing;
  ASSERT_TRUE(jit::kernel_listing(*k, &listing, &err)) << err;
  EXPECT_EQ(listing.rfind("; " + key.name() + "\n", 0), 0u) << listing.substr(0, 200);
  EXPECT_NE(listing.find("; code size " + std::to_string(k->code_size()) + " bytes"), std::string::npos);
  // The tile body's multiply phase is tdp (tileloadd, tdpbf16ps).
  const char* mul = c.isa == jit::Isa::avx512_amx ? "tdp" : "fma";
  for (const char* p : {"prologue", "decode", mul, "tail", "store", "epilogue"}) {
    if (!any_k && std::string(p) == "tail") continue;
    EXPECT_NE(listing.find(std::string("; --- ") + p + " ---"), std::string::npos) << key.name() << ": " << p;
  }
  const auto lines = instruction_lines(listing);
  ASSERT_GT(lines.size(), 20u) << key.name();
  EXPECT_FALSE(uses(lines, "\\(bad\\)")) << key.name() << " has undecodable bytes";
  EXPECT_TRUE(uses(lines, "ret")) << key.name();
  for (const char* m : c.must) EXPECT_TRUE(uses(lines, m)) << key.name() << " does not use " << m;
  for (const char* m : c.must_not) EXPECT_FALSE(uses(lines, m)) << key.name() << " uses " << m;
}

INSTANTIATE_TEST_SUITE_P(All, TierListing, ::testing::ValuesIn(tier_cases()),
                         [](const ::testing::TestParamInfo<TierCase>& i) {
                           return std::string(i.param.name);
                         });

// The plan carries the CPU's streaming choice for bf16 (jit::runtime_flags):
// on Intel its kernels take kFlagLinePrefetch and the layer prefetches a call
// about kPrefetchBytes ahead, elsewhere the next call. Other formats always
// prefetch far ahead and never take the flag.
TEST(Plan, Bf16LinePrefetchFollowsTheCpu) {
  const bool intel = jit::host_features().intel;
  for (jit::Isa isa : {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16, jit::Isa::avx512_amx}) {
    plan::Target t;
    t.isa = isa;
    const plan::MatrixPlan b = plan::matrix_plan(t, {Format::bf16}, 64, 2048, 0);
    EXPECT_EQ((b.flags & jit::kFlagLinePrefetch) != 0, intel) << jit::isa_name(isa);
    EXPECT_EQ(b.far_prefetch(), intel) << jit::isa_name(isa);
    EXPECT_EQ((b.key(32, 1).flags & jit::kFlagLinePrefetch) != 0, intel) << jit::isa_name(isa);
    for (Format f : {Format::fp8_block, Format::q4_K, Format::mxfp4}) {
      const plan::MatrixPlan m = plan::matrix_plan(t, {f}, 64, 2048, 0);
      EXPECT_EQ(m.flags & jit::kFlagLinePrefetch, 0u) << jit::isa_name(isa);
      EXPECT_TRUE(m.far_prefetch()) << jit::isa_name(isa);
    }
  }
}

// On avx512_amx the plan runs tile kernels for bf16 and fp8_block and the
// avx512_bf16 kernels for the other formats; with Target::all_tiles
// (MOEJIT_TILES=all) tile kernels for every format, their keys on the tile
// tier, with that tier's flags. Other tiers ignore it.
TEST(Plan, AllTilesRunsEveryFormatsTileKernels) {
  for (int32_t id = 0; id <= moejit::formats::kMaxFormatId; ++id) {
    const Format f = Format(id);
    for (bool all : {false, true}) {
      plan::Target t;
      t.isa = jit::Isa::avx512_amx;
      t.all_tiles = all;
      const plan::MatrixPlan m = plan::matrix_plan(t, {f}, 64, 2048, 0);
      const bool tiles = all || m.layout.format == Format::bf16 || m.layout.format == Format::fp8_block;
      EXPECT_EQ(m.isa, tiles ? jit::Isa::avx512_amx : jit::Isa::avx512_bf16)
          << moejit::formats::format_name(f) << " " << all;
      EXPECT_EQ(m.key(16, 1).isa, m.isa) << moejit::formats::format_name(f);
      EXPECT_EQ(m.flags & jit::kFlagBf16Pairs, tiles ? 0u : m.flags & jit::kFlagBf16Pairs)
          << moejit::formats::format_name(f);
      std::string why;
      EXPECT_TRUE(jit::gemv_supported(m.key(16, 3), &why, /*run_here=*/false))
          << moejit::formats::format_name(f) << ": " << why;
    }
    plan::Target t;
    t.isa = jit::Isa::avx512_bf16;
    t.all_tiles = true;
    EXPECT_EQ(plan::matrix_plan(t, {f}, 64, 2048, 0).isa, jit::Isa::avx512_bf16)
        << moejit::formats::format_name(f);
  }
}

// A plan for another vendor's CPU (plan::Target::cpu, moejit-dump --cpu) takes
// that vendor's flags: on Intel bf16's line prefetch, the AVX-512 row kernels'
// near prefetch into L1, q2_K's fp32 decode, q4_K's and q5_K's fp32 lanes and
// the pair kernels' row order (q6_K's); on AMD none of them and the pairs of all. The
// rest of the features stay the host's.
TEST(Plan, TargetCpuTakesTheVendorsFlags) {
  jit::CpuFeatures intel = jit::host_features(), amd = jit::host_features();
  intel.intel = true;
  amd.intel = false;
  for (jit::Isa isa : {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16}) {
    plan::Target t;
    t.isa = isa;
    t.cpu = &intel;
    EXPECT_NE(plan::matrix_plan(t, {Format::bf16}, 64, 2048, 0).flags & jit::kFlagLinePrefetch, 0u);
    const uint32_t q2_intel = plan::matrix_plan(t, {Format::q2_K}, 64, 2048, 0).flags;
    const uint32_t q4_intel = plan::matrix_plan(t, {Format::q4_K}, 64, 2048, 0).flags;
    const uint32_t q5_intel = plan::matrix_plan(t, {Format::q5_K}, 64, 2048, 0).flags;
    const uint32_t q6_intel = plan::matrix_plan(t, {Format::q6_K}, 64, 2048, 0).flags;
    // Intel's AVX-512 row kernels prefetch the stream ahead into L1, AMD's into L2.
    const bool avx512 = isa != jit::Isa::avx2;
    for (Format f : {Format::bf16, Format::fp8_block, Format::q4_K}) {
      t.cpu = &intel;
      EXPECT_EQ((plan::matrix_plan(t, {f}, 64, 2048, 0).flags & jit::kFlagNearL1) != 0, avx512)
          << jit::isa_name(isa);
      t.cpu = &amd;
      EXPECT_EQ(plan::matrix_plan(t, {f}, 64, 2048, 0).flags & jit::kFlagNearL1, 0u) << jit::isa_name(isa);
    }
    t.cpu = &amd;
    EXPECT_EQ(plan::matrix_plan(t, {Format::bf16}, 64, 2048, 0).flags & jit::kFlagLinePrefetch, 0u);
    const uint32_t q2_amd = plan::matrix_plan(t, {Format::q2_K}, 64, 2048, 0).flags;
    const uint32_t q4_amd = plan::matrix_plan(t, {Format::q4_K}, 64, 2048, 0).flags;
    const uint32_t q5_amd = plan::matrix_plan(t, {Format::q5_K}, 64, 2048, 0).flags;
    EXPECT_EQ(q2_intel & jit::kFlagBf16Pairs, 0u) << jit::isa_name(isa);
    EXPECT_EQ(q4_amd & jit::kFlagRowOrder, 0u) << jit::isa_name(isa);
    // The pairs are avx512_bf16's (q4_K's need GFNI, which the host may lack).
    const bool bf16 = isa == jit::Isa::avx512_bf16;
    EXPECT_EQ((q2_amd & jit::kFlagBf16Pairs) != 0, bf16) << jit::isa_name(isa);
    const bool q4_pairs = bf16 && jit::host_features().gfni;
    EXPECT_EQ((q4_amd & jit::kFlagBf16Pairs) != 0, q4_pairs) << jit::isa_name(isa);
    EXPECT_EQ((q5_amd & jit::kFlagBf16Pairs) != 0, q4_pairs) << jit::isa_name(isa);
    EXPECT_EQ(q4_intel & (jit::kFlagBf16Pairs | jit::kFlagRowOrder), 0u) << jit::isa_name(isa);
    EXPECT_EQ(q5_intel & (jit::kFlagBf16Pairs | jit::kFlagRowOrder), 0u) << jit::isa_name(isa);
    EXPECT_EQ(q6_intel & (jit::kFlagBf16Pairs | jit::kFlagRowOrder),
              bf16 ? jit::kFlagBf16Pairs | jit::kFlagRowOrder : 0u)
        << jit::isa_name(isa);
    // Without a cpu the plan is this host's.
    t.cpu = nullptr;
    EXPECT_EQ(plan::matrix_plan(t, {Format::q2_K}, 64, 2048, 0).flags,
              jit::host_features().intel ? q2_intel : q2_amd);
  }
  // On avx512_amx, Intel's tile kernels (bf16, fp8_block) have no near
  // prefetch; the formats it runs on avx512_bf16 kernels take the flag.
  plan::Target t;
  t.isa = jit::Isa::avx512_amx;
  t.cpu = &intel;
  for (Format f : {Format::bf16, Format::fp8_block, Format::q8_0, Format::q4_K}) {
    const plan::MatrixPlan m = plan::matrix_plan(t, {f}, 64, 2048, 0);
    EXPECT_EQ((m.flags & jit::kFlagNearL1) != 0, m.isa != jit::Isa::avx512_amx)
        << moejit::formats::format_name(f);
    std::string why;
    EXPECT_TRUE(jit::gemv_supported(m.key(16, 1), &why, /*run_here=*/false)) << why;
  }
}

// Every prefetch of a later call's line (base + distance register) is paired
// with one of the same offset kNearPrefetchBytes ahead in the call's own stream
// (base only; with kFlagNearL1 a prefetcht0 kNearL1PrefetchBytes ahead, and no
// other), and the later call's lines are covered with no gap: offsets 0,
// s, 2s, ... with s = 64 (one per line) or 1024 (bf16, one token, row body,
// without kFlagLinePrefetch). Tile kernels (avx512_amx) read 16 rows at once
// and have no near prefetch: row r's offsets are r * row_bytes + 0, 64, ...
// for each of the call's rows. On an AMX host the row body runs too, as
// avx512_bf16.
TEST(Listing, PrefetchesALaterCallAndTheStreamAhead) {
  if (!jit::disassembler_available()) GTEST_SKIP() << "this build has no Zydis";
  const jit::Isa host = jit::host_isa();
  if (host == jit::Isa::scalar) GTEST_SKIP() << "no JIT tier on this CPU";
  struct Case {
    Format format;
    int64_t k;
    int tokens;
    int64_t stride;
    uint32_t line_prefetch;  // kFlagLinePrefetch or 0, in place of the host's choice
  };
  const uint32_t lp = jit::kFlagLinePrefetch;
  const Case cases[] = {{Format::fp8_block, 1000, 1, 64, 0}, {Format::fp8_block, 2048, 4, 64, 0},
                        {Format::q8_0, 1024, 1, 64, 0},      {Format::mxfp4, 2880, 1, 64, 0},
                        {Format::q4_0, 768, 2, 64, 0},       {Format::bf16, 2048, 1, 1024, 0},
                        {Format::bf16, 2048, 1, 64, lp},     {Format::bf16, 1000, 3, 64, 0},
                        {Format::bf16, 1000, 3, 64, lp}};
  const std::regex far_re(R"(prefetcht1 \[(r\w+)\+(r\w+)\*1(?:\+0x([0-9a-f]+))?\])");
  const std::regex near_l2_re(R"(prefetcht1 \[(r\w+)\+0x([0-9a-f]+)\])");
  const std::regex near_l1_re(R"(prefetcht0 \[(r\w+)\+0x([0-9a-f]+)\])");
  std::vector<jit::Isa> isas = {host};
  if (host == jit::Isa::avx512_amx) isas.push_back(jit::Isa::avx512_bf16);
  const int rows = 3;
  for (jit::Isa isa : isas)
    for (const Case& c : cases)
      for (uint32_t l1 : {0u, jit::kFlagNearL1}) {
        if (l1 && isa == jit::Isa::avx512_amx) continue;  // the tile body has no near prefetch
        jit::KernelKey key = runtime_key(c.format, c.k, isa, rows, c.tokens);
        key.flags = (key.flags & ~(lp | jit::kFlagNearL1)) | c.line_prefetch | l1;
        const std::regex& near_re = l1 ? near_l1_re : near_l2_re;
        const std::regex& other_re = l1 ? near_l2_re : near_l1_re;
        const int64_t ahead = l1 ? jit::kNearL1PrefetchBytes : jit::kNearPrefetchBytes;
        std::string err, listing;
        auto k = jit::global_cache().get(key, &err);
        ASSERT_TRUE(k) << key.name() << ": " << err;
        ASSERT_TRUE(jit::kernel_listing(*k, &listing, &err)) << err;
        std::multiset<int64_t> far, near;
        std::set<std::string> bases;
        for (const auto& line : instruction_lines(listing)) {
          std::smatch m;
          if (std::regex_search(line, m, far_re)) {
            far.insert(m[3].matched ? std::stoll(m[3].str(), nullptr, 16) : 0);
            bases.insert(m[1].str());
          } else if (std::regex_search(line, m, near_re)) {
            near.insert(std::stoll(m[2].str(), nullptr, 16) - ahead);
            bases.insert(m[1].str());
          } else if (key.isa != jit::Isa::avx512_amx) {
            EXPECT_FALSE(std::regex_search(line, m, other_re)) << key.name() << ": " << line;
          }
        }
        ASSERT_FALSE(far.empty()) << key.name() << " prefetches no later call";
        const bool tile = key.isa == jit::Isa::avx512_amx;
        if (tile)
          EXPECT_TRUE(near.empty()) << key.name() << ": the tile body has no near prefetch";
        else
          EXPECT_EQ(near, far) << key.name() << ": the near prefetches do not pair with the later call's";
        EXPECT_EQ(bases.size(), 1u) << key.name() << ": prefetches from more than one cursor";
        const int64_t rb = moejit::formats::row_bytes(c.format, c.k);
        for (int r = 0; r < (tile ? rows : 1); ++r) {
          std::set<int64_t> offsets;
          for (int64_t off : far)
            if (!tile || off / rb == r) offsets.insert(tile ? off - r * rb : off);
          int64_t expect = 0;
          for (int64_t off : offsets) {
            EXPECT_EQ(off, expect) << key.name() << " row " << r << ": a later call's line is not prefetched";
            expect = off + (tile ? 64 : c.stride);
          }
        }
      }
}

// A tile read in place (bf16, blocks of 16 rows) prefetches every line of each
// of its 16 rows kTileL1AheadBytes ahead into L1, once: row r's prefetcht0
// offsets are r * row_bytes + kTileL1AheadBytes + 0, 64, ... Tails and partial
// blocks go through the tile buffer and have none.
TEST(Listing, TileRowsPrefetchIntoL1Ahead) {
  if (!jit::disassembler_available()) GTEST_SKIP() << "this build has no Zydis";
  const std::regex re(R"(prefetcht0 \[(r\w+)(?:\+0x([0-9a-f]+))?\])");
  for (int tokens : {1, 16})
    for (int rows : {16, 3}) {
      const int64_t k = 1024;  // 4 loop iterations of 256 elements: 8 lines per row each
      const jit::KernelKey key = runtime_key(Format::bf16, k, jit::Isa::avx512_amx, rows, tokens);
      std::string err, listing;
      auto kern = jit::generate_gemv(key, &err, /*run_here=*/false);  // read, not run: any CPU
      ASSERT_TRUE(kern) << key.name() << ": " << err;
      ASSERT_TRUE(jit::kernel_listing(*kern, &listing, &err)) << err;
      std::multiset<int64_t> offs;
      for (const auto& line : instruction_lines(listing)) {
        std::smatch m;
        if (std::regex_search(line, m, re))
          offs.insert(m[2].matched ? std::stoll(m[2].str(), nullptr, 16) : 0);
      }
      if (rows < 16) {
        EXPECT_TRUE(offs.empty()) << key.name() << ": a partial block prefetches into L1";
        continue;
      }
      const int64_t rb = moejit::formats::row_bytes(Format::bf16, k);
      std::multiset<int64_t> want;
      for (int r = 0; r < 16; ++r)
        for (int64_t at = 0; at < 256 * 2; at += 64) want.insert(r * rb + at + jit::kTileL1AheadBytes);
      EXPECT_EQ(offs, want) << key.name();
    }
}

// The tile body's shape (jit/tile_body.cpp): each step's products come after
// the next step's decode (two steps of buffer stores before the first
// tileloadd of a buffer), and a scaled format's group takes one FMA per vector
// of the packed totals (TileScaleBlock): one for the 16 rows with one token,
// four with three tokens, so about `width` FMAs per stored C tile (the loop's
// two exits each apply one group more or less than they store).
TEST(Listing, TileProductsTrailTheirDecodeAndGroupsTakeOneFmaPerVector) {
  if (!jit::disassembler_available()) GTEST_SKIP() << "this build has no Zydis";
  const std::regex buffer_store(R"(vmovups zmmword ptr \[rsp\+0x[0-9a-f]+\], zmm[0-3]$)");
  const std::regex buffer_load(R"(tileloadd tmm\d, \[rsp\+rdi\*1)");
  const std::regex c_store(R"(tilestored )");
  const std::regex total_fma(R"(vfmadd231ps zmm(1[6-9]|2\d|3[01]), )");
  for (Format f : {Format::q4_K, Format::q8_0, Format::mxfp4})
    for (int tokens : {1, 3}) {
      jit::KernelKey key = runtime_key(f, 1024, jit::Isa::avx512_amx, 16, tokens);
      key.isa = jit::Isa::avx512_amx;  // the tile kernel, whichever kernels the layers run
      key.flags = 0;
      std::string err, listing;
      auto kern = jit::generate_gemv(key, &err, /*run_here=*/false);
      ASSERT_TRUE(kern) << key.name() << ": " << err;
      ASSERT_TRUE(jit::kernel_listing(*kern, &listing, &err)) << err;
      int stores_before_load = -1, stores = 0, c_stores = 0, fmas = 0;
      for (const auto& line : instruction_lines(listing)) {
        if (stores_before_load < 0 && std::regex_search(line, buffer_load)) stores_before_load = stores;
        if (std::regex_search(line, buffer_store)) ++stores;
        if (std::regex_search(line, c_store)) ++c_stores;
        if (std::regex_search(line, total_fma)) ++fmas;
      }
      EXPECT_EQ(stores_before_load, 2 * 16 * 2) << key.name() << ": two steps of 16 rows x 2 vectors";
      const int width = tokens == 1 ? 1 : 4;
      EXPECT_GE(c_stores, 8) << key.name();
      EXPECT_EQ(fmas % width, 0) << key.name();
      EXPECT_GE(fmas, width * (c_stores - 2)) << key.name();
      EXPECT_LE(fmas, width * (c_stores + 2)) << key.name();
    }
}

// The listing covers every byte once: offsets strictly increase and the last
// line ends at the code size.
TEST(Listing, CoversTheWholeCode) {
  if (!jit::disassembler_available()) GTEST_SKIP() << "this build has no Zydis";
  const jit::Isa isa = jit::host_isa();
  if (isa == jit::Isa::scalar) GTEST_SKIP() << "no JIT tier on this CPU";
  std::string err, listing;
  auto k = jit::global_cache().get(runtime_key(Format::fp8_block, 700, isa, 3, 1), &err);
  ASSERT_TRUE(k) << err;
  ASSERT_TRUE(jit::kernel_listing(*k, &listing, &err)) << err;
  std::istringstream in(listing);
  size_t next = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == ';') continue;
    std::istringstream ls(line);
    std::string off;
    ls >> off;
    ASSERT_EQ(std::stoul(off, nullptr, 16), next) << line;
    size_t n = 0;
    for (std::string tok; ls >> tok && tok.size() == 2 && std::isxdigit(tok[0]) && std::isxdigit(tok[1]);)
      ++n;
    if (line.find(".byte") != std::string::npos) {
      std::istringstream bs(line.substr(line.find(".byte") + 5));
      n = 0;
      for (std::string tok; bs >> tok;) ++n;
    }
    ASSERT_GT(n, 0u) << line;
    next += n;
  }
  EXPECT_EQ(next, k->code_size());
}

// ---- runtime hooks ----

TEST(DumpDir, WritesBinAndListingOfNewKernels) {
  const jit::Isa isa = jit::host_isa();
  if (isa == jit::Isa::scalar) GTEST_SKIP() << "no JIT tier on this CPU";
  const std::string dir = make_temp_dir();
  ASSERT_FALSE(dir.empty());
  jit::KernelKey key;
  {
    ScopedEnv env("MOEJIT_DUMP_DIR", (dir + "/sub").c_str());  // created on demand
    key = runtime_key(Format::bf16, 3001, isa, 7, 1);  // K not used elsewhere in this process: generated now
    std::string err;
    auto k = jit::global_cache().get(key, &err);
    ASSERT_TRUE(k) << err;
    const std::string base = dir + "/sub/" + key.name();
    const std::string bin = read_file(base + ".bin");
    ASSERT_EQ(bin.size(), k->code_size()) << base << ".bin";
    EXPECT_EQ(std::memcmp(bin.data(), k->code(), bin.size()), 0);
    if (jit::disassembler_available()) {
      std::string listing;
      ASSERT_TRUE(jit::kernel_listing(*k, &listing, &err)) << err;
      EXPECT_EQ(read_file(base + ".s"), listing);
    } else {
      EXPECT_FALSE(file_exists(base + ".s"));
    }
    // No temporary files are left behind.
    EXPECT_EQ(files_with_suffix(dir + "/sub", "").size(), jit::disassembler_available() ? 2u : 1u);
  }
  // Read at generation time: unset now, the next new kernel is not written.
  std::string err;
  auto k2 = jit::global_cache().get(runtime_key(Format::bf16, 3002, isa, 7, 1), &err);
  ASSERT_TRUE(k2) << err;
  EXPECT_FALSE(file_exists(dir + "/sub/" + k2->key().name() + ".bin"));
  remove_tree(dir + "/sub");
  remove_tree(dir);
}

TEST(DumpDir, UnwritableDirDoesNotFailGeneration) {
  const jit::Isa isa = jit::host_isa();
  if (isa == jit::Isa::scalar) GTEST_SKIP() << "no JIT tier on this CPU";
  const std::string dir = make_temp_dir();
  ASSERT_FALSE(dir.empty());
  // A directory below a regular file cannot exist, whoever runs the test (root included).
  const std::string file = dir + "/file";
  std::ofstream(file) << "x";
  ScopedEnv env("MOEJIT_DUMP_DIR", (file + "/dumps").c_str());
  testing::internal::CaptureStderr();
  for (int i = 0; i < 2; ++i) {
    std::string err;
    auto k = jit::global_cache().get(runtime_key(Format::fp8_block, 3003 + i, isa, 4, 1), &err);
    ASSERT_TRUE(k) << err;
    EXPECT_NE(k->fn(), nullptr);
  }
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("MOEJIT_DUMP_DIR"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "reported once:\n" << out;
  std::remove(file.c_str());
  remove_tree(dir);
}

TEST(PerfMap, AppendsOneLinePerNewKernel) {
  const jit::Isa isa = jit::host_isa();
  if (isa == jit::Isa::scalar) GTEST_SKIP() << "no JIT tier on this CPU";
  const std::string map = "/tmp/perf-" + std::to_string(getpid()) + ".map";
  std::remove(map.c_str());
  std::shared_ptr<const jit::Kernel> k;
  {
    ScopedEnv env("MOEJIT_PERF_MAP", "1");
    std::string err;
    k = jit::global_cache().get(runtime_key(Format::bf16, 3005, isa, 2, 1), &err);
    ASSERT_TRUE(k) << err;
  }
  const std::string text = read_file(map);
  std::remove(map.c_str());
  char expect[128];
  std::snprintf(expect, sizeof(expect), "%lx %zx moejit_", reinterpret_cast<unsigned long>(k->code()),
                k->code_size());
  EXPECT_EQ(text, expect + k->key().name() + "\n");
  EXPECT_EQ(jit::perf_map_line(*k) + "\n", text);
}

// ---- moejit-dump's layer plan against a real layer ----

struct LayerCase {
  const char* name;
  Format format;
  int32_t hidden, intermediate;
  plan::GateUp form;
  Format up, down;  // separate banks may give up its own format; any layer down's
};

// Zeroed storage for `experts` matrices [rows, k] of format f sharing one
// buffer (the layer's kernels are generated at create: contents never read).
struct BankStore {
  std::vector<uint8_t> w, s;
  std::vector<float> g;
  std::vector<moejit_matrix> m;
  BankStore(Format f, int64_t rows, int64_t k, int experts) {
    namespace fm = moejit::formats;
    w.resize(size_t(rows * fm::row_bytes(f, k)));
    s.resize(
        size_t(std::max<int64_t>(1, fm::scale_rows(f, rows) * fm::scale_cols(f, fm::default_group(f, 0), k) *
                                        fm::scale_elem_bytes(f, fm::ScaleDtype::bf16))));
    g.resize(size_t(rows));
    const bool scaled = fm::has_block_scales(f);
    m.assign(size_t(experts), moejit_matrix{w.data(), scaled ? s.data() : nullptr, 0,
                                            fm::has_row_scales(f) ? g.data() : nullptr, nullptr});
  }
};

class LayerPlan : public ::testing::TestWithParam<LayerCase> {};

// Builds a MoE layer through the C API with MOEJIT_DUMP_DIR set, on every tier
// this CPU has, and compares the kernels it dumped with the layer plan's
// (plan::moe_plan, what moejit-dump --layer prints). Shapes are
// unique to this test, so each layer generates all of its kernels.
TEST_P(LayerPlan, MatchesTheKernelsTheRuntimeGenerates) {
  const LayerCase& c = GetParam();
  ScopedEnv no_dedup_env("MOEJIT_DEDUP", nullptr);
  int tiers = 0;
  for (jit::Isa isa : {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16, jit::Isa::avx512_amx}) {
    if (!jit::isa_available(isa)) {
      std::printf("[  SKIP    ] tier %s: this CPU lacks it\n", jit::isa_name(isa));
      continue;
    }
    for (int dedup = 0; dedup < 2; ++dedup) {
      ++tiers;
      SCOPED_TRACE(std::string(jit::isa_name(isa)) + (dedup ? " dedup" : " no dedup"));
      plan::MoeShape l;
      l.gate = {c.format};
      l.up = {c.up};
      l.down = {c.down};
      // Unique per tier: nothing cached yet (steps of 32 keep the block formats' K % 32).
      const auto any_k = [](Format f) { return f == Format::bf16 || f == Format::fp8_block; };
      const int32_t step = any_k(c.format) && any_k(c.up) && any_k(c.down) ? 1 : 32;
      l.hidden = c.hidden + step * (int32_t(isa) * 2 + dedup);
      l.intermediate = c.intermediate + step * (int32_t(isa) * 2 + dedup);
      const int32_t experts = 4;
      l.top_k = 2;
      l.max_tokens = 3;
      l.gate_up = c.form;
      plan::Target t;
      t.dedup = dedup == 1;
      t.threads = 1 + dedup;  // the down row block depends on the worker count
      t.isa = isa;
      std::set<std::string> planned;
      for (const auto& k : plan::moe_plan(l, t).keys()) planned.insert(k.name());

      const std::string dir = make_temp_dir();
      ASSERT_FALSE(dir.empty());
      ScopedEnv env("MOEJIT_DUMP_DIR", dir.c_str());
      moejit_context_desc cd{};
      cd.struct_size = sizeof(cd);
      cd.num_threads = t.threads;
      cd.max_isa = moejit_isa(isa);
      cd.flags = dedup ? 0 : MOEJIT_CONTEXT_NO_DEDUP;
      moejit_context* ctx = nullptr;
      ASSERT_EQ(moejit_context_create(&cd, &ctx), MOEJIT_OK) << moejit_last_error();
      ASSERT_EQ(moejit_context_isa(ctx), moejit_isa(isa));
      const int64_t H = l.hidden, I = l.intermediate;
      const bool separate = c.form == plan::GateUp::separate;
      BankStore gate(c.format, separate ? I : 2 * I, H, experts), up(c.up, I, H, experts),
          down(c.down, H, I, experts);
      const moejit_proj_format up_format{moejit_format(c.up), MOEJIT_DTYPE_BF16, 0};
      const moejit_proj_format down_format{moejit_format(c.down), MOEJIT_DTYPE_BF16, 0};
      moejit_moe_desc d{};
      d.struct_size = sizeof(d);
      d.format = moejit_format(c.format);
      d.hidden = l.hidden;
      d.intermediate = l.intermediate;
      d.num_experts = experts;
      d.top_k = l.top_k;
      d.max_tokens = l.max_tokens;
      d.gate_up_interleaved = c.form == plan::GateUp::interleaved;
      if (separate) {
        d.gate = gate.m.data();
        d.up = up.m.data();
        d.up_format = &up_format;
      } else {
        d.gate_up = gate.m.data();
      }
      d.down = down.m.data();
      d.down_format = &down_format;
      moejit_moe* moe = nullptr;
      ASSERT_EQ(moejit_moe_create(ctx, &d, &moe), MOEJIT_OK) << moejit_last_error();
      const std::set<std::string> dumped = files_with_suffix(dir, ".bin");
      moejit_moe_destroy(moe);
      moejit_context_destroy(ctx);
      EXPECT_EQ(dumped, planned);
      EXPECT_FALSE(planned.empty());
      // avx512_amx: tile kernels where kernel_isa says so, the rest avx512_bf16's.
      if (isa == jit::Isa::avx512_amx)
        for (Format f : {c.format, c.up, c.down}) {
          const bool tile = jit::kernel_isa(isa, moejit::formats::kernel_format(f),
                                            moejit::formats::default_group(f, 0)) == isa;
          bool found = false;
          for (const std::string& n : planned)
            found |=
                n.rfind(std::string(moejit::formats::format_name(moejit::formats::kernel_format(f))) + "_",
                        0) == 0 &&
                n.find(tile ? "_avx512amx" : "_avx512bf16") != std::string::npos;
          EXPECT_TRUE(found) << moejit::formats::format_name(f) << ": no " << (tile ? "tile" : "avx512_bf16")
                             << " kernel in the plan";
        }
      remove_tree(dir);
    }
  }
  if (tiers == 0) GTEST_SKIP() << "no JIT tier on this CPU";
}

constexpr auto kConcat = plan::GateUp::concat, kInterleaved = plan::GateUp::interleaved,
               kSeparate = plan::GateUp::separate;

INSTANTIATE_TEST_SUITE_P(
    Shapes, LayerPlan,
    ::testing::Values(
        LayerCase{"fp8_concat", Format::fp8_block, 1056, 200, kConcat, Format::fp8_block, Format::fp8_block},
        LayerCase{"fp8_interleaved", Format::fp8_block, 520, 136, kInterleaved, Format::fp8_block,
                  Format::fp8_block},
        LayerCase{"bf16_concat", Format::bf16, 264, 72, kConcat, Format::bf16, Format::bf16},
        LayerCase{"bf16_interleaved", Format::bf16, 136, 40, kInterleaved, Format::bf16, Format::bf16},
        // ds_fp4: the mxfp4 kernels, pass-1 blocks of 128 rows of I
        LayerCase{"ds_fp4_concat", Format::ds_fp4, 2880, 288, kConcat, Format::ds_fp4, Format::ds_fp4},
        LayerCase{"ds_fp4_interleaved", Format::ds_fp4, 320, 160, kInterleaved, Format::ds_fp4,
                  Format::ds_fp4},
        // 0.2: separate banks and a format per projection, each with kernels of its own
        LayerCase{"separate_fp8", Format::fp8_block, 1088, 232, kSeparate, Format::fp8_block,
                  Format::fp8_block},
        LayerCase{"separate_q8_0_bf16_mxfp4", Format::q8_0, 2112, 416, kSeparate, Format::bf16,
                  Format::mxfp4},
        LayerCase{"separate_ds_fp4", Format::ds_fp4, 2944, 352, kSeparate, Format::ds_fp4, Format::ds_fp4},
        LayerCase{"concat_fp8_bf16_down", Format::fp8_block, 1120, 264, kConcat, Format::fp8_block,
                  Format::bf16},
        LayerCase{"interleaved_mxfp4_q4_0_down", Format::mxfp4, 448, 192, kInterleaved, Format::mxfp4,
                  Format::q4_0}),
    [](const ::testing::TestParamInfo<LayerCase>& i) { return std::string(i.param.name); });

// ---- the tools as subprocesses ----

#if defined(MOEJIT_DUMP_EXE) && defined(MOEJIT_INFO_EXE)

struct ToolRun {
  int code = -1;
  std::string out, err;
};

ToolRun run(const std::string& exe, const std::string& args, const std::string& env = "") {
  const std::string dir = make_temp_dir();
  const std::string cmd = "env -u MOEJIT_MAX_ISA -u MOEJIT_DUMP_DIR -u MOEJIT_PERF_MAP " + env + " " + exe +
                          " " + args + " >" + dir + "/out 2>" + dir + "/err";
  ToolRun r;
  const int st = std::system(cmd.c_str());
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = read_file(dir + "/out");
  r.err = read_file(dir + "/err");
  remove_tree(dir);
  return r;
}

int lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

TEST(DumpTool, SingleKernelMatchesTheInProcessListing) {
  const jit::Isa isa = jit::host_isa();
  if (isa == jit::Isa::scalar) GTEST_SKIP() << "no JIT tier on this CPU";
  if (!jit::disassembler_available()) GTEST_SKIP() << "this build has no Zydis";
  const ToolRun r = run(MOEJIT_DUMP_EXE, "--format fp8_block --k 2048 --rows 16 --tokens 4");
  ASSERT_EQ(r.code, 0) << r.err;
  std::string err, listing;
  auto k = jit::global_cache().get(runtime_key(Format::fp8_block, 2048, isa, 16, 4), &err);
  ASSERT_TRUE(k) << err;
  ASSERT_TRUE(jit::kernel_listing(*k, &listing, &err)) << err;
  EXPECT_EQ(r.out, listing);
}

TEST(DumpTool, JsonRawAndLayer) {
  const jit::Isa isa = jit::host_isa();
  if (isa == jit::Isa::scalar) GTEST_SKIP() << "no JIT tier on this CPU";
  const std::string dir = make_temp_dir();
  ToolRun r =
      run(MOEJIT_DUMP_EXE, "--format bf16 --k 512 --rows 16 --tokens 1 --json --raw " + dir + "/k.bin");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"generator_version\": " + std::to_string(jit::kGeneratorVersion)),
            std::string::npos);
  EXPECT_NE(r.out.find("\"phases\""), std::string::npos);
  const std::string bin = read_file(dir + "/k.bin");
  EXPECT_NE(r.out.find("\"code_size\": " + std::to_string(bin.size())), std::string::npos) << r.out;
  std::remove((dir + "/k.bin").c_str());
  remove_tree(dir);

  r = run(MOEJIT_DUMP_EXE,
          "--layer --format fp8_block --hidden 2048 --intermediate 768 --experts 128 --top-k 8 --list "
          "--threads 3");
  ASSERT_EQ(r.code, 0) << r.err;
  plan::MoeShape l;
  l.gate = l.up = l.down = {Format::fp8_block};
  l.hidden = 2048;
  l.intermediate = 768;
  l.top_k = 8;
  plan::Target t;
  t.threads = 3;
  t.isa = isa;
  std::string expect;
  for (const auto& k : plan::moe_plan(l, t).keys()) expect += k.name() + "\n";
  EXPECT_EQ(r.out, expect);
  // Separate banks, each projection in its own format.
  r = run(MOEJIT_DUMP_EXE,
          "--layer --format q8_0 --gate-up separate --up-format bf16 --down-format mxfp4 --hidden 2048 "
          "--intermediate 768 --experts 128 --top-k 8 --list --threads 2");
  ASSERT_EQ(r.code, 0) << r.err;
  l.gate = {Format::q8_0};
  l.up = {Format::bf16};
  l.down = {Format::mxfp4};
  l.gate_up = plan::GateUp::separate;
  t.threads = 2;
  expect.clear();
  for (const auto& k : plan::moe_plan(l, t).keys()) expect += k.name() + "\n";
  EXPECT_EQ(r.out, expect);
  for (const char* f : {"q8_0_k2048", "bf16_k2048", "mxfp4_k768"})
    EXPECT_NE(r.out.find(f), std::string::npos) << f << " kernels missing:\n" << r.out;
  r = run(MOEJIT_DUMP_EXE,
          "--layer --format fp8_block --hidden 2048 --intermediate 768 --experts 128 --top-k 8 "
          "--list",
          "MOEJIT_DEDUP=0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(lines(r.out), 2) << r.out;  // one token per call: one kernel per matrix
}

// --cpu intel / amd: the kernels the runtime picks on that vendor (their
// names carry the flags: on Intel _f64 the near prefetch into L1, _f66 that and
// bf16's line prefetch, _f76 that and the pairs in row order; on AMD _f4 the
// pairs).
TEST(DumpTool, CpuPicksTheVendorsKernels) {
  if (!jit::isa_available(jit::Isa::avx512_bf16)) GTEST_SKIP() << "this CPU lacks avx512_bf16";
  if (!jit::host_features().gfni) GTEST_SKIP() << "this CPU lacks GFNI (q4_K's pairs and lanes)";
  const struct {
    const char* args;
    const char* intel;
    const char* amd;
  } cases[] = {
      {"--format bf16 --k 2048 --rows 64 --tokens 1", "bf16_k2048_r64_m1_avx512bf16_f66",
       "bf16_k2048_r64_m1_avx512bf16"},
      {"--format q2_K --k 2048 --rows 64 --tokens 1", "q2_K_k2048_r64_m1_avx512bf16_f64",
       "q2_K_k2048_r64_m1_avx512bf16_f4"},
      {"--format q4_K --k 2048 --rows 64 --tokens 4", "q4_K_k2048_r64_m4_avx512bf16_f64",
       "q4_K_k2048_r64_m4_avx512bf16_f4"},
      {"--format q6_K --k 2048 --rows 64 --tokens 4", "q6_K_k2048_r64_m4_avx512bf16_f76",
       "q6_K_k2048_r64_m4_avx512bf16_f4"},
  };
  for (const auto& c : cases)
    for (const char* cpu : {"intel", "amd"}) {
      const bool intel = std::string(cpu) == "intel";
      const ToolRun r = run(MOEJIT_DUMP_EXE, std::string(c.args) + " --isa avx512_bf16 --cpu " + cpu);
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_EQ(r.out.rfind(std::string("; ") + (intel ? c.intel : c.amd) + "\n", 0), 0u)
          << cpu << ": " << r.out.substr(0, 80);
    }
  const ToolRun r =
      run(MOEJIT_DUMP_EXE,
          "--layer --format q6_K --hidden 2048 --intermediate 768 --experts 128 --top-k 8 --list "
          "--threads 2 --isa avx512_bf16 --cpu intel");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("q6_K_k2048_r32_m2_avx512bf16_f76\n"), std::string::npos) << r.out;
}

TEST(DumpTool, BadArgumentsAndUnsupportedRequestsFailWithOneLine) {
  const struct {
    const char* args;
    int code;
  } cases[] = {
      {"", 2},
      {"--format nope --k 64 --rows 1 --tokens 1", 2},
      {"--format bf16 --k 0 --rows 1 --tokens 1", 2},
      {"--format bf16 --k 64 --rows 1", 2},
      {"--format bf16 --k 64 --rows 1 --tokens 1 --isa avx9", 2},
      {"--format bf16 --k 64 --rows 1 --tokens 1 --scale-dtype f16", 2},
      {"--format bf16 --k 64 --rows 1 --tokens 1 --bogus", 2},
      {"--format bf16 --k abc --rows 1 --tokens 1", 2},
      {"--format bf16 --k 64 --rows 1 --tokens 1 --no-vbmi", 2},
      {"--format bf16 --list", 2},
      {"--layer --format bf16 --hidden 64 --intermediate 64 --experts 2 --top-k 3", 2},
      {"--layer --format bf16 --hidden 64 --intermediate 64 --experts 2 --top-k 1 --gate-up zip", 2},
      {"--layer --format bf16 --hidden 64 --intermediate 64 --experts 2 --top-k 1 --up-format q8_0", 2},
      {"--layer --format bf16 --hidden 64 --intermediate 64 --experts 2 --top-k 1 --down-format zip", 2},
      {"--layer --format bf16 --hidden 64 --intermediate 40 --experts 2 --top-k 1 --down-format q8_0", 2},
      {"--layer --format mxfp4 --hidden 64 --intermediate 64 --experts 2 --top-k 1 --down-format ds_fp4", 2},
      {"--format bf16 --k 64 --rows 1 --tokens 1 --down-format q8_0", 2},
      {"--format bf16 --k 64 --rows 1 --tokens 1 --isa scalar", 1},
      {"--format bf16 --k 64 --rows 1 --tokens 99", 1},
      {"--format fp8_block --k 64 --rows 129 --tokens 1", 1},
      {"--format bf16 --k 64 --rows 1 --tokens 1 --cpu arm", 2},
      {"--layer --format bf16 --hidden 64 --intermediate 64 --experts 2 --top-k 1 --cpu arm", 2},
  };
  for (const auto& c : cases) {
    const ToolRun r = run(MOEJIT_DUMP_EXE, c.args);
    EXPECT_EQ(r.code, c.code) << "moejit-dump " << c.args << "\n" << r.err;
    EXPECT_EQ(lines(r.err), 1) << "moejit-dump " << c.args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("moejit-dump: ", 0), 0u) << r.err;
    EXPECT_TRUE(r.out.empty()) << "moejit-dump " << c.args << "\n" << r.out;
  }
  for (jit::Isa isa : {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16}) {
    if (jit::isa_available(isa)) continue;
    const ToolRun r = run(
        MOEJIT_DUMP_EXE, std::string("--format bf16 --k 64 --rows 1 --tokens 1 --isa ") + jit::isa_name(isa));
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("lacks"), std::string::npos) << r.err;
  }
  const ToolRun bad_env =
      run(MOEJIT_DUMP_EXE, "--format bf16 --k 64 --rows 1 --tokens 1", "MOEJIT_MAX_ISA=fast");
  EXPECT_EQ(bad_env.code, 2) << bad_env.err;
  const ToolRun help = run(MOEJIT_DUMP_EXE, "--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("--layer"), std::string::npos);
}

TEST(InfoTool, ReportsWhatTheLibraryRuns) {
  ToolRun r = run(MOEJIT_INFO_EXE, "");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string host = moejit_isa_name(moejit_host_isa());
  EXPECT_NE(r.out.find("host tier   " + host), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  fp8_block   " + host), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  bf16        " + host), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  nvfp4       " + host), std::string::npos) << r.out;
  if (moejit_host_isa() != MOEJIT_ISA_SCALAR) {  // bf16's prefetch scheme on this CPU (kFlagLinePrefetch)
    const size_t b = r.out.find("  bf16        "), e = r.out.find('\n', b);
    ASSERT_NE(b, std::string::npos) << r.out;
    const std::string line = r.out.substr(b, e - b);
    EXPECT_NE(line.find(jit::host_features().intel ? "prefetch: every line ~128 KiB ahead (Intel)"
                                                   : "prefetch: the next call"),
              std::string::npos)
        << line;
    const size_t f = r.out.find("  fp8_block   ");
    EXPECT_EQ(r.out.substr(f, r.out.find('\n', f) - f).find("prefetch:"), std::string::npos);
    // The row kernels' near prefetch: into L1 on Intel's AVX-512 tiers (kFlagNearL1), else into L2.
    const bool l1 = jit::host_features().intel && moejit_host_isa() >= MOEJIT_ISA_AVX512;
    const size_t p = r.out.find("\nprefetch    row kernels: every line ~128 KiB ahead into L2");
    ASSERT_NE(p, std::string::npos) << r.out;
    const std::string pline = r.out.substr(p + 1, r.out.find('\n', p + 1) - p - 1);
    EXPECT_NE(
        pline.find(l1 ? "3 KiB ahead in the stream into L1 (Intel)" : "6 KiB ahead in the stream into L2"),
        std::string::npos)
        << pline;
  }
  // The K-quants' decode is the one the layers run: bf16 pairs where the
  // runtime asks for them (kFlagBf16Pairs: AMD, and q6_K and q3_K on Intel).
  for (const char* name : {"q4_K", "q2_K"}) {
    const size_t b = r.out.find(std::string("  ") + name + "        "), e = r.out.find('\n', b);
    ASSERT_NE(b, std::string::npos) << name << "\n" << r.out;
    const std::string line = r.out.substr(b, e - b);
    moejit::formats::Format f{};
    ASSERT_TRUE(moejit::formats::format_from_name(name, &f)) << name;
    const bool pairs = jit::runtime_flags(jit::Isa::avx512_bf16, f, 256) & jit::kFlagBf16Pairs;
    const bool bf16_kernels = line.find("avx512_bf16") != std::string::npos;
    EXPECT_EQ(line.find("bf16 pairs") != std::string::npos, pairs && bf16_kernels) << line;
  }
  for (const char* v :
       {"MOEJIT_MAX_ISA", "MOEJIT_DEDUP", "MOEJIT_DEDUP_DEBUG", "MOEJIT_DUMP_DIR", "MOEJIT_PERF_MAP"})
    EXPECT_NE(r.out.find(v), std::string::npos) << v;

  r = run(MOEJIT_INFO_EXE, "--json", "MOEJIT_MAX_ISA=avx2 MOEJIT_DUMP_DIR=/nonexistent/x");
  ASSERT_EQ(r.code, jit::isa_available(jit::Isa::avx2) ? 0 : 1) << r.err;
  EXPECT_TRUE(r.err.empty()) << "the format probe must not dump its kernels: " << r.err;
  if (jit::isa_available(jit::Isa::avx2)) {
    EXPECT_NE(r.out.find("\"context_isa\": \"avx2\""), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"tier\": \"avx2\""), std::string::npos) << r.out;
    // avx2's row kernels prefetch the stream into L2 on every vendor.
    EXPECT_NE(r.out.find("6 KiB ahead in the stream into L2\""), std::string::npos) << r.out;
  }
  EXPECT_NE(r.out.find("\"value\": \"/nonexistent/x\""), std::string::npos) << r.out;

  r = run(MOEJIT_INFO_EXE, "", "MOEJIT_MAX_ISA=fast");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("cannot be created"), std::string::npos) << r.out;
  r = run(MOEJIT_INFO_EXE, "--bogus");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(lines(r.err), 1) << r.err;
}

#endif

}  // namespace
