// fp32 -> every weight format (formats.md), written from the format definitions:
// RNE minifloat encoding, the OCP MX shared-exponent rule, the amax/448 block
// rule of fp8_block, the two-level nvfp4 scale, and ggml's reference q4_0 /
// q8_0 block arithmetic (fp32 operations in the same order, so the bytes equal
// gguf-py's for every finite input). Built with -ffp-contract=off (CMake): no
// fused multiply-add may change an fp32 rounding.
#include "formats/quantize.h"

#include <cfloat>
#include <cmath>
#include <cstring>

#include "formats/kquants.h"

namespace moejit::formats {

namespace {

// Magnitude bits (exponent field << man_bits | mantissa) of a >= 0 (finite)
// rounded to nearest, ties to even, in a binary format with `man_bits` stored
// mantissa bits, exponent `bias` and subnormals. Sets *over (and returns 0)
// when the rounded value exceeds max_finite.
uint32_t rne_magnitude(double a, int man_bits, int bias, double max_finite, bool* over) {
  *over = false;
  const int emin = 1 - bias;  // exponent of the smallest normal
  int e = emin;
  if (a >= std::ldexp(1.0, emin)) {
    std::frexp(a, &e);  // a in [2^(e-1), 2^e)
    e -= 1;
  }
  const double quantum = std::ldexp(1.0, e - man_bits);  // spacing of the format around a
  const double t = a / quantum;  // exact: scaling by a power of two, t < 2^(man_bits+1)
  double n = std::floor(t);
  const double frac = t - n;  // exact
  if (frac > 0.5 || (frac == 0.5 && std::fmod(n, 2.0) != 0.0)) n += 1.0;
  const double r = n * quantum;  // exact
  if (r > max_finite) {
    *over = true;
    return 0;
  }
  if (r < std::ldexp(1.0, emin)) return uint32_t(n);  // subnormal (or zero): exponent field 0
  int er;
  std::frexp(r, &er);
  er -= 1;
  const uint32_t mant = uint32_t(std::ldexp(r, man_bits - er)) - (1u << man_bits);
  return uint32_t(er + bias) << man_bits | mant;
}

// NaN -> 0, +-inf -> +-FLT_MAX: the value an element type without NaN / inf
// codes encodes (zero, or saturation at any positive scale).
float finite_or_clamped(float x) {
  if (std::isnan(x)) return 0.0f;
  if (std::isinf(x)) return std::copysign(FLT_MAX, x);
  return x;
}

float abs_if_finite(float x) { return std::isfinite(x) ? std::fabs(x) : 0.0f; }

void put_u16_le(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v & 0xFF);
  p[1] = uint8_t(v >> 8);
}

}  // namespace

uint16_t f32_to_fp16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7E00;
  if (std::isinf(f)) return sign | 0x7C00;
  bool over;
  const uint32_t mag = rne_magnitude(std::fabs(double(f)), 10, 15, 65504.0, &over);
  return over ? uint16_t(sign | 0x7C00) : uint16_t(sign | mag);
}

uint8_t f64_to_e4m3(double v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  if (std::isnan(v)) return sign | 0x7F;
  if (std::isinf(v)) return sign | 0x7E;
  bool over;
  const uint32_t mag = rne_magnitude(std::fabs(v), 3, 7, 448.0, &over);
  return over ? uint8_t(sign | 0x7E) : uint8_t(sign | mag);
}

uint8_t f64_to_e5m2(double v, bool saturate) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  if (std::isnan(v)) return sign | 0x7E;
  if (std::isinf(v)) return sign | 0x7C;
  bool over;
  const uint32_t mag = rne_magnitude(std::fabs(v), 2, 15, 57344.0, &over);
  if (over) return sign | (saturate ? 0x7B : 0x7C);
  return uint8_t(sign | mag);
}

uint8_t f64_to_e2m1(double v) {
  if (std::isnan(v)) return 0;
  const uint8_t sign = std::signbit(v) ? 0x8 : 0;
  if (std::isinf(v)) return sign | 0x7;
  bool over;
  const uint32_t mag = rne_magnitude(std::fabs(v), 1, 1, 6.0, &over);
  return over ? uint8_t(sign | 0x7) : uint8_t(sign | mag);
}

