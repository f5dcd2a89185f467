// Google Benchmark: the throughput of the instructions the decoders are made of, on the calling core.
// Each case generates a loop of kInstances independent instances: an instance writes its own register
// (and shared write-only scratch), and an instruction that accumulates into its destination
// (vfmadd231ps, vdpbf16ps, vpternlogd, vpermi2b) forms one chain per instance, 24 chains in all, so
// the time per instance is its reciprocal throughput unless the latency exceeds 24 times that.
// `cycles` divides it by the time of one 1-cycle scalar add in a dependent chain, measured in the same
// run (the `add_chain` case), so it reads as cycles wherever the clock runs. Which decode costs what on
// a CPU (jit/decode_*.cpp; docs/PERFORMANCE.md) comes from these figures: for one, `vdpbf16ps`
// against two `vfmadd231ps` per 32 products. The `_ymm` cases are the 256-bit forms, run in loops
// without 512-bit instructions (Intel cores then use a third vector port). The `clock/` cases run
// a case's instances beside one dependent chain of scalar adds, enough adds per instance that the
// chain bounds the loop, so their `clock` is the core's clock while those vector instructions run,
// over the clock of `add_chain` (1: unchanged; below 1: the core slows down for them, as Intel cores
// do for heavy 512-bit instructions). Cases the CPU lacks (AVX512_BF16, VBMI) are skipped.
// The `tile/` cases time the steps of the tile body (jit/tile_body.cpp) with one token, in cycles
// per step (16 rows x 32 elements): the decode's 16 buffer stores, the tile loads and the
// tdpbf16ps a step (or three) later, the flush of C per scale group, and the alternatives; they
// need the avx512_amx tier (AMX tile data granted), and are skipped elsewhere.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "jit/cpu.h"
#include "jit/generator.h"

