#include "runtime/moe.h"

#include <algorithm>
#include <cstring>
#include <new>

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

  m->mm_gu_.init(isa, make_layout(cfg, 2 * I, H, gate_up[0].scale_row_stride));
  m->mm_dn_.init(isa, make_layout(cfg, H, I, down[0].scale_row_stride));
  m->gu_.resize(size_t(E));
  m->dn_.resize(size_t(E));
  m->gu_bias_.resize(size_t(E));
  m->dn_bias_.resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) {
    m->gu_[size_t(e)] = {gate_up[e].data, gate_up[e].scales, gate_up[e].row_scales,
                         m->mm_gu_.layout().scale_stride};
    m->dn_[size_t(e)] = {down[e].data, down[e].scales, down[e].row_scales, m->mm_dn_.layout().scale_stride};
    if (gate_up[e].scale_row_stride > 0) m->gu_[size_t(e)].scale_stride = gate_up[e].scale_row_stride;
    if (down[e].scale_row_stride > 0) m->dn_[size_t(e)].scale_stride = down[e].scale_row_stride;
    m->gu_bias_[size_t(e)] = gate_up[e].bias;
    m->dn_bias_[size_t(e)] = down[e].bias;
  }

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
  moejit_status st = m->mm_gu_.resolve(1, err);
  if (st == MOEJIT_OK) st = m->mm_dn_.resolve(1, err);
  if (st != MOEJIT_OK) return st;

  m->xelem_ = m->mm_gu_.x_elem_bytes();
  const size_t T = size_t(cfg.max_tokens), K = size_t(cfg.top_k);
  try {
    m->x_prep_.assign(T * size_t(m->mm_gu_.x_stride()) * m->xelem_, 0);
    m->g_prep_.assign(T * K * size_t(m->mm_dn_.x_stride()) * m->xelem_, 0);
    m->worker_floats_ = std::max(m->mm_gu_.scratch_floats(), m->mm_dn_.scratch_floats()) +
                        4 * size_t(m->rb1_) + 2 * size_t(m->rb2_) + 16;
    m->worker_scratch_.assign(m->worker_floats_ * size_t(m->ctx_->num_threads()), 0.0f);
    m->act_slot_.assign(T * K, 0);
    m->order_.assign(T * K, 0);
    m->order_count_.assign(T, 0);
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
                               void* y) {
  if (!ctx_->try_acquire(this)) return MOEJIT_BUSY;
  const int K = cfg_.top_k;
  tokens_ = T;
  ids_ = ids;
  weights_ = weights;
  y_ = y;

  // Prepared activations (integer work only: widening bf16 is exact).
  const int64_t xs = mm_gu_.x_stride();
  for (int32_t t = 0; t < T; ++t)
    mm_gu_.x_prepare(x_prep_.data() + size_t(t) * size_t(xs) * xelem_, x + int64_t(t) * cfg_.hidden);

  // Routes: active slots, and each token's slots in canonical order
  // (ascending expert id, ties by route index).
  int32_t nact = 0;
  uint64_t unique = 0;
  for (int32_t t = 0; t < T; ++t) {
    int32_t* ord = order_.data() + size_t(t) * size_t(K);
    int32_t cnt = 0;
    for (int k = 0; k < K; ++k) {
      const int32_t e = ids[int64_t(t) * K + k];
      if (e < 0) continue;
      const int32_t slot = t * K + k;
      act_slot_[size_t(nact++)] = slot;
      int32_t pos = cnt++;
      while (pos > 0 && ids[ord[pos - 1]] > e) {
        ord[pos] = ord[pos - 1];
        --pos;
      }
      ord[pos] = slot;
    }
    order_count_[size_t(t)] = cnt;
  }
  // Distinct experts of this call (stats only): a scan over T * top_k routes, no allocation.
  for (int32_t a = 0; a < nact; ++a) {
    const int32_t e = ids[act_slot_[size_t(a)]];
    bool dup = false;
    for (int32_t b = 0; b < a && !dup; ++b) dup = ids[act_slot_[size_t(b)]] == e;
    unique += dup ? 0 : 1;
  }
  calls_.fetch_add(1, std::memory_order_relaxed);
  routes_.fetch_add(uint64_t(nact), std::memory_order_relaxed);
  unique_.fetch_add(unique, std::memory_order_relaxed);
  bytes_.fetch_add(uint64_t(nact) * expert_bytes(), std::memory_order_relaxed);

  job_.counts[0] = int64_t(nact) * nblk1_;
  job_.counts[1] = nblk2_;
  ctx_->launch(&job_);
  return MOEJIT_OK;
}

void MoeLayer::run_item(void* self, int phase, int64_t item, int worker) {
  auto* m = static_cast<MoeLayer*>(self);
  if (phase == 0)
    m->pass1(item, worker);
  else
    m->pass2(item, worker);
}

