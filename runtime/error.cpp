#include "runtime/error.h"

#include <cstdio>

namespace moejit {

namespace {
thread_local char g_message[512] = "";
}

moejit_status fail(moejit_status status, const char* function, const char* fmt, ...) {
  int n = std::snprintf(g_message, sizeof(g_message), "%s: ", function);
  if (n < 0 || n >= int(sizeof(g_message))) n = 0;
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(g_message + n, sizeof(g_message) - size_t(n), fmt, ap);
  va_end(ap);
  return status;
}

const char* last_error() { return g_message; }

}  // namespace moejit
