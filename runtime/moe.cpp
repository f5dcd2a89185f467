#include "runtime/moe.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

#include "runtime/ds_round.h"

namespace moejit {

using formats::Format;

namespace {

formats::Layout make_layout(const MoeConfig& c, int64_t rows, int64_t k, int64_t stride) {
  formats::Layout l;
  l.format = c.format;
  l.scale_dtype = c.scale_dtype;
  l.group = formats::default_group(c.format, c.group);
  l.rows = rows;
  l.k = k;
  const int64_t cols = formats::scale_cols(c.format, l.group, k);
  l.scale_stride = stride > 0 ? stride : cols;
  return l;
}

}  // namespace

moejit_status MoeLayer::create(std::shared_ptr<Context> ctx, const MoeConfig& cfg,
                               const moejit_matrix* gate_up, const moejit_matrix* down,
                               std::unique_ptr<MoeLayer>* out, std::string* err) {
  std::unique_ptr<MoeLayer> m(new (std::nothrow) MoeLayer());
  if (!m) return MOEJIT_OUT_OF_MEMORY;
  m->ctx_ = std::move(ctx);
  m->cfg_ = cfg;
  const int64_t H = cfg.hidden, I = cfg.intermediate, E = cfg.experts;
  const jit::Isa isa = m->ctx_->isa();
  m->ds_ = cfg.format == Format::ds_fp4;
  // ds_fp4 round-trips g per 128 elements of I: each pass-1 item owns one such block.
  if (m->ds_) m->rb1_ = int(formats::kDsActBlock);

  m->mm_gu_.init(isa, make_layout(cfg, 2 * I, H, gate_up[0].scale_row_stride));
  m->mm_dn_.init(isa, make_layout(cfg, H, I, down[0].scale_row_stride));
  m->gu_.resize(size_t(E));
  m->dn_.resize(size_t(E));
  m->gu_bias_.resize(size_t(E));
  m->dn_bias_.resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) {
    // Each expert's own stride: explicit, or dense (0) for its own scale tensor.
    const formats::Layout& lg = m->mm_gu_.layout();
    const formats::Layout& ld = m->mm_dn_.layout();
    const int64_t sg = gate_up[e].scale_row_stride > 0 ? gate_up[e].scale_row_stride
                                                       : formats::scale_cols(lg.format, lg.group, lg.k);
    const int64_t sd = down[e].scale_row_stride > 0 ? down[e].scale_row_stride
                                                    : formats::scale_cols(ld.format, ld.group, ld.k);
    m->gu_[size_t(e)] = {gate_up[e].data, gate_up[e].scales, gate_up[e].row_scales, sg};
    m->dn_[size_t(e)] = {down[e].data, down[e].scales, down[e].row_scales, sd};
    m->gu_bias_[size_t(e)] = gate_up[e].bias;
    m->dn_bias_[size_t(e)] = down[e].bias;
  }

  // Row blocks: long contiguous reads per call (64 rows of H measured ~10% faster
  // than 16 for bf16 with one thread), but pass 2 keeps >= 4 items per worker.
  const int64_t min_items = 4 * int64_t(m->ctx_->num_threads());
  while (m->rb2_ > 16 && (H + m->rb2_ - 1) / m->rb2_ < min_items) m->rb2_ /= 2;
  m->nblk1_ = (I + m->rb1_ - 1) / m->rb1_;
  m->nblk2_ = (H + m->rb2_ - 1) / m->rb2_;
  for (int64_t j = 0; j < m->nblk1_; ++j) {
    const int64_t j0 = j * m->rb1_, n = std::min<int64_t>(m->rb1_, I - j0);
    if (cfg.interleaved) {
      m->mm_gu_.plan_rows(2 * j0, 2 * n);
    } else {
      m->mm_gu_.plan_rows(j0, n);
      m->mm_gu_.plan_rows(I + j0, n);
    }
  }
  for (int64_t b = 0; b < m->nblk2_; ++b) {
    const int64_t h0 = b * m->rb2_;
    m->mm_dn_.plan_rows(h0, std::min<int64_t>(m->rb2_, H - h0));
  }
  m->dedup_ = !(m->ctx_->flags() & MOEJIT_CONTEXT_NO_DEDUP) && m->ctx_->dedup_enabled();
  m->debug_ = m->ctx_->dedup_debug();
  // Dedup groups hold up to max_tokens * top_k routes; kernels cover up to the
  // register budget of tokens per call and are tiled beyond it.
  const int group_max = m->dedup_ ? cfg.max_tokens * cfg.top_k : 1;
  m->group_max_ = group_max;
  moejit_status st = m->mm_gu_.resolve(group_max, err);
  if (st == MOEJIT_OK) st = m->mm_dn_.resolve(group_max, err);
  if (st != MOEJIT_OK) return st;

