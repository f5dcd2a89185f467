#include "jit/x_layout.h"

#include <algorithm>
#include <cstring>

#include "formats/formats.h"

namespace moejit::jit {

void XPrep::prepare(void* vec, const uint16_t* src, int64_t k) const {
  if (sums_.span) {  // through store, which also sums
    float chunk[256];
    for (int64_t k0 = 0; k0 < k; k0 += 256) {
      const int64_t n = std::min<int64_t>(256, k - k0);
      for (int64_t i = 0; i < n; ++i) chunk[i] = formats::bf16_to_f32(src[k0 + i]);
      store(vec, k0, chunk, n);
    }
    return;
  }
  switch (layout_) {
    case XLayout::f32:
      for (int64_t i = 0; i < k; ++i) static_cast<float*>(vec)[i] = formats::bf16_to_f32(src[i]);
      return;
    case XLayout::bf16: std::memcpy(vec, src, size_t(k) * 2); return;
    case XLayout::f32_evens_odds:
    case XLayout::f32_kq6:
    case XLayout::f32_kq2:
      for (int64_t i = 0; i < k; ++i) static_cast<float*>(vec)[position(i)] = formats::bf16_to_f32(src[i]);
      return;
    case XLayout::bf16_perm64:
    case XLayout::bf16_nib128:
    case XLayout::bf16_q4:
      for (int64_t i = 0; i < k; ++i) static_cast<uint16_t*>(vec)[position(i)] = src[i];
      return;
  }
}

void XPrep::store(void* vec, int64_t k0, const float* v, int64_t n) const {
  if (sums_.span) {
    const int64_t span = sums_.span;
    for (int64_t s = (k0 + span - 1) / span * span; s + span <= k0 + n; s += span) {
      float sum = 0.0f;
      for (int64_t i = s; i < s + span; ++i) sum += v[i - k0];
      std::memcpy(static_cast<uint8_t*>(vec) + sum_offset(s), &sum, 4);
    }
    for (int64_t i = 0; i < n; ++i) {
      if (elem_bytes() == 4)
        static_cast<float*>(vec)[position(k0 + i)] = v[i];
      else
        static_cast<uint16_t*>(vec)[position(k0 + i)] = formats::f32_to_bf16(v[i]);
    }
    return;
  }
  switch (layout_) {
    case XLayout::f32:
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(vec)[k0 + i] = v[i];
      return;
    case XLayout::f32_evens_odds:
    case XLayout::f32_kq6:
    case XLayout::f32_kq2:
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(vec)[position(k0 + i)] = v[i];
      return;
    case XLayout::bf16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(vec)[k0 + i] = formats::f32_to_bf16(v[i]);
      return;
    case XLayout::bf16_perm64:
    case XLayout::bf16_nib128:
    case XLayout::bf16_q4:
      for (int64_t i = 0; i < n; ++i)
        static_cast<uint16_t*>(vec)[position(k0 + i)] = formats::f32_to_bf16(v[i]);
      return;
  }
}

}  // namespace moejit::jit
