// GGUF K-quants (q4_K, q5_K, q6_K, q2_K, q3_K; formats/kquants.h has the
// layouts): one 256-element super-block per scale block, widened to fp32 and
// multiplied by vfmadd231ps on every tier (avx2, avx512, avx512_bf16).
//
// The row body sums a block's products and hands the sums to the scale rule
// once per block. A K-quant's sub-blocks (16 or 32 elements) each have their
// own factor D_j = d sc[j], and every decoded vector lies inside one
// sub-block (but q4_K's and q5_K's fp32 lanes, Q45Lanes, which scale sums per 128
// elements as the pairs do), so the decode multiplies each vector by its D_j (exact in fp32,
// and so is D_j q: at most 23 significant bits) and the rule adds the block's
// sum and, for the formats with mins, subtracts M . S_x with one FMA against
// the prepared sums of x (M_j = dmin m[j], XPrep's XSums). Products stay exact;
// the summation order differs from kquant_gemv, as formats.md allows.
//
// Why not bf16 and vdpbf16ps on avx512_bf16 everywhere: on Intel a 4-bit step
// costs 3.39 cycles per 32 products as bf16 pairs (shift, vpermw, vdpbf16ps:
// 4 uops on both vector ports) and 1.47 per 16 in fp32 (shift, vpermps, FMA;
// moejit-bench-ports, 16-core Xeon, docs/PERFORMANCE.md), so fp32 multiplies
// faster there. On AMD (Zen 5:
// 0.74 cycles per 32 against 0.73 per 16) the pairs are cheaper: every
// K-quant has a bf16-pair decode (KQuantPairs, kFlagBf16Pairs), which the
// runtime runs there and, for q6_K and q3_K, on Intel too. The sub-block
// factors then scale each step's sums, since d sc[j] q does not fit a bf16.
//
// A super-block's factors are a record on the rule's stack area (aux): D_j,
// M_j, and a format's extra E_j (q5_K 16 D_j, q6_K -32 D_j, q3_K 4 D_j). At the
// top of each row the rule decodes the records of every super-block of the
// row (GemvArgs::scales points at the weights), or, for rows too long for the
// area, load_widen decodes each block's record at its first step (the bf16
// pairs keep a block's factors in a register instead). Each step
// then widens 4 vectors. avx512 looks quants up in 16-entry
// vpermps tables of D_j times the quant value (one vmulps builds a table; vpermps
// reads only an index's low 4 bits, so no masking); avx2 converts with vcvtdq2ps
#include "jit/decode_kquant.h"

#include "formats/formats.h"

