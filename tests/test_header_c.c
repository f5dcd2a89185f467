/* The public header compiled as strict C99 (-std=c99 -Wall -Wextra -Werror
 * -pedantic), every declared function referenced, the trivial ones called, the
 * structure layout pinned for the x86-64 System V ABI, and one small dense
 * layer run end to end. Exit status 0 = pass. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "moejit.h"

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

typedef void (*any_fn)(void);

static void check_layout(void) {
  /* ABI version 1: these never change. */
  CHECK(sizeof(moejit_matrix) == 40);
  CHECK(offsetof(moejit_matrix, scales) == 8);
  CHECK(offsetof(moejit_matrix, scale_row_stride) == 16);
  CHECK(offsetof(moejit_matrix, row_scales) == 24);
  CHECK(offsetof(moejit_matrix, bias) == 32);
  CHECK(sizeof(moejit_context_desc) == 32);
  CHECK(offsetof(moejit_context_desc, num_threads) == 4);
  CHECK(offsetof(moejit_context_desc, cpu_ids) == 8);
  CHECK(offsetof(moejit_context_desc, num_cpu_ids) == 16);
  CHECK(offsetof(moejit_context_desc, max_isa) == 20);
  CHECK(offsetof(moejit_context_desc, flags) == 24);
  CHECK(offsetof(moejit_moe_desc, format) == 4);
  CHECK(offsetof(moejit_moe_desc, hidden) == 16);
  CHECK(offsetof(moejit_moe_desc, activation) == 36);
  CHECK(offsetof(moejit_moe_desc, swiglu_alpha) == 40);
  CHECK(offsetof(moejit_moe_desc, output_dtype) == 56);
  CHECK(offsetof(moejit_moe_desc, gate_up) == 64);
  CHECK(offsetof(moejit_moe_desc, down) == 72);
  CHECK(sizeof(moejit_moe_desc) == 80);
  CHECK(offsetof(moejit_linear_desc, max_tokens) == 24);
  CHECK(offsetof(moejit_linear_desc, weight) == 32);
  CHECK(offsetof(moejit_linear_desc, output_dtype) == 72);
  CHECK(sizeof(moejit_linear_desc) == 80);
  CHECK(offsetof(moejit_moe_stats, calls) == 8);
  CHECK(offsetof(moejit_moe_stats, weight_bytes_read) == 32);
  CHECK(sizeof(moejit_moe_stats) == 40);
  CHECK(sizeof(moejit_status) == 4 && sizeof(moejit_format) == 4 && sizeof(moejit_isa) == 4);
}

static void check_enums(void) {
  CHECK(MOEJIT_OK == 0 && MOEJIT_INVALID_ARGUMENT == 1 && MOEJIT_UNSUPPORTED == 2 &&
        MOEJIT_OUT_OF_MEMORY == 3 && MOEJIT_BUSY == 4 && MOEJIT_INTERNAL_ERROR == 5);
  CHECK(MOEJIT_FORMAT_BF16 == 0 && MOEJIT_FORMAT_NVFP4 == 1 && MOEJIT_FORMAT_MXFP4 == 2 &&
        MOEJIT_FORMAT_DS_FP4 == 3 && MOEJIT_FORMAT_Q4_0 == 4 && MOEJIT_FORMAT_FP8_BLOCK == 5 &&
        MOEJIT_FORMAT_Q8_0 == 6 && MOEJIT_FORMAT_MXFP8_E4M3 == 7 && MOEJIT_FORMAT_MXFP8_E5M2 == 8);
  CHECK(MOEJIT_ISA_AUTO == 0 && MOEJIT_ISA_SCALAR == 1 && MOEJIT_ISA_AVX2 == 2 && MOEJIT_ISA_AVX512 == 3 &&
        MOEJIT_ISA_AVX512_BF16 == 4 && MOEJIT_ISA_AVX512_AMX == 5);
  CHECK(MOEJIT_DTYPE_BF16 == 0 && MOEJIT_DTYPE_F32 == 1);
  CHECK(MOEJIT_ACT_SILU == 0 && MOEJIT_ACT_GELU == 1 && MOEJIT_ACT_GELU_TANH == 2 &&
        MOEJIT_ACT_SWIGLU_OAI == 3 && MOEJIT_ACT_SWIGLU_CLAMP == 4);
  CHECK(MOEJIT_CONTEXT_NO_DEDUP == 1u);
  CHECK(MOEJIT_ABI_VERSION == 1u);
}

