// What every body shares once it has emitted a kernel: the generator kept
// alive as the Kernel (it owns the code memory), and the generation entry
// that turns Xbyak's allocation failure into std::bad_alloc.
#pragma once

#include <memory>
#include <new>
#include <string>

#include "jit/decoder.h"
#include "jit/gemv.h"

namespace moejit::jit {

template <class Body>
class BodyKernel : public Kernel {
 public:
  explicit BodyKernel(std::unique_ptr<Body> gen) : gen_(std::move(gen)) {
    key_ = gen_->key();
    fn_ = gen_->template getCode<GemvFn>();
    size_ = gen_->getSize();
    for (const CodePhase& p : gen_->phases()) phases_.emplace_back(p.offset, p.name);
  }

 private:
  std::unique_ptr<Body> gen_;
};

// `key`'s kernel: Body around `dec`. Allocation failures (the generator object,
// Xbyak's code buffer) throw std::bad_alloc, which the C API reports as
// MOEJIT_OUT_OF_MEMORY; other generation failures return nullptr and *err.
template <class Body>
std::shared_ptr<const Kernel> generate_body_kernel(const KernelKey& key, std::unique_ptr<Decoder> dec,
                                                   std::string* err) {
  std::unique_ptr<Body> gen(new Body(key, std::move(dec)));
  if (Xbyak::GetError() == Xbyak::ERR_CANT_ALLOC) {
    Xbyak::ClearError();
    throw std::bad_alloc();
  }
  if (!gen->generate(err)) return nullptr;
  return std::make_shared<BodyKernel<Body>>(std::move(gen));
}

}  // namespace moejit::jit
