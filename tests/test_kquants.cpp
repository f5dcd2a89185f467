// formats/kquants (GGUF K-quants, formats.md ids 9..13) against computations
// written independently of kquants.cpp:
//  - a per-bit decoder: every field of a super-block (d, dmin, each sub-block
//    scale and min, each quant) as the list of the block's bits it is made of,
//    written from the layout table of formats.md / kquants.h, checked to cover
//    every bit of the block exactly once; values assembled bit by bit;
//  - fp16 values from their fields in double;
//  - the weight formula in double, and the reference GEMV's documented
//    operation order re-implemented here on the per-bit decode (bit-exact), as
//    well as a float64 dot product with an error bound against
//    sum(|d sc q x| + |dmin m x|).
// gguf-py and ggml's quantizers are the references of crosscheck_kquants.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "formats/kquants.h"

namespace fm = moejit::formats;
using fm::KQuant;

namespace {

constexpr KQuant kAll[] = {KQuant::q4_K, KQuant::q5_K, KQuant::q6_K, KQuant::q2_K, KQuant::q3_K};

std::string name(KQuant f) { return fm::kquant_name(f); }

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// IEEE half from its fields, in double.
double fp16_formula(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double mag;
  if (e == 31) {
    if (m) return std::nan("");
    mag = INFINITY;
  } else if (e == 0) {
    mag = std::ldexp(m, -24);
  } else {
    mag = std::ldexp(1024 + m, e - 25);
  }
  return s ? -mag : mag;
}

// ---------------------------------------------------------------- the per-bit decoder

// A field: the block's bit positions (byte * 8 + bit) it is made of, least
// significant first, and what its raw unsigned value means.
enum class Meaning { unsigned_value, minus32, minus4, int8 };
struct Field {
  std::vector<int> bits;
  Meaning meaning = Meaning::unsigned_value;
};

struct BitMap {
  int bytes = 0, sub_blocks = 0, sub_size = 0;
  bool mins = false;
  Field d, dmin;
  std::vector<Field> sc, m, q;  // sub_blocks, sub_blocks (if mins), 256
};

void add_bits(Field& f, int byte, int first_bit, int n) {
  for (int b = 0; b < n; ++b) f.bits.push_back(byte * 8 + first_bit + b);
}

Field fp16_at(int byte) {
  Field f;
  add_bits(f, byte, 0, 8);
  add_bits(f, byte + 1, 0, 8);
  return f;
}

// The layouts of kquants.h's header comment, field by field.
BitMap bit_map(KQuant f) {
  BitMap b;
  b.q.resize(256);
  switch (f) {
    case KQuant::q4_K:
    case KQuant::q5_K: {
      const bool five = f == KQuant::q5_K;
      b.bytes = five ? 176 : 144, b.sub_blocks = 8, b.sub_size = 32, b.mins = true;
      b.d = fp16_at(0), b.dmin = fp16_at(2);
      b.sc.resize(8), b.m.resize(8);
      for (int j = 0; j < 4; ++j) {
        add_bits(b.sc[j], 4 + j, 0, 6);  // scales[j] bits 0..5
        add_bits(b.m[j], 8 + j, 0, 6);   // scales[j + 4] bits 0..5
      }
      for (int j = 4; j < 8; ++j) {
        add_bits(b.sc[j], 8 + j, 0, 4);  // scales[j + 4] low nibble,
        add_bits(b.sc[j], j, 6, 2);      // then scales[j - 4] bits 6..7
        add_bits(b.m[j], 8 + j, 4, 4);   // scales[j + 4] high nibble,
        add_bits(b.m[j], 4 + j, 6, 2);   // then scales[j] bits 6..7
      }
      const int qs = five ? 48 : 16;
      for (int i = 0; i < 256; ++i) {
        add_bits(b.q[i], qs + 32 * (i / 64) + i % 32, i % 64 < 32 ? 0 : 4, 4);
        if (five) add_bits(b.q[i], 16 + i % 32, i / 32, 1);
      }
      break;
    }
    case KQuant::q6_K:
      b.bytes = 210, b.sub_blocks = 16, b.sub_size = 16;
      b.d = fp16_at(208);
      b.sc.resize(16);
      for (int j = 0; j < 16; ++j) {
        add_bits(b.sc[j], 192 + j, 0, 8);
        b.sc[j].meaning = Meaning::int8;
      }
      for (int i = 0; i < 256; ++i) {
        const int h = i / 128, e = i % 128;
        add_bits(b.q[i], 64 * h + e % 64, e < 64 ? 0 : 4, 4);
        add_bits(b.q[i], 128 + 32 * h + e % 32, 2 * (e / 32), 2);
        b.q[i].meaning = Meaning::minus32;
      }
      break;
    case KQuant::q2_K:
      b.bytes = 84, b.sub_blocks = 16, b.sub_size = 16, b.mins = true;
      b.d = fp16_at(80), b.dmin = fp16_at(82);
      b.sc.resize(16), b.m.resize(16);
      for (int j = 0; j < 16; ++j) {
        add_bits(b.sc[j], j, 0, 4);
        add_bits(b.m[j], j, 4, 4);
      }
      for (int i = 0; i < 256; ++i) add_bits(b.q[i], 16 + 32 * (i / 128) + i % 32, 2 * ((i % 128) / 32), 2);
      break;
    case KQuant::q3_K:
      b.bytes = 110, b.sub_blocks = 16, b.sub_size = 16;
      b.d = fp16_at(108);
      b.sc.resize(16);
      for (int j = 0; j < 16; ++j) {
        add_bits(b.sc[j], 96 + j % 8, j < 8 ? 0 : 4, 4);
        add_bits(b.sc[j], 104 + j % 4, 2 * (j / 4), 2);
        b.sc[j].meaning = Meaning::minus32;
      }
      for (int i = 0; i < 256; ++i) {
        add_bits(b.q[i], 32 + 32 * (i / 128) + i % 32, 2 * ((i % 128) / 32), 2);
        add_bits(b.q[i], i % 32, i / 32, 1);  // hmask: set = +4 on top of the -4 offset
        b.q[i].meaning = Meaning::minus4;
      }
      break;
  }
  return b;
}

int32_t value(const Field& f, const uint8_t* blk) {
  int32_t v = 0;
  for (size_t n = 0; n < f.bits.size(); ++n) v |= ((blk[f.bits[n] / 8] >> (f.bits[n] % 8)) & 1) << n;
  switch (f.meaning) {
    case Meaning::unsigned_value: return v;
    case Meaning::minus32: return v - 32;
    case Meaning::minus4: return v - 4;
    case Meaning::int8: return v >= 128 ? v - 256 : v;
  }
  return v;
}

// One super-block decoded bit by bit.
struct Decoded {
  double d = 0, dmin = 0;
  int32_t sc[16] = {}, m[16] = {}, q[256] = {};
};

Decoded decode(const BitMap& b, const uint8_t* blk) {
  Decoded o;
  o.d = fp16_formula(uint16_t(value(b.d, blk)));
  if (b.mins) o.dmin = fp16_formula(uint16_t(value(b.dmin, blk)));
  for (int j = 0; j < b.sub_blocks; ++j) {
    o.sc[j] = value(b.sc[j], blk);
    if (b.mins) o.m[j] = value(b.m[j], blk);
  }
  for (int i = 0; i < 256; ++i) o.q[i] = value(b.q[i], blk);
  return o;
}

// w = d sc q - dmin m in double (exact: at most 51 significant bits).
double weight_formula(const BitMap& b, const Decoded& o, int i) {
  const int j = i / b.sub_size;
  const double dq = o.d * o.sc[j] * o.q[i];
  return b.mins ? dq - o.dmin * o.m[j] : dq;
}

bool same_or_both_nan(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// ---------------------------------------------------------------- data

std::vector<uint8_t> random_blocks(KQuant f, int n, std::mt19937& rng, bool finite_scales = true) {
  const fm::KQuantTraits& t = fm::kquant_traits(f);
  const BitMap b = bit_map(f);
  std::vector<uint8_t> v(size_t(n) * t.block_bytes);
  for (auto& c : v) c = uint8_t(rng());
  if (finite_scales) {
    // d and dmin between 2^-10 and 2^2: nothing overflows, nothing is subnormal.
    for (int k = 0; k < n; ++k) {
      uint8_t* blk = v.data() + size_t(k) * t.block_bytes;
      for (const Field* fld : {&b.d, &b.dmin}) {
        if (fld->bits.empty()) continue;
        const uint16_t h = uint16_t((rng() & 0x8000) | (5 + rng() % 12) << 10 | (rng() & 0x3FF));
        blk[fld->bits[0] / 8] = uint8_t(h), blk[fld->bits[8] / 8] = uint8_t(h >> 8);
      }
    }
  }
  return v;
}

void set_fp16(const Field& fld, uint8_t* blk, uint16_t h) {
  blk[fld.bits[0] / 8] = uint8_t(h);
  blk[fld.bits[8] / 8] = uint8_t(h >> 8);
}

// bf16 activations as fp32: normal values of several magnitudes, and some
// signed zeros and bf16 subnormals.
std::vector<float> bf16_x(int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(k));
  for (auto& v : x) {
    const uint32_t r = rng() % 64;
    if (r == 0)
      v = (rng() & 1) ? -0.0f : 0.0f;
    else if (r == 1)
      v = fm::bf16_to_f32(uint16_t((rng() & 0x8000) | (1 + rng() % 0x7F)));  // subnormal
    else
      v = fm::round_bf16(nd(rng) * std::ldexp(1.0f, int(rng() % 7) - 3));
  }
  return x;
}

// The reference GEMV of kquants.h, re-implemented on the per-bit decode.
float documented_gemv_row(KQuant f, const uint8_t* row, int64_t k, const float* x) {
  const BitMap b = bit_map(f);
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += 256) {
    const Decoded o = decode(b, row + k0 / 256 * b.bytes);
    for (int j = 0; j < b.sub_blocks; ++j) {
      float sq = 0.0f, sx = 0.0f;
      for (int i = j * b.sub_size; i < (j + 1) * b.sub_size; ++i) {
        sq = sq + float(o.q[i]) * x[k0 + i];
        sx = sx + x[k0 + i];
      }
      acc = std::fma(float(o.d) * float(o.sc[j]), sq, acc);
      if (b.mins) acc = std::fma(-(float(o.dmin) * float(o.m[j])), sx, acc);
    }
  }
  return acc;
}

