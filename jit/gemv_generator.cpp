// GEMV generator: one body for every format and tier. A format contributes
// "load and widen one step of weights" and its scale rule; a tier contributes
// the vector width, the register budget and the multiply instruction.
#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "jit/gemv.h"
#include "jit/generator.h"

namespace moejit::jit {

using formats::Format;
using namespace Xbyak;

namespace {

constexpr int kBlock = 128;
// elements per inner block (fp8_block scale block; unrolled chunk otherwise)

bool format_has_jit(Format f) {
  return f == Format::bf16 || f == Format::fp8_block || f == Format::mxfp8_e4m3 || f == Format::mxfp8_e5m2 ||
         f == Format::q4_0 || f == Format::q8_0 || f == Format::mxfp4 || f == Format::nvfp4;
}
// GGUF blocks: fp16 d followed by the 32 quants, rows are arrays of blocks.
bool is_gguf(Format f) { return f == Format::q4_0 || f == Format::q8_0; }
bool is_e4m3(Format f) { return f == Format::fp8_block || f == Format::mxfp8_e4m3; }
bool is_mx8(Format f) { return f == Format::mxfp8_e4m3 || f == Format::mxfp8_e5m2; }
bool is_e2m1(Format f) { return f == Format::mxfp4 || f == Format::nvfp4; }
// One e8m0 scale per group along each row.
bool e8m0_scales(Format f) { return is_mx8(f) || f == Format::mxfp4; }
// One byte scale per group along each row, decoded through a 256-entry fp32
// table: e8m0 (mx formats) or e4m3 (nvfp4).
bool byte_scales(Format f) { return e8m0_scales(f) || f == Format::nvfp4; }

struct TierTraits {
  int vec_bytes;  // 32 (ymm) or 64 (zmm)
  int step;       // weights consumed per multiply instruction
  int acc_first;  // first accumulator register
  int acc_count;  // registers available for accumulators
};

TierTraits tier_traits(Isa isa) {
  switch (isa) {
    case Isa::avx2: return {32, 8, 6, 10};
    case Isa::avx512: return {64, 16, 10, 22};
    case Isa::avx512_bf16: return {64, 32, 10, 22};
    default: return {0, 0, 0, 0};
  }
}

bool scaled_format(Format f) { return f == Format::fp8_block || byte_scales(f) || is_gguf(f); }

// Rows are streamed one at a time, front to back: one sequential stream is what
// hardware prefetchers follow best (interleaving 8 rows measured up to 2x
// slower on cold weights). Independent FMA chains come from the tokens and
// from splitting K across kSplit accumulators per token (vector v of a block
// goes to accumulator v % kSplit, summed by a fixed tree). kSplit never depends
// on the token count, so one token gives the same bits alone or inside a
// multi-token (dedup) call. 4 measured faster than 2 with one token on Zen 4
// (bf16 cold layer 66% -> 81% of the read bandwidth, one thread).
constexpr int kSplit = 4;
// Scaled formats sum each scale block's products in at most kBlockSplit
// accumulators (summed once per block, then one FMA by the scale into a running
// total chosen by block index, see plan_of): fewer adds per block, and short
// blocks still get independent FMA chains.
constexpr int kBlockSplit = 2;
// bf16 one-token kernels stream mostly on the hardware prefetchers, and emit
// each row fully unrolled up to this many vectors: every x load then reads the
// same address on every row. A looped row gives each x load a constant 256-byte
// stride, which the stride prefetcher follows at the cost of the weight stream
// (measured on Zen 4, one core, 1 GiB of bf16 rows: 72-88% of the read
// bandwidth looped, 90-96% unrolled).
constexpr int64_t kMaxRowUnrollVectors = 256;
// Bytes of the next call covered by each software prefetch of a bf16 one-token
// kernel: enough to start the hardware prefetchers on the next call's lines
// (an expert's rows elsewhere in memory) without competing with them. Measured
// on Zen 4 in the Qwen3-30B-A3B bf16 layer, one thread, same runs: none
// 77-87% of the read bandwidth, one per 1 KiB 84-92% (256 B and 4 KiB alike);
// one per line (64 B) 71% on a cold stream. The other formats need one per line:
// fp8_block with one per 256 B fell from 78-81% to 66-72%.
constexpr int kSparsePrefetchBytes = 1024;

// Rows whose group scales an e2m1 kernel widens together (widen_batch).
constexpr int kWidenRows = 4;

// Lanes of the second group of a two-group block: the 64-element byte-table
// decode and the fp32 e2m1 decode keep the first 32 (16) elements in the low
// 256 bits. (e2m1 and q4_0 chunks of 128 hold 4 or 8 groups, see apply_block_scale.)
constexpr uint32_t kGroup2Lanes = 0xFF00;

// The shape of a kernel's inner loop, from its format, tier, group and flags.
struct Plan {
  int vec_elems;  // weights per multiply instruction
  int step;       // weights per decode step
  int block;      // elements per scale block (one or more scale groups), or unrolled chunk (bf16)
  int gpb;        // scale groups per block
  int na;         // accumulators per token inside a block
  int nt;         // running totals per token (scaled formats; 0 otherwise)
  int regs_per_token() const { return na + nt; }
};

Plan plan_of(const KernelKey& key) {
  const Format f = static_cast<Format>(key.format);
  const XLayout l = x_layout(key.isa, key.format, key.flags);
  const bool f32 = x_elem_bytes(l) == 4;
  Plan p{};
  p.vec_elems = f32 ? tier_traits(key.isa).vec_bytes / 4 : 32;
  p.step = l == XLayout::bf16_nib128 || l == XLayout::bf16_q4 ? 4 * p.vec_elems
           : l == XLayout::bf16_perm64 || (is_e2m1(f) && f32) ? 2 * p.vec_elems
                                                              : p.vec_elems;
  // A block is the unit one scale (or one per group of it) applies to.
  const int group = is_gguf(f) ? 32 : byte_scales(f) ? std::max(1, key.group) : kBlock;
  p.block = f == Format::bf16 ? kBlock : std::max(group, std::min(p.step, kBlock));
  const bool scaled = scaled_format(f);
  p.gpb = scaled ? p.block / group : 1;
  const int vpb = std::max(1, p.block / p.vec_elems);
  p.na = scaled ? std::min(kBlockSplit, vpb) : kSplit;
  // Blocks of 4+ vectors are long enough to hide the latency of one running
  // total's FMA chain; shorter blocks rotate kSplit / na totals. Fewer
  // registers per token means more tokens per call (dedup decodes once per call).
  p.nt = !scaled ? 0 : vpb >= 4 ? 1 : std::max(1, kSplit / p.na);
  return p;
}

class GemvGenerator : public Generator {
 public:
  explicit GemvGenerator(const KernelKey& key)
      : key_(key),
        fmt_(static_cast<Format>(key.format)),
        isa_(key.isa),
        tt_(tier_traits(key.isa)),
        layout_(x_layout(key.isa, key.format, key.flags)),
        plan_(plan_of(key)),
        scaled_(scaled_format(fmt_)),
        wbytes_(fmt_ == Format::bf16 ? 2 : 1),
        xbytes_(int(x_elem_bytes(layout_))),
        row_bytes_(formats::row_bytes(fmt_, key.k)),
        xstride_bytes_(x_stride(key.k) * int64_t(x_elem_bytes(layout_))),
        vbmi_lut_(layout_ == XLayout::bf16_perm64),
        q4x4_(layout_ == XLayout::bf16_q4),
        q4_vbmi_(q4x4_ && !(key.flags & kFlagNoVbmi)),
        nib128_(layout_ == XLayout::bf16_nib128),
        fma_f32_(x_elem_bytes(layout_) == 4),
        // Every kernel prefetches a later call (w_prefetch). bf16 multi-token
        // calls compute long enough per line that streaming no longer overlaps
        // without help (measured: cold = hot + DRAM time): they prefetch each line
        // of the next call, as the other formats do of a call ~kPrefetchBytes
        // ahead. bf16 one-token kernels prefetch sparsely (kSparsePrefetchBytes).
        bf16_one_(fmt_ == Format::bf16 && key.tokens == 1) {
    unroll_ = scaled_ ? std::max(plan_.nt, kBlock / plan_.block) : 1;
    const int64_t nfull = key.k / plan_.block;
    if (bf16_one_ && nfull > 0 && nfull * (plan_.block / plan_.vec_elems) <= kMaxRowUnrollVectors)
      unroll_ = int(nfull);
  }

