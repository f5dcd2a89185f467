// moejit-bench: layer geometry, byte accounting per format, random weights and routing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"
#include "moejit.h"

namespace moejit_bench {

// The nine formats of formats.md, by id.
const std::vector<moejit_format>& all_formats();
const char* format_label(moejit_format f);  // "bf16", "fp8_block", ...
bool parse_format(const std::string& name, moejit_format* out);

// Everything about a MoE layer except its weight format.
struct Geometry {
  int32_t hidden = 2048;
  int32_t intermediate = 768;
  int32_t experts = 128;
  int32_t top_k = 8;
  moejit_activation activation = MOEJIT_ACT_SILU;
  float swiglu_alpha = 0.0f;                     // 0 = library default 1.702
  float swiglu_limit = 0.0f;                     // 0 = no clamp
  bool interleaved = false;                      // gate_up rows interleaved (gpt-oss) instead of concatenated
  bool bias = false;                             // bf16 biases on gate_up and down
  int32_t group_size = 0;                        // mxfp8 only: 0 (= 32), 32, 64, 128
  moejit_dtype scale_dtype = MOEJIT_DTYPE_BF16;  // fp8_block only
  moejit_dtype output_dtype = MOEJIT_DTYPE_BF16;
};

// Bytes of one [rows, K] matrix: encoded weights, block scales (dense), nvfp4 row scales.
struct MatrixBytes {
  int64_t data = 0;
  int64_t scales = 0;
  int64_t row_scales = 0;
  int64_t total() const { return data + scales + row_scales; }
};
MatrixBytes matrix_bytes(moejit_format f, const Geometry& g, int64_t rows, int64_t k);

// Weight + scale bytes of one expert (gate_up [2I, H] and down [H, I]); biases not counted.
int64_t expert_bytes(moejit_format f, const Geometry& g);
double bytes_per_weight(moejit_format f, const Geometry& g);

// Empty when the format can hold this geometry (K rules of formats.md), else the reason.
std::string check_geometry(moejit_format f, const Geometry& g);

// A layer's weights, generated randomly but validly for the format, laid out like checkpoint
// tensors: one [E, rows, ...] block each for gate_up data, gate_up scales, down data, down scales.
class Layer {
 public:
  Layer(moejit_format f, const Geometry& g, uint64_t seed);
  moejit_moe_desc desc(int32_t max_tokens) const;
  int64_t total_bytes() const { return int64_t(geometry_.experts) * expert_bytes(format_, geometry_); }

 private:
  void build(const MatrixBytes& bytes, int64_t rows, uint64_t seed, Buffer* data, Buffer* scales,
             std::vector<float>* row_scales, std::vector<uint16_t>* bias, std::vector<moejit_matrix>* out);

  moejit_format format_;
  Geometry geometry_;
  Buffer gate_up_data_, gate_up_scales_, down_data_, down_scales_;
  std::vector<float> gate_up_row_scales_, down_row_scales_;
  std::vector<uint16_t> gate_up_bias_, down_bias_;
  std::vector<moejit_matrix> gate_up_, down_;
};

// A pool of precomputed routings, one per call: each token gets top_k distinct experts drawn
// uniformly, with positive weights summing to 1.
struct Routing {
  int32_t tokens = 0;
  int32_t top_k = 0;
  int32_t pool = 0;
  std::vector<int32_t> ids;       // [pool][tokens * top_k]
  std::vector<float> weights;     // [pool][tokens * top_k]
  std::vector<int32_t> distinct;  // [pool] distinct experts of each call

  const int32_t* ids_of(int64_t call) const { return &ids[size_t(call % pool) * tokens * top_k]; }
  const float* weights_of(int64_t call) const { return &weights[size_t(call % pool) * tokens * top_k]; }
  int32_t distinct_of(int64_t call) const { return distinct[size_t(call % pool)]; }
};
Routing make_routing(int32_t tokens, int32_t top_k, int32_t experts, uint64_t seed);

// Random bf16 activations in [-1, 1].
std::vector<uint16_t> random_activations(int64_t count, uint64_t seed);

}  // namespace moejit_bench
