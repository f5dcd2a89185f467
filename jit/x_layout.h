// Prepared activations: the order and element type a kernel's decode wants x in,
// and the one code that writes it. Matmul, the tools, the tests and the
// benchmarks all prepare x through XPrep; the decoder of a kernel's format
// chooses its layout (x_prep(), defined with the decoders). No Xbyak here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "jit/kernel_key.h"

namespace moejit::jit {

// Prepared activations are padded with zeros to a multiple of 128 elements so
// full-vector loads past K (up to one 128-element decode chunk) read zeros.
inline int64_t x_stride(int64_t k) { return (k + 127) / 128 * 128; }

// How a kernel wants its activations laid out.
enum class XLayout {
  f32,             // fp32, natural order (avx2, avx512)
  bf16,            // bf16 pairs, natural order (avx512_bf16)
  bf16_perm64,     // bf16; inside each 64-element chunk, elements 16L+0..7 (L = 0..3) come first, then
                   // 16L+8..15: the order in which the byte-table e4m3 decode unpacks weights
  f32_evens_odds,  // fp32; inside each group of 2V elements (V = vector lanes) the even elements
                   // come first, then the odd ones: the order of the low and high e2m1 nibbles
  bf16_nib128,     // bf16; inside each 128-element chunk (64 bytes of e2m1 pairs), element e sits at
                   // 32 (e % 4) + e / 4: vector j of the decode holds nibble j of every 16-bit word
  bf16_q4,         // bf16; inside each 128-element chunk (4 q4_0 blocks), element e of block b (byte
                   // e % 16, high nibble when e >= 16) sits at 32 j + 8 b + (e % 16) / 2 with
                   // j = 2 (e % 2) + e / 16: the 16 quant bytes of block b on 128-bit lane b, decoded as e2m1
  f32_kq6,         // fp32; inside each 256-element q6_K super-block, sub-block j (16 elements) is vector
                   // 4 t + i with t = 2 h + r % 2, i = 2 a + r / 2 (h = j / 8, a = j / 4 % 2, r = j % 4): the
                   // four sub-blocks that share 16 bytes of qh side by side (jit/decode_kquant.cpp)
  f32_kq2,         // fp32; inside each 256-element q2_K / q3_K super-block, sub-block j is vector
                   // 4 t + s with t = 2 h + j % 2, s = j / 2 % 4 (h = j / 8): the four sub-blocks of one
                   // 16-byte chunk of quants side by side (jit/decode_kquant.cpp)
  f32_kq4,         // fp32; inside each 256-element q4_K / q5_K super-block, element i of sub-block s (byte
                   // 32 c + i of the quants, c = s / 2, high nibble when s is odd) sits at
                   // 16 (8 (c / 2) + 2 (i % 4) + s % 2) + 8 (c % 2) + i / 4: vector n of the quants'
                   // 64-byte half h (step 2 h + n / 4) holds nibble n of every dword of it
                   // (jit/decode_kquant.cpp)
  bf16_kq4,        // bf16; inside each 256-element q4_K super-block, element i of sub-block s (byte
                   // 32 c + i of the quants, c = s / 2, high nibble when s is odd) sits at
                   // 32 (4 t + j) + 16 (c % 2) + i / 2 with t = c / 2, j = 2 (i % 2) + s % 2: vector
                   // 4 t + j of the bf16-pair decode holds nibble j of every 16-bit word of the
                   // quants' 64-byte half t (jit/decode_kquant.cpp)
  bf16_kq2,        // bf16; inside each 256-element q2_K / q3_K super-block, element 32 j + 16 s + l
                   // of half h (q from quant byte 32 h + 16 s + l >> 2 j) sits at 128 (j / 2)
                   // + 32 (2 (l % 2) + j % 2) + 16 h + 8 s + l / 2: vector i of step t of the
                   // bf16-pair decode holds crumb 4 (i / 2) + 2 t + i % 2 of every 16-bit word
                   // of the 64 quant bytes (jit/decode_kquant.cpp)
  bf16_kq6,        // bf16; inside each 256-element q6_K super-block, element 32 a + l of half h (q
                   // from ql byte 64 h + l + 32 (a % 2) and qh byte 32 h + l) sits at
                   // 32 (4 h + j) + 16 (a % 2) + l / 2 with j = 2 (l % 2) + a / 2: vector 4 h + j
                   // of the bf16-pair decode holds nibble j of every 16-bit word of half h's ql
                   // bytes (jit/decode_kquant.cpp)
};

inline size_t x_elem_bytes(XLayout l) {
  return l == XLayout::f32 || l == XLayout::f32_evens_odds || l == XLayout::f32_kq6 ||
                 l == XLayout::f32_kq2 || l == XLayout::f32_kq4
             ? 4
             : 2;
}
// Sums of x that a decode's scale rule reads (K-quants: S_x of each sub-block,
// for the term - dmin m[j] S_x). After every `block` elements (a multiple of
// 128) the prepared vector holds one 64-byte vector of the fp32 sums of its
// block / span (at most 16) sub-blocks of `span` elements, each summed in k
// order, zeros above: computed once per token, read by every row. (Tile
// layouts interleave a run's sums per sub-block instead: XPrep, below.)
struct XSums {
  int span = 0;  // 0: no sums
  int block = 0;
};
constexpr int kXSumBytes = 64;

// The prepared-activation layout of one kernel family on its tier, and the
// code that writes it. A prepared vector holds x_stride(k) elements (and the
// sums, where the layout has them) in vector_bytes(k) bytes; the padding must
// be zero (callers zero their buffers once, and a tile layout's writers zero a
// token's positions past K again, where runs of other widths put activations).
class XPrep {
 public:
  XPrep() = default;  // fp32 in natural order: the scalar tier
  // halves: a tile layout for scale groups of 16 (below, "halves"); tile layouts only.
  XPrep(XLayout layout, Isa isa, XSums sums = {}, bool halves = false)
      : layout_(layout), isa_(isa), sums_(sums), halves_(halves && isa == Isa::avx512_amx) {}

