// moejit-bench --baseline (tools/bench_api.h): another build of the library loaded beside the
// linked one, as a copy of its own, and run as one more arm of every case.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_api.h"
#include "bench_report.h"
#include "moejit.h"

namespace {

using namespace moejit_bench;

// Loading is refused, with the reason, in sanitizer builds (make check): the tests that load a
// copy skip there, and this one runs there.
#define SKIP_WITHOUT_LOADING()                          \
  do {                                                  \
    std::string reason;                                 \
    if (!can_load_api(&reason)) GTEST_SKIP() << reason; \
  } while (0)

TEST(BaselineLibrary, SanitizerBuildsRefuseToLoadWithTheReason) {
  std::string why;
  if (can_load_api(&why)) GTEST_SKIP() << "not a sanitizer build: loading is allowed";
  EXPECT_NE(why.find("sanitizer"), std::string::npos) << why;
  std::string why_load;
  EXPECT_EQ(load_api(MOEJIT_LIB_PATH, &why_load), nullptr);
  EXPECT_EQ(why_load, why);
}

TEST(BaselineLibrary, LoadsASeparateCopyOfTheLibrary) {
  SKIP_WITHOUT_LOADING();
  std::string why;
  const auto api = load_api(MOEJIT_LIB_PATH, &why);
  ASSERT_NE(api, nullptr) << why;
  EXPECT_EQ(api->path, MOEJIT_LIB_PATH);
  EXPECT_EQ(api->version_string, moejit_version());
  // Its own code, not the linked library's functions under other names.
  EXPECT_NE(reinterpret_cast<void*>(api->moe_forward), reinterpret_cast<void*>(&moejit_moe_forward));
  EXPECT_NE(reinterpret_cast<void*>(api->context_create), reinterpret_cast<void*>(&moejit_context_create));
  // Its own state: an error made through it is its moejit_last_error(), not the linked one's.
  moejit_context* ctx = nullptr;
  EXPECT_EQ(moejit_context_create(nullptr, &ctx), MOEJIT_INVALID_ARGUMENT);
  const std::string linked_error = moejit_last_error();
  moejit_context_desc d{};
  d.struct_size = 3;  // no version of the descriptor is this small
  EXPECT_EQ(api->context_create(&d, &ctx), MOEJIT_INVALID_ARGUMENT);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_NE(std::string(api->last_error()).find("struct_size"), std::string::npos) << api->last_error();
  EXPECT_EQ(moejit_last_error(), linked_error);
  // And it runs: a context through it reports its tier and threads.
  moejit_context_desc cd{};
  cd.struct_size = sizeof(cd);
  cd.num_threads = 1;
  ASSERT_EQ(api->context_create(&cd, &ctx), MOEJIT_OK) << api->last_error();
  EXPECT_EQ(api->context_num_threads(ctx), 1);
  EXPECT_EQ(api->context_isa(ctx), moejit_host_isa());
  api->context_destroy(ctx);
}

TEST(BaselineLibrary, RefusesWhatIsNotAMoejitLibraryWithTheReason) {
  SKIP_WITHOUT_LOADING();
  std::string why;
  EXPECT_EQ(load_api("/nonexistent/libmoejit.so.1", &why), nullptr);
  EXPECT_NE(why.find("/nonexistent/libmoejit.so.1"), std::string::npos) << why;
  // A bare name would be looked up on the search path and could find the linked library itself.
  why.clear();
  EXPECT_EQ(load_api("libmoejit.so.1", &why), nullptr);
  EXPECT_NE(why.find("not a path"), std::string::npos) << why;
  // A shared library that is not moejit: the C library's math, wherever it lives on this system.
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(static_cast<double (*)(double)>(&std::cos)), &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  why.clear();
  EXPECT_EQ(load_api(info.dli_fname, &why), nullptr);
  EXPECT_NE(why.find("does not export moejit_abi_version"), std::string::npos) << why;
}

TEST(BaselineArm, ARowSaysWhenTheBaselineRanAnotherTierOrFailed) {
  CaseRow row;
  row.on = CaseResult{};
  row.on->isa = MOEJIT_ISA_AVX512_BF16;
  row.base = CaseResult{};
  row.base->isa = MOEJIT_ISA_AVX512_BF16;
  auto has = [](const std::vector<std::string>& w, const std::string& s) {
    for (const std::string& x : w)
      if (x.find(s) != std::string::npos) return true;
    return false;
  };
  EXPECT_FALSE(has(row_warnings(row, 0), "baseline"));
  row.base->isa = MOEJIT_ISA_AVX512;
  EXPECT_TRUE(has(row_warnings(row, 0), "baseline ran tier avx512, this build avx512_bf16"));
  row.base->status = CaseStatus::unsupported;
  row.base->message = "MOEJIT_UNSUPPORTED: format 13";
  EXPECT_TRUE(has(row_warnings(row, 0), "baseline: unsupported: MOEJIT_UNSUPPORTED: format 13"));
  EXPECT_FALSE(has(row_warnings(row, 0), "baseline ran tier"));
}

#ifdef MOEJIT_BENCH_EXE

// Runs moejit-bench with `args` and returns its CSV rows as column -> value maps.
std::vector<std::map<std::string, std::string>> bench_csv(const std::string& args, int* code) {
  char path[] = "/tmp/moejit_bench_baseline_XXXXXX";
  const int fd = mkstemp(path);
  close(fd);
  const std::string cmd = "env -u MOEJIT_MAX_ISA " + std::string(MOEJIT_BENCH_EXE) + " " + args + " --csv >" +
                          path + " 2>/dev/null";
  const int st = std::system(cmd.c_str());
  *code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  std::ifstream f(path);
  std::vector<std::vector<std::string>> lines;
  for (std::string line; std::getline(f, line);) {
    std::vector<std::string> cells;
    std::string cell;
    bool quoted = false;
    for (char ch : line) {
      if (ch == '"')
        quoted = !quoted;
      else if (ch == ',' && !quoted)
        cells.push_back(cell), cell.clear();
      else
        cell += ch;
    }
    cells.push_back(cell);
    lines.push_back(cells);
  }
  std::remove(path);
  std::vector<std::map<std::string, std::string>> rows;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::map<std::string, std::string> row;
    for (size_t j = 0; j < lines[0].size() && j < lines[i].size(); ++j) row[lines[0][j]] = lines[i][j];
    rows.push_back(row);
  }
  return rows;
}

