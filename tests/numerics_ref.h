// Test data and the float64 reference for the numerics suite. The reference is
// built only from formats/ decoders (formats::weight, bf16 conversions) and
// implements formats.md "MoE layer semantics" / "Dense linear semantics", with
// an error bound per output element (see bounds in numerics_ref.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "formats/formats.h"
#include "moejit.h"
#include "rng.h"

namespace moejit_test {

namespace fm = moejit::formats;

constexpr double kU = 1.0 / 16777216.0;  // 2^-24, fp32 unit roundoff
// Activation functions evaluated in fp32 by a kernel are trusted to within
// kActUlps * 2^-24 * |gate| * (|up| (+1 for swiglu_oai)) of the exact value.
constexpr double kActUlps = 16;

// How test data is drawn.
//  exact:  every product and partial sum of pass 1 is exact in fp32 (bf16
//          weights n*2^-5 with |n| <= 15, e4m3 codes of exponent 4..7 or zero,
//          power-of-two scales 1/4..1, x = n*2^-4 with |n| <= 8, biases n*2^-6),
//          so the only legitimate kernel/reference difference in g is a bf16
//          rounding flip next to a midpoint.
//  random: full-range data (all e4m3 codes incl. +-480, wide bf16 exponents,
//          non-power-of-two scales incl. f32 mantissas).
//  quantized: a random fp32 matrix (gaussian rows of random magnitude, outliers,
//          zeros) through formats/quantize, as a checkpoint would hold it; every
//          format, nvfp4 with its per-row globals. Bounds as for random.
// The K-quants have no exact fill: random gives random super-block bytes with
// finite d and dmin of moderate size.
enum class Fill { exact, random, quantized };

// One [rows, K] matrix in the engine's layout, with poisoned scale padding.
struct Mat {
  moejit_format fmt = MOEJIT_FORMAT_BF16;
  moejit_dtype sdt = MOEJIT_DTYPE_BF16;
  int64_t rows = 0, k = 0;
  int32_t group = 0;       // mxfp8 scale group (0 = the format's default)
  int64_t api_stride = 0;  // what the API is given (0 = dense)
  int64_t stride = 0;      // resolved
  int64_t srows = 0, scols = 0;
  std::vector<uint8_t> data;
  std::vector<uint8_t> scales;    // srows * stride elements
  std::vector<float> row_scales;  // nvfp4 per-row globals (empty otherwise)
  std::vector<uint16_t> bias;     // empty = none

