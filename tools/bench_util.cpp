#include "bench_util.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace moejit_bench {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;

void pin_to(std::thread& t, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(t.native_handle(), sizeof(set), &set);  // best effort
}

using ReadFn = uint64_t (*)(const uint8_t* p, size_t stream_bytes, size_t distance);

template <Prefetch kHint>
inline void prefetch_line(const uint8_t* p) {
  if constexpr (kHint == Prefetch::t0) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
  if constexpr (kHint == Prefetch::t1) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
  if constexpr (kHint == Prefetch::nta) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_NTA);
}

// kStreams cursors, stream s at p + s * stream_bytes; 128 bytes of each per step, in turn, into
// four 256-bit accumulators. With kStreams = 1 and no prefetch this is the probe of before.
template <int kStreams, Prefetch kHint>
__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, size_t stream_bytes, size_t distance) {
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
  for (size_t i = 0; i + 128 <= stream_bytes; i += 128) {
#pragma GCC unroll 8
    for (int s = 0; s < kStreams; ++s) {
      const uint8_t* q = p + size_t(s) * stream_bytes + i;
      if constexpr (kHint != Prefetch::none) {
        prefetch_line<kHint>(q + distance);
        prefetch_line<kHint>(q + distance + 64);
      }
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j)
        acc[j] = _mm256_add_epi64(acc[j], _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 32 * j)));
    }
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// The same with 512-bit loads: two per 128 bytes, four accumulators over pairs of streams.
template <int kStreams, Prefetch kHint>
__attribute__((target("avx512f"))) uint64_t read_avx512(const uint8_t* p, size_t stream_bytes,
                                                        size_t distance) {
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                    _mm512_setzero_si512()};
  for (size_t i = 0; i + 128 <= stream_bytes; i += 128) {
#pragma GCC unroll 8
    for (int s = 0; s < kStreams; ++s) {
      const uint8_t* q = p + size_t(s) * stream_bytes + i;
      if constexpr (kHint != Prefetch::none) {
        prefetch_line<kHint>(q + distance);
        prefetch_line<kHint>(q + distance + 64);
      }
      const int a = (2 * s) % 4;
      acc[a] = _mm512_add_epi64(acc[a], _mm512_load_si512(q));
      acc[a + 1] = _mm512_add_epi64(acc[a + 1], _mm512_load_si512(q + 64));
    }
  }
  const __m512i s = _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3]));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, s);
  uint64_t sum = 0;
  for (uint64_t l : lanes) sum += l;
  return sum;
}

template <Prefetch kHint>
ReadFn pick_streams(const ReadVariant& v) {
  const bool w = v.vector_bytes == 64;
  switch (v.streams) {
    case 1: return w ? read_avx512<1, kHint> : read_avx2<1, kHint>;
    case 2: return w ? read_avx512<2, kHint> : read_avx2<2, kHint>;
    case 4: return w ? read_avx512<4, kHint> : read_avx2<4, kHint>;
    case 8: return w ? read_avx512<8, kHint> : read_avx2<8, kHint>;
  }
  return nullptr;
}

ReadFn pick(const ReadVariant& v) {
  if (!v.available()) return nullptr;
  switch (v.prefetch) {
    case Prefetch::none: return pick_streams<Prefetch::none>(v);
    case Prefetch::t0: return pick_streams<Prefetch::t0>(v);
    case Prefetch::t1: return pick_streams<Prefetch::t1>(v);
    case Prefetch::nta: return pick_streams<Prefetch::nta>(v);
  }
  return nullptr;
}

constexpr size_t kChunk = size_t(2) << 20;  // the dynamic schedule's unit of work

}  // namespace

