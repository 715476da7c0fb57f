/* Paged extend (prefill) attention over the KV pool in place, for CPU (fp32): each sequence's new tokens attend to
 * its cached prefix and causally to each other, every key and value read straight from the pages the page table
 * lists (the new tokens' K/V are already written there).
 *
 * Why: torch's SDPA ran these shapes at 55-75 GFLOPS here (9 heads, head_dim 64: 345 us a layer for a 128-token
 * prompt, 4.1 ms for 512), and a prompt with a cached prefix first gathered the prefix pages into a copy and
 * built a mask. A prefill chunk of 512 tokens spent ~12% of its time there.
 *
 * Work item = (sequence, query head, block of 16 query tokens). The block's q is held transposed, [d][16], so a
 * score tile (16 queries x 8 keys) is 8 independent FMA chains over d with each key's element broadcast from
 * memory: no horizontal sums. The online softmax runs lane-wise (one lane per query), and P.V accumulates the
 * output transposed, [d][16], in L1, in chunks of 16 rows of d held in registers. Causality and the sequence end
 * are lane masks on the last key blocks. fp32 throughout (max, rescaled sum and accumulator per query).
 *
 * Built at run time by build.py with -O3 -march=native -ffast-math (see paged_decode.c for why that is safe: every
 * value stays finite). Without AVX-512 the same blocking runs in plain loops the compiler vectorises.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "pdr_kernels.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define QB 16       /* query tokens per item: one vector lane each */
#ifndef KB
#define KB 8 /* keys per score tile: independent accumulators */
#endif
#define MAX_DIM 256 /* head_dim the per-item buffers take */

typedef struct {
    const float *q;
    int64_t q_stride; /* floats between two tokens' q rows */
    const void *k, *v; /* float, or bf16 (uint16_t) where bf16 is set */
    int64_t page_stride;
    const int64_t *page_table;
    int64_t pt_stride;
    const int64_t *starts, *prefix, *lens; /* per sequence: first token row, cached tokens, new tokens */
    float *out;
    int64_t out_stride;
    int heads, kv_heads, dim, page_size;
    float scale;
    int bf16; /* the cache holds bf16: each key tile's rows are widened into fp32 rows first */
} job_t;

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
/* exp of 8 lanes, in registers: n = round(x log2 e), r = x - n ln 2 in two FMA steps (Cody-Waite), e^r by Cephes'
 * degree-7 polynomial (about 1 ulp), times 2^n through the exponent bits; 0 below -87 (masked scores sit at
 * -FLT_MAX). FMAs, not a mul and a sub, so -ffast-math cannot merge the two steps of the reduction. Inline because
 * the vectoriser turned the 8-lane expf loops into 3 scalar calls and a 4-lane one. */
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 zero = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(zero, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

/* One key tile for 8 of a block's 16 query lanes (those at lane offset o8), AVX2: the AVX-512 tile below in 8-lane
 * vectors. 8 score accumulators and 8 probability vectors fit the 16 ymm registers beside q (or the output row) and
 * a broadcast; all 16 lanes at once would spill. Always 8 keys (fixed trip counts, so the accumulators stay in
 * registers; a short tile's missing keys repeat its first key's rows and are masked out), qt, ot, m, l point at the
 * half's first lane (rows QB apart). The generic loops it replaces kept the 8 x 16 scores in memory, a load and a
 * store around every FMA: Zen 3, 2 threads, 30 layers (python -m bench.kernels_cpu), 16 prompts of 128 tokens
 * 424-437 -> 123-143 ms, one of 512 334-346 -> 93-106 ms. */
static inline void tile_half(float (*qt)[QB], float (*ot)[QB], float *m, float *l, const float *const *kr,
                             const float *const *vr, int kc, int d, int64_t first0) {
    __m256 sc[KB];
    for (int c = 0; c < KB; c++) sc[c] = _mm256_setzero_ps();
    for (int x = 0; x < d; x++) {
        const __m256 qx = _mm256_load_ps(qt[x]);
        for (int c = 0; c < KB; c++) sc[c] = _mm256_fmadd_ps(qx, _mm256_broadcast_ss(kr[c] + x), sc[c]);
    }
    /* lane u sees key c when c < kc and u >= first0 + c (first0: the first lane that sees the tile's first key) */
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), neg = _mm256_set1_ps(-FLT_MAX);
    __m256 top = _mm256_load_ps(m);
    for (int c = 0; c < KB; c++) {
        const int64_t from = c < kc ? first0 + c : 8;
        if (from > 0) {
            const __m256 see = _mm256_cmp_ps(lane, _mm256_set1_ps((float)from), _CMP_GE_OQ);
            sc[c] = _mm256_blendv_ps(neg, sc[c], see);
        }
        top = _mm256_max_ps(top, sc[c]);
    }
    const __m256 cv = exp8(_mm256_sub_ps(_mm256_load_ps(m), top));
    __m256 sum = _mm256_setzero_ps();
    for (int c = 0; c < KB; c++) {
        sc[c] = exp8(_mm256_sub_ps(sc[c], top)); /* now the probabilities */
        sum = _mm256_add_ps(sum, sc[c]);
    }
    _mm256_store_ps(l, _mm256_fmadd_ps(_mm256_load_ps(l), cv, sum));
    _mm256_store_ps(m, top);
    /* two chains of 4 FMAs an output row, not one of 8: the row's latency, not the FMA units, set the pace */
    for (int x = 0; x < d; x++) {
        __m256 o = _mm256_mul_ps(_mm256_load_ps(ot[x]), cv), e = _mm256_mul_ps(sc[4], _mm256_broadcast_ss(vr[4] + x));
        for (int c = 0; c < 4; c++) {
            o = _mm256_fmadd_ps(sc[c], _mm256_broadcast_ss(vr[c] + x), o);
            if (c < 3) e = _mm256_fmadd_ps(sc[c + 5], _mm256_broadcast_ss(vr[c + 5] + x), e);
        }
        _mm256_store_ps(ot[x], _mm256_add_ps(o, e));
    }
}

