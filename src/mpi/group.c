/*
 * group.c — the context-parallel group (a duplicated communicator, the
 * mode, the timeline), the chunk layout, the status agreement that keeps a
 * failing rank from leaving the others blocked, the job's checks, and the
 * public scatter and gather entry points. The attention over chunks
 * (ring.c, ulysses.c, sdpa.c) builds on these and nothing here calls it.
 */
#include "mpi/group.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

const char *attn_mpi_mode_name(attn_mpi_mode mode) {
    switch (mode) {
    case ATTN_MPI_RING: return "ring";
    case ATTN_MPI_ZIGZAG: return "zigzag";
    case ATTN_MPI_ULYSSES: return "ulysses";
    }
    return "?";
}

/* ---- the layout ------------------------------------------------------------ */

/* The first token of chunk c of n over tokens: sizes differ by at most 1. */
static size_t chunk_start(size_t tokens, size_t n, size_t c) {
    /* tokens * c / n, without overflow for any tokens (c <= n < 2^32) */
    return tokens / n * c + tokens % n * c / n;
}

size_t attn_mpi_local_ranges(attn_mpi_mode mode, size_t tokens, size_t ranks, size_t rank,
                             size_t begin[2], size_t end[2], size_t *local) {
    if (local) *local = 0;
    if (ranks == 0 || rank >= ranks || (unsigned)mode > ATTN_MPI_ULYSSES) return 0;
    size_t count;
    if (mode == ATTN_MPI_ZIGZAG) {
        size_t n = 2 * ranks, other = n - 1 - rank;
        begin[0] = chunk_start(tokens, n, rank);
        end[0] = chunk_start(tokens, n, rank + 1);
        begin[1] = chunk_start(tokens, n, other);
        end[1] = chunk_start(tokens, n, other + 1);
        count = 2;
    } else {
        begin[0] = chunk_start(tokens, ranks, rank);
        end[0] = chunk_start(tokens, ranks, rank + 1);
        count = 1;
    }
    if (local) {
        *local = 0;
        for (size_t i = 0; i < count; i++) *local += end[i] - begin[i];
    }
    return count;
}

size_t attn_mpi_local_count(attn_mpi_mode mode, size_t tokens, size_t ranks, size_t rank) {
    size_t b[2], e[2], n = 0;
    attn_mpi_local_ranges(mode, tokens, ranks, rank, b, e, &n);
    return n;
}

/* ---- the group ---------------------------------------------------------------- */

attn_status attn_mpi_group_new(attn_ctx *ctx, MPI_Comm comm, attn_mpi_mode mode,
                               attn_mpi_group **out) {
    if (out) *out = NULL;
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_mpi_group_new: MPI is not initialized (call MPI_Init first)");
    if (comm == MPI_COMM_NULL)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_mpi_group_new: comm is MPI_COMM_NULL");
    /* A rank's own bad argument fails every rank: the others, already in
     * the collective calls below, would wait for it forever. */
    attn_status st = ATTN_OK;
    if (!out)
        st = attn_fail(ctx, ATTN_ERR_NULL, "attn_mpi_group_new: out is NULL");
    else if ((unsigned)mode > ATTN_MPI_ULYSSES)
        st = attn_fail(ctx, ATTN_ERR_INVALID,
                       "attn_mpi_group_new: mode (%d) is not ring, zigzag or ulysses", (int)mode);
    attn_mpi_group *g = st == ATTN_OK ? attn_calloc(1, sizeof *g) : NULL;
    /* the duplicate is collective: every rank makes it even when its own
     * allocation failed, then all free it together below */
    MPI_Comm dup = MPI_COMM_NULL;
    int rc = MPI_Comm_dup(comm, &dup);
    if (rc != MPI_SUCCESS) {
        attn_free(g);
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        return attn_fail(ctx, ATTN_ERR_IO, "attn_mpi_group_new: MPI_Comm_dup failed: %s", msg);
    }
    /* errors come back as codes, which we turn into statuses */
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    attn_mpi_group tmp = {.ctx = ctx, .comm = dup, .mode = mode};
    MPI_Comm_rank(dup, &tmp.rank);
    MPI_Comm_size(dup, &tmp.size);
    if (st == ATTN_OK && !g)
        st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_mpi_group_new: out of memory");
    st = attn_mpi_agree(&tmp, "attn_mpi_group_new", st, NULL);
    if (st != ATTN_OK) {
        MPI_Comm_free(&dup);
        attn_free(g);
        return st;
    }
    *g = tmp;
    *out = g;
    return ATTN_OK;
}

