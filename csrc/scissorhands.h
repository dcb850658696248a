/*
 * scissorhands.h - KV-cache eviction kernels.
 *
 * One object holds `heads` independent rows of cached positions, each with the
 * per-slot state of its policy kind: uint32 vote counts (SH_SCISSORHANDS, Liu et al.,
 * NeurIPS 2023, arXiv 2305.17118), float64 scores (SH_H2O's cumulative sum, Zhang et
 * al., NeurIPS 2023, arXiv 2306.14048, and the like), or the positions alone
 * (SH_STREAMING_LLM's attention sinks + the most recent positions, Xiao et al., ICLR
 * 2024, arXiv 2309.17453; SH_FULL, which never evicts: the baseline).
 *
 * Each kind is one file of csrc/policies/, whose opening comment states its rule;
 * the build makes `enum sh_kind` of them (SH_<NAME> for policies/<name>.c, numbered
 * by the file's sh-kind line, never renumbered: Python reads lib.SH_<NAME>), so the
 * enum is in the cdef but not in this file. A kind may need a least recent window
 * (sh_config).
 *
 * The kinds that rank by votes or scores may also pin their first positions (sinks),
 * and Scissorhands may count only the votes of its last 1..64 decode steps (a history window: one
 * 64-bit register of vote bits per slot) and may rank positions by votes per decode
 * step held rather than by votes (a vote rate: one uint32 step counter per slot).
 *
 * Every kind may also evict by an observation window (sh_policy_evict_observed: SnapKV,
 * Li et al., 2024, arXiv 2404.14469): the window's summed attention, max-pooled over
 * kept order, decides, the sinks and the window's own positions protected.
 *
 * Rows may hold different counts (a row may even be empty): capacity is shared, each
 * row keeps its own count. Calls that need equal counts say so and return
 * SH_ERR_RAGGED otherwise; the *_rows calls take ragged rows.
 *
 * Every exported function returns an sh_status and takes explicit lengths; a call
 * that fails leaves the object exactly as it was.  Two objects may be used from two
 * threads at once, one object from one thread at a time. The only process-wide
 * setting is sh_set_simd (for tests: it forces the portable scalar kernels).
 *
 * The hot loops (weight validation, each kind's update of its votes or scores, the
 * search for the least-voted slot and the bulk selection) exist in a
 * portable scalar form and, on x86-64, an AVX2 form chosen at run time when the CPU
 * has it; the two give bit-identical results. A step with many rows may spread them
 * over threads (sh_policy_set_threads); the results do not depend on the thread count.
 *
 * This header, with its preprocessor lines removed, is the cffi cdef: keep it to
 * plain declarations.
 */
#ifndef SCISSORHANDS_H
#define SCISSORHANDS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
enum sh_status {
    SH_OK = 0,
    SH_ERR_NOMEM = 1,    /* an allocation failed */
    SH_ERR_ARG = 2,      /* a parameter out of range, or a NULL pointer */
    SH_ERR_LENGTH = 3,   /* attention length or head count differs from the state */
    SH_ERR_WEIGHT = 4,   /* a NaN, infinite or negative attention weight */
    SH_ERR_POSITION = 5, /* a position not above every position admitted */
    SH_ERR_BUDGET = 6,   /* budget < 1, or not above the recent window + sinks */
    SH_ERR_STATE = 7,    /* prefill on a policy that is not fresh; a bad loaded state */
    SH_ERR_BUFFER = 8,   /* an output buffer too small for the victims */
    SH_ERR_RAGGED = 9,   /* rows hold different counts where the call needs them equal */
    SH_ERR_PINNED = 10   /* the pinned positions leave a row (or pool) too few to evict */
};

/* Element types of an attention buffer. */
enum sh_dtype {
    SH_DTYPE_NONE = 0, /* no attention: scores are left untouched */
    SH_DTYPE_F32 = 1,
    SH_DTYPE_F64 = 2
};

