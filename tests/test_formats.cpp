// formats/ element decoders against independent computations (formats.md
// "Element encodings"). Every check here is written differently from
// formats.cpp: by the value formula in double, by the fp16/bf16 widening facts
// the kernels rely on, and, for fp16, by the F16C instruction itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "formats/formats.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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
  std::mt19937 rng(7);
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
    std::mt19937 rng(11 + sd);
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
  std::mt19937 rng(3);
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
  EXPECT_EQ(fm::kMaxFormatId, 8);
  EXPECT_EQ(int(fm::Format::fp8_block), 5);
  EXPECT_EQ(fm::scale_cols(fm::Format::fp8_block, 128, 200), 2);
  EXPECT_EQ(fm::scale_rows(fm::Format::fp8_block, 129), 2);
  EXPECT_EQ(fm::scale_elem_bytes(fm::Format::fp8_block, fm::ScaleDtype::f32), 4);
  EXPECT_EQ(fm::scale_elem_bytes(fm::Format::fp8_block, fm::ScaleDtype::bf16), 2);
}
