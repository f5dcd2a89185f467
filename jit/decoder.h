// Decoders: one object per decode family of weight formats, and the hooks a
// body calls. A body (the row-streaming AVX body of jit/row_body.h; a tile
// body next) owns loops, accumulators, reductions, prefetch and the epilogue
// and knows no format; everything a format decides goes through a Decoder
// (its facts, constants and data, load-and-widen) and its ScaleRule (how block
// or group scales reach the sums). Decoders may look at the format; nothing
// outside them and formats/ compares a format id.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "jit/generator.h"
#include "jit/kernel_key.h"
#include "jit/x_layout.h"

namespace moejit::jit {

// Elements of one scale block of fp8_block, and of one unrolled chunk of an
// unscaled format.
constexpr int kChunk = 128;

// The geometry of a decode, fixed by the key.
struct DecodeShape {
  int vec_elems = 0;    // weights per output vector of load_widen (fp32 lanes, or 32 bf16 pairs)
  int step = 0;         // weights per load_widen: 1, 2 or 4 output vectors
  int block = 0;        // elements per scale block (one or more scale groups); unscaled: one chunk
  int groups = 1;       // scale groups per block
  bool scaled = false;  // whether a ScaleRule applies per block
  // Whether the rule also scales each step's sums (ScaleRule::apply_step): the
  // body then sums vector i of a step into accumulator i % 2, fresh each step,
  // and the block's apply() adds only the rule's other terms (the K-quant bf16
  // pairs, whose sub-block factors cannot ride in bf16 weights).
  bool step_scaled = false;
  // Step-scaled: the steps whose sums one apply_step scales (the accumulators
  // are zeroed before the first of them; the last step of a block ends a run).
  int scale_steps = 1;
  int vectors() const { return step / vec_elems; }
};

// Registers a body lends its decoder for the whole kernel. The decoder's own
// opmasks are k2..k7 (each decoder names its roles); k1 is the body's tail.
// Vector registers must be among 0-15: several decodes use VEX-only
// instructions (vpand, vmovdqu, vpxor on ymm and xmm).
struct DecodeRegs {
  Xbyak::Xmm w[4];     // widened weights: the row body's load_widen destinations, free between steps
  Xbyak::Xmm t[2];     // temporaries of one step (may alias w[2], w[3]: 4-vector decodes use no t)
  Xbyak::Xmm scale;    // the block's scale vector; also a temporary of load_widen
  Xbyak::Xmm c[5];     // decode constants, live from emit_constants on (avx2 lends only c[0])
  Xbyak::Reg64 tmp;    // scratch
  Xbyak::Reg64 aux;    // callee-saved, the decoder's for the whole kernel (scale table, widened scales)
  Xbyak::Opmask tail;  // the body's: the low cnt bits, set before a partial load_widen
  // For the hooks that run between rows (ScaleRule::prologue, begin_row, next_row):
  Xbyak::Reg64 scale_row;        // the current row's scale row (GemvArgs::scales at the first row)
  Xbyak::Reg64 rows_left;        // rows left, the current one included
  Xbyak::Reg64 count, src, dst;  // scratch between rows
};

// Where a block's bytes are: base register plus the displacement of its first byte.
struct Cursor {
  Xbyak::Reg64 base;
  int64_t disp = 0;
  Xbyak::RegExp at(int64_t off = 0) const { return base + size_t(disp + off); }
};

// One block for ScaleRule::apply.
struct ScaleBlock {
  Cursor w;                            // the block's weights (GGUF blocks carry their scale inline)
  Cursor s;                            // the block's scales, at the scale cursor
  int n = 0;                           // elements: shape.block, or fewer in the last block of a row
  std::span<const Xbyak::Xmm> sums;    // per token: the block's sum of products
  std::span<const Xbyak::Xmm> totals;  // per token: the running total that gains sum * scale
  // Per token, the block's vector of sub-block sums of x (XSums), where the
  // decoder asks for them (Decoder::xsum_span): a rule adds its term with one
  // FMA against a vector of its per-sub-block factors.
  std::span<const Xbyak::Address> xsums;
  // True when the block's last load_widen ran just before with these cursors
  // and left r_.scale as it was (the row body); a body that widens several rows
  // before their scales (a tile body) passes false and the rule reloads.
  bool after_widen = true;
};

// One run of DecodeShape::scale_steps steps for ScaleRule::apply_step
// (DecodeShape::step_scaled): the run's two accumulators of every token, which
// the rule scales into that token's two running totals.
struct StepBlock {
  Cursor w;                            // the block's weights
  int step = 0;                        // the run's index in the block (step / scale_steps)
  std::span<const Xbyak::Xmm> sums;    // token m: accumulators 2 m (even vectors) and 2 m + 1 (odd)
  std::span<const Xbyak::Xmm> totals;  // token m: running totals 2 m and 2 m + 1
};

// One group of scales for ScaleRule::tile_apply (tile bodies): the group's
// products of `rows` rows x M tokens gain each row's scale into the running
// totals. C and the totals are packed in `width` lanes per row (M rounded up
// to a power of two): `width` vectors, vector i lane l row (16 i + l) / width
// and token l % width (lanes of tokens past M hold 0), C stored with a row
// stride of 4 width bytes. With one token a vector is the 16 rows; with 9 to 16
// each vector is one row.
struct TileScaleBlock {
  Cursor c;                            // the C tile, packed: vector i at c.at(64 i)
  Cursor w;                            // weights of the group in the first row (GGUF: d inline)
  Cursor s;                            // the group's scales at the scale cursor of the first row
  int64_t row_bytes = 0;               // weight bytes between rows
  int rows = 0;                        // rows of the block (16, fewer in the last)
  int width = 0;                       // lanes per row: vectors of C and of the totals
  std::span<const Xbyak::Xmm> totals;  // the running totals, packed as C
  int group = 0;                       // the group's index in its block
  Cursor block_w;                      // the block's first weight byte in the first row
  // Where the decoder asks for sums of x (Decoder::xsum_span): the block's
  // sums, sub-block j's row of one dword per token at xsums.at(j xsum_row_bytes)
  // (XPrep's tile layout).
  Cursor xsums;
  int xsum_row_bytes = 0;
  // Width 2, 4 or 8: the body's index vectors (vpermps) onto the packed layout,
  // at spread + 64 i lane l row (16 i + l) / width, then one of tokens l % width.
  const Xbyak::Label* spread = nullptr;
};

// State shared by a decoder and its scale rule: the key, the shape and, once
// bound, the generator and the lent registers.
class DecodePart {
 public:
  virtual ~DecodePart() = default;
  const KernelKey& key() const { return key_; }
  const DecodeShape& shape() const { return shape_; }