/* The kernels' instruction set (sh_simd_level). */
enum sh_simd {
    SH_SIMD_SCALAR = 0, /* portable C: any CPU, or forced with sh_set_simd(0) */
    SH_SIMD_AVX2 = 1    /* x86-64 AVX2, chosen at run time when the CPU has it */
};

/* What one call to sh_policy_step does. */
enum sh_flags {
    SH_STEP_ADMIT = 1, /* update the scores with attn, then admit pos */
    SH_STEP_EVICT = 2  /* then evict down to budget */
};

/* Limits and sizes (scissorhands/_shared.py states the same numbers for both
   backends; a test checks that they agree). SH_HEADER_BYTES: counted for the object
   itself by sh_policy_memory_bytes (it holds the count of a single row);
   SH_COUNT_BYTES: the count of each row, counted besides when heads > 1. A row's
   first capacity is min(budget + 1, SH_INITIAL_CAPACITY_LIMIT) slots
   (SH_FULL_INITIAL_CAPACITY for SH_FULL). A step spreads its rows over at most
   SH_MAX_THREADS threads, and over more than one only when it has at least two rows
   holding SH_PARALLEL_MIN_SLOTS positions in all (below that a thread costs more
   than it saves). */
enum sh_sizes {
    SH_HEADER_BYTES = 64,
    SH_COUNT_BYTES = 4,
    SH_MAX_HEADS = 65536,
    SH_MAX_HISTORY_WINDOW = 64,
    SH_INITIAL_CAPACITY_LIMIT = 4096,
    SH_FULL_INITIAL_CAPACITY = 64,
    SH_MAX_THREADS = 64,
    SH_PARALLEL_MIN_SLOTS = 262144,
    SH_MAX_PINS = 65536,
    SH_PIN_BYTES = 8
};

/* Construction parameters. recent_window and sinks are the protected suffix and
   prefix of each row (sinks: the first positions held, for every kind that evicts);
   recent_window + sinks < budget, and recent_window at least the kind's least (1 for
   a kind whose newest position has no score until a later token reads it; else
   sh_policy_new returns SH_ERR_ARG). history_window (Scissorhands only;
   0 = off, else 1..64): votes count only the last history_window decode steps that
   carried attention, kept exactly as a 64-bit register of vote bits per slot.
   vote_rate (Scissorhands only; 0 = off, 1 = on): eviction ranks each slot by
   votes / steps held, the decode steps that carried attention since it was admitted
   (at most history_window of them with a history window; at least 1), computed as a
   correctly rounded double; equal rates evict the lower position. */
typedef struct sh_config {
    int32_t kind; /* enum sh_kind (generated from csrc/policies/) */
    uint32_t heads;
    uint32_t budget;
    uint32_t recent_window;
    uint32_t sinks;
    uint32_t history_window;
    uint32_t vote_rate;
} sh_config;

typedef struct sh_policy sh_policy;

/* Validates cfg, allocates a policy holding position 0 with a zero score in every
   row, and stores it in *out. */
int sh_policy_new(const sh_config *cfg, sh_policy **out);

/* Frees a policy; NULL is allowed. */
void sh_policy_free(sh_policy *p);

/* Threads sh_policy_step and sh_policy_step_rows may use for one call's rows, 1..
   SH_MAX_THREADS (else SH_ERR_ARG); 1 for a new policy. A call uses
   min(threads, heads) of them when its rows hold at least SH_PARALLEL_MIN_SLOTS
   positions, else one. Each row is one thread's work, so the results (victims,
   slots, state) are identical for every thread count. Kept by reset and
   sh_policy_select_rows; not part of the state. */
int sh_policy_set_threads(sh_policy *p, uint32_t threads);

/* The thread count set by sh_policy_set_threads. */
uint32_t sh_policy_threads(const sh_policy *p);

/* Process-wide: 0 forces the portable scalar kernels, nonzero (the default) lets
   each call use the best instruction set the CPU has. For tests and benchmarks of
   the two paths (their results are bit-identical); read atomically when a call
   starts. Returns the previous setting (0 or 1). */
int sh_set_simd(int enabled);

