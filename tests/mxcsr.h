// Runs code under every MXCSR setting an engine may leave behind (x86-64 only).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

namespace moejit_test {

// fn(rc) with flush-to-zero (bit 15) and denormals-are-zero (bit 6) set, under
// each rounding control rc (bits 13-14); the caller's MXCSR is restored after
// each call.
template <class Fn>
void under_each_mxcsr(Fn fn) {
  const unsigned saved = _mm_getcsr();
  for (unsigned rc : {0x0000u, 0x2000u, 0x4000u, 0x6000u}) {
    _mm_setcsr((saved & ~0x6000u) | 0x8040u | rc);
    fn(rc);
    _mm_setcsr(saved);
  }
}

}  // namespace moejit_test
#endif
