// Concurrency (docs/RELIABILITY.md, api.md "Asynchronous form", "Lifetimes",
// "Determinism"): contexts running at once on different threads, many threads
// creating the same shapes at once (the kernel cache generates each kernel
// once), submit on one thread and wait on another, destroy while a task is in
// flight, BUSY under contention. Every result is compared bit for bit with a
// single-threaded run of the same layer. These tests are part of the TSan run
// of `make check`; they must be clean there.
//
// White-box only for the kernel cache counter (jit::global_cache()); the
// library is the internal static copy, every call goes through the C API.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <latch>
#include <mutex>
#include <thread>
#include <vector>

#include "jit/kernel_cache.h"
#include "moejit.h"
#include "numerics_helpers.h"
#include "numerics_ref.h"
#include "test_util.h"

using namespace moejit_test;

namespace {

MoeData small_fp8(uint64_t seed, int max_tokens = 4) {
  MoeProblem p;
  p.name = "conc_fp8";
  p.fmt = MOEJIT_FORMAT_FP8_BLOCK;
  p.H = 160;
  p.I = 96;
  p.E = 6;
  p.top_k = 3;
  p.max_tokens = max_tokens;
  p.fill = Fill::random;
  p.bias = true;
  p.seed = seed;
  return make_moe(p);
}

MoeData small_bf16(uint64_t seed) {
  MoeProblem p;
  p.name = "conc_bf16";
  p.fmt = MOEJIT_FORMAT_BF16;
  p.H = 96;
  p.I = 64;
  p.E = 5;
  p.top_k = 2;
  p.max_tokens = 3;
  p.act = MOEJIT_ACT_SWIGLU_OAI;
  p.limit = 7.0f;
  p.interleaved = 1;
  p.out = MOEJIT_DTYPE_F32;
  p.seed = seed;
  return make_moe(p);
}

// About 25 MB of bf16 weights: still running when the calls after submit are made.
MoeData big_bf16() {
  MoeProblem p;
  p.name = "conc_big";
  p.fmt = MOEJIT_FORMAT_BF16;
  p.H = 1024;
  p.I = 768;
  p.E = 8;
  p.top_k = 8;
  p.max_tokens = 8;
  p.out = MOEJIT_DTYPE_F32;
  p.seed = 7;
  MoeData d = make_moe(p);
  for (int t = 0; t < p.max_tokens; ++t)
    for (int j = 0; j < p.top_k; ++j) d.ids[size_t(t * p.top_k + j)] = (t + j) % p.E;
  return d;
}

std::vector<moejit_isa> host_tiers() {
  std::vector<moejit_isa> v;
  for (int t = MOEJIT_ISA_SCALAR; t <= moejit_host_isa(); ++t) v.push_back(static_cast<moejit_isa>(t));
  return v;
}

// Reference bits of `d` on `tier`, from a 1-worker context.
std::vector<uint8_t> reference_bits(const MoeData& d, moejit_isa tier, int tokens) {
  CtxPtr ctx = make_ctx(tier, 1);
  if (!ctx) return {};
  MoePtr m = make_moe_obj(ctx.get(), d);
  if (!m) return {};
  return moe_call(m.get(), d, tokens);
}

// Raw call without gtest assertions (safe on any thread): OK and y, or the status.
moejit_status raw_forward(moejit_moe* m, const MoeData& d, int tokens, std::vector<uint8_t>* y) {
  y->assign(size_t(tokens) * size_t(d.p.H) * dsize(d.p.out), 0xA5);
  return moejit_moe_forward(m, tokens, d.x.data(), d.ids.data(), d.w.data(), y->data());
}

}  // namespace

