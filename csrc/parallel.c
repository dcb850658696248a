/*
 * parallel.c - a step's rows on several threads.
 *
 * A step with many rows (a model's layers x KV heads in one call) splits them into
 * contiguous parts; each part runs on a thread of its own, started for the call and
 * joined before it returns, so the object owns no thread between calls and the C
 * stays re-entrant. Each row is one thread's work and rows share nothing, so the
 * results do not depend on the number of threads.
 */
#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#endif

#include "sh_internal.h"

#if !defined(_WIN32)

/* What one started thread runs. */
typedef struct part_task {
    sh_part_fn fn;
    void *ctx;
    size_t part;
} part_task;

static void *run_task(void *arg)
{
    part_task *task = arg;
    task->fn(task->ctx, task->part);
    return NULL;
}

void sh_run_parts(sh_part_fn fn, void *ctx, size_t parts)
{
    pthread_t threads[SH_MAX_THREADS];
    part_task tasks[SH_MAX_THREADS];
    int started[SH_MAX_THREADS];
    if (parts > SH_MAX_THREADS)
        parts = SH_MAX_THREADS;
    for (size_t t = 1; t < parts; t++) {
        tasks[t].fn = fn;
        tasks[t].ctx = ctx;
        tasks[t].part = t;
        started[t] = pthread_create(&threads[t], NULL, run_task, &tasks[t]) == 0;
    }
    fn(ctx, 0);
    for (size_t t = 1; t < parts; t++) {
        if (started[t])
            pthread_join(threads[t], NULL);
        else
            fn(ctx, t); /* no thread for it: this one does the part */
    }
}

#else /* no POSIX threads here: the parts run one after another */

void sh_run_parts(sh_part_fn fn, void *ctx, size_t parts)
{
    for (size_t t = 0; t < parts; t++)
        fn(ctx, t);
}

#endif
