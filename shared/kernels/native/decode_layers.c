/* Every decoder layer of a decode step in one call: the same kernels, in the same order and with the same
 * arguments as the model's Python forward runs them one by one on the native backends (so the result is
 * bit-identical), without the ~8 Python wrappers a layer (checks, a fresh torch.empty, a ctypes call of 10-18
 * arguments, 3-10 us each) and the Python between them: ~240 calls and ~3-4 ms of a ~37 ms step of 16 sequences.
 *
 * A layer (llama family, no q/k norm): [residual += h; x = rmsnorm(residual)] (the caller did layer 0's norm),
 * qkv = x Wqkv (+ b), rotate q and k and store k / v in the layer's cache slots, attention of each row over its
 * sequence's pages, o = att Wo (+ b), residual += o, x = rmsnorm(residual), act = silu(x Wg) * (x Wu) (the gated
 * GEMM's epilogue), h = act Wd. The residual is updated in place: pdr_add_rms_norm_f32 reads each element before it
 * writes the same element, which is what the Python path's fresh output holds too.
 */
#include <stdint.h>
#include <stdlib.h>

#include "pdr_kernels.h"

/* Per layer, in this order, as addresses (0: none): */
enum { L_INPUT_NORM, L_QKV, L_QKV_BIAS, L_O, L_O_BIAS, L_POST_NORM, L_GATE_UP, L_DOWN, L_K_CACHE, L_V_CACHE, L_N };
/* The step's sizes, in this order: */
enum {
    D_ROWS,       /* t: tokens of the step, one per sequence */
    D_HIDDEN,     /* hidden size */
    D_HEADS,      /* query heads */
    D_KV_HEADS,   /* kv heads */
    D_HEAD_DIM,   /* head dim */
    D_INTER,      /* MLP intermediate size */
    D_NUM_PAGES,  /* pages of each layer's cache */
    D_PAGE_SIZE,  /* tokens a page */
    D_PAGE_STRIDE,/* elements between pages of one layer's cache */
    D_SEQS,       /* sequences (rows of page_table, seq_lens, rows) */
    D_PT_STRIDE,  /* elements between rows of page_table */
    D_LAYERS,     /* layers */
    D_THREADS,    /* OpenMP threads each kernel forks */
    D_N
};

/* x0: layer 0's normed input [t, hidden]; residual [t, hidden]: layer 0's residual in, the last layer's out;
 * out [t, hidden]: the last layer's MLP output. cos, sin: [t, head_dim / 2]; pages, offsets [t]: where each
 * token's K/V goes; page_table [seqs, *], seq_lens, rows [seqs]: as pdr_paged_decode_f32 takes them.
 * Returns 0; -1 (nothing written) when a K/V slot lies outside the caches; -2 when the attention kernel does not
 * take the head shapes; -3 when the scratch cannot be allocated; -4 when the bf16 GEMM does not run in this build.
 * bf16: the packed weights and the K/V caches are bf16 (skinny_gemm_bf16.c's panels), the activations fp32. */

/* y [t, n] = x [t, k] @ w^T (+ bias), over fp32 or bf16 panels; 0, or -4 / -3 as the bf16 GEMM fails. */
static int gemm(int bf16, const float *x, int64_t t, int64_t k, int64_t p, int64_t n, int64_t bias, float *y, int nt) {
    if (!bf16) {
        pdr_gemm_f32(x, k, t, k, (const float *)p, n, (const float *)bias, y, n, nt);
        return 0;
    }
    const int rc = pdr_gemm_bf16(x, k, t, k, (const uint16_t *)p, n, (const float *)bias, y, n, nt);
    return rc == -1 ? -4 : rc;
}

