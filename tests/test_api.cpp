// The C API surface that needs no layer: versions, names, the context (tiers,
// MOEJIT_MAX_ISA, threads, cpu_ids, flags, struct_size), NULL handles and the
// per-thread error message (api.md).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "moejit.h"
#include "test_util.h"

using namespace moejit_test;

namespace {

moejit_isa cpuid_tier() {
  __builtin_cpu_init();
  moejit_isa t = MOEJIT_ISA_SCALAR;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    t = MOEJIT_ISA_AVX2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      t = MOEJIT_ISA_AVX512;
      if (__builtin_cpu_supports("avx512bf16")) {
        t = MOEJIT_ISA_AVX512_BF16;
        // avx512_amx also needs the OS's permission for tile data (asking twice is harmless).
        constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
        if (__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
            syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0)
          t = MOEJIT_ISA_AVX512_AMX;
      }
    }
  }
  return t;
}

std::vector<int> affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int i = 0; i < CPU_SETSIZE; ++i)
    if (CPU_ISSET(i, &set)) cpus.push_back(i);
  return cpus;
}

int cpu_not_in_mask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  for (int i = 0; i < CPU_SETSIZE; ++i)
    if (!CPU_ISSET(i, &set)) return i;
  return -1;
}

// Creates a context; returns status, leaves the context (or NULL) in *out.
moejit_status create(const moejit_context_desc& d, moejit_context** out) {
  *out = reinterpret_cast<moejit_context*>(uintptr_t(0x10));  // must be overwritten
  return moejit_context_create(&d, out);
}

// Expects context creation to fail with `want`, *out == NULL and a message naming `arg`.
void expect_context_fails(const moejit_context_desc& d, moejit_status want, const std::string& arg) {
  moejit_context* ctx;
  const moejit_status st = create(d, &ctx);
  EXPECT_EQ(st, want) << "got " << sname(st) << " (" << last_error() << ")";
  EXPECT_EQ(ctx, nullptr) << "*out must be set to NULL on failure";
  if (st != MOEJIT_OK) {
    EXPECT_TRUE(message_names("moejit_context_create", arg));
  }
  if (st == MOEJIT_OK && ctx) moejit_context_destroy(ctx);
}

moejit_isa tier_with_env(const char* env, moejit_isa max_isa = MOEJIT_ISA_AUTO) {
  if (env)
    setenv("MOEJIT_MAX_ISA", env, 1);
  else
    unsetenv("MOEJIT_MAX_ISA");
  moejit_context* ctx = nullptr;
  const moejit_context_desc d = context_desc(max_isa, 1);
  const moejit_status st = moejit_context_create(&d, &ctx);
  unsetenv("MOEJIT_MAX_ISA");
  EXPECT_EQ(st, MOEJIT_OK) << "MOEJIT_MAX_ISA=" << (env ? env : "<unset>") << ": " << last_error();
  if (st != MOEJIT_OK) return MOEJIT_ISA_AUTO;
  const moejit_isa t = moejit_context_isa(ctx);
  moejit_context_destroy(ctx);
  return t;
}

moejit_isa min_isa(moejit_isa a, moejit_isa b) { return a < b ? a : b; }

class Api : public ::testing::Test {
 protected:
  void SetUp() override { clear_isa_env(); }
  void TearDown() override { clear_isa_env(); }
};

}  // namespace

TEST_F(Api, AbiVersionAndMaxFormatId) {
  EXPECT_EQ(moejit_abi_version(), 1u);
  EXPECT_EQ(moejit_abi_version(), MOEJIT_ABI_VERSION);
  EXPECT_EQ(moejit_max_format_id(), 13);  // 0.2 added the K-quants, 9..13
}

TEST_F(Api, VersionIsMajorMinorPatch) {
  const char* v = moejit_version();
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(std::regex_match(v, std::regex("[0-9]+\\.[0-9]+\\.[0-9]+"))) << "\"" << v << "\"";
}

