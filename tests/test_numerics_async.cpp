// The asynchronous form (api.md "Asynchronous form", "Lifetimes") and the stats
// counters. In flight means "until moejit_context_wait returns", so every BUSY
// below is required by the contract, however fast the first task runs: nothing
// here depends on timing.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "moejit.h"
#include "numerics_helpers.h"
#include "numerics_ref.h"
#include "test_util.h"

using namespace moejit_test;

namespace {

// Large enough to still be running while the calls after submit are made
// (about 100 MB of bf16 weights, 16 tokens x 8 routes on every expert).
MoeData big_moe() {
  MoeProblem p;
  p.name = "big_bf16_H2048_I1024_E8_k8";
  p.fmt = MOEJIT_FORMAT_BF16;
  p.H = 2048;
  p.I = 1024;
  p.E = 8;
  p.top_k = 8;
  p.max_tokens = 16;
  p.fill = Fill::exact;
  p.out = MOEJIT_DTYPE_F32;
  p.seed = 81;
  MoeData d = make_moe(p);
  for (int t = 0; t < p.max_tokens; ++t)
    for (int j = 0; j < p.top_k; ++j) d.ids[size_t(t * p.top_k + j)] = (t + j) % p.E;
  return d;
}

MoeData small_moe(uint64_t seed) {
  MoeProblem p;
  p.name = "small";
  p.fmt = MOEJIT_FORMAT_FP8_BLOCK;
  p.H = 136;
  p.I = 72;
  p.E = 5;
  p.top_k = 2;
  p.max_tokens = 3;
  p.fill = Fill::random;
  p.seed = seed;
  return make_moe(p);
}

LinearData small_linear() {
  LinearProblem p;
  p.name = "small_linear";
  p.rows = 40;
  p.cols = 50;
  p.max_tokens = 2;
  return make_linear(p);
}

size_t y_bytes(const MoeData& d) { return size_t(d.p.max_tokens) * d.p.H * dsize(d.p.out); }

}  // namespace

