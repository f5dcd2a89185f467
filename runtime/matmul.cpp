#include "runtime/matmul.h"

#include <algorithm>
#include <cstring>

#include "jit/cpu.h"
#include "jit/kernel_cache.h"

namespace moejit {

using formats::Format;

void Matmul::init(jit::Isa isa, const formats::Layout& layout, uint32_t flags) {
  isa_ = isa;
  layout_ = layout;
  // ds_fp4 weights are mxfp4 bytes: its dot products are the mxfp4 kernels' (the
  // owning layer applies its activation numerics around them).
  layout_.format = formats::kernel_format(layout.format);
  flags_ = flags;
#if defined(MOEJIT_HAVE_JIT)
  flags_ |= jit::runtime_flags(isa, int32_t(layout_.format), layout_.group);
#endif
  xprep_ = isa == jit::Isa::scalar ? jit::XPrep() : jit::x_prep(isa, int32_t(layout_.format), flags_);
  // mxfp4 groups are 32 and nvfp4 groups 16 whatever the API's group_size says (ignored for them).
  if (layout_.format == Format::mxfp4) layout_.group = 32;
  if (layout_.format == Format::nvfp4) layout_.group = 16;
}

// Kernels of formats whose scale rows cover several weight rows never cross a
// scale row: calls are split at those boundaries.
int64_t Matmul::segment_end(int64_t r, int64_t end) const {
  if (layout_.format != Format::fp8_block) return end;
  return std::min(end, (r / 128 + 1) * 128);
}

void Matmul::plan_rows(int64_t r0, int64_t n) {
  for (int64_t r = r0; r < r0 + n;) {
    const int64_t e = segment_end(r, r0 + n);
    const int64_t len = e - r;
    if (int64_t(seg_needed_.size()) <= len) seg_needed_.resize(size_t(len) + 1, false);
    seg_needed_[size_t(len)] = true;
    max_seg_ = std::max<int>(max_seg_, int(len));
    r = e;
  }
}

moejit_status Matmul::resolve(int max_tokens, std::string* err) {
  if (isa_ == jit::Isa::scalar) {
    max_m_ = 1;
    return MOEJIT_OK;
  }
  // Every kernel of this matrix: its key with rows and tokens per call left to fill.
  jit::KernelKey base;
  base.format = int32_t(layout_.format);
  base.k = int32_t(layout_.k);
  // fp8_block kernels read one scale row per call (the runtime points at it), so
  // its stride is not part of the generated code.
  base.scale_stride = formats::has_block_scales(layout_.format) && layout_.format != Format::fp8_block
                          ? layout_.scale_stride
                          : 0;
  base.scale_dtype = layout_.format == Format::fp8_block ? int32_t(layout_.scale_dtype) : 0;
  base.group = layout_.format == Format::bf16 ? 0 : layout_.group;
  base.isa = isa_;
  base.flags = flags_;
  max_m_ = std::min(max_tokens, jit::max_tokens_per_call(base));
  table_.assign(size_t(max_seg_ + 1) * size_t(max_m_ + 1), nullptr);
  for (int seg = 1; seg <= max_seg_; ++seg) {
    if (!seg_needed_[size_t(seg)]) continue;
    for (int m = 1; m <= max_m_; ++m) {
      jit::KernelKey key = base;
      key.rows = seg;
      key.tokens = m;
      auto k = jit::global_cache().get(key, err);
      if (!k) {
        *err = key.name() + ": " + *err;
        return MOEJIT_UNSUPPORTED;
      }
      table_[size_t(seg) * size_t(max_m_ + 1) + size_t(m)] = k->fn();
      holds_.push_back(std::move(k));
    }
  }
  return MOEJIT_OK;
}

void Matmul::run(const formats::MatrixRef& m, int64_t r0, int64_t n, int tokens, const void* x, float* y,
                 float* scratch, const void* prefetch) const {
  const int64_t xs = x_stride();
  if (isa_ == jit::Isa::scalar) {
    for (int t = 0; t < tokens; ++t)
      formats::gemv_scalar(layout_, m, r0, n, static_cast<const float*>(x) + t * xs, y + int64_t(t) * n);
    return;
  }
  const size_t xbytes = x_elem_bytes();
  const int64_t rb = formats::row_bytes(layout_.format, layout_.k);
  const int64_t sb = formats::scale_elem_bytes(layout_.format, layout_.scale_dtype);
  for (int t0 = 0; t0 < tokens; t0 += max_m_) {
    const int mc = std::min(max_m_, tokens - t0);
    for (int64_t r = r0; r < r0 + n;) {
      const int64_t e = segment_end(r, r0 + n);
      const int64_t len = e - r;
      jit::GemvArgs a;
      a.w = static_cast<const uint8_t*>(m.data) + r * rb;
      a.scales = m.scales ? static_cast<const uint8_t*>(m.scales) +
                                formats::scale_row_of(layout_.format, r) *
                                    (m.scale_stride ? m.scale_stride : layout_.scale_stride) * sb
                          : nullptr;
      a.row_scales = m.row_scales ? m.row_scales + r : nullptr;
      a.x = static_cast<const uint8_t*>(x) + size_t(t0) * size_t(xs) * xbytes;
      a.y = scratch;
      const uint8_t* wseg = static_cast<const uint8_t*>(a.w);
      a.w_prefetch = prefetch ? static_cast<const uint8_t*>(prefetch) + (r - r0) * rb : wseg + kPrefetchBytes;
      table_[size_t(len) * size_t(max_m_ + 1) + size_t(mc)](&a);
      for (int t = 0; t < mc; ++t)
        std::memcpy(y + int64_t(t0 + t) * n + (r - r0), scratch + int64_t(t) * len, size_t(len) * 4);
      r = e;
    }
  }
}

}  // namespace moejit
