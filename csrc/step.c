/*
 * step.c - a decode step over every row: sh_policy_step, sh_policy_step_rows (and
 * sh_step, their shared work, which pools.c admits through, and sh_check_step, the
 * checks the two share).
 *
 * Everything is checked first (the weights of every row, on the part's threads);
 * then each row is stepped on its own by one thread (parallel.c): the kind's update
 * applies the weights, the new position joins, and rows over budget evict through
 * the kind's eviction. A row evicting one position with plain values (the steady
 * state) is fused: the pass that applies the weights also finds the row's
 * least-valued evictable slot, and only the slots after the victim move.
 */
#include <stdlib.h>
#include <string.h>

#include "sh_internal.h"

/* A step's work, shared by the threads that do it: part t handles rows
   [first_row[t], first_row[t + 1]), writing its victims from first_victim[t] on. */
typedef struct step_job {
    sh_policy *p;
    const sh_kind_ops *ops;
    int32_t dtype;
    const char *attn;     /* row h's weights at attn + h * row_bytes, or NULL */
    size_t row_bytes;
    size_t n;             /* weights per row */
    uint32_t most, least; /* the rows' largest and smallest counts */
    uint64_t held_all;    /* positions held by all rows */
    int admit;            /* pos joins every row */
    int scores_change;    /* the weights change the values */
    int evicts;           /* rows over budget evict */
    uint32_t pos;
    uint32_t budget;
    uint32_t *victims;
    int64_t *slots;
    uint32_t *row_victims; /* per-row victim counts (sh_policy_step_rows), or NULL */
    int simd;
    size_t first_row[SH_MAX_THREADS + 1];
    size_t first_victim[SH_MAX_THREADS];
    int valid[SH_MAX_THREADS];
} step_job;

/* Victims row h evicts in this step (its count before the step is given). */
static size_t row_evicts(const step_job *job, size_t held)
{
    size_t after = held + (size_t)job->admit;
    return (job->evicts && after > job->budget) ? after - job->budget : 0;
}

/* ---------------------------------------------------------------- the rows' work */

/* Checks every weight part t's rows read. */
static void validate_part(void *ctx, size_t t)
{
    step_job *job = ctx;
    size_t a = job->first_row[t], b = job->first_row[t + 1];
    int ok = 1;
    if (job->least == job->most) { /* every row reads all n: one pass over the part's */
        ok = sh_weights_valid(job->dtype, job->attn + a * job->row_bytes, (b - a) * job->n,
                              job->simd);
    } else {
        for (size_t h = a; h < b && ok; h++)
            ok = sh_weights_valid(job->dtype, job->attn + h * job->row_bytes,
                                  job->p->counts[h], job->simd);
    }
    job->valid[t] = ok;
}

/* The fused single-victim step of row h, which holds n >= 1 slots and gets one
   victim: the pass that applies the weights also finds the least slot among the
   evictable ones, and only the slots after the victim move (once, with pos taking
   the freed last slot). The evictable slots after the admission are [lo, hi) of
   n + 1, the new slot n (value 0) among them when there is no recent window: it goes
   only when every older candidate holds more (ties go to the lower slot). */
static void fused_step_row(const step_job *job, size_t h, size_t n, const char *attn,
                           uint32_t *victim, int64_t *slot, sh_steady_undo *undo)
{
    sh_policy *p = job->p;
    const sh_kind_ops *ops = job->ops;
    size_t lo = p->sinks < n + 1 ? p->sinks : n + 1;
    size_t hi = n + 1 - p->recent_window;
    size_t top = hi < n ? hi : n; /* the older slots among the evictable ones */
    size_t at = ops->update(p, h, job->dtype, attn, n, lo, top, job->simd);
    if (hi == n + 1 && !(at < top && sh_value_is_zero(ops, p, h, at))) {
        /* The newcomer goes at once: the row is as the weights left it. */
        *victim = job->pos;
        if (slot != NULL)
            *slot = (int64_t)n;
        if (undo != NULL)
            undo->at = (uint32_t)n;
        return;
    }
    uint32_t *pos = sh_row_positions(p, h);
    size_t vb = sh_value_bytes(ops);
    char *vals = (char *)p->values + h * p->capacity * vb;
    *victim = pos[at];
    if (slot != NULL)
        *slot = (int64_t)at;
    if (undo != NULL) {
        undo->at = (uint32_t)at;
        undo->pos = pos[at];
        memcpy(&undo->vote, vals + at * vb, sizeof undo->vote); /* a vote: SH_VALUES_U32 */
    }
    memmove(pos + at, pos + at + 1, (n - at - 1) * sizeof *pos);
    memmove(vals + at * vb, vals + (at + 1) * vb, (n - at - 1) * vb);
    sh_put_slot(ops, p, h, n - 1, job->pos);
}