 protected:
  explicit DecodePart(const KernelKey& key) : key_(key) {}
  void bind_part(Generator& g, const DecodeRegs& r, const DecodeShape& s) {
    a_ = &g;
    r_ = r;
    shape_ = s;
  }
  Generator& a() const { return *a_; }  // the assembler every hook emits into
  bool zmm() const { return key_.isa != Isa::avx2; }

  KernelKey key_;
  DecodeShape shape_{};
  DecodeRegs r_;

 private:
  Generator* a_ = nullptr;
};

// How a block's scales reach the sums: tot[m] += sum[m] * scale, for every
// token. Rules shared by several element decodes are in jit/scale_rules.cpp;
// decodes whose scales come out of their own loads define theirs with them.
class ScaleRule : public DecodePart {
 public:
  // Elements per scale (the group).
  virtual int group() const = 0;
  // Key rules of the scales (group sizes, K and row limits); *why when not.
  virtual bool check(std::string* /*why*/) const { return true; }

  // ---- prologue and epilogue, emitted once ----
  // After the body read GemvArgs: what the rule keeps in r_.aux.
  virtual void load_args() {}
  // Constants (a two-group block's lane mask), before the decode's.
  virtual void emit_constants() {}
  // Bytes of the rule's stack area, [rsp, rsp + stack_bytes()) from prologue()
  // on; the body allocates its own stack before and frees both at the end.
  virtual int stack_bytes() const { return 0; }
  virtual void prologue() {}
  virtual void emit_data() {}

