// e2m1 weights (mxfp4, nvfp4): pairs of nibbles, low nibble = even k.
// - fp32 (avx2, avx512): the nibbles of a step widened to dwords and looked up
//   in a 16-entry fp32 table; activations evens then odds. Any byte-code scale rule.
// - bf16 (avx512_bf16): 64 bytes -> 4 vectors of 32 bf16 through shifts and
//   vpermw (XLayout::bf16_nib128, AVX512BW only); the row body widens each
//   row's group scales to fp32 on the stack in batches of rows (WidenedRowScale).
// - mxfp4 and nvfp4 on tiles (avx512_amx): each 32 elements one vector of 32
//   bf16 in natural order, a tile row (E2m1TileDecoder; nvfp4's groups of 16
//   are the tile body's half steps).
#include <algorithm>

#include "formats/formats.h"
#include "jit/decoders.h"

namespace moejit::jit {

using formats::Format;
using namespace Xbyak;
using namespace Xbyak::util;

namespace {

bool is_nvfp4(const KernelKey& key) { return key.format == Format::nvfp4; }

class E2m1Decoder : public Decoder {
 public:
  using Decoder::Decoder;
  bool row_globals() const override { return is_nvfp4(key_); }  // nvfp4's fp32 per-row global
  int block_bytes() const override { return shape_.block / 2; }
  int elem_byte(int off) const override { return off / 2; }
};

class E2m1F32Decoder : public E2m1Decoder {
 public:
  E2m1F32Decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule)
      : E2m1Decoder(key, XLayout::f32_evens_odds, 2, std::move(rule)) {}
  void emit_decode_constants() override {
    if (!zmm())
      a().broadcast_u32(r_.c[0], 0x0F, r_.tmp.cvt32());  // nibble mask; the tables are read from data
  }
  void emit_data() override {
    Generator& g = a();
    g.L(l_values_);  // fp32 of the 16 e2m1 codes, then 8 dwords of the sign bit 8 (avx2)
    for (int i = 0; i < 16; ++i) g.df32(formats::e2m1_to_f32(uint8_t(i)));
    g.L(l_sign_);
    for (int i = 0; i < 8; ++i) g.dd(8);
    Decoder::emit_data();
  }
  void load_widen(const Cursor& w, int off, int cnt, const Xmm* dst) override {
    Generator& g = a();
    const Xmm lo = dst[0], hi = dst[1], t = r_.t[0];
    const Xmm xt = Xmm(t.getIdx());
    const Address src = ptr[w.at(elem_byte(off))];
    if (cnt < shape_.step) {  // nvfp4 K % 32 == 16 on avx512: 8 bytes, the upper lanes decode to +0
      g.vmovq(xt, src);
      g.vpmovzxbd(t, xt);
    } else {
      g.vpmovzxbd(t, src);
    }
    g.vpsrld(hi, t, 4);
    if (zmm()) {  // 16 entries: the index carries the sign; vpermps reads its low 4 bits, so no mask
      g.vpermps(Zmm(lo.getIdx()), Zmm(t.getIdx()), ptr[rip + l_values_]);
      g.vpermps(Zmm(hi.getIdx()), Zmm(hi.getIdx()), ptr[rip + l_values_]);
    } else {  // 8-entry vpermps: magnitude from the table, sign bit 3 moved to bit 31
      const Xmm s = r_.t[1];
      g.vpand(lo, t, r_.c[0]);
      for (const Xmm& v : {lo, hi}) {
        g.vpand(s, v, ptr[rip + l_sign_]);
        g.vpslld(s, s, 28);
        g.vpermps(Ymm(v.getIdx()), Ymm(v.getIdx()), ptr[rip + l_values_]);
        g.vorps(v, v, s);
      }
    }
  }

