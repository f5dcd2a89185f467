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
// Why not bf16 and vdpbf16ps on avx512_bf16: on the CI machine's Xeon a
// 512-bit vdpbf16ps takes two cycles of both vector ports for 32 products and
// vfmadd231ps half a cycle for 16, so fp32 multiplies at twice the rate; a
// bf16 decode also needs the per-sub-block factor on its lanes
// (docs/PERFORMANCE.md, "K-quants").
//
// A super-block's factors are a record on the rule's stack area (aux): D_j,
// M_j, and a format's extra E_j (q5_K 16 D_j, q6_K -32 D_j, q3_K 4 D_j). At the
// top of each row the rule decodes the records of every super-block of the
// row (GemvArgs::scales points at the weights), or, for rows too long for the
// area, load_widen decodes each block's record at its first step. Each step
// then widens 4 vectors. avx512 looks quants up in 16-entry
// vpermps tables of D_j times the quant value (one vmulps builds a table; vpermps
// reads only an index's low 4 bits, so no masking); avx2 converts with vcvtdq2ps
// and multiplies by D_j.
#include "formats/format_table.h"
#include "jit/decoders.h"

namespace moejit::jit {

using formats::Format;
using namespace Xbyak;
using namespace Xbyak::util;

namespace {

// Lanes 0..7 (k3, k_grp2, holds lanes 8..15).
inline const Opmask k_lo8 = Xbyak::util::k4;

// A super-block's factor record: D_j at +4j, M_j at +m_off() + 4j, E_j at
// +kEOff + 4j, fp16 halves widened at +kHalfOff. Records of a row lie 2 x the
// super-block's bytes apart (>= 168 >= kRecordBytes), so a block's record is
// base2 + 2 x its weight address: one lea from the weight cursor.
constexpr int kEOff = 64, kHalfOff = 128, kRecordBytes = 144;
// Rows whose records fit this many bytes decode them all at the row's start
// (begin_row), long before the blocks read them; longer rows decode each
// block's factors at its first step into one record. The early decode keeps
// the factors off the blocks' critical path: a q2_K kernel, for one, ran 15%
// faster with the factors of the block before than with its own.
constexpr int kMaxRowRecords = 16384;

class KQuantDecoder;

// The block's sum and its min term (the decode applied D_j); the factor
// records' area and their decode at the top of each row.
class KQuantRule : public ScaleRule {
 public:
  KQuantRule(const KernelKey& key, bool mins, int subs) : ScaleRule(key), mins_(mins), subs_(subs) {}
  int group() const override { return 256; }
  bool check(std::string* why) const override {
    if (key_.k % 256 == 0) return true;
    *why = "k must be a multiple of 256 for the K-quants";
    return false;
  }
  int block_bytes() const override { return 0; }  // inline in the weights
  int stack_bytes() const override;
  void prologue() override {
    a().sub(rsp, stack_bytes());
    a().lea(r_.aux, ptr[rsp + 63]);  // 64-byte aligned (the body leaves rsp 8 mod 16)
    a().and_(r_.aux, ~int64_t(63));
  }
  void begin_row() override;
  void next_row() override;
  // tot += sum; tot -= M . S_x.
  void apply(const ScaleBlock& b) override;

 private:
  friend class KQuantDecoder;
  bool mins_;
  int subs_;
  KQuantDecoder* dec_ = nullptr;
};

// Constants of every K-quant decode, emitted after the code.
struct KqData {
  Label bits;                        // dword j: 1 << j (j < 32)
  Label base;                        // fp32 0..15
  Label pat0, pat1;                  // fp32 i & 3, i >> 2 (q2_K), minus 4 (q3_K)
  Label idx1, idx2, s1, m1, s2;      // the packed 6-bit scales' byte picks, shifts and masks
  Label c3, c4, c15, c16, c30, c32;  // dword constants (ymm)
  Label ef;                          // fp32 E_j / D_j: q5_K 16, q6_K -32, q3_K 4
};

class KQuantDecoder : public Decoder {
 public:
  KQuantDecoder(const KernelKey& key, XLayout layout)
      : Decoder(key, layout, 4,
                std::make_unique<KQuantRule>(key, row(key).has_mins, 256 / row(key).sub_block)) {
    static_cast<KQuantRule*>(rule_.get())->dec_ = this;
  }
  int xsum_span() const override { return fi().has_mins ? fi().sub_block : 0; }
  int block_bytes() const override { return fi().block_bytes; }
  // Where a step's bytes start, near enough for the prefetch walk.
  int elem_byte(int off) const override { return off * fi().block_bytes / 256; }
  std::string describe() const override {
    return zmm() ? "K-quant -> fp32 (vpermps tables of d sc[j] q), vfmadd231ps"
                 : "K-quant -> fp32 (vcvtdq2ps, times d sc[j]), vfmadd231ps";
  }
  // GemvArgs::scales of a K-quant kernel points at its weights (the super-blocks
  // hold the scales): the rule decodes a row's records from it.
  void load_widen(const Cursor& w, int off, int /*cnt*/, const Xmm* dst) override {
    if (rows_mode()) {
      rec_ = record_of(w);
    } else {
      rec_ = r_.aux;
      if (off == 0) emit_factors(w);
    }
    emit_step(w, off / shape_.step, dst);
  }
  void emit_data() override;

