/*
 * sh_avx2.h - what the AVX2 kernels share (simd.c's and the policy files' twins in
 * csrc/policies/): the target attribute, the per-lane search for the least key, the
 * 8-lane uint32 loads and stores, 4 float32 weights widened to double. Not part of
 * the cdef; every function here is static inline.
 *
 * Each function carries __attribute__((target("avx2"))) and runs only after
 * sh_simd_active() has seen the CPU report AVX2 (simd.c states why the results equal
 * the scalar forms' bit for bit).
 */
#ifndef SH_AVX2_H
#define SH_AVX2_H

#include "sh_internal.h"

#if SH_HAVE_AVX2
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2")))

/* ---------------------------------------------------------------- least key, by lane */

/* The least of 8 uint32 lanes seen so far and, per lane, the first slot holding it. */
typedef struct least_u32x8 {
    __m256i least, where, slot;
} least_u32x8;

AVX2 static inline void least_u32x8_start(least_u32x8 *m, __m256i v, size_t at)
{
    m->least = v;
    m->slot = _mm256_add_epi32(_mm256_set1_epi32((int32_t)(uint32_t)at),
                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    m->where = m->slot;
}

/* The next 8 slots (after the last ones seen). */
AVX2 static inline void least_u32x8_add(least_u32x8 *m, __m256i v)
{
    const __m256i bias = _mm256_set1_epi32(INT32_MIN);
    m->slot = _mm256_add_epi32(m->slot, _mm256_set1_epi32(8));
    __m256i less = _mm256_cmpgt_epi32(_mm256_xor_si256(m->least, bias), _mm256_xor_si256(v, bias));
    m->least = _mm256_min_epu32(m->least, v);
    m->where = _mm256_blendv_epi8(m->where, m->slot, less);
}

/* The first slot holding the least of all lanes, and that least. */
AVX2 static inline size_t least_u32x8_end(const least_u32x8 *m, uint32_t *least)
{
    uint32_t l[8], w[8];
    _mm256_storeu_si256((__m256i *)l, m->least);
    _mm256_storeu_si256((__m256i *)w, m->where);
    uint32_t best = l[0], at = w[0];
    for (int j = 1; j < 8; j++) {
        if (l[j] < best || (l[j] == best && w[j] < at)) {
            best = l[j];
            at = w[j];
        }
    }
    *least = best;
    return at;
}

/* The same for 4 double lanes (slots as 64-bit lanes). */
typedef struct least_f64x4 {
    __m256d least;
    __m256i where, slot;
} least_f64x4;

AVX2 static inline void least_f64x4_start(least_f64x4 *m, __m256d x, size_t at)
{
    m->least = x;
    m->slot = _mm256_add_epi64(_mm256_set1_epi64x((long long)at), _mm256_setr_epi64x(0, 1, 2, 3));
    m->where = m->slot;
}

AVX2 static inline void least_f64x4_add(least_f64x4 *m, __m256d x)
{
    m->slot = _mm256_add_epi64(m->slot, _mm256_set1_epi64x(4));
    __m256d less = _mm256_cmp_pd(x, m->least, _CMP_LT_OQ);
    m->least = _mm256_blendv_pd(m->least, x, less);
    m->where = _mm256_castpd_si256(
        _mm256_blendv_pd(_mm256_castsi256_pd(m->where), _mm256_castsi256_pd(m->slot), less));
}

AVX2 static inline size_t least_f64x4_end(const least_f64x4 *m, double *least)
{
    double l[4];
    int64_t w[4];
    _mm256_storeu_pd(l, m->least);
    _mm256_storeu_si256((__m256i *)w, m->where);
    double best = l[0];
    int64_t at = w[0];
    for (int j = 1; j < 4; j++) {
        if (l[j] < best || (l[j] == best && w[j] < at)) {
            best = l[j];
            at = w[j];
        }
    }
    *least = best;
    return (size_t)at;
}

/* ---------------------------------------------------------------- uint32 and float32 lanes */

AVX2 static inline __m256i load8(const uint32_t *v)
{
    return _mm256_loadu_si256((const __m256i *)v);
}

AVX2 static inline void store8(uint32_t *v, __m256i x)
{
    _mm256_storeu_si256((__m256i *)v, x);
}

/* The largest of x's 8 lanes and `best`. */
AVX2 static inline uint32_t max_lane(__m256i x, uint32_t best)
{
    uint32_t l[8];
    store8(l, x);
    for (int j = 0; j < 8; j++)
        best = l[j] > best ? l[j] : best;
    return best;
}

/* 4 float32 weights, widened exactly to double. */
AVX2 static inline __m256d widen4(const float *a)
{
    return _mm256_cvtps_pd(_mm_loadu_ps(a));
}

#endif /* SH_HAVE_AVX2 */

#endif /* SH_AVX2_H */
