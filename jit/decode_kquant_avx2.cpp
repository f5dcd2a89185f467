// The K-quants on avx2 (jit/decode_kquant.cpp has the design): natural order,
// 8 lanes, quants assembled in integers and converted.
#include "jit/decode_kquant.h"

namespace moejit::jit::kquant {

namespace {

// ---------------------------------------------------------------- avx2

// Every K-quant on avx2, natural order: step s is elements 32s .. 32s + 31,
// four vectors of 8 consecutive elements whose quant bytes are consecutive
// too (vpmovzxbd of 8 bytes), q assembled in integers, converted, times D_j.
class KQuantYmm : public KQuantDecoder {
 public:
  explicit KQuantYmm(const KernelKey& key) : KQuantDecoder(key, XLayout::f32) {}
  void emit_decode_constants() override { g().broadcast_u32(r_.c[0], 0x0F, r_.tmp.cvt32()); }
  void emit_factors(const Cursor& w) override {
    Generator& a = g();
    const Xmm f0 = r_.w[0], f1 = r_.w[1];
    switch (format()) {
      case Format::q4_K:
      case Format::q5_K:  // lanes 0..7 sc (times d), 8..15 m (times dmin)
        emit_packed6(ptr[w.at()], f0, f1, r_.w[2], r_.w[3]);
        store_times_half(f0, r_.w[2], ptr[w.at()], 0);
        store_times_half(f1, r_.w[2], ptr[w.at(2)], m_off());
        if (format() == Format::q5_K) store_e(f0);
        break;
      case Format::q6_K:
        for (int p = 0; p < 2; ++p) {
          a.vpmovsxbd(f0, ptr[w.at(192 + 8 * p)]);
          store_times_half(f0, r_.w[2], ptr[w.at(208)], 32 * p);
          g().vbroadcastss(r_.scale, ptr[rip + d_.ef]);
          a.vmulps(f0, f0, r_.scale);
          a.vmovups(ptr[rec_ + kEOff + 32 * p], f0);
        }
        break;
      case Format::q2_K:
        for (int p = 0; p < 2; ++p) {
          a.vpmovzxbd(f0, ptr[w.at(8 * p)]);
          a.vpsrld(f1, f0, 4);
          a.vpand(f0, f0, r_.c[0]);
          store_times_half(f0, r_.w[2], ptr[w.at(80)], 32 * p);
          store_times_half(f1, r_.w[2], ptr[w.at(82)], m_off() + 32 * p);
        }
        break;
      default:  // q3_K
        emit_packed6(ptr[w.at(94)], f0, f1, r_.w[2], r_.w[3]);
        for (int p = 0; p < 2; ++p) {
          const Xmm f = p ? f1 : f0;
          a.vpsubd(f, f, ptr[rip + d_.c32]);
          store_times_half(f, r_.w[2], ptr[w.at(108)], 32 * p);
          g().vbroadcastss(r_.scale, ptr[rip + d_.ef]);
          a.vmulps(f, f, r_.scale);
          a.vmovups(ptr[rec_ + kEOff + 32 * p], f);
        }
        break;
    }
  }
  void emit_step(const Cursor& w, int s, const Xmm* dst) override {
    Generator& a = g();
    const Format f = format();
    for (int u = 0; u < 4; ++u) {
      const Xmm q = dst[u], t = u < 3 ? dst[u + 1] : r_.scale;
      switch (f) {
        case Format::q4_K:
        case Format::q5_K: {  // sub-block s: nibble s % 2 of qs bytes 32 (s / 2) + 8u .. + 8
          a.vpmovzxbd(q, ptr[w.at((f == Format::q5_K ? 48 : 16) + 32 * (s / 2) + 8 * u)]);
          if (s % 2) a.vpsrld(q, q, 4);
          a.vpand(q, q, r_.c[0]);
          if (f == Format::q5_K) {  // bit s of qh[8u + l], to bit 4
            a.vpmovzxbd(t, ptr[w.at(16 + 8 * u)]);
            shift_to(t, s, 4);
            a.vpand(t, t, ptr[rip + d_.c16]);
            a.vpor(q, q, t);
          }
          break;
        }
        case Format::q6_K: {  // ql 64h + 32 (s % 2) + 8u (high nibble for s % 4 >= 2), qh crumb s % 4
          const int h = s / 4;
          a.vpmovzxbd(q, ptr[w.at(64 * h + 32 * (s % 2) + 8 * u)]);
          if (s % 4 >= 2) a.vpsrld(q, q, 4);
          a.vpand(q, q, r_.c[0]);
          a.vpmovzxbd(t, ptr[w.at(128 + 32 * h + 8 * u)]);
          shift_to(t, 2 * (s % 4), 4);
          a.vpand(t, t, ptr[rip + d_.c30]);
          a.vpor(q, q, t);
          a.vpsubd(q, q, ptr[rip + d_.c32]);
          break;
        }
        default: {  // q2_K / q3_K: crumb s % 4 of qs[32 (s / 4) + 8u + l]; q3_K hmask[8u + l] bit s
          const bool q3 = f == Format::q3_K;
          a.vpmovzxbd(q, ptr[w.at((q3 ? 32 : 16) + 32 * (s / 4) + 8 * u)]);
          if (s % 4) a.vpsrld(q, q, 2 * (s % 4));
          a.vpand(q, q, ptr[rip + d_.c3]);
          if (q3) {
            a.vpmovzxbd(t, ptr[w.at(8 * u)]);
            shift_to(t, s, 2);
            a.vpand(t, t, ptr[rip + d_.c4]);
            a.vpor(q, q, t);
            a.vpsubd(q, q, ptr[rip + d_.c4]);
          }
          break;
        }
      }
      a.vcvtdq2ps(q, q);
    }
    // Vectors u of sub-block 2s + u / 2 (16-element sub-blocks) or s (32).
    for (int u = 0; u < 4; ++u) {
      const int j = fi().sub_block == 32 ? s : 2 * s + u / 2;
      if (u == 0 || (fi().sub_block == 16 && u == 2)) a.vbroadcastss(r_.scale, d_at(j));
      a.vmulps(dst[u], dst[u], r_.scale);
    }
  }

 private:
  // Moves bit `from` of every dword to bit `to`.
  void shift_to(const Xmm& x, int from, int to) {
    if (from > to) g().vpsrld(x, x, from - to);
    if (from < to) g().vpslld(x, x, to - from);
  }
};

}  // namespace

std::unique_ptr<Decoder> make_ymm_decoder(const KernelKey& key) { return std::make_unique<KQuantYmm>(key); }

}  // namespace moejit::jit::kquant