// float64 value of a row's dot product and sum(|d sc q x| + |dmin m x|).
void float64_row(KQuant f, const uint8_t* row, int64_t k, const float* x, double* want, double* mag,
                 double* max_scale) {
  const BitMap b = bit_map(f);
  *want = 0, *mag = 0, *max_scale = 1;
  for (int64_t k0 = 0; k0 < k; k0 += 256) {
    const Decoded o = decode(b, row + k0 / 256 * b.bytes);
    for (int i = 0; i < 256; ++i) {
      const int j = i / b.sub_size;
      const double xv = x[k0 + i], dsq = o.d * o.sc[j] * o.q[i], dm = o.dmin * o.m[j];
      *want += (dsq - dm) * xv;
      *mag += std::fabs(dsq * xv) + std::fabs(dm * xv);
      *max_scale = std::max({*max_scale, std::fabs(o.d * o.sc[j]), std::fabs(dm)});
    }
  }
}

// The reference GEMV's rounding error: sub-block sums of q x and of x (B - 1
// roundings each, relative to sum |q x| and sum |x|), then two FMAs per
// sub-block into the running total; every term of sum(|d sc q x| + |dmin m x|)
// passes through at most B + 2 K / B roundings of relative size 2^-24. Results
// in the subnormal range lose up to 2^-150 absolutely per operation, magnified
// by at most the largest scale factor.
double gemv_bound(KQuant f, int64_t k, double mag, double max_scale) {
  const int64_t bl = fm::kquant_traits(f).sub_block_size;
  const double ops = double(bl + 2 * k / bl);
  return ops * std::ldexp(1.0, -24) * mag * 1.001 + ops * std::ldexp(1.0, -149) * max_scale;
}

}  // namespace

