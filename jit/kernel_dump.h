// Disassembly listings and dump files of generated kernels: moejit-dump, and
// the MOEJIT_DUMP_DIR / MOEJIT_PERF_MAP hooks the kernel cache calls after
// each successful generation. Disassembly needs Zydis (found at configure
// time); without it listings are unavailable and only raw bytes are written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "jit/gemv.h"

namespace moejit::jit {

// Bumped whenever the generator emits different code for the same key, so dumps
// and perf maps of two builds can be told apart.
constexpr int kGeneratorVersion = 25;

// True when this build links Zydis.
bool disassembler_available();

// Intel-syntax listing of `size` bytes of code, one instruction per line:
//   "  0x001a  c5 fc 58 c1                  vaddps ymm0, ymm0, ymm1"
// Addresses are offsets from the start of the code. A "; --- <name> ---" line
// precedes the instruction at which each phase starts; a "data" phase is
// printed as bytes, not decoded. False and *err when Zydis is unavailable.
bool disassemble(const uint8_t* code, size_t size, const std::vector<std::pair<size_t, std::string>>& phases,
                 std::string* out, std::string* err);

// Header comments (name, code size, generator version) followed by the listing:
// the text of moejit-dump and of the .s files of MOEJIT_DUMP_DIR.
bool kernel_listing(const Kernel& k, std::string* out, std::string* err);

// Writes <dir>/<name>.bin (the code bytes) and, when Zydis is available,
// <dir>/<name>.s. Creates `dir` if missing. Files appear atomically (written
// under a temporary name and renamed).
bool write_kernel_files(const Kernel& k, const std::string& dir, std::string* err);

// "<hex start> <hex size> moejit_<name>", the line perf reads from /tmp/perf-<pid>.map.
std::string perf_map_line(const Kernel& k);

// Called by the kernel cache right after a kernel is generated. Reads
// MOEJIT_DUMP_DIR and MOEJIT_PERF_MAP now (not cached); a failure is reported on
// stderr once per process and never fails the generation.
void on_kernel_generated(const Kernel& k) noexcept;

}  // namespace moejit::jit
