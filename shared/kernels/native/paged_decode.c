/* Paged decode attention over the KV pool in place, for CPU (fp32): one new query token per sequence attends to
 * its cached keys/values, read straight from the pages the page table lists. No gather copy and no padding to the
 * longest sequence, which is what the torch reference path pays for on every layer.
 *
 * Work item = (sequence, kv head): the item's query heads (the GQA group) share each K/V page while it is in L1.
 * Online softmax page by page (running max, rescaled sum and accumulator), in fp32.
 * Items are shared out by an OpenMP loop. The library links libgomp.so.1, the soname torch's own OpenMP runtime
 * is loaded under, so the loop runs on torch's (already spinning) intra-op threads: a second thread pool measured
 * 2.5x slower here, its threads fighting torch's spinning ones for the same cores.
 *
 * Built at run time by shared/kernels/native/build.py with -O3 -march=native -ffast-math: the dot products and the
 * exp over a page vectorise (glibc's libmvec). The code keeps every value finite (no -inf sentinels), which
 * -ffast-math requires.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "bf16.h"
#include "pdr_kernels.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define PDR_SIMD 1 /* a vector path below: AVX-512, else AVX2 + FMA */
#endif

#define MAX_GROUP 16
#define MAX_DIM 256
#define MAX_PAGE 256
#define MAX_HEADS 64 /* query heads one AVX-512 item takes (a whole sequence when heads <= 64) */
typedef struct {
    const float *q;
    int64_t q_stride; /* floats between two query tokens */
    const void *k, *v;   /* float, or bf16 (uint16_t) where bf16 is set */
    int64_t page_stride; /* elements between two pages of one layer's K (or V) */
    const int64_t *page_table;
    int64_t pt_stride;
    const int64_t *seq_lens, *rows;
    float *out;
    int64_t out_stride;
    int n, heads, kv_heads, dim, page_size;
    float scale;
    int bf16; /* the cache holds bf16: every K/V element is widened to fp32 as it is read */
} job_t;

/* Element i of a K or V cache, as fp32. */
static inline float kv_at(const void *base, int64_t i, int bf16) {
    return bf16 ? pdr_from_bf16(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

/* The address of element i of a K or V cache (for prefetches). */
static inline const char *kv_addr(const void *base, int64_t i, int bf16) {
    return (const char *)base + i * (bf16 ? 2 : 4);
}

/* Per query head: scaled q, a zero accumulator, running max and sum at their start values. */
static void start_heads(const float *q, float scale, int heads, int d, float (*qs)[MAX_DIM], float (*acc)[MAX_DIM],
                        float *m, float *l) {
    for (int h = 0; h < heads; h++) {
        for (int x = 0; x < d; x++) {
            qs[h][x] = q[h * d + x] * scale;
            acc[h][x] = 0.0f;
        }
        m[h] = -FLT_MAX;
        l[h] = 0.0f;
    }
}

/* out[h] = acc[h] / l[h] for each query head. */
static void finish_heads(float *o, int heads, int d, float (*acc)[MAX_DIM], const float *l) {
    for (int h = 0; h < heads; h++) {
        const float inv = 1.0f / l[h];
        for (int x = 0; x < d; x++) o[h * d + x] = acc[h][x] * inv;
    }
}

static void attend(const job_t *j, int i, int kh) {
    const int g = j->heads / j->kv_heads, d = j->dim, P = j->page_size;
    const int64_t tok_stride = (int64_t)j->kv_heads * d;
    const int64_t row = j->rows[i], len = j->seq_lens[i];
    const float *q = j->q + row * j->q_stride + (int64_t)kh * g * d;
    const int64_t *pt = j->page_table + (int64_t)i * j->pt_stride;
    float qs[MAX_GROUP][MAX_DIM], acc[MAX_GROUP][MAX_DIM], s[MAX_GROUP][MAX_PAGE];
    float m[MAX_GROUP], l[MAX_GROUP];
    start_heads(q, j->scale, g, d, qs, acc, m, l);
    for (int64_t start = 0; start < len; start += P) {
        const int cnt = (int)(len - start < P ? len - start : P);
        const int64_t page = pt[start / P];
        const int64_t at = page * j->page_stride + (int64_t)kh * d; /* element of this page's first row */
        for (int h = 0; h < g; h++) {
            float mx = m[h];
            for (int t = 0; t < cnt; t++) {
                const int64_t kt = at + t * tok_stride;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int x = 0; x < d; x++) dot += qs[h][x] * kv_at(j->k, kt + x, j->bf16);
                s[h][t] = dot;
                mx = dot > mx ? dot : mx;
            }
            const float corr = expf(m[h] - mx); /* 0 on the first page: m = -FLT_MAX */
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int t = 0; t < cnt; t++) {
                s[h][t] = expf(s[h][t] - mx);
                sum += s[h][t];
            }
            l[h] = l[h] * corr + sum;
            m[h] = mx;
            for (int x = 0; x < d; x++) acc[h][x] *= corr;
            for (int t = 0; t < cnt; t++) {
                const int64_t vt = at + t * tok_stride;
                const float p = s[h][t];
#pragma omp simd
                for (int x = 0; x < d; x++) acc[h][x] += p * kv_at(j->v, vt + x, j->bf16);
            }
        }
    }
    finish_heads(j->out + row * j->out_stride + (int64_t)kh * g * d, g, d, acc, l);
}