namespace {

namespace jit = moejit::jit;
using Xbyak::Ymm;
using Xbyak::Zmm;
// Emits instance i of kInstances: it writes register i, and scratch registers 24..29 that no
// instruction reads; it reads registers 30 and 31, which nothing writes.
using Emit = std::function<void(jit::Generator&, int)>;

constexpr int kInstances = 24;
constexpr int64_t kLoopsPerCall = 4096;

// Bytes one iteration of a streaming `load/` case walks: a line per instance.
constexpr int kStride = 64 * kInstances;

// A loop of kLoopsPerCall iterations of the kInstances instances, called as void(void). rsi holds
// `mem` (the `load/` cases' buffer); with `stream` > 0 each iteration moves it kStride bytes on,
// back to `mem` after `stream` bytes (a multiple of kStride).
class PortLoop : public jit::Generator {
 public:
  PortLoop(const Emit& emit, const uint8_t* mem = nullptr, int64_t stream = 0) {
    for (int i = 0; i < 32; ++i) vpxord(Zmm(i), Zmm(i), Zmm(i));
    mov(rsi, reinterpret_cast<size_t>(mem));
    mov(r8, reinterpret_cast<size_t>(mem + stream));
    mov(rax, kLoopsPerCall);
    Xbyak::Label l_loop, l_next;
    L(l_loop);
    for (int i = 0; i < kInstances; ++i) emit(*this, i);
    if (stream > 0) {
      add(rsi, kStride);
      cmp(rsi, r8);
      jb(l_next);
      mov(rsi, reinterpret_cast<size_t>(mem));
      L(l_next);
    }
    dec(rax);
    jnz(l_loop, T_NEAR);
    vzeroupper();
    ret();
  }
  bool build(std::string* err) { return finalize(err); }
};

double add_chain_ns();

// What a case needs beyond AVX512F and AVX512BW.
enum Needs : int { kBf16 = 1, kVbmi = 2, kGfni = 4 };

// clock_adds > 0: the `clock/` form of the case (the header), with that many chained adds per instance.
// stream > 0: the case walks that many bytes of its buffer (PortLoop).
void bm_port(benchmark::State& state, Emit emit, int needs, int clock_adds, int64_t stream) {
  const jit::CpuFeatures& cpu = jit::host_features();
  if (!cpu.avx512f || !cpu.avx512bw || ((needs & kBf16) && !cpu.avx512_bf16) ||
      ((needs & kVbmi) && !cpu.avx512_vbmi) || ((needs & kGfni) && !cpu.gfni)) {
    state.SkipWithError("skipped: this CPU lacks the instruction");
    return;
  }
  // 512 KiB and a line: past L1, within L2 on the cores measured.
  constexpr int64_t kStreamBytes = kStride * 342;
  alignas(64) static uint8_t mem[kStreamBytes + 128] = {};
  PortLoop loop(
      clock_adds == 0 ? emit
                      : [&](jit::Generator& g, int i) {
                          emit(g, i);
                          for (int j = 0; j < clock_adds; ++j) g.add(g.rcx, g.rdx);
                        },
      mem, stream > 0 ? kStreamBytes : 0);
  std::string err;
  if (!loop.build(&err)) {
    state.SkipWithError(("skipped: " + err).c_str());
    return;
  }
  const auto fn = loop.getCode<void (*)()>();
  fn();
  double ns = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
  const double per_instance = ns / (double(state.iterations()) * kInstances * kLoopsPerCall);
  state.counters["ns"] = per_instance;
  state.counters["cycles"] = per_instance / add_chain_ns();
  state.counters["clock"] =
      clock_adds > 0 ? add_chain_ns() * clock_adds / per_instance : moejit_gbench::kNotApplicable;
}

// Nanoseconds of one dependent scalar add (one cycle): the best of 5 runs of 64 calls of a loop of
// kInstances x 8 chained adds per iteration.
double add_chain_ns() {
  static const double ns = [] {
    PortLoop loop([](jit::Generator& g, int) {
      for (int j = 0; j < 8; ++j) g.add(g.rcx, g.rdx);
    });
    std::string err;
    if (!loop.build(&err)) return 0.0;
    const auto fn = loop.getCode<void (*)()>();
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 64; ++i) fn();
      const std::chrono::duration<double, std::nano> d = std::chrono::steady_clock::now() - t0;
      best = std::min(best, d.count() / (64.0 * kInstances * 8 * kLoopsPerCall));
    }
    return best;
  }();
  return ns;
}

struct Case {
  std::string name;
  Emit emit;
  int needs = 0;        // Needs
  int clock_adds = 0;   // > 0: also a `clock/` case with this many adds per instance
  bool stream = false;  // walks 512 KiB of its buffer (PortLoop), not one line per instance
};

// A bf16-pair 4-bit step in registers of type R (Zmm or Ymm): a shift, a table lookup, a
// vdpbf16ps into register i.
template <class R>
Emit pair_step() {
  return [](jit::Generator& g, int i) {
    g.vpsrlw(R(24), R(30), 4);
    g.vpermw(R(25), R(30), R(31));
    g.vdpbf16ps(R(i), R(30), R(31));
  };
}