/* The instruction set a call starting now uses: SH_SIMD_AVX2 or SH_SIMD_SCALAR. */
int sh_simd_level(void);

/* Back to holding {0} with zero scores in every row; forgets every admitted
   position. Keeps the allocated capacity and the number of rows. */
int sh_policy_reset(sh_policy *p);

/* Positions held by the fullest row (the count of every row when they agree). */
size_t sh_policy_count(const sh_policy *p);

/* Positions held by row head (0 when head is out of range). */
size_t sh_policy_row_count(const sh_policy *p, size_t head);

/* Copies the count of every row out: heads entries (SH_ERR_BUFFER when cap is
   smaller). */
int sh_policy_counts(const sh_policy *p, uint32_t *counts, size_t cap);

/* Allocated slots per row. */
size_t sh_policy_capacity(const sh_policy *p);

/* SH_HEADER_BYTES + capacity * heads * bytes per slot, plus SH_COUNT_BYTES * heads
   for the rows' counts when heads > 1, plus 4 + SH_PIN_BYTES * m for m >= 1 pinned
   spans (their number, then each start and stop). */
size_t sh_policy_memory_bytes(const sh_policy *p);

/* Bytes of state per slot: 9 with uint32 votes (Scissorhands; +8 with a history
   window, +4 with a vote rate), 13 with float64 scores (H2O and the like), 4 with
   the positions alone (StreamingLLM, Full). */
size_t sh_policy_slot_bytes(const sh_policy *p);

/* The largest position ever admitted (0 for a fresh policy). */
uint32_t sh_policy_last_position(const sh_policy *p);

/* One decode step, eviction, or both (flags from sh_flags):
   - SH_STEP_ADMIT: attn holds heads * n weights (row-major, n = the largest count),
     read as dtype; row h reads only its first count_h weights (the rest is neither
     read nor checked). Every weight read is checked (finite, >= 0) before any score
     changes; then pos (> every position admitted) joins every row with a zero score.
     dtype SH_DTYPE_NONE (attn NULL, n ignored) admits without touching scores
     (nor the vote registers or steps held: it is not a vote step). A row holding
     nothing votes nothing.
   - SH_STEP_EVICT: each row holding count_h > budget evicts count_h - budget
     positions; here every row must evict the same number k, else SH_ERR_RAGGED
     before anything changes (sh_policy_step_rows takes any numbers). The victims go,
     ascending, to victims[h * k + j] (and their slot indices before the eviction to
     slots[h * k + j] when slots is not NULL); budget is checked against
     recent_window + sinks even when nothing is evicted.
   With equal counts a wrong n is SH_ERR_LENGTH; with rows of different counts it is
   SH_ERR_RAGGED. *n_victims receives k (victims per row). victims_cap is the length
   of victims (and of slots) in elements. */
int sh_policy_step(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype,
                   const void *attn, size_t heads, size_t n, uint32_t budget,
                   uint32_t *victims, int64_t *slots, size_t victims_cap,
                   size_t *n_victims);

/* sh_policy_step for rows that may evict different numbers: row h evicts
   k_h = max(0, count_h - budget) (after the admission), written to row_victims[h]
   (heads entries); the victims (and slots, when not NULL) go row after row, each
   row ascending, to victims[0 .. sum k_h), and *n_victims receives sum k_h. Same
   checks and order as sh_policy_step; a wrong n is SH_ERR_LENGTH. */
int sh_policy_step_rows(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype,
                        const void *attn, size_t heads, size_t n, uint32_t budget,
                        uint32_t *victims, int64_t *slots, size_t victims_cap,
                        uint32_t *row_victims, size_t *n_victims);