// ---------------------------------------------------------------- traits

TEST(KQuantFormat, SizesIdsNamesAndKRule) {
  struct Want {
    KQuant f;
    int id;
    const char* name;
    int bytes, subs, sub_size;
    bool mins;
    double bytes_per_weight;  // formats.md "Reference numbers", 4 decimals
  };
  const Want want[] = {{KQuant::q4_K, 9, "q4_K", 144, 8, 32, true, 0.5625},
                       {KQuant::q5_K, 10, "q5_K", 176, 8, 32, true, 0.6875},
                       {KQuant::q6_K, 11, "q6_K", 210, 16, 16, false, 0.8203},
                       {KQuant::q2_K, 12, "q2_K", 84, 16, 16, true, 0.3281},
                       {KQuant::q3_K, 13, "q3_K", 110, 16, 16, false, 0.4297}};
  for (const Want& w : want) {
    const fm::KQuantTraits& t = fm::kquant_traits(w.f);
    EXPECT_EQ(int(w.f), w.id);
    EXPECT_STREQ(fm::kquant_name(w.f), w.name);
    EXPECT_STREQ(t.name, w.name);
    EXPECT_EQ(t.block_bytes, w.bytes) << w.name;
    EXPECT_EQ(t.sub_blocks, w.subs) << w.name;
    EXPECT_EQ(t.sub_block_size, w.sub_size) << w.name;
    EXPECT_EQ(t.sub_blocks * t.sub_block_size, 256) << w.name;
    EXPECT_EQ(t.has_mins, w.mins) << w.name;
    EXPECT_NEAR(t.block_bytes / 256.0, w.bytes_per_weight, 5e-5) << w.name;
    for (int64_t n : {1, 2, 7, 28}) {
      EXPECT_EQ(fm::kquant_row_bytes(w.f, 256 * n), n * w.bytes) << w.name;
      EXPECT_EQ(fm::kquant_sub_sums_len(w.f, 256 * n), 256 * n / w.sub_size) << w.name;
    }
    KQuant g;
    ASSERT_TRUE(fm::kquant_from_id(w.id, &g));
    EXPECT_EQ(g, w.f);
    ASSERT_TRUE(fm::kquant_from_name(w.name, &g));
    EXPECT_EQ(g, w.f);
    // The layout of formats.md takes every byte of the block.
    EXPECT_EQ(bit_map(w.f).bytes, w.bytes);
  }
  KQuant g;
  for (int id : {-1, 0, 4, 8, 14, 100}) EXPECT_FALSE(fm::kquant_from_id(id, &g)) << id;
  for (const char* n : {"Q4_K", "q4_k", "q4_K_M", "", "q8_0"}) EXPECT_FALSE(fm::kquant_from_name(n, &g)) << n;
  for (int64_t k : {256, 512, 768, 7168}) {
    const char* why = nullptr;
    EXPECT_TRUE(fm::kquant_k_is_valid(k, &why)) << k;
  }
  for (int64_t k : {-256, 0, 1, 32, 128, 255, 257, 384, 1000}) {
    const char* why = nullptr;
    EXPECT_FALSE(fm::kquant_k_is_valid(k, &why)) << k;
    EXPECT_TRUE(why && *why) << k;
  }
}

// ---------------------------------------------------------------- decoders

