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

#include "formats/quantize.h"
#include "moejit.h"
#include "rng.h"

namespace {

// H and I are multiples of 32 (every format's K rule but the K-quants') with
// short 128-blocks at the end (320 = 2 * 128 + 64, 160 = 128 + 32): fp8_block
// scale blocks, the 128-element 4-bit decode chunks and ds_fp4's round trips
// all get tails. The K-quants take H and I multiples of 256 (kHk, kIk).
constexpr int kH = 320, kI = 160, kHk = 512, kIk = 256, E = 9, K = 4, TM = 64;

namespace fm = moejit::formats;

struct Proj {  // one projection of one expert, in the engine's layout
  std::vector<uint8_t> data, scales;
  std::vector<float> row_scales;
};

struct Bank {
  int format;
  int H, I;
  std::vector<Proj> gu, dn;
  std::vector<moejit_matrix> gum, dnm;
  size_t expert_bytes = 0;
};

// Random fp32 weights through formats/quantize (dense scale rows, bf16 scales
// for fp8_block); counts the bytes the stats report per expert.
Proj quantized(fm::Format f, int64_t rows, int64_t k, moejit_test::Rng& rng, size_t* bytes) {
  fm::Layout l;
  l.format = f;
  l.group = fm::default_group(f, 0);
  l.rows = rows;
  l.k = k;
  l.scale_stride = fm::scale_cols(f, l.group, k);
  std::vector<float> w(size_t(rows * k));
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (auto& v : w) v = nd(rng);
  Proj p;
  p.data.resize(size_t(rows * fm::row_bytes(f, k)));
  const int64_t sbytes = fm::has_block_scales(f) ? fm::scale_rows(f, rows) * l.scale_stride *
                                                       fm::scale_elem_bytes(f, fm::ScaleDtype::bf16)
                                                 : 0;
  p.scales.resize(size_t(sbytes));
  if (fm::has_row_scales(f)) p.row_scales.resize(size_t(rows));
  const fm::QuantResult r = fm::quantize(l, w.data(),
                                         {p.data.data(), p.scales.empty() ? nullptr : p.scales.data(),
                                          p.row_scales.empty() ? nullptr : p.row_scales.data()});
  EXPECT_TRUE(r.ok) << r.error;
  *bytes += p.data.size() + p.scales.size() + p.row_scales.size() * 4;
  return p;
}

Bank make_bank(int format, moejit_test::Rng& rng) {
  Bank b;
  b.format = format;
  const bool kq = fm::is_kquant(fm::Format(format));
  b.H = kq ? kHk : kH;
  b.I = kq ? kIk : kI;
  const int H = b.H, I = b.I;
  for (int e = 0; e < E; ++e) {
    size_t bytes = 0;
    b.gu.push_back(quantized(fm::Format(format), 2 * I, H, rng, &bytes));
    b.dn.push_back(quantized(fm::Format(format), H, I, rng, &bytes));
    b.expert_bytes = bytes;
  }
  auto mat = [](const Proj& p) {
    return moejit_matrix{p.data.data(), p.scales.empty() ? nullptr : p.scales.data(), 0,
                         p.row_scales.empty() ? nullptr : p.row_scales.data(), nullptr};
  };
  for (int e = 0; e < E; ++e) {
    b.gum.push_back(mat(b.gu[size_t(e)]));
    b.dnm.push_back(mat(b.dn[size_t(e)]));
  }
  return b;
}

enum class Routing { random, skewed, same };

std::vector<int32_t> make_ids(Routing r, moejit_test::Rng& rng) {
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
  const int H = b.H;
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
  d.hidden = b.H;
  d.intermediate = b.I;
  d.num_experts = E;
  d.top_k = K;
  d.max_tokens = TM;
  d.activation = MOEJIT_ACT_SILU;
  d.output_dtype = MOEJIT_DTYPE_F32;
  d.gate_up = b.gum.data();
  d.down = b.dnm.data();
  moejit_moe* moe = nullptr;
  EXPECT_EQ(moejit_moe_create(ctx, &d, &moe), MOEJIT_OK) << moejit_last_error();
  out.y.assign(size_t(T) * H, -1.0f);
  EXPECT_EQ(moejit_moe_forward(moe, T, x.data(), ids.data(), w.data(), out.y.data()), MOEJIT_OK)
      << moejit_last_error();
  out.stats.struct_size = sizeof out.stats;
  EXPECT_EQ(moejit_moe_stats_get(moe, &out.stats), MOEJIT_OK);
  moejit_moe_destroy(moe);
  moejit_context_destroy(ctx);
  return out;
}

TEST(Dedup, SameBitsOnAndOffEveryTierAndRouting) {
  moejit_test::Rng rng(7);
  std::vector<uint16_t> x(size_t(TM) * kHk);
  for (auto& v : x) v = uint16_t(0x3C00 + rng() % 0x400 + (rng() & 0x8000));
  std::vector<float> w(size_t(TM) * K);
  for (auto& v : w) v = float(rng() % 1000) / 1000.0f;
  for (int format = 0; format <= moejit_max_format_id(); ++format) {
    const Bank b = make_bank(format, rng);
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
  moejit_test::Rng rng(9);
  const Bank b = make_bank(MOEJIT_FORMAT_FP8_BLOCK, rng);
  std::vector<uint16_t> x(size_t(TM) * kHk, 0x3F80);
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
