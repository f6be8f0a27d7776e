/*
 * group.h — what every file of the MPI layer builds on (group.c): the
 * group, the status agreement every collective call makes before it
 * exchanges anything, the chunk layout, and the job that describes the
 * attention over chunks in the strided views the SDPA entry points and the
 * modules both hand it. The attention itself sits above: ring.h,
 * ulysses.h, and sdpa.h, which picks between them.
 */
#ifndef ATTN_MPI_GROUP_H
#define ATTN_MPI_GROUP_H

#include "attn_mpi.h"
#include "internal.h"
#include "attention/attention.h"
#include "modules/module.h"
#include "mask/mask_internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a module forward keeps for its backward (modules.c). */
typedef struct attn_mpi_saved {
    bool valid;
    attn_module *module;
    attn_module_identity *module_id; /* module->cp_id at the forward, held */
    size_t batch, tokens, local;  /* B, global T, T_local */
    float *x;                     /* (B, T_local, d_in) */
    float *acts;                  /* projections (B, T_local, 3C), context (B, T_local, C) */
    float *lse;                   /* (B, H, T_local) */
    float *head_stats;            /* Ulysses: the job's head_stats; else NULL */
    uint64_t *versions;           /* the module's parameters' versions at the forward */
} attn_mpi_saved;

/* Frees what s holds and clears it. */
void attn_mpi_saved_free(attn_mpi_saved *s);

/* The sub-maps a block map gives a rank's attention (ring.c: one per
 * (step, query range, key range) pair; ulysses.c: the rank's heads), kept
 * for the next call over the same map (its checksum) and causality (the
 * ring builds none for the pairs causality skips), as a backward after its
 * forward is: built once for both. */
typedef struct attn_mpi_maps {
    bool valid, causal;
    uint64_t checksum;
    size_t n;
    attn_block_mask **sub; /* (n); NULL where the map leaves nothing to see */
} attn_mpi_maps;

/* Frees what m holds and clears it. */
void attn_mpi_maps_free(attn_mpi_maps *m);

struct attn_mpi_group {
    attn_ctx *ctx;
    MPI_Comm comm; /* a duplicate: our tags meet no one else's */
    int rank, size;
    attn_mpi_mode mode;
    attn_mpi_step *steps; /* the last pass's timeline */
    size_t n_steps, steps_cap;
    attn_mpi_saved saved;
    attn_mpi_maps maps;
};

/*
 * The agreement record of a collective call: every value its ranks must
 * share, one field per value, added one line each (attn_mpi_record_int and
 * its siblings). A field is compared by its key (the number, the bits of a
 * real, a hash of a text) and shown by its text, rendered on the rank that
 * holds it: a disagreement names each side's value as that rank wrote it.
 */
#define ATTN_MPI_RECORD_MAX 32
#define ATTN_MPI_TEXT_MAX 64
typedef struct attn_mpi_field {
    const char *name;
    int64_t key;
    char text[ATTN_MPI_TEXT_MAX];
} attn_mpi_field;
typedef struct attn_mpi_record {
    size_t n;
    attn_mpi_field f[ATTN_MPI_RECORD_MAX];
} attn_mpi_record;

/* A field of r: a count or flag; a float (compared bit for bit); a 64-bit
 * checksum (shown in hex); a text (compared by its hash). Fields past
 * ATTN_MPI_RECORD_MAX are a programming error the record refuses in
 * attn_mpi_agree. */
void attn_mpi_record_int(attn_mpi_record *r, const char *name, int64_t value);
void attn_mpi_record_float(attn_mpi_record *r, const char *name, float value);
void attn_mpi_record_hex(attn_mpi_record *r, const char *name, uint64_t value);
void attn_mpi_record_text(attn_mpi_record *r, const char *name, const char *value);