Buffer::Buffer(size_t bytes, bool huge_pages) {
  if (bytes == 0) return;
  mapped_ = (bytes + kHugePage - 1) / kHugePage * kHugePage + kHugePage;
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    mapped_ = 0;
    throw std::runtime_error("cannot map " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  }
  base_ = static_cast<uint8_t*>(p);
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(p) + kHugePage - 1) & ~(kHugePage - 1);
  data_ = reinterpret_cast<uint8_t*>(aligned);
  size_ = bytes;
  madvise(data_, (bytes + kHugePage - 1) / kHugePage * kHugePage,
          huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    this->~Buffer();
    base_ = std::exchange(other.base_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

Buffer::~Buffer() {
  if (base_) munmap(base_, mapped_);
  base_ = data_ = nullptr;
  size_ = mapped_ = 0;
}

int64_t Buffer::huge_page_bytes() const {
  if (!data_) return 0;
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return -1;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(data_), hi = lo + size_;
  int64_t total = 0;
  bool inside = false, found = false;
  uintptr_t overlap = 0;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t a = 0, b = 0;
    char dash = 0;
    if (std::sscanf(line.c_str(), "%lx%c%lx", &a, &dash, &b) == 3 && dash == '-' &&
        line.find(':') > line.find(' ')) {
      inside = a < hi && b > lo;  // a mapping's first line: "start-end perms offset dev inode [path]"
      overlap = inside ? std::min(b, hi) - std::max(a, lo) : 0;
      continue;
    }
    if (!inside || line.rfind("AnonHugePages:", 0) != 0) continue;
    found = true;
    total += std::min<int64_t>(int64_t(overlap), std::stoll(line.substr(14)) * 1024);
  }
  return found ? total : -1;
}

std::vector<int> affinity_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

int64_t l3_cache_bytes() {
  std::set<std::string> seen;  // one entry per L3 instance (the CPUs that share it)
  int64_t total = 0;
  for (int cpu : affinity_cpus()) {
    for (int i = 0; i < 8; ++i) {
      const std::string dir =
          "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache/index" + std::to_string(i) + "/";
      std::ifstream level(dir + "level"), size(dir + "size"), shared(dir + "shared_cpu_list"), id(dir + "id");
      int lv = 0;
      std::string s, who;
      if (!(level >> lv) || !(size >> s)) continue;
      if (lv != 3 || s.empty()) continue;
      // Which L3 this is: the CPUs sharing it, else its id, else the one L3 of every CPU (never
      // counted twice when sysfs cannot tell them apart).
      if (!(shared >> who) && id >> who) who = "id " + who;
      if (!seen.insert(who).second) break;
      int64_t v = std::stoll(s);
      const char unit = s.back();
      if (unit == 'K') v <<= 10;
      if (unit == 'M') v <<= 20;
      total += v;
      break;
    }
  }
  if (total > 0) return total;
  const long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return v > 0 ? v : 0;
}

std::string cpu_model_name() {
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown CPU" : line.substr(start);
  }
  return "unknown CPU";
}

int64_t physical_memory_bytes() { return int64_t(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE); }

void parallel_for(int64_t num_chunks, int threads, const std::function<void(int64_t)>& fn) {
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t c; (c = next.fetch_add(1)) < num_chunks;) fn(c);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min<int64_t>(threads, num_chunks); ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

void fill_words(uint8_t* dst, size_t bytes, uint64_t seed, uint64_t (*shape)(uint64_t)) {
  constexpr size_t kChunk = size_t(16) << 20;
  const int64_t chunks = int64_t((bytes + kChunk - 1) / kChunk);
  parallel_for(chunks, int(affinity_cpus().size()), [&](int64_t c) {
    Rng rng(seed ^ (uint64_t(c) * 0xD1B54A32D192ED03ull));
    const size_t begin = size_t(c) * kChunk, end = std::min(bytes, begin + kChunk);
    size_t i = begin;
    for (; i + 8 <= end; i += 8) {
      const uint64_t w = shape(rng.next());
      std::memcpy(dst + i, &w, 8);
    }
    if (i < end) {
      const uint64_t w = shape(rng.next());
      std::memcpy(dst + i, &w, end - i);
    }
  });
}