const char* const kSmall =
    "--hidden 256 --intermediate 128 --experts 4 --top-k 2 --threads 1 --min-time 0 --repeat 2 --warmup 0 "
    "--l3-bytes 1M --probe-passes 1 --read-variant 'avx2 x1'";

TEST(BaselineArm, EveryCaseRunsTheBaselineBesideItsArms) {
  SKIP_WITHOUT_LOADING();
  int code = -1;
  const auto rows = bench_csv(std::string("--format q8_0,bf16 --tokens 1,3 --dedup both ") + kSmall +
                                  " --baseline " + MOEJIT_LIB_PATH,
                              &code);
  EXPECT_EQ(code, 0);
  ASSERT_EQ(rows.size(), 4u);
  for (const auto& r : rows) {
    EXPECT_EQ(r.at("status"), "ok");
    EXPECT_EQ(r.at("base_status"), "ok");
    const double gbps = std::atof(r.at("base_gbps").c_str()), x = std::atof(r.at("base_speedup").c_str());
    EXPECT_GT(gbps, 0);
    EXPECT_NEAR(x, std::atof(r.at("weight_gbps").c_str()) / gbps, 1e-3 * x);
    EXPECT_FALSE(r.at("off_gbps").empty());  // the dedup arms still both ran
    EXPECT_NE(r.at("repro").find("--baseline"), std::string::npos);
  }
  // Without --baseline the columns are there and empty.
  const auto plain = bench_csv(std::string("--format q8_0 --tokens 1 ") + kSmall, &code);
  EXPECT_EQ(code, 0);
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_TRUE(plain[0].count("base_speedup"));
  EXPECT_EQ(plain[0].at("base_status"), "");
  EXPECT_EQ(plain[0].at("base_speedup"), "");
}

TEST(BaselineArm, ALibraryThatCannotBeLoadedIsAUsageError) {
  int code = -1;
  bench_csv(std::string("--format q8_0 ") + kSmall + " --baseline /nonexistent/libmoejit.so.1", &code);
  EXPECT_EQ(code, 2);
}

#endif

}  // namespace