TEST(Async, BusyWhileInFlightThenSameBitsAsForward) {
  CtxPtr ctx = make_ctx(MOEJIT_ISA_AUTO, 2);
  ASSERT_TRUE(ctx);
  const MoeData big = big_moe();
  const MoeData small = small_moe(82);
  const LinearData ld = small_linear();
  MoePtr mbig = make_moe_obj(ctx.get(), big);
  MoePtr msmall = make_moe_obj(ctx.get(), small);
  LinearPtr lin = make_linear_obj(ctx.get(), ld.desc(), "linear");
  ASSERT_TRUE(mbig && msmall && lin);
  const int T = big.p.max_tokens;
  const std::vector<uint8_t> want = moe_call(mbig.get(), big, T);
  const std::vector<uint8_t> want_small = moe_call(msmall.get(), small, 3);

  // An independent context with its own object.
  CtxPtr ctx2 = make_ctx(MOEJIT_ISA_AUTO, 1);
  ASSERT_TRUE(ctx2);
  MoePtr other = make_moe_obj(ctx2.get(), small);
  ASSERT_TRUE(other);

  Sentinel y1(y_bytes(big));
  ASSERT_EQ(moejit_moe_submit(mbig.get(), T, big.x.data(), big.ids.data(), big.w.data(), y1.data()),
            MOEJIT_OK)
      << last_error();

  Sentinel y2(y_bytes(big)), y3(y_bytes(big)), y4(y_bytes(small)), y5(y_bytes(small)), y6(2 * 40 * 4);
  moejit_status st = moejit_moe_submit(mbig.get(), T, big.x.data(), big.ids.data(), big.w.data(), y2.data());
  EXPECT_EQ(st, MOEJIT_BUSY) << "second submit on the same object: " << sname(st);
  if (st != MOEJIT_OK) {
    EXPECT_TRUE(message_names("moejit_moe_submit", ""));
  }
  st = moejit_moe_forward(mbig.get(), T, big.x.data(), big.ids.data(), big.w.data(), y3.data());
  EXPECT_EQ(st, MOEJIT_BUSY) << "forward on the same object: " << sname(st);
  if (st != MOEJIT_OK) {
    EXPECT_TRUE(message_names("moejit_moe_forward", ""));
  }
  st = moejit_moe_forward(msmall.get(), 3, small.x.data(), small.ids.data(), small.w.data(), y4.data());
  EXPECT_EQ(st, MOEJIT_BUSY) << "forward on another MoE of the same context: " << sname(st);
  st = moejit_moe_submit(msmall.get(), 3, small.x.data(), small.ids.data(), small.w.data(), y5.data());
  EXPECT_EQ(st, MOEJIT_BUSY) << "submit on another MoE of the same context: " << sname(st);
  st = moejit_linear_forward(lin.get(), 2, ld.x.data(), y6.data());
  EXPECT_EQ(st, MOEJIT_BUSY) << "linear forward on the same context: " << sname(st);
  if (st != MOEJIT_OK) {
    EXPECT_TRUE(message_names("moejit_linear_forward", ""));
  }

  // Another context is not affected.
  EXPECT_EQ(moe_call(other.get(), small, 3), want_small);

  EXPECT_EQ(moejit_context_wait(ctx.get()), MOEJIT_OK) << last_error();
  EXPECT_EQ(0, std::memcmp(y1.bytes.data(), want.data(), want.size()))
      << "submit + wait differs from forward";
  EXPECT_EQ(y1.first_changed(want.size()), -1);
  for (Sentinel* s : {&y2, &y3, &y4, &y5, &y6})
    EXPECT_EQ(s->first_changed(), -1) << "a BUSY call wrote its y";
  EXPECT_EQ(moejit_context_wait(ctx.get()), MOEJIT_OK) << "wait with nothing in flight";

  // Everything works again once the task is collected; a BUSY call left no trace.
  EXPECT_EQ(moe_call(msmall.get(), small, 3), want_small);
  EXPECT_EQ(moe_call(mbig.get(), big, T, true, ctx.get()), want);
  moejit_moe_stats s;
  std::memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  ASSERT_EQ(moejit_moe_stats_get(mbig.get(), &s), MOEJIT_OK);
  EXPECT_EQ(s.calls, 3u) << "forward, submit, submit; the BUSY calls are not counted";
  std::memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  ASSERT_EQ(moejit_moe_stats_get(msmall.get(), &s), MOEJIT_OK);
  EXPECT_EQ(s.calls, 2u);
}

TEST(Async, DestroyingTheLayerWaitsForItsTask) {
  CtxPtr ctx = make_ctx(MOEJIT_ISA_AUTO, 2);
  ASSERT_TRUE(ctx);
  const MoeData big = big_moe();
  MoePtr m = make_moe_obj(ctx.get(), big);
  ASSERT_TRUE(m);
  const int T = big.p.max_tokens;
  const std::vector<uint8_t> want = moe_call(m.get(), big, T);
  Sentinel y(y_bytes(big));
  ASSERT_EQ(moejit_moe_submit(m.get(), T, big.x.data(), big.ids.data(), big.w.data(), y.data()), MOEJIT_OK)
      << last_error();
  moejit_moe_destroy(m.release());
  // Had destroy not waited, y would be incomplete (or a worker would be using a freed object).
  EXPECT_EQ(0, std::memcmp(y.bytes.data(), want.data(), want.size()))
      << "y incomplete after moejit_moe_destroy";
  EXPECT_EQ(moejit_context_wait(ctx.get()), MOEJIT_OK);
  // The context keeps serving its other objects.
  const LinearData ld = small_linear();
  LinearPtr lin = make_linear_obj(ctx.get(), ld.desc(), "linear");
  ASSERT_TRUE(lin);
  const std::vector<uint8_t> ly = linear_call(lin.get(), ld, 2);
  check_against(ly, ld.p.out, linear_reference(ld), 2, ld.p.rows,
                "linear after a layer was destroyed in flight");
}

