// The GEMV kernel family: y[m][r] = dot(W row r, x[m]) in fp32 for `rows`
// consecutive rows and `tokens` activation vectors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jit/cpu.h"
#include "jit/kernel_key.h"
#include "jit/x_layout.h"

namespace moejit::jit {

// Argument struct of every GEMV kernel (read by offset in the generator).
struct GemvArgs {
  const void* w;            // weight bytes of the first row
  const void* scales;       // scale row used by the first row (formats with block scales;
                            // K-quants: the weights, whose super-blocks hold the scales)
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
// Formats the hardware prefetchers stream (bf16, !streams_with_prefetch): the
// kernels prefetch every line of a call ~kPrefetchBytes ahead, each with its
// near twin, as the decoding formats do, instead of the next call (one line
// per KiB of it with one token, every line with several). runtime_flags sets
// it on Intel, where it reads more: on the 16-core Xeon, DeepSeek-V3 bf16 with
// 16 threads and the row kernels, 1.19x at one token and 1.18x at 16; on the
// 2-vCPU Xeon VM 1.12x and 1.08x (docs/PERFORMANCE.md). On Zen 4 one line per
// KiB of the next call read more than a prefetch per line (4129b79), so AMD
// keeps it. Other formats reject the flag (they always prefetch every line).
constexpr uint32_t kFlagLinePrefetch = 2;
// avx512_bf16, the K-quants: the quants decode to bf16 pairs (vpermw,
// vpermi2w) that vdpbf16ps multiplies with bf16 x, and each step's sums are
// scaled by their sub-blocks' d sc[j] (DecodeShape::step_scaled), instead of
// fp32 d sc[j] q and vfmadd231ps with fp32 x. runtime_flags sets it on AMD,
// where a 512-bit vdpbf16ps costs what a vfmadd231ps does for twice the
// products (Zen 5: 0.49 cycles each, moejit-bench-ports), and on Intel for
// q6_K and q3_K: there a pair step costs 1.1-1.2x more per product than an
// fp32 one, yet their pair decodes take fewer instructions than their fp32
// ones; q2_K's fp32 decode and q4_K's and q5_K's fp32 lanes are faster there
// (docs/PERFORMANCE.md).
// Other formats and tiers reject it.
constexpr uint32_t kFlagBf16Pairs = 4;
// With kFlagBf16Pairs: multi-token kernels keep the row order whatever the
// size of their x, instead of K chunks above 48 KiB (jit/row_body.cpp; the
// same bits either way). runtime_flags sets it on Intel: on the 16-core Xeon
// (DeepSeek-V3, 16 threads, three rounds) chunked pair kernels were 0.90x
// (q4_K) and 0.91x (q5_K) at 16 tokens and 0.95-1.07x at 64, where on Zen 5
// they gained 1.07-1.30x at 64 tokens (docs/PERFORMANCE.md). Kernels without
// kFlagBf16Pairs reject it.
constexpr uint32_t kFlagRowOrder = 8;
// avx512 and avx512_bf16 without kFlagBf16Pairs, q4_K and q5_K: decode without GFNI
// (CPUs without it: Skylake-SP, Cascade Lake, Cooper Lake), multiplying every
// widened vector by its d sc[j], instead of the GFNI scale unpack and the
// per-128-element factors of its lane decode (jit/decode_kquant.cpp, Q45Lanes).
// runtime_flags sets it where the CPU lacks GFNI and the format's decode uses
// it. Other formats ignore it.
constexpr uint32_t kFlagNoGfni = 16;
// avx512_amx, for tests on CPUs without AMX: the tile body emits each tile
// instruction as AVX512_BF16 code on tile registers kept in its stack frame
// (jit/tile_body.cpp, "the emulated tile unit"), so the kernel runs wherever
// avx512_bf16 does. It checks the body's addressing, buffers, scales, tails
// and batch invariance, not the tile unit's own rounding. The runtime sets it
// only for a Context built with the test-only tile_emu (no API reaches it);
// other tiers reject it.
constexpr uint32_t kFlagTileEmu = 32;
// The row body's near prefetch (kNearPrefetchBytes, below) into L1 with
// prefetcht0, kNearL1PrefetchBytes ahead, instead of into L2 6 KiB ahead.
// runtime_flags sets it on Intel for the AVX-512 row kernels (tiers avx512 and
// avx512_bf16; the tile body has no near prefetch and rejects it). On the
// 16-core Xeon (DeepSeek-V3, 16 threads, cold, the avx512_bf16 kernels of
// 10-12 formats, both prefetches as arms of one process timed in turn, three
// runs) the layers read 1.02-1.04x as much at one token, 1.01-1.03x at 16 and
// 1.00-1.05x at 64 (geometric means over the formats; the 8-bit formats
// 1.00-1.07x at one token; 2 KiB ahead 1.02-1.03x, 4 KiB 1.01x, 6 KiB 1.01x
// at one token). On Zen 5 the same arms read 1.00x (mxfp8_e4m3 0.96x at one
// token), so AMD keeps the L2 prefetch (docs/PERFORMANCE.md, "Intel tuning").
// Only the prefetch changes: the same bits either way.
constexpr uint32_t kFlagNearL1 = 64;

// Whether a kernel's decode uses AVX512_VBMI: the vpermi2b byte tables of
// 8-bit formats, and the vpermt2b that gathers a q4_0 chunk's quants.
bool needs_vbmi(Isa isa, formats::Format format, uint32_t flags);

// Whether kernels of this format prefetch the weights of a call far ahead
// (w_prefetch = a call ~kPrefetchBytes later, one prefetch per line) or the
// next call (bf16: every line of it with several tokens, one line per KiB with
// one token, where the hardware prefetchers do the rest). The decoder's fact;
// kFlagLinePrefetch gives a format without it the far prefetch.
bool streams_with_prefetch(formats::Format format);
// Whether a kernel with these flags prefetches a call far ahead (the plan's
// prefetch distance follows it).
bool prefetches_far(formats::Format format, uint32_t flags);

// How the kernels of a format decode on a tier, in words (moejit-info).
std::string decode_path(Isa isa, formats::Format format, uint32_t flags);

// Each prefetch of a later call's line comes with a second one, of the line
// kNearPrefetchBytes ahead of the cursor in this call's own stream (also into
// L2): the later-call prefetches alone leave demand misses. Measured on Zen 4,
// Qwen3-30B-A3B layer, cold experts, kernels built both ways alternating in one
// process (PERFORMANCE.md, "Tried, and did not help"): fp8_block with one thread 82-85% of the
// read bandwidth without it, 84-89% with it 4 KiB ahead; two threads 87-88% ->
// 90-93%; q8_0 with two threads +3-5 points. The near prefetch alone reads
// 66%; 2 KiB ahead is no better than none, 16 KiB worse, 4-8 KiB alike (6 KiB
// 0-2 points above 4 with one thread). Past a matrix's last row it is a hint
// that never faults.
inline constexpr int kNearPrefetchBytes = 6144;
// kFlagNearL1's near prefetch: prefetcht0 of the line this far ahead.
inline constexpr int kNearL1PrefetchBytes = 3072;

// Whether avx512_amx kernels exist for a format (a tile decode, jit/decoders.cpp):
// every format has them (with AVX512_VBMI forced off, bf16, q4_0 and the
// K-quants). They can be generated and are tested whichever kernels the layers
// run (kernel_isa).
bool has_tile_kernels(formats::Format format, int32_t group, uint32_t flags = 0);

// The tier whose kernels a context of tier `tier` runs for a format (group:
// the kernel key's; flags: kFlagNoVbmi where asked for). Every tier but
// avx512_amx runs its own (tiers.h, kernel_isa(tier)). avx512_amx runs tile
// kernels for bf16, which streams the weights with tileloadd and no decode,
// and for fp8_block, whose one scale per 16 rows x 128 makes its tile step
// cheap; every other format runs the avx512_bf16 kernels there. Measured on
// the 16-core Xeon (docs/PERFORMANCE.md, docs/FORMATS.md): at one to 16 tokens
// bf16's and fp8_block's tile layers are within a few percent of the rows,
// and from 64 tokens they lead (fp8_block 1.25x at 64, 2.45x at 256); q8_0's
// and mxfp8's tile kernels read 8-19% less up to 16 tokens. Batch invariance
// needs one choice per format and shape, never per token count, so the choice
// is the decode's. `all_tiles` (a context created with MOEJIT_TILES=all) runs
// the tile kernels for every format that has them.
Isa kernel_isa(Isa tier, formats::Format format, int32_t group, uint32_t flags = 0, bool all_tiles = false);

// Flags the runtime uses for a kernel of this tier and format on this CPU
// (kFlagNoVbmi where the byte tables cannot be used; kFlagLinePrefetch for
// bf16 on Intel; kFlagBf16Pairs for the K-quants on AMD, q6_K and q3_K on Intel;
// kFlagNearL1 for the AVX-512 row kernels on Intel).
// `cpu`: another CPU's features (moejit-dump --cpu shows another vendor's kernels).
uint32_t runtime_flags(Isa isa, formats::Format format, int32_t group,
                       const CpuFeatures& cpu = host_features());

// Largest tokens-per-call a generated kernel holds in registers: for the
// kernel `key` describes (its tokens ignored), and the smallest over the groups
// and flags a format may use on a tier.
int max_tokens_per_call(const KernelKey& key);
int max_tokens_per_call(Isa isa, formats::Format format);

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

// Checks that this build can generate `key` (format, ISA, sizes) and that this
// CPU runs it; sets *why if not. With run_here false, only whether the code
// can be generated: generating needs no CPU feature, running does
// (tests/kernel_hashes.cpp hashes every tier's bytes on any CPU).
bool gemv_supported(const KernelKey& key, std::string* why, bool run_here = true);
// Generates a kernel (no cache). nullptr and *err on failure. A kernel
// generated with run_here false must not be called unless gemv_supported(key)
// holds.
std::shared_ptr<const Kernel> generate_gemv(const KernelKey& key, std::string* err, bool run_here = true);

}  // namespace moejit::jit
