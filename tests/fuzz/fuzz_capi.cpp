// Fuzz harness for the public C API: context, MoE and linear descriptors built
// from the fuzz input (valid and invalid fields mixed), create, forward/submit
// calls with valid and invalid arguments, destroy.
//
// MoE descriptors cover the 0.2 fields too: separate gate and up banks, up's and
// down's own formats (mixed formats, ds_fp4 in some projections only), broken
// bank forms, and 0.1 callers whose descriptor is the 80 bytes up to `down`.
//
// The harness keeps its own model of the validation rules of docs/API.md and
// checks every status against it: invalid -> INVALID_ARGUMENT (before
// UNSUPPORTED), a valid MoE descriptor whose experts' scale strides differ
// where kernels bake the stride -> UNSUPPORTED, otherwise OK; on failure *out is NULL, the message starts
// with the function name, and no output byte is written. The library reads exactly what a descriptor
// describes, so whenever the model says the library may read a pointer, it points to memory of exactly that
// size (weights and scales in their own mappings next to an inaccessible page, so generated code that reads
// past them faults; everything else on the heap for ASan). Pointers the library must not read (ignored
// fields, or anything after an invalid field) hold garbage addresses. Sizes are bounded so a run stays small.
//
// Successful calls are checked for determinism: the same layer on a context of
// the same tier with another thread count and dedup setting, and a second call
// through the other entry point (forward vs submit + wait), give the same bits;
// the stats count the calls, routes and each projection's bytes.
#include <sched.h>
#include <strings.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "capi_model.h"
#include "fuzz_util.h"
#include "moejit.h"

