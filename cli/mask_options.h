/*
 * mask_options.h — the options that say which keys each query sees, shared
 * by attn sdpa and attn mask: a dense --mask, the mask descriptions
 * (--prefix-lm, --doc-ids, --chunk) ANDed together, block lists
 * (--block-topk) and --block-size, parsed the same way and built into one
 * attn_block_mask the same way, so that attn mask draws the very map attn
 * sdpa runs.
 */
#ifndef ATTN_CLI_MASK_OPTIONS_H
#define ATTN_CLI_MASK_OPTIONS_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The value options below, for a command's NULL-terminated list. */
#define CLI_MASK_VALUE_OPTIONS \
    "--mask", "--prefix-lm", "--doc-ids", "--chunk", "--block-topk", "--block-size"

/* The help lines of those options, for a command's --help. */
#define CLI_MASK_HELP                                                                        \
    "  --mask F.npy    a dense mask broadcastable to (B, H, T, S) as NumPy broadcasts\n"     \
    "                  (rank <= 4, dims of 1 repeat): bool or integer (nonzero:\n"            \
    "                  visible), or float and additive (-inf hides; the finite\n"            \
    "                  values are added to the scores, after every other modifier)\n"       \
    "  --prefix-lm N   keys j <= i or j < N: a bidirectional prefix of N tokens\n"            \
    "  --doc-ids F.npy packed documents: int ids, (T,) or (B, T); query i sees key j\n"      \
    "                  only in its own document (T == S)\n"                                  \
    "  --chunk N       chunked attention: pos_i / N == j / N (Llama 4)\n"                   \
    "                  (--prefix-lm, --doc-ids and --chunk are ANDed into one map)\n"       \
    "  --block-topk F.npy  int (B|1, H|1, QB, K): per query block of the map, the key\n"    \
    "                  blocks it visits (negative entries are padding), each\n"             \
    "                  holding the elements the options above leave visible\n"             \
    "  --block-size N  the map's tiles, N by N: 16 to 256, a power of two (64)\n"

typedef struct cli_mask_options {
    const char *mask, *doc_ids, *block_topk;
    bool prefix_given, chunk_given;
    int64_t prefix;
    size_t chunk;
    size_t block_size; /* 0: the default, 64 */
} cli_mask_options;

/* Where the map goes: its shape, and (attn mask only) causal and window
 * drawn into it; attn sdpa leaves those to its config, which the library
 * ANDs with the map. offset is each query's position less its index (S - T
 * for bottom-right alignment): chunks and causal count from there. */
typedef struct cli_mask_geometry {
    size_t batch, heads, q_len, kv_len;
    int64_t offset;
    bool causal, window;
    int64_t window_left, window_right;
} cli_mask_geometry;

/* What was built: the map (NULL when no option asks for one) and, for a
 * float --mask, its values as an ATTN_SCORE_BIAS over (B, H, T, S). */
typedef struct cli_mask_built {
    attn_block_mask *map;
    bool additive;
    attn_npy values;      /* the float mask (additive) */
    size_t strides[4];    /* its element strides over (b, h, q_idx, kv_idx), 0 broadcasting */
} cli_mask_built;

/* A signed decimal integer, the whole text. */
bool cli_parse_ll(const char *text, long long *out);

/* A position offset (--offset, --q-offset, --rel-offset): a signed integer
 * within the library's bound on positions, +-2^62; a usage error naming opt
 * and the text otherwise, so that a value past it is not refused later under
 * the name of the mask or the field that reads it. */
int cli_parse_offset(const char *opt, const char *text, long long *out);

/* --window L,R: two integers, each -1 (unbounded) or more; a usage error
 * naming opt and the text otherwise. */
int cli_parse_window(const char *opt, const char *text, long long *left, long long *right);

/* Takes opt's value when opt is one of CLI_MASK_VALUE_OPTIONS (*taken set),
 * a usage error naming a bad value. */
int cli_mask_take(cli_mask_options *m, const char *opt, const char *value, bool *taken);

/* The combinations refused: --mask with --block-topk, --mask with a mask
 * description (one map per call). */
int cli_mask_check(const cli_mask_options *m);

/* Whether any option asks for a map (--block-size alone does not). */
bool cli_mask_wanted(const cli_mask_options *m);

/* The input files these options read, for cli_outputs_not_input:
 * opts[i], paths[i] for i < *count (at most 3). */
void cli_mask_inputs(const cli_mask_options *m, const char *opts[3], const char *paths[3],
                     size_t *count);

/* Element strides of an array of rank <= 4 and shape broadcast to target
 * (B, H, T, S) as NumPy does (right-aligned, dims of 1 stride 0); a usage
 * error naming opt, both shapes otherwise. */
int cli_broadcast_strides(const char *opt, size_t rank, const size_t *shape,
                          const size_t target[4], size_t strides[4]);

/* Reads the files and builds the map for geometry g into *out (zeroed
 * first; free with cli_mask_built_free whatever the result). Errors: a
 * usage error naming the option and the value or both shapes, or the
 * library's message (exit 1). */
int cli_mask_build(attn_ctx *ctx, const cli_mask_options *m, const cli_mask_geometry *g,
                   cli_mask_built *out);
void cli_mask_built_free(cli_mask_built *b);

#endif /* ATTN_CLI_MASK_OPTIONS_H */
