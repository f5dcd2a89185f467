#include "runtime/matmul.h"

#include <algorithm>
#include <cstring>

#include "jit/cpu.h"
#include "jit/kernel_cache.h"

namespace moejit {

moejit_status Matmul::init(const plan::MatrixPlan& p, std::string* err) {
  isa_ = p.isa;
  layout_ = p.layout;
  flags_ = p.flags;
  xprep_ = isa_ == jit::Isa::scalar ? jit::XPrep() : jit::x_prep(isa_, layout_.format, flags_);
  max_seg_ = p.max_call_rows();
  max_m_ = p.tokens_per_call;
  if (isa_ == jit::Isa::scalar) return MOEJIT_OK;
  table_.assign(size_t(max_seg_ + 1) * size_t(max_m_ + 1), nullptr);
  for (int32_t seg : p.call_rows) {
    for (int m = 1; m <= max_m_; ++m) {
      const jit::KernelKey key = p.key(seg, m);
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

void Matmul::run(const formats::MatrixRef& m, int64_t r0, int64_t n, int tokens, const void* x, int64_t slot0,
                 float* y, float* scratch, const void* prefetch) const {
  if (isa_ == jit::Isa::scalar) {
    for (int t = 0; t < tokens; ++t)
      formats::gemv_scalar(layout_, m, r0, n,
                           static_cast<const float*>(xprep_.slot_ptr(x, layout_.k, slot0 + t)),
                           y + int64_t(t) * n);
    return;
  }
  const int64_t rb = formats::row_bytes(layout_.format, layout_.k);
  const int64_t sb = formats::scale_elem_bytes(layout_.format, layout_.scale_dtype);
  for (int t0 = 0, mc = 0; t0 < tokens; t0 += mc) {
    // A tile layout's call takes one run of the group (XPrep::group_slot):
    // kTileSlots tokens, fewer at the end. Tile kernels take 16 tokens, or all
    // of the layer's (max_m_ >= mc).
    const int64_t slot = slot0 + t0;
    mc = xprep_.tiled() ? xprep_.group_slot(slot0, tokens, t0).width : std::min(max_m_, tokens - t0);
    for (int64_t r = r0; r < r0 + n;) {
      const int64_t e = plan::call_end(layout_, r, r0 + n);
      const int64_t len = e - r;
      jit::GemvArgs a;
      a.w = static_cast<const uint8_t*>(m.data) + r * rb;
      a.scales = m.scales ? static_cast<const uint8_t*>(m.scales) +
                                formats::scale_row_of(layout_.format, r) *
                                    (m.scale_stride ? m.scale_stride : layout_.scale_stride) * sb
                          : nullptr;
      if (formats::is_kquant(layout_.format)) a.scales = a.w;  // the super-blocks hold the scales
      a.row_scales = m.row_scales ? m.row_scales + r : nullptr;
      a.x = xprep_.slot_ptr(x, layout_.k, slot);
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