// Sources are registers 30 and 31 (never written); s, t are write-only scratch.
std::vector<Case> cases() {
  const Zmm a(30), b(31), s(24), t(25);
  const Ymm ya(30), yb(31);
  return {
      {"vfmadd231ps", [=](jit::Generator& g, int i) { g.vfmadd231ps(Zmm(i), a, b); }, 0, 6},
      {"vdpbf16ps", [=](jit::Generator& g, int i) { g.vdpbf16ps(Zmm(i), a, b); }, kBf16, 6},
      {"vmulps", [=](jit::Generator& g, int i) { g.vmulps(Zmm(i), a, b); }},
      {"vcvtdq2ps", [=](jit::Generator& g, int i) { g.vcvtdq2ps(Zmm(i), a); }},
      {"vcvtph2ps", [=](jit::Generator& g, int i) { g.vcvtph2ps(Zmm(i), Xbyak::Ymm(30)); }},
      // clock/vpandd: a light 512-bit instruction, the control for the clock of the others
      {"vpandd", [=](jit::Generator& g, int i) { g.vpandd(Zmm(i), a, b); }, 0, 6},
      {"vpternlogd", [=](jit::Generator& g, int i) { g.vpternlogd(Zmm(i), a, b, 0xE4); }},
      {"vpsrld_imm", [=](jit::Generator& g, int i) { g.vpsrld(Zmm(i), a, 4); }},
      {"vpsrlw", [=](jit::Generator& g, int i) { g.vpsrlw(Zmm(i), a, 4); }},
      {"vpsrlvd", [=](jit::Generator& g, int i) { g.vpsrlvd(Zmm(i), a, b); }},
      {"vpermps", [=](jit::Generator& g, int i) { g.vpermps(Zmm(i), a, b); }},
      {"vpermps_kz", [=](jit::Generator& g, int i) { g.vpermps(Zmm(i) | g.k1 | g.T_z, a, b); }},
      {"vpermw", [=](jit::Generator& g, int i) { g.vpermw(Zmm(i), a, b); }, 0, 6},
      {"vpermb", [=](jit::Generator& g, int i) { g.vpermb(Zmm(i), a, b); }, kVbmi},
      {"vpermi2b", [=](jit::Generator& g, int i) { g.vpermi2b(Zmm(i), a, b); }, kVbmi},
      {"vpshufb", [=](jit::Generator& g, int i) { g.vpshufb(Zmm(i), a, b); }},
      {"vgf2p8affineqb", [=](jit::Generator& g, int i) { g.vgf2p8affineqb(Zmm(i), a, b, 0); }, kGfni},
      {"vpmovzxbd", [=](jit::Generator& g, int i) { g.vpmovzxbd(Zmm(i), Xbyak::Xmm(30)); }},
      // The mixes of a 4-bit step (an instance: the three): a shift, a table lookup and an FMA
      // in fp32 (16 products); a shift, a table lookup and a vdpbf16ps in bf16 pairs (32).
      {"vpsrld+vpermps+vfmadd231ps",
       [=](jit::Generator& g, int i) {
         g.vpsrld(s, a, 4);
         g.vpermps(t, a, b);
         g.vfmadd231ps(Zmm(i), a, b);
       }},
      {"vpsrlw+vpermw+vdpbf16ps", pair_step<Zmm>(), kBf16, 10},
      // Loads from L1, an instance its own line (rsi): whole lines, and lines split at byte 16
      // (a K-quant's 64-byte quants after its 16-byte header) or a 16-byte load across a line.
      {"load/zmm", [=](jit::Generator& g, int i) { g.vmovdqu32(Zmm(i), g.zword[g.rsi + 64 * i]); }},
      {"load/zmm_split",
       [=](jit::Generator& g, int i) { g.vmovdqu32(Zmm(i), g.zword[g.rsi + 64 * i + 16]); }},
      {"load/xmm_split",
       [=](jit::Generator& g, int i) { g.vmovdqu32(Xbyak::Xmm(i), g.xword[g.rsi + 64 * i + 56]); }},
      // The same, walking 512 KiB: each line comes from L2, as a kernel's weights do.
      {"load/l2_zmm", [=](jit::Generator& g, int i) { g.vmovdqu32(Zmm(i), g.zword[g.rsi + 64 * i]); }, 0, 0,
       true},
      {"load/l2_zmm_split",
       [=](jit::Generator& g, int i) { g.vmovdqu32(Zmm(i), g.zword[g.rsi + 64 * i + 16]); }, 0, 0, true},
      {"vdpbf16ps_mem", [=](jit::Generator& g, int i) { g.vdpbf16ps(Zmm(i), a, g.zword[g.rsi + 64 * i]); },
       kBf16},
      // 256-bit forms (16 products per vdpbf16ps, 8 per FMA).
      {"vfmadd231ps_ymm", [=](jit::Generator& g, int i) { g.vfmadd231ps(Ymm(i), ya, yb); }, 0, 6},
      {"vdpbf16ps_ymm", [=](jit::Generator& g, int i) { g.vdpbf16ps(Ymm(i), ya, yb); }, kBf16},
      {"vpsrlw_ymm", [=](jit::Generator& g, int i) { g.vpsrlw(Ymm(i), ya, 4); }},
      {"vpermw_ymm", [=](jit::Generator& g, int i) { g.vpermw(Ymm(i), ya, yb); }},
      {"vpsrlw+vpermw+vdpbf16ps_ymm", pair_step<Ymm>(), kBf16, 10},
  };
}

