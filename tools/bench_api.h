// moejit-bench: the C API a timed arm calls. The linked library's by default; --baseline loads
// another build of libmoejit beside it (its own link-map namespace, dlmopen), so two libraries
// run the same case as arms interleaved in time, in one process.
#pragma once

#include <memory>
#include <string>

#include "moejit.h"

namespace moejit_bench {

// The functions an arm calls, one list: MoeApi's members and what load_api binds. X(name) is
// moejit_<name>.
// clang-format off
#define MOEJIT_BENCH_API(X) \
  X(abi_version)            \
  X(version)                \
  X(last_error)             \
  X(status_name)            \
  X(context_create)         \
  X(context_destroy)        \
  X(context_isa)            \
  X(context_num_threads)    \
  X(moe_create)             \
  X(moe_destroy)            \
  X(moe_forward)            \
  X(moe_stats_get)
// clang-format on

struct MoeApi {
  std::string path;            // the library file; empty for the linked one
  std::string version_string;  // its moejit_version() (set for a loaded one)
#define MOEJIT_BENCH_API_MEMBER(name) decltype(&moejit_##name) name = moejit_##name;
  MOEJIT_BENCH_API(MOEJIT_BENCH_API_MEMBER)
#undef MOEJIT_BENCH_API_MEMBER
};

// The library this program is linked with.
const MoeApi& linked_api();

// False in sanitizer builds, with the reason: a second copy of the library in a namespace of its
// own would load a second sanitizer runtime, which the sanitizers refuse (the process aborts).
bool can_load_api(std::string* why);

// Another build of libmoejit at `path`, loaded in a namespace of its own so that its symbols and
// state (the thread pools, moejit_last_error) are apart from the linked library's. It must
// export every function above and have this header's ABI version. Never unloaded. On failure:
// null, and *why says what is wrong (can_load_api's reason, the loader's message, the missing
// symbol, the ABI).
std::shared_ptr<const MoeApi> load_api(const std::string& path, std::string* why);

}  // namespace moejit_bench
