#include "runtime/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace moejit {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Spin budgets. Workers spin long enough to bridge back-to-back layers; the
// thread waiting for a job spins briefly, because on a machine with as many
// workers as cores its spinning takes a core away from them.
constexpr auto kSpinWorker = std::chrono::microseconds(50);
constexpr auto kSpinWaiter = std::chrono::microseconds(5);

// Default rounding, no FTZ/DAZ: results never depend on the caller's MXCSR.
constexpr unsigned int kWorkerCsr = 0x1F80;

}  // namespace

ThreadPool::ThreadPool(int n, const std::vector<int>& cpus) {
  ranges_.reset(new Range[size_t(Job::kMaxPhases) * size_t(n)]);
  threads_.reserve(size_t(n));
  for (int i = 0; i < n; ++i) {
    const int cpu = cpus.empty() ? -1 : cpus[size_t(i) % cpus.size()];
    try {
      threads_.emplace_back([this, i, cpu] { worker_main(i, cpu); });
    } catch (...) {
      ok_ = false;
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(1, std::memory_order_release);
  epoch_.fetch_add(1, std::memory_order_release);
  epoch_.notify_all();
  async_epoch_.fetch_add(1, std::memory_order_release);
  async_epoch_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::spin_wait(const std::atomic<uint32_t>& a, uint32_t old, std::chrono::microseconds budget) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    if (a.load(std::memory_order_acquire) != old) return;
    cpu_relax();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() - t0 > budget) break;
  }
  while (a.load(std::memory_order_acquire) == old) a.wait(old, std::memory_order_acquire);
}

void ThreadPool::start(const Job* job, bool caller_joins) {
  job_ = job;
  const int n = size();
  for (int p = 0; p < Job::kMaxPhases; ++p) {
    phases_[p].items_done.store(0, std::memory_order_relaxed);
    // A phase without items is done from the start.
    phases_[p].done.store(p < job->num_phases && job->counts[p] > 0 ? 0 : 1, std::memory_order_relaxed);
  }
  // Every range is set before any participant starts, so a participant still
  // waking up can be stolen from.
  for (int p = 0; p < job->num_phases; ++p) {
    const int64_t count = job->counts[p];
    for (int i = 0; i < n; ++i) {
      const uint64_t begin = uint64_t(count * i / n), end = uint64_t(count * (i + 1) / n);
      ranges_[size_t(p) * size_t(n) + size_t(i)].packed.store(end << 32 | begin, std::memory_order_relaxed);
    }
  }
  finished_.store(0, std::memory_order_relaxed);
  ++seq_;
  gate_.store(uint64_t(seq_) << 32 | (caller_joins ? kCaller | 1 : 0), std::memory_order_release);
  if (n > 1) {
    epoch_.fetch_add(1, std::memory_order_release);
    epoch_.notify_all();
  }
  if (!caller_joins) {
    async_epoch_.fetch_add(1, std::memory_order_release);
    async_epoch_.notify_one();
    return;
  }
#if defined(__x86_64__)
  const unsigned int csr = _mm_getcsr();
  _mm_setcsr(kWorkerCsr);
#endif
  run_job(*job, 0);
#if defined(__x86_64__)
  _mm_setcsr(csr);
#endif
}

void ThreadPool::wait() { spin_wait(finished_, 0, kSpinWaiter); }

bool ThreadPool::join(int id, uint32_t* last_seq) {
  uint64_t g = gate_.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t seq = uint32_t(g >> 32);
    if (seq == *last_seq || (g & kClosed) || (id == 0 && (g & kCaller))) {
      *last_seq = seq;
      return false;
    }
    if (gate_.compare_exchange_weak(g, g + 1, std::memory_order_acq_rel)) {
      *last_seq = seq;
      return true;
    }
  }
}

void ThreadPool::run_job(const Job& job, int id) {
  const int phases = job.num_phases;
  for (int p = 0; p < phases; ++p) {
    run_phase(job, p, id);
    spin_wait(phases_[p].done, 0, kSpinWorker);
  }
  // Every item has run: close the job, then leave it. `job` may be freed as
  // soon as the last participant has left.
  gate_.fetch_or(kClosed, std::memory_order_acq_rel);
  const uint64_t g = gate_.fetch_sub(1, std::memory_order_acq_rel) - 1;
  if ((g & kJoined) == 0) {
    finished_.store(1, std::memory_order_release);
    finished_.notify_all();
  }
}

void ThreadPool::run_item(const Job& job, int p, int64_t item, int id) {
  job.run(job.self, p, item, id);
  if (phases_[p].items_done.fetch_add(1, std::memory_order_acq_rel) + 1 == job.counts[p]) {
    phases_[p].done.store(1, std::memory_order_release);
    phases_[p].done.notify_all();
  }
}

void ThreadPool::run_phase(const Job& job, int p, int id) {
  const int n = size();
  if (job.counts[p] > int64_t(UINT32_MAX)) {  // beyond the packed ranges: static split
    const int64_t begin = job.counts[p] * id / n, end = job.counts[p] * (id + 1) / n;
    for (int64_t i = begin; i < end; ++i) run_item(job, p, i, id);
    return;
  }
  Range* ranges = &ranges_[size_t(p) * size_t(n)];
  std::atomic<uint64_t>& mine = ranges[id].packed;
  for (;;) {
    uint64_t v = mine.load(std::memory_order_acquire);
    uint32_t begin = uint32_t(v), end = uint32_t(v >> 32);
    if (begin < end) {
      if (mine.compare_exchange_weak(v, uint64_t(end) << 32 | (begin + 1), std::memory_order_acq_rel))
        run_item(job, p, int64_t(begin), id);
      continue;
    }
    // Out of items: steal the back half of the largest range left. Only this
    // participant writes to its own empty range, so a plain store installs it.
    int victim = -1;
    uint64_t vv = 0;
    uint32_t most = 0;
    for (int i = 0; i < n; ++i) {
      if (i == id) continue;
      const uint64_t w = ranges[i].packed.load(std::memory_order_acquire);
      const uint32_t left = uint32_t(w >> 32) - std::min(uint32_t(w), uint32_t(w >> 32));
      if (left > most) {
        most = left;
        victim = i;
        vv = w;
      }
    }
    if (victim < 0) return;  // nothing left anywhere
    begin = uint32_t(vv);
    end = uint32_t(vv >> 32);
    const uint32_t mid = end - (end - begin + 1) / 2;
    if (ranges[victim].packed.compare_exchange_strong(vv, uint64_t(mid) << 32 | begin,
                                                      std::memory_order_acq_rel))
      mine.store(uint64_t(end) << 32 | mid, std::memory_order_release);
  }
}

void ThreadPool::worker_main(int id, int cpu) {
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
#if defined(__x86_64__)
  _mm_setcsr(kWorkerCsr);
#endif
  // Thread 0 is participant 0 of asynchronous jobs only; the others take part in every job.
  std::atomic<uint32_t>& epoch = id == 0 ? async_epoch_ : epoch_;
  uint32_t seen = 0, last_seq = 0;
  for (;;) {
    spin_wait(epoch, seen, kSpinWorker);
    seen = epoch.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    if (join(id, &last_seq)) run_job(*job_, id);
  }
}

}  // namespace moejit
