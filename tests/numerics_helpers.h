// RAII handles and call helpers shared by the numerics suites.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "moejit.h"
#include "numerics_ref.h"
#include "test_util.h"

namespace moejit_test {

struct CtxDeleter {
  void operator()(moejit_context* c) const { moejit_context_destroy(c); }
};
struct MoeDeleter {
  void operator()(moejit_moe* m) const { moejit_moe_destroy(m); }
};
struct LinearDeleter {
  void operator()(moejit_linear* l) const { moejit_linear_destroy(l); }
};
using CtxPtr = std::unique_ptr<moejit_context, CtxDeleter>;
using MoePtr = std::unique_ptr<moejit_moe, MoeDeleter>;
using LinearPtr = std::unique_ptr<moejit_linear, LinearDeleter>;

// A context on exactly `tier` (fails the test when the library reports another).
inline CtxPtr make_ctx(moejit_isa tier, int threads, uint32_t flags = 0,
                       const std::vector<int32_t>* cpus = nullptr) {
  clear_isa_env();
  moejit_context_desc d = context_desc(tier, threads);
  d.flags = flags;
  if (cpus) {
    d.cpu_ids = cpus->data();
    d.num_cpu_ids = int32_t(cpus->size());
  }
  moejit_context* c = nullptr;
  const moejit_status st = moejit_context_create(&d, &c);
  EXPECT_EQ(st, MOEJIT_OK) << moejit_isa_name(tier) << ": " << last_error();
  if (st != MOEJIT_OK) return nullptr;
  if (tier != MOEJIT_ISA_AUTO) {
    EXPECT_EQ(moejit_context_isa(c), tier)
        << "forced " << moejit_isa_name(tier) << ", context runs " << moejit_isa_name(moejit_context_isa(c));
    if (moejit_context_isa(c) != tier) {
      moejit_context_destroy(c);
      return nullptr;
    }
  }
  return CtxPtr(c);
}

inline MoePtr make_moe_obj(moejit_context* ctx, const MoeData& d) {
  const moejit_moe_desc desc = d.desc();
  moejit_moe* m = nullptr;
  const moejit_status st = moejit_moe_create(ctx, &desc, &m);
  EXPECT_EQ(st, MOEJIT_OK) << d.p.name << ": " << last_error();
  return MoePtr(st == MOEJIT_OK ? m : nullptr);
}

inline LinearPtr make_linear_obj(moejit_context* ctx, const moejit_linear_desc& desc,
                                 const std::string& name) {
  moejit_linear* l = nullptr;
  const moejit_status st = moejit_linear_create(ctx, &desc, &l);
  EXPECT_EQ(st, MOEJIT_OK) << name << ": " << last_error();
  return LinearPtr(st == MOEJIT_OK ? l : nullptr);
}

inline size_t dsize(moejit_dtype dt) { return dt == MOEJIT_DTYPE_F32 ? 4 : 2; }

// y of a call on the first `tokens` tokens; checks nothing past those rows was
// written (the buffer holds max_tokens rows plus a guard).
inline std::vector<uint8_t> moe_call(moejit_moe* moe, const MoeData& d, int tokens, bool submit = false,
                                     moejit_context* ctx = nullptr) {
  const size_t row = size_t(d.p.H) * dsize(d.p.out);
  Sentinel y(row * size_t(d.p.max_tokens) + 256);
  moejit_status st;
  if (submit) {
    st = moejit_moe_submit(moe, tokens, d.x.data(), d.ids.data(), d.w.data(), y.data());
    EXPECT_EQ(st, MOEJIT_OK) << d.p.name << ": " << last_error();
    EXPECT_EQ(moejit_context_wait(ctx), MOEJIT_OK) << last_error();
  } else {
    st = moejit_moe_forward(moe, tokens, d.x.data(), d.ids.data(), d.w.data(), y.data());
    EXPECT_EQ(st, MOEJIT_OK) << d.p.name << " tokens " << tokens << ": " << last_error();
  }
  EXPECT_EQ(y.first_changed(row * size_t(tokens)), -1)
      << d.p.name << ": y written past " << tokens << " rows";
  y.bytes.resize(row * size_t(tokens));
  return y.bytes;
}

inline std::vector<uint8_t> linear_call(moejit_linear* lin, const LinearData& d, int tokens) {
  const size_t row = size_t(d.p.rows) * dsize(d.p.out);
  Sentinel y(row * size_t(d.p.max_tokens) + 256);
  const moejit_status st = moejit_linear_forward(lin, tokens, d.x.data(), y.data());
  EXPECT_EQ(st, MOEJIT_OK) << d.p.name << " tokens " << tokens << ": " << last_error();
  EXPECT_EQ(y.first_changed(row * size_t(tokens)), -1)
      << d.p.name << ": y written past " << tokens << " rows";
  y.bytes.resize(row * size_t(tokens));
  return y.bytes;
}

// Every token count 1..max_tokens of a MoE problem through one layer on a
// two-worker context of `tier`, each checked against the float64 reference;
// stops at the first count with a mismatch.
inline void expect_moe_matches(moejit_isa tier, const MoeData& d, const Reference& ref) {
  CtxPtr ctx = make_ctx(tier, 2);
  ASSERT_TRUE(ctx);
  MoePtr m = make_moe_obj(ctx.get(), d);
  ASSERT_TRUE(m);
  for (int T = 1; T <= d.p.max_tokens; ++T) {
    const std::vector<uint8_t> y = moe_call(m.get(), d, T);
    const std::string what = d.p.name + " tier " + moejit_isa_name(tier) + " num_tokens " + std::to_string(T);
    if (check_against(y, d.p.out, ref, T, d.p.H, what) > 0) break;
  }
}

// A dense linear problem's data, float64 reference and layer on a context of
// `tier` with two workers; the caller checks HasFatalFailure() after open().
struct LinearRun {
  LinearData d;
  Reference ref;
  CtxPtr ctx;
  LinearPtr l;
  void open(moejit_isa tier, const LinearProblem& p) {
    d = make_linear(p);
    ref = linear_reference(d);
    ctx = make_ctx(tier, 2);
    ASSERT_TRUE(ctx);
    l = make_linear_obj(ctx.get(), d.desc(), p.name);
    ASSERT_TRUE(l);
  }
};

// The same for a dense linear problem, its data and reference made here.
inline void expect_linear_matches(moejit_isa tier, const LinearProblem& p) {
  LinearRun r;
  r.open(tier, p);
  if (::testing::Test::HasFatalFailure()) return;
  for (int T = 1; T <= p.max_tokens; ++T) {
    const std::vector<uint8_t> y = linear_call(r.l.get(), r.d, T);
    const std::string what = p.name + " tier " + moejit_isa_name(tier) + " num_tokens " + std::to_string(T);
    if (check_against(y, p.out, r.ref, T, p.rows, what) > 0) break;
  }
}

// Weight and scale bytes of one matrix as the stats count them (nvfp4's row
// globals included), and of one expert: every bank's first matrix.
inline uint64_t mat_bytes(const Mat& m) {
  const fm::Layout l = m.layout();
  return uint64_t(m.data.size()) +
         uint64_t(m.srows * m.scols * fm::scale_elem_bytes(l.format, l.scale_dtype)) +
         uint64_t(m.row_scales.size() * 4);
}
inline uint64_t expert_bytes(const MoeData& d) {
  uint64_t n = 0;
  for (const std::vector<Mat>* bank : {&d.gu, &d.up, &d.dn})
    if (!bank->empty()) n += mat_bytes((*bank)[0]);
  return n;
}

inline int count_finite_nonzero(const std::vector<uint8_t>& y, moejit_dtype dt) {
  int n = 0;
  for (size_t i = 0; i < y.size() / dsize(dt); ++i) {
    const double v = y_at(y, dt, i);
    n += std::isfinite(v) && v != 0;
  }
  return n;
}

// The layer on 1 and 3 threads and on 2 without dedup, max_tokens tokens: the
// same bits (tokens batch differently in each), most outputs finite and
// nonzero, and weight_bytes_read = distinct experts (dedup) or routes (no
// dedup) times the expert's bytes.
inline void expect_same_bits_any_threads_and_dedup(moejit_isa tier, const MoeData& d) {
  const MoeProblem& p = d.p;
  std::vector<uint8_t> first;
  for (auto [threads, flags] : {std::pair<int, uint32_t>{1, 0u}, {3, 0u}, {2, MOEJIT_CONTEXT_NO_DEDUP}}) {
    CtxPtr ctx = make_ctx(tier, threads, flags);
    ASSERT_TRUE(ctx);
    MoePtr m = make_moe_obj(ctx.get(), d);
    ASSERT_TRUE(m);
    const int T = p.max_tokens;
    const std::vector<uint8_t> y = moe_call(m.get(), d, T);
    if (first.empty()) {
      first = y;
      EXPECT_GT(count_finite_nonzero(y, p.out), int(y.size() / dsize(p.out)) / 2);
    } else {
      EXPECT_EQ(std::memcmp(first.data(), y.data(), y.size()), 0)
          << "threads " << threads << " flags " << flags;
    }
    std::set<int32_t> experts;
    uint64_t routes = 0;
    for (int s = 0; s < T * p.top_k; ++s)
      if (d.ids[size_t(s)] >= 0) ++routes, experts.insert(d.ids[size_t(s)]);
    moejit_moe_stats st{};
    st.struct_size = sizeof(st);
    ASSERT_EQ(moejit_moe_stats_get(m.get(), &st), MOEJIT_OK);
    EXPECT_EQ(st.weight_bytes_read, (flags ? routes : uint64_t(experts.size())) * expert_bytes(d));
  }
}

}  // namespace moejit_test
