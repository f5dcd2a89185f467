#include "formats/formats.h"

#include <cmath>
#include <cstring>

#include "formats/kquants.h"

namespace moejit::formats {

const char* format_name(Format f) { return known_format(int32_t(f)) ? info(f).name : "unknown"; }

bool format_from_name(const char* name, Format* out) {
  for (int32_t f = 0; f <= kMaxFormatId; ++f) {
    if (std::strcmp(name, info(Format(f)).name) == 0) {
      *out = Format(f);
      return true;
    }
  }
  return false;
}

Format kernel_format(Format f) { return info(f).kernel; }

static float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float fp16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0) {
    const float mag = std::ldexp(float(man), -24);  // exact: 10 bits
    return sign ? -mag : mag;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7F800000u | (man << 13) | (man ? 0x400000u : 0u));
  return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

float e4m3_to_f32(uint8_t b) {
  const uint32_t exp = (b >> 3) & 0xFu;
  const uint32_t man = b & 0x7u;
  // Subnormal: man * 2^-9 (exact). Normal: (8 + man) * 2^(exp - 10), i.e. fp32
  // exponent exp + 120 with the 3 mantissa bits on top (0x7F gives 480).
  const float mag = exp == 0 ? float(man) * 0x1p-9f : bits_to_f32((exp + 120u) << 23 | man << 20);
  return (b & 0x80) ? -mag : mag;
}

float e5m2_to_f32(uint8_t b) { return fp16_to_f32(uint16_t(b) << 8); }

float e2m1_to_f32(uint8_t code) {
  static const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float mag = kMag[code & 7];
  return (code & 8) ? -mag : mag;
}

float e8m0_to_f32(uint8_t s) {
  if (s == 255) return std::nanf("");
  return std::ldexp(1.0f, int(s) - 127);
}

uint8_t f32_to_e4m3_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  u &= 0x7FFFFFFFu;
  if (u > 0x7F800000u) return uint8_t(sign | 0x7Fu);             // NaN
  if (u >= 0x43E00000u) return uint8_t(sign | 0x7Eu);            // >= 448, inf: saturate
  if (u >= 0x3C800000u) {                                        // >= 2^-6: normal, 3 mantissa bits kept
    const uint32_t r = (u + 0x7FFFFu + ((u >> 20) & 1u)) >> 20;  // fp32 exponent and 3 bits, rounded
    return uint8_t(sign | (r - (120u << 3)));                    // rebias 127 -> 7
  }
  // Subnormal range: code = rne(|f| * 2^9) in 0..8 (8 is the smallest normal, 2^-6).
  const uint32_t e = u >> 23;
  const uint32_t mant = (u & 0x7FFFFFu) | (e ? 0x800000u : 0u);  // |f| = mant * 2^(max(e, 1) - 150)
  const uint32_t shift = 141u - (e ? e : 1u);                    // |f| * 2^9 = mant >> shift
  if (shift > 25) return sign;                                   // below 2^-11: rounds to zero
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return uint8_t(sign | q);
}

float e4m3_round(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = u & 0x80000000u, a = u & 0x7FFFFFFFu;
  // >= 2^-6: normal e4m3, 3 mantissa bits kept (as f32_to_e4m3_rne, without the rebias).
  const uint32_t normal = (a + 0x7FFFFu + ((a >> 20) & 1u)) & 0xFFF00000u;
  // Below: q = rne(|f| * 2^9) in 0..8, the value q * 2^-9. Every step is exact
  // and none depends on MXCSR: the scaling by 2^9 (a subnormal |f| that DAZ
  // reads as 0 gives q = 0 either way), truncation, the remainder (Sterbenz),
  // comparisons. The clamp keeps the conversion in range for the large inputs
  // whose result is not used (and NaN, whose comparison is false).
  float af;
  std::memcpy(&af, &a, 4);
  float v = af * 512.0f;
  v = v < 16.0f ? v : 16.0f;
  const int32_t t = int32_t(v);
  const float rem = v - float(t);
  const int32_t q = t + int32_t(rem > 0.5f) + (int32_t(rem == 0.5f) & t & 1);
  const float sub_f = float(q) * 0x1p-9f;
  uint32_t sub;
  std::memcpy(&sub, &sub_f, 4);
  uint32_t r = a >= 0x3C800000u ? normal : sub;
  r = a >= 0x43E00000u ? 0x43E00000u : r;  // 448 and beyond, inf: saturate
  const uint32_t out = sign | r;
  float o;
  std::memcpy(&o, &out, 4);
  return o;
}

