#include "numerics_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "formats/kquants.h"
#include "formats/quantize.h"

namespace moejit_test {

namespace {

constexpr uint16_t kBf16NaN = 0x7FC0;
constexpr uint32_t kF32NaN = 0x7FC00000u;

uint16_t random_bf16(Rng& rng, int emin, int emax) {
  if (rng.chance(0.05)) return 0;
  const double mag = std::ldexp(1.0 + rng.unit(), rng.uniform(emin, emax));
  return fm::f32_to_bf16(float(rng.chance(0.5) ? -mag : mag));
}

uint8_t exact_e4m3_code(Rng& rng) {
  if (rng.chance(0.125)) return rng.chance(0.5) ? 0x00 : 0x80;  // +0 and -0
  const int s = rng.uniform(0, 1), e = rng.uniform(4, 7), m = rng.uniform(0, 7);
  return uint8_t(s << 7 | e << 3 | m);
}

// Fill::quantized: random fp32 rows through formats/quantize into m's layout;
// scale padding poisoned like the other fills (NaN; e4m3 0xFF = -480).
void fill_quantized(Mat& m, int64_t pad, Rng& rng) {
  const fm::Format f = static_cast<fm::Format>(m.fmt);
  if (fm::has_block_scales(f)) {
    m.srows = fm::scale_rows(f, m.rows);
    m.scols = fm::scale_cols(f, m.layout().group, m.k);
    m.stride = m.scols + pad;
    m.api_stride = pad ? m.stride : 0;
    const fm::ScaleDtype dt = m.sdt == MOEJIT_DTYPE_F32 ? fm::ScaleDtype::f32 : fm::ScaleDtype::bf16;
    const size_t eb = size_t(fm::scale_elem_bytes(f, dt)), n = size_t(m.srows * m.stride);
    m.scales.assign(n * eb, 0xFF);
    for (size_t i = 0; i < n && eb > 1; ++i) {
      if (eb == 4)
        std::memcpy(&m.scales[i * 4], &kF32NaN, 4);
      else
        std::memcpy(&m.scales[i * 2], &kBf16NaN, 2);
    }
  }
  m.data.assign(size_t(m.rows * fm::row_bytes(f, m.k)), 0);
  if (fm::has_row_scales(f)) m.row_scales.assign(size_t(m.rows), 0.0f);
  std::vector<float> w(size_t(m.rows * m.k));
  for (int64_t r = 0; r < m.rows; ++r) {
    const double mag = std::ldexp(1.0, -rng.uniform(2, 6));
    for (int64_t k = 0; k < m.k; ++k) {
      const double gauss =
          std::sqrt(-2.0 * std::log(1.0 - rng.unit())) * std::cos(6.283185307179586 * rng.unit());
      double v = gauss * mag;
      if (rng.chance(0.01)) v *= 8;
      if (rng.chance(0.02)) v = 0;
      w[size_t(r * m.k + k)] = float(v);
    }
  }
  fm::MatrixOut o;
  o.data = m.data.data();
  o.scales = m.scales.empty() ? nullptr : m.scales.data();
  o.row_scales = m.row_scales.empty() ? nullptr : m.row_scales.data();
  const fm::QuantResult res = fm::quantize(m.layout(), w.data(), o);
  if (!res.ok) ADD_FAILURE() << "quantize " << fm::format_name(f) << ": " << res.error;
}

}  // namespace

double round_bf16(double v) {
  if (v == 0 || !std::isfinite(v)) return v;
  int e;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e)
  const double q = std::ldexp(1.0, std::max(e - 8, -133));
  const double r = std::nearbyint(v / q) * q;  // ties to even (default rounding mode)
  if (std::fabs(r) >= std::ldexp(1.0, 128)) return std::copysign(INFINITY, v);
  return r;
}

double bf16_quantum(double v) {
  if (v == 0) return std::ldexp(1.0, -133);
  int e;
  std::frexp(v, &e);
  return std::ldexp(1.0, std::max(e - 8, -133));
}

// ---------------------------------------------------------------- ds_fp4 activations

double ds_scale(double amax) {
  // amax / 448 is a power of two exactly or relatively >= 2^-8 away from one, so
  // log2 in double decides the ceiling exactly.
  return std::exp2(std::ceil(std::log2(std::max(amax, 1e-4) / 448.0)));
}

