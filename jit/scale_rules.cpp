// Scale rules shared by several element decodes: fp8_block's 128 x 128 block
// scales, byte-code group scales (e8m0, e4m3) through a table, and GGUF's
// inline fp16 d.
#include <algorithm>

#include "formats/formats.h"
#include "jit/decoders.h"

namespace moejit::jit {

using formats::Format;
using namespace Xbyak;
using namespace Xbyak::util;

namespace {

// fp8_block: one scale row serves every row of the call (a call never crosses
// a 128-row scale block); it is widened to fp32 on the stack once, so each
// block's scale is a single broadcast operand.
class Block128Scale : public ScaleRule {
 public:
  explicit Block128Scale(const KernelKey& key) : ScaleRule(key) {}
  int group() const override { return kChunk; }
  bool check(std::string* why) const override {
    if (key_.rows > kChunk) {
      *why = "fp8_block kernels cover at most one 128-row scale block";
      return false;
    }
    return true;
  }
  int stack_bytes() const override { return int((scale_blocks() * 4 + 63) / 64 * 64); }
  void prologue() override {
    Generator& g = a();
    const Reg32 v = r_.tmp.cvt32();
    g.sub(rsp, stack_bytes());
    Label l_scale;
    g.xor_(r_.count, r_.count);
    g.L(l_scale);
    if (key_.scale_dtype == int32_t(formats::ScaleDtype::f32)) {
      g.mov(v, ptr[r_.scale_row + r_.count * 4]);
    } else {
      g.movzx(v, word[r_.scale_row + r_.count * 2]);
      g.shl(v, 16);
    }
    g.mov(ptr[rsp + r_.count * 4], v);
    g.inc(r_.count);
    g.cmp(r_.count, scale_blocks());
    g.jb(l_scale);
  }
  Reg64 row_cursor() const override { return rsp; }  // every row reads the call's fp32 scales
  int block_bytes() const override { return 4; }
  // Tile bodies: one scale for the 16 rows.
  bool tile_ready() const override { return true; }
  void tile_apply(const TileScaleBlock& b) override {
    Generator& g = a();
    g.vbroadcastss(r_.scale, ptr[b.s.at()]);
    for (int i = 0; i < b.width; ++i) g.vfmadd231ps(b.totals[size_t(i)], r_.scale, ptr[b.c.at(64 * i)]);
  }
  void apply(const ScaleBlock& b) override {
    // an embedded broadcast on AVX-512, one load otherwise
    if (zmm()) {
      fma_tokens(b, ptr_b[b.s.at()]);
      return;
    }
    a().vbroadcastss(r_.scale, ptr[b.s.at()]);
    fma_tokens(b, r_.scale);
  }

