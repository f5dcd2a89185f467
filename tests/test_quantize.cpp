// formats/quantize against the format rules, checked through the decoders of
// formats/ (formats::weight) and with checks written independently of
// quantize.cpp: spacing-based error bounds instead of an encoder, the scale
// rules as properties, exact round trips of representable banks, and the
// element encoders exhaustively (F16C for fp16 where the CPU has it).
//
// Error bounds (per element, w the input, S the effective scale of its block):
//  - minifloat elements (bf16, e4m3, e5m2, e2m1), RNE: |w - q| <= S * u(|w|/S) / 2
//    where u(t) is the element's spacing at t (2^(floor(log2 t) - mantissa bits),
//    or the subnormal spacing below the smallest normal); exactly on a midpoint the
//    code with the even mantissa is required. Above the largest finite value
//    m (plus half its spacing), the saturating encoders give exactly +-m*S
//    (OCP MX clamps there: mxfp8 and mxfp4 lose up to 2^(emax+1) - m per element).
//    The scale is exact where chosen so (mx: a power of two; nvfp4: e4m3 * g; fp8_block
//    the stored bf16 / fp32 scale), so q = code * S exactly.
//  - q8_0 (ggml): with d = amax/127 and t = fp32(x * fp32(1/d)), q = round-half-away(t),
//    so |x/d - q| <= 1/2 + 2^-16 and |w - q*d16| <= (1/2 + 2^-16)|d| + |q| |d - d16|
//    (d16 = fp16 RNE of d, |d - d16| <= 2^-11 |d| for normal d: about 0.562 |d| overall).
//  - q4_0 (ggml): d = max/-8 (max = the signed element of largest magnitude), q - 8 =
//    trunc(fp32(t + 8.5)) - 8 with the top clamped to 7: |x/d - (q-8)| <= 1/2 + 2^-19 for
//    x/d < 15/2 (exact midpoints round up), and for x/d >= 15/2 (only -max's side
//    reaches 8) q = 15 and the error is x/d - 7 <= 1 + 2^-19; in w units add
//    |q-8| |d - d16|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "formats/quantize.h"
#include "numerics_ref.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "format_oracle.h"
#include "rng.h"
#endif

namespace fm = moejit::formats;
using fm::Format;

namespace {

namespace oracle = moejit_test::oracle;

constexpr uint8_t kPoison = 0xA5;
constexpr size_t kGuard = 64;

// ------------------------------------------------------------------ buffers

struct Qm {
  fm::Layout l;
  std::vector<uint8_t> data, scales;  // each followed by kGuard poison bytes
  std::vector<float> row_scales;
  int64_t cols = 0;  // scale columns

