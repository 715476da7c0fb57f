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
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define MAX_GROUP 16
#define MAX_DIM 256
#define MAX_PAGE 256
#define MAX_HEADS 64 /* query heads one AVX-512 item takes (a whole sequence when heads <= 64) */
typedef struct {
    const float *q;
    int64_t q_stride; /* floats between two query tokens */
    const float *k, *v;
    int64_t page_stride; /* floats between two pages of one layer's K (or V) */
    const int64_t *page_table;
    int64_t pt_stride;
    const int64_t *seq_lens, *rows;
    float *out;
    int64_t out_stride;
    int n, heads, kv_heads, dim, page_size;
    float scale;
} job_t;

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
        const float *kp = j->k + page * j->page_stride + (int64_t)kh * d;
        const float *vp = j->v + page * j->page_stride + (int64_t)kh * d;
        for (int h = 0; h < g; h++) {
            float mx = m[h];
            for (int t = 0; t < cnt; t++) {
                const float *kt = kp + t * tok_stride;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int x = 0; x < d; x++) dot += qs[h][x] * kt[x];
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
                const float *vt = vp + t * tok_stride;
                const float p = s[h][t];
#pragma omp simd
                for (int x = 0; x < d; x++) acc[h][x] += p * vt[x];
            }
        }
    }
    finish_heads(j->out + row * j->out_stride + (int64_t)kh * g * d, g, d, acc, l);
}

#if defined(__AVX512F__)
/* attend() for head_dim a multiple of 64, in AVX-512 registers, for kv heads [kh0, kh1) of sequence i. Measured 1.4x
 * the plain loops' speed over 30 layers (16 sequences of 160 tokens, GQA 9/3, head_dim 64, 2 threads: 475 -> 343 us
 * a layer; 1.7x with the layer's pages in cache). Where the plain loops lose: each token's dot product
 * ends in a reduction the next one waits on, the P.V sum goes through memory token by token (a store-to-load chain),
 * and the next page is fetched only when it is touched (the pages of one sequence are not sequential in memory, so
 * the hardware prefetcher cannot follow). Here a token's dot is DV independent FMAs then one reduction (tokens
 * overlap), P.V keeps 64 columns in 4 registers over the whole page, and the next page is prefetched while this one
 * is computed. */
static void prefetch_page(const float *p, int cnt, int64_t tok_stride, int d) {
    for (int t = 0; t < cnt; t++)
        for (int x = 0; x < d; x += 16) _mm_prefetch((const char *)(p + t * tok_stride + x), _MM_HINT_T0);
}

