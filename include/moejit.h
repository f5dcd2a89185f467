/* moejit: run-time generated x86 kernels for Mixture-of-Experts decode.
 * Public C API, ABI version 1. See docs/API.md for the contract. */
#ifndef MOEJIT_H
#define MOEJIT_H

#include <stdint.h>

#if defined(_WIN32)
#define MOEJIT_API
#elif defined(MOEJIT_BUILDING)
#define MOEJIT_API __attribute__((visibility("default")))
#else
#define MOEJIT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MOEJIT_ABI_VERSION 1u

typedef enum moejit_status {
  MOEJIT_OK = 0,
  MOEJIT_INVALID_ARGUMENT = 1,
  MOEJIT_UNSUPPORTED = 2,
  MOEJIT_OUT_OF_MEMORY = 3,
  MOEJIT_BUSY = 4,
  MOEJIT_INTERNAL_ERROR = 5
} moejit_status;

typedef enum moejit_format {
  MOEJIT_FORMAT_BF16 = 0,
  MOEJIT_FORMAT_NVFP4 = 1,
  MOEJIT_FORMAT_MXFP4 = 2,
  MOEJIT_FORMAT_DS_FP4 = 3,
  MOEJIT_FORMAT_Q4_0 = 4,
  MOEJIT_FORMAT_FP8_BLOCK = 5,
  MOEJIT_FORMAT_Q8_0 = 6,
  MOEJIT_FORMAT_MXFP8_E4M3 = 7,
  MOEJIT_FORMAT_MXFP8_E5M2 = 8,
  /* added in 0.2: GGUF K-quants, byte-exact as ggml's block_q*_K (super-blocks of 256; K % 256 == 0) */
  MOEJIT_FORMAT_Q4_K = 9,
  MOEJIT_FORMAT_Q5_K = 10,
  MOEJIT_FORMAT_Q6_K = 11,
  MOEJIT_FORMAT_Q2_K = 12,
  MOEJIT_FORMAT_Q3_K = 13
} moejit_format;

typedef enum moejit_isa {
  MOEJIT_ISA_AUTO = 0,
  MOEJIT_ISA_SCALAR = 1,
  MOEJIT_ISA_AVX2 = 2,        /* AVX2 + FMA + F16C */
  MOEJIT_ISA_AVX512 = 3,      /* AVX-512 F + BW + VL + DQ */
  MOEJIT_ISA_AVX512_BF16 = 4, /* the above + AVX512_BF16 */
  MOEJIT_ISA_AVX512_AMX = 5   /* added in 0.2: the above + AMX-TILE + AMX-BF16, with the OS's permission
                                 to use tile data (Linux arch_prctl ARCH_REQ_XCOMP_PERM, asked once) */
} moejit_isa;

typedef enum moejit_dtype { MOEJIT_DTYPE_BF16 = 0, MOEJIT_DTYPE_F32 = 1 } moejit_dtype;

typedef enum moejit_activation {
  MOEJIT_ACT_SILU = 0,
  MOEJIT_ACT_GELU = 1,
  MOEJIT_ACT_GELU_TANH = 2,
  MOEJIT_ACT_SWIGLU_OAI = 3,
  MOEJIT_ACT_SWIGLU_CLAMP = 4
} moejit_activation;

#define MOEJIT_CONTEXT_NO_DEDUP 1u

typedef struct moejit_context moejit_context;
typedef struct moejit_moe moejit_moe;
typedef struct moejit_linear moejit_linear;

typedef struct moejit_matrix { /* one [rows, K] matrix, read in place */
  const void* data;            /* encoded weights (docs/FORMATS.md) */
  const void* scales;          /* block scales; ignored by bf16, q4_0, q8_0 and the K-quants */
  int64_t scale_row_stride;    /* in scale elements; 0 = dense */
  const float* row_scales;     /* nvfp4: fp32 [rows], required; ignored otherwise */
  const uint16_t* bias;        /* optional bf16 [rows], NULL = none */
} moejit_matrix;

typedef struct moejit_context_desc {
  uint32_t struct_size;   /* sizeof(moejit_context_desc) */
  int32_t num_threads;    /* 0 = num_cpu_ids if given, else one per CPU of the affinity mask */
  const int32_t* cpu_ids; /* optional: worker i pinned to cpu_ids[i % num_cpu_ids] */
  int32_t num_cpu_ids;
  moejit_isa max_isa; /* cap; AUTO = best the host has */
  uint32_t flags;     /* MOEJIT_CONTEXT_*; unknown bits are invalid */
} moejit_context_desc;

typedef struct moejit_proj_format { /* one projection's encoding, added in 0.2 */
  moejit_format format;
  moejit_dtype scale_dtype; /* as moejit_moe_desc.scale_dtype */
  int32_t group_size;       /* as moejit_moe_desc.group_size */
} moejit_proj_format;

