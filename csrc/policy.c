/*
 * policy.c - the policy object: its configuration, its storage (one allocation per
 * per-slot array, rows of `capacity` slots each), growth, the rows' counts, reset and
 * sh_policy_select_rows. What differs between the kinds comes from their entry in
 * sh_kinds (the build's table of the files in policies/).
 */
#include <stdlib.h>
#include <string.h>

#include "sh_internal.h"

_Static_assert(sizeof(struct sh_policy) <= SH_HEADER_BYTES,
               "the header must fit the bytes memory_bytes() reports for it");

/* ---------------------------------------------------------------- counts */

uint32_t sh_max_count(const sh_policy *p)
{
    uint32_t most = 0;
    for (size_t h = 0; h < p->heads; h++)
        most = p->counts[h] > most ? p->counts[h] : most;
    return most;
}

size_t sh_total_count(const sh_policy *p)
{
    size_t total = 0;
    for (size_t h = 0; h < p->heads; h++)
        total += p->counts[h];
    return total;
}

int sh_is_fresh(const sh_policy *p)
{
    if (p->last_position != 0)
        return 0;
    for (size_t h = 0; h < p->heads; h++) {
        if (p->counts[h] != 1)
            return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- storage */

/* The capacity after one growth step: doubling, but stopping at budget + 1 once on
   the way, so that a policy evicting every step holds exactly budget + 1 slots. */
static uint64_t next_capacity(uint64_t capacity, uint64_t budget)
{
    uint64_t target = budget + 1;
    uint64_t doubled = capacity * 2;
    if (capacity < target && doubled > target)
        return target;
    return doubled;
}

/* Allocated arrays of one layout, owned together (the scratch and the vote
   registers live in values). */
typedef struct storage {
    uint32_t *positions;
    void *values;
} storage;

static void storage_free(storage *s)
{
    free(s->positions);
    free(s->values);
}

/* Allocates arrays for heads rows of capacity slots (steps held after the votes when
   with_held, a scratch byte per slot after the values when the kind keeps values,
   and vote registers after that when with_history); all or nothing. */
static int storage_alloc(storage *s, const sh_kind_ops *ops, int with_history, int with_held,
                         size_t heads, size_t capacity)
{
    size_t slots = heads * capacity;
    size_t vb = sh_values_bytes(ops, with_held);
    s->positions = NULL;
    s->values = NULL;
    if (capacity != 0 && slots / capacity != heads)
        return SH_ERR_NOMEM;
    if (slots > SIZE_MAX / 32)
        return SH_ERR_NOMEM;
    size_t value_bytes = slots * (vb + 1);
    if (with_history)
        value_bytes = sh_history_offset(slots, with_held) + slots * sizeof(uint64_t);
    s->positions = malloc(slots * sizeof(uint32_t));
    if (vb != 0)
        s->values = malloc(value_bytes);
    if (s->positions == NULL || (vb != 0 && s->values == NULL)) {
        storage_free(s);
        return SH_ERR_NOMEM;
    }
    return SH_OK;
}

/* Allocates storage laid out as p's, for rows rows of capacity slots. */
static int storage_like(storage *s, const sh_policy *p, size_t rows, size_t capacity)
{
    return storage_alloc(s, sh_ops(p), sh_has_history(p), p->vote_rate, rows, capacity);
}

/* Takes the arrays of s as the policy's, freeing the old ones. */
static void storage_install(sh_policy *p, storage *s)
{
    storage old = { p->positions, p->values };
    storage_free(&old);
    p->positions = s->positions;
    p->values = s->values;
}

/* Copies the held slots of row src of p to row dst of s, laid out for rows rows of
   cap slots. */
static void copy_row(const sh_policy *p, size_t src, storage *s, size_t rows, size_t cap,
                     size_t dst)
{
    size_t n = p->counts[src];
    size_t vb = sh_value_bytes(sh_ops(p));
    memcpy(s->positions + dst * cap, sh_row_positions(p, src), n * sizeof(uint32_t));
    if (vb != 0)
        memcpy((char *)s->values + dst * cap * vb, (char *)p->values + src * p->capacity * vb,
               n * vb);
    if (sh_has_history(p))
        memcpy(sh_history_block(s->values, rows, cap, p->vote_rate) + dst * cap,
               sh_row_history(p, src), n * sizeof(uint64_t));
    if (p->vote_rate)
        memcpy(sh_held_block(s->values, rows, cap) + dst * cap, sh_row_held(p, src),
               n * sizeof(uint32_t));
}

/* Grows every row to hold at least need > capacity slots (one doubling at a time),
   copying what each row holds; on failure (SH_ERR_NOMEM) nothing changes. */
static int grow_capacity(sh_policy *p, uint64_t need)
{
    uint64_t cap = p->capacity;
    while (cap < need)
        cap = next_capacity(cap, p->budget);
    if (cap > UINT32_MAX)
        cap = UINT32_MAX;
    if (cap < need)
        return SH_ERR_NOMEM;
    storage s;
    int rc = storage_like(&s, p, p->heads, (size_t)cap);
    if (rc != SH_OK)
        return rc;
    for (size_t h = 0; h < p->heads; h++)
        copy_row(p, h, &s, p->heads, (size_t)cap, h);
    storage_install(p, &s);
    p->capacity = (uint32_t)cap;
    return SH_OK;
}

int sh_ensure_capacity(sh_policy *p, uint64_t need)
{
    return need <= p->capacity ? SH_OK : grow_capacity(p, need);
}

int sh_policy_fit_capacity(sh_policy *p, uint64_t capacity)
{
    if (p == NULL || capacity < 1 || capacity > UINT32_MAX)
        return SH_ERR_ARG;
    for (size_t h = 0; h < p->heads; h++) {
        if (p->counts[h] > capacity)
            return SH_ERR_ARG;
    }
    if (capacity == p->capacity)
        return SH_OK;
    storage s;
    int rc = storage_like(&s, p, p->heads, (size_t)capacity);
    if (rc != SH_OK)
        return rc;
    for (size_t h = 0; h < p->heads; h++)
        copy_row(p, h, &s, p->heads, (size_t)capacity, h);
    storage_install(p, &s);
    p->capacity = (uint32_t)capacity;
    return SH_OK;
}

/* Every row back to {0} with a zero value (and an empty vote register, no steps
   held). */
static void hold_origin(sh_policy *p)
{
    const sh_kind_ops *ops = sh_ops(p);
    for (size_t h = 0; h < p->heads; h++) {
        sh_put_slot(ops, p, h, 0, 0);
        p->counts[h] = 1;
    }
    p->last_position = 0;
}

/* ---------------------------------------------------------------- lifecycle */

/* Checks cfg against its kind's entry: the kind, heads, budget, the parameters the
   kind takes, their ranges. */
static int check_config(const sh_config *cfg)
{
    int32_t kind = cfg->kind;
    if (kind < 0 || kind >= sh_kind_count || sh_kinds[kind] == NULL)
        return SH_ERR_ARG;
    const sh_kind_ops *ops = sh_kinds[kind];
    if (cfg->heads < 1 || cfg->heads > SH_MAX_HEADS)
        return SH_ERR_ARG;
    if (cfg->budget < 1)
        return SH_ERR_BUDGET;
    if ((cfg->recent_window != 0 && !(ops->takes & SH_TAKES_RECENT_WINDOW))
        || (cfg->sinks != 0 && !(ops->takes & SH_TAKES_SINKS)))
        return SH_ERR_ARG;
    int vote_options = (ops->takes & SH_TAKES_VOTE_OPTIONS) != 0;
    if (cfg->history_window != 0
        && (!vote_options || cfg->history_window > SH_MAX_HISTORY_WINDOW))
        return SH_ERR_ARG;
    if (cfg->vote_rate > 1 || (cfg->vote_rate != 0 && !vote_options))
        return SH_ERR_ARG;
    if (cfg->recent_window < ops->min_recent_window)
        return SH_ERR_ARG;
    if ((uint64_t)cfg->recent_window + cfg->sinks >= cfg->budget)
        return SH_ERR_BUDGET;
    return SH_OK;
}

/* A row's first capacity: the kind's, or min(budget + 1, SH_INITIAL_CAPACITY_LIMIT). */
static uint32_t initial_capacity(const sh_kind_ops *ops, uint32_t budget)
{
    uint64_t cap = (uint64_t)budget + 1;
    if (ops->initial_capacity != 0)
        return ops->initial_capacity;
    return cap > SH_INITIAL_CAPACITY_LIMIT ? SH_INITIAL_CAPACITY_LIMIT : (uint32_t)cap;
}

int sh_policy_new(const sh_config *cfg, sh_policy **out)
{
    if (cfg == NULL || out == NULL)
        return SH_ERR_ARG;
    int rc = check_config(cfg);
    if (rc != SH_OK)
        return rc;
    sh_policy *p = calloc(1, sizeof *p);
    if (p == NULL)
        return SH_ERR_NOMEM;
    p->kind = (int8_t)cfg->kind;
    p->vote_rate = (uint8_t)cfg->vote_rate;
    p->history_window = (uint8_t)cfg->history_window;
    p->threads = 1;
    p->heads = cfg->heads;
    p->budget = cfg->budget;
    p->recent_window = cfg->recent_window;
    p->sinks = cfg->sinks;
    uint32_t cap = initial_capacity(sh_ops(p), cfg->budget);
    p->counts = &p->count;
    if (p->heads > 1) {
        p->counts = malloc(p->heads * sizeof *p->counts);
        if (p->counts == NULL) {
            free(p);
            return SH_ERR_NOMEM;
        }
    }
    storage s;
    if (storage_alloc(&s, sh_ops(p), p->history_window != 0, p->vote_rate, p->heads, cap)
        != SH_OK) {
        if (p->counts != &p->count)
            free(p->counts);
        free(p);
        return SH_ERR_NOMEM;
    }
    p->positions = s.positions;
    p->values = s.values;
    p->capacity = cap;
    hold_origin(p);
    *out = p;
    return SH_OK;
}

void sh_policy_free(sh_policy *p)
{
    if (p == NULL)
        return;
    storage s = { p->positions, p->values };
    storage_free(&s);
    free(p->pins);
    if (p->counts != &p->count)
        free(p->counts);
    free(p);
}

int sh_policy_reset(sh_policy *p)
{
    if (p == NULL)
        return SH_ERR_ARG;
    hold_origin(p);
    return SH_OK;
}

int sh_policy_set_threads(sh_policy *p, uint32_t threads)
{
    if (p == NULL || threads < 1 || threads > SH_MAX_THREADS)
        return SH_ERR_ARG;
    p->threads = (uint8_t)threads;
    return SH_OK;
}

uint32_t sh_policy_threads(const sh_policy *p)
{
    return p == NULL ? 0 : p->threads;
}

/* ---------------------------------------------------------------- sizes */

size_t sh_policy_count(const sh_policy *p)
{
    return p == NULL ? 0 : sh_max_count(p);
}

size_t sh_policy_row_count(const sh_policy *p, size_t head)
{
    return (p == NULL || head >= p->heads) ? 0 : p->counts[head];
}

int sh_policy_counts(const sh_policy *p, uint32_t *counts, size_t cap)
{
    if (p == NULL || counts == NULL)
        return SH_ERR_ARG;
    if (cap < p->heads)
        return SH_ERR_BUFFER;
    memcpy(counts, p->counts, p->heads * sizeof *counts);
    return SH_OK;
}

size_t sh_policy_capacity(const sh_policy *p)
{
    return p == NULL ? 0 : p->capacity;
}

size_t sh_policy_slot_bytes(const sh_policy *p)
{
    if (p == NULL)
        return 0;
    size_t vb = sh_value_bytes(sh_ops(p));
    size_t hb = sh_has_history(p) ? sizeof(uint64_t) : 0;
    size_t rb = p->vote_rate ? sizeof(uint32_t) : 0;
    return sizeof(uint32_t) + vb + (vb != 0 ? 1 : 0) + hb + rb;
}

size_t sh_policy_memory_bytes(const sh_policy *p)
{
    if (p == NULL)
        return 0;
    size_t counts = p->heads > 1 ? (size_t)SH_COUNT_BYTES * p->heads : 0;
    return SH_HEADER_BYTES + counts + (size_t)p->capacity * p->heads * sh_policy_slot_bytes(p)
           + sh_pin_bytes(p);
}

uint32_t sh_policy_last_position(const sh_policy *p)
{
    return p == NULL ? 0 : p->last_position;
}

/* ---------------------------------------------------------------- rows */

int sh_policy_select_rows(sh_policy *p, const uint32_t *index, size_t rows)
{
    if (p == NULL || index == NULL || rows < 1 || rows > SH_MAX_HEADS)
        return SH_ERR_ARG;
    for (size_t r = 0; r < rows; r++) {
        if (index[r] >= p->heads)
            return SH_ERR_ARG;
    }
    storage s;
    int rc = storage_like(&s, p, rows, p->capacity);
    if (rc != SH_OK)
        return rc;
    uint32_t *counts = NULL;
    if (rows > 1) {
        counts = malloc(rows * sizeof *counts);
        if (counts == NULL) {
            storage_free(&s);
            return SH_ERR_NOMEM;
        }
    }

    /* Nothing below can fail. */
    uint32_t only = p->counts[index[0]];
    for (size_t r = 0; r < rows; r++) {
        copy_row(p, index[r], &s, rows, p->capacity, r);
        if (counts != NULL)
            counts[r] = p->counts[index[r]];
    }
    storage_install(p, &s);
    if (p->counts != &p->count)
        free(p->counts);
    p->heads = (uint32_t)rows;
    p->count = only;
    p->counts = counts != NULL ? counts : &p->count;
    return SH_OK;
}
