// GGUF K-quants (formats.md ids 9..13): traits, scalar decoders, the scalar
// reference GEMV and fp32 quantizers computed as ggml's reference quantizers.
// Portable C++ like formats.h: no intrinsics, no JIT. The formats are rows
// 9..13 of the format table (formats/format_table.h), which holds their sizes,
// names, sub-blocks and mins; formats.h's weight, gemv_scalar and quantize
// dispatch here.
//
// Layouts (byte-exact as ggml's block_q*_K; fp16 values little-endian). Every
// format stores K / 256 super-blocks per row, back to back, at any alignment.
//
//   q4_K 144 B: d @0, dmin @2, scales[12] @4, qs[128] @16.           8 sub-blocks of 32.
//   q5_K 176 B: d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48. 8 sub-blocks of 32.
//   q6_K 210 B: ql[128] @0, qh[64] @128, scales[16] (int8) @192, d @208. 16 sub-blocks of 16.
//   q2_K  84 B: scales[16] @0, qs[64] @16, d @80, dmin @82.          16 sub-blocks of 16.
//   q3_K 110 B: hmask[32] @0, qs[64] @32, scales[12] @96, d @108.      16 sub-blocks of 16.
//
// Element i (0..255) of a super-block is in sub-block i / 16 or i / 32. Its quant:
//   q4_K  qs[32 (i/64) + i%32], low nibble if i%64 < 32 else high nibble (0..15).
//   q5_K  the q4_K nibble of qs, plus bit i/32 of qh[i%32] as bit 4 (0..31).
//   q6_K  low 4 bits: ql[64 (i/128) + i%64], low nibble if i%128 < 64 else high;
//         high 2 bits: bits 2 ((i%128)/32) of qh[32 (i/128) + i%32]; q = that - 32 (-32..31).
//   q2_K  bits 2 ((i%128)/32) of qs[32 (i/128) + i%32] (0..3).
//   q3_K  the q2_K bits of qs, minus 4 when bit i/32 of hmask[i%32] is clear (-4..3).
// Sub-block scale sc[j] and min m[j]:
//   q4_K, q5_K (6 bits each, s = scales): j < 4: sc = s[j] & 63, m = s[j+4] & 63;
//         j >= 4: sc = s[j+4] & 15 | (s[j-4] >> 6) << 4, m = s[j+4] >> 4 | (s[j] >> 6) << 4.
//   q6_K  sc = int8(scales[j]); no min.
//   q2_K  sc = scales[j] & 15, m = scales[j] >> 4.
//   q3_K  6 bits: low 4 = (j < 8 ? s[j] : s[j-8] >> 4) & 15, high 2 = (s[8 + j%4] >> 2 (j/4)) & 3;
//         sc = that - 32 (-32..31); no min.
// Weight: w = (d * sc[j]) * q - (dmin * m[j]) with mins, (d * sc[j]) * q without.
// d * sc and dmin * m are exact in fp32 (<= 18 significant bits, never below
// 2^-24), (d * sc) * q is exact too (<= 23 bits), so w is one fp32 rounding away
// from exact, and exact in double (<= 51 bits between the two terms). inf and NaN in d / dmin propagate as
// IEEE arithmetic does (inf * 0 = NaN).
#pragma once

#include <cstdint>

#include "formats/format_table.h"
#include "formats/quantize.h"

