#include "bench_api.h"

#include <dlfcn.h>

namespace moejit_bench {

const MoeApi& linked_api() {
  static const MoeApi api;
  return api;
}

namespace {

template <typename Fn>
bool bind(void* handle, const char* name, Fn* out, std::string* why) {
  void* sym = dlsym(handle, name);
  if (!sym) {
    *why = std::string("it does not export ") + name;
    return false;
  }
  *out = reinterpret_cast<Fn>(sym);
  return true;
}

}  // namespace

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MOEJIT_BENCH_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MOEJIT_BENCH_SANITIZED 1
#endif

bool can_load_api(std::string* why) {
#ifdef MOEJIT_BENCH_SANITIZED
  *why =
      "this is a sanitizer build: a second copy of the library would load a second sanitizer runtime, which "
      "aborts the process";
  return false;
#else
  (void)why;
  return true;
#endif
}

std::shared_ptr<const MoeApi> load_api(const std::string& path, std::string* why) {
  if (!can_load_api(why)) return nullptr;
  // A path without a slash would be looked up on the library search path, which finds the linked
  // library's own file under its soname: only files are taken.
  if (path.find('/') == std::string::npos) {
    *why = "'" + path + "' is not a path to a file (write ./" + path + ")";
    return nullptr;
  }
  dlerror();
  void* handle = dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    *why = e ? e : "dlmopen failed";
    return nullptr;
  }
  auto api = std::make_shared<MoeApi>();
  api->path = path;
  bool ok = true;
#define MOEJIT_BENCH_API_BIND(name) ok = ok && bind(handle, "moejit_" #name, &api->name, why);
  MOEJIT_BENCH_API(MOEJIT_BENCH_API_BIND)
#undef MOEJIT_BENCH_API_BIND
  if (!ok) {
    dlclose(handle);
    return nullptr;
  }
  if (api->abi_version() != MOEJIT_ABI_VERSION) {
    *why = "its ABI version is " + std::to_string(api->abi_version()) + ", this program's " +
           std::to_string(MOEJIT_ABI_VERSION);
    dlclose(handle);
    return nullptr;
  }
  api->version_string = api->version();
  return api;  // the handle stays open: contexts made through it may outlive any owner here
}

}  // namespace moejit_bench
