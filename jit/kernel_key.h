// KernelKey: everything a generated GEMV kernel is specialised on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "formats/format_table.h"
#include "jit/tiers.h"

namespace moejit::jit {

// The tier's name from the tier table ("unknown" outside it).
const char* isa_name(Isa isa);

struct KernelKey {
  formats::Format format = formats::Format::bf16;
  int32_t k = 0;             // reduction length
  int32_t rows = 0;          // rows per call
  int32_t tokens = 0;        // tokens per call (M)
  int64_t scale_stride = 0;  // scale elements between scale rows
  int32_t scale_dtype = 0;   // formats::ScaleDtype (fp8_block only)
  int32_t group = 0;         // elements per scale
  Isa isa = Isa::avx2;
  uint32_t flags = 0;

  bool operator==(const KernelKey& o) const = default;
  size_t hash() const;
  // Canonical printable name, e.g. fp8_block_k2048_r16_m4_s16_bf16_avx512bf16.
  std::string name() const;
};

struct KernelKeyHash {
  size_t operator()(const KernelKey& k) const { return k.hash(); }
};

}  // namespace moejit::jit
