#include "jit/cpu.h"

#include <sys/syscall.h>
#include <unistd.h>
#include <xbyak/xbyak_util.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace moejit::jit {

const CpuFeatures& host_features() {
  static const CpuFeatures f = [] {
    Xbyak::util::Cpu cpu;
    using C = Xbyak::util::Cpu;
    CpuFeatures r;
    r.avx2 = cpu.has(C::tAVX2);
    r.fma = cpu.has(C::tFMA);
    r.f16c = cpu.has(C::tF16C);
    r.avx512f = cpu.has(C::tAVX512F);
    r.avx512bw = cpu.has(C::tAVX512BW);
    r.avx512vl = cpu.has(C::tAVX512VL);
    r.avx512dq = cpu.has(C::tAVX512DQ);
    r.avx512_bf16 = cpu.has(C::tAVX512_BF16);
    r.avx512_vbmi = cpu.has(C::tAVX512_VBMI);
    r.gfni = cpu.has(C::tGFNI);
    r.intel = cpu.has(C::tINTEL);
    const std::pair<uint32_t, bool> bits[] = {{kAvx2, r.avx2},
                                              {kFma, r.fma},
                                              {kF16c, r.f16c},
                                              {kAvx512f, r.avx512f},
                                              {kAvx512bw, r.avx512bw},
                                              {kAvx512vl, r.avx512vl},
                                              {kAvx512dq, r.avx512dq},
                                              {kAvx512Vbmi, r.avx512_vbmi},
                                              {kAvx512Bf16, r.avx512_bf16},
                                              {kAmxBf16, cpu.has(C::tAMX_BF16)},
                                              {kAmxTile, cpu.has(C::tAMX_TILE)},
                                              {kGfni, r.gfni}};
    for (const auto& [bit, on] : bits)
      if (on) r.bits |= bit;
    r.tile_data_note = "the CPU has no AMX-TILE";
    if (r.bits & kAmxTile) {
      // Linux hands out the large tile state only on request (arch_prctl
      // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); once granted it holds for
      // the process, so it is asked once, here.
      constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
      if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) {
        r.bits |= kOsTileData;
        r.tile_data_note = "granted";
      } else {
        static std::string why;
        why = std::string("the OS refused AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
              std::strerror(errno) + ")";
        r.tile_data_note = why.c_str();
      }
    }
    return r;
  }();
  return f;
}

bool isa_available(Isa isa) {
  const TierInfo* t = tier_info(isa);
  return t && host_features().has(t->features);
}

Isa host_isa() {
  for (int i = kTierCount - 1; i > 0; --i)
    if (host_features().has(tier(i).features)) return tier(i).isa;
  return Isa::scalar;
}

}  // namespace moejit::jit