#if defined(PDR_SIMD)
/* The lines of `cnt` tokens' rows (d floats each, tok_stride apart) into L2. Into L2, not L1: a page's K and V for
 * every kv head of a sequence (24 KiB at 3 x 64) plus the next one's would not fit L1 beside the working set
 * (measured 10-15% slower with _MM_HINT_T0 at 16 sequences of 160 tokens from DRAM). */
static void prefetch_page(const char *p, int cnt, int64_t tok_bytes, int64_t row_bytes) {
    for (int t = 0; t < cnt; t++)
        for (int64_t x = 0; x < row_bytes; x += 64) _mm_prefetch(p + t * tok_bytes + x, _MM_HINT_T1);
}

/* The page after the one at `start`, for an item over kv heads [kh0, kh0 + span / d) of a sequence of `len` tokens.
 * A whole-sequence item's K and V of a page are each one contiguous range: *nk, *nv get their starts and the result
 * is the count of 64-byte lines, which the caller spreads over this page's compute, a share per query head (one
 * burst of all its lines stalled the loads behind it: Zen 4, 30 layers from DRAM at 16 sequences of 160 tokens,
 * 8.6-9.2 -> 6.8-8.5 ms; of 512: 32 -> 21.5 ms). A one-head item's rows are strided: prefetched here in one burst,
 * and the result is 0. */
static int64_t next_page(const job_t *j, const int64_t *pt, int64_t start, int64_t len, int kh0, int span,
                         const char **nk, const char **nv) {
    const int64_t P = j->page_size, tok_stride = (int64_t)j->kv_heads * j->dim, es = j->bf16 ? 2 : 4;
    if (start + P >= len) return 0;
    const int64_t next = pt[start / P + 1];
    const int ncnt = (int)(len - start - P < P ? len - start - P : P);
    if (span == tok_stride) {
        *nk = kv_addr(j->k, next * j->page_stride, j->bf16);
        *nv = kv_addr(j->v, next * j->page_stride, j->bf16);
        return ((int64_t)ncnt * span * es + 63) / 64;
    }
    const int64_t first = next * j->page_stride + (int64_t)kh0 * j->dim;
    prefetch_page(kv_addr(j->k, first, j->bf16), ncnt, tok_stride * es, span * es);
    prefetch_page(kv_addr(j->v, first, j->bf16), ncnt, tok_stride * es, span * es);
    return 0;
}

/* Query head h's share of the next page's lines, prefetched into L2. */
static inline void prefetch_share(const char *nk, const char *nv, int64_t nlines, int gh, int h) {
    const int64_t share = (nlines + gh - 1) / gh, lo = h * share, hi = lo + share < nlines ? lo + share : nlines;
    for (int64_t x = lo; x < hi; x++) {
        _mm_prefetch(nk + x * 64, _MM_HINT_T1);
        _mm_prefetch(nv + x * 64, _MM_HINT_T1);
    }
}
#endif