namespace moejit::jit {

namespace kquant {

int KQuantRule::stack_bytes() const { return dec_->area_bytes() + 64; }

void KQuantRule::begin_row() {
  if (dec_->rows_mode()) dec_->emit_row_records();
}

void KQuantRule::next_row() {
  if (dec_->rows_mode()) a().add(r_.scale_row, dec_->blocks() * dec_->block_bytes());
}

void KQuantRule::begin_row_blocks(const Address& first_byte, int64_t n) {
  if (dec_->rows_mode()) dec_->emit_row_records(&first_byte, n);
}

void KQuantRule::rewind_rows(int n) {
  if (dec_->rows_mode()) a().sub(r_.scale_row, n * dec_->blocks() * dec_->block_bytes());
}

void KQuantRule::apply(const ScaleBlock& b) {
  Generator& g = a();
  if (!shape_.step_scaled)
    for (size_t m = 0; m < b.totals.size(); ++m) g.vaddps(b.totals[m], b.totals[m], b.sums[m]);
  if (!mins_) return;
  const Reg64 rec = dec_->record_of(b.w);
  const int m_off = dec_->m_off();
  // Lanes past the sub-blocks are zero in M and in the sums of x.
  const int parts = zmm() ? 1 : subs_ / 8;
  const Ymm ys = Ymm(r_.scale.getIdx());
  const Xmm mins = shape_.step_scaled ? r_.w[0] : r_.scale;  // step-scaled: r_.scale holds the factors
  for (int p = 0; p < parts; ++p) {
    if (shape_.step_scaled)
      dec_->load_mins(mins, b.w);
    else if (zmm() && subs_ == 16)
      g.vmovups(r_.scale, ptr[rec + m_off]);
    else
      g.vmovups(ys, ptr[rec + m_off + 32 * p]);  // a ymm load zeros the upper half of the zmm
    for (size_t m = 0; m < b.totals.size(); ++m)
      g.vfnmadd231ps(b.totals[m], mins, ptr[b.xsums[m].getRegExp() + 32 * p]);
  }
}

// The decoder's factor vector F(t, p) scales the step-t accumulator of
// parity p of every token (Q4Pairs has the lanes).
void KQuantRule::apply_step(const StepBlock& b) {
  Generator& g = a();
  for (int p = 0; p < 2; ++p) {
    dec_->emit_factor_vector(r_.w[p], b.step, p);
    for (size_t i = p; i < b.sums.size(); i += 2) g.vfmadd231ps(b.totals[i], b.sums[i], r_.w[p]);
  }
}

void KQuantDecoder::emit_packed6(const Address& src, const Xmm& out0, const Xmm& out1, const Xmm& t0,
                                 const Xmm& t1) {
  Generator& a = g();
  const Xmm l = Xmm(t0.getIdx()), h = Xmm(t1.getIdx());
  a.vmovdqu(l, src);
  a.vpshufb(h, l, ptr[rip + d_.idx2]);
  a.vpshufb(l, l, ptr[rip + d_.idx1]);
  const int halves = zmm() ? 1 : 2;
  for (int p = 0; p < halves; ++p) {
    const Xmm o = v(p == 0 ? out0 : out1);
    const Xmm t = v(p == 0 ? out1 : t1);  // out1 is free until the second half
    if (p == 1) {
      a.vpsrldq(l, l, 8);
      a.vpsrldq(h, h, 8);
    }
    a.vpmovzxbd(o, l);
    a.vpmovzxbd(t, h);
    const int off = 32 * p;
    a.vpsrlvd(o, o, ptr[rip + d_.s1 + off]);
    a.vpsrlvd(t, t, ptr[rip + d_.s2 + off]);
    if (zmm()) {
      a.vpandd(o, o, ptr[rip + d_.m1]);
      a.vpandd(t, t, ptr_b[rip + d_.c3]);
    } else {
      a.vpand(o, o, ptr[rip + d_.m1 + off]);
      a.vpand(t, t, ptr[rip + d_.c3]);
    }
    a.vpslld(t, t, 4);
    if (zmm())
      a.vpord(o, o, t);
    else
      a.vpor(o, o, t);
  }
}

void KQuantDecoder::emit_data() {
  Decoder::emit_data();
  Generator& a = g();
  a.align(64);
  a.L(d_.bits);
  for (int j = 0; j < 32; ++j) a.dd(1u << j);
  a.L(d_.base);
  for (int i = 0; i < 16; ++i) a.df32(float(i));
  const float off = format() == Format::q3_K ? -4.0f : 0.0f;
  a.L(d_.pat0);
  for (int i = 0; i < 16; ++i) a.df32(float(i & 3) + off);
  a.L(d_.pat1);
  for (int i = 0; i < 16; ++i) a.df32(float(i >> 2) + off);
  // The packed 6-bit scales: per lane j, byte picks and shifts (kquants.h).
  uint8_t i1[16], i2[16];
  uint32_t s1[16], m1[16], s2[16];
  for (int j = 0; j < 16; ++j) {
    if (format() == Format::q3_K) {  // 16 bytes from the block's byte 94: s[k] is byte 2 + k
      i1[j] = uint8_t(2 + j % 8), s1[j] = 4 * (j / 8), m1[j] = 15;
      i2[j] = uint8_t(10 + j % 4), s2[j] = 2 * (j / 4);
    } else {  // q4_K / q5_K, 16 bytes from byte 0: s[k] is byte 4 + k; lanes 0..7 sc, 8..15 m
      const int q = j % 8;
      const bool m = j >= 8;
      i1[j] = uint8_t(q < 4 ? (m ? 8 + q : 4 + q) : 8 + q), s1[j] = q >= 4 && m ? 4 : 0,
      m1[j] = q < 4 ? 63 : 15;
      i2[j] = q < 4 ? 0x80 : uint8_t(m ? 4 + q : q), s2[j] = 6;
    }
  }
  a.L(d_.idx1);
  for (uint8_t b : i1) a.db(b);
  a.L(d_.idx2);
  for (uint8_t b : i2) a.db(b);
  a.align(32);
  a.L(d_.s1);
  for (uint32_t x : s1) a.dd(x);
  a.L(d_.m1);
  for (uint32_t x : m1) a.dd(x);
  a.L(d_.s2);
  for (uint32_t x : s2) a.dd(x);
  auto dwords = [&](Label& l, uint32_t x) {
    a.L(l);
    for (int i = 0; i < 8; ++i) a.dd(x);
  };
  dwords(d_.c3, 3);
  dwords(d_.c4, 4);
  dwords(d_.c15, 15);
  dwords(d_.c16, 16);
  dwords(d_.c30, 0x30);
  dwords(d_.c32, 32);
  a.L(d_.ef);
  a.df32(format() == Format::q5_K ? 16.0f : format() == Format::q6_K ? -32.0f : 4.0f);
}

// ---------------------------------------------------------------- avx512

namespace {

// q4_K and q5_K, natural order: step c is nibble group c (qs bytes 32c..32c+31:
// low nibbles sub-block 2c, high nibbles 2c + 1), four vectors of 16.
class Q45Zmm : public KQuantDecoder {
 public:
  explicit Q45Zmm(const KernelKey& key) : KQuantDecoder(key, XLayout::f32) {}
  void emit_decode_constants() override {
    g().vmovups(r_.c[0], ptr[rip + d_.base]);
    g().mov(r_.tmp.cvt32(), kGroup2Lanes);
    g().kmovw(k_grp2, r_.tmp.cvt32());
    set_lo8();
  }
  // The 6-bit scales and mins unpacked in general-purpose registers (their
  // ALU ports are the ones the vector code leaves idle; the vector unpack cost
  // a fifth of the kernel), as bytes sc 0..7, m 0..7 (kquants.h):
  //   sc 0..3 = s[0..3] & 63, m 0..3 = s[4..7] & 63,
  //   sc 4..7 = s[8..11] & 15 | (s[0..3] >> 6) << 4, m 4..7 = s[8..11] >> 4 | (s[4..7] >> 6) << 4.
  void emit_factors(const Cursor& w) override {
    Generator& a = g();
    const Reg64 t = r_.tmp, u = r11;  // r11 saved around it
    const Xmm b = Xmm(r_.w[2].getIdx());
    a.push(r11);
    auto dword = [&](const Reg64& r, int at, int shr, uint32_t mask) {
      a.mov(r.cvt32(), ptr[w.at(4 + at)]);
      if (shr) a.shr(r.cvt32(), shr);
      a.and_(r.cvt32(), mask);
    };
    // sc 0..7 in t, to the low qword of b
    dword(t, 0, 2, 0x30303030u);  // (s >> 6) << 4 of each byte
    dword(u, 8, 0, 0x0F0F0F0Fu);
    a.or_(t, u);
    a.shl(t, 32);
    dword(u, 0, 0, 0x3F3F3F3Fu);
    a.or_(t, u);
    a.vmovq(b, t);
    // m 0..7 in t, to the high qword
    dword(t, 4, 2, 0x30303030u);
    dword(u, 8, 4, 0x0F0F0F0Fu);
    a.or_(t, u);
    a.shl(t, 32);
    dword(u, 4, 0, 0x3F3F3F3Fu);
    a.or_(t, u);
    a.vpinsrq(b, b, t, 1);
    a.pop(r11);
    const Xmm f = r_.w[0], h = Xmm(r_.w[1].getIdx());
    a.vcvtph2ps(h, ptr[w.at()]);  // d, dmin (and two halves of scale bytes)
    a.vmovups(ptr[rec_ + kHalfOff], h);
    a.vpmovzxbd(f, b);
    a.vcvtdq2ps(f, f);
    a.vmulps(f | k_lo8, f, half_bcst(0));
    a.vmulps(f | k_grp2, f, half_bcst(1));
    a.vmovups(ptr[rec_], f);  // D_j at +4 j, M_j at +32 + 4 j (m_off)
    if (format() == Format::q5_K) store_e(f);
  }
  void emit_step(const Cursor& w, int c, const Xmm* dst) override {
    Generator& a = g();
    const bool q5 = format() == Format::q5_K;
    const int qs = q5 ? 48 : 16;
    const Xmm ta = r_.c[2], tb = r_.c[3];
    a.vmulps(ta, r_.c[0], d_bcst(2 * c));
    a.vmulps(tb, r_.c[0], d_bcst(2 * c + 1));
    a.vpmovzxbd(dst[0], ptr[w.at(qs + 32 * c)]);
    a.vpmovzxbd(dst[1], ptr[w.at(qs + 32 * c + 16)]);
    a.vpsrld(dst[2], dst[0], 4);
    a.vpsrld(dst[3], dst[1], 4);
    const Xmm qa = r_.c[4], qb = r_.scale;
    if (q5) {  // the fifth bit of element 64c + 32 par + b is bit 2c + par of qh[b]
      a.vpmovzxbd(qa, ptr[w.at(16)]);
      a.vpmovzxbd(qb, ptr[w.at(32)]);
    }
    for (int i = 0; i < 4; ++i) {
      const int j = 2 * c + i / 2;
      a.vpermps(Zmm(dst[i].getIdx()), Zmm(dst[i].getIdx()), i < 2 ? ta : tb);
      if (!q5) continue;
      a.vptestmd(k_sub, i % 2 ? qb : qa, bit_bcst(j));
      a.vaddps(dst[i] | k_sub, dst[i], e_bcst(j));
    }
  }
};

// The bf16-pair decodes (kFlagBf16Pairs): step-scaled, no factor records. A
// block's first step decodes its factors into r_.scale (emit_block_factors),
// where they stay for the block's steps (apply_step's factor vectors) and its
// min term: records stored at a row's start and read back cost a q4_K pair
// kernel half its time on Zen 5 (docs/PERFORMANCE.md).
class KQuantPairs : public KQuantDecoder {
 public:
  KQuantPairs(const KernelKey& key, XLayout layout, const char* lookup)
      : KQuantDecoder(key, layout), lookup_(lookup) {
    set_step_scaled();
  }
  bool kquant_pairs() const override { return true; }
  bool has_records() const override { return false; }
  std::string describe() const override {
    return std::string("K-quant -> bf16 pairs (") + lookup_ + "), vdpbf16ps, times d sc[j] per step";
  }
  void load_widen(const Cursor& w, int off, int /*cnt*/, const Xmm* dst) override {
    if (off == 0) emit_block_factors(w);
    emit_step(w, off / shape_.step, dst);
  }
  // F(t, p): the block's factors permuted by the index vector 2 t + p.
  void emit_factor_vector(const Xmm& dst, int t, int p) override {
    const Zmm d = Zmm(dst.getIdx());
    g().vmovups(d, ptr[rip + l_fidx_ + 64 * (2 * t + p)]);
    g().vpermps(d, d, Zmm(r_.scale.getIdx()));
  }

