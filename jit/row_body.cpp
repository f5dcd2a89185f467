// The row-streaming body: registers, prefetch, accumulators, the block loop,
// tails, the row-group reduction and the epilogue. It knows no format: the
// Decoder widens weights and its ScaleRule applies scales; a tier contributes
// the vector width, the register budget and the multiply instruction.
#include "jit/row_body.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "formats/formats.h"
#include "jit/body_kernel.h"

namespace moejit::jit {

using namespace Xbyak;

namespace {

struct TierTraits {
  int vec_bytes;  // 32 (ymm) or 64 (zmm)
  int acc_first;  // first accumulator register
  int acc_count;  // registers available for accumulators
};

TierTraits tier_traits(Isa isa) {
  switch (isa) {
    case Isa::avx2: return {32, 6, 10};
    case Isa::avx512:
    case Isa::avx512_bf16: return {64, 10, 22};
    default: return {0, 0, 0};
  }
}

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
// Kernels that stream on the hardware prefetchers (bf16) with one token emit
// each row fully unrolled up to this many vectors: every x load then reads the
// same address on every row. A looped row gives each x load a constant 256-byte
// stride, which the stride prefetcher follows at the cost of the weight stream
// (measured on Zen 4, one core, 1 GiB of bf16 rows: 72-88% of the read
// bandwidth looped, 90-96% unrolled).
constexpr int64_t kMaxRowUnrollVectors = 256;
// Bytes of the next call covered by each software prefetch of those one-token
// kernels: enough to start the hardware prefetchers on the next call's lines
// (an expert's rows elsewhere in memory) without competing with them. Measured
// on Zen 4 in the Qwen3-30B-A3B bf16 layer, one thread, same runs: none
// 77-87% of the read bandwidth, one per 1 KiB 84-92% (256 B and 4 KiB alike);
// one per line (64 B) 71% on a cold stream. The other formats need one per line:
// fp8_block with one per 256 B fell from 78-81% to 66-72%.
constexpr int kSparsePrefetchBytes = 1024;

// K-chunked kernels. A multi-token kernel whose prepared x is fp32 reads
// tokens x 4 bytes of x per weight, once per row: when the call's x outgrows
// L1 those reads come from L2, and a q4_K kernel at K = 7168 ran 1.4x (2
// tokens) to 2.1x (7 tokens) slower per weight than at K = 768 on the Intel
// VM (docs/PERFORMANCE.md, "K-chunked kernels"). Such kernels visit each group
// of rows once per chunk of K whose x of all tokens fits kChunkXBytes, keeping
// each row's running totals in its stash slot between visits. A row's blocks
// still add into the same registers in the same order, so the bits are those
// of the unchunked kernel; only the order in which rows are visited changes.
// Above 56 KiB of x chunking gained 1.1-1.5x on the K-quants there (K = 7168
// with 2-7 tokens, K = 2048 with 7 but q5_K). With x 64-byte aligned (the
// layers' buffers since 3eba768) the line is the Xeons' 48 KiB of L1 data:
// above it (K = 2048 with 6 tokens, K = 4096 with 3) chunks gained 0.97-1.16x,
// at 35-44 KiB (4-5 tokens) they cost 2-10%, so those calls keep the row order.
// Kernels with several running totals per token (the K-quants' bf16 pairs:
// two) keep each of them in a stash slot of its own between chunks and add
// them after the last, with the unchunked kernel's tree.
constexpr int64_t kChunkMinXBytes = 48 * 1024;  // a call's x above this is chunked
constexpr int64_t kChunkXBytes = 16 * 1024;     // x of all tokens per chunk

// Accumulators per token: na inside a block, nt running totals of scaled blocks.
struct Plan {
  int na;
  int nt;  // 0 when unscaled
  int regs_per_token() const { return na + nt; }
};

Plan plan_of(const DecodeShape& s) {
  // Step-scaled decodes: a step's even and odd vectors in two accumulators,
  // each scaled into its own running total (two FMA chains per token).
  if (s.step_scaled) return Plan{2, 2};
  const int vpb = std::max(1, s.block / s.vec_elems);
  Plan p{};
  p.na = s.scaled ? std::min(kBlockSplit, vpb) : kSplit;
  // Blocks of 4+ vectors are long enough to hide the latency of one running
  // total's FMA chain; shorter blocks rotate kSplit / na totals. Fewer
  // registers per token means more tokens per call (dedup decodes once per call).
  p.nt = !s.scaled ? 0 : vpb >= 4 ? 1 : std::max(1, kSplit / p.na);
  return p;
}

class RowBody : public Generator {
 public:
  RowBody(const KernelKey& key, std::unique_ptr<Decoder> dec)
      : key_(key),
        dec_(std::move(dec)),
        rule_(dec_->scale()),
        shape_(dec_->shape()),
        xprep_(dec_->x_prep()),
        tt_(tier_traits(key.isa)),
        plan_(plan_of(shape_)),
        scaled_(shape_.scaled),
        xbytes_(int(xprep_.elem_bytes())),
        row_bytes_(formats::row_bytes(key.format, key.k)),
        xstride_bytes_(xprep_.vector_bytes(key.k)),
        xblock_bytes_(xprep_.bytes(shape_.block)),
        fma_f32_(xbytes_ == 4),
        // Every kernel prefetches a later call (w_prefetch). Multi-token calls
        // compute long enough per line that streaming no longer overlaps
        // without help (measured: cold = hot + DRAM time): they prefetch each
        // line of the next call, as the decoding formats do of a call
        // ~kPrefetchBytes ahead. Formats the hardware prefetchers stream (bf16)
        // prefetch sparsely with one token (kSparsePrefetchBytes), except with
        // kFlagLinePrefetch (Intel), where they prefetch as the others do.
        sparse_(!dec_->streams_with_prefetch() && !(key.flags & kFlagLinePrefetch) && key.tokens == 1) {
    unroll_ = scaled_ ? std::max(plan_.nt, kChunk / shape_.block) : 1;
    const int64_t nfull = key.k / shape_.block;
    if (sparse_ && nfull > 0 && nfull * (shape_.block / shape_.vec_elems) <= kMaxRowUnrollVectors)
      unroll_ = int(nfull);
    // Chunks of K (see kChunkXBytes): rules that support them with no scale
    // cursor (their scales ride in the weights), fp32 x or step-scaled bf16
    // pairs (the two measured; not with kFlagRowOrder, Intel's pair kernels),
    // running totals (kept in stash slots) and no
    // total factor; a group's rows must be a 32-bit displacement (the rewind
    // between chunks).
    const int64_t call_x = key.tokens * xstride_bytes_;
    if (rule_ && rule_->chunkable() && rule_->block_bytes() == 0 && (fma_f32_ || shape_.step_scaled) &&
        !(key.flags & kFlagRowOrder) && key.tokens > 1 && plan_.nt >= 1 && dec_->total_factor() == 1.0f &&
        key.k % shape_.block == 0 && call_x > kChunkMinXBytes &&
        group_rows() * row_bytes_ <= (int64_t(1) << 30)) {
      // The most blocks that fit, dividing the row's blocks into equal chunks.
      const int64_t fit = std::max<int64_t>(1, kChunkXBytes / (key.tokens * xblock_bytes_));
      for (int64_t c = std::min(fit, nfull - 1); c >= 1 && chunk_blocks_ == 0; --c)
        if (nfull % c == 0 && c % unroll_ == 0) chunk_blocks_ = c;
    }
  }

