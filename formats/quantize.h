// fp32 -> every weight format of formats.md, byte-exact. Portable scalar C++
// (no intrinsics), like formats.h. Used by tests and tools to build weight
// banks from real-valued matrices; the library itself never quantizes.
//
// Rules (docs/FORMATS.md "Quantizers" has the derivations and error bounds):
//  - Element encoders round to nearest, ties to even (RNE), from the exact value
//    (quotients by a block scale are formed in double, which is exact enough that
//    the element rounding sees the true quotient: no double rounding).
//  - Block amax is taken over the finite elements of the block only.
//  - Non-finite inputs never cause undefined behaviour. A NaN element is encoded
//    as NaN where the element type has NaN (bf16, e5m2) and as zero otherwise; an
//    infinite element is encoded as infinity where the element type has it (bf16,
//    e5m2) and as the largest-magnitude code of its sign otherwise.
//  - Scale padding (columns >= scale_cols of a strided scale tensor) is never
//    written.
#pragma once

#include <cstdint>

#include "formats/formats.h"

namespace moejit::formats {

// ---- element encoders (RNE) ----
uint16_t f32_to_fp16(float f);  // IEEE half: overflow -> +-inf, NaN -> quiet NaN (sign kept)
// e4m3 (fn): saturating, |f| beyond the RNE range of 448 (and +-inf) -> +-448
// (0x7E/0xFE); NaN -> 0x7F|sign, the OCP NaN code (which formats.md decodes as
// +-480: the matrix quantizers never emit it).
uint8_t f32_to_e4m3(float f);
// e5m2: IEEE-like, overflow -> +-inf (0x7C); with `saturate`, finite overflow ->
// +-57344 (0x7B) while +-inf stays inf (OCP MX conversion). NaN -> 0x7E|sign.
uint8_t f32_to_e5m2(float f, bool saturate = false);
// e2m1: saturating to +-6 (also +-inf); NaN -> +0. Returns the 4-bit code.
uint8_t f32_to_e2m1(float f);
// The same encoders from a double (no intermediate rounding to fp32).
uint8_t f64_to_e4m3(double v);
uint8_t f64_to_e5m2(double v, bool saturate);
uint8_t f64_to_e2m1(double v);

// OCP MX shared scale of a block with finite amax >= 0: e8m0 code
// clamp(floor(log2(amax)) - emax_elem + 127, 0, 254); amax == 0 gives 0
// (2^-127). emax_elem: 8 (e4m3), 15 (e5m2), 2 (e2m1).
uint8_t e8m0_mx_scale(float amax, int emax_elem);
constexpr int kEmaxE4m3 = 8, kEmaxE5m2 = 15, kEmaxE2m1 = 2;

// nvfp4 per-row global scale from a row's (or tensor's) finite amax:
// g = amax / (6 * 448) in fp32, raised to 2^-126 (FLT_MIN) when smaller (zero
// rows included), so that every block scale amax_b / (6 g) fits e4m3.
float nvfp4_global(float amax);

// ---- matrices ----

// Destination of one [rows, K] matrix in Layout l.
struct MatrixOut {
  void* data = nullptr;         // rows * row_bytes(format, K) bytes
  void* scales = nullptr;       // scale_rows x scale_stride elements (block-scaled formats)
  float* row_scales = nullptr;  // nvfp4: rows floats
};

struct QuantOptions {
  // nvfp4: one global from the whole matrix's amax, repeated in every row (the
  // ModelOpt per-tensor weight_scale_2) instead of one per row.
  bool nvfp4_tensor_global = false;
};

struct QuantResult {
  bool ok = false;
  const char* error = nullptr;  // when !ok (nothing was written)
  int64_t nonfinite = 0;        // NaN / inf inputs seen (encoded per the rules above)
};

// Quantizes the dense row-major fp32 matrix w [l.rows, l.k] into l's layout.
// l.group must be the format's group (nvfp4 16; mxfp4, ds_fp4, q4_0, q8_0 32;
// fp8_block 128; mxfp8 32, 64 or 128; ignored for bf16). l.scale_stride 0 means
// dense; l.scale_dtype selects bf16 or fp32 fp8_block scales.
QuantResult quantize(const Layout& l, const float* w, const MatrixOut& out, const QuantOptions& opt = {});

}  // namespace moejit::formats