TEST(KQuantFormatDecode, BitMapCoversEveryBitOnce) {
  // Checks the per-bit decoder itself: fields of the right widths that tile the block.
  for (KQuant f : kAll) {
    const BitMap b = bit_map(f);
    std::vector<int> owner(size_t(b.bytes) * 8, 0);
    auto own = [&](const Field& fld, size_t width) {
      EXPECT_EQ(fld.bits.size(), width) << name(f);
      for (int p : fld.bits) ++owner[size_t(p)];
    };
    own(b.d, 16);
    if (b.mins) own(b.dmin, 16);
    const size_t sc_bits = f == KQuant::q6_K ? 8 : f == KQuant::q2_K ? 4 : 6;
    for (int j = 0; j < b.sub_blocks; ++j) {
      own(b.sc[j], sc_bits);
      if (b.mins) own(b.m[j], sc_bits);
    }
    const size_t q_bits = f == KQuant::q4_K   ? 4
                          : f == KQuant::q5_K ? 5
                          : f == KQuant::q6_K ? 6
                          : f == KQuant::q2_K ? 2
                                              : 3;
    for (int i = 0; i < 256; ++i) own(b.q[i], q_bits);
    for (size_t p = 0; p < owner.size(); ++p) EXPECT_EQ(owner[p], 1) << name(f) << " bit " << p;
  }
}

TEST(KQuantFormatDecode, EveryBitFlipChangesOnlyItsField) {
  // Flips each bit of random blocks in turn; every decoded field must equal the
  // per-bit decode of the flipped block (a swapped nibble or shifted field fails).
  std::mt19937 rng(11);
  for (KQuant f : kAll) {
    const BitMap b = bit_map(f);
    const fm::KQuantTraits& t = fm::kquant_traits(f);
    std::vector<uint8_t> blocks = random_blocks(f, 4, rng, false);
    int bad = 0;
    for (int n = 0; n < 4; ++n) {
      uint8_t* blk = blocks.data() + n * t.block_bytes;
      for (int p = -1; p < t.block_bytes * 8; ++p) {
        if (p >= 0) blk[p / 8] ^= uint8_t(1 << (p % 8));
        const Decoded o = decode(b, blk);
        bad += !same_or_both_nan(o.d, fm::kquant_d(f, blk));
        bad += !same_or_both_nan(o.dmin, fm::kquant_dmin(f, blk));
        for (int j = 0; j < t.sub_blocks; ++j) {
          const fm::KQuantSub s = fm::kquant_sub(f, blk, j);
          bad += s.sc != o.sc[j] || s.m != o.m[j];
        }
        for (int i = 0; i < 256; ++i) bad += fm::kquant_q(f, blk, i) != o.q[i];
        if (p >= 0) blk[p / 8] ^= uint8_t(1 << (p % 8));
        if (bad) {
          ADD_FAILURE() << name(f) << ": decode differs from the per-bit decode after flipping bit " << p;
          break;
        }
      }
    }
  }
}

TEST(KQuantFormatDecode, EveryValueOfEveryScaleByte) {
  // Each byte of the scale field (q4_K / q5_K / q3_K: 12 packed bytes; q2_K:
  // 16 nibble pairs; q6_K: 16 int8) takes all 256 values, the others random.
  std::mt19937 rng(12);
  for (KQuant f : kAll) {
    const BitMap b = bit_map(f);
    const fm::KQuantTraits& t = fm::kquant_traits(f);
    const int first = f == KQuant::q6_K ? 192 : f == KQuant::q2_K ? 0 : f == KQuant::q3_K ? 96 : 4;
    const int len = f == KQuant::q4_K || f == KQuant::q5_K || f == KQuant::q3_K ? 12 : 16;
    std::vector<uint8_t> blk = random_blocks(f, 1, rng, false);
    int checked = 0;
    for (int p = first; p < first + len; ++p)
      for (int v = 0; v < 256; ++v) {
        blk[size_t(p)] = uint8_t(v);
        const Decoded o = decode(b, blk.data());
        for (int j = 0; j < t.sub_blocks; ++j) {
          const fm::KQuantSub s = fm::kquant_sub(f, blk.data(), j);
          ASSERT_EQ(s.sc, o.sc[j]) << name(f) << " byte " << p << " = " << v << " sub-block " << j;
          ASSERT_EQ(s.m, o.m[j]) << name(f) << " byte " << p << " = " << v << " sub-block " << j;
          ++checked;
        }
        // Ranges of the factors (kquants.h).
        for (int j = 0; j < t.sub_blocks; ++j) {
          const fm::KQuantSub s = fm::kquant_sub(f, blk.data(), j);
          const int lo = f == KQuant::q6_K ? -128 : f == KQuant::q3_K ? -32 : 0;
          const int hi = f == KQuant::q6_K ? 127 : f == KQuant::q3_K ? 31 : f == KQuant::q2_K ? 15 : 63;
          ASSERT_TRUE(s.sc >= lo && s.sc <= hi && s.m >= 0 && s.m <= (t.has_mins ? hi : 0)) << name(f);
        }
        blk[size_t(p)] = uint8_t(rng());
      }
    EXPECT_EQ(checked, len * 256 * t.sub_blocks);
  }
}

