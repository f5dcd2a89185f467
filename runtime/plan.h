// The layer plan: the row blocks, kernel calls and kernels of a MoE layer and
// of a dense linear layer, one pure function of the descriptor, the tier and
// the thread count. MoeLayer and LinearLayer build from it, moejit-dump
// --layer prints it and bench/ times its kernels, so none of them re-derives it.
#pragma once

#include <cstdint>
#include <vector>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "jit/kernel_key.h"

namespace moejit::plan {

// One projection's encoding, as a descriptor gives it (validated).
struct ProjFormat {
  formats::Format format = formats::Format::bf16;
  formats::ScaleDtype scale_dtype = formats::ScaleDtype::bf16;
  int32_t group_size = 0;  // the API's value: 0 = the format's default
};

// Where the kernels run. Kernel flags also follow the CPU (kFlagNoVbmi without
// AVX512_VBMI, kFlagLinePrefetch for bf16 on Intel, jit::runtime_flags): the
// one input that is not the caller's.
struct Target {
  jit::Isa isa = jit::Isa::avx2;
  int32_t threads = 1;     // workers of the context: row blocks keep every worker busy
  bool dedup = true;       // one kernel call per expert with all of its routes (MoE)
  bool no_vbmi = false;    // force jit::kFlagNoVbmi where a decode would use AVX512_VBMI
  bool all_tiles = false;  // avx512_amx: tile kernels for every format (MOEJIT_TILES=all; jit::kernel_isa)
  bool tile_emu = false;   // tests: avx512_amx kernels on the emulated tile unit (jit::kFlagTileEmu)
  // The CPU whose choices the kernels' flags make (jit::runtime_flags), null:
  // this host. moejit-dump --cpu plans another vendor's kernels with it.
  const jit::CpuFeatures* cpu = nullptr;
};

// One [rows, K] matrix: the kernels' view of it and every kernel its calls use.
struct MatrixPlan {
  // Kernel format (ds_fp4 runs mxfp4's), group resolved, scale stride resolved
  // (the stride given, or the dense one).
  formats::Layout layout;
  jit::Isa isa = jit::Isa::avx2;   // the scalar tier has no generated kernels
  uint32_t flags = 0;              // jit::kFlag* of every kernel
  std::vector<int32_t> call_rows;  // distinct rows per kernel call, ascending
  int32_t tokens_per_call = 1;     // most tokens one kernel call takes (the scalar tier: 1)

