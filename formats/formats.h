// Element decoders, the per-format rules derived from the format table
// (formats/format_table.h) and the scalar reference (the `scalar` tier).
// Portable C++: no intrinsics, no Xbyak, builds on any architecture.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats/format_table.h"

namespace moejit::formats {

const char* format_name(Format f);
// The format whose format_name() is `name` (exact match); false if none.
bool format_from_name(const char* name, Format* out);
// The format whose kernels compute this format's dot products: ds_fp4 runs the
// mxfp4 kernels (same bytes; its extra activation numerics live in runtime/).
Format kernel_format(Format f);

// ---- element decoders (formats.md "Element encodings") ----
// The bf16 conversions are inline: the layers' epilogues call them per element.
inline float bf16_to_f32(uint16_t v) {
  const uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, NaN stays NaN (quiet, sign kept).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }  // f32 -> bf16 -> f32
float fp16_to_f32(uint16_t h);
float e4m3_to_f32(uint8_t b);  // 0x7F/0xFF decode to +-480
float e5m2_to_f32(uint8_t b);
float e2m1_to_f32(uint8_t code);  // low 4 bits used
float e8m0_to_f32(uint8_t s);     // 255 -> NaN

// ---- element encoders ----
// fp32 -> e4m3 (fn) code, round to nearest even, exact for every input
// (subnormals included). Finite values beyond 448 and +-inf saturate to +-448
// (0x7E / 0xFE); NaN gives 0x7F / 0xFF, which e4m3_to_f32 reads as +-480, so
// callers that must keep NaN handle it themselves.
uint8_t f32_to_e4m3_rne(float f);
// e4m3_to_f32(f32_to_e4m3_rne(f)) for any f but NaN, without the code: the e4m3
// value nearest to f (ties to even, +-448 beyond). Exact operations and selects
// only, so the result never depends on MXCSR (rounding mode, FTZ, DAZ) and the
// hot loop of ds_act_roundtrip has no data-dependent branch.
float e4m3_round(float f);

// ---- ds_fp4 activation numerics (formats.md "ds_fp4 extra numerics") ----
constexpr int64_t kDsActBlock = 128;
// Each block of 128 bf16 values (the last one may be shorter) is round-tripped
// through e4m3 with s = 2^ceil(log2(max(amax, 1e-4) / 448)):
// dst = bf16(e4m3_rne(clamp(src / s, +-448)) * s). Every step but the e4m3
// rounding is exact. A block holding a NaN or an infinity has a NaN or infinite
// amax and s, and becomes all NaN. dst may be src.
void ds_act_roundtrip(const uint16_t* src, int64_t n, uint16_t* dst);
// The power-of-two scale s of a block whose largest magnitude is amax (finite, >= 0).
float ds_act_scale(float amax);

// ---- layout of one [rows, K] matrix ----
struct Layout {
  Format format = Format::bf16;
  ScaleDtype scale_dtype = ScaleDtype::bf16;
  int32_t group = 32;  // elements per scale (mx*: 32/64/128, nvfp4 16, fp8_block 128)
  int64_t rows = 0;
  int64_t k = 0;
  int64_t scale_stride = 0;  // scale elements between scale rows (already resolved, never 0 when scaled)
};

// K rule of a format (returns false and a reason when K is not allowed).
bool k_is_valid(Format f, int32_t group, int64_t k, const char** why);
bool has_block_scales(Format f);  // scales pointer used
bool has_row_scales(Format f);    // nvfp4 global
int32_t default_group(Format f, int32_t group_size);
int64_t row_bytes(Format f, int64_t k);                  // weight bytes of one row
int64_t scale_cols(Format f, int32_t group, int64_t k);  // scale elements per scale row
int64_t scale_rows(Format f, int64_t rows);              // number of scale rows
int64_t scale_elem_bytes(Format f, ScaleDtype dt);       // bytes per scale element
int64_t scale_row_of(Format f, int64_t row);             // which scale row a weight row uses

// One matrix as the engine holds it.
struct MatrixRef {
  const void* data = nullptr;
  const void* scales = nullptr;
  const float* row_scales = nullptr;
  int64_t scale_stride = 0;  // this matrix's scale row stride; 0 = Layout::scale_stride
};

// Exact dequantized weight w(r, k) (as double: every format's value is exact).
double weight(const Layout& l, const MatrixRef& m, int64_t r, int64_t k);

// The scalar tier: y[i] = dot(row r0+i, x) in fp32 for `n` rows. x is fp32
// (already widened from bf16). Per scale block the exact products are summed in
// fp32 and the block sum is scaled and added, like the generated kernels.
void gemv_scalar(const Layout& l, const MatrixRef& m, int64_t r0, int64_t n, const float* x, float* y);

}  // namespace moejit::formats
