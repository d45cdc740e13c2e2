/* Split one kernel call over threads (approxdist.kernels): consecutive ranges, one per thread.
 *
 * Every range but the last starts and ends on a multiple of SPLIT_ALIGN values (a multiple
 * of 8), so each range's packed codes start on a whole byte and the bytes are those of one
 * call over the whole tensor. Built with OpenMP (-fopenmp), the ranges run on an OpenMP
 * team: the library needs libgomp.so.1, which the loader finds already loaded by torch, so
 * the team is torch's own intra-op threads (awake, nothing created per call). Without it,
 * pthreads started per call: the calling thread runs the first range, and a thread that
 * cannot be created runs its range on the calling thread instead. Header-only.
 */
#ifndef APPROXDIST_PARALLEL_H
#define APPROXDIST_PARALLEL_H

#include <pthread.h>
#include <stdint.h>

#define SPLIT_ALIGN 2048
#define MAX_THREADS 64
/* fewer values per thread than this: thread start-up would cost more than it saves */
#define MIN_PER_THREAD (1 << 17)

typedef void (*range_fn)(const void *ctx, int64_t lo, int64_t hi);

typedef struct {
    range_fn f;
    const void *ctx;
    int64_t lo, hi;
} part_t;

static void *run_part(void *arg) {
    const part_t *p = (const part_t *)arg;
    p->f(p->ctx, p->lo, p->hi);
    return NULL;
}

/* The ranges a split of [0, n) over at most `threads` threads makes: range i is
 * [b[i], b[i + 1]) (b: MAX_THREADS + 1 entries); returns their count (>= 1). */
static int split_bounds(int64_t n, int threads, int64_t *b) {
    int64_t most = n / MIN_PER_THREAD;
    int t = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if (t > most) t = most < 1 ? 1 : (int)most;
    if (t == 1) {
        b[0] = 0;
        b[1] = n;
        return 1;
    }
    int64_t per = (n + t - 1) / t;
    per = (per + SPLIT_ALIGN - 1) / SPLIT_ALIGN * SPLIT_ALIGN;
    const int count = (int)((n + per - 1) / per); /* 2..t: n >= 2 * MIN_PER_THREAD here */
    for (int i = 0; i <= count; i++) b[i] = i * per < n ? i * per : n;
    return count;
}

/* which of the `count` ranges of split_bounds `b` starts at `lo` */
static int split_part(const int64_t *b, int count, int64_t lo) {
    int p = 0;
    while (p + 1 < count && b[p + 1] <= lo) p++;
    return p;
}

/* Call f(ctx, lo, hi) over [0, n) with at most `threads` threads (the ranges of split_bounds). */
static void split_run(range_fn f, const void *ctx, int64_t n, int threads) {
    int64_t b[MAX_THREADS + 1];
    const int count = split_bounds(n, threads, b);
    if (count == 1) {
        f(ctx, 0, n);
        return;
    }
#if defined(_OPENMP)
#pragma omp parallel for num_threads(count) schedule(static, 1)
    for (int i = 0; i < count; i++) f(ctx, b[i], b[i + 1]);
#else
    part_t parts[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int i = 0; i < count; i++) parts[i] = (part_t){f, ctx, b[i], b[i + 1]};
    for (int i = 1; i < count; i++)
        started[i] = pthread_create(&ids[i], NULL, run_part, &parts[i]) == 0;
    run_part(&parts[0]);
    for (int i = 1; i < count; i++) {
        if (started[i]) pthread_join(ids[i], NULL);
        else run_part(&parts[i]);
    }
#endif
}

/* Which threads split_run uses (the bench's header prints it). */
static const char *split_threads(void) {
#if defined(_OPENMP)
    return "OpenMP threads";
#else
    return "pthreads per call";
#endif
}

#endif
