// The C API: validate every argument, translate to the runtime, never let an
// exception out. Messages name the function, the argument and its value.
#include <sched.h>
#include <strings.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "jit/tiers.h"
#include "moejit.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/linear.h"
#include "runtime/moe.h"

#ifndef MOEJIT_VERSION_STRING
#define MOEJIT_VERSION_STRING "0.0.0"
#endif

using moejit::fail;
namespace fmt = moejit::formats;

namespace {

constexpr int kMaxThreads = 1024;

// struct_size rule: smaller is invalid; larger is fine when the extra bytes are zero.
bool check_struct_size(const char* fn, const char* what, const void* desc, uint32_t size, size_t known,
                       moejit_status* st) {
  if (size < known) {
    *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s->struct_size = %u is smaller than %zu", what, size, known);
    return false;
  }
  const auto* p = static_cast<const uint8_t*>(desc);
  for (size_t i = known; i < size; ++i) {
    if (p[i] != 0) {
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn,
                 "%s->struct_size = %u is larger than %zu and byte %zu beyond the known fields is not zero",
                 what, size, known, i);
      return false;
    }
  }
  return true;
}

// A C caller may store any int in an enum field; loading such a value as the C++
// enum type is undefined behaviour (UBSan -fsanitize=enum), so enum fields are
// read as int32_t until they are validated.
template <class E>
int32_t raw_enum(const E& field) {
  static_assert(sizeof(E) == sizeof(int32_t), "C enums are int-sized");
  int32_t v;
  std::memcpy(&v, &field, sizeof(v));
  return v;
}

moejit_status internal_error(const char* fn) {
  return fail(MOEJIT_INTERNAL_ERROR, fn, "unexpected internal error");
}
moejit_status out_of_memory(const char* fn) { return fail(MOEJIT_OUT_OF_MEMORY, fn, "out of memory"); }

// ---- format-level checks shared by MoE and linear ----

struct FormatArgs {
  int32_t format;
  int32_t scale_dtype;
  int32_t group_size;
};

bool check_format_args(const char* fn, const FormatArgs& a, moejit_status* st) {
  if (!fmt::known_format(a.format)) {
    *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->format = %d is not a known format (0..%d)", a.format,
               fmt::kMaxFormatId);
    return false;
  }
  const auto f = static_cast<fmt::Format>(a.format);
  const fmt::FormatInfo& fi = fmt::info(f);
  if (fi.scale_code == fmt::ScaleCode::bf16_f32) {
    if (a.scale_dtype != MOEJIT_DTYPE_BF16 && a.scale_dtype != MOEJIT_DTYPE_F32) {
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->scale_dtype = %d must be 0 (bf16) or 1 (f32) for %s",
                 a.scale_dtype, fi.name);
      return false;
    }
  } else if (a.scale_dtype != 0) {
    *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->scale_dtype = %d must be 0 for format %s", a.scale_dtype,
               fi.name);
    return false;
  }
  if (fi.api_groups && a.group_size != 0 && !fmt::api_group_allowed(fi, a.group_size)) {
    std::string allowed = "0";
    for (int b = 0; b < 31; ++b)
      if (fi.api_groups >> b & 1u)
        allowed += (fi.api_groups >> (b + 1) ? ", " : " or ") + std::to_string(1 << b);
    *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->group_size = %d must be %s for %s", a.group_size,
               allowed.c_str(), fi.name);
    return false;
  }
  return true;
}

bool check_k(const char* fn, const char* what, fmt::Format f, int32_t group, int64_t k, moejit_status* st) {
  const char* why = "";
  if (!fmt::k_is_valid(f, group, k, &why)) {
    *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s = %lld %s (format %s)", what, (long long)k, why,
               fmt::format_name(f));
    return false;
  }
  return true;
}

