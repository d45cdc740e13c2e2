/* The stochastic compressors' counter-based random stream (approxdist.kernels).
 *
 * Draw i of a step whose key is k: u = (mix32(k + i * 0x9E3779B9) >> 8) * 2^-24, all integer
 * arithmetic mod 2^32 and mix32 the "lowbias32" integer hash (C. Wellons). A draw depends on
 * (key, i) only, so any split of the values over threads draws the same numbers, and
 * approxdist.comm.compressors.stream draws them with torch ops, bit for bit. Header-only.
 */
#ifndef APPROXDIST_STREAM_H
#define APPROXDIST_STREAM_H

#include <stdint.h>

#define STREAM_GOLDEN 0x9E3779B9u

static inline uint32_t mix32(uint32_t h) {
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    return h;
}

/* draw `i` of the step keyed `key`: a multiple of 2^-24 in [0, 1) (exact in fp32) */
static inline float draw(uint32_t key, uint32_t i) {
    return (float)(int32_t)(mix32(key + i * STREAM_GOLDEN) >> 8) * 0x1p-24f;
}

#endif