// Several contexts (every tier the host has, 1 to 3 workers each) run forward
// on their own threads at the same time; every call gives the bits of a
// single-threaded run on the same tier.
TEST(Concurrency, ContextsForwardAtOnceOnDifferentThreads) {
  const MoeData a = small_fp8(11), b = small_bf16(12);
  const std::vector<moejit_isa> tiers = host_tiers();
  std::vector<std::vector<uint8_t>> want_a, want_b;
  for (moejit_isa t : tiers) {
    want_a.push_back(reference_bits(a, t, a.p.max_tokens));
    want_b.push_back(reference_bits(b, t, b.p.max_tokens));
    ASSERT_FALSE(want_a.back().empty() || want_b.back().empty());
  }
  // Once against the float64 reference, so the bits compared below are right.
  check_against(want_a[0], a.p.out, moe_reference(a), a.p.max_tokens, a.p.H, "scalar reference run");

  const int kThreads = 6, kReps = 25;
  std::vector<int> bad(kThreads, -1);
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      const size_t ti = size_t(i) % tiers.size();
      moejit_context_desc cd = context_desc(tiers[ti], 1 + i % 3);
      cd.flags = i % 2 ? MOEJIT_CONTEXT_NO_DEDUP : 0;
      moejit_context* ctx = nullptr;
      moejit_moe *ma = nullptr, *mb = nullptr;
      const moejit_moe_desc da = a.desc(), db = b.desc();
      const bool ok = moejit_context_create(&cd, &ctx) == MOEJIT_OK &&
                      moejit_moe_create(ctx, &da, &ma) == MOEJIT_OK &&
                      moejit_moe_create(ctx, &db, &mb) == MOEJIT_OK;
      start.arrive_and_wait();
      if (ok) {
        int n = 0;
        std::vector<uint8_t> y;
        for (int r = 0; r < kReps; ++r) {
          n += raw_forward(ma, a, a.p.max_tokens, &y) != MOEJIT_OK || y != want_a[ti];
          n += raw_forward(mb, b, b.p.max_tokens, &y) != MOEJIT_OK || y != want_b[ti];
        }
        bad[size_t(i)] = n;
      }
      moejit_moe_destroy(ma);
      moejit_moe_destroy(mb);
      moejit_context_destroy(ctx);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i)
    EXPECT_EQ(bad[size_t(i)], 0) << "thread " << i << " on tier "
                                 << moejit_isa_name(tiers[size_t(i) % tiers.size()])
                                 << ": mismatching calls (-1: set-up failed)";
}

// Many threads create layers of the same shapes at once, half on one shared
// context and half on their own: the kernel cache generates each kernel once,
// and every creator gets a working layer with identical results.
TEST(Concurrency, SameShapesCreatedAtOnceGenerateOnce) {
  namespace jit = moejit::jit;
  const MoeData d = small_fp8(21);
  const std::vector<uint8_t> want = reference_bits(d, MOEJIT_ISA_AUTO, d.p.max_tokens);
  ASSERT_FALSE(want.empty());

  CtxPtr shared = make_ctx(MOEJIT_ISA_AUTO, 2);
  ASSERT_TRUE(shared);
  const int kThreads = 8;
  const size_t before = jit::global_cache().generated_count();
  std::vector<moejit_context*> own(kThreads, nullptr);
  std::vector<moejit_moe*> layers(kThreads, nullptr);
  std::vector<moejit_status> status(kThreads, MOEJIT_INTERNAL_ERROR);
  {
    std::latch start(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
      threads.emplace_back([&, i] {
        moejit_context* ctx = shared.get();
        if (i % 2) {
          // The same worker count as the shared context: row blocks (so kernel shapes)
          // depend on it.
          const moejit_context_desc cd = context_desc(MOEJIT_ISA_AUTO, 2);
          if (moejit_context_create(&cd, &own[size_t(i)]) != MOEJIT_OK) return;
          ctx = own[size_t(i)];
        }
        const moejit_moe_desc md = d.desc();
        start.arrive_and_wait();
        status[size_t(i)] = moejit_moe_create(ctx, &md, &layers[size_t(i)]);
      });
    for (auto& t : threads) t.join();
  }
  const size_t concurrent = jit::global_cache().generated_count() - before;
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_EQ(status[size_t(i)], MOEJIT_OK) << "creator " << i;
    std::vector<uint8_t> y;
    ASSERT_EQ(raw_forward(layers[size_t(i)], d, d.p.max_tokens, &y), MOEJIT_OK) << "creator " << i;
    EXPECT_EQ(y, want) << "creator " << i << " computes different bits";
  }
  for (int i = 0; i < kThreads; ++i) {
    moejit_moe_destroy(layers[size_t(i)]);
    moejit_context_destroy(own[size_t(i)]);
  }
  // Every kernel was released with its last layer; one creator alone now
  // generates the set once more: that is how many one generation needs.
  const size_t mid = jit::global_cache().generated_count();
  {
    MoePtr m = make_moe_obj(shared.get(), d);
    ASSERT_TRUE(m);
  }
  const size_t single = jit::global_cache().generated_count() - mid;
  EXPECT_GT(single, 0u);
  EXPECT_EQ(concurrent, single) << kThreads << " concurrent creators generated " << concurrent
                                << " kernels; one creator needs " << single;
}