  bool generate(std::string* err) {
    const int regs = tt_.vec_bytes == 64 ? 32 : 16;
    if (tt_.acc_first + key_.tokens * (plan_.na + plan_.nt) > regs) {
      *err = "tokens per call exceed the accumulator registers";
      return false;
    }
    emit_body();
    return finalize(err);
  }
  const KernelKey& key() const { return key_; }

 private:
  // ---- register roles ----
  const Reg64 reg_wt = rsi;    // weights of the current row
  const Reg64 reg_y = rdx;     // y of the current row
  const Reg64 reg_x0 = rcx;    // prepared activations
  const Reg64 reg_s0 = r8;     // scale row
  const Reg64 reg_wk = r9;     // weight cursor along K
  const Reg64 reg_xk = r10;    // activation cursor along K
  const Reg64 reg_sk = r11;    // scale cursor along K
  const Reg64 reg_kb = rax;    // block counter
  const Reg64 reg_tmp = rbx;   // scratch (callee-saved)
  const Reg64 reg_rows = r12;  // row counter (callee-saved)
  const Reg64 reg_pfd = r13;   // w_prefetch - w: prefetch distance (callee-saved)
  const Reg64 reg_stab = r14;  // byte scale -> fp32 table (callee-saved)
  const Reg64 reg_rs = r14;    // e2m1 chunks (no table): the current row's widened scales (callee-saved)
  const Reg64 reg_g = r15;     // nvfp4 per-row globals of the current row group (callee-saved)
  const Reg64 reg_st = rdi;    // stash slot of the current row (reg_args, free after the prologue)
  const Reg64 reg_rg = rbp;    // rows left in the current row group (callee-saved)
  const Opmask k_tail = k1;
  const Opmask k_sub = k2;
  const Opmask k_grp2 = k3;

  Xmm vec(int idx) const {
    if (tt_.vec_bytes == 64) return Zmm(idx);
    return Ymm(idx);
  }
  Xmm v_w(int i = 0) const { return vec(i); }      // widened weights (two for 64-weight steps)
  Xmm v_t(int i = 0) const { return vec(2 + i); }  // decode temporaries
  Xmm v_scale() const { return vec(4); }           // broadcast block scale
  Xmm v_c(int i) const { return vec(5 + i); }      // decode constants 0..4
  // accumulators: acc(m, j) per block (or per row when unscaled), tot(m, j)
  // running totals of scaled blocks
  Xmm acc(int m, int j) const { return vec(tt_.acc_first + m * plan_.na + j); }
  Xmm tot(int m, int j = 0) const {
    return scaled_ ? vec(tt_.acc_first + key_.tokens * plan_.na + m * plan_.nt + j) : acc(m, 0);
  }

  void emit_body() {
    phase("prologue");
    push(reg_tmp);
    push(reg_rows);
    push(reg_pfd);
    push(reg_stab);
    push(reg_g);
    push(reg_rg);
    mov(reg_wt, ptr[reg_args + offsetof(GemvArgs, w)]);
    mov(reg_pfd, ptr[reg_args + offsetof(GemvArgs, w_prefetch)]);
    sub(reg_pfd, reg_wt);
    mov(reg_s0, ptr[reg_args + offsetof(GemvArgs, scales)]);
    if (fmt_ == Format::nvfp4) mov(reg_g, ptr[reg_args + offsetof(GemvArgs, row_scales)]);
    if (byte_scales(fmt_) && !nib128_) lea(reg_stab, ptr[rip + l_stab_]);
    mov(reg_x0, ptr[reg_args + offsetof(GemvArgs, x)]);
    mov(reg_y, ptr[reg_args + offsetof(GemvArgs, y)]);
    emit_constants();
    sub(rsp, stash_bytes());
    if (fmt_ == Format::fp8_block) emit_scales_to_stack();
    if (nib128_) {
      reserve_row_scales();
      lea(reg_rs, ptr[rsp + widen_end()]);  // the first row widens a batch
    }

    // Rows in groups of group_rows(): each row leaves its total vectors in the
    // stash, and each group's horizontal sums run together (see reduce_group).
    Label l_row, l_next;
    const int rem = int(key_.rows % group_rows());
    mov(reg_rows, key_.rows);
    lea(reg_st, ptr[rsp + stash_off()]);
    mov(reg_rg, group_rows());
    L(l_row);
    if (nib128_) {
      Label l_widened;
      lea(reg_kb, ptr[rsp + widen_end()]);
      cmp(reg_rs, reg_kb);
      jne(l_widened, T_NEAR);
      widen_batch();
      L(l_widened);
    }
    emit_row();
    add(reg_wt, row_bytes_);
    if (byte_scales(fmt_)) add(reg_s0, key_.scale_stride);  // one scale row per weight row
    if (nib128_) add(reg_rs, row_scale_bytes());
    add(reg_st, key_.tokens * vbytes());
    dec(reg_rg);
    jnz(l_next, T_NEAR);
    if (key_.rows >= group_rows()) {
      reduce_group(group_rows());
      lea(reg_st, ptr[rsp + stash_off()]);
      mov(reg_rg, group_rows());
    }
    L(l_next);
    dec(reg_rows);
    jnz(l_row, T_NEAR);
    if (rem > 0) reduce_group(rem);

    phase("epilogue");
    if (fmt_ == Format::fp8_block) add(rsp, scale_stack_bytes());
    if (nib128_) add(rsp, row_scale_stack_bytes());
    add(rsp, stash_bytes());
    vzeroupper();
    pop(reg_rg);
    pop(reg_g);
    pop(reg_stab);
    pop(reg_pfd);
    pop(reg_rows);
    pop(reg_tmp);
    ret();
    emit_data();
  }

  void emit_constants() {
    if (nib128_) {  // the e2m1 -> bf16 word table (twice), the vpermps index of the chunk scale vector
      vmovdqu16(v_c(0), ptr[rip + l_nib_tbl_]);
      vmovdqu32(v_c(1), ptr[rip + l_pair_idx_]);
      // widen_row's constants: the e4m3 -> fp16 mask (nvfp4); 2^-127, the inf
      // pattern and NaN (e8m0 codes 0 and 255)
      if (fmt_ == Format::nvfp4) {
        vpbroadcastd(v_c(2), ptr[rip + l_e4m3_fp16_mask_]);
      } else {
        vpbroadcastd(v_c(2), ptr[rip + l_e8m0_min_]);
        vpbroadcastd(v_c(3), ptr[rip + l_e8m0_nan_ + 4]);
        vpbroadcastd(v_c(4), ptr[rip + l_e8m0_nan_]);
      }
      return;
    }
    if (plan_.gpb == 2) {
      mov(reg_tmp.cvt32(), kGroup2Lanes);
      kmovw(k_grp2, reg_tmp.cvt32());
    }
    if (q4x4_) {  // the q - 8 -> bf16 word table (twice); lanes of blocks 0..3 of a 4-block chunk
      vmovdqu16(v_c(0), ptr[rip + l_nib_tbl_]);
      vmovdqu8(v_c(1), ptr[rip + l_q4_qidx_]);
      vmovdqu16(v_c(2), ptr[rip + l_q4_didx_]);
      for (int b = 0; b < 4; ++b) {
        mov(reg_tmp.cvt32(), 0xF << (4 * b));
        kmovw(Opmask(b == 0 ? 6 : 2 + b), reg_tmp.cvt32());
      }
      return;
    }
    if (fmt_ == Format::q4_0 || is_e2m1(fmt_)) {
      broadcast_u32(v_c(0), 0x0F, reg_tmp.cvt32());  // nibble mask; other constants are read from data
      return;
    }
    if (!is_e4m3(fmt_) && !vbmi_lut_) return;  // bf16, q8_0; e5m2 on the fp16 path needs none
    if (vbmi_lut_) {
      // bf16 low and high bytes of e4m3 magnitudes 0..127, and the sign mask.
      vmovdqu8(v_c(0), ptr[rip + l_lut_]);
      vmovdqu8(v_c(1), ptr[rip + l_lut_ + 64]);
      vmovdqu8(v_c(2), ptr[rip + l_lut_ + 128]);
      vmovdqu8(v_c(3), ptr[rip + l_lut_ + 192]);
      broadcast_u32(v_c(4), 0x80808080u, reg_tmp.cvt32());
    } else if (isa_ == Isa::avx512_bf16) {
      broadcast_u32(v_c(0), 0x87F087F0u, reg_tmp.cvt32());  // sign + exponent/mantissa bits after << 4
      broadcast_u32(v_c(1), 0x3C003C00u, reg_tmp.cvt32());  // exponent bias 120 << 7
      broadcast_u32(v_c(2), 0x00780078u, reg_tmp.cvt32());  // e4m3 exponent field
      vmovdqu16(v_c(3), ptr[rip + l_sub_tbl_]);
      broadcast_u32(v_c(4), 0x80008000u, reg_tmp.cvt32());
    } else {
      broadcast_u32(v_c(0), 0xBF80BF80u, reg_tmp.cvt32());  // keep sign and e4m3 bits after << 7
    }
  }

