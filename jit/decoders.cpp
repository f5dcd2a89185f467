// The decoder base, the one place that picks a decode family for a key, and the
// facts the runtime reads from the decoders (VBMI, prefetch scheme, flags).
#include "jit/decoders.h"

#include <algorithm>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "jit/gemv.h"
#include "jit/tile_body.h"

namespace moejit::jit {

using formats::Format;
using namespace Xbyak;

void ScaleRule::fma_tokens(const ScaleBlock& b, const Operand& scale) {
  for (size_t m = 0; m < b.totals.size(); ++m) a().vfmadd231ps(b.totals[m], b.sums[m], scale);
}

namespace {

// For each vector i of a packed layout (TileScaleBlock): first(i), then
// emit(i, f), f the per-row values at `rows` (lane = row) spread onto vector i:
// the vector itself with one token, a broadcast with one row per vector, else
// a vpermps into s (idx clobbered).
template <class First, class Emit>
void each_vector(Generator& g, const TileScaleBlock& b, const RegExp& rows, const Zmm& idx, const Zmm& s,
                 First first, Emit emit) {
  for (int i = 0; i < b.width; ++i) {
    first(i);
    if (b.width == 1) {
      emit(i, g.ptr[rows]);
    } else if (b.width == kTileTokens) {
      emit(i, g.ptr_b[rows + 4 * i]);
    } else {
      g.vmovdqu32(idx, g.ptr[g.rip + *b.spread + 64 * i]);
      g.vpermps(s, idx, g.ptr[rows]);
      emit(i, s);
    }
  }
}

}  // namespace

void ScaleRule::tile_scale_prologue(int bytes) {
  if (bytes == 0) return;
  Generator& g = a();
  const Zmm z = Zmm(r_.scale.getIdx());
  g.sub(g.rsp, bytes);
  g.vpxord(z, z, z);
  g.vmovaps(g.ptr[g.rsp], z);
}

void ScaleRule::tile_fma_rows(const TileScaleBlock& b, const RegExp& rows) {
  Generator& g = a();
  const Zmm c = Zmm(r_.w[0].getIdx()), idx = Zmm(r_.w[1].getIdx()), s = Zmm(r_.w[2].getIdx());
  each_vector(
      g, b, rows, idx, s, [&](int i) { g.vmovups(c, g.ptr[b.c.at(64 * i)]); },
      [&](int i, const Operand& f) { g.vfmadd231ps(b.totals[size_t(i)], c, f); });
}

void ScaleRule::tile_fnma_rows_tokens(const TileScaleBlock& b, const RegExp& rows, const Zmm& toks) {
  Generator& g = a();
  const Zmm t = Zmm(r_.w[0].getIdx()), idx = Zmm(r_.w[1].getIdx()), s = Zmm(r_.w[2].getIdx());
  // The tokens' values on their lanes of every vector.
  Zmm tv = toks;
  if (b.width == 1) {
    g.vbroadcastss(t, Xmm(toks.getIdx()));
    tv = t;
  } else if (b.width < kTileTokens) {
    g.vmovdqu32(idx, g.ptr[g.rip + *b.spread + 64 * b.width]);
    g.vpermps(t, idx, toks);
    tv = t;
  }
  each_vector(
      g, b, rows, idx, s, [](int) {},
      [&](int i, const Operand& f) { g.vfnmadd231ps(b.totals[size_t(i)], tv, f); });
}

Decoder::Decoder(const KernelKey& key, XLayout layout, int vectors, std::unique_ptr<ScaleRule> rule)
    : DecodePart(key), layout_(layout), rule_(std::move(rule)) {
  DecodeShape s;
  const int vec_bytes = key.isa == Isa::avx2 ? 32 : 64;
  s.vec_elems = x_elem_bytes(layout) == 4 ? vec_bytes / 4 : 32;
  s.step = vectors * s.vec_elems;
  s.scaled = rule_ != nullptr;
  if (s.scaled) {
    // A block is the unit one scale (or one per group of it) applies to: at
    // least a group, at least a step up to kChunk.
    const int group = rule_->group();
    s.block = std::max(group, std::min(s.step, kChunk));
    s.groups = s.block / group;
  } else {
    s.block = kChunk;
  }
  shape_ = s;
  if (rule_) rule_->shape_ = s;
}

bool Decoder::tile_halves() const {
  if (key_.isa != Isa::avx512_amx || scale() == nullptr) return false;
  // A key without a group (x_prep() of a format, decoder_key) takes the format's.
  if (key_.group == 0 && formats::default_group(key_.format, 0) == 16) return true;
  return shape_.block / shape_.groups == 16;
}

void Decoder::set_step_scaled(int steps) {
  shape_.step_scaled = true;
  shape_.scale_steps = steps;
  if (rule_) rule_->shape_ = shape_;
}

void Decoder::set_block(int block) {
  shape_.block = block;
  shape_.groups = block / rule_->group();
  rule_->shape_ = shape_;
}

void Decoder::bind(Generator& g, const DecodeRegs& r) {
  bind_part(g, r, shape_);
  if (rule_) rule_->bind_part(g, r, shape_);
}

void emit_nibble_words(Generator& a, const Xmm* dst, const Xmm& table) {
  const Zmm src = Zmm(dst[0].getIdx());
  for (int j = 1; j < 4; ++j) a.vpsrlw(Zmm(dst[j].getIdx()), src, 4 * j);
  for (int j = 0; j < 4; ++j) a.vpermw(Zmm(dst[j].getIdx()), Zmm(dst[j].getIdx()), Zmm(table.getIdx()));
}

namespace {

// avx512_amx: the decodes whose vectors each hold one chunk of 32 elements of
// one scale group, in the order the tile body's activations take (natural).
// Formats without one run the avx512_bf16 kernels on that tier (kernel_isa).
std::unique_ptr<Decoder> make_tile_decoder(const KernelKey& key) {
  // Without VBMI: the decodes that need no byte table.
  if (key.flags & kFlagNoVbmi) {
    if (key.format == Format::bf16) return make_bf16_decoder(key);
    if (formats::is_kquant(key.format)) return make_kquant_tile_decoder(key);
    return key.format == Format::q4_0 ? make_q4_tile_decoder(key) : nullptr;
  }
  switch (key.format) {
    case Format::bf16: return make_bf16_decoder(key);
    case Format::fp8_block: return make_fp8_table_decoder(key, make_block128_scale(key));
    case Format::mxfp8_e4m3:
    case Format::mxfp8_e5m2: return make_fp8_table_decoder(key, make_byte_code_scale(key));
    case Format::q8_0: return make_q8_table_decoder(key);
    case Format::q4_0: return make_q4_tile_decoder(key);
    case Format::mxfp4:
    case Format::nvfp4: return make_e2m1_tile_decoder(key, make_byte_code_scale(key));
    case Format::q4_K:
    case Format::q5_K:
    case Format::q6_K:
    case Format::q2_K:
    case Format::q3_K: return make_kquant_tile_decoder(key);
    default: return nullptr;
  }
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const KernelKey& key) {
  if (key.isa == Isa::avx512_amx) return make_tile_decoder(key);
  if (key.isa != Isa::avx2 && key.isa != Isa::avx512 && key.isa != Isa::avx512_bf16) return nullptr;
  const bool bf16_tier = key.isa == Isa::avx512_bf16;
  // The byte tables need AVX512_VBMI; kFlagNoVbmi keeps the decodes without it.
  const bool tables = bf16_tier && !(key.flags & kFlagNoVbmi);
  switch (key.format) {
    case Format::bf16: return make_bf16_decoder(key);
    case Format::fp8_block:
    case Format::mxfp8_e4m3: {
      auto rule = key.format == Format::fp8_block ? make_block128_scale(key) : make_byte_code_scale(key);
      if (tables) return make_fp8_table_decoder(key, std::move(rule));
      if (bf16_tier) return make_e4m3_blend_decoder(key, std::move(rule));
      return make_e4m3_fp16_decoder(key, std::move(rule));
    }
    case Format::mxfp8_e5m2:
      if (tables) return make_fp8_table_decoder(key, make_byte_code_scale(key));
      return make_e5m2_fp16_decoder(key, make_byte_code_scale(key));
    case Format::q8_0: return tables ? make_q8_table_decoder(key) : make_q8_f32_decoder(key);
    case Format::q4_0: return bf16_tier ? make_q4x4_decoder(key) : make_q4_f32_decoder(key);
    case Format::mxfp4:
    case Format::nvfp4:
      if (bf16_tier) return make_e2m1_nib128_decoder(key, make_widened_row_scale(key));
      return make_e2m1_f32_decoder(key, make_byte_code_scale(key));
    case Format::q4_K:
    case Format::q5_K:
    case Format::q6_K:
    case Format::q2_K:
    case Format::q3_K: return make_kquant_decoder(key);
    default: return nullptr;
  }
}

bool needs_vbmi(Isa isa, formats::Format format, uint32_t flags) {
  const auto dec = make_decoder(decoder_key(isa, format, flags));
  return dec && dec->needs_vbmi();
}

bool streams_with_prefetch(formats::Format format) {
  const auto dec = make_decoder(decoder_key(Isa::avx512, format, 0));
  return !dec || dec->streams_with_prefetch();
}

bool prefetches_far(formats::Format format, uint32_t flags) {
  return (flags & kFlagLinePrefetch) || streams_with_prefetch(format);
}

uint32_t runtime_flags(Isa isa, formats::Format format, int32_t /*group*/, const CpuFeatures& cpu) {
  uint32_t flags = 0;
  // Without AVX512_VBMI the avx512_bf16 tier decodes without byte tables.
  if (needs_vbmi(isa, format, 0) && !cpu.avx512_vbmi) flags |= kFlagNoVbmi;
  if (cpu.intel && !streams_with_prefetch(format)) flags |= kFlagLinePrefetch;
  // Intel's AVX-512 row kernels prefetch the line 3 KiB ahead into L1 (gemv.h).
  if (cpu.intel && (isa == Isa::avx512 || isa == Isa::avx512_bf16)) flags |= kFlagNearL1;
  // Without GFNI, the decodes that use it (q4_K's and q5_K's fp32 lanes) have a form without it.
  if (!cpu.gfni) {
    const auto dec = make_decoder(decoder_key(isa, format, flags));
    if (dec && dec->needs_gfni()) flags |= kFlagNoGfni;
  }
  // The K-quants' bf16 pairs (gemv.h): every K-quant on AMD, where bf16 pairs
  // multiply at about the fp32 FMA's cost; on Intel q6_K and q3_K only (the
  // 16-core Xeon, DeepSeek-V3, 16 threads, the pairs against the fp32 decode,
  // docs/PERFORMANCE.md: q6_K 1.13-1.21x at one token and 1.01-1.18x at 64;
  // since the GFNI decodes q3_K 1.34x and 1.03x; q2_K 0.95x and 0.81x, and with
  // its two-table step 1.06x, inside the noise, and 0.85x; q4_K against its fp32
  // lanes 1.02x at one token, 0.87x at 16 and 0.83x at 64; q5_K against its fp32
  // lanes 0.88-0.96x at one token, 0.81-0.92x at 16 and 0.84-0.86x at 64). q3_K's,
  // q4_K's and q5_K's pairs need GFNI (every AMD CPU with AVX512_BF16 has it).
  const bool fp32_on_intel = format == Format::q2_K || format == Format::q4_K || format == Format::q5_K;
  if (isa == Isa::avx512_bf16 && (!cpu.intel || !fp32_on_intel)) {
    const auto dec = make_decoder(decoder_key(isa, format, flags | kFlagBf16Pairs));
    if (dec && dec->kquant_pairs() && (!dec->needs_gfni() || cpu.gfni)) flags |= kFlagBf16Pairs;
    // Intel's pair kernels keep the row order (gemv.h).
    if ((flags & kFlagBf16Pairs) && cpu.intel) flags |= kFlagRowOrder;
  }
  return flags;
}

bool has_tile_kernels(formats::Format format, int32_t group, uint32_t flags) {
  KernelKey key = decoder_key(Isa::avx512_amx, format, flags);
  key.group = group;
  return make_tile_decoder(key) != nullptr;
}

Isa kernel_isa(Isa tier, formats::Format format, int32_t group, uint32_t flags, bool all_tiles) {
  if (tier != Isa::avx512_amx) return kernel_isa(tier);
  // The layers' choice (gemv.h): tiles for bf16 (no decode) and fp8_block (one
  // scale per 16 rows x 128), or for every format where asked.
  const bool tiles = (all_tiles || format == Format::bf16 || format == Format::fp8_block) &&
                     has_tile_kernels(format, group, flags);
  return tiles ? tier : kernel_isa(tier);
}

std::string decode_path(Isa isa, formats::Format format, uint32_t flags) {
  const auto d = make_decoder(decoder_key(isa, format, flags));
  return d ? d->describe() : std::string();
}

XPrep x_prep(Isa isa, formats::Format format, uint32_t flags) {
  const auto d = make_decoder(decoder_key(isa, format, flags));
  return d ? d->x_prep() : XPrep();
}

}  // namespace moejit::jit