uint8_t f32_to_e4m3(float f) { return f64_to_e4m3(double(f)); }
uint8_t f32_to_e5m2(float f, bool saturate) { return f64_to_e5m2(double(f), saturate); }
uint8_t f32_to_e2m1(float f) { return f64_to_e2m1(double(f)); }

uint8_t e8m0_mx_scale(float amax, int emax_elem) {
  if (!(amax > 0.0f)) return 0;  // zero block (NaN too): the smallest scale, 2^-127
  if (std::isinf(amax)) return 254;
  int e;
  std::frexp(amax, &e);  // amax in [2^(e-1), 2^e): floor(log2(amax)) = e - 1
  const int s = (e - 1) - emax_elem + 127;
  return uint8_t(s < 0 ? 0 : s > 254 ? 254 : s);
}

float nvfp4_global(float amax) {
  const float g = amax / 2688.0f;  // 6 (e2m1 max) * 448 (e4m3 max)
  return g >= FLT_MIN && std::isfinite(g) ? g : FLT_MIN;
}

namespace {

struct Ctx {
  const Layout& l;
  const float* w;
  const MatrixOut& out;
  int64_t stride;  // scale row stride in elements
  int64_t cols;    // scale columns
};

void quantize_bf16(const Ctx& c) {
  uint8_t* d = static_cast<uint8_t*>(c.out.data);
  for (int64_t i = 0; i < c.l.rows * c.l.k; ++i) put_u16_le(d + 2 * i, f32_to_bf16(c.w[i]));
}

void quantize_fp8_block(const Ctx& c) {
  const Layout& l = c.l;
  uint8_t* d = static_cast<uint8_t*>(c.out.data);
  const bool f32 = l.scale_dtype == ScaleDtype::f32;
  for (int64_t br = 0; br < scale_rows(l.format, l.rows); ++br)
    for (int64_t bc = 0; bc < c.cols; ++bc) {
      const int64_t r0 = br * 128, r1 = r0 + 128 < l.rows ? r0 + 128 : l.rows;
      const int64_t k0 = bc * 128, k1 = k0 + 128 < l.k ? k0 + 128 : l.k;
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t k = k0; k < k1; ++k) amax = std::fmax(amax, abs_if_finite(c.w[r * l.k + k]));
      // amax / 448 in fp32, then (bf16 scales) rounded to bf16 as an fp32 ->
      // bf16 conversion does. A zero block gets 1; an underflow the dtype's
      // smallest positive value.
      float s = 1.0f;
      if (amax > 0.0f) {
        s = amax / 448.0f;
        if (!f32) s = round_bf16(s);
        if (s == 0.0f) s = f32 ? std::ldexp(1.0f, -149) : std::ldexp(1.0f, -133);
      }
      const int64_t idx = br * c.stride + bc;
      if (f32) {
        std::memcpy(static_cast<uint8_t*>(c.out.scales) + idx * 4, &s, 4);
      } else {
        const uint16_t b = f32_to_bf16(s);
        std::memcpy(static_cast<uint8_t*>(c.out.scales) + idx * 2, &b, 2);
      }
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t k = k0; k < k1; ++k)
          d[r * l.k + k] = f64_to_e4m3(double(finite_or_clamped(c.w[r * l.k + k])) / double(s));
    }
}