  void emit_f32(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    dd(u);
  }

  void emit_data() {
    phase("data");
    align(64);
    L(l_hsum_idx_);  // lane of row j after reduce_group's tree
    for (int j = 0; j < group_rows(); ++j)
      dd(uint32_t(group_rows() == 16 ? 4 * (j % 4) + j / 4 : 4 * (j % 2) + j / 2));
    align(64);
    const bool blend = is_e4m3(fmt_) && isa_ == Isa::avx512_bf16 && !vbmi_lut_;
    if (!vbmi_lut_ && !blend && !byte_scales(fmt_) && fmt_ != Format::q4_0) return;
    if (nib128_) {
      // vpermw reads 5 index bits; bit 4 is the next nibble's low bit, so the 16
      // entries appear twice.
      L(l_nib_tbl_);
      for (int i = 0; i < 32; ++i) dw(formats::f32_to_bf16(formats::e2m1_to_f32(uint8_t(i & 15))));
      // vpermps index of a chunk's scale vector: dword pairs (nvfp4, group q on
      // dwords 2q, 2q + 1) or quads (mxfp4, group g on dwords 4g..4g+3).
      L(l_pair_idx_);
      for (int i = 0; i < 16; ++i) dd(uint32_t(fmt_ == Format::nvfp4 ? i / 2 : i / 4));
      L(l_e4m3_fp16_mask_);
      dd(0xBF80BF80u);
      L(l_e8m0_min_);
      dd(0x00400000u);  // 2^-127
      L(l_e8m0_nan_);
      dd(0x7FC00000u);  // NaN, then the pattern (255 << 23) of code 255
      dd(0x7F800000u);
    } else if (q4x4_) {
      L(l_nib_tbl_);
      for (int i = 0; i < 32; ++i) dw(formats::f32_to_bf16(float((i & 15) - 8)));
      // A full chunk is read as bytes [0, 64) and [8, 72). Quant byte i of block b
      // is chunk byte 2 + 18b + i: a vpermt2b index into that pair (64 + j: byte 8 + j).
      L(l_q4_qidx_);
      for (int j = 0; j < 64; ++j) {
        const int src = 2 + 18 * (j / 16) + j % 16;
        db(uint8_t(src < 64 ? src : 64 + src - 8));
      }
      // The vpermw index of d (word 9b of the chunk) on the 4 dwords of lane b.
      L(l_q4_didx_);
      for (int w = 0; w < 32; ++w) dw(uint16_t(9 * ((w / 4) % 4)));
    } else if (fmt_ == Format::q4_0) {
      L(l_q4_zero_);  // 16 dwords of 8
      for (int i = 0; i < 16; ++i) dd(8);
    }
    if (is_e2m1(fmt_) && !nib128_) {
      L(l_e2m1_);  // fp32 of the 16 e2m1 codes, then 8 dwords of the sign bit 8 (avx2)
      for (int i = 0; i < 16; ++i) emit_f32(formats::e2m1_to_f32(uint8_t(i)));
      L(l_e2m1_sign_);
      for (int i = 0; i < 8; ++i) dd(8);
    }
    if (byte_scales(fmt_) && !nib128_) {
      // fp32 of every scale code: e8m0 2^(s-127) (0 subnormal, 255 NaN) or e4m3
      L(l_stab_);
      for (int i = 0; i < 256; ++i)
        emit_f32(fmt_ == Format::nvfp4 ? formats::e4m3_to_f32(uint8_t(i)) : formats::e8m0_to_f32(uint8_t(i)));
    }
    if (vbmi_lut_) {
      L(l_lut_);
      for (int half = 0; half < 2; ++half)
        for (int i = 0; i < 128; ++i) {
          // q8_0: the magnitude of the int8 (vpabsb), with 128 (from -128) at index 0
          const float v = fmt_ == Format::q8_0 ? float(i == 0 ? 128 : i)
                          : is_e4m3(fmt_)      ? formats::e4m3_to_f32(uint8_t(i))
                                               : formats::e5m2_to_f32(uint8_t(i));
          const uint16_t b = formats::f32_to_bf16(v);  // exact: 8-bit values fit bf16
          db(half == 0 ? (b & 0xFF) : (b >> 8));
        }
    } else if (blend) {
      L(l_sub_tbl_);
      // bf16 of e4m3 subnormal magnitudes m * 2^-9, indexed by the low 5 bits (m = low 3).
      for (int i = 0; i < 32; ++i) dw(formats::f32_to_bf16(float(i & 7) / 512.0f));
    }
  }

  // Software prefetch of a later call: a code region that reads `span` bytes
  // from the cursor prefetches the lines at cursor + pfd + 0, 64, ..., spread
  // over its steps, so consecutive regions leave no line out whatever the
  // block size (GGUF blocks of 18 and 34 bytes, 4-bit steps of 16).
  // Bytes of the later call per prefetch instruction.
  int pf_stride() const { return bf16_one_ ? kSparsePrefetchBytes : 64; }
  void start_prefetch_span(int64_t span) {
    pf_next_ = 0;
    pf_span_ = span;
  }
  // The next prefetch pair: the later call's line, and this stream's line
  // kNearPrefetchBytes ahead.
  void emit_prefetch() {
    prefetcht1(ptr[reg_wk + reg_pfd + pf_next_]);
    prefetcht1(ptr[reg_wk + pf_next_ + kNearPrefetchBytes]);
    pf_next_ += pf_stride();
  }
  void finish_prefetch_span() {
    while (pf_next_ < pf_span_) emit_prefetch();
  }

  // Byte displacements of the block being emitted inside an unrolled loop body.
  void set_block_disp(int j) {
    dw_ = j * block_bytes();
    dx_ = int64_t(j) * plan_.block * xbytes_;
    ds_ = j * scale_bytes();
  }

