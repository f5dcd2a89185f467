// The tile kernels of avx512_amx (jit/tile_body.cpp), called directly: every
// format with a tile decode against float64 for K and row tails and tokens
// 1..16 from any slot of a 16-slot block (the other slots NaN), the same bits
// for a token whatever the token count and slot (batch invariance), no read
// past a matrix's last byte (a guard page), and the tile unit in the code.
// Each test runs twice: on the tile unit (without AMX, or the OS's permission
// for tile data, it skips, saying why) and on the emulated tile unit
// (kFlagTileEmu: AVX512_BF16 code on tile registers in memory), which runs on
// CPUs without AMX, the CI machine's included, and checks everything above but
// the tile unit's own rounding.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "jit/kernel_cache.h"
#include "jit/kernel_dump.h"
#include "jit/tile_body.h"
#include "jit_test_util.h"
#include "kernel_reference.h"

namespace {

using namespace jit_test;

const Variant kAmx = {jit::Isa::avx512_amx, 0, "avx512_amx"};

// The tile unit, or its emulation.
struct Mode {
  uint32_t flags;
  const char* name;
};
const Mode kModes[] = {{0, "TileUnit"}, {jit::kFlagTileEmu, "Emulated"}};
void PrintTo(const Mode& m, std::ostream* os) { *os << m.name; }

// The formats with tile kernels, each with a group it takes.
struct TileFormat {
  Format f;
  int group;
  ScaleDtype sdt = ScaleDtype::bf16;
};
const TileFormat kTileFormats[] = {
    {Format::bf16, 0},        {Format::fp8_block, 128}, {Format::fp8_block, 128, ScaleDtype::f32},
    {Format::mxfp8_e4m3, 32}, {Format::mxfp8_e4m3, 64}, {Format::mxfp8_e5m2, 128},
    {Format::mxfp8_e5m2, 32}, {Format::q8_0, 32},       {Format::q4_0, 32},
    {Format::mxfp4, 32},      {Format::nvfp4, 16},      {Format::q4_K, 256},
    {Format::q5_K, 256},      {Format::q6_K, 256},      {Format::q2_K, 256},
    {Format::q3_K, 256}};

std::string amx_missing() {
  if (jit::isa_available(jit::Isa::avx512_amx)) return "";
  return std::string("this CPU has no avx512_amx tier: ") + jit::host_features().tile_data_note;
}

// Why a mode cannot run here ("" when it can).
std::string missing(const Mode& m) {
  if (m.flags & jit::kFlagTileEmu)
    return jit::isa_available(jit::Isa::avx512_bf16) ? "" : "the emulated tile unit needs avx512_bf16";
  return amx_missing();
}

class TileKernels : public ::testing::TestWithParam<Mode> {
 protected:
  uint32_t flags() const { return GetParam().flags; }
};

// Whether this CPU runs the format's tile decode (the byte tables and mxfp4's
// vpermb need AVX512_VBMI; every AMX CPU has it, not every avx512_bf16 one).
bool runs_here(const TileFormat& t) {
  return !jit::needs_vbmi(jit::Isa::avx512_amx, t.f, 0) || jit::host_features().avx512_vbmi;
}

bool k_ok(const TileFormat& t, int k) {
  const char* why = nullptr;
  return fmt::k_is_valid(t.f, t.group, k, &why);
}

jit::KernelKey tile_key(const TileFormat& t, int k, int rows, int tokens, const Bank& b, uint32_t flags) {
  jit::KernelKey key = make_key(kAmx, t.f, t.sdt, k, rows, tokens, t.group, b.layout.scale_stride);
  if (t.f == Format::q8_0 || t.f == Format::q4_0) key.group = 32;
  key.flags |= flags;
  return key;
}

std::vector<float> random_x(int tokens, int k, moejit_test::Rng& rng) {
  std::vector<float> x(size_t(tokens) * size_t(k));
  for (float& e : x) e = fmt::round_bf16(float(int(rng() % 2001) - 1000) / 997.0f);
  return x;
}

// Checks y (from x) against float64 (kernel_reference.h: weights from the
// tests' oracle, the bound 2^-24 (K + 64) sum|w x|).
void expect_float64(const jit::KernelKey& key, const Reference& ref, const std::vector<float>& x,
                    const std::vector<float>& y, const std::string& what) {
  for (int m = 0; m < key.tokens; ++m)
    for (int r = 0; r < key.rows; ++r)
      ASSERT_TRUE(matches(ref, r, &x[size_t(m) * size_t(key.k)], y[size_t(m) * size_t(key.rows) + size_t(r)]))
          << key.name() << " " << what << " token " << m << " row " << r;
}

TEST_P(TileKernels, MatchFloat64ReferenceFromAnySlot) {
  if (!missing(GetParam()).empty()) GTEST_SKIP() << missing(GetParam());
  moejit_test::Rng rng(151);
  int checked = 0;
  for (const TileFormat& t : kTileFormats)
    for (int k : {1, 16, 31, 32, 33, 48, 64, 100, 128, 160, 256, 384, 1000, 1008, 2048}) {
      if (!k_ok(t, k) || !runs_here(t)) continue;
      for (int rows : {1, 5, 16, 17, 40, 128}) {
        for (int tokens : {1, 2, 7, 16}) {
          Bank b = make_bank(t.f, t.sdt, rows, k, rng, t.group ? t.group : 128);
          const jit::KernelKey key = tile_key(t, k, rows, tokens, b, flags());
          std::string err;
          auto kern = jit::global_cache().get(key, &err);
          ASSERT_TRUE(kern) << key.name() << ": " << err;
          ASSERT_EQ(kern->key().isa, jit::Isa::avx512_amx);
          const std::vector<float> x = random_x(tokens, k, rng);
          const Reference ref = reference_of(b);
          for (int c0 : {0, 16 - tokens}) {
            expect_float64(key, ref, x, run_kernel(*kern, b, x, c0), "slot " + std::to_string(c0));
            if (HasFatalFailure()) return;
          }
          ++checked;
        }
      }
    }
  EXPECT_GT(checked, 300);
}

// Token j's outputs have the same bits in a call of 1..16 tokens, from any
// slot: the tile arithmetic of a (row, token) never sees the other tokens.
TEST_P(TileKernels, EveryTokenCountGivesTheSameBits) {
  if (!missing(GetParam()).empty()) GTEST_SKIP() << missing(GetParam());
  moejit_test::Rng rng(152);
  for (const TileFormat& t : kTileFormats) {
    if (!runs_here(t)) continue;
    const int k = t.f == Format::bf16 || t.f == Format::fp8_block ? 1000 : 1024, rows = 21;
    Bank b = make_bank(t.f, t.sdt, rows, k, rng, t.group ? t.group : 128);
    const std::vector<float> x = random_x(16, k, rng);
    std::string err;
    auto all = jit::global_cache().get(tile_key(t, k, rows, 16, b, flags()), &err);
    ASSERT_TRUE(all) << err;
    const std::vector<float> want = run_kernel(*all, b, x);
    expect_float64(all->key(), reference_of(b), x, want, "16 tokens");
    for (int tokens = 1; tokens <= 16; ++tokens) {
      auto kern = jit::global_cache().get(tile_key(t, k, rows, tokens, b, flags()), &err);
      ASSERT_TRUE(kern) << err;
      for (int first = 0; first + tokens <= 16; first += std::max(1, tokens / 2)) {
        // tokens first.. of x, in slots first.. of the block
        const std::vector<float> xs(x.begin() + first * k, x.begin() + (first + tokens) * k);
        const std::vector<float> y = run_kernel(*kern, b, xs, first);
        for (int m = 0; m < tokens; ++m)
          for (int r = 0; r < rows; ++r)
            ASSERT_EQ(std::memcmp(&y[size_t(m * rows + r)], &want[size_t((first + m) * rows + r)], 4), 0)
                << kern->key().name() << " token " << first + m << " row " << r << " alone in a call of "
                << tokens << " from slot " << first;
      }
    }
  }
}

// Memory whose last byte is followed by a page the process may not read.
class Guarded {
 public:
  explicit Guarded(size_t bytes) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    len_ = (bytes + page - 1) / page * page + page;
    base_ = static_cast<uint8_t*>(
        mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base_ == MAP_FAILED) base_ = nullptr;
    if (base_) mprotect(base_ + len_ - page, page, PROT_NONE);
    data_ = base_ ? base_ + len_ - page - bytes : nullptr;
  }
  ~Guarded() {
    if (base_) munmap(base_, len_);
  }
  uint8_t* data() const { return data_; }