 private:
  Label l_values_, l_sign_;
};

// Rows whose group scales a bf16 e2m1 kernel widens together.
constexpr int kWidenRows = 4;

// Each row's group scales are widened to fp32 once, on the stack (e8m0:
// (s << 23) with 0 -> 2^-127 and 255 -> NaN; e4m3: fp16 bits of s * 2^-8
// through vcvtph2ps, the 2^-8 undone by total_factor), so a chunk's scale
// vector is one vpermps. Rows are widened kWidenRows at a time, before the
// first of them runs, which measured faster than one row at a time just
// before its chunks (one core, weights in L2, kernels alternating in one
// process: mxfp4 and nvfp4 at K=768, one token, +3-15%; batches of 2 to 16
// rows alike; 4 tokens unchanged). The batch starts zeroed and 64 zero bytes
// of slack follow it (a chunk's vpermps reads a whole vector). The group
// scales land on the lanes of XLayout::bf16_nib128. r_.aux points at the
// current row's widened scales; c[1..4] hold the rule's constants.
class WidenedRowScale : public ScaleRule {
 public:
  explicit WidenedRowScale(const KernelKey& key) : ScaleRule(key) {}
  int group() const override { return std::max(1, key_.group); }
  bool check(std::string* why) const override { return check_byte_groups(key_, why); }
  void emit_constants() override {
    Generator& g = a();
    g.vmovdqu32(r_.c[1], ptr[rip + l_pair_idx_]);  // the vpermps index of a chunk's scale vector
    // the widening's: the e4m3 -> fp16 mask (nvfp4); 2^-127, the inf pattern
    // and NaN (e8m0 codes 0 and 255)
    if (is_nvfp4(key_)) {
      g.vpbroadcastd(r_.c[2], ptr[rip + l_e4m3_fp16_mask_]);
    } else {
      g.vpbroadcastd(r_.c[2], ptr[rip + l_e8m0_min_]);
      g.vpbroadcastd(r_.c[3], ptr[rip + l_e8m0_nan_ + 4]);
      g.vpbroadcastd(r_.c[4], ptr[rip + l_e8m0_nan_]);
    }
  }
  void emit_data() override {
    Generator& g = a();
    // vpermps index of a chunk's scale vector: dword pairs (nvfp4, group q on
    // dwords 2q, 2q + 1) or quads (mxfp4, group g on dwords 4g..4g+3).
    g.L(l_pair_idx_);
    for (int i = 0; i < 16; ++i) g.dd(uint32_t(is_nvfp4(key_) ? i / 2 : i / 4));
    g.L(l_e4m3_fp16_mask_);
    g.dd(0xBF80BF80u);
    g.L(l_e8m0_min_);
    g.dd(0x00400000u);  // 2^-127
    g.L(l_e8m0_nan_);
    g.dd(0x7FC00000u);  // NaN, then the pattern (255 << 23) of code 255
    g.dd(0x7F800000u);
  }
  int stack_bytes() const override { return widen_end() + 64; }
  void prologue() override {
    Generator& g = a();
    const Zmm z = Zmm(r_.w[0].getIdx());
    g.sub(rsp, stack_bytes());
    g.vpxord(z, z, z);
    for (int off = 0; off < stack_bytes(); off += 64) g.vmovups(ptr[rsp + off], z);
    g.lea(r_.aux, ptr[rsp + widen_end()]);  // the first row widens a batch
  }
  void begin_row() override {
    Generator& g = a();
    Label l_widened;
    g.lea(r_.count, ptr[rsp + widen_end()]);
    g.cmp(r_.aux, r_.count);
    g.jne(l_widened, CodeGenerator::T_NEAR);
    widen_batch();
    g.L(l_widened);
  }
  Reg64 row_cursor() const override { return r_.aux; }
  void next_row() override {
    a().add(r_.scale_row, key_.scale_stride);
    a().add(r_.aux, row_scale_bytes());
  }
  int block_bytes() const override { return 4 * shape_.groups; }
  // The chunk's 4 (mxfp4) or 8 (nvfp4) fp32 group scales, each on the lanes its
  // group's elements were decoded into (4 dwords each, or dword pairs). The
  // 64-byte read may run past the row's groups into the zeroed slack.
  void apply(const ScaleBlock& b) override {
    a().vpermps(Zmm(r_.scale.getIdx()), Zmm(r_.c[1].getIdx()), ptr[b.s.at()]);
    fma_tokens(b, r_.scale);
  }

 private:
  int64_t row_groups() const { return key_.k / key_.group; }
  int row_scale_bytes() const { return int((row_groups() + 15) / 16 * 64); }
  // Rows per batch: kWidenRows, within 16 KiB of stack.
  int widen_rows() const {
    const int fit = std::max(1, 16384 / row_scale_bytes());
    return int(std::min<int64_t>({int64_t(kWidenRows), int64_t(fit), int64_t(key_.rows)}));
  }
  int widen_end() const { return widen_rows() * row_scale_bytes(); }

