// The tile body: blocks of 16 weight rows. For each step of K the decoder
// widens each row's weights into bf16 vectors, stored as the rows of a 1 KiB
// tile buffer in L1 (bf16 weights are the A tiles as they lie: tileloadd with
// the row stride, tails aside); the activations of the call's M <= 16 tokens
// are the B tiles (XPrep's tile layout: a run of 16 element pairs x M tokens
// per chunk of 32, so a chunk is M lines: one with one token);
// tdpbf16ps accumulates a C tile of 16 rows x M tokens, one step after the
// step's decode (emit_rows). Scaled formats store C after each scale group,
// packed in `width` lanes per row (M rounded up to a power of two:
// TileScaleBlock), and the rule adds it, times each row's scale, to `width`
// vectors of running totals: with one token one FMA per group for the 16
// rows. Groups of 16 take their x in XPrep's halves layout and, up to
// kPairTokens tokens, one product per vector whose C holds each group in
// columns of its own (pairs_; split_halves), else half steps (A tiles of 16
// bf16, B tiles of 8 pairs, two products per vector), and a decoder with sums of x gets them as one
// more chunk of x after each block. A block ends with the totals turned into
// y (a 16 x 16 transpose but with one token). No instruction depends on M but
// the tile shapes and the totals' layout, and each C element is one (row,
// token) dot product scaled by the same FMAs in the same order, so a token's
// bits are the same for every M. With kFlagTileEmu (tests) every tile
// instruction is emulated with AVX512_BF16 code on tile registers in the
// stack frame (t_load and the other t_* helpers), so the body runs on CPUs
// without AMX.
#include "jit/tile_body.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>
#include <new>
#include <optional>
#include <vector>

#include "formats/formats.h"
#include "jit/body_kernel.h"

namespace moejit::jit {

using namespace Xbyak;

namespace {

constexpr int kRows = 16;          // rows of a tile block
constexpr int kTileBytes = 1024;   // one tile: 16 rows of 64 bytes
constexpr int kIterElems = 256;    // elements of K per loop iteration
constexpr int kPrefetchLine = 64;  // every line of the later call's rows is prefetched
// Groups of 16 take pairs of half steps up to this many tokens per call (2 x
// tokens columns of C; more would need a split of more vectors per chunk).
constexpr int kPairTokens = 4;

// C, 16 rows x M tokens: two, so a group's store overlaps the next group's products.
const Tmm tmm_c[2] = {Tmm(0), Tmm(1)};
// A, 16 rows x 32 bf16; with groups of 16 (half steps), 16 rows x 16 bf16.
const Tmm tmm_a[2] = {Tmm(2), Tmm(3)};
// B, 16 element pairs x M tokens; with groups of 16, 8 pairs x M tokens.
const Tmm tmm_b[2] = {Tmm(4), Tmm(5)};

class TileBody : public Generator {
 public:
  TileBody(const KernelKey& key, std::unique_ptr<Decoder> dec)
      : Generator((key.flags & kFlagTileEmu) ? kTileEmuCodeBytes : kMaxCodeBytes),
        key_(key),
        emu_((key.flags & kFlagTileEmu) != 0),
        dec_(std::move(dec)),
        rule_(dec_->scale()),
        shape_(dec_->shape()),
        nvec_(shape_.vectors()),
        row_bytes_(formats::row_bytes(key.format, key.k)),
        unroll_(std::max(1, kIterElems / shape_.block)),
        xsums_(dec_->xsum_span() > 0),
        half_(dec_->tile_halves()),
        pairs_(half_ && key.tokens <= kPairTokens) {}

  bool generate(std::string* err) {
    if (shape_.vec_elems != 32 || !dec_->x_prep().tiled() || (rule_ && !rule_->tile_ready())) {
      *err = "the decoder of " + key_.name() + " has no tile form";
      return false;
    }
    if (key_.tokens > kTileTokens) {
      *err = "tokens per call exceed the 16 columns of a tile";
      return false;
    }
    if (xsums_ && dec_->x_prep().sums().block != shape_.block) {
      *err = "the sums of x of " + key_.name() + " are not one set per block";
      return false;
    }
    if (rule_bytes() % 64 != 0) {
      *err = "the scale rule's stack area breaks the tile buffers' alignment";
      return false;
    }
    regs_ = lent_regs();
    dec_->bind(*this, regs_);
    emit_body();
    return finalize(err);
  }
  const KernelKey& key() const { return key_; }

 private:
  // ---- register roles ----
  const Reg64 reg_w = rsi;     // weights of the current block's first row
  const Reg64 reg_y = rdx;     // y of the current block
  const Reg64 reg_bs = rcx;    // 4 M: the row stride of B tiles (x is on the stack, x_off())
  const Reg64 reg_s0 = r8;     // scale row of the block's first row
  const Reg64 reg_wk = r9;     // weight cursor along K
  const Reg64 reg_xk = r10;    // activation cursor along K
  const Reg64 reg_sk = r11;    // scale cursor along K
  const Reg64 reg_kb = rax;    // loop counter along K
  const Reg64 reg_tmp = rbx;   // scratch (callee-saved)
  const Reg64 reg_rows = r12;  // row blocks left (callee-saved)
  const Reg64 reg_pfd = r13;   // w_prefetch - w (callee-saved)
  const Reg64 reg_aux = r14;   // the decoder's (callee-saved)
  const Reg64 reg_g = r15;     // per-row globals of the current block (callee-saved)
  const Reg64 reg_s64 = rdi;   // 64: the row stride of tile buffers (reg_args before)
  const Reg64 reg_rb = rbp;    // the weights' row stride, for A tiles read in place (callee-saved)
  const Opmask k_tail = k1;

