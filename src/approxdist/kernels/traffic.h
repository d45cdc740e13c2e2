/* The kernels' memory traffic on large tensors: software prefetch of what they read next,
 * non-temporal stores of decoded fp32 values (approxdist.kernels).
 *
 * Reading. On some hosts (the 2-core development VMs among them) the hardware prefetchers
 * keep few lines in flight for one core: a plain loop reading 64 MiB took 5.4 ms there, and
 * 3.0-3.5 ms when it asked for the lines 2 KiB ahead itself. Encoders therefore work in
 * blocks of AHEAD values and, before each, prefetch the next block's lines (a whole 8 KiB
 * block at once was slower: the requests queue behind each other).
 *
 * Writing. A decoder's output of many megabytes is not read again before it leaves the
 * caches, so a plain store first reads each line it writes (read-for-ownership): 4 bytes
 * read per value on top of the 4 written. A non-temporal store (`movntps`) writes whole lines
 * without reading them. The values are the same; only where they wait changes. Used for
 * outputs of at least STREAM_MIN values, never for decode-and-add (which reads its
 * destination anyway).
 * Header-only; without AVX-512 or AVX2 the stores are plain ones.
 */
#ifndef APPROXDIST_TRAFFIC_H
#define APPROXDIST_TRAFFIC_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* outputs of this many values or more are streamed: 64 MiB of fp32, 16 times a 2-core
 * host's L2 (measured a win there at this size; smaller outputs, a data-parallel bucket of
 * 25 MB say, may still be read from cache by what follows, and keep plain stores) */
#define STREAM_MIN (1 << 24)

/* values an encoder block holds, and how far ahead it prefetches */
#define AHEAD 512

/* the length of the next encoder block of the `left` values, after a prefetch of the block
 * after it (`x`: this block's first value, 4-byte values) */
static int64_t ahead_block(const void *x, int64_t left) {
    const int64_t m = left < AHEAD ? left : AHEAD, next = left - m < AHEAD ? left - m : AHEAD;
    const char *p = (const char *)x + 4 * m;
    for (int64_t b = 0; b < 4 * next; b += 64) __builtin_prefetch(p + b, 0, 3);
    return m;
}

#if defined(__AVX512F__)
#define STREAM_LANES 16
#elif defined(__AVX2__)
#define STREAM_LANES 8
#else
#define STREAM_LANES 1
#endif

/* whether a decode of n values into a fresh destination streams its stores: `want` 1 or 0
 * forces it (the tests), -1 decides by size */
static int stream_output(int64_t n, int add, int want) {
    if (add || STREAM_LANES == 1) return 0;
    return want < 0 ? n >= STREAM_MIN : want != 0;
}

/* values before y[j] is aligned for a vector non-temporal store (0 when not streaming) */
static int64_t stream_peel(const float *y, int64_t m, int stream) {
    if (!stream) return 0;
    const int64_t bytes = (int64_t)(sizeof(float) * STREAM_LANES);
    const int64_t off = (int64_t)((uintptr_t)y % (uintptr_t)bytes);
    int64_t peel = off ? (bytes - off) / (int64_t)sizeof(float) : 0;
    if (off % (int64_t)sizeof(float)) peel = m; /* not even float-aligned: plain stores */
    return peel < m ? peel : m;
}

/* y[0..m) = src[0..m): streamed where `stream` (after a peel to alignment), else memcpy */
static void store_values(float *restrict y, const float *restrict src, int64_t m, int stream) {
    if (!stream) {
        memcpy(y, src, sizeof(float) * (size_t)m);
        return;
    }
    int64_t j = stream_peel(y, m, stream);
    memcpy(y, src, sizeof(float) * (size_t)j);
#if defined(__AVX512F__)
    for (; j + 16 <= m; j += 16) _mm512_stream_ps(y + j, _mm512_loadu_ps(src + j));
#elif defined(__AVX2__)
    for (; j + 8 <= m; j += 8) _mm256_stream_ps(y + j, _mm256_loadu_ps(src + j));
#endif
    memcpy(y + j, src + j, sizeof(float) * (size_t)(m - j));
}

/* after a range's streamed stores: order them before whatever the caller does next */
static void stream_done(int stream) {
#if defined(__AVX512F__) || defined(__AVX2__)
    if (stream) _mm_sfence();
#else
    (void)stream;
#endif
}

/* decodes the values [lo, hi) of a job into y (y[0]: value lo; fp32 or their bit patterns) */
typedef void (*part_fn)(const void *job, int64_t lo, int64_t hi, void *y);

#define STREAM_BLOCK 2048

/* part(job, lo, hi, y + lo), or, where `stream`, the same a block at a time through a buffer
 * in L1 and on past the caches */
static void decode_through(part_fn part, const void *job, int64_t lo, int64_t hi, float *y,
                           int stream) {
    if (!stream) {
        part(job, lo, hi, y + lo);
        return;
    }
    float tmp[STREAM_BLOCK];
    for (int64_t k = lo; k < hi; k += STREAM_BLOCK) {
        const int64_t m = hi - k < STREAM_BLOCK ? hi - k : STREAM_BLOCK;
        part(job, k, k + m, tmp);
        store_values(y + k, tmp, m, 1);
    }
    stream_done(1);
}

#endif
