// GGUF K-quants: the fp32 quantizers, computed as ggml's reference quantizers
// (quantize_row_q*_K_ref in ggml-quants.c), written anew here: every fp32
// expression keeps ggml's operand order, and this file is built with
// -ffp-contract=off (CMake) so that no multiply-add is fused where ggml rounds
// twice. Tests and tools only: the library never quantizes.
#include <cmath>
#include <cstring>

#include "formats/formats.h"
#include "formats/kquants.h"

namespace moejit::formats {

namespace {

uint16_t get_u16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }
void put_u16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v & 0xFF);
  p[1] = uint8_t(v >> 8);
}

}  // namespace

namespace {

constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS: below it a group is all zero

// ggml's nearest_int: round to nearest even through the fp32 addition of 1.5 * 2^23,
// read back from the mantissa bits. Exact for |v| < 2^22; beyond (and for NaN / inf)
// it yields ggml's same defined-but-meaningless integers, not UB.
int nearest_int(float v) {
  const float t = v + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &t, 4);
  return (i & 0x007FFFFF) - 0x00400000;
}

int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

float round_fp16(float v) { return fp16_to_f32(f32_to_fp16(v)); }

// Levels L[i] in 0..nmax, a scale and a min (returned as -min >= 0 in *neg_min) such
// that x[i] ~ scale * L[i] + min: the weighted least-squares fit ggml calls
// make_qkx2_quants, tried for nstep + 1 candidate inverse scales
// (rmin + rdelta * is + nmax) / (max - min), keeping the one of least weighted
// error (|diff| with use_mad, diff^2 otherwise).
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, float rmin,
                    float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = float(nmax) / (max - min);
  float scale = 1 / iscale;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = uint8_t(clampi(nearest_int(iscale * (x[i] - min)), 0, nmax));
    float diff = scale * float(L[i]) + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best += w[i] * diff;
  }
  uint8_t trial[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
      trial[i] = uint8_t(l);
      sum_l += w[i] * float(l);
      sum_l2 += w[i] * float(l) * float(l);
      sum_xl += w[i] * float(l) * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * float(trial[i]) + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        err += w[i] * diff;
      }
      if (err < best) {
        std::memcpy(L, trial, size_t(n));
        best = err;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// Symmetric levels L[i] in 0..2 nmax - 1 (value L - nmax) with the scale of least
// x^2-weighted error over 19 candidate inverse scales -(nmax + 0.1 is) / max
// (ggml's make_qx_quants with rmse_type 1 and no importance weights; q6_K).
float fit_symmetric(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  float iscale = float(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Symmetric levels for q3_K (ggml's make_q3_quants with do_rmse): start from
// -nmax / max, then up to 5 rounds of coordinate descent on the x^2-weighted
// fit, each level moved to the one its residual fit prefers when that improves
// sumlx^2 / suml2. L[i] in 0..2 nmax - 1 (value L - nmax).
float fit_q3(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float iscale = float(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = int8_t(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  for (int round = 0; round < 5; ++round) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * float(L[i]);
      if (slx > 0) {
        float sl2 = suml2 - w * float(L[i]) * float(L[i]);
        const int nl = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (nl != L[i]) {
          slx += w * x[i] * float(nl);
          sl2 += w * float(nl) * float(nl);
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = int8_t(nl);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = int8_t(L[i] + nmax);
  return sumlx / suml2;
}

// Packs 6-bit scale / min pairs into the 12 bytes of q4_K and q5_K (the inverse
// of kquant_sub).
void pack_scales_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] = ls[j];
      s[j + 4] = lm[j];
    } else {
      s[j + 4] = uint8_t((ls[j] & 0xF) | (lm[j] & 0xF) << 4);
      s[j - 4] |= uint8_t((ls[j] >> 4) << 6);
      s[j] |= uint8_t((lm[j] >> 4) << 6);
    }
  }
}

// q4_K (nmax 15) and q5_K (nmax 31): per sub-block of 32 a weighted scale/min fit
// (weights sqrt(mean x^2) + |x|), both quantized to 6 bits against the block's
// largest (d = max_scale / 63, dmin = max_min / 63 as fp16), then every element
// re-rounded against the stored scale and min.
void quantize_block_k45(const float* x, uint8_t* blk, int nmax) {
  const bool q5 = nmax == 31;
  uint8_t L[256];
  float scales[8], mins[8], weights[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = q5 ? fit_scale_min(32, 31, xs, weights, L + 32 * j, &mins[j], -0.5f, 0.1f, 15, false)
                   : fit_scale_min(32, 15, xs, weights, L + 32 * j, &mins[j], -1.0f, 0.1f, 20, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    // ggml stores nearest_int into a uint8_t before the clamp: the same wrap-around here.
    const uint8_t s = uint8_t(nearest_int(inv_scale * scales[j]));
    const uint8_t m = uint8_t(nearest_int(inv_min * mins[j]));
    ls[j] = s < 63 ? s : 63;
    lm[j] = m < 63 ? m : 63;
  }
  pack_scales_k4(ls, lm, blk + 4);
  put_u16(blk, f32_to_fp16(max_scale / 63.0f));
  put_u16(blk + 2, f32_to_fp16(max_min / 63.0f));
  const float d16 = fp16_to_f32(get_u16(blk)), dmin16 = fp16_to_f32(get_u16(blk + 2));
  for (int j = 0; j < 8; ++j) {
    const KQuantSub sm = kquant_sub(KQuant::q4_K, blk, j);
    const float d = d16 * float(sm.sc);
    if (d == 0) continue;  // keeps the levels of the fit, as ggml does
    const float dm = dmin16 * float(sm.m);
    for (int i = 0; i < 32; ++i)
      L[32 * j + i] = uint8_t(clampi(nearest_int((x[32 * j + i] + dm) / d), 0, nmax));
  }
  uint8_t* qs = blk + (q5 ? 48 : 16);
  if (q5) std::memset(blk + 16, 0, 32);
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 32; ++i) {
      int l1 = L[64 * c + i], l2 = L[64 * c + 32 + i];
      if (q5) {
        if (l1 > 15) {
          l1 -= 16;
          blk[16 + i] |= uint8_t(1 << (2 * c));
        }
        if (l2 > 15) {
          l2 -= 16;
          blk[16 + i] |= uint8_t(2 << (2 * c));
        }
      }
      qs[32 * c + i] = uint8_t(l1 | l2 << 4);
    }
}

// q6_K: per sub-block of 16 a symmetric fit (nmax 32), the scales quantized to
// int8 against the largest magnitude (d = max_scale / -128 as fp16), then every
// element re-rounded to -32..31 against d * sc.
void quantize_block_q6(const float* x, uint8_t* blk) {
  int8_t L[256];
  float scales[16];
  float max_scale = 0, max_abs = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
    const float a = std::fabs(scales[j]);
    if (a > max_abs) {
      max_abs = a;
      max_scale = scales[j];
    }
  }
  if (max_abs < kGroupMaxEps) {
    std::memset(blk, 0, 210);  // d = +0.0
    return;
  }
  const float iscale = -128.0f / max_scale;
  put_u16(blk + 208, f32_to_fp16(1 / iscale));
  for (int j = 0; j < 16; ++j) {
    const int s = nearest_int(iscale * scales[j]);
    blk[192 + j] = uint8_t(int8_t(s < 127 ? s : 127));
  }
  const float d16 = fp16_to_f32(get_u16(blk + 208));
  for (int j = 0; j < 16; ++j) {
    const float d = d16 * float(int8_t(blk[192 + j]));
    if (d == 0) continue;
    for (int i = 0; i < 16; ++i) L[16 * j + i] = int8_t(clampi(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
  }
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 32; ++i) {
      const int e = 128 * h + i;
      const uint8_t l0 = uint8_t(L[e]), l1 = uint8_t(L[e + 32]), l2 = uint8_t(L[e + 64]),
                    l3 = uint8_t(L[e + 96]);
      blk[64 * h + i] = uint8_t((l0 & 0xF) | (l2 & 0xF) << 4);
      blk[64 * h + 32 + i] = uint8_t((l1 & 0xF) | (l3 & 0xF) << 4);
      blk[128 + 32 * h + i] = uint8_t((l0 >> 4) | (l1 >> 4) << 2 | (l2 >> 4) << 4 | (l3 >> 4) << 6);
    }
}

// Packs 2-bit levels L[0..255] into the 64 bytes qs of q2_K / q3_K.
void pack_crumbs(const uint8_t* L, uint8_t* qs) {
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 32; ++i) {
      const uint8_t* l = L + 128 * h + i;
      qs[32 * h + i] = uint8_t(l[0] | l[32] << 2 | l[64] << 4 | l[96] << 6);
    }
}

// q2_K: per sub-block of 16 an |x|-weighted scale/min fit with nmax 3 and absolute
// error, scale and min quantized to 4 bits against the block's largest
// (d = max_scale / 15, dmin = max_min / 15 as fp16), then re-rounded.
void quantize_block_q2(const float* x, uint8_t* blk) {
  uint8_t L[256];
  float scales[16], mins[16], weights[16];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    scales[j] = fit_scale_min(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  uint8_t* sc = blk;
  if (max_scale > 0) {
    const float iscale = 15.0f / max_scale;
    for (int j = 0; j < 16; ++j) sc[j] = uint8_t(nearest_int(iscale * scales[j]));
    put_u16(blk + 80, f32_to_fp16(max_scale / 15.0f));
  } else {
    for (int j = 0; j < 16; ++j) sc[j] = 0;
    put_u16(blk + 80, f32_to_fp16(0.0f));
  }
  if (max_min > 0) {
    const float iscale = 15.0f / max_min;
    for (int j = 0; j < 16; ++j) sc[j] = uint8_t(sc[j] | uint32_t(nearest_int(iscale * mins[j])) << 4);
    put_u16(blk + 82, f32_to_fp16(max_min / 15.0f));
  } else {
    put_u16(blk + 82, f32_to_fp16(0.0f));
  }
  const float d16 = fp16_to_f32(get_u16(blk + 80)), dmin16 = fp16_to_f32(get_u16(blk + 82));
  for (int j = 0; j < 16; ++j) {
    const float d = d16 * float(sc[j] & 0xF);
    if (d == 0) continue;
    const float dm = dmin16 * float(sc[j] >> 4);
    for (int i = 0; i < 16; ++i) L[16 * j + i] = uint8_t(clampi(nearest_int((x[16 * j + i] + dm) / d), 0, 3));
  }
  pack_crumbs(L, blk + 16);
}

// q3_K: per sub-block of 16 a symmetric fit (nmax 4, coordinate descent), the
// scales quantized to 6 bits (offset 32) against the largest magnitude
// (d = max_scale / -32 as fp16), then re-rounded to -4..3; bit 2 of each level
// goes to hmask, the low 2 bits to qs.
void quantize_block_q3(const float* x, uint8_t* blk) {
  int8_t L[256];
  float scales[16];
  float max_scale = 0, amax = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
    const float a = std::fabs(scales[j]);
    if (a > amax) {
      amax = a;
      max_scale = scales[j];
    }
  }
  uint8_t* s = blk + 96;
  std::memset(s, 0, 12);
  if (max_scale != 0) {  // NaN too, as in ggml's `if (max_scale)`
    const float iscale = -32.0f / max_scale;
    for (int j = 0; j < 16; ++j) {
      // ggml keeps nearest_int in an int8_t before the clamp: the same wrap-around here.
      const int8_t l8 = int8_t(nearest_int(iscale * scales[j]));
      const int l = clampi(l8, -32, 31) + 32;
      if (j < 8)
        s[j] = uint8_t(l & 0xF);
      else
        s[j - 8] |= uint8_t((l & 0xF) << 4);
      s[8 + j % 4] |= uint8_t((l >> 4) << (2 * (j / 4)));
    }
    put_u16(blk + 108, f32_to_fp16(1 / iscale));
  } else {
    put_u16(blk + 108, f32_to_fp16(0.0f));
  }
  const float d16 = fp16_to_f32(get_u16(blk + 108));
  for (int j = 0; j < 16; ++j) {
    const float d = d16 * float(kquant_sub(KQuant::q3_K, blk, j).sc);
    if (d == 0) continue;
    for (int i = 0; i < 16; ++i) L[16 * j + i] = int8_t(clampi(nearest_int(x[16 * j + i] / d), -4, 3) + 4);
  }
  std::memset(blk, 0, 32);
  uint8_t low[256];
  for (int i = 0; i < 256; ++i) {
    int l = L[i];
    if (l > 3) {
      blk[i % 32] |= uint8_t(1 << (i / 32));
      l -= 4;
    }
    low[i] = uint8_t(l & 3);
  }
  pack_crumbs(low, blk + 32);
}

}  // namespace

QuantResult kquant_quantize(KQuant f, int64_t rows, int64_t k, const float* w, void* out) {
  QuantResult res;
  const char* why = "";
  if (int32_t(f) < kMinKQuantId || int32_t(f) > kMaxKQuantId) {
    res.error = "unknown K-quant format";
    return res;
  }
  if (rows < 1) {
    res.error = "rows must be >= 1";
    return res;
  }
  if (!kquant_k_is_valid(k, &why)) {
    res.error = why;
    return res;
  }
  if (!w || !out) {
    res.error = "null weight or data pointer";
    return res;
  }
  for (int64_t i = 0; i < rows * k; ++i) res.nonfinite += !std::isfinite(w[i]);
  const int bb = kquant_traits(f).block_bytes;
  uint8_t* dst = static_cast<uint8_t*>(out);
  for (int64_t b = 0; b < rows * k / kKQuantSuperBlock; ++b) {
    const float* x = w + b * kKQuantSuperBlock;
    uint8_t* blk = dst + b * bb;
    switch (f) {
      case KQuant::q4_K: quantize_block_k45(x, blk, 15); break;
      case KQuant::q5_K: quantize_block_k45(x, blk, 31); break;
      case KQuant::q6_K: quantize_block_q6(x, blk); break;
      case KQuant::q2_K: quantize_block_q2(x, blk); break;
      case KQuant::q3_K: quantize_block_q3(x, blk); break;
    }
  }
  res.ok = true;
  return res;
}

}  // namespace moejit::formats
