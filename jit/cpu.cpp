#include "jit/cpu.h"

#include <xbyak/xbyak_util.h>

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
    return r;
  }();
  return f;
}

bool isa_available(Isa isa) {
  const CpuFeatures& f = host_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  switch (isa) {
    case Isa::scalar: return true;
    case Isa::avx2: return avx2;
    case Isa::avx512: return avx512;
    case Isa::avx512_bf16: return avx512 && f.avx512_bf16;
  }
  return false;
}

Isa host_isa() {
  for (Isa isa : {Isa::avx512_bf16, Isa::avx512, Isa::avx2})
    if (isa_available(isa)) return isa;
  return Isa::scalar;
}

}  // namespace moejit::jit
