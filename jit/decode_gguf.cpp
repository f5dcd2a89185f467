// GGUF integer blocks (q4_0: 18 bytes = fp16 d + 16 bytes of nibble pairs,
// byte j holding element j low and j + 16 high; q8_0: 34 bytes = d + 32 int8).
// - fp32 (every tier for q8_0 without VBMI, avx2 / avx512 for q4_0): quants
//   widened to dwords and converted, d broadcast per block (GgufScale).
// - q4_0 on avx512_bf16: 4 blocks (72 bytes) at a time as e2m1 with a table of
//   q - 8 (XLayout::bf16_q4); the d of block b on 128-bit lane b.
// - q4_0 on avx512_amx: each block one vector of 32 bf16 in natural order,
//   a tile row (Q4TileDecoder).
#include "formats/formats.h"
#include "jit/decoders.h"

namespace moejit::jit {

using namespace Xbyak;
using namespace Xbyak::util;

namespace {

class Q8F32Decoder : public Decoder {
 public:
  explicit Q8F32Decoder(const KernelKey& key) : Decoder(key, XLayout::f32, 1, make_gguf_scale(key)) {}
  int block_bytes() const override { return kQ8BlockBytes * shape_.block / 32; }
  int elem_byte(int off) const override { return q8_elem_byte(off); }
  void load_widen(const Cursor& w, int off, int /*cnt*/, const Xmm* dst) override {
    // exact in fp32; K % 32 == 0, so a step is never partial
    a().vpmovsxbd(dst[0], ptr[w.at(elem_byte(off))]);
    a().vcvtdq2ps(dst[0], dst[0]);
  }
};

class Q4F32Decoder : public Decoder {
 public:
  explicit Q4F32Decoder(const KernelKey& key) : Decoder(key, XLayout::f32, 1, make_gguf_scale(key)) {}
  int block_bytes() const override { return kQ4BlockBytes * shape_.block / 32; }
  // A step of 8 or 16 elements of a 32-element block: elements j and j + 16 share byte j.
  int elem_byte(int off) const override { return 2 + off % 16; }
  void emit_decode_constants() override {
    a().broadcast_u32(r_.c[0], 0x0F, r_.tmp.cvt32());  // nibble mask; the zero point is read from data
  }
  void emit_data() override {
    a().L(l_eight_);  // 16 dwords of 8
    for (int i = 0; i < 16; ++i) a().dd(8);
  }
  void load_widen(const Cursor& w, int off, int /*cnt*/, const Xmm* dst) override {
    Generator& g = a();
    const Xmm v = dst[0];
    g.vpmovzxbd(v, ptr[w.at(elem_byte(off))]);
    if (off >= 16) g.vpsrld(v, v, 4);
    if (zmm())
      g.vpandd(v, v, r_.c[0]);
    else
      g.vpand(v, v, r_.c[0]);
    g.vpsubd(v, v, ptr[rip + l_eight_]);
    g.vcvtdq2ps(v, v);
  }

