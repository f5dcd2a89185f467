// Small AVX-512 helpers shared by the runtime's intrinsics code (x86-64 only).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cstdint>

#include "jit/kernel_key.h"

namespace moejit::avx512 {

// Whether the tier runs AVX-512 (AVX512F/BW/VL/DQ: its row in jit/tiers.h needs them).
inline bool has_avx512(jit::Isa isa) {
  const jit::TierInfo* t = jit::tier_info(isa);
  constexpr uint32_t kAvx512 = jit::kAvx512f | jit::kAvx512bw | jit::kAvx512vl | jit::kAvx512dq;
  return t && (t->features & kAvx512) == kAvx512;
}

// Shifts of every 32-bit lane by a constant, in the zero-masking form with every
// lane kept: GCC 12 warns (-Wmaybe-uninitialized) about the unmasked forms'
// internal undefined vector.
__attribute__((target("avx512f"))) inline __m512i sll32(__m512i a, int n) {
  return _mm512_maskz_sllv_epi32(0xFFFF, a, _mm512_set1_epi32(n));
}
__attribute__((target("avx512f"))) inline __m512i srl32(__m512i a, int n) {
  return _mm512_maskz_srlv_epi32(0xFFFF, a, _mm512_set1_epi32(n));
}

// The first min(left, 16) or min(left, 32) lanes (left >= 1).
inline __mmask16 first_lanes16(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
}
inline __mmask32 first_lanes32(int64_t left) {
  return left >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << left) - 1u);
}

}  // namespace moejit::avx512
#endif
