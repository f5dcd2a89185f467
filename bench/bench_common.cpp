#include "bench_common.h"

#include <algorithm>
#include <string>

#include "bench_util.h"

namespace moejit_gbench {

const std::vector<moejit_isa>& all_tiers() {
  // The library names every tier it has ("unknown" past them).
  static const std::vector<moejit_isa> kTiers = [] {
    std::vector<moejit_isa> r;
    for (int i = MOEJIT_ISA_SCALAR; std::string(moejit_isa_name(moejit_isa(i))) != "unknown"; ++i)
      r.push_back(moejit_isa(i));
    return r;
  }();
  return kTiers;
}

ContextPtr make_context(benchmark::State& state, moejit_isa isa, uint32_t flags) {
  if (isa > moejit_host_isa()) {
    state.SkipWithError((std::string("skipped: this CPU lacks tier ") + moejit_isa_name(isa) + " (best is " +
                         moejit_isa_name(moejit_host_isa()) + ")")
                            .c_str());
    return nullptr;
  }
  moejit_context_desc cd{};
  cd.struct_size = sizeof(cd);
  cd.max_isa = isa;
  cd.flags = flags;
  moejit_context* raw = nullptr;
  if (moejit_context_create(&cd, &raw) != MOEJIT_OK) {
    state.SkipWithError(moejit_last_error());
    return nullptr;
  }
  ContextPtr ctx(raw);
  if (moejit_context_isa(ctx.get()) != isa) {  // a capped tier that lowered itself measures nothing new
    state.SkipWithError((std::string("context runs ") + moejit_isa_name(moejit_context_isa(ctx.get())) +
                         ", asked for " + moejit_isa_name(isa) + " (MOEJIT_MAX_ISA set?)")
                            .c_str());
    return nullptr;
  }
  return ctx;
}

int32_t cold_pool_count(int64_t bytes) {
  int64_t l3 = moejit_bench::l3_cache_bytes();
  if (l3 <= 0) l3 = int64_t(32) << 20;
  return int32_t(std::max<int64_t>(2, (4 * l3 + bytes - 1) / bytes));
}

}  // namespace moejit_gbench
