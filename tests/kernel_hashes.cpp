// The bytes of every generated kernel, hashed: a refactor of jit/ that means to
// change no code is checked by comparing this program's output before and after
// (tests/golden/kernel_hashes.txt, the kernel_bytes test). A deliberate change
// of generated code regenerates the file with --write and bumps the generator
// version.
//
//   kernel_hashes                 print "name size fnv1a64" per kernel
//   kernel_hashes --check FILE    compare with FILE
//   kernel_hashes --write FILE    write FILE
//
// Generating a kernel needs no CPU feature (only running it does), so every
// key is generated on any x86-64 CPU, avx512_amx's tile kernels and the VBMI
// and GFNI decodes included (jit::gemv_supported's run_here). Keys the
// generator rejects are counted as skipped: --check fails on their golden
// lines, and --write drops them.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "jit/gemv.h"

using namespace moejit;
using formats::Format;

namespace {

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// Every key shape the runtime builds today, over the values that change the
// code: K (block multiples, tails, partial chunks, K % 8 != 0), rows per call (row-group
// tails, the 128-row fp8_block segment), tokens 1..the register budget,
// groups, scale dtypes, padded strides and the no-VBMI flag.
std::vector<jit::KernelKey> all_keys() {
  std::vector<jit::KernelKey> keys;
  const Format formats_list[] = {Format::bf16,      Format::nvfp4, Format::mxfp4,      Format::q4_0,
                                 Format::fp8_block, Format::q8_0,  Format::mxfp8_e4m3, Format::mxfp8_e5m2};
  // avx512_amx last: its lines were appended to the golden file (the tile
  // kernels of the formats with a tile decode; the others are not its keys).
  const jit::Isa isas[] = {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16, jit::Isa::avx512_amx};
  // K % 8 != 0 (bf16 and fp8_block, which take any K) reaches the exact
  // partial loads of the avx2 tail (vmovd / vmovq / vpinsr* and the vpxor start).
  const int ks[] = {1,   3,   5,   7,   13,  16,  32,   48,   64,   96,  100,
                    128, 160, 192, 256, 320, 768, 1000, 1001, 2048, 7168};
  const int rows_list[] = {1, 3, 16, 17, 128};
  for (jit::Isa isa : isas)
    for (Format f : formats_list)
      for (uint32_t flags : {0u, jit::kFlagNoVbmi}) {
        if (flags && isa != jit::Isa::avx512_bf16) continue;
        const bool e2m1 = f == Format::nvfp4 || f == Format::mxfp4;
        const bool mx8 = f == Format::mxfp8_e4m3 || f == Format::mxfp8_e5m2;
        std::vector<int> groups = {0};
        if (f == Format::nvfp4) groups = {16};
        if (f == Format::mxfp4 || f == Format::q4_0 || f == Format::q8_0) groups = {32};
        if (mx8) groups = {32, 64, 128};
        if (f == Format::fp8_block) groups = {128};
        for (int group : groups)
          for (int dtype : {0, 1}) {
            if (dtype == 1 && f != Format::fp8_block) continue;
            for (int k : ks) {
              if (f != Format::bf16 && f != Format::fp8_block && k % std::max(group, 16) != 0) continue;
              if ((f == Format::q4_0 || f == Format::q8_0 || f == Format::mxfp4) && k % 32 != 0) continue;
              const int64_t cols = f == Format::fp8_block ? 0 : (group ? k / group : 0);
              std::vector<int64_t> strides = {0};
              if (e2m1 || mx8) strides = {cols, cols + 3};
              for (int64_t stride : strides)
                for (int rows : rows_list) {
                  jit::KernelKey key;
                  key.format = f;
                  key.k = k;
                  key.rows = rows;
                  key.scale_stride = stride;
                  key.scale_dtype = dtype;
                  key.group = group;
                  key.isa = isa;
                  key.flags = flags;
                  if (isa == jit::Isa::avx512_amx && !jit::has_tile_kernels(key.format, group, flags))
                    continue;
                  const int max_m = jit::max_tokens_per_call(key);
                  for (int m = 1; m <= max_m; ++m) {
                    // Token counts above 4 only at a few shapes: they change the
                    // accumulator allocation, not the decode.
                    if (m > 4 && !(rows == 16 && (k == 768 || k == 2048 || k == 1000))) continue;
                    key.tokens = m;
                    keys.push_back(key);
                  }
                }
            }
          }
      }
  // The K-quants (after the others, so their lines follow the older ones in the
  // golden file): K multiples of 256, the plan's group of 256, no scale tensor.
  const Format kquants[] = {Format::q4_K, Format::q5_K, Format::q6_K, Format::q2_K, Format::q3_K};
  auto add_kquant = [&](Format f, jit::Isa isa, uint32_t flags) {
    for (int k : {256, 768, 2048, 7168})
      for (int rows : rows_list) {
        jit::KernelKey key;
        key.format = f;
        key.k = k;
        key.rows = rows;
        key.group = 256;
        key.isa = isa;
        key.flags = flags;
        const int max_m = jit::max_tokens_per_call(key);
        for (int m = 1; m <= max_m; ++m) {
          if (m > 4 && !(rows == 16 && k == 2048)) continue;
          key.tokens = m;
          keys.push_back(key);
        }
      }
  };
  for (jit::Isa isa : isas)
    for (Format f : kquants)
      for (uint32_t flags : {0u, jit::kFlagNoVbmi})
        if (!flags || isa == jit::Isa::avx512_bf16) add_kquant(f, isa, flags);
  // bf16 with kFlagLinePrefetch (Intel's choice, after the K-quants): the
  // one-token row kernels, the only ones the flag changes (rows not unrolled,
  // a prefetch per line).
  for (jit::Isa isa : {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16})
    for (int k : {1, 13, 100, 768, 1000, 2048, 7168})
      for (int rows : rows_list) {
        jit::KernelKey key;
        key.format = Format::bf16;
        key.k = k;
        key.rows = rows;
        key.tokens = 1;
        key.isa = isa;
        key.flags = jit::kFlagLinePrefetch;
        keys.push_back(key);
      }
  // The K-quants as bf16 pairs (kFlagBf16Pairs, AMD's choice, after the rest;
  // q4_K, q6_K and q5_K first, as they were added).
  for (Format f : {Format::q4_K, Format::q6_K, Format::q5_K, Format::q2_K, Format::q3_K})
    add_kquant(f, jit::Isa::avx512_bf16, jit::kFlagBf16Pairs);
  // Intel's pair kernels (kFlagRowOrder: no K chunks).
  for (Format f : {Format::q4_K, Format::q6_K, Format::q5_K, Format::q3_K})
    add_kquant(f, jit::Isa::avx512_bf16, jit::kFlagBf16Pairs | jit::kFlagRowOrder);
  // q4_K and then q5_K without GFNI (kFlagNoGfni: every vector times its d sc[j]).
  for (Format f : {Format::q4_K, Format::q5_K})
    for (jit::Isa isa : {jit::Isa::avx512, jit::Isa::avx512_bf16}) add_kquant(f, isa, jit::kFlagNoGfni);
  // Intel's AVX-512 row kernels (kFlagNearL1, with the rest of the flags Intel's
  // runtime gives each format on a CPU with VBMI and GFNI, whatever the host's).
  jit::CpuFeatures intel;
  intel.avx512_vbmi = intel.gfni = intel.intel = true;
  for (jit::Isa isa : {jit::Isa::avx512, jit::Isa::avx512_bf16})
    for (int32_t id = 0; id <= formats::kMaxFormatId; ++id) {
      const Format f = Format(id);
      if (formats::kernel_format(f) != f) continue;  // ds_fp4 runs mxfp4's kernels
      const formats::FormatInfo& fi = formats::info(f);
      const int group = fi.scales == formats::ScaleKind::none ? 0 : formats::default_group(f, 0);
      for (int k : {768, 2048, 7168})
        for (int rows : {1, 16, 17}) {
          jit::KernelKey key;
          key.format = f;
          key.k = k;
          key.rows = rows;
          key.group = group;
          key.scale_stride = fi.stride_in_kernel ? formats::scale_cols(f, group, k) : 0;
          key.isa = isa;
          key.flags = jit::runtime_flags(isa, f, group, intel);
          const int max_m = std::min(4, jit::max_tokens_per_call(key));
          for (int m = 1; m <= max_m; ++m) {
            key.tokens = m;
            keys.push_back(key);
          }
        }
    }
  return keys;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc >= 3 ? argv[1] : "";
  const char* file = argc >= 3 ? argv[2] : nullptr;
  std::map<std::string, std::string> golden;
  const bool write = std::strcmp(mode, "--write") == 0;
  if (std::strcmp(mode, "--check") == 0 || write) {
    std::ifstream in(file);
    if (!in && !write) {
      std::fprintf(stderr, "kernel_hashes: cannot read %s\n", file);
      return 2;
    }
    std::string line;
    while (std::getline(in, line)) {
      const size_t sp = line.find(' ');
      if (sp != std::string::npos) golden[line.substr(0, sp)] = line.substr(sp + 1);
    }
  }
  std::ostringstream out;
  int generated = 0, skipped = 0, mismatched = 0, missing = 0;
  for (const jit::KernelKey& key : all_keys()) {
    std::string why;
    if (!jit::gemv_supported(key, &why, /*run_here=*/false)) {
      ++skipped;
      continue;
    }
    auto k = jit::generate_gemv(key, &why, /*run_here=*/false);
    if (!k) {
      std::fprintf(stderr, "kernel_hashes: %s: %s\n", key.name().c_str(), why.c_str());
      return 1;
    }
    ++generated;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%zu %016" PRIx64, k->code_size(), fnv1a(k->code(), k->code_size()));
    out << key.name() << ' ' << buf << '\n';
    if (!golden.empty() && !write) {
      auto it = golden.find(key.name());
      if (it == golden.end()) {
        if (++missing <= 10) std::fprintf(stderr, "not in the golden file: %s\n", key.name().c_str());
      } else if (it->second != buf) {
        if (++mismatched <= 10)
          std::fprintf(stderr, "changed: %s: %s, golden %s\n", key.name().c_str(), buf, it->second.c_str());
      }
    }
  }
  std::fprintf(stderr, "kernel_hashes: %d kernels generated, %d keys skipped (the generator rejects them)\n",
               generated, skipped);
  if (write) {
    std::ofstream f(file);
    f << out.str();
    return f ? 0 : 1;
  }
  if (std::strcmp(mode, "--check") == 0) {
    // Every key is generated on any CPU, so a golden line whose key was not
    // generated (skipped, or no longer among all_keys) is a failure too.
    const int unchecked = int(golden.size()) - (generated - missing);
    if (mismatched || missing || unchecked) {
      std::fprintf(
          stderr,
          "kernel_hashes: %d kernels differ from %s, %d are not in it, %d of its lines were not checked\n",
          mismatched, file, missing, unchecked);
      return 1;
    }
    std::fprintf(stderr, "kernel_hashes: every kernel matches %s\n", file);
    return 0;
  }
  std::fputs(out.str().c_str(), stdout);
  return 0;
}