 private:
  int64_t scale_blocks() const { return (key_.k + kChunk - 1) / kChunk; }
};

// One byte code per group along each row, one scale row per weight row,
// decoded through a 256-entry fp32 table (e8m0 2^(s-127) with 0 subnormal and
// 255 NaN, or e4m3 for nvfp4) whose address stays in r_.aux.
class ByteCodeScale : public ScaleRule {
 public:
  explicit ByteCodeScale(const KernelKey& key) : ScaleRule(key) {}
  int group() const override { return std::max(1, key_.group); }
  bool check(std::string* why) const override { return check_byte_groups(key_, why); }
  void load_args() override { a().lea(r_.aux, ptr[rip + l_table_]); }
  void emit_constants() override {
    if (shape_.groups != 2) return;
    a().mov(r_.tmp.cvt32(), kGroup2Lanes);
    a().kmovw(k_grp2, r_.tmp.cvt32());
  }
  void next_row() override { a().add(r_.scale_row, key_.scale_stride); }
  int block_bytes() const override { return shape_.groups; }
  // Tile bodies: each row's code through the table into a vector of the
  // rows' scales on the stack (rows past the block's stay 0).
  bool tile_ready() const override { return true; }
  int stack_bytes() const override { return key_.isa == Isa::avx512_amx ? 64 : 0; }
  void prologue() override { tile_scale_prologue(stack_bytes()); }
  void next_rows(int n) override { a().add(r_.scale_row, n * key_.scale_stride); }
  void tile_apply(const TileScaleBlock& b) override {
    Generator& g = a();
    const Xmm s = Xmm(r_.scale.getIdx());
    for (int r = 0; r < b.rows; ++r) {
      g.movzx(r_.tmp.cvt32(), byte[b.s.at(r * key_.scale_stride)]);
      g.vmovss(s, ptr[r_.aux + r_.tmp * 4]);
      g.vmovss(ptr[rsp + 4 * r], s);
    }
    tile_fma_rows(b, rsp);
  }
  // Two scales on the lanes of a two-group block; a tail block holding only
  // the first group reads one.
  void apply(const ScaleBlock& b) override {
    Generator& g = a();
    g.movzx(r_.tmp.cvt32(), byte[b.s.at()]);
    g.vbroadcastss(r_.scale, ptr[r_.aux + r_.tmp * 4]);
    if (shape_.groups == 2 && b.n > shape_.block / 2) {
      g.movzx(r_.tmp.cvt32(), byte[b.s.at(1)]);
      g.vbroadcastss(r_.scale | k_grp2, ptr[r_.aux + r_.tmp * 4]);
    }
    fma_tokens(b, r_.scale);
  }
  void emit_data() override {
    Generator& g = a();
    g.L(l_table_);
    const bool e4m3 = key_.format == Format::nvfp4;
    for (int i = 0; i < 256; ++i)
      g.df32(e4m3 ? formats::e4m3_to_f32(uint8_t(i)) : formats::e8m0_to_f32(uint8_t(i)));
  }

 private:
  Label l_table_;
};

// GGUF: the fp16 d at the start of each 32-element block, broadcast.
class GgufScale : public GgufTileScale {
 public:
  explicit GgufScale(const KernelKey& key) : GgufTileScale(key) {}
  void apply(const ScaleBlock& b) override {
    Generator& g = a();
    const Xmm xs = Xmm(r_.scale.getIdx());
    g.movzx(r_.tmp.cvt32(), word[b.w.at()]);
    g.vmovd(xs, r_.tmp.cvt32());
    g.vcvtph2ps(xs, xs);
    g.vbroadcastss(r_.scale, xs);
    fma_tokens(b, r_.scale);
  }
};

}  // namespace

void GgufTileScale::tile_apply(const TileScaleBlock& b) {
  Generator& g = a();
  const Xmm d = Xmm(r_.scale.getIdx());
  for (int r = 0; r < b.rows; ++r) {
    g.vcvtph2ps(d, ptr[b.w.at(r * b.row_bytes)]);  // d and 3 quant pairs; lane 0 is d
    g.vmovss(ptr[rsp + 4 * r], d);
  }
  tile_fma_rows(b, rsp);
}

bool check_byte_groups(const KernelKey& key, std::string* why) {
  const Format f = key.format;
  if (f == Format::mxfp4 && key.group != 32) {
    *why = "mxfp4 groups are 32";
    return false;
  }
  if ((f == Format::mxfp8_e4m3 || f == Format::mxfp8_e5m2) && key.group != 32 && key.group != 64 &&
      key.group != 128) {
    *why = "mxfp8 group must be 32, 64 or 128";
    return false;
  }
  if (f == Format::nvfp4 && key.group != 16) {
    *why = "nvfp4 groups are 16";
    return false;
  }
  if (key.k % key.group != 0) {
    *why = "k must be a multiple of the group";
    return false;
  }
  return true;
}

std::unique_ptr<ScaleRule> make_block128_scale(const KernelKey& key) {
  return std::make_unique<Block128Scale>(key);
}
std::unique_ptr<ScaleRule> make_byte_code_scale(const KernelKey& key) {
  return std::make_unique<ByteCodeScale>(key);
}
std::unique_ptr<ScaleRule> make_gguf_scale(const KernelKey& key) { return std::make_unique<GgufScale>(key); }

}  // namespace moejit::jit