// One matrix [rows, k]: pointers and scale stride.
bool check_matrix(const char* fn, const char* name, const moejit_matrix& m, fmt::Format f, int32_t group,
                  int64_t rows, int64_t k, moejit_status* st) {
  if (!m.data) {
    *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s.data is NULL", name);
    return false;
  }
  if (fmt::has_block_scales(f)) {
    if (!m.scales) {
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s.scales is NULL (format %s needs block scales)", name,
                 fmt::format_name(f));
      return false;
    }
    const int64_t cols = fmt::scale_cols(f, group, k);
    if (m.scale_row_stride < 0) {
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s.scale_row_stride = %lld is negative", name,
                 (long long)m.scale_row_stride);
      return false;
    }
    if (m.scale_row_stride != 0 && m.scale_row_stride < cols) {
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn,
                 "%s.scale_row_stride = %lld is smaller than the %lld scale columns", name,
                 (long long)m.scale_row_stride, (long long)cols);
      return false;
    }
    const int64_t srows = fmt::scale_rows(f, rows);
    const int64_t stride = m.scale_row_stride ? m.scale_row_stride : cols;
    if (stride > (int64_t(1) << 40) || srows * stride > (int64_t(1) << 46)) {
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s.scale_row_stride = %lld is too large", name,
                 (long long)m.scale_row_stride);
      return false;
    }
  } else if (m.scale_row_stride < 0) {
    *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s.scale_row_stride = %lld is negative", name,
               (long long)m.scale_row_stride);
    return false;
  }
  if (fmt::has_row_scales(f) && !m.row_scales) {
    *st =
        fail(MOEJIT_INVALID_ARGUMENT, fn, "%s.row_scales is NULL (nvfp4 needs per-row global scales)", name);
    return false;
  }
  return true;
}

// ---- context ----

bool parse_isa_env(moejit_isa* cap, moejit_status* st, const char* fn) {
  const char* v = std::getenv("MOEJIT_MAX_ISA");
  *cap = MOEJIT_ISA_AUTO;
  if (!v || !*v) return true;
  if (const moejit::jit::TierInfo* t = moejit::jit::tier_from_name(v)) {
    *cap = static_cast<moejit_isa>(t->isa);
    return true;
  }
  *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "environment MOEJIT_MAX_ISA = \"%.64s\" is not one of %s", v,
             moejit::jit::tier_names().c_str());
  return false;
}

moejit_isa host_isa_c() {
#if defined(MOEJIT_HAVE_JIT)
  return static_cast<moejit_isa>(moejit::jit::host_isa());
#else
  return MOEJIT_ISA_SCALAR;
#endif
}