TEST(KQuantFormatDecode, WeightsMatchTheFormulaForEveryElement) {
  std::mt19937 rng(13);
  for (KQuant f : kAll) {
    const BitMap b = bit_map(f);
    const int nb = 6;
    const std::vector<uint8_t> row = random_blocks(f, nb, rng);
    std::vector<float> deq(256 * nb);
    fm::kquant_dequantize_row(f, row.data(), 256 * nb, deq.data());
    for (int64_t k = 0; k < 256 * nb; ++k) {
      const Decoded o = decode(b, row.data() + k / 256 * b.bytes);
      const double want = weight_formula(b, o, int(k % 256));
      const double got = fm::kquant_weight(f, row.data(), k);
      ASSERT_EQ(got, want) << name(f) << " k " << k;
      // The same bytes as a [6, 256] matrix: element (k / 256, k % 256).
      ASSERT_EQ(fm::kquant_weight(f, row.data(), 256, k / 256, k % 256), want) << name(f) << " k " << k;
      // The fp32 row: the exact weight rounded once (as gguf-py's float32).
      ASSERT_EQ(f32_bits(deq[size_t(k)]), f32_bits(float(want))) << name(f) << " k " << k;
    }
  }
}

TEST(KQuantFormatDecode, ExtremeDAndDminPropagate) {
  // fp16 zeros, subnormals, the largest finite, inf and NaN in d and in dmin.
  const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00,
                              0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF};
  std::mt19937 rng(14);
  for (KQuant f : kAll) {
    const BitMap b = bit_map(f);
    for (uint16_t hd : special)
      for (uint16_t hm : special) {
        if (!b.mins && hm != 0) continue;
        std::vector<uint8_t> blk = random_blocks(f, 1, rng);
        set_fp16(b.d, blk.data(), hd);
        if (b.mins) set_fp16(b.dmin, blk.data(), hm);
        const Decoded o = decode(b, blk.data());
        std::vector<float> deq(256);
        fm::kquant_dequantize_row(f, blk.data(), 256, deq.data());
        for (int i = 0; i < 256; ++i) {
          const double want = weight_formula(b, o, i), got = fm::kquant_weight(f, blk.data(), i);
          ASSERT_TRUE(same_or_both_nan(want, got))
              << name(f) << std::hex << " d 0x" << hd << " dmin 0x" << hm << std::dec << " i " << i << ": "
              << got << " want " << want;
          ASSERT_TRUE(same_or_both_nan(double(float(want)), double(deq[size_t(i)]))) << name(f) << " i " << i;
          if (std::isnan(fp16_formula(hd)) || std::isnan(fp16_formula(hm))) {
            ASSERT_TRUE(std::isnan(got));
          }
        }
        // The GEMV: NaN in d or dmin makes the row NaN whatever x is (NaN * 0 is NaN);
        // inf d makes it non-finite; finite scales with finite x give a finite row.
        std::vector<float> x = bf16_x(256, rng);
        float y = 0;
        fm::kquant_gemv(f, blk.data(), 256, 1, x.data(), &y);
        const double d = fp16_formula(hd), dm = b.mins ? fp16_formula(hm) : 0;
        if (std::isnan(d) || std::isnan(dm)) {
          EXPECT_TRUE(std::isnan(y)) << name(f) << std::hex << " d 0x" << hd << " dmin 0x" << hm;
        } else if (std::isinf(d) || std::isinf(dm)) {
          EXPECT_FALSE(std::isfinite(y)) << name(f) << std::hex << " d 0x" << hd << " dmin 0x" << hm;
        } else {
          double want, mag, smax;
          float64_row(f, blk.data(), 256, x.data(), &want, &mag, &smax);
          EXPECT_LE(std::fabs(double(y) - want), gemv_bound(f, 256, mag, smax))
              << name(f) << std::hex << " d 0x" << hd << " dmin 0x" << hm;
        }
        std::vector<float> zero(256, 0.0f);
        fm::kquant_gemv(f, blk.data(), 256, 1, zero.data(), &y);
        if (std::isnan(d) || std::isnan(dm)) {
          EXPECT_TRUE(std::isnan(y)) << name(f) << " x = 0";
        }
      }
  }
}

// ---------------------------------------------------------------- reference GEMV

TEST(KQuantFormatGemv, MatchesTheDocumentedOrderBitForBit) {
  std::mt19937 rng(21);
  for (KQuant f : kAll)
    for (int64_t n : {1, 2, 3, 7, 11, 28}) {
      const int64_t k = 256 * n, rows = 5;
      const std::vector<uint8_t> data = random_blocks(f, int(rows * n), rng);
      const std::vector<float> x = bf16_x(k, rng);
      std::vector<float> y(size_t(rows), -1.0f), y2(size_t(rows), -2.0f);
      std::vector<float> sx(size_t(fm::kquant_sub_sums_len(f, k)));
      fm::kquant_sub_sums(f, x.data(), k, sx.data());
      fm::kquant_gemv(f, data.data(), k, rows, x.data(), sx.data(), y.data());
      fm::kquant_gemv(f, data.data(), k, rows, x.data(), y2.data());
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = data.data() + r * fm::kquant_row_bytes(f, k);
        const float want = documented_gemv_row(f, row, k, x.data());
        EXPECT_EQ(f32_bits(y[size_t(r)]), f32_bits(want)) << name(f) << " K " << k << " row " << r;
        EXPECT_EQ(f32_bits(y2[size_t(r)]), f32_bits(want))
            << name(f) << " K " << k << " row " << r << " (no sx)";
      }
    }
}