/* r[i] <- column i of the 8 x 8 block r (rows in, columns out). */
static inline void transpose8(__m256 *r) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* The block's q rows into qt (transposed, scaled; lanes past nq zero) and its output rows out of ot, 8 x 8 at a
 * time (d a multiple of 8). One element at a time, the output loop alone held ~14% of the kernel's perf samples at
 * 16 prompts of 128 tokens; 8 x 8 at a time the kernel ran ~5% faster. */
static void load_q_t(float (*qt)[QB], const float *q, int64_t stride, int nq, int d, float scale) {
    const __m256 sv = _mm256_set1_ps(scale);
    for (int t0 = 0; t0 < QB; t0 += 8)
        for (int x0 = 0; x0 < d; x0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] =
                    t0 + i < nq ? _mm256_mul_ps(_mm256_loadu_ps(q + (t0 + i) * stride + x0), sv) : _mm256_setzero_ps();
            transpose8(r);
            for (int i = 0; i < 8; i++) _mm256_store_ps(&qt[x0 + i][t0], r[i]);
        }
}

static void store_out_t(float (*ot)[QB], const float *l, float *out, int64_t stride, int nq, int d) {
    for (int t0 = 0; t0 < nq; t0 += 8)
        for (int x0 = 0; x0 < d; x0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_load_ps(&ot[x0 + i][t0]);
            transpose8(r);
            for (int i = 0; i < 8 && t0 + i < nq; i++)
                _mm256_storeu_ps(out + (t0 + i) * stride + x0, _mm256_mul_ps(r[i], _mm256_set1_ps(1.0f / l[t0 + i])));
        }
}
#define PDR_AVX2_EXTEND 1
#endif

