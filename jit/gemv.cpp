// The GEMV kernel family's entry points: key checks, the register budget and
// generation, from the key's decoder (jit/decoders.cpp) and the row body.
#include "jit/gemv.h"

#include <algorithm>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "jit/row_body.h"

namespace moejit::jit {

namespace {

KernelKey key_of(Isa isa, int32_t format, uint32_t flags) {
  KernelKey key;
  key.isa = isa;
  key.format = format;
  key.flags = flags;
  return key;
}

// Whether some tier has a decoder for the format.
bool format_has_decoder(int32_t format) { return make_decoder(key_of(Isa::avx512, format, 0)) != nullptr; }

}  // namespace

bool needs_vbmi(Isa isa, int32_t format, uint32_t flags) {
  const auto dec = make_decoder(key_of(isa, format, flags));
  return dec && dec->needs_vbmi();
}

bool streams_with_prefetch(int32_t format) {
  const auto dec = make_decoder(key_of(Isa::avx512, format, 0));
  return !dec || dec->streams_with_prefetch();
}

uint32_t runtime_flags(Isa isa, int32_t format, int32_t /*group*/) {
  // Without AVX512_VBMI the avx512_bf16 tier decodes without byte tables.
  return needs_vbmi(isa, format, 0) && !host_features().avx512_vbmi ? kFlagNoVbmi : 0;
}

int max_tokens_per_call(const KernelKey& key) {
  const auto dec = make_decoder(key);
  return dec ? row_body_max_tokens(key, *dec) : 0;
}

int max_tokens_per_call(Isa isa, int32_t format) {
  // The smallest over the groups and flags a format may use.
  int m = 1 << 30;
  for (int32_t group : {16, 32, 64, 128})
    for (uint32_t flags : {0u, kFlagNoVbmi}) {
      KernelKey k = key_of(isa, format, flags);
      k.group = group;
      m = std::min(m, max_tokens_per_call(k));
    }
  return m;
}

bool gemv_supported(const KernelKey& key, std::string* why) {
  const auto f = static_cast<formats::Format>(key.format);
  if (key.format < 0 || key.format > formats::kMaxFormatId || !format_has_decoder(key.format)) {
    *why = std::string("no generated kernel for format ") + formats::format_name(f) + " yet";
    return false;
  }
  if (!row_body_has_tier(key.isa)) {
    *why = std::string("no generator for tier ") + isa_name(key.isa);
    return false;
  }
  if (!isa_available(key.isa)) {
    *why = std::string("this CPU lacks tier ") + isa_name(key.isa);
    return false;
  }
  if (key.k < 1 || key.rows < 1 || key.tokens < 1) {
    *why = "k, rows and tokens must be >= 1";
    return false;
  }
  const auto dec = make_decoder(key);
  if (key.tokens > row_body_max_tokens(key, *dec)) {
    *why = "tokens per call exceeds the register budget of " + std::string(isa_name(key.isa));
    return false;
  }
  // Token offsets are 32-bit displacements.
  const int64_t span = formats::row_bytes(f, key.k) + dec->x_prep().vector_bytes(key.k) * key.tokens;
  if (span > (int64_t(1) << 30)) {
    *why = "k is too large for 32-bit displacements";
    return false;
  }
  if ((key.flags & ~kFlagNoVbmi) != 0) {
    *why = "unknown kernel flags";
    return false;
  }
  if (dec->needs_vbmi() && !host_features().avx512_vbmi) {
    *why = "this CPU lacks AVX512_VBMI for the byte-table decode";
    return false;
  }
  return dec->check(why);
}

std::shared_ptr<const Kernel> generate_gemv(const KernelKey& key, std::string* err) {
  if (!gemv_supported(key, err)) return nullptr;
  Xbyak::ClearError();
  return generate_row_kernel(key, make_decoder(key), err);
}

}  // namespace moejit::jit
