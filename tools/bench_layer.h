// moejit-bench: layer geometry, byte accounting per format, random weights and routing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"
#include "moejit.h"

namespace moejit_bench {

// What --format names: a format id of the library, for every projection, or a mix. An int,
// not a moejit_format: a mix is no value of that C enum, and a load of one through the enum
// type would be undefined behaviour (UBSan's -fsanitize=enum stops on it).
using FormatChoice = int32_t;

// The formats of formats.md, by id, then the mixes.
const std::vector<FormatChoice>& all_formats();
const char* format_label(FormatChoice f);  // "bf16", "fp8_block", ..., "q4_K_M"
bool parse_format(const std::string& name, FormatChoice* out);

// A mix: one format per projection, under a name of its own, taken wherever a
// format is. Its value is no format id of the library (and its CSV format_id is
// -1). q4_K_M is llama.cpp's default: gate and up q4_K, down q6_K, in separate
// gate and up banks as GGUF files hold them (fused with an explicit --layout fused).
inline constexpr FormatChoice kMixQ4KM = 1001;
bool is_mix(FormatChoice f);
struct ProjFormats {
  moejit_format gate, up, down;
};
ProjFormats proj_formats(FormatChoice f);  // a plain format three times

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
  bool separate = false;                         // gate and up in banks of their own (--layout separate)
  bool fused_given = false;                      // --layout fused given: mixes fuse gate_up too
  bool bias = false;                             // bf16 biases on gate_up and down
  int32_t group_size = 0;                        // mxfp8 only: 0 (= 32), 32, 64, 128
  moejit_dtype scale_dtype = MOEJIT_DTYPE_BF16;  // fp8_block only
  moejit_dtype output_dtype = MOEJIT_DTYPE_BF16;
};

// A model's MoE layer geometry (routed experts only), from one table.
struct Preset {
  const char* name;
  Geometry geometry;
  moejit_format format;  // the format the checkpoint ships in (the default --format)
  const char* note;      // where the geometry comes from, shown by --help
};
const std::vector<Preset>& presets();

// Bytes of one [rows, K] matrix: encoded weights, block scales (dense), nvfp4 row scales.
struct MatrixBytes {
  int64_t data = 0;
  int64_t scales = 0;
  int64_t row_scales = 0;
  int64_t total() const { return data + scales + row_scales; }
};
MatrixBytes matrix_bytes(moejit_format f, const Geometry& g, int64_t rows, int64_t k);

// The geometry a format's layer has: a mix keeps gate and up apart unless --layout fused was given.
Geometry layer_geometry(FormatChoice f, const Geometry& g);

// Weight + scale bytes of one expert (gate_up [2I, H], or gate and up [I, H] each, and down [H, I],
// each projection in its own format); biases not counted.
int64_t expert_bytes(FormatChoice f, const Geometry& g);
double bytes_per_weight(FormatChoice f, const Geometry& g);

// Empty when the format can hold this geometry (K rules of formats.md), else the reason.
std::string check_geometry(FormatChoice f, const Geometry& g);

// Cold experts: moejit-bench cycles its calls through a pool of expert slots (Layer::place) of at
// least kPoolL3Multiple x the L3 and at least the model's experts. The fewest slots that hold that
// many bytes (weights + scales, as expert_bytes counts them), and never fewer than g.experts.
inline constexpr int kPoolL3Multiple = 4;
int32_t cold_pool_slots(FormatChoice f, const Geometry& g, int64_t l3_bytes);

// `count` matrices [rows, K] of one format, generated randomly but validly for it, laid out like a
// checkpoint tensor: one [stored, rows, ...] block each for data, block scales, row scales and
// bf16 biases (when g.bias). Matrix i reads copy i % stored, so `stored` < `count` gives the
// same descriptors over less memory.
class MatrixBank {
 public:
  MatrixBank() = default;
  MatrixBank(moejit_format f, const Geometry& g, int64_t rows, int64_t k, int32_t count, int32_t stored,
             uint64_t seed);
  const moejit_matrix& operator[](int32_t i) const { return matrices_[size_t(i)]; }
  const moejit_matrix* data() const { return matrices_.data(); }
  int32_t size() const { return int32_t(matrices_.size()); }
  int64_t matrix_bytes() const { return bytes_.total(); }  // weights + scales, no bias
  int64_t huge_page_bytes() const;                         // of data and scales, -1 unknown

