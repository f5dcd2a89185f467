#include "jit/x_layout.h"

#include <cstring>

#include "formats/formats.h"

namespace moejit::jit {

void XPrep::prepare(void* vec, const uint16_t* src, int64_t k) const {
  switch (layout_) {
    case XLayout::f32:
      for (int64_t i = 0; i < k; ++i) static_cast<float*>(vec)[i] = formats::bf16_to_f32(src[i]);
      return;
    case XLayout::bf16: std::memcpy(vec, src, size_t(k) * 2); return;
    case XLayout::f32_evens_odds:
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
  switch (layout_) {
    case XLayout::f32:
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(vec)[k0 + i] = v[i];
      return;
    case XLayout::f32_evens_odds:
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