#if defined(__AVX512F__)
/* out[t] = the sum of a[t]'s 16 lanes, for 16 vectors at once: a transpose folded into the adds (45 shuffles and
 * adds where 16 horizontal sums take ~130, with no chain from one token to the next). */
static inline __m512 hsum16(const __m512 *a) {
    __m512 u[4];
    for (int b = 0; b < 4; b++) {
        const __m512 *x = a + 4 * b;
        /* per 128-bit lane: pairwise sums of x0 / x1 and of x2 / x3, then the lane's sums of x0 x1 x2 x3 in order */
        const __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1]));
        const __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3]));
        u[b] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))));
    }
    /* each 128-bit lane of u[b] holds partial sums of tokens 4b..4b+3: add the four lanes, group b into lane b */
    const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
    const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
}

/* P.V for one query head over `cnt` tokens: acc = acc * corr + sum_t p[t] v_t. d = 64 keeps the row in 4 registers
 * over all the tokens; other sizes go through L1. */
static inline void weigh_values(float *acc, const float *vp, int64_t tok_stride, const float *p, int cnt, int d,
                                float corr) {
    const __m512 c = _mm512_set1_ps(corr);
    if (d == 64) {
        __m512 r0 = _mm512_mul_ps(_mm512_load_ps(acc), c), r1 = _mm512_mul_ps(_mm512_load_ps(acc + 16), c);
        __m512 r2 = _mm512_mul_ps(_mm512_load_ps(acc + 32), c), r3 = _mm512_mul_ps(_mm512_load_ps(acc + 48), c);
        for (int t = 0; t < cnt; t++) {
            const float *vt = vp + t * tok_stride;
            const __m512 w = _mm512_set1_ps(p[t]);
            r0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(vt), r0);
            r1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(vt + 16), r1);
            r2 = _mm512_fmadd_ps(w, _mm512_loadu_ps(vt + 32), r2);
            r3 = _mm512_fmadd_ps(w, _mm512_loadu_ps(vt + 48), r3);
        }
        _mm512_store_ps(acc, r0);
        _mm512_store_ps(acc + 16, r1);
        _mm512_store_ps(acc + 32, r2);
        _mm512_store_ps(acc + 48, r3);
        return;
    }
    for (int x = 0; x < d; x += 16) _mm512_store_ps(acc + x, _mm512_mul_ps(_mm512_load_ps(acc + x), c));
    for (int t = 0; t < cnt; t++) {
        const float *vt = vp + t * tok_stride;
        const __m512 w = _mm512_set1_ps(p[t]);
        for (int x = 0; x < d; x += 16)
            _mm512_store_ps(acc + x, _mm512_fmadd_ps(w, _mm512_loadu_ps(vt + x), _mm512_load_ps(acc + x)));
    }
}

/* attend() for head_dim a multiple of 16, kv heads [kh0, kh1) of sequence i, 16 tokens at a time: a query head's 16
 * scores are 16 dot products in registers and one hsum16, the online softmax runs on that vector (one max, one
 * vectorised exp), and the next page is prefetched while this one is computed (the pages of a sequence are
 * scattered, so the hardware prefetcher cannot follow). Over 30 layers at 16 sequences of 160 tokens from DRAM
 * (GQA 9/3, head_dim 64, 2 threads, Zen 4): 240-265 us a layer with a horizontal sum per token and the next page
 * into L1, 198-213 here. A bf16 cache's block is widened into fp32 rows in L1 once per kv head, and its query heads
 * (the GQA group) read those: widened at every load instead, each element was widened g times. */