  // One row over all of K. Scaled formats unroll `unroll_` blocks per loop
  // iteration; block b adds into running total b % plan_.nt.
  void emit_row() {
    const int64_t nfull = key_.k / plan_.block;
    const int tail = int(key_.k % plan_.block);
    if (scaled_)
      for (int m = 0; m < key_.tokens; ++m)
        for (int j = 0; j < plan_.nt; ++j) vxorps(tot(m, j), tot(m, j), tot(m, j));
    else
      zero_accs();
    mov(reg_wk, reg_wt);
    mov(reg_xk, reg_x0);
    if (fmt_ == Format::fp8_block)
      mov(reg_sk, rsp);  // the call's fp32 block scales
    else if (nib128_)
      mov(reg_sk, reg_rs);  // this row's group scales, widened to fp32 by widen_batch
    else
      mov(reg_sk, reg_s0);
    const int64_t iters = nfull / unroll_;
    const int rem = int(nfull % unroll_);
    if (iters > 0) {
      Label l_blk;
      mov(reg_kb, iters);
      L(l_blk);
      start_prefetch_span(unroll_ * block_bytes());
      for (int j = 0; j < unroll_; ++j) {
        set_block_disp(j);
        emit_block(plan_.block, j % std::max(1, plan_.nt));
      }
      finish_prefetch_span();
      set_block_disp(0);
      add(reg_wk, unroll_ * block_bytes());
      add(reg_xk, int64_t(unroll_) * plan_.block * xbytes_);
      if (scaled_ && scale_bytes() > 0) add(reg_sk, unroll_ * scale_bytes());
      dec(reg_kb);
      jnz(l_blk, T_NEAR);
    }
    start_prefetch_span(row_bytes_ - (row_bytes_ / block_bytes() - rem) * block_bytes());
    for (int j = 0; j < rem; ++j) {
      set_block_disp(j);
      emit_block(plan_.block, j % std::max(1, plan_.nt));
    }
    if (tail > 0) {
      phase("tail");
      set_block_disp(rem);
      emit_block(tail, rem % std::max(1, plan_.nt));
    }
    finish_prefetch_span();
    set_block_disp(0);
    phase("store");
    if (scaled_)
      sum_tots();
    else
      sum_accs();
    stash_row();
  }

  // ---- row groups and their horizontal sums ----
  // A group is one vector's worth of rows (16 or 8). Each row stores its
  // per-token total vector in the stash; reduce_group then sums a group's
  // vectors together with shuffles: 45 instructions for 16 rows instead of 9
  // per row. Every row's lanes are added in the same pairs as a per-row
  // extract-and-add tree (lane i + lane i + 8, then i + 4, i + 2, i + 1), so the
  // sums are those of that tree.
  int group_rows() const { return tt_.vec_bytes / 4; }
  int vbytes() const { return tt_.vec_bytes; }
  // G rows x tokens vectors, then one vector to spill a partial group's sums.
  int stash_bytes() const { return (group_rows() * key_.tokens + 1) * vbytes(); }
  int stash_off() const {
    return (fmt_ == Format::fp8_block ? scale_stack_bytes() : 0) + (nib128_ ? row_scale_stack_bytes() : 0);
  }
  int spill_off() const { return stash_off() + group_rows() * key_.tokens * vbytes(); }
  Address stash_slot(int row, int m) const {
    return ptr[rsp + stash_off() + (row * key_.tokens + m) * vbytes()];
  }

  // The row's total vector of each token into its stash slot; the fp16
  // widening's 2^-8 is undone here.
  void stash_row() {
    const bool fp16_trick = (is_e4m3(fmt_) && fma_f32_) || (nib128_ && fmt_ == Format::nvfp4);
    if (fp16_trick) broadcast_u32(v_scale(), 0x43800000u, reg_tmp.cvt32());  // 256.0f
    for (int m = 0; m < key_.tokens; ++m) {
      if (fp16_trick) {
        vmulps(v_w(), tot(m), v_scale());
        vmovups(ptr[reg_st + m * vbytes()], v_w());
      } else {
        vmovups(ptr[reg_st + m * vbytes()], tot(m));
      }
    }
  }

  // Sums of the group's first n rows to y[m * rows + r] (nvfp4: times each
  // row's global). Rows n.. of a partial group enter the tree as zeros.
  void reduce_group(int n) {
    phase("reduce");
    const int G = group_rows();
    auto in = [&](int i) { return vec(tt_.acc_first + i); };  // G inputs: accumulator registers
    const Xmm t0 = v_w(0), t1 = v_w(1), idx = v_t(0);
    const bool zmm = G == 16;
    const int last = zmm ? 3 : 2;  // index of the neighbouring-lanes level
    vmovups(idx, ptr[rip + l_hsum_idx_]);
    for (int m = 0; m < key_.tokens; ++m) {
      for (int i = 0; i < G; ++i) {
        if (i < n)
          vmovups(in(i), stash_slot(i, m));
        else
          vxorps(in(i), in(i), in(i));
      }
      // Level l pairs inputs (2j, 2j + 1) into input j: first the upper and
      // lower halves of each vector, then quarters (zmm), then pairs of lanes,
      // then neighbouring lanes.
      for (int cnt = G, level = 0; cnt > 1; cnt /= 2, ++level) {
        for (int j = 0; j < cnt / 2; ++j) {
          const Xmm a = in(2 * j), b = in(2 * j + 1);
          if (level == 0 && zmm) {
            vshuff64x2(Zmm(t0.getIdx()), Zmm(a.getIdx()), Zmm(b.getIdx()), 0x44);  // [a lo256 | b lo256]
            vshuff64x2(Zmm(t1.getIdx()), Zmm(a.getIdx()), Zmm(b.getIdx()), 0xEE);  // [a hi256 | b hi256]
          } else if (level == 0) {
            vperm2f128(Ymm(t0.getIdx()), Ymm(a.getIdx()), Ymm(b.getIdx()), 0x20);  // [a lo128 | b lo128]
            vperm2f128(Ymm(t1.getIdx()), Ymm(a.getIdx()), Ymm(b.getIdx()), 0x31);  // [a hi128 | b hi128]
          } else if (level == 1 && zmm) {
            vshuff32x4(Zmm(t0.getIdx()), Zmm(a.getIdx()), Zmm(b.getIdx()), 0x88);  // 128-bit lanes 0, 2
            vshuff32x4(Zmm(t1.getIdx()), Zmm(a.getIdx()), Zmm(b.getIdx()), 0xDD);  // 128-bit lanes 1, 3
          } else if (level < last) {
            vshufps(t0, a, b, 0x44);  // elements 0, 1 of each 128-bit lane
            vshufps(t1, a, b, 0xEE);  // elements 2, 3
          } else {
            vshufps(t0, a, b, 0x88);  // elements 0, 2
            vshufps(t1, a, b, 0xDD);  // elements 1, 3
          }
          vaddps(in(j), t0, t1);
        }
      }
      // Lane 4q + p of the result holds row q + 4p (zmm) or 2p + q (ymm).
      if (zmm)
        vpermps(Zmm(in(0).getIdx()), Zmm(idx.getIdx()), Zmm(in(0).getIdx()));
      else
        vpermps(Ymm(in(0).getIdx()), Ymm(idx.getIdx()), Ymm(in(0).getIdx()));
      if (n == G) {
        if (fmt_ == Format::nvfp4) vmulps(in(0), in(0), ptr[reg_g]);
        vmovups(ptr[reg_y + m * key_.rows * 4], in(0));
      } else {
        vmovups(ptr[rsp + spill_off()], in(0));
        const Xmm x0 = Xmm(t0.getIdx());
        for (int i = 0; i < n; ++i) {
          vmovss(x0, ptr[rsp + spill_off() + i * 4]);
          if (fmt_ == Format::nvfp4) vmulss(x0, x0, ptr[reg_g + i * 4]);
          vmovss(ptr[reg_y + m * key_.rows * 4 + i * 4], x0);
        }
      }
    }
    add(reg_y, n * 4);
    if (fmt_ == Format::nvfp4) add(reg_g, n * 4);
  }

  // fp8_block: one scale row serves every row of the call; widen it to fp32 on
  // the stack once so each block's scale is a single broadcast operand.
  int64_t scale_blocks() const { return (key_.k + kBlock - 1) / kBlock; }
  int scale_stack_bytes() const { return int((scale_blocks() * 4 + 63) / 64 * 64); }
  void emit_scales_to_stack() {
    sub(rsp, scale_stack_bytes());
    Label l_scale;
    xor_(reg_kb, reg_kb);
    L(l_scale);
    if (key_.scale_dtype == 1) {
      mov(reg_tmp.cvt32(), ptr[reg_s0 + reg_kb * 4]);
    } else {
      movzx(reg_tmp.cvt32(), word[reg_s0 + reg_kb * 2]);
      shl(reg_tmp.cvt32(), 16);
    }
    mov(ptr[rsp + reg_kb * 4], reg_tmp.cvt32());
    inc(reg_kb);
    cmp(reg_kb, scale_blocks());
    jb(l_scale);
  }