/* Sequence s, query head h, new tokens [i0, i0 + nq) (nq <= 16). */
static void attend_block(const job_t *j, int s, int h, int64_t i0, int nq) {
    const int d = j->dim, g = j->heads / j->kv_heads, kh = h / g;
    const int64_t p = j->prefix[s], row0 = j->starts[s] + i0;
    const int64_t q_first = p + i0;           /* position of the block's first query */
    const int64_t keys = q_first + nq;        /* keys any query of the block sees: positions [0, keys) */
    float qt[MAX_DIM][QB] __attribute__((aligned(64)));  /* scaled q, transposed; lanes past nq zero */
    float ot[MAX_DIM][QB] __attribute__((aligned(64)));  /* output accumulator, transposed */
    float m[QB] __attribute__((aligned(64))), l[QB] __attribute__((aligned(64)));
#if defined(PDR_AVX2_EXTEND)
    if (d % 8 == 0) {
        load_q_t(qt, j->q + row0 * j->q_stride + (int64_t)h * d, j->q_stride, nq, d, j->scale);
        for (int x = 0; x < d; x++)
            for (int t = 0; t < QB; t++) ot[x][t] = 0.0f;
    } else
#endif
        for (int x = 0; x < d; x++)
            for (int t = 0; t < QB; t++) {
                qt[x][t] = t < nq ? j->q[(row0 + t) * j->q_stride + (int64_t)h * d + x] * j->scale : 0.0f;
                ot[x][t] = 0.0f;
            }
    for (int t = 0; t < QB; t++) {
        m[t] = -FLT_MAX;
        l[t] = 0.0f;
    }
    const float *kr[KB], *vr[KB];
    /* A bf16 cache's tile, widened: 8 keys x d for K and V, converted once a tile and read by all 16 query lanes
     * (the tile's FMAs outnumber the conversions ~8 to 1). */
    float kw[KB][MAX_DIM] __attribute__((aligned(64))), vw[KB][MAX_DIM] __attribute__((aligned(64)));
    const int64_t *pt_row = j->page_table + (int64_t)s * j->pt_stride, tok_stride = (int64_t)j->kv_heads * d;
    for (int64_t k0 = 0; k0 < keys; k0 += KB) {
        const int kc = keys - k0 < KB ? (int)(keys - k0) : KB;
        {
            int64_t pi = k0 / j->page_size, slot = k0 % j->page_size; /* one division a tile, then walk */
            for (int c = 0; c < kc; c++) {
                const int64_t at = pt_row[pi] * j->page_stride + slot * tok_stride + (int64_t)kh * d;
                if (j->bf16) {
                    pdr_widen_bf16(kw[c], (const uint16_t *)j->k + at, d);
                    pdr_widen_bf16(vw[c], (const uint16_t *)j->v + at, d);
                    kr[c] = kw[c];
                    vr[c] = vw[c];
                } else {
                    kr[c] = (const float *)j->k + at;
                    vr[c] = (const float *)j->v + at;
                }
                if (++slot == j->page_size) {
                    slot = 0;
                    pi++;
                }
            }
        }
        /* a query at q_first + t sees key k0 + c when k0 + c <= q_first + t: lanes t >= k0 + c - q_first */
        const int64_t diag = k0 + kc - 1 - q_first; /* > 0: some lanes of this tile are masked */
#if defined(__AVX512F__)
        float pt[KB][QB] __attribute__((aligned(64))); /* a tile's probabilities, per key */
        __m512 sc[KB];
        for (int c = 0; c < KB; c++) sc[c] = _mm512_setzero_ps();
        if (kc == KB) { /* full tile: fixed trip counts, unrolled */
            for (int x = 0; x < d; x++) {
                const __m512 qx = _mm512_load_ps(qt[x]);
                for (int c = 0; c < KB; c++) sc[c] = _mm512_fmadd_ps(qx, _mm512_set1_ps(kr[c][x]), sc[c]);
            }
        } else {
            for (int x = 0; x < d; x++) {
                const __m512 qx = _mm512_load_ps(qt[x]);
                for (int c = 0; c < kc; c++) sc[c] = _mm512_fmadd_ps(qx, _mm512_set1_ps(kr[c][x]), sc[c]);
            }
        }
        const __m512 neg = _mm512_set1_ps(-FLT_MAX);
        __m512 top = _mm512_load_ps(m);
        for (int c = 0; c < kc; c++) {
            if (diag > 0) {
                const int64_t first = k0 + c - q_first; /* first lane that sees key k0 + c */
                if (first > 0) {
                    const __mmask16 see = first >= QB ? 0 : (__mmask16)(0xFFFFu << first);
                    sc[c] = _mm512_mask_blend_ps(see, neg, sc[c]);
                }
            }
            top = _mm512_max_ps(top, sc[c]);
        }
        _mm512_store_ps(pt[0], _mm512_sub_ps(_mm512_load_ps(m), top)); /* scratch: m - max, for corr */
        float corr[QB] __attribute__((aligned(64)));
#pragma omp simd
        for (int t = 0; t < QB; t++) corr[t] = expf(pt[0][t]);
        for (int c = 0; c < kc; c++) _mm512_store_ps(pt[c], _mm512_sub_ps(sc[c], top));
        for (int c = 0; c < kc; c++) {
#pragma omp simd
            for (int t = 0; t < QB; t++) pt[c][t] = expf(pt[c][t]);
        }
        __m512 sum = _mm512_setzero_ps();
        for (int c = 0; c < kc; c++) sum = _mm512_add_ps(sum, _mm512_load_ps(pt[c]));
        const __m512 cv = _mm512_load_ps(corr);
        _mm512_store_ps(l, _mm512_fmadd_ps(_mm512_load_ps(l), cv, sum));
        _mm512_store_ps(m, top);
        __m512 pv[KB];
        for (int c = 0; c < KB; c++) pv[c] = c < kc ? _mm512_load_ps(pt[c]) : _mm512_setzero_ps();
        if (kc == KB) {
            for (int x = 0; x < d; x++) {
                __m512 o = _mm512_mul_ps(_mm512_load_ps(ot[x]), cv);
                for (int c = 0; c < KB; c++) o = _mm512_fmadd_ps(pv[c], _mm512_set1_ps(vr[c][x]), o);
                _mm512_store_ps(ot[x], o);
            }
        } else {
            for (int x = 0; x < d; x++) {
                __m512 o = _mm512_mul_ps(_mm512_load_ps(ot[x]), cv);
                for (int c = 0; c < kc; c++) o = _mm512_fmadd_ps(pv[c], _mm512_set1_ps(vr[c][x]), o);
                _mm512_store_ps(ot[x], o);
            }
        }
#elif defined(__AVX2__) && defined(__FMA__)
        (void)diag;
        for (int c = kc; c < KB; c++) { /* a short tile: rows that exist, masked out in tile_half */
            kr[c] = kr[0];
            vr[c] = vr[0];
        }
        for (int o8 = 0; o8 < nq; o8 += 8) /* a half past nq holds no query */
            tile_half((float (*)[QB])(&qt[0][o8]), (float (*)[QB])(&ot[0][o8]), m + o8, l + o8, kr, vr, kc, d,
                      k0 - q_first - o8);
#else
        float pt[KB][QB], sc[KB][QB];
        for (int c = 0; c < KB; c++)
            for (int t = 0; t < QB; t++) sc[c][t] = 0.0f;
        for (int x = 0; x < d; x++)
            for (int c = 0; c < kc; c++) {
                const float kx = kr[c][x];
#pragma omp simd
                for (int t = 0; t < QB; t++) sc[c][t] += qt[x][t] * kx;
            }
        float top[QB], corr[QB];
        for (int t = 0; t < QB; t++) top[t] = m[t];
        for (int c = 0; c < kc; c++)
            for (int t = 0; t < QB; t++) {
                if (diag > 0 && k0 + c > q_first + t) sc[c][t] = -FLT_MAX;
                top[t] = sc[c][t] > top[t] ? sc[c][t] : top[t];
            }
        for (int t = 0; t < QB; t++) corr[t] = expf(m[t] - top[t]);
        for (int c = 0; c < kc; c++)
            for (int t = 0; t < QB; t++) pt[c][t] = expf(sc[c][t] - top[t]);
        for (int t = 0; t < QB; t++) {
            float sum = 0.0f;
            for (int c = 0; c < kc; c++) sum += pt[c][t];
            l[t] = l[t] * corr[t] + sum;
            m[t] = top[t];
        }
        for (int x = 0; x < d; x++) {
            float o[QB];
            for (int t = 0; t < QB; t++) o[t] = ot[x][t] * corr[t];
            for (int c = 0; c < kc; c++) {
                const float vx = vr[c][x];
#pragma omp simd
                for (int t = 0; t < QB; t++) o[t] += pt[c][t] * vx;
            }
            for (int t = 0; t < QB; t++) ot[x][t] = o[t];
        }
#endif
    }
#if defined(PDR_AVX2_EXTEND)
    if (d % 8 == 0) {
        store_out_t(ot, l, j->out + row0 * j->out_stride + (int64_t)h * d, j->out_stride, nq, d);
        return;
    }
#endif
    for (int t = 0; t < nq; t++) {
        float *o = j->out + (row0 + t) * j->out_stride + (int64_t)h * d;
        const float inv = 1.0f / l[t];
        for (int x = 0; x < d; x++) o[x] = ot[x][t] * inv;
    }
}

