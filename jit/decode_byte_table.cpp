// 8-bit weights to bf16 through byte tables (avx512_bf16 with AVX512_VBMI): two
// vpermi2b look up the low and high bytes of the bf16 of the 128 magnitudes,
// vpternlogd adds the sign, vpunpck{l,h}bw make 2 x 32 bf16 in the order of
// XLayout::bf16_perm64. e4m3 and e5m2 take any scale rule; q8_0 indexes the
// tables by |q| and carries two blocks' d.
#include "formats/formats.h"
#include "jit/decoders.h"

namespace moejit::jit {

using formats::Format;
using namespace Xbyak;
using namespace Xbyak::util;

namespace {

class ByteTableDecoder : public Decoder {
 public:
  ByteTableDecoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule)
      : Decoder(key, natural(key) ? XLayout::bf16 : XLayout::bf16_perm64, 2, std::move(rule)) {}
  bool needs_vbmi() const override { return true; }
  std::string describe() const override { return "byte tables -> bf16 (vpermi2b), " + multiply(); }
  void emit_decode_constants() override {
    Generator& g = a();
    // bf16 low and high bytes of magnitudes 0..127, and the sign mask.
    for (int i = 0; i < 4; ++i) g.vmovdqu8(r_.c[i], ptr[rip + l_lut_ + 64 * i]);
    g.broadcast_u32(r_.c[4], 0x80808080u, r_.tmp.cvt32());
  }
  void emit_data() override {
    Decoder::emit_data();
    Generator& g = a();
    g.L(l_lut_);
    for (int half = 0; half < 2; ++half)
      for (int i = 0; i < 128; ++i) {
        const uint16_t b = formats::f32_to_bf16(magnitude(i));  // exact: 8-bit values fit bf16
        g.db(half == 0 ? (b & 0xFF) : (b >> 8));
      }
    if (!natural(key_)) return;
    // vpermi2b indices of the natural-order words: word i of vector v is
    // (low byte lo[32 v + i], high byte hi[32 v + i]); index bit 6 picks hi.
    g.L(l_words_);
    for (int v = 0; v < 2; ++v)
      for (int j = 0; j < 64; ++j) g.db(uint8_t(32 * v + j / 2 + (j % 2 ? 64 : 0)));
  }

 protected:
  // Natural order inside each vector (the tile body's): each vector is one chunk of 32.
  static bool natural(const KernelKey& key) { return key.isa == Isa::avx512_amx; }
  std::string multiply() const { return natural(key_) ? "tile buffer, tdpbf16ps" : "vdpbf16ps"; }
  // The value of table entry i (a code's magnitude bits).
  virtual float magnitude(int i) const {
    return key_.format == Format::mxfp8_e5m2 ? formats::e5m2_to_f32(uint8_t(i))
                                             : formats::e4m3_to_f32(uint8_t(i));
  }
  // lo / hi hold the table indices; hi gains the sign bit of `sign` and the
  // pair is unpacked into dst[0], dst[1].
  void lookup_unpack(const Zmm& lo, const Zmm& hi, const Zmm& sign, const Xmm* dst, bool zero_hi) {
    Generator& g = a();
    g.vpermi2b(lo, Zmm(r_.c[0].getIdx()), Zmm(r_.c[1].getIdx()));
    if (zero_hi)
      g.vpermi2b(hi | k_sub | T_z, Zmm(r_.c[2].getIdx()), Zmm(r_.c[3].getIdx()));
    else
      g.vpermi2b(hi, Zmm(r_.c[2].getIdx()), Zmm(r_.c[3].getIdx()));
    g.vpternlogd(hi, sign, Zmm(r_.c[4].getIdx()), 0xF8);  // hi | (sign & 0x80)
    if (natural(key_)) {  // as many shuffles as the unpacks; the indices come from memory
      for (int v = 0; v < 2; ++v) {
        g.vmovdqu8(Zmm(dst[v].getIdx()), ptr[rip + l_words_ + 64 * v]);
        g.vpermi2b(Zmm(dst[v].getIdx()), lo, hi);
      }
      return;
    }
    g.vpunpcklbw(Zmm(dst[0].getIdx()), lo, hi);
    g.vpunpckhbw(Zmm(dst[1].getIdx()), lo, hi);
  }

