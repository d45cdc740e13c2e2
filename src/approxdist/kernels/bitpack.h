/* LSB-first bit packing of w-bit codes (w = 1..32), shared by the kernels (approxdist.kernels).
 *
 * Code i occupies stream bits [i*w, (i+1)*w), least significant bit first: the stream of
 * approxdist.comm.codecs.bitpack. `pack` and `unpack` handle one block of codes; every
 * block but the last holds a multiple of 8 codes, so blocks start on whole bytes. Codes
 * of at most 8 bits go faster one per byte (bytepack.h); these take any width.
 * Header-only (static functions): each kernel file includes it.
 */
#ifndef APPROXDIST_BITPACK_H
#define APPROXDIST_BITPACK_H

#include <stdint.h>

#define BLOCK 2048

/* codes per group: the fewest codes that fill whole bytes */
static int group_codes(int width) {
    int g = 8;
    while (g > 1 && (g / 2) * width % 8 == 0) g /= 2;
    return g;
}

/* the low `nbytes` bytes of `v`, least significant first (any host byte order) */
static void store_le(uint8_t *out, uint64_t v, int64_t nbytes) {
    for (int64_t i = 0; i < nbytes; i++) out[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t load_le(const uint8_t *in, int64_t nbytes) {
    uint64_t v = 0;
    for (int64_t i = 0; i < nbytes; i++) v |= (uint64_t)in[i] << (8 * i);
    return v;
}

/* Pack n codes (< 2^width) of a block into `out`; returns bytes written. `n` is a
 * multiple of the group size except in the last block, whose last byte is zero-padded. */
static int64_t pack(const uint32_t *restrict c, int64_t n, int width, uint8_t *restrict out) {
    if (width == 16) {
        for (int64_t k = 0; k < n; k++) {
            out[2 * k] = (uint8_t)c[k];
            out[2 * k + 1] = (uint8_t)(c[k] >> 8);
        }
        return 2 * n;
    }
    int g = group_codes(width);
    if (g * width <= 64) {  /* whole groups of g codes fill g*width/8 bytes of one word */
        int64_t full = n / g, nbytes = (int64_t)g * width / 8;
        for (int64_t b = 0; b < full; b++) {
            uint64_t acc = 0;
            for (int j = 0; j < g; j++) acc |= (uint64_t)c[b * g + j] << (j * width);
            store_le(out + b * nbytes, acc, nbytes);
        }
        out += full * nbytes;
        c += full * g;
        n -= full * g;
        int64_t written = full * nbytes;
        if (n) {
            uint64_t acc = 0;
            for (int64_t j = 0; j < n; j++) acc |= (uint64_t)c[j] << (j * width);
            int64_t tail = (n * width + 7) / 8;
            store_le(out, acc, tail);
            written += tail;
        }
        return written;
    }
    /* any width <= 32: a 64-bit bit accumulator (n*width is a multiple of 8 but last) */
    uint64_t acc = 0;
    int nb = 0;
    uint8_t *o = out;
    for (int64_t k = 0; k < n; k++) {
        acc |= (uint64_t)c[k] << nb;
        nb += width;
        while (nb >= 8) {
            *o++ = (uint8_t)acc;
            acc >>= 8;
            nb -= 8;
        }
    }
    if (nb > 0) *o++ = (uint8_t)acc;
    return o - out;
}

/* Unpack n codes from `in` into c; returns bytes consumed (the same rule as `pack`). */
static int64_t unpack(const uint8_t *restrict in, int64_t n, int width, uint32_t *restrict c) {
    if (width == 16) {
        for (int64_t k = 0; k < n; k++) c[k] = (uint32_t)in[2 * k] | ((uint32_t)in[2 * k + 1] << 8);
        return 2 * n;
    }
    const uint64_t mask = width == 32 ? 0xFFFFFFFFull : ((1ull << width) - 1);
    int g = group_codes(width);
    if (g * width <= 64) {
        int64_t full = n / g, nbytes = (int64_t)g * width / 8;
        for (int64_t b = 0; b < full; b++) {
            uint64_t acc = load_le(in + b * nbytes, nbytes);
            for (int j = 0; j < g; j++) c[b * g + j] = (uint32_t)((acc >> (j * width)) & mask);
        }
        int64_t read = full * nbytes, left = n - full * g;
        if (left) {
            int64_t tail = (left * width + 7) / 8;
            uint64_t acc = load_le(in + read, tail);
            for (int64_t j = 0; j < left; j++)
                c[full * g + j] = (uint32_t)((acc >> (j * width)) & mask);
            read += tail;
        }
        return read;
    }
    uint64_t acc = 0;
    int nb = 0;
    const uint8_t *p = in;
    for (int64_t k = 0; k < n; k++) {
        while (nb < width) {
            acc |= (uint64_t)(*p++) << nb;
            nb += 8;
        }
        c[k] = (uint32_t)(acc & mask);
        acc >>= width;
        nb -= width;
    }
    return p - in;
}

/* The block length: a multiple of 8 values, so every block starts on a whole byte. */
static int64_t block_len(int64_t left) { return left < BLOCK ? left : BLOCK; }

#endif
