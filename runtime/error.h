// Per-thread last error message and the status type used inside the runtime.
#pragma once

#include <cstdarg>
#include <string>

#include "moejit.h"

namespace moejit {

// Sets this thread's message ("<function>: <text>") and returns `status`.
moejit_status fail(moejit_status status, const char* function, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char* last_error();

}  // namespace moejit