static inline __attribute__((always_inline)) void attend_avx512_t(const job_t *j, int i, int kh0, int kh1,
                                                                  const int bf16) {
    const int g = j->heads / j->kv_heads, d = j->dim, P = j->page_size;
    const int64_t tok_stride = (int64_t)j->kv_heads * d;
    const int64_t row = j->rows[i], len = j->seq_lens[i];
    const int gh = (kh1 - kh0) * g; /* query heads of this call */
    const int span = (kh1 - kh0) * d; /* floats of one token's rows for these kv heads */
    const float *q = j->q + row * j->q_stride + (int64_t)kh0 * g * d;
    const int64_t *pt = j->page_table + (int64_t)i * j->pt_stride;
    float qs[MAX_HEADS][MAX_DIM] __attribute__((aligned(64))), acc[MAX_HEADS][MAX_DIM] __attribute__((aligned(64)));
    float p[16] __attribute__((aligned(64))), m[MAX_HEADS], l[MAX_HEADS];
    float kw[16 * MAX_DIM] __attribute__((aligned(64))), vw[16 * MAX_DIM] __attribute__((aligned(64))); /* bf16 only */
    start_heads(q, j->scale, gh, d, qs, acc, m, l);
    for (int64_t start = 0; start < len; start += P) {
        const int cnt = (int)(len - start < P ? len - start : P);
        const int64_t page = pt[start / P];
        const char *nk = 0, *nv = 0;
        const int64_t nlines = next_page(j, pt, start, len, kh0, span, &nk, &nv);
        for (int t0 = 0; t0 < cnt; t0 += 16) {
            const int bc = cnt - t0 < 16 ? cnt - t0 : 16;
            const __mmask16 live = (__mmask16)(bc == 16 ? 0xFFFFu : (1u << bc) - 1u);
            for (int h = 0; h < gh; h++) {
                if (nlines && t0 == 0) prefetch_share(nk, nv, nlines, gh, h);
                int64_t at = page * j->page_stride + (int64_t)(kh0 + h / g) * d + t0 * tok_stride, ts = tok_stride;
                const void *kb = j->k, *vb = j->v;
                if (bf16) { /* the block's rows of this kv head, widened once for its g query heads */
                    if (h % g == 0)
                        for (int t = 0; t < bc; t++) {
                            pdr_widen_bf16(kw + t * d, (const uint16_t *)j->k + at + t * tok_stride, d);
                            pdr_widen_bf16(vw + t * d, (const uint16_t *)j->v + at + t * tok_stride, d);
                        }
                    kb = kw, vb = vw, at = 0, ts = d;
                }
                __m512 a[16];
                for (int t = 0; t < 16; t++) {
                    a[t] = _mm512_setzero_ps();
                    if (t >= bc) continue;
                    const int64_t kt = at + t * ts;
                    for (int x = 0; x < d; x += 16)
                        a[t] = _mm512_fmadd_ps(_mm512_load_ps(qs[h] + x), _mm512_loadu_ps((const float *)kb + kt + x),
                                               a[t]);
                }
                const __m512 sc = hsum16(a); /* [16] scores; lanes past bc are not tokens */
                const float top = _mm512_mask_reduce_max_ps(live, sc);
                const float mx = top > m[h] ? top : m[h];
                const float corr = expf(m[h] - mx); /* 0 on the first block: m = -FLT_MAX */
                _mm512_store_ps(p, _mm512_maskz_sub_ps(live, sc, _mm512_set1_ps(mx)));
#pragma omp simd
                for (int t = 0; t < 16; t++) p[t] = expf(p[t]);
                const __m512 pv = _mm512_maskz_load_ps(live, p); /* exp(0) = 1 past bc: masked out */
                l[h] = l[h] * corr + _mm512_reduce_add_ps(pv);
                m[h] = mx;
                weigh_values(acc[h], (const float *)vb + at, ts, p, bc, d, corr);
            }
        }
    }
    finish_heads(j->out + row * j->out_stride + (int64_t)kh0 * g * d, gh, d, acc, l);
}