 protected:
  // One qword of a vgf2p8affineqb matrix: output bit `to` of every byte takes
  // input bit `from` (row b of the matrix is byte 7 - b), the other bits none.
  static uint64_t gf2_rows(std::initializer_list<std::pair<int, int>> to_from) {
    uint64_t m = 0;
    for (const auto& [to, from] : to_from) m |= uint64_t(1u << from) << 8 * (7 - to);
    return m;
  }
  virtual void emit_block_factors(const Cursor& w) = 0;
  // The factor (sub-block) of lane l of F(t, p), q = 2 t + p.
  virtual int factor_lane(int q, int l) const = 0;
  void emit_factors(const Cursor& /*w*/) override {}
  // The index vectors of the four F(t, p), and the masks of vpternlogd's
  // joins: the low four bits of every word, or of every byte, from the quant
  // word, the rest from the other operand.
  void emit_pair_data() {
    Generator& a = g();
    a.align(64);
    a.L(l_fidx_);
    for (int q = 0; q < 4; ++q)
      for (int l = 0; l < 16; ++l) a.dd(uint32_t(factor_lane(q, l)));
    a.L(l_low4_);
    a.dd(0x000F000Fu);
    a.dd(0x0F0F0F0Fu);
  }
  Address low4() const { return ptr_b[rip + l_low4_]; }
  Address low4_bytes() const { return ptr_b[rip + l_low4_ + 4]; }
  Label l_fidx_;

