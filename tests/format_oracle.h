// The tests' one per-format oracle: sizes, element codes and exact weights
// written out from docs/FORMATS.md (formats.md), independently of formats/ (it
// reads no table row and calls no decoder of the library), so a wrong row or
// decoder in the library cannot agree with it by construction. The fuzz
// harnesses and the test suites read weights through it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats/format_table.h"

namespace moejit_test::oracle {

using moejit::formats::Format;
using moejit::formats::ScaleDtype;

// value = (-1)^sign * mant * 2^exp as double.
inline double make(bool neg, double mant, int exp) { return (neg ? -1.0 : 1.0) * std::ldexp(mant, exp); }

inline double bf16(uint16_t v) {
  const int e = (v >> 7) & 0xFF, m = v & 0x7F;
  const bool neg = v & 0x8000;
  if (e == 0xFF) return m ? NAN : (neg ? -INFINITY : INFINITY);
  if (e == 0) return make(neg, m, -133);
  return make(neg, 128 + m, e - 134);
}
inline double fp16(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const bool neg = h & 0x8000;
  if (e == 31) return m ? NAN : (neg ? -INFINITY : INFINITY);
  if (e == 0) return make(neg, m, -24);
  return make(neg, 1024 + m, e - 25);
}
inline double e4m3(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  const bool neg = b & 0x80;
  if (e == 0) return make(neg, m, -9);
  return make(neg, 8 + m, e - 10);  // 0x7F: 15 * 2^5 = 480 (no NaN, no inf)
}
inline double e5m2(uint8_t b) { return fp16(uint16_t(b) << 8); }
inline double e2m1(uint8_t c) {
  static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double m = kMag[c & 7];
  return (c & 8) ? -m : m;
}
inline double e8m0(uint8_t s) { return s == 255 ? NAN : std::ldexp(1.0, int(s) - 127); }

// Weight bytes of one row of K elements.
inline int64_t row_bytes(Format f, int64_t k) {
  switch (f) {
    case Format::bf16: return 2 * k;
    case Format::nvfp4:
    case Format::mxfp4:
    case Format::ds_fp4: return k / 2;
    case Format::q4_0: return k / 32 * 18;
    case Format::q8_0: return k / 32 * 34;
    case Format::q4_K: return k / 256 * 144;  // GGUF super-blocks of 256 (formats.md)
    case Format::q5_K: return k / 256 * 176;
    case Format::q6_K: return k / 256 * 210;
    case Format::q2_K: return k / 256 * 84;
    case Format::q3_K: return k / 256 * 110;
    default: return k;
  }
}

// The element code of (row, k) as an integer: bf16 bits, the 4-bit code, q4_0's
// unsigned nibble, q8_0's int8, or the 8-bit float's byte.
inline int code_at(Format f, const uint8_t* row, int64_t k) {
  switch (f) {
    case Format::bf16: return row[2 * k] | row[2 * k + 1] << 8;
    case Format::nvfp4:
    case Format::mxfp4:
    case Format::ds_fp4: return (k & 1) ? row[k / 2] >> 4 : row[k / 2] & 15;  // low nibble = even k
    case Format::q4_0: {
      const uint8_t* qs = row + k / 32 * 18 + 2;  // fp16 d, then 16 bytes: j low nibbles, j + 16 high
      return k % 32 < 16 ? qs[k % 32] & 15 : qs[k % 32 - 16] >> 4;
    }
    case Format::q8_0: return int8_t(row[k / 32 * 34 + 2 + k % 32]);
    default: return row[k];
  }
}

inline void set_code(Format f, uint8_t* row, int64_t k, int c) {
  switch (f) {
    case Format::bf16: row[2 * k] = uint8_t(c), row[2 * k + 1] = uint8_t(c >> 8); break;
    case Format::nvfp4:
    case Format::mxfp4:
    case Format::ds_fp4:
      row[k / 2] = (k & 1) ? uint8_t((row[k / 2] & 15) | c << 4) : uint8_t((row[k / 2] & 0xF0) | c);
      break;
    case Format::q4_0: {
      uint8_t* qs = row + k / 32 * 18 + 2;
      const int j = int(k % 32);
      if (j < 16)
        qs[j] = uint8_t((qs[j] & 0xF0) | c);
      else
        qs[j - 16] = uint8_t((qs[j - 16] & 15) | c << 4);
      break;
    }
    case Format::q8_0: row[k / 32 * 34 + 2 + k % 32] = uint8_t(int8_t(c)); break;
    default: row[k] = uint8_t(c);
  }
}

// The fp16 d bits of the GGUF block holding element k of a q4_0 / q8_0 row.
inline uint16_t gguf_d(Format f, const uint8_t* row, int64_t k) {
  const uint8_t* p = row + k / 32 * (f == Format::q4_0 ? 18 : 34);
  return uint16_t(p[0] | p[1] << 8);
}

// One [rows, K] matrix's bytes as an engine holds them.
struct Matrix {
  Format format = Format::bf16;
  ScaleDtype scale_dtype = ScaleDtype::bf16;
  int32_t group = 0;  // mxfp8's group (32, 64, 128); the others' are fixed
  int64_t k = 0;
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;  // scale tensor bytes
  int64_t scale_stride = 0;         // scale elements between scale rows (resolved, never 0 when scaled)
  const float* row_scales = nullptr;
};

// Weight (r, k) as its three factors: the element value, the block scale and
// (nvfp4) the per-row scale.
struct Parts {
  double code = 0, bscale = 1, rscale = 1;
  double weight() const { return code * bscale * rscale; }  // exact in double
};

inline Parts parts(const Matrix& m, int64_t r, int64_t k) {
  const uint8_t* row = m.data + r * oracle::row_bytes(m.format, m.k);  // not formats::row_bytes (ADL)
  const int64_t stride = m.scale_stride;
  auto e8m0_scale = [&](int64_t g) { return e8m0(m.scales[size_t(r * stride + k / g)]); };
  Parts p;
  const int c = code_at(m.format, row, k);
  switch (m.format) {
    case Format::bf16: p.code = bf16(uint16_t(c)); break;
    case Format::nvfp4:
      p.code = e2m1(uint8_t(c));
      p.bscale = e4m3(m.scales[size_t(r * stride + k / 16)]);
      p.rscale = double(m.row_scales[size_t(r)]);
      break;
    case Format::mxfp4:
    case Format::ds_fp4:
      p.code = e2m1(uint8_t(c));
      p.bscale = e8m0_scale(32);
      break;
    case Format::q4_0:
      p.code = c - 8;
      p.bscale = fp16(gguf_d(m.format, row, k));
      break;
    case Format::q8_0:
      p.code = c;
      p.bscale = fp16(gguf_d(m.format, row, k));
      break;
    case Format::fp8_block: {
      const size_t idx = size_t((r / 128) * stride + k / 128);
      if (m.scale_dtype == ScaleDtype::f32) {
        float v;
        std::memcpy(&v, m.scales + 4 * idx, 4);
        p.bscale = v;
      } else {
        p.bscale = bf16(uint16_t(m.scales[2 * idx] | m.scales[2 * idx + 1] << 8));
      }
      p.code = e4m3(uint8_t(c));
      break;
    }
    case Format::mxfp8_e4m3:
      p.code = e4m3(uint8_t(c));
      p.bscale = e8m0_scale(m.group);
      break;
    case Format::mxfp8_e5m2:
      p.code = e5m2(uint8_t(c));
      p.bscale = e8m0_scale(m.group);
      break;
    case Format::q4_K:
    case Format::q5_K:
    case Format::q6_K:
    case Format::q2_K:
    case Format::q3_K: break;  // the K-quants' oracle is tests/kquants_test_util.h (per-bit decode)
  }
  return p;
}

inline double weight(const Matrix& m, int64_t r, int64_t k) { return parts(m, r, k).weight(); }

// Elements per scale block (the unit whose products are summed before the scale).
inline int64_t block_elems(Format f, int32_t group, int64_t k) {
  switch (f) {
    case Format::bf16: return k;
    case Format::fp8_block: return 128;
    case Format::nvfp4: return 16;
    case Format::mxfp8_e4m3:
    case Format::mxfp8_e5m2: return group;
    default: return 32;
  }
}

}  // namespace moejit_test::oracle
