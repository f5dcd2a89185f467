#include "bench_layer.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "formats/formats.h"

namespace moejit_bench {

namespace fmt = moejit::formats;

namespace {

fmt::Format to_fmt(moejit_format f) { return static_cast<fmt::Format>(f); }

fmt::ScaleDtype scale_dtype_of(moejit_format f, const Geometry& g) {
  return f == MOEJIT_FORMAT_FP8_BLOCK && g.scale_dtype == MOEJIT_DTYPE_F32 ? fmt::ScaleDtype::f32
                                                                           : fmt::ScaleDtype::bf16;
}

int32_t group_of(moejit_format f, const Geometry& g) {
  const bool mx8 = f == MOEJIT_FORMAT_MXFP8_E4M3 || f == MOEJIT_FORMAT_MXFP8_E5M2;
  return fmt::default_group(to_fmt(f), mx8 ? g.group_size : 0);
}

// ---- word shapers: a random 64-bit word -> 8 valid encoded bytes ----

uint64_t any_bytes(uint64_t w) { return w; }
// bf16 lanes with biased exponent 118..125 (|w| in ~[0.004, 0.5)), random sign and mantissa.
uint64_t bf16_weights(uint64_t w) {
  return (w & 0x807F807F807F807Full) | ((((w >> 7) & 0x0007000700070007ull) + 0x0076007600760076ull) << 7);
}
// bf16 lanes, positive, exponent 117..120: ~[1e-3, 1.5e-2].
uint64_t bf16_scales(uint64_t w) {
  return (w & 0x007F007F007F007Full) | ((((w >> 7) & 0x0003000300030003ull) + 0x0075007500750075ull) << 7);
}
// fp32 lanes, positive, exponent 117..120.
uint64_t f32_scales(uint64_t w) {
  return (w & 0x007FFFFF007FFFFFull) | ((((w >> 23) & 0x0000000300000003ull) + 0x0000007500000075ull) << 23);
}
// e5m2 without the inf/NaN exponent (bit 6 cleared: exponent <= 15).
uint64_t e5m2_finite(uint64_t w) { return w & 0xBFBFBFBFBFBFBFBFull; }
// e8m0 in 124..127 (2^-3 .. 1).
uint64_t e8m0_scales(uint64_t w) { return (w & 0x0303030303030303ull) | 0x7C7C7C7C7C7C7C7Cull; }
// positive e4m3 in [1, 1.875] (nvfp4 block scales).
uint64_t e4m3_scales(uint64_t w) { return (w & 0x0707070707070707ull) | 0x3838383838383838ull; }

using Shaper = uint64_t (*)(uint64_t);

Shaper data_shaper(moejit_format f) {
  switch (f) {
    case MOEJIT_FORMAT_BF16: return bf16_weights;
    case MOEJIT_FORMAT_MXFP8_E5M2: return e5m2_finite;
    default: return any_bytes;  // e4m3, e2m1 nibbles, int8 / int4 codes: every byte is valid
  }
}

Shaper scale_shaper(moejit_format f, fmt::ScaleDtype dt) {
  switch (f) {
    case MOEJIT_FORMAT_FP8_BLOCK: return dt == fmt::ScaleDtype::f32 ? f32_scales : bf16_scales;
    case MOEJIT_FORMAT_NVFP4: return e4m3_scales;
    default: return e8m0_scales;
  }
}

// GGUF q4_0 / q8_0: overwrite each block's leading fp16 `d` with a finite value ~[1e-3, 1.5e-2].
void patch_gguf_scales(uint8_t* data, int64_t bytes, int64_t block_bytes, uint64_t seed) {
  constexpr int64_t kBlocksPerChunk = int64_t(1) << 20;
  const int64_t blocks = bytes / block_bytes;
  parallel_for((blocks + kBlocksPerChunk - 1) / kBlocksPerChunk, int(affinity_cpus().size()), [&](int64_t c) {
    Rng rng(seed ^ uint64_t(c));
    for (int64_t b = c * kBlocksPerChunk; b < std::min(blocks, (c + 1) * kBlocksPerChunk); ++b) {
      const uint64_t r = rng.next();
      const uint16_t d = uint16_t(((5 + (r & 3)) << 10) | ((r >> 2) & 0x3FF));
      std::memcpy(data + b * block_bytes, &d, 2);
    }
  });
}

}  // namespace

const std::vector<moejit_format>& all_formats() {
  static const std::vector<moejit_format> kAll = {
      MOEJIT_FORMAT_BF16,   MOEJIT_FORMAT_NVFP4,      MOEJIT_FORMAT_MXFP4,
      MOEJIT_FORMAT_DS_FP4, MOEJIT_FORMAT_Q4_0,       MOEJIT_FORMAT_FP8_BLOCK,
      MOEJIT_FORMAT_Q8_0,   MOEJIT_FORMAT_MXFP8_E4M3, MOEJIT_FORMAT_MXFP8_E5M2};
  return kAll;
}

const char* format_label(moejit_format f) { return fmt::format_name(to_fmt(f)); }

bool parse_format(const std::string& name, moejit_format* out) {
  for (moejit_format f : all_formats()) {
    if (name == format_label(f)) {
      *out = f;
      return true;
    }
  }
  return false;
}

MatrixBytes matrix_bytes(moejit_format f, const Geometry& g, int64_t rows, int64_t k) {
  const fmt::Format ff = to_fmt(f);
  MatrixBytes b;
  b.data = rows * fmt::row_bytes(ff, k);
  b.scales = fmt::scale_rows(ff, rows) * fmt::scale_cols(ff, group_of(f, g), k) *
             fmt::scale_elem_bytes(ff, scale_dtype_of(f, g));
  b.row_scales = fmt::has_row_scales(ff) ? rows * int64_t(sizeof(float)) : 0;
  return b;
}

int64_t expert_bytes(moejit_format f, const Geometry& g) {
  return matrix_bytes(f, g, 2 * int64_t(g.intermediate), g.hidden).total() +
         matrix_bytes(f, g, g.hidden, g.intermediate).total();
}

double bytes_per_weight(moejit_format f, const Geometry& g) {
  return double(expert_bytes(f, g)) / (3.0 * double(g.hidden) * double(g.intermediate));
}

std::string check_geometry(moejit_format f, const Geometry& g) {
  const char* why = "";
  if (!fmt::k_is_valid(to_fmt(f), group_of(f, g), g.hidden, &why))
    return std::string("hidden ") + std::to_string(g.hidden) + " " + why;
  if (!fmt::k_is_valid(to_fmt(f), group_of(f, g), g.intermediate, &why))
    return std::string("intermediate ") + std::to_string(g.intermediate) + " " + why;
  return "";
}

Layer::Layer(moejit_format f, const Geometry& g, uint64_t seed) : format_(f), geometry_(g) {
  const int64_t two_i = 2 * int64_t(g.intermediate);
  build(matrix_bytes(f, g, two_i, g.hidden), two_i, seed * 4 + 1, &gate_up_data_, &gate_up_scales_,
        &gate_up_row_scales_, &gate_up_bias_, &gate_up_);
  build(matrix_bytes(f, g, g.hidden, g.intermediate), g.hidden, seed * 4 + 2, &down_data_, &down_scales_,
        &down_row_scales_, &down_bias_, &down_);
}

void Layer::build(const MatrixBytes& bytes, int64_t rows, uint64_t seed, Buffer* data, Buffer* scales,
                  std::vector<float>* row_scales, std::vector<uint16_t>* bias,
                  std::vector<moejit_matrix>* out) {
  const int64_t experts = geometry_.experts;
  *data = Buffer(size_t(bytes.data * experts));
  fill_words(data->data(), data->size(), seed, data_shaper(format_));
  if (format_ == MOEJIT_FORMAT_Q4_0) patch_gguf_scales(data->data(), int64_t(data->size()), 18, seed + 7);
  if (format_ == MOEJIT_FORMAT_Q8_0) patch_gguf_scales(data->data(), int64_t(data->size()), 34, seed + 7);
  if (bytes.scales > 0) {
    *scales = Buffer(size_t(bytes.scales * experts));
    fill_words(scales->data(), scales->size(), seed + 13,
               scale_shaper(format_, scale_dtype_of(format_, geometry_)));
  }
  if (bytes.row_scales > 0) row_scales->assign(size_t(rows * experts), 1.0f);
  if (geometry_.bias) {
    Rng rng(seed + 29);
    bias->resize(size_t(rows * experts));
    for (uint16_t& b : *bias) b = fmt::f32_to_bf16(float(rng.uniform() * 0.2 - 0.1));
  }
  out->assign(size_t(experts), moejit_matrix{});
  for (int64_t e = 0; e < experts; ++e) {
    moejit_matrix& m = (*out)[size_t(e)];
    m.data = data->data() + e * bytes.data;
    m.scales = bytes.scales > 0 ? scales->data() + e * bytes.scales : nullptr;
    m.scale_row_stride = 0;
    m.row_scales = bytes.row_scales > 0 ? row_scales->data() + e * rows : nullptr;
    m.bias = geometry_.bias ? bias->data() + e * rows : nullptr;
  }
}

moejit_moe_desc Layer::desc(int32_t max_tokens) const {
  moejit_moe_desc d{};
  d.struct_size = sizeof(d);
  d.format = format_;
  d.scale_dtype = format_ == MOEJIT_FORMAT_FP8_BLOCK ? geometry_.scale_dtype : MOEJIT_DTYPE_BF16;
  const bool mx8 = format_ == MOEJIT_FORMAT_MXFP8_E4M3 || format_ == MOEJIT_FORMAT_MXFP8_E5M2;
  d.group_size = mx8 ? geometry_.group_size : 0;
  d.hidden = geometry_.hidden;
  d.intermediate = geometry_.intermediate;
  d.num_experts = geometry_.experts;
  d.top_k = geometry_.top_k;
  d.max_tokens = max_tokens;
  d.activation = geometry_.activation;
  d.swiglu_alpha = geometry_.swiglu_alpha;
  d.swiglu_limit = geometry_.swiglu_limit;
  d.gate_up_interleaved = geometry_.interleaved ? 1 : 0;
  d.router_weight_on_input = 0;
  d.output_dtype = geometry_.output_dtype;
  d.gate_up = gate_up_.data();
  d.down = down_.data();
  return d;
}

Routing make_routing(int32_t tokens, int32_t top_k, int32_t experts, uint64_t seed) {
  Routing r;
  r.tokens = tokens;
  r.top_k = top_k;
  const int64_t per_call = int64_t(tokens) * top_k;
  r.pool = int32_t(std::clamp<int64_t>((int64_t(16) << 20) / (per_call * 8), 64, 4096));
  r.ids.resize(size_t(r.pool * per_call));
  r.weights.resize(r.ids.size());
  r.distinct.resize(size_t(r.pool));
  Rng rng(seed);
  std::vector<int32_t> perm(static_cast<size_t>(experts));
  std::vector<char> seen(static_cast<size_t>(experts));
  for (int32_t c = 0; c < r.pool; ++c) {
    std::fill(seen.begin(), seen.end(), 0);
    int32_t distinct = 0;
    for (int32_t t = 0; t < tokens; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      int32_t* ids = &r.ids[size_t(c * per_call + int64_t(t) * top_k)];
      float* w = &r.weights[size_t(c * per_call + int64_t(t) * top_k)];
      float sum = 0.0f;
      for (int32_t j = 0; j < top_k; ++j) {  // partial Fisher-Yates: top_k distinct experts
        std::swap(perm[size_t(j)], perm[size_t(j) + rng.below(uint32_t(experts - j))]);
        ids[j] = perm[size_t(j)];
        w[j] = float(0.05 + rng.uniform());
        sum += w[j];
        if (!seen[size_t(ids[j])]) ++distinct, seen[size_t(ids[j])] = 1;
      }
      for (int32_t j = 0; j < top_k; ++j) w[j] /= sum;
    }
    r.distinct[size_t(c)] = distinct;
  }
  return r;
}

std::vector<uint16_t> random_activations(int64_t count, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint16_t> x(static_cast<size_t>(count));
  for (uint16_t& v : x) v = fmt::f32_to_bf16(float(rng.uniform() * 2.0 - 1.0));
  return x;
}

}  // namespace moejit_bench