 private:
  const char* lookup_;
  Label l_low4_;
};

// q4_K and q5_K as bf16 pairs (kFlagBf16Pairs): step t loads the quants' 64-byte
// half t and vector j takes nibble j of every 16-bit word (emit_nibble_words:
// three shifts, four vpermw of a table of 0..15 as bf16, exact), so vector j
// lanes 0..7 hold sub-block 4 t + j % 2 and lanes 8..15 sub-block 4 t + 2 + j % 2
// (XLayout::bf16_kq4 puts x there). vdpbf16ps sums q x exactly into the even
// and the odd vectors' accumulators, and apply_step scales them by the factor
// vectors F(t, p) (D_(4t+p) on lanes 0..7, D_(4t+2+p) on 8..15), one vpermps
// each of the block's factors.
class Q4Pairs : public KQuantPairs {
 public:
  explicit Q4Pairs(const KernelKey& key) : Q4Pairs(key, XLayout::bf16_kq4, "vpermw of q") {}
  // q4_K keeps the factor vectors' indices in c[1..4]; q5_K needs c[1] for its
  // fifth bits and loads them.
  void emit_decode_constants() override {
    g().vmovups(r_.c[0], ptr[rip + l_words_]);
    if (!q5_)
      for (int q = 0; q < 4; ++q) g().vmovups(r_.c[1 + q], ptr[rip + l_fidx_ + 64 * q]);
    set_lo8();  // load_mins's zeroing mask
  }
  void emit_data() override {
    KQuantDecoder::emit_data();
    Generator& a = g();
    a.align(64);
    a.L(l_words_);  // q4_K: bf16 of i & 15 (vpermw reads five index bits); q5_K: of i
    for (int i = 0; i < 32; ++i) a.dw(formats::f32_to_bf16(float(q5_ ? i : i & 15)));
    // q5_K: per step t, vgf2p8affineqb's matrices for the low and then the
    // high nibbles: the fifth bit of byte p's nibble n is bit 4 t + 2 (p >= 32)
    // + n of qh[p % 32], onto bit 4.
    a.L(l_fifth_);
    for (int t = 0; t < 2; ++t)
      for (int n = 0; n < 2; ++n)
        for (int q = 0; q < 8; ++q) a.dq(gf2_rows({{4, 4 * t + 2 * (q / 4) + n}}));
    a.L(l_dm_);  // d on the lanes of D, dmin on those of M
    for (int l = 0; l < 16; ++l) a.dd(uint32_t(l / 4 % 2));
    a.L(l_mins_);  // M_0..7's lanes
    for (int j = 0; j < 8; ++j) a.dd(uint32_t(m_lane(j)));
    for (int j = 8; j < 16; ++j) a.dd(0);
    // The scales' bytes b[0..11] (header bytes 4..15), as kquants.h unpacks them:
    // sc 0..3 = b[0..3] & 63, m 0..3 = b[4..7] & 63, sc 4..7 = b[8..11] & 15 |
    // (b[0..3] >> 6) << 4, m 4..7 = b[8..11] >> 4 | (b[4..7] >> 6) << 4. Lanes
    // 0..7 take b[0..7] & 63 (qword 0 of vgf2p8affineqb's matrices), lanes 8..15
    // their top two bits on bits 4..5 (qword 1), joined to b[8..11] shifted per
    // dword (0 for sc, 4 for m) and masked to the low nibble (lanes 8..15 only).
    a.align(16);
    a.L(l_sc6_);
    a.dq(gf2_rows({{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 5}}));
    a.dq(gf2_rows({{4, 6}, {5, 7}}));
    for (int d = 0; d < 4; ++d) a.dd(d == 3 ? 4 : 0);
    a.dq(0);
    a.dq(0x0F0F0F0F0F0F0F0Full);
    emit_pair_data();
  }
  // r_.scale's lanes: D_0..3 on 0..3, M_0..3 on 4..7, D_4..7 on 8..11, M_4..7
  // on 12..15 (each qword of the 6-bit unpack decodes one way).
  static int d_lane(int j) { return j < 4 ? j : j + 4; }
  static int m_lane(int j) { return d_lane(j) + 4; }
  // F(t, p): D_(4t+p) on lanes 0..7, D_(4t+2+p) on 8..15.
  int factor_lane(int q, int l) const override { return d_lane(4 * (q / 2) + q % 2 + (l < 8 ? 0 : 2)); }
  // The factors from the 16 header bytes: the 6-bit scales and mins as bytes
  // (two broadcast loads, one vgf2p8affineqb, one vpsrlvd, one vpternlogd;
  // GFNI), widened, converted and times d or dmin (one vpermps puts them on
  // their lanes).
  void emit_block_factors(const Cursor& w) override {
    Generator& a = g();
    const Zmm f = Zmm(r_.scale.getIdx()), t0 = Zmm(r_.w[1].getIdx()), t1 = Zmm(r_.w[2].getIdx());
    const Xmm fx = Xmm(f.getIdx()), tx = Xmm(t0.getIdx());
    a.vpbroadcastq(fx, ptr[w.at(4)]);   // b[0..7], both qwords
    a.vpbroadcastd(tx, ptr[w.at(12)]);  // b[8..11], every dword
    a.vgf2p8affineqb(fx, fx, ptr[rip + l_sc6_], 0);
    a.vpsrlvd(tx, tx, ptr[rip + l_sc6_ + 16]);
    a.vpternlogd(fx, tx, ptr[rip + l_sc6_ + 32], 0xF8);  // fx | (tx & mask)
    a.vpmovzxbd(f, fx);
    a.vcvtdq2ps(f, f);
    a.vcvtph2ps(tx, ptr[w.at()]);  // d, dmin, (two halves of scale bytes)
    a.vmovups(t1, ptr[rip + l_dm_]);
    a.vpermps(t1, t1, t0);
    a.vmulps(f, f, t1);
  }
  void load_mins(const Xmm& dst, const Cursor& /*w*/) override {
    const Zmm m = Zmm(dst.getIdx());
    g().vmovups(m, ptr[rip + l_mins_]);
    g().vpermps(m | k_lo8 | T_z, m, Zmm(r_.scale.getIdx()));  // lanes 8..15 zero
  }
  bool needs_gfni() const override { return true; }
  void emit_step(const Cursor& w, int t, const Xmm* dst) override {
    Generator& a = g();
    if (!q5_) {
      a.vmovdqu32(Zmm(dst[0].getIdx()), ptr[w.at(16 + 64 * t)]);
      emit_nibble_words(a, dst, r_.c[0]);
      return;
    }
    // q5_K: the fifth bit of element i of sub-block s is bit s of qh[i] (the
    // 32 bytes at 16, broadcast to both 256-bit halves). The low nibbles of
    // the step's bytes keep bits 0..3 and take their fifth bits on bit 4 (one
    // vgf2p8affineqb of qh, GFNI, and one vpternlogd); so do the high nibbles,
    // shifted down by 4. Vectors 2 and 3 are those words shifted by 8.
    const Zmm d0 = Zmm(dst[0].getIdx()), d1 = Zmm(dst[1].getIdx()), d2 = Zmm(dst[2].getIdx()),
              d3 = Zmm(dst[3].getIdx()), hb = Zmm(r_.c[1].getIdx());
    a.vbroadcasti64x4(hb, ptr[w.at(16)]);
    a.vmovdqu32(d0, ptr[w.at(48 + 64 * t)]);
    a.vpsrlw(d1, d0, 4);
    a.vgf2p8affineqb(d2, hb, ptr[rip + l_fifth_ + 128 * t], 0);
    a.vgf2p8affineqb(hb, hb, ptr[rip + l_fifth_ + 128 * t + 64], 0);
    a.vpternlogd(d0, d2, low4_bytes(), 0xE4);  // low nibbles ? nibble : fifth bit
    a.vpternlogd(d1, hb, low4_bytes(), 0xE4);
    a.vpsrlw(d2, d0, 8);
    a.vpsrlw(d3, d1, 8);
    for (int j = 0; j < 4; ++j) a.vpermw(Zmm(dst[j].getIdx()), Zmm(dst[j].getIdx()), Zmm(r_.c[0].getIdx()));
  }
  // F(t, p) into a widened-weight register (free once the step's products ran).
  void emit_factor_vector(const Xmm& dst, int t, int p) override {
    if (q5_) return KQuantPairs::emit_factor_vector(dst, t, p);
    g().vpermps(Zmm(dst.getIdx()), Zmm(r_.c[1 + 2 * t + p].getIdx()), Zmm(r_.scale.getIdx()));
  }

 protected:
  Q4Pairs(const KernelKey& key, XLayout layout, const char* lookup)
      : KQuantPairs(key, layout, lookup), q5_(format() == Format::q5_K) {}
  bool q5() const { return q5_; }
  Label l_fifth_;

