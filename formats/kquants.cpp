// GGUF K-quants: decoders and the reference GEMV (kquants.h has the layouts
// and the GEMV's operation order; the quantizers are in kquants_quantize.cpp).
// Built with -ffp-contract=off (CMake), so the GEMV's fp32 operations are
// exactly the documented ones.
#include "formats/kquants.h"

#include <cmath>
#include <cstring>

#include "formats/formats.h"

namespace moejit::formats {

namespace {

uint16_t get_u16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }

int d_offset(KQuant f) {
  switch (f) {
    case KQuant::q4_K:
    case KQuant::q5_K: return 0;
    case KQuant::q6_K: return 208;
    case KQuant::q2_K: return 80;
    case KQuant::q3_K: return 108;
  }
  return 0;
}

// The 2-bit field of element i shared by q2_K and q3_K (qs = the 64 quant bytes).
int crumb(const uint8_t* qs, int i) { return (qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3; }
// The nibble of element i shared by q4_K and q5_K (qs = the 128 quant bytes).
int nibble(const uint8_t* qs, int i) {
  const uint8_t b = qs[32 * (i / 64) + i % 32];
  return i % 64 < 32 ? b & 0xF : b >> 4;
}

// One decoded super-block: the factors of the weight formula.
struct Block {
  float d = 0, dmin = 0;
  int32_t sc[16] = {}, m[16] = {};
  int8_t q[256] = {};
};

void decode_block(KQuant f, const uint8_t* blk, Block* b) {
  const int ns = kquant_traits(f).sub_blocks;
  b->d = kquant_d(f, blk);
  b->dmin = kquant_dmin(f, blk);
  for (int j = 0; j < ns; ++j) {
    const KQuantSub s = kquant_sub(f, blk, j);
    b->sc[j] = s.sc;
    b->m[j] = s.m;
  }
  for (int i = 0; i < 256; ++i) b->q[i] = int8_t(kquant_q(f, blk, i));
}

}  // namespace

KQuantTraits kquant_traits(KQuant f) {
  const int32_t id = int32_t(f);
  const FormatInfo& fi = info(id >= kMinKQuantId && id <= kMaxKQuantId ? Format(id) : Format::q4_K);
  return {fi.name, fi.block_bytes, int32_t(kKQuantSuperBlock) / fi.sub_block, fi.sub_block, fi.has_mins};
}

const char* kquant_name(KQuant f) {
  const int32_t id = int32_t(f);
  return id >= kMinKQuantId && id <= kMaxKQuantId ? info(Format(id)).name : "unknown";
}

bool kquant_from_id(int32_t id, KQuant* out) {
  if (id < kMinKQuantId || id > kMaxKQuantId) return false;
  *out = KQuant(id);
  return true;
}

bool kquant_from_name(const char* name, KQuant* out) {
  for (int32_t id = kMinKQuantId; id <= kMaxKQuantId; ++id) {
    if (std::strcmp(name, info(Format(id)).name) == 0) {
      *out = KQuant(id);
      return true;
    }
  }
  return false;
}

bool kquant_k_is_valid(int64_t k, const char** why) {
  if (k < kKQuantSuperBlock || k % kKQuantSuperBlock != 0) {
    *why = k < 1 ? "must be >= 1" : info(Format::q4_K).k_rule;
    return false;
  }
  return true;
}

int64_t kquant_row_bytes(KQuant f, int64_t k) { return k / kKQuantSuperBlock * kquant_traits(f).block_bytes; }

int64_t kquant_sub_sums_len(KQuant f, int64_t k) { return k / kquant_traits(f).sub_block_size; }

// ---------------------------------------------------------------- decoders

int kquant_d_offset(KQuant f) { return d_offset(f); }

int kquant_dmin_offset(KQuant f) {
  switch (f) {
    case KQuant::q4_K:
    case KQuant::q5_K: return 2;
    case KQuant::q2_K: return 82;
    default: return -1;
  }
}

float kquant_d(KQuant f, const uint8_t* blk) { return fp16_to_f32(get_u16(blk + d_offset(f))); }

float kquant_dmin(KQuant f, const uint8_t* blk) {
  const int at = kquant_dmin_offset(f);
  return at < 0 ? 0.0f : fp16_to_f32(get_u16(blk + at));
}

KQuantSub kquant_sub(KQuant f, const uint8_t* blk, int j) {
  switch (f) {
    case KQuant::q4_K:
    case KQuant::q5_K: {
      const uint8_t* s = blk + 4;
      if (j < 4) return {s[j] & 63, s[j + 4] & 63};
      return {(s[j + 4] & 15) | (s[j - 4] >> 6) << 4, (s[j + 4] >> 4) | (s[j] >> 6) << 4};
    }
    case KQuant::q6_K: return {int8_t(blk[192 + j]), 0};
    case KQuant::q2_K: return {blk[j] & 15, blk[j] >> 4};
    case KQuant::q3_K: {
      const uint8_t* s = blk + 96;
      const int lo = (j < 8 ? s[j] : s[j - 8] >> 4) & 15;
      const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
      return {(lo | hi << 4) - 32, 0};
    }
  }
  return {0, 0};
}

int32_t kquant_q(KQuant f, const uint8_t* blk, int i) {
  switch (f) {
    case KQuant::q4_K: return nibble(blk + 16, i);
    case KQuant::q5_K: return nibble(blk + 48, i) | ((blk[16 + i % 32] >> (i / 32)) & 1) << 4;
    case KQuant::q6_K: {
      const int h = i / 128, e = i % 128;
      const uint8_t lo = blk[64 * h + e % 64];
      const int low4 = e < 64 ? lo & 0xF : lo >> 4;
      const int high2 = (blk[128 + 32 * h + e % 32] >> (2 * (e / 32))) & 3;
      return (low4 | high2 << 4) - 32;
    }
    case KQuant::q2_K: return crumb(blk + 16, i);
    case KQuant::q3_K: return crumb(blk + 32, i) - ((blk[i % 32] >> (i / 32)) & 1 ? 0 : 4);
  }
  return 0;
}

double kquant_weight(KQuant f, const void* row, int64_t k) {
  const KQuantTraits t = kquant_traits(f);
  const uint8_t* blk = static_cast<const uint8_t*>(row) + k / kKQuantSuperBlock * t.block_bytes;
  const int i = int(k % kKQuantSuperBlock);
  const KQuantSub s = kquant_sub(f, blk, i / t.sub_block_size);
  const double dq = double(kquant_d(f, blk)) * s.sc * kquant_q(f, blk, i);  // exact
  return t.has_mins ? dq - double(kquant_dmin(f, blk)) * s.m : dq;
}

double kquant_weight(KQuant f, const void* data, int64_t K, int64_t r, int64_t k) {
  return kquant_weight(f, static_cast<const uint8_t*>(data) + r * kquant_row_bytes(f, K), k);
}

void kquant_dequantize_row(KQuant f, const void* row, int64_t k, float* out) {
  const KQuantTraits t = kquant_traits(f);
  Block b;
  for (int64_t k0 = 0; k0 < k; k0 += kKQuantSuperBlock) {
    decode_block(f, static_cast<const uint8_t*>(row) + k0 / kKQuantSuperBlock * t.block_bytes, &b);
    for (int i = 0; i < 256; ++i) {
      const int j = i / t.sub_block_size;
      const float dq = b.d * float(b.sc[j]) * float(b.q[i]);  // both products exact
      out[k0 + i] = t.has_mins ? dq - b.dmin * float(b.m[j]) : dq;
    }
  }
}

// ---------------------------------------------------------------- reference GEMV

void kquant_sub_sums(KQuant f, const float* x, int64_t k, float* sx) {
  const int64_t bl = kquant_traits(f).sub_block_size;
  for (int64_t s = 0; s < k / bl; ++s) {
    float sum = 0.0f;
    for (int64_t i = s * bl; i < (s + 1) * bl; ++i) sum = sum + x[i];
    sx[s] = sum;
  }
}

void kquant_gemv(KQuant f, const void* data, int64_t k, int64_t rows, const float* x, const float* sx,
                 float* y) {
  const KQuantTraits t = kquant_traits(f);
  const int64_t rb = kquant_row_bytes(f, k);
  Block b;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(data) + r * rb;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += kKQuantSuperBlock) {
      decode_block(f, row + k0 / kKQuantSuperBlock * t.block_bytes, &b);
      for (int j = 0; j < t.sub_blocks; ++j) {
        const int i0 = j * t.sub_block_size;
        float sq = 0.0f;
        for (int i = i0; i < i0 + t.sub_block_size; ++i)
          sq = sq + float(b.q[i]) * x[k0 + i];  // exact products
        acc = std::fma(b.d * float(b.sc[j]), sq, acc);
        if (!t.has_mins) continue;
        float sxj = 0.0f;  // kquant_sub_sums' value, where the caller gives none
        if (sx)
          sxj = sx[(k0 + i0) / t.sub_block_size];
        else
          for (int i = i0; i < i0 + t.sub_block_size; ++i) sxj = sxj + x[k0 + i];
        acc = std::fma(-(b.dmin * float(b.m[j])), sxj, acc);
      }
    }
    y[r] = acc;
  }
}

void kquant_gemv(KQuant f, const void* data, int64_t k, int64_t rows, const float* x, float* y) {
  kquant_gemv(f, data, k, rows, x, nullptr, y);
}

}  // namespace moejit::formats
