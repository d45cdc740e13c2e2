/* Fused encoders of the bit-packed gradient compressors: QSGD, TernGrad, signs (approxdist.kernels).
 *
 * Each computes one code per fp32 value and packs the codes LSB-first (code i at stream bits
 * [i*w, (i+1)*w): bytepack.h for w <= 8, bitpack.h above), the payload codes that the torch
 * reference of approxdist.comm.compressors writes, bit for bit: the same fp32 operations in
 * the same order (no -ffast-math; -std=c99 turns off fused multiply-add contraction), and
 * for the stochastic ones the same draws (stream.h, a counter-based stream).
 *
 * - ad_qsgd_encode: a = |x| * scale (scale = s / ||x||), low = floor(a), level = low + (u < a -
 *   low) at most s, code = s - level for x < 0 else s + level (Alistarh et al. 2017);
 * - ad_terngrad_encode: code 1 (x >= 0) or 2 (x < 0) where u * scale < |x|, else 0 (Wen et
 *   al. 2017: kept with probability |x| / scale);
 * - ad_sign_encode: code 1 where x < 0; with `values` (the decoded value of codes 0 and 1)
 *   also residual = x - values[code] (EF-SignSGD's error feedback, one pass).
 * The callers pass finite positive scales only (so QSGD's a is in [0, s] and truncation is
 * floor). Decoding is a lookup of each code's value: ad_table_decode (table.c). Every
 * encoder splits over `threads` threads (parallel.h), and so does QSGD's squared norm,
 * ad_square_sum, summed in the fixed order of ordered.h.
 */
#include <math.h>
#include <stdint.h>

#include "bitpack.h"
#include "bytepack.h"
#include "parallel.h"
#include "ordered.h"
#include "traffic.h"
#include "stream.h"

typedef struct quant quant_t;
/* codes of values [k, k + m): one a byte into c8 (returns 1; codes of at most 8 bits on a
 * little-endian host) or one a word into c (returns 0) */
typedef int (*codes_fn)(const quant_t *q, int64_t k, int64_t m, uint32_t *restrict c,
                        uint8_t *restrict c8);

struct quant {
    codes_fn codes;
    const float *x;
    const float *values; /* sign: the value of codes 0 and 1, or NULL (no residual) */
    float *residual;
    uint8_t *out;
    float scale;
    int32_t levels;
    uint32_t key;
    int width;
};

/* codes made a byte each: 1 where pack8 takes them (little-endian hosts), else widened into
 * c for pack_words and 0 */
static int byte_codes(const uint8_t *restrict c8, int64_t m, uint32_t *restrict c) {
    if (BYTEPACK_LE) return 1;
    for (int64_t j = 0; j < m; j++) c[j] = c8[j];
    return 0;
}

/* QSGD's code of x (see above); u < a - low compared as (mix32(w) >> 8) < (a - low) * 2^24,
 * both sides times 2^24 exactly, and the level in integers */
static inline uint32_t qsgd_code(float x, float scale, int32_t s, uint32_t w) {
    const float a = fabsf(x) * scale;
    const int32_t low = (int32_t)a; /* floor: 0 <= a <= ~s */
    int32_t l = low + ((float)(int32_t)(mix32(w) >> 8) < (a - (float)low) * 0x1p24f);
    l = l > s ? s : l;
    return (uint32_t)(x < 0.0f ? s - l : s + l);
}

static int qsgd_codes(const quant_t *q, int64_t k, int64_t m, uint32_t *restrict c,
                      uint8_t *restrict c8) {
    const float *restrict x = q->x + k;
    const float scale = q->scale;
    const int32_t s = q->levels;
    uint32_t w = weyl(q->key, (uint32_t)k);
    if (q->width <= 8 && BYTEPACK_LE) {
        for (int32_t j = 0; j < (int32_t)m; j++, w += STREAM_GOLDEN)
            c8[j] = (uint8_t)qsgd_code(x[j], scale, s, w);
        return 1;
    }
    for (int32_t j = 0; j < (int32_t)m; j++, w += STREAM_GOLDEN)
        c[j] = qsgd_code(x[j], scale, s, w);
    return 0;
}