TEST_F(Api, StatusNames) {
  EXPECT_STREQ(moejit_status_name(MOEJIT_OK), "ok");
  EXPECT_STREQ(moejit_status_name(MOEJIT_INVALID_ARGUMENT), "invalid_argument");
  EXPECT_STREQ(moejit_status_name(MOEJIT_UNSUPPORTED), "unsupported");
  EXPECT_STREQ(moejit_status_name(MOEJIT_OUT_OF_MEMORY), "out_of_memory");
  EXPECT_STREQ(moejit_status_name(MOEJIT_BUSY), "busy");
  EXPECT_STREQ(moejit_status_name(MOEJIT_INTERNAL_ERROR), "internal_error");
  for (int v : {6, 7, 100, -1, INT32_MIN})
    EXPECT_STREQ(moejit_status_name(static_cast<moejit_status>(v)), "unknown") << v;
}

TEST_F(Api, IsaNames) {
  EXPECT_STREQ(moejit_isa_name(MOEJIT_ISA_AUTO), "auto");
  EXPECT_STREQ(moejit_isa_name(MOEJIT_ISA_SCALAR), "scalar");
  EXPECT_STREQ(moejit_isa_name(MOEJIT_ISA_AVX2), "avx2");
  EXPECT_STREQ(moejit_isa_name(MOEJIT_ISA_AVX512), "avx512");
  EXPECT_STREQ(moejit_isa_name(MOEJIT_ISA_AVX512_BF16), "avx512_bf16");
  EXPECT_STREQ(moejit_isa_name(MOEJIT_ISA_AVX512_AMX), "avx512_amx");
  for (int v : {6, 8, -1, 1000}) EXPECT_STREQ(moejit_isa_name(static_cast<moejit_isa>(v)), "unknown") << v;
}

TEST_F(Api, FormatNames) {
  const char* names[] = {"bf16",       "nvfp4",      "mxfp4", "ds_fp4", "q4_0", "fp8_block", "q8_0",
                         "mxfp8_e4m3", "mxfp8_e5m2", "q4_K",  "q5_K",   "q6_K", "q2_K",      "q3_K"};
  for (int i = 0; i <= 13; ++i)
    EXPECT_STREQ(moejit_format_name(static_cast<moejit_format>(i)), names[i]) << i;
  EXPECT_EQ(MOEJIT_FORMAT_Q4_K, 9);
  EXPECT_EQ(MOEJIT_FORMAT_Q3_K, 13);
  for (int v : {14, 15, -1, 255})
    EXPECT_STREQ(moejit_format_name(static_cast<moejit_format>(v)), "unknown") << v;
}

TEST_F(Api, HostIsaMatchesCpuid) {
  const moejit_isa host = moejit_host_isa();
  EXPECT_GE(host, MOEJIT_ISA_SCALAR);
  EXPECT_LE(host, MOEJIT_ISA_AVX512_AMX);
#if defined(__x86_64__)
  EXPECT_EQ(host, cpuid_tier()) << "host " << moejit_isa_name(host) << ", CPUID says "
                                << moejit_isa_name(cpuid_tier());
#endif
}

