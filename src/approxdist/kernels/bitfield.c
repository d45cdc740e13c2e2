/* Fused bit-field kernels for `bits:` codecs (approxdist.kernels).
 *
 * A layout is up to 4 runs of kept fp32 bits. Run i moves bits by shift[i]: the code of
 * a value v is OR_i ((v >> shift[i]) & mask[i]) with mask[i] at code position, and the
 * decoded bit pattern of a code c is OR_i ((c & mask[i]) << shift[i]). Unused runs have
 * mask 0 and come last. Codes form the LSB-first bit stream of
 * approxdist.comm.codecs.bitpack (bitpack.h; bytepack.h for codes of at most 8 bits).
 *
 * Plain C99 and pthreads, no torch headers: it compiles in a second or two with any cc
 * (the library, with table.c, in ~5 s at -O3, once per machine). Blocks of BLOCK values go through a small stack buffer so that the bit arithmetic
 * and the packing are separate simple loops the compiler vectorizes; the loops are
 * specialised on the number of runs (most layouts have one or two), so no vector op is
 * spent on an empty run; codes of at most 4 bits decode through a 16-value table held in
 * a register (lookup.h). Each call splits over `threads` threads (parallel.h). No
 * -ffast-math: the fused decode-add is the same IEEE fp32 addition torch does, so results
 * are bit-identical.
 */
#include <stdint.h>
#include <string.h>

#include "bitpack.h"
#include "bytepack.h"
#include "lookup.h"
#include "parallel.h"
#include "traffic.h"

typedef struct {
    uint32_t shift[4];
    uint32_t mask[4];
} layout_t;

static int run_count(const layout_t *l) {
    int r = 0;
    while (r < 4 && l->mask[r]) r++;
    return r;
}

/* the code of v and the bit pattern of code c over the first nr runs; called with a
 * constant nr inside the loops below, so the runs unroll and the loops vectorize */
static inline uint32_t code_of(uint32_t v, const uint32_t *s, const uint32_t *m, int nr) {
    uint32_t acc = 0;
    for (int r = 0; r < nr; r++) acc |= (v >> s[r]) & m[r];
    return acc;
}

static inline uint32_t pattern_of(uint32_t c, const uint32_t *s, const uint32_t *m, int nr) {
    uint32_t acc = 0;
    for (int r = 0; r < nr; r++) acc |= (c & m[r]) << s[r];
    return acc;
}

/* one loop per run count */
#define BY_RUNS(l, LOOP)                                                                    \
    do {                                                                                    \
        const uint32_t s[4] = {(l)->shift[0], (l)->shift[1], (l)->shift[2], (l)->shift[3]}; \
        const uint32_t m[4] = {(l)->mask[0], (l)->mask[1], (l)->mask[2], (l)->mask[3]};     \
        switch (run_count(l)) {                                                             \
        case 1: LOOP(1) break;                                                              \
        case 2: LOOP(2) break;                                                              \
        case 3: LOOP(3) break;                                                              \
        default: LOOP(4) break;                                                             \
        }                                                                                   \
    } while (0)

static void codes8(const uint32_t *restrict x, uint8_t *restrict c, int64_t n, const layout_t *l) {
#define LOOP(NR) for (int64_t k = 0; k < n; k++) c[k] = (uint8_t)code_of(x[k], s, m, NR);
    BY_RUNS(l, LOOP);
#undef LOOP
}

static void codes32(const uint32_t *restrict x, uint32_t *restrict c, int64_t n, const layout_t *l) {
#define LOOP(NR) for (int64_t k = 0; k < n; k++) c[k] = code_of(x[k], s, m, NR);
    BY_RUNS(l, LOOP);
#undef LOOP
}

/* y = (or += with `add`) the fp32 values of n codes stored as `ctype` */
#define LOOP_SET(NR) for (int64_t k = 0; k < n; k++) y[k] = pattern_of(c[k], s, m, NR);
#define LOOP_ADD(NR)                                                                \
    for (int64_t k = 0; k < n; k++) {                                               \
        uint32_t p = pattern_of(c[k], s, m, NR);                                    \
        float v;                                                                    \
        memcpy(&v, &p, sizeof v);                                                   \
        f[k] += v;                                                                  \
    }