static void check_trivial_calls(void) {
  const char* v;
  moejit_moe* moe = (moejit_moe*)&failures;
  moejit_linear* lin = (moejit_linear*)&failures;
  CHECK(moejit_abi_version() == 1u);
  v = moejit_version();
  CHECK(v != NULL && strlen(v) >= 5);
  CHECK(moejit_max_format_id() == 8);
  CHECK(moejit_last_error() != NULL);
  CHECK(strcmp(moejit_status_name(MOEJIT_BUSY), "busy") == 0);
  CHECK(strcmp(moejit_status_name((moejit_status)6), "unknown") == 0);
  CHECK(strcmp(moejit_status_name((moejit_status)-1), "unknown") == 0);
  CHECK(strcmp(moejit_isa_name(MOEJIT_ISA_AVX512_BF16), "avx512_bf16") == 0);
  CHECK(strcmp(moejit_isa_name(MOEJIT_ISA_AVX512_AMX), "avx512_amx") == 0);
  CHECK(strcmp(moejit_isa_name((moejit_isa)6), "unknown") == 0);
  CHECK(strcmp(moejit_format_name(MOEJIT_FORMAT_FP8_BLOCK), "fp8_block") == 0);
  CHECK(strcmp(moejit_format_name((moejit_format)9), "unknown") == 0);
  CHECK(strcmp(moejit_format_name((moejit_format)-1), "unknown") == 0);
  CHECK(moejit_host_isa() >= MOEJIT_ISA_SCALAR && moejit_host_isa() <= MOEJIT_ISA_AVX512_AMX);
  moejit_context_destroy(NULL);
  moejit_moe_destroy(NULL);
  moejit_linear_destroy(NULL);
  CHECK(moejit_context_isa(NULL) == MOEJIT_ISA_AUTO);
  CHECK(moejit_context_num_threads(NULL) == 0);
  CHECK(moejit_context_wait(NULL) == MOEJIT_INVALID_ARGUMENT);
  CHECK(strncmp(moejit_last_error(), "moejit_context_wait: ", 21) == 0);
  CHECK(moejit_moe_create(NULL, NULL, &moe) == MOEJIT_INVALID_ARGUMENT);
  CHECK(moe == NULL);
  CHECK(moejit_linear_create(NULL, NULL, &lin) == MOEJIT_INVALID_ARGUMENT);
  CHECK(lin == NULL);
  CHECK(moejit_moe_forward(NULL, 0, NULL, NULL, NULL, NULL) == MOEJIT_INVALID_ARGUMENT);
  CHECK(moejit_moe_submit(NULL, 0, NULL, NULL, NULL, NULL) == MOEJIT_INVALID_ARGUMENT);
  CHECK(moejit_moe_stats_get(NULL, NULL) == MOEJIT_INVALID_ARGUMENT);
  CHECK(moejit_linear_forward(NULL, 0, NULL, NULL) == MOEJIT_INVALID_ARGUMENT);
}

/* y = x W^T + bias with W = [[1, 2, 3], [-1, 0.5, 0]], bias [0.25, -1]. */
static void check_small_linear(void) {
  static const uint16_t w[6] = {0x3F80, 0x4000, 0x4040, 0xBF80, 0x3F00, 0x0000};
  static const uint16_t bias[2] = {0x3E80, 0xBF80};
  static const uint16_t x[6] = {0x3F80, 0x3F80, 0x3F80, 0x4000, 0x0000, 0xBF80}; /* [1,1,1], [2,0,-1] */
  const float want[4] = {6.25f, -1.5f, -0.75f, -3.0f};
  float y[4] = {0, 0, 0, 0};
  moejit_context_desc cd;
  moejit_linear_desc ld;
  moejit_context* ctx = NULL;
  moejit_linear* lin = NULL;
  int i;
  memset(&cd, 0, sizeof(cd));
  cd.struct_size = sizeof(cd);
  cd.num_threads = 1;
  CHECK(moejit_context_create(&cd, &ctx) == MOEJIT_OK);
  if (!ctx) return;
  CHECK(moejit_context_isa(ctx) == moejit_host_isa());
  CHECK(moejit_context_num_threads(ctx) == 1);
  memset(&ld, 0, sizeof(ld));
  ld.struct_size = sizeof(ld);
  ld.format = MOEJIT_FORMAT_BF16;
  ld.rows = 2;
  ld.cols = 3;
  ld.max_tokens = 2;
  ld.weight.data = w;
  ld.weight.bias = bias;
  ld.output_dtype = MOEJIT_DTYPE_F32;
  CHECK(moejit_linear_create(ctx, &ld, &lin) == MOEJIT_OK);
  if (lin) {
    CHECK(moejit_linear_forward(lin, 2, x, y) == MOEJIT_OK);
    for (i = 0; i < 4; ++i) {
      if (y[i] != want[i]) fprintf(stderr, "y[%d] = %g, want %g\n", i, (double)y[i], (double)want[i]);
      CHECK(y[i] == want[i]);
    }
  }
  CHECK(moejit_context_wait(ctx) == MOEJIT_OK);
  moejit_linear_destroy(lin);
  moejit_context_destroy(ctx);
}

int main(void) {
  /* Every declared function, by address. */
  const any_fn fns[] = {
      (any_fn)moejit_abi_version,     (any_fn)moejit_version,        (any_fn)moejit_max_format_id,
      (any_fn)moejit_last_error,      (any_fn)moejit_status_name,    (any_fn)moejit_isa_name,
      (any_fn)moejit_format_name,     (any_fn)moejit_host_isa,       (any_fn)moejit_context_create,
      (any_fn)moejit_context_destroy, (any_fn)moejit_context_isa,    (any_fn)moejit_context_num_threads,
      (any_fn)moejit_context_wait,    (any_fn)moejit_moe_create,     (any_fn)moejit_moe_destroy,
      (any_fn)moejit_moe_forward,     (any_fn)moejit_moe_submit,     (any_fn)moejit_moe_stats_get,
      (any_fn)moejit_linear_create,   (any_fn)moejit_linear_destroy, (any_fn)moejit_linear_forward,
  };
  size_t i;
  for (i = 0; i < sizeof(fns) / sizeof(fns[0]); ++i) CHECK(fns[i] != NULL);
  check_layout();
  check_enums();
  check_trivial_calls();
  check_small_linear();
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("C header: %u functions referenced, all checks passed\n", (unsigned)(sizeof(fns) / sizeof(fns[0])));
  return 0;
}