TEST(Async, DestroyingTheContextWaitsForItsTask) {
  CtxPtr ctx = make_ctx(MOEJIT_ISA_AUTO, 2);
  ASSERT_TRUE(ctx);
  const MoeData big = big_moe();
  MoePtr m = make_moe_obj(ctx.get(), big);
  ASSERT_TRUE(m);
  const int T = big.p.max_tokens;
  const std::vector<uint8_t> want = moe_call(m.get(), big, T);
  Sentinel y(y_bytes(big));
  ASSERT_EQ(moejit_moe_submit(m.get(), T, big.x.data(), big.ids.data(), big.w.data(), y.data()), MOEJIT_OK)
      << last_error();
  moejit_context_destroy(ctx.release());
  EXPECT_EQ(0, std::memcmp(y.bytes.data(), want.data(), want.size()))
      << "y incomplete after moejit_context_destroy";
  m.reset();  // the context is torn down with its last object
}

TEST(Async, ObjectsOutliveTheirContext) {
  // api.md: a context may be destroyed before its objects; it is torn down
  // when the last of them is destroyed, so they keep working until then.
  CtxPtr ctx = make_ctx(MOEJIT_ISA_AUTO, 2);
  ASSERT_TRUE(ctx);
  const MoeData small = small_moe(83);
  const LinearData ld = small_linear();
  MoePtr m = make_moe_obj(ctx.get(), small);
  LinearPtr lin = make_linear_obj(ctx.get(), ld.desc(), "linear");
  ASSERT_TRUE(m && lin);
  const std::vector<uint8_t> want = moe_call(m.get(), small, 3);
  const std::vector<uint8_t> lwant = linear_call(lin.get(), ld, 2);
  moejit_context_destroy(ctx.release());
  EXPECT_EQ(moe_call(m.get(), small, 3), want);
  m.reset();
  EXPECT_EQ(linear_call(lin.get(), ld, 2), lwant);
  lin.reset();
}