  // ---- the factor records (KQuantRule's hooks) ----
  int64_t blocks() const { return key_.k / 256; }
  bool rows_mode() const { return 2 * blocks() * block_bytes() <= kMaxRowRecords; }
  // Bytes of the area at r_.aux: the records (or one), then the slot of base2.
  int area_bytes() const { return rows_mode() ? int(2 * blocks() * block_bytes() + 64) : 256; }
  int slot() const { return area_bytes() - 64; }
  // The register holding the record of the block at w (r_.tmp, or r_.aux).
  Reg64 record_of(const Cursor& w) {
    if (!rows_mode()) return r_.aux;
    g().mov(r_.tmp, ptr[r_.aux + slot()]);
    g().lea(r_.tmp, ptr[r_.tmp + w.base * 2 + 2 * w.disp]);
    return r_.tmp;
  }
  // Every record of the row that starts at r_.scale_row, and base2 = aux - 2 row.
  void emit_row_records() {
    Generator& a = g();
    a.mov(r_.tmp, r_.aux);
    a.sub(r_.tmp, r_.scale_row);
    a.sub(r_.tmp, r_.scale_row);
    a.mov(ptr[r_.aux + slot()], r_.tmp);
    a.mov(r_.src, r_.scale_row);
    a.mov(r_.dst, r_.aux);
    a.mov(r_.count, blocks());
    Label l_block;
    a.L(l_block);
    rec_ = r_.dst;
    emit_factors(Cursor{r_.src, 0});
    a.add(r_.src, block_bytes());
    a.add(r_.dst, 2 * block_bytes());
    a.dec(r_.count);
    a.jnz(l_block, Xbyak::CodeGenerator::T_NEAR);
  }
  int m_off() const { return fi().sub_block == 32 ? 32 : 64; }

 protected:
  static const formats::FormatInfo& row(const KernelKey& k) {
    return formats::info(static_cast<Format>(k.format));
  }
  const formats::FormatInfo& fi() const { return row(key_); }
  Format format() const { return static_cast<Format>(key_.format); }
  virtual void emit_factors(const Cursor& w) = 0;
  virtual void emit_step(const Cursor& w, int step, const Xmm* dst) = 0;

  Generator& g() const { return a(); }
  // The tier's vector view of a register.
  Xmm v(const Xmm& x) const { return zmm() ? Xmm(Zmm(x.getIdx())) : Xmm(Ymm(x.getIdx())); }
  Xmm half_of(const Xmm& x) const { return zmm() ? Xmm(Ymm(x.getIdx())) : Xmm(x.getIdx()); }
  Address d_at(int j) const { return ptr[rec_ + 4 * j]; }
  Address d_bcst(int j) const { return ptr_b[rec_ + 4 * j]; }
  Address e_bcst(int j) const { return ptr_b[rec_ + kEOff + 4 * j]; }
  Address half_bcst(int lane) const { return ptr_b[rec_ + kHalfOff + 4 * lane]; }
  Address bit_bcst(int j) const { return ptr_b[rip + d_.bits + 4 * j]; }
  // dst = the fp16 at `at`, widened, on every lane.
  void bcast_half(const Xmm& dst, const Address& at) {
    g().vpbroadcastw(half_of(dst), at);
    g().vcvtph2ps(v(dst), half_of(dst));
  }
  // The integer lanes of x, converted, times the fp16 at `half`, stored at aux + off.
  // E_j = D_j times the format's factor, from D in x (clobbered), at aux + kEOff.
  void store_e(const Xmm& x) {
    g().vbroadcastss(v(r_.scale), ptr[rip + d_.ef]);
    g().vmulps(v(x), v(x), v(r_.scale));
    g().vmovups(ptr[rec_ + kEOff], v(x));
  }
  void store_times_half(const Xmm& x, const Xmm& tmp, const Address& half, int off) {
    g().vcvtdq2ps(v(x), v(x));
    bcast_half(tmp, half);
    g().vmulps(v(x), v(x), v(tmp));
    g().vmovups(ptr[rec_ + off], v(x));
  }
  // Packed 6-bit scales (q4_K/q5_K: sc 0..7 then m 0..7; q3_K: 16 sc - 32 + 32)
  // from 16 bytes at src: lane j = ((B1 >> s1) & m1) | ((B2 >> s2) & 3) << 4,
  // B1 = byte idx1[j], B2 = byte idx2[j] (0 where idx2 is 0x80). zmm: 16 lanes
  // in out0; ymm: lanes 0..7 in out0, 8..15 in out1. Four distinct registers;
  // t0 and t1 are clobbered, and so is out1 on zmm.
  void emit_packed6(const Address& src, const Xmm& out0, const Xmm& out1, const Xmm& t0, const Xmm& t1);

