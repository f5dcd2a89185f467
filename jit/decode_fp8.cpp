// 8-bit float weights (e4m3, e5m2) widened without byte tables. The scale
// rule (fp8_block's block scales, or mxfp8's e8m0 groups) is the caller's.
#include "formats/formats.h"
#include "jit/decoders.h"

namespace moejit::jit {

using namespace Xbyak;
using namespace Xbyak::util;

namespace {

// One byte per element, any scale rule.
class Fp8Decoder : public Decoder {
 public:
  using Decoder::Decoder;
  int block_bytes() const override { return shape_.block; }
  int elem_byte(int off) const override { return off; }

 protected:
  // The step's bytes, sign- or zero-extended to words in `words` (an xmm on
  // avx2, a ymm on avx512); a partial step reads exactly its cnt bytes.
  void load_words(const Cursor& w, int off, int cnt, const Xmm& words, bool sign) {
    Generator& g = a();
    const Xmm xt = Xmm(r_.t[0].getIdx());
    const Address src = ptr[w.at(elem_byte(off))];
    if (cnt < shape_.step) {
      if (key_.isa == Isa::avx2)
        g.load_partial_xmm(xt, w.at(elem_byte(off)), cnt);
      else
        g.vmovdqu8(xt | r_.tail | T_z, src);
      sign ? g.vpmovsxbw(words, xt) : g.vpmovzxbw(words, xt);
    } else {
      sign ? g.vpmovsxbw(words, src) : g.vpmovzxbw(words, src);
    }
  }
};

// e4m3 on avx2 / avx512: fp16 = (sign_extend(b) << 7) & 0xBF80 is exactly
// e4m3(b) * 2^-8 for every code, subnormals included; vcvtph2ps widens it and
// the row total is multiplied by 256 (total_factor).
class E4m3Fp16Decoder : public Fp8Decoder {
 public:
  E4m3Fp16Decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule)
      : Fp8Decoder(key, XLayout::f32, 1, std::move(rule)) {}
  float total_factor() const override { return 256.0f; }
  void emit_decode_constants() override {
    a().broadcast_u32(r_.c[0], 0xBF80BF80u, r_.tmp.cvt32());  // keep sign and e4m3 bits after << 7
  }
  void load_widen(const Cursor& w, int off, int cnt, const Xmm* dst) override {
    Generator& g = a();
    const Xmm words = half(dst[0]);
    load_words(w, off, cnt, words, true);
    g.vpsllw(words, words, 7);
    g.vpand(words, words, half(r_.c[0]));
    g.vcvtph2ps(dst[0], words);
  }

 private:
  // The register holding one step's words: half the vector width.
  Xmm half(const Xmm& v) const { return zmm() ? Xmm(Ymm(v.getIdx())) : Xmm(v.getIdx()); }
};

// e5m2 on every tier without byte tables: the high byte of an fp16, (b << 8)
// and vcvtph2ps.
class E5m2Fp16Decoder : public Fp8Decoder {
 public:
  E5m2Fp16Decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule)
      : Fp8Decoder(key, XLayout::f32, 1, std::move(rule)) {}
  void load_widen(const Cursor& w, int off, int cnt, const Xmm* dst) override {
    Generator& g = a();
    const Xmm words = zmm() ? Xmm(Ymm(dst[0].getIdx())) : Xmm(dst[0].getIdx());
    load_words(w, off, cnt, words, false);
    g.vpsllw(words, words, 8);
    g.vcvtph2ps(dst[0], words);
  }
};

// e4m3 to bf16 on avx512_bf16 without VBMI: normals as ((sx << 4) & 0x87F0) +
// 0x3C00, exponent-0 codes blended from a 32-entry vpermw table, the sign with
// vpternlogd. Exact: e4m3 has 4 significant bits and its range fits bf16.
class E4m3BlendDecoder : public Fp8Decoder {
 public:
  E4m3BlendDecoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule)
      : Fp8Decoder(key, XLayout::bf16, 1, std::move(rule)) {}
  std::string describe() const override { return "arithmetic + vpermw blend -> bf16, vdpbf16ps"; }
  void emit_decode_constants() override {
    Generator& g = a();
    const Reg32 t = r_.tmp.cvt32();
    g.broadcast_u32(r_.c[0], 0x87F087F0u, t);  // sign + exponent/mantissa bits after << 4
    g.broadcast_u32(r_.c[1], 0x3C003C00u, t);  // exponent bias 120 << 7
    g.broadcast_u32(r_.c[2], 0x00780078u, t);  // e4m3 exponent field
    g.vmovdqu16(r_.c[3], ptr[rip + l_sub_]);
    g.broadcast_u32(r_.c[4], 0x80008000u, t);
  }
  void emit_data() override {
    Decoder::emit_data();
    Generator& g = a();
    g.L(l_sub_);
    // bf16 of e4m3 subnormal magnitudes m * 2^-9, indexed by the low 5 bits (m = low 3).
    for (int i = 0; i < 32; ++i) g.dw(formats::f32_to_bf16(float(i & 7) / 512.0f));
  }
  void load_widen(const Cursor& w, int off, int cnt, const Xmm* dst) override {
    Generator& g = a();
    const Zmm zw = Zmm(dst[0].getIdx()), zt = Zmm(r_.t[0].getIdx());
    const Ymm yt = Ymm(r_.t[0].getIdx());
    const Address src = ptr[w.at(elem_byte(off))];
    if (cnt < shape_.step) {
      g.vmovdqu8(yt | r_.tail | T_z, src);
      g.vpmovsxbw(zt, yt);
    } else {
      g.vpmovsxbw(zt, src);
    }
    // normal: ((sx << 4) & 0x87F0) + 0x3C00; exponent 0: table[m]; then | sign.
    g.vpsllw(zw, zt, 4);
    g.vpandd(zw, zw, Zmm(r_.c[0].getIdx()));
    g.vpaddw(zw, zw, Zmm(r_.c[1].getIdx()));
    g.vptestnmw(k_sub, zt, Zmm(r_.c[2].getIdx()));
    g.vpermw(zw | k_sub, zt, Zmm(r_.c[3].getIdx()));
    g.vpternlogd(zw, zt, Zmm(r_.c[4].getIdx()), 0xF8);  // zw | (zt & 0x8000)
  }

 private:
  Label l_sub_;
};

}  // namespace

std::unique_ptr<Decoder> make_e4m3_fp16_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule) {
  return std::make_unique<E4m3Fp16Decoder>(key, std::move(rule));
}
std::unique_ptr<Decoder> make_e5m2_fp16_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule) {
  return std::make_unique<E5m2Fp16Decoder>(key, std::move(rule));
}
std::unique_ptr<Decoder> make_e4m3_blend_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule) {
  return std::make_unique<E4m3BlendDecoder>(key, std::move(rule));
}

}  // namespace moejit::jit
