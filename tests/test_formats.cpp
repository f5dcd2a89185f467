// formats/ element decoders against independent computations (formats.md
// "Element encodings"). Every check here is written differently from
// formats.cpp: by the value formula in double, by the fp16/bf16 widening facts
// the kernels rely on, and, for fp16, by the F16C instruction itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "mxcsr.h"
#include "rng.h"

namespace fm = moejit::formats;

namespace {

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Value of an e4m3 (fn) code from its fields, in double.
double e4m3_formula(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? (m / 8.0) * std::pow(2.0, 1 - 7) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}

// IEEE half from its fields, in double (NaN returned as NaN, sign ignored).
double fp16_formula(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double mag;
  if (e == 31) {
    if (m) return std::nan("");
    mag = INFINITY;
  } else if (e == 0) {
    mag = m / 1024.0 * std::pow(2.0, -14);
  } else {
    mag = (1.0 + m / 1024.0) * std::pow(2.0, e - 15);
  }
  return s ? -mag : mag;
}

// Bit-exact equality for non-NaN values (distinguishes +0 / -0).
void expect_same_value(double want, float got, const char* what, unsigned code) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << " code 0x" << std::hex << code << " got " << got;
    return;
  }
  EXPECT_EQ(double(got), want) << what << " code 0x" << std::hex << code;
  EXPECT_EQ(std::signbit(got), std::signbit(want)) << what << " code 0x" << std::hex << code << " sign";
}

// Round-to-nearest-even of a finite float to bf16, by comparing distances in
// double to the two bf16 neighbours (not by the integer add trick).
uint16_t bf16_rne_by_distance(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t lo = uint16_t(u >> 16);  // truncation: toward zero
  const uint16_t hi = uint16_t(lo + 1);   // next magnitude up
  const double v = std::fabs(double(f));
  const double vlo = std::fabs(double(bits_f32(uint32_t(lo) << 16)));
  double vhi;
  if ((hi & 0x7FFF) == 0x7F80) {
    vhi = std::ldexp(1.0, 128);  // what the next code would be with an unbounded exponent
  } else {
    vhi = std::fabs(double(bits_f32(uint32_t(hi) << 16)));
  }
  const double dlo = v - vlo, dhi = vhi - v;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

}  // namespace

// ---------------------------------------------------------------- e4m3

TEST(E4m3, AllCodesMatchFieldFormula) {
  for (unsigned c = 0; c < 256; ++c)
    expect_same_value(e4m3_formula(uint8_t(c)), fm::e4m3_to_f32(uint8_t(c)), "e4m3", c);
}

TEST(E4m3, AllCodesMatchFp16WideningFact) {
  // formats.md: h = (b & 0x80) << 8 | (b & 0x7F) << 7 is the fp16 of e4m3(b) * 2^-8.
  for (unsigned b = 0; b < 256; ++b) {
    const uint16_t h = uint16_t((b & 0x80) << 8 | (b & 0x7F) << 7);
    const double want = fp16_formula(h) * 256.0;
    expect_same_value(want, fm::e4m3_to_f32(uint8_t(b)), "e4m3 via fp16", b);
  }
}

TEST(E4m3, NormalCodesMatchBf16WideningFact) {
  // formats.md: for exponent != 0 the bf16 bits are (b & 0x80) << 8 | ((b & 0x7F) << 4) + (120 << 7).
  int normals = 0;
  for (unsigned b = 0; b < 256; ++b) {
    if (((b >> 3) & 15) == 0) continue;
    const uint16_t bits = uint16_t(((b & 0x80) << 8) | (((b & 0x7F) << 4) + (120 << 7)));
    const float want = bits_f32(uint32_t(bits) << 16);
    EXPECT_EQ(f32_bits(fm::e4m3_to_f32(uint8_t(b))), f32_bits(want)) << "code 0x" << std::hex << b;
    ++normals;
  }
  EXPECT_EQ(normals, 240);
}