static void attend_avx512(const job_t *j, int i, int kh0, int kh1) {
    if (j->bf16)
        attend_avx512_t(j, i, kh0, kh1, 1);
    else
        attend_avx512_t(j, i, kh0, kh1, 0);
}
#define ATTEND_VEC attend_avx512
#define VEC_DIM 16
#elif defined(PDR_SIMD)
/* The AVX2 + FMA forms of hsum16, weigh_values and attend_avx512: 8 lanes, 16 registers. */

/* out[t] = the sum of a[t]'s 8 lanes, for 8 vectors at once (the transpose folded into the adds). */
static inline __m256 hsum8(const __m256 *a) {
    __m256 u[2];
    for (int b = 0; b < 2; b++) {
        const __m256 *x = a + 4 * b;
        /* per 128-bit lane: pairwise sums of x0 / x1 and of x2 / x3, then the lane's sums of x0 x1 x2 x3 in order */
        const __m256 t01 = _mm256_add_ps(_mm256_unpacklo_ps(x[0], x[1]), _mm256_unpackhi_ps(x[0], x[1]));
        const __m256 t23 = _mm256_add_ps(_mm256_unpacklo_ps(x[2], x[3]), _mm256_unpackhi_ps(x[2], x[3]));
        u[b] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t01), _mm256_castps_pd(t23))),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t01), _mm256_castps_pd(t23))));
    }
    /* u[b]'s two 128-bit lanes hold the low and high halves' sums of tokens 4b..4b+3 */
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

static inline float hmax8(__m256 v) {
    v = _mm256_max_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_max_ps(v, _mm256_shuffle_ps(v, v, 0x4E));
    v = _mm256_max_ps(v, _mm256_shuffle_ps(v, v, 0xB1));
    return _mm256_cvtss_f32(v);
}

static inline float hadd8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

/* acc = acc * corr + sum_t p[t] v_t over `cnt` tokens; d = 64 keeps the row in 8 registers over all of them. */
static inline void weigh_values(float *acc, const float *vp, int64_t tok_stride, const float *p, int cnt, int d,
                                float corr) {
    const __m256 c = _mm256_set1_ps(corr);
    if (d == 64) {
        __m256 r[8];
        for (int x = 0; x < 8; x++) r[x] = _mm256_mul_ps(_mm256_load_ps(acc + 8 * x), c);
        for (int t = 0; t < cnt; t++) {
            const float *vt = vp + t * tok_stride;
            const __m256 w = _mm256_set1_ps(p[t]);
            for (int x = 0; x < 8; x++) r[x] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vt + 8 * x), r[x]);
        }
        for (int x = 0; x < 8; x++) _mm256_store_ps(acc + 8 * x, r[x]);
        return;
    }
    for (int x = 0; x < d; x += 8) _mm256_store_ps(acc + x, _mm256_mul_ps(_mm256_load_ps(acc + x), c));
    for (int t = 0; t < cnt; t++) {
        const float *vt = vp + t * tok_stride;
        const __m256 w = _mm256_set1_ps(p[t]);
        for (int x = 0; x < d; x += 8)
            _mm256_store_ps(acc + x, _mm256_fmadd_ps(w, _mm256_loadu_ps(vt + x), _mm256_load_ps(acc + x)));
    }
}

/* Scores of query head qh against tokens [0, bc) of kp (bc <= 8), lanes past bc at -FLT_MAX. x outer, tokens inner:
 * 8 independent FMA chains (a token's 8 chained FMAs, token after token, left the FMA units waiting on their
 * latency), one load of q for every 8 FMAs. */
static inline __m256 scores8(const float *qh, const float *kp, int64_t tok_stride, int d, int bc) {
    __m256 a[8];
    for (int t = 0; t < 8; t++) a[t] = _mm256_setzero_ps();
    if (bc == 8) {
        for (int x = 0; x < d; x += 8) {
            const __m256 qx = _mm256_load_ps(qh + x);
            for (int t = 0; t < 8; t++) a[t] = _mm256_fmadd_ps(qx, _mm256_loadu_ps(kp + t * tok_stride + x), a[t]);
        }
        return hsum8(a);
    }
    for (int x = 0; x < d; x += 8) {
        const __m256 qx = _mm256_load_ps(qh + x);
        for (int t = 0; t < bc; t++) a[t] = _mm256_fmadd_ps(qx, _mm256_loadu_ps(kp + t * tok_stride + x), a[t]);
    }
    const __m256 live = _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps((float)bc), _CMP_LT_OQ);
    return _mm256_blendv_ps(_mm256_set1_ps(-FLT_MAX), hsum8(a), live);
}

