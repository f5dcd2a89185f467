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
// Opmask: the call's tokens (lanes of a sums row).
const Opmask k_tokens = k5;

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
  int stack_bytes() const override { return 64 * (subs_ * (mins_ ? 2 : 1) + 2); }
  void prologue() override { a().sub(rsp, stack_bytes()); }
  // Only the tile body runs this rule (make_decoder gives the decode on the
  // tile tier alone), and it calls tile_apply.
  void apply(const ScaleBlock& /*b*/) override { assert(false && "tile bodies only"); }
  void tile_apply(const TileScaleBlock& b) override {
    if (b.group == 0) emit_factors(b);
    tile_fma_rows(b, rsp + d_off(b.group));
    if (!mins_) return;
    const Zmm sx = Zmm(r_.scale.getIdx());
    a().vmovups(sx | k_tokens | T_z, ptr[b.xsums.at(int64_t(b.group) * b.xsum_row_bytes)]);
    tile_fnma_rows_tokens(b, rsp + m_off(b.group), sx);
  }
  void emit_data() override;

 private:
  // The block's factors on the stack, one vector per sub-block, lane = row:
  // D_j = d sc[j] at d_off(j), M_j = dmin m[j] at m_off(j); then d and dmin.
  int d_off(int j) const { return 64 * j; }
  int m_off(int j) const { return 64 * (subs_ + j); }
  int d_slot() const { return 64 * subs_ * (mins_ ? 2 : 1); }
  int dmin_slot() const { return d_slot() + 64; }
  Format format() const { return key_.format; }
  // Every row's factors of the block, from its scale bytes: gathered a dword
  // per row (lane = row), so each factor is the same vertical shifts and masks
  // on all 16 rows.
  void emit_factors(const TileScaleBlock& b);
  // dst lane r = the dword at byte `off` of the block in row r (0 past b.rows).
  void gather(const Zmm& dst, const TileScaleBlock& b, int off);
  // The fp16 in the low (or high) half of each dword of g, widened, to the stack at `slot`.
  void store_half(const Zmm& g, bool high, int slot);
  // The integer lanes of v to fp32, times the vector at `scale_slot`, to the stack at `slot`.
  void store_factor(const Zmm& v, int scale_slot, int slot);
  Address bcst(const Label& l) { return ptr_b[rip + l]; }

  int subs_;
  bool mins_;
  Label l_rows_, l_15_, l_63_, l_32_;
};

void KQuantTileRule::gather(const Zmm& dst, const TileScaleBlock& b, int off) {
  Generator& g = a();
  const Zmm idx = Zmm(r_.scale.getIdx());
  if (b.rows == 16) {
    g.kxnorw(k_sub, k_sub, k_sub);
  } else {
    g.mov(r_.tmp.cvt32(), (1u << b.rows) - 1);
    g.kmovw(k_sub, r_.tmp.cvt32());
  }
  g.vpxord(dst, dst, dst);
  g.vmovdqu32(idx, ptr[rip + l_rows_]);
  g.vpgatherdd(dst | k_sub, ptr[b.block_w.at(off) + idx]);
}

void KQuantTileRule::store_half(const Zmm& v, bool high, int slot) {
  Generator& g = a();
  if (high) g.vpsrld(v, v, 16);
  g.vpmovdw(Ymm(v.getIdx()), v);
  g.vcvtph2ps(v, Ymm(v.getIdx()));
  g.vmovaps(ptr[rsp + slot], v);
}

void KQuantTileRule::store_factor(const Zmm& v, int scale_slot, int slot) {
  Generator& g = a();
  g.vcvtdq2ps(v, v);
  g.vmulps(v, v, ptr[rsp + scale_slot]);
  g.vmovaps(ptr[rsp + slot], v);
}

