// The tile (AMX) body (avx512_amx): tdpbf16ps over blocks of 16 weight rows
// and up to 16 tokens, around the format's Decoder.
#pragma once

#include <memory>
#include <string>

#include "jit/decoder.h"
#include "jit/gemv.h"

namespace moejit::jit {

// Tokens one tile kernel call takes: the 16 dword columns of a B tile. Every
// token count 1..16 runs the same tile arithmetic per token (batch invariance).
constexpr int kTileTokens = 16;

// A tile read in place (bf16, 16 rows) first prefetches each row's line this
// far ahead into L1 (prefetcht0). Its tileloadd reads 16 lines of 16 rows at
// once, which the L1 prefetchers do not follow: on the Xeon (DeepSeek-V3 bf16,
// 16 threads) the layer ran 1.07x faster at one token and one thread computed
// 1.11x faster (docs/PERFORMANCE.md).
constexpr int kTileL1AheadBytes = 256;

// Code buffer of a kernel on the emulated tile unit (kFlagTileEmu): each
// emulated tile instruction is tens of instructions.
constexpr size_t kTileEmuCodeBytes = 512 * 1024;

// Whether the tile body has a tier.
inline bool tile_body_has_tier(Isa isa) { return isa == Isa::avx512_amx; }
// Generates `key`'s kernel around `dec` (the key's decoder). nullptr and *err on failure.
std::shared_ptr<const Kernel> generate_tile_kernel(const KernelKey& key, std::unique_ptr<Decoder> dec,
                                                   std::string* err);

}  // namespace moejit::jit
