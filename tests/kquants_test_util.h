// Shared by the K-quant test files: the per-bit decoder of a super-block,
// written from the layout table of formats.md / kquants.h (every field of a
// super-block as the list of the block's bits it is made of, values assembled
// bit by bit), fp16 from its fields in double, the weight formula, the
// reference GEMV's documented operation order re-implemented on the per-bit
// decode, a float64 row with sum(|d sc q x| + |dmin m x|), and test data.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "formats/kquants.h"
#include "rng.h"

namespace kquants_test {
namespace fm = moejit::formats;
using fm::KQuant;

inline constexpr KQuant kAll[] = {KQuant::q4_K, KQuant::q5_K, KQuant::q6_K, KQuant::q2_K, KQuant::q3_K};

inline std::string name(KQuant f) { return fm::kquant_name(f); }

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// IEEE half from its fields, in double.
inline double fp16_formula(uint16_t h) {
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

inline void add_bits(Field& f, int byte, int first_bit, int n) {
  for (int b = 0; b < n; ++b) f.bits.push_back(byte * 8 + first_bit + b);
}

inline Field fp16_at(int byte) {
  Field f;
  add_bits(f, byte, 0, 8);
  add_bits(f, byte + 1, 0, 8);
  return f;
}

// The layouts of kquants.h's header comment, field by field.
inline BitMap bit_map(KQuant f) {
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

inline int32_t value(const Field& f, const uint8_t* blk) {
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

inline Decoded decode(const BitMap& b, const uint8_t* blk) {
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
inline double weight_formula(const BitMap& b, const Decoded& o, int i) {
  const int j = i / b.sub_size;
  const double dq = o.d * o.sc[j] * o.q[i];
  return b.mins ? dq - o.dmin * o.m[j] : dq;
}

inline bool same_or_both_nan(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// ---------------------------------------------------------------- data

inline std::vector<uint8_t> random_blocks(KQuant f, int n, moejit_test::Rng& rng, bool finite_scales = true) {
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

inline void set_fp16(const Field& fld, uint8_t* blk, uint16_t h) {
  blk[fld.bits[0] / 8] = uint8_t(h);
  blk[fld.bits[8] / 8] = uint8_t(h >> 8);
}

// bf16 activations as fp32: normal values of several magnitudes, and some
// signed zeros and bf16 subnormals.
inline std::vector<float> bf16_x(int64_t k, moejit_test::Rng& rng) {
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
inline float documented_gemv_row(KQuant f, const uint8_t* row, int64_t k, const float* x) {
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
inline void float64_row(KQuant f, const uint8_t* row, int64_t k, const float* x, double* want, double* mag,
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
inline double gemv_bound(KQuant f, int64_t k, double mag, double max_scale) {
  const int64_t bl = fm::kquant_traits(f).sub_block_size;
  const double ops = double(bl + 2 * k / bl);
  return ops * std::ldexp(1.0, -24) * mag * 1.001 + ops * std::ldexp(1.0, -149) * max_scale;
}

}  // namespace kquants_test