// Which ports an instruction takes: `mix/X+2vpsrld` runs case X beside two shifts (port 0 only on
// the cores measured), `mix/X+2vpermps` beside two `vpermps` (port 5 only), so X's share of each
// port is the mix's time minus 2 where that port bounds it (docs/TOOLS.md). X: the decoders'
// instructions among cases(), and the 4-bit pair step.
std::vector<Case> port_mixes() {
  const Zmm a(30), b(31);
  const char* const probes[] = {
      "vfmadd231ps", "vdpbf16ps",      "vpermw",     "vpermb",     "vpshufb",
      "vpsrlw",      "vpsrlvd",        "vpternlogd", "vcvtdq2ps",  "vcvtph2ps",
      "vpmovzxbd",   "vgf2p8affineqb", "vpermi2b",   "vpermps_kz", "vpsrlw+vpermw+vdpbf16ps"};
  const std::vector<Case> all = cases();
  std::vector<Case> out;
  for (const char* name : probes) {
    const auto c = std::find_if(all.begin(), all.end(), [&](const Case& k) { return k.name == name; });
    if (c == all.end()) continue;
    const Emit x = c->emit;
    auto beside = [&](const char* what, const Emit& partner) {
      out.push_back({std::string("mix/") + name + "+2" + what,
                     [=](jit::Generator& g, int i) {
                       x(g, i);
                       partner(g, 0);
                       partner(g, 1);
                     },
                     c->needs});
    };
    beside("vpsrld", [=](jit::Generator& g, int j) { g.vpsrld(Zmm(26 + j), a, 4); });
    beside("vpermps", [=](jit::Generator& g, int j) { g.vpermps(Zmm(28 + j), a, b); });
  }
  return out;
}

// ---- tile/: the tile body's step, one token ----
// A step: `permw` vpermw per row (standing in for a decode's shuffles) and, with `stores`, the 16
// vector stores of the decoded rows into buffer set s % sets; the A tile from set (s - lag) % sets,
// the B tile (one token: 16 rows of 4 bytes; `diag`: 16 rows of 32 bytes from a ring of 8 tiles),
// a tdpbf16ps. Flushes: `flush` (every `flush` steps) stores C (16 rows of 4 bytes), zeroes it, and
// loads the C stored a step earlier into an FMA, as the body's deferred scale group does: every step
// is a scale group of 32 (or two of 16) elements, every 8 steps a group of 256, a K-quant
// super-block whose sub-block scales are folded into the bf16 weights (both C tiles, which the
// steps alternate, are flushed then); `diag` (eight groups in eight
// columns of C, x in column s % 8 of B) stores C every 8 steps and gathers each group's 16 rows
// from the previous store with one vpgatherdd into an FMA.
struct TileStep {
  bool products = true;
  bool stores = true;
  int lag = 1;
  int permw = 0;
  int flush = 0;  // steps per scale group; 0: no flush
  bool diag = false;
  // An e2m1 row's decode with its power-of-two group scales folded into the bf16 weights: the
  // row's two group exponents shuffled into place, added to the table's nonzero entries (masked
  // vpaddw), the nibbles shifted, the group bit joined to the index (vpternlogd), and the lookup.
  bool fold = false;
};