#define DECODE_CODES(ctype, name)                                                   \
    static void name(const ctype *restrict c, uint32_t *restrict y, int64_t n,      \
                     const layout_t *l, int add) {                                  \
        float *restrict f = (float *)y;                                             \
        if (add) BY_RUNS(l, LOOP_ADD);                                              \
        else BY_RUNS(l, LOOP_SET);                                                  \
    }
DECODE_CODES(uint8_t, values8)
DECODE_CODES(uint32_t, values32)
#undef LOOP_SET
#undef LOOP_ADD

typedef struct {
    const uint8_t *in;
    uint8_t *out;
    const uint32_t *x;
    uint32_t *y;
    const layout_t *l;
    int width, add, stream;
} job_t;

static void encode_range(const void *arg, int64_t lo, int64_t hi) {
    const job_t *j = (const job_t *)arg;
    const uint32_t *x = j->x + lo;
    uint8_t *out = j->out + lo * j->width / 8;
    const int w = j->width;
    uint8_t c8[BLOCK];
    uint32_t c32[BLOCK];
    for (int64_t k = 0, m; k < hi - lo; k += m) {
        m = ahead_block(x + k, hi - lo - k);
        if (w == 8) { /* the codes are the payload */
            codes8(x + k, out + k, m, j->l);
            continue;
        }
        if (w < 8 && BYTEPACK_LE) {
            codes8(x + k, c8, m, j->l);
            out += pack8(c8, m, w, out);
        } else {
            codes32(x + k, c32, m, j->l);
            out += pack(c32, m, w, out);
        }
    }
}

/* the values [lo, hi) into y (y[0]: value lo) */
static void decode_part(const void *arg, int64_t lo, int64_t hi, void *out) {
    const job_t *j = (const job_t *)arg;
    uint32_t *y = (uint32_t *)out;
    const uint8_t *in = j->in + lo * j->width / 8;
    const int w = j->width;
    if (w == 8) {
        values8(in, y, hi - lo, j->l, j->add);
        return;
    }
    uint8_t c8[BLOCK];
    uint32_t c32[BLOCK];
    if (w <= 4 && BYTEPACK_LE) { /* at most 16 decoded values: look them up in registers */
        float tab[16] = {0};
        for (uint32_t c = 0; c < 1u << w; c++) {
            const uint32_t p = pattern_of(c, j->l->shift, j->l->mask, 4);
            memcpy(&tab[c], &p, sizeof p);
        }
        for (int64_t k = 0; k < hi - lo; k += BLOCK) {
            const int64_t m = block_len(hi - lo - k);
            in += unpack8(in, m, w, c8);
            lookup16(c8, m, tab, (float *)y + k, j->add);
        }
        return;
    }
    for (int64_t k = 0; k < hi - lo; k += BLOCK) {
        int64_t m = block_len(hi - lo - k);
        if (w < 8 && BYTEPACK_LE) {
            in += unpack8(in, m, w, c8);
            values8(c8, y + k, m, j->l, j->add);
        } else {
            in += unpack(in, m, w, c32);
            values32(c32, y + k, m, j->l, j->add);
        }
    }
}

static void decode_range(const void *arg, int64_t lo, int64_t hi) {
    const job_t *j = (const job_t *)arg;
    decode_through(decode_part, j, lo, hi, (float *)j->y, j->stream);
}

void ad_bits_encode(const uint32_t *x, int64_t n, const layout_t *l, int width, uint8_t *out,
                    int threads) {
    job_t j = {NULL, out, x, NULL, l, width, 0, 0};
    split_run(encode_range, &j, n, threads);
}

void ad_bits_decode(const uint8_t *in, int64_t n, const layout_t *l, int width, uint32_t *y,
                    int threads, int stream) {
    job_t j = {in, NULL, NULL, y, l, width, 0, stream_output(n, 0, stream)};
    split_run(decode_range, &j, n, threads);
}

void ad_bits_decode_add(const uint8_t *in, int64_t n, const layout_t *l, int width, float *y,
                        int threads) {
    job_t j = {in, NULL, NULL, (uint32_t *)y, l, width, 1, 0};
    split_run(decode_range, &j, n, threads);
}