/* sh_policy_step_rows with the budget shared by pools of `pool` consecutive rows
   (Ada-KV, Feng et al., 2024, arXiv 2407.11550): rows [g * pool, (g + 1) * pool) hold
   at most pool * budget positions in all, a row may hold more than budget while
   another holds less. After the admission each pool over its share evicts the excess:
   the slots of its rows with the least (key, position, row) among their evictable
   slots (each row keeps its sinks and its recent window), the key being what
   sh_policy_step ranks by (votes, the vote rate, the score). Victims as
   sh_policy_step_rows writes them (row after row, each ascending; row_victims and
   n_victims required). pool must divide heads and, above 1, the policy must rank by
   scores (not SH_FULL or SH_STREAMING_LLM), else SH_ERR_ARG; pool 1 is exactly
   sh_policy_step_rows. Same checks and order, then SH_ERR_BUFFER, then SH_ERR_NOMEM
   (a scratch of 24 bytes per held slot of the fullest pool), all before anything
   changes. */
int sh_policy_step_pools(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype,
                         const void *attn, size_t heads, size_t n, uint32_t budget,
                         uint32_t pool, uint32_t *victims, int64_t *slots, size_t victims_cap,
                         uint32_t *row_victims, size_t *n_victims);

/* Evicts each row down to budget by an observation window's attention (SnapKV, Li et
   al., 2024, arXiv 2404.14469), for every kind. attn is heads * window * n weights of
   dtype (n = the largest count, window >= 1): window row j of row h is the row's held
   slot t = count_h - window + j, and attn[(h * window + j) * n + i] its weight on slot
   i; only i < t is read (nothing when t <= 0). Slot i's score is the sum over j
   ascending of those weights, in double; its pooled score the largest score of the
   row's slots [i - r, i + r] (r = pool_kernel / 2, clipped at the row's ends). A row
   holding count_h > budget evicts its count_h - budget unprotected slots of least
   pooled score, equal pooled scores evicting the lower slot; protected are the first
   min(sinks, count_h) and the last min(window, count_h). recent_window is not used;
   survivors keep their votes, scores, registers and steps held. Victims as
   sh_policy_step_rows writes them (row_victims[h] = k_h, victims row after row, each
   ascending, slots when not NULL). Refused before anything changes, in order: a NULL
   pointer, window 0, an even pool_kernel, a dtype other than F32/F64 (SH_ERR_ARG);
   heads or n not the policy's (SH_ERR_LENGTH); budget 0, then a row whose unprotected
   slots are fewer than it must evict (SH_ERR_BUDGET); a read weight NaN, infinite or
   negative, any row (SH_ERR_WEIGHT); victims_cap below sum k_h (SH_ERR_BUFFER); a
   scratch of 22 bytes per slot of the fullest evicting row (SH_ERR_NOMEM). A kind that
   never evicts (SH_FULL) checks the pointers, window, pool_kernel and the lengths only
   (attn may be NULL) and evicts nothing. */
int sh_policy_evict_observed(sh_policy *p, int32_t dtype, const void *attn, size_t heads,
                             size_t window, size_t n, uint32_t budget, uint32_t pool_kernel,
                             uint32_t *victims, int64_t *slots, size_t victims_cap,
                             uint32_t *row_victims, size_t *n_victims);

/* A call with sh_policy_step's arguments that does nothing: the floor of the call
   overhead, for benchmarks. */
int sh_noop_step(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype,
                 const void *attn, size_t heads, size_t n, uint32_t budget,
                 uint32_t *victims, int64_t *slots, size_t victims_cap,
                 size_t *n_victims);

/* Consumes a prompt's attention on a fresh policy (every row holding {0}, nothing
   admitted since construction or reset; else SH_ERR_STATE): attn is heads * P * P
   weights (row i = token i over positions 0..i; only j < i is read), applied exactly
   as decode steps admitting positions 1..P-1. No eviction. The same as
   sh_policy_extend(p, dtype, attn, heads, P, P, NULL) on a fresh policy. */
int sh_policy_prefill(sh_policy *p, int32_t dtype, const void *attn, size_t heads,
                      size_t prompt_len);

