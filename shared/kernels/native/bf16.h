/* bf16 helpers the native kernels share (static inline: nothing here is exported).
 *
 * bf16 is the upper half of an fp32: widening is a 16-bit shift, and narrowing rounds to nearest even, as torch's
 * .to(torch.bfloat16) and the AVX512_BF16 conversions do (values stay finite: -ffast-math, see paged_decode.c).
 * PDR_BF16 is set where the compiler targets avx512_bf16 (vdpbf16ps, vcvtne2ps2bf16): the bf16 kernels run only
 * there; elsewhere their entry points return -1 and the caller keeps float32 (dispatch: shared/kernels/cpu.py).
 */
#ifndef PDR_BF16_H
#define PDR_BF16_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define PDR_BF16 1
#endif

static inline uint16_t pdr_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float pdr_from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* dst[0, n) = bf16(src[0, n)), rounded to nearest even. */
static inline void pdr_store_bf16(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
#if defined(PDR_BF16)
    for (; i + 32 <= n; i += 32) {
        const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512((void *)(dst + i), (__m512i)h);
    }
#endif
    for (; i < n; i++) dst[i] = pdr_to_bf16(src[i]);
}

#if defined(__AVX512F__)
#include <immintrin.h>
/* 16 bf16 at p, widened to fp32 (AVX512F alone: the widening needs no bf16 instruction). */
static inline __m512 pdr_load16_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#endif

/* dst[0, n) = src[0, n) widened to fp32. */
static inline void pdr_widen_bf16(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, pdr_load16_bf16(src + i));
#endif
    for (; i < n; i++) dst[i] = pdr_from_bf16(src[i]);
}

#endif /* PDR_BF16_H */