TEST(Async, ContextsRunConcurrentlyFromThreads) {
  const MoeData small = small_moe(84);
  const Reference ref = moe_reference(small);
  std::vector<uint8_t> want;
  {
    CtxPtr ctx = make_ctx(MOEJIT_ISA_AUTO, 1);
    ASSERT_TRUE(ctx);
    MoePtr m = make_moe_obj(ctx.get(), small);
    ASSERT_TRUE(m);
    want = moe_call(m.get(), small, 3);
    check_against(want, small.p.out, ref, 3, small.p.H, "concurrent contexts, single-thread run");
  }
  std::vector<int> mismatches(3, -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      moejit_context_desc d = context_desc(MOEJIT_ISA_AUTO, 1 + i % 2);
      moejit_context* ctx = nullptr;
      if (moejit_context_create(&d, &ctx) != MOEJIT_OK) return;
      const moejit_moe_desc md = small.desc();
      moejit_moe* m = nullptr;
      if (moejit_moe_create(ctx, &md, &m) == MOEJIT_OK) {
        int bad = 0;
        for (int rep = 0; rep < 20; ++rep) {
          std::vector<uint8_t> y(want.size() + 64, 0xA5);
          const bool ok =
              (rep % 2 ? moejit_moe_submit : moejit_moe_forward)(m, 3, small.x.data(), small.ids.data(),
                                                                 small.w.data(), y.data()) == MOEJIT_OK &&
              moejit_context_wait(ctx) == MOEJIT_OK;
          if (!ok || std::memcmp(y.data(), want.data(), want.size()) != 0) ++bad;
        }
        mismatches[size_t(i)] = bad;
        moejit_moe_destroy(m);
      }
      moejit_context_destroy(ctx);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(mismatches[size_t(i)], 0) << "thread " << i << " (-1: setup failed)";
}

// ------------------------------------------------------------------ stats

TEST(Stats, CountsSuccessfulCallsRoutesAndExperts) {
  CtxPtr ctx = make_ctx(MOEJIT_ISA_AUTO, 2);
  ASSERT_TRUE(ctx);
  MoeProblem p;
  p.name = "stats";
  p.fmt = MOEJIT_FORMAT_BF16;
  p.H = 64;
  p.I = 32;
  p.E = 6;
  p.top_k = 3;
  p.max_tokens = 4;
  p.seed = 91;
  MoeData d = make_moe(p);
  MoePtr m = make_moe_obj(ctx.get(), d);
  ASSERT_TRUE(m);
  const uint64_t B = uint64_t(3) * p.I * p.H * 2;  // bf16 weight bytes of one expert (gate_up + down)
  auto stats = [&] {
    moejit_moe_stats s;
    std::memset(&s, 0, sizeof(s));
    s.struct_size = sizeof(s);
    EXPECT_EQ(moejit_moe_stats_get(m.get(), &s), MOEJIT_OK) << last_error();
    return s;
  };
  std::vector<uint8_t> y(size_t(4 * p.H * 2) + 64);
  auto call = [&](int T, std::vector<int32_t> ids, bool submit = false) {
    if (submit) {
      const moejit_status st = moejit_moe_submit(m.get(), T, d.x.data(), ids.data(), d.w.data(), y.data());
      if (st == MOEJIT_OK) {
        EXPECT_EQ(moejit_context_wait(ctx.get()), MOEJIT_OK);
      }
      return st;
    }
    return moejit_moe_forward(m.get(), T, d.x.data(), ids.data(), d.w.data(), y.data());
  };
  moejit_moe_stats s = stats();
  EXPECT_EQ(s.calls, 0u);
  EXPECT_EQ(s.routes, 0u);
  EXPECT_EQ(s.unique_experts, 0u);
  EXPECT_EQ(s.weight_bytes_read, 0u);

  // 5 non-negative routes on experts {0, 1, 5}.
  ASSERT_EQ(call(2, {0, 1, -1, 1, 1, 5}), MOEJIT_OK) << last_error();
  s = stats();
  EXPECT_EQ(s.calls, 1u);
  EXPECT_EQ(s.routes, 5u);
  EXPECT_EQ(s.unique_experts, 3u);
  EXPECT_GE(s.weight_bytes_read, 3 * B) << "each served expert's weights are streamed";
  EXPECT_LE(s.weight_bytes_read, 5 * B);
  const uint64_t wbr1 = s.weight_bytes_read;

  // Not counted: an empty call, a failing call.
  ASSERT_EQ(call(0, {0, 0, 0}), MOEJIT_OK);
  ASSERT_EQ(call(2, {0, 1, 2, 3, 4, 6}), MOEJIT_INVALID_ARGUMENT);
  ASSERT_EQ(call(2, {0, 1, 2, 3, 4, 6}, true), MOEJIT_INVALID_ARGUMENT);
  s = stats();
  EXPECT_EQ(s.calls, 1u);
  EXPECT_EQ(s.routes, 5u);
  EXPECT_EQ(s.unique_experts, 3u);
  EXPECT_EQ(s.weight_bytes_read, wbr1);

  // A successful call whose routes are all skipped: a call, no routes, no experts.
  ASSERT_EQ(call(1, {-1, INT32_MIN, -7}, true), MOEJIT_OK) << last_error();
  s = stats();
  EXPECT_EQ(s.calls, 2u);
  EXPECT_EQ(s.routes, 5u);
  EXPECT_EQ(s.unique_experts, 3u);
  EXPECT_EQ(s.weight_bytes_read, wbr1);

  // 10 routes on all 6 experts (duplicates inside a token count as routes).
  ASSERT_EQ(call(4, {2, 2, 2, 3, 4, 5, 0, -1, -1, 5, 5, 1}), MOEJIT_OK) << last_error();
  s = stats();
  EXPECT_EQ(s.calls, 3u);
  EXPECT_EQ(s.routes, 15u);
  EXPECT_EQ(s.unique_experts, 9u);
  EXPECT_GE(s.weight_bytes_read, wbr1 + 6 * B);
  EXPECT_LE(s.weight_bytes_read, wbr1 + 10 * B);
}
