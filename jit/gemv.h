// The GEMV kernel family: y[m][r] = dot(W row r, x[m]) in fp32 for `rows`
// consecutive rows and `tokens` activation vectors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jit/kernel_key.h"

namespace moejit::jit {

// Argument struct of every GEMV kernel (read by offset in the generator).
struct GemvArgs {
  const void* w;            // weight bytes of the first row
  const void* scales;       // scale row used by the first row (formats with block scales)
  const float* row_scales;  // nvfp4 per-row globals of the first row
  const void* x;            // prepared activations, `tokens` vectors of x_stride(k) elements
  float* y;                 // y[m * rows + r]
  const void* w_prefetch;   // first row of a later call: while this call reads w + d, the kernel
                            // prefetches w_prefetch + d, so DRAM runs ahead across calls
};
static_assert(offsetof(GemvArgs, w) == 0 && offsetof(GemvArgs, scales) == 8 &&
                  offsetof(GemvArgs, row_scales) == 16 && offsetof(GemvArgs, x) == 24 &&
                  offsetof(GemvArgs, y) == 32 && offsetof(GemvArgs, w_prefetch) == 40,
              "GemvArgs layout is read by generated code");

using GemvFn = void (*)(const GemvArgs*);

// KernelKey::flags bits.
// avx512_bf16: decode without AVX512_VBMI (CPUs without it): 8-bit floats
// through arithmetic and a blend instead of byte tables, q4_0 chunks through
// four loads instead of a two-register byte permute. Other formats ignore it.
constexpr uint32_t kFlagNoVbmi = 1;

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
};
// 4-bit formats on avx512_bf16 decode to bf16 pairs (shifts and vpermw, AVX512BW).
inline bool is_e2m1_format(int32_t format) {
  return format == 1 /* nvfp4 */ || format == 2 /* mxfp4 */ || format == 3 /* ds_fp4 */;
}
inline XLayout x_layout(Isa isa, int32_t format, uint32_t flags) {
  const bool bf16_tables = isa == Isa::avx512_bf16 && !(flags & kFlagNoVbmi);
  if (is_e2m1_format(format)) return isa == Isa::avx512_bf16 ? XLayout::bf16_nib128 : XLayout::f32_evens_odds;
  if (format == 4 /* q4_0 */) return isa == Isa::avx512_bf16 ? XLayout::bf16_q4 : XLayout::f32;
  if (isa != Isa::avx512_bf16) return XLayout::f32;
  const bool eight_bit = format == 5 /* fp8_block */ || format == 7 /* mxfp8_e4m3 */ ||
                         format == 8 /* e5m2 */ || format == 6 /* q8_0 */;
  if (eight_bit && bf16_tables) return XLayout::bf16_perm64;
  if (format == 8) return XLayout::f32;  // e5m2 without VBMI: fp16 widening, fp32 FMA
  if (format == 6) return XLayout::f32;  // q8_0 without VBMI: int8 quants widened to fp32
  return XLayout::bf16;
}
// Whether a kernel's decode uses AVX512_VBMI: the vpermi2b byte tables of
// 8-bit formats, and the vpermt2b that gathers a q4_0 chunk's quants.
inline bool needs_vbmi(Isa isa, int32_t format, uint32_t flags) {
  return isa == Isa::avx512_bf16 && !(flags & kFlagNoVbmi) &&
         (x_layout(isa, format, flags) == XLayout::bf16_perm64 || format == 4 /* q4_0 */);
}
inline size_t x_elem_bytes(XLayout l) { return l == XLayout::f32 || l == XLayout::f32_evens_odds ? 4 : 2; }
// Vector lanes of fp32 activations on a tier (the evens/odds group is twice this).
inline int64_t f32_lanes(Isa isa) { return isa == Isa::avx2 ? 8 : 16; }
inline int64_t nib128_position(int64_t n) { return (n % 4) * 32 + n / 4; }
inline int64_t x_position(XLayout l, int64_t k, Isa isa = Isa::avx512) {
  switch (l) {
    case XLayout::f32_evens_odds: {
      const int64_t g = 2 * f32_lanes(isa), r = k % g;
      return (k - r) + (r % 2 ? g / 2 : 0) + r / 2;
    }
    case XLayout::bf16_perm64: {
      const int64_t r = k & 63, lane = r >> 4, j = r & 15;
      return (k - r) + (j < 8 ? lane * 8 + j : 32 + lane * 8 + (j - 8));
    }
    case XLayout::bf16_nib128: return (k & ~int64_t(127)) + nib128_position(k & 127);
    case XLayout::bf16_q4: {
      const int64_t r = k & 127, b = r / 32, e = r % 32;
      return (k - r) + 32 * (2 * (e % 2) + e / 16) + 8 * b + (e % 16) / 2;
    }
    default: return k;
  }
}

// Whether kernels of this format prefetch the weights of a call far ahead
// (w_prefetch = a call ~kPrefetchBytes later, one prefetch per line) or the
// next call (bf16: every line of it with several tokens, one line per KiB with
// one token, where the hardware prefetchers do the rest).
inline bool streams_with_prefetch(int32_t format) { return format != 0 /* bf16 */; }

// Each prefetch of a later call's line comes with a second one, of the line
// kNearPrefetchBytes ahead of the cursor in this call's own stream (also into
// L2): the later-call prefetches alone leave demand misses. Measured on Zen 4,
// Qwen3-30B-A3B layer, cold experts, kernels built both ways alternating in one
// process (PERFORMANCE.md, session 6): fp8_block with one thread 82-85% of the
// read bandwidth without it, 84-89% with it 4 KiB ahead; two threads 87-88% ->
// 90-93%; q8_0 with two threads +3-5 points. The near prefetch alone reads
// 66%; 2 KiB ahead is no better than none, 16 KiB worse, 4-8 KiB alike (6 KiB
// 0-2 points above 4 with one thread). Past a matrix's last row it is a hint
// that never faults.
inline constexpr int kNearPrefetchBytes = 6144;

// Flags the runtime uses for a kernel of this tier and format on this CPU
// (kFlagNoVbmi where the byte tables cannot be used).
uint32_t runtime_flags(Isa isa, int32_t format, int32_t group);

// Largest tokens-per-call a generated kernel holds in registers: for the
// kernel `key` describes (its tokens ignored), and the smallest over the groups
// and flags a format may use on a tier.
int max_tokens_per_call(const KernelKey& key);
int max_tokens_per_call(Isa isa, int32_t format);

// Generated code. Owns its executable memory (read+exec, never writable).
class Kernel {
 public:
  virtual ~Kernel() = default;
  const KernelKey& key() const { return key_; }
  GemvFn fn() const { return fn_; }
  const uint8_t* code() const { return reinterpret_cast<const uint8_t*>(fn_); }
  size_t code_size() const { return size_; }
  // Named regions of the code (prologue, decode, fma, block-scale, tail, epilogue, data).
  const std::vector<std::pair<size_t, std::string>>& phases() const { return phases_; }

 protected:
  KernelKey key_{};
  GemvFn fn_ = nullptr;
  size_t size_ = 0;
  std::vector<std::pair<size_t, std::string>> phases_;
};

// Checks that this build can generate `key` (format, ISA, sizes); sets *why if not.
bool gemv_supported(const KernelKey& key, std::string* why);
// Generates a kernel (no cache). nullptr and *err on failure.
std::shared_ptr<const Kernel> generate_gemv(const KernelKey& key, std::string* err);

}  // namespace moejit::jit