 private:
  Label l_eight_;
};

// Lanes of block b of a 4-block chunk (k3 doubles as k_grp2: these blocks
// hold 4 groups, never 2).
Opmask k_q4_block(int b) { return Opmask(b == 0 ? 6 : 2 + b); }

// Full chunks with VBMI: two 64-byte loads of the 72-byte chunk (bytes [0, 64)
// and [8, 72)) and one vpermt2b gather the 16 quant bytes of block b onto
// 128-bit lane b, and one vpermw of the first load puts the fp16 d of block b
// (word 9b) on lane b, widened once and left in r_.scale for the scale rule.
// The previous version (a vmovdqu and 3 vinserti32x4 from memory, 4 masked
// vpbroadcastw of d) ran 14.4-14.7 GB/s hot on one core with K=2048, this one
// 18.7-19.4. Partial chunks (K % 128 != 0) and CPUs without AVX512_VBMI
// (kFlagNoVbmi) keep the four loads.
bool q4_gathers(const KernelKey& key, const DecodeShape& s, int cnt) {
  return !(key.flags & kFlagNoVbmi) && cnt == s.step;
}

// The fp16 d of blocks 0..3 on their 128-bit lanes (missing blocks: 0), or
// the vector load_widen just left.
class Q4x4Scale : public ScaleRule {
 public:
  explicit Q4x4Scale(const KernelKey& key) : ScaleRule(key) {}
  int group() const override { return 32; }
  int block_bytes() const override { return 0; }  // inline in the weights
  void apply(const ScaleBlock& b) override {
    Generator& g = a();
    if (!(b.after_widen && q4_gathers(key_, shape_, b.n))) {
      const Ymm ys = Ymm(r_.scale.getIdx());
      const int nb = (b.n + 31) / 32;
      g.vpxor(ys, ys, ys);
      for (int blk = 0; blk < nb; ++blk)
        g.vpbroadcastw(ys | k_q4_block(blk), ptr[b.w.at(kQ4BlockBytes * blk)]);
      g.vcvtph2ps(Zmm(r_.scale.getIdx()), ys);
    }
    fma_tokens(b, r_.scale);
  }
};

class Q4x4Decoder : public Decoder {
 public:
  explicit Q4x4Decoder(const KernelKey& key)
      : Decoder(key, XLayout::bf16_q4, 4, std::make_unique<Q4x4Scale>(key)) {}
  bool needs_vbmi() const override { return !(key_.flags & kFlagNoVbmi); }
  std::string describe() const override { return "q4_0 -> bf16 (vpsrlw + vpermw, 4 blocks), vdpbf16ps"; }
  int block_bytes() const override { return kQ4BlockBytes * shape_.block / 32; }
  int elem_byte(int off) const override { return kQ4BlockBytes * (off / 32) + 2; }  // off: a block start
  void emit_decode_constants() override {
    Generator& g = a();
    // the q - 8 -> bf16 word table (twice); lanes of blocks 0..3 of a 4-block chunk
    g.vmovdqu16(r_.c[0], ptr[rip + l_words_]);
    g.vmovdqu8(r_.c[1], ptr[rip + l_qidx_]);
    g.vmovdqu16(r_.c[2], ptr[rip + l_didx_]);
    for (int b = 0; b < 4; ++b) {
      g.mov(r_.tmp.cvt32(), 0xF << (4 * b));
      g.kmovw(k_q4_block(b), r_.tmp.cvt32());
    }
  }
  void emit_data() override {
    Generator& g = a();
    g.L(l_words_);
    for (int i = 0; i < 32; ++i) g.dw(formats::f32_to_bf16(float((i & 15) - 8)));
    // A full chunk is read as bytes [0, 64) and [8, 72). Quant byte i of block b
    // is chunk byte 2 + 18b + i: a vpermt2b index into that pair (64 + j: byte 8 + j).
    g.L(l_qidx_);
    for (int j = 0; j < 64; ++j) {
      const int src = 2 + kQ4BlockBytes * (j / 16) + j % 16;
      g.db(uint8_t(src < 64 ? src : 64 + src - 8));
    }
    // The vpermw index of d (word 9b of the chunk) on the 4 dwords of lane b.
    g.L(l_didx_);
    for (int w = 0; w < 32; ++w) g.dw(uint16_t(9 * ((w / 4) % 4)));
  }
  // 4 blocks -> 4 x 32 bf16: the 16 quant bytes of block b on 128-bit lane b,
  // then as e2m1: vector j = table[word >> 4j]. A tail of 1-3 blocks leaves the
  // other lanes zero (the VEX load clears them).
  void load_widen(const Cursor& w, int off, int cnt, const Xmm* dst) override {
    Generator& g = a();
    const Zmm q = Zmm(dst[0].getIdx());
    if (q4_gathers(key_, shape_, cnt)) {
      const Zmm hi = Zmm(dst[1].getIdx()), d = Zmm(r_.scale.getIdx());
      g.vmovdqu8(q, ptr[w.at()]);
      g.vmovdqu8(hi, ptr[w.at(8)]);
      g.vpermw(d, Zmm(r_.c[2].getIdx()), q);
      g.vcvtph2ps(d, Ymm(d.getIdx()));
      g.vpermt2b(q, Zmm(r_.c[1].getIdx()), hi);
    } else {
      g.vmovdqu(Xmm(q.getIdx()), ptr[w.at(elem_byte(off))]);
      for (int b = 1; b < (cnt + 31) / 32; ++b) g.vinserti32x4(q, q, ptr[w.at(elem_byte(off + 32 * b))], b);
    }
    emit_nibble_words(g, dst, r_.c[0]);
  }