  fm::MatrixRef ref() const {
    fm::MatrixRef m;
    m.data = data.data();
    m.scales = scales.empty() ? nullptr : scales.data();
    m.row_scales = row_scales.empty() ? nullptr : row_scales.data();
    return m;
  }
  fm::MatrixOut out() {
    fm::MatrixOut o;
    o.data = data.data();
    o.scales = scales.empty() ? nullptr : scales.data();
    o.row_scales = row_scales.empty() ? nullptr : row_scales.data();
    return o;
  }
  size_t data_bytes() const { return data.size() - kGuard; }
  size_t scale_bytes() const { return scales.empty() ? 0 : scales.size() - kGuard; }
  int64_t ebytes() const { return fm::scale_elem_bytes(l.format, l.scale_dtype); }
};

Qm make_q(Format f, int64_t rows, int64_t k, int32_t group = 0, fm::ScaleDtype sdt = fm::ScaleDtype::bf16,
          int64_t pad = 0) {
  Qm q;
  q.l.format = f;
  q.l.scale_dtype = sdt;
  q.l.group = group ? group : f == Format::bf16 ? 32 : fm::default_group(f, 0);
  q.l.rows = rows;
  q.l.k = k;
  q.cols = fm::scale_cols(f, q.l.group, k);
  q.l.scale_stride = fm::has_block_scales(f) ? q.cols + pad : 0;
  q.data.assign(size_t(rows * fm::row_bytes(f, k)) + kGuard, kPoison);
  if (fm::has_block_scales(f))
    q.scales.assign(size_t(fm::scale_rows(f, rows) * q.l.scale_stride * q.ebytes()) + kGuard, kPoison);
  if (fm::has_row_scales(f)) q.row_scales.assign(size_t(rows), NAN);
  return q;
}

void run(Qm& q, const std::vector<float>& w, const fm::QuantOptions& opt = {}) {
  const fm::QuantResult r = fm::quantize(q.l, w.data(), q.out(), opt);
  ASSERT_TRUE(r.ok) << r.error;
}

// ------------------------------------------------------------------ reading codes (tests/format_oracle.h)

const uint8_t* row_of(const Qm& q, int64_t r) {
  return q.data.data() + r * oracle::row_bytes(q.l.format, q.l.k);
}
int code_at(const Qm& q, int64_t r, int64_t k) { return oracle::code_at(q.l.format, row_of(q, r), k); }
void set_code(Qm& q, int64_t r, int64_t k, int c) {
  oracle::set_code(q.l.format, q.data.data() + r * oracle::row_bytes(q.l.format, q.l.k), k, c);
}
// fp16 d of the GGUF block holding (r, k).
uint16_t gguf_d(const Qm& q, int64_t r, int64_t k) { return oracle::gguf_d(q.l.format, row_of(q, r), k); }

// Scale element (sr, sc) as stored (raw bits).
uint32_t scale_bits(const Qm& q, int64_t sr, int64_t sc) {
  const size_t i = size_t(sr * q.l.scale_stride + sc);
  uint32_t v = 0;
  std::memcpy(&v, &q.scales[i * size_t(q.ebytes())], size_t(q.ebytes()));  // little-endian host
  return v;
}

void set_scale_bits(Qm& q, int64_t sr, int64_t sc, uint32_t v) {
  const size_t i = size_t(sr * q.l.scale_stride + sc);
  std::memcpy(&q.scales[i * size_t(q.ebytes())], &v, size_t(q.ebytes()));
}

// ------------------------------------------------------------------ element rules

struct Elem {
  const char* name;
  int man, bias;
  double maxv;
  bool saturate;  // above maxv: +-maxv (else: inf)
};
const Elem kE4m3{"e4m3", 3, 7, 448.0, true};
const Elem kE5m2{"e5m2", 2, 15, 57344.0, true};  // as the mxfp8 quantizer uses it (OCP clamp)
const Elem kE2m1{"e2m1", 1, 1, 6.0, true};
const Elem kFp16{"fp16", 10, 15, 65504.0, false};
const Elem kBf16{"bf16", 7, 127, std::ldexp(255.0, 120), false};

double spacing(const Elem& E, double t) {
  const int emin = 1 - E.bias;
  const int e = t < std::ldexp(1.0, emin) ? emin : std::ilogb(t);
  return std::ldexp(1.0, e - E.man);
}

// `got` (= element value * S, exact) must be the RNE encoding of finite w at
// scale S > 0; `odd` is the code's lowest mantissa bit.
bool rne_ok(const Elem& E, double w, double S, double got, bool odd, std::string* why) {
  std::ostringstream os;
  os.precision(17);
  if (std::signbit(got) != std::signbit(w)) {
    os << E.name << ": sign of " << got << " differs from input " << w;
  } else {
    const double a = std::fabs(w), g = std::fabs(got);
    const double t = a / S;
    if (t > E.maxv + 0.5 * spacing(E, E.maxv)) {
      const double want = E.saturate ? E.maxv * S : INFINITY;
      if (g != want) os << E.name << ": " << w << " / " << S << " overflows: want " << want << " got " << got;
    } else {
      const double half = 0.5 * spacing(E, t) * S, err = std::fabs(a - g);
      if (err > half)
        os << E.name << ": |" << w << " - " << got << "| = " << err << " > half spacing " << half << " (S "
           << S << ")";
      else if (err == half && t < E.maxv && odd)
        os << E.name << ": tie " << w << " / " << S << " rounded to the odd neighbour " << got;
    }
  }
  *why = os.str();
  return why->empty();
}

Elem elem_of(Format f) {
  switch (f) {
    case Format::bf16: return kBf16;
    case Format::fp8_block:
    case Format::mxfp8_e4m3: return kE4m3;
    case Format::mxfp8_e5m2: return kE5m2;
    default: return kE2m1;
  }
}

int emax_of(Format f) {
  return f == Format::mxfp8_e4m3 ? 8 : f == Format::mxfp8_e5m2 ? 15 : 2;  // OCP MX emax_elem
}

float finite_abs(float x) { return std::isfinite(x) ? std::fabs(x) : 0.0f; }

// ------------------------------------------------------------------ the checker

// Checks a quantized matrix against its fp32 source: scale rules, element
// bounds and tie rules, untouched scale padding and guards. Returns the number
// of violations (the first few described in *msgs).
int64_t check(const Qm& q, const std::vector<float>& w, std::string* msgs) {
  const fm::Layout& l = q.l;
  const Format f = l.format;
  const fm::MatrixRef m = q.ref();
  int64_t bad = 0;
  std::ostringstream os;
  auto fail = [&](const std::string& s) {
    if (bad++ < 6) os << "\n  " << s;
  };
  auto x = [&](int64_t r, int64_t k) { return w[size_t(r * l.k + k)]; };
  // Guards and padding.
  for (size_t i = q.data_bytes(); i < q.data.size(); ++i)
    if (q.data[i] != kPoison) fail("byte written past the weight data");
  for (size_t i = q.scale_bytes(); i < q.scales.size(); ++i)
    if (q.scales[i] != kPoison) fail("byte written past the scales");
  if (!q.scales.empty())
    for (int64_t sr = 0; sr < fm::scale_rows(f, l.rows); ++sr)
      for (int64_t b = q.cols * q.ebytes(); b < l.scale_stride * q.ebytes(); ++b)
        if (q.scales[size_t(sr * l.scale_stride * q.ebytes() + b)] != kPoison)
          fail("scale padding written, scale row " + std::to_string(sr));

  std::string why;
  if (f == Format::q8_0 || f == Format::q4_0) {
    for (int64_t r = 0; r < l.rows; ++r)
      for (int64_t b = 0; b < l.k / 32; ++b) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; ++j)
          if (finite_abs(x(r, b * 32 + j)) > amax)
            amax = finite_abs(x(r, b * 32 + j)), max = x(r, b * 32 + j);
        const float d = f == Format::q8_0 ? amax / 127.0f : max / -8.0f;
        const uint16_t h = gguf_d(q, r, b * 32);
        const double d16 = fm::fp16_to_f32(h);
        if (!rne_ok(kFp16, d, 1.0, d16, h & 1, &why)) fail("d of block " + std::to_string(b) + ": " + why);
        const float id = d != 0 ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; ++j) {
          const int64_t k = b * 32 + j;
          const float xv = x(r, k);
          if (!std::isfinite(xv)) continue;
          const int c = code_at(q, r, k);
          const int qv = f == Format::q8_0 ? c : c - 8;
          const double got = fm::weight(l, m, r, k);
          if (got != double(qv) * d16) fail("weight() disagrees with the block bytes");
          if (d == 0) {
            if (qv != 0) fail("zero block with a nonzero quant");
            continue;
          }
          const double v = double(xv) / double(d);  // the exact quotient, within 2^-53
          if (f == Format::q8_0) {
            // Rule: round half away from zero of t = fp32(x * fp32(1/d)).
            const float t = xv * id;
            const double e = std::fabs(double(t) - qv);
            if (e > 0.5 || (e == 0.5 && std::fabs(double(qv)) < std::fabs(double(t))) || std::abs(qv) > 127)
              fail("q8_0 quant " + std::to_string(qv) + " for t = " + std::to_string(t));
            if (std::fabs(xv - got) >
                (0.5 + std::ldexp(1.0, -16)) * std::fabs(d) + std::abs(qv) * std::fabs(d - d16))
              fail("q8_0 error bound");
          } else {
            const double lim = 7.5 - std::ldexp(1.0, -19);
            if (v < lim) {
              if (std::fabs(v - qv) > 0.5 + std::ldexp(1.0, -19))
                fail("q4_0 quant " + std::to_string(qv) + " for x/d = " + std::to_string(v));
              const double j2 = 2.0 * double(xv) / double(d);  // exact tie <=> 2x = (2j+1) d
              if (j2 == std::floor(j2) && std::fmod(std::fabs(j2), 2.0) == 1.0 && qv != (j2 + 1) / 2)
                fail("q4_0 tie x/d = " + std::to_string(v) + " not rounded up (got " + std::to_string(qv) +
                     ")");
            } else if (qv != 7) {
              fail("q4_0 top: x/d = " + std::to_string(v) + " must give 7, got " + std::to_string(qv));
            }
            const double e = v < lim ? 0.5 + std::ldexp(1.0, -19) : 1.0 + std::ldexp(1.0, -19);
            if (std::fabs(xv - got) > e * std::fabs(d) + std::abs(qv) * std::fabs(d - d16))
              fail("q4_0 error bound");
          }
        }
      }
    *msgs = os.str();
    return bad;
  }

  // Effective scale of every element and the scale rule of every block.
  auto S_at = [&](int64_t r, int64_t k) -> double {
    switch (f) {
      case Format::bf16: return 1.0;
      case Format::fp8_block: {
        const uint32_t b = scale_bits(q, r / 128, k / 128);
        if (l.scale_dtype == fm::ScaleDtype::bf16) return fm::bf16_to_f32(uint16_t(b));
        float s;
        std::memcpy(&s, &b, 4);
        return s;
      }
      case Format::nvfp4:
        return double(fm::e4m3_to_f32(uint8_t(scale_bits(q, r, k / 16)))) * double(q.row_scales[size_t(r)]);
      default: return fm::e8m0_to_f32(uint8_t(scale_bits(q, r, k / l.group)));
    }
  };
  if (f == Format::fp8_block) {
    for (int64_t br = 0; br < fm::scale_rows(f, l.rows); ++br)
      for (int64_t bc = 0; bc < q.cols; ++bc) {
        float amax = 0;
        for (int64_t r = br * 128; r < std::min<int64_t>(l.rows, br * 128 + 128); ++r)
          for (int64_t k = bc * 128; k < std::min<int64_t>(l.k, bc * 128 + 128); ++k)
            amax = std::max(amax, finite_abs(x(r, k)));
        const bool f32 = l.scale_dtype == fm::ScaleDtype::f32;
        float want = amax == 0 ? 1.0f : f32 ? amax / 448.0f : fm::round_bf16(amax / 448.0f);
        if (want == 0) want = f32 ? FLT_TRUE_MIN : std::ldexp(1.0f, -133);
        if (S_at(br * 128, bc * 128) != want)
          fail("fp8_block scale (" + std::to_string(br) + ", " + std::to_string(bc) + ") = " +
               std::to_string(S_at(br * 128, bc * 128)) + ", want amax/448 = " + std::to_string(want));
      }
  } else if (f == Format::nvfp4) {
    for (int64_t r = 0; r < l.rows; ++r) {
      float amax = 0;
      for (int64_t k = 0; k < l.k; ++k) amax = std::max(amax, finite_abs(x(r, k)));
      const float g = q.row_scales[size_t(r)];
      if (g != std::max(amax / 2688.0f, FLT_MIN)) fail("nvfp4 global of row " + std::to_string(r));
      for (int64_t b = 0; b < q.cols; ++b) {
        float bmax = 0;
        for (int64_t k = b * 16; k < b * 16 + 16; ++k) bmax = std::max(bmax, finite_abs(x(r, k)));
        const uint8_t s = uint8_t(scale_bits(q, r, b));
        const double six_g = 6.0 * double(g);
        if (!rne_ok(kE4m3, bmax, six_g, double(fm::e4m3_to_f32(s)) * six_g, s & 1, &why))
          fail("nvfp4 block scale: " + why);
      }
    }
  } else if (f != Format::bf16) {  // mx: amax / 2^(s-127) in [2^emax, 2^(emax+1)), s clamped to [0, 254]
    const double lo = std::ldexp(1.0, emax_of(f)), hi = 2 * lo;
    for (int64_t r = 0; r < l.rows; ++r)
      for (int64_t b = 0; b < q.cols; ++b) {
        float amax = 0;
        for (int64_t k = b * l.group; k < (b + 1) * l.group; ++k) amax = std::max(amax, finite_abs(x(r, k)));
        const uint32_t s = scale_bits(q, r, b);
        const double ratio = double(amax) / std::ldexp(1.0, int(s) - 127);
        const bool ok = s <= 254 && (amax == 0 ? s == 0 : ratio < hi && (ratio >= lo || s == 0));
        if (!ok) fail("mx scale code " + std::to_string(s) + " for block amax " + std::to_string(amax));
      }
  }

  const Elem E = elem_of(f);
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t k = 0; k < l.k; ++k) {
      const float xv = x(r, k);
      if (!std::isfinite(xv)) continue;
      const double S = S_at(r, k);
      const double got = fm::weight(l, m, r, k);
      const int c = code_at(q, r, k);
      if (S == 0) {  // nvfp4 block whose scale rounded to zero: elements are zeros
        if (got != 0) fail("nonzero element in a zero-scale block");
        continue;
      }
      if (!rne_ok(E, xv, S, got, c & 1, &why))
        fail("(" + std::to_string(r) + ", " + std::to_string(k) + ") code " + std::to_string(c) + ": " + why);
    }
  *msgs = os.str();
  return bad;
}