// mxfp8_e4m3, mxfp8_e5m2, mxfp4, ds_fp4: e8m0 per group along K.
void quantize_mx(const Ctx& c) {
  const Layout& l = c.l;
  const int g = l.group;
  const Element el = info(l.format).element;
  const bool fp4 = el == Element::e2m1;
  const bool e5 = el == Element::e5m2;
  const int emax = fp4 ? kEmaxE2m1 : e5 ? kEmaxE5m2 : kEmaxE4m3;
  uint8_t* d = static_cast<uint8_t*>(c.out.data);
  uint8_t* sc = static_cast<uint8_t*>(c.out.scales);
  const int64_t rb = row_bytes(l.format, l.k);
  for (int64_t r = 0; r < l.rows; ++r) {
    const float* x = c.w + r * l.k;
    uint8_t* row = d + r * rb;
    for (int64_t b = 0; b < c.cols; ++b) {
      float amax = 0.0f;
      for (int64_t k = b * g; k < (b + 1) * g; ++k) amax = std::fmax(amax, abs_if_finite(x[k]));
      const uint8_t s = e8m0_mx_scale(amax, emax);
      sc[r * c.stride + b] = s;
      const double X = std::ldexp(1.0, int(s) - 127);
      for (int64_t k = b * g; k < (b + 1) * g; ++k) {
        if (fp4) {
          const uint8_t code = f64_to_e2m1(double(finite_or_clamped(x[k])) / X);
          row[k / 2] = (k & 1) ? uint8_t((row[k / 2] & 0x0F) | code << 4) : code;
        } else if (e5) {
          // NaN and inf keep their codes (a NaN is encoded before the division, keeping its sign)
          row[k] = f64_to_e5m2(std::isnan(x[k]) ? double(x[k]) : double(x[k]) / X, true);
        } else {
          row[k] = f64_to_e4m3(double(finite_or_clamped(x[k])) / X);
        }
      }
    }
  }
}

void quantize_nvfp4(const Ctx& c, bool tensor_global) {
  const Layout& l = c.l;
  uint8_t* d = static_cast<uint8_t*>(c.out.data);
  uint8_t* sc = static_cast<uint8_t*>(c.out.scales);
  float tensor_amax = 0.0f;
  if (tensor_global)
    for (int64_t i = 0; i < l.rows * l.k; ++i) tensor_amax = std::fmax(tensor_amax, abs_if_finite(c.w[i]));
  for (int64_t r = 0; r < l.rows; ++r) {
    const float* x = c.w + r * l.k;
    uint8_t* row = d + r * (l.k / 2);
    float amax = tensor_amax;
    if (!tensor_global)
      for (int64_t k = 0; k < l.k; ++k) amax = std::fmax(amax, abs_if_finite(x[k]));
    const float g = nvfp4_global(amax);
    c.out.row_scales[r] = g;
    for (int64_t b = 0; b < c.cols; ++b) {
      float bmax = 0.0f;
      for (int64_t k = b * 16; k < (b + 1) * 16; ++k) bmax = std::fmax(bmax, abs_if_finite(x[k]));
      const uint8_t s = f64_to_e4m3(double(bmax) / (6.0 * double(g)));  // <= 448 by the choice of g
      sc[r * c.stride + b] = s;
      const double S = double(e4m3_to_f32(s)) * double(g);  // exact
      for (int64_t k = b * 16; k < (b + 1) * 16; ++k) {
        const double v = double(finite_or_clamped(x[k]));
        const uint8_t code = f64_to_e2m1(S > 0 ? v / S : std::copysign(0.0, v));
        row[k / 2] = (k & 1) ? uint8_t((row[k / 2] & 0x0F) | code << 4) : code;
      }
    }
  }
}

// ggml's quantize_row_q8_0_ref: d = amax / 127 and q = roundf(x * (1/d)) in
// fp32, d stored as fp16. Clamps make non-finite intermediates (which the
// reference would convert to int8 with undefined behaviour) well defined.
void quantize_q8_0(const Ctx& c) {
  const Layout& l = c.l;
  uint8_t* d = static_cast<uint8_t*>(c.out.data);
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t b = 0; b < l.k / 32; ++b) {
      const float* x = c.w + r * l.k + b * 32;
      uint8_t* blk = d + (r * (l.k / 32) + b) * 34;
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) {
        const float v = abs_if_finite(x[j]);
        amax = amax > v ? amax : v;
      }
      const float dd = amax / 127.0f;
      const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
      put_u16_le(blk, f32_to_fp16(dd));
      for (int j = 0; j < 32; ++j) {
        const float x0 = finite_or_clamped(x[j]) * id;
        float q = std::isnan(x0) ? 0.0f : std::round(x0);  // half away from zero, like roundf
        q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
        blk[2 + j] = uint8_t(int8_t(q));
      }
    }
}

