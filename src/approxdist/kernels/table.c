/* Fused Table-N kernels for `table<N>` codecs (seed 004; approxdist.kernels).
 *
 * Table-N sends each fp32 value as its sign (the code's top bit) and the index of the
 * nearest of T = 2^(N-1) table magnitudes. The index of |v| is the number of decision
 * thresholds (midpoints between neighbouring magnitudes, T-1 of them) at or below it,
 * compared as int32 bit patterns: for non-negative fp32 values (and NaN patterns, which
 * sort above +inf) the pattern order is the value order. That is exactly the torch path's
 * `searchsorted(mids, v & 0x7FFFFFFF, right=True)`.
 *
 * - ad_table_sample: the strided sample of |x| the percentiles are taken from, finite
 *   values only, sorted (LSD radix sort on the bit patterns: same order as torch.sort);
 * - ad_table_encode: codes (counting compares for T <= 16, binary search above), packed
 *   by bitpack.h;
 * - ad_table_decode (decode-add with `add`): codes are unpacked and looked up in `values`
 *   (2T entries: +table then -table), with one AVX-512 / AVX2 permute per 16 / 8 values
 *   for N <= 4 where the CPU has it; without, widths dividing 8 copy one row of 8/N
 *   decoded values per packed byte (the `rows` table the torch path gathers from too).
 * No -ffast-math: decode-add is the same IEEE fp32 addition as torch's, bit for bit.
 */
#include <stdint.h>
#include <string.h>

#include "bitpack.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define ABS_BITS 0x7FFFFFFF
#define INF_BITS 0x7F800000u

/* code = sign << (bits-1) | count of mids <= |x|; NM constant: the compares unroll and the
 * loop over values vectorizes with the thresholds held in registers */
#define COUNT_LOOP(NM)                                                              \
    for (int64_t k = 0; k < n; k++) {                                               \
        const int32_t a = x[k] & ABS_BITS;                                          \
        uint32_t s = ((uint32_t)x[k] >> 31) << (bits - 1);                          \
        for (int j = 0; j < (NM); j++) s += (uint32_t)(a >= mids[j]);               \
        c[k] = s;                                                                   \
    }

static void table_codes(const int32_t *restrict x, uint32_t *restrict c, int64_t n,
                        const int32_t *restrict mids, int64_t nm, int bits) {
    switch (nm) { /* the thresholds of table1..table5 */
    case 0: COUNT_LOOP(0) return;
    case 1: COUNT_LOOP(1) return;
    case 3: COUNT_LOOP(3) return;
    case 7: COUNT_LOOP(7) return;
    case 15: COUNT_LOOP(15) return;
    default: break;
    }
    int64_t top = 1;
    while (top * 2 <= nm) top *= 2;
    if (top * 2 - 1 == nm) { /* T-1 thresholds (every codec): the probes never pass the end */
        for (int64_t k = 0; k < n; k++) c[k] = 0;
        for (int64_t step = top; step > 0; step >>= 1) /* one probe of every value per pass */
            for (int64_t k = 0; k < n; k++)
                c[k] += (mids[c[k] + step - 1] <= (x[k] & ABS_BITS)) ? (uint32_t)step : 0u;
        for (int64_t k = 0; k < n; k++) c[k] += ((uint32_t)x[k] >> 31) << (bits - 1);
        return;
    }
    for (int64_t k = 0; k < n; k++) {
        const int32_t a = x[k] & ABS_BITS;
        int64_t pos = 0; /* mids[0..pos) <= a */
        for (int64_t step = top; step > 0; step >>= 1)
            if (pos + step <= nm && mids[pos + step - 1] <= a) pos += step;
        c[k] = (((uint32_t)x[k] >> 31) << (bits - 1)) + (uint32_t)pos;
    }
}

void ad_table_encode(const int32_t *x, int64_t n, const int32_t *mids, int64_t nm, int bits,
                     uint8_t *out) {
    uint32_t c[BLOCK];
    for (int64_t k = 0; k < n; k += BLOCK) {
        int64_t m = block_len(n - k);
        table_codes(x + k, c, m, mids, nm, bits);
        out += pack(c, m, bits, out);
    }
}

/* y[k] (+)= rows[byte][j] for each packed byte; g = 8 / width decoded values per byte. */
#define ROWS_LOOP(G, OP)                                                            \
    for (int64_t b = 0; b < full; b++) {                                            \
        const float *r = rows + (int64_t)in[b] * (G);                               \
        float *o = y + b * (G);                                                     \
        for (int j = 0; j < (G); j++) o[j] OP r[j];                                 \
    }