  // ---- per row ----
  virtual void begin_row() {}  // top of every row, before its first block
  // The register the row's scale cursor starts from.
  virtual Xbyak::Reg64 row_cursor() const { return r_.scale_row; }
  virtual void next_row() {}  // after a row, before the next
  // Scale-cursor bytes per block.
  virtual int block_bytes() const = 0;

  // ---- K-chunked row bodies: rows in groups, each group's rows visited once
  // per chunk of K (kChunkXBytes in jit/row_body.cpp) ----
  // Whether the rule supports them: begin_row_blocks instead of begin_row,
  // rewind_rows between chunks; a rule that reads rows_left does not.
  virtual bool chunkable() const { return false; }
  // Top of a row's visit for its n blocks from the weight byte offset held in
  // the qword at `first_byte` (r_.scale_row, r_.count, src, dst and tmp free).
  virtual void begin_row_blocks(const Xbyak::Address& /*first_byte*/, int64_t /*n*/) {}
  // Undoes next_row() n times: back to the group's first row.
  virtual void rewind_rows(int /*n*/) {}

  // ---- per block ----
  virtual void apply(const ScaleBlock& b) = 0;
  // After each run of DecodeShape::scale_steps steps of a step-scaled decode.
  virtual void apply_step(const StepBlock& /*b*/) {}

  // ---- tile bodies (jit/tile_body.cpp): 16 rows at a time ----
  // Whether the rule has a tile form; a tile body then calls begin_row() and
  // next_rows(n) around each block of n rows and tile_apply() per group.
  virtual bool tile_ready() const { return false; }
  virtual void next_rows(int n) {
    for (int i = 0; i < n; ++i) next_row();
  }
  virtual void tile_apply(const TileScaleBlock& /*b*/) {}

 protected:
  friend class Decoder;  // gives the rule its shape and binds it with the decode
  explicit ScaleRule(const KernelKey& key) : DecodePart(key) {}
  // tot[m] += sum[m] * scale for every token (an FMA each).
  void fma_tokens(const ScaleBlock& b, const Xbyak::Operand& scale);
  // Tile bodies, on the packed totals: totals += C * (the row's value of
  // `rows`, 16 fp32 at a 64-byte aligned address, lane = row), and totals -=
  // (the row's value of `rows`) * (the token's value of `toks`, a vector whose
  // lane t is token t). Each is one FMA per element, in any layout; they use
  // r_.w[0..2] (free between steps).
  void tile_fma_rows(const TileScaleBlock& b, const Xbyak::RegExp& rows);
  void tile_fnma_rows_tokens(const TileScaleBlock& b, const Xbyak::RegExp& rows, const Xbyak::Zmm& toks);
  // A tile rule's prologue with `bytes` (0 or 64) of stack: one vector of the
  // rows' scales, zero so that rows past a block's stay 0.
  void tile_scale_prologue(int bytes);
};

// Element decode of one family: facts, constants and data, load-and-widen.
class Decoder : public DecodePart {
 public:
  // ---- facts ----
  XLayout x_layout() const { return layout_; }
  XPrep x_prep() const {
    return XPrep(layout_, key_.isa, xsum_span() ? XSums{xsum_span(), shape_.block} : XSums{}, tile_halves());
  }
  // Whether a tile body takes this decode in half steps: scale groups of 16
  // (nvfp4, q6_K, q2_K, q3_K), whose x is a halves layout (XPrep).
  bool tile_halves() const;
  // AVX512_VBMI instructions in the decode (byte tables, the q4_0 gather).
  virtual bool needs_vbmi() const { return false; }
  // GFNI instructions in the decode (vgf2p8affineqb: the q3_K, q4_K and q5_K bf16 pairs).
  virtual bool needs_gfni() const { return false; }
  // False where the hardware prefetchers stream the weights (bf16): one-token
  // kernels then unroll rows and prefetch a later call sparsely.
  virtual bool streams_with_prefetch() const { return true; }
  // Each row's sum times its fp32 global (GemvArgs::row_scales) before the store.
  virtual bool row_globals() const { return false; }
  // Each row's total times this before its sums (256: the fp16 widening's 2^-8).
  virtual float total_factor() const { return 1.0f; }
  // Elements per sub-block whose sum of x the scale rule adds a term with
  // (K-quants: - dmin m[j] S_x); 0 for none. The prepared x then carries those
  // sums after each block (XSums) and ScaleBlock::xsums addresses them.
  virtual int xsum_span() const { return 0; }
  ScaleRule* scale() const { return rule_.get(); }  // null when unscaled
  // Whether the decode is the K-quant bf16-pair form that kFlagBf16Pairs asks for.
  virtual bool kquant_pairs() const { return false; }
  // The decode path in words (moejit-info).
  virtual std::string describe() const { return "widened to fp32, vfmadd231ps"; }
  // Tile bodies: whether the weights as they lie are the A tiles (bf16: no
  // decode, tileloadd from the weights; tails still go through load_widen).
  virtual bool tile_direct() const { return false; }

