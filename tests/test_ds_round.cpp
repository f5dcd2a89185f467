// ds_fp4's e4m3 round trip of activations: the AVX-512 loop of
// ds_act_roundtrip_n against formats::ds_act_roundtrip, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "mxcsr.h"
#include "rng.h"
#include "runtime/ds_round.h"

namespace {

namespace fm = moejit::formats;
using moejit::jit::Isa;

// The scalar round trip of `src` against the AVX-512 one, in place and not;
// the number of differing values.
size_t differences(const std::vector<uint16_t>& src, const char* what) {
  std::vector<uint16_t> want(src.size()), got(src.size());
  fm::ds_act_roundtrip(src.data(), int64_t(src.size()), want.data());
  moejit::ds_act_roundtrip_n(src.data(), int64_t(src.size()), got.data(), Isa::avx512);
  std::vector<uint16_t> inplace = src;
  moejit::ds_act_roundtrip_n(inplace.data(), int64_t(inplace.size()), inplace.data(), Isa::avx512);
  size_t bad = 0;
  for (size_t i = 0; i < src.size(); ++i)
    if ((got[i] != want[i] || inplace[i] != want[i]) && ++bad <= 4)
      ADD_FAILURE() << what << std::hex << ": element " << std::dec << i << " of " << src.size() << std::hex
                    << ", input 0x" << src[i] << ": want 0x" << want[i] << ", got 0x" << got[i]
                    << " (in place 0x" << inplace[i] << ")";
  return bad;
}

// Blocks that meet every e4m3 range: each holds one large value (its amax,
// which sets the scale) and 127 values of a sweep of every bf16 pattern
// scaled by 2^k, so that x / s lands in the subnormal, normal and
// saturating ranges, and on the rounding ties of each.
std::vector<uint16_t> sweep_blocks(uint16_t amax_bits, int k) {
  std::vector<uint16_t> v;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    if (v.size() % fm::kDsActBlock == 0) v.push_back(amax_bits);
    const float f = std::ldexp(fm::bf16_to_f32(uint16_t(b)), k);
    const uint16_t x = fm::f32_to_bf16(f);
    if ((x & 0x7FFFu) >= 0x7F80u || (x & 0x7FFFu) > (amax_bits & 0x7FFFu)) continue;  // keep amax the max
    v.push_back(x);
  }
  return v;
}

bool has_avx512() { return moejit::jit::isa_available(Isa::avx512); }

TEST(DsActRoundTripN, Avx512SameBitsAsScalar) {
  if (!has_avx512()) GTEST_SKIP() << "this CPU lacks AVX-512: the scalar code runs";
  size_t bad = 0;
  // amax from tiny (below 1e-4: the smallest scale) to near bf16's top.
  for (uint16_t amax : {uint16_t(0x3800), uint16_t(0x3F80), uint16_t(0x43E0), uint16_t(0x43E1),
                        uint16_t(0x4700), uint16_t(0x5F00), uint16_t(0x7F7F), uint16_t(0xC2F0)})
    for (int k : {-40, -20, -12, -8, -4, 0, 4, 12}) bad += differences(sweep_blocks(amax, k), "sweep");
  // Every bf16 pattern in natural order (blocks with NaN or inf become NaN).
  std::vector<uint16_t> all(0x10000);
  for (uint32_t b = 0; b < 0x10000u; ++b) all[b] = uint16_t(b);
  bad += differences(all, "all patterns");
  // A block with an infinity and no NaN becomes NaN as well.
  for (uint16_t inf : {uint16_t(0x7F80), uint16_t(0xFF80)}) {
    std::vector<uint16_t> v(200, fm::f32_to_bf16(1.5f));
    v[130] = inf;
    bad += differences(v, "infinity");
  }
  // Random lengths: the masked tails of the 32- and 16-lane loops, short last blocks.
  moejit_test::Rng rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t n = 1; n <= 300; ++n) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    const float scale = std::ldexp(1.0f, int(rng() % 60) - 30);
    for (auto& x : v) x = fm::f32_to_bf16(nd(rng) * scale);
    bad += differences(v, "random");
  }
  EXPECT_EQ(bad, 0u);
}

#if defined(__x86_64__) || defined(_M_X64)
// Neither path depends on MXCSR: the AVX-512 loop under flush-to-zero,
// denormals-are-zero and each rounding mode gives the bits of the scalar code
// under the default MXCSR.
TEST(DsActRoundTripN, SameBitsUnderAnyMxcsr) {
  if (!has_avx512()) GTEST_SKIP() << "this CPU lacks AVX-512: the scalar code runs";
  std::vector<uint16_t> src;
  for (uint16_t amax : {uint16_t(0x3800), uint16_t(0x43E0), uint16_t(0x5F00)})
    for (int k : {-20, -8, 0}) {
      const auto v = sweep_blocks(amax, k);
      src.insert(src.end(), v.begin(), v.end());
      while (src.size() % fm::kDsActBlock) src.push_back(0);  // keep the blocks aligned to their amax
    }
  std::vector<uint16_t> want(src.size()), got(src.size());
  fm::ds_act_roundtrip(src.data(), int64_t(src.size()), want.data());
  // Integer comparisons only under the odd MXCSR; under_each_mxcsr restores it.
  moejit_test::under_each_mxcsr([&](unsigned rc) {
    moejit::ds_act_roundtrip_n(src.data(), int64_t(src.size()), got.data(), Isa::avx512);
    size_t bad = 0;
    for (size_t i = 0; i < src.size(); ++i)
      if (got[i] != want[i] && ++bad <= 4)
        ADD_FAILURE() << std::hex << "mxcsr rc 0x" << rc << ": input 0x" << src[i] << " want 0x" << want[i]
                      << " got 0x" << got[i];
    EXPECT_EQ(bad, 0u) << "rounding control " << std::hex << rc;
  });
}
#endif

// Without AVX-512 the scalar code runs: the same bits by construction, and the
// call must still be correct for a tier that lacks it.
TEST(DsActRoundTripN, ScalarTierIsTheReference) {
  std::vector<uint16_t> src(1000);
  moejit_test::Rng rng(3);
  for (auto& x : src) x = uint16_t(rng());
  std::vector<uint16_t> want(src.size()), got(src.size());
  fm::ds_act_roundtrip(src.data(), int64_t(src.size()), want.data());
  moejit::ds_act_roundtrip_n(src.data(), int64_t(src.size()), got.data(), Isa::scalar);
  EXPECT_EQ(got, want);
}

}  // namespace