 private:
  bool q5_;
  Label l_words_, l_dm_, l_mins_, l_sc6_;
};

// q4_K and q5_K in fp32 with the pairs' sub-block lanes (avx512 and
// avx512_bf16 without kFlagBf16Pairs or kFlagNoGfni): the quants' 64-byte half
// h is steps 2 h and 2 h + 1, and vector j of step t holds nibble n = 4 (t % 2)
// + j of every dword of it (q4_K: vpsrld by 4 n, then vpermps of the fp32
// table 0..15, which reads an index's low four bits: exact). Dword lane L is
// byte 4 L + n / 2 of the half, so lanes 0..7 are sub-block 4 h + n % 2 and
// lanes 8..15 sub-block 4 h + 2 + n % 2, as in Q4Pairs' vectors of half h
// (XLayout::f32_kq4 puts x there). The two steps of a half sum their even and
// odd vectors into two accumulators per token (DecodeShape::scale_steps 2),
// which apply_step scales by Q4Pairs' factor vectors F(h, p): one vpermps and
// one FMA each per 128 elements, where Q45Zmm multiplies every vector by its
// D_j. Per 16 products a shift (port 0 on Intel), a vpermps (port 5) and an
// FMA (either), against the pairs' shift, vpermw (ports 0 and 5) and half a
// vdpbf16ps (two uops on port 5 per 32).
//
// q5_K: step 2 h joins the fifth bits to the half's bytes as its pairs do
// (two vgf2p8affineqb of the broadcast qh and two vpternlogd): E holds every
// byte's low nibble and its fifth bit, O its high nibble and its fifth bit
// (bits 5..7 zero). Vector j of step t is then E or O (j even or odd) shifted
// right by 8 (2 (t % 2) + j / 2), and vpermi2ps looks up its low five bits in
// the 32-entry table 0..31 (c[0], c[1]). Step 2 h leaves E >> 16 and O >> 16
// in c[2], c[3] for step 2 h + 1.
class Q45Lanes : public Q4Pairs {
 public:
  explicit Q45Lanes(const KernelKey& key) : Q4Pairs(key, XLayout::f32_kq4, "") { set_step_scaled(2); }
  bool kquant_pairs() const override { return false; }
  std::string describe() const override {
    return std::string("K-quant -> fp32 (") + (q5() ? "vpermi2ps" : "vpermps") +
           " of q), vfmadd231ps, times d sc[j] per 128 elements";
  }
  void emit_decode_constants() override {
    if (q5()) {  // the factor vectors' indices come from memory (KQuantPairs::emit_factor_vector)
      g().vmovups(r_.c[0], ptr[rip + l_values_]);
      g().vmovups(r_.c[1], ptr[rip + l_values_ + 64]);
    } else {
      g().vmovups(r_.c[0], ptr[rip + d_.base]);
      for (int q = 0; q < 4; ++q) g().vmovups(r_.c[1 + q], ptr[rip + l_fidx_ + 64 * q]);
    }
    set_lo8();  // load_mins's zeroing mask
  }
  void emit_data() override {
    Q4Pairs::emit_data();
    if (!q5()) return;
    g().align(64);
    g().L(l_values_);  // fp32 0..31
    for (int i = 0; i < 32; ++i) g().df32(float(i));
  }
  void emit_step(const Cursor& w, int t, const Xmm* dst) override {
    Generator& a = g();
    if (q5()) return emit_step_q5(w, t, dst);
    const int n0 = 4 * (t % 2);
    const Zmm q = Zmm(dst[0].getIdx());
    a.vmovdqu32(q, ptr[w.at(16 + 64 * (t / 2))]);
    for (int j = 3; j >= 1; --j) a.vpsrld(Zmm(dst[j].getIdx()), q, 4 * (n0 + j));  // dst[0] last
    if (n0) a.vpsrld(q, q, 4 * n0);
    for (int j = 0; j < 4; ++j) a.vpermps(Zmm(dst[j].getIdx()), Zmm(dst[j].getIdx()), Zmm(r_.c[0].getIdx()));
  }

 private:
  void emit_step_q5(const Cursor& w, int t, const Xmm* dst) {
    Generator& a = g();
    const Zmm d0 = Zmm(dst[0].getIdx()), d1 = Zmm(dst[1].getIdx()), d2 = Zmm(dst[2].getIdx()),
              d3 = Zmm(dst[3].getIdx()), e16 = Zmm(r_.c[2].getIdx()), o16 = Zmm(r_.c[3].getIdx());
    if (t % 2 == 0) {
      const int h = t / 2;
      a.vbroadcasti64x4(d3, ptr[w.at(16)]);  // qh
      a.vmovdqu32(d0, ptr[w.at(48 + 64 * h)]);
      a.vgf2p8affineqb(d2, d3, ptr[rip + l_fifth_ + 128 * h], 0);
      a.vgf2p8affineqb(d3, d3, ptr[rip + l_fifth_ + 128 * h + 64], 0);
      a.vpsrlw(d1, d0, 4);
      a.vpternlogd(d0, d2, low4_bytes(), 0xE4);  // E: low nibbles ? nibble : fifth bit
      a.vpternlogd(d1, d3, low4_bytes(), 0xE4);  // O
      a.vpsrld(e16, d0, 16);
      a.vpsrld(o16, d1, 16);
      a.vpsrld(d2, d0, 8);
      a.vpsrld(d3, d1, 8);
    } else {
      a.vpsrld(d2, e16, 8);
      a.vpsrld(d3, o16, 8);
      a.vmovdqa32(d0, e16);
      a.vmovdqa32(d1, o16);
    }
    for (int j = 0; j < 4; ++j)
      a.vpermi2ps(Zmm(dst[j].getIdx()), Zmm(r_.c[0].getIdx()), Zmm(r_.c[1].getIdx()));
  }

