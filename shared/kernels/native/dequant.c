// Quantized projection weights widened to fp32 (kernels/fp8_weight.py, int4_weight.py), one pass per weight.
//
// torch widens float8_e4m3fn one element at a time (~10 ns each on the dev box): 17 ms for a 3072 x 576 weight,
// 20x the GEMM it feeds. Here a 256-entry table gives each byte's exact fp32 value and one product by its block's
// scale follows: the same two roundings-free steps and one rounded product as the torch reference, so the result
// is bit-identical. int4 nibbles are read in place from the checkpoint's packing, (q - zero) x scale per group.
#include <math.h>
#include <stdint.h>

#include "pdr_kernels.h"

// Each e4m3fn byte's value: sign, 4 exponent bits (bias 7, subnormal at 0), 3 mantissa bits; 0x7f / 0xff are NaN.
static void fp8_table(float *t) {
    for (int b = 0; b < 256; b++) {
        int e = (b >> 3) & 15, m = b & 7;
        float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
        if (e == 15 && m == 7) v = __builtin_nanf("");
        t[b] = (b & 128) ? -v : v;
    }
}

// w [rows, cols] e4m3fn bytes, scale [rows, nb] (one per bk columns) -> out [rows, cols] = value x scale.
void pdr_dequant_fp8_f32(const uint8_t *w, const float *scale, int64_t rows, int64_t cols, int64_t nb, int64_t bk,
                         float *out, int threads) {
    float table[256];
    fp8_table(table);
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * cols >= 262144)
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *wr = w + r * cols;
        float *o = out + r * cols;
        for (int64_t b = 0; b < nb; b++) {
            float s = scale[r * nb + b];
            int64_t end = (b + 1) * bk < cols ? (b + 1) * bk : cols;
            for (int64_t c = b * bk; c < end; c++) o[c] = table[wr[c]] * s;
        }
    }
}

// AWQ's nibble order within an int32 of 8 output rows: row 8i + m sits in nibble awq_nibble[m]
static const int awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// int4 held output-rows first (int4_weight.Int4Weight): packing 0 (awq): qweight [rows / 8, cols], 8 rows per
// int32 interleaved; packing 1 (gptq): qweight [rows, cols / 8], 8 columns per int32 in order. qzeros
// [rows / 8, cols / group] (awq interleaved, gptq in order, plus zero_offset); scales [rows, cols / group] fp32.
void pdr_dequant_int4_f32(const int32_t *qweight, const int32_t *qzeros, const float *scales, int64_t rows,
                          int64_t cols, int64_t group, int packing, int zero_offset, float *out, int threads) {
    int64_t groups = cols / group;
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * cols >= 262144)
    for (int64_t r = 0; r < rows; r++) {
        int shift = 4 * (packing == 0 ? awq_nibble[r & 7] : (int)(r & 7));
        float *o = out + r * cols;
        for (int64_t g = 0; g < groups; g++) {
            int z = (int)(((uint32_t)qzeros[(r >> 3) * groups + g] >> shift) & 15u) + (packing == 0 ? 0 : zero_offset);
            float s = scales[r * groups + g];
            for (int64_t c = g * group; c < (g + 1) * group; c++) {
                uint32_t word = packing == 0 ? (uint32_t)qweight[(r >> 3) * cols + c]
                                             : (uint32_t)qweight[r * (cols >> 3) + (c >> 3)];
                int q = (int)((word >> (packing == 0 ? shift : 4 * (int)(c & 7))) & 15u);
                o[c] = (float)(q - z) * s;
            }
        }
    }
}