  bool generate(std::string* err) {
    const int regs = tt_.vec_bytes == 64 ? 32 : 16;
    if (tt_.acc_first + key_.tokens * plan_.regs_per_token() > regs) {
      *err = "tokens per call exceed the accumulator registers";
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
  const Reg64 reg_aux = r14;   // the decoder's (callee-saved): scale table, widened row scales
  const Reg64 reg_g = r15;     // per-row globals of the current row group (callee-saved)
  const Reg64 reg_st = rdi;    // stash slot of the current row (reg_args, free after the prologue)
  const Reg64 reg_rg = rbp;    // rows left in the current row group (callee-saved)
  const Opmask k_tail = k1;

  Xmm vec(int idx) const {
    if (tt_.vec_bytes == 64) return Zmm(idx);
    return Ymm(idx);
  }
  // Vectors 0..9 are lent to the decoder (DecodeRegs); between steps the body
  // uses 0..4 as temporaries of the store and the reduction.
  Xmm v_w(int i = 0) const { return vec(i); }      // widened weights (up to four per step)
  Xmm v_t(int i = 0) const { return vec(2 + i); }  // decode temporaries
  Xmm v_scale() const { return vec(4); }           // block scale
  Xmm v_c(int i) const { return vec(5 + i); }      // decode constants 0..4
  // accumulators: acc(m, j) per block (or per row when unscaled), tot(m, j)
  // running totals of scaled blocks
  Xmm acc(int m, int j) const { return vec(tt_.acc_first + m * plan_.na + j); }
  Xmm tot(int m, int j = 0) const {
    return scaled_ ? vec(tt_.acc_first + key_.tokens * plan_.na + m * plan_.nt + j) : acc(m, 0);
  }

  DecodeRegs lent_regs() const {
    DecodeRegs r;
    for (int i = 0; i < 4; ++i) r.w[i] = v_w(i);
    for (int i = 0; i < 2; ++i) r.t[i] = v_t(i);
    r.scale = v_scale();
    for (int i = 0; i < 5; ++i) r.c[i] = v_c(i);
    r.tmp = reg_tmp;
    r.aux = reg_aux;
    r.tail = k_tail;
    r.scale_row = reg_s0;
    r.rows_left = reg_rows;
    r.count = reg_kb;  // between rows: the block counter,
    r.src = reg_wk;    // and the row's cursors
    r.dst = reg_xk;
    return r;
  }
  int rule_stack_bytes() const { return rule_ ? rule_->stack_bytes() : 0; }

  void emit_body();
  void emit_data();
  void emit_rows();
  void emit_row();
  // Blocks from the cursors, then the row's totals summed into the stash;
  // chunked kernels (chunk true) store each running total to its slot instead.
  void emit_blocks(int64_t nfull, bool tail_too, bool chunk = false);
  void emit_chunked_rows();
  void emit_group(int n);
  void emit_block(int n, int ti);
  void apply_scale(int n, int ti);
  void apply_step(int s);
  void stash_row();
  void reduce_group(int n);

  // ---- prefetch ----
  // Software prefetch of a later call: a code region that reads `span` bytes
  // from the cursor prefetches the lines at cursor + pfd + 0, 64, ..., spread
  // over its steps, so consecutive regions leave no line out whatever the
  // block size (GGUF blocks of 18 and 34 bytes, 4-bit steps of 16).
  // Bytes of the later call per prefetch instruction.
  int pf_stride() const { return sparse_ ? kSparsePrefetchBytes : 64; }
  void start_prefetch_span(int64_t span) {
    pf_next_ = 0;
    pf_span_ = span;
  }
  // The next prefetch pair: the later call's line, and this stream's line
  // kNearPrefetchBytes ahead into L2 (with kFlagNearL1, kNearL1PrefetchBytes
  // ahead into L1).
  void emit_prefetch() {
    prefetcht1(ptr[reg_wk + reg_pfd + pf_next_]);
    if (key_.flags & kFlagNearL1)
      prefetcht0(ptr[reg_wk + pf_next_ + kNearL1PrefetchBytes]);
    else
      prefetcht1(ptr[reg_wk + pf_next_ + kNearPrefetchBytes]);
    pf_next_ += pf_stride();
  }
  void finish_prefetch_span() {
    while (pf_next_ < pf_span_) emit_prefetch();
  }

  // Byte displacements of the block being emitted inside an unrolled loop body.
  void set_block_disp(int j) {
    dw_ = j * dec_->block_bytes();
    dx_ = j * xblock_bytes_;
    ds_ = j * scale_bytes();
  }
  int scale_bytes() const { return rule_ ? rule_->block_bytes() : 0; }

  // ---- row groups and their horizontal sums ----
  // A group is one vector's worth of rows (16 or 8). Each row stores its
  // per-token total vector in the stash; reduce_group then sums a group's
  // vectors together with shuffles: 45 instructions for 16 rows instead of 9
  // per row. Every row's lanes are added in the same pairs as a per-row
  // extract-and-add tree (lane i + lane i + 8, then i + 4, i + 2, i + 1), so the
  // sums are those of that tree.
  int group_rows() const { return tt_.vec_bytes / 4; }
  int vbytes() const { return tt_.vec_bytes; }
  // G rows x tokens vectors, then one vector to spill a partial group's sums
  // (and the chunks' offsets), then, in chunked kernels with nt > 1 running
  // totals, nt - 1 more areas of G x tokens vectors for totals 1..nt - 1.
  int stash_bytes() const {
    const int extra = chunk_blocks_ > 0 ? plan_.nt - 1 : 0;
    return (group_rows() * key_.tokens * (1 + extra) + 1) * vbytes();
  }
  int stash_off() const { return rule_stack_bytes(); }  // above the scale rule's area
  int spill_off() const { return stash_off() + group_rows() * key_.tokens * vbytes(); }
  // From a row's stash slot (reg_st) to that of its running total j.
  int total_disp(int j) const { return j == 0 ? 0 : (group_rows() * key_.tokens * j + 1) * vbytes(); }
  Address stash_slot(int row, int m) const {
    return ptr[rsp + stash_off() + (row * key_.tokens + m) * vbytes()];
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

  void set_tail_mask(int cnt) {
    mov(reg_tmp, cnt >= 64 ? ~uint64_t(0) : (uint64_t(1) << cnt) - 1);
    kmovq(k_tail, reg_tmp);
  }
  Address x_addr(int m, int off) const { return ptr[reg_xk + m * xstride_bytes_ + dx_ + off * xbytes_]; }
  void multiply(const Xmm& a, const Xmm& w, int m, int off) {
    if (fma_f32_)
      vfmadd231ps(a, w, x_addr(m, off));
    else
      vdpbf16ps(a, w, x_addr(m, off));
  }

  KernelKey key_;
  std::unique_ptr<Decoder> dec_;
  ScaleRule* rule_;  // dec_'s, null when unscaled
  DecodeRegs regs_;  // lent to dec_
  DecodeShape shape_;
  XPrep xprep_;  // the activations' layout
  TierTraits tt_;
  Plan plan_;
  bool scaled_;
  int xbytes_;
  int64_t row_bytes_;
  int64_t xstride_bytes_;  // bytes per token's prepared vector
  int64_t xblock_bytes_;   // prepared-x bytes per block (with its sums of x, if any)
  bool fma_f32_;           // fp32 weights and activations, vfmadd231ps (else bf16 pairs, vdpbf16ps)
  bool sparse_;            // streamed by the hardware prefetchers, one token: unrolled rows, sparse prefetch
  int unroll_ = 1;         // blocks per loop iteration
  int64_t chunk_blocks_ = 0;  // blocks per chunk of K, 0 when rows are not chunked
  int dw_ = 0;                // byte displacements of the block being emitted: weights,
  int64_t dx_ = 0;            // activations,
  int ds_ = 0;                // scales
  int64_t pf_next_ = 0;       // next line offset of the current region to prefetch
  int64_t pf_span_ = 0;       // bytes the current region reads
  Label l_hsum_idx_;          // vpermps index putting a row group's sums in row order
};

void RowBody::emit_body() {
  phase("prologue");
  push(reg_tmp);
  push(reg_rows);
  push(reg_pfd);
  push(reg_aux);
  push(reg_g);
  push(reg_rg);
  mov(reg_wt, ptr[reg_args + offsetof(GemvArgs, w)]);
  mov(reg_pfd, ptr[reg_args + offsetof(GemvArgs, w_prefetch)]);
  sub(reg_pfd, reg_wt);
  mov(reg_s0, ptr[reg_args + offsetof(GemvArgs, scales)]);
  if (dec_->row_globals()) mov(reg_g, ptr[reg_args + offsetof(GemvArgs, row_scales)]);
  if (rule_) rule_->load_args();
  mov(reg_x0, ptr[reg_args + offsetof(GemvArgs, x)]);
  mov(reg_y, ptr[reg_args + offsetof(GemvArgs, y)]);
  dec_->emit_constants();
  sub(rsp, stash_bytes());
  if (rule_) rule_->prologue();

  // Rows in groups of group_rows(): each row leaves its total vectors in the
  // stash, and each group's horizontal sums run together (see reduce_group).
  if (chunk_blocks_ > 0) {
    emit_chunked_rows();
  } else {
    emit_rows();
  }

  phase("epilogue");
  if (rule_stack_bytes() > 0) add(rsp, rule_stack_bytes());
  add(rsp, stash_bytes());
  vzeroupper();
  pop(reg_rg);
  pop(reg_g);
  pop(reg_aux);
  pop(reg_pfd);
  pop(reg_rows);
  pop(reg_tmp);
  ret();
  emit_data();
}

// Rows front to back, each over all of K.
void RowBody::emit_rows() {
  Label l_row, l_next;
  const int rem = int(key_.rows % group_rows());
  mov(reg_rows, key_.rows);
  lea(reg_st, ptr[rsp + stash_off()]);
  mov(reg_rg, group_rows());
  L(l_row);
  if (rule_) rule_->begin_row();
  emit_row();
  add(reg_wt, row_bytes_);
  if (rule_) rule_->next_row();
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
}

// K-chunked rows (see kChunkXBytes): full groups in a loop, then the partial one.
void RowBody::emit_chunked_rows() {
  const int G = group_rows();
  const int64_t full = key_.rows / G;
  const int rem = int(key_.rows % G);
  if (full > 0) {
    Label l_group;
    mov(reg_rows, full);  // groups left (no rule of a chunked kernel reads rows_left)
    L(l_group);
    emit_group(G);
    dec(reg_rows);
    jnz(l_group, T_NEAR);
  }
  if (rem > 0) emit_group(rem);
}

// One group of n rows: its running totals start as zeros in the stash, each
// chunk of K runs over the n rows (one loop over the chunks, their offsets
// in the spill slot), then the group's sums.
void RowBody::emit_group(int n) {
  const int64_t chunks = key_.k / shape_.block / chunk_blocks_;
  const Address off_w = qword[rsp + spill_off()];      // weight bytes of the chunk's first block
  const Address off_x = qword[rsp + spill_off() + 8];  // and its prepared-x bytes
  const Address left = qword[rsp + spill_off() + 16];  // chunks left
  const Xmm z = v_w(0);
  vxorps(z, z, z);
  for (int j = 0; j < plan_.nt; ++j)
    for (int i = 0; i < n * key_.tokens; ++i)
      vmovups(ptr[rsp + stash_off() + total_disp(j) + i * vbytes()], z);
  mov(off_w, 0);
  mov(off_x, 0);
  mov(left, chunks);
  Label l_chunk, l_row;
  L(l_chunk);
  lea(reg_st, ptr[rsp + stash_off()]);
  mov(reg_rg, n);
  L(l_row);
  rule_->begin_row_blocks(off_w, chunk_blocks_);
  for (int m = 0; m < key_.tokens; ++m)
    for (int j = 0; j < plan_.nt; ++j) vmovups(tot(m, j), ptr[reg_st + total_disp(j) + m * vbytes()]);
  mov(reg_wk, reg_wt);
  add(reg_wk, off_w);
  mov(reg_xk, reg_x0);
  add(reg_xk, off_x);
  emit_blocks(chunk_blocks_, false, true);
  add(reg_wt, row_bytes_);
  rule_->next_row();
  add(reg_st, key_.tokens * vbytes());
  dec(reg_rg);
  jnz(l_row, T_NEAR);
  // After the last chunk the cursors stay on the next group's first row.
  Label l_done;
  dec(left);
  jz(l_done, T_NEAR);
  sub(reg_wt, n * row_bytes_);
  rule_->rewind_rows(n);
  add(off_w, int32_t(chunk_blocks_ * dec_->block_bytes()));
  add(off_x, int32_t(chunk_blocks_ * xblock_bytes_));
  jmp(l_chunk, T_NEAR);
  L(l_done);
  if (plan_.nt > 1) {  // each row's totals summed as the unchunked kernel sums them
    phase("store");
    for (int i = 0; i < n; ++i) {
      const int row = (i * key_.tokens) * vbytes();
      for (int m = 0; m < key_.tokens; ++m)
        for (int j = 0; j < plan_.nt; ++j)
          vmovups(tot(m, j), ptr[rsp + stash_off() + total_disp(j) + row + m * vbytes()]);
      sum_tots();
      for (int m = 0; m < key_.tokens; ++m) vmovups(ptr[rsp + stash_off() + row + m * vbytes()], tot(m));
    }
  }
  reduce_group(n);
}

void RowBody::emit_data() {
  phase("data");
  align(64);
  L(l_hsum_idx_);  // lane of row j after reduce_group's tree
  for (int j = 0; j < group_rows(); ++j)
    dd(uint32_t(group_rows() == 16 ? 4 * (j % 4) + j / 4 : 4 * (j % 2) + j / 2));
  align(64);
  dec_->emit_data();
}

// One row over all of K. Scaled formats unroll `unroll_` blocks per loop
// iteration; block b adds into running total b % plan_.nt.
void RowBody::emit_row() {
  if (scaled_)
    for (int m = 0; m < key_.tokens; ++m)
      for (int j = 0; j < plan_.nt; ++j) vxorps(tot(m, j), tot(m, j), tot(m, j));
  else
    zero_accs();
  mov(reg_wk, reg_wt);
  mov(reg_xk, reg_x0);
  mov(reg_sk, rule_ ? rule_->row_cursor() : reg_s0);
  emit_blocks(key_.k / shape_.block, true);
}

// nfull blocks from the cursors (and the row's tail when `tail_too`), then the
// row's totals into its stash slot.
void RowBody::emit_blocks(int64_t nfull, bool tail_too, bool chunk) {
  const int tail = tail_too ? int(key_.k % shape_.block) : 0;
  const int block_bytes = dec_->block_bytes();
  const int64_t iters = nfull / unroll_;
  const int rem = int(nfull % unroll_);
  if (iters > 0) {
    Label l_blk;
    mov(reg_kb, iters);
    L(l_blk);
    start_prefetch_span(unroll_ * block_bytes);
    for (int j = 0; j < unroll_; ++j) {
      set_block_disp(j);
      emit_block(shape_.block, j % std::max(1, plan_.nt));
    }
    finish_prefetch_span();
    set_block_disp(0);
    add(reg_wk, unroll_ * block_bytes);
    add(reg_xk, unroll_ * xblock_bytes_);
    if (scaled_ && scale_bytes() > 0) add(reg_sk, unroll_ * scale_bytes());
    dec(reg_kb);
    jnz(l_blk, T_NEAR);
  }
  if (tail_too)
    start_prefetch_span(row_bytes_ - (row_bytes_ / block_bytes - rem) * block_bytes);
  else
    start_prefetch_span(rem * int64_t(block_bytes));
  for (int j = 0; j < rem; ++j) {
    set_block_disp(j);
    emit_block(shape_.block, j % std::max(1, plan_.nt));
  }
  if (tail > 0) {
    phase("tail");
    set_block_disp(rem);
    emit_block(tail, rem % std::max(1, plan_.nt));
  }
  finish_prefetch_span();
  set_block_disp(0);
  phase("store");
  if (chunk) {  // no total factor (the constructor's condition)
    for (int m = 0; m < key_.tokens; ++m)
      for (int j = 0; j < plan_.nt; ++j) vmovups(ptr[reg_st + total_disp(j) + m * vbytes()], tot(m, j));
    return;
  }
  if (scaled_)
    sum_tots();
  else
    sum_accs();
  stash_row();
}

// n elements (<= shape_.block) starting at the cursors; the last step may be partial.
// Scaled blocks end with tot(m, ti) += (sum of the block's accumulators) * scale.
void RowBody::emit_block(int n, int ti) {
  const bool per_step = shape_.step_scaled;
  if (scaled_ && !per_step) zero_accs();
  int v = 0;  // vector index inside the block: picks the accumulator
  const int run = shape_.scale_steps;
  for (int s = 0; s * shape_.step < n; ++s) {
    if (per_step && s % run == 0) zero_accs();
    const int off = s * shape_.step;
    const int cnt = std::min(shape_.step, n - off);
    if (cnt < shape_.step && key_.isa != Isa::avx2) set_tail_mask(cnt);
    // Each line read is matched by a prefetch of the same line of a later
    // call (into L2: measured ~1.5x faster cold than L1 prefetches here), or
    // one per kSparsePrefetchBytes in sparse kernels, and by one of the line
    // kNearPrefetchBytes (kFlagNearL1: kNearL1PrefetchBytes) ahead.
    while (pf_next_ <= dw_ + dec_->elem_byte(off) && pf_next_ < pf_span_) emit_prefetch();
    if (cnt == shape_.step) phase("decode");
    dec_->load_widen(Cursor{reg_wk, dw_}, off, cnt, regs_.w);
    if (cnt == shape_.step) phase("fma");
    for (int i = 0; i < shape_.vectors(); ++i, ++v)
      for (int m = 0; m < key_.tokens; ++m)
        multiply(acc(m, (per_step ? i : v) % plan_.na), v_w(i), m, off + i * shape_.vec_elems);
    if (per_step && (s % run == run - 1 || (s + 1) * shape_.step >= n)) apply_step(s / run);
  }
  if (scaled_) {
    if (n == shape_.block) phase("block-scale");
    if (!per_step) sum_accs();
    apply_scale(n, ti);
  }
}

// Run s (DecodeShape::scale_steps steps) of a step-scaled block: the rule
// scales its two accumulators of every token into that token's two running
// totals.
void RowBody::apply_step(int s) {
  std::vector<Xmm> sums, totals;
  for (int m = 0; m < key_.tokens; ++m)
    for (int j = 0; j < 2; ++j) {
      sums.push_back(acc(m, j));
      totals.push_back(tot(m, j));
    }
  StepBlock b;
  b.w = Cursor{reg_wk, dw_};
  b.step = s;
  b.sums = sums;
  b.totals = totals;
  rule_->apply_step(b);
}

// tot(m, ti) += acc(m, 0) * the block's scale, by the decoder's scale rule.
void RowBody::apply_scale(int n, int ti) {
  std::vector<Xmm> sums, totals;
  std::vector<Address> xsums;
  for (int m = 0; m < key_.tokens; ++m) {
    sums.push_back(acc(m, 0));
    totals.push_back(tot(m, ti));
    // the block's sums of x follow its activations
    if (xprep_.sums().span)
      xsums.push_back(ptr[reg_xk + m * xstride_bytes_ + dx_ + xblock_bytes_ - kXSumBytes]);
  }
  ScaleBlock b;
  b.w = Cursor{reg_wk, dw_};
  b.s = Cursor{reg_sk, ds_};
  b.n = n;
  b.sums = sums;
  b.totals = totals;
  b.xsums = xsums;
  rule_->apply(b);
}

// The row's total vector of each token into its stash slot, times the
// decoder's total factor (the fp16 widening's 2^-8 undone).
void RowBody::stash_row() {
  const float factor = dec_->total_factor();
  const bool scale = factor != 1.0f;
  if (scale) {
    uint32_t bits;
    std::memcpy(&bits, &factor, 4);
    broadcast_u32(v_scale(), bits, reg_tmp.cvt32());
  }
  for (int m = 0; m < key_.tokens; ++m) {
    if (scale) {
      vmulps(v_w(), tot(m), v_scale());
      vmovups(ptr[reg_st + m * vbytes()], v_w());
    } else {
      vmovups(ptr[reg_st + m * vbytes()], tot(m));
    }
  }
}

// Sums of the group's first n rows to y[m * rows + r] (times each row's global
// where the decoder has them). Rows n.. of a partial group enter the tree as zeros.
void RowBody::reduce_group(int n) {
  phase("reduce");
  const int G = group_rows();
  auto in = [&](int i) { return vec(tt_.acc_first + i); };  // G inputs: accumulator registers
  const Xmm t0 = v_w(0), t1 = v_w(1), idx = v_t(0);
  const bool zmm = G == 16;
  const bool globals = dec_->row_globals();
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
      if (globals) vmulps(in(0), in(0), ptr[reg_g]);
      vmovups(ptr[reg_y + m * key_.rows * 4], in(0));
    } else {
      vmovups(ptr[rsp + spill_off()], in(0));
      const Xmm x0 = Xmm(t0.getIdx());
      for (int i = 0; i < n; ++i) {
        vmovss(x0, ptr[rsp + spill_off() + i * 4]);
        if (globals) vmulss(x0, x0, ptr[reg_g + i * 4]);
        vmovss(ptr[reg_y + m * key_.rows * 4 + i * 4], x0);
      }
    }
  }
  add(reg_y, n * 4);
  if (globals) add(reg_g, n * 4);
}

}  // namespace

bool row_body_has_tier(Isa isa) { return tier_traits(isa).vec_bytes > 0; }

int row_body_max_tokens(const KernelKey& key, const Decoder& dec) {
  return tier_traits(key.isa).acc_count / plan_of(dec.shape()).regs_per_token();
}

std::shared_ptr<const Kernel> generate_row_kernel(const KernelKey& key, std::unique_ptr<Decoder> dec,
                                                  std::string* err) {
  return generate_body_kernel<RowBody>(key, std::move(dec), err);
}

}  // namespace moejit::jit
