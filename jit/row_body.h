// The row-streaming AVX body (avx2, avx512, avx512_bf16): every format's GEMV
// kernel on those tiers is this body around the format's Decoder.
#pragma once

#include <memory>
#include <string>

#include "jit/decoder.h"
#include "jit/gemv.h"

namespace moejit::jit {

// Whether the row body has a tier (its register budget and multiply instruction).
bool row_body_has_tier(Isa isa);
// Largest tokens-per-call the row body holds in registers for `key` (its tokens ignored).
int row_body_max_tokens(const KernelKey& key, const Decoder& dec);
// Generates `key`'s kernel around `dec` (the key's decoder). nullptr and *err on failure.
std::shared_ptr<const Kernel> generate_row_kernel(const KernelKey& key, std::unique_ptr<Decoder> dec,
                                                  std::string* err);

}  // namespace moejit::jit