  // Calls to look ahead for the prefetch (each call reads one row block of one expert).
  const int64_t b1 = m->mm_gu_.call_bytes(cfg.interleaved ? 2 * m->rb1_ : m->rb1_);
  const int64_t b2 = m->mm_dn_.call_bytes(m->rb2_);
  const bool far = jit::streams_with_prefetch(int32_t(m->mm_gu_.layout().format));
  m->ahead1_ = far ? std::max<int64_t>(1, (kPrefetchBytes + b1 - 1) / b1) : 1;
  m->ahead2_ = far ? std::max<int64_t>(1, (kPrefetchBytes + b2 - 1) / b2) : 1;
  m->xelem_ = m->mm_gu_.x_elem_bytes();
  const size_t T = size_t(cfg.max_tokens), K = size_t(cfg.top_k), R = T * K;
  const size_t gmax = size_t(group_max);
  try {
    m->x_prep_.assign(T * size_t(m->mm_gu_.x_stride()) * m->xelem_, 0);
    if (m->ds_) m->x_rt_.assign(size_t(H), 0);
    if (m->dedup_) m->x_grp_.assign(R * size_t(m->mm_gu_.x_stride()) * m->xelem_, 0);
    m->g_grp_.assign(R * size_t(m->mm_dn_.x_stride()) * m->xelem_, 0);
    // pass 1: gate, up (or both interleaved) for a group; pass 2: dot for a group + per-token sums.
    const size_t p1 = 4 * gmax * size_t(m->rb1_);
    const size_t p2 = gmax * size_t(m->rb2_) + T * size_t(m->rb2_);
    m->worker_floats_ =
        std::max(m->mm_gu_.scratch_floats(), m->mm_dn_.scratch_floats()) + std::max(p1, p2) + 16;
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

uint64_t MoeLayer::expert_bytes() const {
  auto bytes = [](const formats::Layout& l) {
    int64_t b = l.rows * formats::row_bytes(l.format, l.k);
    b += formats::scale_rows(l.format, l.rows) * formats::scale_cols(l.format, l.group, l.k) *
         formats::scale_elem_bytes(l.format, l.scale_dtype);
    if (formats::has_row_scales(l.format)) b += l.rows * 4;
    return uint64_t(b);
  };
  return bytes(mm_gu_.layout()) + bytes(mm_dn_.layout());
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
  const int64_t xs = mm_gu_.x_stride();
  for (int32_t t = 0; t < T; ++t) {
    const uint16_t* xt = x + int64_t(t) * cfg_.hidden;
    if (ds_) {
      ds_act_roundtrip_n(xt, cfg_.hidden, x_rt_.data(), ctx_->isa());
      xt = x_rt_.data();
    }
    mm_gu_.x_prepare(x_prep_.data() + size_t(t) * size_t(xs) * xelem_, xt);
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
    const size_t vbytes = size_t(xs) * xelem_;
    for (int32_t r = 0; r < nact; ++r)
      std::memcpy(x_grp_.data() + size_t(r) * vbytes,
                  x_prep_.data() + size_t(route_slot_[size_t(r)] / K) * vbytes, vbytes);
  } else {
    for (int32_t r = 0; r < nact; ++r) group_begin_[size_t(++groups_)] = r + 1;
  }

  const uint64_t streamed = uint64_t(dedup_ ? unique : nact) * expert_bytes();
  calls_.fetch_add(1, std::memory_order_relaxed);
  routes_.fetch_add(uint64_t(nact), std::memory_order_relaxed);
  unique_.fetch_add(uint64_t(unique), std::memory_order_relaxed);
  bytes_.fetch_add(streamed, std::memory_order_relaxed);
  if (debug_) {
    std::fprintf(stderr, "moejit: moe call: %d tokens, %d routes, %d experts, reuse %.2f, %s\n", T, nact,
                 unique, unique ? double(nact) / unique : 0.0, dedup_ ? "dedup" : "no dedup");
  }

  job_.counts[0] = int64_t(groups_) * nblk1_;
  job_.counts[1] = nblk2_;
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

// First weight row of pass-1 call number `call` (gate and up calls alternate
// when concatenated); nullptr past the end.
const void* MoeLayer::pass1_call(int64_t call) const {
  const int cpi = cfg_.interleaved ? 1 : 2;
  const int64_t item = call / cpi;
  if (item >= int64_t(groups_) * nblk1_) return nullptr;
  const int64_t j0 = (item % nblk1_) * rb1_;
  const formats::MatrixRef& w = gu_[size_t(group_expert(int32_t(item / nblk1_)))];
  if (cfg_.interleaved) return mm_gu_.row_ptr(w, 2 * j0);
  return mm_gu_.row_ptr(w, call % 2 == 0 ? j0 : cfg_.intermediate + j0);
}

// First weight row of pass-2 call number `call` (item-major, then group).
const void* MoeLayer::pass2_call(int64_t call) const {
  if (groups_ == 0) return nullptr;
  const int64_t item = call / groups_;
  if (item >= nblk2_) return nullptr;
  return mm_dn_.row_ptr(dn_[size_t(group_expert(int32_t(call % groups_)))], item * rb2_);
}

// Pass 1 item: one group's rows [j0, j0 + n) of gate and up for all of its routes.
void MoeLayer::pass1(int64_t item, int worker) {
  const int64_t I = cfg_.intermediate;
  const int32_t grp = int32_t(item / nblk1_);
  const int64_t j0 = (item % nblk1_) * rb1_;
  const int64_t n = std::min<int64_t>(rb1_, I - j0);
  const int32_t first = group_begin_[size_t(grp)];
  const int32_t cnt = group_size(grp);
  const int32_t e = group_expert(grp);
  const int32_t K = cfg_.top_k;
  const size_t xvec = size_t(mm_gu_.x_stride()) * xelem_;
  float* scratch = worker_scratch_.data() + size_t(worker) * worker_floats_;
  float* gate = scratch;                       // [cnt][n]
  float* up = gate + size_t(cnt) * size_t(n);  // [cnt][n]
  float* both = up + size_t(cnt) * size_t(n);  // [cnt][2n] interleaved rows
  float* mscratch = gate + 4 * size_t(cnt) * size_t(rb1_);
  const void* xg =
      dedup_ ? static_cast<const void*>(x_grp_.data() + size_t(first) * xvec)
             : static_cast<const void*>(x_prep_.data() + size_t(route_slot_[size_t(first)] / K) * xvec);
  const formats::MatrixRef& w = gu_[size_t(e)];
  // Workers own contiguous item ranges, so this thread's later calls are known:
  // prefetch the one about kPrefetchBytes ahead.
  const int cpi = cfg_.interleaved ? 1 : 2;
  const int64_t call = item * cpi;
  const void* pf0 = pass1_call(call + ahead1_);
  const void* pf1 = pass1_call(call + 1 + ahead1_);
  if (cfg_.interleaved) {
    mm_gu_.run(w, 2 * j0, 2 * n, cnt, xg, both, mscratch, pf0);
    for (int64_t i = 0; i < int64_t(cnt) * n; ++i) {
      gate[i] = both[2 * i];
      up[i] = both[2 * i + 1];
    }
  } else {
    mm_gu_.run(w, j0, n, cnt, xg, gate, mscratch, pf0);
    mm_gu_.run(w, I + j0, n, cnt, xg, up, mscratch, pf1);
  }
  const uint16_t* bias = gu_bias_[size_t(e)];
  const size_t gvec = size_t(mm_dn_.x_stride()) * xelem_;
  uint16_t gq[formats::kDsActBlock];  // ds_fp4: this item's block of g, bf16
  for (int32_t m = 0; m < cnt; ++m) {
    const int32_t r = first + m;
    const float rw = cfg_.weight_on_input ? weights_[route_slot_[size_t(r)]] : 1.0f;
    void* g = g_grp_.data() + size_t(r) * gvec;
    float* gt = gate + int64_t(m) * n;  // this route's gate and up values, updated in place
    float* ut = up + int64_t(m) * n;
    if (cfg_.weight_on_input) {
      for (int64_t i = 0; i < n; ++i) {
        gt[i] *= rw;
        ut[i] *= rw;
      }
    }
    if (bias) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t rg = cfg_.interleaved ? 2 * (j0 + i) : j0 + i;
        const int64_t ru = cfg_.interleaved ? 2 * (j0 + i) + 1 : I + j0 + i;
        gt[i] += formats::bf16_to_f32(bias[rg]);
        ut[i] += formats::bf16_to_f32(bias[ru]);
      }
    }
    if (!ds_) {
      activate_bf16_n(cfg_.act, gt, ut, gt, n, ctx_->isa());
      mm_dn_.x_store_n(g, j0, gt, n);
      continue;
    }
    activate_bf16_in_n(cfg_.act, gt, ut, gt, n, ctx_->isa());
    for (int64_t i = 0; i < n; ++i) gq[i] = formats::f32_to_bf16(gt[i]);  // exact: gt holds bf16 values
    // j0 is a multiple of 128 and n <= 128: gq is exactly one 128-block of g.
    ds_act_roundtrip_n(gq, n, gq, ctx_->isa());
    for (int64_t i = 0; i < n; ++i) gt[i] = formats::bf16_to_f32(gq[i]);
    mm_dn_.x_store_n(g, j0, gt, n);
  }
}

// Pass 2 item: rows [h0, h0 + n) of y for every token. Groups run in ascending
// expert id, so each token's private fp32 sum follows the canonical order.
void MoeLayer::pass2(int64_t item, int worker) {
  const int64_t H = cfg_.hidden;
  const int64_t h0 = item * rb2_;
  const int64_t n = std::min<int64_t>(rb2_, H - h0);
  const int32_t K = cfg_.top_k;
  float* scratch = worker_scratch_.data() + size_t(worker) * worker_floats_;
  float* acc = scratch;                                       // [tokens][n]
  float* dot = acc + size_t(cfg_.max_tokens) * size_t(rb2_);  // [group size][n]
  float* mscratch = dot + size_t(group_max_) * size_t(rb2_);
  std::fill(acc, acc + int64_t(tokens_) * n, 0.0f);
  const size_t gvec = size_t(mm_dn_.x_stride()) * xelem_;
  for (int32_t grp = 0; grp < groups_; ++grp) {
    const int32_t first = group_begin_[size_t(grp)];
    const int32_t cnt = group_size(grp);
    const int32_t e = group_expert(grp);
    const void* pf = pass2_call(item * groups_ + grp + ahead2_);
    mm_dn_.run(dn_[size_t(e)], h0, n, cnt, g_grp_.data() + size_t(first) * gvec, dot, mscratch, pf);
    const uint16_t* bias = dn_bias_[size_t(e)];
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