void MoeLayer::pass1(int64_t item, int worker) {
  const int64_t I = cfg_.intermediate;
  const int32_t slot = act_slot_[size_t(item / nblk1_)];
  const int64_t j0 = (item % nblk1_) * rb1_;
  const int64_t n = std::min<int64_t>(rb1_, I - j0);
  const int32_t t = slot / cfg_.top_k;
  const int32_t e = ids_[slot];
  float* scratch = worker_scratch_.data() + size_t(worker) * worker_floats_;
  float* gate = scratch;
  float* up = gate + rb1_;
  float* both = up + rb1_;  // 2 * rb1 for interleaved rows
  float* mscratch = both + 2 * rb1_;
  const void* xt = x_prep_.data() + size_t(t) * size_t(mm_gu_.x_stride()) * xelem_;
  const formats::MatrixRef& w = gu_[size_t(e)];
  // The next item of this worker is item + 1 (contiguous ranges): prefetch its first rows.
  const void* next_item = nullptr;
  if (item + 1 < job_.counts[0]) {
    const int32_t ns = act_slot_[size_t((item + 1) / nblk1_)];
    const int64_t nj0 = ((item + 1) % nblk1_) * rb1_;
    next_item = mm_gu_.row_ptr(gu_[size_t(ids_[ns])], cfg_.interleaved ? 2 * nj0 : nj0);
  }
  if (cfg_.interleaved) {
    mm_gu_.run(w, 2 * j0, 2 * n, 1, xt, both, mscratch, next_item);
    for (int64_t i = 0; i < n; ++i) {
      gate[i] = both[2 * i];
      up[i] = both[2 * i + 1];
    }
  } else {
    mm_gu_.run(w, j0, n, 1, xt, gate, mscratch, mm_gu_.row_ptr(w, I + j0));
    mm_gu_.run(w, I + j0, n, 1, xt, up, mscratch, next_item);
  }
  const float rw = cfg_.weight_on_input ? weights_[slot] : 1.0f;
  const uint16_t* bias = gu_bias_[size_t(e)];
  void* g = g_prep_.data() + size_t(slot) * size_t(mm_dn_.x_stride()) * xelem_;
  for (int64_t i = 0; i < n; ++i) {
    float gv = gate[i], uv = up[i];
    if (cfg_.weight_on_input) {
      gv *= rw;
      uv *= rw;
    }
    if (bias) {
      const int64_t rg = cfg_.interleaved ? 2 * (j0 + i) : j0 + i;
      const int64_t ru = cfg_.interleaved ? 2 * (j0 + i) + 1 : I + j0 + i;
      gv += formats::bf16_to_f32(bias[rg]);
      uv += formats::bf16_to_f32(bias[ru]);
    }
    mm_dn_.x_store(g, j0 + i, formats::round_bf16(activate(cfg_.act, gv, uv)));
  }
}

void MoeLayer::pass2(int64_t item, int worker) {
  const int64_t H = cfg_.hidden;
  const int64_t h0 = item * rb2_;
  const int64_t n = std::min<int64_t>(rb2_, H - h0);
  float* scratch = worker_scratch_.data() + size_t(worker) * worker_floats_;
  float* dot = scratch;
  float* acc = dot + rb2_;
  float* mscratch = acc + rb2_;
  // Calls run token by token, routes in canonical order; each prefetches the next.
  auto first_route = [&](int32_t t) -> int32_t {
    for (; t < tokens_; ++t)
      if (order_count_[size_t(t)] > 0) return t;
    return -1;
  };
  const int32_t t_first = first_route(0);
  const void* next_item = nullptr;
  if (item + 1 < nblk2_ && t_first >= 0)
    next_item = mm_dn_.row_ptr(dn_[size_t(ids_[order_[size_t(t_first) * size_t(cfg_.top_k)]])], h0 + rb2_);
  for (int32_t t = 0; t < tokens_; ++t) {
    for (int64_t i = 0; i < n; ++i) acc[i] = 0.0f;
    const int32_t* ord = order_.data() + size_t(t) * size_t(cfg_.top_k);
    const int32_t cnt = order_count_[size_t(t)];
    for (int32_t j = 0; j < cnt; ++j) {
      const int32_t slot = ord[j];
      const int32_t e = ids_[slot];
      const void* g = g_prep_.data() + size_t(slot) * size_t(mm_dn_.x_stride()) * xelem_;
      const void* next = next_item;
      if (j + 1 < cnt) {
        next = mm_dn_.row_ptr(dn_[size_t(ids_[ord[j + 1]])], h0);
      } else if (const int32_t tn = first_route(t + 1); tn >= 0) {
        next = mm_dn_.row_ptr(dn_[size_t(ids_[order_[size_t(tn) * size_t(cfg_.top_k)]])], h0);
      }
      mm_dn_.run(dn_[size_t(e)], h0, n, 1, g, dot, mscratch, next);
      const float w = cfg_.weight_on_input ? 1.0f : weights_[slot];
      const uint16_t* bias = dn_bias_[size_t(e)];
      for (int64_t i = 0; i < n; ++i) {
        const float d = bias ? dot[i] + formats::bf16_to_f32(bias[h0 + i]) : dot[i];
        acc[i] += w * d;
      }
    }
    if (cfg_.out_dtype == MOEJIT_DTYPE_BF16) {
      uint16_t* yt = static_cast<uint16_t*>(y_) + int64_t(t) * H + h0;
      for (int64_t i = 0; i < n; ++i) yt[i] = formats::f32_to_bf16(acc[i]);
    } else {
      float* yt = static_cast<float*>(y_) + int64_t(t) * H + h0;
      for (int64_t i = 0; i < n; ++i) yt[i] = acc[i];
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