TEST(KQuantFormatGemv, SubSumsAreSequentialFp32Sums) {
  std::mt19937 rng(22);
  for (KQuant f : kAll) {
    const int64_t k = 768, bl = fm::kquant_traits(f).sub_block_size;
    std::vector<float> x = bf16_x(k, rng);
    x[0] = -0.0f;  // +0.0 + -0.0 = +0.0: the sum starts from +0.0
    for (int64_t i = 1; i < bl; ++i) x[size_t(i)] = -0.0f;
    std::vector<float> sx(size_t(k / bl) + 1, 777.0f);
    fm::kquant_sub_sums(f, x.data(), k, sx.data());
    EXPECT_EQ(sx.back(), 777.0f) << name(f) << ": wrote past K / B sums";
    EXPECT_EQ(f32_bits(sx[0]), 0u) << name(f) << ": an all -0.0 sub-block sums to +0.0";
    for (int64_t s = 1; s < k / bl; ++s) {
      volatile float acc = 0.0f;  // one rounding per addition, in k order
      for (int64_t i = s * bl; i < (s + 1) * bl; ++i) acc = acc + x[size_t(i)];
      EXPECT_EQ(f32_bits(sx[size_t(s)]), f32_bits(acc)) << name(f) << " sub-block " << s;
    }
    // The sums of x are what the formats with mins use: a wrong S_x changes the row.
    if (fm::kquant_traits(f).has_mins) {
      const std::vector<uint8_t> row = random_blocks(f, 3, rng);
      float y0, y1;
      fm::kquant_gemv(f, row.data(), k, 1, x.data(), sx.data(), &y0);
      sx[7] += 1.0f;
      fm::kquant_gemv(f, row.data(), k, 1, x.data(), sx.data(), &y1);
      EXPECT_NE(y0, y1) << name(f);
    }
  }
}

TEST(KQuantFormatGemv, Float64ReferenceWithinBound) {
  // Random blocks and quantized bell-shaped rows, K = 256 n for several n; the
  // bound is taken against sum(|d sc q x| + |dmin m x|), since the two terms cancel.
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  for (KQuant f : kAll)
    for (int64_t n : {1, 2, 4, 9, 16}) {
      const int64_t k = 256 * n, rows = 6;
      std::vector<uint8_t> data = random_blocks(f, int(rows * n), rng);
      std::vector<float> w(size_t(rows * k));
      for (auto& v : w) v = nd(rng) * 0.02f + 0.01f;
      std::vector<uint8_t> q(size_t(rows * fm::kquant_row_bytes(f, k)));
      ASSERT_TRUE(fm::kquant_quantize(f, rows, k, w.data(), q.data()).ok);
      const std::vector<float> x = bf16_x(k, rng);
      for (const std::vector<uint8_t>* d : {&data, &q}) {
        std::vector<float> y(static_cast<size_t>(rows));
        fm::kquant_gemv(f, d->data(), k, rows, x.data(), y.data());
        for (int64_t r = 0; r < rows; ++r) {
          double want, mag, smax;
          float64_row(f, d->data() + r * fm::kquant_row_bytes(f, k), k, x.data(), &want, &mag, &smax);
          const double err = std::fabs(double(y[size_t(r)]) - want), bound = gemv_bound(f, k, mag, smax);
          EXPECT_LE(err, bound) << name(f) << " K " << k << " row " << r << (d == &q ? " (quantized)" : "")
                                << ": y " << y[size_t(r)] << " float64 " << want;
        }
      }
    }
}

TEST(KQuantFormatGemv, UnalignedRowsGiveTheSameBits) {
  // Engines pass rows where they lie in a mapped file: any address.
  std::mt19937 rng(24);
  for (KQuant f : kAll) {
    const int64_t k = 512, rows = 5, rb = fm::kquant_row_bytes(f, k);
    const std::vector<uint8_t> data = random_blocks(f, int(rows * 2), rng);
    const std::vector<float> x = bf16_x(k, rng);
    std::vector<float> want(static_cast<size_t>(rows));
    fm::kquant_gemv(f, data.data(), k, rows, x.data(), want.data());
    for (int off : {1, 3, 5, 7, 13}) {
      std::vector<uint8_t> buf(data.size() + 16, 0xA5);
      std::memcpy(buf.data() + off, data.data(), data.size());
      std::vector<float> y(static_cast<size_t>(rows));
      fm::kquant_gemv(f, buf.data() + off, k, rows, x.data(), y.data());
      std::vector<float> deq(static_cast<size_t>(k));
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(f32_bits(y[size_t(r)]), f32_bits(want[size_t(r)])) << name(f) << " offset " << off;
        fm::kquant_dequantize_row(f, buf.data() + off + r * rb, k, deq.data());
        for (int64_t i = 0; i < k; i += 37)
          EXPECT_EQ(double(deq[size_t(i)]), double(float(fm::kquant_weight(f, data.data() + r * rb, i))));
      }
    }
  }
}

// ---------------------------------------------------------------- quantizers

