// The decoder layer's elementwise work in fp32 on CPU, one call where torch runs several ops.
//
// At decode batch sizes (16 rows of 576) each torch op costs its dispatch and a fresh output more than its
// arithmetic: residual add + RMSNorm is 2 ops, RoPE + the K/V write + a contiguous q is ~12, SiLU-and-mul 3.
// These loops touch each element once. Rows are split over threads only when a step has enough of them (a
// prefill chunk): forking the team costs more than 16 rows of work.
#include <math.h>
#include <stdint.h>

#include "bf16.h"
#include "pdr_kernels.h"

#define PAR_MIN_ELEMS 65536  // rows x columns below which one thread does the whole call

// res_out = x + res; norm_out = res_out * rsqrt(mean(res_out^2) + eps) * w, per row of d.
// x, res: row strides xs, rs (elements); outputs contiguous [t, d].
void pdr_add_rms_norm_f32(const float *x, int64_t xs, const float *res, int64_t rs, const float *w, float *norm_out,
                          float *res_out, int64_t t, int64_t d, float eps, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (t * d >= PAR_MIN_ELEMS)
    for (int64_t i = 0; i < t; i++) {
        const float *xi = x + i * xs, *ri = res + i * rs;
        float *ro = res_out + i * d, *no = norm_out + i * d;
        float ss = 0.f;
        for (int64_t j = 0; j < d; j++) {
            float v = xi[j] + ri[j];
            ro[j] = v;
            ss += v * v;
        }
        float inv = 1.0f / sqrtf(ss / (float)d + eps);
        for (int64_t j = 0; j < d; j++) no[j] = (ro[j] * inv) * w[j];  // HF's order: normalise, then scale
    }
}

// One head of d: (x1, x2) = halves; out = (x1 cos - x2 sin, x2 cos + x1 sin) (NeoX "rotate half").
static inline void rotate(const float *x, const float *c, const float *s, float *out, int64_t half) {
    for (int64_t j = 0; j < half; j++) {
        float a = x[j], b = x[j + half];
        out[j] = a * c[j] - b * s[j];
        out[j + half] = b * c[j] + a * s[j];
    }
}

// qkv [t, (h + 2 kvh) d] (row stride qs) holds q | k | v per token. Writes the rotated q to q_out [t, h, d] and
// the rotated k to k_out [t, kvh, d] (both contiguous), and stores k and v into their cache slots: token i's go
// to page pages[i], slot offsets[i] of k_cache / v_cache ([pages, page_size, kvh, d], page stride ps elements;
// a page < 0 is padding and stored nowhere). cos, sin: [t, d / 2]. Returns -1, having written nothing, when a
// slot lies outside the caches' num_pages x page_size. bf16: the caches hold bf16 (K and V rounded to nearest even).
static int rope_store(const float *qkv, int64_t qs, int64_t t, int64_t h, int64_t kvh, int64_t d, const float *cos,
                      const float *sin, float *q_out, float *k_out, void *k_cache, void *v_cache, int64_t ps,
                      int64_t num_pages, int64_t page_size, const int64_t *pages, const int64_t *offsets, int threads,
                      int bf16) {
    const int64_t half = d / 2, kv = kvh * d;
    for (int64_t i = 0; i < t; i++)
        if (pages[i] >= num_pages || (pages[i] >= 0 && (offsets[i] < 0 || offsets[i] >= page_size))) return -1;
#pragma omp parallel for num_threads(threads) schedule(static) if (t * qs >= PAR_MIN_ELEMS)
    for (int64_t i = 0; i < t; i++) {
        const float *row = qkv + i * qs, *c = cos + i * half, *s = sin + i * half;
        for (int64_t hd = 0; hd < h; hd++) rotate(row + hd * d, c, s, q_out + (i * h + hd) * d, half);
        float *ko = k_out + i * kv;
        for (int64_t hd = 0; hd < kvh; hd++) rotate(row + (h + hd) * d, c, s, ko + hd * d, half);
        if (pages[i] < 0) continue;
        const int64_t slot = pages[i] * ps + offsets[i] * kv;
        const float *vi = row + (h + kvh) * d;
        if (bf16) {
            pdr_store_bf16((uint16_t *)k_cache + slot, ko, kv);
            pdr_store_bf16((uint16_t *)v_cache + slot, vi, kv);
            continue;
        }
        float *kc = (float *)k_cache + slot, *vc = (float *)v_cache + slot;
        for (int64_t j = 0; j < kv; j++) {
            kc[j] = ko[j];
            vc[j] = vi[j];
        }
    }
    return 0;
}

int pdr_rope_store_f32(const float *qkv, int64_t qs, int64_t t, int64_t h, int64_t kvh, int64_t d, const float *cos,
                       const float *sin, float *q_out, float *k_out, float *k_cache, float *v_cache, int64_t ps,
                       int64_t num_pages, int64_t page_size, const int64_t *pages, const int64_t *offsets,
                       int threads) {
    return rope_store(qkv, qs, t, h, kvh, d, cos, sin, q_out, k_out, k_cache, v_cache, ps, num_pages, page_size, pages,
                      offsets, threads, 0);
}

// pdr_rope_store_f32 into bf16 caches (q_out and k_out stay fp32: the step's attention reads q from them, and the
// cache's rounded K/V).
int pdr_rope_store_bf16(const float *qkv, int64_t qs, int64_t t, int64_t h, int64_t kvh, int64_t d, const float *cos,
                        const float *sin, float *q_out, float *k_out, uint16_t *k_cache, uint16_t *v_cache, int64_t ps,
                        int64_t num_pages, int64_t page_size, const int64_t *pages, const int64_t *offsets,
                        int threads) {
    return rope_store(qkv, qs, t, h, kvh, d, cos, sin, q_out, k_out, k_cache, v_cache, ps, num_pages, page_size, pages,
                      offsets, threads, 1);
}

// x [t, 2 inter] (row stride xs) holds gate | up; out [t, inter] = silu(gate) * up.
void pdr_silu_mul_f32(const float *x, int64_t xs, float *out, int64_t t, int64_t inter, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (t * inter >= PAR_MIN_ELEMS)
    for (int64_t i = 0; i < t; i++) {
        const float *g = x + i * xs, *u = g + inter;
        float *o = out + i * inter;
        for (int64_t j = 0; j < inter; j++) {
            // exp's argument capped: -ffast-math assumes finite values, and silu(x < -88) is -0 either way
            float e = expf(fminf(-g[j], 88.0f));
            o[j] = g[j] / (1.0f + e) * u[j];
        }
    }
}
