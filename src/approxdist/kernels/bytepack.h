/* LSB-first bit packing of codes of 1..8 bits held one per byte (approxdist.kernels).
 *
 * The same stream as bitpack.h (code i at stream bits [i*w, (i+1)*w)), from and to one
 * byte per code, which keeps the code buffers small and lets the compiler vectorize the
 * loops: for widths dividing 8 each group of 8/w code bytes, read as one 16-, 32- or
 * 64-bit word, folds into one packed byte with shifts and ORs (no per-code branch, no
 * table); other widths fold 8 code bytes into w packed bytes, and where the CPU has AVX-512
 * VBMI pack (widths 3, 5, 6: pack_vbmi) and unpack (unpack_vbmi) 64 codes at once. Little-endian hosts only (the kernels'
 * callers check `BYTEPACK_LE`); header-only.
 */
#ifndef APPROXDIST_BYTEPACK_H
#define APPROXDIST_BYTEPACK_H

#include <stdint.h>
#include <string.h>

#include "bitpack.h" /* BLOCK */

#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

#define BYTEPACK_LE (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)

static uint64_t load_n(const uint8_t *in, int64_t nbytes) {
    uint64_t v = 0;
    memcpy(&v, in, (size_t)nbytes); /* little-endian: byte i is bits 8i.. */
    return v;
}

/* 8 code bytes (each < 2^w, w < 8) -> their 8w-bit stream in the low bits */
static uint64_t fold8(uint64_t u, int w) {
    u = (u & 0x00FF00FF00FF00FFull) | ((u & 0xFF00FF00FF00FF00ull) >> (8 - w));
    u = (u & 0x0000FFFF0000FFFFull) | ((u & 0xFFFF0000FFFF0000ull) >> (16 - 2 * w));
    return (u & 0xFFFFFFFFull) | ((u >> 32) << (4 * w));
}

/* the inverse of fold8 (bits above 8w ignored) */
static uint64_t unfold8(uint64_t u, int w) {
    u &= (1ull << (8 * w)) - 1;
    const uint64_t m1 = (1ull << w) - 1, m2 = (1ull << (2 * w)) - 1, m4 = (1ull << (4 * w)) - 1;
    u = (u & m4) | ((u >> (4 * w)) << 32);
    u = (u & (m2 | m2 << 32)) | ((u & ((m4 & ~m2) | (m4 & ~m2) << 32)) << (16 - 2 * w));
    const uint64_t lo = m1 * 0x0001000100010001ull, hi = (m2 & ~m1) * 0x0001000100010001ull;
    return (u & lo) | ((u & hi) << (8 - w));
}

/* The first groups (of 8 codes of w = 3, 5 or 6 bits) of `full` packed 8 groups at a time
 * where the CPU has AVX-512 VBMI: neighbouring codes joined by multiply-adds (c0 + c1 * 2^w,
 * then pairs of those times 2^2w), pairs of 32-bit halves into each 64-bit lane (its 8w-bit
 * stream), the lanes' w bytes moved together (vpermb) and stored exactly (a masked store);
 * returns the groups done (0 without, and for other widths). */