  Label l_values_;
};

// q6_K as bf16 pairs (kFlagBf16Pairs): step h takes the 64 ql bytes and
// the 32 qh bytes of half h. Vector j holds, for each 16-bit word w of the ql
// bytes, nibble j with its crumb: element (a, l) of the half (e = 32 a + l, q
// from ql[l + 32 (a % 2)]'s low or high nibble and qh[l] >> 2 a) sits in word
// w = 16 (a % 2) + l / 2 of vector j = 2 (l % 2) + a / 2 (XLayout::bf16_kq6).
// The qh bytes, broadcast to both 256-bit halves, are shifted per word so the
// crumb lands on bits 4..5, one vpternlogd joins it to the nibble, and one
// vpermi2w looks the 6-bit q up in 64 words of bf16(q - 32) (exact). Dword lane
// L of vector j is sub-block 8 h + 4 (j % 2) + L / 4, so the even and the odd
// vectors each cover four sub-blocks, scaled per step as q4_K's are.
class Q6Pairs : public KQuantPairs {
 public:
  explicit Q6Pairs(const KernelKey& key) : KQuantPairs(key, XLayout::bf16_kq6, "vpermi2w of q - 32") {}
  void emit_decode_constants() override {
    g().vmovups(r_.c[0], ptr[rip + l_values_]);
    g().vmovups(r_.c[1], ptr[rip + l_values_ + 64]);
  }
  void emit_data() override {
    KQuantDecoder::emit_data();
    Generator& a = g();
    a.align(64);
    a.L(l_values_);  // bf16 of q - 32 for q = 0..63
    for (int q = 0; q < 64; ++q) a.dw(formats::f32_to_bf16(float(q - 32)));
    a.L(l_counts_);  // per vector j, the qh word shifts that put its crumbs on bits 4..5
    for (int j = 0; j < 4; ++j)
      for (int w = 0; w < 32; ++w) {
        const int sh = 8 * (j / 2) + 2 * (w >= 16) + 4 * (j % 2);  // the crumb's bit in the word
        a.dw(uint16_t(j == 0 ? 4 - sh : sh - 4));                  // j = 0 shifts left, the others right
      }
    emit_pair_data();
  }
  // F(h, p): lane l takes D of sub-block 8 h + 4 p + l / 4.
  int factor_lane(int q, int l) const override { return 8 * (q / 2) + 4 * (q % 2) + l / 4; }
  // D_j = d sc[j] of the block's 16 sub-blocks in r_.scale, from its first step on.
  void emit_block_factors(const Cursor& w) override {
    Generator& a = g();
    const Zmm f = Zmm(r_.scale.getIdx()), t = Zmm(r_.w[1].getIdx());
    a.vpmovsxbd(f, ptr[w.at(192)]);
    a.vcvtdq2ps(f, f);
    bcast_half(t, ptr[w.at(208)]);
    a.vmulps(f, f, t);
  }
  void emit_step(const Cursor& w, int h, const Xmm* dst) override {
    Generator& a = g();
    const Zmm v0 = Zmm(dst[0].getIdx()), crumbs = Zmm(r_.c[2].getIdx());
    a.vmovdqu32(v0, ptr[w.at(64 * h)]);
    for (int j = 1; j < 4; ++j) a.vpsrlw(Zmm(dst[j].getIdx()), v0, 4 * j);
    for (int j = 0; j < 4; ++j) {
      const Zmm v = Zmm(dst[j].getIdx());
      a.vbroadcasti64x4(crumbs, ptr[w.at(128 + 32 * h)]);
      if (j == 0)
        a.vpsllvw(crumbs, crumbs, ptr[rip + l_counts_]);
      else
        a.vpsrlvw(crumbs, crumbs, ptr[rip + l_counts_ + 64 * j]);
      a.vpternlogd(v, crumbs, low4(), 0xE4);  // low4 ? nibble : crumb bits
      a.vpermi2w(v, Zmm(r_.c[0].getIdx()), Zmm(r_.c[1].getIdx()));
    }
  }

 private:
  Label l_values_, l_counts_;
};

// q2_K and q3_K as bf16 pairs (kFlagBf16Pairs): both steps load all 64
// quant bytes, and vector i of step t takes crumb k of every 16-bit word, k =
// 4 (i / 2) + 2 t + i % 2, so crumb j = k % 4 of byte half k / 4: q2_K shifts
// the word right by 8 (i / 2) + 4 t and vpermw looks the crumb up on index
// bits 0..1 (even i) or 2..3 (odd i: a second table), so one shift serves two
// vectors; q3_K shifts by 2 k (below). Element 32 j + 16 s + l of half h (q from
// byte 32 h + 16 s + l >> 2 j) sits in word 16 h + 8 s + l / 2 of vector
// i = 2 (l % 2) + j % 2 of step t = j / 2 (XLayout::bf16_kq2), and dword lane L
// of a vector is sub-block 8 (L / 8) + 2 j + L % 8 / 4: vectors i and i + 2 of
// a step share their four sub-blocks. q3_K joins the hmask bits once per step:
// its crumbs 2 t and 2 t + 1 of every byte (step 1: the bytes shifted right by
// 4) keep bits 0..3, and one vgf2p8affineqb of the broadcast hmask (GFNI) puts
// their hmask bits 4 h + 2 t and 4 h + 2 t + 1 of the byte with the same index
// on bits 4 and 6, joined by one vpternlogd. Step 0 broadcasts the hmask once
// and computes both steps' vgf2p8affineqb (step 1's into c[2]), so step 1's
// join waits on no load or GFNI latency. Shifts by 0, 2, 8 and 10 then
// leave each crumb on index bits 0..1 and its hmask bit on bit 4, and the table
// holds bf16(crumb - 4 + 4 hbit). q2_K's mins M_j = dmin (sc[j] >> 4) are
// widened at the block's end (load_mins).
class Q23Pairs : public KQuantPairs {
 public:
  explicit Q23Pairs(const KernelKey& key)
      : KQuantPairs(key, XLayout::bf16_kq2, "vpermw of q"), q3_(format() == Format::q3_K) {}
  void emit_decode_constants() override {
    g().vmovups(r_.c[0], ptr[rip + l_values_]);
    if (!q3_) g().vmovups(r_.c[2], ptr[rip + l_values_ + 64]);
  }
  void emit_data() override {
    KQuantDecoder::emit_data();
    Generator& a = g();
    a.align(64);
    a.L(l_values_);  // index bits 0..1 the crumb, bit 4 q3_K's hmask bit
    for (int i = 0; i < 32; ++i)
      a.dw(formats::f32_to_bf16(q3_ ? float((i & 3) - 4 + 4 * ((i >> 4) & 1)) : float(i & 3)));
    if (!q3_)  // q2_K's second table (c[2]): the crumb on index bits 2..3
      for (int i = 0; i < 32; ++i) a.dw(formats::f32_to_bf16(float((i >> 2) & 3)));
    // q3_K, per step t: vgf2p8affineqb's matrices, one per qword (h = qword / 4).
    // Row b of a matrix is byte 7 - b: output bit 4 takes hmask bit 4 h + 2 t,
    // bit 6 bit 4 h + 2 t + 1, the other bits none.
    a.L(l_hbits_);
    for (int t = 0; t < 2; ++t)
      for (int q = 0; q < 8; ++q) {
        const int bit = 4 * (q / 4) + 2 * t;
        a.dq(gf2_rows({{4, bit}, {6, bit + 1}}));
      }
    a.L(l_low6b_);
    a.dd(0x3F3F3F3Fu);
    // q3_K's scales s_j = (b[j % 8] >> 4 (j / 8)) & 15 | ((b[8 + j % 4] >> 2 (j / 4)) & 3) << 4
    // (b = the 12 bytes at 96) as the bytes 4 (s_j - 32) = (s_j ^ 32) << 2:
    // vgf2p8affineqb puts the nibble of b[j % 8] on bits 2..5 (qword 0 the low,
    // qword 1 the high) and sets bit 7; vpsllvd by 6 - 2 (j / 4) puts the crumb
    // on bits 6..7, joined by one vpternlogd (its top bit flipped by bit 7).
    a.align(16);
    a.L(l_sc3_);
    a.dq(gf2_rows({{2, 0}, {3, 1}, {4, 2}, {5, 3}}));
    a.dq(gf2_rows({{2, 4}, {3, 5}, {4, 6}, {5, 7}}));
    for (int d = 0; d < 4; ++d) a.dd(uint32_t(6 - 2 * d));
    emit_pair_data();
  }
  bool needs_gfni() const override { return q3_; }
  // F(t, p): lane l takes sub-block 8 (l / 8) + 2 (2 t + p) + l % 8 / 4.
  int factor_lane(int q, int l) const override { return 8 * (l / 8) + 2 * q + l % 8 / 4; }
  void emit_step(const Cursor& w, int t, const Xmm* dst) override {
    Generator& a = g();
    const Zmm v0 = Zmm(dst[0].getIdx()), hb = Zmm(r_.c[1].getIdx());
    a.vmovdqu32(v0, ptr[w.at(q3_ ? 32 : 16)]);
    if (!q3_) {  // q2_K: vectors 0, 1 (2, 3) take crumbs 2 t, 2 t + 1 of the low (high) bytes, through
                 // one shift and the two tables
      const Zmm v2 = Zmm(dst[2].getIdx()), lo = Zmm(r_.c[0].getIdx()), hi = Zmm(r_.c[2].getIdx());
      a.vpsrlw(v2, v0, 8 + 4 * t);
      if (t > 0) a.vpsrlw(v0, v0, 4 * t);
      a.vpermw(Zmm(dst[1].getIdx()), v0, hi);
      a.vpermw(v0, v0, lo);
      a.vpermw(Zmm(dst[3].getIdx()), v2, hi);
      a.vpermw(v2, v2, lo);
      return;
    }
    const Zmm hb1 = Zmm(r_.c[2].getIdx());  // step 1's hmask bits (c[2]: q2_K's second table)
    if (t == 0) {
      a.vbroadcasti64x4(hb, ptr[w.at(0)]);  // hmask, word w at w % 16
      a.vgf2p8affineqb(hb1, hb, ptr[rip + l_hbits_ + 64], 0);
      a.vgf2p8affineqb(hb, hb, ptr[rip + l_hbits_], 0);
    } else {
      a.vpsrlw(v0, v0, 4);
    }
    a.vpternlogd(v0, t == 0 ? hb : hb1, low4_bytes(), 0xE4);  // low nibbles ? crumbs : hmask bits
    for (int i = 3; i >= 1; --i)                              // vector 0 last: the others shift its load
      a.vpsrlw(Zmm(dst[i].getIdx()), v0, 8 * (i / 2) + 2 * (i % 2));
    for (int i = 0; i < 4; ++i) a.vpermw(Zmm(dst[i].getIdx()), Zmm(dst[i].getIdx()), Zmm(r_.c[0].getIdx()));
  }
  void load_mins(const Xmm& dst, const Cursor& w) override {  // q2_K: M_j = dmin (sc[j] >> 4)
    Generator& a = g();
    const Zmm m = Zmm(dst.getIdx()), h = Zmm(r_.w[1].getIdx());
    a.vpmovzxbd(m, ptr[w.at()]);
    a.vpsrld(m, m, 4);
    a.vcvtdq2ps(m, m);
    bcast_half(h, ptr[w.at(82)]);
    a.vmulps(m, m, h);
  }