namespace {

std::vector<float> bell_rows(int64_t rows, int64_t k, std::mt19937& rng, float scale) {
  std::normal_distribution<float> nd;
  std::vector<float> w(size_t(rows * k));
  for (auto& v : w) v = nd(rng) * scale;
  return w;
}

std::vector<uint8_t> quantize(KQuant f, int64_t rows, int64_t k, const std::vector<float>& w) {
  std::vector<uint8_t> q(size_t(rows * fm::kquant_row_bytes(f, k)));
  const fm::QuantResult r = fm::kquant_quantize(f, rows, k, w.data(), q.data());
  EXPECT_TRUE(r.ok) << (r.error ? r.error : "");
  return q;
}

}  // namespace

TEST(KQuantQuantize, RoundTripRmsError) {
  // RMS error against the RMS of bell-shaped rows whose fp16 d is normal. ggml's
  // quantizers on such data: about 0.30 (q2_K), 0.15 (q3_K), 0.070 (q4_K), 0.036
  // (q5_K), 0.018 (q6_K); the limits leave ~15% room and fail for a broken fit,
  // scale packing or level packing.
  std::mt19937 rng(31);
  for (KQuant f : kAll) {
    const double limit = f == KQuant::q2_K   ? 0.35
                         : f == KQuant::q3_K ? 0.18
                         : f == KQuant::q4_K ? 0.082
                         : f == KQuant::q5_K ? 0.042
                                             : 0.022;
    for (float scale : {1e-3f, 0.05f, 1.0f, 300.0f}) {
      const int64_t rows = 8, k = 1024;
      const std::vector<float> w = bell_rows(rows, k, rng, scale);
      const std::vector<uint8_t> q = quantize(f, rows, k, w);
      double se = 0, ss = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < k; ++i) {
          const double got = fm::kquant_weight(f, q.data() + r * fm::kquant_row_bytes(f, k), i);
          se += (got - w[size_t(r * k + i)]) * (got - w[size_t(r * k + i)]);
          ss += double(w[size_t(r * k + i)]) * w[size_t(r * k + i)];
        }
      EXPECT_LE(std::sqrt(se / ss), limit) << name(f) << " scale " << scale;
    }
  }
}

TEST(KQuantQuantize, EachElementIsTheNearestLevelOfItsStoredScales) {
  // ggml re-rounds every element against the stored (fp16 d and dmin, integer
  // sc and m) scales: its level is the nearest of the sub-block's grid, up to
  // the fp32 rounding of (x + dmin m) / (d sc).
  std::mt19937 rng(32);
  for (KQuant f : kAll) {
    const BitMap b = bit_map(f);
    const int lo = f == KQuant::q6_K ? -32 : f == KQuant::q3_K ? -4 : 0;
    const int hi = f == KQuant::q6_K   ? 31
                   : f == KQuant::q3_K ? 3
                   : f == KQuant::q2_K ? 3
                   : f == KQuant::q4_K ? 15
                                       : 31;
    const int64_t rows = 6, k = 512;
    std::vector<float> w = bell_rows(rows, k, rng, 0.1f);
    for (int64_t i = 0; i < rows * k; i += 97) w[size_t(i)] *= 12.0f;  // outliers
    for (int64_t i = 256; i < 512; ++i) w[size_t(i)] += 0.3f;          // an offset block
    const std::vector<uint8_t> q = quantize(f, rows, k, w);
    int64_t checked = 0;
    for (int64_t blk_i = 0; blk_i < rows * k / 256; ++blk_i) {
      const Decoded o = decode(b, q.data() + blk_i * b.bytes);
      for (int i = 0; i < 256; ++i) {
        const int j = i / b.sub_size;
        const double dsc = o.d * o.sc[j], dm = o.dmin * o.m[j];
        if (dsc == 0) continue;
        const double x = w[size_t(blk_i * 256 + i)], got = dsc * o.q[i] - dm;
        double best = INFINITY;
        for (int l = lo; l <= hi; ++l) best = std::min(best, std::fabs(dsc * l - dm - x));
        const double slack = std::ldexp(1.0, -20) * (std::fabs(x) + std::fabs(dm) + std::fabs(dsc) * 32);
        ASSERT_LE(std::fabs(got - x), best + slack) << name(f) << " block " << blk_i << " element " << i;
        ++checked;
      }
    }
    EXPECT_GT(checked, rows * k * 9 / 10) << name(f);
  }
}

TEST(KQuantQuantize, ScalesUseTheirFullRange) {
  // ggml's scale quantization maps the largest sub-block scale (and min) of a
  // super-block to the top code: 63 (q4_K, q5_K), 15 (q2_K), -128 (q6_K, d
  // negative: d = max / -128), -32 (q3_K); the fp16 d is then that scale divided
  // by the top code, so d * top is within fp16 rounding of the largest fit.
  std::mt19937 rng(33);
  for (KQuant f : kAll) {
    const BitMap b = bit_map(f);
    const int64_t rows = 4, k = 1024;
    std::vector<float> w = bell_rows(rows, k, rng, 0.7f);
    for (int64_t i = 0; i < rows * k; ++i) w[size_t(i)] += 0.2f;  // positive mins needed for q4_K, q5_K, q2_K
    const std::vector<uint8_t> q = quantize(f, rows, k, w);
    for (int64_t n = 0; n < rows * k / 256; ++n) {
      const Decoded o = decode(b, q.data() + n * b.bytes);
      const int* sc = o.sc;
      const int top = f == KQuant::q2_K ? 15 : f == KQuant::q6_K ? -128 : f == KQuant::q3_K ? -32 : 63;
      EXPECT_TRUE(std::count(sc, sc + b.sub_blocks, top) >= 1) << name(f) << " block " << n;
      if (b.mins) {
        EXPECT_TRUE(std::count(o.m, o.m + b.sub_blocks, top) >= 1) << name(f) << " block " << n;
      }
      EXPECT_TRUE(std::isfinite(o.d) && o.d != 0) << name(f);
    }
  }
}