CpuSample sample_cpu() {
  CpuSample s;
  s.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::ifstream stat("/proc/stat");
  std::string cpu;
  uint64_t v[8] = {};  // user nice system idle iowait irq softirq steal
  if (stat >> cpu && cpu == "cpu") {
    for (uint64_t& x : v) stat >> x;
    const uint64_t busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    s.machine_busy_s = double(busy) / double(sysconf(_SC_CLK_TCK));
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  s.self_s = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
             1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  return s;
}

double foreign_cpus(const CpuSample& a, const CpuSample& b) {
  const double wall = b.wall_s - a.wall_s;
  if (wall <= 0 || b.machine_busy_s <= 0) return 0.0;
  return std::max(0.0, ((b.machine_busy_s - a.machine_busy_s) - (b.self_s - a.self_s)) / wall);
}

std::string ReadVariant::name() const {
  std::string s = std::string(vector_bytes == 64 ? "avx512" : "avx2") + " x" + std::to_string(streams);
  if (prefetch != Prefetch::none) {
    static const char* kHints[] = {"", "t0", "t1", "nta"};
    s += std::string(" ") + kHints[int(prefetch)] + "+" +
         (distance % 1024 ? std::to_string(distance) : std::to_string(distance / 1024) + "K");
  }
  if (dynamic) s += " dyn";
  return s;
}

bool ReadVariant::available() const {
  if (streams != 1 && streams != 2 && streams != 4 && streams != 8) return false;
  if (prefetch != Prefetch::none && (distance <= 0 || distance % 128)) return false;
  if (vector_bytes == 64) return __builtin_cpu_supports("avx512f");
  return vector_bytes == 32 && __builtin_cpu_supports("avx2");
}

namespace {

std::vector<ReadVariant> only_available(std::vector<ReadVariant> v) {
  std::erase_if(v, [](const ReadVariant& r) { return !r.available(); });
  return v;
}

}  // namespace

std::vector<ReadVariant> all_read_variants() {
  // Both load widths without prefetch; the prefetches with the widest loads this CPU has.
  const int widest = __builtin_cpu_supports("avx512f") ? 64 : 32;
  const std::pair<Prefetch, int> hints[] = {{Prefetch::t0, 1024},
                                            {Prefetch::t1, 1024},
                                            {Prefetch::t1, 4096},
                                            {Prefetch::t1, 16384},
                                            {Prefetch::nta, 1024}};
  std::vector<ReadVariant> v;
  for (bool dynamic : {false, true}) {
    for (int bytes : {32, 64})
      for (int streams : {1, 2, 4, 8}) v.push_back({bytes, streams, Prefetch::none, 0, dynamic});
    for (int streams : {1, 2, 4, 8})
      for (const auto& [hint, distance] : hints) v.push_back({widest, streams, hint, distance, dynamic});
  }
  return only_available(v);
}

std::vector<ReadVariant> startup_read_variants() {
  const int widest = __builtin_cpu_supports("avx512f") ? 64 : 32;
  return only_available({
      kPlainRead,
      {widest, 1, Prefetch::t1, 1024, false},
      {widest, 2, Prefetch::t1, 1024, false},
      {widest, 4, Prefetch::t1, 1024, false},
      {widest, 4, Prefetch::none, 0, false},
      {widest, 4, Prefetch::none, 0, true},
      {widest, 1, Prefetch::t0, 1024, true},
      {widest, 2, Prefetch::t1, 1024, true},
      {widest, 8, Prefetch::t1, 1024, true},
  });
}

bool parse_read_variant(const std::string& name, ReadVariant* out) {
  for (const ReadVariant& v : all_read_variants())
    if (v.name() == name) return *out = v, true;
  return false;
}

namespace {

struct Pass {
  double seconds = 0;
  uint64_t bytes = 0, sum = 0;
};

// `passes` rounds of one pass per variant, in turn, on one pinned thread pool: passes[p][v].
std::vector<std::vector<Pass>> read_passes(const Buffer& buffer, int threads, int passes,
                                           const std::vector<ReadVariant>& variants) {
  const size_t nv = variants.size();
  std::vector<ReadFn> fns;
  for (const ReadVariant& v : variants) {
    fns.push_back(pick(v));
    if (!fns.back()) throw std::runtime_error("read variant " + v.name() + " does not run on this CPU");
  }
  const std::vector<int> cpus = affinity_cpus();
  const size_t slice = buffer.size() / size_t(threads) / 4096 * 4096;
  const size_t chunks = buffer.size() / kChunk;
  std::barrier sync(threads + 1);
  std::atomic<uint64_t> sink{0};
  std::atomic<size_t> next_chunk{0};
  size_t current = 0;  // the variant of this pass, set before the start barrier
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t step = 0; step < size_t(passes) * nv; ++step) {
        sync.arrive_and_wait();  // start
        const ReadVariant& v = variants[current];
        const size_t streams = size_t(v.streams), distance = size_t(v.distance);
        uint64_t sum = 0;
        if (v.dynamic) {
          for (size_t c; (c = next_chunk.fetch_add(1, std::memory_order_relaxed)) < chunks;)
            sum += fns[current](buffer.data() + c * kChunk, kChunk / streams, distance);
        } else {
          sum = fns[current](buffer.data() + size_t(t) * slice, slice / streams / 128 * 128, distance);
        }
        sink.fetch_add(sum, std::memory_order_relaxed);
        sync.arrive_and_wait();  // done
      }
    });
    pin_to(pool.back(), cpus[size_t(t) % cpus.size()]);
  }
  std::vector<std::vector<Pass>> out(static_cast<size_t>(passes), std::vector<Pass>(nv));
  for (int pass = 0; pass < passes; ++pass) {
    for (size_t i = 0; i < nv; ++i) {
      const ReadVariant& v = variants[i];
      current = i;
      next_chunk.store(0, std::memory_order_relaxed);
      sink.store(0, std::memory_order_relaxed);
      const auto t0 = std::chrono::steady_clock::now();
      sync.arrive_and_wait();
      sync.arrive_and_wait();
      Pass& p = out[size_t(pass)][i];
      p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      p.bytes = v.dynamic ? chunks * kChunk
                          : slice / size_t(v.streams) / 128 * 128 * size_t(v.streams) * size_t(threads);
      p.sum = sink.load(std::memory_order_relaxed);
    }
  }
  for (auto& t : pool) t.join();
  return out;
}

}  // namespace

std::vector<double> measure_read_variants(const Buffer& buffer, int threads, int passes,
                                          const std::vector<ReadVariant>& variants) {
  const std::vector<std::vector<Pass>> runs = read_passes(buffer, threads, passes, variants);
  // The median, like the per-call times it is compared with.
  std::vector<double> out;
  for (size_t v = 0; v < variants.size(); ++v) {
    std::vector<double> rates;
    for (const std::vector<Pass>& run : runs) rates.push_back(double(run[v].bytes) / run[v].seconds / 1e9);
    std::sort(rates.begin(), rates.end());
    out.push_back(rates.empty() ? 0.0 : rates[rates.size() / 2]);
  }
  return out;
}

ReadCheck check_read_variant(const Buffer& buffer, int threads, const ReadVariant& variant) {
  const Pass p = read_passes(buffer, threads, 1, {variant}).front().front();
  return {p.bytes, p.sum};
}

double measure_read_bandwidth(const Buffer& buffer, int threads, int passes, const ReadVariant& variant) {
  return measure_read_variants(buffer, threads, passes, {variant}).front();
}

}  // namespace moejit_bench
