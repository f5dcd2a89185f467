#include "jit/generator.h"

#include <cstring>
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

void Generator::load_partial_xmm(const Xbyak::Xmm& dst, const Xbyak::RegExp& base, int bytes) {
  int done = 0;
  if (bytes >= 8) {
    vmovq(dst, ptr[base]);
    done = 8;
  } else if (bytes >= 4) {
    vmovd(dst, ptr[base]);
    done = 4;
  } else {
    vpxor(dst, dst, dst);
  }
  if (bytes - done >= 4) {
    vpinsrd(dst, dst, ptr[base + done], done / 4);
    done += 4;
  }
  if (bytes - done >= 2) {
    vpinsrw(dst, dst, ptr[base + done], done / 2);
    done += 2;
  }
  if (bytes - done >= 1) vpinsrb(dst, dst, ptr[base + done], done);
}

void Generator::df32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  dd(u);
}

}  // namespace moejit::jit