  XLayout layout() const { return layout_; }
  const XSums& sums() const { return sums_; }
  bool halves() const { return halves_; }
  bool operator==(const XPrep& o) const {
    return layout_ == o.layout_ && isa_ == o.isa_ && sums_.span == o.sums_.span &&
           sums_.block == o.sums_.block && halves_ == o.halves_;
  }
  size_t elem_bytes() const { return x_elem_bytes(layout_); }
  // Element slot of activation k (the sums take kXSumBytes / elem_bytes() slots after each block).
  int64_t position(int64_t k) const {
    const int64_t p = slot(k);
    return sums_.span ? p + k / sums_.block * (kXSumBytes / int64_t(elem_bytes())) : p;
  }
  // Bytes of n activations from a block boundary, with their sums (n a multiple
  // of the block, or less than one block).
  int64_t bytes(int64_t n) const {
    return n * int64_t(elem_bytes()) + (sums_.span ? n / sums_.block * kXSumBytes : 0);
  }
  // A slot's bytes: a halves layout takes twice a token's bytes (half of each row is zeros).
  int64_t vector_bytes(int64_t k) const { return bytes(x_stride(k)) * (halves_ ? 2 : 1); }
  // Byte offset of the sum of the sub-block holding activation k.
  int64_t sum_offset(int64_t k) const {
    const int64_t b = k / sums_.block;
    return bytes((b + 1) * sums_.block) - kXSumBytes + 4 * (k % sums_.block / sums_.span);
  }

  // One prepared vector from k bf16 activations.
  void prepare(void* vec, const uint16_t* src, int64_t k) const;
  // Activations k0 .. k0 + n - 1 of one prepared vector (values exact in bf16),
  // and the sums of the sub-blocks wholly inside them.
  void store(void* vec, int64_t k0, const float* v, int64_t n) const;

