// bf16 weights: fp32 by a zero-extend and shift (avx2, avx512), or read as
// bf16 pairs for vdpbf16ps (avx512_bf16). Unscaled.
#include "jit/decoders.h"

namespace moejit::jit {

using namespace Xbyak;
using namespace Xbyak::util;

namespace {

class Bf16Decoder : public Decoder {
 public:
  explicit Bf16Decoder(const KernelKey& key)
      : Decoder(key, bf16_pairs(key.isa) ? XLayout::bf16 : XLayout::f32, 1, nullptr) {}
  // The hardware prefetchers stream bf16 rows best (see the row body).
  bool streams_with_prefetch() const override { return false; }
  std::string describe() const override {
    if (key_.isa == Isa::avx512_amx) return "tileloadd from the weights (tails via a tile buffer), tdpbf16ps";
    return key_.isa == Isa::avx512_bf16 ? "vdpbf16ps" : Decoder::describe();
  }
  bool tile_direct() const override { return true; }
  int block_bytes() const override { return shape_.block * 2; }
  int elem_byte(int off) const override { return off * 2; }

  void load_widen(const Cursor& w, int off, int cnt, const Xmm* dst) override {
    Generator& g = a();
    const bool partial = cnt < shape_.step;
    const Address src = ptr[w.at(elem_byte(off))];
    const Xmm xt = Xmm(r_.t[0].getIdx());
    const Ymm yt = Ymm(r_.t[0].getIdx());
    switch (key_.isa) {
      case Isa::avx2:
        if (partial) {
          g.load_partial_xmm(xt, w.at(elem_byte(off)), cnt * 2);
          g.vpmovzxwd(dst[0], xt);
        } else {
          g.vpmovzxwd(dst[0], src);
        }
        g.vpslld(dst[0], dst[0], 16);
        break;
      case Isa::avx512:
        if (partial) {
          g.vmovdqu16(yt | r_.tail | T_z, src);
          g.vpmovzxwd(dst[0], yt);
        } else {
          g.vpmovzxwd(dst[0], src);
        }
        g.vpslld(dst[0], dst[0], 16);
        break;
      case Isa::avx512_bf16:
      case Isa::avx512_amx:
        if (partial)
          g.vmovdqu16(dst[0] | r_.tail | T_z, src);
        else
          g.vmovdqu16(dst[0], src);
        break;
      default: break;
    }
  }
};

}  // namespace

std::unique_ptr<Decoder> make_bf16_decoder(const KernelKey& key) {
  return std::make_unique<Bf16Decoder>(key);
}

}  // namespace moejit::jit
