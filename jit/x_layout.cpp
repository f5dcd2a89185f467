#include "jit/x_layout.h"

#include <algorithm>
#include <cstring>

#include "formats/formats.h"

namespace moejit::jit {

namespace {

// k bf16 activations widened to fp32 in pieces of 256, each passed to
// put(k0, values, n): how a layout with sums prepares x through its store.
template <typename Put>
void widened_pieces(const uint16_t* src, int64_t k, Put put) {
  float piece[256];
  for (int64_t k0 = 0; k0 < k; k0 += 256) {
    const int64_t n = std::min<int64_t>(256, k - k0);
    for (int64_t i = 0; i < n; ++i) piece[i] = formats::bf16_to_f32(src[k0 + i]);
    put(k0, piece, n);
  }
}

}  // namespace

void XPrep::prepare(void* vec, const uint16_t* src, int64_t k) const {
  if (sums_.span)  // through store, which also sums
    return widened_pieces(src, k, [&](int64_t k0, const float* v, int64_t n) { store(vec, k0, v, n); });
  switch (layout_) {
    case XLayout::f32:
      for (int64_t i = 0; i < k; ++i) static_cast<float*>(vec)[i] = formats::bf16_to_f32(src[i]);
      return;
    case XLayout::bf16: std::memcpy(vec, src, size_t(k) * 2); return;
    case XLayout::f32_evens_odds:
    case XLayout::f32_kq6:
    case XLayout::f32_kq2:
    case XLayout::f32_kq4:
      for (int64_t i = 0; i < k; ++i) static_cast<float*>(vec)[position(i)] = formats::bf16_to_f32(src[i]);
      return;
    case XLayout::bf16_perm64:
    case XLayout::bf16_nib128:
    case XLayout::bf16_q4:
    case XLayout::bf16_kq4:
    case XLayout::bf16_kq6:
    case XLayout::bf16_kq2:
      for (int64_t i = 0; i < k; ++i) static_cast<uint16_t*>(vec)[position(i)] = src[i];
      return;
  }
}

void XPrep::store(void* vec, int64_t k0, const float* v, int64_t n) const {
  if (sums_.span) {
    sum_sub_blocks(k0, v, n, [&](int64_t s, float sum) {
      std::memcpy(static_cast<uint8_t*>(vec) + sum_offset(s), &sum, 4);
    });
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
    case XLayout::f32_kq4:
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(vec)[position(k0 + i)] = v[i];
      return;
    case XLayout::bf16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(vec)[k0 + i] = formats::f32_to_bf16(v[i]);
      return;
    case XLayout::bf16_perm64:
    case XLayout::bf16_nib128:
    case XLayout::bf16_q4:
    case XLayout::bf16_kq4:
    case XLayout::bf16_kq6:
    case XLayout::bf16_kq2:
      for (int64_t i = 0; i < n; ++i)
        static_cast<uint16_t*>(vec)[position(k0 + i)] = formats::f32_to_bf16(v[i]);
      return;
  }
}

// ---- buffers of token slots ----

namespace {
uint8_t* run_base(void* buf, int64_t run, int64_t vb) { return static_cast<uint8_t*>(buf) + run * vb; }
}  // namespace

void XPrep::prepare_slot(void* buf, Slot s, const uint16_t* src, int64_t k) const {
  const int64_t vb = vector_bytes(k);
  if (!tiled()) return prepare(run_base(buf, s.run + s.col, vb), src, k);
  if (sums_.span)  // through store_slot, which also sums
    return widened_pieces(src, k,
                          [&](int64_t k0, const float* v, int64_t n) { store_slot(buf, s, k, k0, v, n); });
  uint8_t* b = run_base(buf, s.run, vb);
  for (int64_t i = 0; i < k; ++i) put_tile(b, i, s, src[i]);
  zero_padding(b, s, k);
}

// A token's positions past K, zeroed: in a tile layout a run of another width
// may have left activations there (a 0 weight times an inf is a NaN).
void XPrep::zero_padding(uint8_t* run, Slot s, int64_t k) const {
  for (int64_t i = k; i < x_stride(k); ++i) put_tile(run, i, s, 0);
}

void XPrep::put_tile(uint8_t* run, int64_t k, Slot s, uint16_t v) const {
  const int64_t p = position(k);
  const PairPlace at = pair_place(p >> 1, s.width, false);
  uint8_t* dword = run + at.byte + 4 * s.col;
  std::memcpy(dword + (p & 1) * 2, &v, 2);
  if (at.mirror != 0) std::memset(dword + at.mirror, 0, 4);  // the token's other dword of the row
}

void XPrep::store_slot(void* buf, Slot s, int64_t k, int64_t k0, const float* v, int64_t n) const {
  const int64_t vb = vector_bytes(k);
  if (!tiled()) return store(run_base(buf, s.run + s.col, vb), k0, v, n);
  uint8_t* b = run_base(buf, s.run, vb);
  for (int64_t i = 0; i < n; ++i) put_tile(b, k0 + i, s, formats::f32_to_bf16(v[i]));
  if (k0 + n == k) zero_padding(b, s, k);
  if (sums_.span)
    sum_sub_blocks(k0, v, n,
                   [&](int64_t j, float sum) { std::memcpy(b + tile_sum_byte(j, s.width, s.col), &sum, 4); });
}

void XPrep::copy_slot(void* dst, Slot to, const void* src, Slot from, int64_t k) const {
  const int64_t vb = vector_bytes(k);
  const auto* sb = static_cast<const uint8_t*>(src);
  if (!tiled()) {
    std::memcpy(run_base(dst, to.run + to.col, vb), sb + (from.run + from.col) * vb, size_t(vb));
    return;
  }
  // One dword (an element pair) of each run per pair of a token's vector.
  uint8_t* d = run_base(dst, to.run, vb) + 4 * to.col;
  const uint8_t* s = sb + from.run * vb + 4 * from.col;
  const int64_t pairs = bytes(x_stride(k)) / 4;
  if (!halves_) {
    for (int64_t pair = 0; pair < pairs; ++pair)
      std::memcpy(d + pair * 4 * to.width, s + pair * 4 * from.width, 4);
    return;
  }
  // A chunk at a time: rows of 8 width bytes, the token's dword of rows 8-15
  // 4 width on (the other dword zeroed); a chunk of sums, rows of 4 width.
  // pair_place's rows written out: through pair_place per pair this copy took
  // 1.5-1.8x as long (K = 7168, 2026-12-06), and dedup copies every route's x.
  const int64_t tw = 4 * int64_t(to.width), fw = 4 * int64_t(from.width);
  const uint32_t zero = 0;
  for (int64_t c = 0; c < pairs / 16; ++c) {
    uint8_t* dc = d + c * 32 * tw;
    const uint8_t* sc = s + c * 32 * fw;
    if (sums_chunk(c)) {
      for (int64_t r = 0; r < 16; ++r) std::memcpy(dc + r * tw, sc + r * fw, 4);
      continue;
    }
    for (int64_t r = 0; r < 16; ++r) {
      const int64_t h = r / 8;
      uint8_t* at = dc + (2 * r + h) * tw;
      std::memcpy(at, sc + (2 * r + h) * fw, 4);
      std::memcpy(at + (h ? -tw : tw), &zero, 4);  // the token's other dword of the row
    }
  }
}

}  // namespace moejit::jit
