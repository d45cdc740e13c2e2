/* Top-k selection by magnitude for the top-k compressor (approxdist.kernels).
 *
 * The k values of largest magnitude, compared as 31-bit patterns (bits & 0x7FFFFFFF: the
 * value order of finite values, NaN patterns above infinity), ties broken by the lower
 * index, written in increasing index order with their values: the selection the torch path
 * of comm/compressors/topk.py makes. A radix select: a histogram of the top 16 pattern bits
 * finds the bin of the k-th largest, a histogram of that bin's low 15 bits its exact pattern
 * T; a last pass writes every value above T and the first ties at T, and, given a residual,
 * residual = x - (selected ? x : 0) (error feedback, the torch path's x - decode). Each pass
 * splits over `threads` threads (parallel.h); each range keeps its own histograms and counts,
 * from which the ranges' output offsets follow. Below SMALL_N values (one range) T comes from
 * three histograms of 11, 10 and 10 bits on the stack: the two large ones' allocation, zeroing
 * and scans cost a fixed 0.1-0.5 ms a call, more than a small tensor's values
 * (docs/compressors.md, "Many small tensors").
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define ABS_BITS 0x7FFFFFFFu
#define HIGH_BINS (1 << 16)
#define LOW_BINS (1 << 15)
#define SUM_BLOCK 2048
/* values of the sample the first histogram's floor is estimated from */
#define SAMPLE (1 << 14)
/* below this many values the k-th largest pattern is found by three small histograms */
#define SMALL_N (1 << 16)

typedef struct {
    const uint32_t *x;
    const float *g; /* error feedback: the gradient, x = g + residual (NULL: x as given) */
    int64_t bounds[MAX_THREADS + 1];
    uint32_t *high, *low; /* per range: HIGH_BINS / LOW_BINS counts */
    uint32_t bin, t;      /* the k-th largest's top 16 bits; its whole pattern */
    uint32_t floor;       /* the first histogram counts bins >= floor only (0: all) */
    int64_t above[MAX_THREADS], take[MAX_THREADS], offset[MAX_THREADS], counted[MAX_THREADS];
    int parts;
    int32_t *idx;
    float *val, *residual;
} topk_t;

static int part_of(const topk_t *j, int64_t lo) { return split_part(j->bounds, j->parts, lo); }

/* h[bin]++ for the values of [lo, hi) whose bin (top 16 bits) is at least j->floor (all of them
 * where 0: the scalar loop); returns how many were counted */
static int64_t count_high(const topk_t *j, int64_t lo, int64_t hi, uint32_t *h) {
    const uint32_t *x = j->x, floor = j->floor;
    int64_t counted = 0, i = lo;
    if (floor == 0) {
        for (; i < hi; i++) h[(x[i] & ABS_BITS) >> 15]++;
        return hi - lo;
    }
#if defined(__AVX512F__)
    const __m512i abs_bits = _mm512_set1_epi32((int)ABS_BITS), f = _mm512_set1_epi32((int)floor);
    for (; i + 16 <= hi; i += 16) { /* the few values at or above the floor one by one */
        const __m512i top = _mm512_srli_epi32(
            _mm512_and_si512(_mm512_loadu_si512((const void *)(x + i)), abs_bits), 15);
        for (__mmask16 in = _mm512_cmpge_epu32_mask(top, f); in; in &= in - 1, counted++)
            h[(x[i + __builtin_ctz(in)] & ABS_BITS) >> 15]++;
    }
#endif
    for (; i < hi; i++) {
        const uint32_t top = (x[i] & ABS_BITS) >> 15;
        if (top >= floor) h[top]++, counted++;
    }
    return counted;
}