/* struct_size: sizeof(moejit_moe_desc); the 0.1 size (80 bytes on x86-64, up to `down`) is
 * still accepted and reads the fields added in 0.2 as zero/NULL. */
typedef struct moejit_moe_desc {
  uint32_t struct_size;
  moejit_format format;     /* gate's (and gate_up's); up and down too unless up_format/down_format */
  moejit_dtype scale_dtype; /* fp8_block: BF16 or F32; must be 0 for other formats */
  int32_t group_size;       /* mxfp8: 0 (= 32), 32, 64 or 128; ignored by other formats */
  int32_t hidden;           /* H */
  int32_t intermediate;     /* I */
  int32_t num_experts;      /* E */
  int32_t top_k;            /* 1..E */
  int32_t max_tokens;       /* largest num_tokens a call may pass (scratch is sized once) */
  moejit_activation activation;
  float swiglu_alpha;             /* 0 = 1.702 */
  float swiglu_limit;             /* 0 or +inf = no clamp */
  int32_t gate_up_interleaved;    /* 0: rows [0,I) gate, [I,2I) up; 1: row 2j gate j, 2j+1 up j */
  int32_t router_weight_on_input; /* 0 or 1 */
  moejit_dtype output_dtype;
  const moejit_matrix* gate_up; /* [num_experts], each [2I, H]; NULL with separate gate and up */
  const moejit_matrix* down;    /* [num_experts], each [H, I] */
  /* Added in 0.2 (all zero/NULL: the layer is described by the fields above alone). */
  const moejit_matrix* gate;             /* [num_experts], each [I, H]: with `up`, instead of gate_up */
  const moejit_matrix* up;               /* [num_experts], each [I, H] */
  const moejit_proj_format* up_format;   /* NULL: as gate (format, scale_dtype, group_size above) */
  const moejit_proj_format* down_format; /* NULL: as gate */
} moejit_moe_desc;

typedef struct moejit_linear_desc { /* y[T, rows] = x[T, cols] W^T + bias */
  uint32_t struct_size;
  moejit_format format;
  moejit_dtype scale_dtype;
  int32_t group_size;
  int32_t rows;
  int32_t cols;
  int32_t max_tokens;
  moejit_matrix weight;
  moejit_dtype output_dtype;
} moejit_linear_desc;

typedef struct moejit_moe_stats { /* cumulative since creation; successful calls with num_tokens > 0 */
  uint32_t struct_size;
  uint64_t calls;
  uint64_t routes;            /* non-negative routes served */
  uint64_t unique_experts;    /* sum over calls of distinct experts served */
  uint64_t weight_bytes_read; /* weight + scale bytes the plan streamed */
} moejit_moe_stats;

MOEJIT_API uint32_t moejit_abi_version(void);
MOEJIT_API const char* moejit_version(void);
MOEJIT_API int32_t moejit_max_format_id(void);
MOEJIT_API const char* moejit_last_error(void);
MOEJIT_API const char* moejit_status_name(moejit_status status);
MOEJIT_API const char* moejit_isa_name(moejit_isa isa);
MOEJIT_API const char* moejit_format_name(moejit_format format);
MOEJIT_API moejit_isa moejit_host_isa(void);

MOEJIT_API moejit_status moejit_context_create(const moejit_context_desc* desc, moejit_context** out);
MOEJIT_API void moejit_context_destroy(moejit_context* ctx);
MOEJIT_API moejit_isa moejit_context_isa(const moejit_context* ctx);
MOEJIT_API int32_t moejit_context_num_threads(const moejit_context* ctx);
MOEJIT_API moejit_status moejit_context_wait(moejit_context* ctx);

MOEJIT_API moejit_status moejit_moe_create(moejit_context* ctx, const moejit_moe_desc* desc,
                                           moejit_moe** out);
MOEJIT_API void moejit_moe_destroy(moejit_moe* moe);
MOEJIT_API moejit_status moejit_moe_forward(moejit_moe* moe, int32_t num_tokens, const uint16_t* x,
                                            const int32_t* topk_ids, const float* topk_weights, void* y);
MOEJIT_API moejit_status moejit_moe_submit(moejit_moe* moe, int32_t num_tokens, const uint16_t* x,
                                           const int32_t* topk_ids, const float* topk_weights, void* y);
MOEJIT_API moejit_status moejit_moe_stats_get(const moejit_moe* moe, moejit_moe_stats* out);

MOEJIT_API moejit_status moejit_linear_create(moejit_context* ctx, const moejit_linear_desc* desc,
                                              moejit_linear** out);
MOEJIT_API void moejit_linear_destroy(moejit_linear* linear);
MOEJIT_API moejit_status moejit_linear_forward(moejit_linear* linear, int32_t num_tokens, const uint16_t* x,
                                               void* y);

#ifdef __cplusplus
}
#endif
#endif /* MOEJIT_H */