 private:
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t len_ = 0;
};

// Row tails (the last row block's missing rows) and K tails (the last row's
// end) read nothing past the matrix: the weights end at a guard page, and so
// do the scales of the formats with one scale row per weight row, and the
// prepared activations of the call's run.
TEST_P(TileKernels, NeverReadPastTheMatrix) {
  if (!missing(GetParam()).empty()) GTEST_SKIP() << missing(GetParam());
  moejit_test::Rng rng(153);
  for (const TileFormat& t : kTileFormats)
    for (int k : {16, 33, 100, 256, 1000, 1008, 1024}) {
      if (!k_ok(t, k) || !runs_here(t)) continue;
      for (int rows : {3, 16, 29}) {
        Bank b = make_bank(t.f, t.sdt, rows, k, rng, t.group ? t.group : 128);
        const bool own_scales = t.f == Format::mxfp8_e4m3 || t.f == Format::mxfp8_e5m2 ||
                                t.f == Format::mxfp4 || t.f == Format::nvfp4;
        if (own_scales) {  // dense scale rows, so the last row's last group is the tensor's last byte
          b.layout.scale_stride = k / t.group;
          b.scales.assign(size_t(rows * k / t.group), 0);
          for (auto& s : b.scales) s = uint8_t(118 + rng() % 16);
        }
        const jit::KernelKey key = tile_key(t, k, rows, 3, b, flags());
        std::string err;
        auto kern = jit::global_cache().get(key, &err);
        ASSERT_TRUE(kern) << key.name() << ": " << err;
        Guarded w(b.w.size()), s(b.scales.size());
        ASSERT_TRUE(w.data() && s.data());
        std::memcpy(w.data(), b.w.data(), b.w.size());
        if (!b.scales.empty()) std::memcpy(s.data(), b.scales.data(), b.scales.size());
        const std::vector<float> x = random_x(3, k, rng);
        // x too: the run's 3 tokens (with the K-quants' sums after each block) end at the page
        const jit::XPrep prep = jit::x_prep(key.isa, key.format, key.flags);
        Guarded xg(size_t(prep.buffer_bytes(k, 3)));
        ASSERT_TRUE(xg.data());
        std::memset(xg.data(), 0, size_t(prep.buffer_bytes(k, 3)));
        for (int m = 0; m < 3; ++m)
          prep.store_slot(xg.data(), prep.group_slot(0, 3, m), k, 0, &x[size_t(m) * size_t(k)], k);
        std::vector<float> y(size_t(rows) * 3);
        jit::GemvArgs a{};
        a.w = w.data();
        a.scales = b.scales.empty() ? nullptr : s.data();
        if (fmt::is_kquant(key.format)) a.scales = a.w;  // the super-blocks hold the scales
        a.row_scales = b.row_scales.empty() ? nullptr : b.row_scales.data();  // nvfp4's globals
        a.x = xg.data();
        a.y = y.data();
        a.w_prefetch = w.data();
        kern->fn()(&a);
        expect_float64(key, reference_of(b), x, y, "guarded");
        if (HasFatalFailure()) return;
      }
    }
}

