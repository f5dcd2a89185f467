// The activations' exp (runtime/activation.h) and the AVX-512 silu loop of
// activate_bf16_n against the scalar code.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "rng.h"
#include "runtime/activation.h"

namespace {

using moejit::ActivationParams;
namespace fm = moejit::formats;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(ExpAct, WithinOneUlpOfDouble) {
  double worst = 0.0;
  float worst_x = 0.0f;
  for (float x = -86.0f; x < 88.72f; x = std::nextafter(x + std::max(std::fabs(x), 1e-3f) * 3e-6f, 100.0f)) {
    const double want = std::exp(double(x));
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    const double err = std::fabs(double(moejit::exp_act(x)) - want) / ulp;
    if (err > worst) {
      worst = err;
      worst_x = x;
    }
  }
  EXPECT_LT(worst, 1.0) << "at x = " << worst_x;
  EXPECT_EQ(moejit::exp_act(0.0f), 1.0f);
  EXPECT_EQ(moejit::exp_act(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(moejit::exp_act(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_GT(moejit::exp_act(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_LT(moejit::exp_act(-std::numeric_limits<float>::infinity()), 1e-37f);
  EXPECT_TRUE(std::isnan(moejit::exp_act(std::numeric_limits<float>::quiet_NaN())));
}

// Every bf16 gate value (and 10^6 random fp32 ones) with several up values, in
// calls of every length 1..40 (the masked tail): for silu and both swiglu
// kinds (with and without a limit), the AVX-512 path gives the scalar path's
// bits (any NaN for a NaN), before and after rounding to bf16.
TEST(ActivateBf16N, Avx512SameBitsAsScalar) {
  if (!moejit::jit::isa_available(moejit::jit::Isa::avx512)) GTEST_SKIP() << "this CPU lacks avx512";
  std::vector<float> gate, up;
  moejit_test::Rng rng(5);
  const float ups[] = {1.0f, -0.75f, 3.5e-3f, 1e30f, -0.0f, 9.0f, -8.0f};
  for (uint32_t b = 0; b < 0x10000u; ++b)
    for (float u : ups) {
      gate.push_back(fm::bf16_to_f32(uint16_t(b)));
      up.push_back(u);
    }
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t u = uint32_t(rng());
    float g;
    std::memcpy(&g, &u, 4);
    gate.push_back(g);
    up.push_back(float(int(rng() % 2001) - 1000) / 64.0f);
  }
  struct Case {
    moejit_activation kind;
    float limit;
  };
  for (const Case c : {Case{MOEJIT_ACT_SILU, 0.0f}, Case{MOEJIT_ACT_SWIGLU_OAI, 7.0f},
                       Case{MOEJIT_ACT_SWIGLU_OAI, 0.0f}, Case{MOEJIT_ACT_SWIGLU_CLAMP, 7.0f}}) {
    ActivationParams p;
    p.kind = c.kind;
    p.limit = c.limit;
    for (bool rounded : {false, true}) {
      std::vector<float> want(gate.size()), got(gate.size());
      if (rounded)
        moejit::activate_bf16_n(p, gate.data(), up.data(), want.data(), int64_t(gate.size()));
      else
        moejit::activate_f32_n(p, gate.data(), up.data(), want.data(), int64_t(gate.size()),
                               moejit::jit::Isa::scalar);
      size_t i = 0;
      for (int64_t len = 1; i < gate.size(); len = len % 40 + 1) {
        const int64_t n = std::min<int64_t>(len, int64_t(gate.size() - i));
        if (rounded)
          moejit::activate_bf16_n(p, gate.data() + i, up.data() + i, got.data() + i, n,
                                  moejit::jit::Isa::avx512);
        else
          moejit::activate_f32_n(p, gate.data() + i, up.data() + i, got.data() + i, n,
                                 moejit::jit::Isa::avx512);
        i += size_t(n);
      }
      size_t bad = 0;
      for (size_t k = 0; k < gate.size(); ++k) {
        const bool same = std::isnan(want[k]) ? std::isnan(got[k]) : bits(want[k]) == bits(got[k]);
        if (!same && ++bad <= 3)
          ADD_FAILURE() << "kind " << int(c.kind) << " limit " << c.limit << (rounded ? " bf16" : " fp32")
                        << ": gate " << gate[k] << " up " << up[k] << ": scalar " << want[k] << ", avx512 "
                        << got[k];
      }
      EXPECT_EQ(bad, 0u) << "kind " << int(c.kind) << " limit " << c.limit << (rounded ? ", bf16" : ", fp32");
    }
  }
}

// ds_fp4's pass 1: gate and up rounded to bf16 before the activation, by the
// AVX-512 loop and by the scalar one, against the formula written out.
TEST(ActivateBf16InN, BothPathsRoundTheInputs) {
  std::vector<float> gate, up;
  moejit_test::Rng rng(9);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (int i = 0; i < 300000; ++i) {
    gate.push_back(nd(rng));  // fp32 values: rounding them to bf16 first matters
    up.push_back(nd(rng));
  }
  for (const float g : {NAN, INFINITY, -INFINITY, 3.3895314e38f, -0.0f}) {
    gate.push_back(g);
    up.push_back(1.25f);
  }
  std::vector<moejit::jit::Isa> tiers = {moejit::jit::Isa::scalar};
  if (moejit::jit::isa_available(moejit::jit::Isa::avx512)) tiers.push_back(moejit::jit::Isa::avx512);
  for (const moejit_activation kind : {MOEJIT_ACT_SILU, MOEJIT_ACT_SWIGLU_OAI, MOEJIT_ACT_GELU}) {
    ActivationParams p;
    p.kind = kind;
    p.limit = kind == MOEJIT_ACT_SWIGLU_OAI ? 7.0f : 0.0f;
    for (const moejit::jit::Isa isa : tiers) {
      std::vector<float> got(gate.size());
      size_t i = 0;
      for (int64_t len = 1; i < gate.size(); len = len % 40 + 1) {
        const int64_t n = std::min<int64_t>(len, int64_t(gate.size() - i));
        moejit::activate_bf16_in_n(p, gate.data() + i, up.data() + i, got.data() + i, n, isa);
        i += size_t(n);
      }
      size_t bad = 0;
      for (size_t k = 0; k < gate.size(); ++k) {
        const float want =
            fm::round_bf16(moejit::activate(p, fm::round_bf16(gate[k]), fm::round_bf16(up[k])));
        const bool same = std::isnan(want) ? std::isnan(got[k]) : bits(want) == bits(got[k]);
        if (!same && ++bad <= 3)
          ADD_FAILURE() << "kind " << int(kind) << " tier " << moejit::jit::isa_name(isa) << ": gate "
                        << gate[k] << " up " << up[k] << ": want " << want << ", got " << got[k];
      }
      EXPECT_EQ(bad, 0u) << "kind " << int(kind) << " tier " << moejit::jit::isa_name(isa);
    }
  }
  if (tiers.size() == 1) GTEST_SKIP() << "this CPU lacks avx512: only the scalar path was checked";
}

}  // namespace
