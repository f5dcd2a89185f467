// GGUF K-quants (q4_K, q5_K, q6_K, q2_K, q3_K; formats/kquants.h has the
// layouts): one 256-element super-block per scale block, widened to fp32 and
// multiplied by vfmadd231ps on every tier (avx2, avx512, avx512_bf16).
//
// The row body sums a block's products and hands the sums to the scale rule
// once per block. A K-quant's sub-blocks (16 or 32 elements) each have their
// own factor D_j = d sc[j], and every decoded vector lies inside one
// sub-block, so the decode multiplies each vector by its D_j (exact in fp32,
// and so is D_j q: at most 23 significant bits) and the rule adds the block's
// sum and, for the formats with mins, subtracts M . S_x with one FMA against
// the prepared sums of x (M_j = dmin m[j], XPrep's XSums). Products stay exact;
// the summation order differs from kquant_gemv, as formats.md allows.
//
// Why not bf16 and vdpbf16ps on avx512_bf16 everywhere: on Intel a 512-bit
// vdpbf16ps takes two cycles of both vector ports for 32 products and
// vfmadd231ps half a cycle for 16, so fp32 multiplies at twice the rate
// (docs/PERFORMANCE.md, "K-quants"). On AMD (Zen 5: 0.73 against 0.54 cycles)
// the pairs are cheaper: every K-quant has a bf16-pair decode (KQuantPairs,
// kFlagBf16Pairs), which the runtime runs there and, for q6_K, on Intel too.
// The sub-block factors then scale each step's sums, since d sc[j] q does not
// fit a bf16.
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
    g().mov(r_.tmp.cvt32(), 0x00FF);
    g().kmovw(k_lo8, r_.tmp.cvt32());
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
  virtual void emit_block_factors(const Cursor& w) = 0;
  // The factor (sub-block) of lane l of F(t, p), q = 2 t + p.
  virtual int factor_lane(int q, int l) const = 0;
  void emit_factors(const Cursor& /*w*/) override {}
  // The index vectors of the four F(t, p), and the word mask of vpternlogd's
  // joins (the low four bits from the quant word, the rest from the other).
  void emit_pair_data() {
    Generator& a = g();
    a.align(64);
    a.L(l_fidx_);
    for (int q = 0; q < 4; ++q)
      for (int l = 0; l < 16; ++l) a.dd(uint32_t(factor_lane(q, l)));
    a.L(l_low4_);
    a.dd(0x000F000Fu);
  }
  Address low4() const { return ptr_b[rip + l_low4_]; }
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
  explicit Q4Pairs(const KernelKey& key)
      : KQuantPairs(key, XLayout::bf16_kq4, "vpermw of q"), q5_(format() == Format::q5_K) {}
  // q4_K keeps the factor vectors' indices in c[1..4]; q5_K needs c[1] for its
  // fifth bits and loads them.
  void emit_decode_constants() override {
    g().vmovups(r_.c[0], ptr[rip + l_words_]);
    if (!q5_)
      for (int q = 0; q < 4; ++q) g().vmovups(r_.c[1 + q], ptr[rip + l_fidx_ + 64 * q]);
  }
  void emit_data() override {
    KQuantDecoder::emit_data();
    Generator& a = g();
    a.align(64);
    a.L(l_words_);  // q4_K: bf16 of i & 15 (vpermw reads five index bits); q5_K: of i
    for (int i = 0; i < 32; ++i) a.dw(formats::f32_to_bf16(float(q5_ ? i : i & 15)));
    // q5_K: per step t and vector j, the qh word shifts that put the fifth bit
    // of word w (bit 4 t + 2 (w >= 16) + j % 2 of byte j / 2) on bit 4.
    a.L(l_counts_);
    for (int t = 0; t < 2; ++t)
      for (int j = 0; j < 4; ++j)
        for (int w = 0; w < 32; ++w) {
          const int sh = 8 * (j / 2) + 4 * t + 2 * (w >= 16) + j % 2;
          a.dw(uint16_t(sh < 4 ? 4 - sh : sh - 4));
        }
    a.L(l_dm_);  // d on lanes 0..7, dmin on 8..15
    for (int l = 0; l < 16; ++l) a.dd(uint32_t(l / 8));
    emit_pair_data();
  }
  // F(t, p): D_(4t+p) on lanes 0..7, D_(4t+2+p) on 8..15.
  int factor_lane(int q, int l) const override { return 4 * (q / 2) + q % 2 + (l < 8 ? 0 : 2); }
  // D_j on lanes 0..7 and M_j on 8..15 from the 16 header bytes: the 6-bit
  // scales by emit_packed6's byte picks, d and dmin onto their lanes by one vpermps.
  void emit_block_factors(const Cursor& w) override {
    Generator& a = g();
    const Zmm f = Zmm(r_.scale.getIdx()), o1 = Zmm(r_.w[1].getIdx()), t0 = Zmm(r_.w[2].getIdx()),
              t1 = Zmm(r_.w[3].getIdx());
    emit_packed6(ptr[w.at()], f, o1, t0, t1);
    a.vcvtdq2ps(f, f);
    a.vcvtph2ps(Xmm(o1.getIdx()), ptr[w.at()]);  // d, dmin, (two halves of scale bytes)
    a.vmovups(t0, ptr[rip + l_dm_]);
    a.vpermps(t1, t0, o1);
    a.vmulps(f, f, t1);
  }
  void load_mins(const Xmm& dst, const Cursor& /*w*/) override {
    g().vextractf32x8(Ymm(dst.getIdx()), Zmm(r_.scale.getIdx()), 1);
  }
  void emit_step(const Cursor& w, int t, const Xmm* dst) override {
    Generator& a = g();
    if (!q5_) {
      a.vmovdqu32(Zmm(dst[0].getIdx()), ptr[w.at(16 + 64 * t)]);
      emit_nibble_words(a, dst, r_.c[0]);
      return;
    }
    // q5_K: the fifth bit of element i of sub-block s is bit s of qh[i] (the
    // 32 bytes at 16, broadcast to both 256-bit halves), shifted per word onto
    // bit 4 and joined to the nibble by one vpternlogd; vpermw reads 5 bits.
    const Zmm v0 = Zmm(dst[0].getIdx()), hb = Zmm(r_.c[1].getIdx());
    a.vmovdqu32(v0, ptr[w.at(48 + 64 * t)]);
    for (int j = 1; j < 4; ++j) a.vpsrlw(Zmm(dst[j].getIdx()), v0, 4 * j);
    for (int j = 0; j < 4; ++j) {
      const Zmm v = Zmm(dst[j].getIdx());
      const Address counts = ptr[rip + l_counts_ + 64 * (4 * t + j)];
      a.vbroadcasti64x4(hb, ptr[w.at(16)]);
      if (t == 0 && j < 2)
        a.vpsllvw(hb, hb, counts);
      else
        a.vpsrlvw(hb, hb, counts);
      a.vpternlogd(v, hb, low4(), 0xE4);  // low4 ? nibble : fifth bit
      a.vpermw(v, v, Zmm(r_.c[0].getIdx()));
    }
  }
  // F(t, p) into a widened-weight register (free once the step's products ran).
  void emit_factor_vector(const Xmm& dst, int t, int p) override {
    if (q5_) return KQuantPairs::emit_factor_vector(dst, t, p);
    g().vpermps(Zmm(dst.getIdx()), Zmm(r_.c[1 + 2 * t + p].getIdx()), Zmm(r_.scale.getIdx()));
  }

 private:
  bool q5_;
  Label l_words_, l_dm_, l_counts_;
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
// 4 (i / 2) + 2 t + i % 2 (a shift by 2 k, then vpermw: five index bits), so
// crumb j = k % 4 of byte half k / 4. Element 32 j + 16 s + l of half h (q from
// byte 32 h + 16 s + l >> 2 j) sits in word 16 h + 8 s + l / 2 of vector
// i = 2 (l % 2) + j % 2 of step t = j / 2 (XLayout::bf16_kq2), and dword lane L
// of a vector is sub-block 8 (L / 8) + 2 j + L % 8 / 4: vectors i and i + 2 of
// a step share their four sub-blocks. q3_K's hmask bit 4 h + j of byte 16 s + l
// reaches bit 4 of its word by one vprolvd of the broadcast hmask (both words of
// a dword share h, so one rotation per dword serves left and right shifts) and
// is joined by one vpternlogd; the table holds bf16(crumb - 4 + 4 hbit).
// q2_K's mins M_j = dmin (sc[j] >> 4) are widened at the block's end
// (load_mins).
class Q23Pairs : public KQuantPairs {
 public:
  explicit Q23Pairs(const KernelKey& key)
      : KQuantPairs(key, XLayout::bf16_kq2, "vpermw of q"), q3_(format() == Format::q3_K) {}
  void emit_decode_constants() override { g().vmovups(r_.c[0], ptr[rip + l_values_]); }
  void emit_data() override {
    KQuantDecoder::emit_data();
    Generator& a = g();
    a.align(64);
    a.L(l_values_);  // index bits 0..1 the crumb, bit 4 q3_K's hmask bit
    for (int i = 0; i < 32; ++i)
      a.dw(formats::f32_to_bf16(q3_ ? float((i & 3) - 4 + 4 * ((i >> 4) & 1)) : float(i & 3)));
    // q3_K, per step t and vector i: the dword rotations that put the hmask
    // bit of each word on its bit 4 (both words of a dword share h).
    a.L(l_rot_);
    for (int t = 0; t < 2; ++t)
      for (int i = 0; i < 4; ++i)
        for (int l = 0; l < 16; ++l) {
          const int k = crumb(t, i), bit = 8 * (k / 4) + 4 * (l / 8) + k % 4;
          a.dd(uint32_t((36 - bit) % 32));
        }
    emit_pair_data();
  }
  // F(t, p): lane l takes sub-block 8 (l / 8) + 2 (2 t + p) + l % 8 / 4.
  int factor_lane(int q, int l) const override { return 8 * (l / 8) + 2 * q + l % 8 / 4; }
  void emit_step(const Cursor& w, int t, const Xmm* dst) override {
    Generator& a = g();
    const Zmm v0 = Zmm(dst[0].getIdx()), hb = Zmm(r_.c[1].getIdx()), hm = Zmm(r_.c[2].getIdx());
    a.vmovdqu32(v0, ptr[w.at(q3_ ? 32 : 16)]);
    if (q3_) a.vbroadcasti64x4(hm, ptr[w.at(0)]);  // hmask, word w at w % 16
    for (int i = 3; i >= 0; --i) {                 // vector 0 last: the others shift its load
      const int k = crumb(t, i);
      if (k > 0) a.vpsrlw(Zmm(dst[i].getIdx()), v0, 2 * k);
    }
    for (int i = 0; i < 4; ++i) {
      const Zmm v = Zmm(dst[i].getIdx());
      if (q3_) {
        a.vprolvd(hb, hm, ptr[rip + l_rot_ + 64 * (4 * t + i)]);
        a.vpternlogd(v, hb, low4(), 0xE4);  // low4 ? crumb : hmask bit
      }
      a.vpermw(v, v, Zmm(r_.c[0].getIdx()));
    }
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
  static int crumb(int t, int i) { return 4 * (i / 2) + 2 * t + i % 2; }
  // D_j of the block's 16 sub-blocks in r_.scale, from its first step on.
  void emit_block_factors(const Cursor& w) override {
    Generator& a = g();
    const Zmm f = Zmm(r_.scale.getIdx()), o1 = Zmm(r_.w[1].getIdx()), t0 = Zmm(r_.w[2].getIdx()),
              t1 = Zmm(r_.w[3].getIdx());
    if (q3_) {  // 6-bit scales - 32, from the 16 bytes that end at d
      emit_packed6(ptr[w.at(94)], f, o1, t0, t1);
      a.vpsubd(f, f, ptr_b[rip + d_.c32]);
    } else {  // low nibbles
      a.vpmovzxbd(f, ptr[w.at()]);
      a.vpandd(f, f, ptr_b[rip + d_.c15]);
    }
    a.vcvtdq2ps(f, f);
    bcast_half(o1, ptr[w.at(q3_ ? 108 : 80)]);
    a.vmulps(f, f, o1);
  }

  bool q3_;
  Label l_values_, l_rot_;
};

// q6_K: step t = 2h + p holds the four sub-blocks j = 8h + 4a + p + 2rh (i =
// 2a + rh) that share the 16 qh bytes at 128 + 32h + 16p: crumb i of each (the
// high two bits of q) and the low nibble a of ql bytes 64h + 16(p + 2rh).
// q = nibble | crumb << 4 is assembled with one vpternlogd, converted, and
// D_j (q - 32) is one FMA with E_j = -32 D_j. XLayout::f32_kq6.
class Q6Zmm : public KQuantDecoder {
 public:
  explicit Q6Zmm(const KernelKey& key) : KQuantDecoder(key, XLayout::f32_kq6) {}
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
      if ((key.flags & kFlagBf16Pairs) && key.isa == Isa::avx512_bf16) return std::make_unique<Q4Pairs>(key);
      return std::make_unique<Q45Zmm>(key);
    case Format::q5_K:
      if ((key.flags & kFlagBf16Pairs) && key.isa == Isa::avx512_bf16) return std::make_unique<Q4Pairs>(key);
      return std::make_unique<Q45Zmm>(key);
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
