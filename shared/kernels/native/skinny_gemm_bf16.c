/* bf16 GEMM for few rows (decode batches): out[M, N] (fp32) = x[M, K] (fp32, rounded to bf16) @ w[N, K]^T (bf16)
 * (+ bias), w packed once, products summed in fp32 by vdpbf16ps (avx512_bf16).
 *
 * Why: a decode step streams every weight once; in bf16 that is half the bytes of skinny_gemm.c's fp32 panels, and
 * one vdpbf16ps does 32 multiply-adds where an fp32 FMA does 16, so the tiles that re-read a block from L1 finish in
 * half the instructions too. The layout and schedule are skinny_gemm.c's (read its header for why each one):
 * panels of 16 output columns, a thread takes two panels at a time (8 rows x 32 columns in 16 zmm accumulators),
 * K cut into L1 blocks, the block PF k ahead prefetched into L1 by the tile that meets it first, the next block
 * streamed into L2 by the later tiles (the lookahead), chunks of panel pairs handed out dynamically.
 *
 * Packed layout: [ceil(N / 16)][ceil(K / 2)][16][2]: for each pair of k, the 16 columns' two weights side by side,
 * one 64-byte line, which is the operand vdpbf16ps multiplies with a broadcast (x[k], x[k + 1]) pair. Columns past
 * N and a k past an odd K are zero.
 *
 * Accuracy: x is rounded to bf16 once (transformers' bf16 model holds its activations in bf16 throughout); each
 * product of two bf16 is exact in fp32 and the sums are blocked like skinny_gemm.c's (KCP pairs in a register, the
 * blocks added in order).
 *
 * Built by build.py with -march=native. Without avx512_bf16 the GEMM entry points return -1 (the dispatch never
 * calls them there: shared/kernels/cpu.py); the packing is plain C everywhere.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "pdr_kernels.h"

#define NR 16 /* output columns per panel */
#ifndef KCP
/* k pairs per L1 block: 96 pairs x 64 bytes = 6 KiB a panel, 12 KiB a pair of panels (skinny_gemm.c's fp32 block of
 * 192 k is 12 KiB a panel); the bundled model's inner sizes split evenly: 576 = 3 x 192 k, 1536 = 8 x 192 k. */
#define KCP 96
#endif
#ifndef PFP
#define PFP 64 /* pair rows (64-byte lines) ahead: 4 KiB, skinny_gemm.c's PF */
#endif
#define MR2 8 /* rows of the two-panel tile */

/* w [N, K] bf16 row-major -> panels [ceil(N / 16)][ceil(K / 2)][16][2] (zero-padded). */
void pdr_gemm_pack_bf16(const uint16_t *w, int64_t n, int64_t k, uint16_t *out) {
    const int64_t panels = (n + NR - 1) / NR, k2 = (k + 1) / 2;
    for (int64_t p = 0; p < panels; p++) {
        uint16_t *dst = out + p * k2 * 2 * NR;
        for (int64_t kk = 0; kk < k2; kk++)
            for (int j = 0; j < NR; j++)
                for (int e = 0; e < 2; e++) {
                    const int64_t col = p * NR + j, kx = 2 * kk + e;
                    dst[(kk * NR + j) * 2 + e] = col < n && kx < k ? w[col * k + kx] : 0;
                }
    }
}

/* w [2 inter, K] holding gate | up rows -> gate panel p then up panel p, as pdr_gemm_pack_gated_f32 lays them. */
void pdr_gemm_pack_gated_bf16(const uint16_t *w, int64_t inter, int64_t k, uint16_t *out) {
    const int64_t panels = (inter + NR - 1) / NR, pstride = (k + 1) / 2 * 2 * NR;
    for (int64_t p = 0; p < panels; p++) {
        const int64_t cols = inter - p * NR < NR ? inter - p * NR : NR;
        pdr_gemm_pack_bf16(w + p * NR * k, cols, k, out + 2 * p * pstride);
        pdr_gemm_pack_bf16(w + (inter + p * NR) * k, cols, k, out + (2 * p + 1) * pstride);
    }
}

#if defined(PDR_BF16)
/* R rows x 32 columns (panels w0, w1; an odd last panel passes w1 = w0 and cols <= 16) over kc pairs of one block;
 * first block: out = acc (+ bias), later: out += acc. x: bf16 pairs, ldx pairs a row. q0, q1, qn, every: the
 * lookahead stream (skinny_gemm.c's tile2). */
