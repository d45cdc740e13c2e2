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
 * - ad_table_encode: codes (for T <= 16 a binary search over thresholds held in AVX-512
 *   registers, or counting compares; a binary search in memory above), one byte each for
 *   N <= 8, packed by bytepack.h (bitpack.h above);
 * - ad_table_decode (decode-add with `add`): codes are unpacked and looked up in `values`
 *   (2T entries: +table then -table), with one AVX-512 / AVX2 permute per 16 / 8 values
 *   for N <= 4 where the CPU has it (two two-register AVX-512 permutes per 16 for N = 5, 6);
 *   without, widths dividing 8 copy one row of 8/N decoded values per packed byte (the
 *   `rows` table the torch path gathers from too).
 * Encode and decode split over `threads` threads (parallel.h).
 * No -ffast-math: decode-add is the same IEEE fp32 addition as torch's, bit for bit.
 */
#include <stdint.h>
#include <string.h>

#include "bitpack.h"
#include "bytepack.h"
#include "lookup.h"
#include "parallel.h"
#include "traffic.h"

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

/* the codes of table1..table5 (T <= 16); 0 if `nm` is not 2^(bits-1) - 1. (Counted in
 * 32-bit lanes: counting into bytes makes gcc narrow every compare's result.) */
static int count_codes(const int32_t *restrict x, uint32_t *restrict c, int64_t n,
                       const int32_t *restrict mids, int64_t nm, int bits) {
    switch (nm) {
    case 0: COUNT_LOOP(0) return 1;
    case 1: COUNT_LOOP(1) return 1;
    case 3: COUNT_LOOP(3) return 1;
    case 7: COUNT_LOOP(7) return 1;
    case 15: COUNT_LOOP(15) return 1;
    default: return 0;
    }
}

#if defined(__AVX512F__)
/* level 0 probes mids[T/2 - 1] for every value: no permute; the sign bit is ORed in by
 * one ternary-logic op (A | (B & C)) */
#define SEARCH_LOOP(L)                                                                      \
    for (; k + 16 <= n; k += 16) {                                                          \
        const __m512i v = _mm512_loadu_si512((const void *)(x + k));                        \
        const __m512i a = _mm512_and_si512(v, abs_bits);                                    \
        __m512i code = (L) == 0 ? _mm512_setzero_si512() /* table1: the sign only */        \
            : _mm512_maskz_mov_epi32(_mm512_cmpge_epi32_mask(a, level[0]), step[0]);        \
        for (int l = 1; l < (L); l++) {                                                     \
            __m512i probe = _mm512_permutexvar_epi32(code, level[l]);                       \
            code = _mm512_mask_add_epi32(code, _mm512_cmpge_epi32_mask(a, probe), code, step[l]); \
        }                                                                                   \
        code = _mm512_ternarylogic_epi32(code, _mm512_srai_epi32(v, 31), sign, 0xF8);        \
        _mm_storeu_si128((__m128i *)(c + k), _mm512_cvtepi32_epi8(code));                   \
    }
#endif

/* Byte codes of table1..table5 (T <= 16, nm = T - 1), 16 values per step, by a branch-free
 * binary search with the thresholds in registers: level s (T/2, ..., 1) compares |x| with
 * mids[c + s - 1], one permute, one compare and one masked add, so log2(T) levels instead
 * of T-1 compares. Returns how many values it did (0 without AVX-512). */
static int64_t search_codes8(const int32_t *restrict x, uint8_t *restrict c, int64_t n,
                             const int32_t *restrict mids, int64_t nm, int bits) {
    int64_t k = 0;
#if defined(__AVX512F__)
    if (nm > 15 || (nm & (nm + 1))) return 0;
    __m512i level[4] = {0}, step[4] = {0};
    int levels = 0;
    for (int32_t s = (int32_t)(nm + 1) / 2; s >= 1; s /= 2, levels++) {
        int32_t t[16];
        for (int i = 0; i < 16; i++) /* level 0: mids[s - 1] in every lane */
            t[i] = levels == 0 ? mids[s - 1] : i + s - 1 < nm ? mids[i + s - 1] : INT32_MAX;
        level[levels] = _mm512_loadu_si512((const void *)t);
        step[levels] = _mm512_set1_epi32(s);
    }
    const __m512i abs_bits = _mm512_set1_epi32(ABS_BITS), sign = _mm512_set1_epi32(1 << (bits - 1));
    switch (levels) { /* constant level counts: the levels unroll, the tables stay in registers */
    case 0: SEARCH_LOOP(0) break;
    case 1: SEARCH_LOOP(1) break;
    case 2: SEARCH_LOOP(2) break;
    case 3: SEARCH_LOOP(3) break;
    default: SEARCH_LOOP(4) break;
    }
#else
    (void)x, (void)c, (void)n, (void)mids, (void)nm, (void)bits;
#endif
    return k;
}

