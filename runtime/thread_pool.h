// Persistent worker pool running one job at a time. A job is a short list of
// phases; each phase is a count of independent items of equal cost, split into
// contiguous ranges, one per participant; phases are separated by a barrier.
// A job has n participants (n = size()). Participants 1..n-1 are always pool
// threads; participant 0 is either the calling thread (a synchronous call: no
// hand-off and no wake-up on the caller's side, so one participant never waits
// for a sleeping thread) or pool thread 0 (an asynchronous call). Workers spin
// briefly, then park on a futex, so back-to-back layers skip the sleep/wake
// round trip. Starting and waiting allocate nothing and hold no lock while the
// pool runs.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace moejit {

struct Job {
  static constexpr int kMaxPhases = 4;
  int num_phases = 0;
  int64_t counts[kMaxPhases] = {};
  // Runs one item; `worker` is in [0, num_threads).
  void (*run)(void* self, int phase, int64_t item, int worker) = nullptr;
  void* self = nullptr;
};

class ThreadPool {
 public:
  // Starts `n` workers; worker i is pinned to cpus[i % cpus.size()] when cpus is non-empty.
  ThreadPool(int n, const std::vector<int>& cpus);
  ~ThreadPool();
  bool ok() const { return ok_; }
  int size() const { return int(threads_.size()); }

  // Hands the job to the workers. With `caller_joins` the calling thread runs
  // participant 0 before returning (under the workers' MXCSR); otherwise it
  // returns at once. The job must stay valid until wait().
  void start(const Job* job, bool caller_joins);
  // Blocks until the started job has finished.
  void wait();

 private:
  void worker_main(int id, int cpu);
  void run_job(const Job& job, int id);
  static void spin_wait(const std::atomic<uint32_t>& a, uint32_t old, std::chrono::microseconds budget);

  std::vector<std::thread> threads_;
  bool ok_ = true;
  const Job* job_ = nullptr;
  std::atomic<uint32_t> epoch_{0};        // bumped per job: wakes threads 1..n-1
  std::atomic<uint32_t> async_epoch_{0};  // bumped per job without the caller: wakes thread 0
  std::atomic<uint32_t> stop_{0};
  struct alignas(64) PhaseState {
    std::atomic<int32_t> arrived{0};
    std::atomic<uint32_t> done{0};
  };
  PhaseState phases_[Job::kMaxPhases];
  alignas(64) std::atomic<uint32_t> finished_{1};
};

}  // namespace moejit
