#include "runtime/moe.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

#include "runtime/ds_round.h"

namespace moejit {

moejit_status MoeLayer::create(std::shared_ptr<Context> ctx, const MoeConfig& cfg, const MoeBanks& banks,
                               std::unique_ptr<MoeLayer>* out, std::string* err) {
  std::unique_ptr<MoeLayer> m(new (std::nothrow) MoeLayer());
  if (!m) return MOEJIT_OUT_OF_MEMORY;
  m->ctx_ = std::move(ctx);
  m->cfg_ = cfg;
  const int64_t H = cfg.hidden, E = cfg.experts;
  m->dedup_ = !(m->ctx_->flags() & MOEJIT_CONTEXT_NO_DEDUP) && m->ctx_->dedup_enabled();
  m->debug_ = m->ctx_->dedup_debug();

  plan::Target target;
  target.isa = m->ctx_->isa();
  target.threads = m->ctx_->num_threads();
  target.dedup = m->dedup_;
  target.all_tiles = m->ctx_->all_tiles();
  target.tile_emu = m->ctx_->tile_emu();
  plan::MoeShape shape;
  shape.gate = cfg.gate;
  shape.up = cfg.up;
  shape.down = cfg.down;
  shape.hidden = cfg.hidden;
  shape.intermediate = cfg.intermediate;
  shape.top_k = cfg.top_k;
  shape.max_tokens = cfg.max_tokens;
  shape.gate_up = cfg.gate_up;
  shape.gate_stride = banks.gate[0].scale_row_stride;
  shape.up_stride = banks.up ? banks.up[0].scale_row_stride : 0;
  shape.down_stride = banks.down[0].scale_row_stride;
  m->plan_ = plan::moe_plan(shape, target);
  const plan::MoePlan& p = m->plan_;
  m->ds_ = p.ds;
  m->expert_bytes_ = uint64_t(p.expert_bytes());

  const moejit_matrix* bank[3] = {banks.gate, banks.up, banks.down};
  for (int proj : {plan::kGate, plan::kUp, plan::kDown}) {
    if (!p.has(proj)) continue;
    const moejit_status st = m->mm_[proj].init(p.mats[proj], err);
    if (st != MOEJIT_OK) return st;
    // Each expert's own stride: explicit, or dense (0) for its own scale tensor.
    const formats::Layout& l = p.mats[proj].layout;
    const int64_t dense = formats::scale_cols(l.format, l.group, l.k);
    m->w_[proj].resize(size_t(E));
    m->bias_[proj].resize(size_t(E));
    for (int64_t e = 0; e < E; ++e) {
      const moejit_matrix& w = bank[proj][e];
      m->w_[proj][size_t(e)] = {w.data, w.scales, w.row_scales,
                                w.scale_row_stride > 0 ? w.scale_row_stride : dense};
      m->bias_[proj][size_t(e)] = w.bias;
    }
  }

  // Calls to look ahead for the prefetch (each call reads one row block of one
  // expert; gate and up calls alternate, so their mean size with separate banks).
  int64_t b1 = 0;
  bool far1 = false;
  for (int c = 0; c < p.calls1(); ++c) {
    const int proj = p.call1(0, c).proj;
    b1 += m->mm_[proj].call_bytes(p.gate_up == plan::GateUp::interleaved ? 2 * p.rows1 : p.rows1);
    far1 = far1 || p.mats[proj].far_prefetch();
  }
  b1 /= p.calls1();
  const Matmul& gate = m->mm_[plan::kGate];
  const Matmul& dn = m->mm_[plan::kDown];
  const int64_t b2 = dn.call_bytes(p.rows2);
  m->ahead1_ = far1 ? std::max<int64_t>(1, (kPrefetchBytes + b1 - 1) / b1) : 1;
  m->ahead2_ = p.mats[plan::kDown].far_prefetch() ? std::max<int64_t>(1, (kPrefetchBytes + b2 - 1) / b2) : 1;
  m->x_sets_ = p.separate() && !(m->mm_[plan::kUp].xprep() == gate.xprep()) ? 2 : 1;
  const size_t T = size_t(cfg.max_tokens), K = size_t(cfg.top_k), R = T * K;
  const size_t gmax = size_t(p.group_max);
  // Grouped x and g: one slot per route.
  const int64_t slots = int64_t(R);
  try {
    for (int s = 0; s < m->x_sets_; ++s) {
      const Matmul& mx = m->mm_[s == 0 ? plan::kGate : plan::kUp];
      m->x_prep_[s].assign(mx.x_buffer_bytes(int64_t(T)), 0);
      if (m->dedup_) m->x_grp_[s].assign(mx.x_buffer_bytes(slots), 0);
    }
    if (m->ds_) m->x_rt_.assign(size_t(H), 0);
    m->g_grp_.assign(dn.x_buffer_bytes(slots), 0);
    m->group_slot_.assign(R + 1, 0);
    // pass 1: gate, up (or both interleaved) for a group; pass 2: dot for a group + per-token sums.
    const size_t p1 = 4 * gmax * size_t(p.rows1);
    const size_t p2 = gmax * size_t(p.rows2) + T * size_t(p.rows2);
    size_t mm_floats = 0;
    for (int proj : {plan::kGate, plan::kUp, plan::kDown})
      if (p.has(proj)) mm_floats = std::max(mm_floats, m->mm_[proj].scratch_floats());
    m->worker_floats_ = aligned_elems<float>(mm_floats + std::max(p1, p2) + 16);
    m->worker_scratch_.assign(m->worker_floats_ * size_t(m->ctx_->num_threads()), 0.0f);
    m->expert_count_.assign(size_t(cfg.experts) + 1, 0);
    m->route_slot_.assign(R, 0);
    m->group_begin_.assign(R + 1, 0);
  } catch (const std::bad_alloc&) {
    return MOEJIT_OUT_OF_MEMORY;
  }
  m->job_.run = &MoeLayer::run_item;
  m->job_.self = m.get();
  m->job_.num_phases = 2;
  *out = std::move(m);
  return MOEJIT_OK;
}

MoeLayer::~MoeLayer() {
  if (ctx_) ctx_->wait_if_owner(this);
}

moejit_status MoeLayer::submit(int32_t T, const uint16_t* x, const int32_t* ids, const float* weights,
                               void* y, bool sync) {
  if (!ctx_->try_acquire(this)) return MOEJIT_BUSY;
  const int32_t K = cfg_.top_k;
  tokens_ = T;
  ids_ = ids;
  weights_ = weights;
  y_ = y;

  // Prepared activations (integer work only: widening bf16 is exact). ds_fp4
  // first round-trips each token's x through e4m3 per 128 (O(T * H)).
  for (int32_t t = 0; t < T; ++t) {
    const uint16_t* xt = x + int64_t(t) * cfg_.hidden;
    if (ds_) {
      ds_act_roundtrip_n(xt, cfg_.hidden, x_rt_.data(), ctx_->isa());
      xt = x_rt_.data();
    }
    for (int s = 0; s < x_sets_; ++s)
      mm_[s == 0 ? plan::kGate : plan::kUp].x_prepare(x_prep_[s].data(), {t, 1, 0}, xt);
  }

  // Counting sort of the active routes by expert; slots ascend inside an expert.
  std::fill(expert_count_.begin(), expert_count_.end(), 0);
  const int32_t slots = T * K;
  for (int32_t s = 0; s < slots; ++s)
    if (ids[s] >= 0) ++expert_count_[size_t(ids[s]) + 1];
  for (int32_t e = 0; e < cfg_.experts; ++e) expert_count_[size_t(e) + 1] += expert_count_[size_t(e)];
  const int32_t nact = expert_count_[size_t(cfg_.experts)];
  int32_t unique = 0;
  for (int32_t e = 0; e < cfg_.experts; ++e)
    unique += expert_count_[size_t(e) + 1] > expert_count_[size_t(e)];
  for (int32_t s = 0; s < slots; ++s)
    if (ids[s] >= 0) route_slot_[size_t(expert_count_[size_t(ids[s])]++)] = s;
  // expert_count_[e] now holds the end of expert e's routes.
  groups_ = 0;
  group_begin_[0] = 0;
  if (dedup_) {
    for (int32_t e = 0, begin = 0; e < cfg_.experts; ++e) {
      const int32_t end = expert_count_[size_t(e)];
      if (end > begin) group_begin_[size_t(++groups_)] = end;
      begin = end;
    }
    // Each group's x vectors side by side for the multi-token kernels.
    for (int32_t g = 0, next = 0; g < groups_; ++g) {
      const int32_t first = group_begin_[size_t(g)], cnt = group_size(g);
      group_slot_[size_t(g)] = next;
      next += cnt;
      for (int s = 0; s < x_sets_; ++s) {
        const Matmul& mx = mm_[s == 0 ? plan::kGate : plan::kUp];
        for (int32_t i = 0; i < cnt; ++i)
          mx.x_copy(x_grp_[s].data(), mx.xprep().group_slot(group_slot_[size_t(g)], cnt, i),
                    x_prep_[s].data(), {route_slot_[size_t(first + i)] / K, 1, 0});
      }
    }
  } else {
    for (int32_t r = 0; r < nact; ++r) {
      group_begin_[size_t(++groups_)] = r + 1;
      group_slot_[size_t(r)] = r;
    }
  }

  const uint64_t streamed = uint64_t(dedup_ ? unique : nact) * expert_bytes_;
  calls_.fetch_add(1, std::memory_order_relaxed);
  routes_.fetch_add(uint64_t(nact), std::memory_order_relaxed);
  unique_.fetch_add(uint64_t(unique), std::memory_order_relaxed);
  bytes_.fetch_add(streamed, std::memory_order_relaxed);
  if (debug_) {
    std::fprintf(stderr, "moejit: moe call: %d tokens, %d routes, %d experts, reuse %.2f, %s\n", T, nact,
                 unique, unique ? double(nact) / unique : 0.0, dedup_ ? "dedup" : "no dedup");
  }

  job_.counts[0] = int64_t(groups_) * plan_.blocks1;
  job_.counts[1] = plan_.blocks2;
  ctx_->launch(&job_, sync);
  return MOEJIT_OK;
}

void MoeLayer::run_item(void* self, int phase, int64_t item, int worker) {
  auto* m = static_cast<MoeLayer*>(self);
  if (phase == 0)
    m->pass1(item, worker);
  else
    m->pass2(item, worker);
}

// First weight row of pass-1 call number `call` (an item's calls in the
// plan's order: gate then up, or one interleaved call); nullptr past the end.
const void* MoeLayer::pass1_call(int64_t call) const {
  const int cpi = plan_.calls1();
  const int64_t item = call / cpi;
  if (item >= int64_t(groups_) * plan_.blocks1) return nullptr;
  const plan::Call c = plan_.call1(item % plan_.blocks1, int(call % cpi));
  const int32_t e = group_expert(int32_t(item / plan_.blocks1));
  return mm_[c.proj].row_ptr(w_[c.proj][size_t(e)], c.r0);
}

// First weight row of pass-2 call number `call` (item-major, then group).
const void* MoeLayer::pass2_call(int64_t call) const {
  if (groups_ == 0) return nullptr;
  const int64_t item = call / groups_;
  if (item >= plan_.blocks2) return nullptr;
  const int32_t e = group_expert(int32_t(call % groups_));
  return mm_[plan::kDown].row_ptr(w_[plan::kDown][size_t(e)], item * plan_.rows2);
}

// Pass 1 item: one group's rows [j0, j0 + n) of gate and up for all of its routes.
void MoeLayer::pass1(int64_t item, int worker) {
  const int64_t I = cfg_.intermediate;
  const int32_t grp = int32_t(item / plan_.blocks1);
  const int64_t blk = item % plan_.blocks1;
  const int64_t j0 = blk * plan_.rows1;
  const int64_t n = std::min<int64_t>(plan_.rows1, I - j0);
  const int32_t first = group_begin_[size_t(grp)];
  const int32_t cnt = group_size(grp);
  const int32_t e = group_expert(grp);
  const int32_t K = cfg_.top_k;
  const Matmul& dn = mm_[plan::kDown];
  float* scratch = worker_scratch_.data() + size_t(worker) * worker_floats_;
  float* gate = scratch;                       // [cnt][n]
  float* up = gate + size_t(cnt) * size_t(n);  // [cnt][n]
  float* both = up + size_t(cnt) * size_t(n);  // [cnt][2n] interleaved rows
  float* mscratch = gate + 4 * size_t(cnt) * size_t(plan_.rows1);
  // This group's x vectors in x set s (side by side with dedup, else its one token's): buffer and first slot.
  auto group_x = [&](int s) { return dedup_ ? x_grp_[s].data() : x_prep_[s].data(); };
  const int64_t xslot = dedup_ ? group_slot_[size_t(grp)] : route_slot_[size_t(first)] / K;
  // Workers own contiguous item ranges, so this thread's later calls are known:
  // prefetch the one about kPrefetchBytes ahead.
  const int cpi = plan_.calls1();
  const int64_t call = item * cpi;
  const void* pf0 = pass1_call(call + ahead1_);
  const void* pf1 = pass1_call(call + 1 + ahead1_);
  const plan::GateUp form = plan_.gate_up;
  if (form == plan::GateUp::interleaved) {
    const plan::Call c = plan_.call1(blk, 0);
    mm_[c.proj].run(w_[c.proj][size_t(e)], c.r0, c.rows, cnt, group_x(0), xslot, both, mscratch, pf0);
    for (int64_t i = 0; i < int64_t(cnt) * n; ++i) {
      gate[i] = both[2 * i];
      up[i] = both[2 * i + 1];
    }
  } else {
    const plan::Call cg = plan_.call1(blk, 0), cu = plan_.call1(blk, 1);
    mm_[cg.proj].run(w_[cg.proj][size_t(e)], cg.r0, cg.rows, cnt, group_x(0), xslot, gate, mscratch, pf0);
    mm_[cu.proj].run(w_[cu.proj][size_t(e)], cu.r0, cu.rows, cnt, group_x(x_sets_ - 1), xslot, up, mscratch,
                     pf1);
  }
  // Gate's and up's biases, from element j0: rows j0 + i and I + j0 + i of gate_up
  // (concatenated), 2 (j0 + i) and 2 (j0 + i) + 1 (interleaved), or j0 + i of each bank.
  const uint16_t* bias_g = bias_[plan::kGate][size_t(e)];
  const uint16_t* bias_u = plan_.separate() ? bias_[plan::kUp][size_t(e)] : bias_g;
  int64_t bstep = 1;
  if (bias_g) bias_g += form == plan::GateUp::interleaved ? 2 * j0 : j0;
  if (bias_u) {
    bias_u += form == plan::GateUp::interleaved ? 2 * j0 + 1 : form == plan::GateUp::concat ? I + j0 : j0;
  }
  if (form == plan::GateUp::interleaved) bstep = 2;
  uint16_t gq[formats::kDsActBlock];  // ds_fp4: this item's block of g, bf16
  for (int32_t m = 0; m < cnt; ++m) {
    const int32_t r = first + m;
    const float rw = cfg_.weight_on_input ? weights_[route_slot_[size_t(r)]] : 1.0f;
    // This route's slot of g.
    const jit::XPrep::Slot gslot = dn.xprep().group_slot(group_slot_[size_t(grp)], cnt, m);
    float* gt = gate + int64_t(m) * n;  // this route's gate and up values, updated in place
    float* ut = up + int64_t(m) * n;
    if (cfg_.weight_on_input) {
      for (int64_t i = 0; i < n; ++i) {
        gt[i] *= rw;
        ut[i] *= rw;
      }
    }
    if (bias_g)
      for (int64_t i = 0; i < n; ++i) gt[i] += formats::bf16_to_f32(bias_g[bstep * i]);
    if (bias_u)
      for (int64_t i = 0; i < n; ++i) ut[i] += formats::bf16_to_f32(bias_u[bstep * i]);
    if (!ds_) {
      activate_bf16_n(cfg_.act, gt, ut, gt, n, ctx_->isa());
      dn.x_store_n(g_grp_.data(), gslot, j0, gt, n);
      continue;
    }
    activate_bf16_in_n(cfg_.act, gt, ut, gt, n, ctx_->isa());
    for (int64_t i = 0; i < n; ++i) gq[i] = formats::f32_to_bf16(gt[i]);  // exact: gt holds bf16 values
    // j0 is a multiple of 128 and n <= 128: gq is exactly one 128-block of g.
    ds_act_roundtrip_n(gq, n, gq, ctx_->isa());
    for (int64_t i = 0; i < n; ++i) gt[i] = formats::bf16_to_f32(gq[i]);
    dn.x_store_n(g_grp_.data(), gslot, j0, gt, n);
  }
}

// Pass 2 item: rows [h0, h0 + n) of y for every token. Groups run in ascending
// expert id, so each token's private fp32 sum follows the canonical order.
void MoeLayer::pass2(int64_t item, int worker) {
  const int64_t H = cfg_.hidden;
  const int64_t rb2 = plan_.rows2;
  const int64_t h0 = item * rb2;
  const int64_t n = std::min<int64_t>(rb2, H - h0);
  const int32_t K = cfg_.top_k;
  const Matmul& dn = mm_[plan::kDown];
  float* scratch = worker_scratch_.data() + size_t(worker) * worker_floats_;
  float* acc = scratch;                                      // [tokens][n]
  float* dot = acc + size_t(cfg_.max_tokens) * size_t(rb2);  // [group size][n]
  float* mscratch = dot + size_t(plan_.group_max) * size_t(rb2);
  std::fill(acc, acc + int64_t(tokens_) * n, 0.0f);
  for (int32_t grp = 0; grp < groups_; ++grp) {
    const int32_t first = group_begin_[size_t(grp)];
    const int32_t cnt = group_size(grp);
    const int32_t e = group_expert(grp);
    const void* pf = pass2_call(item * groups_ + grp + ahead2_);
    dn.run(w_[plan::kDown][size_t(e)], h0, n, cnt, g_grp_.data(), group_slot_[size_t(grp)], dot, mscratch,
           pf);
    const uint16_t* bias = bias_[plan::kDown][size_t(e)];
    for (int32_t m = 0; m < cnt; ++m) {
      const int32_t slot = route_slot_[size_t(first + m)];
      const float w = cfg_.weight_on_input ? 1.0f : weights_[slot];
      float* a = acc + int64_t(slot / K) * n;
      const float* d = dot + int64_t(m) * n;
      if (ds_) {  // each weighted route output is rounded to bf16 before the sum
        for (int64_t i = 0; i < n; ++i) {
          const float v = bias ? d[i] + formats::bf16_to_f32(bias[h0 + i]) : d[i];
          a[i] += formats::round_bf16(w * v);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) {
          const float v = bias ? d[i] + formats::bf16_to_f32(bias[h0 + i]) : d[i];
          a[i] += w * v;
        }
      }
    }
  }
  for (int32_t t = 0; t < tokens_; ++t) {
    const float* a = acc + int64_t(t) * n;
    if (cfg_.out_dtype == MOEJIT_DTYPE_BF16) {
      uint16_t* yt = static_cast<uint16_t*>(y_) + int64_t(t) * H + h0;
      for (int64_t i = 0; i < n; ++i) yt[i] = formats::f32_to_bf16(a[i]);
    } else {
      std::memcpy(static_cast<float*>(y_) + int64_t(t) * H + h0, a, size_t(n) * 4);
    }
  }
}

moejit_moe_stats MoeLayer::stats() const {
  moejit_moe_stats s{};
  s.struct_size = sizeof(s);
  s.calls = calls_.load();
  s.routes = routes_.load();
  s.unique_experts = unique_.load();
  s.weight_bytes_read = bytes_.load();
  return s;
}

}  // namespace moejit