/* attend_avx512 in 8-lane vectors, head_dim a multiple of 8, 16 tokens a block (two vectors of scores: one max,
 * one rescale of the accumulator, one exp call of 16 for every 16 tokens). The generic attend() it replaces summed
 * each token's dot product horizontally, one exp a token, and waited on DRAM for every scattered page: Zen 3, 2
 * threads, 30 layers from DRAM (python -m bench.kernels_cpu), 16 sequences of 160 tokens 12.8-16.6 -> 7.2-11.3 ms,
 * of 512 tokens 40.7-46.4 -> 20.7-24.9 ms. */
static void attend_avx2(const job_t *j, int i, int kh0, int kh1) {
    const int g = j->heads / j->kv_heads, d = j->dim, P = j->page_size;
    const int64_t tok_stride = (int64_t)j->kv_heads * d;
    const int64_t row = j->rows[i], len = j->seq_lens[i];
    const int gh = (kh1 - kh0) * g;
    const int span = (kh1 - kh0) * d;
    const float *q = j->q + row * j->q_stride + (int64_t)kh0 * g * d;
    const int64_t *pt = j->page_table + (int64_t)i * j->pt_stride;
    float qs[MAX_HEADS][MAX_DIM] __attribute__((aligned(32))), acc[MAX_HEADS][MAX_DIM] __attribute__((aligned(32)));
    float p[16] __attribute__((aligned(32))), m[MAX_HEADS], l[MAX_HEADS];
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), neg = _mm256_set1_ps(-FLT_MAX);
    start_heads(q, j->scale, gh, d, qs, acc, m, l);
    for (int64_t start = 0; start < len; start += P) {
        const int cnt = (int)(len - start < P ? len - start : P);
        const int64_t page = pt[start / P];
        const char *nk = 0, *nv = 0;
        const int64_t nlines = next_page(j, pt, start, len, kh0, span, &nk, &nv);
        for (int t0 = 0; t0 < cnt; t0 += 16) {
            const int bc = cnt - t0 < 16 ? cnt - t0 : 16;
            const __m256 live0 = _mm256_cmp_ps(lane, _mm256_set1_ps((float)bc), _CMP_LT_OQ);
            const __m256 live1 = _mm256_cmp_ps(lane, _mm256_set1_ps((float)(bc - 8)), _CMP_LT_OQ);
            for (int h = 0; h < gh; h++) {
                if (nlines && t0 == 0) prefetch_share(nk, nv, nlines, gh, h);
                const int64_t at = page * j->page_stride + (int64_t)(kh0 + h / g) * d + t0 * tok_stride;
                const float *kp = (const float *)j->k + at, *vp = (const float *)j->v + at; /* fp32 only */
                const __m256 s0 = scores8(qs[h], kp, tok_stride, d, bc < 8 ? bc : 8);
                const __m256 s1 = bc > 8 ? scores8(qs[h], kp + 8 * tok_stride, tok_stride, d, bc - 8) : neg;
                const float top = hmax8(_mm256_max_ps(s0, s1));
                const float mx = top > m[h] ? top : m[h];
                const float corr = expf(m[h] - mx); /* 0 on the first block: m = -FLT_MAX */
                const __m256 mv = _mm256_set1_ps(mx);
                _mm256_store_ps(p, _mm256_and_ps(live0, _mm256_sub_ps(s0, mv)));
                _mm256_store_ps(p + 8, _mm256_and_ps(live1, _mm256_sub_ps(s1, mv)));
#pragma omp simd
                for (int t = 0; t < 16; t++) p[t] = expf(p[t]);
                /* exp(0) = 1 in the lanes past bc: masked out */
                const __m256 p0 = _mm256_and_ps(live0, _mm256_load_ps(p));
                const __m256 p1 = _mm256_and_ps(live1, _mm256_load_ps(p + 8));
                l[h] = l[h] * corr + hadd8(_mm256_add_ps(p0, p1));
                m[h] = mx;
                weigh_values(acc[h], vp, tok_stride, p, bc, d, corr);
            }
        }
    }
    finish_heads(j->out + row * j->out_stride + (int64_t)kh0 * g * d, gh, d, acc, l);
}
#define ATTEND_VEC attend_avx2
#define VEC_DIM 8
#endif

