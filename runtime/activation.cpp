#include "runtime/activation.h"

#include <cmath>
#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "runtime/avx512_util.h"
#endif

namespace moejit {

#if defined(__x86_64__) || defined(_M_X64)
namespace {

using avx512::first_lanes16;
using avx512::has_avx512;
using avx512::sll32;
using avx512::srl32;

// sigmoidf (with exp_act) of activation.h, 16 lanes at a time: every
// operation as there, in the same order.
__attribute__((target("avx512f"))) __m512 sigmoid16(__m512 z) {
  __m512 x =
      _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(z), _mm512_set1_epi32(INT32_MIN)));  // -z
  x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-86.0f), _CMP_LT_OQ), x,
                           _mm512_set1_ps(-86.0f));
  x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(89.0f), _CMP_GT_OQ), x,
                           _mm512_set1_ps(89.0f));
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 t = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), magic);
  const __m512 nf = _mm512_sub_ps(t, magic);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(nf, _mm512_set1_ps(0.693359375f)));
  r = _mm512_add_ps(r, _mm512_mul_ps(nf, _mm512_set1_ps(2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0f));
  const __m512i sb =
      sll32(_mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000)),
                             _mm512_set1_epi32(126)),
            23);
  const __m512 e = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_castsi512_ps(sb)), _mm512_set1_ps(2.0f));
  return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// activate() for silu and the two swiglu kinds, 16 lanes at a time.
__attribute__((target("avx512f"))) __m512 act16(const ActivationParams& p, __m512 g, __m512 u) {
  if (p.kind == MOEJIT_ACT_SILU) return _mm512_mul_ps(_mm512_mul_ps(g, sigmoid16(g)), u);
  if (p.limit > 0.0f && std::isfinite(p.limit)) {  // min_keep_nan, clamp_keep_nan
    const __m512 hi = _mm512_set1_ps(p.limit), lo = _mm512_set1_ps(-p.limit);
    g = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(g, hi, _CMP_GT_OQ), g, hi);
    const __m512 uc = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(u, hi, _CMP_GT_OQ), u, hi);
    u = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(u, lo, _CMP_LT_OQ), uc, lo);
  }
  const __m512 glu = _mm512_mul_ps(g, sigmoid16(_mm512_mul_ps(_mm512_set1_ps(p.alpha), g)));
  return p.kind == MOEJIT_ACT_SWIGLU_OAI ? _mm512_mul_ps(glu, _mm512_add_ps(u, _mm512_set1_ps(1.0f)))
                                         : _mm512_mul_ps(glu, u);
}

bool vectorized(moejit_activation kind) {
  return kind == MOEJIT_ACT_SILU || kind == MOEJIT_ACT_SWIGLU_OAI || kind == MOEJIT_ACT_SWIGLU_CLAMP;
}

// formats::round_bf16: to bf16 (nearest even, NaN kept NaN) and back.
__attribute__((target("avx512f"))) __m512 round_bf16_16(__m512 v) {
  const __m512i vb = _mm512_castps_si512(v);
  const __m512i abs = _mm512_and_si512(vb, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F800000));
  const __m512i lsb = _mm512_and_si512(srl32(vb, 16), _mm512_set1_epi32(1));
  const __m512i rne = srl32(_mm512_add_epi32(_mm512_add_epi32(vb, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __m512i qnan = _mm512_or_si512(srl32(vb, 16), _mm512_set1_epi32(0x40));
  return _mm512_castsi512_ps(sll32(_mm512_mask_blend_epi32(nan, rne, qnan), 16));
}

__attribute__((target("avx512f"))) void act_avx512(const ActivationParams& p, const float* gate,
                                                   const float* up, float* out, int64_t n, bool round,
                                                   bool round_in) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes16(n - i);
    __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
    if (round_in) {
      g = round_bf16_16(g);
      u = round_bf16_16(u);
    }
    __m512 v = act16(p, g, u);
    if (round) v = round_bf16_16(v);
    _mm512_mask_storeu_ps(out + i, m, v);
  }
}

}  // namespace
#endif

namespace {

// activate() of every value, rounded to bf16 or not, of gate and up as given
// or rounded to bf16 first (round_in), on the AVX-512 path when the kind and
// the tier have it.
void activate_n(const ActivationParams& p, const float* gate, const float* up, float* out, int64_t n,
                jit::Isa isa, bool round, bool round_in = false) {
#if defined(__x86_64__) || defined(_M_X64)
  if (vectorized(p.kind) && has_avx512(isa)) {
    act_avx512(p, gate, up, out, n, round, round_in);
    return;
  }
#else
  (void)isa;
#endif
  if (round_in) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = activate(p, formats::round_bf16(gate[i]), formats::round_bf16(up[i]));
      out[i] = round ? formats::round_bf16(v) : v;
    }
    return;
  }
  if (round) {
    activate_bf16_n(p, gate, up, out, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = activate(p, gate[i], up[i]);
}

}  // namespace

void activate_bf16_n(const ActivationParams& p, const float* gate, const float* up, float* out, int64_t n,
                     jit::Isa isa) {
  activate_n(p, gate, up, out, n, isa, true);
}

void activate_f32_n(const ActivationParams& p, const float* gate, const float* up, float* out, int64_t n,
                    jit::Isa isa) {
  activate_n(p, gate, up, out, n, isa, false);
}

void activate_bf16_in_n(const ActivationParams& p, const float* gate, const float* up, float* out, int64_t n,
                        jit::Isa isa) {
  activate_n(p, gate, up, out, n, isa, true, true);
}

}  // namespace moejit