// submit on one thread, moejit_context_wait on another, in a ping-pong: round
// r is submitted by thread r % 2 and collected by the other thread, which
// then lets round r + 1 start.
TEST(Concurrency, SubmitOnOneThreadWaitOnAnother) {
  const MoeData d = small_fp8(31);
  const std::vector<uint8_t> want = reference_bits(d, MOEJIT_ISA_AUTO, d.p.max_tokens);
  ASSERT_FALSE(want.empty());
  CtxPtr ctx = make_ctx(MOEJIT_ISA_AUTO, 2);
  ASSERT_TRUE(ctx);
  MoePtr m = make_moe_obj(ctx.get(), d);
  ASSERT_TRUE(m);
  const int kRounds = 60;
  std::mutex mu;
  std::condition_variable cv;
  int round = 0;
  bool in_flight = false;
  std::vector<std::vector<uint8_t>> ys(kRounds, std::vector<uint8_t>(want.size(), 0xA5));
  std::vector<moejit_status> sub(kRounds, MOEJIT_INTERNAL_ERROR), wt(kRounds, MOEJIT_INTERNAL_ERROR);
  auto player = [&](int me) {
    for (int r = 0; r < kRounds; ++r) {
      const bool submitter = r % 2 == me;
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return round == r && in_flight != submitter; });
      lock.unlock();
      if (submitter)
        sub[size_t(r)] = moejit_moe_submit(m.get(), d.p.max_tokens, d.x.data(), d.ids.data(), d.w.data(),
                                           ys[size_t(r)].data());
      else
        wt[size_t(r)] = moejit_context_wait(ctx.get());
      lock.lock();
      if (submitter) {
        in_flight = true;
      } else {
        in_flight = false;
        ++round;
      }
      cv.notify_all();
    }
  };
  std::thread a(player, 0), b(player, 1);
  a.join();
  b.join();
  for (int r = 0; r < kRounds; ++r) {
    EXPECT_EQ(sub[size_t(r)], MOEJIT_OK) << "submit of round " << r;
    EXPECT_EQ(wt[size_t(r)], MOEJIT_OK) << "wait of round " << r;
    EXPECT_EQ(ys[size_t(r)], want) << "round " << r << " (submitted by thread " << r % 2 << ")";
  }
}