#define TILEB(R)                                                                                                     \
    static inline void tileb_##R(const uint32_t *x, int64_t ldx, const uint16_t *w0, const uint16_t *w1, int64_t kc, \
                                 float *o, int64_t ldo, int first, const float *bias, int cols, const uint16_t *q0,  \
                                 const uint16_t *q1, int64_t qn, int every) {                                        \
        __m512 a[R], b[R];                                                                                           \
        int cd = every;                                                                                              \
        for (int i = 0; i < R; i++) a[i] = b[i] = _mm512_setzero_ps();                                               \
        for (int64_t kk = 0; kk < kc; kk++) {                                                                        \
            _mm_prefetch((const char *)(w0 + (kk + PFP) * 2 * NR), _MM_HINT_T0);                                     \
            _mm_prefetch((const char *)(w1 + (kk + PFP) * 2 * NR), _MM_HINT_T0);                                     \
            if (qn > 0 && --cd == 0) {                                                                               \
                cd = every;                                                                                          \
                _mm_prefetch((const char *)q0, _MM_HINT_T1);                                                         \
                _mm_prefetch((const char *)q1, _MM_HINT_T1);                                                         \
                q0 += 2 * NR;                                                                                        \
                q1 += 2 * NR;                                                                                        \
                qn--;                                                                                                \
            }                                                                                                        \
            const __m512bh v0 = (__m512bh)_mm512_loadu_si512((const void *)(w0 + kk * 2 * NR));                      \
            const __m512bh v1 = (__m512bh)_mm512_loadu_si512((const void *)(w1 + kk * 2 * NR));                      \
            for (int i = 0; i < R; i++) {                                                                            \
                const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)x[i * ldx + kk]);                               \
                a[i] = _mm512_dpbf16_ps(a[i], xb, v0);                                                               \
                b[i] = _mm512_dpbf16_ps(b[i], xb, v1);                                                               \
            }                                                                                                        \
        }                                                                                                            \
        const __mmask16 m0 = (__mmask16)(cols >= 16 ? 0xFFFFu : (1u << cols) - 1u);                                  \
        const __mmask16 m1 = (__mmask16)(cols >= 32 ? 0xFFFFu : cols <= 16 ? 0u : (1u << (cols - 16)) - 1u);         \
        const __m512 b0 = bias && first ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();                     \
        const __m512 b1 = bias && first ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();                \
        for (int i = 0; i < R; i++) {                                                                                \
            float *row = o + i * ldo;                                                                                \
            const __m512 p0 = first ? b0 : _mm512_maskz_loadu_ps(m0, row);                                           \
            const __m512 p1 = first ? b1 : _mm512_maskz_loadu_ps(m1, row + 16);                                      \
            _mm512_mask_storeu_ps(row, m0, _mm512_add_ps(p0, a[i]));                                                 \
            _mm512_mask_storeu_ps(row + 16, m1, _mm512_add_ps(p1, b[i]));                                            \
        }                                                                                                            \
    }
TILEB(1)
TILEB(2)
TILEB(3)
TILEB(4)
TILEB(5)
TILEB(6)
TILEB(7)
TILEB(8)
#define CASEB(R) \
    case R: tileb_##R(x, ldx, w0, w1, kc, o, ldo, first, bias, cols, q0, q1, qn, every); break;
static void tileb(int r, const uint32_t *x, int64_t ldx, const uint16_t *w0, const uint16_t *w1, int64_t kc, float *o,
                  int64_t ldo, int first, const float *bias, int cols, const uint16_t *q0, const uint16_t *q1,
                  int64_t qn, int every) {
    switch (r) {
        CASEB(1)
        CASEB(2)
        CASEB(3)
        CASEB(4)
        CASEB(5)
        CASEB(6)
        CASEB(7)
        default: tileb_8(x, ldx, w0, w1, kc, o, ldo, first, bias, cols, q0, q1, qn, every); break;
    }
}

/* x [m, k] fp32 (row stride ldx) -> xp [m, ceil(k / 2)] bf16 pairs (an odd k's last pair padded with 0). */
static void to_pairs(const float *x, int64_t ldx, int64_t m, int64_t k, uint32_t *xp) {
    const int64_t k2 = (k + 1) / 2;
    for (int64_t i = 0; i < m; i++) {
        uint16_t *o = (uint16_t *)(xp + i * k2);
        pdr_store_bf16(o, x + i * ldx, k);
        if (k & 1) o[k] = 0;
    }
}

/* skinny_gemm.c's silu_mul_pair: g [m, 32] rows (stride lds) hold 16 gate | 16 up sums; out = silu(gate) * up. */
static void silu_mul_pair(const float *g, int64_t lds, int64_t m, float *out, int64_t ldo, int cols) {
    for (int64_t i = 0; i < m; i++) {
        const float *gi = g + i * lds, *ui = gi + NR;
        float *o = out + i * ldo;
        for (int j = 0; j < cols; j++) {
            const float e = expf(fminf(-gi[j], 88.0f));
            o[j] = gi[j] / (1.0f + e) * ui[j];
        }
    }
}

