// moejit-bench: timing one case (format x tokens x threads x tier x dedup) through the public C API.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench_api.h"
#include "bench_layer.h"
#include "moejit.h"

namespace moejit_bench {

struct CaseSpec {
  FormatChoice format = MOEJIT_FORMAT_BF16;
  int32_t tokens = 1;
  int32_t threads = 1;
  moejit_isa max_isa = MOEJIT_ISA_AUTO;
  bool dedup = true;      // false: context flag MOEJIT_CONTEXT_NO_DEDUP
  double min_time = 1.0;  // seconds of timed calls at least ...
  int64_t min_calls = 5;  // ... and at least this many timed calls
  int32_t warmup = 3;     // untimed calls first (fewer when they take over min_time / 4)
};

enum class CaseStatus { ok, unsupported, skipped, error };

struct CaseResult {
  CaseStatus status = CaseStatus::ok;
  std::string message;  // moejit_last_error() of the failing call, or why the case was skipped
  moejit_isa isa = MOEJIT_ISA_AUTO;
  int32_t threads = 0;  // moejit_context_num_threads (the peer: its thread count)
  int64_t calls = 0;    // timed calls
  double median_s = 0, min_s = 0, mean_s = 0;
  double weight_gbps = 0;          // median over calls of (weight+scale bytes of its distinct experts) / time
  double bytes_per_call = 0;       // mean, as computed by the tool from the routing (distinct experts)
  double distinct_per_call = 0;    // mean distinct experts per call
  double routes_per_call = 0;      // mean routes per call
  double lib_bytes_per_call = -1;  // moejit_moe_stats weight_bytes_read per timed call, -1 if unavailable
  double lib_unique_per_call = -1;  // moejit_moe_stats unique_experts per timed call, -1 if unavailable
  int64_t nonfinite_outputs = 0;    // in y after the last call

  bool ok() const { return status == CaseStatus::ok; }
};

using CallFn = std::function<bool(int64_t call)>;
using PrepareFn = std::function<void(int64_t call)>;

// Calls fn(call) for `warmup` untimed calls, then times calls until both spec.min_calls and
// spec.min_time are reached. Call c uses routing c % pool (every call, timed or not, gets the next
// routing, so experts stay cold). `prepare(call)`, when given, runs before each call, untimed
// (Layer::place of the call's routes). Fills the timing and byte fields of r; false when fn
// failed (fn records why in r).
bool time_loop(const CallFn& fn, const Routing& routing, double expert_bytes, const CaseSpec& spec,
               CaseResult* r, const PrepareFn& prepare = {});

// One arm of a case: dedup on or off, through the linked library (api null) or another build.
struct Arm {
  bool dedup = true;
  const MoeApi* api = nullptr;
};

// Times the arms of one case interleaved in time: arm i is `layer` with dedup = arms[i].dedup in
// its own context (spec.threads, spec.max_isa) of arms[i]'s library; arm i starts its walk over
// the routing pool i / arms.size() of the way in; every call's routes go through layer.place (untimed),
// the cold cycle over the layer's slots. After every arm's warm-up, each round gives every arm
// a slice of timed calls (spec.min_time / 8, clamped to [20 ms, 250 ms], at least one call) and
// then calls `round` (the DRAM probe), until every arm has spec.min_calls calls and spec.min_time
// seconds of them. A drift of the machine's bandwidth (a VM's host load) then hits every arm and
// the probe alike, instead of whichever ran during it.
std::vector<CaseResult> run_arms(const Layer& layer, const std::vector<Arm>& arms, const Routing& routing,
                                 const CaseSpec& spec, const std::function<void()>& round);

// One arm (dedup = spec.dedup) on its own.
CaseResult run_case(const Layer& layer, const Routing& routing, const CaseSpec& spec);

double median(std::vector<double> v);
const char* status_label(CaseStatus s);

}  // namespace moejit_bench
