// The K-quants on tiles (avx512_amx). A super-block (256 elements) is the
// tile body's block and each sub-block a scale group: one tile row of bf16
// quants per row and vector of 32, in natural order, so the activations are
// XPrep's tile layout (with the sums of x of each sub-block after each block
// for the formats with mins). Sub-blocks of 16 (q6_K, q2_K, q3_K) are the
// tile body's half steps.
// - The decode, two vectors of 32 a step: the quant bytes widened to words
//   (vpmovzxbw) and shifted so each word's low bits hold its quant; the high
//   bits of q5_K (1), q6_K (2) and q3_K (1) shifted above them and selected in
//   (vpternlogd); a table lookup on the low bits (vpermw, 5 bits; q6_K
//   vpermi2w, 6) gives bf16(q - offset): q4_K, q5_K and q2_K q, q6_K q - 32,
//   q3_K q - 4. Every such value is exact in bf16, so C holds each
//   sub-block's sum of q x with exact products.
// - The scales (KQuantTileRule): at a block's first group, each row's
//   sub-block factors from its scale bytes at once (vpermd, shifts and masks
//   where packed), times d (and dmin), into a record per row on the stack:
//   D_j = d sc[j] (exact in fp32: 11 x at most 8 bits), and M_j = dmin m[j]
//   for the formats with mins. Each group then adds, per row, C D_j (and
//   - M_j S_x[j], S_x[j] one masked load of the call's tokens' sums) to the
//   row's total (lanes = tokens): one or two FMAs.
// K is a multiple of 256 (the K-quants' rule), so no step is partial.
#include <cassert>

#include "formats/format_table.h"
#include "formats/formats.h"
#include "jit/decoders.h"

namespace moejit::jit {

using formats::Format;
using namespace Xbyak;
using namespace Xbyak::util;

namespace {

constexpr int kSuper = 256;  // elements of a super-block: the tile body's block
// Opmasks: the call's tokens (lanes of a sums row) and the words 8..15 of a ymm (dmin's lanes).
const Opmask k_tokens = k5;
const Opmask k_hi_words = k6;

const formats::FormatInfo& info_of(const KernelKey& key) { return formats::info(key.format); }

class KQuantTileRule : public ScaleRule {
 public:
  explicit KQuantTileRule(const KernelKey& key)
      : ScaleRule(key), subs_(kSuper / info_of(key).sub_block), mins_(info_of(key).has_mins) {}
  int group() const override { return kSuper / subs_; }
  bool check(std::string* why) const override {
    if (key_.k % kSuper == 0) return true;
    *why = "k must be a multiple of 256 for the K-quants";
    return false;
  }
  int block_bytes() const override { return 0; }  // inline in the weights
  bool tile_ready() const override { return true; }
  int stack_bytes() const override { return 16 * record_bytes(); }
  void prologue() override { a().sub(rsp, stack_bytes()); }
  // Only the tile body runs this rule (make_decoder gives the decode on the
  // tile tier alone), and it calls tile_apply.
  void apply(const ScaleBlock& /*b*/) override { assert(false && "tile bodies only"); }
  void tile_apply(const TileScaleBlock& b) override {
    Generator& g = a();
    if (b.group == 0)
      for (int r = 0; r < b.rows; ++r) emit_record(b.block_w, r * b.row_bytes, r);
    const Zmm sx = Zmm(r_.scale.getIdx());
    if (mins_) g.vmovups(sx | k_tokens | T_z, ptr[b.xsums.at(int64_t(b.group) * b.xsum_row_bytes)]);
    for (int r = 0; r < b.rows; ++r) {
      const Zmm c = Zmm(r_.w[r % 2].getIdx());
      const int rec = record_bytes() * r;
      g.vmovups(c, ptr[b.c.at(64 * r)]);
      g.vfmadd231ps(b.totals[size_t(r)], c, ptr_b[rsp + rec + 4 * b.group]);
      if (mins_) g.vfnmadd231ps(b.totals[size_t(r)], sx, ptr_b[rsp + rec + m_off() + 4 * b.group]);
    }
  }
  void emit_data() override;

