// One projection geometry ([rows, K] in one format) with its kernels resolved
// at construction: run() only indexes a table and calls.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "jit/gemv.h"
#include "moejit.h"
#include "runtime/plan.h"

namespace moejit {

// How far ahead of its reads a thread prefetches weights (into L2, 1 MiB per
// core on Zen 4). Measured there (1 thread, cold fp8 rows of 2 KiB, median
// against a streaming read): 2 KiB ahead 55%, 8 KiB 70%, 64 KiB 76-84%; the
// MoE layer gained a few more percent at 128 KiB.
constexpr int64_t kPrefetchBytes = 128 * 1024;

class Matmul {
 public:
  // Takes one matrix of a layer plan (runtime/plan.h): its layout (kernel
  // format: ds_fp4 -> mxfp4), flags and calls, and generates (or finds in the
  // cache) every kernel the plan lists.
  moejit_status init(const plan::MatrixPlan& p, std::string* err);

  // y[t * n + i] = dot(row r0 + i, x[t]) for t < tokens, i < n. x is a buffer
  // of prepared vectors (xprep()), the tokens a group in slots slot0 ..
  // slot0 + tokens - 1, placed by xprep().group_slot(slot0, tokens, t).
  // `scratch` holds scratch_floats(). `prefetch` is the first weight row of a
  // later call of this thread, fetched while this one runs; nullptr means the
  // bytes kPrefetchBytes past these rows (a thread reading one matrix front to back).
  void run(const formats::MatrixRef& m, int64_t r0, int64_t n, int tokens, const void* x, int64_t slot0,
           float* y, float* scratch, const void* prefetch = nullptr) const;
  // Weight bytes one call reads for n rows.
  int64_t call_bytes(int64_t n) const { return n * formats::row_bytes(layout_.format, layout_.k); }
  // Address of row r's weights.
  const void* row_ptr(const formats::MatrixRef& m, int64_t r) const {
    return static_cast<const uint8_t*>(m.data) + r * formats::row_bytes(layout_.format, layout_.k);
  }

  int64_t x_stride() const { return jit::x_stride(layout_.k); }
  // Bytes of one prepared vector: x_stride() elements, and the sums of x where
  // the kernels read them (K-quants). Vectors of a call lie this far apart.
  size_t x_vector_bytes() const { return size_t(xprep_.vector_bytes(layout_.k)); }
  const jit::XPrep& x_prep() const { return xprep_; }
  jit::XLayout x_layout() const { return xprep_.layout(); }
  // The kernels' activation layout: per-token vectors, or runs of up to 16 tokens as tiles (avx512_amx).
  const jit::XPrep& xprep() const { return xprep_; }
  // Bytes of a buffer of `slots` prepared vectors.
  size_t x_buffer_bytes(int64_t slots) const { return size_t(xprep_.buffer_bytes(layout_.k, slots)); }
  // Writes activations k0 .. k0 + n - 1 (values exact in bf16) of slot s of a buffer.
  void x_store_n(void* buf, jit::XPrep::Slot s, int64_t k0, const float* v, int64_t n) const {
    xprep_.store_slot(buf, s, layout_.k, k0, v, n);
  }
  // Prepares slot s of a buffer from K bf16 values.
  void x_prepare(void* buf, jit::XPrep::Slot s, const uint16_t* src) const {
    xprep_.prepare_slot(buf, s, src, layout_.k);
  }
  // Slot `from` of buffer `src` to slot `to` of `dst`.
  void x_copy(void* dst, jit::XPrep::Slot to, const void* src, jit::XPrep::Slot from) const {
    xprep_.copy_slot(dst, to, src, from, layout_.k);
  }
  size_t scratch_floats() const { return size_t(max_seg_) * size_t(max_m_ > 0 ? max_m_ : 1); }
  const formats::Layout& layout() const { return layout_; }

 private:
  jit::Isa isa_ = jit::Isa::scalar;
  uint32_t flags_ = 0;
  jit::XPrep xprep_;  // the kernels' activation layout (fp32 on the scalar tier)
  formats::Layout layout_{};
  int max_seg_ = 0;
  int max_m_ = 0;
  std::vector<jit::GemvFn> table_;  // [seg * (max_m_ + 1) + m]
  std::vector<std::shared_ptr<const jit::Kernel>> holds_;
};

}  // namespace moejit