static void high_range(const void *arg, int64_t lo, int64_t hi) {
    topk_t *j = (topk_t *)arg; /* each range writes its own slots only */
    const int p = part_of(j, lo);
    uint32_t *h = j->high + (size_t)p * HIGH_BINS;
    int64_t counted = 0;
    if (j->g != NULL) { /* x = g + residual, written over the residual a block at a time */
        const float *restrict g = j->g;
        float *e = j->residual; /* the memory j->x reads */
        for (int64_t k = lo; k < hi; k += SUM_BLOCK) {
            const int64_t end = hi - k < SUM_BLOCK ? hi : k + SUM_BLOCK;
            for (int64_t i = k; i < end; i++) e[i] = g[i] + e[i];
            counted += count_high(j, k, end, h);
        }
    } else {
        counted = count_high(j, lo, hi, h);
    }
    j->counted[p] = counted;
}

/* A bin at or below the k-th largest's, from a strided sample of SAMPLE values: the highest
 * bin at or above which 2 k / n of the sample and 64 values more lie; 0 (count every value)
 * for small tensors or large k. Uses and clears h (HIGH_BINS zeros). */
static uint32_t floor_bin(const topk_t *j, int64_t n, int64_t k, uint32_t *h) {
    const int64_t step = n / SAMPLE, want = 2 * k * SAMPLE / n + 64;
    if (step < 8 || want >= SAMPLE / 4) return 0;
    const float *e = (const float *)j->x;
    for (int64_t i = 0; i < SAMPLE; i++) {
        float v = e[i * step];
        if (j->g != NULL) v = j->g[i * step] + v; /* x to be: g + residual */
        uint32_t a;
        memcpy(&a, &v, sizeof a);
        h[(a & ABS_BITS) >> 15]++;
    }
    int64_t sum = 0;
    uint32_t bin = HIGH_BINS - 1;
    for (; bin > 0 && sum < want; bin--) sum += h[bin];
    memset(h, 0, sizeof(uint32_t) * HIGH_BINS);
    return sum >= want ? bin + 1 : 0;
}

static void low_range(const void *arg, int64_t lo, int64_t hi) {
    topk_t *j = (topk_t *)arg; /* each range writes its own slots only */
    const int p = part_of(j, lo);
    uint32_t *h = j->low + (size_t)p * LOW_BINS;
    const uint32_t bin = j->bin;
    int64_t above = 0, i = lo;
#if defined(__AVX512F__)
    /* 16 values a step: the count above the bin by compare and popcount; the few values in
     * the bin (a k-th largest's bin is a sliver of them) one by one */
    const __m512i abs_bits = _mm512_set1_epi32((int)ABS_BITS), b = _mm512_set1_epi32((int)bin);
    for (; i + 16 <= hi; i += 16) {
        const __m512i top = _mm512_srli_epi32(
            _mm512_and_si512(_mm512_loadu_si512((const void *)(j->x + i)), abs_bits), 15);
        above += __builtin_popcount(_mm512_cmpgt_epu32_mask(top, b));
        for (__mmask16 in = _mm512_cmpeq_epu32_mask(top, b); in; in &= in - 1) {
            const uint32_t a = j->x[i + __builtin_ctz(in)] & ABS_BITS;
            h[a & (LOW_BINS - 1)]++;
        }
    }
#endif
    for (; i < hi; i++) {
        const uint32_t a = j->x[i] & ABS_BITS, top = a >> 15;
        above += top > bin;
        if (top == bin) h[a & (LOW_BINS - 1)]++;
    }
    j->above[p] = above;
}

/* the scalar selection over [i, hi): values above t, and ties at t while fewer than `take`
 * were kept; *out and *seen (ties met so far) carry on from one call to the next */
static void select_scalar(const topk_t *j, int64_t i, int64_t hi, int64_t take, int64_t *out,
                          int64_t *seen) {
    const uint32_t t = j->t;
    const float *xf = (const float *)j->x;
    int64_t o = *out, met = *seen;
    for (; i < hi; i++) {
        const uint32_t a = j->x[i] & ABS_BITS;
        int sel = a > t;
        if (a == t) sel = met++ < take;
        if (sel) {
            j->idx[o] = (int32_t)i;
            j->val[o] = xf[i];
            o++;
        }
        if (j->residual != NULL) j->residual[i] = xf[i] - (sel ? xf[i] : 0.0f);
    }
    *out = o;
    *seen = met;
}

