// Descriptor checks the C API's create calls share: struct_size versions,
// enum fields read as integers, format arguments, K rules and matrices. Each
// failing check sets moejit_last_error() (naming the function, the argument
// and its value) and stores the status in *st.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats/formats.h"
#include "moejit.h"

namespace moejit::capi {

// struct_size rule: `known` (this version's size) or `older` (an older
// version's, 0 = none) is accepted; another smaller size is invalid; a larger
// one is fine when the extra bytes are zero (a newer caller).
bool check_struct_size(const char* fn, const char* what, const void* desc, uint32_t size, size_t known,
                       moejit_status* st, size_t older = 0);

// A C caller may store any int in an enum field; loading such a value as the C++
// enum type is undefined behaviour (UBSan -fsanitize=enum), so enum fields are
// read as int32_t until they are validated.
template <class E>
int32_t raw_enum(const E& field) {
  static_assert(sizeof(E) == sizeof(int32_t), "C enums are int-sized");
  int32_t v;
  std::memcpy(&v, &field, sizeof(v));
  return v;
}

moejit_status internal_error(const char* fn);
moejit_status out_of_memory(const char* fn);

// ---- format-level checks shared by MoE and linear ----

struct FormatArgs {
  int32_t format;
  int32_t scale_dtype;
  int32_t group_size;
};

// Messages name `prefix` + the field ("desc->format", "desc->up_format->format").
bool check_format_args(const char* fn, const FormatArgs& a, moejit_status* st, const char* prefix = "desc->");
// K rule of format f for `what` (e.g. "desc->hidden"); `format_field` names where
// the format comes from when it is not the descriptor's own.
bool check_k(const char* fn, const char* what, formats::Format f, int32_t group, int64_t k, moejit_status* st,
             const char* format_field = nullptr);
// One matrix [rows, k]: pointers and scale stride.
bool check_matrix(const char* fn, const char* name, const moejit_matrix& m, formats::Format f, int32_t group,
                  int64_t rows, int64_t k, moejit_status* st);

// ---- MoE (runtime/capi_moe.cpp) ----

moejit_status moe_create(moejit_context* ctx, const moejit_moe_desc* d, moejit_moe** out);
moejit_status moe_submit(const char* fn, moejit_moe* moe, int32_t T, const uint16_t* x, const int32_t* ids,
                         const float* w, void* y, bool sync);

}  // namespace moejit::capi