  // e2m1 chunk decode: each row's group scales are widened to fp32 once, on
  // the stack (e8m0: (s << 23) with 0 -> 2^-127 and 255 -> NaN; e4m3: fp16 bits
  // of s * 2^-8 through vcvtph2ps, the 2^-8 undone at the store), so a chunk's
  // scale vector is one vpermps. Rows are widened kWidenRows at a time, before
  // the first of them runs, which measured faster than one row at a time just
  // before its chunks (one core, weights in L2, kernels alternating in one
  // process: mxfp4 and nvfp4 at K=768, one token, +3-15%; batches of 2 to 16
  // rows alike; 4 tokens unchanged). The batch starts zeroed and 64 zero bytes
  // of slack follow it (a chunk's vpermps reads a whole vector).
  int64_t row_groups() const { return key_.k / key_.group; }
  int row_scale_bytes() const { return int((row_groups() + 15) / 16 * 64); }
  // Rows per batch: kWidenRows, within 16 KiB of stack.
  int widen_rows() const {
    const int fit = std::max(1, 16384 / row_scale_bytes());
    return int(std::min<int64_t>({int64_t(kWidenRows), int64_t(fit), int64_t(key_.rows)}));
  }
  int widen_end() const { return widen_rows() * row_scale_bytes(); }
  int row_scale_stack_bytes() const { return widen_end() + 64; }
  void reserve_row_scales() {
    sub(rsp, row_scale_stack_bytes());
    vpxord(Zmm(0), Zmm(0), Zmm(0));
    for (int off = 0; off < row_scale_stack_bytes(); off += 64) vmovups(ptr[rsp + off], Zmm(0));
  }
  // The scales of the next min(widen_rows(), rows left) rows, from reg_s0 on,
  // to the batch at rsp; reg_rs points at the first.
  void widen_batch() {
    phase("widen");
    const Reg64 src = reg_wk, dst = reg_xk;  // row cursors, free between rows
    mov(reg_kb, widen_rows());
    cmp(reg_rows, reg_kb);
    cmovb(reg_kb, reg_rows);
    mov(src, reg_s0);
    mov(dst, rsp);
    Label l_row;
    L(l_row);
    widen_row(src, dst);
    add(src, key_.scale_stride);
    add(dst, row_scale_bytes());
    dec(reg_kb);
    jnz(l_row, T_NEAR);
    mov(reg_rs, rsp);
  }
  void widen_row(const Reg64& src, const Reg64& dst) {
    const Zmm t = Zmm(0);
    for (int64_t g = 0; g < row_groups(); g += 16) {
      const int64_t n = std::min<int64_t>(16, row_groups() - g);
      const Xmm xt = Xmm(0);
      if (n < 16) {  // only the row's scale bytes: the rest of the scale row may be padding
        mov(reg_tmp, (uint64_t(1) << n) - 1);
        kmovq(k_tail, reg_tmp);
        vmovdqu8(xt | k_tail | T_z, ptr[src + g]);
      } else {
        vmovdqu8(xt, ptr[src + g]);
      }
      if (fmt_ == Format::nvfp4) {
        vpmovsxbw(Ymm(0), xt);
        vpsllw(Ymm(0), Ymm(0), 7);
        vpandd(Ymm(0), Ymm(0), Ymm(v_c(2).getIdx()));
        vcvtph2ps(t, Ymm(0));
      } else {
        vpmovzxbd(t, xt);
        vpslld(t, t, 23);
        vpmaxud(t, t, Zmm(v_c(2).getIdx()));         // code 0: 2^-127 (every other code is above it)
        vpcmpeqd(k_sub, t, Zmm(v_c(3).getIdx()));    // code 255 gave the inf pattern
        vmovdqa32(t | k_sub, Zmm(v_c(4).getIdx()));  // NaN
      }
      vmovups(ptr[dst + g * 4], t);
    }
  }

  // Weight bytes of one scale block (GGUF blocks carry their d inline).
  int block_bytes() const {
    if (is_e2m1(fmt_)) return plan_.block / 2;
    if (fmt_ == Format::q8_0) return 34 * plan_.block / 32;
    if (fmt_ == Format::q4_0) return 18 * plan_.block / 32;
    return plan_.block * wbytes_;
  }
  // Byte offset of element `off` of the current block from the cursor.
  int w_byte(int off) const {
    if (fmt_ == Format::q8_0) return dw_ + 34 * (off / 32) + 2 + off % 32;
    if (fmt_ == Format::q4_0) return q4x4_ ? dw_ + 18 * (off / 32) + 2 : dw_ + 2 + off % 16;
    if (is_e2m1(fmt_)) return dw_ + off / 2;
    return dw_ + off * wbytes_;
  }

  int scale_bytes() const {
    if (fmt_ == Format::fp8_block) return 4;  // widened to fp32 on the stack
    if (nib128_) return 4 * plan_.gpb;        // the row's group scales widened to fp32 on the stack
    if (is_gguf(fmt_)) return 0;
    if (byte_scales(fmt_)) return plan_.gpb;
    return key_.scale_dtype == 1 ? 4 : 2;
  }

  void zero_accs() {
    for (int m = 0; m < key_.tokens; ++m)
      for (int j = 0; j < plan_.na; ++j) vxorps(acc(m, j), acc(m, j), acc(m, j));
  }
  // acc(m, 0) = sum over j, as a fixed pairwise tree.
  void sum_accs() {
    for (int width = 1; width < plan_.na; width *= 2)
      for (int m = 0; m < key_.tokens; ++m)
        for (int j = 0; j + width < plan_.na; j += 2 * width) vaddps(acc(m, j), acc(m, j), acc(m, j + width));
  }
  void sum_tots() {
    for (int width = 1; width < plan_.nt; width *= 2)
      for (int m = 0; m < key_.tokens; ++m)
        for (int j = 0; j + width < plan_.nt; j += 2 * width) vaddps(tot(m, j), tot(m, j), tot(m, j + width));
  }

  // n elements (<= plan_.block) starting at the cursors; the last step may be partial.
  // Scaled blocks end with tot(m, ti) += (sum of the block's accumulators) * scale.
  void emit_block(int n, int ti) {
    if (scaled_) zero_accs();
    int v = 0;  // vector index inside the block: picks the accumulator
    for (int s = 0; s * plan_.step < n; ++s) {
      const int off = s * plan_.step;
      const int cnt = std::min(plan_.step, n - off);
      if (cnt < plan_.step && isa_ != Isa::avx2) set_tail_mask(cnt);
      // Each line read is matched by a prefetch of the same line of a later
      // call (into L2: measured ~1.5x faster cold than L1 prefetches here), or
      // one per kSparsePrefetchBytes in bf16 one-token kernels, and by one of
      // the line kNearPrefetchBytes ahead.
      while (pf_next_ <= w_byte(off) && pf_next_ < pf_span_) emit_prefetch();
      if (cnt == plan_.step) phase("decode");
      const int nvec = load_weights(off, cnt);
      if (cnt == plan_.step) phase("fma");
      for (int i = 0; i < nvec; ++i, ++v)
        for (int m = 0; m < key_.tokens; ++m)
          multiply(acc(m, v % plan_.na), v_w(i), m, off + i * plan_.vec_elems);
    }
    if (scaled_) {
      if (n == plan_.block) phase("block-scale");
      sum_accs();
      apply_block_scale(n, ti);
    }
  }

  void set_tail_mask(int cnt) {
    mov(reg_tmp, cnt >= 64 ? ~uint64_t(0) : (uint64_t(1) << cnt) - 1);
    kmovq(k_tail, reg_tmp);
  }

  Address w_addr(int off) const { return ptr[reg_wk + w_byte(off)]; }
  Address x_addr(int m, int off) const { return ptr[reg_xk + m * xstride_bytes_ + dx_ + off * xbytes_]; }