  // ---- geometry of the weight bytes ----
  virtual int block_bytes() const = 0;       // weight bytes of one block
  virtual int elem_byte(int off) const = 0;  // byte of element `off` (a step start) from the block's first
  bool check(std::string* why) const { return !rule_ || rule_->check(why); }

  // ---- emission ----
  void bind(Generator& g, const DecodeRegs& r);
  // The scale rule's constants, then the decode's.
  virtual void emit_constants() {
    if (rule_) rule_->emit_constants();
    emit_decode_constants();
  }
  // Tables after the code (the decode's and the rule's, in the decoder's order).
  virtual void emit_data() {
    if (rule_) rule_->emit_data();
  }
  // Widens `cnt` elements (cnt <= step) of the block at `w`, from element
  // `off`, into dst[0 .. shape().vectors() - 1] in the order of x_layout(),
  // zeros past cnt and never a byte past them. cnt < step only in the last step
  // of a row, and r_.tail then holds its low cnt bits (AVX-512). May clobber
  // t[], scale and tmp; dst may be any vectors other than those and c[].
  virtual void load_widen(const Cursor& w, int off, int cnt, const Xbyak::Xmm* dst) = 0;

 protected:
  // `vectors`: output vectors per step; `rule`: null for unscaled formats.
  Decoder(const KernelKey& key, XLayout layout, int vectors, std::unique_ptr<ScaleRule> rule);
  // Makes the shape step-scaled (DecodeShape::step_scaled), the rule's too,
  // with `steps` steps per apply_step.
  void set_step_scaled(int steps = 1);
  // Makes a block `block` elements (a multiple of the rule's group), the rule's too.
  void set_block(int block);
  virtual void emit_decode_constants() {}

  XLayout layout_;
  std::unique_ptr<ScaleRule> rule_;
};

// The decoder for a key: the one place that picks a decode family from the
// format, the tier and the flags. Null when no generated kernel decodes the
// format on that tier.
std::unique_ptr<Decoder> make_decoder(const KernelKey& key);
// A key with only the tier, format and flags set: enough to ask a decoder its facts.
inline KernelKey decoder_key(Isa isa, formats::Format format, uint32_t flags) {
  KernelKey key;
  key.isa = isa;
  key.format = format;
  key.flags = flags;
  return key;
}

}  // namespace moejit::jit