/* A 64-bit hash of n bytes, continuing h (start from ATTN_MPI_HASH_SEED). */
#define ATTN_MPI_HASH_SEED 0x84222325cbf29ce4ull
uint64_t attn_mpi_hash(uint64_t h, const void *data, size_t n);

/*
 * Every rank's outcome of its local part (checks, allocations), agreed on
 * before any exchange that could block: st is this rank's status (its
 * message in the ctx), rec (may be NULL) the values every rank must share.
 * One MPI_Allreduce of a record of fixed size, whatever the call, so that
 * ranks in different calls meet in it too. In order: ranks in different
 * calls (who differs) or groups of another mode fail with both sides
 * named; then a failing rank's status becomes every rank's (the lowest
 * failing rank's, its message prefixed with "rank R: " on the others);
 * then a field that differs fails everywhere, naming it and the value of
 * the lowest rank on each side ("the ranks disagree on tokens: rank 0 50,
 * rank 1 51"). Returns ATTN_OK on every rank, or the same failure on every
 * rank.
 */
attn_status attn_mpi_agree(attn_mpi_group *g, const char *who, attn_status st,
                           const attn_mpi_record *rec);

/* A failed MPI call (the communicator returns errors): its message. */
attn_status attn_mpi_error(attn_mpi_group *g, const char *who, const char *call, int code);

/* The token count of rank's chunk. */
size_t attn_mpi_local_count(attn_mpi_mode mode, size_t tokens, size_t ranks, size_t rank);

/* Steps of the timeline: room for n (false when out of memory). */
bool attn_mpi_timeline_reserve(attn_mpi_group *g, size_t n);

/* An MPI type of n contiguous floats (a row): counts then fit int for
 * far longer sequences. *type is MPI_DATATYPE_NULL on failure. */
int attn_mpi_row_type(size_t n, MPI_Datatype *type);

/*
 * Attention over chunks: this rank's views, t the local token (T_local
 * rows), every view (b, t, h)-strided with each head's D floats
 * contiguous. Forward: q, k, v in, out out, lse (B, H, T_local) out when
 * not NULL. Backward: q, k, v, out, lse (required), dout in; dq, dk, dv
 * out (with q's, k's, v's strides).
 */
typedef struct attn_mpi_job {
    size_t batch, heads, kv_heads, tokens, head_dim, local;
    float scale;
    bool causal;
    /* the keys each query sees over the whole sequence (tokens x tokens),
     * ANDed with causal, or NULL; its checksum (attn_mpi_map_checksum) */
    const attn_block_map *map;
    uint64_t map_checksum;
    const float *q, *k, *v;
    attn_view_strides q_s, k_s, v_s, out_s; /* dout has out's strides */
    float *out;
    float *lse;
    const float *dout;
    float *dq, *dk, *dv;
    /* Ulysses, optional: the rank's heads' lse_lo and row statistics
     * (attention_problem.h), lse_lo (B, H / P, T) then row_stats (2 floats a
     * row), written by the forward and read by the backward on the same
     * rank, which then takes each weight as one process's module does */
    float *head_stats;
} attn_mpi_job;

/* A 64-bit checksum of m's geometry and content (which tiles are full,
 * which partial, and the partial tiles' bits): equal maps, however built,
 * give equal checksums. */
uint64_t attn_mpi_map_checksum(const attn_block_map *m);

/* The job's checks every rank makes alike (heads, sizes): ATTN_OK or the
 * failure, recorded in the ctx. */
attn_status attn_mpi_job_check(attn_mpi_group *g, const char *who, const attn_mpi_job *job);

/* dst (B, Hx, n, D) contiguous <- the strided view src of n tokens, and
 * back. */
void attn_mpi_pack(float *dst, const float *src, attn_view_strides s, size_t batch,
                   size_t heads, size_t n, size_t D);
void attn_mpi_unpack(float *dst, attn_view_strides s, const float *src, size_t batch,
                     size_t heads, size_t n, size_t D);

#endif /* ATTN_MPI_GROUP_H */