  // The scales of the next min(widen_rows(), rows left) rows, from the scale
  // row on, to the batch at rsp; r_.aux points at the first.
  void widen_batch() {
    Generator& g = a();
    g.phase("widen");
    const Reg64 src = r_.src, dst = r_.dst, n = r_.count;
    g.mov(n, widen_rows());
    g.cmp(r_.rows_left, n);
    g.cmovb(n, r_.rows_left);
    g.mov(src, r_.scale_row);
    g.mov(dst, rsp);
    Label l_row;
    g.L(l_row);
    widen_row(src, dst);
    g.add(src, key_.scale_stride);
    g.add(dst, row_scale_bytes());
    g.dec(n);
    g.jnz(l_row, CodeGenerator::T_NEAR);
    g.mov(r_.aux, rsp);
  }
  void widen_row(const Reg64& src, const Reg64& dst) {
    Generator& g = a();
    const Zmm t = Zmm(r_.w[0].getIdx());
    const Ymm yt = Ymm(t.getIdx());
    const Xmm xt = Xmm(t.getIdx());
    for (int64_t grp = 0; grp < row_groups(); grp += 16) {
      const int64_t n = std::min<int64_t>(16, row_groups() - grp);
      if (n < 16) {  // only the row's scale bytes: the rest of the scale row may be padding
        g.mov(r_.tmp, (uint64_t(1) << n) - 1);
        g.kmovq(r_.tail, r_.tmp);
        g.vmovdqu8(xt | r_.tail | T_z, ptr[src + grp]);
      } else {
        g.vmovdqu8(xt, ptr[src + grp]);
      }
      if (is_nvfp4(key_)) {
        g.vpmovsxbw(yt, xt);
        g.vpsllw(yt, yt, 7);
        g.vpandd(yt, yt, Ymm(r_.c[2].getIdx()));
        g.vcvtph2ps(t, yt);
      } else {
        g.vpmovzxbd(t, xt);
        g.vpslld(t, t, 23);
        g.vpmaxud(t, t, Zmm(r_.c[2].getIdx()));         // code 0: 2^-127 (every other code is above it)
        g.vpcmpeqd(k_sub, t, Zmm(r_.c[3].getIdx()));    // code 255 gave the inf pattern
        g.vmovdqa32(t | k_sub, Zmm(r_.c[4].getIdx()));  // NaN
      }
      g.vmovups(ptr[dst + grp * 4], t);
    }
  }

  Label l_pair_idx_, l_e4m3_fp16_mask_, l_e8m0_min_, l_e8m0_nan_;
};

class E2m1Nib128Decoder : public E2m1Decoder {
 public:
  E2m1Nib128Decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule)
      : E2m1Decoder(key, XLayout::bf16_nib128, 4, std::move(rule)) {}
  float total_factor() const override { return is_nvfp4(key_) ? 256.0f : 1.0f; }  // e4m3 scales via fp16
  std::string describe() const override { return "e2m1 -> bf16 (vpsrlw + vpermw), vdpbf16ps"; }
  // The word table first, then the rule's: the order these kernels' code has
  // always had (kernel_bytes).
  void emit_constants() override {
    a().vmovdqu16(r_.c[0], ptr[rip + l_words_]);  // the e2m1 -> bf16 word table (twice)
    if (rule_) rule_->emit_constants();
  }
  void emit_data() override {
    Generator& g = a();
    // vpermw reads 5 index bits; bit 4 is the next nibble's low bit, so the 16
    // entries appear twice.
    g.L(l_words_);
    for (int i = 0; i < 32; ++i) g.dw(formats::f32_to_bf16(formats::e2m1_to_f32(uint8_t(i & 15))));
    Decoder::emit_data();
  }
  // 64 bytes -> 4 x 32 bf16: vector j is the word table at nibble j of every
  // 16-bit word. A partial chunk (K % 128 != 0) loads the row's last bytes; the
  // rest decodes to +0.
  void load_widen(const Cursor& w, int off, int cnt, const Xmm* dst) override {
    Generator& g = a();
    const Address src = ptr[w.at(elem_byte(off))];
    if (cnt < shape_.step) {
      g.mov(r_.tmp, (uint64_t(1) << (cnt / 2)) - 1);  // cnt < 128: at most 63 bytes
      g.kmovq(r_.tail, r_.tmp);
      g.vmovdqu8(Zmm(dst[0].getIdx()) | r_.tail | T_z, src);
    } else {
      g.vmovdqu8(Zmm(dst[0].getIdx()), src);
    }
    emit_nibble_words(g, dst, r_.c[0]);
  }

