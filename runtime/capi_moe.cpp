// The C API's MoE layer: moejit_moe_create's descriptor validation and the
// checks of a forward or submit call.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "runtime/capi_check.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/moe.h"

namespace moejit::capi {

namespace fmt = moejit::formats;

namespace {

// The 0.1 descriptor ends at `down`: its size is still a valid struct_size.
constexpr size_t kMoeDescV1Size = offsetof(moejit_moe_desc, gate);
#if defined(__x86_64__)
static_assert(kMoeDescV1Size == 80 && sizeof(moejit_moe_desc) == 112, "moejit_moe_desc sizes of api.md");
#endif

// One projection's bank as the descriptor gives it.
struct Bank {
  const char* name;        // "gate_up", "gate", "up", "down"
  const moejit_matrix* m;  // [num_experts]
  FormatArgs args;
  const char* format_field;  // where its format comes from ("desc->format", "desc->up_format->format")
  bool own_format;           // up_format or down_format: not the layer's own fields
  int64_t rows, k;
  fmt::Format f() const { return static_cast<fmt::Format>(args.format); }
  int32_t group() const { return fmt::default_group(f(), args.group_size); }
};

// Exactly one of gate_up and the pair (gate, up); up_format only with the pair.
bool check_banks(const char* fn, const moejit_moe_desc* d, moejit_status* st) {
  const auto INV = MOEJIT_INVALID_ARGUMENT;
  if (d->gate_up && (d->gate || d->up)) {
    *st =
        fail(INV, fn,
             "desc->gate_up and desc->%s are both given: pass the fused gate_up or the separate gate and up "
             "banks, not both",
             d->gate ? "gate" : "up");
    return false;
  }
  if (!d->gate_up && !d->gate && !d->up) {
    *st = fail(INV, fn,
               "desc->gate_up is NULL, and so are desc->gate and desc->up (one of the two forms is needed)");
    return false;
  }
  if (!d->gate_up && (!d->gate || !d->up)) {
    *st = fail(INV, fn, "desc->%s is NULL but desc->%s is not: separate banks need both gate and up",
               d->gate ? "up" : "gate", d->gate ? "gate" : "up");
    return false;
  }
  if (!d->gate_up && d->gate_up_interleaved != 0) {
    *st = fail(INV, fn, "desc->gate_up_interleaved = %d must be 0 with separate gate and up banks",
               d->gate_up_interleaved);
    return false;
  }
  if (d->gate_up && d->up_format) {
    *st = fail(
        INV, fn,
        "desc->up_format is not NULL but gate and up are one fused matrix (desc->gate_up) in one format: "
        "give up_format with separate banks (desc->gate, desc->up)");
    return false;
  }
  return true;
}

// ds_fp4's activation numerics (x, g and the route outputs rounded) belong to the
// whole layer: every projection is ds_fp4 or none is.
bool check_ds_fp4(const char* fn, const Bank& gate, const Bank& up, const Bank& down, moejit_status* st) {
  const auto ds = [](const Bank& b) { return fmt::info(b.f()).ds_numerics; };
  if (ds(gate) == ds(up) && ds(gate) == ds(down)) return true;
  const Bank& odd = ds(up) != ds(gate) ? up : down;
  *st = fail(MOEJIT_INVALID_ARGUMENT, fn,
             "%s = %s but desc->format = %s: ds_fp4's activation numerics apply to the whole layer, so every "
             "projection is ds_fp4 or none is",
             odd.format_field, fmt::format_name(odd.f()), fmt::format_name(gate.f()));
  return false;
}

}  // namespace

moejit_status moe_create(moejit_context* ctx, const moejit_moe_desc* desc, moejit_moe** out) {
  const char* fn = "moejit_moe_create";
  const auto INV = MOEJIT_INVALID_ARGUMENT;
  if (!out) return fail(INV, fn, "out is NULL");
  *out = nullptr;
  if (!ctx) return fail(INV, fn, "ctx is NULL");
  if (!desc) return fail(INV, fn, "desc is NULL");
  moejit_status st = MOEJIT_OK;
  if (!check_struct_size(fn, "desc", desc, desc->struct_size, sizeof(moejit_moe_desc), &st, kMoeDescV1Size))
    return st;
  // A 0.1 caller's descriptor ends before the 0.2 fields: they read as zero.
  moejit_moe_desc copy;
  std::memset(&copy, 0, sizeof(copy));
  std::memcpy(&copy, desc, std::min<size_t>(desc->struct_size, sizeof(copy)));
  const moejit_moe_desc* d = &copy;

  const FormatArgs gate_args{raw_enum(d->format), raw_enum(d->scale_dtype), d->group_size};
  if (!check_format_args(fn, gate_args, &st)) return st;
  FormatArgs up_args = gate_args, down_args = gate_args;
  if (d->up_format) {
    up_args = {raw_enum(d->up_format->format), raw_enum(d->up_format->scale_dtype), d->up_format->group_size};
    if (!check_format_args(fn, up_args, &st, "desc->up_format->")) return st;
  }
  if (d->down_format) {
    down_args = {raw_enum(d->down_format->format), raw_enum(d->down_format->scale_dtype),
                 d->down_format->group_size};
    if (!check_format_args(fn, down_args, &st, "desc->down_format->")) return st;
  }
  struct {
    const char* name;
    int32_t v;
  } sizes[] = {{"hidden", d->hidden},
               {"intermediate", d->intermediate},
               {"num_experts", d->num_experts},
               {"max_tokens", d->max_tokens}};
  for (const auto& s : sizes)
    if (s.v < 1) return fail(INV, fn, "desc->%s = %d must be >= 1", s.name, s.v);
  if (d->top_k < 1 || d->top_k > d->num_experts)
    return fail(INV, fn, "desc->top_k = %d is out of range [1, num_experts = %d]", d->top_k, d->num_experts);
  if (int64_t(d->max_tokens) * d->top_k > (int64_t(1) << 24))
    return fail(INV, fn, "desc->max_tokens = %d times top_k = %d is too large", d->max_tokens, d->top_k);
  if (raw_enum(d->activation) < MOEJIT_ACT_SILU || raw_enum(d->activation) > MOEJIT_ACT_SWIGLU_CLAMP)
    return fail(INV, fn, "desc->activation = %d is not a known activation (0..4)", raw_enum(d->activation));
  if (!std::isfinite(d->swiglu_alpha))
    return fail(INV, fn, "desc->swiglu_alpha = %g must be finite", double(d->swiglu_alpha));
  if (std::isnan(d->swiglu_limit) || d->swiglu_limit < 0.0f)
    return fail(INV, fn, "desc->swiglu_limit = %g must be >= 0 (0 or inf: no clamp)",
                double(d->swiglu_limit));
  if (d->gate_up_interleaved != 0 && d->gate_up_interleaved != 1)
    return fail(INV, fn, "desc->gate_up_interleaved = %d must be 0 or 1", d->gate_up_interleaved);
  if (d->router_weight_on_input != 0 && d->router_weight_on_input != 1)
    return fail(INV, fn, "desc->router_weight_on_input = %d must be 0 or 1", d->router_weight_on_input);
  if (raw_enum(d->output_dtype) != MOEJIT_DTYPE_BF16 && raw_enum(d->output_dtype) != MOEJIT_DTYPE_F32)
    return fail(INV, fn, "desc->output_dtype = %d must be 0 (bf16) or 1 (f32)", raw_enum(d->output_dtype));
  if (!check_banks(fn, d, &st)) return st;
  if (!d->down) return fail(INV, fn, "desc->down is NULL");

  const int64_t H = d->hidden, I = d->intermediate;
  const bool separate = d->gate_up == nullptr;
  // The matrices of one expert: gate_up [2I, H], or gate and up [I, H]; down [H, I].
  Bank banks[3] = {{separate ? "gate" : "gate_up", separate ? d->gate : d->gate_up, gate_args, "desc->format",
                    false, separate ? I : 2 * I, H},
                   {"up", d->up, up_args, d->up_format ? "desc->up_format->format" : "desc->format",
                    d->up_format != nullptr, I, H},
                   {"down", d->down, down_args, d->down_format ? "desc->down_format->format" : "desc->format",
                    d->down_format != nullptr, H, I}};
  if (!check_ds_fp4(fn, banks[0], banks[1], banks[2], &st)) return st;
  for (const Bank& b : banks) {
    if (b.m == nullptr) continue;  // up of a fused gate_up
    const char* what = &b == &banks[2] ? "desc->intermediate" : "desc->hidden";
    if (!check_k(fn, what, b.f(), b.group(), b.k, &st, b.own_format ? b.format_field : nullptr)) return st;
    // Bytes of one expert must be addressable (rows * row bytes in int64 without overflow).
    if (b.rows * fmt::row_bytes(b.f(), b.k) > (int64_t(1) << 50))
      return fail(INV, fn, "desc->hidden = %d and desc->intermediate = %d are too large", d->hidden,
                  d->intermediate);
  }
  char name[64];
  for (int32_t e = 0; e < d->num_experts; ++e)
    for (const Bank& b : banks) {
      if (b.m == nullptr) continue;
      std::snprintf(name, sizeof(name), "desc->%s[%d]", b.name, e);
      if (!check_matrix(fn, name, b.m[e], b.f(), b.group(), b.rows, b.k, &st)) return st;
    }
  // Support checks come after every validity check.
  for (const Bank& b : banks) {
    if (b.m == nullptr) continue;
    if (!fmt::info(b.f()).stride_in_kernel) continue;
    const auto stride = [&](const moejit_matrix& m) {
      return m.scale_row_stride ? m.scale_row_stride : fmt::scale_cols(b.f(), b.group(), b.k);
    };
    for (int32_t e = 1; e < d->num_experts; ++e)
      if (stride(b.m[e]) != stride(b.m[0]))
        return fail(MOEJIT_UNSUPPORTED, fn,
                    "desc->%s[%d].scale_row_stride = %lld differs from desc->%s[0]'s %lld: %s kernels are "
                    "generated for one stride per projection",
                    b.name, e, (long long)stride(b.m[e]), b.name, (long long)stride(b.m[0]),
                    fmt::format_name(b.f()));
  }
  const auto proj = [](const Bank& b) {
    return moejit::plan::ProjFormat{b.f(), static_cast<fmt::ScaleDtype>(b.args.scale_dtype),
                                    b.args.group_size};
  };
  moejit::MoeConfig cfg;
  cfg.gate = proj(banks[0]);
  cfg.up = proj(banks[1]);
  cfg.down = proj(banks[2]);
  cfg.gate_up = separate                      ? moejit::plan::GateUp::separate
                : d->gate_up_interleaved == 1 ? moejit::plan::GateUp::interleaved
                                              : moejit::plan::GateUp::concat;
  cfg.hidden = d->hidden;
  cfg.intermediate = d->intermediate;
  cfg.experts = d->num_experts;
  cfg.top_k = d->top_k;
  cfg.max_tokens = d->max_tokens;
  cfg.act.kind = d->activation;
  cfg.act.alpha = d->swiglu_alpha == 0.0f ? 1.702f : d->swiglu_alpha;
  cfg.act.limit = d->swiglu_limit;
  cfg.weight_on_input = d->router_weight_on_input == 1;
  cfg.out_dtype = d->output_dtype;

  std::unique_ptr<moejit::MoeLayer> layer;
  std::string err;
  st = moejit::MoeLayer::create(ctx->impl, cfg, {banks[0].m, banks[1].m, d->down}, &layer, &err);
  if (st == MOEJIT_OUT_OF_MEMORY) return out_of_memory(fn);
  if (st != MOEJIT_OK) return fail(st, fn, "%s", err.c_str());
  auto* h = new (std::nothrow) moejit_moe();
  if (!h) return out_of_memory(fn);
  h->impl = std::move(layer);
  *out = h;
  return MOEJIT_OK;
}

moejit_status moe_submit(const char* fn, moejit_moe* moe, int32_t T, const uint16_t* x, const int32_t* ids,
                         const float* w, void* y, bool sync) {
  if (!moe) return fail(MOEJIT_INVALID_ARGUMENT, fn, "moe is NULL");
  const moejit::MoeConfig& c = moe->impl->config();
  if (T < 0 || T > c.max_tokens)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "num_tokens = %d is out of range [0, max_tokens = %d]", T,
                c.max_tokens);
  if (T == 0) return MOEJIT_OK;
  if (!x) return fail(MOEJIT_INVALID_ARGUMENT, fn, "x is NULL");
  if (!ids) return fail(MOEJIT_INVALID_ARGUMENT, fn, "topk_ids is NULL");
  if (!w) return fail(MOEJIT_INVALID_ARGUMENT, fn, "topk_weights is NULL");
  if (!y) return fail(MOEJIT_INVALID_ARGUMENT, fn, "y is NULL");
  for (int32_t t = 0; t < T; ++t)
    for (int32_t k = 0; k < c.top_k; ++k) {
      const int32_t e = ids[int64_t(t) * c.top_k + k];
      if (e >= c.experts)
        return fail(MOEJIT_INVALID_ARGUMENT, fn, "topk_ids[%d][%d] = %d is out of range [0, %d)", t, k, e,
                    c.experts);
    }
  const moejit_status st = moe->impl->submit(T, x, ids, w, y, sync);
  if (st == MOEJIT_BUSY)
    return fail(st, fn, "the context already has a task in flight (call moejit_context_wait)");
  return st;
}

}  // namespace moejit::capi
