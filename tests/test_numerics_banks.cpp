// Separate gate and up banks and a format per projection (api.md 0.2) on every
// tier the host has: separate banks give the bits of the fused gate_up holding
// the same rows (concatenated and interleaved, every format); layers whose
// projections mix formats against the float64 reference; mixed layers give the
// same bits for any thread count and with dedup on or off, and count each
// projection's own bytes in weight_bytes_read.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "moejit.h"
#include "numerics_helpers.h"
#include "numerics_ref.h"
#include "test_util.h"

using namespace moejit_test;

namespace {

const auto BF16 = MOEJIT_FORMAT_BF16;
const auto FP8 = MOEJIT_FORMAT_FP8_BLOCK;
const auto MX8 = MOEJIT_FORMAT_MXFP8_E4M3;
const auto MX5 = MOEJIT_FORMAT_MXFP8_E5M2;
const auto Q40 = MOEJIT_FORMAT_Q4_0;
const auto MF4 = MOEJIT_FORMAT_MXFP4;
const auto NV4 = MOEJIT_FORMAT_NVFP4;
const auto DS4 = MOEJIT_FORMAT_DS_FP4;
const auto Q80 = MOEJIT_FORMAT_Q8_0;
const auto SB = MOEJIT_DTYPE_BF16;
const auto SF = MOEJIT_DTYPE_F32;

bool skip_tier(moejit_isa tier) { return tier > moejit_host_isa(); }

// Rows r0, r0 + step, ... (n of them) of m as a matrix of their own: weights,
// scale rows (one per weight row; fp8_block's one per 128 rows, so there only
// step 1 from a multiple of 128), nvfp4 row globals and bias.
Mat rows_of(const Mat& m, int64_t r0, int64_t n, int64_t step) {
  const fm::Layout l = m.layout();
  const int64_t rb = fm::row_bytes(l.format, m.k);
  Mat s = m;
  s.rows = n;
  s.data.assign(size_t(n * rb), 0);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(&s.data[size_t(i * rb)], &m.data[size_t((r0 + i * step) * rb)], size_t(rb));
  if (!m.scales.empty()) {
    const size_t eb = size_t(fm::scale_elem_bytes(l.format, l.scale_dtype));
    const size_t srow = size_t(m.stride) * eb;
    if (m.fmt == FP8) {
      EXPECT_TRUE(step == 1 && r0 % 128 == 0) << "fp8_block scale blocks would not line up";
      s.srows = (n + 127) / 128;
      s.scales.assign(m.scales.begin() + ptrdiff_t(size_t(r0 / 128) * srow),
                      m.scales.begin() + ptrdiff_t(size_t(r0 / 128 + s.srows) * srow));
    } else {
      s.srows = n;
      s.scales.assign(size_t(n) * srow, 0);
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(&s.scales[size_t(i) * srow], &m.scales[size_t(r0 + i * step) * srow], srow);
    }
  }
  if (!m.row_scales.empty()) {
    s.row_scales.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) s.row_scales[size_t(i)] = m.row_scales[size_t(r0 + i * step)];
  }
  if (!m.bias.empty()) {
    s.bias.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) s.bias[size_t(i)] = m.bias[size_t(r0 + i * step)];
  }
  return s;
}

// The same layer with gate and up split out of d's fused gate_up into banks of their own.
MoeData split(const MoeData& fused) {
  MoeData d = fused;
  const int64_t I = d.p.I;
  d.p.separate = true;
  d.p.interleaved = 0;
  d.gu.clear();
  d.up.clear();
  d.gu_api.clear();
  d.up_api.clear();
  for (const Mat& gu : fused.gu) {
    d.gu.push_back(fused.p.interleaved ? rows_of(gu, 0, I, 2) : rows_of(gu, 0, I, 1));
    d.up.push_back(fused.p.interleaved ? rows_of(gu, 1, I, 2) : rows_of(gu, I, I, 1));
  }
  for (size_t e = 0; e < d.gu.size(); ++e) {
    d.gu_api.push_back(d.gu[e].api());
    d.up_api.push_back(d.up[e].api());
  }
  return d;
}

// ------------------------------------------------------------------ separate = fused

struct SplitCase {
  moejit_format fmt;
  bool interleaved;
};

class SeparateBanks : public ::testing::TestWithParam<std::tuple<moejit_isa, SplitCase>> {};

