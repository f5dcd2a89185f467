#include "jit/kernel_dump.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "formats/formats.h"

#if defined(MOEJIT_HAVE_ZYDIS)
#include <Zydis/Zydis.h>
#endif

namespace moejit::jit {

namespace {

bool write_file(const std::string& path, const void* data, size_t size, std::string* err) {
  // Written under a temporary name, then renamed: readers never see half a file.
  static std::atomic<unsigned> seq{0};
  const std::string tmp = path + ".tmp" + std::to_string(getpid()) + "_" + std::to_string(seq.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *err = tmp + ": " + std::strerror(errno);
    return false;
  }
  const uint8_t* p = static_cast<const uint8_t*>(data);
  size_t left = size;
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *err = tmp + ": " + std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return false;
    }
    p += w;
    left -= size_t(w);
  }
  if (::close(fd) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    *err = path + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

// One stderr line per kind of failure per process: a dump dir that cannot be
// written would otherwise print once per kernel.
void report_once(std::atomic<bool>* reported, const std::string& msg) {
  if (!reported->exchange(true)) std::fprintf(stderr, "moejit: %s\n", msg.c_str());
}

std::atomic<bool> g_dump_reported{false};
std::atomic<bool> g_listing_reported{false};
std::atomic<bool> g_perf_reported{false};

void dump_to_dir(const Kernel& k, const char* dir) {
  std::string err;
  if (!write_kernel_files(k, dir, &err)) {
    report_once(&g_dump_reported, "MOEJIT_DUMP_DIR: cannot write " + k.key().name() + ": " + err +
                                      " (further dump errors are not reported)");
  } else if (!disassembler_available()) {
    report_once(&g_listing_reported,
                "MOEJIT_DUMP_DIR: this build has no disassembler (Zydis); writing .bin files only");
  }
}

void append_perf_map(const Kernel& k) {
  const std::string path = "/tmp/perf-" + std::to_string(getpid()) + ".map";
  const std::string line = perf_map_line(k) + "\n";
  // O_APPEND and a single write: lines of concurrent generations never interleave.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  if (ok) {
    ssize_t w;
    do {
      w = ::write(fd, line.data(), line.size());
    } while (w < 0 && errno == EINTR);
    ok = w == ssize_t(line.size());
    ok = (::close(fd) == 0) && ok;
  }
  if (!ok)
    report_once(&g_perf_reported, "MOEJIT_PERF_MAP: cannot append to " + path + ": " + std::strerror(errno));
}

}  // namespace

#if defined(MOEJIT_HAVE_ZYDIS)

namespace {

void append_offset(std::string* out, size_t off) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "  0x%04zx  ", off);
  *out += buf;
}

void append_bytes(std::string* out, const uint8_t* p, size_t n, size_t min_width) {
  static const char kHex[] = "0123456789abcdef";
  const size_t start = out->size();
  for (size_t i = 0; i < n; ++i) {
    *out += kHex[p[i] >> 4];
    *out += kHex[p[i] & 15];
    *out += ' ';
  }
  while (out->size() - start < min_width) *out += ' ';
}

// Phases sorted by offset, each one's end the next one's start.
std::vector<std::pair<size_t, std::string>> sorted_phases(std::vector<std::pair<size_t, std::string>> p) {
  std::stable_sort(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return p;
}

}  // namespace

bool disassembler_available() { return true; }

