// Two properties the float64 bounds cannot see, per tier:
//  - the canonical summation order of pass 2 (ascending expert id, ties by route
//    index, from +0.0, one rounding at the end), checked bit for bit with route
//    contributions that are exact in fp32 whatever the kernel does;
//  - no read or write outside the caller's buffers: every weight, scale, bias,
//    x, ids, weights and y buffer ends (or starts) at a PROT_NONE page.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "moejit.h"
#include "numerics_helpers.h"
#include "numerics_ref.h"
#include "test_util.h"

using namespace moejit_test;

namespace {

class EdgeTier : public ::testing::TestWithParam<moejit_isa> {
 protected:
  void SetUp() override {
    clear_isa_env();
    tier_ = GetParam();
    if (tier_ > moejit_host_isa()) {
      GTEST_SKIP() << "tier " << moejit_isa_name(tier_) << " is above this host's "
                   << moejit_isa_name(moejit_host_isa());
    }
  }
  moejit_isa tier_ = MOEJIT_ISA_AUTO;
};

INSTANTIATE_TEST_SUITE_P(Tiers, EdgeTier, ::testing::ValuesIn(kTiers),
                         [](const auto& info) { return std::string(moejit_isa_name(info.param)); });

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

// Down weights are all zero, so each route contributes exactly w * bias_down[h]
// (a bf16 value times a power of two: exact in fp32). Large contributions of
// both signs around small ones make the fp32 sum depend on the order.
// ds_fp4 rounds each weighted route output to bf16 before the sum: its router
// weights are not powers of two, so fp32(w * bias) is rounded again to bf16, and
// the expected bits follow that.
TEST_P(EdgeTier, CanonicalSummationOrderBitExact) {
  // Mostly +-2^24 and +-2^23 with small values in between: the sum depends on the order.
  const float biases[] = {16777216.0f, -16777216.0f, 8388608.0f, -8388608.0f, 1.0f,
                          3.0f,        -1.0f,        0.5f,       0.0f,        -3.0f};
  const float pow2_weights[] = {1.0f, 0.5f, 2.0f, 1.0f, 0.25f, 1.0f, 4.0f};
  const float ds_weights[] = {1.0f, 0.3f, 2.7f, 1.1f, 0.77f, 1.0f, 4.0f};
  for (moejit_format fmt : {MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_FP8_BLOCK, MOEJIT_FORMAT_DS_FP4})
    for (int rwoi : {0, 1})
      for (moejit_dtype out : {MOEJIT_DTYPE_F32, MOEJIT_DTYPE_BF16}) {
        const bool ds = fmt == MOEJIT_FORMAT_DS_FP4;
        const float* weights = ds ? ds_weights : pow2_weights;
        MoeProblem p;
        p.name = std::string("canonical_order_") + moejit_format_name(fmt) + (rwoi ? "_rwoi" : "") +
                 (out == MOEJIT_DTYPE_F32 ? "_f32out" : "_bf16out");
        p.fmt = fmt;
        p.H = ds ? 64 : 40;  // ds_fp4: K % 32
        p.I = ds ? 32 : 8;
        p.E = 6;
        p.top_k = 6;
        p.max_tokens = 9;
        p.bias = true;
        p.rwoi = rwoi;
        p.out = out;
        p.seed = 101 + uint64_t(rwoi);
        MoeData d = make_moe(p);
        Rng rng(202);
        for (int e = 0; e < p.E; ++e) {
          Mat& dn = d.dn[size_t(e)];
          std::fill(dn.data.begin(), dn.data.end(), 0);  // bf16 +0 / e4m3 code 0 / e2m1 +0
          for (int h = 0; h < p.H; ++h) dn.bias[size_t(h)] = fm::f32_to_bf16(biases[rng.uniform(0, 9)]);
        }
        for (size_t i = 0; i < d.w.size(); ++i) d.w[i] = weights[rng.uniform(0, 6)];
        for (int t = 0; t < p.max_tokens; ++t)  // dense duplicates, random order
          for (int j = 0; j < p.top_k; ++j)
            if (t != 2 && rng.chance(0.5)) d.ids[size_t(t * p.top_k + j)] = rng.uniform(0, 2);

        // Expected bits: the contract's order, and two wrong orders that must differ somewhere.
        std::vector<float> want(size_t(p.max_tokens * p.H)), by_route(want.size()), descending(want.size()),
            unrounded(want.size());
        for (int t = 0; t < p.max_tokens; ++t) {
          std::vector<std::pair<int, int>> r;
          for (int j = 0; j < p.top_k; ++j)
            if (d.ids[size_t(t * p.top_k + j)] >= 0) r.push_back({d.ids[size_t(t * p.top_k + j)], j});
          std::vector<std::pair<int, int>> canon = r;
          std::sort(canon.begin(), canon.end());
          std::vector<std::pair<int, int>> desc = canon;
          std::reverse(desc.begin(), desc.end());
          for (int h = 0; h < p.H; ++h) {
            auto sum = [&](const std::vector<std::pair<int, int>>& order, bool round_routes) {
              float acc = 0.0f;
              for (auto [e, j] : order) {
                const float b = fm::bf16_to_f32(d.dn[size_t(e)].bias[size_t(h)]);
                const float c = rwoi ? b : d.w[size_t(t * p.top_k + j)] * b;
                acc += round_routes ? fm::round_bf16(c) : c;
              }
              return acc;
            };
            want[size_t(t * p.H + h)] = sum(canon, ds);
            by_route[size_t(t * p.H + h)] = sum(r, ds);
            descending[size_t(t * p.H + h)] = sum(desc, ds);
            unrounded[size_t(t * p.H + h)] = sum(canon, false);
          }
        }
        auto store = [&](float v) {
          return out == MOEJIT_DTYPE_F32 ? f32_bits(v) : uint32_t(fm::f32_to_bf16(v));
        };
        int differs_route = 0, differs_desc = 0, differs_unrounded = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          differs_route += store(want[i]) != store(by_route[i]);
          differs_desc += store(want[i]) != store(descending[i]);
          differs_unrounded += store(want[i]) != store(unrounded[i]);
        }
        ASSERT_GT(differs_route, 0) << "test data does not distinguish route order";
        ASSERT_GT(differs_desc, 0) << "test data does not distinguish descending order";
        if (ds && !rwoi) {
          ASSERT_GT(differs_unrounded, 0) << "test data does not distinguish bf16-rounded route outputs";
        }

        CtxPtr ctx = make_ctx(tier_, 2);
        ASSERT_TRUE(ctx);
        MoePtr m = make_moe_obj(ctx.get(), d);
        ASSERT_TRUE(m);
        for (int T : {9, 4}) {
          const std::vector<uint8_t> y = moe_call(m.get(), d, T);
          int bad = 0;
          for (int t = 0; t < T; ++t)
            for (int h = 0; h < p.H; ++h) {
              const size_t i = size_t(t * p.H + h);
              uint32_t got;
              if (out == MOEJIT_DTYPE_F32) {
                std::memcpy(&got, &y[i * 4], 4);
              } else {
                uint16_t g16;
                std::memcpy(&g16, &y[i * 2], 2);
                got = g16;
              }
              if (got != store(want[i]) && bad++ < 6) {
                ADD_FAILURE() << p.name << " tier " << moejit_isa_name(tier_) << " num_tokens " << T
                              << " token " << t << " index " << h << ": got bits 0x" << std::hex << got
                              << ", canonical order 0x" << store(want[i]) << ", route order 0x"
                              << store(by_route[i]) << ", descending 0x" << store(descending[i]);
              }
            }
          EXPECT_EQ(bad, 0) << p.name << ": " << bad << " elements not summed in canonical order";
        }
      }
}