static int terngrad_codes(const quant_t *q, int64_t k, int64_t m, uint32_t *restrict c,
                          uint8_t *restrict c8) {
    const float *restrict x = q->x + k;
    const float scale = q->scale;
    uint32_t w = weyl(q->key, (uint32_t)k);
    for (int32_t j = 0; j < (int32_t)m; j++, w += STREAM_GOLDEN) {
        const uint32_t sign = x[j] < 0.0f ? 2u : 1u;
        c8[j] = uniform(w) * scale < fabsf(x[j]) ? (uint8_t)sign : 0u; /* u < |x| / scale */
    }
    return byte_codes(c8, m, c);
}

static int sign_codes(const quant_t *q, int64_t k, int64_t m, uint32_t *restrict c32,
                      uint8_t *restrict c) {
    const float *restrict x = q->x + k;
    for (int64_t j = 0; j < m; j++) c[j] = x[j] < 0.0f;
    if (q->values == NULL) return byte_codes(c, m, c32);
    const float plus = q->values[0], minus = q->values[1];
    if (q->residual == q->x) { /* in place: the residual replaces the values it came from */
        float *restrict r = q->residual + k;
        for (int64_t j = 0; j < m; j++) r[j] = r[j] - (c[j] ? minus : plus);
        return byte_codes(c, m, c32);
    }
    float *restrict r = q->residual + k;
    for (int64_t j = 0; j < m; j++) r[j] = x[j] - (c[j] ? minus : plus);
    return byte_codes(c, m, c32);
}

static void encode_range(const void *arg, int64_t lo, int64_t hi) {
    const quant_t *q = (const quant_t *)arg;
    const int w = q->width;
    uint8_t *out = q->out + lo * w / 8;
    uint32_t c32[BLOCK];
    uint8_t c8[BLOCK];
    for (int64_t k = lo, m; k < hi; k += m) {
        m = ahead_block(q->x + k, hi - k);
        out += q->codes(q, k, m, c32, c8) ? pack8(c8, m, w, out) : pack_words(c32, m, w, c8, out);
    }
}

void ad_qsgd_encode(const float *x, int64_t n, float scale, int32_t levels, uint32_t key,
                    int width, uint8_t *out, int threads) {
    quant_t q = {qsgd_codes, x, NULL, NULL, out, scale, levels, key, width};
    split_run(encode_range, &q, n, threads);
}

void ad_terngrad_encode(const float *x, int64_t n, float scale, uint32_t key, uint8_t *out,
                        int threads) {
    quant_t q = {terngrad_codes, x, NULL, NULL, out, scale, 0, key, 2};
    split_run(encode_range, &q, n, threads);
}

void ad_sign_encode(const float *x, int64_t n, const float *values, float *residual,
                    uint8_t *out, int threads) {
    quant_t q = {sign_codes, x, values, residual, out, 0.0f, 0, 0, 1};
    split_run(encode_range, &q, n, threads);
}

typedef struct {
    const float *g;
    float *e, *sums;
    int square; /* add e^2, not |e| (g NULL) */
} sum_t;

/* m values (a multiple of SUM_LANES but at the end): e = g + e where g is given (else e is
 * only read), and each |e| added to its lane (ordered.h); with `square` (g NULL) each e^2
 * instead, rounded to fp32 on its own before its addition (-std=c99 contracts no fma) */
