// moejit-bench: the C API a timed arm calls. The linked library's by default; --baseline loads
// another build of libmoejit beside it (its own link-map namespace, dlmopen), so two libraries
// run the same case as arms interleaved in time, in one process.
#pragma once

#include <memory>
#include <string>

#include "moejit.h"

namespace moejit_bench {

struct MoeApi {
  std::string path;     // the library file; empty for the linked one
  std::string version;  // its moejit_version()
  decltype(&moejit_abi_version) abi_version = moejit_abi_version;
  decltype(&moejit_version) get_version = moejit_version;
  decltype(&moejit_last_error) last_error = moejit_last_error;
  decltype(&moejit_status_name) status_name = moejit_status_name;
  decltype(&moejit_context_create) context_create = moejit_context_create;
  decltype(&moejit_context_destroy) context_destroy = moejit_context_destroy;
  decltype(&moejit_context_isa) context_isa = moejit_context_isa;
  decltype(&moejit_context_num_threads) context_num_threads = moejit_context_num_threads;
  decltype(&moejit_moe_create) moe_create = moejit_moe_create;
  decltype(&moejit_moe_destroy) moe_destroy = moejit_moe_destroy;
  decltype(&moejit_moe_forward) moe_forward = moejit_moe_forward;
  decltype(&moejit_moe_stats_get) moe_stats_get = moejit_moe_stats_get;
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
