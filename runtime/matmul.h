// One projection geometry ([rows, K] in one format) with its kernels resolved
// at construction: run() only indexes a table and calls.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "jit/gemv.h"
#include "moejit.h"

namespace moejit {

class Matmul {
 public:
  void init(jit::Isa isa, const formats::Layout& layout) {
    isa_ = isa;
    layout_ = layout;
  }
  // Records that run() will be called on rows [r0, r0 + n).
  void plan_rows(int64_t r0, int64_t n);
  // Generates (or finds in the cache) every kernel the planned rows need, for
  // 1..max_tokens tokens per kernel call.
  moejit_status resolve(int max_tokens, std::string* err);

  // y[t * n + i] = dot(row r0 + i, x[t]) for t < tokens, i < n. x holds `tokens`
  // prepared vectors of x_stride() elements. `scratch` holds scratch_floats().
  void run(const formats::MatrixRef& m, int64_t r0, int64_t n, int tokens, const void* x, float* y,
           float* scratch) const;

  int64_t x_stride() const { return jit::x_stride(layout_.k); }
  bool x_bf16() const { return isa_ != jit::Isa::scalar && jit::x_is_bf16(isa_); }
  size_t scratch_floats() const { return size_t(max_seg_) * size_t(max_m_ > 0 ? max_m_ : 1); }
  const formats::Layout& layout() const { return layout_; }
  size_t kernel_count() const { return holds_.size(); }
  // Name of one resolved kernel (for messages and reports).
  std::string kernel_name() const { return holds_.empty() ? "scalar" : holds_.front()->key().name(); }

 private:
  int64_t segment_end(int64_t r, int64_t end) const;

  jit::Isa isa_ = jit::Isa::scalar;
  formats::Layout layout_{};
  std::vector<bool> seg_needed_;  // by segment length
  int max_seg_ = 0;
  int max_m_ = 0;
  std::vector<jit::GemvFn> table_;  // [seg * (max_m_ + 1) + m]
  std::vector<std::shared_ptr<const jit::Kernel>> holds_;
};

}  // namespace moejit