 private:
  MatrixBytes bytes_;
  Buffer data_, scales_;
  std::vector<float> row_scales_;
  std::vector<uint16_t> bias_;
  std::vector<moejit_matrix> matrices_;
};

// A layer's weights: gate_up [S][2I, H] (or, with g.separate, gate [S][I, H] and up [S][I, H])
// and down [S][H, I] banks over S = `slots` expert slots (0: the model's experts, S >=
// g.experts). `backing` > 0 stores only that many experts and points slot s at copy s % backing:
// the same routing and plan as the full layer over a working set small enough to stay cached
// (--hot). The moejit layer it describes has S experts; place() maps a call's routes over the
// model's experts onto them.
class Layer {
 public:
  Layer(FormatChoice f, const Geometry& g, uint64_t seed, int32_t backing = 0, int32_t slots = 0);
  moejit_moe_desc desc(int32_t max_tokens) const;  // num_experts = slots()
  // Bytes of distinct memory behind the layer's slots.
  int64_t total_bytes() const { return int64_t(backing_) * expert_bytes(format_, geometry_); }
  int32_t slots() const { return slots_; }
  // Bytes of the layer's weights and scales on transparent huge pages, -1 unknown.
  int64_t huge_page_bytes() const;
  FormatChoice format() const { return format_; }
  const Geometry& geometry() const { return geometry_; }
  // The fused gate_up of expert e (the gate bank's matrix when the geometry is separate).
  const moejit_matrix& gate_up(int32_t e) const { return gate_up_[e]; }
  const moejit_matrix& down(int32_t e) const { return down_[e]; }

  // The cold cycle: writes to out[r] the slot of route r (ids in [0, g.experts); < 0 passes
  // through). The call's distinct experts, in order of first route, take the next slots of a ring
  // over all slots (a fixed random order of them), so routes that share an expert share its slot
  // (dedup sees the same reuse), and a slot is read again only after every other slot was: no
  // call finds its experts in a cache smaller than the pool. The cursor is the layer's, shared by
  // every arm timed on it, so arms interleaved in time stay cold against each other.
  void place(const int32_t* ids, int64_t routes, int32_t* out) const;

 private:
  FormatChoice format_;
  Geometry geometry_;
  int32_t slots_;
  int32_t backing_;
  MatrixBank gate_up_, up_, down_;            // gate_up_ is the gate bank when separate
  moejit_proj_format up_fmt_{}, down_fmt_{};  // a mix's up and down formats
  std::vector<int32_t> ring_;                 // every slot once, in a fixed random order
  mutable size_t cursor_ = 0;                 // next position in ring_
  mutable std::vector<int32_t> slot_of_;      // per model expert: its slot in the current call, -1
  mutable std::vector<int32_t> placed_;       // model experts given a slot in the current call
};

// How a call's tokens pick their experts. uniform: top_k distinct experts each, uniformly;
// skewed: Zipf-like popularity, P(expert of rank r) ~ 1 / (r + 1)^s over a fixed random ranking;
// same: every token of a call takes the same top_k experts (the most reuse dedup can find).
enum class RoutingKind { uniform, skewed, same };
const char* routing_label(RoutingKind k);
bool parse_routing(const std::string& name, RoutingKind* out);

// A pool of precomputed routings, one per call (calls cycle through it so experts stay cold);
// every token has top_k distinct experts with positive weights summing to 1.
struct Routing {
  RoutingKind kind = RoutingKind::uniform;
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
Routing make_routing(int32_t tokens, int32_t top_k, int32_t experts, uint64_t seed,
                     RoutingKind kind = RoutingKind::uniform, double zipf_s = 1.0);

// Random bf16 activations in [-1, 1].
std::vector<uint16_t> random_activations(int64_t count, uint64_t seed);

}  // namespace moejit_bench
