// KernelKey: everything a generated GEMV kernel is specialised on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "formats/format_table.h"
#include "jit/tiers.h"

namespace moejit::jit {

// Each prefetch of a later call's line comes with a second one, of the line
// kNearPrefetchBytes ahead of the cursor in this call's own stream (also into
// L2): the later-call prefetches alone leave demand misses. Measured on Zen 4,
// Qwen3-30B-A3B layer, cold experts, kernels built both ways alternating in one
// process (PERFORMANCE.md, "Tried, and did not help"): fp8_block with one thread 82-85% of the
// read bandwidth without it, 84-89% with it 4 KiB ahead; two threads 87-88% ->
// 90-93%; q8_0 with two threads +3-5 points. The near prefetch alone reads
// 66%; 2 KiB ahead is no better than none, 16 KiB worse, 4-8 KiB alike (6 KiB
// 0-2 points above 4 with one thread). Past a matrix's last row it is a hint
// that never faults.
// That is the default; the runtime asks for a distance per CPU vendor
// (KernelKey::near_prefetch, jit::near_prefetch_for): Intel 12 KiB.
inline constexpr int32_t kNearPrefetchBytes = 6144;
inline constexpr int32_t kNearPrefetchBytesIntel = 12288;

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
  // Bytes ahead of the cursor of the near prefetch in the call's own stream
  // (row body): a multiple of 64 in [64, 65536]. The name shows it when it is
  // not kNearPrefetchBytes.
  int32_t near_prefetch = kNearPrefetchBytes;

  bool operator==(const KernelKey& o) const = default;
  size_t hash() const;
  // Canonical printable name, e.g. fp8_block_k2048_r16_m4_s16_bf16_avx512bf16.
  std::string name() const;
};

struct KernelKeyHash {
  size_t operator()(const KernelKey& k) const { return k.hash(); }
};

}  // namespace moejit::jit