// ------------------------------------------------------------------ data

struct Case {
  Format f;
  int64_t rows, k;
  int32_t group;
  fm::ScaleDtype sdt;
  int64_t pad;
};

std::string name_of(const Case& c) {
  std::ostringstream os;
  os << fm::format_name(c.f) << " rows " << c.rows << " K " << c.k;
  if (c.f == Format::mxfp8_e4m3 || c.f == Format::mxfp8_e5m2) os << " group " << c.group;
  if (c.f == Format::fp8_block) os << (c.sdt == fm::ScaleDtype::f32 ? " f32 scales" : " bf16 scales");
  if (c.pad) os << " pad " << c.pad;
  return os.str();
}

const std::vector<Case>& cases() {
  using S = fm::ScaleDtype;
  static const std::vector<Case> v = {
      {Format::bf16, 3, 7, 0, S::bf16, 0},
      {Format::bf16, 5, 256, 0, S::bf16, 0},
      {Format::nvfp4, 4, 80, 16, S::bf16, 0},
      {Format::nvfp4, 3, 2880, 16, S::bf16, 3},
      {Format::mxfp4, 4, 2880, 32, S::bf16, 0},
      {Format::mxfp4, 5, 64, 32, S::bf16, 2},
      {Format::ds_fp4, 3, 256, 32, S::bf16, 1},
      {Format::q4_0, 4, 96, 32, S::bf16, 0},
      {Format::q4_0, 2, 2880, 32, S::bf16, 0},
      {Format::fp8_block, 300, 200, 128, S::bf16, 0},
      {Format::fp8_block, 130, 200, 128, S::f32, 2},
      {Format::fp8_block, 1, 1, 128, S::f32, 0},
      {Format::fp8_block, 129, 384, 128, S::bf16, 1},
      {Format::q8_0, 4, 96, 32, S::bf16, 0},
      {Format::q8_0, 2, 2880, 32, S::bf16, 0},
      {Format::mxfp8_e4m3, 4, 96, 32, S::bf16, 1},
      {Format::mxfp8_e4m3, 3, 256, 128, S::bf16, 0},
      {Format::mxfp8_e5m2, 4, 192, 64, S::bf16, 2},
      {Format::mxfp8_e5m2, 3, 2880, 32, S::bf16, 0},
  };
  return v;
}

