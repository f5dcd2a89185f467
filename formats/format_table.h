// The format table: every fact about a weight format in one row (formats.md).
// Every other folder reads these rows instead of comparing format ids; adding
// a format is one row here plus its scalar decoder, quantizer, JIT decoder and
// tests (docs/ARCHITECTURE.md, "Adding a format").
#pragma once

#include <cstdint>

namespace moejit::formats {

// The API's format ids (moejit_format).
enum class Format : int32_t {
  bf16 = 0,
  nvfp4 = 1,
  mxfp4 = 2,
  ds_fp4 = 3,
  q4_0 = 4,
  fp8_block = 5,
  q8_0 = 6,
  mxfp8_e4m3 = 7,
  mxfp8_e5m2 = 8,
  q4_K = 9,  // GGUF K-quants (formats/kquants.h has their layouts)
  q5_K = 10,
  q6_K = 11,
  q2_K = 12,
  q3_K = 13,
};
constexpr int32_t kMaxFormatId = 13;

enum class ScaleDtype : int32_t { bf16 = 0, f32 = 1 };

// The encoding of one weight element.
enum class Element : uint8_t {
  bf16,
  e4m3,
  e5m2,
  e2m1,    // 4-bit float, two per byte (low nibble first)
  q4_0,    // GGUF: 4-bit q - 8, byte j holds elements j and j + 16 of a block
  int8,    // GGUF q8_0
  kquant,  // GGUF K-quants: 2- to 6-bit quants of 256-element super-blocks (formats/kquants.h)
};

// Where a format's scales live.
enum class ScaleKind : uint8_t {
  none,          // bf16
  inline_fp16,   // GGUF blocks: an fp16 d at the start of each block of the row
  row_groups,    // a [rows, S >= K / group] tensor: one scale per group of each row
  tile_128,      // a [ceil(rows / 128), S >= ceil(K / 128)] tensor: one scale per 128 x 128 tile
  inline_super,  // GGUF K-quants: each 256-element super-block of the row holds an fp16 d (and dmin)
                 // and packed scales (and mins) of its sub-blocks
};

// The encoding of a scale element in a scale tensor.
enum class ScaleCode : uint8_t {
  none,      // no scale tensor (bf16; GGUF d are part of the weight bytes)
  e8m0,      // 1 byte, 2^(s - 127), 255 = NaN
  e4m3,      // 1 byte
  bf16_f32,  // the descriptor's scale_dtype: bf16 (2 bytes) or fp32 (4 bytes)
};

struct FormatInfo {
  Format id;
  const char* name;       // formats.md and moejit_format_name()
  Format kernel;          // the format whose kernels compute its dot products (ds_fp4 -> mxfp4)
  Element element;        //
  int32_t block_elems;    // weights per encoded block of a row
  int32_t block_bytes;    // bytes of that block (d included for GGUF)
  ScaleKind scales;       //
  ScaleCode scale_code;   //
  int32_t group;          // weights per scale along K (the default where the descriptor picks)
  uint32_t api_groups;    // group sizes the descriptor's group_size may pick (bit n: 2^n); 0 = fixed
  bool any_k;             // K rule: any K >= 1 (else K % group == 0)
  const char* k_rule;     // the K rule, as error messages state it
  bool row_globals;       // an fp32 per-row global (moejit_matrix.row_scales) multiplies every row
  bool stride_in_kernel;  // kernels bake the scale row stride (one scale row per weight row)
  bool ds_numerics;       // DeepSeek activation numerics around the kernels (formats.md)
  int32_t sub_block;      // inline_super: elements per sub-block (its own scale, and min); 0 otherwise
  bool has_mins;          // inline_super: w = d sc q - dmin m (else d sc q)
};

// The row of a known id (0..kMaxFormatId); known_format() first for raw ids.
const FormatInfo& info(Format f);
inline bool known_format(int32_t id) { return id >= 0 && id <= kMaxFormatId; }
inline bool is_kquant(Format f) { return info(f).scales == ScaleKind::inline_super; }
// Whether a descriptor's group_size g (non-zero) is one this format lets it pick.
inline bool api_group_allowed(const FormatInfo& fi, int32_t g) {
  return g > 0 && (g & (g - 1)) == 0 && ((fi.api_groups >> __builtin_ctz(uint32_t(g))) & 1u);
}

}  // namespace moejit::formats