// ds_fp4 round-trips g through e4m3 per block of 128 of I. One-hot down rows
// (row h reads g[h] with weight 1.0), no biases, router weights 1 and fp32 y make
// y[t][h] the kernel's g'[h] itself, with nothing summed: the reference bound is
// then tight, and each block's values must be e4m3 values times the block's own
// power-of-two scale. Up rows get e8m0 scales 2^0..2^-24, so g spans ~2^24 inside
// every block and the small elements land in e4m3's subnormal range or on zero:
// which elements do depends on which 128 elements share a scale (I = 320: blocks
// of 128, 128 and a 64-element tail).
TEST_P(EdgeTier, DsFp4RoundTripOfGPerBlockOf128) {
  for (int interleaved : {0, 1}) {
    MoeProblem p;
    p.name = std::string("ds_fp4_g_blocks") + (interleaved ? "_il" : "_concat");
    p.fmt = MOEJIT_FORMAT_DS_FP4;
    p.H = 320;
    p.I = 320;
    p.E = 3;
    p.top_k = 1;
    p.max_tokens = 9;
    p.act = MOEJIT_ACT_SILU;
    p.interleaved = interleaved;
    p.out = MOEJIT_DTYPE_F32;
    p.seed = 303 + uint64_t(interleaved);
    MoeData d = make_moe(p);
    const int I = p.I, H = p.H;
    for (int e = 0; e < p.E; ++e) {
      Mat& gu = d.gu[size_t(e)];
      for (int j = 0; j < I; ++j) {
        const int r = interleaved ? 2 * j + 1 : I + j;  // up row j
        for (int64_t sc = 0; sc < gu.scols; ++sc)
          gu.scales[size_t(r * gu.stride + sc)] = uint8_t(127 - (j * 7 + e) % 25);
      }
      Mat& dn = d.dn[size_t(e)];
      std::fill(dn.data.begin(), dn.data.end(), 0);  // e2m1 +0
      for (int h = 0; h < H; ++h) {
        dn.data[size_t(h * (I / 2) + h / 2)] = uint8_t(h % 2 ? 0x20 : 0x02);  // e2m1 code 2 = 1.0 at column h
        for (int64_t sc = 0; sc < dn.scols; ++sc) dn.scales[size_t(h * dn.stride + sc)] = 127;
      }
    }
    std::fill(d.w.begin(), d.w.end(), 1.0f);
    const Reference ref = moe_reference(d);
    EXPECT_LE(ref.significant * 100, ref.g_elems) << p.name << ": too many ambiguous g elements";
    CtxPtr ctx = make_ctx(tier_, 2);
    ASSERT_TRUE(ctx);
    MoePtr m = make_moe_obj(ctx.get(), d);
    ASSERT_TRUE(m);
    const std::vector<uint8_t> y = moe_call(m.get(), d, p.max_tokens);
    const std::string what = p.name + " tier " + moejit_isa_name(tier_);
    check_against(y, p.out, ref, p.max_tokens, H, what);
    int checked_blocks = 0, bad = 0, subnormal = 0;
    for (int t = 0; t < p.max_tokens; ++t) {
      if (ref.all_skipped[size_t(t)]) continue;
      for (int b0 = 0; b0 < I; b0 += 128) {
        const int b1 = std::min(I, b0 + 128);
        double amax = 0;
        for (int i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(y_at(y, p.out, size_t(t * H + i))));
        // The block's g' max is e4m3(g max / s) * s in [224 s, 448 s]: this gives s, or s / 2
        // when it is exactly 224 s (a finer grid that still holds every value of the s grid).
        const double s = ds_scale(amax);
        for (int i = b0; i < b1; ++i) {
          const double v = y_at(y, p.out, size_t(t * H + i)) / s;
          subnormal += v != 0 && std::fabs(v) < std::ldexp(1.0, -6);
          if (e4m3_rne(v) != v && bad++ < 6)
            ADD_FAILURE() << what << " token " << t << " g'[" << i << "] = " << v * s
                          << " is not an e4m3 value times its block's scale " << s;
        }
        ++checked_blocks;
      }
    }
    EXPECT_EQ(bad, 0) << what;
    EXPECT_GT(checked_blocks, 10) << what;
    EXPECT_GT(subnormal, 20) << what << ": the data should put elements in e4m3's subnormal range";
  }
}