// ggml's quantize_row_q4_0_ref: d = max / -8 with max the signed element of
// largest magnitude (the first one on ties), q = min(15, trunc(x * (1/d) + 8.5))
// in fp32, d stored as fp16.
void quantize_q4_0(const Ctx& c) {
  const Layout& l = c.l;
  uint8_t* d = static_cast<uint8_t*>(c.out.data);
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t b = 0; b < l.k / 32; ++b) {
      const float* x = c.w + r * l.k + b * 32;
      uint8_t* blk = d + (r * (l.k / 32) + b) * 18;
      float amax = 0.0f, max = 0.0f;
      for (int j = 0; j < 32; ++j) {
        if (!std::isfinite(x[j])) continue;
        if (amax < std::fabs(x[j])) {
          amax = std::fabs(x[j]);
          max = x[j];
        }
      }
      const float dd = max / -8.0f;
      const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
      put_u16_le(blk, f32_to_fp16(dd));
      uint8_t q[32];
      for (int j = 0; j < 32; ++j) {
        const float x0 = finite_or_clamped(x[j]) * id;
        const float u = x0 + 8.5f;
        q[j] = std::isnan(u) ? 8 : u <= 0.0f ? 0 : u >= 15.0f ? 15 : uint8_t(u);  // uint8_t(u) truncates
      }
      for (int j = 0; j < 16; ++j) blk[2 + j] = uint8_t(q[j] | q[j + 16] << 4);
    }
}

// The group a layout must carry: the format's own, or one the descriptor may pick.
int32_t required_group(const Layout& l) {
  const FormatInfo& fi = info(l.format);
  if (fi.scales == ScaleKind::none || api_group_allowed(fi, l.group)) return l.group;
  return fi.group;
}

}  // namespace

QuantResult quantize(const Layout& l, const float* w, const MatrixOut& out, const QuantOptions& opt) {
  QuantResult res;
  if (int32_t(l.format) < 0 || int32_t(l.format) > kMaxFormatId) {
    res.error = "unknown format";
    return res;
  }
  const char* why = "";
  if (l.rows < 1) {
    res.error = "rows must be >= 1";
    return res;
  }
  if (l.group != required_group(l)) {
    res.error =
        "group is not the format's group (nvfp4 16; fp8_block 128; mxfp8 32/64/128; K-quants 256; others 32)";
    return res;
  }
  if (!k_is_valid(l.format, l.group, l.k, &why)) {
    res.error = why;
    return res;
  }
  if (!w || !out.data) {
    res.error = "null weight or data pointer";
    return res;
  }
  const int64_t cols = scale_cols(l.format, l.group, l.k);
  const int64_t stride = l.scale_stride ? l.scale_stride : cols;
  if (has_block_scales(l.format) && (!out.scales || stride < cols)) {
    res.error = out.scales ? "scale_stride is smaller than the scale columns" : "null scales pointer";
    return res;
  }
  if (has_row_scales(l.format) && !out.row_scales) {
    res.error = "null row_scales pointer (nvfp4)";
    return res;
  }
  for (int64_t i = 0; i < l.rows * l.k; ++i) res.nonfinite += !std::isfinite(w[i]);
  const Ctx c{l, w, out, stride, cols};
  switch (l.format) {
    case Format::bf16: quantize_bf16(c); break;
    case Format::nvfp4: quantize_nvfp4(c, opt.nvfp4_tensor_global); break;
    case Format::mxfp4:
    case Format::ds_fp4:
    case Format::mxfp8_e4m3:
    case Format::mxfp8_e5m2: quantize_mx(c); break;
    case Format::q4_0: quantize_q4_0(c); break;
    case Format::fp8_block: quantize_fp8_block(c); break;
    case Format::q8_0: quantize_q8_0(c); break;
    case Format::q4_K:
    case Format::q5_K:
    case Format::q6_K:
    case Format::q2_K:
    case Format::q3_K: return kquant_quantize(KQuant(int32_t(l.format)), l.rows, l.k, w, out.data);
  }
  res.ok = true;
  return res;
}

}  // namespace moejit::formats