TEST(KQuantQuantize, ZeroAndTinyBlocksDecodeToZero) {
  for (KQuant f : kAll) {
    std::vector<float> w(512, 0.0f);
    for (int i = 256; i < 512; ++i)
      w[size_t(i)] = (i % 2 ? 1e-22f : -1e-22f);  // below ggml's GROUP_MAX_EPS scales
    const std::vector<uint8_t> q = quantize(f, 1, 512, w);
    for (int64_t i = 0; i < 512; ++i)
      EXPECT_EQ(fm::kquant_weight(f, q.data(), i) + 0.0, 0.0) << name(f) << " element " << i;
    if (f == KQuant::q6_K) {
      for (int i = 0; i < 210; ++i) EXPECT_EQ(q[size_t(i)], 0) << "q6_K zero block is all zero bytes";
    }
  }
}

TEST(KQuantQuantize, RowsAndBlocksAreIndependentAndSizesExact) {
  std::mt19937 rng(34);
  for (KQuant f : kAll) {
    const int64_t rows = 3, k = 768, rb = fm::kquant_row_bytes(f, k), bb = fm::kquant_traits(f).block_bytes;
    const std::vector<float> w = bell_rows(rows, k, rng, 2.0f);
    std::vector<uint8_t> all(size_t(rows * rb) + 64, 0xA5);
    ASSERT_TRUE(fm::kquant_quantize(f, rows, k, w.data(), all.data()).ok);
    for (size_t i = size_t(rows * rb); i < all.size(); ++i)
      ASSERT_EQ(all[i], 0xA5) << name(f) << ": wrote past the rows";
    for (int64_t blk = 0; blk < rows * k / 256; ++blk) {
      std::vector<uint8_t> one(static_cast<size_t>(bb));
      const std::vector<float> part(w.begin() + blk * 256, w.begin() + (blk + 1) * 256);
      ASSERT_TRUE(fm::kquant_quantize(f, 1, 256, part.data(), one.data()).ok);
      EXPECT_EQ(0, std::memcmp(one.data(), all.data() + blk * bb, size_t(bb))) << name(f) << " block " << blk;
    }
  }
}

TEST(KQuantQuantize, NonFiniteInputsAreDefined) {
  // ggml's arithmetic on NaN / inf is not promised to match, but ours is defined:
  // the same bytes each time, other super-blocks untouched, the count reported.
  std::mt19937 rng(35);
  for (KQuant f : kAll) {
    std::vector<float> w = bell_rows(1, 1024, rng, 1.0f);
    w[3] = NAN, w[300] = INFINITY, w[301] = -INFINITY;
    for (int i = 512; i < 768; ++i) w[size_t(i)] = NAN;
    const std::vector<uint8_t> a = quantize(f, 1, 1024, w), b = quantize(f, 1, 1024, w);
    EXPECT_EQ(a, b) << name(f);
    std::vector<uint8_t> out(a.size());
    EXPECT_EQ(fm::kquant_quantize(f, 1, 1024, w.data(), out.data()).nonfinite, 259) << name(f);
    const int64_t bb = fm::kquant_traits(f).block_bytes;
    const std::vector<float> last(w.begin() + 768, w.end());
    const std::vector<uint8_t> alone = quantize(f, 1, 256, last);
    EXPECT_EQ(0, std::memcmp(alone.data(), a.data() + 3 * bb, size_t(bb))) << name(f);
  }
}

TEST(KQuantQuantize, RejectsBadArguments) {
  std::vector<float> w(512, 1.0f);
  std::vector<uint8_t> out(512, 0xA5);
  const auto rejected = [&](KQuant f, int64_t rows, int64_t k, const float* src, void* dst) {
    const fm::QuantResult r = fm::kquant_quantize(f, rows, k, src, dst);
    return !r.ok && r.error && *r.error;
  };
  EXPECT_TRUE(rejected(KQuant(8), 1, 256, w.data(), out.data()));
  EXPECT_TRUE(rejected(KQuant(14), 1, 256, w.data(), out.data()));
  EXPECT_TRUE(rejected(KQuant::q4_K, 0, 256, w.data(), out.data()));
  EXPECT_TRUE(rejected(KQuant::q4_K, 1, 128, w.data(), out.data()));
  EXPECT_TRUE(rejected(KQuant::q4_K, 1, 300, w.data(), out.data()));
  EXPECT_TRUE(rejected(KQuant::q6_K, 1, 256, nullptr, out.data()));
  EXPECT_TRUE(rejected(KQuant::q6_K, 1, 256, w.data(), nullptr));
  for (uint8_t c : out) ASSERT_EQ(c, 0xA5) << "a rejected call wrote";
}
