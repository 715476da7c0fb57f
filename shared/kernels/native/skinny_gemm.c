/* fp32 GEMM for few rows (decode batches): out[M, N] = x[M, K] @ w[N, K]^T (+ bias), with w packed once.
 *
 * Why: at M = 1-64 rows a projection is bound by streaming its weight from DRAM (16 rows of SmolLM2's down
 * projection: 28 MFLOP over 3.5 MB). MKL's sgemm streams it at ~7.6 GB/s here and oneDNN's prepacked inner
 * product at ~12.5 GB/s, of the box's ~26 GB/s read rate; this kernel reads each weight byte from DRAM once per call
 * and keeps the FMA units busy while it does.
 *
 * Packed layout: panels of 16 output columns, [ceil(N / 16)][K][16] (the last panel zero-padded), so a panel is one
 * sequential stream, one 64-byte line per k. Each thread takes whole panels. Within a panel the K range is cut into
 * blocks of KC: a block of the panel (16 x KC floats = 12 KiB) stays in L1 while every register tile of rows runs
 * over it, one broadcast of x per row and k. AVX-512: a thread takes two panels at a time, 8 rows x 32 columns in 16
 * zmm accumulators (an odd last panel: 16 rows x 16 columns); AVX2: one panel, 6 rows in 12 ymm. The panels are
 * prefetched into L1 PF k ahead by the tile that first meets a block (AVX2: by tiles of 4 rows or more; Zen 3, 2
 * threads, the bundled model's projections + LM head from DRAM: 8-24 rows 6-13% faster; at 1 row it cost 11-17%),
 * and the later tiles over a block stream the thread's next block (AVX-512: into L2, the lookahead below; AVX2: into
 * L1, one_panel), so the weight stream never waits for the tiles that re-read a block from L1.
 *
 * Accuracy: each output sums KC products in a register, then adds the block sums in order, so the rounding error
 * grows with KC + K / KC rather than K (a plain running sum over K = 1536 measured ~4x MKL's error against a
 * float64 reference; blocked, it is on par).
 *
 * Built by build.py with -march=native; without AVX2 + FMA the same loops run in plain C (the compiler vectorises
 * what it can).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "pdr_kernels.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define PDR_AVX512 1
#define MR 16 /* rows per register tile: 16 zmm accumulators of the 32 registers */
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PDR_AVX2 1
#define MR 6 /* rows per register tile: 12 ymm accumulators of the 16 registers */
#else
#define MR 6
#endif

#define NR 16  /* output columns per panel */
#ifndef KC
/* k per L1 block. A pair's block at 256 was 32 KiB, all of Zen 4's L1D, so the second row tile re-read it partly from
 * L2, and K = 576 split as 256 + 256 + 64 left the short last block too few k steps to stream the next pair's first
 * block (the lookahead, below). At 192 (24 KiB a pair; 576 = 3 x 192, 1536 = 8 x 192), Zen 4, 2 threads, the
 * bundled model's 30 layers' projections + LM head from DRAM, medians of 15 alternating rounds: 8 rows 18.0 ->
 * 16.5 ms, 15-16 rows 24.1-27.1 -> 22.0-24.2 ms (gate_up -10-15%, LM head -15%), 24 rows -3%, 1 row and a 417-row
 * down projection unchanged. */
#define KC 192
#endif
#ifndef PF
/* Rows of 16 floats ahead: 4 KiB. Far enough to cover DRAM latency on the faster cores: on Zen 5 (two 512-bit FMA
 * pipes) 64 measured 15-20% faster than 32 at 16 rows (208 -> 240-250 GFLOPS over the bundled model's projections),
 * 96-128 no better, and at one row 64 was best too; on Zen 4 32 and 64 were within noise at 16 rows. */
#define PF 64
#endif

/* w [N, K] row-major -> out [ceil(N / 16) * K * 16] panels (zero-padded columns past N). */
void pdr_gemm_pack_f32(const float *w, int64_t n, int64_t k, float *out) {
    const int64_t panels = (n + NR - 1) / NR;
    for (int64_t p = 0; p < panels; p++) {
        float *dst = out + p * k * NR;
        for (int64_t kk = 0; kk < k; kk++)
            for (int j = 0; j < NR; j++) {
                const int64_t col = p * NR + j;
                dst[kk * NR + j] = col < n ? w[col * k + kk] : 0.0f;
            }
    }
}