void attn_mpi_saved_free(attn_mpi_saved *s) {
    attn_free(s->x);
    attn_free(s->acts);
    attn_free(s->lse);
    attn_free(s->head_stats);
    attn_free(s->versions);
    attn_module_identity_release(s->module_id);
    *s = (attn_mpi_saved){0};
}

void attn_mpi_maps_free(attn_mpi_maps *m) {
    for (size_t i = 0; i < m->n; i++) attn_block_mask_free(m->sub[i]);
    attn_free(m->sub);
    *m = (attn_mpi_maps){0};
}

void attn_mpi_group_free(attn_mpi_group *g) {
    if (!g) return;
    attn_mpi_saved_free(&g->saved);
    attn_mpi_maps_free(&g->maps);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
    attn_free(g->steps);
    attn_free(g);
}

int attn_mpi_group_rank(const attn_mpi_group *g) { return g ? g->rank : -1; }
int attn_mpi_group_size(const attn_mpi_group *g) { return g ? g->size : 0; }

/* ---- agreement ------------------------------------------------------------------ */

attn_status attn_mpi_error(attn_mpi_group *g, const char *who, const char *call, int code) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", code);
    return attn_fail(g->ctx, ATTN_ERR_IO, "%s: %s failed on rank %d: %s", who, call, g->rank, msg);
}

/* ---- the agreement record ------------------------------------------------------- */

static attn_mpi_field *record_next(attn_mpi_record *r, const char *name, int64_t key) {
    /* one past the end counts the overflow, which attn_mpi_agree refuses */
    if (r->n >= ATTN_MPI_RECORD_MAX) {
        r->n = ATTN_MPI_RECORD_MAX + 1;
        return NULL;
    }
    attn_mpi_field *f = &r->f[r->n++];
    f->name = name;
    f->key = key;
    return f;
}

void attn_mpi_record_int(attn_mpi_record *r, const char *name, int64_t value) {
    attn_mpi_field *f = record_next(r, name, value);
    if (f) snprintf(f->text, sizeof f->text, "%lld", (long long)value);
}

void attn_mpi_record_float(attn_mpi_record *r, const char *name, float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    attn_mpi_field *f = record_next(r, name, (int64_t)bits);
    if (f) snprintf(f->text, sizeof f->text, "%.9g", (double)value); /* 9 digits: the float */
}

void attn_mpi_record_hex(attn_mpi_record *r, const char *name, uint64_t value) {
    int64_t key;
    memcpy(&key, &value, sizeof key);
    attn_mpi_field *f = record_next(r, name, key);
    if (f) snprintf(f->text, sizeof f->text, "0x%016llx", (unsigned long long)value);
}

void attn_mpi_record_text(attn_mpi_record *r, const char *name, const char *value) {
    const char *v = value ? value : "(none)";
    uint64_t h = attn_mpi_hash(ATTN_MPI_HASH_SEED, v, strlen(v));
    int64_t key;
    memcpy(&key, &h, sizeof key);
    attn_mpi_field *f = record_next(r, name, key);
    if (!f) return;
    /* a text too long to show whole keeps its end too: two paths that
     * differ only there are shown apart */
    size_t len = strlen(v), half = (sizeof f->text - 4) / 2;
    if (len < sizeof f->text)
        snprintf(f->text, sizeof f->text, "%s", v);
    else
        snprintf(f->text, sizeof f->text, "%.*s...%s", (int)half, v, v + len - half);
}

uint64_t attn_mpi_hash(uint64_t h, const void *data, size_t n) {
    /* a multiply-xorshift over 8-byte words: a checksum of weights, not a
     * defence against anyone choosing collisions */
    const unsigned char *p = data;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, sizeof w);
        h = (h ^ w) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    /* the tail's length mixed in: "a" and "a\0" differ */
    h = (h ^ w ^ ((uint64_t)n << 56)) * 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
}