// Destroying a layer, or its context, from another thread while its task is in
// flight waits for the task: y is complete when destroy returns.
TEST(Concurrency, DestroyFromAnotherThreadWhileInFlightWaits) {
  const MoeData big = big_bf16();
  const int T = big.p.max_tokens;
  const std::vector<uint8_t> want = reference_bits(big, MOEJIT_ISA_AUTO, T);
  ASSERT_FALSE(want.empty());
  for (int what = 0; what < 2; ++what) {
    SCOPED_TRACE(what == 0 ? "moejit_moe_destroy" : "moejit_context_destroy");
    for (int rep = 0; rep < 4; ++rep) {
      moejit_context_desc cd = context_desc(MOEJIT_ISA_AUTO, 2);
      moejit_context* ctx = nullptr;
      ASSERT_EQ(moejit_context_create(&cd, &ctx), MOEJIT_OK);
      const moejit_moe_desc md = big.desc();
      moejit_moe* m = nullptr;
      ASSERT_EQ(moejit_moe_create(ctx, &md, &m), MOEJIT_OK) << last_error();
      std::vector<uint8_t> y(want.size(), 0xA5);
      std::atomic<bool> destroyed{false};
      ASSERT_EQ(moejit_moe_submit(m, T, big.x.data(), big.ids.data(), big.w.data(), y.data()), MOEJIT_OK);
      std::thread killer([&] {
        if (what == 0)
          moejit_moe_destroy(m);
        else
          moejit_context_destroy(ctx);
        destroyed.store(true, std::memory_order_release);
      });
      killer.join();
      ASSERT_TRUE(destroyed.load());
      EXPECT_EQ(y, want) << "y incomplete after destroy returned (rep " << rep << ")";
      if (what == 0) {
        EXPECT_EQ(moejit_context_wait(ctx), MOEJIT_OK);
        moejit_context_destroy(ctx);
      } else {
        // The layer outlives its context and still works; destroying it tears the context down.
        std::vector<uint8_t> y2;
        EXPECT_EQ(raw_forward(m, big, T, &y2), MOEJIT_OK);
        EXPECT_EQ(y2, want);
        moejit_moe_destroy(m);
      }
    }
  }
}

// Layers destroyed right after a call: the workers of the finished task must
// not touch the layer after the caller saw the task finish (api.md
// "Lifetimes"). Many short calls on several workers make a late worker likely;
// ASan and TSan see any access to the freed layer.
TEST(Concurrency, DestroyRightAfterForward) {
  const MoeData d = small_bf16(41);
  const std::vector<uint8_t> want = reference_bits(d, MOEJIT_ISA_AUTO, 1);
  ASSERT_FALSE(want.empty());
  CtxPtr ctx = make_ctx(MOEJIT_ISA_AUTO, 3);
  ASSERT_TRUE(ctx);
  int bad = 0;
  for (int rep = 0; rep < 200; ++rep) {
    MoePtr m = make_moe_obj(ctx.get(), d);
    ASSERT_TRUE(m);
    std::vector<uint8_t> y;
    bad += raw_forward(m.get(), d, 1, &y) != MOEJIT_OK || y != want;
  }
  EXPECT_EQ(bad, 0);
}

// Threads hammer one context through several layers with forward and submit:
// every call is OK or BUSY, never anything else; a BUSY call writes nothing;
// every OK call computes the right bits, whoever collects its task.
TEST(Concurrency, BusyUnderContention) {
  const MoeData a = small_fp8(51), b = small_bf16(52);
  const std::vector<uint8_t> want_a = reference_bits(a, MOEJIT_ISA_AUTO, a.p.max_tokens);
  const std::vector<uint8_t> want_b = reference_bits(b, MOEJIT_ISA_AUTO, b.p.max_tokens);
  ASSERT_FALSE(want_a.empty() || want_b.empty());
  CtxPtr ctx = make_ctx(MOEJIT_ISA_AUTO, 2);
  ASSERT_TRUE(ctx);
  MoePtr ma = make_moe_obj(ctx.get(), a), mb = make_moe_obj(ctx.get(), b);
  ASSERT_TRUE(ma && mb);
  const int kThreads = 4, kCalls = 150;
  std::vector<int> ok(kThreads, 0), busy(kThreads, 0), wrong(kThreads, 0);
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      for (int c = 0; c < kCalls; ++c) {
        const bool use_a = (c + i) % 2 == 0;
        const MoeData& d = use_a ? a : b;
        moejit_moe* m = use_a ? ma.get() : mb.get();
        const std::vector<uint8_t>& want = use_a ? want_a : want_b;
        std::vector<uint8_t> y(want.size(), 0xA5);
        moejit_status st;
        if (c % 3 == 0) {
          st = moejit_moe_submit(m, d.p.max_tokens, d.x.data(), d.ids.data(), d.w.data(), y.data());
          // Collect: this thread's task, or a later one if another thread collected ours first.
          if (st == MOEJIT_OK && moejit_context_wait(ctx.get()) != MOEJIT_OK) ++wrong[size_t(i)];
        } else {
          st = moejit_moe_forward(m, d.p.max_tokens, d.x.data(), d.ids.data(), d.w.data(), y.data());
        }
        if (st == MOEJIT_OK) {
          ++ok[size_t(i)];
          wrong[size_t(i)] += y != want;
        } else if (st == MOEJIT_BUSY) {
          ++busy[size_t(i)];
          wrong[size_t(i)] += y != std::vector<uint8_t>(want.size(), 0xA5);
        } else {
          ++wrong[size_t(i)];
        }
      }
    });
  for (auto& t : threads) t.join();
  int total_ok = 0;
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(wrong[size_t(i)], 0) << "thread " << i << ": wrong results or statuses";
    total_ok += ok[size_t(i)];
  }
  EXPECT_GT(total_ok, 0);
  EXPECT_EQ(moejit_context_wait(ctx.get()), MOEJIT_OK);
}