  // Exact partial load of `bytes` (< 16) bytes into an xmm for the avx2 tail.
  void load_partial_xmm(const Xmm& dst, int off, int bytes) {
    const RegExp base = reg_wk + w_byte(off);
    int done = 0;
    if (bytes >= 8) {
      vmovq(dst, ptr[base]);
      done = 8;
    } else if (bytes >= 4) {
      vmovd(dst, ptr[base]);
      done = 4;
    } else {
      vpxor(dst, dst, dst);
    }
    if (bytes - done >= 4) {
      vpinsrd(dst, dst, ptr[base + done], done / 4);
      done += 4;
    }
    if (bytes - done >= 2) {
      vpinsrw(dst, dst, ptr[base + done], done / 2);
      done += 2;
    }
    if (bytes - done >= 1) vpinsrb(dst, dst, ptr[base + done], done);
  }

  // Leaves `cnt` widened weights of row r at `off` in v_w(0..n-1) and returns n
  // (zeros beyond cnt).
  int load_weights(int off, int cnt) {
    const bool partial = cnt < plan_.step;
    const Xmm xt = Xmm(v_t().getIdx());
    const Ymm yt = Ymm(v_t().getIdx());
    if (fmt_ == Format::bf16) {
      switch (isa_) {
        case Isa::avx2:
          if (partial) {
            load_partial_xmm(xt, off, cnt * 2);
            vpmovzxwd(v_w(), xt);
          } else {
            vpmovzxwd(v_w(), w_addr(off));
          }
          vpslld(v_w(), v_w(), 16);
          break;
        case Isa::avx512:
          if (partial) {
            vmovdqu16(yt | k_tail | T_z, w_addr(off));
            vpmovzxwd(v_w(), yt);
          } else {
            vpmovzxwd(v_w(), w_addr(off));
          }
          vpslld(v_w(), v_w(), 16);
          break;
        case Isa::avx512_bf16:
          if (partial)
            vmovdqu16(v_w() | k_tail | T_z, w_addr(off));
          else
            vmovdqu16(v_w(), w_addr(off));
          break;
        default: break;
      }
      return 1;
    }
    if (vbmi_lut_ && fmt_ == Format::q8_0) {
      emit_q8_lut64(off, cnt);
      return 2;
    }
    if (vbmi_lut_) {  // any 8-bit float: the tables hold its bf16 bytes
      emit_e4m3_lut64(off, partial);
      return 2;
    }
    if (fmt_ == Format::q8_0) {  // int8 quants at byte 2 of the block, exact in fp32
      vpmovsxbd(v_w(), w_addr(off));
      vcvtdq2ps(v_w(), v_w());
      return 1;
    }
    if (nib128_) {
      // 64 bytes -> 4 x 32 bf16: vector j is the word table at nibble j of every
      // 16-bit word (word >> 4j; vpermw reads 5 bits, the table is doubled).
      // Shifts rather than byte shuffles: shuffles are the scarce port here.
      if (partial) {  // K % 128 != 0: load the row's last bytes, the rest decodes to +0
        mov(reg_tmp, (uint64_t(1) << (cnt / 2)) - 1);  // cnt < 128: at most 63 bytes
        kmovq(k_tail, reg_tmp);
        vmovdqu8(Zmm(0) | k_tail | T_z, w_addr(off));
      } else {
        vmovdqu8(Zmm(0), w_addr(off));
      }
      for (int j = 1; j < 4; ++j) vpsrlw(Zmm(j), Zmm(0), 4 * j);
      for (int j = 0; j < 4; ++j) vpermw(Zmm(j), Zmm(j), Zmm(v_c(0).getIdx()));
      return 4;
    }
    if (q4x4_) {
      // q4_0, 4 blocks of 18 bytes -> 4 x 32 bf16: the 16 quant bytes of block b
      // go to 128-bit lane b, then as e2m1: vector j = table[word >> 4j]. A tail
      // of 1-3 blocks leaves the other lanes zero (the VEX load clears them).
      if (q4_gathers(cnt)) {
        // Two loads of the 72-byte chunk and two permutes instead of four loads
        // (three of them inserts) and four masked broadcasts of d: the chunk's
        // fp32 d vector is left in v_scale for apply_block_scale.
        vmovdqu8(Zmm(0), ptr[reg_wk + dw_]);
        vmovdqu8(Zmm(1), ptr[reg_wk + dw_ + 8]);
        vpermw(Zmm(v_scale().getIdx()), Zmm(v_c(2).getIdx()), Zmm(0));
        vcvtph2ps(Zmm(v_scale().getIdx()), Ymm(v_scale().getIdx()));
        vpermt2b(Zmm(0), Zmm(v_c(1).getIdx()), Zmm(1));
      } else {
        vmovdqu(Xmm(0), ptr[reg_wk + w_byte(off)]);
        for (int b = 1; b < (cnt + 31) / 32; ++b)
          vinserti32x4(Zmm(0), Zmm(0), ptr[reg_wk + w_byte(off + 32 * b)], b);
      }
      for (int j = 1; j < 4; ++j) vpsrlw(Zmm(j), Zmm(0), 4 * j);
      for (int j = 0; j < 4; ++j) vpermw(Zmm(j), Zmm(j), Zmm(v_c(0).getIdx()));
      return 4;
    }
    if (is_e2m1(fmt_)) {  // e2m1 pairs, low nibble = even k; activations: evens then odds
      const Xmm lo = v_w(0), hi = v_w(1), t = v_t(0);
      if (partial) {  // nvfp4 K % 32 == 16 on avx512: 8 bytes, the upper lanes decode to +0
        vmovq(xt, w_addr(off));
        vpmovzxbd(t, xt);
      } else {
        vpmovzxbd(t, w_addr(off));
      }
      vpsrld(hi, t, 4);
      if (tt_.vec_bytes == 64) {
        vpandd(lo, t, v_c(0));
        vpermps(Zmm(lo.getIdx()), Zmm(lo.getIdx()),
                ptr[rip + l_e2m1_]);  // 16 entries: the index carries the sign
        vpermps(Zmm(hi.getIdx()), Zmm(hi.getIdx()), ptr[rip + l_e2m1_]);
      } else {  // 8-entry vpermps: magnitude from the table, sign bit 3 moved to bit 31
        const Xmm s = v_t(1);
        vpand(lo, t, v_c(0));
        for (const Xmm& w : {lo, hi}) {
          vpand(s, w, ptr[rip + l_e2m1_sign_]);
          vpslld(s, s, 28);
          vpermps(Ymm(w.getIdx()), Ymm(w.getIdx()), ptr[rip + l_e2m1_]);
          vorps(w, w, s);
        }
      }
      return 2;
    }
    if (fmt_ == Format::q4_0) {  // byte j holds element j (low nibble) and j + 16 (high nibble)
      vpmovzxbd(v_w(), w_addr(off));
      if (off >= 16) vpsrld(v_w(), v_w(), 4);
      if (tt_.vec_bytes == 64)
        vpandd(v_w(), v_w(), v_c(0));
      else
        vpand(v_w(), v_w(), v_c(0));
      vpsubd(v_w(), v_w(), ptr[rip + l_q4_zero_]);
      vcvtdq2ps(v_w(), v_w());
      return 1;
    }
    if (fmt_ == Format::mxfp8_e5m2) {  // e5m2 is the high byte of an fp16: (b << 8), vcvtph2ps
      if (isa_ == Isa::avx2) {
        const Xmm xw = Xmm(v_w().getIdx());
        if (partial) {
          load_partial_xmm(xt, off, cnt);
          vpmovzxbw(xw, xt);
        } else {
          vpmovzxbw(xw, w_addr(off));
        }
        vpsllw(xw, xw, 8);
      } else {  // avx512, or avx512_bf16 without VBMI (fp32 path)
        const Ymm yw = Ymm(v_w().getIdx());
        if (partial) {
          vmovdqu8(xt | k_tail | T_z, w_addr(off));
          vpmovzxbw(yw, xt);
        } else {
          vpmovzxbw(yw, w_addr(off));
        }
        vpsllw(yw, yw, 8);
      }
      if (tt_.vec_bytes == 32)
        vcvtph2ps(v_w(), Xmm(v_w().getIdx()));
      else
        vcvtph2ps(v_w(), Ymm(v_w().getIdx()));
      return 1;
    }
    // e4m3
    switch (isa_) {
      case Isa::avx2: {
        const Xmm xw = Xmm(v_w().getIdx());
        if (partial) {
          load_partial_xmm(xt, off, cnt);
          vpmovsxbw(xw, xt);
        } else {
          vpmovsxbw(xw, w_addr(off));
        }
        // fp16 bits of e4m3 * 2^-8: (sx(b) << 7) & 0xBF80
        vpsllw(xw, xw, 7);
        vpand(xw, xw, Xmm(v_c(0).getIdx()));
        vcvtph2ps(v_w(), xw);
        return 1;
      }
      case Isa::avx512: {
        const Ymm yw = Ymm(v_w().getIdx());
        if (partial) {
          vmovdqu8(xt | k_tail | T_z, w_addr(off));
          vpmovsxbw(yw, xt);
        } else {
          vpmovsxbw(yw, w_addr(off));
        }
        vpsllw(yw, yw, 7);
        vpand(yw, yw, Ymm(v_c(0).getIdx()));
        vcvtph2ps(v_w(), yw);
        return 1;
      }
      case Isa::avx512_bf16: emit_e4m3_blend32(off, partial); return 1;
      default: return 0;
    }
  }