TEST(E4m3, SpotValues) {
  EXPECT_EQ(fm::e4m3_to_f32(0x7F), 480.0f);
  EXPECT_EQ(fm::e4m3_to_f32(0xFF), -480.0f);
  EXPECT_EQ(fm::e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(fm::e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(fm::e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(fm::e4m3_to_f32(0x07), 7.0f * std::ldexp(1.0f, -9));
  EXPECT_EQ(fm::e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fm::e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fm::e4m3_to_f32(0x40), 2.0f);
  EXPECT_EQ(fm::e4m3_to_f32(0xB8), -1.0f);
  EXPECT_EQ(f32_bits(fm::e4m3_to_f32(0x00)), 0x00000000u);
  EXPECT_EQ(f32_bits(fm::e4m3_to_f32(0x80)), 0x80000000u);  // -0.0
  for (unsigned c = 0; c < 256; ++c) {
    const float v = fm::e4m3_to_f32(uint8_t(c));
    EXPECT_TRUE(std::isfinite(v)) << "no e4m3 code is inf or NaN: 0x" << std::hex << c;
  }
}

// ---------------------------------------------------------------- e4m3 encoder

namespace {

// Nearest e4m3 (fn) code to |v| by search over the 127 finite non-negative codes
// (0x00..0x7E); ties go to the even code (mantissa bit 0 clear). Beyond 448: 0x7E.
uint8_t e4m3_nearest_by_search(double v) {
  const double a = std::fabs(v);
  uint8_t best = 0;
  for (unsigned c = 1; c <= 0x7E; ++c) {
    const double d = std::fabs(e4m3_formula(uint8_t(c)) - a), db = std::fabs(e4m3_formula(best) - a);
    if (d < db || (d == db && (c & 1) == 0)) best = uint8_t(c);
  }
  return uint8_t(best | (std::signbit(v) ? 0x80 : 0));
}

}  // namespace

TEST(E4m3Encode, EveryFiniteCodeRoundTrips) {
  for (unsigned c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // +-480: outside e4m3fn's finite range, saturates
    EXPECT_EQ(fm::f32_to_e4m3_rne(fm::e4m3_to_f32(uint8_t(c))), c) << "code 0x" << std::hex << c;
  }
  EXPECT_EQ(fm::f32_to_e4m3_rne(480.0f), 0x7E);
  EXPECT_EQ(fm::f32_to_e4m3_rne(-480.0f), 0xFE);
}

TEST(E4m3Encode, EveryBf16MatchesNearestEvenSearch) {
  for (uint32_t v = 0; v < 65536; ++v) {
    const float f = fm::bf16_to_f32(uint16_t(v));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fm::f32_to_e4m3_rne(f), e4m3_nearest_by_search(f)) << "bf16 0x" << std::hex << v << " = " << f;
  }
}

TEST(E4m3Encode, MidpointsTieToEvenAndNeighboursDoNot) {
  // Every midpoint between consecutive non-negative codes, exactly and one fp32 ulp either side.
  int ties = 0;
  for (unsigned c = 0; c < 0x7E; ++c) {
    const double lo = e4m3_formula(uint8_t(c)), hi = e4m3_formula(uint8_t(c + 1));
    const float mid = float((lo + hi) / 2);  // exact: <= 5 significant bits
    ASSERT_EQ(double(mid), (lo + hi) / 2);
    const uint8_t even = (c & 1) ? uint8_t(c + 1) : uint8_t(c);
    for (float sgn : {1.0f, -1.0f}) {
      const uint8_t s = sgn < 0 ? 0x80 : 0;
      EXPECT_EQ(fm::f32_to_e4m3_rne(sgn * mid), even | s) << "midpoint " << sgn * mid;
      EXPECT_EQ(fm::f32_to_e4m3_rne(sgn * std::nextafter(mid, 0.0f)), c | s) << "below " << mid;
      EXPECT_EQ(fm::f32_to_e4m3_rne(sgn * std::nextafter(mid, INFINITY)), (c + 1) | s) << "above " << mid;
    }
    ++ties;
  }
  EXPECT_EQ(ties, 126);
  EXPECT_EQ(fm::f32_to_e4m3_rne(std::ldexp(1.0f, -10)), 0x00);      // half the smallest subnormal
  EXPECT_EQ(fm::f32_to_e4m3_rne(3 * std::ldexp(1.0f, -10)), 0x02);  // 1.5 * 2^-9 -> 2 * 2^-9
  EXPECT_EQ(fm::f32_to_e4m3_rne(8.5f), 0x50);                       // 8 (even), not 9
  EXPECT_EQ(fm::f32_to_e4m3_rne(9.5f), 0x52);                       // 10 (even), not 9
}

TEST(E4m3Encode, RandomFp32MatchesSearch) {
  moejit_test::Rng rng(3);
  for (int i = 0; i < 200000; ++i) {
    // Magnitudes 2^-30..2^10 (below, across and above e4m3's range), any mantissa.
    const float f = bits_f32((rng() & 0x80000000u) | uint32_t(97 + rng() % 40) << 23 | (rng() & 0x7FFFFFu));
    ASSERT_EQ(fm::f32_to_e4m3_rne(f), e4m3_nearest_by_search(f)) << f;
  }
  for (uint32_t u = 1; u < 4096; ++u) {  // fp32 subnormals
    ASSERT_EQ(fm::f32_to_e4m3_rne(bits_f32(u)), 0x00);
    ASSERT_EQ(fm::f32_to_e4m3_rne(bits_f32(u | 0x80000000u)), 0x80);
  }
}

TEST(E4m3Encode, SaturationZerosAndNaN) {
  EXPECT_EQ(fm::f32_to_e4m3_rne(448.0f), 0x7E);
  EXPECT_EQ(fm::f32_to_e4m3_rne(463.99f), 0x7E);
  EXPECT_EQ(fm::f32_to_e4m3_rne(464.0f), 0x7E);  // saturates (RNE would reach 480, not finite in e4m3fn)
  EXPECT_EQ(fm::f32_to_e4m3_rne(1e30f), 0x7E);
  EXPECT_EQ(fm::f32_to_e4m3_rne(-1e30f), 0xFE);
  EXPECT_EQ(fm::f32_to_e4m3_rne(INFINITY), 0x7E);
  EXPECT_EQ(fm::f32_to_e4m3_rne(-INFINITY), 0xFE);
  EXPECT_EQ(fm::f32_to_e4m3_rne(0.0f), 0x00);
  EXPECT_EQ(fm::f32_to_e4m3_rne(-0.0f), 0x80);
  EXPECT_EQ(fm::f32_to_e4m3_rne(std::nanf("")), 0x7F);
  EXPECT_EQ(fm::f32_to_e4m3_rne(-std::nanf("")), 0xFF);
}

// ---------------------------------------------------------------- ds_fp4 activation round trip

namespace {

// formats.md "ds_fp4 extra numerics", evaluated literally in double:
// s = 2^ceil(log2(max(amax, 1e-4) / 448)), x' = bf16(e4m3_rne(clamp(x / s, +-448)) * s),
// with the e4m3 rounding done by frexp/nearbyint (not by the encoder under test).
double e4m3_rne_double(double v) {
  if (v == 0) return v;
  int e;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e)
  const double q = std::ldexp(1.0, std::max(e - 4, -9));
  return std::nearbyint(v / q) * q;
}

double bf16_rne_double(double v) {
  if (v == 0 || !std::isfinite(v)) return v;
  int e;
  std::frexp(v, &e);
  const double q = std::ldexp(1.0, std::max(e - 8, -133));
  const double r = std::nearbyint(v / q) * q;
  return std::fabs(r) >= std::ldexp(1.0, 128) ? std::copysign(INFINITY, v) : r;
}

std::vector<uint16_t> roundtrip_by_formula(const std::vector<uint16_t>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t b0 = 0; b0 < x.size(); b0 += 128) {
    const size_t b1 = std::min(x.size(), b0 + 128);
    double amax = 0;
    for (size_t i = b0; i < b1; ++i) amax = std::fmax(amax, std::fabs(double(fm::bf16_to_f32(x[i]))));
    bool poisoned = false;
    for (size_t i = b0; i < b1; ++i) poisoned |= !std::isfinite(fm::bf16_to_f32(x[i]));
    const double s = std::exp2(std::ceil(std::log2(std::max(amax, 1e-4) / 448.0)));
    for (size_t i = b0; i < b1; ++i) {
      if (poisoned) {
        out[i] = 0x7FC0;
        continue;
      }
      const double q = std::min(448.0, std::max(-448.0, double(fm::bf16_to_f32(x[i])) / s));
      out[i] = fm::f32_to_bf16(float(bf16_rne_double(e4m3_rne_double(q) * s)));
    }
  }
  return out;
}

uint16_t bf(double v) { return fm::f32_to_bf16(float(v)); }

void expect_roundtrip(const std::vector<uint16_t>& x, const char* what) {
  std::vector<uint16_t> got(x.size(), 0xDEAD);
  fm::ds_act_roundtrip(x.data(), int64_t(x.size()), got.data());
  const std::vector<uint16_t> want = roundtrip_by_formula(x);
  int bad = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (got[i] != want[i] && bad++ < 8)
      ADD_FAILURE() << what << ": element " << i << " x = " << fm::bf16_to_f32(x[i]) << " got "
                    << fm::bf16_to_f32(got[i]) << " (0x" << std::hex << got[i] << ") want "
                    << fm::bf16_to_f32(want[i]) << " (0x" << want[i] << ")";
  EXPECT_EQ(bad, 0) << what;
  // In place gives the same bits.
  std::vector<uint16_t> inplace = x;
  fm::ds_act_roundtrip(inplace.data(), int64_t(inplace.size()), inplace.data());
  EXPECT_EQ(inplace, got) << what << " in place";
}

}  // namespace