  KqData d_;
  Reg64 rec_;  // the register of the record being written or read
};

int KQuantRule::stack_bytes() const { return dec_->area_bytes() + 64; }

void KQuantRule::begin_row() {
  if (dec_->rows_mode()) dec_->emit_row_records();
}

void KQuantRule::next_row() {
  if (dec_->rows_mode()) a().add(r_.scale_row, dec_->blocks() * dec_->block_bytes());
}

void KQuantRule::apply(const ScaleBlock& b) {
  Generator& g = a();
  for (size_t m = 0; m < b.totals.size(); ++m) g.vaddps(b.totals[m], b.totals[m], b.sums[m]);
  if (!mins_) return;
  const Reg64 rec = dec_->record_of(b.w);
  const int m_off = dec_->m_off();
  // Lanes past the sub-blocks are zero in M and in the sums of x.
  const int parts = zmm() ? 1 : subs_ / 8;
  const Ymm ys = Ymm(r_.scale.getIdx());
  for (int p = 0; p < parts; ++p) {
    if (zmm() && subs_ == 16)
      g.vmovups(r_.scale, ptr[rec + m_off]);
    else
      g.vmovups(ys, ptr[rec + m_off + 32 * p]);  // a ymm load zeros the upper half of the zmm
    for (size_t m = 0; m < b.totals.size(); ++m)
      g.vfnmadd231ps(b.totals[m], r_.scale, ptr[b.xsums[m].getRegExp() + 32 * p]);
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

// ---------------------------------------------------------------- avx2

// Every K-quant on avx2, natural order: step s is elements 32s .. 32s + 31,
// four vectors of 8 consecutive elements whose quant bytes are consecutive
// too (vpmovzxbd of 8 bytes), q assembled in integers, converted, times D_j.
class KQuantYmm : public KQuantDecoder {
 public:
  explicit KQuantYmm(const KernelKey& key) : KQuantDecoder(key, XLayout::f32) {}
  void emit_decode_constants() override { g().broadcast_u32(r_.c[0], 0x0F, r_.tmp.cvt32()); }
  void emit_factors(const Cursor& w) override {
    Generator& a = g();
    const Xmm f0 = r_.w[0], f1 = r_.w[1];
    switch (format()) {
      case Format::q4_K:
      case Format::q5_K:  // lanes 0..7 sc (times d), 8..15 m (times dmin)
        emit_packed6(ptr[w.at()], f0, f1, r_.w[2], r_.w[3]);
        store_times_half(f0, r_.w[2], ptr[w.at()], 0);
        store_times_half(f1, r_.w[2], ptr[w.at(2)], m_off());
        if (format() == Format::q5_K) store_e(f0);
        break;
      case Format::q6_K:
        for (int p = 0; p < 2; ++p) {
          a.vpmovsxbd(f0, ptr[w.at(192 + 8 * p)]);
          store_times_half(f0, r_.w[2], ptr[w.at(208)], 32 * p);
          g().vbroadcastss(r_.scale, ptr[rip + d_.ef]);
          a.vmulps(f0, f0, r_.scale);
          a.vmovups(ptr[rec_ + kEOff + 32 * p], f0);
        }
        break;
      case Format::q2_K:
        for (int p = 0; p < 2; ++p) {
          a.vpmovzxbd(f0, ptr[w.at(8 * p)]);
          a.vpsrld(f1, f0, 4);
          a.vpand(f0, f0, r_.c[0]);
          store_times_half(f0, r_.w[2], ptr[w.at(80)], 32 * p);
          store_times_half(f1, r_.w[2], ptr[w.at(82)], m_off() + 32 * p);
        }
        break;
      default:  // q3_K
        emit_packed6(ptr[w.at(94)], f0, f1, r_.w[2], r_.w[3]);
        for (int p = 0; p < 2; ++p) {
          const Xmm f = p ? f1 : f0;
          a.vpsubd(f, f, ptr[rip + d_.c32]);
          store_times_half(f, r_.w[2], ptr[w.at(108)], 32 * p);
          g().vbroadcastss(r_.scale, ptr[rip + d_.ef]);
          a.vmulps(f, f, r_.scale);
          a.vmovups(ptr[rec_ + kEOff + 32 * p], f);
        }
        break;
    }
  }
  void emit_step(const Cursor& w, int s, const Xmm* dst) override {
    Generator& a = g();
    const Format f = format();
    for (int u = 0; u < 4; ++u) {
      const Xmm q = dst[u], t = u < 3 ? dst[u + 1] : r_.scale;
      switch (f) {
        case Format::q4_K:
        case Format::q5_K: {  // sub-block s: nibble s % 2 of qs bytes 32 (s / 2) + 8u .. + 8
          a.vpmovzxbd(q, ptr[w.at((f == Format::q5_K ? 48 : 16) + 32 * (s / 2) + 8 * u)]);
          if (s % 2) a.vpsrld(q, q, 4);
          a.vpand(q, q, r_.c[0]);
          if (f == Format::q5_K) {  // bit s of qh[8u + l], to bit 4
            a.vpmovzxbd(t, ptr[w.at(16 + 8 * u)]);
            shift_to(t, s, 4);
            a.vpand(t, t, ptr[rip + d_.c16]);
            a.vpor(q, q, t);
          }
          break;
        }
        case Format::q6_K: {  // ql 64h + 32 (s % 2) + 8u (high nibble for s % 4 >= 2), qh crumb s % 4
          const int h = s / 4;
          a.vpmovzxbd(q, ptr[w.at(64 * h + 32 * (s % 2) + 8 * u)]);
          if (s % 4 >= 2) a.vpsrld(q, q, 4);
          a.vpand(q, q, r_.c[0]);
          a.vpmovzxbd(t, ptr[w.at(128 + 32 * h + 8 * u)]);
          shift_to(t, 2 * (s % 4), 4);
          a.vpand(t, t, ptr[rip + d_.c30]);
          a.vpor(q, q, t);
          a.vpsubd(q, q, ptr[rip + d_.c32]);
          break;
        }
        default: {  // q2_K / q3_K: crumb s % 4 of qs[32 (s / 4) + 8u + l]; q3_K hmask[8u + l] bit s
          const bool q3 = f == Format::q3_K;
          a.vpmovzxbd(q, ptr[w.at((q3 ? 32 : 16) + 32 * (s / 4) + 8 * u)]);
          if (s % 4) a.vpsrld(q, q, 2 * (s % 4));
          a.vpand(q, q, ptr[rip + d_.c3]);
          if (q3) {
            a.vpmovzxbd(t, ptr[w.at(8 * u)]);
            shift_to(t, s, 2);
            a.vpand(t, t, ptr[rip + d_.c4]);
            a.vpor(q, q, t);
            a.vpsubd(q, q, ptr[rip + d_.c4]);
          }
          break;
        }
      }
      a.vcvtdq2ps(q, q);
    }
    // Vectors u of sub-block 2s + u / 2 (16-element sub-blocks) or s (32).
    for (int u = 0; u < 4; ++u) {
      const int j = fi().sub_block == 32 ? s : 2 * s + u / 2;
      if (u == 0 || (fi().sub_block == 16 && u == 2)) a.vbroadcastss(r_.scale, d_at(j));
      a.vmulps(dst[u], dst[u], r_.scale);
    }
  }

 private:
  // Moves bit `from` of every dword to bit `to`.
  void shift_to(const Xmm& x, int from, int to) {
    if (from > to) g().vpsrld(x, x, from - to);
    if (from < to) g().vpslld(x, x, to - from);
  }
};

}  // namespace

std::unique_ptr<Decoder> make_kquant_decoder(const KernelKey& key) {
  if (key.isa == Isa::avx2) return std::make_unique<KQuantYmm>(key);
  switch (static_cast<Format>(key.format)) {
    case Format::q4_K:
    case Format::q5_K: return std::make_unique<Q45Zmm>(key);
    case Format::q6_K: return std::make_unique<Q6Zmm>(key);
    case Format::q2_K:
    case Format::q3_K: return std::make_unique<Q23Zmm>(key);
    default: return nullptr;
  }
}

}  // namespace moejit::jit