static void rows_decode(const uint8_t *restrict in, int64_t n, const float *restrict rows,
                        int g, float *restrict y, int add) {
    const int64_t full = n / g;
    if (add) {
        switch (g) {
        case 1: ROWS_LOOP(1, +=) break;
        case 2: ROWS_LOOP(2, +=) break;
        case 4: ROWS_LOOP(4, +=) break;
        default: ROWS_LOOP(8, +=) break;
        }
    } else {
        switch (g) {
        case 1: ROWS_LOOP(1, =) break;
        case 2: ROWS_LOOP(2, =) break;
        case 4: ROWS_LOOP(4, =) break;
        default: ROWS_LOOP(8, =) break;
        }
    }
    const float *r = rows + (int64_t)(full < (n + g - 1) / g ? in[full] : 0) * g;
    for (int64_t k = full * g; k < n; k++) {
        if (add) y[k] += r[k - full * g];
        else y[k] = r[k - full * g];
    }
}

/* y[j] (+)= values[c[j]] for m codes, with at most 16 code values: one permute per 16 (or
 * 8) values where the CPU has one; returns how many it did (the rest go the scalar way). */
static int64_t lookup_simd(const uint32_t *restrict c, int64_t m, const float *restrict tab,
                           float *restrict y, int add) {
    int64_t j = 0;
#if defined(__AVX512F__)
    const __m512 t = _mm512_loadu_ps(tab);
    for (; j + 16 <= m; j += 16) {
        __m512 v = _mm512_permutexvar_ps(_mm512_loadu_si512((const void *)(c + j)), t);
        if (add) v = _mm512_add_ps(_mm512_loadu_ps(y + j), v);
        _mm512_storeu_ps(y + j, v);
    }
#elif defined(__AVX2__)
    const __m256 lo = _mm256_loadu_ps(tab), hi = _mm256_loadu_ps(tab + 8);
    for (; j + 8 <= m; j += 8) {
        __m256i idx = _mm256_loadu_si256((const __m256i *)(c + j));
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

#if defined(__AVX512F__) || defined(__AVX2__)
#define HAVE_PERMUTE 1
#else
#define HAVE_PERMUTE 0
#endif

static void codes_decode(const uint8_t *in, int64_t n, const float *restrict values, int bits,
                         float *restrict y, int add) {
    uint32_t c[BLOCK];
    float tab[16] = {0};
    const int small = bits <= 4; /* 2T <= 16 code values fit one permute */
    if (small) memcpy(tab, values, sizeof(float) << bits);
    for (int64_t k = 0; k < n; k += BLOCK) {
        int64_t m = block_len(n - k);
        in += unpack(in, m, bits, c);
        int64_t j = small ? lookup_simd(c, m, tab, y + k, add) : 0;
        if (add)
            for (; j < m; j++) y[k + j] += values[c[j]];
        else
            for (; j < m; j++) y[k + j] = values[c[j]];
    }
}

void ad_table_decode(const uint8_t *in, int64_t n, const float *values, const float *rows,
                     int bits, float *y, int add) {
    if (rows != NULL && 8 % bits == 0 && !(HAVE_PERMUTE && bits <= 4))
        rows_decode(in, n, rows, 8 / bits, y, add);
    else
        codes_decode(in, n, values, bits, y, add);
}

/* LSD radix sort of n keys in `a` (tmp: n more), 8 bits per pass; the result ends in `a`. */
static void radix_sort(uint32_t *a, uint32_t *tmp, int64_t n) {
    uint32_t *src = a, *dst = tmp;
    for (int shift = 0; shift < 32; shift += 8) {
        int64_t count[257] = {0};
        for (int64_t i = 0; i < n; i++) count[((src[i] >> shift) & 255u) + 1]++;
        for (int d = 0; d < 256; d++) count[d + 1] += count[d];
        for (int64_t i = 0; i < n; i++) dst[count[(src[i] >> shift) & 255u]++] = src[i];
        uint32_t *t = src;
        src = dst;
        dst = t;
    }
}

int64_t ad_table_sample(const uint32_t *x, int64_t n, int64_t step, uint32_t *out,
                        uint32_t *tmp) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i += step) {
        uint32_t a = x[i] & (uint32_t)ABS_BITS;
        if (a < INF_BITS) out[m++] = a;
    }
    radix_sort(out, tmp, m);
    return m;
}
