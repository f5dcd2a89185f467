// MoE layer: experts' banks read in place, kernels resolved at construction,
// one decode call = pass 1 (gate/up + activation) and pass 2 (down + weighted
// sum) split into row-block work items across the context's pool.
//
// Routes are grouped by expert (a counting sort). With dedup (the default) a
// group is every route of one expert: its weight rows are read and decoded
// once and multiplied against all of its tokens in one kernel call. Without
// dedup every route is its own group. Groups run in ascending expert id, routes
// inside a group in slot order, so each token's pass-2 sum follows the
// canonical order in both modes and the bits are the same.
//
// Gate and up come fused in one gate_up matrix per expert (rows concatenated
// or interleaved) or as separate gate and up banks; each projection (gate, up,
// down) may have its own format, so its own kernels and, for gate and up, its
// own layout of the prepared x (the plan, runtime/plan.h, says which).
//
// ds_fp4 runs the mxfp4 kernels with DeepSeek's activation numerics around
// them (formats.md), in every projection or none (validated by the C API): x
// is round-tripped through e4m3 per 128 before pass 1;
// gate and up are rounded to bf16 before the activation; pass-1 items cover
// exactly one 128-block of I, so each round-trips its own block of g; each
// weighted route output is rounded to bf16 before the pass-2 sum.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "moejit.h"
#include "runtime/activation.h"
#include "runtime/aligned_buffer.h"
#include "runtime/context.h"
#include "runtime/matmul.h"
#include "runtime/plan.h"

namespace moejit {

struct MoeConfig {
  plan::ProjFormat gate, up, down;  // each projection's encoding (up is gate's when fused)
  plan::GateUp gate_up = plan::GateUp::concat;
  int32_t hidden = 0, intermediate = 0, experts = 0, top_k = 0, max_tokens = 0;
  ActivationParams act;
  bool weight_on_input = false;
  moejit_dtype out_dtype = MOEJIT_DTYPE_BF16;
};

// The experts' banks, [experts] matrices each: the fused gate_up (gate, with up
// NULL) or separate gate and up, and down.
struct MoeBanks {
  const moejit_matrix* gate = nullptr;
  const moejit_matrix* up = nullptr;
  const moejit_matrix* down = nullptr;
};

class MoeLayer {
 public:
  // Builds the layer; arrays are copied. On failure returns the status and sets *err.
  static moejit_status create(std::shared_ptr<Context> ctx, const MoeConfig& cfg, const MoeBanks& banks,
                              std::unique_ptr<MoeLayer>* out, std::string* err);
  ~MoeLayer();

  // Arguments are already validated. Returns BUSY when the context has a task in flight.
  // `sync`: the caller is about to wait, so it may run a share of the work itself.
  moejit_status submit(int32_t num_tokens, const uint16_t* x, const int32_t* ids, const float* weights,
                       void* y, bool sync);
  Context& context() { return *ctx_; }
  moejit_moe_stats stats() const;
  const MoeConfig& config() const { return cfg_; }
  const plan::MoePlan& plan() const { return plan_; }  // white-box tests

 private:
  MoeLayer() = default;
  static void run_item(void* self, int phase, int64_t item, int worker);
  void pass1(int64_t item, int worker);
  void pass2(int64_t item, int worker);
  int32_t group_expert(int32_t g) const { return ids_[route_slot_[size_t(group_begin_[size_t(g)])]]; }
  const void* pass1_call(int64_t call) const;
  const void* pass2_call(int64_t call) const;
  int32_t group_size(int32_t g) const { return group_begin_[size_t(g) + 1] - group_begin_[size_t(g)]; }

  std::shared_ptr<Context> ctx_;
  MoeConfig cfg_;
  plan::MoePlan plan_;  // row blocks, calls and kernels (runtime/plan.h)
  // Per matrix of the plan (plan::kGate: gate or the fused gate_up; plan::kUp
  // with separate banks; plan::kDown): its kernels, each expert's weights and bias.
  Matmul mm_[3];
  std::vector<formats::MatrixRef> w_[3];
  std::vector<const uint16_t*> bias_[3];
  bool ds_ = false;                  // ds_fp4 activation numerics
  int64_t ahead1_ = 1, ahead2_ = 1;  // calls between a read and its prefetch
  uint64_t expert_bytes_ = 0;        // weight + scale bytes of one expert

  // Scratch sized once at construction. x is prepared in the layout of gate's
  // kernels ([0]) and, when up's kernels want another one, of up's ([1]).
  AlignedBuffer<uint8_t> x_prep_[2];  // [max_tokens][x_stride(H)]: each token's prepared x (a run of its own)
  std::vector<uint16_t> x_rt_;        // ds_fp4: [H], one token's x after the e4m3 round trip
  AlignedBuffer<uint8_t> x_grp_[2];   // slots of x of each route, grouped (dedup; group_slot_)
  AlignedBuffer<uint8_t> g_grp_;      // slots of g of each route, grouped (group_slot_)
  int x_sets_ = 1;                    // 2: up's kernels want x in another layout than gate's
  std::vector<int32_t> group_slot_;   // [groups]: the slot of each group's first route in x_grp_ and g_grp_
  AlignedBuffer<float> worker_scratch_;  // per worker: matmul scratch + pass buffers
  size_t worker_floats_ = 0;
  std::vector<int32_t> expert_count_;  // [E + 1] counting sort of routes by expert
  std::vector<int32_t> route_slot_;    // routes sorted by (expert, slot); slot = t * top_k + k
  std::vector<int32_t> group_begin_;   // [groups + 1]: a group is one expert's routes (dedup) or one route
  int32_t groups_ = 0;
  bool dedup_ = true;
  bool debug_ = false;  // MOEJIT_DEDUP_DEBUG: print each call's reuse factor
  Job job_;

  // The call in flight.
  int32_t tokens_ = 0;
  const int32_t* ids_ = nullptr;
  const float* weights_ = nullptr;
  void* y_ = nullptr;

  std::atomic<uint64_t> calls_{0}, routes_{0}, unique_{0}, bytes_{0};
};

}  // namespace moejit

struct moejit_moe {
  std::unique_ptr<moejit::MoeLayer> impl;
};