TEST_P(SeparateBanks, GiveTheBitsOfTheFusedGateUp) {
  const moejit_isa tier = std::get<0>(GetParam());
  const SplitCase c = std::get<1>(GetParam());
  if (skip_tier(tier)) GTEST_SKIP() << "tier " << moejit_isa_name(tier) << " is above this host's";
  MoeProblem p;
  p.name = std::string(moejit_format_name(c.fmt)) + (c.interleaved ? " interleaved" : " concatenated");
  p.fmt = c.fmt;
  // H with a short last 128-block; I a multiple of 128 so fp8_block's scale blocks split evenly.
  p.H = 320, p.I = 256, p.E = 5, p.top_k = 3, p.max_tokens = 9;
  p.interleaved = c.interleaved;
  p.act = c.interleaved ? MOEJIT_ACT_SWIGLU_OAI : MOEJIT_ACT_SILU;
  p.limit = c.interleaved ? 7.0f : 0.0f;
  p.bias = true, p.pad = 1;
  p.group = c.fmt == MX8 ? 64 : 0;
  p.seed = 1000 + uint64_t(c.fmt);
  const MoeData fused = make_moe(p);
  const MoeData separate = split(fused);
  for (int threads : {1, 3}) {
    CtxPtr ctx = make_ctx(tier, threads);
    ASSERT_TRUE(ctx);
    MoePtr mf = make_moe_obj(ctx.get(), fused);
    MoePtr ms = make_moe_obj(ctx.get(), separate);
    ASSERT_TRUE(mf && ms);
    for (int T = 1; T <= p.max_tokens; T += 4) {
      const std::vector<uint8_t> yf = moe_call(mf.get(), fused, T);
      const std::vector<uint8_t> ys = moe_call(ms.get(), separate, T);
      ASSERT_EQ(yf.size(), ys.size());
      EXPECT_EQ(std::memcmp(yf.data(), ys.data(), yf.size()), 0)
          << p.name << " tier " << moejit_isa_name(tier) << " threads " << threads << " tokens " << T;
      EXPECT_GT(count_finite_nonzero(ys, p.out), int(ys.size() / dsize(p.out)) / 2) << p.name;
    }
  }
}

