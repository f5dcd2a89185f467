#include "bench_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

namespace moejit_bench {

namespace {

using Clock = std::chrono::steady_clock;

struct ContextDeleter {
  void operator()(moejit_context* c) const { moejit_context_destroy(c); }
};
struct MoeDeleter {
  void operator()(moejit_moe* m) const { moejit_moe_destroy(m); }
};
using ContextPtr = std::unique_ptr<moejit_context, ContextDeleter>;
using MoePtr = std::unique_ptr<moejit_moe, MoeDeleter>;

// Records a failed call into `r`; returns false so callers can `return fail(...)`.
bool fail(CaseResult* r, moejit_status st) {
  r->status = st == MOEJIT_UNSUPPORTED ? CaseStatus::unsupported : CaseStatus::error;
  r->message = std::string(moejit_status_name(st)) + ": " + moejit_last_error();
  return false;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + long(mid), v.end());
  if (v.size() % 2) return v[mid];
  return 0.5 * (v[mid] + *std::max_element(v.begin(), v.begin() + long(mid)));
}

int64_t count_nonfinite(const std::vector<uint8_t>& y, moejit_dtype dt) {
  int64_t bad = 0;
  if (dt == MOEJIT_DTYPE_F32) {
    for (size_t i = 0; i + 4 <= y.size(); i += 4) {
      float f;
      std::memcpy(&f, &y[i], 4);
      bad += !std::isfinite(f);
    }
  } else {
    for (size_t i = 0; i + 2 <= y.size(); i += 2) {
      uint16_t h;
      std::memcpy(&h, &y[i], 2);
      bad += (h & 0x7F80) == 0x7F80;
    }
  }
  return bad;
}

bool read_stats(const moejit_moe* moe, moejit_moe_stats* s, CaseResult* r) {
  std::memset(s, 0, sizeof(*s));
  s->struct_size = sizeof(*s);
  const moejit_status st = moejit_moe_stats_get(moe, s);
  return st == MOEJIT_OK || fail(r, st);
}

bool time_calls(moejit_moe* moe, const Geometry& g, const Routing& routing, const CaseSpec& spec,
                CaseResult* r) {
  const std::vector<uint16_t> x = random_activations(int64_t(spec.tokens) * g.hidden, 0x5EED + spec.tokens);
  const size_t y_elem = g.output_dtype == MOEJIT_DTYPE_F32 ? 4 : 2;
  std::vector<uint8_t> y(size_t(spec.tokens) * size_t(g.hidden) * y_elem);
  const double expert = double(expert_bytes(spec.format, g));
  int64_t call = 0;
  auto forward = [&] {
    const moejit_status st = moejit_moe_forward(moe, spec.tokens, x.data(), routing.ids_of(call),
                                                routing.weights_of(call), y.data());
    return st == MOEJIT_OK || fail(r, st);
  };
  const auto warm_start = Clock::now();  // warm-up: `warmup` calls, cut short after min_time / 4
  for (int32_t i = 0; i < spec.warmup; ++i) {
    if (!forward()) return false;
    ++call;  // every call, timed or not, gets the next routing: experts stay cold
    if (std::chrono::duration<double>(Clock::now() - warm_start).count() > spec.min_time / 4) break;
  }

  moejit_moe_stats before, after;
  if (!read_stats(moe, &before, r)) return false;
  std::vector<double> seconds, gbps;
  double bytes = 0, distinct = 0;
  const auto start = Clock::now();
  while (int64_t(seconds.size()) < spec.min_calls ||
         std::chrono::duration<double>(Clock::now() - start).count() < spec.min_time) {
    const auto t0 = Clock::now();
    if (!forward()) return false;
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const double call_bytes = routing.distinct_of(call) * expert;
    seconds.push_back(s);
    gbps.push_back(call_bytes / s / 1e9);
    bytes += call_bytes;
    distinct += routing.distinct_of(call);
    ++call;
  }
  if (!read_stats(moe, &after, r)) return false;

  r->calls = int64_t(seconds.size());
  r->median_s = median(seconds);
  r->min_s = *std::min_element(seconds.begin(), seconds.end());
  r->mean_s = std::accumulate(seconds.begin(), seconds.end(), 0.0) / double(r->calls);
  r->weight_gbps = median(gbps);
  r->bytes_per_call = bytes / double(r->calls);
  r->distinct_per_call = distinct / double(r->calls);
  if (after.calls - before.calls == uint64_t(r->calls))
    r->lib_bytes_per_call = double(after.weight_bytes_read - before.weight_bytes_read) / double(r->calls);
  r->nonfinite_outputs = count_nonfinite(y, g.output_dtype);
  return true;
}

}  // namespace

const char* status_label(CaseStatus s) {
  switch (s) {
    case CaseStatus::ok: return "ok";
    case CaseStatus::unsupported: return "unsupported";
    case CaseStatus::error: return "error";
  }
  return "?";
}

CaseResult run_case(const Layer& layer, const Geometry& g, const Routing& routing, const CaseSpec& spec) {
  CaseResult r;
  moejit_context_desc cd{};
  cd.struct_size = sizeof(cd);
  cd.num_threads = spec.threads;
  cd.max_isa = spec.max_isa;
  moejit_context* raw_ctx = nullptr;
  moejit_status st = moejit_context_create(&cd, &raw_ctx);
  ContextPtr ctx(raw_ctx);
  if (st != MOEJIT_OK) return fail(&r, st), r;
  r.isa = moejit_context_isa(ctx.get());
  r.threads = moejit_context_num_threads(ctx.get());

  const moejit_moe_desc desc = layer.desc(spec.tokens);
  moejit_moe* raw_moe = nullptr;
  st = moejit_moe_create(ctx.get(), &desc, &raw_moe);
  MoePtr moe(raw_moe);
  if (st != MOEJIT_OK) return fail(&r, st), r;
  time_calls(moe.get(), g, routing, spec, &r);
  return r;
}

}  // namespace moejit_bench