uint64_t attn_mpi_map_checksum(const attn_block_map *m) {
    uint64_t geometry[6] = {m->batch, m->heads, m->q_len, m->kv_len, m->block_q, m->block_kv};
    size_t rows = m->batch * m->heads * m->q_blocks, tile = m->block_q * m->words_per_row;
    uint64_t h = attn_mpi_hash(ATTN_MPI_HASH_SEED, geometry, sizeof geometry);
    h = attn_mpi_hash(h, m->full_at, (rows + 1) * sizeof *m->full_at);
    h = attn_mpi_hash(h, m->part_at, (rows + 1) * sizeof *m->part_at);
    h = attn_mpi_hash(h, m->full, m->full_at[rows] * sizeof *m->full);
    h = attn_mpi_hash(h, m->part, m->part_at[rows] * sizeof *m->part);
    /* the partial tiles' bits in the order of their entries */
    for (size_t e = 0; e < m->part_at[rows]; e++)
        h = attn_mpi_hash(h, m->bits + m->part_tile[e] * tile, tile * sizeof *m->bits);
    return h;
}

/* The header every record starts with, then the call's own fields. */
enum { HEAD = 2, SLOTS = HEAD + 1 + ATTN_MPI_RECORD_MAX };

/* A field differs (least key lo, greatest hi): every rank learns the lowest
 * rank holding each and its text, and fails with both. */
static attn_status disagree(attn_mpi_group *g, const char *who, const attn_mpi_field *mine,
                            int64_t lo, int64_t hi) {
    int64_t at[2] = {mine->key == lo ? g->rank : g->size, mine->key == hi ? g->rank : g->size};
    int rc = MPI_Allreduce(MPI_IN_PLACE, at, 2, MPI_INT64_T, MPI_MIN, g->comm);
    if (rc != MPI_SUCCESS) return attn_mpi_error(g, who, "MPI_Allreduce", rc);
    char text[2][ATTN_MPI_TEXT_MAX];
    for (int s = 0; s < 2; s++) {
        memcpy(text[s], mine->text, sizeof text[s]);
        rc = MPI_Bcast(text[s], (int)sizeof text[s], MPI_CHAR, (int)at[s], g->comm);
        if (rc != MPI_SUCCESS) return attn_mpi_error(g, who, "MPI_Bcast", rc);
        text[s][sizeof text[s] - 1] = '\0';
    }
    int first = at[0] < at[1] ? 0 : 1;
    return attn_fail(g->ctx, ATTN_ERR_INVALID,
                     "%s: the ranks disagree on %s: rank %d %s, rank %d %s (every rank must "
                     "pass the same)",
                     who, mine->name, (int)at[first], text[first], (int)at[1 - first],
                     text[1 - first]);
}

attn_status attn_mpi_agree(attn_mpi_group *g, const char *who, attn_status st,
                           const attn_mpi_record *rec) {
    static const attn_mpi_record none = {0};
    if (!rec) rec = &none;
    if (st == ATTN_OK && rec->n > ATTN_MPI_RECORD_MAX)
        st = attn_fail(g->ctx, ATTN_ERR_INVALID, "%s: more than %d values to agree on", who,
                       ATTN_MPI_RECORD_MAX);
    size_t n = rec->n > ATTN_MPI_RECORD_MAX ? ATTN_MPI_RECORD_MAX : rec->n;
    /* the header (the call, the group's mode), which even a failed rank
     * knows, then the number of fields and the fields */
    attn_mpi_record head = {0};
    attn_mpi_record_text(&head, "the call", who);
    attn_mpi_record_text(&head, "the mode", attn_mpi_mode_name(g->mode));
    attn_mpi_record_int(&head, "the number of values", (int64_t)n);
    attn_mpi_field all[SLOTS];
    memcpy(all, head.f, (HEAD + 1) * sizeof *all);
    memcpy(all + HEAD + 1, rec->f, n * sizeof *all);
    /* one MIN over [failing rank, keys, ~keys]: the lowest failing rank,
     * and each field's least key and (~ of) its greatest; a slot a rank
     * does not fill (a failed rank's fields, unused slots) is the MIN's
     * identity */
    int64_t v[1 + 2 * SLOTS];
    v[0] = st == ATTN_OK ? (int64_t)g->size : (int64_t)g->rank;
    for (size_t i = 0; i < SLOTS; i++) {
        bool known = i < HEAD || (st == ATTN_OK && i < HEAD + 1 + n);
        v[1 + i] = known ? all[i].key : INT64_MAX;
        v[1 + SLOTS + i] = known ? ~all[i].key : INT64_MAX;
    }
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, (int)(1 + 2 * SLOTS), MPI_INT64_T, MPI_MIN, g->comm);
    if (rc != MPI_SUCCESS) return attn_mpi_error(g, who, "MPI_Allreduce", rc);
    /* ranks in different calls: what each rank checked is beside the point */
    for (size_t i = 0; i < HEAD; i++)
        if (v[1 + i] != ~v[1 + SLOTS + i])
            return disagree(g, who, &all[i], v[1 + i], ~v[1 + SLOTS + i]);
    int failed = (int)v[0];
    if (failed < g->size) {
        /* the failing rank's status and message, to every rank */
        struct {
            int status;
            char text[ATTN_ERROR_CAPACITY];
        } msg = {0};
        if (failed == g->rank) {
            msg.status = (int)st;
            snprintf(msg.text, sizeof msg.text, "%s", attn_ctx_last_error(g->ctx));
        }
        rc = MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, failed, g->comm);
        if (rc != MPI_SUCCESS) return attn_mpi_error(g, who, "MPI_Bcast", rc);
        if (failed == g->rank) return st;
        msg.text[sizeof msg.text - 1] = '\0';
        return attn_fail(g->ctx, (attn_status)msg.status, "rank %d: %s", failed, msg.text);
    }
    for (size_t i = HEAD; i < HEAD + 1 + n; i++)
        if (v[1 + i] != ~v[1 + SLOTS + i])
            return disagree(g, who, &all[i], v[1 + i], ~v[1 + SLOTS + i]);
    return ATTN_OK;
}