  moejit_matrix api() const;
  fm::Layout layout() const;
  fm::MatrixRef ref() const;
  std::vector<double> dequant() const;  // [rows * k], exact
  // [rows * k]: what the error bounds take per weight: |w|, and for the K-quants
  // |d sc q| + |dmin m| (formats.md: the two terms may cancel).
  std::vector<double> magnitude() const;
  double bias_at(int64_t r) const;
  void set_scale(int64_t sr, int64_t sc, float v);  // v must be representable in the scale dtype
};

// pad > 0: scale_row_stride = scale columns + pad, padding holds NaN.
// group: mxfp8 scale group, 0 = the format's default.
Mat make_mat(moejit_format fmt, moejit_dtype sdt, int64_t rows, int64_t k, int64_t pad, Fill fill, bool bias,
             Rng& rng, int32_t group = 0);

// make_mat for the formats of a layer: ds_fp4 weights are mxfp4 bytes, drawn as
// mxfp4 and labelled ds_fp4.
Mat make_weights(moejit_format fmt, moejit_dtype sdt, int64_t rows, int64_t k, int64_t pad, Fill fill,
                 bool bias, Rng& rng, int32_t group = 0);

std::vector<uint16_t> make_x(int64_t n, Fill fill, Rng& rng);

double round_bf16(double v);    // round to nearest even in bf16, from a double (no double rounding)
double bf16_quantum(double v);  // spacing of bf16 values at |v|

// ds_fp4 activation numerics (formats.md "ds_fp4 extra numerics"), literally in
// double: s = 2^ceil(log2(max(amax, 1e-4) / 448)), v' = bf16(e4m3_rne(clamp(v / s, +-448)) * s).
double ds_scale(double amax);
double e4m3_rne(double v);               // nearest e4m3 value, ties to even (|v| <= 448)
double ds_quantize(double v, double s);  // bf16(e4m3_rne(clamp(v / s, +-448)) * s)
// The round trip of n values, per block of 128 (the last one may be shorter).
std::vector<double> ds_roundtrip(const double* v, int64_t n);

// ---------------------------------------------------------------- MoE

// One projection's own format (0.2: up_format, down_format), when given.
struct ProjSpec {
  bool given = false;
  moejit_format fmt = MOEJIT_FORMAT_BF16;
  moejit_dtype sdt = MOEJIT_DTYPE_BF16;
  int32_t group = 0;
};
inline ProjSpec proj(moejit_format fmt, moejit_dtype sdt = MOEJIT_DTYPE_BF16, int32_t group = 0) {
  return {true, fmt, sdt, group};
}

struct MoeProblem {
  std::string name;
  moejit_format fmt = MOEJIT_FORMAT_BF16;
  moejit_dtype sdt = MOEJIT_DTYPE_BF16;
  int H = 64, I = 32, E = 8, top_k = 2, max_tokens = 9;
  moejit_activation act = MOEJIT_ACT_SILU;
  float alpha = 0, limit = 0;
  int interleaved = 0, rwoi = 0;
  moejit_dtype out = MOEJIT_DTYPE_BF16;
  bool bias = false;
  int pad = 0;
  int32_t group = 0;  // mxfp8 scale group (group_size; 0 = 32)
  Fill fill = Fill::exact;
  uint64_t seed = 1;
  // 0.2: separate gate and up banks [I, H] instead of gate_up [2I, H], and the
  // formats of up and down when given (else as gate: fmt, sdt, group).
  bool separate = false;
  ProjSpec up_format, down_format;
};

struct MoeData {
  MoeProblem p;
  std::vector<Mat> gu, dn;  // gu: the fused gate_up, or the gate bank when p.separate
  std::vector<Mat> up;      // p.separate: the up bank
  std::vector<moejit_matrix> gu_api, up_api, dn_api;
  moejit_proj_format up_fmt{}, dn_fmt{};  // what desc() points up_format and down_format at
  std::vector<uint16_t> x;                // [max_tokens, H]
  std::vector<int32_t> ids;               // [max_tokens, top_k]
  std::vector<float> w;                   // [max_tokens, top_k]
  moejit_moe_desc desc() const;
};

// A problem of E experts (top_k 2) and up to max_tokens tokens; the other
// fields keep MoeProblem's defaults.
inline MoeProblem moe_problem(std::string name, moejit_format fmt, int H, int I, int E, int max_tokens,
                              Fill fill, uint64_t seed) {
  MoeProblem p;
  p.name = std::move(name);
  p.fmt = fmt;
  p.H = H;
  p.I = I;
  p.E = E;
  p.max_tokens = max_tokens;
  p.fill = fill;
  p.seed = seed;
  return p;
}

MoeData make_moe(const MoeProblem& p);

struct Reference {
  std::vector<double> y;          // [tokens, cols]
  std::vector<double> bound;      // allowed |got - y|
  std::vector<bool> all_skipped;  // per token: y must be +0.0
  int64_t flagged = 0;            // g elements with a legitimate bf16 rounding ambiguity
  int64_t significant = 0;        // ... among those, elements above 1/16 of their route's largest |g|
  int64_t g_elems = 0;
  // ds_fp4: route outputs (before the pass-2 sum) with a legitimate bf16 rounding ambiguity.
  int64_t c_flagged = 0, c_elems = 0;
};

Reference moe_reference(const MoeData& d);

// ---------------------------------------------------------------- linear

struct LinearProblem {
  std::string name;
  moejit_format fmt = MOEJIT_FORMAT_BF16;
  moejit_dtype sdt = MOEJIT_DTYPE_BF16;
  int rows = 16, cols = 16, max_tokens = 9;
  moejit_dtype out = MOEJIT_DTYPE_F32;
  bool bias = false;
  int pad = 0;
  int32_t group = 0;  // mxfp8 scale group (group_size; 0 = 32)
  uint64_t seed = 1;
  Fill fill = Fill::random;
};

struct LinearData {
  LinearProblem p;
  Mat w;
  std::vector<uint16_t> x;
  moejit_linear_desc desc() const;
};

LinearData make_linear(const LinearProblem& p);
Reference linear_reference(const LinearData& d);

// ---------------------------------------------------------------- checking

// Output element t*cols + c of a y buffer as double.
double y_at(const std::vector<uint8_t>& y, moejit_dtype dt, size_t i);

// Compares the first `tokens` rows; reports up to a few mismatches with
// ADD_FAILURE naming `what`. Returns the number of bad elements.
int64_t check_against(const std::vector<uint8_t>& y, moejit_dtype dt, const Reference& ref, int tokens,
                      int cols, const std::string& what);

}  // namespace moejit_test