  // Vectors 0-9 are the decoder's (as the row body lends them); 16-31 hold
  // the totals (the first width() of them with a rule); 10-15 are the body's. The transpose at
  // the end of a block takes 0-15 too, and the decoder's constants are loaded
  // again before the next block.
  Zmm v_w(int i) const { return Zmm(i); }
  Zmm tot(int r) const { return Zmm(16 + r); }
  Zmm v_tmp() const { return Zmm(10); }

  DecodeRegs lent_regs() const {
    DecodeRegs r;
    for (int i = 0; i < 4; ++i) r.w[i] = v_w(i);
    for (int i = 0; i < 2; ++i) r.t[i] = v_w(2 + i);
    r.scale = Zmm(4);
    for (int i = 0; i < 5; ++i) r.c[i] = Zmm(5 + i);
    r.tmp = reg_tmp;
    r.aux = reg_aux;
    r.tail = k_tail;
    r.scale_row = reg_s0;
    r.rows_left = reg_rows;
    r.count = reg_kb;
    r.src = reg_wk;
    r.dst = reg_xk;
    return r;
  }

  // ---- the stack: the rule's area at rsp, then the body's (64-byte aligned) ----
  int rule_bytes() const { return rule_ ? rule_->stack_bytes() : 0; }
  int abuf_off(int set, int v) const { return rule_bytes() + (set * nvec_ + v) * kTileBytes; }
  int cbuf_off(int i) const { return rule_bytes() + 2 * nvec_ * kTileBytes + i * kTileBytes; }
  // Pairs of half steps: the two groups' C, packed, split from a C store (split_halves).
  int halves_off(int h) const { return cbuf_off(2) + h * kTileBytes; }
  int scratch_tiles() const { return pairs_ ? 2 : 0; }
  int saved_rsp_off() const { return rule_bytes() + (2 * nvec_ + 2 + scratch_tiles()) * kTileBytes; }
  int x_off() const { return saved_rsp_off() + 8; }  // the kernel's x: B tiles of the call's run
  // The emulated tile unit's area (kFlagTileEmu): tmm0..5, then the registers it saves.
  int emu_off() const { return saved_rsp_off() + 64; }
  int emu_tile(const Tmm& t) const { return emu_off() + t.getIdx() * kTileBytes; }
  int emu_save_off() const { return emu_off() + kEmuTiles * kTileBytes; }
  int body_bytes() const {
    return (2 * nvec_ + 2 + scratch_tiles()) * kTileBytes + 64 + (emu_ ? kEmuTiles * kTileBytes + 192 : 0);
  }

  // ---- the tile instructions, or their emulation (kFlagTileEmu) ----
  void t_config() {
    if (!emu_) ldtilecfg(ptr[rip + l_cfg_]);
  }
  void t_release() {
    if (!emu_) tilerelease();
  }
  void t_zero(const Tmm& t);
  // Tile t from rows at base + disp + r stride, the stride in stride_reg
  // (reg_rb, reg_s64 or reg_bs, whose values stride_of knows).
  void t_load(const Tmm& t, const Reg64& base, int64_t disp, const Reg64& stride_reg);
  // Tile t's rows to base + disp + r stride.
  void t_store(const Reg64& base, int64_t disp, const Reg64& stride_reg, const Tmm& t);
  // The value a stride register holds after the prologue.
  int64_t stride_of(const Reg64& r) const {
    if (r.getIdx() == reg_rb.getIdx()) return row_bytes_;
    if (r.getIdx() == reg_s64.getIdx()) return 64;
    if (r.getIdx() == reg_tmp.getIdx()) return c_stride();  // C stores (flush_groups)
    assert(r.getIdx() == reg_bs.getIdx());
    return b_row_bytes();
  }
  void t_dp(const Tmm& c, const Tmm& a, const Tmm& b);
  // Bytes per row of a tile as configured (emit_data's palette).
  int colsb(const Tmm& t) const { return t == tmm_a[0] || t == tmm_a[1] ? a_colsb() : c_colsb(); }
  // Rows of a tile as configured: B tiles hold one row per element pair.
  int tile_rows(const Tmm& t) const { return t == tmm_b[0] || t == tmm_b[1] ? b_rows() : kRows; }
  // A tiles' bytes per row and B tiles' rows: 32 elements, or 16 in half steps.
  int a_colsb() const { return half_steps() ? 32 : 64; }
  int b_rows() const { return half_steps() ? 8 : kRows; }
  // Groups of 16 in two products per vector (more tokens than pairs take).
  bool half_steps() const { return half_ && !pairs_; }
  // C and B tiles' bytes per row: a dword per token, two in pairs of half steps.
  int c_colsb() const { return 4 * key_.tokens * (pairs_ ? 2 : 1); }
  // The row stride of C stores: packed (TileScaleBlock), both groups' lanes in pairs.
  int c_stride() const { return 4 * width() * (pairs_ ? 2 : 1); }
  // The emulation's scratch: two vectors, a GPR and an opmask, saved and restored around each instruction.
  const Zmm e0 = Zmm(11), e1 = Zmm(12);
  const Opmask e_k = k7;
  void emu_save(int cols_bytes = 0);
  void emu_restore();

