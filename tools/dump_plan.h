// The kernel keys the runtime builds, computed without building a layer: one
// projection call (runtime/matmul.cpp) or every kernel of a MoE layer
// (runtime/moe.cpp). Used by moejit-dump and checked against the runtime by
// tests/test_tools.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "jit/kernel_key.h"

namespace moejit::tools {

// One [rows, K] matrix as the runtime describes it.
struct MatrixSpec {
  formats::Format format = formats::Format::bf16;
  formats::ScaleDtype scale_dtype = formats::ScaleDtype::bf16;
  int32_t group_size = 0;    // 0 = the format's default
  int64_t k = 0;             // reduction length
  int64_t scale_stride = 0;  // scale elements between scale rows; 0 = dense
  jit::Isa isa = jit::Isa::avx2;
  bool no_vbmi = false;  // force jit::kFlagNoVbmi (fp8_block on avx512_bf16)
};

// Flags Matmul::init gives every kernel of the matrix: kFlagNoVbmi for
// fp8_block on avx512_bf16 when asked to or when the CPU lacks AVX512_VBMI.
uint32_t runtime_flags(const MatrixSpec& m);

// The key Matmul::resolve builds for one call of `rows` rows and `tokens` tokens.
jit::KernelKey runtime_key(const MatrixSpec& m, int rows, int tokens);

struct LayerSpec {
  formats::Format format = formats::Format::bf16;
  formats::ScaleDtype scale_dtype = formats::ScaleDtype::bf16;
  int32_t group_size = 0;
  int32_t hidden = 0;        // H
  int32_t intermediate = 0;  // I
  int32_t experts = 0;
  int32_t top_k = 0;
  int32_t max_tokens = 1;
  bool interleaved = false;  // gate_up rows 2j gate j, 2j+1 up j
  bool dedup = true;         // MOEJIT_DEDUP / MOEJIT_CONTEXT_NO_DEDUP
  int32_t threads = 1;       // workers of the context: the down row block depends on it
  jit::Isa isa = jit::Isa::avx2;
  bool no_vbmi = false;
};

// Checks the shape the way moejit_moe_create does (sizes, K rule); *why if not.
bool layer_valid(const LayerSpec& l, std::string* why);

// Row blocks MoeLayer::create picks: rows of I per pass-1 item, rows of H per
// pass-2 item.
struct RowBlocks {
  int64_t gate_up = 0, down = 0;
};
RowBlocks layer_row_blocks(const LayerSpec& l);

// Every distinct kernel a MoE layer resolves, in the order it resolves them
// (gate_up by segment length then tokens, then down). Empty for the scalar tier.
std::vector<jit::KernelKey> layer_keys(const LayerSpec& l);

}  // namespace moejit::tools
