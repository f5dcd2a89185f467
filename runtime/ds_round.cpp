#include "runtime/ds_round.h"

#include "formats/formats.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "runtime/avx512_util.h"
#endif

namespace moejit {

#if defined(__x86_64__) || defined(_M_X64)
namespace {

#define MOEJIT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

using avx512::first_lanes16;
using avx512::first_lanes32;
using avx512::has_avx512;
using avx512::sll32;
using avx512::srl32;

// Largest |bf16| bit pattern of n <= 128 values (NaN above inf, as the scalar loop).
MOEJIT_AVX512 uint32_t amax_bits(const uint16_t* src, int64_t n) {
  __m512i m = _mm512_setzero_si512();
  for (int64_t i = 0; i < n; i += 32) {
    const __m512i v = _mm512_maskz_loadu_epi16(first_lanes32(n - i), src + i);
    m = _mm512_max_epu16(m, _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF)));
  }
  const __m512i lo = _mm512_and_si512(m, _mm512_set1_epi32(0xFFFF));
  alignas(64) uint32_t w[16];
  _mm512_store_si512(w, _mm512_maskz_max_epu32(0xFFFF, lo, srl32(m, 16)));
  uint32_t r = 0;
  for (uint32_t x : w) r = x > r ? x : r;
  return r;
}

// formats::e4m3_round of 16 values: the normal range by the same integer
// rounding; below 2^-6, q = rne(|f| * 2^9) by vrndscaleps with its rounding in
// the immediate (the scalar code's truncation and exact remainder give the same
// q), then q * 2^-9.
MOEJIT_AVX512 __m512 e4m3_round16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i sign = _mm512_and_si512(u, _mm512_set1_epi32(INT32_MIN));
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i odd = _mm512_and_si512(srl32(a, 20), _mm512_set1_epi32(1));
  const __m512i normal =
      _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7FFFF)), odd),
                       _mm512_set1_epi32(int32_t(0xFFF00000u)));
  __m512 v = _mm512_maskz_mul_ps(0xFFFF, _mm512_castsi512_ps(a), _mm512_set1_ps(512.0f));
  v = _mm512_maskz_min_ps(0xFFFF, v, _mm512_set1_ps(16.0f));
  const __m512 q = _mm512_maskz_roundscale_ps(0xFFFF, v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512i sub = _mm512_castps_si512(_mm512_maskz_mul_ps(0xFFFF, q, _mm512_set1_ps(0x1p-9f)));
  const __mmask16 is_normal = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(0x3C800000));
  // No saturation: s makes every |x / s| <= 448, which rounds to at most 448.
  const __m512i r = _mm512_mask_blend_epi32(is_normal, sub, normal);
  return _mm512_castsi512_ps(_mm512_or_si512(sign, r));
}

MOEJIT_AVX512 void roundtrip_avx512(const uint16_t* src, int64_t n, uint16_t* dst) {
  for (int64_t b0 = 0; b0 < n; b0 += formats::kDsActBlock) {
    const int64_t len = n - b0 < formats::kDsActBlock ? n - b0 : formats::kDsActBlock;
    const uint32_t amax = amax_bits(src + b0, len);
    if (amax >= 0x7F80u) {  // NaN or inf: every element NaN
      for (int64_t i = b0; i < b0 + len; ++i) dst[i] = 0x7FC0u;
      continue;
    }
    const float s = formats::ds_act_scale(formats::bf16_to_f32(uint16_t(amax)));
    const __m512 vs = _mm512_set1_ps(s), inv = _mm512_set1_ps(1.0f / s);  // exact: s is a power of two
    for (int64_t i = b0; i < b0 + len; i += 16) {
      const __mmask16 k = first_lanes16(b0 + len - i);
      const __m512 x = _mm512_castsi512_ps(
          sll32(_mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_maskz_loadu_epi16(k, src + i)), 16));
      // e4m3 (<= 4 significant bits) times s is exact in bf16: truncating is rounding.
      const __m512 r = _mm512_maskz_mul_ps(0xFFFF, e4m3_round16(_mm512_maskz_mul_ps(0xFFFF, x, inv)), vs);
      _mm256_mask_storeu_epi16(dst + i, k,
                               _mm512_maskz_cvtepi32_epi16(0xFFFF, srl32(_mm512_castps_si512(r), 16)));
    }
  }
}

}  // namespace
#endif

void ds_act_roundtrip_n(const uint16_t* src, int64_t n, uint16_t* dst, jit::Isa isa) {
#if defined(__x86_64__) || defined(_M_X64)
  if (has_avx512(isa)) {
    roundtrip_avx512(src, n, dst);
    return;
  }
#else
  (void)isa;
#endif
  formats::ds_act_roundtrip(src, n, dst);
}

}  // namespace moejit