  // One decode step: `cnt` (<= step) elements from element `off` of a block of
  // n_elems, at displacements from the cursors, into tile buffer set `set`.
  struct Step {
    int off = 0, cnt = 0, n_elems = 0;
    int dw = 0;      // weights (bytes)
    int64_t dx = 0;  // activations (elements)
    int ds = 0;      // scales (bytes)
    int set = 0;
  };
  // Whether step st's A tiles are the weights as they lie (bf16: no decode).
  bool direct(const Step& st, int n) const {
    return dec_->tile_direct() && n == kRows && st.cnt == shape_.step;
  }

  void emit_body();
  void emit_data();
  void emit_rows(int n);
  void advance_cursors();
  void decode_step(const Step& st, int n);
  void product_step(const Step& st, int n);
  void flush_groups(const Step& st, int g0, int groups, int n);
  TileScaleBlock scale_block(const Step& st, int gi, int n, const Cursor& c) const;
  void split_halves(int cb);
  // The rule's FMAs of the groups flush_groups stored last, if not yet made.
  void apply_deferred();
  void store_rows(int n);
  void transpose();

  // ---- prefetch: a region of `span` bytes per row from the cursor prefetches
  // each row's lines of the later call (reg_pfd), spread over its steps. No
  // near prefetch (the row body's kNearPrefetchBytes): 6 KiB ahead lands mostly
  // in rows of the same block, and the layer ran 3-8% faster without it
  // (docs/PERFORMANCE.md, "Tried") ----
  void start_prefetch_span(int64_t from, int64_t span) {
    pf_next_ = from;
    pf_span_ = span;
  }
  void emit_prefetch(int n) {
    for (int r = 0; r < n; ++r) prefetcht1(ptr[reg_wk + reg_pfd + (r * row_bytes_ + pf_next_)]);
    pf_next_ += kPrefetchLine;
  }
  // The region's prefetches up to step st's first byte.
  void prefetch_to(const Step& st, int n) {
    while (pf_next_ <= st.dw + dec_->elem_byte(st.off) && pf_next_ < pf_span_) emit_prefetch(n);
  }
  void finish_prefetch_span(int n) {
    while (pf_next_ < pf_span_) emit_prefetch(n);
  }

  void set_tail_mask(int cnt) {
    mov(reg_tmp, cnt >= 64 ? ~uint64_t(0) : (uint64_t(1) << cnt) - 1);
    kmovq(k_tail, reg_tmp);
  }
  int scale_bytes() const { return rule_ ? rule_->block_bytes() : 0; }
  // x of the call's M tokens (XPrep, tile layouts): a B tile of 16 element
  // pairs x M tokens per chunk of 32 elements, its rows packed; a halves
  // layout has twice the dwords per row (half of them zeros).
  int b_row_bytes() const { return 4 * key_.tokens * (half_ ? 2 : 1); }
  // Lanes per row of the packed C stores and totals (TileScaleBlock): the
  // tokens rounded up to a power of two.
  int width() const {
    int w = 1;
    while (w < key_.tokens) w *= 2;
    return w;
  }
  int b_chunk_bytes() const { return 16 * b_row_bytes(); }
  // x bytes of one block: its chunks, then its sums of x (one chunk) where the decoder asks for them.
  int x_block_bytes() const { return (shape_.block / 32 + (xsums_ ? 1 : 0)) * b_chunk_bytes(); }
  // Byte of chunk c (32 elements from element off) of the block at element dx.
  int64_t x_chunk_at(int64_t dx, int off, int c) const {
    return dx / shape_.block * x_block_bytes() + int64_t(off / 32 + c) * b_chunk_bytes();
  }

  static constexpr int kEmuTiles = 6;  // tmm0..5: two C, two A, two B