attn_status attn_mpi_group_agree(attn_mpi_group *g, const char *who, const attn_mpi_value *values,
                                 size_t n) {
    if (!g) return ATTN_ERR_NULL;
    attn_clear_error(g->ctx);
    const char *call = "attn_mpi_group_agree";
    attn_status st = ATTN_OK;
    attn_mpi_record rec = {0};
    if (n > ATTN_MPI_RECORD_MAX)
        st = attn_fail(g->ctx, ATTN_ERR_INVALID, "%s: %zu values (at most %d)", call, n,
                       ATTN_MPI_RECORD_MAX);
    else if (n && !values)
        st = attn_fail(g->ctx, ATTN_ERR_NULL, "%s: values is NULL", call);
    for (size_t i = 0; i < n && st == ATTN_OK; i++) {
        const char *name = values[i].name ? values[i].name : "(unnamed)";
        if (values[i].text) attn_mpi_record_text(&rec, name, values[i].text);
        else attn_mpi_record_int(&rec, name, values[i].number);
    }
    /* the caller's own name for what is agreed leads its messages, and is
     * compared whole: steps that differ past any length fail */
    return attn_mpi_agree(g, who ? who : call, st, &rec);
}

int attn_mpi_row_type(size_t n, MPI_Datatype *type) {
    *type = MPI_DATATYPE_NULL;
    if (n > INT_MAX) return MPI_ERR_COUNT;
    int rc = MPI_Type_contiguous((int)n, MPI_FLOAT, type);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(type);
    if (rc != MPI_SUCCESS && *type != MPI_DATATYPE_NULL) MPI_Type_free(type);
    return rc;
}

bool attn_mpi_timeline_reserve(attn_mpi_group *g, size_t n) {
    g->n_steps = 0;
    if (n <= g->steps_cap) return true;
    attn_mpi_step *steps = attn_calloc(n, sizeof *steps);
    if (!steps) return false;
    attn_free(g->steps);
    g->steps = steps;
    g->steps_cap = n;
    return true;
}

size_t attn_mpi_timeline(const attn_mpi_group *g, attn_mpi_step *steps, size_t cap) {
    if (!g) return 0;
    if (steps)
        memcpy(steps, g->steps, (cap < g->n_steps ? cap : g->n_steps) * sizeof *steps);
    return g->n_steps;
}

/* ---- packing ----------------------------------------------------------------------- */

void attn_mpi_pack(float *dst, const float *src, attn_view_strides s, size_t batch,
                   size_t heads, size_t n, size_t D) {
    for (size_t b = 0; b < batch; b++)
        for (size_t h = 0; h < heads; h++)
            for (size_t t = 0; t < n; t++)
                memcpy(dst + ((b * heads + h) * n + t) * D, src + b * s.b + t * s.t + h * s.h,
                       D * sizeof *dst);
}

