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
#include "runtime/capi_check.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/linear.h"
#include "runtime/moe.h"

#ifndef MOEJIT_VERSION_STRING
#define MOEJIT_VERSION_STRING "0.0.0"
#endif

using moejit::fail;
using namespace moejit::capi;
namespace fmt = moejit::formats;

namespace {

constexpr int kMaxThreads = 1024;

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

// MOEJIT_TILES: unset or empty, each format's choice of kernels on
// avx512_amx (jit::kernel_isa); "all", tile kernels for every format.
bool parse_tiles_env(bool* all, moejit_status* st, const char* fn) {
  const char* v = std::getenv("MOEJIT_TILES");
  *all = false;
  if (!v || !*v) return true;
  if (std::strcmp(v, "all") == 0) {
    *all = true;
    return true;
  }
  *st =
      fail(MOEJIT_INVALID_ARGUMENT, fn, "environment MOEJIT_TILES = \"%.64s\" is not \"all\" (or empty)", v);
  return false;
}

moejit_isa host_isa_c() { return static_cast<moejit_isa>(moejit::jit::host_isa()); }

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
  bool all_tiles;
  if (!parse_tiles_env(&all_tiles, &st, fn)) return st;
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
                                              dedup, dedup_debug, all_tiles);
  if (!h->impl->ok()) return fail(MOEJIT_OUT_OF_MEMORY, fn, "could not start %d worker threads", threads);
  *out = h.release();
  return MOEJIT_OK;
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