// Random fp32 matrix: a normal body per row at a random magnitude (2^-20..2^8),
// outliers, a few all-zero 32-element runs, exact zeros and tiny values.
std::vector<float> random_matrix(int64_t rows, int64_t k, uint64_t seed) {
  moejit_test::Rng g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> w(size_t(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::ldexp(1.0f, int(g() % 29) - 20);
    for (int64_t c = 0; c < k; ++c) {
      float v = n(g) * mag;
      const double p = u(g);
      if (p < 0.01)
        v *= 40.0f;  // outlier
      else if (p < 0.02)
        v = 0.0f;
      else if (p < 0.03)
        v *= 1e-4f;
      w[size_t(r * k + c)] = v;
    }
    if (k >= 64 && g() % 4 == 0) {
      const int64_t z = int64_t(g() % uint64_t(k / 32)) * 32;
      for (int64_t c = z; c < z + 32; ++c) w[size_t(r * k + c)] = 0.0f;
    }
  }
  return w;
}

// Midpoints between neighbouring element values (positive, below the max).
std::vector<double> midpoints(const Elem& E) {
  std::vector<double> v;
  for (double a = 0;;) {
    const double next = a + spacing(E, a);
    if (next > E.maxv) break;
    v.push_back((a + next) / 2);
    a = next;
  }
  return v;
}

// A matrix whose blocks have a known exact scale and hold many exact element
// midpoints (ties), so that a quantizer with the wrong tie rule fails.
std::vector<float> tie_matrix(const Qm& q, uint64_t seed) {
  moejit_test::Rng g(seed);
  const fm::Layout& l = q.l;
  std::vector<float> w(size_t(l.rows * l.k), 0.0f);
  auto at = [&](int64_t r, int64_t k) -> float& { return w[size_t(r * l.k + k)]; };
  auto sgn = [&]() { return g() % 2 ? -1.0 : 1.0; };
  switch (l.format) {
    case Format::q8_0:
    case Format::q4_0:
      for (int64_t r = 0; r < l.rows; ++r)
        for (int64_t b = 0; b < l.k / 32; ++b) {
          const double d = std::ldexp(1.0, int(g() % 12) - 8);  // exact 1/d
          for (int j = 0; j < 32; ++j) {
            const int n = l.format == Format::q8_0 ? int(g() % 254) - 127 : int(g() % 15) - 8;
            at(r, b * 32 + j) = float((n + 0.5) * d);
          }
          // The block's amax: 127 d (q8_0), or max = -8 d (q4_0), placed first.
          at(r, b * 32) = float(l.format == Format::q8_0 ? 127 * d * sgn() : -8 * d);
        }
      break;
    case Format::bf16:
      for (auto& v : w) {  // bf16 midpoints: a bf16 value plus half its spacing
        const double a = std::ldexp(1.0 + double(g() % 128) / 128, int(g() % 40) - 20);
        v = float(sgn() * (a + std::ldexp(1.0, std::ilogb(a) - 8)));
      }
      break;
    case Format::nvfp4: {
      // g = 1 (row amax 2688 in block 0, whose scale is 448); block b > 0 has the
      // e4m3 scale s_b and the element +-6 s_b, so S = s_b exactly.
      const std::vector<double> mids = midpoints(kE2m1);
      for (int64_t r = 0; r < l.rows; ++r)
        for (int64_t b = 0; b < q.cols; ++b) {
          const double sb = b == 0 ? 448.0 : double(fm::e4m3_to_f32(uint8_t(8 + g() % 0x76)));
          for (int64_t k = b * 16; k < b * 16 + 16; ++k)
            at(r, k) = float(sgn() * mids[size_t(g() % mids.size())] * sb);
          at(r, b * 16 + 1) = float(6 * sb * sgn());
        }
      break;
    }
    default: {
      // mx: per block S = 2^j and an element +-max*S (its binade fixes the scale at
      // S); fp8_block: per 128x128 block S = 2^j and one element 448 S.
      const Elem E = elem_of(l.format);
      const std::vector<double> mids = midpoints(E);
      const bool fp8 = l.format == Format::fp8_block;
      const int64_t bl = fp8 ? 128 : l.group;
      for (int64_t r = 0; r < l.rows; ++r)
        for (int64_t b = 0; b * bl < l.k; ++b) {
          const int64_t key = fp8 ? (r / 128) * 7 + b * 3 : int64_t(g() % 16);
          const double S = std::ldexp(1.0, int(key % 16) - 10);
          for (int64_t k = b * bl; k < std::min(l.k, (b + 1) * bl); ++k)
            at(r, k) = float(sgn() * mids[size_t(g() % mids.size())] * S);
          if (!fp8 || r % 128 == 0) at(r, b * bl) = float(E.maxv * S * sgn());
        }
    }
  }
  return w;
}

// Codes of finite values of an element type (as set_code takes them).
std::vector<int> finite_codes(Format f) {
  std::vector<int> v;
  switch (f) {
    case Format::q8_0:
      for (int c = -127; c <= 127; ++c) v.push_back(c);
      break;
    case Format::q4_0:
    case Format::nvfp4:
    case Format::mxfp4:
    case Format::ds_fp4:
      for (int c = 0; c < 16; ++c) v.push_back(c);
      break;
    default:
      for (int c = 0; c < 256; ++c)
        if ((c & 0x7F) != 0x7F) v.push_back(c);  // e4m3: +-480 is not a value
  }
  return v;
}

std::vector<uint8_t> bytes_of(const Qm& q) {
  std::vector<uint8_t> v = q.data;
  v.insert(v.end(), q.scales.begin(), q.scales.end());
  for (float g : q.row_scales) {
    uint8_t b[4];
    std::memcpy(b, &g, 4);
    v.insert(v.end(), b, b + 4);
  }
  return v;
}

// ------------------------------------------------------------------ tests

TEST(Quantize, RandomMatricesWithinBounds) {
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    for (int rep = 0; rep < 2; ++rep) {
      Qm q = make_q(c.f, c.rows, c.k, c.group, c.sdt, c.pad);
      const std::vector<float> w = random_matrix(c.rows, c.k, seed++);
      run(q, w);
      std::string msgs;
      EXPECT_EQ(check(q, w, &msgs), 0) << msgs;
    }
  }
}