/* acc (rows x 16) over k in [k0, k0 + kc) of one panel; first block: out = acc (+ bias), later: out += acc. */
#if defined(PDR_AVX512)
#define TILE(R)                                                                                                  \
    static inline void tile_##R(const float *x, int64_t ldx, const float *wp, int64_t kc, float *o, int64_t ldo, \
                                int first, const float *bias, int cols, const float *pf) {                       \
        (void)pf; /* AVX-512 runs this tile only on an odd last panel, which prefetches PF k ahead itself */     \
        __m512 a[R];                                                                                             \
        for (int i = 0; i < R; i++) a[i] = _mm512_setzero_ps();                                                  \
        for (int64_t kk = 0; kk < kc; kk++) {                                                                    \
            _mm_prefetch((const char *)(wp + (kk + PF) * NR), _MM_HINT_T0);                                      \
            const __m512 w = _mm512_loadu_ps(wp + kk * NR);                                                      \
            for (int i = 0; i < R; i++) a[i] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * ldx + kk]), w, a[i]);        \
        }                                                                                                        \
        const __mmask16 m = (__mmask16)((1u << cols) - 1u);                                                      \
        const __m512 b = bias && first ? _mm512_maskz_loadu_ps(m, bias) : _mm512_setzero_ps();                   \
        for (int i = 0; i < R; i++) {                                                                            \
            float *row = o + i * ldo;                                                                            \
            const __m512 p = first ? b : _mm512_maskz_loadu_ps(m, row);                                          \
            _mm512_mask_storeu_ps(row, m, _mm512_add_ps(p, a[i]));                                               \
        }                                                                                                        \
    }
#elif defined(PDR_AVX2)
/* lanes [0, cols) of 8 set (cols may be <= 0 or >= 8) */
static inline __m256i cols_mask(int cols) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(cols), lane);
}
#define TILE(R)                                                                                                    \
    static inline void tile_##R(const float *x, int64_t ldx, const float *wp, int64_t kc, float *o, int64_t ldo,   \
                                int first, const float *bias, int cols, const float *pf) {                         \
        __m256 a0[R], a1[R];                                                                                       \
        for (int i = 0; i < R; i++) {                                                                              \
            a0[i] = _mm256_setzero_ps();                                                                           \
            a1[i] = _mm256_setzero_ps();                                                                           \
        }                                                                                                          \
        for (int64_t kk = 0; kk < kc; kk++) {                                                                      \
            _mm_prefetch((const char *)(pf + kk * NR), _MM_HINT_T0);                                               \
            __m256 w0 = _mm256_loadu_ps(wp + kk * NR), w1 = _mm256_loadu_ps(wp + kk * NR + 8);                     \
            /* Both loads stay in registers: GCC otherwise folds them into every FMA's memory operand, 2R + R    \
             * loads for 2R FMAs, and a tile of 3-4 rows became load-bound (hot in L1, one core: 4 rows 60 -> 87 \
             * GFLOPS, 3 rows 59 -> 68; 5-6 rows, where it kept them, 86-89). */ \
            __asm__("" : "+x"(w0), "+x"(w1));                                                                      \
            for (int i = 0; i < R; i++) {                                                                          \
                const __m256 xb = _mm256_broadcast_ss(x + i * ldx + kk);                                           \
                a0[i] = _mm256_fmadd_ps(xb, w0, a0[i]);                                                            \
                a1[i] = _mm256_fmadd_ps(xb, w1, a1[i]);                                                            \
            }                                                                                                      \
        }                                                                                                          \
        const __m256i m0 = cols_mask(cols), m1 = cols_mask(cols - 8);                                              \
        const __m256 b0 = bias && first ? _mm256_maskload_ps(bias, m0) : _mm256_setzero_ps();                      \
        const __m256 b1 = bias && first ? _mm256_maskload_ps(bias + 8, m1) : _mm256_setzero_ps();                  \
        for (int i = 0; i < R; i++) {                                                                              \
            float *row = o + i * ldo;                                                                              \
            const __m256 p0 = first ? b0 : _mm256_maskload_ps(row, m0);                                            \
            const __m256 p1 = first ? b1 : _mm256_maskload_ps(row + 8, m1);                                        \
            _mm256_maskstore_ps(row, m0, _mm256_add_ps(p0, a0[i]));                                                \
            _mm256_maskstore_ps(row + 8, m1, _mm256_add_ps(p1, a1[i]));                                            \
        }                                                                                                          \
    }
