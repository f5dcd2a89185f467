#include "bench_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

namespace moejit_bench {

namespace {

using Clock = std::chrono::steady_clock;

using ContextPtr = std::unique_ptr<moejit_context, decltype(&moejit_context_destroy)>;
using MoePtr = std::unique_ptr<moejit_moe, decltype(&moejit_moe_destroy)>;

// Records a failed call of `api` into `r`; returns false so callers can `return fail(...)`.
bool fail(const MoeApi& api, CaseResult* r, moejit_status st) {
  r->status = st == MOEJIT_UNSUPPORTED ? CaseStatus::unsupported : CaseStatus::error;
  r->message = std::string(api.status_name(st)) + ": " + api.last_error();
  return false;
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

bool read_stats(const MoeApi& api, const moejit_moe* moe, moejit_moe_stats* s, CaseResult* r) {
  std::memset(s, 0, sizeof(*s));
  s->struct_size = sizeof(*s);
  const moejit_status st = api.moe_stats_get(moe, s);
  return st == MOEJIT_OK || fail(api, r, st);
}

// Timed calls of one arm, accumulated over one or several slices.
class CallTimer {
 public:
  CallTimer(const Routing& routing, double expert_bytes, int64_t first_call, PrepareFn prepare)
      : routing_(routing), expert_(expert_bytes), call_(first_call), prepare_(std::move(prepare)) {}

  // Untimed calls: spec.warmup of them, cut short after spec.min_time / 4.
  bool warmup(const CallFn& fn, const CaseSpec& spec) {
    const auto start = Clock::now();
    for (int32_t i = 0; i < spec.warmup; ++i) {
      if (prepare_) prepare_(call_);
      if (!fn(call_++)) return false;  // every call, timed or not, gets the next routing: experts stay cold
      if (std::chrono::duration<double>(Clock::now() - start).count() > spec.min_time / 4) break;
    }
    return true;
  }

  // Timed calls for `slice` seconds (at least one call), or until done() when slice < 0.
  bool run(const CallFn& fn, double slice, const CaseSpec& spec) {
    const auto start = Clock::now();
    do {
      if (prepare_) prepare_(call_);
      const auto t0 = Clock::now();
      if (!fn(call_)) return false;
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      const double call_bytes = routing_.distinct_of(call_) * expert_;
      seconds_.push_back(s);
      gbps_.push_back(call_bytes / s / 1e9);
      bytes_ += call_bytes;
      distinct_ += routing_.distinct_of(call_);
      timed_ += s;
      ++call_;
    } while (slice < 0 ? !done(spec) : std::chrono::duration<double>(Clock::now() - start).count() < slice);
    return true;
  }

  bool done(const CaseSpec& spec) const {
    return int64_t(seconds_.size()) >= spec.min_calls && timed_ >= spec.min_time;
  }

  void finish(CaseResult* r) const {
    r->calls = int64_t(seconds_.size());
    r->median_s = median(seconds_);
    r->min_s = *std::min_element(seconds_.begin(), seconds_.end());
    r->mean_s = timed_ / double(r->calls);
    r->weight_gbps = median(gbps_);
    r->bytes_per_call = bytes_ / double(r->calls);
    r->distinct_per_call = distinct_ / double(r->calls);
    r->routes_per_call = double(routing_.tokens) * routing_.top_k;
  }

 private:
  const Routing& routing_;
  double expert_;
  int64_t call_;
  PrepareFn prepare_;
  std::vector<double> seconds_, gbps_;
  double bytes_ = 0, distinct_ = 0, timed_ = 0;
};

// One moejit layer in its own context, ready to be timed, through `api` (the linked library or
// a --baseline build).
class MoeArm {
 public:
  MoeArm(const MoeApi& api, const Layer& layer, const Routing& routing, const CaseSpec& spec,
         int64_t first_call)
      : api_(api),
        layer_(layer),
        routing_(routing),
        spec_(spec),
        timer_(routing, double(expert_bytes(spec.format, layer.geometry())), first_call,
               [this](int64_t c) { layer_.place(routing_.ids_of(c), int64_t(ids_.size()), ids_.data()); }),
        ids_(size_t(spec.tokens) * size_t(layer.geometry().top_k)) {
    const Geometry& g = layer.geometry();
    moejit_context_desc cd{};
    cd.struct_size = sizeof(cd);
    cd.num_threads = spec.threads;
    cd.max_isa = spec.max_isa;
    cd.flags = spec.dedup ? 0u : MOEJIT_CONTEXT_NO_DEDUP;
    moejit_context* raw_ctx = nullptr;
    moejit_status st = api_.context_create(&cd, &raw_ctx);
    ctx_.reset(raw_ctx);
    if (st != MOEJIT_OK) {
      fail(api_, &result_, st);
      return;
    }
    result_.isa = api_.context_isa(ctx_.get());
    result_.threads = api_.context_num_threads(ctx_.get());
    const moejit_moe_desc desc = layer.desc(spec.tokens);
    moejit_moe* raw_moe = nullptr;
    st = api_.moe_create(ctx_.get(), &desc, &raw_moe);
    moe_.reset(raw_moe);
    if (st != MOEJIT_OK) {
      fail(api_, &result_, st);
      return;
    }
    x_ = random_activations(int64_t(spec.tokens) * g.hidden, 0x5EED + spec.tokens);
    y_.resize(size_t(spec.tokens) * size_t(g.hidden) * (g.output_dtype == MOEJIT_DTYPE_F32 ? 4 : 2));
    fn_ = [this](int64_t c) {
      const moejit_status s = api_.moe_forward(moe_.get(), spec_.tokens, x_.data(), ids_.data(),
                                               routing_.weights_of(c), y_.data());
      return s == MOEJIT_OK || fail(api_, &result_, s);
    };
    ok_ = true;
  }

  bool ok() const { return ok_; }
  bool done() const { return !ok_ || timer_.done(spec_); }
  // Warm-up, then the library's counters as the start of the timed calls.
  void warmup() {
    ok_ = ok_ && timer_.warmup(fn_, spec_) && read_stats(api_, moe_.get(), &before_, &result_);
  }
  void run(double slice) { ok_ = ok_ && timer_.run(fn_, slice, spec_); }

  CaseResult finish() {
    moejit_moe_stats after;
    if (!ok_ || !read_stats(api_, moe_.get(), &after, &result_)) return result_;
    timer_.finish(&result_);
    if (after.calls - before_.calls == uint64_t(result_.calls)) {
      const double calls = double(result_.calls);
      result_.lib_bytes_per_call = double(after.weight_bytes_read - before_.weight_bytes_read) / calls;
      result_.lib_unique_per_call = double(after.unique_experts - before_.unique_experts) / calls;
    }
    result_.nonfinite_outputs = count_nonfinite(y_, layer_.geometry().output_dtype);
    return result_;
  }

 private:
  const MoeApi& api_;
  const Layer& layer_;
  const Routing& routing_;
  CaseSpec spec_;
  CallTimer timer_;
  std::vector<int32_t> ids_;  // the call's routes placed on the layer's slots
  CaseResult result_;
  // Deleters of api_'s library; destroyed in reverse order: the layer before its context.
  ContextPtr ctx_{nullptr, api_.context_destroy};
  MoePtr moe_{nullptr, api_.moe_destroy};
  std::vector<uint16_t> x_;
  std::vector<uint8_t> y_;
  CallFn fn_;
  moejit_moe_stats before_{};
  bool ok_ = false;
};

}  // namespace

bool time_loop(const CallFn& fn, const Routing& routing, double expert_bytes, const CaseSpec& spec,
               CaseResult* r, const PrepareFn& prepare) {
  CallTimer timer(routing, expert_bytes, 0, prepare);
  if (!timer.warmup(fn, spec) || !timer.run(fn, -1, spec)) return false;
  timer.finish(r);
  return true;
}

std::vector<CaseResult> run_arms(const Layer& layer, const std::vector<Arm>& arms_of, const Routing& routing,
                                 const CaseSpec& spec, const std::function<void()>& round) {
  std::vector<std::unique_ptr<MoeArm>> arms;
  for (size_t i = 0; i < arms_of.size(); ++i) {
    CaseSpec s = spec;
    s.dedup = arms_of[i].dedup;
    // Arms start at different places of the routing pool: no arm finds the experts of the
    // routing another arm just ran still in the cache.
    const int64_t first = int64_t(i) * routing.pool / int64_t(arms_of.size());
    arms.push_back(
        std::make_unique<MoeArm>(arms_of[i].api ? *arms_of[i].api : linked_api(), layer, routing, s, first));
  }
  for (auto& a : arms) a->warmup();
  const double slice = std::clamp(spec.min_time / 8, 0.02, 0.25);
  for (;;) {
    bool all_done = true, any_ok = false;
    for (auto& a : arms) all_done = all_done && a->done(), any_ok = any_ok || a->ok();
    if (all_done || !any_ok) break;
    for (auto& a : arms)
      if (!a->done()) a->run(slice);
    if (round) round();
  }
  std::vector<CaseResult> out;
  for (auto& a : arms) out.push_back(a->finish());
  return out;
}

CaseResult run_case(const Layer& layer, const Routing& routing, const CaseSpec& spec) {
  return run_arms(layer, {Arm{spec.dedup, nullptr}}, routing, spec, {}).front();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + long(mid), v.end());
  if (v.size() % 2) return v[mid];
  return 0.5 * (v[mid] + *std::max_element(v.begin(), v.begin() + long(mid)));
}

const char* status_label(CaseStatus s) {
  switch (s) {
    case CaseStatus::ok: return "ok";
    case CaseStatus::unsupported: return "unsupported";
    case CaseStatus::skipped: return "skipped";
    case CaseStatus::error: return "error";
  }
  return "?";
}

}  // namespace moejit_bench