TEST(Quantize, TiesRoundPerFormatRule) {
  uint64_t seed = 100;
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    Qm q = make_q(c.f, c.rows, c.k, c.group, c.sdt, c.pad);
    const std::vector<float> w = tie_matrix(q, seed++);
    run(q, w);
    std::string msgs;
    EXPECT_EQ(check(q, w, &msgs), 0) << msgs;
  }
}

TEST(Quantize, DenseStrideZeroMeansScaleColumns) {
  for (const Case& c : cases()) {
    if (!fm::has_block_scales(c.f) || c.pad) continue;
    SCOPED_TRACE(name_of(c));
    Qm a = make_q(c.f, c.rows, c.k, c.group, c.sdt), b = a;
    b.l.scale_stride = 0;
    const std::vector<float> w = random_matrix(c.rows, c.k, 7);
    run(a, w);
    run(b, w);
    EXPECT_EQ(bytes_of(a), bytes_of(b));
  }
}

// A broken quantizer fails the checker: one element moved to the other
// neighbour of a tie (wrong tie rule), one element off by one code (wrong
// rounding), one scale off by one step (wrong scale rule).
TEST(Quantize, CheckerCatchesBrokenQuantizers) {
  uint64_t seed = 200;
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    Qm q = make_q(c.f, c.rows, c.k, c.group, c.sdt, c.pad);
    const std::vector<float> w = tie_matrix(q, seed++);
    run(q, w);
    std::string msgs;
    ASSERT_EQ(check(q, w, &msgs), 0) << msgs;
    const bool gguf = c.f == Format::q4_0 || c.f == Format::q8_0;
    const bool bf16 = c.f == Format::bf16;
    const int sign_bit = bf16                                                                      ? 0x8000
                         : (c.f == Format::nvfp4 || c.f == Format::mxfp4 || c.f == Format::ds_fp4) ? 8
                                                                                                   : 0x80;
    int tie_mutants = 0, step_mutants = 0;
    for (int64_t r = 0; r < c.rows && tie_mutants < 3; ++r)
      for (int64_t k = 0; k < c.k && tie_mutants < 3; ++k) {
        const int code = code_at(q, r, k);
        const double got = fm::weight(q.l, q.ref(), r, k), xv = w[size_t(r * c.k + k)];
        if (got == xv || xv == 0) continue;
        // The other neighbour: one code further from zero when |x| > |got|, else nearer.
        int other;
        if (gguf) {
          const bool up = xv > got;
          other = code + (up ? 1 : -1);
          if (other < (c.f == Format::q4_0 ? 0 : -127) || other > (c.f == Format::q4_0 ? 15 : 127)) continue;
        } else {
          const int mag = code & (sign_bit - 1);
          const int omag = mag + (std::fabs(xv) > std::fabs(got) ? 1 : -1);
          if (omag < 0 || (c.f != Format::bf16 && omag >= (sign_bit == 8 ? 8 : 0x7F)) ||
              (c.f == Format::mxfp8_e5m2 && omag > 0x7B))
            continue;
          other = (code & sign_bit) | omag;
        }
        Qm m = q;
        set_code(m, r, k, other);
        EXPECT_GT(check(m, w, &msgs), 0) << "element (" << r << ", " << k << ") moved from code " << code
                                         << " to " << other << " was not caught";
        ++tie_mutants;
      }
    if (c.rows * c.k > 1) {
      EXPECT_GT(tie_mutants, 0);
    }
    // Off by one code on a random matrix element that is not exact.
    const std::vector<float> rw = random_matrix(c.rows, c.k, seed++);
    Qm rq = make_q(c.f, c.rows, c.k, c.group, c.sdt, c.pad);
    run(rq, rw);
    for (int64_t i = 0; i < c.rows * c.k && step_mutants < 3; i += 7) {
      const int64_t r = i / c.k, k = i % c.k;
      const double got = fm::weight(rq.l, rq.ref(), r, k);
      const int code = code_at(rq, r, k);
      if (got == rw[size_t(i)] || (!gguf && (code & (sign_bit - 1)) < 2)) continue;
      if (gguf && (code == 0 || std::abs(code) >= 15)) continue;
      Qm m = rq;
      set_code(m, r, k, code - 1);
      EXPECT_GT(check(m, rw, &msgs), 0) << "element (" << r << ", " << k << ") off by one code not caught";
      ++step_mutants;
    }
    EXPECT_GT(step_mutants, 0);
    // A scale one step off.
    Qm m = rq;
    if (gguf) {
      const uint16_t d = gguf_d(m, 0, 0);
      m.data[0] = uint8_t((d + 1) & 0xFF), m.data[1] = uint8_t((d + 1) >> 8);
    } else if (fm::has_block_scales(c.f)) {
      set_scale_bits(m, 0, 0, scale_bits(m, 0, 0) + 1);
    } else {
      continue;
    }
    EXPECT_GT(check(m, rw, &msgs), 0) << "scale one step off not caught";
  }
}

