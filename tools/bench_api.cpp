#include "bench_api.h"

#include <dlfcn.h>

namespace moejit_bench {

const MoeApi& linked_api() {
  static const MoeApi api = [] {
    MoeApi a;
    a.version = moejit_version();
    return a;
  }();
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
  const bool ok = bind(handle, "moejit_abi_version", &api->abi_version, why) &&
                  bind(handle, "moejit_version", &api->get_version, why) &&
                  bind(handle, "moejit_last_error", &api->last_error, why) &&
                  bind(handle, "moejit_status_name", &api->status_name, why) &&
                  bind(handle, "moejit_context_create", &api->context_create, why) &&
                  bind(handle, "moejit_context_destroy", &api->context_destroy, why) &&
                  bind(handle, "moejit_context_isa", &api->context_isa, why) &&
                  bind(handle, "moejit_context_num_threads", &api->context_num_threads, why) &&
                  bind(handle, "moejit_moe_create", &api->moe_create, why) &&
                  bind(handle, "moejit_moe_destroy", &api->moe_destroy, why) &&
                  bind(handle, "moejit_moe_forward", &api->moe_forward, why) &&
                  bind(handle, "moejit_moe_stats_get", &api->moe_stats_get, why);
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
  api->version = api->get_version();
  return api;  // the handle stays open: contexts made through it may outlive any owner here
}

}  // namespace moejit_bench
