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
 * take the head shapes; -3 when the scratch cannot be allocated. */
int pdr_decode_layers_f32(const int64_t *layer_ptrs, const int64_t *dims, const float *x0, float *residual, float *out,
                          const float *cos, const float *sin, const int64_t *pages, const int64_t *offsets,
                          const int64_t *page_table, const int64_t *seq_lens, const int64_t *rows, float eps,
                          float scale) {
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
        pdr_gemm_f32(xin, hd, t, hd, (const float *)p[L_QKV], nqkv, (const float *)p[L_QKV_BIAS], qkv, nqkv, nt);
        float *kc = (float *)p[L_K_CACHE], *vc = (float *)p[L_V_CACHE];
        if (pdr_rope_store_f32(qkv, nqkv, t, h, kvh, d, cos, sin, q, k, kc, vc, dims[D_PAGE_STRIDE], dims[D_NUM_PAGES],
                               dims[D_PAGE_SIZE], pages, offsets, nt) != 0) {
            rc = -1; /* not reached: the slots were checked above */
            break;
        }
        if (pdr_paged_decode_f32(q, qd, kc, vc, dims[D_PAGE_STRIDE], page_table, dims[D_PT_STRIDE], seq_lens, rows, att,
                                 qd, (int)dims[D_SEQS], (int)h, (int)kvh, (int)d, (int)dims[D_PAGE_SIZE], scale,
                                 nt) != 0) {
            rc = -2;
            break;
        }
        pdr_gemm_f32(att, qd, t, qd, (const float *)p[L_O], hd, (const float *)p[L_O_BIAS], o, hd, nt);
        pdr_add_rms_norm_f32(o, hd, residual, hd, (const float *)p[L_POST_NORM], x, residual, t, hd, eps, nt);
        pdr_gemm_silu_mul_f32(x, hd, t, hd, (const float *)p[L_GATE_UP], inter, scratch, act, inter, nt);
        pdr_gemm_f32(act, inter, t, inter, (const float *)p[L_DOWN], hd, 0, out, hd, nt);
    }
    free(buf);
    return rc;
}