static int64_t pack_vbmi(const uint8_t *restrict c, int64_t full, int w, uint8_t *restrict out) {
    int64_t g = 0;
#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
    /* output byte k <- byte k mod w of lane k / w (w <= 6: 2^w fits a signed byte) */
    static const uint8_t from3[64] = {
        0, 1, 2, 8, 9, 10, 16, 17, 18, 24, 25, 26, 32, 33, 34, 40, 41, 42, 48, 49, 50, 56, 57,
        58};
    static const uint8_t from5[64] = {
        0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 16, 17, 18, 19, 20, 24, 25, 26, 27, 28, 32, 33, 34, 35,
        36, 40, 41, 42, 43, 44, 48, 49, 50, 51, 52, 56, 57, 58, 59, 60};
    static const uint8_t from6[64] = {
        0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, 16, 17, 18, 19, 20, 21, 24, 25, 26, 27, 28, 29,
        32, 33, 34, 35, 36, 37, 40, 41, 42, 43, 44, 45, 48, 49, 50, 51, 52, 53, 56, 57, 58, 59,
        60, 61};
    const uint8_t *from = w == 3 ? from3 : w == 5 ? from5 : w == 6 ? from6 : NULL;
    if (from == NULL) return 0;
    const __m512i perm = _mm512_loadu_si512(from), low = _mm512_set1_epi64(0xFFFFFFFF);
    const __m512i pairs = _mm512_set1_epi16((short)((1 << w) << 8 | 1));
    const __m512i quads = _mm512_set1_epi32((1 << 2 * w) << 16 | 1);
    const __m128i half = _mm_cvtsi32_si128(4 * w);
    const __mmask64 store = (1ull << (8 * w)) - 1;
    for (; g + 8 <= full; g += 8) {
        const __m512i d = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_loadu_si512(c + 8 * g),
                                                                  pairs), quads);
        const __m512i q = _mm512_or_si512(_mm512_and_si512(d, low),
                                          _mm512_sll_epi64(_mm512_srli_epi64(d, 32), half));
        _mm512_mask_storeu_epi8(out + g * w, store, _mm512_permutexvar_epi8(perm, q));
    }
#else
    (void)c, (void)full, (void)w, (void)out;
#endif
    return g;
}

/* Pack n <= BLOCK code bytes into `out`; returns bytes written ((n*w + 7) / 8, the last
 * byte zero-padded). */
static int64_t pack8(const uint8_t *restrict c, int64_t n, int w, uint8_t *restrict out) {
    int64_t b = 0, full = n / 8; /* whole groups of 8 codes */
    if (w == 8) {
        memcpy(out, c, (size_t)n);
        return n;
    } else if (w == 4) {
        for (b = 0; b < n / 2; b++) {
            uint16_t u;
            memcpy(&u, c + 2 * b, 2);
            out[b] = (uint8_t)(u | (u >> 4));
        }
        b = n / 2 * 2;
    } else if (w == 2) {
        for (b = 0; b < n / 4; b++) {
            uint32_t u;
            memcpy(&u, c + 4 * b, 4);
            u |= u >> 6;
            out[b] = (uint8_t)(u | (u >> 12));
        }
        b = n / 4 * 4;
    } else if (w == 1) {
        for (b = 0; b < full; b++) {
            uint64_t u;
            memcpy(&u, c + 8 * b, 8);
            u |= u >> 7;
            u |= u >> 14;
            out[b] = (uint8_t)(u | (u >> 28));
        }
        b = full * 8;
    } else {
        /* fold all groups first (a vectorized loop), then store 8 bytes per group, of which
         * w are kept (the next group overwrites the rest); the groups whose 8 bytes would
         * pass this call's end are stored exactly: another thread may write the next bytes */
        uint64_t folded[BLOCK / 8];
        const int64_t done = pack_vbmi(c, full, w, out);
        for (int64_t g = done; g < full; g++) folded[g] = fold8(load_n(c + 8 * g, 8), w);
        const int64_t spill = full - (8 + w - 1) / w, safe = spill > done ? spill : done;
        for (int64_t g = done; g < safe; g++) memcpy(out + g * w, &folded[g], 8);
        for (int64_t g = safe; g < full; g++) memcpy(out + g * w, &folded[g], (size_t)w);
        b = full * 8;
    }
    if (b < n) { /* the last codes: fewer than one group */
        uint64_t acc = 0;
        for (int64_t k = b; k < n; k++) acc |= (uint64_t)c[k] << ((k - b) * w);
        int64_t at = b * w / 8, tail = ((n - b) * w + 7) / 8;
        memcpy(out + at, &acc, (size_t)tail);
    }
    return (n * w + 7) / 8;
}

/* Pack n <= BLOCK codes of w bits held as 32-bit words (narrowed into `c8` first where
 * w <= 8 and the host is little-endian); returns bytes written. */
static int64_t pack_words(const uint32_t *restrict c, int64_t n, int w, uint8_t *restrict c8,
                          uint8_t *restrict out) {
    if (w > 8 || !BYTEPACK_LE) return pack(c, n, w, out);
    for (int64_t k = 0; k < n; k++) c8[k] = (uint8_t)c[k];
    return pack8(c8, n, w, out);
}

