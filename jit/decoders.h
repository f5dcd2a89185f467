// Inside the decoders: each family's factory (called only by make_decoder),
// the shared scale rules, and the opmask roles and helpers they share.
#pragma once

#include <memory>
#include <string>

#include "jit/decoder.h"
#include "jit/gemv.h"  // kFlagNoVbmi

namespace moejit::jit {

// ---- opmask roles (k1 is the body's tail mask) ----
// Scratch mask of one step or one scale widening.
inline const Xbyak::Opmask k_sub = Xbyak::util::k2;
// Lanes of the second group of a two-group block (the 64-element byte-table
// decode and the fp32 e2m1 decode keep the first group in the low 256 bits).
inline const Xbyak::Opmask k_grp2 = Xbyak::util::k3;
constexpr uint32_t kGroup2Lanes = 0xFF00;

// Tiers whose decodes widen to bf16 pairs: avx512_bf16 (vdpbf16ps) and
// avx512_amx (the tile body's buffer of bf16 rows, tdpbf16ps).
inline bool bf16_pairs(Isa isa) { return isa == Isa::avx512_bf16 || isa == Isa::avx512_amx; }

// ---- element decode families ----
std::unique_ptr<Decoder> make_bf16_decoder(const KernelKey& key);
// 8-bit floats widened without byte tables: e4m3 through the fp16 trick
// (avx2, avx512), e5m2 as the high byte of an fp16, e4m3 through arithmetic
// and a subnormal blend to bf16 (avx512_bf16 without VBMI).
std::unique_ptr<Decoder> make_e4m3_fp16_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule);
std::unique_ptr<Decoder> make_e5m2_fp16_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule);
std::unique_ptr<Decoder> make_e4m3_blend_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule);
// 8-bit byte tables to bf16 (avx512_bf16 with VBMI): e4m3 and e5m2, and q8_0
// (with its two-block d rule). On avx512_amx the words come out in natural
// order (vpermi2b instead of vpunpck{l,h}bw), so each vector is one chunk of
// 32 elements: one scale group of 32 (mxfp8, q8_0) per tile.
std::unique_ptr<Decoder> make_fp8_table_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule);
std::unique_ptr<Decoder> make_q8_table_decoder(const KernelKey& key);
// e2m1 (mxfp4, nvfp4): fp32 evens and odds (avx2, avx512), or 128 at a time to
// bf16 with the row's group scales widened on the stack (avx512_bf16).
std::unique_ptr<Decoder> make_e2m1_f32_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule);
std::unique_ptr<Decoder> make_e2m1_nib128_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule);
// mxfp4 on avx512_amx (VBMI): each group of 32 one tile row of bf16 (natural order).
std::unique_ptr<Decoder> make_e2m1_tile_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule);
// The nib128 decode's scales in the row body: e8m0 or e4m3 group scales
// widened per batch of rows, a vpermps per chunk onto the decode's lanes.
std::unique_ptr<ScaleRule> make_widened_row_scale(const KernelKey& key);
// GGUF integer blocks to fp32 (q4_0, q8_0), and q4_0 4 blocks at a time to bf16.
std::unique_ptr<Decoder> make_q4_f32_decoder(const KernelKey& key);
std::unique_ptr<Decoder> make_q8_f32_decoder(const KernelKey& key);
std::unique_ptr<Decoder> make_q4x4_decoder(const KernelKey& key);
// q4_0 on avx512_amx: each block one tile row of 32 bf16 (natural order).
std::unique_ptr<Decoder> make_q4_tile_decoder(const KernelKey& key);
// GGUF K-quants (q4_K .. q3_K): super-blocks widened to fp32, each vector
// times its sub-block's d sc[j], with the rule's min term (decode_kquant.cpp).
std::unique_ptr<Decoder> make_kquant_decoder(const KernelKey& key);
// The K-quants on avx512_amx: each vector of 32 one tile row of bf16 quants
// (natural order), d sc[j] (and dmin m[j] S_x) per sub-block (decode_kquant_tile.cpp).
std::unique_ptr<Decoder> make_kquant_tile_decoder(const KernelKey& key);

// ---- scale rules shared by several decodes (jit/scale_rules.cpp) ----
// fp8_block: one bf16 or fp32 scale per 128 x 128, widened to fp32 on the stack once per call.
std::unique_ptr<ScaleRule> make_block128_scale(const KernelKey& key);
// One byte code per group along each row (e8m0, or e4m3 for nvfp4), through a 256-entry fp32 table.
std::unique_ptr<ScaleRule> make_byte_code_scale(const KernelKey& key);
// GGUF: the fp16 d at the start of each 32-element block.
std::unique_ptr<ScaleRule> make_gguf_scale(const KernelKey& key);
// The GGUF d rules' shared part (q8_0's two-block rule and GgufScale): groups
// of 32, d inline in the weights, and on tiles each row's d widened
// (vcvtph2ps from memory, no shuffle) to its lane of a vector on the stack,
// which the FMAs read (ScaleRule::tile_fma_rows).
class GgufTileScale : public ScaleRule {
 public:
  using ScaleRule::ScaleRule;
  int group() const override { return 32; }
  int block_bytes() const override { return 0; }  // inline in the weights
  bool tile_ready() const override { return true; }
  int stack_bytes() const override { return key_.isa == Isa::avx512_amx ? 64 : 0; }
  void prologue() override { tile_scale_prologue(stack_bytes()); }
  void tile_apply(const TileScaleBlock& b) override;
};
// The group rules of the byte-code scales (mxfp4 32, mxfp8 32/64/128, nvfp4 16, K a multiple).
bool check_byte_groups(const KernelKey& key, std::string* why);

// ---- byte geometry of GGUF blocks: fp16 d, then the quants ----
constexpr int kQ8BlockBytes = 34;
constexpr int kQ4BlockBytes = 18;
// Byte of q8_0 element `off` from the first byte of a run of blocks.
inline int q8_elem_byte(int off) { return kQ8BlockBytes * (off / 32) + 2 + off % 32; }

// 64 bytes of nibbles in dst[0] -> 4 x 32 words: vector j = table[word >> 4j]
// (vpermw reads 5 index bits, so the table holds its 16 entries twice).
// Shifts rather than byte shuffles: shuffles are the scarce port (Zen 4).
void emit_nibble_words(Generator& a, const Xbyak::Xmm* dst, const Xbyak::Xmm& table);

}  // namespace moejit::jit
