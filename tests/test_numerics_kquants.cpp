// The GGUF K-quants through the C API on every tier the host has (avx512_amx
// included: it runs the avx512_bf16 kernels) against the float64 reference of
// numerics_ref (bounds from sum(|d sc q x| + |dmin m x|), Mat::magnitude): MoE
// layers of each K-quant, fused and separate banks, the Q4_K_M mix (gate and up
// q4_K, down q6_K) and K-quants next to other formats; dense linear layers;
// the same bits for any thread count and with dedup on or off, and each
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

const auto Q4K = MOEJIT_FORMAT_Q4_K;
const auto Q5K = MOEJIT_FORMAT_Q5_K;
const auto Q6K = MOEJIT_FORMAT_Q6_K;
const auto Q2K = MOEJIT_FORMAT_Q2_K;
const auto Q3K = MOEJIT_FORMAT_Q3_K;
const auto BF16 = MOEJIT_FORMAT_BF16;
const auto Q80 = MOEJIT_FORMAT_Q8_0;
const auto OB = MOEJIT_DTYPE_BF16;
const auto OF = MOEJIT_DTYPE_F32;

MoeProblem moe(const char* name, moejit_format fmt, int H, int I, Fill fill, uint64_t seed) {
  return moe_problem(name, fmt, H, I, 6, 9, fill, seed);
}

MoeProblem separate(MoeProblem p, ProjSpec up, ProjSpec down) {
  p.separate = true;
  p.up_format = up;
  p.down_format = down;
  return p;
}

std::vector<MoeProblem> moe_problems() {
  std::vector<MoeProblem> v;
  MoeProblem p = moe("q4_K_bias", Q4K, 512, 256, Fill::random, 1);
  p.bias = true;
  v.push_back(p);
  p = moe("q5_K_interleaved_gelu_bf16out", Q5K, 768, 256, Fill::random, 2);
  p.interleaved = 1, p.act = MOEJIT_ACT_GELU, p.out = OB;
  v.push_back(p);
  p = moe("q6_K_f32out", Q6K, 512, 512, Fill::random, 3);
  p.out = OF;
  v.push_back(p);
  v.push_back(moe("q2_K", Q2K, 256, 256, Fill::random, 4));
  p = moe("q3_K_router_weight_on_input", Q3K, 512, 256, Fill::random, 5);
  p.rwoi = 1;
  v.push_back(p);
  for (auto [f, seed] : {std::pair{Q4K, 6}, {Q5K, 7}, {Q6K, 8}, {Q2K, 9}, {Q3K, 10}}) {
    p = moe("quant", f, 768, 512, Fill::quantized, uint64_t(seed));
    p.name = std::string("quant_") + moejit_format_name(f);
    p.max_tokens = 5;
    v.push_back(p);
  }
  // Q4_K_M as GGUF files hold it: separate gate and up banks in q4_K, down q6_K.
  p = separate(moe("q4_K_M_separate", Q4K, 1024, 512, Fill::quantized, 11), proj(Q4K), proj(Q6K));
  p.out = OB;
  v.push_back(p);
  p = separate(moe("q4_K_M_separate_random_swiglu", Q4K, 512, 256, Fill::random, 12), proj(Q4K), proj(Q6K));
  p.act = MOEJIT_ACT_SWIGLU_OAI, p.limit = 7.0f, p.bias = true;
  v.push_back(p);
  // K-quants beside other formats (their x layouts differ: up gets its own prepared x).
  p = separate(moe("bf16_gate_q5_K_up_q2_K_down", BF16, 256, 256, Fill::random, 13), proj(Q5K), proj(Q2K));
  v.push_back(p);
  p = separate(moe("q3_K_gate_q8_0_up_q4_K_down", Q3K, 512, 256, Fill::random, 14), proj(Q80), proj(Q4K));
  v.push_back(p);
  p = moe("q6_K_gate_up_fused_q4_K_down", Q6K, 256, 512, Fill::quantized, 15);
  p.down_format = proj(Q4K);
  v.push_back(p);
  return v;
}

class KQuantMoe : public ::testing::TestWithParam<std::tuple<moejit_isa, int>> {};

TEST_P(KQuantMoe, MatchesReference) {
  const moejit_isa tier = std::get<0>(GetParam());
  if (tier > moejit_host_isa()) GTEST_SKIP() << "tier " << moejit_isa_name(tier) << " is above this host's";
  const MoeProblem p = moe_problems()[size_t(std::get<1>(GetParam()))];
  const MoeData d = make_moe(p);
  const Reference ref = moe_reference(d);
  expect_moe_matches(tier, d, ref);
}

