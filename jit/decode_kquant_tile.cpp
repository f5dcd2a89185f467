// q4_K and q5_K on tiles (avx512_amx). A super-block (256 elements) is the
// tile body's block and each of its 8 sub-blocks of 32 a scale group: one tile
// row of 32 bf16 quants per row, in natural order, so the activations are
// XPrep's tile layout with the sums of x of each sub-block after each block.
// - The decode, two sub-blocks a step: the 32 quant bytes they share widened
//   to words (vpmovzxbw); the low nibbles masked, the high ones shifted down;
//   q5_K's fifth bit (bit s of qh byte i, for sub-block s) shifted to bit 4 and
//   selected in (vpternlogd); vpermw then looks up bf16(q) on each word's low
//   five bits. Quants 0..31 are exact in bf16, so C holds each sub-block's sum
//   of q x with exact products.
// - The scales (KQuantTileRule): at a block's first group, each row's 8 sc[j]
//   and 8 m[j] unpacked from the 12 packed bytes at once (vpermd, shifts and
//   masks), times d and dmin (exact in fp32: 11 x 6 bits), to a 64-byte
//   record per row on the stack. Each group then adds, per row,
//   C d sc[j] - dmin m[j] S_x[j] to the row's total (lanes = tokens): two FMAs,
//   with S_x[j] one masked load of the call's tokens' sums.
// K is a multiple of 256 (the K-quants' rule), so no step is partial.
#include <cassert>

#include "formats/formats.h"
#include "jit/decoders.h"

namespace moejit::jit {

using formats::Format;
using namespace Xbyak;
using namespace Xbyak::util;

namespace {

constexpr int kSuper = 256;       // elements of a super-block: the tile body's block
constexpr int kSub = 32;          // elements of a sub-block: a scale group, one tile row
constexpr int kScalesAt = 4;      // the 12 packed scale bytes, after d and dmin
constexpr int kRecordBytes = 64;  // a row's record: D_j = d sc[j] at 4 j, M_j = dmin m[j] at 32 + 4 j
// Opmasks: the call's tokens (lanes of a sums row) and the words 8..15 of a ymm (dmin's lanes).
const Opmask k_tokens = k5;
const Opmask k_hi_words = k6;

class KQuantTileRule : public ScaleRule {
 public:
  explicit KQuantTileRule(const KernelKey& key) : ScaleRule(key) {}
  int group() const override { return kSub; }
  bool check(std::string* why) const override {
    if (key_.k % kSuper == 0) return true;
    *why = "k must be a multiple of 256 for the K-quants";
    return false;
  }
  int block_bytes() const override { return 0; }  // inline in the weights
  bool tile_ready() const override { return true; }
  int stack_bytes() const override { return 16 * kRecordBytes; }
  void prologue() override { a().sub(rsp, stack_bytes()); }
  // Only the tile body runs this rule (make_decoder gives the decode on the
  // tile tier alone), and it calls tile_apply.
  void apply(const ScaleBlock& /*b*/) override { assert(false && "tile bodies only"); }
  void tile_apply(const TileScaleBlock& b) override {
    Generator& g = a();
    if (b.group == 0)
      for (int r = 0; r < b.rows; ++r) emit_record(b.block_w, r * b.row_bytes, r);
    const Zmm sx = Zmm(r_.scale.getIdx());
    g.vmovups(sx | k_tokens | T_z, ptr[b.xsums.at(int64_t(b.group) * b.xsum_row_bytes)]);
    for (int r = 0; r < b.rows; ++r) {
      const Zmm c = Zmm(r_.w[r % 2].getIdx());
      g.vmovups(c, ptr[b.c.at(64 * r)]);
      g.vfmadd231ps(b.totals[size_t(r)], c, ptr_b[rsp + kRecordBytes * r + 4 * b.group]);
      g.vfnmadd231ps(b.totals[size_t(r)], sx, ptr_b[rsp + kRecordBytes * r + 32 + 4 * b.group]);
    }
  }
  void emit_data() override {
    Generator& g = a();
    // Lane L < 8: sc[L]; lane 8 + j: m[j] (ggml's get_scale_min_k4). From the
    // packed bytes q[0..11]: sc[j] = q[j] & 63 and m[j] = q[j + 4] & 63 for
    // j < 4; sc[j] = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4 and
    // m[j] = (q[j + 4] >> 4) | (q[j] >> 6) << 4 for j >= 4. Lane L is
    // ((q[idx1[L]] >> s1[L]) & m1[L]) | ((q[idx2[L]] >> 2) & m2[L]).
    const int idx1[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11};
    const int idx2[16] = {0, 0, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0, 4, 5, 6, 7};
    g.align(64);
    g.L(l_idx1_);
    for (int v : idx1) g.dd(uint32_t(v));
    g.L(l_idx2_);
    for (int v : idx2) g.dd(uint32_t(v));
    g.L(l_s1_);
    for (int L = 0; L < 16; ++L) g.dd(L >= 12 ? 4 : 0);
    g.L(l_m1_);
    for (int L = 0; L < 16; ++L) g.dd(L % 8 < 4 ? 63 : 15);
    g.L(l_m2_);
    for (int L = 0; L < 16; ++L) g.dd(L % 8 < 4 ? 0 : 0x30);
  }