/* A chunk of `chunk` tokens, each applied to every row as a decode step (a vote over
   what the row holds at that moment, then admission), without eviction. The tokens
   take positions last + 1 .. last + chunk, shared by all rows; on a fresh policy
   (every row holding {0}, last position 0) positions 0 .. chunk - 1, token 0 being
   the pre-held position 0 (kept as it is when admitted, dropped when not).
   admit: heads * chunk bytes, row-major, nonzero = token i joins row h (NULL: every
   token joins every row); a token left out of a row neither votes in it nor joins it
   (none of its weights in that row is read).
   attn: heads * chunk * width weights; width = base + chunk, base = the largest count
   before the chunk (0 when fresh). For row h (n_h = its count before the chunk, 0
   when fresh) a token that joins reads columns [0, n_h) (the positions held before,
   in kept order) and n_h + j for each chunk token j < i that joined the row; nothing
   else is read or checked. Every weight read is checked before anything changes.
   SH_ERR_POSITION when the positions would pass UINT32_MAX; SH_ERR_LENGTH for a
   wrong heads (checked when attention is read or admit is given) or width. Capacity
   grows one doubling at a time until the fullest row fits. */
int sh_policy_extend(sh_policy *p, int32_t dtype, const void *attn, size_t heads,
                     size_t chunk, size_t width, const uint8_t *admit);

/* Pinned spans: positions start <= pos < stop that no eviction takes, in any row
   (sh_policy_step, sh_policy_step_rows, sh_policy_step_pools), whether held yet or
   not; the object's, not a row's: kept by reset, sh_policy_select_rows and the
   imports, freed with the object. Sinks are the special case of the span [0, sinks)
   on rows that hold every position from 0. sh_policy_set_pins replaces the spans by
   the m given, spans[2 * j] = start and spans[2 * j + 1] = stop of span j: merged and
   ascending (start < stop, each start above the previous stop), m <= SH_MAX_PINS,
   else SH_ERR_ARG; SH_ERR_BUDGET when the pinned positions outside [0, sinks) plus
   sinks plus recent_window reach the configured budget (nothing would be left to
   evict); SH_ERR_NOMEM; on any error the old spans stay. m = 0 removes them all.
   A step evicting with a budget whose row (pool) holds fewer unpinned positions
   outside its sinks and recent window than it must evict returns SH_ERR_PINNED
   before anything changes. */
int sh_policy_set_pins(sh_policy *p, const uint32_t *spans, size_t m);

/* The number of pinned spans. */
size_t sh_policy_pin_count(const sh_policy *p);

/* Copies the pinned spans out as sh_policy_set_pins takes them (2 * m words;
   SH_ERR_BUFFER when cap, in spans, is below m). */
int sh_policy_export_pins(const sh_policy *p, uint32_t *spans, size_t cap);

/* Replaces the rows by `rows` rows, row r a copy of old row index[r] (positions,
   per-slot arrays, count); repeats allowed. 1 <= rows <= SH_MAX_HEADS and every
   index below heads, else SH_ERR_ARG. The capacity per row is kept. Everything is
   allocated before anything changes (SH_ERR_NOMEM leaves the policy as it was). */
int sh_policy_select_rows(sh_policy *p, const uint32_t *index, size_t rows);

/* Copies the held positions and scores out, row after row (row h's count_h entries,
   sum count_h in all: heads * count row-major when the counts agree). votes is read
   for a kind with uint32 votes, scores for one with float64 scores; any of the three
   may be NULL. */
int sh_policy_export(const sh_policy *p, uint32_t *positions, uint32_t *votes,
                     double *scores, size_t cap);

/* Copies the positions held by row head out (its count of them; SH_ERR_ARG for a
   head out of range, SH_ERR_BUFFER when cap is smaller). */
int sh_policy_export_row(const sh_policy *p, size_t head, uint32_t *positions, size_t cap);

/* Copies the vote registers of a Scissorhands policy with a history window out, row
   after row as sh_policy_export; bit j of a register is the vote of the decode step
   j steps back (bit 0: the latest). SH_ERR_STATE when there is no history. */
int sh_policy_export_history(const sh_policy *p, uint64_t *history, size_t cap);

/* Copies the steps held of a Scissorhands policy with a vote rate out, row after row
   as sh_policy_export. SH_ERR_STATE when it keeps none. */