constexpr int kTileSteps = 16;  // steps per loop iteration (sets of 2 and 4 keep their place)

class TileLoop : public jit::Generator {
 public:
  // rdi: the buffer sets; rsi: x; rdx: C stores; the number of iterations in rcx.
  explicit TileLoop(const TileStep& t) {
    const int sets = t.lag + 1, cols = t.diag ? 8 : 1;
    Xbyak::Label l_cfg, l_idx, l_loop;
    ldtilecfg(ptr[rip + l_cfg]);
    mov(r8, 64);
    mov(r9, 4 * cols);
    vpxord(Zmm(20), Zmm(20), Zmm(20));
    vmovdqu32(Zmm(30), ptr[rip + l_idx]);
    kxnorw(k2, k2, k2);
    tilezero(Xbyak::Tmm(0));
    tilezero(Xbyak::Tmm(1));
    L(l_loop);
    for (int s = 0; s < kTileSteps; ++s) {
      const int dset = s % sets, lset = (s - t.lag + kTileSteps) % sets, ab = s & 1;
      for (int r = 0; r < 16; ++r) {
        const Zmm z(r % 8);
        for (int w = 0; w < t.permw; ++w) vpermw(Zmm(8 + (w + r) % 8), Zmm(16 + w % 4), z);
        if (t.fold) {
          const Zmm e(22 + r % 2), table(24 + r % 2), idx(r % 2 ? 31 : 27);
          vpermw(e, Zmm(28), Zmm(29));
          vpaddw(table | k2 | T_z, Zmm(26), e);  // k2: the nonzero entries (all ones here)
          vpsrlw(idx, z, 4);
          vpternlogd(idx, Zmm(17), Zmm(18), 0xE4);
          vpermw(Zmm(8 + r % 8), idx, table);
        }
        if (t.stores) {
          vpaddd(z, z, Zmm(20));
          vmovups(ptr[rdi + dset * 1024 + 64 * r], z);
        }
      }
      if (!t.products) continue;
      tileloadd(Xbyak::Tmm(2 + ab), ptr[rdi + r8 + lset * 1024]);
      tileloadd(Xbyak::Tmm(4 + ab), ptr[rsi + r9 + (t.diag ? (s % 8) * 512 : s * 64)]);
      const int c = t.diag ? (s / 8) & 1 : ab;
      tdpbf16ps(Xbyak::Tmm(c), Xbyak::Tmm(2 + ab), Xbyak::Tmm(4 + ab));
      if (t.flush > 0 && s % t.flush == t.flush - 1) {
        if (t.flush > 1) flush_c(c ^ 1);  // a group of several steps: both C tiles hold it
        flush_c(c);
      } else if (t.diag && s % 8 == 7) {
        tilestored(ptr[rdx + r9 + c * 1024], Xbyak::Tmm(c));
        tilezero(Xbyak::Tmm(c));
        for (int g = 0; g < 8; ++g) {
          kxnorw(k1, k1, k1);
          vpgatherdd(Zmm(10) | k1, ptr[rdx + Zmm(30) + ((c ^ 1) * 1024 + 4 * g)]);
          vfmadd231ps(Zmm(21), Zmm(10), Zmm(20));
        }
      }
    }
    dec(rcx);
    jnz(l_loop, T_NEAR);
    tilerelease();
    vzeroupper();
    ret();
    align(64);
    L(l_cfg);  // palette 1: C tmm0-1 (16 x 4 cols), A tmm2-3 (16 x 64), B tmm4-5 (16 x 4 cols)
    uint8_t cfg[64] = {};
    cfg[0] = 1;
    for (int i = 0; i < 6; ++i) {
      cfg[16 + 2 * i] = uint8_t(i == 2 || i == 3 ? 64 : 4 * cols);
      cfg[48 + i] = 16;
    }
    for (uint8_t b : cfg) db(b);
    L(l_idx);  // row r of a C store at 4 cols r bytes
    for (int l = 0; l < 16; ++l) dd(uint32_t(4 * cols * l));
  }
  bool build(std::string* err) { return finalize(err); }