// The formats with a tile decode have tile kernels; the layers run them for
// bf16 and fp8_block (the plan's kernel_isa, gemv.h says why), the avx512_bf16
// kernels for every other format. The kernels configure, use and release the
// tile unit; the emulated ones use no AMX instruction and run vdpbf16ps. Only
// the code is read, so the tile unit's kernels are generated on any CPU
// (gemv_supported's run_here).
TEST_P(TileKernels, UseTheTileUnit) {
  for (const TileFormat& t : kTileFormats) {
    EXPECT_TRUE(jit::has_tile_kernels(t.f, t.group)) << fmt::format_name(t.f) << " g" << t.group;
    EXPECT_EQ(jit::kernel_isa(jit::Isa::avx512_amx, t.f, t.group),
              t.f == Format::bf16 || t.f == Format::fp8_block ? jit::Isa::avx512_amx : jit::Isa::avx512_bf16)
        << fmt::format_name(t.f) << " g" << t.group << ": docs/FORMATS.md says which formats run tiles";
  }
  const bool emu = flags() & jit::kFlagTileEmu;
  moejit_test::Rng rng(154);
  for (const TileFormat& t : kTileFormats) {
    Bank b = make_bank(t.f, t.sdt, 20, 1024, rng, t.group ? t.group : 128);
    std::string err;
    auto kern = jit::generate_gemv(tile_key(t, 1024, 20, 4, b, flags()), &err, /*run_here=*/false);
    ASSERT_TRUE(kern) << err;
    bool tdp = false;
    for (const auto& p : kern->phases()) tdp |= p.second == "tdp";
    EXPECT_TRUE(tdp) << kern->key().name() << " has no tdp phase";
    if (!jit::disassembler_available()) continue;
    std::string listing;
    ASSERT_TRUE(jit::kernel_listing(*kern, &listing, &err)) << err;
    for (const char* m : {"ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored", "tilezero", "tilerelease"}) {
      // " tdpbf16ps" is not found inside "vdpbf16ps"
      const bool has = listing.find(std::string(" ") + m) != std::string::npos;
      EXPECT_EQ(has, !emu) << kern->key().name() << (emu ? " uses " : " does not use ") << m;
    }
    EXPECT_EQ(listing.find("vdpbf16ps") != std::string::npos, emu) << kern->key().name();
  }
}