moejit_status context_create(const moejit_context_desc* desc, moejit_context** out) {
  const char* fn = "moejit_context_create";
  if (!out) return fail(MOEJIT_INVALID_ARGUMENT, fn, "out is NULL");
  *out = nullptr;
  if (!desc) return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc is NULL");
  moejit_status st = MOEJIT_OK;
  if (!check_struct_size(fn, "desc", desc, desc->struct_size, sizeof(moejit_context_desc), &st)) return st;
  if (desc->num_threads < 0 || desc->num_threads > kMaxThreads)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->num_threads = %d is out of range [0, %d]",
                desc->num_threads, kMaxThreads);
  if (desc->num_cpu_ids < 0)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->num_cpu_ids = %d is negative", desc->num_cpu_ids);
  if (desc->num_cpu_ids > 0 && !desc->cpu_ids)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->cpu_ids is NULL but desc->num_cpu_ids = %d",
                desc->num_cpu_ids);
  if (raw_enum(desc->max_isa) != MOEJIT_ISA_AUTO &&
      !moejit::jit::tier_info(moejit::jit::Isa(raw_enum(desc->max_isa))))
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->max_isa = %d is not a known tier (0..%d)",
                raw_enum(desc->max_isa), int(moejit::jit::tier(moejit::jit::kTierCount - 1).isa));
  if (desc->flags & ~MOEJIT_CONTEXT_NO_DEDUP)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->flags = 0x%x has unknown bits 0x%x", desc->flags,
                desc->flags & ~MOEJIT_CONTEXT_NO_DEDUP);
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0)
    return fail(MOEJIT_INTERNAL_ERROR, fn, "sched_getaffinity failed");
  std::vector<int> cpus;
  for (int32_t i = 0; i < desc->num_cpu_ids; ++i) {
    const int32_t c = desc->cpu_ids[i];
    if (c < 0 || c >= CPU_SETSIZE || !CPU_ISSET(c, &mask))
      return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->cpu_ids[%d] = %d is not in the process affinity mask",
                  i, c);
    cpus.push_back(c);
  }
  moejit_isa env_cap;
  if (!parse_isa_env(&env_cap, &st, fn)) return st;
  const moejit_isa host = host_isa_c();
  if (desc->max_isa > host)
    return fail(MOEJIT_UNSUPPORTED, fn, "desc->max_isa = %s is above this CPU's best tier %s%s%s",
                moejit_isa_name(desc->max_isa), moejit_isa_name(host),
                desc->max_isa == MOEJIT_ISA_AVX512_AMX ? ": " : "",
                desc->max_isa == MOEJIT_ISA_AVX512_AMX ? moejit::jit::host_features().tile_data_note : "");
  moejit_isa isa = desc->max_isa == MOEJIT_ISA_AUTO ? host : desc->max_isa;
  if (env_cap != MOEJIT_ISA_AUTO && env_cap < isa) isa = env_cap;
  int threads = desc->num_threads;
  if (threads == 0) threads = desc->num_cpu_ids > 0 ? desc->num_cpu_ids : CPU_COUNT(&mask);
  if (threads < 1) threads = 1;
  if (threads > kMaxThreads) threads = kMaxThreads;

  // Owned until returned: make_shared may throw std::bad_alloc (guarded() reports it).
  std::unique_ptr<moejit_context> h(new (std::nothrow) moejit_context());
  if (!h) return out_of_memory(fn);
  // Read at every creation (never cached) so A/B runs in one process work.
  const char* dedup_env = std::getenv("MOEJIT_DEDUP");
  const bool dedup = !(dedup_env && std::strcmp(dedup_env, "0") == 0);
  const char* debug_env = std::getenv("MOEJIT_DEDUP_DEBUG");
  const bool dedup_debug = debug_env && std::strcmp(debug_env, "1") == 0;
  h->impl = std::make_shared<moejit::Context>(threads, cpus, static_cast<moejit::jit::Isa>(isa), desc->flags,
                                              dedup, dedup_debug);
  if (!h->impl->ok()) return fail(MOEJIT_OUT_OF_MEMORY, fn, "could not start %d worker threads", threads);
  *out = h.release();
  return MOEJIT_OK;
}

// ---- MoE ----

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

// ---- linear ----