/* Whether row h, holding n before the step, has a pinned slot among those the fused
   step could evict: the older evictable ones, or the newcomer when no recent window
   keeps it. */
static int pinned_candidate(const step_job *job, size_t h, size_t n)
{
    const sh_policy *p = job->p;
    if (p->pins == NULL)
        return 0;
    size_t lo = p->sinks < n + 1 ? p->sinks : n + 1;
    size_t hi = n + 1 - p->recent_window, end;
    size_t top = hi < n ? hi : n;
    return (lo < top && sh_next_pinned(p, h, lo, top, &end) < top)
           || (hi == n + 1 && sh_is_pinned(p, job->pos));
}

/* Applies the step to row h, writing its victims from victims + at. */
static void step_row(step_job *job, size_t h, size_t at)
{
    sh_policy *p = job->p;
    const sh_kind_ops *ops = job->ops;
    size_t held = p->counts[h];
    size_t k = row_evicts(job, held);
    uint32_t *victims = job->victims + at;
    int64_t *slots = job->slots == NULL ? NULL : job->slots + at;
    if (job->row_victims != NULL)
        job->row_victims[h] = (uint32_t)k;
    if (job->scores_change && k == 1 && held != 0 && sh_plain_values(ops, p)
        && !pinned_candidate(job, h, held)) {
        fused_step_row(job, h, held, job->attn + h * job->row_bytes, victims, slots, NULL);
        return;
    }
    if (job->scores_change)
        sh_update_row(ops, p, h, job->dtype, job->attn + h * job->row_bytes, held, 0, 0,
                      job->simd);
    if (job->admit)
        sh_put_slot(ops, p, h, held++, job->pos);
    if (k != 0)
        ops->evict(ops, p, h, held, k, victims, slots, job->simd);
    p->counts[h] = (uint32_t)(held - k);
}

/* Applies the step to part t's rows. */
static void step_part(void *ctx, size_t t)
{
    step_job *job = ctx;
    size_t at = job->first_victim[t];
    for (size_t h = job->first_row[t]; h < job->first_row[t + 1]; h++) {
        size_t held = job->p->counts[h];
        step_row(job, h, at);
        at += row_evicts(job, held);
    }
}

/* ---------------------------------------------------------------- the call */

int sh_check_step(const sh_policy *p, int32_t flags, uint32_t pos, uint32_t budget)
{
    if (flags < 1 || flags > (SH_STEP_ADMIT | SH_STEP_EVICT))
        return SH_ERR_ARG;
    if ((flags & SH_STEP_ADMIT) != 0 && pos <= p->last_position)
        return SH_ERR_POSITION;
    if ((flags & SH_STEP_EVICT) == 0)
        return SH_OK;
    if (p->recent_window < sh_ops(p)->min_recent_window)
        return SH_ERR_ARG;
    if (budget < 1)
        return SH_ERR_BUDGET;
    if ((uint64_t)p->recent_window + p->sinks >= budget)
        return SH_ERR_BUDGET;
    return SH_OK;
}

/* Fills job for a call whose arguments passed sh_check_step. */
static void start_job(step_job *job, sh_policy *p, int32_t flags, uint32_t pos,
                      int32_t dtype, const void *attn, size_t n, uint32_t budget)
{
    const sh_kind_ops *ops = sh_ops(p);
    int admit = (flags & SH_STEP_ADMIT) != 0;
    int scores_change = admit && dtype != SH_DTYPE_NONE && ops->update != NULL;
    job->p = p;
    job->ops = ops;
    job->dtype = scores_change ? dtype : SH_DTYPE_NONE;
    job->attn = scores_change ? attn : NULL;
    job->row_bytes = scores_change ? n * sh_dtype_size(dtype) : 0;
    job->n = n;
    job->most = job->least = p->counts[0];
    job->held_all = 0;
    for (size_t h = 0; h < p->heads; h++) {
        uint32_t c = p->counts[h];
        job->most = c > job->most ? c : job->most;
        job->least = c < job->least ? c : job->least;
        job->held_all += c;
    }
    job->admit = admit;
    job->scores_change = scores_change;
    job->evicts = (flags & SH_STEP_EVICT) != 0 && ops->evict != NULL;
    job->pos = pos;
    job->budget = budget;
    job->simd = sh_simd_active();
}

/* How many parts (threads) the job's rows use, and the rows of each: contiguous,
   about equal in number; one part below SH_PARALLEL_MIN_SLOTS positions. */
