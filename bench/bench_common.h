// Helpers shared by the Google Benchmark suites: tiers, contexts, cold-pool sizing.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "moejit.h"

namespace moejit_gbench {

// The tiers a suite sweeps (every tier; the ones this CPU lacks are skipped with a reason).
const std::vector<moejit_isa>& all_tiers();

struct ContextDeleter {
  void operator()(moejit_context* c) const { moejit_context_destroy(c); }
};
using ContextPtr = std::unique_ptr<moejit_context, ContextDeleter>;

// A context on every CPU of the affinity mask capped at `isa`. On failure (or when the context
// does not run exactly `isa`) marks the benchmark skipped/failed with the reason and returns null.
ContextPtr make_context(benchmark::State& state, moejit_isa isa, uint32_t flags = 0);

// How many matrices of `bytes` make a pool that no cache level holds: 4x the L3, at least 2.
int32_t cold_pool_count(int64_t bytes);

// Untimed calls before the timed loop (benchmark 1.7 has no warm-up time).
constexpr int kWarmupCalls = 3;

// Google Benchmark's CSV reporter aborts when a run carries a counter that the first run lacked, so a
// suite whose cases measure different things sets every counter it uses in every case, this value
// (printed as nan) where a counter does not apply.
constexpr double kNotApplicable = std::numeric_limits<double>::quiet_NaN();

}  // namespace moejit_gbench