#else
#define TILE(R)                                                                                                  \
    static inline void tile_##R(const float *x, int64_t ldx, const float *wp, int64_t kc, float *o, int64_t ldo, \
                                int first, const float *bias, int cols, const float *pf) {                       \
        (void)pf;                                                                                                \
        float acc[R][NR];                                                                                        \
        memset(acc, 0, sizeof(acc));                                                                             \
        for (int64_t kk = 0; kk < kc; kk++)                                                                      \
            for (int i = 0; i < R; i++) {                                                                        \
                const float xv = x[i * ldx + kk];                                                                \
                for (int j = 0; j < NR; j++) acc[i][j] += xv * wp[kk * NR + j];                                  \
            }                                                                                                    \
        for (int i = 0; i < R; i++) {                                                                            \
            float *row = o + i * ldo;                                                                            \
            if (first)                                                                                           \
                for (int j = 0; j < cols; j++) row[j] = acc[i][j] + (bias ? bias[j] : 0.0f);                     \
            else                                                                                                 \
                for (int j = 0; j < cols; j++) row[j] += acc[i][j];                                              \
        }                                                                                                        \
    }
#endif
TILE(1)
TILE(2)
TILE(3)
TILE(4)
TILE(5)
TILE(6)
#if MR > 6
TILE(7)
TILE(8)
TILE(9)
TILE(10)
TILE(11)
TILE(12)
TILE(13)
TILE(14)
TILE(15)
TILE(16)
#endif

#define CASE(R) \
    case R: tile_##R(x, ldx, wp, kc, o, ldo, first, bias, cols, pf); break;
static void tile(int r, const float *x, int64_t ldx, const float *wp, int64_t kc, float *o, int64_t ldo, int first,
                 const float *bias, int cols, const float *pf) {
    switch (r) {
        CASE(1)
        CASE(2)
        CASE(3)
        CASE(4)
        CASE(5)
#if MR > 6
        CASE(6)
        CASE(7)
        CASE(8)
        CASE(9)
        CASE(10)
        CASE(11)
        CASE(12)
        CASE(13)
        CASE(14)
        CASE(15)
        default: tile_16(x, ldx, wp, kc, o, ldo, first, bias, cols, pf); break;
#else
        default: tile_6(x, ldx, wp, kc, o, ldo, first, bias, cols, pf); break;
#endif
    }
}

#if defined(PDR_AVX512)
/* The AVX-512 main tile: R <= 8 rows x 32 columns (two panels) in 2R zmm accumulators. Per k it loads two weight
 * vectors and R broadcasts for 2R FMAs, 0.6 loads an FMA where the one-panel tile needs 1.06. Zen 5, 2 threads: with
 * a [3072, 576] weight in cache the one-panel tile stopped at ~263 GFLOPS at 16-128 rows (oneDNN 330-408), this one
 * runs at 346-384; over the bundled model's projections from DRAM, 48 rows: 253-268 -> 333-336 GFLOPS, 16 rows on
 * par (the weight stream is the limit there). cols: of the 32. */