// ------------------------------------------------------------------ guard pages

namespace {

// The one guard-page buffer of the tests (tests/fuzz/fuzz_util.h): `bytes`
// touching a PROT_NONE page on the chosen side.
using fuzz::Guarded;

struct GuardedCopies {
  std::vector<std::unique_ptr<Guarded>> bufs;
  bool after;
  template <class T>
  T* copy(const std::vector<T>& v) {
    if (v.empty()) return nullptr;
    bufs.push_back(std::make_unique<Guarded>(v.size() * sizeof(T), after));
    std::memcpy(bufs.back()->data(), v.data(), v.size() * sizeof(T));
    return reinterpret_cast<T*>(bufs.back()->data());
  }
  uint8_t* blank(size_t bytes) {
    bufs.push_back(std::make_unique<Guarded>(bytes, after));
    std::memset(bufs.back()->data(), 0xA5, bytes);
    return bufs.back()->data();
  }
  moejit_matrix matrix(const Mat& m) {
    moejit_matrix r = m.api();
    r.data = copy(m.data);
    r.scales = m.scales.empty() ? nullptr : copy(m.scales);
    r.bias = m.bias.empty() ? nullptr : copy(m.bias);
    return r;
  }
};

}  // namespace

TEST_P(EdgeTier, NoAccessOutsideLinearBuffers) {
  for (bool after : {true, false})
    for (moejit_format fmt : {MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_FP8_BLOCK})
      for (moejit_dtype sdt : {MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_F32})
        for (int rows : {1, 3, 130})
          for (int cols : {1, 7, 33, 200, 333}) {
            if (fmt == MOEJIT_FORMAT_BF16 && sdt == MOEJIT_DTYPE_F32) continue;
            LinearProblem p;
            p.name = std::string("guarded_") + moejit_format_name(fmt) + (sdt ? "_f32s" : "") + "_r" +
                     std::to_string(rows) + "_c" + std::to_string(cols) +
                     (after ? "_guard_after" : "_guard_before");
            p.fmt = fmt;
            p.sdt = sdt;
            p.rows = rows;
            p.cols = cols;
            p.max_tokens = 3;
            p.bias = true;
            p.out = rows == 3 ? MOEJIT_DTYPE_BF16 : MOEJIT_DTYPE_F32;
            p.seed = uint64_t(rows * 1000 + cols);
            const LinearData d = make_linear(p);
            GuardedCopies g{{}, after};
            moejit_linear_desc desc = d.desc();
            desc.weight = g.matrix(d.w);
            const uint16_t* x = g.copy(d.x);
            const size_t ybytes = size_t(p.max_tokens * rows) * dsize(p.out);
            uint8_t* y = g.blank(ybytes);
            CtxPtr ctx = make_ctx(tier_, 2);
            ASSERT_TRUE(ctx);
            LinearPtr l = make_linear_obj(ctx.get(), desc, p.name);
            ASSERT_TRUE(l);
            ASSERT_EQ(moejit_linear_forward(l.get(), p.max_tokens, x, y), MOEJIT_OK) << last_error();
            check_against(std::vector<uint8_t>(y, y + ybytes), p.out, linear_reference(d), p.max_tokens, rows,
                          p.name + " tier " + moejit_isa_name(tier_));
          }
}

