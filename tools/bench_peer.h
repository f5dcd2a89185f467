// moejit-bench --peer: the same MoE work through another library, timed the same way (same layer
// memory, routing pool, tokens and call sequence as the moejit case it is compared with).
#pragma once

#include <string>

#include "bench_layer.h"
#include "bench_report.h"
#include "bench_run.h"

namespace moejit_bench {

// True when this build can run the peer; otherwise *why says what is missing.
bool peer_available(PeerKind kind, std::string* why);

// How the peer runs a format: its label ("onednn bf16", ...) and a note for the reader on what it
// computes (empty when it is the same computation as moejit's). Probes the library when asked.
struct PeerPlan {
  bool supported = false;
  std::string label;
  std::string note;  // what differs from moejit, or why the format is unsupported
};
PeerPlan peer_plan(PeerKind kind, FormatChoice format);

// Times the peer on `layer` with spec.threads threads (spec.max_isa and spec.dedup do not apply).
CaseResult run_peer(PeerKind kind, const Layer& layer, const Routing& routing, const CaseSpec& spec);

}  // namespace moejit_bench