#define TILE2(R)                                                                                                      \
    static inline void tile2_##R(const float *x, int64_t ldx, const float *w0, const float *w1, int64_t kc, float *o, \
                                 int64_t ldo, int first, const float *bias, int cols, const float *q0,                \
                                 const float *q1, int64_t qn, int every) {                                            \
        __m512 a[R], b[R];                                                                                            \
        int cd = every;                                                                                               \
        for (int i = 0; i < R; i++) a[i] = b[i] = _mm512_setzero_ps();                                                \
        for (int64_t kk = 0; kk < kc; kk++) {                                                                         \
            _mm_prefetch((const char *)(w0 + (kk + PF) * NR), _MM_HINT_T0);                                           \
            _mm_prefetch((const char *)(w1 + (kk + PF) * NR), _MM_HINT_T0);                                           \
            if (qn > 0 && --cd == 0) { /* the lookahead stream: one line of each panel every `every` k */             \
                cd = every;                                                                                           \
                _mm_prefetch((const char *)q0, _MM_HINT_T1);                                                          \
                _mm_prefetch((const char *)q1, _MM_HINT_T1);                                                          \
                q0 += NR;                                                                                             \
                q1 += NR;                                                                                             \
                qn--;                                                                                                 \
            }                                                                                                         \
            const __m512 v0 = _mm512_loadu_ps(w0 + kk * NR), v1 = _mm512_loadu_ps(w1 + kk * NR);                      \
            for (int i = 0; i < R; i++) {                                                                             \
                const __m512 xb = _mm512_set1_ps(x[i * ldx + kk]);                                                    \
                a[i] = _mm512_fmadd_ps(xb, v0, a[i]);                                                                 \
                b[i] = _mm512_fmadd_ps(xb, v1, b[i]);                                                                 \
            }                                                                                                         \
        }                                                                                                             \
        const __mmask16 m0 = (__mmask16)(cols >= 16 ? 0xFFFFu : (1u << cols) - 1u);                                   \
        const __mmask16 m1 = (__mmask16)(cols >= 32 ? 0xFFFFu : cols <= 16 ? 0u : (1u << (cols - 16)) - 1u);          \
        const __m512 b0 = bias && first ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();                      \
        const __m512 b1 = bias && first ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();                 \
        for (int i = 0; i < R; i++) {                                                                                 \
            float *row = o + i * ldo;                                                                                 \
            const __m512 p0 = first ? b0 : _mm512_maskz_loadu_ps(m0, row);                                            \
            const __m512 p1 = first ? b1 : _mm512_maskz_loadu_ps(m1, row + 16);                                       \
            _mm512_mask_storeu_ps(row, m0, _mm512_add_ps(p0, a[i]));                                                  \
            _mm512_mask_storeu_ps(row + 16, m1, _mm512_add_ps(p1, b[i]));                                             \
        }                                                                                                             \
    }
TILE2(1)
TILE2(2)
TILE2(3)
TILE2(4)
TILE2(5)
TILE2(6)
TILE2(7)
TILE2(8)
#define MR2 8
#define CASE2(R) \
    case R: tile2_##R(x, ldx, w0, w1, kc, o, ldo, first, bias, cols, q0, q1, qn, every); break;
static void tile2(int r, const float *x, int64_t ldx, const float *w0, const float *w1, int64_t kc, float *o,
                  int64_t ldo, int first, const float *bias, int cols, const float *q0, const float *q1, int64_t qn,
                  int every) {
    switch (r) {
        CASE2(1)
        CASE2(2)
        CASE2(3)
        CASE2(4)
        CASE2(5)
        CASE2(6)
        CASE2(7)
        default: tile2_8(x, ldx, w0, w1, kc, o, ldo, first, bias, cols, q0, q1, qn, every); break;
    }
}
#endif

/* The dynamic schedule's chunk: an eighth of a thread's share of `units`, at least 1 (see gemm). */
static inline int64_t chunk_of(int64_t units, int nthreads) {
    const int64_t c = units / (8 * (int64_t)nthreads);
    return c > 1 ? c : 1;
}

/* Panel p alone: rows in tiles of MR, k in blocks of KC.
 *
 * What each AVX2 tile prefetches, one line a k (pf): the first tile of a block, the one that meets it from DRAM,
 * PF k ahead when it has 4 rows or more (with fewer it streams at DRAM speed anyway and measured slower with it), else
 * its own lines (free: the loads want them); every later tile the next block of the panels, this panel's or the next
 * one's first, so that block streams in while they compute from L1 and the next first tile finds it there. Zen 3, 2
 * threads, the bundled model's projections + LM head from DRAM, both builds in one process: 8-24 rows 4-7% faster, 1
 * row on par. The next panel may be another thread's: one wasted block at the end of a chunk. */
static void one_panel(const float *x, int64_t ldx, int64_t m, int64_t k, const float *wp, int64_t n, const float *bias,
                      float *out, int64_t ldo, int64_t p) {
    const float *panel = wp + p * k * NR;
    const int cols = (int)(n - p * NR < NR ? n - p * NR : NR);
    const float *b = bias ? bias + p * NR : 0;
    for (int64_t k0 = 0; k0 < k; k0 += KC) {
        const int64_t kc = k - k0 < KC ? k - k0 : KC;
        const float *block = panel + k0 * NR, *next = block + kc * NR; /* panels lie back to back */
        for (int64_t m0 = 0; m0 < m; m0 += MR) {
            const int r = (int)(m - m0 < MR ? m - m0 : MR);
            const float *pf = m0 > 0 ? next : r >= 4 ? block + PF * NR : block;
            tile(r, x + m0 * ldx + k0, ldx, block, kc, out + m0 * ldo + p * NR, ldo, k0 == 0, b, cols, pf);
        }
    }
}

