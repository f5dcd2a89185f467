// Context: thread pool, ISA tier, flags. One task in flight at a time.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "jit/kernel_key.h"
#include "moejit.h"
#include "runtime/thread_pool.h"

namespace moejit {

class Context {
 public:
  // `dedup` and `dedup_debug` come from MOEJIT_DEDUP / MOEJIT_DEDUP_DEBUG, and
  // `all_tiles` from MOEJIT_TILES, read at creation.
  // `tile_emu` (tests only; no API sets it): the avx512_amx kernels run on the
  // emulated tile unit (jit::kFlagTileEmu), so a context of that tier works on
  // any avx512_bf16 CPU.
  Context(int num_threads, const std::vector<int>& cpus, jit::Isa isa, uint32_t flags, bool dedup,
          bool dedup_debug, bool all_tiles = false, bool tile_emu = false);
  bool ok() const { return pool_.ok(); }
  jit::Isa isa() const { return isa_; }
  uint32_t flags() const { return flags_; }
  bool dedup_enabled() const { return dedup_; }
  bool dedup_debug() const { return dedup_debug_; }
  // avx512_amx: the layers run tile kernels for every format (plan::Target::all_tiles).
  bool all_tiles() const { return all_tiles_; }
  bool tile_emu() const { return tile_emu_; }
  int num_threads() const { return pool_.size(); }

  // Claims the context for one task; false when one is already in flight.
  bool try_acquire(const void* owner);
  // Runs an acquired job on the pool. With `sync` (the caller waits next) and no
  // pinned workers, the calling thread runs participant 0 before returning;
  // otherwise it returns at once.
  void launch(const Job* job, bool sync);
  // Gives an acquired context back without running anything.
  void release();
  // Waits for the task in flight, if any, and releases the context.
  void wait();
  // Waits only if the task in flight belongs to `owner`.
  void wait_if_owner(const void* owner);

 private:
  ThreadPool pool_;
  jit::Isa isa_;
  uint32_t flags_;
  bool dedup_;
  bool dedup_debug_;
  bool all_tiles_;
  bool tile_emu_;
  bool pinned_;  // cpu_ids given: every participant is a pinned pool thread
  enum : uint32_t { kIdle = 0, kAcquired = 1, kLaunched = 2 };
  std::atomic<uint32_t> state_{kIdle};
  std::atomic<const void*> owner_{nullptr};  // the object whose task is in flight
};

}  // namespace moejit

struct moejit_context {
  std::shared_ptr<moejit::Context> impl;
};