double e4m3_rne(double v) {
  if (v == 0 || std::isnan(v)) return v;
  int e;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e): 3 mantissa bits; subnormal spacing 2^-9
  const double q = std::ldexp(1.0, std::max(e - 4, -9));
  return std::nearbyint(v / q) * q;  // ties to even (default rounding mode)
}

double ds_quantize(double v, double s) {
  return round_bf16(e4m3_rne(std::min(448.0, std::max(-448.0, v / s))) * s);
}

std::vector<double> ds_roundtrip(const double* v, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t b0 = 0; b0 < n; b0 += 128) {
    const int64_t b1 = std::min<int64_t>(n, b0 + 128);
    double amax = 0;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(v[i]));
    const double s = ds_scale(amax);
    for (int64_t i = b0; i < b1; ++i) out[size_t(i)] = ds_quantize(v[i], s);
  }
  return out;
}

// ---------------------------------------------------------------- Mat

moejit_matrix Mat::api() const {
  moejit_matrix m;
  std::memset(&m, 0, sizeof(m));
  m.data = data.data();
  m.scales = scales.empty() ? nullptr : scales.data();
  m.scale_row_stride = api_stride;
  m.row_scales = row_scales.empty() ? nullptr : row_scales.data();
  m.bias = bias.empty() ? nullptr : bias.data();
  return m;
}

fm::Layout Mat::layout() const {
  fm::Layout l;
  l.format = static_cast<fm::Format>(fmt);
  l.scale_dtype = sdt == MOEJIT_DTYPE_F32 ? fm::ScaleDtype::f32 : fm::ScaleDtype::bf16;
  l.group = fm::default_group(l.format, group);
  l.rows = rows;
  l.k = k;
  l.scale_stride = stride;
  return l;
}

fm::MatrixRef Mat::ref() const {
  fm::MatrixRef r;
  r.data = data.data();
  r.scales = scales.empty() ? nullptr : scales.data();
  r.row_scales = row_scales.empty() ? nullptr : row_scales.data();
  return r;
}