static void select_range(const void *arg, int64_t lo, int64_t hi) {
    const topk_t *j = (const topk_t *)arg;
    const int p = part_of(j, lo);
    const int64_t take = j->take[p];
    int64_t o = j->offset[p], seen = 0, i = lo;
#if defined(__AVX512F__)
    /* 16 values a step: the kept ones compress-stored in index order, the residual masked; a
     * step holding a value at t goes the scalar way (ties are taken in index order) */
    const __m512i abs_bits = _mm512_set1_epi32((int)ABS_BITS), tv = _mm512_set1_epi32((int)j->t);
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= hi; i += 16) {
        const __m512i v = _mm512_loadu_si512((const void *)(j->x + i));
        const __m512i a = _mm512_and_si512(v, abs_bits);
        if (_mm512_cmpeq_epu32_mask(a, tv)) {
            select_scalar(j, i, i + 16, take, &o, &seen);
            continue;
        }
        const __mmask16 sel = _mm512_cmpgt_epu32_mask(a, tv);
        const __m512 xs = _mm512_castsi512_ps(v);
        if (sel) {
            const __m512i index = _mm512_add_epi32(_mm512_set1_epi32((int32_t)i), lanes);
            _mm512_mask_compressstoreu_epi32((void *)(j->idx + o), sel, index);
            _mm512_mask_compressstoreu_ps((void *)(j->val + o), sel, xs);
            o += __builtin_popcount(sel);
        }
        if (j->residual != NULL)
            _mm512_storeu_ps(j->residual + i, _mm512_sub_ps(xs, _mm512_maskz_mov_ps(sel, xs)));
    }
#endif
    select_scalar(j, i, hi, take, &o, &seen);
}

/* The first bin (from the top) at which the counts, summed from the top, reach k; `before`
 * gets the sum above it. */
static uint32_t kth_bin(const uint32_t *h, int parts, int bins, int64_t k, int64_t *before) {
    int64_t sum = *before;
    for (int b = bins - 1; b > 0; b--) {
        int64_t count = 0;
        for (int p = 0; p < parts; p++) count += h[(size_t)p * bins + b];
        if (sum + count >= k) {
            *before = sum;
            return (uint32_t)b;
        }
        sum += count;
    }
    *before = sum;
    return 0;
}

/* The k-th largest 31-bit pattern of x[0, n) by three histograms of 11, 10 and 10 bits on
 * the stack (the radix select of select_top with 2048 bins a level instead of 65536 and
 * 32768, which cost more to clear and scan than a small tensor's values); *greater gets
 * how many patterns lie above it. One thread. */
static uint32_t kth_pattern_small(const uint32_t *x, int64_t n, int64_t k, int64_t *greater) {
    static const int shift[3] = {20, 10, 0};
    static const uint32_t bins[3] = {1u << 11, 1u << 10, 1u << 10};
    uint32_t h[1u << 11];
    uint32_t prefix = 0, mask = 0;
    int64_t above = 0;
    for (int level = 0; level < 3; level++) {
        const uint32_t top = bins[level] - 1;
        memset(h, 0, sizeof(uint32_t) * bins[level]);
        for (int64_t i = 0; i < n; i++) {
            const uint32_t a = x[i] & ABS_BITS;
            if ((a & mask) == prefix) h[(a >> shift[level]) & top]++;
        }
        uint32_t b = top;
        for (; b > 0 && above + (int64_t)h[b] < k; b--) above += h[b];
        prefix |= b << shift[level];
        mask |= top << shift[level];
    }
    *greater = above;
    return prefix;
}

/* select_top for n < SMALL_N (one range): x made (error feedback), the pattern T found on
 * the stack, then the one selection pass. */