namespace {

using namespace fuzz_capi;

// ---------------------------------------------------------------- contexts

moejit_isa g_host = MOEJIT_ISA_SCALAR;
// FUZZ_CAPI_VERBOSE=1: print every descriptor and call (to turn a crashing input into a report).
bool g_verbose = false;
// [tier][variant]: variant 0 = 1 worker, 1 = 2 workers without dedup, 2 = 3 workers.
moejit_context* g_ctx[MOEJIT_ISA_AVX512_AMX + 1][3] = {};

void init() {
  static bool done = false;
  if (done) return;
  done = true;
  unsetenv("MOEJIT_MAX_ISA");
  unsetenv("MOEJIT_DEDUP");
  unsetenv("MOEJIT_DEDUP_DEBUG");
  g_host = moejit_host_isa();
  g_verbose = std::getenv("FUZZ_CAPI_VERBOSE") != nullptr;
  for (int t = MOEJIT_ISA_SCALAR; t <= g_host; ++t)
    for (int v = 0; v < 3; ++v) {
      moejit_context_desc d;
      std::memset(&d, 0, sizeof(d));
      d.struct_size = sizeof(d);
      d.num_threads = v + 1;
      d.max_isa = static_cast<moejit_isa>(t);
      d.flags = v == 1 ? MOEJIT_CONTEXT_NO_DEDUP : 0;
      FUZZ_CHECK(moejit_context_create(&d, &g_ctx[t][v]) == MOEJIT_OK, "context: %s", moejit_last_error());
      FUZZ_CHECK(moejit_context_isa(g_ctx[t][v]) == t, "context tier %d",
                 int(moejit_context_isa(g_ctx[t][v])));
    }
  // NULL handles (docs/API.md "NULL handles").
  FUZZ_CHECK(moejit_context_isa(nullptr) == MOEJIT_ISA_AUTO, "context_isa(NULL)");
  FUZZ_CHECK(moejit_context_num_threads(nullptr) == 0, "context_num_threads(NULL)");
  FUZZ_CHECK(moejit_context_wait(nullptr) == MOEJIT_INVALID_ARGUMENT, "context_wait(NULL)");
  moejit_context_destroy(nullptr);
  moejit_moe_destroy(nullptr);
  moejit_linear_destroy(nullptr);
}

void expect_failure(moejit_status st, moejit_status want, const char* fn) {
  FUZZ_CHECK(st == want, "%s returned %s, the model expects %s; message \"%s\"", fn, moejit_status_name(st),
             moejit_status_name(want), moejit_last_error());
  if (st != MOEJIT_OK) {
    const std::string msg = moejit_last_error();
    const std::string prefix = std::string(fn) + ": ";
    FUZZ_CHECK(msg.compare(0, prefix.size(), prefix) == 0 && msg.size() > prefix.size(),
               "%s: message \"%s\" does not start with \"%s\"", fn, msg.c_str(), prefix.c_str());
  }
}

// ---------------------------------------------------------------- MoE

struct MoeModel {
  moejit_moe_desc d{};
  // [0] gate_up (fused) or gate, [1] up (separate banks), [2] down; experts map onto banks.
  std::vector<Bank> banks[3];
  std::vector<moejit_matrix> mats[3];
  moejit_proj_format up_format{}, down_format{};
  bool invalid = false;
};

void fuzz_moe(Reader& in) {
  const int tier = int(in.range(MOEJIT_ISA_SCALAR, g_host));
  const int variant = int(in.range(0, 2));
  moejit_context* ctx = g_ctx[tier][variant];
  MoeModel mm;
  moejit_moe_desc& d = mm.d;
  std::memset(&d, 0, sizeof(d));
  d.struct_size = sizeof(d);
  bool inv = false;

  // Format fields: the layer's own (gate's), then the 0.2 fields. A 0.1 caller
  // (80-byte descriptor) has none of them; separate banks may give up its own
  // format (with a fused gate_up that is invalid), and either form down's.
  const FormatPick gate = pick_format(in, &inv);
  set_enum(d.format, gate.raw_format);
  set_enum(d.scale_dtype, gate.raw_sdt);
  d.group_size = gate.group_size;
  const bool v1 = in.chance(12);
  const bool separate = !v1 && in.chance(96);
  FormatPick up = gate, down = gate;
  if (!v1 && in.chance(separate ? 128 : 8)) {
    up = pick_format(in, &inv);
    mm.up_format = api_format(up);
    d.up_format = &mm.up_format;
    if (!separate) inv = true;  // one fused matrix has one format
  }
  if (!v1 && in.chance(48)) {
    down = pick_format(in, &inv);
    mm.down_format = api_format(down);
    d.down_format = &mm.down_format;
  }
  // ds_fp4's activation numerics are layer-wide: every projection or none.
  const FormatPick* projs[3] = {&gate, &up, &down};
  int ds = 0;
  for (const FormatPick* p : projs) ds += p->f == MOEJIT_FORMAT_DS_FP4;
  if (ds != 0 && ds != 3) inv = true;

  // Sizes: small and valid for every K rule (H: gate's and up's, I: down's), or invalid by themselves.
  // `wide`: now and then a hidden size of 2048-3072 for super-block formats, so
  // dedup groups of 4+ tokens run the K-chunked kernels (jit/row_body.cpp)
  // against the one-token kernels of the twin without dedup.
  auto pick_k = [&](int32_t unit, bool wide = false) -> int32_t {
    if (wide && unit == 256 && in.chance(16)) return int32_t(256 * in.range(8, 12));
    if (in.chance(8)) {
      inv = true;
      if (unit > 1 && in.flag()) return int32_t(unit * in.range(1, 4) + in.range(1, 15));
      const int32_t bad[] = {0, -1, -128, std::numeric_limits<int32_t>::min()};
      return bad[in.u8() % 4];
    }
    if (unit == 1) return int32_t(in.chance(40) ? in.range(1, 8) : in.range(1, 400));
    return int32_t(unit * in.range(1, 256 / unit > 0 ? 256 / unit + 1 : 1));
  };
  d.hidden = pick_k(std::max(gate.k_unit(), up.k_unit()), true);
  d.intermediate = pick_k(down.k_unit());
  d.num_experts = pick(in, 1, 24, {0, -1, std::numeric_limits<int32_t>::min()}, &inv);
  if (in.chance(6)) {
    d.top_k = in.flag() ? 0 : d.num_experts + int32_t(in.range(1, 4));
    inv = true;
  } else {
    d.top_k = int32_t(in.range(1, d.num_experts > 0 ? (d.num_experts < 8 ? d.num_experts : 8) : 1));
    if (d.num_experts < 1) d.top_k = 1;
  }
  d.max_tokens = pick(in, 1, 8, {0, -1, -100000}, &inv);
  int32_t act = int32_t(in.range(0, 4));
  if (in.chance(8)) act = in.flag() ? 5 : (in.flag() ? -1 : in.i32() | 0x100), inv = true;
  set_enum(d.activation, act);
  switch (in.u8() % 16) {
    case 0: d.swiglu_alpha = NAN, inv = true; break;
    case 1: d.swiglu_alpha = in.flag() ? INFINITY : -INFINITY, inv = true; break;
    case 2:
    case 3: d.swiglu_alpha = float(in.range(-300, 300)) / 64.0f; break;
    default: d.swiglu_alpha = 0; break;
  }
  switch (in.u8() % 16) {
    case 0: d.swiglu_limit = NAN, inv = true; break;
    case 1: d.swiglu_limit = in.flag() ? -INFINITY : -float(in.range(1, 100)) / 8.0f, inv = true; break;
    case 2: d.swiglu_limit = INFINITY; break;
    case 3:
    case 4: d.swiglu_limit = float(in.range(1, 100)) / 8.0f; break;
    default: d.swiglu_limit = 0; break;
  }
  d.gate_up_interleaved = pick(in, 0, 1, {2, -1, 256}, &inv);
  d.router_weight_on_input = pick(in, 0, 1, {2, -1, 0x10001}, &inv);
  int32_t odt = int32_t(in.range(0, 1));
  if (in.chance(8)) odt = in.flag() ? 2 : -1, inv = true;
  set_enum(d.output_dtype, odt);

  if (separate && d.gate_up_interleaved == 1) inv = true;  // rows of one matrix only

  // Weight memory is only sized when every scalar field is valid; otherwise the
  // matrices hold garbage addresses (create only looks at pointer values).
  // The arrays themselves are real whenever they have entries to read.
  const bool shapes_valid = !inv;
  const int32_t E = d.num_experts;
  const int64_t H = d.hidden, I = d.intermediate;
  const int64_t rows[3] = {separate ? I : 2 * I, I, H}, ks[3] = {H, H, I};
  std::vector<int> used = {0, 2};
  if (separate) used = {0, 1, 2};
  // The bank form: a bank left NULL, or a fused gate_up next to a gate or up (or
  // separate banks next to a gate_up): all invalid.
  bool null_bank[3] = {in.chance(4), separate && in.chance(4), in.chance(4)};
  const bool extra = !v1 && in.chance(4);
  for (int p : used)
    if (null_bank[p]) inv = true;
  if (extra) inv = true;
  if (E >= 1) {
    for (int p : used) mm.mats[p].resize(size_t(E));
    if (shapes_valid) {
      const int nb = int(in.range(1, 3));
      const int bad_bank = in.chance(24) ? int(in.range(0, int(used.size()) * nb - 1)) : -1;
      for (int p : used) mm.banks[p].resize(size_t(nb));
      for (int b = 0; b < nb; ++b)
        for (size_t u = 0; u < used.size(); ++u) {
          const int p = used[u];
          make_bank(in, mm.banks[p][size_t(b)], projs[p]->fv(), projs[p]->sdt, projs[p]->group(), rows[p],
                    ks[p], bad_bank == int(u) * nb + b, true);
        }
      // Experts map to banks; an invalid bank only counts if some expert uses it.
      const int shift = int(in.range(0, nb - 1));
      for (int32_t e = 0; e < E; ++e)
        for (int p : used) {
          const Bank& bk = mm.banks[p][size_t((e + shift) % nb)];
          mm.mats[p][size_t(e)] = bk.m;
          if (bk.invalid && !null_bank[p]) inv = true;
        }
    } else {
      for (int p : used)
        for (auto& m : mm.mats[p]) {
          std::memset(&m, 0, sizeof(m));
          m.data = garbage(in);
          m.scales = garbage(in);
        }
    }
  }
  const auto array = [&](int p) {  // no entries to read when E < 1
    return E >= 1 ? mm.mats[p].data() : static_cast<const moejit_matrix*>(garbage(in));
  };
  if (separate) {
    d.gate = null_bank[0] ? nullptr : array(0);
    d.up = null_bank[1] ? nullptr : array(1);
    if (extra) d.gate_up = array(0);
  } else {
    d.gate_up = null_bank[0] ? nullptr : array(0);
    if (extra) (in.flag() ? d.gate : d.up) = array(0);
  }
  d.down = null_bank[2] ? nullptr : array(2);

  bool size_inv = false;
  const SizedDesc<moejit_moe_desc> sd = sized(in, d, &size_inv, kMoeDescV1Size, v1);
  if (size_inv) inv = true;

  if (g_verbose) {
    std::fprintf(
        stderr,
        "moe: tier %s variant %d | format %d scale_dtype %d group_size %d H %d I %d E %d top_k %d "
        "max_tokens %d act %d alpha %g limit %g interleaved %d rwoi %d out %d struct_size %u | 0.2: %s, up "
        "format %d/%d/%d%s, down format %d/%d/%d%s, NULL banks %d%d%d, extra %d | model %s\n",
        moejit_isa_name(moejit_isa(tier)), variant, raw(d.format), raw(d.scale_dtype), d.group_size, d.hidden,
        d.intermediate, d.num_experts, d.top_k, d.max_tokens, raw(d.activation), double(d.swiglu_alpha),
        double(d.swiglu_limit), d.gate_up_interleaved, d.router_weight_on_input, raw(d.output_dtype),
        sd.get()->struct_size, separate ? "separate" : "fused", up.raw_format, up.raw_sdt, up.group_size,
        d.up_format ? "" : " (NULL)", down.raw_format, down.raw_sdt, down.group_size,
        d.down_format ? "" : " (NULL)", null_bank[0], null_bank[1], null_bank[2], extra,
        inv ? "invalid" : "valid");
    static const char* kNames[3] = {"gate_up/gate", "up", "down"};
    for (int p : used)
      for (size_t b = 0; b < mm.banks[p].size(); ++b) {
        const Bank* bk = &mm.banks[p][b];
        std::fprintf(
            stderr,
            "  %s bank %zu: data %zu bytes [%p, %p), scales %zu bytes [%p, %p), stride %lld, bias %d, "
            "row_scales %d%s\n",
            kNames[p], b, bk->data.size(), (const void*)bk->data.data(),
            (const void*)(bk->data.data() + bk->data.size()), bk->scales.size(),
            (const void*)bk->scales.data(), (const void*)(bk->scales.data() + bk->scales.size()),
            (long long)bk->m.scale_row_stride, bk->m.bias != nullptr, bk->m.row_scales != nullptr,
            bk->invalid ? " (invalid)" : "");
      }
  }
  // Rare: NULL out, ctx or desc.
  moejit_moe* out = reinterpret_cast<moejit_moe*>(uintptr_t(0x10));
  const uint8_t nulls = in.u8();
  moejit_status want = inv ? MOEJIT_INVALID_ARGUMENT : MOEJIT_OK;
  moejit_status st;
  if (nulls == 255) {
    st = moejit_moe_create(ctx, sd.get(), nullptr);
    expect_failure(st, MOEJIT_INVALID_ARGUMENT, "moejit_moe_create");
    return;
  } else if (nulls == 254) {
    st = moejit_moe_create(nullptr, sd.get(), &out);
    want = MOEJIT_INVALID_ARGUMENT;
  } else if (nulls == 253) {
    st = moejit_moe_create(ctx, nullptr, &out);
    want = MOEJIT_INVALID_ARGUMENT;
  } else {
    st = moejit_moe_create(ctx, sd.get(), &out);
  }
  bool agree = true;
  for (int p : used) agree = agree && strides_agree(projs[p]->f, projs[p]->group(), ks[p], mm.mats[p]);
  if (want == MOEJIT_OK && st == MOEJIT_UNSUPPORTED && !agree) want = MOEJIT_UNSUPPORTED;
  if (want != MOEJIT_OK) {
    expect_failure(st, want, "moejit_moe_create");
    FUZZ_CHECK(out == nullptr, "moejit_moe_create failed but *out = %p", static_cast<void*>(out));
    return;
  }
  FUZZ_CHECK(st == MOEJIT_OK && out, "moejit_moe_create: %s, model expects ok: %s", moejit_status_name(st),
             moejit_last_error());
  std::unique_ptr<moejit_moe, void (*)(moejit_moe*)> moe(out, moejit_moe_destroy);

  // The same layer on another context of the same tier (other threads and dedup).
  moejit_moe* twin_raw = nullptr;
  FUZZ_CHECK(moejit_moe_create(g_ctx[tier][(variant + 1) % 3], &d, &twin_raw) == MOEJIT_OK, "twin: %s",
             moejit_last_error());
  std::unique_ptr<moejit_moe, void (*)(moejit_moe*)> twin(twin_raw, moejit_moe_destroy);

  const size_t row = size_t(H) * out_bytes(odt);
  uint64_t calls = 0, routes = 0, bytes = 0, expert_bytes = 0;
  for (int p : used) expert_bytes += matrix_bytes(*projs[p], rows[p], ks[p]);
  // Each call streams its distinct experts (with dedup) or each route's (variant 1: without).
  const auto streamed = [&](const CallArgs& c) {
    return (variant == 1 ? c.routes : c.distinct) * expert_bytes;
  };
  for (int call = 0, ncalls = int(in.range(1, 3)); call < ncalls; ++call) {
    CallArgs c = make_call(in, d.max_tokens, d.top_k, E, H);
    if (g_verbose) {
      std::fprintf(stderr, "  call %d: num_tokens %d%s, ids", call, c.T, c.invalid ? " (invalid)" : "");
      for (size_t i = 0; i < c.ids.size() && i < 64; ++i) std::fprintf(stderr, " %d", c.ids[i]);
      std::fprintf(stderr, "\n");
    }
    const int32_t rows = c.T < 0 ? 0 : c.T > d.max_tokens ? d.max_tokens : c.T;
    // y: exactly the rows a call of this size may write, filled with a sentinel.
    std::vector<uint8_t> y(size_t(rows) * row, 0xA5), y2(y.size(), 0xA5), y3(y.size(), 0xA5);
    void* yp = c.y_null ? nullptr : y.empty() ? static_cast<void*>(&c) : y.data();
    const bool use_submit = in.flag();
    if (use_submit) {
      st = moejit_moe_submit(moe.get(), c.T, c.xp, c.idp, c.wp, yp);
      if (st == MOEJIT_OK && c.T > 0) {
        // In flight until wait returns: every other call on the context is BUSY.
        const moejit_status busy = moejit_moe_forward(moe.get(), c.T, c.xp, c.idp, c.wp, y2.data());
        FUZZ_CHECK(busy == MOEJIT_BUSY, "forward while a submit is in flight: %s", moejit_status_name(busy));
        FUZZ_CHECK(moejit_context_wait(ctx) == MOEJIT_OK, "wait: %s", moejit_last_error());
      }
    } else {
      st = moejit_moe_forward(moe.get(), c.T, c.xp, c.idp, c.wp, yp);
    }
    const char* fn = use_submit ? "moejit_moe_submit" : "moejit_moe_forward";
    if (c.invalid) {
      expect_failure(st, MOEJIT_INVALID_ARGUMENT, fn);
      for (size_t i = 0; i < y.size(); ++i) FUZZ_CHECK(y[i] == 0xA5, "%s failed but wrote y byte %zu", fn, i);
      continue;
    }
    FUZZ_CHECK(st == MOEJIT_OK, "%s: %s (%s)", fn, moejit_status_name(st), moejit_last_error());
    for (size_t i = 0; i < y2.size(); ++i) FUZZ_CHECK(y2[i] == 0xA5, "a BUSY call wrote y byte %zu", i);
    if (c.T == 0) {
      for (size_t i = 0; i < y.size(); ++i) FUZZ_CHECK(y[i] == 0xA5, "num_tokens = 0 wrote y");
      continue;
    }
    ++calls;
    routes += c.routes;
    bytes += streamed(c);
    // Determinism: the other entry point, and the twin layer.
    if (use_submit)
      st = moejit_moe_forward(moe.get(), c.T, c.xp, c.idp, c.wp, y2.data());
    else if ((st = moejit_moe_submit(moe.get(), c.T, c.xp, c.idp, c.wp, y2.data())) == MOEJIT_OK)
      st = moejit_context_wait(ctx);
    FUZZ_CHECK(st == MOEJIT_OK, "repeat call: %s", moejit_last_error());
    ++calls;
    routes += c.routes;
    bytes += streamed(c);
    FUZZ_CHECK(moejit_moe_forward(twin.get(), c.T, c.xp, c.idp, c.wp, y3.data()) == MOEJIT_OK,
               "twin call: %s", moejit_last_error());
    size_t where = 0;
    FUZZ_CHECK(same_bits(y, y2, odt, &where), "MoE: a repeated call differs at output %zu", where);
    FUZZ_CHECK(same_bits(y, y3, odt, &where),
               "MoE: tier %s, %d vs %d workers (dedup %d vs %d) differ at output %zu",
               moejit_isa_name(moejit_isa(tier)), variant + 1, (variant + 1) % 3 + 1, variant != 1,
               (variant + 1) % 3 != 1, where);
  }
  moejit_moe_stats s;
  std::memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  FUZZ_CHECK(moejit_moe_stats_get(moe.get(), &s) == MOEJIT_OK, "stats: %s", moejit_last_error());
  FUZZ_CHECK(s.calls == calls && s.routes == routes, "stats: calls %llu routes %llu, want %llu %llu",
             (unsigned long long)s.calls, (unsigned long long)s.routes, (unsigned long long)calls,
             (unsigned long long)routes);
  FUZZ_CHECK(s.weight_bytes_read == bytes, "stats: weight_bytes_read %llu, want %llu (%llu per expert)",
             (unsigned long long)s.weight_bytes_read, (unsigned long long)bytes,
             (unsigned long long)expert_bytes);
  s.struct_size = sizeof(s) - 1;
  FUZZ_CHECK(moejit_moe_stats_get(moe.get(), &s) == MOEJIT_INVALID_ARGUMENT,
             "stats with a short struct_size");
  if (in.flag()) moejit_context_wait(ctx);  // nothing in flight: OK at once
}

// ---------------------------------------------------------------- linear

void fuzz_linear(Reader& in) {
  const int tier = int(in.range(MOEJIT_ISA_SCALAR, g_host));
  const int variant = int(in.range(0, 2));
  moejit_context* ctx = g_ctx[tier][variant];
  moejit_linear_desc d;
  std::memset(&d, 0, sizeof(d));
  d.struct_size = sizeof(d);
  bool inv = false;
  int f = in.chance(200) ? (in.flag() ? MOEJIT_FORMAT_BF16 : MOEJIT_FORMAT_FP8_BLOCK)
                         : int(in.range(0, kFormats - 1));
  if (in.chance(6)) {
    set_enum(d.format, in.flag() ? kFormats : -1);
    inv = true;
    f = -1;
  } else {
    set_enum(d.format, f);
  }
  const int fv = f < 0 ? 0 : f;
  int sdt = 0;
  if (f == MOEJIT_FORMAT_FP8_BLOCK) {
    sdt = in.flag();
    if (in.chance(8))
      set_enum(d.scale_dtype, int32_t(in.range(2, 5))), inv = true;
    else
      set_enum(d.scale_dtype, sdt);
  } else if (in.chance(8)) {
    set_enum(d.scale_dtype, 1), inv = true;
  }
  if (mx8(f)) {
    static const int32_t kOk[] = {0, 32, 64, 128};
    d.group_size = kOk[in.u8() % 4];
    if (in.chance(8)) d.group_size = 48, inv = true;
  } else {
    d.group_size = in.chance(30) ? in.i32() : 0;
  }
  const int group = group_of(fv, d.group_size);
  d.rows = pick(in, 1, 300, {0, -1, std::numeric_limits<int32_t>::min()}, &inv);
  if (in.chance(8)) {
    d.cols = in.flag() ? 0 : -7;
    inv = true;
  } else if (fv == 0 || fv == 5) {
    d.cols = int32_t(in.range(1, 700));
  } else {
    const int32_t g = fv == 1 ? 16 : group;
    d.cols = int32_t(g * in.range(1, 512 / g));
    if (in.chance(8)) d.cols += int32_t(in.range(1, g - 1)), inv = true;
  }
  d.max_tokens = pick(in, 1, 12, {0, -3, (1 << 20) + 1}, &inv);
  int32_t odt = int32_t(in.range(0, 1));
  if (in.chance(8)) odt = 7, inv = true;
  set_enum(d.output_dtype, odt);
  Bank bank;
  if (!inv) {
    make_bank(in, bank, fv, sdt, group, d.rows, d.cols, in.chance(24), true);
    if (bank.invalid) inv = true;
  } else {
    make_bank(in, bank, fv, sdt, group, 1, 1, false, false);
  }
  d.weight = bank.m;
  bool size_inv = false;
  const SizedDesc<moejit_linear_desc> sd = sized(in, d, &size_inv);
  if (size_inv) inv = true;
  if (g_verbose)
    std::fprintf(
        stderr,
        "linear: tier %s variant %d | format %d scale_dtype %d group_size %d rows %d cols %d max_tokens %d "
        "out %d struct_size %u | data %zu bytes, scales %zu bytes, stride %lld, bias %d | model %s\n",
        moejit_isa_name(moejit_isa(tier)), variant, raw(d.format), raw(d.scale_dtype), d.group_size, d.rows,
        d.cols, d.max_tokens, raw(d.output_dtype), sd.get()->struct_size, bank.data.size(),
        bank.scales.size(), (long long)bank.m.scale_row_stride, bank.m.bias != nullptr,
        inv ? "invalid" : "valid");
  moejit_linear* out = reinterpret_cast<moejit_linear*>(uintptr_t(0x10));
  moejit_status want = inv ? MOEJIT_INVALID_ARGUMENT : MOEJIT_OK;
  moejit_status st = moejit_linear_create(ctx, sd.get(), &out);
  if (want != MOEJIT_OK) {
    expect_failure(st, want, "moejit_linear_create");
    FUZZ_CHECK(out == nullptr, "moejit_linear_create failed but *out = %p", static_cast<void*>(out));
    return;
  }
  FUZZ_CHECK(st == MOEJIT_OK && out, "moejit_linear_create: %s, model expects ok: %s", moejit_status_name(st),
             moejit_last_error());
  std::unique_ptr<moejit_linear, void (*)(moejit_linear*)> lin(out, moejit_linear_destroy);
  moejit_linear* twin_raw = nullptr;
  FUZZ_CHECK(moejit_linear_create(g_ctx[tier][(variant + 1) % 3], &d, &twin_raw) == MOEJIT_OK, "twin: %s",
             moejit_last_error());
  std::unique_ptr<moejit_linear, void (*)(moejit_linear*)> twin(twin_raw, moejit_linear_destroy);

  const size_t row = size_t(d.rows) * out_bytes(odt);
  for (int call = 0, ncalls = int(in.range(1, 3)); call < ncalls; ++call) {
    CallArgs c = make_call(in, d.max_tokens, 1, 1, d.cols);
    const int32_t rows = c.T < 0 ? 0 : c.T > d.max_tokens ? d.max_tokens : c.T;
    std::vector<uint8_t> y(size_t(rows) * row, 0xA5), y2(y.size(), 0xA5);
    const bool bad_ptr = c.T > 0 && c.T <= d.max_tokens && (c.xp == nullptr || c.y_null);
    const bool invalid = c.T < 0 || c.T > d.max_tokens || bad_ptr;
    void* yp = c.y_null ? nullptr : y.empty() ? static_cast<void*>(&c) : y.data();
    st = moejit_linear_forward(lin.get(), c.T, c.xp, yp);
    if (invalid) {
      expect_failure(st, MOEJIT_INVALID_ARGUMENT, "moejit_linear_forward");
      for (size_t i = 0; i < y.size(); ++i) FUZZ_CHECK(y[i] == 0xA5, "linear_forward failed but wrote y");
      continue;
    }
    FUZZ_CHECK(st == MOEJIT_OK, "moejit_linear_forward: %s", moejit_last_error());
    if (c.T == 0) continue;
    FUZZ_CHECK(moejit_linear_forward(twin.get(), c.T, c.xp, y2.data()) == MOEJIT_OK, "twin: %s",
               moejit_last_error());
    size_t where = 0;
    FUZZ_CHECK(same_bits(y, y2, odt, &where), "linear: tier %s, %d vs %d workers differ at output %zu",
               moejit_isa_name(moejit_isa(tier)), variant + 1, (variant + 1) % 3 + 1, where);
  }
}

// ---------------------------------------------------------------- context

void fuzz_context(Reader& in) {
  moejit_context_desc d;
  std::memset(&d, 0, sizeof(d));
  d.struct_size = sizeof(d);
  bool inv = false, unsupported = false;
  d.num_threads = pick(
      in, 0, 3, {-1, 1025, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}, &inv);
  cpu_set_t mask;
  CPU_ZERO(&mask);
  FUZZ_CHECK(sched_getaffinity(0, sizeof(mask), &mask) == 0, "sched_getaffinity");
  std::vector<int32_t> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) allowed.push_back(c);
  std::vector<int32_t> ids;
  const int n_ids = in.chance(128) ? int(in.range(1, 4)) : 0;
  for (int i = 0; i < n_ids; ++i) {
    const uint8_t r = in.u8();
    if (r < 230) {
      ids.push_back(allowed[size_t(in.range(0, int64_t(allowed.size()) - 1))]);
    } else {
      const int32_t bad[] = {-1, CPU_SETSIZE, std::numeric_limits<int32_t>::max(), 4095};
      const int32_t v = bad[r % 4];
      ids.push_back(v);
      if (v < 0 || v >= CPU_SETSIZE || !CPU_ISSET(v, &mask)) inv = true;
    }
  }
  d.num_cpu_ids = int32_t(ids.size());
  d.cpu_ids = ids.empty() ? nullptr : ids.data();
  switch (in.u8() % 32) {
    case 0: d.num_cpu_ids = -int32_t(in.range(1, 5)), inv = true; break;
    case 1:
      if (!ids.empty()) d.cpu_ids = nullptr, inv = true;
      break;
    case 2:
      if (ids.empty()) d.cpu_ids = static_cast<const int32_t*>(garbage(in));  // not read: num_cpu_ids = 0
      break;
    default: break;
  }
  int32_t isa = int32_t(in.range(0, 5));
  if (in.chance(8)) isa = in.flag() ? 6 : -1, inv = true;
  set_enum(d.max_isa, isa);
  d.flags = in.chance(200) ? (in.flag() ? MOEJIT_CONTEXT_NO_DEDUP : 0) : in.u32();
  if (d.flags & ~uint32_t(MOEJIT_CONTEXT_NO_DEDUP)) inv = true;