  // ---- buffers of token slots ----
  // A buffer holds the prepared x of several tokens, vector_bytes(k) bytes per
  // slot. A kernel call reads one run: the tokens in slots run .. run + width - 1.
  // Per-token layouts give slot s the vector at s * vector_bytes(k). Tile
  // layouts (avx512_amx) interleave a run's tokens in its width * vector_bytes(k)
  // bytes: chunk c of 32 positions is 64 * width bytes at c * 64 * width, as
  // 16 rows (element pairs) of 4 * width bytes, one dword per token: the B tile
  // of tdpbf16ps for the run, `width` lines of it per chunk. A run of one token
  // is its vector in natural order (but in a halves layout). Sums of x (XSums) take the place of one
  // chunk after each block, as one row of 4 * width bytes per sub-block (a
  // dword per token, in sub-block order, zeros after the last): the run's
  // vector of sums of sub-block j is one masked load at row j. A halves layout
  // (scale groups of 16: nvfp4, q6_K, q2_K, q3_K) doubles each chunk to 16
  // rows of 8 * width bytes: the first 16 elements of the chunk (rows 0-7) put
  // token t's pair in dword t, the last 16 (rows 8-15) in dword width + t, and
  // the other dwords stay zero, so one tdpbf16ps of a whole chunk sums each
  // group of 16 in a column of its own (jit/tile_body.cpp); a chunk of sums
  // keeps rows of 4 * width bytes.
  static constexpr int kTileSlots = 16;  // the most tokens of a run in a tile layout
  struct Slot {
    int64_t run = 0;  // first slot of the run
    int width = 1;    // tokens of the run
    int col = 0;      // this token's place in it
  };
  bool tiled() const { return isa_ == Isa::avx512_amx; }
  // Token i of a group of `count` tokens from slot `first`, whose kernel calls
  // take runs of kTileSlots tokens (the last one shorter) in a tile layout and
  // one token each otherwise (Matmul::run makes its calls so).
  Slot group_slot(int64_t first, int64_t count, int64_t i) const {
    if (!tiled()) return {first + i, 1, 0};
    const int64_t r = i / kTileSlots * kTileSlots;
    return {first + r, int(std::min<int64_t>(kTileSlots, count - r)), int(i - r)};
  }
  // Bytes of a buffer of `slots` slots.
  int64_t buffer_bytes(int64_t k, int64_t slots) const { return slots * vector_bytes(k); }
  // The kernel's x argument for the run from `slot`.
  const void* slot_ptr(const void* buf, int64_t k, int64_t slot) const {
    return static_cast<const uint8_t*>(buf) + slot * vector_bytes(k);
  }
  // prepare() and store() into slot s of a buffer.
  void prepare_slot(void* buf, Slot s, const uint16_t* src, int64_t k) const;
  void store_slot(void* buf, Slot s, int64_t k, int64_t k0, const float* v, int64_t n) const;
  // Slot `from` of buffer `src` to slot `to` of `dst`.
  void copy_slot(void* dst, Slot to, const void* src, Slot from, int64_t k) const;