 private:
  // A row's record: D_j at 4 j, M_j at m_off() + 4 j.
  int m_off() const { return 4 * subs_; }
  int record_bytes() const { return 4 * subs_ * (mins_ ? 2 : 1); }
  Format format() const { return key_.format; }
  // Row r's record from its super-block at w + row_off.
  void emit_record(const Cursor& w, int64_t row_off, int r);
  // dst = the fp16 at `at`, widened, on every lane; with `hi`, the fp16 at hi
  // on lanes 8..15.
  void bcast_halves(const Zmm& dst, const Address& at, const Address* hi = nullptr) {
    const Ymm h = Ymm(dst.getIdx());
    a().vpbroadcastw(h, at);
    if (hi) a().vpbroadcastw(h | k_hi_words, *hi);
    a().vcvtph2ps(dst, h);
  }
  // lane L = (q[idx[L]] >> shift[L]) & mask[L], q's dword lanes the scale bytes.
  void pick(const Zmm& dst, const Zmm& q, const Label& idx, const Label& shift, const Label& mask) {
    a().vmovdqu32(dst, ptr[rip + idx]);
    a().vpermd(dst, dst, q);
    a().vpsrlvd(dst, dst, ptr[rip + shift]);
    a().vpandd(dst, dst, ptr[rip + mask]);
  }