  KernelKey key_;
  bool emu_;  // kFlagTileEmu
  std::unique_ptr<Decoder> dec_;
  ScaleRule* rule_;  // dec_'s, null when unscaled
  DecodeRegs regs_;  // lent to dec_
  DecodeShape shape_;
  int nvec_;  // vectors per step: tile buffers per set
  int64_t row_bytes_;
  int unroll_;  // blocks per loop iteration
  bool xsums_;  // whether x carries sums after each block (Decoder::xsum_span)
  // Groups of 16 (nvfp4, the K-quants with 16-element sub-blocks): each vector
  // of 32 is two half steps of 16 elements, a tdpbf16ps and a group each; or,
  // with at most kPairTokens tokens (pairs_), one tdpbf16ps of the whole vector whose C
  // holds each group's sums in columns of their own (the halves x layout), split
  // into the two groups' packed C after its store (split_halves).
  bool half_;
  bool pairs_;
  int cur_ = 0;                           // C tile of the current group
  bool pending_ = false;                  // products in C not yet stored
  std::vector<TileScaleBlock> deferred_;  // groups stored (C buffer cur_ ^ 1), their FMAs not yet made
  int64_t pf_next_ = 0;                   // next line offset of the current region to prefetch
  int64_t pf_span_ = 0;                   // bytes per row the current region reads
  Label l_cfg_;                           // the tile palette
  Label l_spread_;                        // index vectors onto the packed totals (TileScaleBlock::spread)
  Label l_halves_;                        // vpermt2ps indices of each half's lanes in a pair's C store
  // The block's row totals, for the rule (tot(r)).
  const std::array<Xmm, kRows> totals_ = [] {
    std::array<Xmm, kRows> t;
    for (int r = 0; r < kRows; ++r) t[size_t(r)] = Zmm(16 + r);
    return t;
  }();
};

void TileBody::emit_body() {
  phase("prologue");
  for (const Reg64& r : {reg_tmp, reg_rows, reg_pfd, reg_aux, reg_g, reg_rb}) push(r);
  mov(reg_w, ptr[reg_args + offsetof(GemvArgs, w)]);
  mov(reg_pfd, ptr[reg_args + offsetof(GemvArgs, w_prefetch)]);
  sub(reg_pfd, reg_w);
  mov(reg_s0, ptr[reg_args + offsetof(GemvArgs, scales)]);
  if (dec_->row_globals()) mov(reg_g, ptr[reg_args + offsetof(GemvArgs, row_scales)]);
  if (rule_) rule_->load_args();
  mov(reg_y, ptr[reg_args + offsetof(GemvArgs, y)]);
  // A 64-byte aligned area above the rule's: tile buffers, C stores, the caller's rsp.
  mov(reg_kb, rsp);
  and_(rsp, -64);
  sub(rsp, body_bytes());  // the rule's prologue allocates its own bytes below
  mov(ptr[rsp + saved_rsp_off() - rule_bytes()], reg_kb);
  mov(reg_kb, ptr[reg_args + offsetof(GemvArgs, x)]);
  mov(ptr[rsp + x_off() - rule_bytes()], reg_kb);
  t_config();
  // The lanes past the call's tokens of the C stores stay zero (no denormal
  // garbage reaches the FMAs).
  vpxord(v_tmp(), v_tmp(), v_tmp());
  for (int i = 0; i < 2; ++i)
    for (int r = 0; r < kRows; ++r) vmovups(ptr[rsp + cbuf_off(i) - rule_bytes() + 64 * r], v_tmp());
  if (rule_) rule_->prologue();
  mov(reg_s64, 64);
  mov(reg_bs, b_row_bytes());
  mov(reg_rb, row_bytes_);

  const int64_t full = key_.rows / kRows;
  const int part = int(key_.rows % kRows);
  if (full > 0) {
    Label l_blk;
    mov(reg_rows, full);
    L(l_blk);
    emit_rows(kRows);
    add(reg_w, kRows * row_bytes_);
    add(reg_y, kRows * 4);
    if (dec_->row_globals()) add(reg_g, kRows * 4);
    if (rule_) rule_->next_rows(kRows);
    dec(reg_rows);
    jnz(l_blk, T_NEAR);
  }
  if (part > 0) emit_rows(part);

  phase("epilogue");
  t_release();
  if (rule_bytes() > 0) add(rsp, rule_bytes());
  mov(rsp, ptr[rsp + saved_rsp_off() - rule_bytes()]);
  vzeroupper();
  for (const Reg64& r : {reg_rb, reg_g, reg_aux, reg_pfd, reg_rows, reg_tmp}) pop(r);
  ret();
  emit_data();
}

void TileBody::emit_data() {
  phase("data");
  align(64);
  // The palette: id 1; colsb (16-bit) of tile i at 16 + 2i, rows at 48 + i.
  L(l_cfg_);
  uint8_t cfg[64] = {};
  cfg[0] = 1;
  auto set = [&](const Tmm& t, int rows, int colsb) {
    cfg[16 + 2 * t.getIdx()] = uint8_t(colsb);
    cfg[17 + 2 * t.getIdx()] = uint8_t(colsb >> 8);
    cfg[48 + t.getIdx()] = uint8_t(rows);
  };
  for (int i = 0; i < 2; ++i) {
    set(tmm_c[i], kRows, c_colsb());
    set(tmm_a[i], kRows, a_colsb());
    set(tmm_b[i], b_rows(), c_colsb());
  }
  for (uint8_t b : cfg) db(b);
  align(64);
  const int w = width();
  if (pairs_) {
    // Half h's lane l: row l / w, token t = l % w, from a pair's C store (rows
    // of 2 w dwords: the first group's M tokens, then the second's): dword
    // 2 w row + h M + t, or for t >= M a dword past the row's 2 M, which the
    // store leaves zero.
    const int m = key_.tokens;
    L(l_halves_);
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 16; ++l) {
        const int row = l / w, t = l % w;
        dd(uint32_t(2 * w * row + (t < m ? h * m + t : 2 * m)));
      }
  }
  if (rule_ && w > 1 && w < kRows) {
    L(l_spread_);
    for (int i = 0; i < w; ++i)
      for (int l = 0; l < 16; ++l) dd(uint32_t((16 * i + l) / w));
    for (int l = 0; l < 16; ++l) dd(uint32_t(l % w));
  }
  dec_->emit_data();
}

// One block of n <= 16 rows over all of K, then its outputs. Decoded steps
// are multiplied one step later (software pipelining): a tileloadd that reads
// the buffer stores of the instructions just before it waits for them to
// reach L1 (no forwarding into tiles), and its products with it, so each
// step's products come after the next step's decode. The loop decodes the
// first step of its next iteration last, and its final iteration branches to a
// copy of the pending step's products instead; the blocks past the loop and
// the tail follow, and the last step's products end the row block
// (docs/ARCHITECTURE.md, docs/PERFORMANCE.md).
void TileBody::emit_rows(int n) {
  phase("decode");
  dec_->emit_constants();  // the previous block's transpose took the decoder's registers
  if (rule_) rule_->begin_row();
  if (rule_)
    for (int r = 0; r < kRows; ++r) vxorps(tot(r), tot(r), tot(r));
  for (const Tmm& c : tmm_c) t_zero(c);
  cur_ = 0;
  pending_ = false;
  mov(reg_wk, reg_w);
  mov(reg_xk, ptr[rsp + x_off()]);
  mov(reg_sk, rule_ ? rule_->row_cursor() : reg_s0);

  const int block_bytes = dec_->block_bytes();
  const int64_t nfull = key_.k / shape_.block;
  const int tail = int(key_.k % shape_.block);
  const int64_t iters = nfull / unroll_;
  const int rem = int(nfull % unroll_);
  // The steps of `count` blocks (and the tail block after them, if asked) from
  // the cursors, buffer sets alternating from set 0.
  auto steps_of = [&](int count, bool with_tail) {
    std::vector<Step> out;
    int set = 0;
    auto add_block = [&](int j, int n_elems) {
      for (int off = 0; off < n_elems; off += shape_.step) {
        Step st;
        st.off = off;
        st.cnt = std::min(shape_.step, n_elems - off);
        st.n_elems = n_elems;
        st.dw = j * block_bytes;
        st.dx = int64_t(j) * shape_.block;
        st.ds = j * scale_bytes();
        st.set = set;
        set ^= 1;
        out.push_back(st);
      }
    };
    for (int j = 0; j < count; ++j) add_block(j, shape_.block);
    if (with_tail && tail > 0) add_block(count, tail);
    return out;
  };
  const std::vector<Step> iter = steps_of(unroll_, false);
  const int64_t iter_bytes = int64_t(unroll_) * block_bytes;
  std::optional<Step> decoded;  // a step decoded, not yet multiplied
  // Weights read in place (bf16) have no decode to wait for: no lag.
  const bool lag = !dec_->tile_direct();
  auto emit = [&](const Step& st) {
    decode_step(st, n);
    if (decoded) product_step(*decoded, n);
    decoded = st;
    if (!lag) {
      product_step(st, n);
      decoded.reset();
    }
  };
  // Each buffer set keeps its place from one iteration to the next: an
  // iteration is 256 elements in steps of 32, 64 or 128.
  assert(iter.size() % 2 == 0);
  Label l_k, l_last;  // the loop, and its final iteration's exit (lag)
  if (iters > 0) {
    if (lag) {
      start_prefetch_span(0, 0);  // the loop's first iteration prefetches its lines
      decode_step(iter[0], n);
      decoded = iter[0];
    }
    mov(reg_kb, iters);
    L(l_k);
    start_prefetch_span(0, iter_bytes);
    for (size_t s = lag ? 1 : 0; s < iter.size(); ++s) emit(iter[s]);
    finish_prefetch_span(n);
    if (!lag) {
      advance_cursors();
      dec(reg_kb);
      jnz(l_k, T_NEAR);
    }
  }
  if (iters > 0 && lag) {  // the loop's end: the last step's products on both exits
    const Step last = *decoded;
    const int cur = cur_;  // the C tiles' state before `last`'s products, for both paths
    const bool in_c = pending_;
    const std::vector<TileScaleBlock> deferred = deferred_;
    cmp(reg_kb, 1);
    je(l_last, T_NEAR);
    Step next = iter[0];  // the next iteration's first step, decoded before the cursors move
    next.dw += int(iter_bytes);
    next.dx += int64_t(unroll_) * shape_.block;
    next.ds += unroll_ * scale_bytes();
    decode_step(next, n);
    product_step(last, n);
    advance_cursors();
    dec(reg_kb);
    jmp(l_k, T_NEAR);
    L(l_last);  // the final iteration: no next step to decode
    cur_ = cur;
    pending_ = in_c;
    deferred_ = deferred;
    product_step(last, n);
    advance_cursors();
    decoded.reset();
  }
  // The blocks past the loop and the tail, from the cursors as the loop left them.
  const std::vector<Step> rest = steps_of(rem, true);
  start_prefetch_span(0, row_bytes_ - iters * iter_bytes);
  for (const Step& st : rest) {
    if (st.n_elems < shape_.block) phase("tail");
    emit(st);
  }
  finish_prefetch_span(n);
  if (decoded) product_step(*decoded, n);
  if (rule_) apply_deferred();
  store_rows(n);
}

// After a loop iteration: the cursors to the next one.
void TileBody::advance_cursors() {
  if (rule_) apply_deferred();  // its cursors are this iteration's
  add(reg_wk, unroll_ * dec_->block_bytes());
  add(reg_xk, unroll_ * x_block_bytes());
  if (scale_bytes() > 0) add(reg_sk, unroll_ * scale_bytes());
}

// Step st's decode of n rows into its tile buffer set.
void TileBody::decode_step(const Step& st, int n) {
  phase("decode");
  if (direct(st, n)) return;
  prefetch_to(st, n);
  const int nv = (st.cnt + 31) / 32;  // vectors holding elements (natural order in each chunk)
  if (st.cnt < shape_.step) set_tail_mask(st.cnt);
  for (int r = 0; r < n; ++r) {
    dec_->load_widen(Cursor{reg_wk, r * row_bytes_ + st.dw}, st.off, st.cnt, regs_.w);
    for (int v = 0; v < nv; ++v) vmovups(ptr[rsp + abuf_off(st.set, v) + 64 * r], v_w(v));
  }
}

// Step st's tile products; a scale group ends after its last vector, and a
// partial block's last group after its last step. Pairs of half steps end
// both groups of a vector at once.
void TileBody::product_step(const Step& st, int n) {
  phase("tdp");
  const bool dir = direct(st, n);
  assert(!(dir && half_));  // A read in place is whole vectors (bf16: unscaled)
  if (dir) prefetch_to(st, n);
  const int group = shape_.block / shape_.groups;
  const bool halfsteps = half_steps();
  // Pieces of `span` elements: a vector, or half of one in half steps.
  const int span = halfsteps ? 16 : 32, pieces = (st.cnt + span - 1) / span;
  for (int p = 0; p < pieces; ++p) {
    const int v = halfsteps ? p / 2 : p, h = halfsteps ? p % 2 : 0;
    const Tmm& a = tmm_a[p % 2];
    if (dir) {
      const int64_t at = st.dw + dec_->elem_byte(st.off + 32 * v);
      for (int r = 0; r < kRows; ++r) prefetcht0(ptr[reg_wk + (r * row_bytes_ + at + kTileL1AheadBytes)]);
      t_load(a, reg_wk, at, reg_rb);
    } else
      t_load(a, rsp, abuf_off(st.set, v) + 32 * h, reg_s64);
    // In half steps, half h's x: rows 8 h.. of the chunk, its dwords from h M (XPrep's halves layout).
    t_load(tmm_b[p % 2], reg_xk, x_chunk_at(st.dx, st.off, v) + h * (8 * b_row_bytes() + 4 * key_.tokens),
           reg_bs);
    t_dp(tmm_c[cur_], a, tmm_b[p % 2]);
    pending_ = true;
    if (pairs_) {
      const int first = st.off + span * p, last = st.off + std::min(span * (p + 1), st.cnt) - 1;
      flush_groups(st, first / group, last / group - first / group + 1, n);
    } else if (rule_ && (st.off + span * (p + 1)) % group == 0) {
      flush_groups(st, (st.off + span * p) / group, 1, n);
    }
  }
  if (rule_ && pending_ && st.off + st.cnt == st.n_elems)
    flush_groups(st, (st.n_elems - 1) / group, 1, n);  // a partial block's last
  phase("decode");
}

// The rule's view of group gi of step st's block, its C packed at c.
TileScaleBlock TileBody::scale_block(const Step& st, int gi, int n, const Cursor& c) const {
  TileScaleBlock b;
  b.c = c;
  b.w = Cursor{reg_wk, st.dw + gi * (dec_->block_bytes() / shape_.groups)};
  b.s = Cursor{reg_sk, st.ds + gi * (scale_bytes() / shape_.groups)};
  b.row_bytes = row_bytes_;
  b.rows = n;
  b.width = width();
  b.totals = std::span<const Xmm>(totals_.data(), size_t(width()));
  b.spread = &l_spread_;
  b.group = gi;
  b.block_w = Cursor{reg_wk, st.dw};
  if (xsums_) {
    b.xsums = Cursor{reg_xk, x_chunk_at(st.dx, 0, shape_.block / 32)};
    b.xsum_row_bytes = 4 * key_.tokens;  // a chunk of sums keeps rows of a dword per token
  }
  return b;
}

// The `groups` groups from g0 of step st's block that C holds (one; two in a
// pair of half steps, each in columns of its own): C to memory, packed
// (TileScaleBlock: rows width() dwords apart; both groups' in a pair), zeroed.
// The previous flush's FMAs come now and these groups' at the next flush
// (after splitting a pair's C per group), so their C loads read stores a
// flush old (a vector load of a tile store just made waits for it to reach L1).
void TileBody::flush_groups(const Step& st, int g0, int groups, int n) {
  phase("block-scale");
  const int cb = cbuf_off(cur_);
  if (c_stride() == 64) {
    t_store(rsp, cb, reg_s64, tmm_c[cur_]);
  } else if (c_stride() == b_row_bytes()) {
    t_store(rsp, cb, reg_bs, tmm_c[cur_]);
  } else {
    mov(reg_tmp, c_stride());
    t_store(rsp, cb, reg_tmp, tmm_c[cur_]);
  }
  t_zero(tmm_c[cur_]);
  std::vector<TileScaleBlock> blocks;
  for (int g = 0; g < groups; ++g)
    blocks.push_back(scale_block(st, g0 + g, n, Cursor{rsp, pairs_ ? halves_off(g) : cb}));
  apply_deferred();
  deferred_ = blocks;
  cur_ ^= 1;
  pending_ = false;
  phase("decode");
}

// A pair's C store at cb (rows of 2 width() dwords) to each half's packed C
// (rows of width() dwords) at halves_off(h): one vpermt2ps per vector.
void TileBody::split_halves(int cb) {
  const Zmm idx = Zmm(11);  // free in the body (the emulation saves it around its instructions)
  for (int h = 0; h < 2; ++h) {
    vmovups(idx, ptr[rip + l_halves_ + 64 * h]);
    for (int u = 0; u < width(); ++u) {
      vmovups(v_tmp(), ptr[rsp + cb + 128 * u]);
      vpermt2ps(v_tmp(), idx, ptr[rsp + cb + 128 * u + 64]);
      vmovups(ptr[rsp + halves_off(h) + 64 * u], v_tmp());
    }
  }
}

void TileBody::apply_deferred() {
  if (deferred_.empty()) return;
  phase("block-scale");
  if (pairs_) split_halves(cbuf_off(cur_ ^ 1));  // the C the last flush stored
  for (const TileScaleBlock& b : deferred_) rule_->tile_apply(b);
  deferred_.clear();
}

// The block's n rows x M tokens into y[m * rows + r].
void TileBody::store_rows(int n) {
  phase("store");
  if (!rule_) {
    t_store(rsp, cbuf_off(0), reg_s64, tmm_c[0]);
    for (int r = 0; r < kRows; ++r) vmovups(tot(r), ptr[rsp + cbuf_off(0) + 64 * r]);
  }
  // With a rule the totals are packed (TileScaleBlock): width() vectors.
  const int w = rule_ ? width() : kRows;
  const float factor = dec_->total_factor();
  if (factor != 1.0f) {
    uint32_t bits;
    std::memcpy(&bits, &factor, 4);
    broadcast_u32(v_tmp(), bits, reg_tmp.cvt32());
    for (int r = 0; r < w; ++r) vmulps(tot(r), tot(r), v_tmp());
  }
  if (w > 1 && w < kRows) {  // unpacked through memory: tot(r), lanes = tokens
    for (int i = 0; i < w; ++i) vmovups(ptr[rsp + cbuf_off(0) + 64 * i], tot(i));
    for (int r = 0; r < kRows; ++r) vmovups(tot(r), ptr[rsp + cbuf_off(0) + 4 * w * r]);
  }
  if (w > 1) transpose();  // tot(m): token m, lanes = rows
  if (n < kRows) set_tail_mask(n);
  const bool globals = dec_->row_globals();
  if (globals) {
    if (n < kRows)
      vmovups(v_tmp() | k_tail | T_z, ptr[reg_g]);
    else
      vmovups(v_tmp(), ptr[reg_g]);
  }
  for (int m = 0; m < key_.tokens; ++m) {
    if (globals) vmulps(tot(m), tot(m), v_tmp());
    const Address dst = ptr[reg_y + m * key_.rows * 4];
    if (n < kRows)
      vmovups(dst | k_tail, tot(m));
    else
      vmovups(dst, tot(m));
  }
}

// ---- the emulated tile unit (kFlagTileEmu) ----
// Tile register t is 16 rows of 64 bytes at emu_tile(t); a row's bytes past
// its colsb are zero, as tileloadd leaves them. The emulation keeps every
// register the body and the decoder use: it saves its scratch (e0, e1, rbx,
// k7) first and restores it after. It changes EFLAGS, which the tile
// instructions do not: no flag is live across one in this body (the loops'
// dec and jnz are adjacent). Loads and stores touch a row's colsb bytes only
// (a masked move), so it reads no byte the tile unit would not; their base is
// never rbx (the weights, x or the stack), which the mask setup takes.

void TileBody::emu_save(int cols_bytes) {
  vmovups(ptr[rsp + emu_save_off()], e0);
  vmovups(ptr[rsp + emu_save_off() + 64], e1);
  mov(ptr[rsp + emu_save_off() + 128], reg_tmp);
  kmovq(ptr[rsp + emu_save_off() + 136], e_k);
  if (cols_bytes > 0) {
    mov(reg_tmp.cvt32(), (1u << (cols_bytes / 4)) - 1);
    kmovw(e_k, reg_tmp.cvt32());
  }
}

void TileBody::emu_restore() {
  kmovq(e_k, ptr[rsp + emu_save_off() + 136]);
  mov(reg_tmp, ptr[rsp + emu_save_off() + 128]);
  vmovups(e1, ptr[rsp + emu_save_off() + 64]);
  vmovups(e0, ptr[rsp + emu_save_off()]);
}

void TileBody::t_zero(const Tmm& t) {
  if (!emu_) {
    tilezero(t);
    return;
  }
  emu_save();
  vpxord(e0, e0, e0);
  for (int r = 0; r < kRows; ++r) vmovups(ptr[rsp + emu_tile(t) + 64 * r], e0);
  emu_restore();
}

void TileBody::t_load(const Tmm& t, const Reg64& base, int64_t disp, const Reg64& stride_reg) {
  if (!emu_) {
    tileloadd(t, ptr[base + stride_reg + disp]);
    return;
  }
  assert(base.getIdx() != reg_tmp.getIdx());
  const int64_t stride = stride_of(stride_reg);
  emu_save(colsb(t));
  for (int r = 0; r < tile_rows(t); ++r) {
    vmovdqu32(e0 | e_k | T_z, ptr[base + (disp + r * stride)]);
    vmovups(ptr[rsp + emu_tile(t) + 64 * r], e0);
  }
  emu_restore();
}

void TileBody::t_store(const Reg64& base, int64_t disp, const Reg64& stride_reg, const Tmm& t) {
  if (!emu_) {
    tilestored(ptr[base + stride_reg + disp], t);
    return;
  }
  assert(base.getIdx() != reg_tmp.getIdx());
  const int64_t stride = stride_of(stride_reg);
  emu_save(colsb(t));
  for (int r = 0; r < kRows; ++r) {
    vmovups(e0, ptr[rsp + emu_tile(t) + 64 * r]);
    vmovdqu32(ptr[base + (disp + r * stride)] | e_k, e0);
  }
  emu_restore();
}

// C[r][n] += A[r][2k] B[k][2n] + A[r][2k + 1] B[k][2n + 1] over the pairs k
// of each row r of A (16 rows of 32 bf16, or 16 in half steps) and the n < M
// pair columns of B:
// per row of C, one vdpbf16ps per pair of A, broadcast, against B's row k.
void TileBody::t_dp(const Tmm& c, const Tmm& a, const Tmm& b) {
  if (!emu_) {
    tdpbf16ps(c, a, b);
    return;
  }
  emu_save();
  Label l_row;
  xor_(reg_tmp.cvt32(), reg_tmp.cvt32());  // 64 x the row of C and A
  L(l_row);
  vmovups(e0, ptr[rsp + reg_tmp + emu_tile(c)]);
  for (int k = 0; k < colsb(a) / 4; ++k) {
    vpbroadcastd(e1, ptr[rsp + reg_tmp + emu_tile(a) + 4 * k]);
    vdpbf16ps(e0, e1, ptr[rsp + emu_tile(b) + 64 * k]);
  }
  vmovups(ptr[rsp + reg_tmp + emu_tile(c)], e0);
  add(reg_tmp.cvt32(), 64);
  cmp(reg_tmp.cvt32(), kTileBytes);
  jb(l_row);
  emu_restore();
}

// tot(r) lane t = X[r][t] -> tot(t) lane r = X[r][t], for the tokens of the
// call: 32-bit and 64-bit interleaves, then a 4 x 4 transpose of 128-bit lanes.
void TileBody::transpose() {
  const int M = key_.tokens;
  auto t = [](int i) { return Zmm(i); };  // stage 1 and 3 results: vectors 0-15
  // Stage 1: t[2k] = rows 2k, 2k+1 interleaved (elements 0, 1 of each lane), t[2k+1] (elements 2, 3).
  for (int k = 0; k < 8; ++k) {
    vunpcklps(t(2 * k), tot(2 * k), tot(2 * k + 1));
    if (M > 2) vunpckhps(t(2 * k + 1), tot(2 * k), tot(2 * k + 1));
  }
  // Stage 2: u[4k + j] (in tot) lane L = rows 4k..4k+3 of token 4L + j.
  for (int k = 0; k < 4; ++k)
    for (int h = 0; h < 2; ++h) {
      if (2 * h >= M) continue;
      vunpcklpd(tot(4 * k + 2 * h), t(4 * k + h), t(4 * k + h + 2));
      if (2 * h + 1 < M) vunpckhpd(tot(4 * k + 2 * h + 1), t(4 * k + h), t(4 * k + h + 2));
    }
  // Stages 3 and 4: token 4L + j = lanes L of u[j], u[4 + j], u[8 + j], u[12 + j].
  for (int j = 0; j < 4 && j < M; ++j) {
    const Zmm v0 = t(4 * j), v1 = t(4 * j + 1), v2 = t(4 * j + 2), v3 = t(4 * j + 3);
    vshuff32x4(v0, tot(j), tot(4 + j), 0x44);  // lanes 0, 1 of each
    vshuff32x4(v1, tot(j), tot(4 + j), 0xEE);  // lanes 2, 3
    vshuff32x4(v2, tot(8 + j), tot(12 + j), 0x44);
    vshuff32x4(v3, tot(8 + j), tot(12 + j), 0xEE);
    vshuff32x4(tot(j), v0, v2, 0x88);  // token j: lane 0 of each
    if (4 + j < M) vshuff32x4(tot(4 + j), v0, v2, 0xDD);
    if (8 + j < M) vshuff32x4(tot(8 + j), v1, v3, 0x88);
    if (12 + j < M) vshuff32x4(tot(12 + j), v1, v3, 0xDD);
  }
}

}  // namespace

std::shared_ptr<const Kernel> generate_tile_kernel(const KernelKey& key, std::unique_ptr<Decoder> dec,
                                                   std::string* err) {
  return generate_body_kernel<TileBody>(key, std::move(dec), err);
}

}  // namespace moejit::jit