std::vector<SplitCase> split_cases() {
  std::vector<SplitCase> v;
  for (moejit_format f : {BF16, NV4, MF4, DS4, Q40, FP8, Q80, MX8, MX5}) {
    v.push_back({f, false});
    if (f != FP8) v.push_back({f, true});  // fp8_block's 128-row scale blocks do not interleave
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Tiers, SeparateBanks,
                         ::testing::Combine(::testing::ValuesIn(kTiers), ::testing::ValuesIn(split_cases())),
                         [](const auto& info) {
                           const SplitCase& c = std::get<1>(info.param);
                           return std::string(moejit_isa_name(std::get<0>(info.param))) + "_" +
                                  moejit_format_name(c.fmt) + (c.interleaved ? "_interleaved" : "_concat");
                         });

// ------------------------------------------------------------------ mixed formats vs float64

MoeProblem mixed(const char* name, moejit_format gate, bool separate, ProjSpec up, ProjSpec down, int H,
                 int I, moejit_activation act, Fill fill, uint64_t seed) {
  MoeProblem p;
  p.name = name;
  p.fmt = gate;
  p.separate = separate;
  p.up_format = up;
  p.down_format = down;
  p.H = H, p.I = I, p.E = 6, p.top_k = 3;
  p.act = act;
  p.fill = fill;
  p.seed = seed;
  return p;
}

std::vector<MoeProblem> mixed_problems() {
  const ProjSpec same;  // not given: as gate
  std::vector<MoeProblem> v;
  MoeProblem p;
  p = mixed("sep_fp8_gate_up_bf16_down_bias", FP8, true, same, proj(BF16), 384, 200, MOEJIT_ACT_SILU,
            Fill::exact, 1);
  p.bias = true, p.pad = 2;
  v.push_back(p);
  p = mixed("sep_q8_0_gate_up_mxfp4_down", Q80, true, proj(Q80), proj(MF4), 256, 192, MOEJIT_ACT_GELU,
            Fill::exact, 2);
  v.push_back(p);
  p = mixed("fused_fp8f32_gate_up_mx8g64_down_pad2", FP8, false, same, proj(MX8, SB, 64), 256, 128,
            MOEJIT_ACT_GELU_TANH, Fill::exact, 3);
  p.sdt = SF, p.pad = 2, p.out = MOEJIT_DTYPE_F32;
  v.push_back(p);
  p = mixed("fused_il_mxfp4_gate_up_bf16_down_gptoss", MF4, false, same, proj(BF16), 2880, 96,
            MOEJIT_ACT_SWIGLU_OAI, Fill::exact, 4);
  p.interleaved = 1, p.bias = true, p.limit = 7.0f, p.max_tokens = 4;
  v.push_back(p);
  p = mixed("sep_bf16_gate_q4_0_up_mx5g128_down", BF16, true, proj(Q40), proj(MX5, SB, 128), 256, 256,
            MOEJIT_ACT_SILU, Fill::exact, 5);
  p.rwoi = 1;
  v.push_back(p);
  p = mixed("sep_nvfp4_gate_fp8f32_up_q8_0_down", NV4, true, proj(FP8, SF), proj(Q80), 288, 160,
            MOEJIT_ACT_SWIGLU_CLAMP, Fill::exact, 6);
  p.limit = 2.0f, p.bias = true, p.pad = 1;
  v.push_back(p);
  p = mixed("sep_ds_fp4_everywhere_bias", DS4, true, same, same, 256, 160, MOEJIT_ACT_SILU, Fill::exact, 7);
  p.bias = true;
  v.push_back(p);
  p = mixed("sep_q4_0_gate_up_fp8_down_T20", Q40, true, same, proj(FP8), 128, 96, MOEJIT_ACT_SILU,
            Fill::exact, 8);
  p.max_tokens = 20;
  v.push_back(p);
  p = mixed("random_sep_fp8_gate_bf16_up_mx8_down", FP8, true, proj(BF16), proj(MX8), 192, 128,
            MOEJIT_ACT_SILU, Fill::random, 9);
  p.pad = 1;
  v.push_back(p);
  p = mixed("quant_sep_q8_0_gate_up_mxfp4_down_bias", Q80, true, same, proj(MF4), 256, 128, MOEJIT_ACT_SILU,
            Fill::quantized, 10);
  p.bias = true, p.max_tokens = 4;
  v.push_back(p);
  p = mixed("quant_fused_fp8_gate_up_bf16_down", FP8, false, same, proj(BF16), 384, 200, MOEJIT_ACT_GELU,
            Fill::quantized, 11);
  p.max_tokens = 4;
  v.push_back(p);
  return v;
}

class MixedFormats : public ::testing::TestWithParam<std::tuple<moejit_isa, int>> {};

TEST_P(MixedFormats, MatchReference) {
  const moejit_isa tier = std::get<0>(GetParam());
  if (skip_tier(tier)) GTEST_SKIP() << "tier " << moejit_isa_name(tier) << " is above this host's";
  const MoeProblem p = mixed_problems()[size_t(std::get<1>(GetParam()))];
  const MoeData d = make_moe(p);
  const Reference ref = moe_reference(d);
  if (p.fill == Fill::exact) {
    EXPECT_LE(ref.significant * 100, ref.g_elems) << "too many ambiguous g elements";
  }
  expect_moe_matches(tier, d, ref);
}

INSTANTIATE_TEST_SUITE_P(Tiers, MixedFormats,
                         ::testing::Combine(::testing::ValuesIn(kTiers),
                                            ::testing::Range(0, int(mixed_problems().size()))),
                         [](const auto& info) {
                           return std::string(moejit_isa_name(std::get<0>(info.param))) + "_" +
                                  sanitize(mixed_problems()[size_t(std::get<1>(info.param))].name);
                         });

// ------------------------------------------------------------------ determinism and stats

class MixedTier : public ::testing::TestWithParam<moejit_isa> {};

TEST_P(MixedTier, SameBitsForAnyThreadsAndDedupAndOwnBytesCounted) {
  const moejit_isa tier = GetParam();
  if (skip_tier(tier)) GTEST_SKIP() << "tier " << moejit_isa_name(tier) << " is above this host's";
  for (int i : {1, 2, 4, 5, 7}) {
    MoeProblem p = mixed_problems()[size_t(i)];
    p.max_tokens = 17, p.E = 5, p.top_k = 4;
    const MoeData d = make_moe(p);
    SCOPED_TRACE(p.name + " tier " + moejit_isa_name(tier));
    expect_same_bits_any_threads_and_dedup(tier, d);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, MixedTier, ::testing::ValuesIn(kTiers),
                         [](const auto& info) { return std::string(moejit_isa_name(info.param)); });

}  // namespace