int sh_policy_export_held(const sh_policy *p, uint32_t *held, size_t cap);

/* Replaces the state with heads rows of n positions each and their per-slot arrays,
   all row-major: votes (uint32 kinds) or scores (float64 kinds), history exactly when the policy
   has a history window and held exactly when it has a vote rate (else SH_ERR_ARG).
   Only what memory safety needs is checked here (presence, heads, 1 <= n <=
   UINT32_MAX); the caller validates the values (ascending positions, finite scores,
   consistent registers: scissorhands/_shared.py). On any error the old state stays. */
int sh_policy_import_state(sh_policy *p, size_t heads, size_t n,
                           const uint32_t *positions, const uint32_t *votes,
                           const double *scores, const uint64_t *history,
                           const uint32_t *held, uint32_t last_position);

/* sh_policy_import_state for rows of any counts: row h holds counts[h] positions
   (0 allowed), the arrays holding the rows one after another (sum counts[h] entries).
   Checks presence and heads only; capacity grows one doubling at a time until the
   fullest row fits. On any error the old state stays. */
int sh_policy_import_rows(sh_policy *p, size_t heads, const uint32_t *counts,
                          const uint32_t *positions, const uint32_t *votes,
                          const double *scores, const uint64_t *history,
                          const uint32_t *held, uint32_t last_position);

/* The slot index of pos in row head, or -1 when it is not held (or head is out
   of range). */
int64_t sh_policy_find(const sh_policy *p, size_t head, uint32_t pos);

/* The vote count of pos in row head (Scissorhands), or -1 when it is not held. */
int64_t sh_policy_votes_of(const sh_policy *p, size_t head, uint32_t pos);

/* The score of pos in row head (as its kind keeps it: H2O's is cumulative), or -1.0
   when it is not held. */
double sh_policy_score_of(const sh_policy *p, size_t head, uint32_t pos);

/* The cache's GQA reduction (gqa.c): out[r, t, j] (float32, rows x q x width) is the
   mean of the weights of query heads r*group .. r*group+group-1 at query t and column
   columns[r * col_stride + j], the heads added in order in float32 and divided by
   group; weights is float32 (rows * group) x q x extent, row-major. A column outside
   [0, extent) gives 0. With held (per row, the positions it held before a chunk),
   out[r, t, j] is 0 for j > held[r] + t without reading the weights: the chunk's later
   tokens, which its mask hides from token t. SH_ERR_ARG for a NULL pointer, group or
   extent 0, or col_stride < width; SH_ERR_NOMEM when its scratch cannot be had. */
int sh_gqa_gather(const float *weights, size_t rows, size_t group, size_t q, size_t extent,
                  const int64_t *columns, size_t col_stride, size_t width, const int64_t *held,
                  float *out);

/* Reallocates every row to capacity slots (>= each row's count, else SH_ERR_ARG, as
   for capacity 0 or above UINT32_MAX), keeping the contents; later growth doubles
   from there as usual. The transformers cache starts its policies at what they hold. */
int sh_policy_fit_capacity(sh_policy *p, uint64_t capacity);

/* The cache's rotary re-rotation (layout.c): turns in place the count vectors of x
   (float32, length elements) starting at x + offsets[i], vector i by table row
   which[i]: for j < half, (a, b) = (v[j], v[j + half]) becomes (a c - b s, b c + a s)
   with c = cos_table[which[i] * half + j] and s = sin_table[...], computed in double
   and rounded once to float32; elements past 2 half are untouched (the rotate-half
   layout of transformers' rotary embeddings). SH_ERR_ARG, nothing turned, for a NULL
   pointer (count > 0), half 0, a vector past length or a table row past table_rows. */
int sh_rope_rotate(float *x, size_t length, const int64_t *offsets, const int64_t *which, size_t count,
                   const double *cos_table, const double *sin_table, size_t table_rows, size_t half);

