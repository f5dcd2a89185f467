// White-box tests of the K-quant kernels (jit/decode_kquant.cpp, and the tile
// kernels of jit/decode_kquant_tile.cpp on the tile unit and emulated): every format
// on every tier this CPU has, called directly, against float64 from the
// per-bit decoder of kquants_test_util.h (written from the layout tables, not
// from formats/kquants.cpp), with the bound sum(|d sc q x| + |dmin m x|) of
// formats.md. Rows lie at odd addresses; every byte value of every scale
// field; fp16 subnormal, infinite and NaN d and dmin; rows on both sides of
// the factor-record limit. The K values, row counts and token counts of every
// format, and a token's bits alone and inside a multi-token call, are
// FormatTier/Kernels.MatchFloat64Reference (test_jit_formats.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "jit/cpu.h"
#include "jit/gemv.h"
#include "jit/kernel_cache.h"
#include "kquants_test_util.h"
#include "rng.h"

namespace {

using namespace kquants_test;
namespace jit = moejit::jit;

struct Variant {
  jit::Isa isa;
  uint32_t flags;
  const char* name;
};
// The no-VBMI flag changes nothing for the K-quants; it is kept to show that.
// The bf16-pair flag (AMD's choice) changes every K-quant's avx512_bf16 decode;
// the other tiers reject it (BfPairsOnlyOnAvx512Bf16).
const Variant kVariants[] = {
    {jit::Isa::avx2, 0, "avx2"},
    {jit::Isa::avx512, 0, "avx512"},
    {jit::Isa::avx512, jit::kFlagNoGfni, "avx512_nogfni"},
    {jit::Isa::avx512_bf16, 0, "avx512_bf16"},
    {jit::Isa::avx512_bf16, jit::kFlagNoVbmi, "avx512_bf16_novbmi"},
    {jit::Isa::avx512_bf16, jit::kFlagBf16Pairs, "avx512_bf16_pairs"},
    {jit::Isa::avx512_bf16, jit::kFlagBf16Pairs | jit::kFlagRowOrder, "avx512_bf16_pairs_row_order"},
    // The tile kernels (jit/decode_kquant_tile.cpp), on the tile unit and emulated.
    {jit::Isa::avx512_amx, 0, "avx512_amx"},
    {jit::Isa::avx512_amx, jit::kFlagTileEmu, "avx512_amx_emulated"}};

// The formats a variant's kernels exist for.

jit::KernelKey make_key(const Variant& v, KQuant f, int k, int rows, int tokens) {
  jit::KernelKey key;
  key.format = moejit::formats::Format(int32_t(f));
  key.k = k;
  key.rows = rows;
  key.tokens = tokens;
  key.group = 256;  // the plan's: the format table's group
  key.isa = v.isa;
  key.flags = v.flags;
  return key;
}

// rows * row_bytes bytes starting at an odd address (rows lie anywhere in a
// mapped GGUF file), the buffer ending right after the last row.
struct Bank {
  std::vector<uint8_t> buf;
  size_t row_bytes = 0;
  uint8_t* data() { return buf.data() + 1; }
  const uint8_t* data() const { return buf.data() + 1; }
  const uint8_t* row(int r) const { return data() + size_t(r) * row_bytes; }
};

Bank make_bank(KQuant f, int rows, int k, moejit_test::Rng& rng) {
  Bank b;
  b.row_bytes = size_t(fm::kquant_row_bytes(f, k));
  const std::vector<uint8_t> blocks = random_blocks(f, rows * (k / 256), rng);
  b.buf.assign(blocks.size() + 1, 0);
  std::memcpy(b.data(), blocks.data(), blocks.size());
  return b;
}

// Runs `kern` on the bank's first key.rows rows with `tokens` activation
// vectors from x (k floats each, exact bf16 values), prepared by the kernel's XPrep.
std::vector<float> run(const jit::Kernel& kern, const Bank& b, const std::vector<float>& x) {
  const jit::KernelKey& key = kern.key();
  const jit::XPrep prep = jit::x_prep(key.isa, key.format, key.flags);
  std::vector<uint8_t> xp(size_t(prep.buffer_bytes(key.k, key.tokens)), 0);
  for (int m = 0; m < key.tokens; ++m)  // slot m, or column m of a tile layout's run
    prep.store_slot(xp.data(), prep.group_slot(0, key.tokens, m), key.k, 0, &x[size_t(m) * key.k], key.k);
  std::vector<float> y(size_t(key.rows) * size_t(key.tokens), -12345.0f);
  jit::GemvArgs a{};
  a.w = b.data();
  a.scales = b.data();  // K-quant kernels read their scales from the weights
  a.x = xp.data();
  a.y = y.data();
  a.w_prefetch = b.data();
  kern.fn()(&a);
  return y;
}

std::shared_ptr<const jit::Kernel> kernel(const jit::KernelKey& key) {
  std::string err;
  auto k = jit::global_cache().get(key, &err);
  EXPECT_TRUE(k) << key.name() << ": " << err;
  return k;
}

// got against float64 with the bound (K + 64) 2^-24 sum(|d sc q x| + |dmin m x|),
// plus an absolute term for results in the subnormal range. Non-finite float64
// results (inf or NaN scales) must come out non-finite, NaN where float64 is NaN.
// Kernels that sum q x per sub-block before its factor (sums_first: the bf16
// pairs and q4_K's and q5_K's fp32 lanes, formats.md's (d sc[j]) S_q) give inf, not NaN,
// where an infinite d meets a zero quant of a sub-block whose sum is not zero;
// and the pairs' vdpbf16ps (flush) flushes subnormal x, products and partial
// sums (below 2^-126, |q| <= 32) to zero, formats.md's absolute term
// K 2^-126 max|scale| with the scale q D_j.
::testing::AssertionResult matches(KQuant f, const uint8_t* row, int k, const float* x, float got,
                                   bool sums_first = false, bool flush = false) {
  double want, mag, smax;
  float64_row(f, row, k, x, &want, &mag, &smax);
  if (!std::isfinite(want)) {
    if (std::isfinite(got) || (std::isnan(want) && !std::isnan(got) && !sums_first))
      return ::testing::AssertionFailure() << "got " << got << " want " << want;
    return ::testing::AssertionSuccess();
  }
  const double bound = (k + 64) * (std::ldexp(mag, -24) * 1.001 + std::ldexp(smax, -149)) +
                       (flush ? k * 32 * std::ldexp(smax, -126) : 0.0);
  if (!(std::fabs(double(got) - want) <= bound))
    return ::testing::AssertionFailure() << "got " << got << " want " << want << " bound " << bound;
  return ::testing::AssertionSuccess();
}

bool pairs(const Variant& v) { return (v.flags & jit::kFlagBf16Pairs) != 0; }
bool tiles(const Variant& v) { return v.isa == jit::Isa::avx512_amx; }
// q4_K's and q5_K's fp32 lane decode (the avx512 tiers without kFlagBf16Pairs or kFlagNoGfni).
bool lanes(const Variant& v) {
  return v.isa != jit::Isa::avx2 && !pairs(v) && !tiles(v) && !(v.flags & jit::kFlagNoGfni);
}
bool has_lanes(KQuant f) { return f == KQuant::q4_K || f == KQuant::q5_K; }
// Whether a variant's f kernels scale sums of q x (the pairs, the tiles, the lanes).
bool sums_first(const Variant& v, KQuant f) { return pairs(v) || tiles(v) || (has_lanes(f) && lanes(v)); }
// Whether they multiply bf16 (vdpbf16ps or tdpbf16ps), which flush.
bool flushes(const Variant& v) { return pairs(v) || tiles(v); }
// The pair decodes of q3_K, q4_K and q5_K and their lanes use GFNI (every AMD
// CPU with AVX512_BF16 has it); the variant's tests run where all five
// generate. The emulated tile unit runs on avx512_bf16.
bool available(const Variant& v) {
  if (v.flags & jit::kFlagTileEmu) return jit::isa_available(jit::Isa::avx512_bf16);
  return jit::isa_available(v.isa) && (!(pairs(v) || lanes(v)) || jit::host_features().gfni);
}
// Why a variant's tests skip here.
std::string lacks(const Variant& v) {
  return std::string("this CPU lacks ") + v.name + (pairs(v) ? " (or GFNI)" : "");
}
// q3_K's, q4_K's and q5_K's pair decodes need GFNI.
bool pairs_need_gfni(KQuant f) { return f == KQuant::q3_K || f == KQuant::q4_K || f == KQuant::q5_K; }

class KQuantKernels : public ::testing::TestWithParam<Variant> {};

// Rows whose factor records would not fit the kernel's area (over 16 KiB:
// 2 x the row's bytes) decode each block's factors at its first step instead
// of all at the row's start: both sides of that boundary. (The tile kernels
// unpack each block's factors at its first group whatever the row's length:
// for them these are long rows against float64.)
TEST_P(KQuantKernels, LongRowsBothFactorPaths) {
  const Variant v = GetParam();
  if (!available(v)) GTEST_SKIP() << lacks(v);
  moejit_test::Rng rng(37);
  for (KQuant f : kAll) {
    const int bb = fm::kquant_traits(f).block_bytes;
    const int last_fit = 16384 / (2 * bb);  // super-blocks of the longest row decoded at its start
    for (int k : {256 * last_fit, 256 * (last_fit + 1)}) {
      const int rows = 3;
      const Bank b = make_bank(f, rows, k, rng);
      std::vector<float> x = bf16_x(k, rng);
      const std::vector<float> x2 = bf16_x(k, rng);
      x.insert(x.end(), x2.begin(), x2.end());
      const auto kern = kernel(make_key(v, f, k, rows, 2));
      ASSERT_TRUE(kern);
      const std::vector<float> y = run(*kern, b, x);
      for (int m = 0; m < 2; ++m)
        for (int r = 0; r < rows; ++r)
          ASSERT_TRUE(matches(f, b.row(r), k, &x[size_t(m) * k], y[size_t(m) * rows + r], sums_first(v, f),
                              flushes(v)))
              << kern->key().name() << " token " << m << " row " << r;
    }
  }
}

// K-chunked kernels (jit/row_body.cpp: a call's prepared x above 48 KiB, here
// 4 and 5 tokens at K = 7168, fp32 x or bf16 pairs with their two running
// totals) give each token the bits of the same token alone (one token is
// never chunked): batch invariance across the chunked order of rows. The tile
// kernels are never chunked; for them this checks a run of 4 and 5 tokens
// against each token alone at a long K.
TEST_P(KQuantKernels, ChunkedCallsKeepEachTokensBits) {
  const Variant v = GetParam();
  if (!available(v)) GTEST_SKIP() << lacks(v);
  moejit_test::Rng rng(41);
  const int k = 7168, rows = 19;  // a full group of 16 (8 on avx2) and a partial one
  for (KQuant f : kAll) {
    const Bank b = make_bank(f, rows, k, rng);
    for (int tokens : {4, 5}) {
      std::vector<float> x;
      for (int m = 0; m < tokens; ++m) {
        const std::vector<float> xm = bf16_x(k, rng);
        x.insert(x.end(), xm.begin(), xm.end());
      }
      const jit::KernelKey key = make_key(v, f, k, rows, tokens);
      if (tokens > jit::max_tokens_per_call(key)) continue;
      const auto many = kernel(key);
      const auto one = kernel(make_key(v, f, k, rows, 1));
      ASSERT_TRUE(many && one);
      const std::vector<float> y = run(*many, b, x);
      for (int m = 0; m < tokens; ++m) {
        const std::vector<float> xm(x.begin() + ptrdiff_t(m) * k, x.begin() + ptrdiff_t(m + 1) * k);
        const std::vector<float> y1 = run(*one, b, xm);
        for (int r = 0; r < rows; ++r)
          ASSERT_EQ(std::memcmp(&y[size_t(m) * rows + r], &y1[size_t(r)], 4), 0)
              << many->key().name() << " token " << m << " row " << r << ": " << y[size_t(m) * rows + r]
              << " alone " << y1[size_t(r)];
      }
    }
  }
}

// Every byte value of every byte of the scale fields (and of d and dmin):
// row r of 256 holds value r in the byte under test, the rest random.
TEST_P(KQuantKernels, EveryScaleByteValue) {
  const Variant v = GetParam();
  if (!available(v)) GTEST_SKIP() << lacks(v);
  moejit_test::Rng rng(29);
  for (KQuant f : kAll) {
    const BitMap bm = bit_map(f);
    std::vector<int> bytes;  // the bytes of the sub-block scales, mins, d and dmin
    for (const std::vector<Field>* fields : {&bm.sc, &bm.m})
      for (const Field& fld : *fields)
        for (int bit : fld.bits) bytes.push_back(bit / 8);
    for (const Field* fld : {&bm.d, &bm.dmin})
      for (int bit : fld->bits) bytes.push_back(bit / 8);
    std::sort(bytes.begin(), bytes.end());
    bytes.erase(std::unique(bytes.begin(), bytes.end()), bytes.end());
    const int rows = 256, k = 512;
    const auto kern = kernel(make_key(v, f, k, 64, 1));
    ASSERT_TRUE(kern);
    for (int byte : bytes) {
      Bank b = make_bank(f, rows, k, rng);
      for (int r = 0; r < rows; ++r)
        b.data()[size_t(r) * b.row_bytes + size_t(bm.bytes) + size_t(byte)] = uint8_t(r);
      const std::vector<float> x = bf16_x(k, rng);
      for (int r0 = 0; r0 < rows; r0 += 64) {
        Bank part;
        part.row_bytes = b.row_bytes;
        part.buf.assign(1 + 64 * b.row_bytes, 0);
        std::memcpy(part.data(), b.row(r0), 64 * b.row_bytes);
        const std::vector<float> y = run(*kern, part, x);
        for (int i = 0; i < 64; ++i)
          ASSERT_TRUE(matches(f, part.row(i), k, x.data(), y[size_t(i)], sums_first(v, f), flushes(v)))
              << kern->key().name() << " byte " << byte << " of the second super-block = " << r0 + i;
      }
    }
  }
}

// d and dmin at the edges of fp16: subnormals (D_j = d sc exact in fp32 all the
// same), the largest finite, infinities and NaN (which propagate).
TEST_P(KQuantKernels, ExtremeSuperBlockScales) {
  const Variant v = GetParam();
  if (!available(v)) GTEST_SKIP() << lacks(v);
  moejit_test::Rng rng(31);
  const uint16_t kHalves[] = {0x0001, 0x03FF, 0x8001, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x0000};
  for (KQuant f : kAll) {
    const BitMap bm = bit_map(f);
    const int k = 768, rows = 16;
    const auto kern = kernel(make_key(v, f, k, rows, 1));
    ASSERT_TRUE(kern);
    for (uint16_t hd : kHalves)
      for (uint16_t hm : {uint16_t(0x3C00), uint16_t(0x0003), uint16_t(0x7C00), uint16_t(0x7E00)}) {
        if (!bm.mins && hm != 0x3C00) continue;
        Bank b = make_bank(f, rows, k, rng);
        for (int r = 0; r < rows; ++r) {  // one super-block per row gets the edge value
          uint8_t* blk = b.data() + size_t(r) * b.row_bytes + size_t(bm.bytes) * size_t(r % 3);
          set_fp16(bm.d, blk, hd);
          if (bm.mins) set_fp16(bm.dmin, blk, hm);
        }
        const std::vector<float> x = bf16_x(k, rng);
        const std::vector<float> y = run(*kern, b, x);
        for (int r = 0; r < rows; ++r)
          ASSERT_TRUE(matches(f, b.row(r), k, x.data(), y[size_t(r)], sums_first(v, f), flushes(v)))
              << kern->key().name() << " d " << std::hex << hd << " dmin " << hm << " row " << std::dec << r;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, KQuantKernels, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.name); });

// The kernels of every tier are generated from the K-quant decoder (not a
// fallback), each decode named, and the prepared x of the formats with mins
// carries their sums (the kernels read them: a wrong sum fails the tests above).
TEST(KQuantKernels, DecoderAndPreparedSums) {
  for (const Variant& v : kVariants) {
    for (KQuant f : kAll) {
      const std::string path = jit::decode_path(v.isa, moejit::formats::Format(int32_t(f)), v.flags);
      EXPECT_NE(path.find("K-quant"), std::string::npos) << v.name << " " << name(f) << ": " << path;
      EXPECT_EQ(path.find("bf16 pairs") != std::string::npos, pairs(v))
          << v.name << " " << name(f) << ": " << path;
      // The avx512 tiers' fp32 decode: vpermps tables of d sc[j] q, but q6_K's
      // conversion and FMA, and q4_K's and q5_K's lanes scaled per 128 elements
      // (kFlagNoGfni: the tables).
      if (v.isa != jit::Isa::avx2 && !pairs(v) && !tiles(v)) {
        const bool scaled_sums = has_lanes(f) && lanes(v);
        EXPECT_EQ(path.find("vpermps tables") != std::string::npos, f != KQuant::q6_K && !scaled_sums)
            << v.name << " " << name(f) << ": " << path;
        EXPECT_EQ(path.find("per 128 elements") != std::string::npos, scaled_sums)
            << v.name << " " << name(f) << ": " << path;
      }
      const jit::XPrep prep = jit::x_prep(v.isa, moejit::formats::Format(int32_t(f)), v.flags);
      const fm::KQuantTraits t = fm::kquant_traits(f);
      EXPECT_EQ(prep.sums().span, t.has_mins ? t.sub_block_size : 0) << v.name << " " << name(f);
      EXPECT_EQ(prep.elem_bytes(), pairs(v) || tiles(v) ? 2u : 4u) << v.name << " " << name(f);
      EXPECT_EQ(prep.tiled(), tiles(v)) << v.name << " " << name(f);
    }
  }
}

// The bf16-pair decodes are avx512_bf16's: the other tiers refuse the flag
// with the reason; the runtime asks for it on AMD, and for q6_K and q3_K on Intel.
TEST(KQuantKernels, BfPairsOnlyOnAvx512Bf16) {
  for (jit::Isa isa : {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16})
    for (KQuant f : kAll) {
      jit::KernelKey key = make_key(Variant{isa, jit::kFlagBf16Pairs, ""}, f, 512, 16, 1);
      std::string why;
      const bool ok = jit::gemv_supported(key, &why);
      if (isa == jit::Isa::avx512_bf16) {
        if (jit::isa_available(isa) && (jit::host_features().gfni || !pairs_need_gfni(f))) {
          EXPECT_TRUE(ok) << why;
        } else if (jit::isa_available(isa)) {
          EXPECT_FALSE(ok) << key.name();
          EXPECT_NE(why.find("lacks GFNI"), std::string::npos) << why;
        }
      } else if (jit::isa_available(isa)) {
        EXPECT_FALSE(ok) << key.name();
        EXPECT_NE(why.find("bf16-pair flag"), std::string::npos) << why;
      }
      const uint32_t flags = jit::runtime_flags(isa, moejit::formats::Format(int32_t(f)), 256);
      const bool fp32_on_intel = f == KQuant::q2_K || f == KQuant::q4_K || f == KQuant::q5_K;
      EXPECT_EQ((flags & jit::kFlagBf16Pairs) != 0, isa == jit::Isa::avx512_bf16 &&
                                                        (!jit::host_features().intel || !fp32_on_intel) &&
                                                        (jit::host_features().gfni || !pairs_need_gfni(f)))
          << name(f);
      // Intel's pair kernels keep the row order (kFlagRowOrder), AMD's chunk K.
      EXPECT_EQ((flags & jit::kFlagRowOrder) != 0,
                (flags & jit::kFlagBf16Pairs) && jit::host_features().intel)
          << name(f);
    }
}

// A CPU without GFNI (Skylake-SP, Cascade Lake, Cooper Lake): the runtime asks
// for kFlagNoGfni where a decode uses GFNI (q4_K's and q5_K's lanes, the avx512 tiers), and
// that decode needs no GFNI; the pairs are not asked for there.
TEST(KQuantKernels, WithoutGfniTheRuntimeAsksForTheDecodeWithoutIt) {
  jit::CpuFeatures cpu = jit::host_features();
  cpu.gfni = false;
  for (jit::Isa isa : {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16})
    for (bool intel : {false, true}) {
      cpu.intel = intel;
      for (KQuant f : kAll) {
        const auto format = moejit::formats::Format(int32_t(f));
        const uint32_t flags = jit::runtime_flags(isa, format, 256, cpu);
        const bool q45_zmm = has_lanes(f) && isa != jit::Isa::avx2;
        EXPECT_EQ((flags & jit::kFlagNoGfni) != 0, q45_zmm) << jit::isa_name(isa) << " " << name(f);
        if (pairs_need_gfni(f)) {
          EXPECT_EQ(flags & jit::kFlagBf16Pairs, 0u) << jit::isa_name(isa) << " " << name(f);
        }
        const std::string path = jit::decode_path(isa, format, flags);
        if (q45_zmm) {
          EXPECT_NE(path.find("vpermps tables"), std::string::npos) << path;
        }
        std::string why;
        const jit::KernelKey key = make_key(Variant{isa, flags, ""}, f, 512, 16, 1);
        if (jit::isa_available(isa)) {
          EXPECT_TRUE(jit::gemv_supported(key, &why)) << key.name() << ": " << why;
        }
      }
    }
}

// kFlagRowOrder: only with the bf16 pairs (refused with the reason), and it
// changes exactly the kernels that would chunk K (x above 48 KiB: 4 tokens at
// K = 7168, not at K = 2048).
TEST(KQuantKernels, RowOrderFlagKeepsPairKernelsUnchunked) {
  if (!jit::isa_available(jit::Isa::avx512_bf16) || !jit::host_features().gfni)
    GTEST_SKIP() << "this CPU lacks avx512_bf16 (or GFNI)";
  for (KQuant f : kAll) {
    std::string why;
    EXPECT_FALSE(jit::gemv_supported(
        make_key(Variant{jit::Isa::avx512_bf16, jit::kFlagRowOrder, ""}, f, 512, 16, 1), &why));
    EXPECT_NE(why.find("row-order flag"), std::string::npos) << why;
    for (int k : {2048, 7168}) {
      const auto chunked =
          kernel(make_key(Variant{jit::Isa::avx512_bf16, jit::kFlagBf16Pairs, ""}, f, k, 16, 4));
      const auto rows = kernel(make_key(
          Variant{jit::Isa::avx512_bf16, jit::kFlagBf16Pairs | jit::kFlagRowOrder, ""}, f, k, 16, 4));
      ASSERT_TRUE(chunked && rows);
      const bool same = chunked->code_size() == rows->code_size() &&
                        std::memcmp(chunked->code(), rows->code(), rows->code_size()) == 0;
      EXPECT_EQ(same, k == 2048) << name(f) << " K = " << k;
    }
  }
}

// The prepared x of the pair decode: element i of sub-block s of a
// super-block at word 32 (4 t + j) + 16 (c % 2) + i / 2 (c = s / 2, t = c / 2,
// j = 2 (i % 2) + s % 2), the super-block's 8 sums of x after it.
TEST(KQuantKernels, PairLayoutPlacesNibbleWords) {
  const jit::XPrep prep =
      jit::x_prep(jit::Isa::avx512_bf16, moejit::formats::Format::q4_K, jit::kFlagBf16Pairs);
  ASSERT_EQ(prep.layout(), jit::XLayout::bf16_kq4);
  std::vector<bool> seen(256, false);
  for (int e = 0; e < 512; ++e) {
    const int r = e % 256, s = r / 32, i = r % 32, c = s / 2;
    const int64_t want =
        e / 256 * (256 + 32) + 32 * (4 * (c / 2) + 2 * (i % 2) + s % 2) + 16 * (c % 2) + i / 2;
    EXPECT_EQ(prep.position(e), want) << e;
    if (e < 256) {
      ASSERT_LT(prep.position(e), 256);
      EXPECT_FALSE(seen[size_t(prep.position(e))]) << e;
      seen[size_t(prep.position(e))] = true;
    }
  }
  // q6_K's: element 32 a + l of half h at 32 (4 h + 2 (l % 2) + a / 2) + 16 (a % 2) + l / 2, no sums.
  const jit::XPrep p6 =
      jit::x_prep(jit::Isa::avx512_bf16, moejit::formats::Format::q6_K, jit::kFlagBf16Pairs);
  ASSERT_EQ(p6.layout(), jit::XLayout::bf16_kq6);
  EXPECT_EQ(p6.sums().span, 0);
  std::vector<bool> seen6(256, false);
  for (int e = 0; e < 512; ++e) {
    const int r = e % 256, h = r / 128, a = r % 128 / 32, l = r % 32;
    EXPECT_EQ(p6.position(e), e / 256 * 256 + 32 * (4 * h + 2 * (l % 2) + a / 2) + 16 * (a % 2) + l / 2) << e;
    if (e < 256) {
      EXPECT_FALSE(seen6[size_t(p6.position(e))]) << e;
      seen6[size_t(p6.position(e))] = true;
    }
  }
  std::vector<float> x(512);
  for (int e = 0; e < 512; ++e) x[size_t(e)] = float(e % 7) - 3.0f;
  std::vector<uint8_t> buf(size_t(prep.vector_bytes(512)), 0);
  prep.store(buf.data(), 0, x.data(), 512);
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 8; ++s) {
      float want = 0;
      for (int i = 0; i < 32; ++i) want += x[size_t(256 * b + 32 * s + i)];
      float got;
      std::memcpy(&got, buf.data() + prep.sum_offset(256 * b + 32 * s), 4);
      EXPECT_EQ(got, want) << b << " " << s;
    }
}

}  // namespace
