/* The native CPU kernels' C ABI: every function the library exports, declared once.
 *
 * Every kernel source includes this header, so a definition that differs from its declaration does not compile,
 * and the build's -Wmissing-prototypes -Werror rejects an exported function that is not declared here. build.py
 * sets each function's ctypes restype and argtypes from these declarations (abi.py reads them), so the Python calls
 * and the C definitions cannot drift apart.
 *
 * abi.py parses this file, so it keeps a plain form: one declaration per function, `RET pdr_NAME(TYPE NAME, ...);`,
 * return types void, int or float; parameters int, int64_t, float, or a pointer (passed as an address). Shapes and
 * return codes are documented at each definition.
 */
#ifndef PDR_KERNELS_H
#define PDR_KERNELS_H

#include <stdint.h>

/* paged_decode.c: one query token per sequence attends to its cached K/V, read from the pages in place. */
int pdr_paged_decode_f32(const float *q, int64_t q_stride, const float *k, const float *v, int64_t page_stride,
                         const int64_t *page_table, int64_t pt_stride, const int64_t *seq_lens, const int64_t *rows,
                         float *out, int64_t out_stride, int n, int heads, int kv_heads, int dim, int page_size,
                         float scale, int nthreads);
int pdr_paged_decode_bf16(const float *q, int64_t q_stride, const uint16_t *k, const uint16_t *v, int64_t page_stride,
                          const int64_t *page_table, int64_t pt_stride, const int64_t *seq_lens, const int64_t *rows,
                          float *out, int64_t out_stride, int n, int heads, int kv_heads, int dim, int page_size,
                          float scale, int nthreads);

/* paged_extend.c: each sequence's new tokens attend to its cached prefix and causally to each other. */
int pdr_paged_extend_f32(const float *q, int64_t q_stride, const float *k, const float *v, int64_t page_stride,
                         const int64_t *page_table, int64_t pt_stride, const int64_t *starts, const int64_t *prefix,
                         const int64_t *lens, float *out, int64_t out_stride, int n, int heads, int kv_heads, int dim,
                         int page_size, float scale, int nthreads);
int pdr_paged_extend_bf16(const float *q, int64_t q_stride, const uint16_t *k, const uint16_t *v, int64_t page_stride,
                          const int64_t *page_table, int64_t pt_stride, const int64_t *starts, const int64_t *prefix,
                          const int64_t *lens, float *out, int64_t out_stride, int n, int heads, int kv_heads, int dim,
                          int page_size, float scale, int nthreads);

/* skinny_gemm.c: the few-row GEMM over a weight packed once into 16-column panels, and its gated form. */
int pdr_gemm_vector_bits(void);
void pdr_gemm_pack_f32(const float *w, int64_t n, int64_t k, float *out);
void pdr_gemm_f32(const float *x, int64_t ldx, int64_t m, int64_t k, const float *wp, int64_t n, const float *bias,
                  float *out, int64_t ldo, int nthreads);
void pdr_gemm_pack_gated_f32(const float *w, int64_t inter, int64_t k, float *out);
void pdr_gemm_silu_mul_f32(const float *x, int64_t ldx, int64_t m, int64_t k, const float *wp, int64_t inter,
                           float *scratch, float *out, int64_t ldo, int nthreads);

/* skinny_gemm_bf16.c: the few-row GEMM over bf16 panels (fp32 x and out, products summed in fp32 by vdpbf16ps). */
int pdr_bf16_kernels(void);
void pdr_gemm_pack_bf16(const uint16_t *w, int64_t n, int64_t k, uint16_t *out);
int pdr_gemm_bf16(const float *x, int64_t ldx, int64_t m, int64_t k, const uint16_t *wp, int64_t n, const float *bias,
                  float *out, int64_t ldo, int nthreads);
void pdr_gemm_pack_gated_bf16(const uint16_t *w, int64_t inter, int64_t k, uint16_t *out);
int pdr_gemm_silu_mul_bf16(const float *x, int64_t ldx, int64_t m, int64_t k, const uint16_t *wp, int64_t inter,
                           float *scratch, float *out, int64_t ldo, int nthreads);

/* elementwise.c: residual add + RMSNorm, RoPE + the K/V cache write, SiLU-and-mul. */
void pdr_add_rms_norm_f32(const float *x, int64_t xs, const float *res, int64_t rs, const float *w, float *norm_out,
                          float *res_out, int64_t t, int64_t d, float eps, int threads);
int pdr_rope_store_f32(const float *qkv, int64_t qs, int64_t t, int64_t h, int64_t kvh, int64_t d, const float *cos,
                       const float *sin, float *q_out, float *k_out, float *k_cache, float *v_cache, int64_t ps,
                       int64_t num_pages, int64_t page_size, const int64_t *pages, const int64_t *offsets, int threads);
int pdr_rope_store_bf16(const float *qkv, int64_t qs, int64_t t, int64_t h, int64_t kvh, int64_t d, const float *cos,
                        const float *sin, float *q_out, float *k_out, uint16_t *k_cache, uint16_t *v_cache, int64_t ps,
                        int64_t num_pages, int64_t page_size, const int64_t *pages, const int64_t *offsets,
                        int threads);
void pdr_silu_mul_f32(const float *x, int64_t xs, float *out, int64_t t, int64_t inter, int threads);

/* decode_layers.c: every decoder layer of a decode step in one call, over the kernels above. */
int pdr_decode_layers_f32(const int64_t *layer_ptrs, const int64_t *dims, const float *x0, float *residual, float *out,
                          const float *cos, const float *sin, const int64_t *pages, const int64_t *offsets,
                          const int64_t *page_table, const int64_t *seq_lens, const int64_t *rows, float eps,
                          float scale);
int pdr_decode_layers_bf16(const int64_t *layer_ptrs, const int64_t *dims, const float *x0, float *residual, float *out,
                           const float *cos, const float *sin, const int64_t *pages, const int64_t *offsets,
                           const int64_t *page_table, const int64_t *seq_lens, const int64_t *rows, float eps,
                           float scale);

/* dequant.c: quantized projection weights widened to fp32 (kernels/fp8_weight.py, int4_weight.py). */
void pdr_dequant_fp8_f32(const uint8_t *w, const float *scale, int64_t rows, int64_t cols, int64_t nb, int64_t bk,
                         float *out, int threads);
void pdr_dequant_int4_f32(const int32_t *qweight, const int32_t *qzeros, const float *scales, int64_t rows,
                          int64_t cols, int64_t group, int packing, int zero_offset, float *out, int threads);

#endif /* PDR_KERNELS_H */