void KQuantTileRule::emit_factors(const TileScaleBlock& b) {
  Generator& g = a();
  const Zmm g0 = Zmm(r_.w[0].getIdx()), g1 = Zmm(r_.w[1].getIdx()), g2 = Zmm(r_.w[2].getIdx()),
            ta = Zmm(r_.w[3].getIdx()), tb = Zmm(r_.scale.getIdx());
  // ta = (src >> shift) & mask (a left shift where shift < 0)
  auto field = [&](const Zmm& dst, const Zmm& src, int shift) {
    if (shift > 0)
      g.vpsrld(dst, src, shift);
    else if (shift < 0)
      g.vpslld(dst, src, -shift);
    else
      g.vmovdqa32(dst, src);
  };
  // dst = bits 0..3 of lo, bits 4.. of hi, masked to 6 bits
  auto join = [&](const Zmm& lo, const Zmm& hi) {
    g.vpternlogd(lo, hi, bcst(l_15_), 0xE4);
    g.vpandd(lo, lo, bcst(l_63_));
  };
  switch (format()) {
    case Format::q4_K:
    case Format::q5_K: {
      // d, dmin, then 12 packed bytes q[0..11] (ggml's get_scale_min_k4): for
      // j < 4 sc[j] = q[j] & 63, m[j] = q[j + 4] & 63; for j >= 4 sc[j] =
      // (q[j + 4] & 15) | (q[j - 4] >> 6) << 4, m[j] = (q[j + 4] >> 4) | (q[j] >> 6) << 4.
      gather(g0, b, 0);
      g.vmovdqa32(g1, g0);
      store_half(g0, false, d_slot());
      store_half(g1, true, dmin_slot());
      gather(g0, b, 4);   // q[0..3]
      gather(g1, b, 8);   // q[4..7]
      gather(g2, b, 12);  // q[8..11]
      for (int j = 0; j < 4; ++j) {
        field(ta, g0, 8 * j);
        g.vpandd(ta, ta, bcst(l_63_));
        store_factor(ta, d_slot(), d_off(j));
        field(ta, g1, 8 * j);
        g.vpandd(ta, ta, bcst(l_63_));
        store_factor(ta, dmin_slot(), m_off(j));
      }
      for (int i = 0; i < 4; ++i) {
        field(ta, g2, 8 * i);
        field(tb, g0, 8 * i + 2);
        join(ta, tb);
        store_factor(ta, d_slot(), d_off(4 + i));
        field(ta, g2, 8 * i + 4);
        field(tb, g1, 8 * i + 2);
        join(ta, tb);
        store_factor(ta, dmin_slot(), m_off(4 + i));
      }
      return;
    }
    case Format::q6_K:  // 16 int8 scales at 192, d at 208 (the high half of the dword at 206)
      gather(g0, b, 206);
      store_half(g0, true, d_slot());
      for (int q = 0; q < 4; ++q) {
        gather(g0, b, 192 + 4 * q);
        for (int i = 0; i < 4; ++i) {
          g.vpslld(ta, g0, 24 - 8 * i);
          g.vpsrad(ta, ta, 24);
          store_factor(ta, d_slot(), d_off(4 * q + i));
        }
      }
      return;
    case Format::q2_K:  // 16 bytes: sc in the low nibbles, m in the high; d at 80, dmin at 82
      gather(g0, b, 80);
      g.vmovdqa32(g1, g0);
      store_half(g0, false, d_slot());
      store_half(g1, true, dmin_slot());
      for (int q = 0; q < 4; ++q) {
        gather(g0, b, 4 * q);
        for (int i = 0; i < 4; ++i) {
          field(ta, g0, 8 * i);
          g.vpandd(ta, ta, bcst(l_15_));
          store_factor(ta, d_slot(), d_off(4 * q + i));
          field(ta, g0, 8 * i + 4);
          g.vpandd(ta, ta, bcst(l_15_));
          store_factor(ta, dmin_slot(), m_off(4 * q + i));
        }
      }
      return;
    case Format::q3_K: {
      // ggml's q3_K scales, b[i] the 12 bytes at 96: sc[j] = (b[j % 8] >> 4 (j / 8)) & 15 |
      // ((b[8 + j % 4] >> 2 (j / 4)) & 3) << 4, minus 32; d at 108 (the dword at 106).
      gather(g0, b, 106);
      store_half(g0, true, d_slot());
      gather(g0, b, 96);
      gather(g1, b, 100);
      gather(g2, b, 104);
      for (int j = 0; j < 16; ++j) {
        field(ta, j % 8 < 4 ? g0 : g1, 8 * (j % 4) + 4 * (j / 8));
        field(tb, g2, 8 * (j % 4) + 2 * (j / 4) - 4);
        join(ta, tb);
        g.vpsubd(ta, ta, bcst(l_32_));
        store_factor(ta, d_slot(), d_off(j));
      }
      return;
    }
    default: assert(false);
  }
}

void KQuantTileRule::emit_data() {
  Generator& g = a();
  g.align(64);
  g.L(l_rows_);  // lane r: row r's byte offset
  const int64_t row_bytes = formats::row_bytes(key_.format, key_.k);
  for (int r = 0; r < 16; ++r) g.dd(uint32_t(r * row_bytes));
  g.L(l_15_);
  g.dd(15);
  g.L(l_63_);
  g.dd(63);
  g.L(l_32_);
  g.dd(32);
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
