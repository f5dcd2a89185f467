#include "runtime/linear.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "runtime/ds_round.h"

namespace moejit {

moejit_status LinearLayer::create(std::shared_ptr<Context> ctx, const LinearConfig& cfg,
                                  const moejit_matrix& w, std::unique_ptr<LinearLayer>* out,
                                  std::string* err) {
  std::unique_ptr<LinearLayer> l(new (std::nothrow) LinearLayer());
  if (!l) return MOEJIT_OUT_OF_MEMORY;
  l->ctx_ = std::move(ctx);
  l->cfg_ = cfg;
  plan::Target target;
  target.isa = l->ctx_->isa();
  target.threads = l->ctx_->num_threads();
  target.all_tiles = l->ctx_->all_tiles();
  target.tile_emu = l->ctx_->tile_emu();
  const plan::LinearPlan p = plan::linear_plan({cfg.format, cfg.scale_dtype, cfg.group}, cfg.rows, cfg.cols,
                                               cfg.max_tokens, w.scale_row_stride, target);
  const moejit_status st = l->mm_.init(p.weight, err);
  if (st != MOEJIT_OK) return st;
  l->w_ = {w.data, w.scales, w.row_scales, p.weight.layout.scale_stride};
  l->bias_ = w.bias;
  l->rb_ = p.rows_per_item;
  l->nblk_ = p.items;
  try {
    l->x_prep_.assign(l->mm_.x_buffer_bytes(cfg.max_tokens), 0);
    if (formats::info(cfg.format).ds_numerics) l->x_rt_.assign(size_t(cfg.cols), 0);
    l->worker_floats_ =
        aligned_elems<float>(l->mm_.scratch_floats() + size_t(cfg.max_tokens) * size_t(l->rb_) + 16);
    l->worker_scratch_.assign(l->worker_floats_ * size_t(l->ctx_->num_threads()), 0.0f);
  } catch (const std::bad_alloc&) {
    return MOEJIT_OUT_OF_MEMORY;
  }
  l->job_.run = &LinearLayer::run_item;
  l->job_.self = l.get();
  l->job_.num_phases = 1;
  *out = std::move(l);
  return MOEJIT_OK;
}

LinearLayer::~LinearLayer() {
  if (ctx_) ctx_->wait_if_owner(this);
}

moejit_status LinearLayer::submit(int32_t T, const uint16_t* x, void* y, bool sync) {
  if (!ctx_->try_acquire(this)) return MOEJIT_BUSY;
  tokens_ = T;
  y_ = y;
  for (int32_t t = 0; t < T; ++t) {
    const uint16_t* xt = x + int64_t(t) * cfg_.cols;
    if (!x_rt_.empty()) {  // ds_fp4
      ds_act_roundtrip_n(xt, cfg_.cols, x_rt_.data(), ctx_->isa());
      xt = x_rt_.data();
    }
    mm_.x_prepare(x_prep_.data(), mm_.xprep().group_slot(0, T, t), xt);
  }
  job_.counts[0] = nblk_;
  ctx_->launch(&job_, sync);
  return MOEJIT_OK;
}

void LinearLayer::run_item(void* self, int, int64_t item, int worker) {
  auto* l = static_cast<LinearLayer*>(self);
  const int64_t r0 = item * l->rb_;
  const int64_t n = std::min<int64_t>(l->rb_, l->cfg_.rows - r0);
  float* dot = l->worker_scratch_.data() + size_t(worker) * l->worker_floats_;
  float* mscratch = dot + size_t(l->cfg_.max_tokens) * size_t(l->rb_);
  l->mm_.run(l->w_, r0, n, l->tokens_, l->x_prep_.data(), 0, dot, mscratch);
  const int64_t rows = l->cfg_.rows;
  for (int32_t t = 0; t < l->tokens_; ++t) {
    for (int64_t i = 0; i < n; ++i) {
      float v = dot[int64_t(t) * n + i];
      if (l->bias_) v += formats::bf16_to_f32(l->bias_[r0 + i]);
      if (l->cfg_.out_dtype == MOEJIT_DTYPE_BF16)
        static_cast<uint16_t*>(l->y_)[int64_t(t) * rows + r0 + i] = formats::f32_to_bf16(v);
      else
        static_cast<float*>(l->y_)[int64_t(t) * rows + r0 + i] = v;
    }
  }
}

}  // namespace moejit