namespace moejit::formats {

enum class KQuant : int32_t { q4_K = 9, q5_K = 10, q6_K = 11, q2_K = 12, q3_K = 13 };
constexpr int32_t kMinKQuantId = 9, kMaxKQuantId = 13;
constexpr int64_t kKQuantSuperBlock = 256;  // elements per super-block (ggml's QK_K)

// The facts of a K-quant's format-table row.
struct KQuantTraits {
  const char* name;        // "q4_K", ...
  int32_t block_bytes;     // bytes per super-block: 144, 176, 210, 84, 110
  int32_t sub_blocks;      // per super-block: 8 or 16
  int32_t sub_block_size;  // elements per sub-block: 32 or 16
  bool has_mins;           // q4_K, q5_K, q2_K
};

inline Format kquant_format(KQuant f) { return Format(int32_t(f)); }
// Read from the format table (f must be a K-quant; q4_K's row otherwise).
KQuantTraits kquant_traits(KQuant f);
const char* kquant_name(KQuant f);
bool kquant_from_id(int32_t id, KQuant* out);          // false unless 9..13
bool kquant_from_name(const char* name, KQuant* out);  // exact match of kquant_name
bool kquant_k_is_valid(int64_t k, const char** why);   // K >= 256 and K % 256 == 0
int64_t kquant_row_bytes(KQuant f, int64_t k);         // K / 256 * block_bytes
int64_t kquant_sub_sums_len(KQuant f, int64_t k);      // K / sub_block_size

// ---- one super-block `blk` (block_bytes bytes, any alignment) ----
// Byte offsets of d and dmin in a super-block (dmin: -1 for q6_K and q3_K).
int kquant_d_offset(KQuant f);
int kquant_dmin_offset(KQuant f);
float kquant_d(KQuant f, const uint8_t* blk);
float kquant_dmin(KQuant f, const uint8_t* blk);  // +0.0 for the formats without mins
struct KQuantSub {
  int32_t sc;  // the factor of d: q4_K/q5_K 0..63, q2_K 0..15, q6_K -128..127, q3_K -32..31
  int32_t m;   // the factor of dmin: q4_K/q5_K 0..63, q2_K 0..15, 0 without mins
};
KQuantSub kquant_sub(KQuant f, const uint8_t* blk, int j);  // j < sub_blocks
int32_t kquant_q(KQuant f, const uint8_t* blk, int i);      // the factor of d * sc (ranges above), i < 256

// Exact w(k) of a row (row points at its first super-block), and the row as fp32
// (each value is w rounded once, as ggml's dequantize_row_q*_K and gguf-py give it).
double kquant_weight(KQuant f, const void* row, int64_t k);
// w(r, k) of a [rows, K] matrix whose rows lie kquant_row_bytes(f, K) apart from data.
double kquant_weight(KQuant f, const void* data, int64_t K, int64_t r, int64_t k);
void kquant_dequantize_row(KQuant f, const void* row, int64_t k, float* out);

// ---- scalar reference GEMV (formats.md "K-quants (W*A16)") ----
// x holds K fp32 values (bf16 activations widened, so every q * x is exact).
//
// kquant_sub_sums: the per-token sums S_x[s] = sum of x[s*B .. s*B + B) for every
// sub-block s of K (B = sub_block_size; kquant_sub_sums_len values), each an fp32
// sum from +0.0 in ascending k: S_x = ((+0 + x0) + x1) + ... Computed once per
// token and shared by every row (and every expert) of that K.
//
// kquant_gemv: y[r] for `rows` rows, row r at data + r * kquant_row_bytes (no
// alignment needed). Per row, exactly this sequence of fp32 operations, each
// rounded to nearest even (FMA = one rounding):
//   acc = +0.0
//   for each super-block b = 0 .. K/256 - 1, for each sub-block j = 0 .. sub_blocks - 1
//   (s = b * sub_blocks + j, elements k = s*B .. s*B + B - 1 ascending):
//     S_q = +0.0; for each k: S_q = S_q + q[k] * x[k]   (q[k] * x[k] exact)
//     D = d_b * sc[j]                                    (exact)
//     acc = fma(D, S_q, acc)
//     with mins: M = dmin_b * m[j] (exact); acc = fma(-M, S_x[s], acc)
//   y[r] = acc
// with q, sc, m the factors of kquant_q / kquant_sub (q6_K: q - 32; q3_K: q in
// -4..3 and sc - 32). sx is read only for the formats with mins; where it is
// null (and in the overload without it) each S_x[s] is summed as
// kquant_sub_sums does, per row, so both give the same bits. Nothing allocates:
// the scalar tier calls it on the layers' worker threads.
void kquant_sub_sums(KQuant f, const float* x, int64_t k, float* sx);
void kquant_gemv(KQuant f, const void* data, int64_t k, int64_t rows, const float* x, const float* sx,
                 float* y);
void kquant_gemv(KQuant f, const void* data, int64_t k, int64_t rows, const float* x, float* y);

// ---- quantizers ----
// fp32 -> each format as ggml's quantize_row_q*_K_ref computes it (the same
// search for sub-block scales and mins, the same fp32 operations in the same
// order, fp16 stores rounded to nearest even), so the bytes equal ggml's for the
// same finite input. Built with -ffp-contract=off. Non-finite inputs give
// defined (deterministic, UB-free) bytes but are not promised to match ggml.
// Writes rows * kquant_row_bytes(f, k) bytes; nothing on failure.
QuantResult kquant_quantize(KQuant f, int64_t rows, int64_t k, const float* w, void* out);

}  // namespace moejit::formats