static size_t plan_parts(step_job *job)
{
    size_t rows = job->p->heads;
    size_t parts = job->p->threads;
    if (parts > rows)
        parts = rows;
    if (parts < 2 || job->held_all < SH_PARALLEL_MIN_SLOTS)
        parts = 1;
    for (size_t t = 0; t <= parts; t++)
        job->first_row[t] = rows * t / parts;
    return parts;
}

/* The attention's presence, shape and values (every weight a row reads). */
static int check_weights(step_job *job, const void *attn, size_t heads, int ragged,
                         size_t parts, int checked)
{
    if (attn == NULL)
        return SH_ERR_ARG;
    if (heads != job->p->heads)
        return SH_ERR_LENGTH;
    if (job->n != job->most)
        return (ragged && job->least != job->most) ? SH_ERR_RAGGED : SH_ERR_LENGTH;
    if (checked) /* the caller's pass that wrote them found them valid */
        return SH_OK;
    if (parts > 1)
        sh_run_parts(validate_part, job, parts);
    else
        validate_part(job, 0);
    for (size_t t = 0; t < parts; t++) {
        if (!job->valid[t])
            return SH_ERR_WEIGHT;
    }
    return SH_OK;
}

/* The victims of the step: *k0 row 0's (every row's when they must agree), *total
   all rows'. SH_ERR_RAGGED when they must agree (ragged) and do not. */
static int count_victims(const step_job *job, int ragged, uint64_t *k0, uint64_t *total)
{
    *k0 = *total = 0;
    if (!job->evicts)
        return SH_OK;
    if (job->least == job->most) { /* every row evicts the same k0 */
        *k0 = row_evicts(job, job->most);
        *total = *k0 * job->p->heads;
        return SH_OK;
    }
    for (size_t h = 0; h < job->p->heads; h++) {
        uint64_t k = row_evicts(job, job->p->counts[h]);
        if (h == 0)
            *k0 = k;
        else if (ragged && k != *k0)
            return SH_ERR_RAGGED;
        *total += k;
    }
    return SH_OK;
}

/* Steps every row, part by part; returns the victims written. Cannot fail. */
static size_t run_job(step_job *job, size_t parts)
{
    size_t at = 0;
    for (size_t t = 0; t < parts; t++) {
        job->first_victim[t] = at;
        for (size_t h = job->first_row[t]; h < job->first_row[t + 1]; h++)
            at += row_evicts(job, job->p->counts[h]);
    }
    if (parts > 1)
        sh_run_parts(step_part, job, parts);
    else
        step_part(job, 0);
    return at;
}

int sh_step(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype, const void *attn,
            size_t heads, size_t n, uint32_t budget, uint32_t *victims, int64_t *slots,
            size_t victims_cap, uint32_t *row_victims, size_t *n_victims, int checked)
{
    if (p == NULL || n_victims == NULL)
        return SH_ERR_ARG;
    int rc = sh_check_step(p, flags, pos, budget);
    if (rc != SH_OK)
        return rc;
    int admit = (flags & SH_STEP_ADMIT) != 0;
    if (admit && dtype != SH_DTYPE_NONE && dtype != SH_DTYPE_F32 && dtype != SH_DTYPE_F64)
        return SH_ERR_ARG;
    step_job job;
    start_job(&job, p, flags, pos, dtype, attn, n, budget);
    job.victims = victims;
    job.slots = slots;
    job.row_victims = row_victims;
    size_t parts = plan_parts(&job);
    int ragged = row_victims == NULL; /* every row must evict the same number */
    if (job.scores_change && (rc = check_weights(&job, attn, heads, ragged, parts, checked)) != SH_OK)
        return rc;
    uint64_t k0, total;
    if ((rc = count_victims(&job, ragged, &k0, &total)) != SH_OK)
        return rc;
    /* At the configured budget or above, the spans' own check leaves every row enough. */
    if (total != 0 && budget < p->budget && (rc = sh_check_pins(p, admit, pos, budget)) != SH_OK)
        return rc;
    if (total != 0 && (victims == NULL || victims_cap < total))
        return SH_ERR_BUFFER;
    if (admit && (rc = sh_ensure_capacity(p, (uint64_t)job.most + 1)) != SH_OK)
        return rc;

    /* Nothing below can fail. */
    size_t at = run_job(&job, parts);
    if (admit)
        p->last_position = pos;
    *n_victims = ragged ? (size_t)k0 : at;
    return SH_OK;
}

int sh_policy_step(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype,
                   const void *attn, size_t heads, size_t n, uint32_t budget,
                   uint32_t *victims, int64_t *slots, size_t victims_cap,
                   size_t *n_victims)
{
    return sh_step(p, flags, pos, dtype, attn, heads, n, budget, victims, slots,
                   victims_cap, NULL, n_victims, 0);
}