  // q4_0 steps of cnt elements decoded by the two-load gather, which also leaves
  // the chunk's d vector in v_scale for apply_block_scale.
  bool q4_gathers(int cnt) const { return q4_vbmi_ && cnt == plan_.step; }

  // 64 8-bit floats (e4m3 or e5m2) -> 2 x 32 bf16 through byte tables: lo/hi = table[b & 127],
  // hi |= b & 0x80, then unpack; the activations are stored in that order
  // (XLayout::bf16_perm64). One load and two register copies: reading the bytes
  // three times (twice as table indices, once in vpternlogd) made the kernel 20-25%
  // slower on L2-resident weights, as 512-bit loads issue one per cycle here.
  void emit_e4m3_lut64(int off, bool partial) {
    const Zmm b = Zmm(v_w(1).getIdx()), lo = Zmm(v_t(0).getIdx()), hi = Zmm(v_t(1).getIdx());
    if (partial)
      vmovdqu8(b | k_tail | T_z, w_addr(off));
    else
      vmovdqu8(b, w_addr(off));
    vmovdqa64(lo, b);
    vmovdqa64(hi, b);
    vpermi2b(lo, Zmm(v_c(0).getIdx()), Zmm(v_c(1).getIdx()));
    vpermi2b(hi, Zmm(v_c(2).getIdx()), Zmm(v_c(3).getIdx()));
    vpternlogd(hi, b, Zmm(v_c(4).getIdx()), 0xF8);  // hi | (b & 0x80)
    vpunpcklbw(Zmm(v_w(0).getIdx()), lo, hi);
    vpunpckhbw(Zmm(v_w(1).getIdx()), lo, hi);
  }

  // q8_0, two 34-byte blocks -> 2 x 32 bf16 (XLayout::bf16_perm64): the quants
  // of block 0 in the low 256 bits, block 1 in the high; bf16 of |q| from the
  // byte tables (index 0 holds 128, for -128; q = 0 zeroes the high byte), the
  // sign from q. A tail of one block leaves the high half zero.
  void emit_q8_lut64(int off, int cnt) {
    const Zmm b = Zmm(v_scale().getIdx()), lo = Zmm(v_t(0).getIdx()), hi = Zmm(v_t(1).getIdx());
    vmovdqu8(Ymm(b.getIdx()), w_addr(off));  // EVEX: clears bits 256-511
    if (cnt > 32) vinserti64x4(b, b, w_addr(off + 32), 1);
    vpabsb(lo, b);
    vptestmb(k_sub, b, b);
    vmovdqa64(hi, lo);
    vpermi2b(lo, Zmm(v_c(0).getIdx()), Zmm(v_c(1).getIdx()));
    vpermi2b(hi | k_sub | T_z, Zmm(v_c(2).getIdx()), Zmm(v_c(3).getIdx()));
    vpternlogd(hi, b, Zmm(v_c(4).getIdx()), 0xF8);  // hi | (q & 0x80)
    vpunpcklbw(Zmm(v_w(0).getIdx()), lo, hi);
    vpunpckhbw(Zmm(v_w(1).getIdx()), lo, hi);
  }

  // 32 e4m3 bytes -> 32 bf16 with arithmetic for normals and a table blend for
  // exponent-0 codes (CPUs with AVX512_BF16 but no AVX512_VBMI).
  void emit_e4m3_blend32(int off, bool partial) {
    const Zmm zw = Zmm(v_w().getIdx());
    const Zmm zt = Zmm(v_t().getIdx());
    const Ymm yt = Ymm(v_t().getIdx());
    if (partial) {
      vmovdqu8(yt | k_tail | T_z, w_addr(off));
      vpmovsxbw(zt, yt);
    } else {
      vpmovsxbw(zt, w_addr(off));
    }
    // normal: ((sx << 4) & 0x87F0) + 0x3C00; exponent 0: table[m]; then | sign.
    vpsllw(zw, zt, 4);
    vpandd(zw, zw, Zmm(v_c(0).getIdx()));
    vpaddw(zw, zw, Zmm(v_c(1).getIdx()));
    vptestnmw(k_sub, zt, Zmm(v_c(2).getIdx()));
    vpermw(zw | k_sub, zt, Zmm(v_c(3).getIdx()));
    vpternlogd(zw, zt, Zmm(v_c(4).getIdx()), 0xF8);  // zw | (zt & 0x8000)
  }

  void multiply(const Xmm& a, const Xmm& w, int m, int off) {
    if (fma_f32_)
      vfmadd231ps(a, w, x_addr(m, off));
    else
      vdpbf16ps(a, w, x_addr(m, off));
  }

  // tot(m, ti) += acc(m, 0) * the block's scale (two scales on the lanes of a
  // two-group block; a tail block holding only the first group reads one).
  void apply_block_scale(int n, int ti) {
    if (vbmi_lut_ && fmt_ == Format::q8_0) {  // d of block 0 on lanes 0-7, of block 1 on 8-15 (or 0)
      if (n > 32) {
        vpbroadcastw(Ymm(v_scale().getIdx()), ptr[reg_wk + dw_]);
        vpbroadcastw(Ymm(v_scale().getIdx()) | k_grp2, ptr[reg_wk + dw_ + 34]);
      } else {
        vpbroadcastw(Xmm(v_scale().getIdx()), ptr[reg_wk + dw_]);  // clears the upper lanes
      }
      vcvtph2ps(Zmm(v_scale().getIdx()), Ymm(v_scale().getIdx()));
    } else if (q4x4_) {
      // The fp16 d of blocks 0..3 on their 128-bit lanes (missing blocks: 0);
      // load_weights already left a full chunk's in v_scale.
      if (!q4_gathers(n)) {
        const Ymm ys = Ymm(v_scale().getIdx());
        const int nb = (n + 31) / 32;
        vpxor(ys, ys, ys);
        for (int b = 0; b < nb; ++b)
          vpbroadcastw(ys | Opmask(b == 0 ? 6 : 2 + b), ptr[reg_wk + dw_ + 18 * b]);
        vcvtph2ps(Zmm(v_scale().getIdx()), ys);
      }
    } else if (is_gguf(fmt_)) {  // fp16 d at the start of the block
      const Xmm xs = Xmm(v_scale().getIdx());
      movzx(reg_tmp.cvt32(), word[reg_wk + dw_]);
      vmovd(xs, reg_tmp.cvt32());
      vcvtph2ps(xs, xs);
      vbroadcastss(v_scale(), xs);
    } else if (nib128_) {
      // The chunk's 4 (mxfp4) or 8 (nvfp4) fp32 group scales from the row's
      // widened scales, each on the lanes its group's elements were decoded into
      // (4 dwords each, or dword pairs). The 64-byte read may run past the row's
      // groups into the zeroed slack of the stack buffer.
      vpermps(Zmm(v_scale().getIdx()), Zmm(v_c(1).getIdx()), ptr[reg_sk + ds_]);
    } else if (byte_scales(fmt_)) {
      movzx(reg_tmp.cvt32(), byte[reg_sk + ds_]);
      vbroadcastss(v_scale(), ptr[reg_stab + reg_tmp * 4]);
      if (plan_.gpb == 2 && n > plan_.block / 2) {
        movzx(reg_tmp.cvt32(), byte[reg_sk + ds_ + 1]);
        vbroadcastss(v_scale() | k_grp2, ptr[reg_stab + reg_tmp * 4]);
      }
    } else if (fmt_ == Format::fp8_block) {
      // fp32 scale on the stack: an embedded broadcast on AVX-512, one load otherwise
      if (tt_.vec_bytes == 64) {
        for (int m = 0; m < key_.tokens; ++m) vfmadd231ps(tot(m, ti), acc(m, 0), ptr_b[reg_sk + ds_]);
        return;
      }
      vbroadcastss(v_scale(), ptr[reg_sk + ds_]);
    }
    for (int m = 0; m < key_.tokens; ++m) vfmadd231ps(tot(m, ti), acc(m, 0), v_scale());
  }

