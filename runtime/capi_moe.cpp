// The C API's MoE layer: moejit_moe_create's descriptor validation and the
// checks of a forward or submit call.
#include <cmath>
#include <cstdio>
#include <memory>
#include <new>
#include <string>

#include "runtime/capi_check.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/moe.h"

namespace moejit::capi {

namespace fmt = moejit::formats;

moejit_status moe_create(moejit_context* ctx, const moejit_moe_desc* d, moejit_moe** out) {
  const char* fn = "moejit_moe_create";
  if (!out) return fail(MOEJIT_INVALID_ARGUMENT, fn, "out is NULL");
  *out = nullptr;
  if (!ctx) return fail(MOEJIT_INVALID_ARGUMENT, fn, "ctx is NULL");
  if (!d) return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc is NULL");
  moejit_status st = MOEJIT_OK;
  if (!check_struct_size(fn, "desc", d, d->struct_size, sizeof(moejit_moe_desc), &st)) return st;
  if (!check_format_args(fn, {raw_enum(d->format), raw_enum(d->scale_dtype), d->group_size}, &st)) return st;
  const auto f = static_cast<fmt::Format>(d->format);
  const int32_t group = fmt::default_group(f, d->group_size);
  struct {
    const char* name;
    int32_t v;
  } sizes[] = {{"hidden", d->hidden},
               {"intermediate", d->intermediate},
               {"num_experts", d->num_experts},
               {"max_tokens", d->max_tokens}};
  for (const auto& s : sizes)
    if (s.v < 1) return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->%s = %d must be >= 1", s.name, s.v);
  if (d->top_k < 1 || d->top_k > d->num_experts)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->top_k = %d is out of range [1, num_experts = %d]",
                d->top_k, d->num_experts);
  if (int64_t(d->max_tokens) * d->top_k > (int64_t(1) << 24))
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->max_tokens = %d times top_k = %d is too large",
                d->max_tokens, d->top_k);
  if (raw_enum(d->activation) < MOEJIT_ACT_SILU || raw_enum(d->activation) > MOEJIT_ACT_SWIGLU_CLAMP)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->activation = %d is not a known activation (0..4)",
                raw_enum(d->activation));
  if (!std::isfinite(d->swiglu_alpha))
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->swiglu_alpha = %g must be finite",
                double(d->swiglu_alpha));
  if (std::isnan(d->swiglu_limit) || d->swiglu_limit < 0.0f)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->swiglu_limit = %g must be >= 0 (0 or inf: no clamp)",
                double(d->swiglu_limit));
  if (d->gate_up_interleaved != 0 && d->gate_up_interleaved != 1)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->gate_up_interleaved = %d must be 0 or 1",
                d->gate_up_interleaved);
  if (d->router_weight_on_input != 0 && d->router_weight_on_input != 1)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->router_weight_on_input = %d must be 0 or 1",
                d->router_weight_on_input);
  if (raw_enum(d->output_dtype) != MOEJIT_DTYPE_BF16 && raw_enum(d->output_dtype) != MOEJIT_DTYPE_F32)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->output_dtype = %d must be 0 (bf16) or 1 (f32)",
                raw_enum(d->output_dtype));
  if (!check_k(fn, "desc->hidden", f, group, d->hidden, &st)) return st;
  if (!check_k(fn, "desc->intermediate", f, group, d->intermediate, &st)) return st;
  // Bytes of one expert must be addressable (rows * row bytes in int64 without overflow).
  const int64_t H = d->hidden, I = d->intermediate;
  if (2 * I * fmt::row_bytes(f, H) > (int64_t(1) << 50) || H * fmt::row_bytes(f, I) > (int64_t(1) << 50))
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->hidden = %d and desc->intermediate = %d are too large",
                d->hidden, d->intermediate);
  if (!d->gate_up) return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->gate_up is NULL");
  if (!d->down) return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->down is NULL");
  char name[64];
  for (int32_t e = 0; e < d->num_experts; ++e) {
    std::snprintf(name, sizeof(name), "desc->gate_up[%d]", e);
    if (!check_matrix(fn, name, d->gate_up[e], f, group, 2 * I, H, &st)) return st;
    std::snprintf(name, sizeof(name), "desc->down[%d]", e);
    if (!check_matrix(fn, name, d->down[e], f, group, H, I, &st)) return st;
  }
  // Support checks come after every validity check.
  if (fmt::info(f).stride_in_kernel) {
    const auto stride = [&](const moejit_matrix& m, int64_t k) {
      return m.scale_row_stride ? m.scale_row_stride : fmt::scale_cols(f, group, k);
    };
    for (int32_t e = 1; e < d->num_experts; ++e)
      if (stride(d->gate_up[e], H) != stride(d->gate_up[0], H) ||
          stride(d->down[e], I) != stride(d->down[0], I))
        return fail(
            MOEJIT_UNSUPPORTED, fn,
            "desc->gate_up[%d] or desc->down[%d] has a scale_row_stride different from expert 0's: %s "
            "kernels are generated for one stride per projection",
            e, e, fmt::format_name(f));
  }
  moejit::MoeConfig cfg;
  cfg.format = f;
  cfg.scale_dtype = static_cast<fmt::ScaleDtype>(d->scale_dtype);
  cfg.group = group;
  cfg.hidden = d->hidden;
  cfg.intermediate = d->intermediate;
  cfg.experts = d->num_experts;
  cfg.top_k = d->top_k;
  cfg.max_tokens = d->max_tokens;
  cfg.act.kind = d->activation;
  cfg.act.alpha = d->swiglu_alpha == 0.0f ? 1.702f : d->swiglu_alpha;
  cfg.act.limit = d->swiglu_limit;
  cfg.interleaved = d->gate_up_interleaved == 1;
  cfg.weight_on_input = d->router_weight_on_input == 1;
  cfg.out_dtype = d->output_dtype;

  std::unique_ptr<moejit::MoeLayer> layer;
  std::string err;
  st = moejit::MoeLayer::create(ctx->impl, cfg, d->gate_up, d->down, &layer, &err);
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