std::vector<double> Mat::dequant() const {
  const fm::Layout l = layout();
  const fm::MatrixRef m = ref();
  std::vector<double> out(size_t(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c) out[size_t(r * k + c)] = fm::weight(l, m, r, c);
  return out;
}

std::vector<double> Mat::magnitude() const {
  const fm::Layout l = layout();
  if (!fm::is_kquant(l.format)) {
    std::vector<double> w = dequant();
    for (double& v : w) v = std::fabs(v);
    return w;
  }
  const fm::KQuant f = fm::KQuant(int32_t(l.format));
  const fm::KQuantTraits t = fm::kquant_traits(f);
  const int64_t rb = fm::row_bytes(l.format, k);
  std::vector<double> out(size_t(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t* blk = &data[size_t(r * rb + c / 256 * t.block_bytes)];
      const fm::KQuantSub s = fm::kquant_sub(f, blk, int(c % 256) / t.sub_block_size);
      const double dsq = double(fm::kquant_d(f, blk)) * s.sc * fm::kquant_q(f, blk, int(c % 256));
      out[size_t(r * k + c)] = std::fabs(dsq) + std::fabs(double(fm::kquant_dmin(f, blk)) * s.m);
    }
  return out;
}

double Mat::bias_at(int64_t r) const { return bias.empty() ? 0.0 : double(fm::bf16_to_f32(bias[size_t(r)])); }

void Mat::set_scale(int64_t sr, int64_t sc, float v) {
  const size_t i = size_t(sr * stride + sc);
  if (sdt == MOEJIT_DTYPE_F32) {
    std::memcpy(&scales[i * 4], &v, 4);
  } else {
    const uint16_t b = fm::f32_to_bf16(v);
    std::memcpy(&scales[i * 2], &b, 2);
  }
}

Mat make_mat(moejit_format fmt, moejit_dtype sdt, int64_t rows, int64_t k, int64_t pad, Fill fill, bool bias,
             Rng& rng, int32_t group) {
  Mat m;
  m.fmt = fmt;
  m.group = group;
  m.sdt = sdt;
  m.rows = rows;
  m.k = k;
  if (fill == Fill::quantized) {
    fill_quantized(m, pad, rng);
  } else if (fm::is_kquant(static_cast<fm::Format>(fmt))) {
    // Random super-block bytes; d (and dmin) finite, 2^-10..2^-4 in magnitude, either sign.
    const fm::KQuant f = fm::KQuant(int32_t(fmt));
    const int bb = fm::kquant_traits(f).block_bytes;
    m.data.resize(size_t(rows * fm::kquant_row_bytes(f, k)));
    for (auto& b : m.data) b = uint8_t(rng.next());
    for (size_t blk = 0; blk < m.data.size() / size_t(bb); ++blk)
      for (int at : {fm::kquant_d_offset(f), fm::kquant_dmin_offset(f)}) {
        if (at < 0) continue;
        const uint16_t h =
            uint16_t((rng.chance(0.5) ? 0x8000 : 0) | (rng.uniform(5, 11) << 10) | rng.uniform(0, 1023));
        std::memcpy(&m.data[blk * size_t(bb) + size_t(at)], &h, 2);
      }
  } else if (fmt == MOEJIT_FORMAT_BF16) {
    m.data.resize(size_t(rows * k * 2));
    for (int64_t i = 0; i < rows * k; ++i) {
      const uint16_t v = fill == Fill::exact ? fm::f32_to_bf16(float(rng.uniform(-15, 15)) / 32.0f)
                                             : random_bf16(rng, -10, 0);
      std::memcpy(&m.data[size_t(i * 2)], &v, 2);
    }
  } else if (fmt == MOEJIT_FORMAT_Q4_0 || fmt == MOEJIT_FORMAT_Q8_0) {
    // GGUF blocks of 32: fp16 d, then 16 bytes of nibbles (q4_0) or 32 int8 (q8_0).
    const int64_t bb = fmt == MOEJIT_FORMAT_Q4_0 ? 18 : 34;
    m.data.resize(size_t(rows * (k / 32) * bb));
    for (size_t blk = 0; blk < m.data.size() / size_t(bb); ++blk) {
      uint8_t* p = &m.data[blk * size_t(bb)];
      // exact: d = 2^-1..2^-3, |q| <= 8; random: any finite d of moderate size, any quant
      const uint16_t d =
          fill == Fill::exact
              ? uint16_t((15 - rng.uniform(1, 3)) << 10)
              : uint16_t((rng.chance(0.5) ? 0x8000 : 0) | (rng.uniform(8, 16) << 10) | rng.uniform(0, 1023));
      std::memcpy(p, &d, 2);
      for (int64_t i = 2; i < bb; ++i) {
        if (fmt == MOEJIT_FORMAT_Q8_0)
          p[i] = fill == Fill::exact ? uint8_t(int8_t(rng.uniform(-8, 8))) : uint8_t(rng.next());
        else
          p[i] = uint8_t(rng.next());
      }
    }
  } else if (fmt == MOEJIT_FORMAT_NVFP4) {
    // e2m1 pairs, one e4m3 scale per 16 (exact: 2^-2..2^0), an fp32 global per
    // row (exact: 2^-1..2^0); padding holds 0x7F (480, e4m3 has no NaN).
    m.data.resize(size_t(rows * k / 2));
    for (auto& b : m.data) b = uint8_t(rng.next());
    m.srows = rows;
    m.scols = k / 16;
    m.stride = m.scols + pad;
    m.api_stride = pad ? m.stride : 0;
    m.scales.assign(size_t(m.srows * m.stride), 0x7F);
    for (int64_t sr = 0; sr < m.srows; ++sr)
      for (int64_t sc = 0; sc < m.scols; ++sc)
        m.scales[size_t(sr * m.stride + sc)] =
            fill == Fill::exact ? uint8_t(0x38 - 8 * rng.uniform(0, 2)) : uint8_t(rng.uniform(0x20, 0x48));
    m.row_scales.resize(size_t(rows));
    for (auto& g : m.row_scales)
      g = fill == Fill::exact ? std::ldexp(1.0f, -rng.uniform(0, 1))
                              : float(std::ldexp(1.0 + rng.unit(), -rng.uniform(0, 2)));
  } else if (fmt == MOEJIT_FORMAT_MXFP8_E4M3 || fmt == MOEJIT_FORMAT_MXFP8_E5M2 ||
             fmt == MOEJIT_FORMAT_MXFP4) {
    // One e8m0 scale per group of each row (mxfp4: 32; mxfp8: m.group, default 32).
    const bool e5 = fmt == MOEJIT_FORMAT_MXFP8_E5M2;
    const bool fp4 = fmt == MOEJIT_FORMAT_MXFP4;
    m.data.resize(size_t(rows * (fp4 ? k / 2 : k)));
    for (auto& b : m.data) {
      if (fp4) {
        b = uint8_t(rng.next());  // every e2m1 pair is exact in fp32 products
      } else if (!e5) {
        b = fill == Fill::exact ? exact_e4m3_code(rng) : uint8_t(rng.next());
      } else if (fill == Fill::exact) {  // exponent field 13..16 (2^-2..2^1), or zero
        b = rng.chance(0.1)
                ? 0
                : uint8_t(((rng.uniform(13, 16)) << 2) | rng.uniform(0, 3) | (rng.chance(0.5) ? 0x80 : 0));
      } else {
        do b = uint8_t(rng.next());
        while ((b & 0x7C) == 0x7C);  // finite codes: inf/NaN are covered by the kernel tests
      }
    }
    m.srows = rows;
    m.scols = k / m.layout().group;
    m.stride = m.scols + pad;
    m.api_stride = pad ? m.stride : 0;
    m.scales.assign(size_t(m.srows * m.stride), 0xFF);  // padding: the e8m0 NaN code
    for (int64_t sr = 0; sr < m.srows; ++sr)
      for (int64_t sc = 0; sc < m.scols; ++sc)
        m.scales[size_t(sr * m.stride + sc)] =
            uint8_t(fill == Fill::exact ? 127 - rng.uniform(0, 2) : rng.uniform(118, 130));
  } else {  // fp8_block
    m.data.resize(size_t(rows * k));
    for (auto& b : m.data) b = fill == Fill::exact ? exact_e4m3_code(rng) : uint8_t(rng.next());
    m.srows = (rows + 127) / 128;
    m.scols = (k + 127) / 128;
    m.stride = m.scols + pad;
    m.api_stride = pad ? m.stride : 0;
    const size_t n = size_t(m.srows * m.stride);
    if (sdt == MOEJIT_DTYPE_F32) {
      m.scales.resize(n * 4);
      for (size_t i = 0; i < n; ++i) std::memcpy(&m.scales[i * 4], &kF32NaN, 4);
    } else {
      m.scales.resize(n * 2);
      for (size_t i = 0; i < n; ++i) std::memcpy(&m.scales[i * 2], &kBf16NaN, 2);
    }
    for (int64_t sr = 0; sr < m.srows; ++sr)
      for (int64_t sc = 0; sc < m.scols; ++sc) {
        float v;
        if (fill == Fill::exact) {
          v = std::ldexp(1.0f, -rng.uniform(0, 2));
        } else {
          v = float(std::ldexp(1.0 + rng.unit(), rng.uniform(-9, -6)));
          if (rng.chance(0.1)) v = -v;
        }
        m.set_scale(sr, sc, v);
      }
  }
  if (bias) {
    m.bias.resize(size_t(rows));
    for (auto& b : m.bias)
      b = fill == Fill::exact ? fm::f32_to_bf16(float(rng.uniform(-32, 32)) / 64.0f)
                              : random_bf16(rng, -6, 0);
  }
  return m;
}

std::vector<uint16_t> make_x(int64_t n, Fill fill, Rng& rng) {
  std::vector<uint16_t> x(static_cast<size_t>(n));
  for (auto& v : x)
    v = fill == Fill::exact ? fm::f32_to_bf16(float(rng.uniform(-8, 8)) / 16.0f) : random_bf16(rng, -6, 1);
  return x;
}

// ds_fp4 weights are mxfp4 bytes: drawn by make_mat as mxfp4, then labelled ds_fp4.
Mat make_weights(moejit_format fmt, moejit_dtype sdt, int64_t rows, int64_t k, int64_t pad, Fill fill,
                 bool bias, Rng& rng, int32_t group) {
  Mat m = make_mat(fmt == MOEJIT_FORMAT_DS_FP4 ? MOEJIT_FORMAT_MXFP4 : fmt, sdt, rows, k, pad, fill, bias,
                   rng, group);
  m.fmt = fmt;
  return m;
}

// ---------------------------------------------------------------- linear

moejit_linear_desc LinearData::desc() const {
  moejit_linear_desc d;
  std::memset(&d, 0, sizeof(d));
  d.struct_size = sizeof(d);
  d.format = p.fmt;
  d.scale_dtype = p.fmt == MOEJIT_FORMAT_FP8_BLOCK ? p.sdt : MOEJIT_DTYPE_BF16;
  d.rows = p.rows;
  d.cols = p.cols;
  d.group_size = p.group;
  d.max_tokens = p.max_tokens;
  d.weight = w.api();
  d.output_dtype = p.out;
  return d;
}

LinearData make_linear(const LinearProblem& p) {
  LinearData d;
  d.p = p;
  Rng rng(p.seed);
  d.w = make_weights(p.fmt, p.sdt, p.rows, p.cols, p.pad, p.fill, p.bias, rng, p.group);
  d.x = make_x(int64_t(p.max_tokens) * p.cols, Fill::random, rng);
  return d;
}

// |y - ref| <= 2^-24 (K + 64) (sum_k |w_k x_k| + |bias|), + half a bf16 ulp for bf16 y
// (K-quants: |d sc q x| + |dmin m x| for |w x|, Mat::magnitude).
// ds_fp4: x is first round-tripped through e4m3 per 128 columns, exactly as the
// MoE layer's input (docs/FORMATS.md), so kernel and reference share x'.
Reference linear_reference(const LinearData& d) {
  const LinearProblem& p = d.p;
  Reference ref;
  ref.y.assign(size_t(p.max_tokens * p.rows), 0.0);
  ref.bound.assign(ref.y.size(), 0.0);
  const std::vector<double> W = d.w.dequant(), Wm = d.w.magnitude();
  std::vector<double> X(d.x.size());
  for (size_t i = 0; i < X.size(); ++i) X[i] = fm::bf16_to_f32(d.x[i]);
  if (p.fmt == MOEJIT_FORMAT_DS_FP4)
    for (int t = 0; t < p.max_tokens; ++t) {
      const std::vector<double> q = ds_roundtrip(&X[size_t(t * p.cols)], p.cols);
      std::copy(q.begin(), q.end(), X.begin() + t * p.cols);
    }
  for (int t = 0; t < p.max_tokens; ++t)
    for (int r = 0; r < p.rows; ++r) {
      double dot = 0, s = 0;
      for (int k = 0; k < p.cols; ++k) {
        const double x = X[size_t(t * p.cols + k)];
        dot += W[size_t(r) * p.cols + k] * x;
        s += Wm[size_t(r) * p.cols + k] * std::fabs(x);
      }
      const double b = d.w.bias_at(r);
      const size_t o = size_t(t * p.rows + r);
      ref.y[o] = dot + b;
      double bound = (p.cols + 64) * kU * (s + std::fabs(b));
      if (p.out == MOEJIT_DTYPE_BF16) bound += 0.5 * bf16_quantum(std::fabs(ref.y[o]) + bound);
      ref.bound[o] = bound;
    }
  return ref;
}

// ---------------------------------------------------------------- checking

double y_at(const std::vector<uint8_t>& y, moejit_dtype dt, size_t i) {
  if (dt == MOEJIT_DTYPE_BF16) {
    uint16_t v;
    std::memcpy(&v, &y[i * 2], 2);
    return fm::bf16_to_f32(v);
  }
  float f;
  std::memcpy(&f, &y[i * 4], 4);
  return f;
}

int64_t check_against(const std::vector<uint8_t>& y, moejit_dtype dt, const Reference& ref, int tokens,
                      int cols, const std::string& what) {
  int64_t bad = 0;
  std::ostringstream os;
  for (int t = 0; t < tokens; ++t) {
    const bool skipped = !ref.all_skipped.empty() && ref.all_skipped[size_t(t)];
    for (int c = 0; c < cols; ++c) {
      const size_t i = size_t(t) * cols + c;
      const double got = y_at(y, dt, i), want = ref.y[i], bound = ref.bound[i];
      const bool ok = skipped ? (got == 0 && !std::signbit(got)) : std::fabs(got - want) <= bound;
      if (ok) continue;
      if (bad < 8) {
        os.precision(10);
        os << "\n  token " << t << " index " << c << ": got " << got << " want " << want << " |diff| "
           << std::fabs(got - want) << " bound " << bound
           << (skipped ? " (all routes skipped: must be +0.0)" : "");
      }
      ++bad;
    }
  }
  if (bad)
    ADD_FAILURE() << what << ": " << bad << " of " << int64_t(tokens) * cols << " elements out of bounds"
                  << os.str();
  return bad;
}

}  // namespace moejit_test