TEST_P(EdgeTier, NoAccessOutsideMoeBuffers) {
  for (bool after : {true, false})
    for (moejit_format fmt : {MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_FP8_BLOCK})
      for (int H : {1, 33, 130})
        for (int I : {7, 129}) {
          MoeProblem p;
          p.name = std::string("guarded_moe_") + moejit_format_name(fmt) + "_H" + std::to_string(H) + "_I" +
                   std::to_string(I) + (after ? "_guard_after" : "_guard_before");
          p.fmt = fmt;
          p.sdt = H == 33 ? MOEJIT_DTYPE_F32 : MOEJIT_DTYPE_BF16;
          p.H = H;
          p.I = I;
          p.E = 3;
          p.top_k = 2;
          p.max_tokens = 3;
          p.bias = true;
          p.interleaved = I == 7;
          p.fill = Fill::random;
          p.seed = uint64_t(H * 10 + I);
          const MoeData d = make_moe(p);
          GuardedCopies g{{}, after};
          std::vector<moejit_matrix> gu, dn;
          for (int e = 0; e < p.E; ++e) {
            gu.push_back(g.matrix(d.gu[size_t(e)]));
            dn.push_back(g.matrix(d.dn[size_t(e)]));
          }
          moejit_moe_desc desc = d.desc();
          desc.gate_up = g.copy(gu);
          desc.down = g.copy(dn);
          const uint16_t* x = g.copy(d.x);
          const int32_t* ids = g.copy(d.ids);
          const float* w = g.copy(d.w);
          const size_t ybytes = size_t(p.max_tokens * H) * dsize(p.out);
          uint8_t* y = g.blank(ybytes);
          CtxPtr ctx = make_ctx(tier_, 2);
          ASSERT_TRUE(ctx);
          moejit_moe* m = nullptr;
          ASSERT_EQ(moejit_moe_create(ctx.get(), &desc, &m), MOEJIT_OK) << p.name << ": " << last_error();
          MoePtr owner(m);
          ASSERT_EQ(moejit_moe_forward(m, p.max_tokens, x, ids, w, y), MOEJIT_OK) << last_error();
          check_against(std::vector<uint8_t>(y, y + ybytes), p.out, moe_reference(d), p.max_tokens, H,
                        p.name + " tier " + moejit_isa_name(tier_));
        }
}
