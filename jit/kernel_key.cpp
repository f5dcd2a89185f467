#include "jit/kernel_key.h"

#include "formats/formats.h"

namespace moejit::jit {

const char* isa_name(Isa isa) {
  const TierInfo* t = tier_info(isa);
  return t ? t->name : "unknown";
}

size_t KernelKey::hash() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xFF;
      h *= 1099511628211ull;
    }
  };
  mix(uint64_t(uint32_t(format)));
  mix(uint64_t(uint32_t(k)));
  mix(uint64_t(uint32_t(rows)));
  mix(uint64_t(uint32_t(tokens)));
  mix(uint64_t(scale_stride));
  mix(uint64_t(uint32_t(scale_dtype)));
  mix(uint64_t(uint32_t(group)));
  mix(uint64_t(uint32_t(isa)));
  mix(uint64_t(flags));
  return size_t(h);
}

std::string KernelKey::name() const {
  const formats::Format f = format;
  std::string n = formats::format_name(f);
  n += "_k" + std::to_string(k) + "_r" + std::to_string(rows) + "_m" + std::to_string(tokens);
  if (formats::known_format(int32_t(f)) && formats::has_block_scales(f)) {
    const formats::FormatInfo& fi = formats::info(f);
    n += "_s" + std::to_string(scale_stride);
    if (fi.scale_code == formats::ScaleCode::bf16_f32) n += scale_dtype == 1 ? "_f32" : "_bf16";
    if (fi.api_groups) n += "_g" + std::to_string(group);
  }
  const TierInfo* t = tier_info(isa);
  n += std::string("_") + (t ? t->key_name : "unknown");
  if (flags) n += "_f" + std::to_string(flags);
  return n;
}

}  // namespace moejit::jit