 private:
  // Where element pair `pair` (of a token's vector) lies in a run of `width`
  // tokens in a tile layout: token 0's dword (token t's is 4 t bytes on) and,
  // in a halves layout, the bytes from it to the token's other dword of the
  // row, which must hold zeros (0 where there is none: chunks of sums).
  struct PairPlace {
    int64_t byte = 0;
    int64_t mirror = 0;
  };
  // `sums`: the pair is in a chunk of sums (sums_chunk), not of activations.
  PairPlace pair_place(int64_t pair, int width, bool sums) const {
    if (!halves_) return {pair * 4 * width, 0};
    const int64_t row = pair & 15, base = (pair >> 4) * 128 * width;
    if (sums) return {base + row * 4 * width, 0};
    return {base + (2 * row + row / 8) * 4 * width, row < 8 ? 4 * width : -4 * width};
  }
  // Whether chunk c of a token's vector holds sums (after each block's chunks).
  bool sums_chunk(int64_t c) const { return sums_.span && c % (sums_.block / 32 + 1) == sums_.block / 32; }
  // Activation k (bf16 bits v) of slot s into its run at `run` (a tile layout).
  void put_tile(uint8_t* run, int64_t k, Slot s, uint16_t v) const;
  void zero_padding(uint8_t* run, Slot s, int64_t k) const;
  // Byte of the sum of the sub-block holding activation k, token `col`, in a tile layout.
  int64_t tile_sum_byte(int64_t k, int width, int col) const {
    const int64_t pair = sum_offset(k) / 4;  // row j of the block's sums is pair row (sums start) + j
    return pair_place(pair, width, true).byte + col * 4;
  }
  // The sums of the sub-blocks wholly inside activations k0 .. k0 + n - 1
  // (each summed in k order), through put(k of the sub-block's first, sum).
  template <typename Put>
  void sum_sub_blocks(int64_t k0, const float* v, int64_t n, Put put) const {
    const int64_t span = sums_.span;
    for (int64_t s = (k0 + span - 1) / span * span; s + span <= k0 + n; s += span) {
      float sum = 0.0f;
      for (int64_t i = s; i < s + span; ++i) sum += v[i - k0];
      put(s, sum);
    }
  }
  // Slot of activation k in the layout's order, sums aside.
  int64_t slot(int64_t k) const {
    switch (layout_) {
      case XLayout::f32_evens_odds: {  // groups of 2V, V the fp32 lanes of the tier
        const int64_t g = isa_ == Isa::avx2 ? 16 : 32, r = k % g;
        return (k - r) + (r % 2 ? g / 2 : 0) + r / 2;
      }
      case XLayout::bf16_perm64: {
        const int64_t r = k & 63, lane = r >> 4, j = r & 15;
        return (k - r) + (j < 8 ? lane * 8 + j : 32 + lane * 8 + (j - 8));
      }
      case XLayout::bf16_nib128: {
        const int64_t r = k & 127;
        return (k - r) + (r % 4) * 32 + r / 4;
      }
      case XLayout::bf16_q4: {
        const int64_t r = k & 127, b = r / 32, e = r % 32;
        return (k - r) + 32 * (2 * (e % 2) + e / 16) + 8 * b + (e % 16) / 2;
      }
      case XLayout::f32_kq6: {
        const int64_t r = k & 255, j = r / 16, h = j / 8, a = j / 4 % 2, q = j % 4;
        return (k - r) + 16 * (4 * (2 * h + q % 2) + 2 * a + q / 2) + r % 16;
      }
      case XLayout::f32_kq2: {
        const int64_t r = k & 255, j = r / 16;
        return (k - r) + 16 * (4 * (2 * (j / 8) + j % 2) + j / 2 % 4) + r % 16;
      }
      case XLayout::bf16_kq2: {
        const int64_t r = k & 255, h = r / 128, j = r % 128 / 32, s = r % 32 / 16, l = r % 16;
        return (k - r) + 128 * (j / 2) + 32 * (2 * (l % 2) + j % 2) + 16 * h + 8 * s + l / 2;
      }
      case XLayout::bf16_kq6: {
        const int64_t r = k & 255, h = r / 128, a = r % 128 / 32, l = r % 32;
        return (k - r) + 32 * (4 * h + 2 * (l % 2) + a / 2) + 16 * (a % 2) + l / 2;
      }
      case XLayout::f32_kq4: {
        const int64_t r = k & 255, s = r / 32, i = r % 32, c = s / 2;
        return (k - r) + 16 * (8 * (c / 2) + 2 * (i % 4) + s % 2) + 8 * (c % 2) + i / 4;
      }
      case XLayout::bf16_kq4: {
        const int64_t r = k & 255, s = r / 32, i = r % 32, c = s / 2;
        return (k - r) + 32 * (4 * (c / 2) + 2 * (i % 2) + s % 2) + 16 * (c % 2) + i / 2;
      }
      default: return k;
    }
  }

  XLayout layout_ = XLayout::f32;
  Isa isa_ = Isa::scalar;
  XSums sums_;
  bool halves_ = false;
};

// The layout of the kernels of `format` on `isa` with KernelKey::flags `flags`:
// the choice of the format's decoder (jit/decoders.cpp). The scalar tier reads
// fp32 in natural order.
XPrep x_prep(Isa isa, formats::Format format, uint32_t flags);
inline XLayout x_layout(Isa isa, formats::Format format, uint32_t flags) {
  return x_prep(isa, format, flags).layout();
}

}  // namespace moejit::jit