static void select_small(topk_t *j, int64_t n, int64_t k) {
    if (j->g != NULL) { /* x = g + residual, written over the residual, as high_range does */
        float *e = j->residual;
        for (int64_t i = 0; i < n; i++) e[i] = j->g[i] + e[i];
    }
    int64_t greater = 0;
    j->t = kth_pattern_small(j->x, n, k, &greater);
    j->parts = 1;
    j->bounds[0] = 0, j->bounds[1] = n;
    j->take[0] = k - greater, j->offset[0] = 0;
    select_range(j, 0, n);
}

/* The selection of j->x's k largest magnitudes (j->g: of g + residual, made by the first pass)
 * into j->val and j->idx. Returns 0, or -1 if the histograms could not be allocated (nothing
 * written). Frees j. */
static int select_top(topk_t *j, int64_t n, int64_t k, int threads) {
    if (n < SMALL_N) {
        select_small(j, n, k);
        free(j);
        return 0;
    }
    j->parts = split_bounds(n, threads, j->bounds);
    j->high = (uint32_t *)calloc((size_t)j->parts * HIGH_BINS, sizeof(uint32_t));
    j->low = (uint32_t *)calloc((size_t)j->parts * LOW_BINS, sizeof(uint32_t));
    if (j->high == NULL || j->low == NULL) {
        free(j->high);
        free(j->low);
        free(j);
        return -1;
    }
    j->floor = floor_bin(j, n, k, j->high);
    split_run(high_range, j, n, threads);
    int64_t counted = 0;
    for (int p = 0; p < j->parts; p++) counted += j->counted[p];
    if (counted < k) { /* fewer than k at or above the floor: count every value */
        memset(j->high, 0, sizeof(uint32_t) * HIGH_BINS * (size_t)j->parts);
        j->floor = 0;
        j->g = NULL; /* x holds g + residual now */
        split_run(high_range, j, n, threads);
    }
    int64_t above = 0;
    j->bin = kth_bin(j->high, j->parts, HIGH_BINS, k, &above);
    split_run(low_range, j, n, threads);
    int64_t greater = above;
    const uint32_t low = kth_bin(j->low, j->parts, LOW_BINS, k, &greater);
    j->t = j->bin << 15 | low;
    int64_t ties = k - greater, offset = 0;
    for (int p = 0; p < j->parts; p++) { /* range p: its values above t, then its first ties */
        const uint32_t *h = j->low + (size_t)p * LOW_BINS;
        int64_t gt = j->above[p];
        for (uint32_t b = low + 1; b < LOW_BINS; b++) gt += h[b];
        j->take[p] = ties < (int64_t)h[low] ? ties : (int64_t)h[low];
        ties -= j->take[p];
        j->offset[p] = offset;
        offset += gt + j->take[p];
    }
    split_run(select_range, j, n, threads);
    free(j->high);
    free(j->low);
    free(j);
    return 0;
}

/* Select the k (1 <= k <= n) values of largest magnitude of x: their values and indices in
 * increasing index order; residual (may be NULL) = x - (selected ? x : 0). Returns 0, or -1
 * if the histograms could not be allocated (nothing written). */
int ad_topk_select(const float *x, int64_t n, int64_t k, float *val, int32_t *idx,
                   float *residual, int threads) {
    topk_t *j = (topk_t *)calloc(1, sizeof(topk_t));
    if (j == NULL) return -1;
    j->x = (const uint32_t *)x;
    j->idx = idx, j->val = val, j->residual = residual;
    return select_top(j, n, k, threads);
}

/* ad_topk_select of x = g + residual (torch.add's fp32 sums), with error feedback in place:
 * the first pass writes x over the residual, the last x - (selected ? x : 0). */
int ad_topk_feedback(const float *g, float *residual, int64_t n, int64_t k, float *val,
                     int32_t *idx, int threads) {
    topk_t *j = (topk_t *)calloc(1, sizeof(topk_t));
    if (j == NULL) return -1;
    j->g = g;
    j->x = (const uint32_t *)residual;
    j->idx = idx, j->val = val, j->residual = residual;
    return select_top(j, n, k, threads);
}