// e4m3_round is the value of the e4m3 code f32_to_e4m3_rne picks, computed
// without the code: same bits for every bf16 pattern at several power-of-two
// scales (every value ds_act_roundtrip feeds it), random fp32 patterns, and the
// double-precision reference where it does not saturate. (All 2^32 fp32
// patterns but NaN were compared once when it was written: identical.)
TEST(E4m3Round, SameValueAsEncodeThenDecode) {
  auto check = [](float f) {
    if (std::isnan(f)) return true;
    const float want = fm::e4m3_to_f32(fm::f32_to_e4m3_rne(f));
    const float got = fm::e4m3_round(f);
    uint32_t uw, ug;
    std::memcpy(&uw, &want, 4);
    std::memcpy(&ug, &got, 4);
    EXPECT_EQ(ug, uw) << "f = " << f;
    if (std::fabs(f) < 448.0f) {
      EXPECT_EQ(double(got), e4m3_rne_double(double(f))) << "f = " << f;
    }
    return ug == uw;
  };
  int bad = 0;
  for (int k : {-24, -12, -9, -6, 0, 3, 8, 20})
    for (uint32_t b = 0; b < 0x10000u && bad < 8; ++b)
      bad += !check(std::ldexp(fm::bf16_to_f32(uint16_t(b)), k));
  moejit_test::Rng rng(11);
  for (int i = 0; i < 1000000 && bad < 8; ++i) {
    const uint32_t u = uint32_t(rng());
    float f;
    std::memcpy(&f, &u, 4);
    bad += !check(f);
  }
  EXPECT_EQ(bad, 0);
  // Spot values: ties to even in both ranges, saturation, signed zero.
  EXPECT_EQ(fm::e4m3_round(0x1.1p0f), 1.0f);      // 1 + 1/16: tie between 1 and 1.125
  EXPECT_EQ(fm::e4m3_round(0x1.3p0f), 1.25f);     // 1 + 3/16: tie, 1.25 is even
  EXPECT_EQ(fm::e4m3_round(0x1.8p-9f), 0x1p-8f);  // 1.5 * 2^-9: tie between codes 1 and 2
  EXPECT_EQ(fm::e4m3_round(0x1p-10f), 0.0f);      // half of the smallest subnormal
  EXPECT_EQ(fm::e4m3_round(1000.0f), 448.0f);
  EXPECT_EQ(fm::e4m3_round(-INFINITY), -448.0f);
  EXPECT_TRUE(std::signbit(fm::e4m3_round(-1e-30f)));
}

#if defined(__x86_64__) || defined(_M_X64)
// Engines may run with flush-to-zero, denormals-are-zero or another rounding
// mode: e4m3_round (and so the ds_fp4 round trip) gives the same bits.
TEST(E4m3Round, SameBitsUnderAnyMxcsr) {
  std::vector<uint32_t> in;
  for (int k : {-140, -130, -24, -12, -9, -6, 0, 8})
    for (uint32_t b = 0; b < 0x10000u; ++b) {
      const float f = std::ldexp(fm::bf16_to_f32(uint16_t(b)), k);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      in.push_back(u);
    }
  for (uint32_t u = 0; u < 0x00800000u; u += 0x101u) in.push_back(u | 0x80000000u * (u & 1u));  // subnormals
  auto run = [&] {
    std::vector<uint32_t> out(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      float f, r;
      std::memcpy(&f, &in[i], 4);
      r = fm::e4m3_round(f);
      std::memcpy(&out[i], &r, 4);
    }
    return out;
  };
  const std::vector<uint32_t> want = run();
  // Integer comparisons only under the odd MXCSR; under_each_mxcsr restores it.
  moejit_test::under_each_mxcsr([&](unsigned rc) {
    const std::vector<uint32_t> got = run();
    size_t bad = 0;
    for (size_t i = 0; i < in.size(); ++i)
      if (got[i] != want[i] && ++bad <= 4)
        ADD_FAILURE() << std::hex << "mxcsr rc " << rc << ": input " << in[i];
    EXPECT_EQ(bad, 0u) << "rounding control " << std::hex << rc;
  });
}
#endif

