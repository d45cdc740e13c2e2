/* Fused bit-field kernels for `bits:` codecs (approxdist.kernels).
 *
 * A layout is up to 4 runs of kept fp32 bits. Run i moves bits by shift[i]: the code of
 * a value v is OR_i ((v >> shift[i]) & mask[i]) with mask[i] at code position, and the
 * decoded bit pattern of a code c is OR_i ((c & mask[i]) << shift[i]). Unused runs have
 * mask 0. Codes form the LSB-first bit stream of approxdist.comm.codecs.bitpack (bitpack.h).
 *
 * Plain C99, no torch headers: it compiles in well under a second with any cc. Blocks of
 * BLOCK values go through a small stack buffer so that the bit arithmetic and the
 * packing are separate simple loops the compiler vectorizes. No -ffast-math: the fused
 * decode-add is the same IEEE fp32 addition torch does, so results are bit-identical.
 */
#include <stdint.h>
#include <string.h>

#include "bitpack.h"

typedef struct {
    uint32_t shift[4];
    uint32_t mask[4];
} layout_t;

static void codes_of(const uint32_t *restrict x, uint32_t *restrict c, int64_t n,
                     const layout_t *l) {
    const uint32_t s0 = l->shift[0], s1 = l->shift[1], s2 = l->shift[2], s3 = l->shift[3];
    const uint32_t m0 = l->mask[0], m1 = l->mask[1], m2 = l->mask[2], m3 = l->mask[3];
    for (int64_t k = 0; k < n; k++) {
        uint32_t v = x[k];
        c[k] = ((v >> s0) & m0) | ((v >> s1) & m1) | ((v >> s2) & m2) | ((v >> s3) & m3);
    }
}

static void bits_of(const uint32_t *restrict c, uint32_t *restrict v, int64_t n,
                    const layout_t *l) {
    const uint32_t s0 = l->shift[0], s1 = l->shift[1], s2 = l->shift[2], s3 = l->shift[3];
    const uint32_t m0 = l->mask[0], m1 = l->mask[1], m2 = l->mask[2], m3 = l->mask[3];
    for (int64_t k = 0; k < n; k++) {
        uint32_t x = c[k];
        v[k] = ((x & m0) << s0) | ((x & m1) << s1) | ((x & m2) << s2) | ((x & m3) << s3);
    }
}

void ad_bits_encode(const uint32_t *x, int64_t n, const layout_t *l, int width, uint8_t *out) {
    uint32_t c[BLOCK];
    for (int64_t k = 0; k < n; k += BLOCK) {
        int64_t m = block_len(n - k);
        codes_of(x + k, c, m, l);
        out += pack(c, m, width, out);
    }
}

void ad_bits_decode(const uint8_t *in, int64_t n, const layout_t *l, int width, uint32_t *y) {
    uint32_t c[BLOCK];
    for (int64_t k = 0; k < n; k += BLOCK) {
        int64_t m = block_len(n - k);
        in += unpack(in, m, width, c);
        bits_of(c, y + k, m, l);
    }
}

void ad_bits_decode_add(const uint8_t *in, int64_t n, const layout_t *l, int width, float *y) {
    uint32_t c[BLOCK], v[BLOCK];
    for (int64_t k = 0; k < n; k += BLOCK) {
        int64_t m = block_len(n - k);
        in += unpack(in, m, width, c);
        bits_of(c, v, m, l);
        for (int64_t j = 0; j < m; j++) {
            float f;
            memcpy(&f, &v[j], sizeof f);
            y[k + j] += f;
        }
    }
}