static void table_codes(const int32_t *restrict x, uint32_t *restrict c, int64_t n,
                        const int32_t *restrict mids, int64_t nm, int bits) {
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

typedef struct {
    const int32_t *x, *mids;
    const uint8_t *in;
    uint8_t *out;
    const float *values, *rows;
    float *y;
    int64_t nm;
    int bits, add, stream;
} job_t;

static void encode_range(const void *arg, int64_t lo, int64_t hi) {
    const job_t *j = (const job_t *)arg;
    const int bits = j->bits;
    uint8_t *out = j->out + lo * bits / 8;
    uint8_t c8[BLOCK];
    uint32_t c32[BLOCK];
    for (int64_t k = lo, m; k < hi; k += m) {
        m = ahead_block(j->x + k, hi - k);
        if (bits > 8 || !BYTEPACK_LE) {
            if (!count_codes(j->x + k, c32, m, j->mids, j->nm, bits))
                table_codes(j->x + k, c32, m, j->mids, j->nm, bits);
            out += pack(c32, m, bits, out);
            continue;
        }
        const int64_t done = search_codes8(j->x + k, c8, m, j->mids, j->nm, bits);
        if (!count_codes(j->x + k + done, c32, m - done, j->mids, j->nm, bits))
            table_codes(j->x + k + done, c32, m - done, j->mids, j->nm, bits);
        for (int64_t i = done; i < m; i++) c8[i] = (uint8_t)c32[i - done];
        out += pack8(c8, m, bits, out);
    }
}

void ad_table_encode(const int32_t *x, int64_t n, const int32_t *mids, int64_t nm, int bits,
                     uint8_t *out, int threads) {
    job_t j = {x, mids, NULL, out, NULL, NULL, NULL, nm, bits, 0, 0};
    split_run(encode_range, &j, n, threads);
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

/* y (+)= values[code] over [lo, hi), y[0] the slot of value lo (bits <= 8: byte codes, a
 * permute for bits <= 4) */
static void codes_range(const job_t *j, int64_t lo, int64_t hi, float *y0) {
    const int bits = j->bits, add = j->add, bytes = bits <= 8 && BYTEPACK_LE;
    const uint8_t *in = j->in + lo * bits / 8;
    const float *restrict values = j->values;
    uint8_t c8[BLOCK];
    uint32_t c32[BLOCK];
    float tab[64] = {0};
    const int small = bits <= 4 && bytes; /* 2T <= 16 code values fit one permute */
    const int mid = bits <= 6 && bytes && HAVE_PERMUTE64; /* <= 64: four registers */
    if (small || mid) memcpy(tab, values, sizeof(float) << bits);
    for (int64_t k = lo; k < hi; k += BLOCK) {
        const int64_t m = block_len(hi - k);
        float *restrict y = y0 + (k - lo);
        if (bytes) {
            in += unpack8(in, m, bits, c8);
            if (small) {
                lookup16(c8, m, tab, y, add);
                continue;
            }
            lookup_rest(c8, mid ? lookup64_simd(c8, m, tab, y, add) : 0, m, values, y, add);
        } else {
            in += unpack(in, m, bits, c32);
            if (add) for (int64_t i = 0; i < m; i++) y[i] += values[c32[i]];
            else for (int64_t i = 0; i < m; i++) y[i] = values[c32[i]];
        }
    }
}

/* the values [lo, hi) into y (y[0]: value lo) */
static void decode_part(const void *arg, int64_t lo, int64_t hi, void *out) {
    const job_t *j = (const job_t *)arg;
    float *y = (float *)out;
    const int bits = j->bits;
    if (j->rows != NULL && 8 % bits == 0 && !(HAVE_PERMUTE && bits <= 4))
        rows_decode(j->in + lo * bits / 8, hi - lo, j->rows, 8 / bits, y, j->add);
    else
        codes_range(j, lo, hi, y);
}

static void decode_range(const void *arg, int64_t lo, int64_t hi) {
    const job_t *j = (const job_t *)arg;
    decode_through(decode_part, j, lo, hi, j->y, j->stream);
}

void ad_table_decode(const uint8_t *in, int64_t n, const float *values, const float *rows,
                     int bits, float *y, int add, int threads, int stream) {
    job_t j = {NULL, NULL, in, NULL, values, rows, y, 0, bits, add, stream_output(n, add, stream)};
    split_run(decode_range, &j, n, threads);
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

/* The vector instruction set this build uses (the bench's header prints it). */
const char *ad_kernels_isa(void) {
#if defined(__AVX512F__)
    return "AVX-512";
#elif defined(__AVX2__)
    return "AVX2";
#else
    return "no SIMD intrinsics";
#endif
}

/* The threads calls split over (parallel.h). */
const char *ad_kernels_threads(void) { return split_threads(); }