TEST(DsActRoundTrip, ScaleIsCeilPowerOfTwo) {
  EXPECT_EQ(fm::ds_act_scale(448.0f), 1.0f);
  EXPECT_EQ(fm::ds_act_scale(448.0f * 1.0078125f), 2.0f);
  EXPECT_EQ(fm::ds_act_scale(447.0f), 1.0f);
  EXPECT_EQ(fm::ds_act_scale(224.0f), 0.5f);
  EXPECT_EQ(fm::ds_act_scale(225.0f), 1.0f);
  EXPECT_EQ(fm::ds_act_scale(0.0f), std::ldexp(1.0f, -22));     // max(0, 1e-4) = 1e-4
  EXPECT_EQ(fm::ds_act_scale(1e-30f), std::ldexp(1.0f, -22));   // tiny amax uses 1e-4 too
  EXPECT_EQ(fm::ds_act_scale(1.1e-4f), std::ldexp(1.0f, -21));  // above 448 * 2^-22 = 1.068e-4
  EXPECT_EQ(fm::ds_act_scale(3.3895314e38f), std::ldexp(1.0f, 120));
  for (uint32_t v = 0; v < 0x7F80; ++v) {  // every finite non-negative bf16 against the formula
    const double a = fm::bf16_to_f32(uint16_t(v));
    const double want = std::exp2(std::ceil(std::log2(std::max(a, 1e-4) / 448.0)));
    ASSERT_EQ(double(fm::ds_act_scale(float(a))), want) << a;
  }
}

TEST(DsActRoundTrip, ZeroBlockUsesTheFloor) {
  std::vector<uint16_t> x(128, 0);
  x[5] = 0x8000;  // -0 stays -0
  expect_roundtrip(x, "all zero");
  std::vector<uint16_t> got(x.size());
  fm::ds_act_roundtrip(x.data(), 128, got.data());
  EXPECT_EQ(got[0], 0x0000);
  EXPECT_EQ(got[5], 0x8000);
  // amax below 1e-4: s = 2^-22, so 5e-5 -> e4m3(209.7...) = 208 -> 208 * 2^-22.
  std::vector<uint16_t> t(40, 0);
  t[0] = bf(5e-5);
  t[1] = bf(-1e-6);                 // 1e-6 * 2^22 = 4.19 -> 4
  t[2] = bf(std::ldexp(1.0, -33));  // 2^-11 below the smallest subnormal: rounds to 0
  fm::ds_act_roundtrip(t.data(), int64_t(t.size()), got.data());
  EXPECT_EQ(double(fm::bf16_to_f32(got[0])), std::ldexp(208.0, -22));
  EXPECT_EQ(double(fm::bf16_to_f32(got[1])), -std::ldexp(4.0, -22));
  EXPECT_EQ(got[2], 0x0000);
  expect_roundtrip(t, "amax below 1e-4");
}

TEST(DsActRoundTrip, BlockMaxLandsOn448) {
  // amax = 448 * 2^n exactly: the largest element maps to +-448 * s (the clamp's edge).
  for (int n : {-20, -3, 0, 5, 100}) {
    std::vector<uint16_t> x(128);
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf(std::ldexp((int(i) % 17 - 8) * 3.0, n));
    x[7] = bf(std::ldexp(448.0, n));
    x[9] = bf(std::ldexp(-448.0, n));
    std::vector<uint16_t> got(x.size());
    fm::ds_act_roundtrip(x.data(), 128, got.data());
    EXPECT_EQ(got[7], x[7]) << n;
    EXPECT_EQ(got[9], x[9]) << n;
    expect_roundtrip(x, "amax 448 * 2^n");
  }
  // amax 447 (s = 1) rounds up to 448; 440 * 2 = 880 (s = 2) is 440 -> 448 -> 896.
  std::vector<uint16_t> x = {bf(447.0), bf(-3.0), bf(880.0)};
  std::vector<uint16_t> got(3);
  fm::ds_act_roundtrip(x.data(), 2, got.data());
  EXPECT_EQ(double(fm::bf16_to_f32(got[0])), 448.0);
  EXPECT_EQ(double(fm::bf16_to_f32(got[1])), -3.0);
  fm::ds_act_roundtrip(x.data() + 2, 1, got.data() + 2);
  EXPECT_EQ(double(fm::bf16_to_f32(got[2])), 896.0);
  // The largest bf16 values overflow to inf, as their exact round trip (2^128) does in bf16.
  std::vector<uint16_t> big = {0x7F7F, 0x3F80};
  fm::ds_act_roundtrip(big.data(), 2, got.data());
  EXPECT_EQ(got[0], 0x7F80);
  expect_roundtrip(big, "bf16 max");
}

TEST(DsActRoundTrip, TiesToEven) {
  // s = 1 (amax 448): x at midpoints between e4m3 values goes to the even code.
  std::vector<uint16_t> x = {bf(448.0),
                             bf(8.5),
                             bf(9.5),
                             bf(17.0),
                             bf(19.0),
                             bf(-8.5),
                             bf(240.0),
                             bf(248.0),
                             bf(0.0009765625 /* 2^-10 */),
                             bf(3 * 0.0009765625)};
  std::vector<uint16_t> got(x.size());
  fm::ds_act_roundtrip(x.data(), int64_t(x.size()), got.data());
  const double want[] = {448, 8, 10, 16, 20, -8, 240, 256, 0, 2 * 0.001953125};
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(double(fm::bf16_to_f32(got[i])), want[i]) << "x = " << fm::bf16_to_f32(x[i]);
  expect_roundtrip(x, "ties");
}

