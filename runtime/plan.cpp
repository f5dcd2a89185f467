#include "runtime/plan.h"

#include <algorithm>

#include "jit/gemv.h"

namespace moejit::plan {

using formats::Format;

jit::KernelKey MatrixPlan::key(int32_t rows, int32_t tokens) const {
  jit::KernelKey k;
  k.format = layout.format;
  k.k = int32_t(layout.k);
  k.rows = rows;
  k.tokens = tokens;
  const formats::FormatInfo& fi = formats::info(layout.format);
  // Only formats with one scale row per weight row bake the stride; fp8_block
  // kernels read one scale row per call (the runtime points at it).
  k.scale_stride = fi.stride_in_kernel ? layout.scale_stride : 0;
  k.scale_dtype = fi.scale_code == formats::ScaleCode::bf16_f32 ? int32_t(layout.scale_dtype) : 0;
  k.group = fi.scales == formats::ScaleKind::none ? 0 : layout.group;
  k.isa = isa;
  k.flags = flags;
  return k;
}

std::vector<jit::KernelKey> MatrixPlan::keys() const {
  std::vector<jit::KernelKey> out;
  if (isa == jit::Isa::scalar) return out;
  for (int32_t rows : call_rows)
    for (int32_t m = 1; m <= tokens_per_call; ++m) out.push_back(key(rows, m));
  return out;
}

int64_t MatrixPlan::matrix_bytes() const {
  const formats::Layout& l = layout;
  int64_t b = l.rows * formats::row_bytes(l.format, l.k);
  b += formats::scale_rows(l.format, l.rows) * formats::scale_cols(l.format, l.group, l.k) *
       formats::scale_elem_bytes(l.format, l.scale_dtype);
  if (formats::has_row_scales(l.format)) b += l.rows * 4;
  return b;
}

bool MatrixPlan::far_prefetch() const { return jit::prefetches_far(layout.format, flags); }

MatrixPlan matrix_plan(const Target& t, const ProjFormat& f, int64_t rows, int64_t k, int64_t scale_stride) {
  MatrixPlan m;
  formats::Layout& l = m.layout;
  // ds_fp4 weights are mxfp4 bytes: its dot products are the mxfp4 kernels' (the
  // owning layer applies its activation numerics around them).
  l.format = formats::kernel_format(f.format);
  l.scale_dtype = f.scale_dtype;
  l.group = formats::default_group(f.format, f.group_size);
  l.rows = rows;
  l.k = k;
  l.scale_stride = scale_stride > 0 ? scale_stride : formats::scale_cols(f.format, l.group, k);
  // The tier of the kernels: the context's, or the vector tier it runs for
  // formats it does not run its own kernels for (avx512_amx: jit::kernel_isa).
  m.isa = jit::kernel_isa(t.isa, l.format, l.group, t.no_vbmi ? jit::kFlagNoVbmi : 0, t.all_tiles);
  // kFlagNoVbmi where the CPU lacks AVX512_VBMI, or where asked to.
  m.flags = jit::runtime_flags(m.isa, l.format, l.group, t.cpu ? *t.cpu : jit::host_features());
  if (t.no_vbmi && jit::needs_vbmi(m.isa, l.format, 0)) m.flags |= jit::kFlagNoVbmi;
  if (t.tile_emu && m.isa == jit::Isa::avx512_amx) m.flags |= jit::kFlagTileEmu;
  return m;
}

void add_rows(MatrixPlan* m, int64_t r0, int64_t n) {
  for (int64_t r = r0; r < r0 + n;) {
    const int64_t e = call_end(m->layout, r, r0 + n);
    const auto len = int32_t(e - r);
    const auto at = std::lower_bound(m->call_rows.begin(), m->call_rows.end(), len);
    if (at == m->call_rows.end() || *at != len) m->call_rows.insert(at, len);
    r = e;
  }
}

void set_tokens(MatrixPlan* m, int32_t max_tokens) {
  m->tokens_per_call = 1;
  // At least 1: a format without kernels on the tier then fails to generate
  // them with the reason, instead of leaving the table empty.
  if (m->isa != jit::Isa::scalar)
    m->tokens_per_call = std::max(1, std::min(max_tokens, jit::max_tokens_per_call(m->key(1, 1))));
}

// ---------------------------------------------------------------- MoE

int64_t MoePlan::expert_bytes() const {
  int64_t b = 0;
  for (int p : {kGate, kUp, kDown})
    if (has(p)) b += mats[p].matrix_bytes();
  return b;
}

std::vector<jit::KernelKey> MoePlan::keys() const {
  std::vector<jit::KernelKey> out;
  for (int p : {kGate, kUp, kDown}) {
    if (!has(p)) continue;
    for (const jit::KernelKey& k : mats[p].keys())
      if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  }
  return out;
}

MoePlan moe_plan(const MoeShape& s, const Target& t) {
  MoePlan p;
  p.gate_up = s.gate_up;
  p.hidden = s.hidden;
  p.intermediate = s.intermediate;
  const int64_t H = s.hidden, I = s.intermediate;
  // ds_fp4 round-trips g per 128 elements of I: each pass-1 item owns one such block.
  p.ds = formats::info(s.gate.format).ds_numerics;
  p.rows1 = p.ds ? formats::kDsActBlock : 32;
  // Long contiguous reads per call (64 rows of H measured ~10% faster than 16
  // for bf16 with one thread), but pass 2 keeps >= 4 items per worker.
  p.rows2 = 64;
  const int64_t min_items = 4 * int64_t(std::max(1, t.threads));
  while (p.rows2 > 16 && (H + p.rows2 - 1) / p.rows2 < min_items) p.rows2 /= 2;
  p.blocks1 = (I + p.rows1 - 1) / p.rows1;
  p.blocks2 = (H + p.rows2 - 1) / p.rows2;

  p.mats[kGate] = matrix_plan(t, s.gate, s.gate_up == GateUp::separate ? I : 2 * I, H, s.gate_stride);
  if (p.has(kUp)) p.mats[kUp] = matrix_plan(t, s.up, I, H, s.up_stride);
  p.mats[kDown] = matrix_plan(t, s.down, H, I, s.down_stride);
  for (int64_t j = 0; j < p.blocks1; ++j)
    for (int c = 0; c < p.calls1(); ++c) {
      const Call call = p.call1(j, c);
      add_rows(&p.mats[call.proj], call.r0, call.rows);
    }
  for (int64_t b = 0; b < p.blocks2; ++b)
    add_rows(&p.mats[kDown], b * p.rows2, std::min(p.rows2, H - b * p.rows2));
  // Dedup groups hold up to max_tokens * top_k routes; kernels cover up to the
  // register budget of tokens per call and are tiled beyond it.
  p.group_max = t.dedup ? s.max_tokens * s.top_k : 1;
  for (int m : {kGate, kUp, kDown})
    if (p.has(m)) set_tokens(&p.mats[m], p.group_max);
  return p;
}

// ---------------------------------------------------------------- dense linear

LinearPlan linear_plan(const ProjFormat& f, int32_t rows, int32_t cols, int32_t max_tokens,
                       int64_t scale_stride, const Target& t) {
  LinearPlan p;
  // Enough row blocks to keep every worker busy on small matrices.
  const int64_t min_items = 4 * int64_t(std::max(1, t.threads));
  p.rows_per_item = rows >= 32 * min_items ? 32 : 16;
  p.items = (int64_t(rows) + p.rows_per_item - 1) / p.rows_per_item;  // rows may be INT32_MAX
  p.weight = matrix_plan(t, f, rows, cols, scale_stride);
  for (int64_t b = 0; b < p.items; ++b) {
    const int64_t r0 = b * p.rows_per_item;
    add_rows(&p.weight, r0, std::min<int64_t>(p.rows_per_item, rows - r0));
  }
  set_tokens(&p.weight, max_tokens);
  return p;
}

}  // namespace moejit::plan
