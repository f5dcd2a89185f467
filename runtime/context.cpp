#include "runtime/context.h"

namespace moejit {

Context::Context(int num_threads, const std::vector<int>& cpus, jit::Isa isa, uint32_t flags, bool dedup,
                 bool dedup_debug, bool all_tiles, bool tile_emu)
    : pool_(num_threads, cpus),
      isa_(isa),
      flags_(flags),
      dedup_(dedup),
      dedup_debug_(dedup_debug),
      all_tiles_(all_tiles),
      tile_emu_(tile_emu),
      pinned_(!cpus.empty()) {}

bool Context::try_acquire(const void* owner) {
  uint32_t expected = kIdle;
  if (!state_.compare_exchange_strong(expected, kAcquired, std::memory_order_acq_rel)) return false;
  owner_.store(owner, std::memory_order_release);
  return true;
}

void Context::launch(const Job* job, bool sync) {
  pool_.start(job, sync && !pinned_);
  state_.store(kLaunched, std::memory_order_release);
  state_.notify_all();
}

void Context::release() {
  owner_.store(nullptr, std::memory_order_release);
  state_.store(kIdle, std::memory_order_release);
  state_.notify_all();
}

void Context::wait() {
  // No lock: concurrent waiters may all wait on the pool; one of them releases.
  for (;;) {
    uint32_t s = state_.load(std::memory_order_acquire);
    if (s == kIdle) return;
    if (s == kAcquired) {  // the owner is between acquiring and launching
      state_.wait(kAcquired, std::memory_order_acquire);
      continue;
    }
    pool_.wait();
    owner_.store(nullptr, std::memory_order_release);
    if (state_.compare_exchange_strong(s, kIdle, std::memory_order_acq_rel)) state_.notify_all();
    return;
  }
}

void Context::wait_if_owner(const void* owner) {
  if (owner_.load(std::memory_order_acquire) == owner) wait();
}

}  // namespace moejit