TEST(DsActRoundTrip, NaNAndInfPoisonOnlyTheirBlock) {
  std::vector<uint16_t> x(3 * 128 + 20);
  moejit_test::Rng rng(5);
  for (auto& v : x) v = uint16_t((rng() & 0x8000) | (0x3A00 + rng() % 0x800));
  x[130] = 0x7FC1;  // NaN in block 1
  x[300] = 0xFF80;  // -inf in block 2
  x[390] = 0xFFC0;  // negative NaN in the tail block
  std::vector<uint16_t> got(x.size());
  fm::ds_act_roundtrip(x.data(), int64_t(x.size()), got.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const bool poisoned = i >= 128;
    EXPECT_EQ(std::isnan(fm::bf16_to_f32(got[i])), poisoned) << i;
  }
  expect_roundtrip(x, "NaN and inf");
}

TEST(DsActRoundTrip, BlocksOf128WithShortTail) {
  moejit_test::Rng rng(11);
  for (int n : {1, 31, 127, 128, 129, 200, 256, 2880, 7168 + 64}) {
    std::vector<uint16_t> x(static_cast<size_t>(n));
    for (size_t i = 0; i < x.size(); ++i) {
      // A different magnitude per block (2^-20 .. 2^20) and wide spread inside it.
      const int blk = int(i / 128);
      const int e = 127 + ((blk * 7) % 41) - 20 - int(rng() % 12);
      x[i] = uint16_t((rng() & 0x8000) | (e << 7) | (rng() & 0x7F));
      if (rng() % 50 == 0) x[i] = 0;
    }
    expect_roundtrip(x, ("n = " + std::to_string(n)).c_str());
    // The tail block uses its own amax: scaling the tail alone changes nothing before it.
    if (n > 128 && n % 128) {
      std::vector<uint16_t> a(x.size()), y = x;
      const size_t tail = size_t(n) / 128 * 128;
      for (size_t i = tail; i < y.size(); ++i) y[i] = bf(fm::bf16_to_f32(y[i]) * 1024.0);
      std::vector<uint16_t> b(y.size());
      fm::ds_act_roundtrip(x.data(), n, a.data());
      fm::ds_act_roundtrip(y.data(), n, b.data());
      EXPECT_TRUE(std::equal(a.begin(), a.begin() + long(tail), b.begin())) << n;
    }
  }
}

TEST(DsActRoundTrip, EveryBf16AgainstTheFormula) {
  // Each bf16 value as an element of a block whose max is 448 (s = 1), 1.0 and 3e-3.
  for (double top : {448.0, 1.0, 3e-3}) {
    std::vector<uint16_t> x;
    for (uint32_t v = 0; v < 65536; ++v) {
      const float f = fm::bf16_to_f32(uint16_t(v));
      if (!std::isfinite(f) || std::fabs(f) > top) continue;
      if (x.size() % 128 == 0) x.push_back(bf(top));
      x.push_back(uint16_t(v));
    }
    expect_roundtrip(x, "every bf16");
  }
}

// ---------------------------------------------------------------- bf16

TEST(Bf16, DecodeIsUpperHalf) {
  for (uint32_t v = 0; v < 65536; ++v) EXPECT_EQ(f32_bits(fm::bf16_to_f32(uint16_t(v))), v << 16);
}

TEST(Bf16, RoundTripEveryCode) {
  for (uint32_t v = 0; v < 65536; ++v) {
    const float f = fm::bf16_to_f32(uint16_t(v));
    const uint16_t back = fm::f32_to_bf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fm::bf16_to_f32(back))) << std::hex << v;
      EXPECT_EQ(back & 0x8000, v & 0x8000) << "NaN sign kept " << std::hex << v;
    } else {
      EXPECT_EQ(back, v) << std::hex << v;
    }
  }
}

TEST(Bf16, RoundToNearestEvenEveryHighHalf) {
  // Every upper half with low halves around the midpoint and random ones.
  moejit_test::Rng rng(7);
  const uint32_t lows[] = {0x0000, 0x0001, 0x3FFF, 0x7FFF, 0x8000, 0x8001, 0xBFFF, 0xFFFF};
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    const uint32_t e = (hi >> 7) & 0xFF;
    if (e == 0xFF) continue;  // inf / NaN: separate tests
    for (int j = 0; j < 10; ++j) {
      const uint32_t lo = j < 8 ? lows[j] : (rng() & 0xFFFF);
      const float f = bits_f32(hi << 16 | lo);
      const uint16_t want = bf16_rne_by_distance(f);
      const uint16_t got = fm::f32_to_bf16(f);
      if (got != want) {
        ADD_FAILURE() << "f32 0x" << std::hex << (hi << 16 | lo) << " -> 0x" << got << ", want 0x" << want;
        return;
      }
    }
  }
}