  // The kernel of a call of `rows` rows and `tokens` tokens.
  jit::KernelKey key(int32_t rows, int32_t tokens) const;
  // Every kernel, in the order the runtime resolves them: rows ascending, then
  // tokens 1..tokens_per_call. Empty on the scalar tier.
  std::vector<jit::KernelKey> keys() const;
  int32_t max_call_rows() const { return call_rows.empty() ? 0 : call_rows.back(); }
  // Weight bytes one call of n rows reads.
  int64_t call_bytes(int64_t n) const { return n * formats::row_bytes(layout.format, layout.k); }
  // Weight + scale bytes of the whole matrix (dense scales, nvfp4 row globals).
  int64_t matrix_bytes() const;
  // Whether its kernels prefetch a call far ahead (bf16 prefetches the next
  // one, except with kFlagLinePrefetch).
  bool far_prefetch() const;
};

// A matrix with no calls yet. `scale_stride` is the API's (0 = dense).
MatrixPlan matrix_plan(const Target& t, const ProjFormat& f, int64_t rows, int64_t k, int64_t scale_stride);
// Records the kernel calls of rows [r0, r0 + n).
void add_rows(MatrixPlan* m, int64_t r0, int64_t n);
// Sets tokens_per_call for calls of up to `max_tokens` tokens (tiled beyond the registers).
void set_tokens(MatrixPlan* m, int32_t max_tokens);

// Where a kernel call over rows [r, end) ends: fp8_block calls never cross a
// 128-row scale block (a kernel reads one scale row).
inline int64_t call_end(const formats::Layout& l, int64_t r, int64_t end) {
  if (formats::info(l.format).scales != formats::ScaleKind::tile_128)
    return end;  // calls never cross a scale tile
  const int64_t block_end = (r / 128 + 1) * 128;
  return block_end < end ? block_end : end;
}

// ---------------------------------------------------------------- MoE

// How gate and up are held: one fused [2I, H] gate_up matrix per expert, rows
// concatenated (gate [0, I), up [I, 2I)) or interleaved (2j gate j, 2j+1 up j);
// or separate gate [I, H] and up [I, H] banks.
enum class GateUp { concat, interleaved, separate };

// What the plan of a MoE layer depends on. Validated: the K rules of each
// projection, and ds_fp4 in every projection or none.
struct MoeShape {
  ProjFormat gate, up, down;  // up is gate's with a fused gate_up
  int32_t hidden = 0, intermediate = 0, top_k = 1, max_tokens = 1;
  GateUp gate_up = GateUp::concat;
  // Expert 0's scale_row_stride of each bank (0 = dense; `up` unused when fused):
  // kernels of the formats that bake the stride are generated for it.
  int64_t gate_stride = 0, up_stride = 0, down_stride = 0;
};

enum Proj : int { kGate = 0, kUp = 1, kDown = 2 };  // kGate is the fused gate_up matrix when fused

// One kernel call of a pass-1 item: `rows` rows of matrix `proj` from `r0`.
struct Call {
  int proj;
  int64_t r0, rows;
};

struct MoePlan {
  GateUp gate_up = GateUp::concat;
  int64_t hidden = 0, intermediate = 0;
  bool ds = false;        // ds_fp4 activation numerics (every projection is ds_fp4)
  int64_t rows1 = 32;     // rows of I per pass-1 item (ds_fp4: one 128-block of g)
  int64_t rows2 = 64;     // rows of H per pass-2 item
  int64_t blocks1 = 0;    // pass-1 row blocks (a call has groups x blocks1 items)
  int64_t blocks2 = 0;    // pass-2 items
  int32_t group_max = 1;  // routes one group holds: max_tokens * top_k with dedup, else 1
  MatrixPlan mats[3];     // kGate (or gate_up), kUp (separate banks only), kDown

  // Kernel calls of one pass-1 item (1 interleaved, else 2: gate then up).
  int calls1() const { return gate_up == GateUp::interleaved ? 1 : 2; }
  // Call c of pass-1 row block j.
  Call call1(int64_t j, int c) const {
    const int64_t j0 = j * rows1, n = rows1 < intermediate - j0 ? rows1 : intermediate - j0;
    switch (gate_up) {
      case GateUp::interleaved: return {kGate, 2 * j0, 2 * n};
      case GateUp::concat: return {kGate, c == 0 ? j0 : intermediate + j0, n};
      case GateUp::separate: break;
    }
    return {c == 0 ? kGate : kUp, j0, n};
  }
  bool separate() const { return gate_up == GateUp::separate; }
  // Whether the layer holds matrix `proj` (kUp only with separate banks).
  bool has(int proj) const { return proj != kUp || separate(); }
  // Weight + scale bytes of one expert (every projection in its own format).
  int64_t expert_bytes() const;
  // Every distinct kernel, in the order the layer resolves them (gate_up or
  // gate, up, down). Empty on the scalar tier.
  std::vector<jit::KernelKey> keys() const;
};

MoePlan moe_plan(const MoeShape& s, const Target& t);

// ---------------------------------------------------------------- dense linear

struct LinearPlan {
  int64_t rows_per_item = 16;
  int64_t items = 0;
  MatrixPlan weight;
};

LinearPlan linear_plan(const ProjFormat& f, int32_t rows, int32_t cols, int32_t max_tokens,
                       int64_t scale_stride, const Target& t);

}  // namespace moejit::plan
