// ThreadPool: every item runs exactly once, phases stay ordered, a participant
// id is never used twice at the same time, a late or slow participant is
// stolen from, and threads that wake after a job is done skip it. Jobs mix the
// synchronous form (the caller is participant 0) with the asynchronous one,
// with pauses that let workers park, so late joiners are exercised.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "rng.h"
#include "runtime/thread_pool.h"

namespace {

using moejit::Job;
using moejit::ThreadPool;

struct Recorder {
  int n = 0;
  int64_t counts[Job::kMaxPhases] = {};
  std::vector<std::atomic<int>> runs[Job::kMaxPhases];  // times each item ran
  std::atomic<int64_t> finished[Job::kMaxPhases] = {};  // items of the phase completed
  std::vector<std::atomic<int>> busy;                   // participant id currently running an item
  std::atomic<int> order_errors{0}, overlap_errors{0}, id_errors{0}, caller_errors{0};
  bool sync = false;  // participant 0 must be the thread that started the job
  std::thread::id caller = std::this_thread::get_id();
  std::atomic<int64_t> by_id[8] = {};
  int spin_ns = 0;

  void reset(const Job& job, int threads) {
    n = threads;
    busy = std::vector<std::atomic<int>>(size_t(threads));
    for (int p = 0; p < Job::kMaxPhases; ++p) {
      counts[p] = p < job.num_phases ? job.counts[p] : 0;
      runs[p] = std::vector<std::atomic<int>>(size_t(counts[p]));
      finished[p] = 0;
    }
    for (auto& b : by_id) b = 0;
  }

  static void run(void* self, int phase, int64_t item, int worker) {
    auto* r = static_cast<Recorder*>(self);
    if (worker < 0 || worker >= r->n) {
      ++r->id_errors;
      return;
    }
    if (r->busy[size_t(worker)].exchange(1)) ++r->overlap_errors;
    if (r->sync && worker == 0 && std::this_thread::get_id() != r->caller) ++r->caller_errors;
    for (int p = 0; p < phase; ++p)
      if (r->finished[p].load() != r->counts[p]) ++r->order_errors;
    ++r->runs[phase][size_t(item)];
    ++r->by_id[worker];
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::nanoseconds(r->spin_ns)) {
    }
    r->busy[size_t(worker)].store(0);
    ++r->finished[phase];
  }
};

void expect_each_item_once(const Recorder& r, const std::string& what) {
  for (int p = 0; p < Job::kMaxPhases; ++p)
    for (int64_t i = 0; i < r.counts[p]; ++i)
      ASSERT_EQ(1, r.runs[p][size_t(i)].load()) << what << ": phase " << p << " item " << i;
  EXPECT_EQ(0, r.order_errors.load()) << what << ": an item started before the previous phase was done";
  EXPECT_EQ(0, r.overlap_errors.load()) << what << ": two threads ran as the same participant";
  EXPECT_EQ(0, r.id_errors.load()) << what << ": participant id out of range";
  EXPECT_EQ(0, r.caller_errors.load()) << what << ": a pool thread ran as participant 0 of a synchronous job";
}

TEST(ThreadPool, EveryItemOncePhasesInOrderSyncAndAsync) {
  moejit_test::Rng rng(7);
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads, {});
    ASSERT_TRUE(pool.ok());
    Recorder rec;
    for (int iter = 0; iter < 300; ++iter) {
      Job job;
      job.num_phases = 1 + int(rng() % Job::kMaxPhases);
      for (int p = 0; p < job.num_phases; ++p) {
        const uint32_t kind = rng() % 8;
        job.counts[p] = kind == 0 ? 0 : kind == 1 ? 1 : int64_t(rng() % 60);
      }
      job.run = &Recorder::run;
      job.self = &rec;
      rec.reset(job, threads);
      rec.spin_ns = int(rng() % 3) * 2000;
      const bool sync = rng() % 2;
      rec.sync = sync;
      pool.start(&job, sync);
      pool.wait();
      expect_each_item_once(rec, std::to_string(threads) + " threads, job " + std::to_string(iter) +
                                     (sync ? " sync" : " async"));
      if (HasFatalFailure()) return;
      // Pauses past the workers' spin budget make them park, so the next job
      // has late joiners (and threads that wake after it is done).
      const uint32_t pause = rng() % 4;
      if (pause) std::this_thread::sleep_for(std::chrono::microseconds(pause == 3 ? 500 : 60 * pause));
    }
  }
}

// Thread 0 serves asynchronous jobs only. Parked during a run of synchronous
// jobs (the other threads stay awake), it wakes late for an asynchronous job
// that the others finish without it; it must then not join the next,
// synchronous job, whose participant 0 is the caller.
TEST(ThreadPool, AsyncThenSyncNeverSharesParticipantZero) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads, {});
    ASSERT_TRUE(pool.ok());
    Recorder rec;
    for (int iter = 0; iter < 300; ++iter) {
      for (int j = 0; j < 32; ++j) {  // sync jobs, async last but one
        Job job;
        job.num_phases = 1;
        job.counts[0] = 2 * threads;
        job.run = &Recorder::run;
        job.self = &rec;
        rec.reset(job, threads);
        rec.spin_ns = 1000;
        const bool sync = j != 30;
        rec.sync = sync;
        pool.start(&job, sync);
        pool.wait();
        expect_each_item_once(rec, std::to_string(threads) + " threads, round " + std::to_string(iter) +
                                       ", job " + std::to_string(j));
        if (HasFatalFailure()) return;
      }
    }
  }
}

// A participant stuck in its first item does not hold up the phase: the caller
// steals the rest of its range.
TEST(ThreadPool, IdleParticipantStealsFromASlowOne) {
  ThreadPool pool(2, {});
  ASSERT_TRUE(pool.ok());
  struct Slow {
    std::atomic<int64_t> by_caller{0}, by_worker{0}, total{0};
    std::thread::id caller;
    static void run(void* self, int, int64_t, int) {
      auto* s = static_cast<Slow*>(self);
      if (std::this_thread::get_id() == s->caller)
        ++s->by_caller;
      else if (s->by_worker++ == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the worker's first item
      ++s->total;
    }
  } slow;
  slow.caller = std::this_thread::get_id();
  Job job;
  job.num_phases = 1;
  job.counts[0] = 40;
  job.run = &Slow::run;
  job.self = &slow;
  pool.start(&job, true);
  pool.wait();
  EXPECT_EQ(40, slow.total.load());
  // Without stealing the caller would run its static half (20 items) only.
  EXPECT_GE(slow.by_caller.load(), 39) << "the caller did not take over the slow participant's items";
}

}  // namespace