/* The entry points below, over a cache of fp32 or (bf16 set) bf16 elements. */
static int decode(const float *q, int64_t q_stride, const void *k, const void *v, int64_t page_stride,
                  const int64_t *page_table, int64_t pt_stride, const int64_t *seq_lens, const int64_t *rows,
                  float *out, int64_t out_stride, int n, int heads, int kv_heads, int dim, int page_size, float scale,
                  int nthreads, int bf16) {
    if (kv_heads <= 0 || heads % kv_heads || heads / kv_heads > MAX_GROUP || dim > MAX_DIM || page_size > MAX_PAGE)
        return -1;
    const job_t j = {q,   q_stride,   k, v,     page_stride, page_table, pt_stride, seq_lens, rows,
                     out, out_stride, n, heads, kv_heads,    dim,        page_size, scale,    bf16};
    const int items = n * kv_heads;
    if (nthreads < 1) nthreads = 1;
    /* AVX-512 or AVX2, head_dim a multiple of the vector: with enough sequences to go round, an item is a whole
     * sequence, every kv head page by page (a page's heads share its cache lines: 418 -> 343 us a layer over 30
     * layers at 16 sequences of 160 tokens on Zen 4, against one head per item), else one kv head (every thread
     * busy with few sequences). A bf16 cache takes the AVX-512 path (the AVX2 one reads fp32 only) or the loops. */
#if defined(ATTEND_VEC)
    if (dim % VEC_DIM == 0 && (!bf16 || VEC_DIM == 16)) {
        if (n >= 2 * nthreads && heads <= MAX_HEADS) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
            for (int i = 0; i < n; i++) ATTEND_VEC(&j, i, 0, kv_heads);
        } else {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
            for (int it = 0; it < items; it++) ATTEND_VEC(&j, it / kv_heads, it % kv_heads, it % kv_heads + 1);
        }
        return 0;
    }
#endif
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int it = 0; it < items; it++) attend(&j, it / kv_heads, it % kv_heads);
    return 0;
}

/* Returns 0, or -1 when a size is past the fixed per-item buffers (the caller says which flag avoids it). */
int pdr_paged_decode_f32(const float *q, int64_t q_stride, const float *k, const float *v, int64_t page_stride,
                         const int64_t *page_table, int64_t pt_stride, const int64_t *seq_lens, const int64_t *rows,
                         float *out, int64_t out_stride, int n, int heads, int kv_heads, int dim, int page_size,
                         float scale, int nthreads) {
    return decode(q, q_stride, k, v, page_stride, page_table, pt_stride, seq_lens, rows, out, out_stride, n, heads,
                  kv_heads, dim, page_size, scale, nthreads, 0);
}

/* pdr_paged_decode_f32 over a bf16 cache (q and out fp32): each K/V element widened to fp32 as it is read, the
 * sums and the softmax in fp32. */
int pdr_paged_decode_bf16(const float *q, int64_t q_stride, const uint16_t *k, const uint16_t *v, int64_t page_stride,
                          const int64_t *page_table, int64_t pt_stride, const int64_t *seq_lens, const int64_t *rows,
                          float *out, int64_t out_stride, int n, int heads, int kv_heads, int dim, int page_size,
                          float scale, int nthreads) {
    return decode(q, q_stride, k, v, page_stride, page_table, pt_stride, seq_lens, rows, out, out_stride, n, heads,
                  kv_heads, dim, page_size, scale, nthreads, 1);
}
