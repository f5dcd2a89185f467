/* The public header compiled as strict C99 (-std=c99 -Wall -Wextra -Werror
 * -pedantic), every declared function referenced, the trivial ones called, the
 * structure layout pinned for the x86-64 System V ABI, and one small dense
 * layer and one small MoE layer (separate, fused and 0.1-sized descriptors) run
 * end to end. Exit status 0 = pass. */
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
  /* Added in 0.2 after the 80 bytes of 0.1, which stay a valid struct_size. */
  CHECK(offsetof(moejit_moe_desc, gate) == 80);
  CHECK(offsetof(moejit_moe_desc, up) == 88);
  CHECK(offsetof(moejit_moe_desc, up_format) == 96);
  CHECK(offsetof(moejit_moe_desc, down_format) == 104);
  CHECK(sizeof(moejit_moe_desc) == 112);
  CHECK(offsetof(moejit_proj_format, scale_dtype) == 4);
  CHECK(offsetof(moejit_proj_format, group_size) == 8);
  CHECK(sizeof(moejit_proj_format) == 12);
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
  CHECK(moejit_max_format_id() == 13);
  CHECK(moejit_last_error() != NULL);
  CHECK(strcmp(moejit_status_name(MOEJIT_BUSY), "busy") == 0);
  CHECK(strcmp(moejit_status_name((moejit_status)6), "unknown") == 0);
  CHECK(strcmp(moejit_status_name((moejit_status)-1), "unknown") == 0);
  CHECK(strcmp(moejit_isa_name(MOEJIT_ISA_AVX512_BF16), "avx512_bf16") == 0);
  CHECK(strcmp(moejit_isa_name(MOEJIT_ISA_AVX512_AMX), "avx512_amx") == 0);
  CHECK(strcmp(moejit_isa_name((moejit_isa)6), "unknown") == 0);
  CHECK(strcmp(moejit_format_name(MOEJIT_FORMAT_FP8_BLOCK), "fp8_block") == 0);
  CHECK(strcmp(moejit_format_name(MOEJIT_FORMAT_Q4_K), "q4_K") == 0);
  CHECK(strcmp(moejit_format_name(MOEJIT_FORMAT_Q5_K), "q5_K") == 0);
  CHECK(strcmp(moejit_format_name(MOEJIT_FORMAT_Q6_K), "q6_K") == 0);
  CHECK(strcmp(moejit_format_name(MOEJIT_FORMAT_Q2_K), "q2_K") == 0);
  CHECK(strcmp(moejit_format_name(MOEJIT_FORMAT_Q3_K), "q3_K") == 0);
  CHECK(MOEJIT_FORMAT_Q4_K == 9 && MOEJIT_FORMAT_Q5_K == 10 && MOEJIT_FORMAT_Q6_K == 11 &&
        MOEJIT_FORMAT_Q2_K == 12 && MOEJIT_FORMAT_Q3_K == 13);
  CHECK(strcmp(moejit_format_name((moejit_format)14), "unknown") == 0);
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

/* One expert, H = 3, I = 2, bf16: separate gate and up banks with down's format
 * given explicitly, the fused gate_up of the same rows, and the same descriptor
 * with the 0.1 struct_size (the 0.2 fields then read as zero) give the same bits. */
static void check_small_moe(void) {
  static const uint16_t gate[6] = {0x3F80, 0x4000, 0xBF80, 0x3F00, 0x0000, 0x3F80};
  static const uint16_t up[6] = {0x3F00, 0xBF80, 0x4000, 0x3F80, 0x3F80, 0x3F80};
  static const uint16_t down[6] = {0x3F80, 0xC000, 0x3F00, 0x3F80, 0xBF80, 0x4040};
  static const uint16_t x[3] = {0x3F80, 0x3F00, 0xBF80};
  static const int32_t ids[1] = {0};
  static const float weights[1] = {0.5f};
  uint16_t gate_up[12];
  float y_separate[3] = {0, 0, 0}, y_fused[3] = {0, 0, 0}, y_v1[3] = {0, 0, 0};
  moejit_matrix mg, mu, mgu, md;
  moejit_proj_format down_format;
  moejit_context_desc cd;
  moejit_moe_desc d;
  moejit_context* ctx = NULL;
  moejit_moe* moe = NULL;
  memcpy(gate_up, gate, sizeof(gate));
  memcpy(gate_up + 6, up, sizeof(up));
  memset(&mg, 0, sizeof(mg));
  mu = mgu = md = mg;
  mg.data = gate;
  mu.data = up;
  mgu.data = gate_up;
  md.data = down;
  memset(&down_format, 0, sizeof(down_format));
  down_format.format = MOEJIT_FORMAT_BF16;
  memset(&cd, 0, sizeof(cd));
  cd.struct_size = sizeof(cd);
  cd.num_threads = 1;
  CHECK(moejit_context_create(&cd, &ctx) == MOEJIT_OK);
  if (!ctx) return;
  memset(&d, 0, sizeof(d));
  d.struct_size = sizeof(d);
  d.format = MOEJIT_FORMAT_BF16;
  d.hidden = 3;
  d.intermediate = 2;
  d.num_experts = 1;
  d.top_k = 1;
  d.max_tokens = 1;
  d.activation = MOEJIT_ACT_SILU;
  d.output_dtype = MOEJIT_DTYPE_F32;
  d.gate = &mg;
  d.up = &mu;
  d.down = &md;
  d.down_format = &down_format;
  CHECK(moejit_moe_create(ctx, &d, &moe) == MOEJIT_OK);
  if (moe) CHECK(moejit_moe_forward(moe, 1, x, ids, weights, y_separate) == MOEJIT_OK);
  moejit_moe_destroy(moe);
  moe = NULL;
  d.gate = d.up = NULL;
  d.down_format = NULL;
  d.gate_up = &mgu;
  CHECK(moejit_moe_create(ctx, &d, &moe) == MOEJIT_OK);
  if (moe) CHECK(moejit_moe_forward(moe, 1, x, ids, weights, y_fused) == MOEJIT_OK);
  moejit_moe_destroy(moe);
  moe = NULL;
  d.struct_size = (uint32_t)offsetof(moejit_moe_desc, gate);
  CHECK(moejit_moe_create(ctx, &d, &moe) == MOEJIT_OK);
  if (moe) CHECK(moejit_moe_forward(moe, 1, x, ids, weights, y_v1) == MOEJIT_OK);
  moejit_moe_destroy(moe);
  CHECK(y_separate[0] != 0.0f && y_separate[1] != 0.0f && y_separate[2] != 0.0f);
  CHECK(memcmp(y_separate, y_fused, sizeof(y_fused)) == 0);
  CHECK(memcmp(y_v1, y_fused, sizeof(y_fused)) == 0);
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
  check_small_moe();
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("C header: %u functions referenced, all checks passed\n", (unsigned)(sizeof(fns) / sizeof(fns[0])));
  return 0;
}