 private:
  // D_j of the block's 16 sub-blocks in r_.scale, from its first step on.
  void emit_block_factors(const Cursor& w) override {
    Generator& a = g();
    const Zmm f = Zmm(r_.scale.getIdx()), o1 = Zmm(r_.w[1].getIdx());
    if (q3_) {  // 6-bit scales - 32 (l_sc3_)
      const Xmm fx = Xmm(f.getIdx()), tx = Xmm(o1.getIdx());
      a.vpbroadcastq(fx, ptr[w.at(96)]);   // b[0..7], both qwords
      a.vpbroadcastd(tx, ptr[w.at(104)]);  // b[8..11], every dword
      a.vgf2p8affineqb(fx, fx, ptr[rip + l_sc3_], 0x80);
      a.vpsllvd(tx, tx, ptr[rip + l_sc3_ + 16]);
      a.vpternlogd(fx, tx, ptr_b[rip + l_low6b_], 0xB4);  // 0x3F ? fx : fx ^ tx
      a.vpmovsxbd(f, fx);
      a.vpsrad(f, f, 2);
    } else {  // low nibbles
      a.vpmovzxbd(f, ptr[w.at()]);
      a.vpandd(f, f, ptr_b[rip + d_.c15]);
    }
    a.vcvtdq2ps(f, f);
    bcast_half(o1, ptr[w.at(q3_ ? 108 : 80)]);
    a.vmulps(f, f, o1);
  }

