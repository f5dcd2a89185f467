#include "formats/formats.h"

#include <cmath>
#include <cstring>

namespace moejit::formats {

const char* format_name(Format f) {
  switch (f) {
    case Format::bf16: return "bf16";
    case Format::nvfp4: return "nvfp4";
    case Format::mxfp4: return "mxfp4";
    case Format::ds_fp4: return "ds_fp4";
    case Format::q4_0: return "q4_0";
    case Format::fp8_block: return "fp8_block";
    case Format::q8_0: return "q8_0";
    case Format::mxfp8_e4m3: return "mxfp8_e4m3";
    case Format::mxfp8_e5m2: return "mxfp8_e5m2";
  }
  return "unknown";
}

static float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float bf16_to_f32(uint16_t v) { return bits_to_f32(uint32_t(v) << 16); }

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN, sign kept
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

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
  const int exp = (b >> 3) & 0xF;
  const int man = b & 0x7;
  const float mag = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(8 + man), exp - 10);
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

bool has_block_scales(Format f) {
  return f == Format::nvfp4 || f == Format::mxfp4 || f == Format::ds_fp4 || f == Format::fp8_block ||
         f == Format::mxfp8_e4m3 || f == Format::mxfp8_e5m2;
}

bool has_row_scales(Format f) { return f == Format::nvfp4; }

int32_t default_group(Format f, int32_t group_size) {
  switch (f) {
    case Format::bf16: return 0;
    case Format::nvfp4: return 16;
    case Format::mxfp4:
    case Format::ds_fp4:
    case Format::q4_0:
    case Format::q8_0: return 32;
    case Format::fp8_block: return 128;
    case Format::mxfp8_e4m3:
    case Format::mxfp8_e5m2: return group_size == 0 ? 32 : group_size;
  }
  return 0;
}

bool k_is_valid(Format f, int32_t group, int64_t k, const char** why) {
  if (k < 1) {
    *why = "must be >= 1";
    return false;
  }
  switch (f) {
    case Format::bf16:
    case Format::fp8_block: return true;
    case Format::nvfp4:
      if (k % 16) *why = "must be a multiple of 16 for nvfp4";
      return k % 16 == 0;
    default:
      if (k % group) {
        *why = group == 128  ? "must be a multiple of the group size 128"
               : group == 64 ? "must be a multiple of the group size 64"
                             : "must be a multiple of 32 for this format";
        return false;
      }
      return true;
  }
}

int64_t row_bytes(Format f, int64_t k) {
  switch (f) {
    case Format::bf16: return 2 * k;
    case Format::nvfp4:
    case Format::mxfp4:
    case Format::ds_fp4: return k / 2;
    case Format::q4_0: return k / 32 * 18;
    case Format::q8_0: return k / 32 * 34;
    case Format::fp8_block:
    case Format::mxfp8_e4m3:
    case Format::mxfp8_e5m2: return k;
  }
  return 0;
}

int64_t scale_cols(Format f, int32_t group, int64_t k) {
  if (!has_block_scales(f)) return 0;
  return (k + group - 1) / group;
}

int64_t scale_rows(Format f, int64_t rows) {
  if (!has_block_scales(f)) return 0;
  return f == Format::fp8_block ? (rows + 127) / 128 : rows;
}

int64_t scale_row_of(Format f, int64_t row) { return f == Format::fp8_block ? row / 128 : row; }

int64_t scale_elem_bytes(Format f, ScaleDtype dt) {
  if (!has_block_scales(f)) return 0;
  if (f == Format::fp8_block) return dt == ScaleDtype::f32 ? 4 : 2;
  return 1;  // e4m3 (nvfp4) or e8m0 (mx*)
}

namespace {

struct BlockSource {
  const Layout& l;
  const MatrixRef& m;
  const uint8_t* row;  // weight bytes of the row

  // Element value without the block scale (exact in float: <= 11 significant bits).
  float code(int64_t k) const {
    switch (l.format) {
      case Format::bf16: return bf16_to_f32(uint16_t(row[2 * k] | row[2 * k + 1] << 8));
      case Format::nvfp4:
      case Format::mxfp4:
      case Format::ds_fp4: {
        const uint8_t byte = row[k / 2];
        return e2m1_to_f32((k & 1) ? byte >> 4 : byte & 0xF);
      }
      case Format::q4_0: {
        const uint8_t* blk = row + k / 32 * 18 + 2;
        const int j = int(k % 32);
        const int q = j < 16 ? (blk[j] & 0xF) : (blk[j - 16] >> 4);
        return float(q - 8);
      }
      case Format::q8_0: return float(int8_t(row[k / 32 * 34 + 2 + k % 32]));
      case Format::fp8_block:
      case Format::mxfp8_e4m3: return e4m3_to_f32(row[k]);
      case Format::mxfp8_e5m2: return e5m2_to_f32(row[k]);
    }
    return 0.0f;
  }
};

// Scale of block b of row r (the factor applied to the block's sum).
float block_scale(const Layout& l, const MatrixRef& m, int64_t r, int64_t b, const uint8_t* row) {
  const int64_t stride = m.scale_stride ? m.scale_stride : l.scale_stride;
  switch (l.format) {
    case Format::bf16: return 1.0f;
    case Format::q4_0: return fp16_to_f32(uint16_t(row[b * 18] | row[b * 18 + 1] << 8));
    case Format::q8_0: return fp16_to_f32(uint16_t(row[b * 34] | row[b * 34 + 1] << 8));
    case Format::fp8_block: {
      const int64_t idx = (r / 128) * stride + b;
      if (l.scale_dtype == ScaleDtype::f32) return static_cast<const float*>(m.scales)[idx];
      return bf16_to_f32(static_cast<const uint16_t*>(m.scales)[idx]);
    }
    case Format::nvfp4: return e4m3_to_f32(static_cast<const uint8_t*>(m.scales)[r * stride + b]);
    case Format::mxfp4:
    case Format::ds_fp4:
    case Format::mxfp8_e4m3:
    case Format::mxfp8_e5m2: return e8m0_to_f32(static_cast<const uint8_t*>(m.scales)[r * stride + b]);
  }
  return 0.0f;
}

int64_t block_len(const Layout& l) {
  switch (l.format) {
    case Format::bf16: return l.k;
    case Format::fp8_block: return 128;
    default: return l.group;
  }
}

}  // namespace

double weight(const Layout& l, const MatrixRef& m, int64_t r, int64_t k) {
  const uint8_t* row = static_cast<const uint8_t*>(m.data) + r * row_bytes(l.format, l.k);
  BlockSource src{l, m, row};
  double w = double(src.code(k)) * double(block_scale(l, m, r, k / block_len(l), row));
  if (has_row_scales(l.format)) w *= double(m.row_scales[r]);
  return w;
}

void gemv_scalar(const Layout& l, const MatrixRef& m, int64_t r0, int64_t n, const float* x, float* y) {
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
