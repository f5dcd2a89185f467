// Dense linear: y[T, rows] = x[T, cols] W^T + bias, row blocks across the pool.
// ds_fp4 ("mxfp4 weights with DeepSeek activation numerics") round-trips each
// token's x through e4m3 per 128 columns first, as the MoE layer does before
// pass 1; nothing else differs from mxfp4.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "moejit.h"
#include "runtime/aligned_buffer.h"
#include "runtime/context.h"
#include "runtime/matmul.h"
#include "runtime/plan.h"

namespace moejit {

struct LinearConfig {
  formats::Format format = formats::Format::bf16;
  formats::ScaleDtype scale_dtype = formats::ScaleDtype::bf16;
  int32_t group = 0;
  int32_t rows = 0, cols = 0, max_tokens = 0;
  moejit_dtype out_dtype = MOEJIT_DTYPE_BF16;
};

class LinearLayer {
 public:
  static moejit_status create(std::shared_ptr<Context> ctx, const LinearConfig& cfg, const moejit_matrix& w,
                              std::unique_ptr<LinearLayer>* out, std::string* err);
  ~LinearLayer();
  // `sync`: the caller is about to wait, so it may run a share of the work itself.
  moejit_status submit(int32_t num_tokens, const uint16_t* x, void* y, bool sync);
  Context& context() { return *ctx_; }
  const LinearConfig& config() const { return cfg_; }
  const Matmul& matmul() const { return mm_; }  // white-box tests

 private:
  LinearLayer() = default;
  static void run_item(void* self, int phase, int64_t item, int worker);

  std::shared_ptr<Context> ctx_;
  LinearConfig cfg_;
  formats::MatrixRef w_{};
  const uint16_t* bias_ = nullptr;
  Matmul mm_;
  int64_t rb_ = 16;  // rows per item (runtime/plan.h)
  int64_t nblk_ = 0;
  AlignedBuffer<uint8_t> x_prep_;
  std::vector<uint16_t> x_rt_;  // ds_fp4: [cols], one token's x after the e4m3 round trip
  AlignedBuffer<float> worker_scratch_;
  size_t worker_floats_ = 0;
  Job job_;
  int32_t tokens_ = 0;
  void* y_ = nullptr;
};

}  // namespace moejit

struct moejit_linear {
  std::unique_ptr<moejit::LinearLayer> impl;
};