float ds_act_scale(float amax) {
  // The smallest n with 448 * 2^n >= max(amax, 1e-4). amax / 448 is exact or far
  // (relatively >= 2^-8) from a power of two for bf16 amax, so double division
  // decides the ceiling exactly; 1e-4 lies in (448 * 2^-23, 448 * 2^-22).
  if (!(amax >= 1e-4f)) return std::ldexp(1.0f, -22);
  int e;
  const double m = std::frexp(double(amax) / 448.0, &e);  // amax / 448 = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, m == 0.5 ? e - 1 : e);
}

void ds_act_roundtrip(const uint16_t* src, int64_t n, uint16_t* dst) {
  for (int64_t b0 = 0; b0 < n; b0 += kDsActBlock) {
    const int64_t b1 = b0 + kDsActBlock < n ? b0 + kDsActBlock : n;
    uint16_t amax = 0;  // largest |bf16| bits: orders magnitudes, NaN above inf
    for (int64_t i = b0; i < b1; ++i) {
      const uint16_t a = uint16_t(src[i] & 0x7FFFu);
      amax = a > amax ? a : amax;
    }
    if (amax >= 0x7F80u) {  // NaN or inf: s is NaN or inf, every element NaN
      for (int64_t i = b0; i < b1; ++i) dst[i] = 0x7FC0u;
      continue;
    }
    const float s = ds_act_scale(bf16_to_f32(amax));
    const float inv = 1.0f / s;  // exact: s is a power of two in [2^-22, 2^120]
    for (int64_t i = b0; i < b1; ++i) {
      // Exact unless far below e4m3's range (then it rounds to +-0); e4m3_round clamps to +-448.
      const float q = bf16_to_f32(src[i]) * inv;
      // e4m3 (<= 4 significant bits) times a power of two: exact in fp32 and bf16; it
      // overflows to inf (as the exact value does in bf16) only for a block max >= 1.9375 * 2^127.
      dst[i] = f32_to_bf16(e4m3_round(q) * s);
    }
  }
}

bool has_block_scales(Format f) { return info(f).scale_code != ScaleCode::none; }

bool has_row_scales(Format f) { return info(f).row_globals; }

int32_t default_group(Format f, int32_t group_size) {
  const FormatInfo& fi = info(f);
  return fi.api_groups && group_size != 0 ? group_size : fi.group;
}

bool k_is_valid(Format f, int32_t group, int64_t k, const char** why) {
  if (k < 1) {
    *why = "must be >= 1";
    return false;
  }
  const FormatInfo& fi = info(f);
  if (fi.any_k || k % group == 0) return true;
  // A group the descriptor picked is named as such.
  *why = group == fi.group ? fi.k_rule
         : group == 128    ? "must be a multiple of the group size 128"
                           : "must be a multiple of the group size 64";
  return false;
}

int64_t row_bytes(Format f, int64_t k) {
  const FormatInfo& fi = info(f);
  return k / fi.block_elems * fi.block_bytes;
}

int64_t scale_cols(Format f, int32_t group, int64_t k) {
  if (!has_block_scales(f)) return 0;
  return (k + group - 1) / group;
}

int64_t scale_rows(Format f, int64_t rows) {
  switch (info(f).scales) {
    case ScaleKind::row_groups: return rows;
    case ScaleKind::tile_128: return (rows + 127) / 128;
    default: return 0;
  }
}

int64_t scale_row_of(Format f, int64_t row) {
  return info(f).scales == ScaleKind::tile_128 ? row / 128 : row;
}

int64_t scale_elem_bytes(Format f, ScaleDtype dt) {
  switch (info(f).scale_code) {
    case ScaleCode::none: return 0;
    case ScaleCode::bf16_f32: return dt == ScaleDtype::f32 ? 4 : 2;
    default: return 1;  // e4m3 or e8m0
  }
}

namespace {

struct BlockSource {
  const Layout& l;
  const MatrixRef& m;
  const uint8_t* row;  // weight bytes of the row

