// The float64 reference of a bank's dot products from the tests' own oracles,
// never from formats/: format_oracle.h (written from formats.md) and, for the
// K-quants, the per-bit decoder of kquants_test_util.h. Each weight w = a - b
// (b: a K-quant's dmin m, 0 elsewhere) is kept with |a| + |b|, so the check can
// apply its format's bound to sum(|a x| + |b x|).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "format_oracle.h"
#include "jit_test_util.h"
#include "kquants_test_util.h"

namespace jit_test {

struct Reference {
  int64_t rows = 0, k = 0;
  bool super_blocks = false;   // the K-quants' bound (formats.md)
  std::vector<double> w, mag;  // rows * k: a - b and |a| + |b|
  std::vector<double> smax;    // per row: the largest scale factor, at least 1
};

inline Reference reference_of(const Bank& bank) {
  const fmt::Layout& l = bank.layout;
  const fmt::FormatInfo& fi = fmt::info(l.format);
  Reference ref;
  ref.rows = l.rows, ref.k = l.k;
  ref.super_blocks = fi.scales == fmt::ScaleKind::inline_super;
  ref.w.assign(size_t(l.rows * l.k), 0.0);
  ref.mag.assign(size_t(l.rows * l.k), 0.0);
  ref.smax.assign(size_t(l.rows), 1.0);
  if (ref.super_blocks) {
    const kquants_test::BitMap bm = kquants_test::bit_map(fmt::KQuant(int32_t(l.format)));
    const int64_t row_bytes = l.k / 256 * bm.bytes;
    for (int64_t r = 0; r < l.rows; ++r)
      for (int64_t k0 = 0; k0 < l.k; k0 += 256) {
        const kquants_test::Decoded o =
            kquants_test::decode(bm, bank.wp() + r * row_bytes + k0 / 256 * bm.bytes);
        for (int i = 0; i < 256; ++i) {
          const int j = i / bm.sub_size;
          const double dsq = o.d * o.sc[j] * o.q[i], dm = o.dmin * o.m[j];
          ref.w[size_t(r * l.k + k0 + i)] = dsq - dm;
          ref.mag[size_t(r * l.k + k0 + i)] = std::fabs(dsq) + std::fabs(dm);
          ref.smax[size_t(r)] = std::max({ref.smax[size_t(r)], std::fabs(o.d * o.sc[j]), std::fabs(dm)});
        }
      }
    return ref;
  }
  moejit_test::oracle::Matrix m;
  m.format = l.format;
  m.scale_dtype = l.scale_dtype;
  m.group = l.group;
  m.k = l.k;
  m.data = bank.wp();
  m.scales = bank.scales.empty() ? nullptr : bank.scales.data();
  m.scale_stride = l.scale_stride;
  m.row_scales = bank.row_scales.empty() ? nullptr : bank.row_scales.data();
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t kk = 0; kk < l.k; ++kk) {
      const size_t i = size_t(r * l.k + kk);
      ref.w[i] = moejit_test::oracle::weight(m, r, kk);
      ref.mag[i] = std::fabs(ref.w[i]);
    }
  return ref;
}

// Output `got` of row r for activations x (k floats) against float64, within
// 2^-24 (K + 64) sum|w x|; the K-quants' bound (K + 64) 2^-24 sum(|d sc q x| +
// |dmin m x|) 1.001 carries an absolute term for results in the subnormal range,
// and a non-finite float64 result must come out non-finite (NaN where it is NaN).
inline ::testing::AssertionResult matches(const Reference& ref, int64_t r, const float* x, float got) {
  double want = 0.0, mag = 0.0;
  const double* w = &ref.w[size_t(r * ref.k)];
  const double* a = &ref.mag[size_t(r * ref.k)];
  for (int64_t kk = 0; kk < ref.k; ++kk) {
    const double xv = x[kk];
    want += w[kk] * xv;
    mag += a[kk] * std::fabs(xv);
  }
  double bound = std::ldexp(1.0, -24) * double(ref.k + 64) * mag;
  if (ref.super_blocks) {
    if (!std::isfinite(want)) {
      if (std::isfinite(got) || (std::isnan(want) && !std::isnan(got)))
        return ::testing::AssertionFailure() << "got " << got << " want " << want;
      return ::testing::AssertionSuccess();
    }
    bound = double(ref.k + 64) * (std::ldexp(mag, -24) * 1.001 + std::ldexp(ref.smax[size_t(r)], -149));
  }
  if (!(std::fabs(double(got) - want) <= bound))
    return ::testing::AssertionFailure() << "got " << got << " want " << want << " bound " << bound;
  return ::testing::AssertionSuccess();
}

// Activations for `n` elements in the domain of the format's bound: the K-quants'
// (whose bound has a term for subnormal results) include signed zeros and bf16
// subnormals at several magnitudes (kquants_test_util.h); the others' are bf16
// values in [-1, 1] (some kernels treat subnormal bf16 as zero: vdpbf16ps).
inline std::vector<float> activations(const Reference& ref, int64_t n, moejit_test::Rng& rng) {
  if (ref.super_blocks) return kquants_test::bf16_x(n, rng);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& e : x) e = fmt::round_bf16(float(int(rng() % 2001) - 1000) / 997.0f);
  return x;
}

}  // namespace jit_test
