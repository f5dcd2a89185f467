// The GEMV kernel family's entry points: key checks, the register budget and
// generation, from the key's decoder (jit/decoders.cpp) and the row body.
#include "jit/gemv.h"

#include <algorithm>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "jit/row_body.h"
#include "jit/tile_body.h"

namespace moejit::jit {

namespace {

// Whether some tier has a decoder for the format.
bool format_has_decoder(formats::Format format) {
  return make_decoder(decoder_key(Isa::avx512, format, 0)) != nullptr;
}

}  // namespace

int max_tokens_per_call(const KernelKey& key) {
  const auto dec = make_decoder(key);
  if (!dec) return 0;
  return tile_body_has_tier(key.isa) ? kTileTokens : row_body_max_tokens(key, *dec);
}

int max_tokens_per_call(Isa isa, formats::Format format) {
  // The smallest over the groups and flags a format may use.
  int m = 1 << 30;
  for (int32_t group : {16, 32, 64, 128})
    for (uint32_t flags : {0u, kFlagNoVbmi, kFlagNoGfni}) {
      KernelKey k = decoder_key(isa, format, flags);
      k.group = group;
      const int t = max_tokens_per_call(k);
      if (t > 0) m = std::min(m, t);  // 0: no kernel with these flags or group (the tile tier)
    }
  return m == 1 << 30 ? 0 : m;
}

bool gemv_supported(const KernelKey& key, std::string* why, bool run_here) {
  const auto f = key.format;
  if (!formats::known_format(int32_t(key.format)) || !format_has_decoder(key.format)) {
    *why = std::string("no generated kernel for format ") + formats::format_name(f) + " yet";
    return false;
  }
  if (!row_body_has_tier(key.isa) && !tile_body_has_tier(key.isa)) {
    *why = std::string("no generator for tier ") + isa_name(key.isa);
    return false;
  }
  if ((key.flags & kFlagTileEmu) && !tile_body_has_tier(key.isa)) {
    *why = "the emulated tile unit is for avx512_amx kernels";
    return false;
  }
  // The emulated tile unit runs on avx512_bf16 (vdpbf16ps).
  const Isa runs_on = (key.flags & kFlagTileEmu) ? Isa::avx512_bf16 : key.isa;
  if (run_here && !isa_available(runs_on)) {
    *why = std::string("this CPU lacks tier ") + isa_name(runs_on);
    return false;
  }
  if (key.k < 1 || key.rows < 1 || key.tokens < 1) {
    *why = "k, rows and tokens must be >= 1";
    return false;
  }
  const auto dec = make_decoder(key);
  if (!dec) {
    *why = std::string("no ") + isa_name(key.isa) + " kernel for format " + formats::format_name(f) +
           " (its tier runs the " + isa_name(kernel_isa(key.isa)) + " kernels)";
    return false;
  }
  if (key.tokens > max_tokens_per_call(key)) {
    *why = "tokens per call exceeds the register budget of " + std::string(isa_name(key.isa));
    return false;
  }
  // Token and row offsets are 32-bit displacements (a tile block's 16 rows; a
  // 16-token block of x is 32 bytes per element; K-quant vectors carry sums of x).
  const int64_t rows_read = tile_body_has_tier(key.isa) ? 16 : 1;
  const int64_t x_span =
      tile_body_has_tier(key.isa) ? x_stride(key.k) * 32 : dec->x_prep().vector_bytes(key.k) * key.tokens;
  const int64_t span = formats::row_bytes(f, key.k) * rows_read + x_span;
  if (span > (int64_t(1) << 30)) {
    *why = "k is too large for 32-bit displacements";
    return false;
  }
  if ((key.flags & ~(kFlagNoVbmi | kFlagLinePrefetch | kFlagBf16Pairs | kFlagRowOrder | kFlagNoGfni |
                     kFlagTileEmu | kFlagNearL1)) != 0) {
    *why = "unknown kernel flags";
    return false;
  }
  if ((key.flags & kFlagLinePrefetch) && dec->streams_with_prefetch()) {
    *why = std::string("the line-prefetch flag is for formats the hardware prefetchers stream (bf16), not ") +
           formats::format_name(f);
    return false;
  }
  if ((key.flags & kFlagNearL1) && !row_body_has_tier(key.isa)) {
    *why = "the near-L1 prefetch flag is for the row kernels; the tile body has no near prefetch";
    return false;
  }
  if ((key.flags & kFlagRowOrder) && !(key.flags & kFlagBf16Pairs)) {
    *why = "the row-order flag is for the K-quants' bf16-pair kernels (with kFlagBf16Pairs)";
    return false;
  }
  if ((key.flags & kFlagBf16Pairs) && !dec->kquant_pairs()) {
    *why = std::string("the bf16-pair flag is for the K-quants on avx512_bf16, not ") +
           formats::format_name(f) + " on " + isa_name(key.isa);
    return false;
  }
  if (run_here && dec->needs_vbmi() && !host_features().avx512_vbmi) {
    *why = "this CPU lacks AVX512_VBMI for the byte-table decode";
    return false;
  }
  if (run_here && dec->needs_gfni() && !host_features().gfni) {
    *why = std::string("this CPU lacks GFNI for the ") + formats::format_name(f) + " decode" +
           ((key.flags & kFlagBf16Pairs) ? " as bf16 pairs" : " (kFlagNoGfni decodes without it)");
    return false;
  }
  return dec->check(why);
}

std::shared_ptr<const Kernel> generate_gemv(const KernelKey& key, std::string* err, bool run_here) {
  if (!gemv_supported(key, err, run_here)) return nullptr;
  Xbyak::ClearError();
  if (tile_body_has_tier(key.isa)) return generate_tile_kernel(key, make_decoder(key), err);
  return generate_row_kernel(key, make_decoder(key), err);
}

}  // namespace moejit::jit