TEST(Bf16, TiesAndOverflow) {
  EXPECT_EQ(fm::f32_to_bf16(bits_f32(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(fm::f32_to_bf16(bits_f32(0x3F818000u)), 0x3F82);  // tie, odd below -> up
  EXPECT_EQ(fm::f32_to_bf16(bits_f32(0x3F808001u)), 0x3F81);  // just above the tie
  EXPECT_EQ(fm::f32_to_bf16(bits_f32(0x3F807FFFu)), 0x3F80);  // just below the tie
  EXPECT_EQ(fm::f32_to_bf16(bits_f32(0xBF818000u)), 0xBF82);  // negative tie
  EXPECT_EQ(fm::f32_to_bf16(bits_f32(0x00008000u)), 0x0000);  // subnormal tie
  EXPECT_EQ(fm::f32_to_bf16(bits_f32(0x00018000u)), 0x0002);
  EXPECT_EQ(fm::f32_to_bf16(bits_f32(0x80008000u)), 0x8000);  // -0.0 result keeps its sign
  EXPECT_EQ(fm::f32_to_bf16(bits_f32(0x7F7F8000u)), 0x7F80);  // tie at the top rounds to inf
  EXPECT_EQ(fm::f32_to_bf16(bits_f32(0x7F7FFFFFu)), 0x7F80);  // FLT_MAX -> inf
  EXPECT_EQ(fm::f32_to_bf16(bits_f32(0x7F7F7FFFu)), 0x7F7F);  // stays the largest finite
  EXPECT_EQ(fm::f32_to_bf16(bits_f32(0xFF7FFFFFu)), 0xFF80);
  EXPECT_EQ(fm::f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(fm::f32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(fm::round_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);                             // tie -> even
  EXPECT_EQ(fm::round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));  // tie -> even
}

TEST(Bf16, InfAndNaN) {
  EXPECT_EQ(fm::f32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(fm::f32_to_bf16(-INFINITY), 0xFF80);
  // Every NaN stays NaN (a naive add-and-truncate turns 0x7F80xxxx into inf and
  // 0x7FFFxxxx into -0 / a wrapped value), with its sign.
  const uint32_t nans[] = {0x7FC00000u, 0x7F800001u, 0x7F807FFFu, 0x7F808000u, 0x7FFFFFFFu,
                           0x7FBFFFFFu, 0xFF800001u, 0xFFFFFFFFu, 0xFFC00000u};
  for (uint32_t n : nans) {
    const uint16_t b = fm::f32_to_bf16(bits_f32(n));
    EXPECT_TRUE(std::isnan(fm::bf16_to_f32(b))) << std::hex << n << " -> " << b;
    EXPECT_EQ(b >> 15, n >> 31) << std::hex << n;
    EXPECT_TRUE(std::isnan(fm::round_bf16(bits_f32(n))));
  }
}

// ---------------------------------------------------------------- fp16

TEST(Fp16, AllCodesMatchFieldFormula) {
  for (uint32_t h = 0; h < 65536; ++h)
    expect_same_value(fp16_formula(uint16_t(h)), fm::fp16_to_f32(uint16_t(h)), "fp16", h);
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) static float f16c_decode(uint16_t h) { return _cvtsh_ss(h); }

TEST(Fp16, AllCodesBitIdenticalToF16C) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "CPU has no F16C";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = f16c_decode(uint16_t(h));
    const float got = fm::fp16_to_f32(uint16_t(h));
    ASSERT_EQ(f32_bits(got), f32_bits(want)) << "fp16 0x" << std::hex << h;
  }
}
#endif

TEST(Fp16, SpotValues) {
  EXPECT_EQ(fm::fp16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(fm::fp16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(fm::fp16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fm::fp16_to_f32(0x03FF), 1023.0f * std::ldexp(1.0f, -24));
  EXPECT_EQ(fm::fp16_to_f32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(f32_bits(fm::fp16_to_f32(0x8000)), 0x80000000u);
  EXPECT_EQ(fm::fp16_to_f32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(fm::fp16_to_f32(0x7C00), INFINITY);
  EXPECT_EQ(fm::fp16_to_f32(0xFC00), -INFINITY);
  EXPECT_TRUE(std::isnan(fm::fp16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(fm::fp16_to_f32(0x7C01)));  // signalling NaN stays NaN
  EXPECT_TRUE(std::isnan(fm::fp16_to_f32(0xFFFF)));
}

// ---------------------------------------------------------------- e5m2

TEST(E5m2, AllCodes) {
  for (unsigned b = 0; b < 256; ++b) {
    const int s = b >> 7, e = (b >> 2) & 31, m = b & 3;
    double want;
    if (e == 31) {
      want = m ? std::nan("") : INFINITY;
    } else if (e == 0) {
      want = m / 4.0 * std::pow(2.0, -14);
    } else {
      want = (1.0 + m / 4.0) * std::pow(2.0, e - 15);
    }
    if (s && !std::isnan(want)) want = -want;
    expect_same_value(want, fm::e5m2_to_f32(uint8_t(b)), "e5m2", b);
    // "exactly the upper byte of an fp16"
    const float via16 = fm::fp16_to_f32(uint16_t(b << 8));
    if (std::isnan(via16)) {
      EXPECT_TRUE(std::isnan(fm::e5m2_to_f32(uint8_t(b))));
    } else {
      EXPECT_EQ(f32_bits(fm::e5m2_to_f32(uint8_t(b))), f32_bits(via16)) << b;
    }
  }
  EXPECT_EQ(fm::e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(fm::e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(fm::e5m2_to_f32(0x7C), INFINITY);
  EXPECT_EQ(fm::e5m2_to_f32(0xFC), -INFINITY);
  EXPECT_TRUE(std::isnan(fm::e5m2_to_f32(0x7D)));
  EXPECT_TRUE(std::isnan(fm::e5m2_to_f32(0xFF)));
  EXPECT_EQ(f32_bits(fm::e5m2_to_f32(0x80)), 0x80000000u);
}

// ---------------------------------------------------------------- e2m1

TEST(E2m1, AllCodes) {
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (unsigned c = 0; c < 16; ++c) {
    const double want = (c & 8) ? -mags[c & 7] : mags[c & 7];
    const float got = fm::e2m1_to_f32(uint8_t(c));
    EXPECT_EQ(double(got), want) << c;
    EXPECT_EQ(std::signbit(got), (c & 8) != 0) << "code " << c << " sign (code 8 is -0.0)";
    // Only the low 4 bits are used.
    EXPECT_EQ(f32_bits(fm::e2m1_to_f32(uint8_t(c | 0xF0))), f32_bits(got)) << c;
    EXPECT_EQ(f32_bits(fm::e2m1_to_f32(uint8_t(c | 0x50))), f32_bits(got)) << c;
  }
  EXPECT_EQ(f32_bits(fm::e2m1_to_f32(8)), 0x80000000u);
}

// ---------------------------------------------------------------- e8m0

TEST(E8m0, AllCodes) {
  for (unsigned s = 0; s < 255; ++s) {
    const float got = fm::e8m0_to_f32(uint8_t(s));
    EXPECT_EQ(double(got), std::pow(2.0, int(s) - 127)) << s;
  }
  EXPECT_EQ(f32_bits(fm::e8m0_to_f32(0)), 0x00400000u);  // 2^-127, an fp32 subnormal
  EXPECT_EQ(fm::e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(fm::e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(fm::e8m0_to_f32(255)));
}

// ---------------------------------------------------------------- weight()
// The numerics reference is built from formats::weight; check its indexing
// (scale row r/128, padded stride, partial last block) against a direct
// computation so that the reference itself cannot share a layout bug with the
// kernels.

TEST(Weight, Fp8BlockIndexingWithPaddedStride) {
  for (int sd = 0; sd < 2; ++sd) {
    const int64_t rows = 300, k = 333, cols = 3, srows = 3, stride = 5;
    moejit_test::Rng rng(11 + sd);
    std::vector<uint8_t> w(size_t(rows * k));
    for (auto& b : w) b = uint8_t(rng());
    std::vector<float> sv(size_t(srows * stride), NAN);
    for (int64_t i = 0; i < srows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        sv[size_t(i * stride + j)] = std::ldexp(1.0f + float(i * cols + j) / 8, int(j) - 2);
    std::vector<uint16_t> s16(sv.size());
    for (size_t i = 0; i < sv.size(); ++i) s16[i] = fm::f32_to_bf16(sv[i]);
    fm::Layout l;
    l.format = fm::Format::fp8_block;
    l.scale_dtype = sd ? fm::ScaleDtype::f32 : fm::ScaleDtype::bf16;
    l.group = 128;
    l.rows = rows;
    l.k = k;
    l.scale_stride = stride;
    fm::MatrixRef m;
    m.data = w.data();
    m.scales = sd ? static_cast<const void*>(sv.data()) : static_cast<const void*>(s16.data());
    for (int64_t r = 0; r < rows; r += 7)
      for (int64_t c = 0; c < k; c += 5) {
        const double want =
            e4m3_formula(w[size_t(r * k + c)]) * double(sv[size_t((r / 128) * stride + c / 128)]);
        ASSERT_EQ(fm::weight(l, m, r, c), want) << "r " << r << " k " << c << " scale dtype " << sd;
      }
  }
}

TEST(Weight, Bf16) {
  const int64_t rows = 5, k = 77;
  std::vector<uint16_t> w(size_t(rows * k));
  moejit_test::Rng rng(3);
  for (auto& v : w) v = uint16_t(0x3C00 + (rng() & 0x0FFF)) ^ uint16_t(rng() & 0x8000);
  fm::Layout l;
  l.format = fm::Format::bf16;
  l.rows = rows;
  l.k = k;
  fm::MatrixRef m;
  m.data = w.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c)
      ASSERT_EQ(fm::weight(l, m, r, c), double(bits_f32(uint32_t(w[size_t(r * k + c)]) << 16)));
}

TEST(Traits, FormatNamesAndIds) {
  EXPECT_STREQ(fm::format_name(fm::Format::bf16), "bf16");
  EXPECT_STREQ(fm::format_name(fm::Format::fp8_block), "fp8_block");
  EXPECT_STREQ(fm::format_name(fm::Format::mxfp8_e5m2), "mxfp8_e5m2");
  EXPECT_EQ(fm::kMaxFormatId, 13);
  EXPECT_EQ(int(fm::Format::fp8_block), 5);
  EXPECT_EQ(int(fm::Format::q4_K), 9);
  EXPECT_EQ(int(fm::Format::q3_K), 13);
  EXPECT_STREQ(fm::format_name(fm::Format::q6_K), "q6_K");
  EXPECT_EQ(fm::scale_cols(fm::Format::fp8_block, 128, 200), 2);
  EXPECT_EQ(fm::scale_rows(fm::Format::fp8_block, 129), 2);
  EXPECT_EQ(fm::scale_elem_bytes(fm::Format::fp8_block, fm::ScaleDtype::f32), 4);
  EXPECT_EQ(fm::scale_elem_bytes(fm::Format::fp8_block, fm::ScaleDtype::bf16), 2);
}

// format_from_name inverts format_name for every id and rejects anything else.
TEST(Traits, FormatFromNameInvertsFormatName) {
  for (int32_t id = 0; id <= fm::kMaxFormatId; ++id) {
    fm::Format f = fm::Format(-1);
    ASSERT_TRUE(fm::format_from_name(fm::format_name(fm::Format(id)), &f)) << id;
    EXPECT_EQ(id, int32_t(f));
  }
  fm::Format f = fm::Format::q8_0;
  for (const char* bad : {"", "BF16", "fp8", "bf16 ", "unknown", "5"}) {
    EXPECT_FALSE(fm::format_from_name(bad, &f)) << bad;
    EXPECT_EQ(fm::Format::q8_0, f) << "output written for " << bad;
  }
}

// Every row of the format table against the numbers formats.md states, written
// out here independently of the table: bytes per row, scale tensor shape and
// element size, the per-row globals, groups and the K rule.
TEST(Traits, EveryFormatRowAgainstFormatsMd) {
  struct Row {
    fm::Format f;
    int64_t bytes_k256;  // weight bytes of one row of K = 256
    int64_t scale_cols_k256, scale_rows_200,
        scale_bytes;  // scale columns for K = 256, scale rows of 200 rows
    bool row_globals;
    int32_t group;
    int64_t smallest_k;  // the smallest valid K
    fm::Format kernel;
  };
  const Row rows[] = {
      {fm::Format::bf16, 512, 0, 0, 0, false, 0, 1, fm::Format::bf16},
      {fm::Format::nvfp4, 128, 16, 200, 1, true, 16, 16, fm::Format::nvfp4},
      {fm::Format::mxfp4, 128, 8, 200, 1, false, 32, 32, fm::Format::mxfp4},
      {fm::Format::ds_fp4, 128, 8, 200, 1, false, 32, 32, fm::Format::mxfp4},
      {fm::Format::q4_0, 144, 0, 0, 0, false, 32, 32, fm::Format::q4_0},
      {fm::Format::fp8_block, 256, 2, 2, 2, false, 128, 1, fm::Format::fp8_block},
      {fm::Format::q8_0, 272, 0, 0, 0, false, 32, 32, fm::Format::q8_0},
      {fm::Format::mxfp8_e4m3, 256, 8, 200, 1, false, 32, 32, fm::Format::mxfp8_e4m3},
      {fm::Format::mxfp8_e5m2, 256, 8, 200, 1, false, 32, 32, fm::Format::mxfp8_e5m2},
      {fm::Format::q4_K, 144, 0, 0, 0, false, 256, 256, fm::Format::q4_K},
      {fm::Format::q5_K, 176, 0, 0, 0, false, 256, 256, fm::Format::q5_K},
      {fm::Format::q6_K, 210, 0, 0, 0, false, 256, 256, fm::Format::q6_K},
      {fm::Format::q2_K, 84, 0, 0, 0, false, 256, 256, fm::Format::q2_K},
      {fm::Format::q3_K, 110, 0, 0, 0, false, 256, 256, fm::Format::q3_K},
  };
  ASSERT_EQ(std::size(rows), size_t(fm::kMaxFormatId + 1));
  for (const Row& r : rows) {
    SCOPED_TRACE(fm::format_name(r.f));
    const int32_t g = fm::default_group(r.f, 0);
    EXPECT_EQ(g, r.group);
    EXPECT_EQ(fm::row_bytes(r.f, 256), r.bytes_k256);
    EXPECT_EQ(fm::has_block_scales(r.f), r.scale_bytes > 0);
    EXPECT_EQ(fm::scale_cols(r.f, g, 256), r.scale_cols_k256);
    EXPECT_EQ(fm::scale_rows(r.f, 200), r.scale_rows_200);
    EXPECT_EQ(fm::scale_elem_bytes(r.f, fm::ScaleDtype::bf16), r.scale_bytes);
    EXPECT_EQ(fm::has_row_scales(r.f), r.row_globals);
    EXPECT_EQ(fm::kernel_format(r.f), r.kernel);
    const char* why = "";
    EXPECT_TRUE(fm::k_is_valid(r.f, g, r.smallest_k, &why)) << why;
    EXPECT_TRUE(fm::k_is_valid(r.f, g, 4 * r.smallest_k, &why)) << why;
    if (r.smallest_k > 1) {
      EXPECT_FALSE(fm::k_is_valid(r.f, g, r.smallest_k + 1, &why));
      EXPECT_GT(std::strlen(why), 0u);
    }
    EXPECT_FALSE(fm::k_is_valid(r.f, g, 0, &why));
  }
  // mxfp8 lets the descriptor pick 64 or 128; the K rule follows the group picked.
  for (fm::Format f : {fm::Format::mxfp8_e4m3, fm::Format::mxfp8_e5m2}) {
    EXPECT_EQ(fm::default_group(f, 64), 64);
    EXPECT_EQ(fm::default_group(f, 128), 128);
    const char* why = "";
    EXPECT_FALSE(fm::k_is_valid(f, 128, 192, &why));
    EXPECT_STREQ(why, "must be a multiple of the group size 128");
    EXPECT_EQ(fm::scale_cols(f, 64, 256), 4);
  }
  EXPECT_EQ(fm::default_group(fm::Format::mxfp4, 64), 32) << "mxfp4 groups are fixed";
  EXPECT_EQ(fm::scale_elem_bytes(fm::Format::fp8_block, fm::ScaleDtype::f32), 4);
  EXPECT_EQ(fm::scale_row_of(fm::Format::fp8_block, 255), 1);
  EXPECT_EQ(fm::scale_row_of(fm::Format::mxfp4, 255), 255);
  // The K-quants' sub-blocks and mins (formats.md rows 9..13); no other row has them.
  struct Sub {
    fm::Format f;
    int32_t sub_block;
    bool mins;
  };
  for (const Sub& s :
       {Sub{fm::Format::q4_K, 32, true}, Sub{fm::Format::q5_K, 32, true}, Sub{fm::Format::q6_K, 16, false},
        Sub{fm::Format::q2_K, 16, true}, Sub{fm::Format::q3_K, 16, false}}) {
    EXPECT_TRUE(fm::is_kquant(s.f));
    EXPECT_EQ(fm::info(s.f).sub_block, s.sub_block) << fm::format_name(s.f);
    EXPECT_EQ(fm::info(s.f).has_mins, s.mins) << fm::format_name(s.f);
  }
  for (int32_t id = 0; id <= 8; ++id) {
    EXPECT_FALSE(fm::is_kquant(fm::Format(id))) << id;
    EXPECT_EQ(fm::info(fm::Format(id)).sub_block, 0) << id;
  }
  const char* why = "";
  EXPECT_FALSE(fm::k_is_valid(fm::Format::q6_K, 256, 384, &why));
  EXPECT_STREQ(why, "must be a multiple of 256 for the K-quants");
}