  // Element value without the block scale (exact in float: <= 11 significant bits).
  float code(int64_t k) const {
    const FormatInfo& fi = info(l.format);
    switch (fi.element) {
      case Element::bf16: return bf16_to_f32(uint16_t(row[2 * k] | row[2 * k + 1] << 8));
      case Element::e2m1: {
        const uint8_t byte = row[k / 2];
        return e2m1_to_f32((k & 1) ? byte >> 4 : byte & 0xF);
      }
      case Element::q4_0: {
        const uint8_t* blk = row + k / 32 * fi.block_bytes + 2;
        const int j = int(k % 32);
        const int q = j < 16 ? (blk[j] & 0xF) : (blk[j - 16] >> 4);
        return float(q - 8);
      }
      case Element::int8: return float(int8_t(row[k / 32 * fi.block_bytes + 2 + k % 32]));
      case Element::e4m3: return e4m3_to_f32(row[k]);
      case Element::e5m2: return e5m2_to_f32(row[k]);
      case Element::kquant: break;  // formats/kquants.cpp decodes them (weight, gemv_scalar)
    }
    return 0.0f;
  }
};

// Scale of block b of row r (the factor applied to the block's sum).
float block_scale(const Layout& l, const MatrixRef& m, int64_t r, int64_t b, const uint8_t* row) {
  const FormatInfo& fi = info(l.format);
  const int64_t stride = m.scale_stride ? m.scale_stride : l.scale_stride;
  switch (fi.scales) {
    case ScaleKind::none: return 1.0f;
    case ScaleKind::inline_fp16: {
      const uint8_t* d = row + b * fi.block_bytes;
      return fp16_to_f32(uint16_t(d[0] | d[1] << 8));
    }
    case ScaleKind::tile_128: {
      const int64_t idx = (r / 128) * stride + b;
      if (l.scale_dtype == ScaleDtype::f32) return static_cast<const float*>(m.scales)[idx];
      return bf16_to_f32(static_cast<const uint16_t*>(m.scales)[idx]);
    }
    case ScaleKind::row_groups: {
      const uint8_t s = static_cast<const uint8_t*>(m.scales)[r * stride + b];
      return fi.scale_code == ScaleCode::e4m3 ? e4m3_to_f32(s) : e8m0_to_f32(s);
    }
    case ScaleKind::inline_super: break;  // formats/kquants.cpp
  }
  return 0.0f;
}

int64_t block_len(const Layout& l) {
  switch (info(l.format).scales) {
    case ScaleKind::none: return l.k;
    case ScaleKind::tile_128: return 128;
    default: return l.group;
  }
}

}  // namespace

double weight(const Layout& l, const MatrixRef& m, int64_t r, int64_t k) {
  if (is_kquant(l.format)) return kquant_weight(KQuant(int32_t(l.format)), m.data, l.k, r, k);
  const uint8_t* row = static_cast<const uint8_t*>(m.data) + r * row_bytes(l.format, l.k);
  BlockSource src{l, m, row};
  double w = double(src.code(k)) * double(block_scale(l, m, r, k / block_len(l), row));
  if (has_row_scales(l.format)) w *= double(m.row_scales[r]);
  return w;
}

void gemv_scalar(const Layout& l, const MatrixRef& m, int64_t r0, int64_t n, const float* x, float* y) {
  if (is_kquant(l.format)) {  // the reference GEMV of kquants.h, its sums of x computed per call
    const KQuant f = KQuant(int32_t(l.format));
    kquant_gemv(f, static_cast<const uint8_t*>(m.data) + r0 * row_bytes(l.format, l.k), l.k, n, x, y);
    return;
  }
  const int64_t bl = block_len(l);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = r0 + i;
    const uint8_t* row = static_cast<const uint8_t*>(m.data) + r * row_bytes(l.format, l.k);
    BlockSource src{l, m, row};
    float acc = 0.0f;
    for (int64_t k0 = 0, b = 0; k0 < l.k; k0 += bl, ++b) {
      const int64_t k1 = k0 + bl < l.k ? k0 + bl : l.k;
      float part = 0.0f;
      for (int64_t k = k0; k < k1; ++k) part = std::fma(src.code(k), x[k], part);
      acc = std::fma(part, block_scale(l, m, r, b, row), acc);
    }
    if (has_row_scales(l.format)) acc *= m.row_scales[r];
    y[i] = acc;
  }
}

}  // namespace moejit::formats
