// Generator base over Xbyak: code memory written RW and flipped to RX (never
// RWX), no exceptions, errors reported as strings.
#pragma once

#include <xbyak/xbyak.h>

#include <string>

namespace moejit::jit {

class Generator : public Xbyak::CodeGenerator {
 public:
  Generator() : Xbyak::CodeGenerator(16 * 1024, Xbyak::AutoGrow) {}

 protected:
  // Resolves labels, flips the pages to read+exec and checks Xbyak's error.
  bool finalize(std::string* err);
  // Loads a 32-bit pattern broadcast into a vector register.
  void broadcast_u32(const Xbyak::Xmm& v, uint32_t pattern, const Xbyak::Reg32& tmp);

  // SysV argument register.
  const Xbyak::Reg64 reg_args = rdi;
};

}  // namespace moejit::jit