void attn_mpi_unpack(float *dst, attn_view_strides s, const float *src, size_t batch,
                     size_t heads, size_t n, size_t D) {
    for (size_t b = 0; b < batch; b++)
        for (size_t h = 0; h < heads; h++)
            for (size_t t = 0; t < n; t++)
                memcpy(dst + b * s.b + t * s.t + h * s.h, src + ((b * heads + h) * n + t) * D,
                       D * sizeof *dst);
}

/* ---- the job --------------------------------------------------------------------------- */

attn_status attn_mpi_job_check(attn_mpi_group *g, const char *who, const attn_mpi_job *job) {
    attn_ctx *ctx = g->ctx;
    if (!job->batch || !job->heads || !job->kv_heads || !job->tokens || !job->head_dim)
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "%s: batch (%zu), heads (%zu), kv_heads (%zu), tokens (%zu) and "
                         "head_dim (%zu) must be positive",
                         who, job->batch, job->heads, job->kv_heads, job->tokens, job->head_dim);
    if (job->heads % job->kv_heads)
        return attn_fail(ctx, ATTN_ERR_SHAPE, "%s: kv_heads (%zu) must divide heads (%zu)", who,
                         job->kv_heads, job->heads);
    if (!isfinite(job->scale))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: scale (%g) must be finite", who,
                         (double)job->scale);
    size_t P = (size_t)g->size;
    if (g->mode == ATTN_MPI_ULYSSES && (job->heads % P || job->kv_heads % P))
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "%s: Ulysses splits the heads over the ranks: heads (%zu) and kv_heads "
                         "(%zu) must be divisible by the %zu ranks (use ring or zigzag)",
                         who, job->heads, job->kv_heads, P);
    /* every element count of the largest buffer (the whole sequence's, for
     * Ulysses) must fit size_t, and a chunk's rows int (MPI counts) */
    size_t rows, n;
    if (!attn_mul3_size(job->batch, job->heads + 2 * job->kv_heads, job->tokens, &rows) ||
        !attn_mul_size(rows, job->head_dim, &n) || !attn_floats_fit(n) || rows > INT_MAX)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "%s: (%zu, %zu|%zu, %zu, %zu) is too large for the exchange", who,
                         job->batch, job->heads, job->kv_heads, job->tokens, job->head_dim);
    return ATTN_OK;
}

/* ---- whole tensors ------------------------------------------------------------------------ */

/* Counts and displacements (in rows of width floats) of each rank's part
 * of a (B, tokens, width) tensor packed rank by rank, batch by batch. */