/* One unit: panels p and p + 1 (p alone when it is the last), every row, every K block. */
static void unit(const uint32_t *xp, int64_t m, int64_t k2, const uint16_t *wp, int64_t n, const float *bias,
                 float *out, int64_t ldo, int64_t p) {
    const int64_t panels = (n + NR - 1) / NR, pstride = k2 * 2 * NR;
    const uint16_t *w0 = wp + p * pstride, *w1 = p + 1 < panels ? w0 + pstride : w0;
    const int64_t left = n - p * NR;
    const int cols = (int)(left < 2 * NR ? left : 2 * NR);
    const float *b = bias ? bias + p * NR : 0;
    const int tiles = (int)((m + MR2 - 1) / MR2);
    for (int64_t k0 = 0; k0 < k2; k0 += KCP) {
        const int64_t kc = k2 - k0 < KCP ? k2 - k0 : KCP;
        /* the lookahead: this pair's next block, else the next pair's first, into L2 over the block's tiles */
        const uint16_t *q0 = 0, *q1 = 0;
        int64_t qk = 0;
        if (k0 + kc < k2) {
            q0 = w0 + (k0 + kc) * 2 * NR;
            q1 = w1 + (k0 + kc) * 2 * NR;
            qk = k2 - k0 - kc;
        } else if (p + 2 < panels) {
            q0 = wp + (p + 2) * pstride;
            q1 = p + 3 < panels ? q0 + pstride : q0;
            qk = k2;
        }
        qk = qk < KCP ? qk : KCP;
        const int64_t share = (qk + tiles - 1) / tiles;
        int t = 0;
        for (int64_t m0 = 0; m0 < m; m0 += MR2, t++) {
            const int r = (int)(m - m0 < MR2 ? m - m0 : MR2);
            const int64_t lo = t * share, hi = lo + share < qk ? lo + share : qk;
            tileb(r, xp + m0 * k2 + k0, k2, w0 + k0 * 2 * NR, w1 + k0 * 2 * NR, kc, out + m0 * ldo + p * NR, ldo,
                  k0 == 0, b, cols, q0 ? q0 + lo * 2 * NR : 0, q1 ? q1 + lo * 2 * NR : 0, hi > lo ? hi - lo : 0, tiles);
        }
    }
}

/* The GEMM; with gated != NULL the panels alternate gate and up, `out` is the scratch of their sums and each pair's
 * thread writes silu(gate) * up for its 16 columns into gated (stride ldg, inter columns), as skinny_gemm.c does. */
static int gemm(const float *x, int64_t ldx, int64_t m, int64_t k, const uint16_t *wp, int64_t n, const float *bias,
                float *out, int64_t ldo, int nthreads, float *gated, int64_t ldg, int64_t inter) {
    const int64_t panels = (n + NR - 1) / NR, k2 = (k + 1) / 2, units = (panels + 1) / 2;
    uint32_t *xp = (uint32_t *)malloc((size_t)(m * k2) * sizeof(uint32_t));
    if (!xp) return -3;
    to_pairs(x, ldx, m, k, xp);
    if (nthreads < 1) nthreads = 1;
    if (panels < 2 * nthreads) nthreads = 1; /* a tiny projection: waking the team costs more than it saves */
    int64_t chunk = units / (8 * (int64_t)nthreads);
    chunk = chunk > 1 ? chunk : 1;
#pragma omp parallel for schedule(dynamic, chunk) num_threads(nthreads)
    for (int64_t u = 0; u < units; u++) {
        unit(xp, m, k2, wp, n, bias, out, ldo, 2 * u);
        if (gated) {
            const int64_t left_g = inter - u * NR;
            silu_mul_pair(out + 2 * u * NR, ldo, m, gated + u * NR, ldg, (int)(left_g < NR ? left_g : NR));
        }
    }
    free(xp);
    return 0;
}
#endif

/* 1 where this build runs the bf16 kernels (avx512_bf16), else 0. */
int pdr_bf16_kernels(void) {
#if defined(PDR_BF16)
    return 1;
#else
    return 0;
#endif
}

/* out [m, n] fp32 (row stride ldo) = x [m, k] fp32 (row stride ldx) @ w^T (+ bias [n] fp32 or NULL), w packed by
 * pdr_gemm_pack_bf16. Returns 0; -1 in a build without avx512_bf16; -3 when x's bf16 copy cannot be allocated. */
int pdr_gemm_bf16(const float *x, int64_t ldx, int64_t m, int64_t k, const uint16_t *wp, int64_t n, const float *bias,
                  float *out, int64_t ldo, int nthreads) {
#if defined(PDR_BF16)
    return gemm(x, ldx, m, k, wp, n, bias, out, ldo, nthreads, 0, 0, 0);
#else
    (void)x, (void)ldx, (void)m, (void)k, (void)wp, (void)n, (void)bias, (void)out, (void)ldo, (void)nthreads;
    return -1;
#endif
}

/* out [m, inter] = silu(x @ gate^T) * (x @ up^T), w packed by pdr_gemm_pack_gated_bf16; scratch [m, 2 ceil(inter /
 * 16) * 16] fp32 holds the sums (the same as pdr_gemm_bf16 makes). Returns as pdr_gemm_bf16. */
int pdr_gemm_silu_mul_bf16(const float *x, int64_t ldx, int64_t m, int64_t k, const uint16_t *wp, int64_t inter,
                           float *scratch, float *out, int64_t ldo, int nthreads) {
#if defined(PDR_BF16)
    const int64_t n = 2 * ((inter + NR - 1) / NR) * NR;
    return gemm(x, ldx, m, k, wp, n, 0, scratch, n, nthreads, out, ldo, inter);
#else
    (void)x, (void)ldx, (void)m, (void)k, (void)wp, (void)inter, (void)scratch, (void)out, (void)ldo, (void)nthreads;
    return -1;
#endif
}
