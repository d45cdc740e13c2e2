/* Decoding byte codes through a table of fp32 values held in registers (approxdist.kernels):
 * 16 values, one AVX-512 permute per 16 codes (two AVX2 permutes per 8); 64 values, two
 * two-register permutes and a blend per 16 codes (AVX-512 only); a plain indexed load
 * elsewhere and for the rest. Header-only.
 */
#ifndef APPROXDIST_LOOKUP_H
#define APPROXDIST_LOOKUP_H

#include <stdint.h>

/* the register lookups this build has, for the callers to choose by: tables of 16 values
 * (lookup16's permutes), of 64 (lookup64_simd) */
#if defined(__AVX512F__)
#define HAVE_PERMUTE 1
#define HAVE_PERMUTE64 1
#elif defined(__AVX2__)
#define HAVE_PERMUTE 1
#define HAVE_PERMUTE64 0
#else
#define HAVE_PERMUTE 0
#define HAVE_PERMUTE64 0
#endif

#if HAVE_PERMUTE
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
/* y[0..16) = v, or y[0..16) += v with `add` */
static inline void put16(float *restrict y, __m512 v, int add) {
    _mm512_storeu_ps(y, add ? _mm512_add_ps(_mm512_loadu_ps(y), v) : v);
}
#endif

/* y[i] (+)= tab[c[i]] for i in [j, m), one at a time: what the permutes leave */
static void lookup_rest(const uint8_t *restrict c, int64_t j, int64_t m,
                        const float *restrict tab, float *restrict y, int add) {
    if (add)
        for (; j < m; j++) y[j] += tab[c[j]];
    else
        for (; j < m; j++) y[j] = tab[c[j]];
}

/* y[j] (+)= values[c[j]] for m byte codes, with at most 16 code values: one permute per 16 (or
 * 8) values where the CPU has one; returns how many it did (the rest go the scalar way). */
static int64_t lookup_simd(const uint8_t *restrict c, int64_t m, const float *restrict tab,
                           float *restrict y, int add) {
    int64_t j = 0;
#if defined(__AVX512F__)
    const __m512 t = _mm512_loadu_ps(tab);
    for (; j + 16 <= m; j += 16) {
        __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + j)));
        put16(y + j, _mm512_permutexvar_ps(idx, t), add);
    }
#elif defined(__AVX2__)
    const __m256 lo = _mm256_loadu_ps(tab), hi = _mm256_loadu_ps(tab + 8);
    for (; j + 8 <= m; j += 8) {
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + j)));
        __m256 high = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)); /* bit 3 -> sign */
        __m256 v = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx),
                                    _mm256_permutevar8x32_ps(hi, idx), high);
        if (add) v = _mm256_add_ps(_mm256_loadu_ps(y + j), v);
        _mm256_storeu_ps(y + j, v);
    }
#else
    (void)c, (void)m, (void)tab, (void)y, (void)add;
#endif
    return j;
}

/* y[j] (+)= tab[c[j]] for m byte codes < 16 (tab: 16 floats) */
static void lookup16(const uint8_t *restrict c, int64_t m, const float *restrict tab,
                     float *restrict y, int add) {
    lookup_rest(c, lookup_simd(c, m, tab, y, add), m, tab, y, add);
}

/* y[j] (+)= tab[c[j]] for m byte codes < 64 (tab: 64 floats), AVX-512 only: two two-register
 * permutes (code bits 0-4) and a blend on code bit 5 per 16 values; returns how many it did. */
static int64_t lookup64_simd(const uint8_t *restrict c, int64_t m, const float *restrict tab,
                             float *restrict y, int add) {
    int64_t j = 0;
#if HAVE_PERMUTE64
    const __m512 t0 = _mm512_loadu_ps(tab), t1 = _mm512_loadu_ps(tab + 16);
    const __m512 t2 = _mm512_loadu_ps(tab + 32), t3 = _mm512_loadu_ps(tab + 48);
    const __m512i bit5 = _mm512_set1_epi32(32);
    for (; j + 16 <= m; j += 16) {
        __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + j)));
        __m512 lo = _mm512_permutex2var_ps(t0, idx, t1), hi = _mm512_permutex2var_ps(t2, idx, t3);
        put16(y + j, _mm512_mask_blend_ps(_mm512_test_epi32_mask(idx, bit5), lo, hi), add);
    }
#else
    (void)c, (void)m, (void)tab, (void)y, (void)add;
#endif
    return j;
}

#endif