/* One layer's turns of positions="cache" in one call (layout.c): sh_rope_rotate's turns
   of the count vectors of keys (float32, keys_length elements) by offsets and which,
   each turned key's rotation then recorded (rope[rope_index[i]] = target[i], rope of
   rope_length entries); then the query (float32, query_length elements) copied to out
   (as long) with its first query_count vectors, head_dim elements apart, turned by table
   rows query_which (the same arithmetic). SH_ERR_ARG, nothing written, for a NULL
   pointer, half 0, 2 half past head_dim, a vector past its buffer, a rope index past
   rope_length or a table row past table_rows. */
int sh_rope_layer(float *keys, size_t keys_length, const int64_t *offsets, const int64_t *which, size_t count,
                  int64_t *rope, size_t rope_length, const int64_t *rope_index, const int64_t *target,
                  const float *query, float *out, size_t query_length, size_t head_dim, const int64_t *query_which,
                  size_t query_count, const double *cos_table, const double *sin_table, size_t table_rows,
                  size_t half);

/* positions="cache" (layout.c): per row r, the held keys' slots slots[r * slot_stride
   + j] (j < counts[r], kept order; the cache's int32 slot table), the rotation each
   stored key has, rope[r * rope_stride + slot], and the forward's q new tokens' slots
   and ranks (new_slots,
   new_rank: rows x q). offset[r] becomes the row's rope at its last held key minus that
   key's kept index (0 for an empty row); every held key whose rotation is not j +
   offset[r], then every new token whose rotation is not new_rank + offset[r], gives one
   entry (row_out, slot_out, turn_out = target - rope, target_out), row after row, at
   most room entries. Returns the entries, or -1 (what was written is not to be used)
   for a NULL pointer, a count past slot_stride, a slot past rope_stride or more than
   room entries. */
int64_t sh_rope_turns(const int32_t *slots, size_t slot_stride, const int64_t *counts, const int64_t *rope,
                      size_t rope_stride, size_t rows, const int64_t *new_slots, const int64_t *new_rank, size_t q,
                      int64_t *offset, int64_t *row_out, int64_t *slot_out, int64_t *turn_out, int64_t *target_out,
                      size_t room);

/* The cache's slot table (int32: 4 bytes a held position) after a decode step evicting
   one position per row, every row having held `count` positions and taken its token
   at free_slots[r] (layout.c): row r (slots + r * stride) gets the new token's slot at
   kept index count, then the one at kept index index[r] (0..count) is removed, the
   later ones move one left, freed[r] is the removed slot and valid[r * valid_stride +
   freed[r]] becomes 0.
   SH_ERR_LENGTH, nothing changed, when a row's count is not `count` or count + 1 >
   stride (not this case); SH_ERR_ARG, nothing changed, for a NULL pointer (rows > 0),
   an index past count, or a removed or new slot past valid_stride or INT32_MAX. */
int sh_slots_step_steady(int32_t *slots, size_t rows, size_t stride, size_t count, const int64_t *counts,
                         const int64_t *free_slots, const int64_t *index, uint8_t *valid, size_t valid_stride,
                         int64_t *freed);

/* sh_slots_step_steady with each row's own count: row r held counts[r] positions (its
   kept order at slots + r * stride), took its token at free_slots[r] and evicted the
   one at kept index index[r] (0..counts[r]); a decode step of rows of several
   configurations or budgets, each evicting one. SH_ERR_LENGTH, nothing changed, when a
   count is negative or counts[r] + 1 > stride; SH_ERR_ARG, nothing changed, for a NULL
   pointer (rows > 0), an index past its row's count, or a removed or new slot past
   valid_stride or INT32_MAX. */
int sh_slots_step_rows(int32_t *slots, size_t rows, size_t stride, const int64_t *counts, const int64_t *free_slots,
                       const int64_t *index, uint8_t *valid, size_t valid_stride, int64_t *freed);

