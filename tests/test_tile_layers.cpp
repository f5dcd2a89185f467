// MoE and linear layers whose kernels are tile kernels, on any CPU with
// avx512_bf16: a context of tier avx512_amx built here with every format on
// tiles (as MOEJIT_TILES=all gives) and its kernels on the emulated tile unit
// (Context's test-only tile_emu, jit::kFlagTileEmu), through the C API, against
// the float64 reference of numerics_ref at every token count up to 20 (runs of
// 16 tokens and a shorter one). This checks the runtime's side of the tile
// tier that the kernel tests do not reach: the plans, the tile layouts of x and
// g (with the K-quants' sums of x), the runs a group's tokens are cut into,
// dedup on and off, the Q4_K_M mix. The tile unit itself runs these layers on
// the Xeon (`MOEJIT_TILES=all` over test_numerics, docs/RELIABILITY.md).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "jit/cpu.h"
#include "moejit.h"
#include "numerics_helpers.h"
#include "numerics_ref.h"
#include "runtime/context.h"
#include "runtime/linear.h"
#include "runtime/moe.h"
#include "test_util.h"

using namespace moejit_test;
namespace jit = moejit::jit;

namespace {

bool emulation_runs() {
  return jit::isa_available(jit::Isa::avx512_bf16) && jit::host_features().avx512_vbmi;
}
const char* kWhy = "the emulated tile unit needs avx512_bf16 (and the byte-table decodes VBMI)";

// A context of tier avx512_amx whose layers run tile kernels for every format,
// on the emulated tile unit; `dedup` as the context's.
CtxPtr tile_ctx(int threads, bool dedup) {
  auto* c = new moejit_context();
  c->impl = std::make_shared<moejit::Context>(threads, std::vector<int>{}, jit::Isa::avx512_amx, 0u, dedup,
                                              false, /*all_tiles=*/true, /*tile_emu=*/true);
  return CtxPtr(c);
}

MoeProblem moe(const std::string& name, moejit_format fmt, int H, int I, uint64_t seed) {
  return moe_problem(name, fmt, H, I, 5, 20, Fill::exact, seed);
}

std::vector<MoeProblem> problems() {
  std::vector<MoeProblem> v;
  v.push_back(moe("bf16_H200_I72", MOEJIT_FORMAT_BF16, 200, 72, 1));
  MoeProblem p = moe("fp8f32_H256_I200_bias", MOEJIT_FORMAT_FP8_BLOCK, 256, 200, 2);
  p.sdt = MOEJIT_DTYPE_F32, p.bias = true;
  v.push_back(p);
  p = moe("mxfp8e4m3_g64_H256_I128", MOEJIT_FORMAT_MXFP8_E4M3, 256, 128, 3);
  p.group = 64;
  v.push_back(p);
  v.push_back(moe("mxfp8e5m2_H256_I96", MOEJIT_FORMAT_MXFP8_E5M2, 256, 96, 4));
  p = moe("q8_0_H256_I96_interleaved", MOEJIT_FORMAT_Q8_0, 256, 96, 5);
  p.interleaved = 1;
  v.push_back(p);
  v.push_back(moe("q4_0_H256_I96", MOEJIT_FORMAT_Q4_0, 256, 96, 6));
  p = moe("mxfp4_H2880_I64_swiglu", MOEJIT_FORMAT_MXFP4, 2880, 64, 7);
  p.act = MOEJIT_ACT_SWIGLU_OAI, p.limit = 7.0f, p.interleaved = 1, p.bias = true;
  v.push_back(p);
  v.push_back(moe("nvfp4_H144_I80", MOEJIT_FORMAT_NVFP4, 144, 80, 8));  // K % 32 == 16
  v.push_back(moe("ds_fp4_H256_I160", MOEJIT_FORMAT_DS_FP4, 256, 160, 9));
  for (auto [f, seed] : {std::pair{MOEJIT_FORMAT_Q4_K, 10},
                         {MOEJIT_FORMAT_Q5_K, 11},
                         {MOEJIT_FORMAT_Q6_K, 12},
                         {MOEJIT_FORMAT_Q2_K, 13},
                         {MOEJIT_FORMAT_Q3_K, 14}}) {
    p = moe(std::string(moejit_format_name(f)) + "_H512_I256", f, 512, 256, uint64_t(seed));
    p.fill = Fill::random;
    v.push_back(p);
  }
  p = moe("q4_K_M_separate", MOEJIT_FORMAT_Q4_K, 512, 256, 15);
  p.fill = Fill::quantized, p.separate = true, p.up_format = proj(MOEJIT_FORMAT_Q4_K);
  p.down_format = proj(MOEJIT_FORMAT_Q6_K);
  v.push_back(p);
  return v;
}

class TileLayers : public ::testing::TestWithParam<int> {};

// Every token count through one layer with dedup, and the largest without.
TEST_P(TileLayers, MoeMatchesReference) {
  if (!emulation_runs()) GTEST_SKIP() << kWhy;
  const MoeProblem p = problems()[size_t(GetParam())];
  const MoeData d = make_moe(p);
  const Reference ref = moe_reference(d);
  for (bool dedup : {true, false}) {
    CtxPtr ctx = tile_ctx(2, dedup);
    MoePtr m = make_moe_obj(ctx.get(), d);
    ASSERT_TRUE(m);
    const moejit::plan::MoePlan& plan = m->impl->plan();
    for (int k = 0; k < 3; ++k)
      if (plan.has(k)) {
        EXPECT_EQ(plan.mats[k].isa, jit::Isa::avx512_amx) << p.name << " projection " << k;
        EXPECT_TRUE(plan.mats[k].flags & jit::kFlagTileEmu) << p.name;
      }
    EXPECT_EQ(moejit_context_isa(ctx.get()), MOEJIT_ISA_AVX512_AMX);
    for (int T = dedup ? 1 : p.max_tokens; T <= p.max_tokens; ++T) {
      const std::vector<uint8_t> y = moe_call(m.get(), d, T);
      const std::string what = p.name + (dedup ? "" : " without dedup") + " num_tokens " + std::to_string(T);
      if (check_against(y, p.out, ref, T, p.H, what) > 0) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, TileLayers, ::testing::Range(0, int(problems().size())),
                         [](const auto& info) { return sanitize(problems()[size_t(info.param)].name); });

// The same bits on 1 and 3 workers, and with dedup on and off, at 20 tokens.
TEST(TileLayers, SameBitsForAnyThreadsAndDedup) {
  if (!emulation_runs()) GTEST_SKIP() << kWhy;
  for (int i : {0, 7, 9, 10}) {  // bf16, nvfp4, q4_K, q5_K
    const MoeProblem p = problems()[size_t(i)];
    const MoeData d = make_moe(p);
    std::vector<uint8_t> first;
    for (auto [threads, dedup] : {std::pair{1, true}, {3, true}, {3, false}}) {
      CtxPtr ctx = tile_ctx(threads, dedup);
      MoePtr m = make_moe_obj(ctx.get(), d);
      ASSERT_TRUE(m);
      const std::vector<uint8_t> y = moe_call(m.get(), d, p.max_tokens);
      if (first.empty())
        first = y;
      else
        EXPECT_EQ(y, first) << p.name << " on " << threads << " workers, dedup " << dedup;
    }
  }
}

TEST(TileLayers, LinearMatchesReference) {
  if (!emulation_runs()) GTEST_SKIP() << kWhy;
  std::vector<LinearProblem> v;
  auto lin = [&](const char* name, moejit_format f, int rows, int cols, bool bias, uint64_t seed) {
    LinearProblem p;
    p.name = name, p.fmt = f, p.rows = rows, p.cols = cols, p.bias = bias, p.seed = seed, p.max_tokens = 18;
    v.push_back(p);
  };
  lin("bf16_r130_c200", MOEJIT_FORMAT_BF16, 130, 200, true, 1);
  lin("nvfp4_r37_c2896", MOEJIT_FORMAT_NVFP4, 37, 2896, false, 2);
  lin("q4_K_r33_c512", MOEJIT_FORMAT_Q4_K, 33, 512, true, 3);
  lin("q3_K_r64_c768", MOEJIT_FORMAT_Q3_K, 64, 768, false, 4);
  lin("q8_0_r40_c2880", MOEJIT_FORMAT_Q8_0, 40, 2880, false, 5);
  for (const LinearProblem& p : v) {
    const LinearData d = make_linear(p);
    const Reference ref = linear_reference(d);
    CtxPtr ctx = tile_ctx(2, true);
    LinearPtr l = make_linear_obj(ctx.get(), d.desc(), p.name);
    ASSERT_TRUE(l);
    EXPECT_TRUE(l->impl->matmul().xprep().tiled()) << p.name;
    for (int T = 1; T <= p.max_tokens; ++T) {
      const std::vector<uint8_t> y = linear_call(l.get(), d, T);
      if (check_against(y, p.out, ref, T, p.rows, p.name + " num_tokens " + std::to_string(T)) > 0) break;
    }
  }
}

// A tile layout interleaves a run's tokens, so a call of one width writes x
// where a call of another width has its padding past K. A later call's bits
// must not depend on an earlier call's activations: inf activations in a call
// of 3 tokens, then finite calls of 1 and 2 tokens, give the bits a fresh
// layer gives (a stale inf in the padding times a 0 weight would be a NaN).
TEST(TileLayers, AnEarlierCallLeavesNoTraceInALaterOne) {
  if (!emulation_runs()) GTEST_SKIP() << kWhy;
  auto lin = [](const char* name, moejit_format f, int rows, int cols, uint64_t seed) {
    LinearProblem p;
    p.name = name, p.fmt = f, p.rows = rows, p.cols = cols, p.seed = seed, p.max_tokens = 4;
    return p;
  };
  for (const LinearProblem& p : {lin("bf16_r20_c200", MOEJIT_FORMAT_BF16, 20, 200, 1),
                                 lin("nvfp4_r17_c2896", MOEJIT_FORMAT_NVFP4, 17, 2896, 2),
                                 lin("q8_0_r16_c2880", MOEJIT_FORMAT_Q8_0, 16, 2880, 3)}) {
    LinearData d = make_linear(p);
    CtxPtr ctx = tile_ctx(1, true);
    LinearPtr used = make_linear_obj(ctx.get(), d.desc(), p.name),
              fresh = make_linear_obj(ctx.get(), d.desc(), p.name);
    ASSERT_TRUE(used && fresh);
    LinearData inf = d;
    for (uint16_t& v : inf.x) v = 0x7F80;  // bf16 +inf
    linear_call(used.get(), inf, 3);
    for (int T : {1, 2})
      EXPECT_EQ(linear_call(used.get(), d, T), linear_call(fresh.get(), d, T))
          << p.name << " num_tokens " << T;
  }
}

}  // namespace