  int subs_;
  bool mins_;
  Label l_idx1_, l_s1_, l_m1_, l_idx2_, l_s2_, l_m2_, l_c32_;
};

void KQuantTileRule::emit_record(const Cursor& w, int64_t row_off, int r) {
  Generator& g = a();
  const Zmm q = Zmm(r_.w[0].getIdx()), lo = Zmm(r_.w[1].getIdx()), hi = Zmm(r_.w[2].getIdx()),
            d = Zmm(r_.w[3].getIdx());
  const Address rec = ptr[rsp + record_bytes() * r];
  switch (format()) {
    case Format::q4_K:
    case Format::q5_K: {  // 12 packed bytes after d and dmin: lanes 0..7 sc[j], 8..15 m[j]
      g.vpmovzxbd(q, ptr[w.at(row_off + 4)]);  // and 4 bytes after them, in the block
      pick(lo, q, l_idx1_, l_s1_, l_m1_);
      pick(hi, q, l_idx2_, l_s2_, l_m2_);
      g.vpord(lo, lo, hi);
      g.vcvtdq2ps(lo, lo);
      const Address dmin = ptr[w.at(row_off + 2)];
      bcast_halves(d, ptr[w.at(row_off)], &dmin);
      g.vmulps(lo, lo, d);
      g.vmovups(rec, lo);
      return;
    }
    case Format::q6_K:  // 16 int8 scales at 192, d at 208
      g.vpmovsxbd(lo, ptr[w.at(row_off + 192)]);
      g.vcvtdq2ps(lo, lo);
      bcast_halves(d, ptr[w.at(row_off + 208)]);
      g.vmulps(lo, lo, d);
      g.vmovups(rec, lo);
      return;
    case Format::q2_K:  // 16 bytes: sc in the low nibbles, m in the high; d at 80, dmin at 82
      g.vpmovzxbd(q, ptr[w.at(row_off)]);
      g.vpsrld(hi, q, 4);
      g.vpandd(lo, q, ptr_b[rip + l_m1_]);  // a dword of 15
      g.vcvtdq2ps(lo, lo);
      g.vcvtdq2ps(hi, hi);
      bcast_halves(d, ptr[w.at(row_off + 80)]);
      g.vmulps(lo, lo, d);
      g.vmovups(rec, lo);
      bcast_halves(d, ptr[w.at(row_off + 82)]);
      g.vmulps(hi, hi, d);
      g.vmovups(ptr[rsp + record_bytes() * r + m_off()], hi);
      return;
    case Format::q3_K:  // 12 packed bytes at 96 (read from 94: the block ends at 110), d at 108
      g.vpmovzxbd(q, ptr[w.at(row_off + 94)]);
      pick(lo, q, l_idx1_, l_s1_, l_m1_);
      pick(hi, q, l_idx2_, l_s2_, l_m2_);
      g.vpslld(hi, hi, 4);
      g.vpord(lo, lo, hi);
      g.vpsubd(lo, lo, ptr_b[rip + l_c32_]);
      g.vcvtdq2ps(lo, lo);
      bcast_halves(d, ptr[w.at(row_off + 108)]);
      g.vmulps(lo, lo, d);
      g.vmovups(rec, lo);
      return;
    default: assert(false);
  }
}

void KQuantTileRule::emit_data() {
  Generator& g = a();
  auto table = [&](Label& l, const int(&v)[16]) {
    g.L(l);
    for (int e : v) g.dd(uint32_t(e));
  };
  g.align(64);
  switch (format()) {
    case Format::q4_K:
    case Format::q5_K: {
      // ggml's get_scale_min_k4 on the packed bytes q[0..11]: sc[j] = q[j] & 63
      // and m[j] = q[j + 4] & 63 for j < 4; sc[j] = (q[j + 4] & 15) |
      // (q[j - 4] >> 6) << 4 and m[j] = (q[j + 4] >> 4) | (q[j] >> 6) << 4 for
      // j >= 4. Lane L < 8 is sc[L], lane 8 + j m[j]: the first pick takes the
      // low bits, the second the two high bits (>> 2, masked to bits 4 and 5).
      table(l_idx1_, {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11});
      table(l_s1_, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4});
      table(l_m1_, {63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15});
      table(l_idx2_, {0, 0, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0, 4, 5, 6, 7});
      table(l_s2_, {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2});
      table(l_m2_, {0, 0, 0, 0, 48, 48, 48, 48, 0, 0, 0, 0, 48, 48, 48, 48});
      return;
    }
    case Format::q2_K:
      g.L(l_m1_);
      g.dd(15);
      return;
    case Format::q3_K:
      // ggml's q3_K scales: sc[j] = (b[j % 8] >> 4 (j / 8)) & 15 |
      // ((b[8 + j % 4] >> 2 (j / 4)) & 3) << 4, minus 32; b[i] is lane i + 2
      // of the load from byte 94.
      table(l_idx1_, {2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9});
      table(l_s1_, {0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4});
      table(l_m1_, {15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15});
      table(l_idx2_, {10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13});
      table(l_s2_, {0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6});
      table(l_m2_, {3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3});
      g.L(l_c32_);
      g.dd(32);
      return;
    default: return;
  }
}

class KQuantTileDecoder : public Decoder {
 public:
  explicit KQuantTileDecoder(const KernelKey& key)
      : Decoder(key, XLayout::bf16, 2, std::make_unique<KQuantTileRule>(key)) {
    set_block(kSuper);
  }
  std::string describe() const override {
    return "K-quant -> bf16 (vpmovzxbw, vpermw), tile buffer, tdpbf16ps; d sc[j] (and dmin m[j] S_x) per "
           "sub-block";
  }
  int xsum_span() const override { return info_of(key_).has_mins ? info_of(key_).sub_block : 0; }
  int block_bytes() const override { return info_of(key_).block_bytes; }
  // The step's first quant byte (prefetch).
  int elem_byte(int off) const override {
    const int t = off / 64;  // step t: elements 64 t ..
    switch (key_.format) {
      case Format::q4_K: return 16 + 32 * t;
      case Format::q5_K: return 48 + 32 * t;
      case Format::q6_K: return 64 * (t / 2);
      case Format::q2_K: return 16 + 32 * (t / 2);
      default: return 32 + 32 * (t / 2);  // q3_K
    }
  }
  void emit_decode_constants() override {
    Generator& g = a();
    g.vmovdqu16(Zmm(r_.c[0].getIdx()), ptr[rip + l_words_]);
    g.vmovdqu16(Zmm(r_.c[1].getIdx()), ptr[rip + l_low_]);
    if (key_.format == Format::q6_K) g.vmovdqu16(Zmm(r_.c[2].getIdx()), ptr[rip + l_words_ + 64]);
    g.mov(r_.tmp.cvt32(), (1u << key_.tokens) - 1);
    g.kmovw(k_tokens, r_.tmp.cvt32());
    g.mov(r_.tmp.cvt32(), 0xFF00);
    g.kmovw(k_hi_words, r_.tmp.cvt32());
  }
  void emit_data() override {
    Generator& g = a();
    g.align(64);
    g.L(l_words_);  // bf16 of entry i (vpermw reads 5 index bits, vpermi2w 6)
    for (int i = 0; i < (key_.format == Format::q6_K ? 64 : 32); ++i)
      g.dw(formats::f32_to_bf16(float(value(i))));
    g.L(l_low_);  // the bits below the high bits of each word (vpternlogd's select)
    const int low = key_.format == Format::q3_K ? 3 : 15;
    for (int i = 0; i < 32; ++i) g.dw(uint16_t(low));
    Decoder::emit_data();
  }
  // Elements off .. off + 63 (two vectors) of the block at w into dst[0], dst[1].
  void load_widen(const Cursor& w, int off, int /*cnt*/, const Xmm* dst) override {
    Generator& g = a();
    const int t = off / 64;
    const Zmm d0 = Zmm(dst[0].getIdx()), d1 = Zmm(dst[1].getIdx()), h0 = Zmm(r_.t[0].getIdx()),
              h1 = Zmm(r_.t[1].getIdx()), low = Zmm(r_.c[1].getIdx());
    switch (key_.format) {
      case Format::q4_K:
      case Format::q5_K:  // sub-blocks 2 t (low nibbles) and 2 t + 1 (high) of 32 bytes
        g.vpmovzxbw(d0, ptr[w.at(elem_byte(off))]);
        g.vpsrlw(d1, d0, 4);
        if (key_.format == Format::q5_K) {  // bit s of qh byte i: bit 4 of element i of sub-block s
          g.vpmovzxbw(h0, ptr[w.at(16)]);
          shift_bit(h1, h0, 2 * t, 4);
          shift_bit(h0, h0, 2 * t + 1, 4);
          select(d0, h1);
          select(d1, h0);
        } else {
          g.vpandd(d0, d0, low);
        }
        break;
      case Format::q6_K: {
        // Elements 128 h + 32 a + l (a = 2 (t % 2) + i for vector i): ql byte
        // 64 h + 32 (a % 2) + l, nibble a / 2; bits 2a, 2a + 1 of qh byte 32 h + l.
        const int h = t / 2, p = t % 2;
        g.vpmovzxbw(d0, ptr[w.at(64 * h)]);
        g.vpmovzxbw(d1, ptr[w.at(64 * h + 32)]);
        if (p) {
          g.vpsrlw(d0, d0, 4);
          g.vpsrlw(d1, d1, 4);
        }
        g.vpmovzxbw(h0, ptr[w.at(128 + 32 * h)]);
        shift_bit(h1, h0, 4 * p, 4);
        shift_bit(h0, h0, 4 * p + 2, 4);
        select(d0, h1);
        select(d1, h0);
        g.vpermi2w(d0, Zmm(r_.c[0].getIdx()), Zmm(r_.c[2].getIdx()));
        g.vpermi2w(d1, Zmm(r_.c[0].getIdx()), Zmm(r_.c[2].getIdx()));
        return;
      }
      case Format::q2_K:
      case Format::q3_K: {
        // Elements 128 h + 32 j + l: crumb j of quant byte 32 h + l; q3_K's
        // fourth bit (before the - 4) is bit 4 h + j of hmask byte l.
        const int h = t / 2, j = 2 * (t % 2);
        g.vpmovzxbw(d0, ptr[w.at(elem_byte(off))]);
        g.vpsrlw(d1, d0, 2 * (j + 1));
        if (j > 0) g.vpsrlw(d0, d0, 2 * j);
        if (key_.format == Format::q3_K) {
          g.vpmovzxbw(h0, ptr[w.at(0)]);
          shift_bit(h1, h0, 4 * h + j, 2);
          shift_bit(h0, h0, 4 * h + j + 1, 2);
          select(d0, h1);
          select(d1, h0);
        }
        break;
      }
      default: assert(false);
    }
    g.vpermw(d0, d0, Zmm(r_.c[0].getIdx()));
    g.vpermw(d1, d1, Zmm(r_.c[0].getIdx()));
  }