static void attend_avx512(const job_t *j, int i, int kh0, int kh1) {
    const int g = j->heads / j->kv_heads, d = j->dim, P = j->page_size;
    const int64_t tok_stride = (int64_t)j->kv_heads * d;
    const int64_t row = j->rows[i], len = j->seq_lens[i];
    const int gh = (kh1 - kh0) * g; /* query heads of this call */
    const float *q = j->q + row * j->q_stride + (int64_t)kh0 * g * d;
    const int64_t *pt = j->page_table + (int64_t)i * j->pt_stride;
    float qs[MAX_HEADS][MAX_DIM] __attribute__((aligned(64))), acc[MAX_HEADS][MAX_DIM] __attribute__((aligned(64)));
    float s[MAX_PAGE], m[MAX_HEADS], l[MAX_HEADS];
    start_heads(q, j->scale, gh, d, qs, acc, m, l);
    for (int64_t start = 0; start < len; start += P) {
        const int cnt = (int)(len - start < P ? len - start : P);
        const int64_t page = pt[start / P];
        if (start + P < len) {
            const int64_t next = pt[start / P + 1];
            const int ncnt = (int)(len - start - P < P ? len - start - P : P);
            prefetch_page(j->k + next * j->page_stride + (int64_t)kh0 * d, ncnt, tok_stride, (kh1 - kh0) * d);
            prefetch_page(j->v + next * j->page_stride + (int64_t)kh0 * d, ncnt, tok_stride, (kh1 - kh0) * d);
        }
        for (int h = 0; h < gh; h++) {
            const float *kp = j->k + page * j->page_stride + (int64_t)(kh0 + h / g) * d;
            const float *vp = j->v + page * j->page_stride + (int64_t)(kh0 + h / g) * d;
            float mx = m[h];
            for (int t = 0; t < cnt; t++) {
                const float *kt = kp + t * tok_stride;
                __m512 a = _mm512_mul_ps(_mm512_load_ps(qs[h]), _mm512_loadu_ps(kt));
                for (int x = 16; x < d; x += 16) a = _mm512_fmadd_ps(_mm512_load_ps(qs[h] + x), _mm512_loadu_ps(kt + x), a);
                const float dot = _mm512_reduce_add_ps(a);
                s[t] = dot;
                mx = dot > mx ? dot : mx;
            }
            const float corr = expf(m[h] - mx); /* 0 on the first page: m = -FLT_MAX */
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int t = 0; t < cnt; t++) {
                s[t] = expf(s[t] - mx);
                sum += s[t];
            }
            l[h] = l[h] * corr + sum;
            m[h] = mx;
            const __m512 c = _mm512_set1_ps(corr);
            for (int x = 0; x < d; x += 64) {
                float *ah = acc[h] + x;
                __m512 r0 = _mm512_mul_ps(_mm512_load_ps(ah), c), r1 = _mm512_mul_ps(_mm512_load_ps(ah + 16), c);
                __m512 r2 = _mm512_mul_ps(_mm512_load_ps(ah + 32), c), r3 = _mm512_mul_ps(_mm512_load_ps(ah + 48), c);
                for (int t = 0; t < cnt; t++) {
                    const float *vt = vp + t * tok_stride + x;
                    const __m512 p = _mm512_set1_ps(s[t]);
                    r0 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vt), r0);
                    r1 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vt + 16), r1);
                    r2 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vt + 32), r2);
                    r3 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vt + 48), r3);
                }
                _mm512_store_ps(ah, r0);
                _mm512_store_ps(ah + 16, r1);
                _mm512_store_ps(ah + 32, r2);
                _mm512_store_ps(ah + 48, r3);
            }
        }
    }
    finish_heads(j->out + row * j->out_stride + (int64_t)kh0 * g * d, gh, d, acc, l);
}
#endif

/* Returns 0, or -1 when a size is past the fixed per-item buffers (the caller says which flag avoids it). */
int pdr_paged_decode_f32(const float *q, int64_t q_stride, const float *k, const float *v, int64_t page_stride,
                         const int64_t *page_table, int64_t pt_stride, const int64_t *seq_lens, const int64_t *rows,
                         float *out, int64_t out_stride, int n, int heads, int kv_heads, int dim, int page_size,
                         float scale, int nthreads) {
    if (kv_heads <= 0 || heads % kv_heads || heads / kv_heads > MAX_GROUP || dim > MAX_DIM || page_size > MAX_PAGE)
        return -1;
    const job_t j = {q, q_stride, k, v, page_stride, page_table, pt_stride, seq_lens, rows, out, out_stride,
                     n, heads, kv_heads, dim, page_size, scale};
    const int items = n * kv_heads;
    if (nthreads < 1) nthreads = 1;
    /* AVX-512, head_dim a multiple of 64: with enough sequences to go round, an item is a whole sequence, every kv
     * head page by page (a page's heads share its cache lines: 418 -> 343 us a layer over 30 layers at 16 sequences
     * of 160 tokens, against one head per item), else one kv head (every thread busy with few sequences). */
#if defined(__AVX512F__)
    if (dim % 64 == 0) {
        if (n >= 2 * nthreads && heads <= MAX_HEADS) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
            for (int i = 0; i < n; i++) attend_avx512(&j, i, 0, kv_heads);
        } else {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
            for (int it = 0; it < items; it++) attend_avx512(&j, it / kv_heads, it % kv_heads, it % kv_heads + 1);
        }
        return 0;
    }
#endif
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int it = 0; it < items; it++) attend(&j, it / kv_heads, it % kv_heads);
    return 0;
}