  bool q3_;
  Label l_values_, l_hbits_, l_low6b_, l_sc3_;
};

// q6_K: step t = 2h + p holds the four sub-blocks j = 8h + 4a + p + 2rh (i =
// 2a + rh) that share the 16 qh bytes at 128 + 32h + 16p: crumb i of each (the
// high two bits of q) and the low nibble a of ql bytes 64h + 16(p + 2rh).
// q = nibble | crumb << 4 is assembled with one vpternlogd, converted, and
// D_j (q - 32) is one FMA with E_j = -32 D_j. XLayout::f32_kq6.
class Q6Zmm : public KQuantDecoder {
 public:
  explicit Q6Zmm(const KernelKey& key) : KQuantDecoder(key, XLayout::f32_kq6) {}
  std::string describe() const override {
    return "K-quant -> fp32 (vcvtdq2ps, D_j q - 32 D_j by one FMA), vfmadd231ps";
  }
  void emit_decode_constants() override {
    g().broadcast_u32(r_.c[0], 0x0F, r_.tmp.cvt32());
    g().broadcast_u32(r_.c[1], 0x3F, r_.tmp.cvt32());
  }
  void emit_factors(const Cursor& w) override {
    Generator& a = g();
    const Xmm f = r_.w[0];
    const Xmm h = Xmm(r_.w[1].getIdx());
    a.vcvtph2ps(h, ptr[w.at(202)]);  // the four halves that end at d: d is lane 3
    a.vmovups(ptr[rec_ + kHalfOff], h);
    a.vpmovsxbd(f, ptr[w.at(192)]);
    a.vcvtdq2ps(f, f);
    a.vmulps(f, f, half_bcst(3));
    a.vmovups(ptr[rec_], f);
    store_e(f);
  }
  void emit_step(const Cursor& w, int t, const Xmm* dst) override {
    Generator& a = g();
    const int h = t / 2, p = t % 2;
    const Xmm y = r_.c[2], x0 = r_.c[3], x1 = r_.c[4], hi = r_.scale, m0f = r_.c[0], m3f = r_.c[1];
    a.vpmovzxbd(y, ptr[w.at(128 + 32 * h + 16 * p)]);
    a.vpmovzxbd(x0, ptr[w.at(64 * h + 16 * p)]);
    a.vpmovzxbd(x1, ptr[w.at(64 * h + 16 * (p + 2))]);
    // vpternlogd: 0xD8 = C ? B : A, 0xE4 = C ? A : B (C the low-nibble mask).
    a.vpslld(hi, y, 4);  // crumb 0 to bits 4..5
    a.vpternlogd(hi, x0, m0f, 0xD8);
    a.vpandd(dst[0], hi, m3f);
    a.vpslld(hi, y, 2);  // crumb 1
    a.vpternlogd(hi, x1, m0f, 0xD8);
    a.vpandd(dst[1], hi, m3f);
    a.vpsrld(dst[2], x0, 4);  // high nibbles; crumb 2 is in place
    a.vpternlogd(dst[2], y, m0f, 0xE4);
    a.vpandd(dst[2], dst[2], m3f);
    a.vpsrld(dst[3], x1, 4);
    a.vpsrld(hi, y, 2);  // crumb 3, nothing above it
    a.vpternlogd(dst[3], hi, m0f, 0xE4);
    for (int i = 0; i < 4; ++i) {
      const int j = 8 * h + 4 * (i / 2) + p + 2 * (i % 2);
      a.vcvtdq2ps(dst[i], dst[i]);
      a.vbroadcastss(hi, d_at(j));
      a.vfmadd213ps(dst[i], hi, e_bcst(j));  // D_j q - 32 D_j
    }
  }
};

// q2_K and q3_K: step t = 2h + hb holds the four sub-blocks j = 8h + 2s + hb
// (s = 0..3) of the 16 quant bytes at qs + 16t, crumb s of each byte. vpermps
// reads an index's low four bits: two crumbs, so pat0 (i & 3) and pat1 (i >> 2)
// tables give crumbs 0 and 1 of a byte, and of the byte shifted right by 4
// crumbs 2 and 3. q3_K: the tables hold crumb - 4, plus 4 D_j where the hmask
// bit 4h + s of byte 16hb + m is set (a masked add). XLayout::f32_kq2.
class Q23Zmm : public KQuantDecoder {
 public:
  explicit Q23Zmm(const KernelKey& key) : KQuantDecoder(key, XLayout::f32_kq2) {}
  void emit_decode_constants() override {
    g().vmovups(r_.c[0], ptr[rip + d_.pat0]);
    g().vmovups(r_.c[1], ptr[rip + d_.pat1]);
  }
  void emit_factors(const Cursor& w) override {
    Generator& a = g();
    const Xmm f = r_.w[0], m = r_.w[1];
    if (format() == Format::q2_K) {  // byte j: sc low nibble, m high
      const Xmm h = Xmm(r_.w[2].getIdx());
      a.vcvtph2ps(h, ptr[w.at(76)]);  // the four halves that end at dmin: d and dmin are lanes 2, 3
      a.vmovups(ptr[rec_ + kHalfOff], h);
      a.vpmovzxbd(f, ptr[w.at()]);
      a.vpsrld(m, f, 4);
      a.vpandd(f, f, ptr_b[rip + d_.c15]);
      a.vcvtdq2ps(f, f);
      a.vcvtdq2ps(m, m);
      a.vmulps(f, f, half_bcst(2));
      a.vmulps(m, m, half_bcst(3));
      a.vmovups(ptr[rec_], f);
      a.vmovups(ptr[rec_ + m_off()], m);
    } else {  // q3_K: 6-bit scales - 32, from the 16 bytes that end at its d
      emit_packed6(ptr[w.at(94)], f, m, r_.w[2], r_.w[3]);
      a.vpsubd(f, f, ptr_b[rip + d_.c32]);
      store_times_half(f, r_.w[2], ptr[w.at(108)], 0);
      store_e(f);
    }
  }
  void emit_step(const Cursor& w, int t, const Xmm* dst) override {
    Generator& a = g();
    const bool q3 = format() == Format::q3_K;
    const int h = t / 2, hb = t % 2;
    const Xmm x = r_.c[2], x4 = r_.c[3], hm = r_.c[4];
    a.vpmovzxbd(x, ptr[w.at((q3 ? 32 : 16) + 16 * t)]);
    a.vpsrld(x4, x, 4);
    if (q3) a.vpmovzxbd(hm, ptr[w.at(16 * hb)]);
    for (int s = 0; s < 4; ++s) {
      const int j = 8 * h + 2 * s + hb;
      a.vmulps(dst[s], s % 2 ? r_.c[1] : r_.c[0], d_bcst(j));
      a.vpermps(Zmm(dst[s].getIdx()), Zmm((s < 2 ? x : x4).getIdx()), dst[s]);
      if (!q3) continue;
      a.vptestmd(k_sub, hm, bit_bcst(4 * h + s));
      a.vaddps(dst[s] | k_sub, dst[s], e_bcst(j));
    }
  }
};

}  // namespace

}  // namespace kquant

std::unique_ptr<Decoder> make_kquant_decoder(const KernelKey& key) {
  using namespace kquant;
  if (key.isa == Isa::avx2) return make_ymm_decoder(key);
  switch (static_cast<Format>(key.format)) {
    case Format::q4_K:
    case Format::q5_K:
      if ((key.flags & kFlagBf16Pairs) && key.isa == Isa::avx512_bf16) return std::make_unique<Q4Pairs>(key);
      if (key.flags & kFlagNoGfni) return std::make_unique<Q45Zmm>(key);
      return std::make_unique<Q45Lanes>(key);
    case Format::q6_K:
      if ((key.flags & kFlagBf16Pairs) && key.isa == Isa::avx512_bf16) return std::make_unique<Q6Pairs>(key);
      return std::make_unique<Q6Zmm>(key);
    case Format::q2_K:
    case Format::q3_K:
      if ((key.flags & kFlagBf16Pairs) && key.isa == Isa::avx512_bf16) return std::make_unique<Q23Pairs>(key);
      return std::make_unique<Q23Zmm>(key);
    default: return nullptr;
  }
}

}  // namespace moejit::jit
