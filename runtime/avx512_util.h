// Small AVX-512 helpers shared by the runtime's intrinsics code (x86-64 only).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cstdint>

namespace moejit::avx512 {

// Shifts of every 32-bit lane by a constant, in the zero-masking form with every
// lane kept: GCC 12 warns (-Wmaybe-uninitialized) about the unmasked forms'
// internal undefined vector.
__attribute__((target("avx512f"))) inline __m512i sll32(__m512i a, int n) {
  return _mm512_maskz_sllv_epi32(0xFFFF, a, _mm512_set1_epi32(n));
}
__attribute__((target("avx512f"))) inline __m512i srl32(__m512i a, int n) {
  return _mm512_maskz_srlv_epi32(0xFFFF, a, _mm512_set1_epi32(n));
}

// The first min(left, 16) lanes (left >= 1).
inline __mmask16 first_lanes16(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
}

}  // namespace moejit::avx512
#endif