 private:
  // C tile c to its store (16 rows of 4 bytes), zeroed, and the other tile's last store into an FMA.
  void flush_c(int c) {
    vmovups(Zmm(9), ptr[rdx + (c ^ 1) * 1024]);
    vfmadd231ps(Zmm(21), Zmm(9), Zmm(20));
    tilestored(ptr[rdx + r9 + c * 1024], Xbyak::Tmm(c));
    tilezero(Xbyak::Tmm(c));
  }
};

void bm_tile(benchmark::State& state, TileStep t) {
  if (!jit::isa_available(jit::Isa::avx512_amx)) {
    state.SkipWithError("skipped: no avx512_amx tier here (AMX tile data)");
    return;
  }
  TileLoop loop(t);
  std::string err;
  if (!loop.build(&err)) {
    state.SkipWithError(("skipped: " + err).c_str());
    return;
  }
  alignas(64) static uint8_t sets[4 * 1024] = {}, x[kTileSteps * 512] = {}, c[2 * 1024] = {};
  const auto fn = loop.getCode<void (*)(void*, void*, void*, int64_t)>();
  constexpr int64_t kIters = 1024;
  fn(sets, x, c, kIters);
  double ns = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(sets, x, c, kIters);
    ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
  const double per_step = ns / (double(state.iterations()) * kIters * kTileSteps);
  state.counters["ns"] = per_step;
  state.counters["cycles"] = per_step / add_chain_ns();
  state.counters["clock"] = moejit_gbench::kNotApplicable;
}

std::vector<std::pair<std::string, TileStep>> tile_cases() {
  std::vector<std::pair<std::string, TileStep>> out = {
      {"tile/products", {true, false}},
      {"tile/stores", {false, true}},
  };
  for (int permw : {0, 1, 2}) {
    const std::string d = permw == 0 ? "" : permw == 1 ? "+1vpermw" : "+2vpermw";
    if (permw != 1) {
      out.push_back({"tile/stores" + d + "+products_lag1", {true, true, 1, permw}});
      out.push_back({"tile/stores" + d + "+products_lag1+flush", {true, true, 1, permw, 1}});
      out.push_back({"tile/stores" + d + "+products_lag1+diag8", {true, true, 1, permw, 0, true}});
    }
    out.push_back({"tile/stores" + d + "+products_lag3", {true, true, 3, permw}});
    out.push_back({"tile/stores" + d + "+products_lag3+flush", {true, true, 3, permw, 1}});
    out.push_back({"tile/stores" + d + "+products_lag3+flush8", {true, true, 3, permw, 8}});
  }
  out.push_back({"tile/stores+fold+products_lag3+flush8", {true, true, 3, 0, 8, false, true}});
  out.push_back({"tile/2vpermw", {false, false, 1, 2}});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RegisterBenchmark("port/add_chain", [](benchmark::State& state) {
    for (auto _ : state) benchmark::DoNotOptimize(add_chain_ns());
    state.counters["ns"] = add_chain_ns();
    state.counters["cycles"] = 1;
    state.counters["clock"] = 1;
  });
  for (const Case& c : cases())
    benchmark::RegisterBenchmark((std::string("port/") + c.name).c_str(), bm_port, c.emit, c.needs, 0,
                                 int64_t(c.stream));
  for (const Case& c : port_mixes())
    benchmark::RegisterBenchmark(c.name.c_str(), bm_port, c.emit, c.needs, 0, 0);
  for (const Case& c : cases())
    if (c.clock_adds > 0)
      benchmark::RegisterBenchmark((std::string("clock/") + c.name).c_str(), bm_port, c.emit, c.needs,
                                   c.clock_adds, 0);
  for (const auto& [name, t] : tile_cases()) benchmark::RegisterBenchmark(name.c_str(), bm_tile, t);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