bool disassemble(const uint8_t* code, size_t size,
                 const std::vector<std::pair<size_t, std::string>>& phases_in, std::string* out,
                 std::string* err) {
  ZydisDecoder dec;
  ZydisFormatter fmt;
  if (ZYAN_FAILED(ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64)) ||
      ZYAN_FAILED(ZydisFormatterInit(&fmt, ZYDIS_FORMATTER_STYLE_INTEL)) ||
      ZYAN_FAILED(ZydisFormatterSetProperty(&fmt, ZYDIS_FORMATTER_PROP_HEX_UPPERCASE, ZYAN_FALSE)) ||
      ZYAN_FAILED(ZydisFormatterSetProperty(&fmt, ZYDIS_FORMATTER_PROP_ADDR_PADDING_ABSOLUTE,
                                            ZYDIS_PADDING_DISABLED))) {
    *err = "cannot initialise the Zydis decoder";
    return false;
  }
  const auto phases = sorted_phases(phases_in);
  size_t next_phase = 0;
  bool data = false;
  std::string text;
  text.reserve(size * 12);
  size_t off = 0;
  while (off < size) {
    size_t end = size;  // the current phase ends where the next one starts
    while (next_phase < phases.size() && phases[next_phase].first <= off) {
      text += "; --- " + phases[next_phase].second + " ---\n";
      data = phases[next_phase].second == "data";
      ++next_phase;
    }
    if (next_phase < phases.size()) end = phases[next_phase].first;
    if (data) {
      const size_t n = std::min<size_t>(16 - off % 16, end - off);  // lines start at 16-byte boundaries
      append_offset(&text, off);
      text += ".byte ";
      append_bytes(&text, code + off, n, 0);
      text.back() = '\n';
      off += n;
      continue;
    }
    ZydisDecodedInstruction insn;
    ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
    append_offset(&text, off);
    if (ZYAN_FAILED(ZydisDecoderDecodeFull(&dec, code + off, size - off, &insn, ops))) {
      append_bytes(&text, code + off, 1, 36);
      text += "(bad)\n";
      off += 1;
      continue;
    }
    char buf[256];
    if (ZYAN_FAILED(ZydisFormatterFormatInstruction(&fmt, &insn, ops, insn.operand_count_visible, buf,
                                                    sizeof(buf), ZyanU64(off), nullptr)))
      std::snprintf(buf, sizeof(buf), "(unformattable)");
    append_bytes(&text, code + off, insn.length, 36);
    text += buf;
    text += '\n';
    off += insn.length;
  }
  // Phases that start at the very end (an empty trailing region) still show.
  for (; next_phase < phases.size(); ++next_phase) text += "; --- " + phases[next_phase].second + " ---\n";
  *out = std::move(text);
  return true;
}

#else

bool disassembler_available() { return false; }

bool disassemble(const uint8_t*, size_t, const std::vector<std::pair<size_t, std::string>>&, std::string*,
                 std::string* err) {
  *err = "this build of moejit has no disassembler (Zydis was not found at configure time)";
  return false;
}

#endif

bool kernel_listing(const Kernel& k, std::string* out, std::string* err) {
  std::string body;
  if (!disassemble(k.code(), k.code_size(), k.phases(), &body, err)) return false;
  const KernelKey& key = k.key();
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "; %s\n"
                "; format %s (%d), k %d, rows %d, tokens %d, scale_stride %" PRId64
                ", scale_dtype %s, group %d, isa %s, flags %u\n"
                "; code size %zu bytes, generator version %d\n",
                key.name().c_str(), formats::format_name(key.format), int(key.format), key.k, key.rows,
                key.tokens, key.scale_stride, key.scale_dtype == 1 ? "f32" : "bf16", key.group,
                isa_name(key.isa), key.flags, k.code_size(), kGeneratorVersion);
  *out = buf + body;
  return true;
}

bool write_kernel_files(const Kernel& k, const std::string& dir, std::string* err) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    *err = dir + ": " + ec.message();
    return false;
  }
  const std::string base = dir + "/" + k.key().name();
  if (!write_file(base + ".bin", k.code(), k.code_size(), err)) return false;
  if (!disassembler_available()) return true;
  std::string listing;
  if (!kernel_listing(k, &listing, err)) return false;
  return write_file(base + ".s", listing.data(), listing.size(), err);
}

std::string perf_map_line(const Kernel& k) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%" PRIxPTR " %zx ", reinterpret_cast<uintptr_t>(k.code()), k.code_size());
  return buf + ("moejit_" + k.key().name());
}

void on_kernel_generated(const Kernel& k) noexcept {
  try {
    const char* dir = std::getenv("MOEJIT_DUMP_DIR");
    if (dir && *dir) dump_to_dir(k, dir);
    const char* perf = std::getenv("MOEJIT_PERF_MAP");
    if (perf && std::strcmp(perf, "1") == 0) append_perf_map(k);
  } catch (...) {
    // Out of memory while formatting: dumps are best effort, generation stands.
  }
}

}  // namespace moejit::jit