/* The slot table after a decode step where rows evict any number of positions (rows
   sharing a budget, layout.c): row r (slots + r * stride) holds held[r] slots in kept
   order (its new token's included) and evicts victims[r] of them, at the kept indices
   index[at .. at + victims[r]) (at: the earlier rows' victims; total in all). Each
   evicted slot goes to freed (in index's order) and stops being valid (valid[r *
   valid_stride + slot] = 0); the row's other slots move to its front in their order
   (what lies past them is left as it was). SH_ERR_ARG, nothing changed, for a NULL
   pointer, a count past the stride, more victims than held or than total, an index
   outside its row or twice in it, or a slot past valid_stride; SH_ERR_NOMEM, nothing
   changed, when the scratch for the marks cannot be had. */
int sh_slots_evict_rows(int32_t *slots, size_t rows, size_t stride, const int64_t *held, const int64_t *victims,
                        const int64_t *index, size_t total, uint8_t *valid, size_t valid_stride, int64_t *freed);

/* sh_gqa_gather for one query row of every layer, each layer's weights where the
   attention left them (gqa.c): weights[e] is layer e's float32 (rows * group) x extent;
   out[e * rows + r, j] (float32, layers * rows x width) is the mean of the group's
   weights at column columns[(e * rows + r) * col_stride + j] (int32: the cache's slot
   table), with sh_gqa_gather's arithmetic (heads added in order in float32, divided by
   group), 0 for a column outside [0, extent). *finite (when finite is not NULL) becomes 1 when every weight
   written is finite, else 0. SH_ERR_ARG for a NULL pointer, group or extent 0, or
   col_stride < width; SH_ERR_NOMEM when a row's scratch cannot be had. */
int sh_gqa_gather_layers(const float *const *weights, size_t layers, size_t rows, size_t group, size_t extent,
                         const int32_t *columns, size_t col_stride, size_t width, float *out, int *finite);

/* A transformers cache's steady decode step in one call (layout.c), with nothing
   between its three passes: every layer's GQA gather (sh_gqa_gather_layers, columns
   from the slot table, col_stride = stride, into gathered: layers * rows x width, width
   = count), then, when every gathered weight is finite, one sh_policy_step of p (the
   flags of a step, pos, float32 gathered as layers * rows heads of width count, budget,
   victims and victim_slots of victims_cap, n_victims; the step's own check of the
   weights is skipped when the gather found every one it wrote >= 0 too, and made as
   usual when not), then, when every row evicted
   exactly one position, sh_slots_step_steady of the layers * rows rows (count,
   counts, free_slots, the victim slots as index, valid, valid_stride, freed); with
   free_slots NULL (valid and freed unused) the slot table's step is the caller's.
   *done says how far it went: 0, nothing changed (the weights were not all finite, or
   the policy refused: its code is returned, or a row's count is not `count`: the
   caller takes its general path); 1, the policy stepped and the slot table did not
   (free_slots NULL, a row evicted no position or more than one, or the slot step
   refused: its code is returned); 2, all of it. *policy_seconds (when not NULL)
   receives the time spent in the policy's step (for statistics: a wall clock). SH_ERR_ARG,
   nothing changed, for a NULL pointer.
   In the steady state proper (free_slots given; p a Scissorhands policy of plain votes,
   no pinned spans and one thread, every row holding `count` and evicting one) the
   three passes are one: each row's weights are gathered, applied by the policy and its
   slot table row stepped before the next row's are read, so that each row's state is
   read once while it is in the caches; gathered is then unused and *policy_seconds
   covers the whole pass. Its results are the three passes' to the bit; a row whose
   gathered weights are not valid (or, when a vote could saturate, any row) undoes the
   rows stepped before it, exactly, and the three passes run instead. */
int sh_cache_step_steady(const float *const *weights, size_t layers, size_t rows, size_t group, size_t extent,
                         int32_t *slots, size_t stride, size_t count, const int64_t *counts,
                         const int64_t *free_slots, uint8_t *valid, size_t valid_stride, float *gathered,
                         sh_policy *p, uint32_t pos, uint32_t budget, uint32_t *victims, int64_t *victim_slots,
                         size_t victims_cap, size_t *n_victims, int64_t *freed, int *done,
                         double *policy_seconds);

#ifdef __cplusplus
}
#endif

#endif /* SCISSORHANDS_H */
