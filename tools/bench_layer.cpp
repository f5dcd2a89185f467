#include "bench_layer.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>

#include "formats/formats.h"
#include "formats/kquants.h"

namespace moejit_bench {

namespace fmt = moejit::formats;

namespace {

fmt::Format to_fmt(moejit_format f) { return static_cast<fmt::Format>(f); }

fmt::ScaleDtype scale_dtype_of(moejit_format f, const Geometry& g) {
  const bool choice = fmt::info(to_fmt(f)).scale_code == fmt::ScaleCode::bf16_f32;  // fp8_block
  return choice && g.scale_dtype == MOEJIT_DTYPE_F32 ? fmt::ScaleDtype::f32 : fmt::ScaleDtype::bf16;
}

int32_t group_of(moejit_format f, const Geometry& g) {
  return fmt::default_group(to_fmt(f), g.group_size);  // the group_size applies where the format lets it
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

// GGUF blocks: overwrite each block's fp16 `d` (at d_at) and, where the format
// has one, `dmin` (dmin_at >= 0) with finite values ~[1e-3, 1.5e-2].
void patch_gguf_scales(uint8_t* data, int64_t bytes, int64_t block_bytes, uint64_t seed, int d_at = 0,
                       int dmin_at = -1) {
  constexpr int64_t kBlocksPerChunk = int64_t(1) << 20;
  const int64_t blocks = bytes / block_bytes;
  parallel_for((blocks + kBlocksPerChunk - 1) / kBlocksPerChunk, int(affinity_cpus().size()), [&](int64_t c) {
    Rng rng(seed ^ uint64_t(c));
    for (int64_t b = c * kBlocksPerChunk; b < std::min(blocks, (c + 1) * kBlocksPerChunk); ++b) {
      const uint64_t r = rng.next();
      const uint16_t d = uint16_t(((5 + (r & 3)) << 10) | ((r >> 2) & 0x3FF));
      std::memcpy(data + b * block_bytes + d_at, &d, 2);
      if (dmin_at < 0) continue;
      const uint16_t dmin = uint16_t(((5 + ((r >> 12) & 3)) << 10) | ((r >> 14) & 0x3FF));
      std::memcpy(data + b * block_bytes + dmin_at, &dmin, 2);
    }
  });
}

Geometry make_geometry(int32_t h, int32_t i, int32_t e, int32_t k, moejit_activation act, bool oai) {
  Geometry g;
  g.hidden = h, g.intermediate = i, g.experts = e, g.top_k = k, g.activation = act;
  if (oai) g.swiglu_alpha = 1.702f, g.swiglu_limit = 7.0f, g.interleaved = true, g.bias = true;
  return g;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> kPresets = {
      {"qwen3-30b-a3b", make_geometry(2048, 768, 128, 8, MOEJIT_ACT_SILU, false), MOEJIT_FORMAT_BF16, ""},
      {"qwen3-235b-a22b", make_geometry(4096, 1536, 128, 8, MOEJIT_ACT_SILU, false), MOEJIT_FORMAT_BF16, ""},
      {"qwen3.5-35b-a3b", make_geometry(2048, 512, 256, 8, MOEJIT_ACT_SILU, false), MOEJIT_FORMAT_BF16,
       "assumed geometry, not checked against a released config"},
      {"glm-4.5-air", make_geometry(4096, 1408, 128, 8, MOEJIT_ACT_SILU, false), MOEJIT_FORMAT_BF16, ""},
      {"minimax-m2", make_geometry(3072, 1536, 256, 8, MOEJIT_ACT_SILU, false), MOEJIT_FORMAT_FP8_BLOCK, ""},
      {"gpt-oss-20b", make_geometry(2880, 2880, 32, 4, MOEJIT_ACT_SWIGLU_OAI, true), MOEJIT_FORMAT_MXFP4,
       "swiglu alpha 1.702 limit 7, interleaved gate_up, biases"},
      {"gpt-oss-120b", make_geometry(2880, 2880, 128, 4, MOEJIT_ACT_SWIGLU_OAI, true), MOEJIT_FORMAT_MXFP4,
       "swiglu alpha 1.702 limit 7, interleaved gate_up, biases"},
      {"deepseek-v3", make_geometry(7168, 2048, 256, 8, MOEJIT_ACT_SILU, false), MOEJIT_FORMAT_FP8_BLOCK, ""},
  };
  return kPresets;
}

const std::vector<FormatChoice>& all_formats() {
  static const std::vector<FormatChoice> kAll = {
      MOEJIT_FORMAT_BF16,   MOEJIT_FORMAT_NVFP4,      MOEJIT_FORMAT_MXFP4,
      MOEJIT_FORMAT_DS_FP4, MOEJIT_FORMAT_Q4_0,       MOEJIT_FORMAT_FP8_BLOCK,
      MOEJIT_FORMAT_Q8_0,   MOEJIT_FORMAT_MXFP8_E4M3, MOEJIT_FORMAT_MXFP8_E5M2,
      MOEJIT_FORMAT_Q4_K,   MOEJIT_FORMAT_Q5_K,       MOEJIT_FORMAT_Q6_K,
      MOEJIT_FORMAT_Q2_K,   MOEJIT_FORMAT_Q3_K,       kMixQ4KM};
  return kAll;
}

bool is_mix(FormatChoice f) { return f == kMixQ4KM; }

ProjFormats proj_formats(FormatChoice f) {
  if (f == kMixQ4KM) return {MOEJIT_FORMAT_Q4_K, MOEJIT_FORMAT_Q4_K, MOEJIT_FORMAT_Q6_K};
  const auto one = static_cast<moejit_format>(f);  // not a mix: a format id of the library
  return {one, one, one};
}

Geometry layer_geometry(FormatChoice f, const Geometry& g) {
  Geometry l = g;
  if (is_mix(f) && !g.fused_given) l.separate = true, l.interleaved = false;
  return l;
}

const char* format_label(FormatChoice f) {
  return f == kMixQ4KM ? "q4_K_M" : fmt::format_name(fmt::Format(f));
}

bool parse_format(const std::string& name, FormatChoice* out) {
  if (name == "q4_K_M") return *out = kMixQ4KM, true;
  fmt::Format f;
  if (!fmt::format_from_name(name.c_str(), &f)) return false;
  *out = FormatChoice(f);
  return true;
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

int64_t expert_bytes(FormatChoice f, const Geometry& geom) {
  // Separate banks: two [I, H] matrices (fp8_block's 128-row scale blocks per bank).
  const Geometry g = layer_geometry(f, geom);
  const ProjFormats p = proj_formats(f);
  const int64_t gate_up = g.separate ? matrix_bytes(p.gate, g, g.intermediate, g.hidden).total() +
                                           matrix_bytes(p.up, g, g.intermediate, g.hidden).total()
                                     : matrix_bytes(p.gate, g, 2 * int64_t(g.intermediate), g.hidden).total();
  return gate_up + matrix_bytes(p.down, g, g.hidden, g.intermediate).total();
}

double bytes_per_weight(FormatChoice f, const Geometry& g) {
  return double(expert_bytes(f, g)) / (3.0 * double(g.hidden) * double(g.intermediate));
}

std::string check_geometry(FormatChoice f, const Geometry& g) {
  const char* why = "";
  const ProjFormats p = proj_formats(f);
  // A mix names the projection's format.
  const auto of = [&](moejit_format pf) {
    return is_mix(f) ? std::string(" (") + format_label(pf) + ")" : "";
  };
  for (moejit_format gu : {p.gate, p.up})
    if (!fmt::k_is_valid(to_fmt(gu), group_of(gu, g), g.hidden, &why))
      return std::string("hidden ") + std::to_string(g.hidden) + " " + why + of(gu);
  if (!fmt::k_is_valid(to_fmt(p.down), group_of(p.down, g), g.intermediate, &why))
    return std::string("intermediate ") + std::to_string(g.intermediate) + " " + why + of(p.down);
  return "";
}

MatrixBank::MatrixBank(moejit_format f, const Geometry& g, int64_t rows, int64_t k, int32_t count,
                       int32_t stored, uint64_t seed)
    : bytes_(moejit_bench::matrix_bytes(f, g, rows, k)) {
  stored = std::clamp(stored, 1, count);
  data_ = Buffer(size_t(bytes_.data * stored));
  fill_words(data_.data(), data_.size(), seed, data_shaper(f));
  const fmt::FormatInfo& fi = fmt::info(to_fmt(f));
  if (fi.scales == fmt::ScaleKind::inline_fp16)  // GGUF blocks: a finite d at the start of each
    patch_gguf_scales(data_.data(), int64_t(data_.size()), fi.block_bytes, seed + 7);
  if (fmt::is_kquant(to_fmt(f))) {
    const fmt::KQuant kq = fmt::KQuant(int32_t(f));
    patch_gguf_scales(data_.data(), int64_t(data_.size()), fmt::info(to_fmt(f)).block_bytes, seed + 7,
                      fmt::kquant_d_offset(kq), fmt::kquant_dmin_offset(kq));
  }
  if (bytes_.scales > 0) {
    scales_ = Buffer(size_t(bytes_.scales * stored));
    fill_words(scales_.data(), scales_.size(), seed + 13, scale_shaper(f, scale_dtype_of(f, g)));
  }
  if (bytes_.row_scales > 0) row_scales_.assign(size_t(rows * stored), 1.0f);
  if (g.bias) {
    Rng rng(seed + 29);
    bias_.resize(size_t(rows * stored));
    for (uint16_t& b : bias_) b = fmt::f32_to_bf16(float(rng.uniform() * 0.2 - 0.1));
  }
  matrices_.assign(size_t(count), moejit_matrix{});
  for (int64_t i = 0; i < count; ++i) {
    moejit_matrix& m = matrices_[size_t(i)];
    const int64_t e = i % stored;
    m.data = data_.data() + e * bytes_.data;
    m.scales = bytes_.scales > 0 ? scales_.data() + e * bytes_.scales : nullptr;
    m.scale_row_stride = 0;
    m.row_scales = bytes_.row_scales > 0 ? row_scales_.data() + e * rows : nullptr;
    m.bias = g.bias ? bias_.data() + e * rows : nullptr;
  }
}

int64_t MatrixBank::huge_page_bytes() const {
  const int64_t d = data_.huge_page_bytes(), s = scales_.huge_page_bytes();
  return d < 0 || s < 0 ? -1 : d + s;
}

int64_t Layer::huge_page_bytes() const {
  const int64_t g = gate_up_.huge_page_bytes(), d = down_.huge_page_bytes();
  return g < 0 || d < 0 ? -1 : g + d;
}

int32_t cold_pool_slots(FormatChoice f, const Geometry& g, int64_t l3_bytes) {
  const int64_t per_slot = std::max<int64_t>(1, expert_bytes(f, g));
  const int64_t want = int64_t(kPoolL3Multiple) * std::max<int64_t>(0, l3_bytes);
  const int64_t slots = std::max<int64_t>(g.experts, (want + per_slot - 1) / per_slot);
  return int32_t(std::min<int64_t>(slots, INT32_MAX));
}

Layer::Layer(FormatChoice f, const Geometry& g, uint64_t seed, int32_t backing, int32_t slots)
    : format_(f),
      geometry_(layer_geometry(f, g)),
      slots_(std::max(slots, g.experts)),
      backing_(backing > 0 ? std::min(backing, slots_) : slots_),
      ring_(size_t(slots_)),
      slot_of_(size_t(g.experts), -1) {
  const Geometry& lg = geometry_;
  const ProjFormats p = proj_formats(f);
  const int64_t gate_rows = lg.separate ? int64_t(lg.intermediate) : 2 * int64_t(lg.intermediate);
  gate_up_ = MatrixBank(p.gate, lg, gate_rows, lg.hidden, slots_, backing_, seed * 4 + 1);
  if (lg.separate) up_ = MatrixBank(p.up, lg, lg.intermediate, lg.hidden, slots_, backing_, seed * 4 + 3);
  down_ = MatrixBank(p.down, lg, lg.hidden, lg.intermediate, slots_, backing_, seed * 4 + 2);
  up_fmt_ = {p.up, MOEJIT_DTYPE_BF16, 0};
  down_fmt_ = {p.down, MOEJIT_DTYPE_BF16, 0};
  std::iota(ring_.begin(), ring_.end(), 0);
  Rng rng(seed * 4 + 3);
  for (int32_t i = slots_ - 1; i > 0; --i) std::swap(ring_[size_t(i)], ring_[rng.below(uint32_t(i + 1))]);
  placed_.reserve(size_t(g.experts));
}

void Layer::place(const int32_t* ids, int64_t routes, int32_t* out) const {
  for (int64_t r = 0; r < routes; ++r) {
    const int32_t e = ids[r];
    if (e < 0 || e >= geometry_.experts) {
      out[r] = e;
      continue;
    }
    int32_t& slot = slot_of_[size_t(e)];
    if (slot < 0) {
      slot = ring_[cursor_];
      cursor_ = cursor_ + 1 == ring_.size() ? 0 : cursor_ + 1;
      placed_.push_back(e);
    }
    out[r] = slot;
  }
  for (int32_t e : placed_) slot_of_[size_t(e)] = -1;
  placed_.clear();
}

moejit_moe_desc Layer::desc(int32_t max_tokens) const {
  moejit_moe_desc d{};
  d.struct_size = sizeof(d);
  d.format = proj_formats(format_).gate;  // a mix: its gate format, the others below
  const fmt::FormatInfo& fi = fmt::info(to_fmt(d.format));
  d.scale_dtype = fi.scale_code == fmt::ScaleCode::bf16_f32 ? geometry_.scale_dtype : MOEJIT_DTYPE_BF16;
  d.group_size = fi.api_groups ? geometry_.group_size : 0;
  d.hidden = geometry_.hidden;
  d.intermediate = geometry_.intermediate;
  d.num_experts = slots_;
  d.top_k = geometry_.top_k;
  d.max_tokens = max_tokens;
  d.activation = geometry_.activation;
  d.swiglu_alpha = geometry_.swiglu_alpha;
  d.swiglu_limit = geometry_.swiglu_limit;
  d.gate_up_interleaved = geometry_.interleaved && !geometry_.separate ? 1 : 0;
  d.router_weight_on_input = 0;
  d.output_dtype = geometry_.output_dtype;
  if (geometry_.separate) {
    d.gate = gate_up_.data();
    d.up = up_.data();
  } else {
    d.gate_up = gate_up_.data();
  }
  d.down = down_.data();
  if (is_mix(format_)) {
    if (geometry_.separate) d.up_format = &up_fmt_;
    d.down_format = &down_fmt_;
  }
  return d;
}

const char* routing_label(RoutingKind k) {
  switch (k) {
    case RoutingKind::uniform: return "uniform";
    case RoutingKind::skewed: return "skewed";
    case RoutingKind::same: return "same";
  }
  return "?";
}

bool parse_routing(const std::string& name, RoutingKind* out) {
  for (RoutingKind k : {RoutingKind::uniform, RoutingKind::skewed, RoutingKind::same})
    if (name == routing_label(k)) return *out = k, true;
  return false;
}

namespace {

// Draws top_k distinct experts into ids: uniformly (partial Fisher-Yates over perm) or, given
// log_weight, by weighted sampling without replacement (Efraimidis-Spirakis: the k largest
// log(u) / w, here log(-log(u)) - log(w) smallest, which is the same order).
class ExpertSampler {
 public:
  ExpertSampler(int32_t experts, RoutingKind kind, double zipf_s) : perm_(size_t(experts)) {
    if (kind != RoutingKind::skewed) return;
    // A fixed random ranking (independent of the seed of the calls), so every token count of a
    // run sees the same popular experts.
    std::vector<int32_t> rank(static_cast<size_t>(experts));
    std::iota(rank.begin(), rank.end(), 0);
    Rng rng(0x5EC7ED);
    for (int32_t i = experts - 1; i > 0; --i) std::swap(rank[size_t(i)], rank[rng.below(uint32_t(i + 1))]);
    log_weight_.resize(size_t(experts));
    for (int32_t e = 0; e < experts; ++e)
      log_weight_[size_t(e)] = -zipf_s * std::log(double(rank[size_t(e)] + 1));
    keys_.resize(size_t(experts));
  }

  void draw(Rng& rng, int32_t top_k, int32_t* ids) {
    const int32_t experts = int32_t(perm_.size());
    std::iota(perm_.begin(), perm_.end(), 0);
    if (log_weight_.empty()) {
      for (int32_t j = 0; j < top_k; ++j) {
        std::swap(perm_[size_t(j)], perm_[size_t(j) + rng.below(uint32_t(experts - j))]);
        ids[j] = perm_[size_t(j)];
      }
      return;
    }
    for (int32_t e = 0; e < experts; ++e)
      keys_[size_t(e)] = std::log(-std::log(1.0 - rng.uniform())) - log_weight_[size_t(e)];
    std::partial_sort(perm_.begin(), perm_.begin() + top_k, perm_.end(),
                      [&](int32_t a, int32_t b) { return keys_[size_t(a)] < keys_[size_t(b)]; });
    std::copy(perm_.begin(), perm_.begin() + top_k, ids);
  }

 private:
  std::vector<int32_t> perm_;
  std::vector<double> log_weight_, keys_;
};

}  // namespace

Routing make_routing(int32_t tokens, int32_t top_k, int32_t experts, uint64_t seed, RoutingKind kind,
                     double zipf_s) {
  Routing r;
  r.kind = kind;
  r.tokens = tokens;
  r.top_k = top_k;
  const int64_t per_call = int64_t(tokens) * top_k;
  r.pool = int32_t(std::clamp<int64_t>((int64_t(16) << 20) / (per_call * 8), 64, 4096));
  r.ids.resize(size_t(r.pool * per_call));
  r.weights.resize(r.ids.size());
  r.distinct.resize(size_t(r.pool));
  Rng rng(seed);
  ExpertSampler sampler(experts, kind, zipf_s);
  std::vector<char> seen(static_cast<size_t>(experts));
  for (int32_t c = 0; c < r.pool; ++c) {
    std::fill(seen.begin(), seen.end(), 0);
    int32_t distinct = 0;
    for (int32_t t = 0; t < tokens; ++t) {
      int32_t* ids = &r.ids[size_t(c * per_call + int64_t(t) * top_k)];
      float* w = &r.weights[size_t(c * per_call + int64_t(t) * top_k)];
      if (kind == RoutingKind::same && t > 0) {
        std::copy(ids - top_k, ids, ids);  // the first token's experts
      } else {
        sampler.draw(rng, top_k, ids);
      }
      float sum = 0.0f;
      for (int32_t j = 0; j < top_k; ++j) {
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