  KernelKey key_;
  Format fmt_;
  Isa isa_;
  TierTraits tt_;
  XLayout layout_;
  Plan plan_;
  bool scaled_;
  int wbytes_;
  int xbytes_;
  int64_t row_bytes_;
  int64_t xstride_bytes_;
  bool vbmi_lut_;        // 8-bit floats -> bf16 through two 128-entry byte tables (vpermi2b)
  bool q4x4_;            // q4_0, 4 blocks at a time -> bf16 through shifts + vpermw
  bool q4_vbmi_;         // q4x4_ full chunks: two loads and a vpermt2b (AVX512_VBMI)
  bool nib128_;          // e2m1: 64 bytes -> 4 vectors of bf16 through shifts + vpermw
  bool fma_f32_;         // fp32 weights and activations, vfmadd231ps (else bf16 pairs, vdpbf16ps)
  bool bf16_one_;        // bf16, one token: unrolled rows, sparse prefetch
  int unroll_ = 1;       // blocks per loop iteration
  int dw_ = 0;           // byte displacements of the block being emitted: weights,
  int64_t dx_ = 0;       // activations,
  int ds_ = 0;           // scales
  int64_t pf_next_ = 0;  // next line offset of the current region to prefetch
  int64_t pf_span_ = 0;  // bytes the current region reads
  Label l_hsum_idx_;     // vpermps index putting a row group's sums in row order
  Label l_sub_tbl_;
  Label l_lut_;
  Label l_stab_;
  Label l_q4_zero_;
  Label l_e2m1_;
  Label l_e2m1_sign_;
  Label l_nib_tbl_;
  Label l_q4_qidx_, l_q4_didx_;
  Label l_pair_idx_;
  Label l_e4m3_fp16_mask_;
  Label l_e8m0_min_;
  Label l_e8m0_nan_;
};

class GeneratedKernel : public Kernel {
 public:
  explicit GeneratedKernel(std::unique_ptr<GemvGenerator> gen) : gen_(std::move(gen)) {
    key_ = gen_->key();
    fn_ = gen_->getCode<GemvFn>();
    size_ = gen_->getSize();
    for (const CodePhase& p : gen_->phases()) phases_.emplace_back(p.offset, p.name);
  }

 private:
  std::unique_ptr<GemvGenerator> gen_;
};

}  // namespace

bool needs_vbmi(Isa isa, int32_t format, uint32_t flags) {
  return isa == Isa::avx512_bf16 && !(flags & kFlagNoVbmi) &&
         (x_layout(isa, format, flags) == XLayout::bf16_perm64 || format == 4 /* q4_0 */);
}

uint32_t runtime_flags(Isa isa, int32_t format, int32_t /*group*/) {
  // Without AVX512_VBMI the avx512_bf16 tier decodes without byte tables.
  return needs_vbmi(isa, format, 0) && !host_features().avx512_vbmi ? kFlagNoVbmi : 0;
}

int max_tokens_per_call(const KernelKey& key) {
  return tier_traits(key.isa).acc_count / plan_of(key).regs_per_token();
}

int max_tokens_per_call(Isa isa, int32_t format) {
  // The smallest over the groups and flags a format may use.
  int m = 1 << 30;
  for (int32_t group : {16, 32, 64, 128})
    for (uint32_t flags : {0u, kFlagNoVbmi}) {
      KernelKey k;
      k.isa = isa;
      k.format = format;
      k.group = group;
      k.flags = flags;
      m = std::min(m, max_tokens_per_call(k));
    }
  return m;
}

bool gemv_supported(const KernelKey& key, std::string* why) {
  const Format f = static_cast<Format>(key.format);
  if (key.format < 0 || key.format > formats::kMaxFormatId || !format_has_jit(f)) {
    *why = std::string("no generated kernel for format ") + formats::format_name(f) + " yet";
    return false;
  }
  if (key.isa != Isa::avx2 && key.isa != Isa::avx512 && key.isa != Isa::avx512_bf16) {
    *why = std::string("no generator for tier ") + isa_name(key.isa);
    return false;
  }
  if (!isa_available(key.isa)) {
    *why = std::string("this CPU lacks tier ") + isa_name(key.isa);
    return false;
  }
  if (key.k < 1 || key.rows < 1 || key.tokens < 1) {
    *why = "k, rows and tokens must be >= 1";
    return false;
  }
  if (key.tokens > max_tokens_per_call(key)) {
    *why = "tokens per call exceeds the register budget of " + std::string(isa_name(key.isa));
    return false;
  }
  // Token offsets are 32-bit displacements.
  const int64_t span = formats::row_bytes(f, key.k) + x_stride(key.k) * 4 * key.tokens;
  if (span > (int64_t(1) << 30)) {
    *why = "k is too large for 32-bit displacements";
    return false;
  }
  if ((key.flags & ~kFlagNoVbmi) != 0) {
    *why = "unknown kernel flags";
    return false;
  }
  if (needs_vbmi(key.isa, key.format, key.flags) && !host_features().avx512_vbmi) {
    *why = "this CPU lacks AVX512_VBMI for the byte-table decode";
    return false;
  }
  if (f == Format::mxfp4 && key.group != 32) {
    *why = "mxfp4 groups are 32";
    return false;
  }
  if (is_mx8(f) && key.group != 32 && key.group != 64 && key.group != 128) {
    *why = "mxfp8 group must be 32, 64 or 128";
    return false;
  }
  if (f == Format::nvfp4 && key.group != 16) {
    *why = "nvfp4 groups are 16";
    return false;
  }
  if (byte_scales(f) && key.k % key.group != 0) {
    *why = "k must be a multiple of the group";
    return false;
  }
  if (f == Format::fp8_block && key.rows > 128) {
    *why = "fp8_block kernels cover at most one 128-row scale block";
    return false;
  }
  return true;
}

std::shared_ptr<const Kernel> generate_gemv(const KernelKey& key, std::string* err) {
  if (!gemv_supported(key, err)) return nullptr;
  Xbyak::ClearError();
  // Allocation failures (the generator object, Xbyak's code buffer) throw
  // std::bad_alloc, which the C API reports as MOEJIT_OUT_OF_MEMORY; other
  // generation failures return nullptr with a reason.
  std::unique_ptr<GemvGenerator> gen(new GemvGenerator(key));
  if (Xbyak::GetError() == Xbyak::ERR_CANT_ALLOC) {
    Xbyak::ClearError();
    throw std::bad_alloc();
  }
  if (!gen->generate(err)) return nullptr;
  return std::make_shared<GeneratedKernel>(std::move(gen));
}

}  // namespace moejit::jit
