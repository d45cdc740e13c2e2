/* A bucket's bit-packed compressors in one call a phase: quantize.c's and table.c's kernels over each member (approxdist.kernels).
 *
 * A GatheredTogether bucket (comm/compressors/gathered_together.py) of QSGD, TernGrad or the
 * sign methods made one ctypes call and 20-30 small torch ops per member and phase (the
 * scale, the payload's views, the table of code values): on ResNet-56's 56 matrices that
 * per-tensor cost was ~6x the work on the values. Each entry point here takes `count`
 * members as arrays (a pointer per member into its values, payload or result; its length;
 * its scale or key) and calls the one-tensor kernel on each in member order, so every byte
 * and every value is the one a call per member writes. The members' own scales come from
 * torch ops on all of them at once (comm/compressors/packed_bucket.py). A NULL output
 * pointer skips a member (one whose scale the caller sends by the torch path).
 */
#include <stddef.h>
#include <stdint.h>

float ad_feedback_sum(const float *g, float *e, float *sums, int64_t n, int threads);
float ad_square_sum(const float *x, float *sums, int64_t n, int threads);
uint32_t ad_max_magnitude(const float *x, int64_t n, int threads);
void ad_sign_encode(const float *x, int64_t n, const float *values, float *residual,
                    uint8_t *out, int threads);
void ad_qsgd_encode(const float *x, int64_t n, float scale, int32_t levels, uint32_t key,
                    int width, uint8_t *out, int threads);
void ad_terngrad_encode(const float *x, int64_t n, float scale, uint32_t key, uint8_t *out,
                        int threads);
void ad_table_decode(const uint8_t *in, int64_t n, const float *values, const float *rows,
                     int bits, float *y, int add, int threads, int stream);

/* sign+ef's first pass a member: e[i] = g[i] + e[i] (g NULL: e only read) and the fixed-order
 * sum of |e[i]| into totals[i] (`sums`: work space for the longest member) */
void ad_bucket_feedback_sum(int64_t count, float *const *g, float *const *e, const int64_t *n,
                            float *sums, float *totals, int threads) {
    for (int64_t i = 0; i < count; i++)
        totals[i] = ad_feedback_sum(g == NULL ? NULL : g[i], e[i], sums, n[i], threads);
}

/* QSGD's squared norm a member, into totals[i] */
void ad_bucket_square_sum(int64_t count, float *const *x, const int64_t *n, float *sums,
                          float *totals, int threads) {
    for (int64_t i = 0; i < count; i++) totals[i] = ad_square_sum(x[i], sums, n[i], threads);
}

/* TernGrad's max |x| a member, as its bit pattern, into most[i] */
void ad_bucket_max_magnitude(int64_t count, float *const *x, const int64_t *n, uint32_t *most,
                             int threads) {
    for (int64_t i = 0; i < count; i++) most[i] = ad_max_magnitude(x[i], n[i], threads);
}

/* the sign bits a member; with `values` (two a member) and `residual`, also residual[i] =
 * x[i] - values[code] */
void ad_bucket_sign_encode(int64_t count, float *const *x, const int64_t *n,
                           const float *values, float *const *residual, uint8_t *const *out,
                           int threads) {
    for (int64_t i = 0; i < count; i++)
        if (out[i] != NULL)
            ad_sign_encode(x[i], n[i], values == NULL ? NULL : values + 2 * i,
                           residual == NULL ? NULL : residual[i], out[i], threads);
}

void ad_bucket_qsgd_encode(int64_t count, float *const *x, const int64_t *n, const float *scale,
                           int32_t levels, const uint32_t *key, int width, uint8_t *const *out,
                           int threads) {
    for (int64_t i = 0; i < count; i++)
        if (out[i] != NULL)
            ad_qsgd_encode(x[i], n[i], scale[i], levels, key[i], width, out[i], threads);
}

void ad_bucket_terngrad_encode(int64_t count, float *const *x, const int64_t *n,
                               const float *scale, const uint32_t *key, uint8_t *const *out,
                               int threads) {
    for (int64_t i = 0; i < count; i++)
        if (out[i] != NULL) ad_terngrad_encode(x[i], n[i], scale[i], key[i], out[i], threads);
}

/* y[i] = the sum over the `world` workers, in worker order, of values[code] of member i's codes
 * in[i * world + w] (values: 2^bits a member and worker, in the same order) */
void ad_bucket_decode(int64_t count, int world, const uint8_t *const *in, const int64_t *n,
                      const float *values, int bits, float *const *y, int threads) {
    const int64_t table = (int64_t)1 << bits;
    for (int64_t i = 0; i < count; i++)
        for (int w = 0; w < world; w++) {
            const int64_t at = i * world + w;
            ad_table_decode(in[at], n[i], values + at * table, NULL, bits, y[i], w > 0,
                            threads, -1);
        }
}