int sh_policy_step_rows(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype,
                        const void *attn, size_t heads, size_t n, uint32_t budget,
                        uint32_t *victims, int64_t *slots, size_t victims_cap,
                        uint32_t *row_victims, size_t *n_victims)
{
    if (row_victims == NULL)
        return SH_ERR_ARG;
    return sh_step(p, flags, pos, dtype, attn, heads, n, budget, victims, slots,
                   victims_cap, row_victims, n_victims, 0);
}

int sh_noop_step(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype,
                 const void *attn, size_t heads, size_t n, uint32_t budget,
                 uint32_t *victims, int64_t *slots, size_t victims_cap,
                 size_t *n_victims)
{
    (void)p, (void)flags, (void)pos, (void)dtype, (void)attn, (void)heads, (void)n;
    (void)budget, (void)victims, (void)slots, (void)victims_cap;
    if (n_victims != NULL)
        *n_victims = 0;
    return SH_OK;
}

/* ---------------------------------------------------------------- the steady step */

/* Undoes row h's fused step (n held, u what it recorded, w the weights it applied):
   the victim back in its slot, then each vote the weights added taken off. Exact
   while no vote could saturate (every vote below UINT32_MAX - 1 before the step). */
static void undo_row(sh_policy *p, size_t h, size_t n, const sh_steady_undo *u, const float *w)
{
    uint32_t *pos = sh_row_positions(p, h), *votes = sh_row_votes(p, h);
    if (u->at < n) {
        memmove(pos + u->at + 1, pos + u->at, (n - u->at - 1) * sizeof *pos);
        memmove(votes + u->at + 1, votes + u->at, (n - u->at - 1) * sizeof *votes);
        pos[u->at] = u->pos;
        votes[u->at] = u->vote;
    }
    sh_scissorhands_unvote(votes, w, n);
}

int sh_step_steady(sh_policy *p, uint32_t pos, uint32_t budget, size_t heads, size_t n,
                   const sh_row_source *src, uint32_t *victims, int64_t *slots, size_t victims_cap,
                   size_t *n_victims)
{
    if (p == NULL || src == NULL || n_victims == NULL || victims == NULL || slots == NULL)
        return SH_ERR_ARG;
    const int32_t flags = SH_STEP_ADMIT | SH_STEP_EVICT;
    const sh_kind_ops *ops = sh_ops(p);
    /* Its case: plain Scissorhands votes, no pinned spans, one thread, every row
       holding n and evicting one; anything else (an error included) is the general
       step's, which reports what it reports. */
    if (ops->update != sh_scissorhands_update || !sh_plain_values(ops, p) || p->pins != NULL
        || p->threads > 1 || heads != p->heads || n == 0 || n > UINT32_MAX || victims_cap < heads
        || sh_check_step(p, flags, pos, budget) != SH_OK)
        return SH_STEADY_DECLINED;
    step_job job;
    start_job(&job, p, flags, pos, SH_DTYPE_F32, NULL, n, budget);
    if (job.least != n || job.most != n || row_evicts(&job, n) != 1)
        return SH_STEADY_DECLINED;
    sh_steady_undo *undo = malloc(heads * sizeof *undo);
    if (undo == NULL)
        return SH_STEADY_DECLINED;
    size_t h = 0;
    for (; h < heads; h++) {
        /* The row's votes are read as its weights are made, for the check that no vote
           can saturate (which keeps the row's step undoable); nothing changed yet. */
        uint32_t most = 0;
        const float *w = src->make(src->ctx, h, sh_row_votes(p, h), sh_row_positions(p, h), &most);
        if (w == NULL || most >= UINT32_MAX - 1)
            break;
        fused_step_row(&job, h, n, (const char *)w, victims + h, slots + h, &undo[h]);
        if (src->after != NULL && src->after(src->ctx, h, slots[h]) != 0) {
            undo_row(p, h, n, &undo[h], w);
            break;
        }
    }
    /* The capacity the general step makes sure of (this one writes within each row's
       n slots), once every row stepped, so that a declined step leaves it as it was. */
    int stepped = h == heads && sh_ensure_capacity(p, (uint64_t)n + 1) == SH_OK;
    if (!stepped) { /* declined: every row stepped is undone, in reverse */
        while (h-- > 0) {
            if (src->undo != NULL)
                src->undo(src->ctx, h, slots[h]);
            undo_row(p, h, n, &undo[h], src->make(src->ctx, h, NULL, NULL, NULL));
        }
    }
    free(undo);
    if (!stepped)
        return SH_STEADY_DECLINED;
    p->last_position = pos;
    *n_victims = 1;
    return SH_OK;
}