static int decode_layers(const int64_t *layer_ptrs, const int64_t *dims, const float *x0, float *residual, float *out,
                         const float *cos, const float *sin, const int64_t *pages, const int64_t *offsets,
                         const int64_t *page_table, const int64_t *seq_lens, const int64_t *rows, float eps,
                         float scale, int bf16) {
    const int64_t t = dims[D_ROWS], hd = dims[D_HIDDEN], h = dims[D_HEADS], kvh = dims[D_KV_HEADS];
    const int64_t d = dims[D_HEAD_DIM], inter = dims[D_INTER], layers = dims[D_LAYERS];
    const int nt = (int)dims[D_THREADS];
    const int64_t nqkv = (h + 2 * kvh) * d, qd = h * d, pairs = 2 * ((inter + 15) / 16) * 16;
    for (int64_t i = 0; i < t; i++) /* checked once for all layers: every layer's cache has the same pages */
        if (pages[i] >= dims[D_NUM_PAGES] || (pages[i] >= 0 && (offsets[i] < 0 || offsets[i] >= dims[D_PAGE_SIZE])))
            return -1;
    const int64_t floats = t * (hd + nqkv + qd + kvh * d + qd + hd + inter + pairs);
    float *buf = (float *)malloc((size_t)floats * sizeof(float));
    if (!buf) return -3;
    float *x = buf, *qkv = x + t * hd, *q = qkv + t * nqkv, *k = q + t * qd, *att = k + t * kvh * d;
    float *o = att + t * qd, *act = o + t * hd, *scratch = act + t * inter;
    int rc = 0;
    for (int64_t l = 0; l < layers && rc == 0; l++) {
        const int64_t *p = layer_ptrs + l * L_N;
        const float *xin = x0;
        if (l > 0) { /* the previous layer's MLP output (in out) joins the residual */
            pdr_add_rms_norm_f32(out, hd, residual, hd, (const float *)p[L_INPUT_NORM], x, residual, t, hd, eps, nt);
            xin = x;
        }
        if ((rc = gemm(bf16, xin, t, hd, p[L_QKV], nqkv, p[L_QKV_BIAS], qkv, nt)) != 0) break;
        void *kc = (void *)p[L_K_CACHE], *vc = (void *)p[L_V_CACHE];
        const int64_t ps = dims[D_PAGE_STRIDE], np = dims[D_NUM_PAGES], psz = dims[D_PAGE_SIZE];
        const int stored =
            bf16 ? pdr_rope_store_bf16(qkv, nqkv, t, h, kvh, d, cos, sin, q, k, kc, vc, ps, np, psz, pages, offsets, nt)
                 : pdr_rope_store_f32(qkv, nqkv, t, h, kvh, d, cos, sin, q, k, kc, vc, ps, np, psz, pages, offsets, nt);
        if (stored != 0) {
            rc = -1; /* not reached: the slots were checked above */
            break;
        }
        const int64_t pts = dims[D_PT_STRIDE];
        const int n = (int)dims[D_SEQS];
        if ((bf16 ? pdr_paged_decode_bf16(q, qd, kc, vc, ps, page_table, pts, seq_lens, rows, att, qd, n, (int)h,
                                          (int)kvh, (int)d, (int)psz, scale, nt)
                  : pdr_paged_decode_f32(q, qd, kc, vc, ps, page_table, pts, seq_lens, rows, att, qd, n, (int)h,
                                         (int)kvh, (int)d, (int)psz, scale, nt)) != 0) {
            rc = -2;
            break;
        }
        if ((rc = gemm(bf16, att, t, qd, p[L_O], hd, p[L_O_BIAS], o, nt)) != 0) break;
        pdr_add_rms_norm_f32(o, hd, residual, hd, (const float *)p[L_POST_NORM], x, residual, t, hd, eps, nt);
        if (bf16) {
            const int g =
                pdr_gemm_silu_mul_bf16(x, hd, t, hd, (const uint16_t *)p[L_GATE_UP], inter, scratch, act, inter, nt);
            if ((rc = g == -1 ? -4 : g) != 0) break;
        } else {
            pdr_gemm_silu_mul_f32(x, hd, t, hd, (const float *)p[L_GATE_UP], inter, scratch, act, inter, nt);
        }
        if ((rc = gemm(bf16, act, t, inter, p[L_DOWN], hd, 0, out, nt)) != 0) break;
    }
    free(buf);
    return rc;
}

int pdr_decode_layers_f32(const int64_t *layer_ptrs, const int64_t *dims, const float *x0, float *residual, float *out,
                          const float *cos, const float *sin, const int64_t *pages, const int64_t *offsets,
                          const int64_t *page_table, const int64_t *seq_lens, const int64_t *rows, float eps,
                          float scale) {
    return decode_layers(layer_ptrs, dims, x0, residual, out, cos, sin, pages, offsets, page_table, seq_lens, rows, eps,
                         scale, 0);
}

/* The same layers over bf16 panels and bf16 K/V caches (the kernels' bf16 forms; activations fp32). */
int pdr_decode_layers_bf16(const int64_t *layer_ptrs, const int64_t *dims, const float *x0, float *residual, float *out,
                           const float *cos, const float *sin, const int64_t *pages, const int64_t *offsets,
                           const int64_t *page_table, const int64_t *seq_lens, const int64_t *rows, float eps,
                           float scale) {
    return decode_layers(layer_ptrs, dims, x0, residual, out, cos, sin, pages, offsets, page_table, seq_lens, rows, eps,
                         scale, 1);
}