// Banks whose values are exactly representable with the rule's own scales come
// back bit-identical: quantize(dequantize(bytes)) == bytes.
TEST(Quantize, RepresentableBanksRoundTripExactly) {
  moejit_test::Rng g(5);
  auto pick = [&](int lo, int hi) { return lo + int(g() % uint64_t(hi - lo + 1)); };
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    Qm src = make_q(c.f, c.rows, c.k, c.group, c.sdt, c.pad);
    const fm::Layout& l = src.l;
    const int64_t rb = fm::row_bytes(c.f, c.k);
    switch (c.f) {
      case Format::bf16:
        for (int64_t i = 0; i < c.rows * c.k; ++i) {
          int h;
          do h = pick(0, 0xFFFF);
          while ((h & 0x7F80) == 0x7F80 && (h & 0x7F));  // any non-NaN (inf included)
          set_code(src, i / c.k, i % c.k, h);
        }
        break;
      case Format::q8_0:
      case Format::q4_0:
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t b = 0; b < c.k / 32; ++b) {
            uint16_t d = uint16_t(pick(1, 30) << 10 | pick(0, 1023));  // normal fp16
            if (c.f == Format::q4_0 && pick(0, 1)) d |= 0x8000;        // q4_0 d has max's sign
            // An all-zero block: q8_0 d = 0 / 127 = +0; q4_0 d = max / -8 = -0 (ggml's arithmetic).
            const bool zero = b == 1;
            if (zero) d = c.f == Format::q4_0 ? 0x8000 : 0;
            uint8_t* p = src.data.data() + r * rb + b * (c.f == Format::q4_0 ? 18 : 34);
            p[0] = uint8_t(d), p[1] = uint8_t(d >> 8);
            for (int j = 0; j < 32; ++j)
              set_code(src, r, b * 32 + j,
                       zero                  ? (c.f == Format::q4_0 ? 8 : 0)
                       : c.f == Format::q4_0 ? pick(1, 15)
                                             : pick(-127, 127));
            if (!zero)
              set_code(src, r, b * 32 + pick(0, 31), c.f == Format::q4_0 ? 0 : (pick(0, 1) ? 127 : -127));
          }
        break;
      case Format::fp8_block:
        for (int64_t sr = 0; sr < fm::scale_rows(c.f, c.rows); ++sr)
          for (int64_t sc = 0; sc < src.cols; ++sc) {
            // f32: up to 20 significant bits (448 s and every e4m3 multiple exact); bf16: any.
            const float s = l.scale_dtype == fm::ScaleDtype::f32
                                ? std::ldexp(1.0f + float(pick(0, 1023)) / 1024, pick(-20, 4))
                                : fm::round_bf16(std::ldexp(1.0f + float(pick(0, 127)) / 128, pick(-20, 4)));
            uint32_t bits = 0;
            if (l.scale_dtype == fm::ScaleDtype::f32)
              std::memcpy(&bits, &s, 4);
            else
              bits = fm::f32_to_bf16(s);
            set_scale_bits(src, sr, sc, bits);
          }
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t k = 0; k < c.k; ++k) {
            int code;
            do code = pick(0, 255);
            while ((code & 0x7F) == 0x7F);
            set_code(src, r, k, code);
          }
        for (int64_t br = 0; br * 128 < c.rows; ++br)
          for (int64_t bc = 0; bc * 128 < c.k; ++bc)
            set_code(src, br * 128, bc * 128, pick(0, 1) ? 0x7E : 0xFE);
        break;
      case Format::nvfp4:
        for (int64_t r = 0; r < c.rows; ++r) {
          src.row_scales[size_t(r)] = std::ldexp(1.0f, pick(-12, 0));
          for (int64_t b = 0; b < src.cols; ++b) {
            const int s = pick(1, 0x7E);
            set_scale_bits(src, r, b, uint32_t(b == 0 ? 0x7E : s));  // block 0 holds the row max
            for (int64_t k = b * 16; k < b * 16 + 16; ++k) set_code(src, r, k, pick(0, 15));
            set_code(src, r, b * 16 + pick(0, 15), pick(0, 1) ? 7 : 15);  // +-6: amax_b = 6 s g
          }
        }
        break;
      default: {  // mx
        const bool fp4 = c.f == Format::mxfp4 || c.f == Format::ds_fp4;
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t b = 0; b < src.cols; ++b) {
            set_scale_bits(src, r, b, uint32_t(pick(100, 150)));
            for (int64_t k = b * l.group; k < (b + 1) * l.group; ++k) {
              int code;
              do code = pick(0, fp4 ? 15 : 255);
              while (!fp4 && (c.f == Format::mxfp8_e5m2 ? (code & 0x7C) == 0x7C : (code & 0x7F) == 0x7F));
              set_code(src, r, k, code);
            }
            // One element in the top binade [2^emax, max]: the rule recovers the scale.
            const int top = fp4                         ? pick(6, 7)
                            : c.f == Format::mxfp8_e5m2 ? pick(0x78, 0x7B)
                                                        : pick(0x78, 0x7E);
            set_code(src, r, b * l.group + pick(0, l.group - 1), top | (pick(0, 1) ? (fp4 ? 8 : 0x80) : 0));
          }
      }
    }
    std::vector<float> w(size_t(c.rows * c.k));
    for (int64_t i = 0; i < c.rows * c.k; ++i)
      w[size_t(i)] = float(fm::weight(l, src.ref(), i / c.k, i % c.k));
    Qm q = make_q(c.f, c.rows, c.k, c.group, c.sdt, c.pad);
    run(q, w);
    EXPECT_EQ(q.data, src.data);
    EXPECT_EQ(q.scales, src.scales);
    EXPECT_EQ(q.row_scales, src.row_scales);
  }
}

// NaN and inf inputs (quantize.h): amax from finite elements only; NaN -> NaN
// where the element type has it (bf16, e5m2) else zero; inf -> inf (bf16,
// e5m2) else the largest-magnitude value of its sign. Nothing else changes.
TEST(Quantize, NonFiniteInputs) {
  for (const Case& c : cases()) {
    if (c.k < 4) continue;
    SCOPED_TRACE(name_of(c));
    std::vector<float> w = random_matrix(c.rows, c.k, 11), clean = w;
    const int64_t kn = 1, kp = 2, km = 3;  // NaN, +inf, -inf in row 0
    w[kn] = NAN, w[kp] = INFINITY, w[km] = -INFINITY;
    clean[kn] = clean[kp] = clean[km] = 0.0f;
    Qm q = make_q(c.f, c.rows, c.k, c.group, c.sdt, c.pad), qc = q;
    const fm::QuantResult res = fm::quantize(q.l, w.data(), q.out());
    ASSERT_TRUE(res.ok);
    EXPECT_EQ(res.nonfinite, 3);
    run(qc, clean);
    EXPECT_EQ(q.scales, qc.scales);
    EXPECT_EQ(q.row_scales, qc.row_scales);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t k = 0; k < c.k; ++k) {
        if (r == 0 && k >= 1 && k <= 3) continue;
        ASSERT_EQ(code_at(q, r, k), code_at(qc, r, k)) << "row " << r << " k " << k;
        if ((c.f == Format::q4_0 || c.f == Format::q8_0) && k % 32 == 0) {
          ASSERT_EQ(gguf_d(q, r, k), gguf_d(qc, r, k));
        }
      }
    std::string msgs;
    EXPECT_EQ(check(q, w, &msgs), 0) << msgs;  // the finite elements still obey the rules
    const fm::MatrixRef m = q.ref();
    const double vn = fm::weight(q.l, m, 0, kn), vp = fm::weight(q.l, m, 0, kp),
                 vm = fm::weight(q.l, m, 0, km);
    if (c.f == Format::bf16 || c.f == Format::mxfp8_e5m2) {
      EXPECT_TRUE(std::isnan(vn));
      EXPECT_EQ(vp, INFINITY);
      EXPECT_EQ(vm, -INFINITY);
      continue;
    }
    EXPECT_EQ(vn, 0.0);
    // Largest magnitude of each sign among the block's representable values.
    double most = 0, least = 0;
    for (int code : finite_codes(c.f)) {
      Qm t = q;
      set_code(t, 0, kp, code);
      const double v = fm::weight(t.l, t.ref(), 0, kp);
      most = std::max(most, v), least = std::min(least, v);
    }
    EXPECT_EQ(vp, most);
    EXPECT_EQ(vm, least);
  }
}