/* One gate/up panel pair's epilogue: g [m, 32] rows (stride lds) hold 16 gate | 16 up columns; out's 16 columns (the
 * first `cols`) = silu(gate) * up, the formula and order of pdr_silu_mul_f32 (elementwise.c). */
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

/* The GEMM; with gated != NULL the weight's panels alternate gate and up (pdr_gemm_pack_gated_f32), `out` is the
 * scratch their sums land in, and each pair's thread writes silu(gate) * up for its 16 columns into gated (row
 * stride ldg, `inter` columns in all) as soon as the pair's last K block is summed, while those sums are still in
 * its own L1. */
static void gemm(const float *x, int64_t ldx, int64_t m, int64_t k, const float *wp, int64_t n, const float *bias,
                 float *out, int64_t ldo, int nthreads, float *gated, int64_t ldg, int64_t inter) {
    const int64_t panels = (n + NR - 1) / NR;
    if (nthreads < 1) nthreads = 1;
    if (panels < 2 * nthreads) nthreads = 1; /* a tiny projection: waking the team costs more than it saves */
#if defined(PDR_AVX512)
    /* A unit is two panels (the 32-column tile), the last one alone when the count is odd. */
    const int64_t units = (panels + 1) / 2;
    /* Handed out in chunks, an eighth of a thread's share each, not one static share per thread: on a box the
     * engine shares with its server's other threads (event loop, gateway, kvstore), a thread preempted mid-call
     * left the other waiting at the loop's end for its whole share; now the other takes the chunks it did not
     * start. A chunk's last pair prefetches the next pair's first block, perhaps another thread's (one block).
     * Engine at 16 x 128/64 on 2 threads beside a process busy 2 of every 10 ms: 167-168 -> 170-176 tok/s; alone,
     * no change. */
    const int64_t chunk = chunk_of(units, nthreads);
#pragma omp parallel for schedule(dynamic, chunk) num_threads(nthreads)
    for (int64_t u = 0; u < units; u++) {
        const int64_t p = 2 * u;
        if (p + 1 == panels) {
            one_panel(x, ldx, m, k, wp, n, bias, out, ldo, p);
            continue;
        }
        const float *panel = wp + p * k * NR;
        const int64_t left = n - p * NR;
        const int cols = (int)(left < 2 * NR ? left : 2 * NR);
        const float *b = bias ? bias + p * NR : 0;
        const int tiles = (int)((m + MR2 - 1) / MR2);
        for (int64_t k0 = 0; k0 < k; k0 += KC) {
            const int64_t kc = k - k0 < KC ? k - k0 : KC;
            /* Lookahead: the tiles over this block stream the next one (this pair's, else the next pair's first)
             * into L2, each its share of the lines, so the weight stream runs while every tile computes. Without
             * it DRAM idled through all but the first tile of a block (only that one missed, PF lines ahead).
             * Zen 4, 2 threads, the bundled model's projections from DRAM, 16 rows: 15.5 -> 17.5-20 GB/s (qkv
             * 143 -> 112 us, gate_up 465 -> 404, lm_head 6.4 -> 5.5 ms); 1-8 rows 25-30 GB/s; 32-144 rows now
             * ahead of oneDNN on every layer shape. The next pair may be another thread's: one wasted block. */
            const float *q0 = 0;
            int64_t qk = 0;
            if (k0 + kc < k) {
                q0 = panel + (k0 + kc) * NR;
                qk = k - k0 - kc;
            } else if (p + 2 < panels) {
                q0 = wp + (p + 2) * k * NR;
                qk = k;
            }
            const float *q1 = q0 && (k0 + kc < k || p + 3 < panels) ? q0 + k * NR : q0;
            qk = qk < KC ? qk : KC;
            const int64_t share = (qk + tiles - 1) / tiles;
            int t = 0;
            for (int64_t m0 = 0; m0 < m; m0 += MR2, t++) {
                const int r = (int)(m - m0 < MR2 ? m - m0 : MR2);
                const int64_t lo = t * share, hi = lo + share < qk ? lo + share : qk;
                tile2(r, x + m0 * ldx + k0, ldx, panel + k0 * NR, panel + k * NR + k0 * NR, kc, out + m0 * ldo + p * NR,
                      ldo, k0 == 0, b, cols, q0 ? q0 + lo * NR : 0, q0 ? q1 + lo * NR : 0, hi > lo ? hi - lo : 0,
                      tiles);
            }
        }
        if (gated) {
            const int64_t left_g = inter - u * NR;
            silu_mul_pair(out + p * NR, ldo, m, gated + u * NR, ldg, (int)(left_g < NR ? left_g : NR));
        }
    }
#else
    /* Chunks of panels, as above: a thread preempted by the server's other threads no longer holds the other one
     * at the loop's end for its whole static share. */
    if (gated) {
        /* A thread takes a gate/up panel pair at a time and writes the pair's 16 outputs while its sums are in L1,
         * as the AVX-512 pair tile does; the epilogue used to run over the whole scratch after the loop, on one
         * thread. Zen 3, 2 threads, 30 gate_up projections from DRAM, alternating: 16 rows 2.4-2.8% faster, 24
         * rows 7-9%, 1-8 rows on par. */
        const int64_t pairs = panels / 2, chunk = chunk_of(pairs, nthreads);
#pragma omp parallel for schedule(dynamic, chunk) num_threads(nthreads)
        for (int64_t u = 0; u < pairs; u++) {
            one_panel(x, ldx, m, k, wp, n, bias, out, ldo, 2 * u);
            one_panel(x, ldx, m, k, wp, n, bias, out, ldo, 2 * u + 1);
            const int64_t left_g = inter - u * NR;
            silu_mul_pair(out + 2 * u * NR, ldo, m, gated + u * NR, ldg, (int)(left_g < NR ? left_g : NR));
        }
        return;
    }
    const int64_t chunk = chunk_of(panels, nthreads);
#pragma omp parallel for schedule(dynamic, chunk) num_threads(nthreads)
    for (int64_t p = 0; p < panels; p++) one_panel(x, ldx, m, k, wp, n, bias, out, ldo, p);
#endif
}