 private:
  Label l_words_, l_qidx_, l_didx_;
};

// q4_0 on tiles (avx512_amx), two blocks a step: block b's 16 quant bytes,
// broadcast to both 128-bit halves of a ymm, widened to 32 words (vpmovzxbw),
// words 16..31 shifted right by 4 (vpsrlvw), then vpermw looks up bf16(q - 8)
// on each word's low five bits (table entry i holds (i & 15) - 8): word i is
// element i, natural order, one tile row per block and its d (GgufScale) per
// tile. K is a multiple of 32, so a step is one or two whole blocks.
class Q4TileDecoder : public Decoder {
 public:
  explicit Q4TileDecoder(const KernelKey& key) : Decoder(key, XLayout::bf16, 2, make_gguf_scale(key)) {}
  std::string describe() const override {
    return "q4_0 -> bf16 (vpmovzxbw, vpsrlvw, vpermw), tile buffer, tdpbf16ps";
  }
  int block_bytes() const override { return kQ4BlockBytes * shape_.block / 32; }
  int elem_byte(int off) const override { return kQ4BlockBytes * (off / 32) + 2; }
  void emit_decode_constants() override {
    a().vmovdqu16(r_.c[0], ptr[rip + l_words_]);
    a().vmovdqu16(r_.c[1], ptr[rip + l_shifts_]);
  }
  void emit_data() override {
    Generator& g = a();
    g.align(64);
    g.L(l_words_);
    for (int i = 0; i < 32; ++i) g.dw(formats::f32_to_bf16(float((i & 15) - 8)));
    g.L(l_shifts_);
    for (int i = 0; i < 32; ++i) g.dw(i < 16 ? 0 : 4);
    Decoder::emit_data();
  }
  void load_widen(const Cursor& w, int off, int cnt, const Xmm* dst) override {
    Generator& g = a();
    for (int b = 0; b < (cnt + 31) / 32; ++b) {
      const Zmm v = Zmm(dst[b].getIdx());
      g.vbroadcasti32x4(Ymm(v.getIdx()), ptr[w.at(elem_byte(off + 32 * b))]);
      g.vpmovzxbw(v, Ymm(v.getIdx()));
      g.vpsrlvw(v, v, Zmm(r_.c[1].getIdx()));
      g.vpermw(v, v, Zmm(r_.c[0].getIdx()));
    }
  }

 private:
  Label l_words_, l_shifts_;
};

}  // namespace

std::unique_ptr<Decoder> make_q4_tile_decoder(const KernelKey& key) {
  return std::make_unique<Q4TileDecoder>(key);
}
std::unique_ptr<Decoder> make_q4_f32_decoder(const KernelKey& key) {
  return std::make_unique<Q4F32Decoder>(key);
}
std::unique_ptr<Decoder> make_q8_f32_decoder(const KernelKey& key) {
  return std::make_unique<Q8F32Decoder>(key);
}
std::unique_ptr<Decoder> make_q4x4_decoder(const KernelKey& key) {
  return std::make_unique<Q4x4Decoder>(key);
}

}  // namespace moejit::jit