/* The entry points below, over a cache of fp32 or (bf16 set) bf16 elements. */
static int extend(const float *q, int64_t q_stride, const void *k, const void *v, int64_t page_stride,
                  const int64_t *page_table, int64_t pt_stride, const int64_t *starts, const int64_t *prefix,
                  const int64_t *lens, float *out, int64_t out_stride, int n, int heads, int kv_heads, int dim,
                  int page_size, float scale, int nthreads, int bf16) {
    if (kv_heads <= 0 || heads % kv_heads || dim > MAX_DIM || dim <= 0) return -1;
    if (n <= 0) return 0;
    const job_t j = {q,    q_stride, k,          v,     page_stride, page_table, pt_stride, starts, prefix,
                     lens, out,      out_stride, heads, kv_heads,    dim,        page_size, scale,  bf16};
    /* items: every (sequence, block of 16 new tokens), times the heads; first[s] = the sequence's first block */
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!first) return -2;
    first[0] = 0;
    for (int s = 0; s < n; s++) first[s + 1] = first[s] + (lens[s] + QB - 1) / QB;
    const int64_t items = first[n] * heads;
    if (nthreads < 1) nthreads = 1;
    /* Heaviest first: blocks later in a sequence see more keys; dynamic hand-out balances the rest. */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t it = items - 1; it >= 0; it--) {
        const int64_t blk = it / heads;
        const int h = (int)(it % heads);
        int s = 0;
        while (first[s + 1] <= blk) s++;
        const int64_t i0 = (blk - first[s]) * QB;
        const int nq = (int)(lens[s] - i0 < QB ? lens[s] - i0 : QB);
        attend_block(&j, s, h, i0, nq);
    }
    free(first);
    return 0;
}