INSTANTIATE_TEST_SUITE_P(Tiers, KQuantMoe,
                         ::testing::Combine(::testing::ValuesIn(kTiers),
                                            ::testing::Range(0, int(moe_problems().size()))),
                         [](const auto& info) {
                           return std::string(moejit_isa_name(std::get<0>(info.param))) + "_" +
                                  sanitize(moe_problems()[size_t(std::get<1>(info.param))].name);
                         });

// ------------------------------------------------------------------ linear

LinearProblem lin(moejit_format f, int rows, int cols, moejit_dtype out, bool bias, Fill fill,
                  uint64_t seed) {
  LinearProblem p;
  p.name = std::string(moejit_format_name(f)) + "_r" + std::to_string(rows) + "_c" + std::to_string(cols) +
           (bias ? "_bias" : "") + (out == OB ? "_bf16out" : "") + (fill == Fill::quantized ? "_quant" : "");
  p.fmt = f;
  p.rows = rows;
  p.cols = cols;
  p.out = out;
  p.bias = bias;
  p.fill = fill;
  p.seed = seed;
  return p;
}

std::vector<LinearProblem> linear_problems() {
  std::vector<LinearProblem> v;
  uint64_t seed = 100;
  for (moejit_format f : {Q4K, Q5K, Q6K, Q2K, Q3K}) {
    v.push_back(lin(f, 1, 256, OF, false, Fill::random, ++seed));
    v.push_back(lin(f, 33, 768, OB, true, Fill::random, ++seed));
    v.push_back(lin(f, 130, 2048, OF, false, Fill::quantized, ++seed));
  }
  return v;
}

class KQuantLinear : public ::testing::TestWithParam<std::tuple<moejit_isa, int>> {};

TEST_P(KQuantLinear, MatchesReference) {
  const moejit_isa tier = std::get<0>(GetParam());
  if (tier > moejit_host_isa()) GTEST_SKIP() << "tier " << moejit_isa_name(tier) << " is above this host's";
  const LinearProblem p = linear_problems()[size_t(std::get<1>(GetParam()))];
  expect_linear_matches(tier, p);
}

INSTANTIATE_TEST_SUITE_P(Tiers, KQuantLinear,
                         ::testing::Combine(::testing::ValuesIn(kTiers),
                                            ::testing::Range(0, int(linear_problems().size()))),
                         [](const auto& info) {
                           return std::string(moejit_isa_name(std::get<0>(info.param))) + "_" +
                                  sanitize(linear_problems()[size_t(std::get<1>(info.param))].name);
                         });

// ------------------------------------------------------------------ determinism and stats

class KQuantTier : public ::testing::TestWithParam<moejit_isa> {};

// Dedup on and off and 1 to 3 threads give the same bits (tokens are batched
// differently in each: a token's arithmetic may not depend on its neighbours),
// and the stats count each projection's own bytes.
TEST_P(KQuantTier, SameBitsForAnyThreadsAndDedup) {
  const moejit_isa tier = GetParam();
  if (tier > moejit_host_isa()) GTEST_SKIP() << "tier " << moejit_isa_name(tier) << " is above this host's";
  const std::vector<MoeProblem> all = moe_problems();
  for (size_t i : {size_t(0), size_t(4), size_t(10), size_t(12)}) {
    MoeProblem p = all[i];
    p.max_tokens = 17, p.E = 5, p.top_k = 4;
    const MoeData d = make_moe(p);
    SCOPED_TRACE(p.name + " tier " + moejit_isa_name(tier));
    expect_same_bits_any_threads_and_dedup(tier, d);
  }
  // A linear layer: 1 and 3 threads, the same bits.
  const LinearData ld = make_linear(lin(Q5K, 130, 768, OF, true, Fill::random, 7));
  std::vector<uint8_t> first;
  for (int threads : {1, 3}) {
    CtxPtr ctx = make_ctx(tier, threads);
    ASSERT_TRUE(ctx);
    LinearPtr l = make_linear_obj(ctx.get(), ld.desc(), ld.p.name);
    ASSERT_TRUE(l);
    const std::vector<uint8_t> y = linear_call(l.get(), ld, ld.p.max_tokens);
    if (first.empty())
      first = y;
    else
      EXPECT_EQ(std::memcmp(first.data(), y.data(), y.size()), 0) << "linear, threads " << threads;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, KQuantTier, ::testing::ValuesIn(kTiers),
                         [](const auto& info) { return std::string(moejit_isa_name(info.param)); });

}  // namespace