TEST_F(Api, NullHandles) {
  moejit_context_destroy(nullptr);
  moejit_moe_destroy(nullptr);
  moejit_linear_destroy(nullptr);
  EXPECT_EQ(moejit_context_isa(nullptr), MOEJIT_ISA_AUTO);
  EXPECT_EQ(moejit_context_num_threads(nullptr), 0);
  EXPECT_EQ(moejit_context_wait(nullptr), MOEJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(message_names("moejit_context_wait", "ctx"));
}

TEST_F(Api, DefaultContext) {
  moejit_context* ctx = nullptr;
  const moejit_context_desc d = context_desc();
  ASSERT_EQ(moejit_context_create(&d, &ctx), MOEJIT_OK) << last_error();
  ASSERT_NE(ctx, nullptr);
  EXPECT_EQ(moejit_context_isa(ctx), moejit_host_isa());
  EXPECT_EQ(moejit_context_num_threads(ctx), int32_t(affinity_cpus().size()))
      << "num_threads 0 = one per CPU of the affinity mask";
  EXPECT_EQ(moejit_context_wait(ctx), MOEJIT_OK) << "wait with nothing in flight";
  EXPECT_EQ(moejit_context_wait(ctx), MOEJIT_OK);
  moejit_context_destroy(ctx);
}

TEST_F(Api, ContextNullOut) {
  const moejit_context_desc d = context_desc();
  EXPECT_EQ(moejit_context_create(&d, nullptr), MOEJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(message_names("moejit_context_create", "out"));
}

TEST_F(Api, ContextNullDescFailsCleanlyOrUsesDefaults) {
  // api.md does not say whether a NULL descriptor means defaults; either way it
  // must not crash, and a failure follows the error convention.
  moejit_context* ctx = reinterpret_cast<moejit_context*>(uintptr_t(0x10));
  const moejit_status st = moejit_context_create(nullptr, &ctx);
  if (st == MOEJIT_OK) {
    ASSERT_NE(ctx, nullptr);
    moejit_context_destroy(ctx);
  } else {
    EXPECT_EQ(st, MOEJIT_INVALID_ARGUMENT);
    EXPECT_EQ(ctx, nullptr);
    EXPECT_TRUE(message_names("moejit_context_create", "desc"));
  }
}

TEST_F(Api, ContextStructSize) {
  for (uint32_t s : {0u, 4u, uint32_t(sizeof(moejit_context_desc) - 1)}) {
    moejit_context_desc d = context_desc();
    d.struct_size = s;
    SCOPED_TRACE("struct_size " + std::to_string(s));
    expect_context_fails(d, MOEJIT_INVALID_ARGUMENT, "struct_size");
  }
  // A newer caller's larger descriptor: OK when the extra bytes are zero.
  struct Bigger {
    moejit_context_desc d;
    uint8_t tail[24];
  } big;
  std::memset(&big, 0, sizeof(big));
  big.d = context_desc(MOEJIT_ISA_AUTO, 1);
  big.d.struct_size = sizeof(big);
  moejit_context* ctx = nullptr;
  EXPECT_EQ(moejit_context_create(&big.d, &ctx), MOEJIT_OK) << last_error();
  moejit_context_destroy(ctx);
  for (size_t at : {size_t(0), size_t(13), sizeof(big.tail) - 1}) {
    big.tail[at] = 1;
    SCOPED_TRACE("non-zero tail byte " + std::to_string(at));
    expect_context_fails(big.d, MOEJIT_INVALID_ARGUMENT, "struct_size");
    big.tail[at] = 0;
  }
}

TEST_F(Api, ForcedTierReadBack) {
  const moejit_isa host = moejit_host_isa();
  for (moejit_isa t : kTiers) {
    if (t > host) continue;
    moejit_context* ctx = nullptr;
    const moejit_context_desc d = context_desc(t, 1);
    ASSERT_EQ(moejit_context_create(&d, &ctx), MOEJIT_OK) << moejit_isa_name(t) << ": " << last_error();
    EXPECT_EQ(moejit_context_isa(ctx), t)
        << "forced " << moejit_isa_name(t) << ", got " << moejit_isa_name(moejit_context_isa(ctx));
    moejit_context_destroy(ctx);
  }
}

TEST_F(Api, ForcedTierAboveHostIsUnsupported) {
  const moejit_isa host = moejit_host_isa();
  if (host == kHighestTier)
    GTEST_SKIP() << "host has " << moejit_isa_name(host)
                 << ", the highest tier: no tier above the host to request";
  for (moejit_isa t : kTiers) {
    if (t <= host) continue;
    SCOPED_TRACE(moejit_isa_name(t));
    expect_context_fails(context_desc(t, 1), MOEJIT_UNSUPPORTED, "max_isa");
  }
}

TEST_F(Api, MaxIsaOutOfEnumIsInvalid) {
  for (int v : {6, 7, -1, 1000}) {
    SCOPED_TRACE(v);
    expect_context_fails(context_desc(static_cast<moejit_isa>(v), 1), MOEJIT_INVALID_ARGUMENT, "max_isa");
  }
}

TEST_F(Api, EnvCapsTierCaseInsensitive) {
  const moejit_isa host = moejit_host_isa();
  EXPECT_EQ(tier_with_env("scalar"), MOEJIT_ISA_SCALAR);
  EXPECT_EQ(tier_with_env("SCALAR"), MOEJIT_ISA_SCALAR);
  EXPECT_EQ(tier_with_env("ScAlAr"), MOEJIT_ISA_SCALAR);
  EXPECT_EQ(tier_with_env("avx2"), min_isa(host, MOEJIT_ISA_AVX2));
  EXPECT_EQ(tier_with_env("AVX2"), min_isa(host, MOEJIT_ISA_AVX2));
  EXPECT_EQ(tier_with_env("avx512"), min_isa(host, MOEJIT_ISA_AVX512));
  EXPECT_EQ(tier_with_env("Avx512"), min_isa(host, MOEJIT_ISA_AVX512));
  EXPECT_EQ(tier_with_env("avx512_bf16"), min_isa(host, MOEJIT_ISA_AVX512_BF16));
  EXPECT_EQ(tier_with_env("AVX512_BF16"), min_isa(host, MOEJIT_ISA_AVX512_BF16));
  EXPECT_EQ(tier_with_env("avx512_amx"), min_isa(host, MOEJIT_ISA_AVX512_AMX));
  EXPECT_EQ(tier_with_env("AVX512_AMX"), min_isa(host, MOEJIT_ISA_AVX512_AMX));
  EXPECT_EQ(tier_with_env(""), host) << "empty = unset";
  EXPECT_EQ(tier_with_env(nullptr), host);
}

TEST_F(Api, EnvAndMaxIsaTakeTheMinimum) {
  const moejit_isa host = moejit_host_isa();
  EXPECT_EQ(tier_with_env("scalar", host), MOEJIT_ISA_SCALAR);
  if (host >= MOEJIT_ISA_AVX2) {
    EXPECT_EQ(tier_with_env("avx512_bf16", MOEJIT_ISA_AVX2), MOEJIT_ISA_AVX2);
    EXPECT_EQ(tier_with_env("avx2", MOEJIT_ISA_SCALAR), MOEJIT_ISA_SCALAR);
    EXPECT_EQ(tier_with_env("avx2", host), MOEJIT_ISA_AVX2);
  }
  if (host >= MOEJIT_ISA_AVX512) {
    EXPECT_EQ(tier_with_env("avx512", MOEJIT_ISA_AVX512), MOEJIT_ISA_AVX512);
  }
}

TEST_F(Api, EnvInvalidValues) {
  // api.md: only scalar/avx2/avx512/avx512_bf16 (any case); anything else is invalid.
  for (const char* v : {"bogus", "auto", "avx", "avx512bf16", "avx2 ", " avx2", "sse4", "1", "scalar,avx2"}) {
    SCOPED_TRACE(std::string("MOEJIT_MAX_ISA=\"") + v + "\"");
    setenv("MOEJIT_MAX_ISA", v, 1);
    expect_context_fails(context_desc(MOEJIT_ISA_AUTO, 1), MOEJIT_INVALID_ARGUMENT, "MOEJIT_MAX_ISA");
    expect_context_fails(context_desc(MOEJIT_ISA_SCALAR, 1), MOEJIT_INVALID_ARGUMENT, "MOEJIT_MAX_ISA");
    unsetenv("MOEJIT_MAX_ISA");
  }
}

// MOEJIT_TILES: unset, empty or "all"; anything else fails the create,
// naming the variable, and nothing is created. "all" takes effect on
// avx512_amx only (tests/test_tools.cpp, Plan.AllTilesRunsEveryFormatsTileKernels):
// a context of another tier is the same.
TEST_F(Api, TilesEnvIsAllOrNothing) {
  for (const char* v : {"bogus", "ALL", "1", "all ", "none"}) {
    SCOPED_TRACE(std::string("MOEJIT_TILES=\"") + v + "\"");
    setenv("MOEJIT_TILES", v, 1);
    expect_context_fails(context_desc(MOEJIT_ISA_AUTO, 1), MOEJIT_INVALID_ARGUMENT, "MOEJIT_TILES");
    unsetenv("MOEJIT_TILES");
  }
  for (const char* v : {"", "all"}) {
    setenv("MOEJIT_TILES", v, 1);
    moejit_context* ctx = nullptr;
    const moejit_context_desc d = context_desc(MOEJIT_ISA_AUTO, 1);
    EXPECT_EQ(moejit_context_create(&d, &ctx), MOEJIT_OK) << v << ": " << moejit_last_error();
    EXPECT_EQ(moejit_context_isa(ctx), moejit_host_isa()) << v;
    moejit_context_destroy(ctx);
    unsetenv("MOEJIT_TILES");
  }
}

TEST_F(Api, EnvIsReadAtEveryCreate) {
  const moejit_isa host = moejit_host_isa();
  // A context keeps the tier it was created with; the next create reads the
  // variable again (a cached first read would return scalar forever).
  setenv("MOEJIT_MAX_ISA", "scalar", 1);
  moejit_context* first = nullptr;
  const moejit_context_desc d = context_desc(MOEJIT_ISA_AUTO, 1);
  ASSERT_EQ(moejit_context_create(&d, &first), MOEJIT_OK) << last_error();
  EXPECT_EQ(moejit_context_isa(first), MOEJIT_ISA_SCALAR);
  unsetenv("MOEJIT_MAX_ISA");
  EXPECT_EQ(tier_with_env(nullptr), host);
  if (host >= MOEJIT_ISA_AVX2) {
    EXPECT_EQ(tier_with_env("avx2"), MOEJIT_ISA_AVX2);
  }
  EXPECT_EQ(tier_with_env("scalar"), MOEJIT_ISA_SCALAR);
  EXPECT_EQ(tier_with_env(nullptr), host);
  EXPECT_EQ(moejit_context_isa(first), MOEJIT_ISA_SCALAR) << "an existing context keeps its tier";
  // An invalid value in between fails only that create.
  setenv("MOEJIT_MAX_ISA", "nonsense", 1);
  expect_context_fails(d, MOEJIT_INVALID_ARGUMENT, "MOEJIT_MAX_ISA");
  unsetenv("MOEJIT_MAX_ISA");
  EXPECT_EQ(tier_with_env(nullptr), host);
  moejit_context_destroy(first);
}

TEST_F(Api, NumThreadsReadBack) {
  for (int n : {1, 2, 3, 5}) {
    moejit_context* ctx = nullptr;
    const moejit_context_desc d = context_desc(MOEJIT_ISA_AUTO, n);
    ASSERT_EQ(moejit_context_create(&d, &ctx), MOEJIT_OK) << n << ": " << last_error();
    EXPECT_EQ(moejit_context_num_threads(ctx), n);
    moejit_context_destroy(ctx);
  }
  for (int n : {-1, INT32_MIN}) {
    SCOPED_TRACE(n);
    expect_context_fails(context_desc(MOEJIT_ISA_AUTO, n), MOEJIT_INVALID_ARGUMENT, "num_threads");
  }
}

TEST_F(Api, CpuIds) {
  const std::vector<int> cpus = affinity_cpus();
  ASSERT_FALSE(cpus.empty());
  const int c0 = cpus.front(), c1 = cpus.back();
  {  // num_threads 0 = num_cpu_ids; duplicates allowed
    const int32_t ids[3] = {c0, c1, c0};
    moejit_context_desc d = context_desc(MOEJIT_ISA_AUTO, 0);
    d.cpu_ids = ids;
    d.num_cpu_ids = 3;
    moejit_context* ctx = nullptr;
    ASSERT_EQ(moejit_context_create(&d, &ctx), MOEJIT_OK) << last_error();
    EXPECT_EQ(moejit_context_num_threads(ctx), 3);
    moejit_context_destroy(ctx);
  }
  {  // more workers than ids: worker i on cpu_ids[i % n]
    const int32_t ids[1] = {c1};
    moejit_context_desc d = context_desc(MOEJIT_ISA_AUTO, 4);
    d.cpu_ids = ids;
    d.num_cpu_ids = 1;
    moejit_context* ctx = nullptr;
    ASSERT_EQ(moejit_context_create(&d, &ctx), MOEJIT_OK) << last_error();
    EXPECT_EQ(moejit_context_num_threads(ctx), 4);
    moejit_context_destroy(ctx);
  }
  std::vector<int> bad = {-1, 1 << 20, INT32_MAX};
  if (cpu_not_in_mask() >= 0) bad.push_back(cpu_not_in_mask());
  for (int b : bad) {
    const int32_t ids[3] = {c0, b, c0};
    moejit_context_desc d = context_desc(MOEJIT_ISA_AUTO, 0);
    d.cpu_ids = ids;
    d.num_cpu_ids = 3;
    SCOPED_TRACE("cpu id " + std::to_string(b));
    expect_context_fails(d, MOEJIT_INVALID_ARGUMENT, "cpu_ids[1]");
  }
  {
    moejit_context_desc d = context_desc(MOEJIT_ISA_AUTO, 0);
    const int32_t ids[1] = {c0};
    d.cpu_ids = ids;
    d.num_cpu_ids = -1;
    expect_context_fails(d, MOEJIT_INVALID_ARGUMENT, "num_cpu_ids");
  }
  {
    moejit_context_desc d = context_desc(MOEJIT_ISA_AUTO, 0);
    d.cpu_ids = nullptr;
    d.num_cpu_ids = 2;
    expect_context_fails(d, MOEJIT_INVALID_ARGUMENT, "cpu_ids");
  }
}

TEST_F(Api, Flags) {
  {
    moejit_context_desc d = context_desc(MOEJIT_ISA_AUTO, 1);
    d.flags = MOEJIT_CONTEXT_NO_DEDUP;
    moejit_context* ctx = nullptr;
    EXPECT_EQ(moejit_context_create(&d, &ctx), MOEJIT_OK) << last_error();
    moejit_context_destroy(ctx);
  }
  for (uint32_t f : {2u, 3u, 0x100u, 0x80000000u, 0xFFFFFFFFu}) {
    moejit_context_desc d = context_desc(MOEJIT_ISA_AUTO, 1);
    d.flags = f;
    SCOPED_TRACE(f);
    expect_context_fails(d, MOEJIT_INVALID_ARGUMENT, "flags");
  }
}

TEST_F(Api, LastErrorIsPerThreadAndSurvivesSuccess) {
  const moejit_context_desc d = context_desc();
  ASSERT_EQ(moejit_context_create(&d, nullptr), MOEJIT_INVALID_ARGUMENT);
  const std::string mine = last_error();
  ASSERT_TRUE(message_names("moejit_context_create", "out"));
  // Success does not clear the message.
  EXPECT_EQ(moejit_abi_version(), 1u);
  moejit_context* ctx = nullptr;
  const moejit_context_desc ok = context_desc(MOEJIT_ISA_AUTO, 1);
  ASSERT_EQ(moejit_context_create(&ok, &ctx), MOEJIT_OK);
  EXPECT_EQ(moejit_context_wait(ctx), MOEJIT_OK);
  moejit_context_destroy(ctx);
  EXPECT_EQ(last_error(), mine);
  // Another thread neither sees this message nor overwrites it.
  std::string other_before, other_after;
  std::thread t([&] {
    other_before = last_error();
    moejit_moe* m = nullptr;
    moejit_moe_create(nullptr, nullptr, &m);
    other_after = last_error();
  });
  t.join();
  EXPECT_NE(other_before, mine);
  EXPECT_EQ(other_after.rfind("moejit_moe_create: ", 0), 0u) << other_after;
  EXPECT_EQ(last_error(), mine);
}