moejit_status linear_create(moejit_context* ctx, const moejit_linear_desc* d, moejit_linear** out) {
  const char* fn = "moejit_linear_create";
  if (!out) return fail(MOEJIT_INVALID_ARGUMENT, fn, "out is NULL");
  *out = nullptr;
  if (!ctx) return fail(MOEJIT_INVALID_ARGUMENT, fn, "ctx is NULL");
  if (!d) return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc is NULL");
  moejit_status st = MOEJIT_OK;
  if (!check_struct_size(fn, "desc", d, d->struct_size, sizeof(moejit_linear_desc), &st)) return st;
  if (!check_format_args(fn, {raw_enum(d->format), raw_enum(d->scale_dtype), d->group_size}, &st)) return st;
  const auto f = static_cast<fmt::Format>(d->format);
  const int32_t group = fmt::default_group(f, d->group_size);
  if (d->rows < 1) return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->rows = %d must be >= 1", d->rows);
  if (d->cols < 1) return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->cols = %d must be >= 1", d->cols);
  if (d->max_tokens < 1)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->max_tokens = %d must be >= 1", d->max_tokens);
  if (d->max_tokens > (1 << 20))
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->max_tokens = %d is too large", d->max_tokens);
  if (raw_enum(d->output_dtype) != MOEJIT_DTYPE_BF16 && raw_enum(d->output_dtype) != MOEJIT_DTYPE_F32)
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "desc->output_dtype = %d must be 0 (bf16) or 1 (f32)",
                raw_enum(d->output_dtype));
  if (!check_k(fn, "desc->cols", f, group, d->cols, &st)) return st;
  if (!check_matrix(fn, "desc->weight", d->weight, f, group, d->rows, d->cols, &st)) return st;
  moejit::LinearConfig cfg;
  cfg.format = f;
  cfg.scale_dtype = static_cast<fmt::ScaleDtype>(d->scale_dtype);
  cfg.group = group;
  cfg.rows = d->rows;
  cfg.cols = d->cols;
  cfg.max_tokens = d->max_tokens;
  cfg.out_dtype = d->output_dtype;
  std::unique_ptr<moejit::LinearLayer> layer;
  std::string err;
  st = moejit::LinearLayer::create(ctx->impl, cfg, d->weight, &layer, &err);
  if (st == MOEJIT_OUT_OF_MEMORY) return out_of_memory(fn);
  if (st != MOEJIT_OK) return fail(st, fn, "%s", err.c_str());
  auto* h = new (std::nothrow) moejit_linear();
  if (!h) return out_of_memory(fn);
  h->impl = std::move(layer);
  *out = h;
  return MOEJIT_OK;
}

// Runs `body`, turning any escaping exception into a status.
template <class F>
moejit_status guarded(const char* fn, F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return out_of_memory(fn);
  } catch (...) {
    return internal_error(fn);
  }
}

}  // namespace