/* Returns 0, or -1 when head_dim is past the per-item buffers (the caller says which flag avoids it). */
int pdr_paged_extend_f32(const float *q, int64_t q_stride, const float *k, const float *v, int64_t page_stride,
                         const int64_t *page_table, int64_t pt_stride, const int64_t *starts, const int64_t *prefix,
                         const int64_t *lens, float *out, int64_t out_stride, int n, int heads, int kv_heads, int dim,
                         int page_size, float scale, int nthreads) {
    return extend(q, q_stride, k, v, page_stride, page_table, pt_stride, starts, prefix, lens, out, out_stride, n,
                  heads, kv_heads, dim, page_size, scale, nthreads, 0);
}

/* pdr_paged_extend_f32 over a bf16 cache (q and out fp32; sums and softmax in fp32). */
int pdr_paged_extend_bf16(const float *q, int64_t q_stride, const uint16_t *k, const uint16_t *v, int64_t page_stride,
                          const int64_t *page_table, int64_t pt_stride, const int64_t *starts, const int64_t *prefix,
                          const int64_t *lens, float *out, int64_t out_stride, int n, int heads, int kv_heads, int dim,
                          int page_size, float scale, int nthreads) {
    return extend(q, q_stride, k, v, page_stride, page_table, pt_stride, starts, prefix, lens, out, out_stride, n,
                  heads, kv_heads, dim, page_size, scale, nthreads, 1);
}
