#include "runtime/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <chrono>

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
  for (auto& p : phases_) {
    p.arrived.store(0, std::memory_order_relaxed);
    p.done.store(0, std::memory_order_relaxed);
  }
  finished_.store(0, std::memory_order_relaxed);
  if (size() > 1) {
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

void ThreadPool::run_job(const Job& job, int id) {
  const int n = size();
  // `job` may be freed once the last worker arrives at the final barrier: read
  // what is needed after that point first.
  const int phases = job.num_phases;
  for (int p = 0; p < phases; ++p) {
    PhaseState& ps = phases_[p];
    // Contiguous static ranges: items of one phase cost the same, and a worker
    // knows its next item, so kernels can prefetch it.
    const int64_t begin = job.counts[p] * id / n, end = job.counts[p] * (id + 1) / n;
    for (int64_t i = begin; i < end; ++i) job.run(job.self, p, i, id);
    const bool last = ps.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == n;
    if (p + 1 == phases) {
      // Every worker has passed every earlier barrier once all arrive here.
      if (last) {
        finished_.store(1, std::memory_order_release);
        finished_.notify_all();
      }
    } else if (last) {
      ps.done.store(1, std::memory_order_release);
      ps.done.notify_all();
    } else {
      spin_wait(ps.done, 0, kSpinWorker);
    }
  }
  if (phases == 0 && id == 0) {
    finished_.store(1, std::memory_order_release);
    finished_.notify_all();
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
  uint32_t seen = 0;
  for (;;) {
    spin_wait(epoch, seen, kSpinWorker);
    seen = epoch.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    run_job(*job_, id);
  }
}

}  // namespace moejit