 private:
  Label l_words_;
};

// mxfp4 and nvfp4 on tiles (avx512_amx, VBMI), two vectors a step: a group's 16 bytes
// (an xmm load, zeros above), vpermb puts byte w / 2 in the low byte of word
// w and a zero byte (byte 16) in its high byte, vpsrlvw shifts the odd
// words by 4, and vpermw looks each word's low nibble up in the e2m1 -> bf16
// table: word w is element w (low nibble = even k), natural order, one tile
// row per group, whose e8m0 scale the byte-code rule applies per tile. nvfp4
// takes the same decode, its e4m3 scale per group of 16 (the tile body's half
// steps); its K may end 16 elements into a vector, whose 8 bytes one vmovq
// loads (zeros above, nothing read past the row).
class E2m1TileDecoder : public E2m1Decoder {
 public:
  E2m1TileDecoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule)
      : E2m1Decoder(key, XLayout::bf16, 2, std::move(rule)) {}
  bool needs_vbmi() const override { return true; }
  std::string describe() const override {
    return "e2m1 -> bf16 (vpermb, vpsrlvw, vpermw), tile buffer, tdpbf16ps";
  }
  void emit_decode_constants() override {
    a().vmovdqu16(r_.c[0], ptr[rip + l_words_]);
    a().vmovdqu16(r_.c[1], ptr[rip + l_shifts_]);
    a().vmovdqu8(r_.c[2], ptr[rip + l_bytes_]);
  }
  void emit_data() override {
    Generator& g = a();
    g.align(64);
    g.L(l_words_);  // vpermw reads 5 index bits: the 16 entries twice
    for (int i = 0; i < 32; ++i) g.dw(formats::f32_to_bf16(formats::e2m1_to_f32(uint8_t(i & 15))));
    g.L(l_shifts_);
    for (int w = 0; w < 32; ++w) g.dw(w % 2 ? 4 : 0);
    g.L(l_bytes_);  // word w: byte w / 2, then byte 16 (zero)
    for (int b = 0; b < 64; ++b) g.db(uint8_t(b % 2 ? 16 : b / 4));
    Decoder::emit_data();
  }
  void load_widen(const Cursor& w, int off, int cnt, const Xmm* dst) override {
    Generator& g = a();
    for (int b = 0; b < (cnt + 31) / 32; ++b) {
      const Zmm v = Zmm(dst[b].getIdx());
      if (cnt - 32 * b >= 32)
        g.vmovdqu(Xmm(v.getIdx()), ptr[w.at(elem_byte(off + 32 * b))]);
      else  // K % 32 == 16 (nvfp4)
        g.vmovq(Xmm(v.getIdx()), ptr[w.at(elem_byte(off + 32 * b))]);
      g.vpermb(v, Zmm(r_.c[2].getIdx()), v);
      g.vpsrlvw(v, v, Zmm(r_.c[1].getIdx()));
      g.vpermw(v, v, Zmm(r_.c[0].getIdx()));
    }
  }

 private:
  Label l_words_, l_shifts_, l_bytes_;
};

}  // namespace

std::unique_ptr<Decoder> make_e2m1_tile_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule) {
  return std::make_unique<E2m1TileDecoder>(key, std::move(rule));
}
std::unique_ptr<Decoder> make_e2m1_f32_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule) {
  return std::make_unique<E2m1F32Decoder>(key, std::move(rule));
}
std::unique_ptr<Decoder> make_e2m1_nib128_decoder(const KernelKey& key, std::unique_ptr<ScaleRule> rule) {
  return std::make_unique<E2m1Nib128Decoder>(key, std::move(rule));
}
std::unique_ptr<ScaleRule> make_widened_row_scale(const KernelKey& key) {
  return std::make_unique<WidenedRowScale>(key);
}

}  // namespace moejit::jit
