// formats/kquants quantizers (ggml's quantize_row_q*_K_ref algorithm): round
// trip error, the nearest-level and scale-range properties of that algorithm,
// zero blocks, independence of rows and blocks, non-finite inputs, argument
// checks. Their bytes are compared with ggml's in crosscheck_kquants.
#include <gtest/gtest.h>

#include "kquants_test_util.h"
#include "rng.h"

using namespace kquants_test;

namespace {

std::vector<float> bell_rows(int64_t rows, int64_t k, moejit_test::Rng& rng, float scale) {
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
  moejit_test::Rng rng(31);
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
  moejit_test::Rng rng(32);
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
  moejit_test::Rng rng(33);
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
  moejit_test::Rng rng(34);
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
  moejit_test::Rng rng(35);
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
