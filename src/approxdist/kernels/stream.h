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

/* the word draw `i` of the step keyed `key` hashes; draw i + 1's is this + STREAM_GOLDEN (a
 * loop adds it instead of multiplying) */
static inline uint32_t weyl(uint32_t key, uint32_t i) { return key + i * STREAM_GOLDEN; }

/* the draw of Weyl word `w`: a multiple of 2^-24 in [0, 1) (exact in fp32) */
static inline float uniform(uint32_t w) {
    return (float)(int32_t)(mix32(w) >> 8) * 0x1p-24f;
}

#endif
