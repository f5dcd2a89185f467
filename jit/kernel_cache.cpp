#include "jit/kernel_cache.h"

#include "jit/kernel_dump.h"

namespace moejit::jit {

std::shared_ptr<const Kernel> KernelCache::get(const KernelKey& key, std::string* err) {
  for (;;) {
    Slot slot;
    {
      std::shared_lock<std::shared_mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) slot = it->second;
    }
    if (slot.valid()) {
      if (auto k = slot.get().lock()) return k;
      // Expired (last user gone) or failed: drop the stale slot and retry.
      std::unique_lock<std::shared_mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end() && it->second.wait_for(std::chrono::seconds(0)) == std::future_status::ready &&
          it->second.get().expired())
        map_.erase(it);
      continue;
    }
    std::promise<std::weak_ptr<const Kernel>> promise;
    {
      std::unique_lock<std::shared_mutex> lock(mu_);
      if (map_.count(key)) continue;  // someone else is generating it
      map_.emplace(key, promise.get_future().share());
    }
    std::shared_ptr<const Kernel> k;
    try {
      std::shared_ptr<const Kernel> owned = generate_gemv(key, err);
      // The handle given out: when its last user goes away the code is freed and
      // the cache entry removed, so the map does not grow with dead keys.
      if (owned)
        k = std::shared_ptr<const Kernel>(owned.get(), [this, key, owned](const Kernel*) mutable {
          owned.reset();
          drop_expired(key);
        });
    } catch (...) {  // allocation failure inside Xbyak or the containers: nothing stays cached
      {
        std::unique_lock<std::shared_mutex> lock(mu_);
        map_.erase(key);
      }
      promise.set_value({});
      throw;
    }
    if (!k) {
      std::unique_lock<std::shared_mutex> lock(mu_);
      map_.erase(key);
      promise.set_value({});
      return nullptr;
    }
    {
      std::unique_lock<std::shared_mutex> lock(mu_);
      ++generated_;
    }
    promise.set_value(k);
    on_kernel_generated(*k);  // MOEJIT_DUMP_DIR, MOEJIT_PERF_MAP; never fails the generation
    return k;
  }
}

void KernelCache::drop_expired(const KernelKey& key) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = map_.find(key);
  if (it != map_.end() && it->second.wait_for(std::chrono::seconds(0)) == std::future_status::ready &&
      it->second.get().expired())
    map_.erase(it);
}

size_t KernelCache::size() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return map_.size();
}

size_t KernelCache::generated_count() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return generated_;
}

KernelCache& global_cache() {
  static KernelCache* cache = new KernelCache();  // never destroyed: kernels may outlive static destruction
  return *cache;
}

}  // namespace moejit::jit
