// moejit-bench: timing one case (format x tokens x threads) through the public C API.
#pragma once

#include <cstdint>
#include <string>

#include "bench_layer.h"
#include "moejit.h"

namespace moejit_bench {

struct CaseSpec {
  moejit_format format = MOEJIT_FORMAT_BF16;
  int32_t tokens = 1;
  int32_t threads = 1;
  moejit_isa max_isa = MOEJIT_ISA_AUTO;
  double min_time = 1.0;  // seconds of timed calls at least ...
  int64_t min_calls = 5;  // ... and at least this many timed calls
  int32_t warmup = 3;     // untimed calls first (fewer when they take over min_time / 4)
};

enum class CaseStatus { ok, unsupported, error };

struct CaseResult {
  CaseStatus status = CaseStatus::ok;
  std::string message;  // moejit_last_error() of the failing call
  moejit_isa isa = MOEJIT_ISA_AUTO;
  int32_t threads = 0;  // moejit_context_num_threads
  int64_t calls = 0;    // timed calls
  double median_s = 0, min_s = 0, mean_s = 0;
  double weight_gbps = 0;          // median over calls of (weight+scale bytes of its distinct experts) / time
  double bytes_per_call = 0;       // mean, as computed by the tool from the routing
  double distinct_per_call = 0;    // mean distinct experts per call
  double lib_bytes_per_call = -1;  // moejit_moe_stats weight_bytes_read per timed call, -1 if unavailable
  int64_t nonfinite_outputs = 0;   // in y after the last call
};

// Creates a context (spec.threads, spec.max_isa) and the layer, warms up, then times calls with
// consecutive routings of the pool until both min_calls and min_time are reached.
CaseResult run_case(const Layer& layer, const Geometry& g, const Routing& routing, const CaseSpec& spec);

const char* status_label(CaseStatus s);

}  // namespace moejit_bench