// While one thread keeps calling a layer, others create and destroy layers of
// the same and of other shapes (kernels found, released, generated again):
// the running layer's results never change and every layer created works.
TEST(Concurrency, CreateAndDestroyWhileOthersRun) {
  const MoeData a = small_fp8(61), b = small_bf16(62);
  const std::vector<uint8_t> want_a = reference_bits(a, MOEJIT_ISA_AUTO, a.p.max_tokens);
  const std::vector<uint8_t> want_b = reference_bits(b, MOEJIT_ISA_AUTO, b.p.max_tokens);
  ASSERT_FALSE(want_a.empty() || want_b.empty());
  std::atomic<bool> stop{false};
  std::atomic<int> runner_calls{0}, runner_bad{0};
  std::thread runner([&] {
    moejit_context_desc cd = context_desc(MOEJIT_ISA_AUTO, 2);
    moejit_context* ctx = nullptr;
    moejit_moe* m = nullptr;
    const moejit_moe_desc md = a.desc();
    if (moejit_context_create(&cd, &ctx) != MOEJIT_OK || moejit_moe_create(ctx, &md, &m) != MOEJIT_OK) {
      runner_bad = 1000000;
    } else {
      std::vector<uint8_t> y;
      while (!stop.load(std::memory_order_acquire) || runner_calls.load() < 10) {
        runner_bad += raw_forward(m, a, a.p.max_tokens, &y) != MOEJIT_OK || y != want_a;
        ++runner_calls;
      }
    }
    moejit_moe_destroy(m);
    moejit_context_destroy(ctx);
  });
  const int kChurners = 2, kCycles = 12;
  std::vector<int> churn_bad(kChurners, 0);
  std::vector<std::thread> churners;
  for (int i = 0; i < kChurners; ++i)
    churners.emplace_back([&, i] {
      moejit_context_desc cd = context_desc(MOEJIT_ISA_AUTO, 1);
      moejit_context* ctx = nullptr;
      if (moejit_context_create(&cd, &ctx) != MOEJIT_OK) {
        churn_bad[size_t(i)] = 1000;
        return;
      }
      for (int c = 0; c < kCycles; ++c) {
        const MoeData& d = (c + i) % 2 ? b : a;
        const std::vector<uint8_t>& want = (c + i) % 2 ? want_b : want_a;
        const moejit_moe_desc md = d.desc();
        moejit_moe* m = nullptr;
        if (moejit_moe_create(ctx, &md, &m) != MOEJIT_OK) {
          ++churn_bad[size_t(i)];
          continue;
        }
        std::vector<uint8_t> y;
        churn_bad[size_t(i)] += raw_forward(m, d, d.p.max_tokens, &y) != MOEJIT_OK || y != want;
        moejit_moe_destroy(m);
      }
      moejit_context_destroy(ctx);
    });
  for (auto& t : churners) t.join();
  stop.store(true, std::memory_order_release);
  runner.join();
  EXPECT_EQ(runner_bad.load(), 0) << "of " << runner_calls.load() << " calls";
  for (int i = 0; i < kChurners; ++i) EXPECT_EQ(churn_bad[size_t(i)], 0) << "churner " << i;
}