TEST(Quantize, AllNonFiniteAndZeroBlocksAreDefined) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    for (float v : {0.0f, -0.0f, NAN, INFINITY}) {
      Qm q = make_q(c.f, c.rows, c.k, c.group, c.sdt, c.pad);
      const std::vector<float> w(size_t(c.rows * c.k), v);
      run(q, w);
      for (int64_t i = 0; i < std::min<int64_t>(c.rows * c.k, 64); ++i) {
        const double got = fm::weight(q.l, q.ref(), i / c.k, i % c.k);
        if (v == 0 || (std::isnan(v) && c.f != Format::bf16 && c.f != Format::mxfp8_e5m2)) {
          EXPECT_EQ(got, 0.0);
        }
      }
      std::string msgs;
      EXPECT_EQ(check(q, w, &msgs), 0) << msgs;
    }
  }
}

TEST(Quantize, RejectsBadLayouts) {
  std::vector<float> w(4096, 1.0f);
  auto bad = [&](Qm q, const char* what) {
    const fm::QuantResult r = fm::quantize(q.l, w.data(), q.out());
    EXPECT_FALSE(r.ok) << what;
    EXPECT_NE(r.error, nullptr) << what;
  };
  Qm q = make_q(Format::mxfp4, 2, 64);
  q.l.k = 48;
  bad(q, "mxfp4 K 48");
  q = make_q(Format::nvfp4, 2, 64);
  q.l.group = 32;
  bad(q, "nvfp4 group 32");
  q = make_q(Format::mxfp8_e4m3, 2, 128, 64);
  q.l.group = 16;
  bad(q, "mxfp8 group 16");
  q = make_q(Format::fp8_block, 2, 64);
  q.l.scale_stride = 0;
  q.l.k = 200;
  q.l.scale_stride = 1;
  bad(q, "stride below the scale columns");
  q = make_q(Format::nvfp4, 2, 64);
  q.row_scales.clear();
  bad(q, "nvfp4 without row scales");
  q = make_q(Format::q8_0, 2, 64);
  q.l.rows = 0;
  bad(q, "zero rows");
}

TEST(Quantize, Nvfp4TensorGlobal) {
  Qm q = make_q(Format::nvfp4, 4, 64);
  const std::vector<float> w = random_matrix(4, 64, 3);
  fm::QuantOptions opt;
  opt.nvfp4_tensor_global = true;
  run(q, w, opt);
  float amax = 0;
  for (float v : w) amax = std::max(amax, std::fabs(v));
  for (float g : q.row_scales) EXPECT_EQ(g, std::max(amax / 2688.0f, FLT_MIN));
  // Every element within its bound: the checker's per-row global rule does not
  // apply, so check elements only.
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t k = 0; k < 64; ++k) {
      const double S =
          double(fm::e4m3_to_f32(q.scales[size_t(r * q.l.scale_stride + k / 16)])) * q.row_scales[size_t(r)];
      std::string why;
      if (S > 0) {
        EXPECT_TRUE(rne_ok(kE2m1, w[size_t(r * 64 + k)], S, fm::weight(q.l, q.ref(), r, k),
                           code_at(q, r, k) & 1, &why))
            << why;
      }
    }
}

// ------------------------------------------------------------------ element encoders, exhaustively

// Every finite code comes back; every midpoint of neighbouring values goes to the
// even code; one fp32 step either side of a midpoint goes to the nearer code.
void exhaustive(const Elem& E, int ncodes, int sign_bit, float (*dec)(uint8_t), uint8_t (*enc)(float)) {
  SCOPED_TRACE(E.name);
  std::vector<int> mags;
  for (int c = 0; c < sign_bit; ++c) {
    const float v = dec(uint8_t(c));
    if (std::isfinite(v) && v <= E.maxv) mags.push_back(c);
  }
  for (int c = 0; c < ncodes; ++c)
    if (std::find(mags.begin(), mags.end(), c & (sign_bit - 1)) != mags.end()) {
      EXPECT_EQ(enc(dec(uint8_t(c))), c) << c;
    }
  for (size_t i = 0; i + 1 < mags.size(); ++i) {
    const float a = dec(uint8_t(mags[i])), b = dec(uint8_t(mags[i + 1]));
    const float mid = (a + b) / 2;  // exact
    ASSERT_EQ(double(mid), (double(a) + double(b)) / 2);
    const int even = mags[i] % 2 == 0 ? mags[i] : mags[i + 1];
    for (int s : {0, sign_bit}) {
      const float sg = s ? -1.0f : 1.0f;
      EXPECT_EQ(enc(sg * mid), even | s) << "tie " << sg * mid;
      EXPECT_EQ(enc(sg * std::nextafter(mid, 0.0f)), mags[i] | s) << "below tie " << mid;
      EXPECT_EQ(enc(sg * std::nextafter(mid, INFINITY)), mags[i + 1] | s) << "above tie " << mid;
    }
  }
}

float dec_e4m3(uint8_t b) { return fm::e4m3_to_f32(b); }
float dec_e5m2(uint8_t b) { return fm::e5m2_to_f32(b); }
float dec_e2m1(uint8_t b) { return fm::e2m1_to_f32(b); }
uint8_t enc_e4m3(float f) { return fm::f32_to_e4m3(f); }
uint8_t enc_e5m2(float f) { return fm::f32_to_e5m2(f); }
uint8_t enc_e2m1(float f) { return fm::f32_to_e2m1(f); }

