#include "tools/dump_plan.h"

#include <algorithm>

#include "jit/cpu.h"
#include "jit/gemv.h"

namespace moejit::tools {

using formats::Format;

uint32_t runtime_flags(const MatrixSpec& m) {
  const int32_t kf = int32_t(formats::kernel_format(m.format));
  const uint32_t flags =
      jit::runtime_flags(jit::kernel_isa(m.isa), kf, formats::default_group(m.format, m.group_size));
  const bool has_vbmi_decode = jit::needs_vbmi(jit::kernel_isa(m.isa), kf, 0);
  return m.no_vbmi && has_vbmi_decode ? flags | jit::kFlagNoVbmi : flags;
}

jit::KernelKey runtime_key(const MatrixSpec& m, int rows, int tokens) {
  const int32_t group = formats::default_group(m.format, m.group_size);
  jit::KernelKey key;
  key.format = int32_t(formats::kernel_format(m.format));  // ds_fp4 runs the mxfp4 kernels
  key.k = int32_t(m.k);
  key.rows = rows;
  key.tokens = tokens;
  // fp8_block kernels read one scale row per call, so the stride is not in their code.
  if (formats::has_block_scales(m.format) && m.format != Format::fp8_block)
    key.scale_stride = m.scale_stride > 0 ? m.scale_stride : formats::scale_cols(m.format, group, m.k);
  key.scale_dtype = m.format == Format::fp8_block ? int32_t(m.scale_dtype) : 0;
  key.group = m.format == Format::bf16 ? 0 : group;
  key.isa = jit::kernel_isa(m.isa);  // the tier whose kernels the context runs
  key.flags = runtime_flags(m);
  return key;
}

bool layer_valid(const LayerSpec& l, std::string* why) {
  const struct {
    const char* name;
    int32_t v;
  } pos[] = {{"hidden", l.hidden},
             {"intermediate", l.intermediate},
             {"experts", l.experts},
             {"top-k", l.top_k},
             {"max-tokens", l.max_tokens}};
  for (const auto& p : pos)
    if (p.v < 1) {
      *why = std::string(p.name) + " = " + std::to_string(p.v) + " must be >= 1";
      return false;
    }
  if (l.top_k > l.experts) {
    *why = "top-k = " + std::to_string(l.top_k) + " exceeds experts = " + std::to_string(l.experts);
    return false;
  }
  if (int64_t(l.max_tokens) * l.top_k > (int64_t(1) << 24)) {
    *why = "max-tokens times top-k is too large";
    return false;
  }
  const int32_t group = formats::default_group(l.format, l.group_size);
  const char* w = "";
  if (!formats::k_is_valid(l.format, group, l.hidden, &w)) {
    *why = "hidden = " + std::to_string(l.hidden) + " " + w;
    return false;
  }
  if (!formats::k_is_valid(l.format, group, l.intermediate, &w)) {
    *why = "intermediate = " + std::to_string(l.intermediate) + " " + w;
    return false;
  }
  return true;
}

namespace {

// Matmul::plan_rows + resolve for one matrix: segment lengths needed, then
// keys for every (length, tokens) pair.
struct MatrixPlan {
  MatrixSpec spec;
  std::vector<bool> seg_needed;

  void plan_rows(int64_t r0, int64_t n) {
    for (int64_t r = r0; r < r0 + n;) {
      // fp8_block calls never cross a 128-row scale block.
      const int64_t e = spec.format == Format::fp8_block ? std::min(r0 + n, (r / 128 + 1) * 128) : r0 + n;
      const size_t len = size_t(e - r);
      if (seg_needed.size() <= len) seg_needed.resize(len + 1, false);
      seg_needed[len] = true;
      r = e;
    }
  }

  void keys(int max_tokens, std::vector<jit::KernelKey>* out) const {
    const int max_m = std::min(max_tokens, jit::max_tokens_per_call(runtime_key(spec, 1, 1)));
    for (size_t seg = 1; seg < seg_needed.size(); ++seg) {
      if (!seg_needed[seg]) continue;
      for (int m = 1; m <= max_m; ++m) {
        const jit::KernelKey k = runtime_key(spec, int(seg), m);
        if (std::find(out->begin(), out->end(), k) == out->end()) out->push_back(k);
      }
    }
  }
};

}  // namespace

RowBlocks layer_row_blocks(const LayerSpec& l) {
  // MoeLayer: rb1_ = 32 (ds_fp4: one 128-block of g); rb2_ = 64, halved down to
  // 16 while pass 2 has fewer than 4 items per worker.
  RowBlocks rb{l.format == formats::Format::ds_fp4 ? formats::kDsActBlock : 32, 64};
  const int64_t min_items = 4 * int64_t(std::max(1, l.threads));
  while (rb.down > 16 && (l.hidden + rb.down - 1) / rb.down < min_items) rb.down /= 2;
  return rb;
}

std::vector<jit::KernelKey> layer_keys(const LayerSpec& l) {
  std::vector<jit::KernelKey> keys;
  if (l.isa == jit::Isa::scalar) return keys;
  const RowBlocks rb = layer_row_blocks(l);
  const int64_t H = l.hidden, I = l.intermediate;
  MatrixPlan gu, dn;
  gu.spec = {l.format, l.scale_dtype, l.group_size, H, 0, l.isa, l.no_vbmi};
  dn.spec = {l.format, l.scale_dtype, l.group_size, I, 0, l.isa, l.no_vbmi};
  for (int64_t j0 = 0; j0 < I; j0 += rb.gate_up) {
    const int64_t n = std::min(rb.gate_up, I - j0);
    if (l.interleaved) {
      gu.plan_rows(2 * j0, 2 * n);
    } else {
      gu.plan_rows(j0, n);
      gu.plan_rows(I + j0, n);
    }
  }
  for (int64_t h0 = 0; h0 < H; h0 += rb.down) dn.plan_rows(h0, std::min(rb.down, H - h0));
  const int group_max = l.dedup ? l.max_tokens * l.top_k : 1;
  gu.keys(group_max, &keys);
  dn.keys(group_max, &keys);
  return keys;
}

}  // namespace moejit::tools