/* The vector width this build's tiles run at, in bits: 512 (AVX-512), 256 (AVX2 + FMA) or 0 (plain C). */
int pdr_gemm_vector_bits(void) {
#if defined(PDR_AVX512)
    return 512;
#elif defined(PDR_AVX2)
    return 256;
#else
    return 0;
#endif
}

/* out [m, n] (row stride ldo) = x [m, k] (row stride ldx) @ w^T (+ bias [n] or NULL), w packed by pdr_gemm_pack_f32. */
void pdr_gemm_f32(const float *x, int64_t ldx, int64_t m, int64_t k, const float *wp, int64_t n, const float *bias,
                  float *out, int64_t ldo, int nthreads) {
    gemm(x, ldx, m, k, wp, n, bias, out, ldo, nthreads, 0, 0, 0);
}

/* w [2 inter, K] holding gate | up rows -> 2 ceil(inter / 16) panels, gate panel p then up panel p (zero-padded
 * columns past inter): the pair one AVX-512 tile covers, so one thread sums both halves of its 16 outputs. */
void pdr_gemm_pack_gated_f32(const float *w, int64_t inter, int64_t k, float *out) {
    const int64_t panels = (inter + NR - 1) / NR;
    for (int64_t p = 0; p < panels; p++) {
        const int64_t cols = inter - p * NR < NR ? inter - p * NR : NR;
        pdr_gemm_pack_f32(w + p * NR * k, cols, k, out + 2 * p * k * NR);
        pdr_gemm_pack_f32(w + (inter + p * NR) * k, cols, k, out + (2 * p + 1) * k * NR);
    }
}

/* out [m, inter] (row stride ldo) = silu(x @ gate^T) * (x @ up^T), w packed by pdr_gemm_pack_gated_f32; scratch
 * [m, 2 ceil(inter / 16) * 16] holds the projection's sums (the same sums pdr_gemm_f32 makes, so the result equals
 * pdr_gemm_f32 followed by pdr_silu_mul_f32). Saves the activation's separate pass: at 16 rows it read the 196 KB
 * projection back, half of it from the other core's cache. Zen 4, 2 threads, the bundled model's 30 MLPs (gate_up,
 * activation, down; weights from DRAM), medians of 30 alternating rounds: 15 rows 15.2 -> 14.8 ms, 16 rows
 * 17.6 -> 16.9 ms. */
void pdr_gemm_silu_mul_f32(const float *x, int64_t ldx, int64_t m, int64_t k, const float *wp, int64_t inter,
                           float *scratch, float *out, int64_t ldo, int nthreads) {
    const int64_t n = 2 * ((inter + NR - 1) / NR) * NR;
    gemm(x, ldx, m, k, wp, n, 0, scratch, n, nthreads, out, ldo, inter);
}