static void add_feedback(const float *restrict g, float *restrict e, int64_t m, int square,
                         float *restrict lanes) {
    float lane[SUM_LANES];
    for (int j = 0; j < SUM_LANES; j++) lane[j] = lanes[j];
    const int64_t whole = m / SUM_LANES * SUM_LANES;
    if (square) {
        for (int64_t r = 0; r < whole; r += SUM_LANES)
            for (int j = 0; j < SUM_LANES; j++) {
                const float q = e[r + j] * e[r + j];
                lane[j] += q;
            }
    } else if (g == NULL) {
        for (int64_t r = 0; r < whole; r += SUM_LANES)
            for (int j = 0; j < SUM_LANES; j++) lane[j] += fabsf(e[r + j]);
    } else {
        for (int64_t r = 0; r < whole; r += SUM_LANES)
            for (int j = 0; j < SUM_LANES; j++) {
                e[r + j] = g[r + j] + e[r + j];
                lane[j] += fabsf(e[r + j]);
            }
    }
    for (int j = 0; j < m - whole; j++) {
        if (g != NULL) e[whole + j] = g[whole + j] + e[whole + j];
        const float q = square ? e[whole + j] * e[whole + j] : fabsf(e[whole + j]);
        lane[j] += q;
    }
    for (int j = 0; j < SUM_LANES; j++) lanes[j] = lane[j];
}

static void sum_range(const void *arg, int64_t lo, int64_t hi) {
    const sum_t *s = (const sum_t *)arg;
    for (int64_t c = lo; c < hi; c += SUM_CHUNK) { /* lo is a multiple of SUM_CHUNK */
        const int64_t end = hi - c < SUM_CHUNK ? hi : c + SUM_CHUNK;
        float lane[SUM_LANES] = {0.0f};
        for (int64_t k = c, m; k < end; k += m) { /* AHEAD: a multiple of SUM_LANES */
            m = ahead_block(s->e + k, end - k);
            if (s->g != NULL) ahead_block(s->g + k, end - k);
            add_feedback(s->g == NULL ? NULL : s->g + k, s->e + k, m, s->square, lane);
        }
        s->sums[c / SUM_CHUNK] = fold_lanes(lane);
    }
}

/* Error feedback's first pass, in place: e = g + e (torch.add's fp32 sum; g NULL: e only
 * read) and the sum of |e| in the fixed order of ordered.h, returned (`sums`: sum_chunks(n) floats
 * of work space). One read of g and e, one write of e. */
float ad_feedback_sum(const float *g, float *e, float *sums, int64_t n, int threads) {
    sum_t s = {g, e, sums, 0};
    split_run(sum_range, &s, n, threads);
    return fold_chunks(sums, sum_chunks(n));
}

/* QSGD's squared norm: the sum of x^2 in the fixed order of ordered.h, split over `threads`
 * (`sums`: sum_chunks(n) floats of work space); the same bits with any thread count and as
 * comm/compressors/ordered.py's ordered_sum(x * x). x is only read. */
float ad_square_sum(const float *x, float *sums, int64_t n, int threads) {
    sum_t s = {NULL, (float *)x, sums, 1};
    split_run(sum_range, &s, n, threads);
    return fold_chunks(sums, sum_chunks(n));
}

typedef struct {
    const uint32_t *x;
    int64_t bounds[MAX_THREADS + 1];
    uint32_t most[MAX_THREADS];
    int parts;
} most_t;

static void most_range(const void *arg, int64_t lo, int64_t hi) {
    most_t *j = (most_t *)arg; /* each range writes its own slot only */
    const uint32_t *restrict x = j->x;
    uint32_t most = 0;
    for (int64_t k = lo, m; k < hi; k += m) {
        m = ahead_block(x + k, hi - k);
        for (int64_t i = k; i < k + m; i++) {
            const uint32_t a = x[i] & 0x7FFFFFFFu;
            most = a > most ? a : most;
        }
    }
    j->most[split_part(j->bounds, j->parts, lo)] = most;
}

/* The largest |x| as its bit pattern (TernGrad's scale): exact in any order, since it is one
 * of the values; a NaN pattern (above +inf) where x holds a NaN. */
uint32_t ad_max_magnitude(const float *x, int64_t n, int threads) {
    most_t j = {(const uint32_t *)x, {0}, {0}, 0};
    j.parts = split_bounds(n, threads, j.bounds);
    split_run(most_range, &j, n, threads);
    uint32_t most = 0;
    for (int p = 0; p < j.parts; p++) most = j.most[p] > most ? j.most[p] : most;
    return most;
}
