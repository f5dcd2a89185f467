// Persistent worker pool running one job at a time. A job is a short list of
// phases; each phase is a count of independent items, split into contiguous
// ranges, one per participant; phases are separated by a barrier. A participant
// runs its range front to back (so it knows its next items and kernels can
// prefetch them); one that runs out steals the back half of the largest range
// left, so a late or slow participant (a thread still waking, a group with more
// tokens than the others) never holds up the phase. A phase ends when all its
// items are done, not when every participant has arrived: a pool thread that
// wakes after the job is done (or has no items left) skips it, so a parked
// thread never delays a call. Which participant runs an item never changes its
// result.
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
#include <memory>
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
  // Joins the job in flight if it is still open and this thread has not seen it yet.
  bool join(int id, uint32_t* last_seq);
  // Runs participant `id`'s share of every phase, then leaves the job.
  void run_job(const Job& job, int id);
  // Runs phase `p` items until none is left anywhere.
  void run_phase(const Job& job, int p, int id);
  // Runs one item and marks the phase done after its last item.
  void run_item(const Job& job, int p, int64_t item, int id);
  static void spin_wait(const std::atomic<uint32_t>& a, uint32_t old, std::chrono::microseconds budget);

  std::vector<std::thread> threads_;
  bool ok_ = true;
  const Job* job_ = nullptr;
  std::atomic<uint32_t> epoch_{0};        // bumped per job: wakes threads 1..n-1
  std::atomic<uint32_t> async_epoch_{0};  // bumped per job without the caller: wakes thread 0
  std::atomic<uint32_t> stop_{0};
  // Participants of the job in flight: seq << 32 | closed << 31 | caller << 30 |
  // joined. A participant that finds the last phase done closes the job (no one
  // joins after that); the last one to leave a closed job finishes it. Thread 0
  // joins only jobs whose participant 0 is not the caller.
  static constexpr uint64_t kClosed = uint64_t(1) << 31;
  static constexpr uint64_t kCaller = uint64_t(1) << 30;
  static constexpr uint64_t kJoined = kCaller - 1;
  alignas(64) std::atomic<uint64_t> gate_{0};
  uint32_t seq_ = 0;  // jobs started (written by the starting thread only)
  struct alignas(64) PhaseState {
    std::atomic<int64_t> items_done{0};
    std::atomic<uint32_t> done{0};  // 1 once every item of the phase has run
  };
  PhaseState phases_[Job::kMaxPhases];
  // Items [begin, end) left to participant i in phase p at ranges_[p * n + i],
  // packed as end << 32 | begin; taken from the front by the owner, from the
  // back by thieves, each with one compare-and-swap.
  struct alignas(64) Range {
    std::atomic<uint64_t> packed{0};
  };
  std::unique_ptr<Range[]> ranges_;
  alignas(64) std::atomic<uint32_t> finished_{1};
};

}  // namespace moejit