 private:
  // Row r's record from its super-block at w + row_off.
  void emit_record(const Cursor& w, int64_t row_off, int r) {
    Generator& g = a();
    const Zmm q = Zmm(r_.w[0].getIdx()), lo = Zmm(r_.w[1].getIdx()), hi = Zmm(r_.w[2].getIdx()),
              d = Zmm(r_.w[3].getIdx());
    g.vpmovzxbd(q, ptr[w.at(row_off + kScalesAt)]);  // q[0..11] and 4 quant bytes
    g.vmovdqu32(lo, ptr[rip + l_idx1_]);
    g.vpermd(lo, lo, q);
    g.vpsrlvd(lo, lo, ptr[rip + l_s1_]);
    g.vpandd(lo, lo, ptr[rip + l_m1_]);
    g.vmovdqu32(hi, ptr[rip + l_idx2_]);
    g.vpermd(hi, hi, q);
    g.vpsrld(hi, hi, 2);
    g.vpandd(hi, hi, ptr[rip + l_m2_]);
    g.vpord(lo, lo, hi);
    g.vcvtdq2ps(lo, lo);
    const Ymm dh = Ymm(d.getIdx());
    g.vpbroadcastw(dh, ptr[w.at(row_off)]);                   // d on words 0..7
    g.vpbroadcastw(dh | k_hi_words, ptr[w.at(row_off + 2)]);  // dmin on words 8..15
    g.vcvtph2ps(d, dh);
    g.vmulps(lo, lo, d);
    g.vmovups(ptr[rsp + kRecordBytes * r], lo);
  }

  Label l_idx1_, l_idx2_, l_s1_, l_m1_, l_m2_;
};

class KQuantTileDecoder : public Decoder {
 public:
  explicit KQuantTileDecoder(const KernelKey& key)
      : Decoder(key, XLayout::bf16, 2, std::make_unique<KQuantTileRule>(key)),
        q5_(key.format == Format::q5_K) {
    set_block(kSuper);
  }
  std::string describe() const override {
    return std::string(q5_ ? "q5_K" : "q4_K") +
           " -> bf16 (vpmovzxbw, vpermw), tile buffer, tdpbf16ps; d sc[j] and dmin m[j] S_x per sub-block";
  }
  int xsum_span() const override { return kSub; }
  int block_bytes() const override { return formats::info(key_.format).block_bytes; }
  // The step's quant bytes (prefetch).
  int elem_byte(int off) const override { return quants_at() + off / 64 * 32; }
  void emit_decode_constants() override {
    Generator& g = a();
    g.vmovdqu16(Zmm(r_.c[0].getIdx()), ptr[rip + l_words_]);
    g.vmovdqu16(Zmm(r_.c[1].getIdx()), ptr[rip + l_low_]);
    g.mov(r_.tmp.cvt32(), (1u << key_.tokens) - 1);
    g.kmovw(k_tokens, r_.tmp.cvt32());
    g.mov(r_.tmp.cvt32(), 0xFF00);
    g.kmovw(k_hi_words, r_.tmp.cvt32());
  }
  void emit_data() override {
    Generator& g = a();
    g.align(64);
    g.L(l_words_);
    for (int i = 0; i < 32; ++i) g.dw(formats::f32_to_bf16(float(i)));
    g.L(l_low_);
    for (int i = 0; i < 32; ++i) g.dw(0x000F);
    Decoder::emit_data();
  }
  // Sub-blocks 2 c and 2 c + 1 (c = off / 64) into dst[0] and dst[1].
  void load_widen(const Cursor& w, int off, int /*cnt*/, const Xmm* dst) override {
    Generator& g = a();
    const int c = off / 64;
    const Zmm d0 = Zmm(dst[0].getIdx()), d1 = Zmm(dst[1].getIdx()), table = Zmm(r_.c[0].getIdx()),
              low = Zmm(r_.c[1].getIdx());
    g.vpmovzxbw(d0, ptr[w.at(elem_byte(off))]);
    g.vpsrlw(d1, d0, 4);
    if (q5_) {
      // Bit s of qh byte i is the fifth bit of element i of sub-block s: to bit 4
      // of each word, above the nibble (vpermw ignores the bits above 4).
      const Zmm h0 = Zmm(r_.t[0].getIdx()), h1 = Zmm(r_.t[1].getIdx());
      g.vpmovzxbw(h0, ptr[w.at(kQhAt)]);
      bit_to_4(h1, h0, 2 * c);
      bit_to_4(h0, h0, 2 * c + 1);
      g.vpternlogd(d0, h1, low, 0xE4);  // low ? d0 : h1, bitwise
      g.vpternlogd(d1, h0, low, 0xE4);
    } else {
      g.vpandd(d0, d0, low);
    }
    g.vpermw(d0, d0, table);
    g.vpermw(d1, d1, table);
  }

 private:
  static constexpr int kQhAt = 16;  // q5_K: 32 bytes of fifth bits, then the quants
  int quants_at() const { return q5_ ? kQhAt + 32 : kScalesAt + 12; }
  // dst = src's words shifted so that bit `bit` lands on bit 4.
  void bit_to_4(const Zmm& dst, const Zmm& src, int bit) {
    if (bit < 4)
      a().vpsllw(dst, src, 4 - bit);
    else if (bit > 4)
      a().vpsrlw(dst, src, bit - 4);
    else if (dst.getIdx() != src.getIdx())
      a().vmovdqa64(dst, src);
  }

  bool q5_;
  Label l_words_, l_low_;
};

}  // namespace

std::unique_ptr<Decoder> make_kquant_tile_decoder(const KernelKey& key) {
  if (key.format != Format::q4_K && key.format != Format::q5_K) return nullptr;
  return std::make_unique<KQuantTileDecoder>(key);
}

}  // namespace moejit::jit
