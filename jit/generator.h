// Generator base over Xbyak: code memory written RW and flipped to RX (never
// RWX), no exceptions, errors reported as strings.
#pragma once

#include <xbyak/xbyak.h>

#include <string>
#include <vector>

namespace moejit::jit {

// A named region of generated code, for disassembly listings.
struct CodePhase {
  size_t offset;     // bytes from the start of the code
  std::string name;  // prologue, decode, fma, block-scale, tail, epilogue, data, ...
};

// Largest kernel a generator may emit. The buffer is fixed (not Xbyak's
// AutoGrow, whose failed grow would write past the buffer with exceptions
// off): emitting past it sets ERR_CODE_IS_TOO_BIG and generation fails
// cleanly. The largest kernels are a few KiB (test_jit checks the margin).
constexpr size_t kMaxCodeBytes = 64 * 1024;

class Generator : public Xbyak::CodeGenerator {
 public:
  // Pages start read+write (DontSetProtectRWE: never writable and executable).
  // max_bytes: kMaxCodeBytes, or more for the tile body's emulated tile unit
  // (tests only, kFlagTileEmu).
  explicit Generator(size_t max_bytes = kMaxCodeBytes)
      : Xbyak::CodeGenerator(max_bytes, Xbyak::DontSetProtectRWE) {}
  const std::vector<CodePhase>& phases() const { return phases_; }

  // Helpers the body and the decoders emit with.
  // Loads a 32-bit pattern broadcast into a vector register.
  void broadcast_u32(const Xbyak::Xmm& v, uint32_t pattern, const Xbyak::Reg32& tmp);
  // Exact load of `bytes` (< 16) bytes at `base` into an xmm, zeros above: the
  // avx2 tail, which has no masked byte loads.
  void load_partial_xmm(const Xbyak::Xmm& dst, const Xbyak::RegExp& base, int bytes);
  // The bits of an fp32 constant, as data.
  void df32(float f);

  // Marks the start of a named phase at the current position (consecutive
  // marks with the same name collapse into one).
  void phase(const char* name) {
    if (!phases_.empty() && phases_.back().name == name) return;
    phases_.push_back({getSize(), name});
  }

 protected:
  // Resolves labels, flips the pages to read+exec and checks Xbyak's error.
  bool finalize(std::string* err);

  // SysV argument register.
  const Xbyak::Reg64 reg_args = rdi;

 private:
  std::vector<CodePhase> phases_;
};

}  // namespace moejit::jit