extern "C" {

uint32_t moejit_abi_version(void) { return MOEJIT_ABI_VERSION; }
const char* moejit_version(void) { return MOEJIT_VERSION_STRING; }
int32_t moejit_max_format_id(void) { return fmt::kMaxFormatId; }
const char* moejit_last_error(void) { return moejit::last_error(); }

const char* moejit_status_name(moejit_status s) {
  switch (s) {
    case MOEJIT_OK: return "ok";
    case MOEJIT_INVALID_ARGUMENT: return "invalid_argument";
    case MOEJIT_UNSUPPORTED: return "unsupported";
    case MOEJIT_OUT_OF_MEMORY: return "out_of_memory";
    case MOEJIT_BUSY: return "busy";
    case MOEJIT_INTERNAL_ERROR: return "internal_error";
  }
  return "unknown";
}

const char* moejit_isa_name(moejit_isa isa) {
  if (isa == MOEJIT_ISA_AUTO) return "auto";
  const moejit::jit::TierInfo* t = moejit::jit::tier_info(moejit::jit::Isa(int32_t(isa)));
  return t ? t->name : "unknown";
}

const char* moejit_format_name(moejit_format f) {
  if (!fmt::known_format(int32_t(f))) return "unknown";
  return fmt::format_name(static_cast<fmt::Format>(f));
}

moejit_isa moejit_host_isa(void) { return host_isa_c(); }

moejit_status moejit_context_create(const moejit_context_desc* desc, moejit_context** out) {
  return guarded("moejit_context_create", [&] { return context_create(desc, out); });
}

void moejit_context_destroy(moejit_context* ctx) {
  if (!ctx) return;
  try {
    ctx->impl->wait();
  } catch (...) {
  }
  delete ctx;  // workers stop when the last object of the context is gone
}

moejit_isa moejit_context_isa(const moejit_context* ctx) {
  return ctx ? static_cast<moejit_isa>(ctx->impl->isa()) : MOEJIT_ISA_AUTO;
}

int32_t moejit_context_num_threads(const moejit_context* ctx) { return ctx ? ctx->impl->num_threads() : 0; }

moejit_status moejit_context_wait(moejit_context* ctx) {
  if (!ctx) return fail(MOEJIT_INVALID_ARGUMENT, "moejit_context_wait", "ctx is NULL");
  return guarded("moejit_context_wait", [&] {
    ctx->impl->wait();
    return MOEJIT_OK;
  });
}

moejit_status moejit_moe_create(moejit_context* ctx, const moejit_moe_desc* desc, moejit_moe** out) {
  return guarded("moejit_moe_create", [&] { return moe_create(ctx, desc, out); });
}

void moejit_moe_destroy(moejit_moe* moe) {
  if (!moe) return;
  delete moe;  // the layer waits for its own task in flight
}

moejit_status moejit_moe_submit(moejit_moe* moe, int32_t num_tokens, const uint16_t* x,
                                const int32_t* topk_ids, const float* topk_weights, void* y) {
  return guarded("moejit_moe_submit", [&] {
    return moe_submit("moejit_moe_submit", moe, num_tokens, x, topk_ids, topk_weights, y, false);
  });
}

moejit_status moejit_moe_forward(moejit_moe* moe, int32_t num_tokens, const uint16_t* x,
                                 const int32_t* topk_ids, const float* topk_weights, void* y) {
  return guarded("moejit_moe_forward", [&] {
    const moejit_status st =
        moe_submit("moejit_moe_forward", moe, num_tokens, x, topk_ids, topk_weights, y, true);
    if (st == MOEJIT_OK && num_tokens > 0) moe->impl->context().wait();
    return st;
  });
}

moejit_status moejit_moe_stats_get(const moejit_moe* moe, moejit_moe_stats* out) {
  const char* fn = "moejit_moe_stats_get";
  if (!moe) return fail(MOEJIT_INVALID_ARGUMENT, fn, "moe is NULL");
  if (!out) return fail(MOEJIT_INVALID_ARGUMENT, fn, "out is NULL");
  if (out->struct_size < sizeof(moejit_moe_stats))
    return fail(MOEJIT_INVALID_ARGUMENT, fn, "out->struct_size = %u is smaller than %zu", out->struct_size,
                sizeof(moejit_moe_stats));
  const uint32_t size = out->struct_size;
  *out = moe->impl->stats();
  out->struct_size = size;
  return MOEJIT_OK;
}

moejit_status moejit_linear_create(moejit_context* ctx, const moejit_linear_desc* desc, moejit_linear** out) {
  return guarded("moejit_linear_create", [&] { return linear_create(ctx, desc, out); });
}

void moejit_linear_destroy(moejit_linear* linear) {
  if (!linear) return;
  delete linear;
}

moejit_status moejit_linear_forward(moejit_linear* linear, int32_t num_tokens, const uint16_t* x, void* y) {
  const char* fn = "moejit_linear_forward";
  return guarded(fn, [&] {
    if (!linear) return fail(MOEJIT_INVALID_ARGUMENT, fn, "linear is NULL");
    const int32_t max_tokens = linear->impl->config().max_tokens;
    if (num_tokens < 0 || num_tokens > max_tokens)
      return fail(MOEJIT_INVALID_ARGUMENT, fn, "num_tokens = %d is out of range [0, max_tokens = %d]",
                  num_tokens, max_tokens);
    if (num_tokens == 0) return MOEJIT_OK;
    if (!x) return fail(MOEJIT_INVALID_ARGUMENT, fn, "x is NULL");
    if (!y) return fail(MOEJIT_INVALID_ARGUMENT, fn, "y is NULL");
    const moejit_status st = linear->impl->submit(num_tokens, x, y, true);
    if (st == MOEJIT_BUSY)
      return fail(st, fn, "the context already has a task in flight (call moejit_context_wait)");
    if (st == MOEJIT_OK) linear->impl->context().wait();
    return st;
  });
}

}  // extern "C"
