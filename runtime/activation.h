// Pass-1 epilogue activations (formats.md "Activations"), in fp32.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats/formats.h"
#include "jit/kernel_key.h"
#include "moejit.h"

namespace moejit {

struct ActivationParams {
  moejit_activation kind = MOEJIT_ACT_SILU;
  float alpha = 1.702f;
  float limit = 0.0f;  // 0 = no clamp
};

// e^x in fp32 for the activations, the same bits on every CPU and in
// activate_bf16_n's AVX-512 loop (which repeats these operations in this
// order; no FMA: x86-64 code without -mfma cannot contract): x = n ln2 + r with
// n rounded by adding 1.5 * 2^23, ln2 in two parts (Cody-Waite), e^r by Cephes'
// degree-6 polynomial (within 1 ulp of e^x here), 2^n through the exponent
// bits (as 2^(n-1) * 2, so n = 128 overflows to +inf as e^x does). Inputs are
// clamped to [-86, 89]: below, e^x only meets 1 + e^x in sigmoidf; above, +inf.
inline float exp_act(float x) {
  x = x < -86.0f ? -86.0f : (x > 89.0f ? 89.0f : x);  // NaN stays NaN
  const float t = x * 1.44269504f + 12582912.0f;
  const float nf = t - 12582912.0f;
  float r = x - nf * 0.693359375f;
  r = r + nf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  uint32_t tb;
  std::memcpy(&tb, &t, 4);
  const uint32_t sb = (tb - 0x4B400000u + 126u) << 23;  // 2^(n-1)
  float sc;
  std::memcpy(&sc, &sb, 4);
  return p * sc * 2.0f;
}
inline float sigmoidf(float z) { return 1.0f / (1.0f + exp_act(-z)); }

// NaN-propagating min / clamp (std::fmin would drop a NaN).
inline float min_keep_nan(float a, float b) { return a > b ? b : a; }
inline float clamp_keep_nan(float a, float lo, float hi) { return a < lo ? lo : (a > hi ? hi : a); }

inline float activate(const ActivationParams& p, float gate, float up) {
  switch (p.kind) {
    case MOEJIT_ACT_SILU: return gate * sigmoidf(gate) * up;
    case MOEJIT_ACT_GELU: return 0.5f * gate * (1.0f + std::erf(gate * 0.70710678118654752f)) * up;
    case MOEJIT_ACT_GELU_TANH: {
      const float inner = 0.7978845608f * (gate + 0.044715f * gate * gate * gate);
      return 0.5f * gate * (1.0f + std::tanh(inner)) * up;
    }
    case MOEJIT_ACT_SWIGLU_OAI:
    case MOEJIT_ACT_SWIGLU_CLAMP: {
      if (p.limit > 0.0f && std::isfinite(p.limit)) {
        gate = min_keep_nan(gate, p.limit);
        up = clamp_keep_nan(up, -p.limit, p.limit);
      }
      const float glu = gate * sigmoidf(p.alpha * gate);
      return p.kind == MOEJIT_ACT_SWIGLU_OAI ? glu * (up + 1.0f) : glu * up;
    }
  }
  return 0.0f;
}

// out[i] = round_bf16(activate(p, gate[i], up[i])) for n values (out may be
// gate): the same arithmetic per element, with the activation chosen once.
inline void activate_bf16_n(const ActivationParams& p, const float* gate, const float* up, float* out,
                            int64_t n) {
  if (p.kind == MOEJIT_ACT_SILU) {
    for (int64_t i = 0; i < n; ++i) out[i] = formats::round_bf16(gate[i] * sigmoidf(gate[i]) * up[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = formats::round_bf16(activate(p, gate[i], up[i]));
}
// The same, 16 values per AVX-512 instruction for silu and the swiglu kinds
// when `isa` has AVX-512 (same bits: the same operations in the same order).
void activate_bf16_n(const ActivationParams& p, const float* gate, const float* up, float* out, int64_t n,
                     jit::Isa isa);
// ds_fp4's pass 1 (formats.md): gate and up rounded to bf16 before the
// activation, out[i] = round_bf16(activate(p, round_bf16(gate[i]),
// round_bf16(up[i]))), by the same two paths (out may be gate or up).
void activate_bf16_in_n(const ActivationParams& p, const float* gate, const float* up, float* out, int64_t n,
                        jit::Isa isa);
// out[i] = activate(p, gate[i], up[i]), not rounded, by the same two paths:
// for tests that compare them bit for bit.
void activate_f32_n(const ActivationParams& p, const float* gate, const float* up, float* out, int64_t n,
                    jit::Isa isa);

}  // namespace moejit