 private:
  Label l_lut_, l_words_;
};

// 64 e4m3 or e5m2 bytes: one load and two register copies. Reading the bytes
// three times (twice as table indices, once in vpternlogd) made the kernel
// 20-25% slower on L2-resident weights, as 512-bit loads issue one per cycle
// on Zen 4.
class Fp8TableDecoder : public ByteTableDecoder {
 public:
  using ByteTableDecoder::ByteTableDecoder;
  int block_bytes() const override { return shape_.block; }
  int elem_byte(int off) const override { return off; }
  void load_widen(const Cursor& w, int off, int cnt, const Xmm* dst) override {
    Generator& g = a();
    const Zmm b = Zmm(dst[1].getIdx()), lo = Zmm(r_.t[0].getIdx()), hi = Zmm(r_.t[1].getIdx());
    if (cnt < shape_.step)
      g.vmovdqu8(b | r_.tail | T_z, ptr[w.at(elem_byte(off))]);
    else
      g.vmovdqu8(b, ptr[w.at(elem_byte(off))]);
    g.vmovdqa64(lo, b);
    g.vmovdqa64(hi, b);
    lookup_unpack(lo, hi, b, dst, false);
  }
};

// q8_0, two 34-byte blocks per step: the quants of block 0 in the low 256
// bits, block 1 in the high; bf16 of |q| from the tables (index 0 holds 128,
// for -128; q = 0 zeroes the high byte), the sign from q. A tail of one block
// leaves the high half zero. The two fp16 d go to the two halves of the
// scale vector (Q8PairScale).
class Q8TableDecoder : public ByteTableDecoder {
 public:
  explicit Q8TableDecoder(const KernelKey& key);
  std::string describe() const override { return "|q| byte tables -> bf16 (vpermi2b), " + multiply(); }
  int block_bytes() const override { return kQ8BlockBytes * shape_.block / 32; }
  int elem_byte(int off) const override { return q8_elem_byte(off); }
  void load_widen(const Cursor& w, int off, int cnt, const Xmm* dst) override {
    Generator& g = a();
    const Zmm b = Zmm(r_.scale.getIdx()), lo = Zmm(r_.t[0].getIdx()), hi = Zmm(r_.t[1].getIdx());
    g.vmovdqu8(Ymm(b.getIdx()), ptr[w.at(elem_byte(off))]);  // EVEX: clears bits 256-511
    if (cnt > 32) g.vinserti64x4(b, b, ptr[w.at(elem_byte(off + 32))], 1);
    g.vpabsb(lo, b);
    g.vptestmb(k_sub, b, b);
    g.vmovdqa64(hi, lo);
    lookup_unpack(lo, hi, b, dst, true);
  }

 protected:
  float magnitude(int i) const override { return float(i == 0 ? 128 : i); }
};

// d of block 0 on lanes 0-7, of block 1 on lanes 8-15 (or 0 in a one-block tail).
class Q8PairScale : public GgufTileScale {
 public:
  explicit Q8PairScale(const KernelKey& key) : GgufTileScale(key) {}
  void emit_constants() override {
    if (shape_.groups != 2) return;
    a().mov(r_.tmp.cvt32(), kGroup2Lanes);
    a().kmovw(k_grp2, r_.tmp.cvt32());
  }
  void apply(const ScaleBlock& b) override {
    Generator& g = a();
    if (b.n > 32) {
      g.vpbroadcastw(Ymm(r_.scale.getIdx()), ptr[b.w.at()]);
      g.vpbroadcastw(Ymm(r_.scale.getIdx()) | k_grp2, ptr[b.w.at(kQ8BlockBytes)]);
    } else {
      g.vpbroadcastw(Xmm(r_.scale.getIdx()), ptr[b.w.at()]);  // clears the upper lanes
    }
    g.vcvtph2ps(Zmm(r_.scale.getIdx()), Ymm(r_.scale.getIdx()));
    fma_tokens(b, r_.scale);
  }
};

Q8TableDecoder::Q8TableDecoder(const KernelKey& key)
    : ByteTableDecoder(key, std::make_unique<Q8PairScale>(key)) {}

}  // namespace

std::unique_ptr<Decoder> make_fp8_table_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule) {
  return std::make_unique<Fp8TableDecoder>(key, std::move(rule));
}
std::unique_ptr<Decoder> make_q8_table_decoder(const KernelKey& key) {
  return std::make_unique<Q8TableDecoder>(key);
}

}  // namespace moejit::jit
