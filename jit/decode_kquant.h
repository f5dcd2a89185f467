// The K-quant decoders' shared parts (jit/decode_kquant.cpp has the design):
// the scale rule with its factor records, the decoder base and its
// constants. Included only by decode_kquant.cpp (avx512 tiers) and
// decode_kquant_avx2.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/format_table.h"
#include "jit/decoders.h"

namespace moejit::jit::kquant {

using formats::Format;
using namespace Xbyak;
using namespace Xbyak::util;

// Lanes 0..7 (k3, k_grp2, holds lanes 8..15).
inline const Opmask k_lo8 = Xbyak::util::k4;

// A super-block's factor record: D_j at +4j, M_j at +m_off() + 4j, E_j at
// +kEOff + 4j, fp16 halves widened at +kHalfOff. Records of a row lie 2 x the
// super-block's bytes apart (>= 168 >= kRecordBytes), so a block's record is
// base2 + 2 x its weight address: one lea from the weight cursor.
constexpr int kEOff = 64, kHalfOff = 128, kRecordBytes = 144;
static_assert(2 * 84 >= kRecordBytes, "q2_K's records, 2 x 84 bytes apart, hold one each");
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
  bool chunkable() const override { return true; }
  void begin_row_blocks(const Address& first_byte, int64_t n) override;
  void rewind_rows(int n) override;
  // tot += sum (unless step-scaled: the steps added theirs); tot -= M . S_x.
  void apply(const ScaleBlock& b) override;
  // bf16 pairs: each token's two accumulators times the step's two factor vectors.
  void apply_step(const StepBlock& b) override;

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
  // Whether a row's records are decoded at its start (else at each block's
  // first step); decoders that keep a block's factors in a register have none.
  bool rows_mode() const { return has_records() && 2 * blocks() * block_bytes() <= kMaxRowRecords; }
  virtual bool has_records() const { return true; }
  // Step-scaled decodes: the M_j of the block at w into dst (lanes past the
  // sub-blocks zero), for the min term.
  virtual void load_mins(const Xmm& /*dst*/, const Cursor& /*w*/) {}
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
  // The records of the row that starts at r_.scale_row, and base2 = aux - 2
  // row: every block's, or n blocks' from the byte offset in the qword at
  // *first_byte (K-chunked kernels).
  void emit_row_records(const Address* first_byte = nullptr, int64_t n = -1) {
    Generator& a = g();
    a.mov(r_.tmp, r_.aux);
    a.sub(r_.tmp, r_.scale_row);
    a.sub(r_.tmp, r_.scale_row);
    a.mov(ptr[r_.aux + slot()], r_.tmp);
    if (first_byte) {
      a.mov(r_.dst, *first_byte);
      a.lea(r_.src, ptr[r_.scale_row + r_.dst]);
      a.lea(r_.dst, ptr[r_.aux + r_.dst * 2]);
    } else {
      a.mov(r_.src, r_.scale_row);
      a.mov(r_.dst, r_.aux);
    }
    a.mov(r_.count, n < 0 ? blocks() : n);
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
  // Step-scaled decodes: the factor vector of step t's accumulators of parity
  // p into dst.
  virtual void emit_factor_vector(const Xmm& /*dst*/, int /*t*/, int /*p*/) {}

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
  // k_lo8 = lanes 0..7 (a decode's constants).
  void set_lo8() {
    g().mov(r_.tmp.cvt32(), 0x00FF);
    g().kmovw(k_lo8, r_.tmp.cvt32());
  }
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

// avx2: every K-quant (decode_kquant_avx2.cpp).
std::unique_ptr<Decoder> make_ymm_decoder(const KernelKey& key);

}  // namespace moejit::jit::kquant