static attn_status token_counts(attn_mpi_group *g, const char *who, size_t batch, size_t tokens,
                                int **counts, int **displs) {
    size_t P = (size_t)g->size, total = 0;
    *counts = attn_calloc(P, sizeof **counts);
    *displs = attn_calloc(P, sizeof **displs);
    if (!*counts || !*displs)
        return attn_fail(g->ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", who);
    for (size_t p = 0; p < P; p++) {
        size_t rows = batch * attn_mpi_local_count(g->mode, tokens, P, p);
        if (total > INT_MAX || rows > INT_MAX - total)
            return attn_fail(g->ctx, ATTN_ERR_OVERFLOW,
                             "%s: %zu x %zu rows are too many for one exchange", who, batch,
                             tokens);
        (*counts)[p] = (int)rows;
        (*displs)[p] = (int)total;
        total += rows;
    }
    return ATTN_OK;
}

/* whole (B, T, W) <-> packed [rank][b][its tokens][W]; to_packed picks the
 * direction. */
static void reorder_tokens(const attn_mpi_group *g, float *whole, float *packed, size_t batch,
                           size_t tokens, size_t width, bool to_packed) {
    size_t P = (size_t)g->size, at = 0;
    for (size_t p = 0; p < P; p++) {
        size_t b0[2], e0[2], n = attn_mpi_local_ranges(g->mode, tokens, P, p, b0, e0, NULL);
        for (size_t b = 0; b < batch; b++)
            for (size_t r = 0; r < n; r++) {
                size_t len = (e0[r] - b0[r]) * width;
                float *w = whole + (b * tokens + b0[r]) * width;
                if (to_packed) memcpy(packed + at, w, len * sizeof *w);
                else memcpy(w, packed + at, len * sizeof *w);
                at += len;
            }
    }
}

static attn_status tokens_begin(attn_mpi_group *g, const char *who, int root, bool is_root_ok,
                                const char *root_name, const float *local, const char *local_name,
                                size_t batch, size_t tokens, size_t width, float **packed,
                                int **counts, int **displs, MPI_Datatype *row) {
    attn_status st = ATTN_OK;
    size_t n = 0;
    *packed = NULL;
    *counts = *displs = NULL;
    *row = MPI_DATATYPE_NULL;
    if (root < 0 || root >= g->size)
        st = attn_fail(g->ctx, ATTN_ERR_INVALID, "%s: root (%d) is not a rank of the %d", who,
                       root, g->size);
    else if (!batch || !tokens || !width)
        st = attn_fail(g->ctx, ATTN_ERR_SHAPE,
                       "%s: batch (%zu), tokens (%zu) and width (%zu) must be positive", who,
                       batch, tokens, width);
    else if (!attn_mul3_size(batch, tokens, width, &n) || !attn_floats_fit(n))
        st = attn_fail(g->ctx, ATTN_ERR_OVERFLOW, "%s: (%zu, %zu, %zu) overflows", who, batch,
                       tokens, width);
    else if (!local)
        st = attn_fail(g->ctx, ATTN_ERR_NULL, "%s: %s is NULL", who, local_name);
    else if (g->rank == root && !is_root_ok)
        st = attn_fail(g->ctx, ATTN_ERR_NULL, "%s: %s is NULL on the root", who, root_name);
    if (st == ATTN_OK) st = token_counts(g, who, batch, tokens, counts, displs);
    if (st == ATTN_OK && g->rank == root && !(*packed = attn_alloc_floats(n)))
        st = attn_fail(g->ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for %zu floats", who, n);
    if (st == ATTN_OK) {
        int rc = attn_mpi_row_type(width, row);
        if (rc != MPI_SUCCESS) st = attn_mpi_error(g, who, "MPI_Type_contiguous", rc);
    }
    attn_mpi_record rec = {0};
    attn_mpi_record_int(&rec, "root", root);
    attn_mpi_record_int(&rec, "batch", (int64_t)batch);
    attn_mpi_record_int(&rec, "tokens", (int64_t)tokens);
    attn_mpi_record_int(&rec, "width", (int64_t)width);
    return attn_mpi_agree(g, who, st, &rec);
}

static void tokens_end(float *packed, int *counts, int *displs, MPI_Datatype *row) {
    attn_free(packed);
    attn_free(counts);
    attn_free(displs);
    if (*row != MPI_DATATYPE_NULL) MPI_Type_free(row);
}

attn_status attn_mpi_scatter_tokens(attn_mpi_group *g, int root, const float *x, size_t batch,
                                    size_t tokens, size_t width, float *x_local) {
    if (!g) return ATTN_ERR_NULL;
    attn_clear_error(g->ctx);
    const char *who = "attn_mpi_scatter_tokens";
    float *packed;
    int *counts, *displs;
    MPI_Datatype row;
    attn_status st = tokens_begin(g, who, root, x != NULL, "x", x_local, "x_local", batch, tokens,
                                  width, &packed, &counts, &displs, &row);
    if (st == ATTN_OK) {
        if (g->rank == root) reorder_tokens(g, (float *)x, packed, batch, tokens, width, true);
        int rc = MPI_Scatterv(packed, counts, displs, row, x_local, counts[g->rank], row, root,
                              g->comm);
        if (rc != MPI_SUCCESS) st = attn_mpi_error(g, who, "MPI_Scatterv", rc);
    }
    tokens_end(packed, counts, displs, &row);
    return st;
}

attn_status attn_mpi_gather_tokens(attn_mpi_group *g, int root, const float *x_local,
                                   size_t batch, size_t tokens, size_t width, float *x) {
    if (!g) return ATTN_ERR_NULL;
    attn_clear_error(g->ctx);
    const char *who = "attn_mpi_gather_tokens";
    float *packed;
    int *counts, *displs;
    MPI_Datatype row;
    attn_status st = tokens_begin(g, who, root, x != NULL, "x", x_local, "x_local", batch, tokens,
                                  width, &packed, &counts, &displs, &row);
    if (st == ATTN_OK) {
        int rc = MPI_Gatherv(x_local, counts[g->rank], row, packed, counts, displs, row, root,
                             g->comm);
        if (rc != MPI_SUCCESS) st = attn_mpi_error(g, who, "MPI_Gatherv", rc);
        else if (g->rank == root) reorder_tokens(g, x, packed, batch, tokens, width, false);
    }
    tokens_end(packed, counts, displs, &row);
    return st;
}