/* The first groups (of 8 codes of w < 8 bits, w bytes each) of `full`, 8 groups at a time where
 * the CPU has AVX-512 VBMI: the 8w bytes loaded exactly (a masked load), each group's w bytes
 * moved into a 64-bit lane of its own (vpermb), code k of a lane taken from its bits
 * [kw, kw + 8) (vpmultishiftqb) and masked to w bits; returns the groups done (0 without). */
static int64_t unpack_vbmi(const uint8_t *restrict in, int64_t full, int w,
                           uint8_t *restrict c) {
    int64_t g = 0;
#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
    /* byte j of lane g: from byte gw + j (at most 7w + 7 < 64), its code from bit jw */
    const long long ones = 0x0101010101010101ll, w8 = w * ones;
    const __m512i perm = _mm512_add_epi8(_mm512_set1_epi64(0x0706050403020100ll),
                                         _mm512_set_epi64(7 * w8, 6 * w8, 5 * w8, 4 * w8,
                                                          3 * w8, 2 * w8, w8, 0));
    const __m512i shift = _mm512_set1_epi64(w * 0x0706050403020100ll);
    const __m512i mask = _mm512_set1_epi8((char)((1 << w) - 1));
    const __mmask64 load = (1ull << (8 * w)) - 1;
    for (; g + 8 <= full; g += 8) {
        const __m512i v = _mm512_maskz_loadu_epi8(load, in + g * w);
        const __m512i codes = _mm512_multishift_epi64_epi8(shift, _mm512_permutexvar_epi8(perm, v));
        _mm512_storeu_si512(c + 8 * g, _mm512_and_si512(codes, mask));
    }
#else
    (void)in, (void)full, (void)w, (void)c;
#endif
    return g;
}

/* Unpack n <= BLOCK codes of w bits from `in` into one byte each; returns bytes consumed. */
static int64_t unpack8(const uint8_t *restrict in, int64_t n, int w, uint8_t *restrict c) {
    int64_t b = 0, full = n / 8;
    if (w == 8) {
        memcpy(c, in, (size_t)n);
        return n;
    } else if (w == 4) {
        for (b = 0; b < n / 2; b++) {
            uint16_t u = (uint16_t)((in[b] | (in[b] << 4)) & 0x0F0F);
            memcpy(c + 2 * b, &u, 2);
        }
        b = n / 2 * 2;
    } else if (w == 2) {
        for (b = 0; b < n / 4; b++) {
            uint32_t u = in[b];
            u |= u << 12;
            u = (u | (u << 6)) & 0x03030303u;
            memcpy(c + 4 * b, &u, 4);
        }
        b = n / 4 * 4;
    } else if (w == 1) {
        for (b = 0; b < full; b++) {
            uint64_t u = in[b];
            u |= u << 28;
            u |= u << 14;
            u = (u | (u << 7)) & 0x0101010101010101ull;
            memcpy(c + 8 * b, &u, 8);
        }
        b = full * 8;
    } else {
        /* the groups unpack_vbmi leaves: 8 bytes read per group, w used (exact reads where
         * 8 would pass the end of the codes), then unfolded in a vectorized loop */
        uint64_t packed[BLOCK / 8];
        const int64_t done = unpack_vbmi(in, full, w, c);
        const int64_t spill = full - (8 + w - 1) / w, safe = spill > done ? spill : done;
        for (int64_t g = done; g < safe; g++) memcpy(&packed[g], in + g * w, 8);
        for (int64_t g = safe; g < full; g++) packed[g] = load_n(in + g * w, w);
        for (int64_t g = done; g < full; g++) {
            uint64_t u = unfold8(packed[g], w);
            memcpy(c + 8 * g, &u, 8);
        }
        b = full * 8;
    }
    if (b < n) {
        int64_t at = b * w / 8, tail = ((n - b) * w + 7) / 8;
        uint64_t acc = load_n(in + at, tail);
        for (int64_t k = b; k < n; k++) c[k] = (uint8_t)((acc >> ((k - b) * w)) & ((1u << w) - 1));
    }
    return (n * w + 7) / 8;
}

#endif
