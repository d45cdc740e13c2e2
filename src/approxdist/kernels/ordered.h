/* Sums of fp32 values in one fixed order, whatever the thread count (approxdist.kernels).
 *
 * The values are cut into chunks of SUM_CHUNK (the last one shorter); a chunk's sum is that
 * of SUM_LANES lanes, lane j adding the chunk's values j, j + 16, j + 32, ... in turn from
 * +0, then the lanes folded in halves (lane j + 8 onto lane j, then j + 4, j + 2, j + 1);
 * the chunks' sums are folded in halves the same way (padded with zeros to a power of two).
 * Thread ranges start on multiples of SPLIT_ALIGN = SUM_CHUNK, so every chunk lies in one
 * range and each thread writes its chunks' sums; the fold after them runs on one thread.
 * Every step is one fp32 addition of two named values, so any SIMD width gives the same
 * bits, and so do torch ops (approxdist.comm.compressors.ordered, the reference).
 * Header-only.
 */
#ifndef APPROXDIST_ORDERED_H
#define APPROXDIST_ORDERED_H

#include <stdint.h>

#include "parallel.h"

#define SUM_CHUNK SPLIT_ALIGN
#define SUM_LANES 16

/* the chunks n values make */
static int64_t sum_chunks(int64_t n) { return (n + SUM_CHUNK - 1) / SUM_CHUNK; }

/* the lanes of one chunk folded in halves: its sum */
static float fold_lanes(float *lane) {
    for (int h = SUM_LANES / 2; h >= 1; h /= 2)
        for (int j = 0; j < h; j++) lane[j] = lane[j] + lane[j + h];
    return lane[0];
}

/* the `count` chunk sums folded in halves (as if zeros padded them to a power of two),
 * in place: the total */
static float fold_chunks(float *p, int64_t count) {
    if (count == 0) return 0.0f;
    int64_t size = 1;
    while (size < count) size *= 2;
    for (int64_t h = size / 2, live = count; h >= 1; h /= 2) {
        for (int64_t i = 0; i + h < live; i++) p[i] = p[i] + p[i + h];
        live = live < h ? live : h;
    }
    return p[0];
}

#endif
