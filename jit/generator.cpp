#include "jit/generator.h"

#include <new>

namespace moejit::jit {

bool Generator::finalize(std::string* err) {
  if (Xbyak::GetError() == 0) ready();  // resolves labels; a fixed buffer keeps its protection
  if (Xbyak::GetError() == 0 && !setProtectModeRE(false)) {
    *err = "code generation failed: mprotect to read+exec refused";
    return false;
  }
  const int e = Xbyak::GetError();
  if (e == Xbyak::ERR_CANT_ALLOC) {
    Xbyak::ClearError();
    throw std::bad_alloc();
  }
  if (e != 0) {
    *err = std::string("code generation failed: ") + Xbyak::ConvertErrorToString(e);
    Xbyak::ClearError();
    return false;
  }
  return true;
}

void Generator::broadcast_u32(const Xbyak::Xmm& v, uint32_t pattern, const Xbyak::Reg32& tmp) {
  mov(tmp, pattern);
  if (v.isZMM()) {
    vpbroadcastd(v, tmp);
  } else {
    vmovd(Xbyak::Xmm(v.getIdx()), tmp);
    vpbroadcastd(v, Xbyak::Xmm(v.getIdx()));
  }
}

}  // namespace moejit::jit
