// Pass-1 epilogue activations (formats.md "Activations"), in fp32.
#pragma once

#include <cmath>

#include "formats/formats.h"
#include "moejit.h"

namespace moejit {

struct ActivationParams {
  moejit_activation kind = MOEJIT_ACT_SILU;
  float alpha = 1.702f;
  float limit = 0.0f;  // 0 = no clamp
};

inline float sigmoidf(float z) { return 1.0f / (1.0f + std::exp(-z)); }

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

}  // namespace moejit
