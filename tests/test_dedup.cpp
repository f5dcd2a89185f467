// Expert dedup: the same bits with dedup on and off, for every tier, format,
// routing shape and token count up to 64; stats against a hand count; the
// environment switch is read at context creation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "moejit.h"

namespace {

constexpr int H = 200, I = 72, E = 9, K = 4, TM = 64;

struct Bank {
  int format;
  int h = H, i = I;  // hidden and intermediate of this bank
  std::vector<uint8_t> gu, dn;
  std::vector<uint16_t> scales;
  std::vector<uint8_t> gu_scales, dn_scales;  // ds_fp4: e8m0 per 32, dense
  std::vector<moejit_matrix> gum, dnm;
  size_t expert_bytes = 0;
};

// ds_fp4 (mxfp4 bytes, e8m0 scales per 32): H and I multiples of 32 with short
// 128-blocks at the end (320 = 2 * 128 + 64, 160 = 128 + 32), so the x and g
// round trips have tail blocks.
constexpr int kDsH = 320, kDsI = 160;

Bank make_ds_bank(std::mt19937& rng) {
  Bank b;
  b.format = MOEJIT_FORMAT_DS_FP4;
  b.h = kDsH;
  b.i = kDsI;
  const size_t gu_bytes = size_t(2 * kDsI) * kDsH / 2, dn_bytes = size_t(kDsH) * kDsI / 2;
  const size_t gu_sc = size_t(2 * kDsI) * (kDsH / 32), dn_sc = size_t(kDsH) * (kDsI / 32);
  b.gu.resize(E * gu_bytes);
  b.dn.resize(E * dn_bytes);
  b.gu_scales.resize(E * gu_sc);
  b.dn_scales.resize(E * dn_sc);
  for (auto& x : b.gu) x = uint8_t(rng());
  for (auto& x : b.dn) x = uint8_t(rng());
  for (auto* v : {&b.gu_scales, &b.dn_scales})
    for (auto& x : *v) x = uint8_t(121 + rng() % 8);  // 2^-6 .. 2^1
  b.gum.resize(E);
  b.dnm.resize(E);
  for (int e = 0; e < E; ++e) {
    b.gum[size_t(e)] = {b.gu.data() + e * gu_bytes, b.gu_scales.data() + e * gu_sc, 0, nullptr, nullptr};
    b.dnm[size_t(e)] = {b.dn.data() + e * dn_bytes, b.dn_scales.data() + e * dn_sc, 0, nullptr, nullptr};
  }
  b.expert_bytes = gu_bytes + dn_bytes + gu_sc + dn_sc;
  return b;
}

Bank make_bank(int format, std::mt19937& rng) {
  Bank b;
  b.format = format;
  const size_t eb = format == MOEJIT_FORMAT_BF16 ? 2 : 1;
  b.gu.resize(size_t(E) * 2 * I * H * eb);
  b.dn.resize(size_t(E) * H * I * eb);
  for (auto* v : {&b.gu, &b.dn}) {
    for (auto& x : *v) x = uint8_t(rng());
    if (eb == 2)
      for (size_t i = 1; i < v->size(); i += 2) (*v)[i] = uint8_t((rng() & 0x80) | (0x3A + rng() % 4));
  }
  b.scales.assign(64, 0x3C00);  // enough scale rows/columns for both projections
  b.gum.resize(E);
  b.dnm.resize(E);
  for (int e = 0; e < E; ++e) {
    b.gum[size_t(e)] = {b.gu.data() + size_t(e) * 2 * I * H * eb, b.scales.data(), 0, nullptr, nullptr};
    b.dnm[size_t(e)] = {b.dn.data() + size_t(e) * H * I * eb, b.scales.data(), 0, nullptr, nullptr};
  }
  b.expert_bytes = 3 * size_t(I) * H * eb;
  if (format ==
      MOEJIT_FORMAT_FP8_BLOCK)  // bf16 scales: gate_up [ceil(144/128) x ceil(200/128)] + down [2 x 1]
    b.expert_bytes += (2 * 2 + 2 * 1) * 2;
  return b;
}

enum class Routing { random, skewed, same };

std::vector<int32_t> make_ids(Routing r, std::mt19937& rng) {
  std::vector<int32_t> ids(size_t(TM) * K);
  for (auto& id : ids) {
    switch (r) {
      case Routing::random: id = int32_t(rng() % E); break;
      case Routing::skewed: id = rng() % 4 ? 2 : int32_t(rng() % E); break;
      case Routing::same: id = 5; break;
    }
    if (rng() % 11 == 0) id = rng() % 2 ? -1 : INT32_MIN;  // routes computed elsewhere
  }
  return ids;
}

struct Result {
  std::vector<float> y;
  moejit_moe_stats stats{};
};

Result run(const Bank& b, moejit_isa isa, int threads, uint32_t flags, int T, const std::vector<uint16_t>& x,
           const std::vector<int32_t>& ids, const std::vector<float>& w) {
  Result out;
  moejit_context_desc cd{};
  cd.struct_size = sizeof cd;
  cd.num_threads = threads;
  cd.max_isa = isa;
  cd.flags = flags;
  moejit_context* ctx = nullptr;
  EXPECT_EQ(moejit_context_create(&cd, &ctx), MOEJIT_OK) << moejit_last_error();
  moejit_moe_desc d{};
  d.struct_size = sizeof d;
  d.format = moejit_format(b.format);
  d.hidden = b.h;
  d.intermediate = b.i;
  d.num_experts = E;
  d.top_k = K;
  d.max_tokens = TM;
  d.activation = MOEJIT_ACT_SILU;
  d.output_dtype = MOEJIT_DTYPE_F32;
  d.gate_up = b.gum.data();
  d.down = b.dnm.data();
  moejit_moe* moe = nullptr;
  EXPECT_EQ(moejit_moe_create(ctx, &d, &moe), MOEJIT_OK) << moejit_last_error();
  out.y.assign(size_t(T) * b.h, -1.0f);
  EXPECT_EQ(moejit_moe_forward(moe, T, x.data(), ids.data(), w.data(), out.y.data()), MOEJIT_OK)
      << moejit_last_error();
  out.stats.struct_size = sizeof out.stats;
  EXPECT_EQ(moejit_moe_stats_get(moe, &out.stats), MOEJIT_OK);
  moejit_moe_destroy(moe);
  moejit_context_destroy(ctx);
  return out;
}

TEST(Dedup, SameBitsOnAndOffEveryTierAndRouting) {
  std::mt19937 rng(7);
  std::vector<uint16_t> x(size_t(TM) * kDsH);
  for (auto& v : x) v = uint16_t(0x3C00 + rng() % 0x400 + (rng() & 0x8000));
  std::vector<float> w(size_t(TM) * K);
  for (auto& v : w) v = float(rng() % 1000) / 1000.0f;
  for (int format : {MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_FP8_BLOCK, MOEJIT_FORMAT_DS_FP4}) {
    const Bank b = format == MOEJIT_FORMAT_DS_FP4 ? make_ds_bank(rng) : make_bank(format, rng);
    for (int isa = MOEJIT_ISA_SCALAR; isa <= moejit_host_isa(); ++isa) {
      for (Routing r : {Routing::random, Routing::skewed, Routing::same}) {
        const std::vector<int32_t> ids = make_ids(r, rng);
        for (int T : {1, 2, 3, 8, 17, 33, 64}) {
          if (isa == MOEJIT_ISA_SCALAR && T > 17) continue;  // the reference tier is slow
          const Result on = run(b, moejit_isa(isa), 2, 0, T, x, ids, w);
          const Result off = run(b, moejit_isa(isa), 3, MOEJIT_CONTEXT_NO_DEDUP, T, x, ids, w);
          ASSERT_EQ(std::memcmp(on.y.data(), off.y.data(), on.y.size() * 4), 0)
              << "format " << format << " tier " << moejit_isa_name(moejit_isa(isa)) << " routing " << int(r)
              << " tokens " << T;
          int finite_nonzero = 0;  // the comparison is between real numbers, not NaN or zeros
          for (float v : on.y) finite_nonzero += std::isfinite(v) && v != 0.0f;
          EXPECT_GT(finite_nonzero, int(on.y.size()) / 2) << "format " << format << " tokens " << T;
          // Hand count of routes and distinct experts.
          std::set<int32_t> experts;
          uint64_t routes = 0;
          for (int i = 0; i < T * K; ++i)
            if (ids[size_t(i)] >= 0) {
              ++routes;
              experts.insert(ids[size_t(i)]);
            }
          for (const Result* s : {&on, &off}) {
            EXPECT_EQ(s->stats.calls, 1u);
            EXPECT_EQ(s->stats.routes, routes);
            EXPECT_EQ(s->stats.unique_experts, experts.size());
          }
          EXPECT_EQ(on.stats.weight_bytes_read, experts.size() * b.expert_bytes);
          EXPECT_EQ(off.stats.weight_bytes_read, routes * b.expert_bytes);
        }
      }
    }
  }
}

TEST(Dedup, EnvironmentSwitchIsReadAtContextCreation) {
  std::mt19937 rng(9);
  const Bank b = make_bank(MOEJIT_FORMAT_FP8_BLOCK, rng);
  std::vector<uint16_t> x(size_t(TM) * H, 0x3F80);
  std::vector<float> w(size_t(TM) * K, 0.5f);
  std::vector<int32_t> ids(size_t(TM) * K, 3);  // every route to expert 3
  const int T = 8;
  setenv("MOEJIT_DEDUP", "0", 1);
  const Result off = run(b, MOEJIT_ISA_AUTO, 2, 0, T, x, ids, w);
  unsetenv("MOEJIT_DEDUP");
  const Result on = run(b, MOEJIT_ISA_AUTO, 2, 0, T, x, ids, w);
  EXPECT_EQ(off.stats.weight_bytes_read, uint64_t(T) * K * b.expert_bytes);
  EXPECT_EQ(on.stats.weight_bytes_read, b.expert_bytes);
  EXPECT_EQ(std::memcmp(on.y.data(), off.y.data(), on.y.size() * 4), 0);
}

}  // namespace