  // MOEJIT_MAX_ISA: unset, empty, a tier in any case, or anything else.
  static const char* kEnv[] = {"scalar", "AVX2", "avx512",     "Avx512_BF16",
                               "",       "avx",  "AVX512_amx", "avx512_bf16 "};
  int env_cap = 0;
  std::string env;
  const uint8_t e = in.u8();
  if (e < 128) {
    unsetenv("MOEJIT_MAX_ISA");
  } else {
    env = e < 250 ? kEnv[e % 8] : std::string(1, char(in.range(1, 127)));
    setenv("MOEJIT_MAX_ISA", env.c_str(), 1);
    const char* names[] = {"scalar", "avx2", "avx512", "avx512_bf16", "avx512_amx"};
    bool known = env.empty();
    for (int i = 0; i < 5; ++i)
      if (strcasecmp(env.c_str(), names[i]) == 0) known = true, env_cap = i + 1;
    if (!known) inv = true;
  }
  if (isa > g_host && isa <= 5) unsupported = true;

  bool size_inv = false;
  const SizedDesc<moejit_context_desc> sd = sized(in, d, &size_inv);
  if (size_inv) inv = true;
  moejit_context* out = reinterpret_cast<moejit_context*>(uintptr_t(0x10));
  const moejit_status want = inv ? MOEJIT_INVALID_ARGUMENT : unsupported ? MOEJIT_UNSUPPORTED : MOEJIT_OK;
  const moejit_status st = moejit_context_create(sd.get(), &out);
  unsetenv("MOEJIT_MAX_ISA");
  if (want != MOEJIT_OK) {
    expect_failure(st, want, "moejit_context_create");
    FUZZ_CHECK(out == nullptr, "context_create failed but *out = %p", static_cast<void*>(out));
    return;
  }
  FUZZ_CHECK(st == MOEJIT_OK && out, "moejit_context_create: %s, model expects ok: %s",
             moejit_status_name(st), moejit_last_error());
  int want_isa = isa == 0 ? g_host : isa;
  if (env_cap && env_cap < want_isa) want_isa = env_cap;
  const int want_threads = d.num_threads       ? d.num_threads
                           : d.num_cpu_ids > 0 ? d.num_cpu_ids
                                               : CPU_COUNT(&mask);
  FUZZ_CHECK(moejit_context_isa(out) == want_isa, "context tier %s, want %s",
             moejit_isa_name(moejit_context_isa(out)), moejit_isa_name(moejit_isa(want_isa)));
  FUZZ_CHECK(moejit_context_num_threads(out) == want_threads, "context threads %d, want %d",
             moejit_context_num_threads(out), want_threads);
  FUZZ_CHECK(moejit_context_wait(out) == MOEJIT_OK, "wait on an idle context");
  moejit_context_destroy(out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  init();
  Reader in(data, size);
  switch (in.u8() % 8) {
    case 0: fuzz_context(in); break;
    case 1:
    case 2: fuzz_linear(in); break;
    default: fuzz_moe(in); break;
  }
  return 0;
}
