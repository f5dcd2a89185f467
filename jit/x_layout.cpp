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

// ---- buffers of token slots ----

int64_t XPrep::buffer_bytes(int64_t k, int64_t slots) const {
  if (!tiled()) return slots * vector_bytes(k);
  return (slots + kTileSlots - 1) / kTileSlots * kTileSlots * vector_bytes(k);
}

const void* XPrep::slot_ptr(const void* buf, int64_t k, int64_t slot) const {
  const auto* b = static_cast<const uint8_t*>(buf);
  if (!tiled()) return b + slot * vector_bytes(k);
  return b + slot / kTileSlots * kTileSlots * vector_bytes(k) + slot % kTileSlots * 4;
}

void XPrep::prepare_slot(void* buf, int64_t slot, const uint16_t* src, int64_t k) const {
  if (!tiled()) return prepare(static_cast<uint8_t*>(buf) + slot * vector_bytes(k), src, k);
  auto* b = static_cast<uint8_t*>(buf) + slot / kTileSlots * kTileSlots * vector_bytes(k);
  for (int64_t i = 0; i < k; ++i) std::memcpy(b + tile_byte(i, slot % kTileSlots), &src[i], 2);
}

void XPrep::store_slot(void* buf, int64_t slot, int64_t k, int64_t k0, const float* v, int64_t n) const {
  if (!tiled()) return store(static_cast<uint8_t*>(buf) + slot * vector_bytes(k), k0, v, n);
  auto* b = static_cast<uint8_t*>(buf) + slot / kTileSlots * kTileSlots * vector_bytes(k);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = formats::f32_to_bf16(v[i]);
    std::memcpy(b + tile_byte(k0 + i, slot % kTileSlots), &h, 2);
  }
}

void XPrep::copy_slot(void* dst, int64_t dslot, const void* src, int64_t sslot, int64_t k) const {
  const int64_t vb = vector_bytes(k);
  if (!tiled()) {
    std::memcpy(static_cast<uint8_t*>(dst) + dslot * vb, static_cast<const uint8_t*>(src) + sslot * vb,
                size_t(vb));
    return;
  }
  // One dword (an element pair) per 64-byte row of each block.
  auto* d = static_cast<uint8_t*>(dst) + dslot / kTileSlots * kTileSlots * vb + dslot % kTileSlots * 4;
  const auto* s =
      static_cast<const uint8_t*>(src) + sslot / kTileSlots * kTileSlots * vb + sslot % kTileSlots * 4;
  for (int64_t row = 0; row < vb / 4; ++row) std::memcpy(d + row * 64, s + row * 64, 4);
}

int64_t XPrep::run_slot(int64_t next, int64_t count) const {
  if (!tiled() || count <= 0) return next;
  const int64_t at = next % kTileSlots;
  const auto blocks = [](int64_t n) { return (n + kTileSlots - 1) / kTileSlots; };
  return blocks(at + count) > blocks(count) ? next - at + kTileSlots : next;
}

}  // namespace moejit::jit