 private:
  // The bf16 value of table entry i (the lookup's low bits hold the quant).
  int value(int i) const {
    switch (key_.format) {
      case Format::q6_K: return i - 32;
      case Format::q2_K: return i & 3;
      case Format::q3_K: return (i & 7) - 4;
      default: return i;  // q4_K (i < 16), q5_K
    }
  }
  // dst = src's words shifted so that bit `bit` lands on bit `to`.
  void shift_bit(const Zmm& dst, const Zmm& src, int bit, int to) {
    if (bit < to)
      a().vpsllw(dst, src, to - bit);
    else if (bit > to)
      a().vpsrlw(dst, src, bit - to);
    else if (dst.getIdx() != src.getIdx())
      a().vmovdqa64(dst, src);
  }
  // d = the low bits (r_.c[1]) of d, the bits above them of h (vpternlogd: c ? d : h).
  void select(const Zmm& d, const Zmm& h) { a().vpternlogd(d, h, Zmm(r_.c[1].getIdx()), 0xE4); }

  Label l_words_, l_low_;
};

}  // namespace

std::unique_ptr<Decoder> make_kquant_tile_decoder(const KernelKey& key) {
  if (!formats::is_kquant(key.format)) return nullptr;
  return std::make_unique<KQuantTileDecoder>(key);
}

}  // namespace moejit::jit