TEST(ElementEncoders, E4m3) {
  exhaustive(kE4m3, 256, 0x80, dec_e4m3, enc_e4m3);
  EXPECT_EQ(fm::f32_to_e4m3(463.99f), 0x7E);
  EXPECT_EQ(fm::f32_to_e4m3(464.0f), 0x7E);  // tie 448 | 480: even, and 480 is not finite in e4m3fn
  EXPECT_EQ(fm::f32_to_e4m3(1e30f), 0x7E);
  EXPECT_EQ(fm::f32_to_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(fm::f32_to_e4m3(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(fm::f32_to_e4m3(-1e-30f), 0x80);
  EXPECT_EQ(fm::f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie 0 | 2^-9: even
  EXPECT_EQ(fm::f32_to_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);
}

TEST(ElementEncoders, E5m2) {
  exhaustive(kE5m2, 256, 0x80, dec_e5m2, enc_e5m2);
  EXPECT_EQ(fm::f32_to_e5m2(61439.0f), 0x7B);
  EXPECT_EQ(fm::f32_to_e5m2(61440.0f), 0x7C);  // IEEE: the tie goes to the even 65536 = inf
  EXPECT_EQ(fm::f32_to_e5m2(61440.0f, true), 0x7B);
  EXPECT_EQ(fm::f32_to_e5m2(INFINITY, true), 0x7C);
  EXPECT_EQ(fm::f32_to_e5m2(-INFINITY), 0xFC);
  EXPECT_EQ(fm::f32_to_e5m2(NAN) & 0x7F, 0x7E);
}

TEST(ElementEncoders, E2m1) {
  exhaustive(kE2m1, 16, 8, dec_e2m1, enc_e2m1);
  const float in[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 7.0f, 100.0f, -0.1f, INFINITY, NAN};
  const uint8_t want[] = {0, 2, 2, 4, 4, 6, 6, 7, 7, 8, 7, 0};
  for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); ++i) EXPECT_EQ(fm::f32_to_e2m1(in[i]), want[i]) << in[i];
}

TEST(ElementEncoders, E8m0MxScale) {
  EXPECT_EQ(fm::e8m0_mx_scale(0.0f, 8), 0);
  EXPECT_EQ(fm::e8m0_mx_scale(448.0f, 8), 127);  // floor(log2 448) = 8
  EXPECT_EQ(fm::e8m0_mx_scale(511.9f, 8), 127);
  EXPECT_EQ(fm::e8m0_mx_scale(512.0f, 8), 128);
  EXPECT_EQ(fm::e8m0_mx_scale(6.0f, 2), 127);
  EXPECT_EQ(fm::e8m0_mx_scale(FLT_MAX, 2), 252);
  EXPECT_EQ(fm::e8m0_mx_scale(FLT_TRUE_MIN, 8), 0);  // clamped
  EXPECT_EQ(fm::e8m0_mx_scale(std::ldexp(1.0f, -119), 8), 0);
  EXPECT_EQ(fm::e8m0_mx_scale(std::ldexp(1.0f, -118), 8), 1);
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t f16c_encode(float f) {
  return uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#endif

TEST(ElementEncoders, Fp16AgainstF16C) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "CPU has no F16C";
  // Every fp16 value, the midpoints between neighbours and one fp32 step either side.
  for (uint32_t h = 0; h < 0x7C00; ++h)
    for (uint32_t s : {0u, 0x8000u}) {
      const float a = fm::fp16_to_f32(uint16_t(h | s)), b = fm::fp16_to_f32(uint16_t((h + 1) | s));
      for (float v :
           {a, (a + b) / 2, std::nextafter((a + b) / 2, 0.0f), std::nextafter((a + b) / 2, INFINITY)})
        ASSERT_EQ(fm::f32_to_fp16(v), f16c_encode(v)) << v;
    }
  moejit_test::Rng g(9);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = g();
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(fm::f32_to_fp16(f), f16c_encode(f)) << f;
  }
#else
  GTEST_SKIP() << "not x86";
#endif
}

// ------------------------------------------------------------------ numerics banks

// Fill::quantized (tests/numerics_ref) builds every format's bank, including
// nvfp4 (with per-row globals) and ds_fp4 whose kernels are not in this build:
// layout, poisoned scale padding and finite dequantized weights.
TEST(QuantizedBanks, EveryFormat) {
  for (int id = 0; id <= fm::kMaxFormatId; ++id) {
    const auto fmt = static_cast<moejit_format>(id);
    for (moejit_dtype sdt : {MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_F32}) {
      if (sdt == MOEJIT_DTYPE_F32 && fmt != MOEJIT_FORMAT_FP8_BLOCK) continue;
      SCOPED_TRACE(std::string(fm::format_name(Format(id))) + (sdt == MOEJIT_DTYPE_F32 ? " f32 scales" : ""));
      moejit_test::Rng rng(uint64_t(id) + 1);
      // gpt-oss's hidden size; a multiple of 256 for the K-quants
      const int64_t rows = 130, k = fm::is_kquant(Format(id)) ? 2816 : 2880, pad = 2;
      const moejit_test::Mat m =
          moejit_test::make_mat(fmt, sdt, rows, k, pad, moejit_test::Fill::quantized, true, rng);
      const fm::Layout l = m.layout();
      ASSERT_EQ(int64_t(m.data.size()), rows * fm::row_bytes(l.format, k));
      EXPECT_EQ(m.api().row_scales != nullptr, fm::has_row_scales(l.format));
      EXPECT_EQ(m.row_scales.size(), fm::has_row_scales(l.format) ? size_t(rows) : 0u);
      if (fm::has_block_scales(l.format)) {
        EXPECT_EQ(m.stride, m.scols + pad);
        EXPECT_EQ(m.api().scale_row_stride, m.stride);
        const int64_t eb = fm::scale_elem_bytes(l.format, l.scale_dtype);
        for (int64_t sr = 0; sr < m.srows; ++sr)
          for (int64_t sc = m.scols; sc < m.stride; ++sc) {
            const uint8_t* p = &m.scales[size_t((sr * m.stride + sc) * eb)];
            if (eb == 1) {
              EXPECT_EQ(*p, 0xFF);
            } else if (eb == 2) {
              EXPECT_TRUE(std::isnan(fm::bf16_to_f32(uint16_t(p[0] | p[1] << 8))));
            } else {
              float f;
              std::memcpy(&f, p, 4);
              EXPECT_TRUE(std::isnan(f));
            }
          }
      }
      const std::vector<double> w = m.dequant();
      int64_t nonzero = 0;
      for (double v : w) {
        ASSERT_TRUE(std::isfinite(v));
        nonzero += v != 0;
      }
      EXPECT_GT(nonzero, int64_t(w.size()) / 2);
    }
  }
}

}  // namespace