// Issue 15: the tile tier has kernels for every format, with every group the
// format takes (ds_fp4 through mxfp4's kernels, fmt::kernel_format).
// The emulation takes its tile shapes from the same place as the palette, so
// only the palette's own bytes can show a shape the tile unit would refuse:
// each kernel's palette (the one 64-byte block of palette id 1 in its code)
// must pair A tiles of 16 rows and 32 or 64 bytes with B tiles of colsb / 4
// rows, and C and B rows of 4 M bytes. Generated on any CPU (run_here false).
TEST(TileTier, EveryFormatAndGroupHasKernelsWithAValidPalette) {
  int checked = 0;
  for (int32_t id = 0; id <= fmt::kMaxFormatId; ++id) {
    const Format f = fmt::kernel_format(Format(id));
    const fmt::FormatInfo& fi = fmt::info(f);
    std::vector<int> groups;
    for (int n = 0; n < 32; ++n)
      if ((fi.api_groups >> n) & 1u) groups.push_back(1 << n);
    if (groups.empty()) groups.push_back(fi.group);
    for (int g : groups)
      for (int tokens : {1, 3, 16}) {
        EXPECT_TRUE(jit::has_tile_kernels(f, g)) << fi.name << " g" << g;
        jit::KernelKey key = make_key(kAmx, f, ScaleDtype::bf16, 2048, 20, tokens, g, 2048 / std::max(g, 1));
        key.group = fi.scales == fmt::ScaleKind::none ? 0 : g;
        std::string err;
        const auto kern = jit::generate_gemv(key, &err, /*run_here=*/false);
        ASSERT_TRUE(kern) << key.name() << ": " << err;
        ASSERT_EQ(kern->key().isa, jit::Isa::avx512_amx) << key.name();
        const uint8_t* pal = nullptr;
        for (size_t off = 0; off + 64 <= kern->code_size(); off += 64) {
          const uint8_t* p = kern->code() + off;
          bool zeros = true;  // reserved bytes, and tiles 6 and 7 unused
          for (int i = 1; i < 16; ++i) zeros &= p[i] == 0;
          for (int i = 28; i < 32; ++i) zeros &= p[i] == 0;
          for (int i = 54; i < 64; ++i) zeros &= p[i] == 0;
          if (p[0] != 1 || !zeros || p[48] == 0) continue;
          EXPECT_EQ(pal, nullptr) << key.name() << ": two palettes";
          pal = p;
        }
        ASSERT_NE(pal, nullptr) << key.name() << ": no palette";
        auto colsb = [&](int t) { return pal[16 + 2 * t] | pal[17 + 2 * t] << 8; };
        auto rows = [&](int t) { return int(pal[48 + t]); };
        for (int i = 0; i < 2; ++i) {  // C = tile i, A = tile 2 + i, B = tile 4 + i
          const int c = i, a = 2 + i, b = 4 + i;
          EXPECT_EQ(rows(c), 16) << key.name();
          EXPECT_EQ(rows(a), 16) << key.name();
          EXPECT_TRUE(colsb(a) == 64 || colsb(a) == 32) << key.name() << " A colsb " << colsb(a);
          EXPECT_EQ(rows(b), colsb(a) / 4) << key.name() << ": B rows must be A's pairs";
          // groups of 16 take half steps, in pairs (both groups' columns in one C) up to 4 tokens
          const int group = fi.scales == fmt::ScaleKind::inline_super ? 256 / fi.sub_block : g;
          const bool pairs = group == 16 && tokens <= 4;
          EXPECT_EQ(colsb(b), 4 * tokens * (pairs ? 2 : 1)) << key.name();
          EXPECT_EQ(colsb(c), 4 * tokens * (pairs ? 2 : 1)) << key.name();
          EXPECT_EQ(colsb(a), group == 16 && !pairs ? 32 : 64) << key.name();
        }
        ++checked;
      }
  }
  EXPECT_GE(checked, 3 * 15);
}

// The emulation is a test mode of avx512_amx only, and names itself in the key.
TEST(TileKernelsEmulated, OnlyForTheTileTier) {
  jit::KernelKey key = make_key(kAmx, Format::bf16, ScaleDtype::bf16, 256, 16, 1);
  key.flags = jit::kFlagTileEmu;
  EXPECT_NE(key.name(), make_key(kAmx, Format::bf16, ScaleDtype::bf16, 256, 16, 1).name());
  key.isa = jit::Isa::avx512_bf16;
  std::string why;
  EXPECT_FALSE(jit::gemv_supported(key, &why));
  EXPECT_NE(why.find("emulated tile unit"), std::string::npos) << why;
}

INSTANTIATE_TEST_SUITE_P(Modes, TileKernels, ::testing::ValuesIn(kModes),
                         [](const ::testing::TestParamInfo<Mode>& i) { return std::string(i.param.name); });

}  // namespace
