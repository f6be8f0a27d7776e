/* cmd_sdpa.c — attn sdpa: scaled dot-product attention on .npy tensors,
 * every feature of attn_sdpa_config (GQA, alignment, sliding window,
 * softcap, ALiBi, sinks, packed variable-length batches, Philox dropout,
 * block maps and score modifiers), forward and, given dL/dout, backward. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "mask_options.h"
#include "outputs.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char sdpa_help[] =
    "usage: attn sdpa --q q.npy --k k.npy --v v.npy --output o.npy [--lse lse.npy]\n"
    "                 [--causal] [--align bottom-right|top-left] [--q-offset N]\n"
    "                 [--scale S] [--window L,R] [--softcap C] [--alibi slopes.npy]\n"
    "                 [--sinks s.npy] [--cu-seqlens-q a.npy --cu-seqlens-kv b.npy]\n"
    "                 [--dropout P [--seed S]] [--grad-output do.npy --grad-dir DIR]\n"
    "                 [--threads N] [--kernels auto|reference|portable|avx2|avx512]\n"
    "                 [--explain] [--mask m.npy | --block-topk t.npy] [--prefix-lm N]\n"
    "                 [--doc-ids ids.npy] [--chunk N] [--block-size N] [--bias b.npy]\n"
    "                 [--rel-bias-table t.npy [--rel-buckets N]\n"
    "                 [--rel-max-distance M] [--rel-bidirectional] |\n"
    "                 [--rel-offset C] [--rel-signed]]\n"
    "\n"
    "Scaled dot-product attention on .npy tensors (attn_sdpa_forward; with\n"
    "--grad-output also attn_sdpa_backward):\n"
    "  out[b, h, i] = sum_j dropout(P[b, h, i, j]) v[b, h / G, j]\n"
    "  P[b, h, i, :] = softmax over the keys j query i sees (and the head's sink)\n"
    "                  of softcap(q_i . k_j * scale) - slope_h * |pos_i - j|\n"
    "Inputs are float32 (or float64) .npy files:\n"
    "  q (B, H, T, D), k (B, H_kv, S, D), v (B, H_kv, S, Dv): H_kv divides H, and\n"
    "  query heads h*G .. h*G+G-1 (G = H / H_kv) share KV head h (GQA, MQA);\n"
    "  with --cu-seqlens-q/-kv, packed: q (total_q, H, D), k (total_kv, H_kv, D),\n"
    "  v (total_kv, H_kv, Dv), sequence b being rows cu[b] .. cu[b + 1] - 1.\n"
    "--output is written in q's layout with Dv features, (B, H, T, Dv) or\n"
    "(total_q, H, Dv); --lse, each row's log-sum-exp, (B, H, T) or (H, total_q).\n"
    "A query that sees no key outputs zeros and lse -inf (with a sink: the sink).\n"
    "\n"
    "  --causal        hides key j from query i when j > pos_i\n"
    "  --align A       where query i sits among the keys: bottom-right (default,\n"
    "                  pos_i = i + S - T: the last query sees every key, as in\n"
    "                  FlashAttention and a KV cache) or top-left (pos_i = i, as\n"
    "                  PyTorch's is_causal)\n"
    "  --q-offset N    pos_i = i + N instead (N may be negative)\n"
    "  --scale S       multiplies q . k, rounded to float32; 0 or absent: 1/sqrt(D)\n"
    "  --window L,R    query i sees keys pos_i - L .. pos_i + R, -1 unbounded\n"
    "                  (FlashAttention-2's window_size; the book's sliding window\n"
    "                  of W tokens is --window W-1,0 --causal)\n"
    "  --softcap C     s = C * tanh(s / C) after the scale (Gemma 2); 0: off\n"
    "  --alibi F.npy   ALiBi slopes, (H) floats: s -= slope_h * |pos_i - j|\n"
    "  --sinks F.npy   one logit per head, (H) floats, in each row's softmax\n"
    "                  denominator, with no value (gpt-oss)\n"
    "  --cu-seqlens-q F.npy, --cu-seqlens-kv F.npy\n"
    "                  a packed variable-length batch: B + 1 cumulative offsets\n"
    "                  each (int32 or int64 .npy), rising from 0 to the rows of\n"
    "                  q, and of k and v\n"
    "  --dropout P     drops each weight with probability P and scales the rest\n"
    "                  by 1 / (1 - P), by the Philox mask drawn inside the kernels\n"
    "                  (the same for any kernels and thread count)\n"
    "  --seed S        the Philox key of the mask (default 123)\n"
    "  --grad-output F.npy  dL/dout, shaped as the output: runs the backward and\n"
    "                  writes dq.npy, dk.npy, dv.npy (and dsinks.npy with --sinks)\n"
    "  --grad-dir DIR  where the gradients go (created if missing)\n"
    "  --threads N     worker threads (default: all online CPUs)\n"
    "  --kernels K     auto (default: the fastest this CPU runs, or the\n"
    "                  ATTN_KERNELS environment variable), reference (the\n"
    "                  double-accumulating loops, closest to exact), portable,\n"
    "                  avx2 or avx512\n"
    "  --explain       after each pass, one line on stderr: the backends the\n"
    "                  runner asked in order, why each declined, and which ran\n"
    "                  on which kernels (attn_ctx_last_explain)\n"
    "\n"
    "Programmable attention: a block map of the keys each query sees (ANDed with\n"
    "--causal and --window) and score modifiers; 'attn mask' draws the map.\n"
    CLI_MASK_HELP
    "                  (one map per call: --mask goes with neither --block-topk\n"
    "                  nor a description)\n"
    "  --bias F.npy    float, broadcastable to (B, H, T, S): added to the scores\n"
    "                  (-inf hides a key; NaN and +inf are refused); with\n"
    "                  --grad-output its gradient dbias.npy, in its shape\n"
    "  --rel-bias-table F.npy  T5's relative position bias, (H, N) floats: s +=\n"
    "                  table[h, bucket(j - i)]; gradient drel_bias_table.npy\n"
    "  --rel-buckets N the table's buckets (default: its N; given, it must be N)\n"
    "  --rel-max-distance M  T5's max_distance (default 128)\n"
    "  --rel-bidirectional   T5's bidirectional buckets (keys before and after)\n"
    "  --rel-offset C  the table read by distance instead of T5's buckets: s +=\n"
    "                  table[h, i - j + C], a negative index from the row's end\n"
    "                  (Python's); every index the lengths reach must be in\n"
    "                  [-N, N)\n"
    "  --rel-signed    with --rel-offset: table[h, j - i + C]\n"
    "With --bias, --rel-bias-table or a float --mask the scores go through a chain\n"
    "of modifiers in this order: --softcap, --alibi, --bias, --rel-bias-table, the\n"
    "float --mask's values (so s = softcap(q . k * scale) - alibi + bias + ...).\n"
    "With --cu-seqlens the map and the modifiers are in each sequence's own\n"
    "positions (flash_attn_varlen's): B is the number of sequences, T and S the\n"
    "longest lengths, and sequence b's query i, key j is element (b, h, i, j) of\n"
    "--mask, --doc-ids, --bias and --block-topk; --chunk, and --alibi beside a\n"
    "chain, need one position offset for every sequence (--align top-left,\n"
    "--q-offset, or equal S - T per sequence).\n"
    "With --align top-left and no window, softcap, ALiBi, sinks or dropout, out is\n"
    "PyTorch's F.scaled_dot_product_attention(q, k, v, is_causal=causal,\n"
    "scale=scale).\n";

static const char *const sdpa_value_options[] = {
    "--q",        "--k",         "--v",       "--output",        "--lse",
    "--align",    "--q-offset",  "--scale",   "--window",        "--softcap",
    "--alibi",    "--sinks",     "--cu-seqlens-q", "--cu-seqlens-kv", "--dropout",
    "--seed",     "--grad-output", "--grad-dir", "--threads",    "--kernels",
    CLI_MASK_VALUE_OPTIONS, "--bias", "--rel-bias-table", "--rel-buckets", "--rel-max-distance",
    "--rel-offset", NULL};

typedef struct sdpa_options {
    const char *q, *k, *v, *output, *lse, *alibi, *sinks, *cu_q, *cu_kv;
    const char *grad_output, *grad_dir, *bias, *rel_table;
    cli_mask_options map;
    size_t rel_buckets, rel_max_distance;
    bool rel_bidirectional, rel_given;       /* T5's options given */
    long long rel_offset;                    /* --rel-offset: the table read by distance */
    bool rel_by_distance, rel_signed;
    bool causal, align_given, offset_given, seed_given, explain;
    attn_align align;
    long long q_offset;
    double scale;
    bool window;
    long long window_left, window_right;
    double softcap, dropout;
    uint64_t seed;
    size_t threads;
    attn_kernels kernels;
} sdpa_options;

/* ---- argument parsing ---------------------------------------------------- */

/* One value option. */
static int take_value(sdpa_options *o, const char *opt, const char *value) {
    const char **path = strcmp(opt, "--q") == 0               ? &o->q
                        : strcmp(opt, "--k") == 0             ? &o->k
                        : strcmp(opt, "--v") == 0             ? &o->v
                        : strcmp(opt, "--output") == 0        ? &o->output
                        : strcmp(opt, "--lse") == 0           ? &o->lse
                        : strcmp(opt, "--alibi") == 0         ? &o->alibi
                        : strcmp(opt, "--sinks") == 0         ? &o->sinks
                        : strcmp(opt, "--cu-seqlens-q") == 0  ? &o->cu_q
                        : strcmp(opt, "--cu-seqlens-kv") == 0 ? &o->cu_kv
                        : strcmp(opt, "--grad-output") == 0   ? &o->grad_output
                        : strcmp(opt, "--grad-dir") == 0      ? &o->grad_dir
                        : strcmp(opt, "--bias") == 0          ? &o->bias
                        : strcmp(opt, "--rel-bias-table") == 0 ? &o->rel_table
                                                              : NULL;
    if (path) {
        *path = value;
        return CLI_OK;
    }
    bool taken;
    int rc = cli_mask_take(&o->map, opt, value, &taken);
    if (taken) return rc;
    if (strcmp(opt, "--align") == 0) {
        if (strcmp(value, "bottom-right") == 0) o->align = ATTN_ALIGN_BOTTOM_RIGHT;
        else if (strcmp(value, "top-left") == 0) o->align = ATTN_ALIGN_TOP_LEFT;
        else return cli_usage_error("--align: expected bottom-right or top-left, got '%s'", value);
        o->align_given = true;
    } else if (strcmp(opt, "--q-offset") == 0) {
        o->offset_given = true;
        return cli_parse_offset(opt, value, &o->q_offset);
    } else if (strcmp(opt, "--scale") == 0) {
        if (!cli_parse_double(value, &o->scale)) return cli_bad_number(opt, value, "a number");
        if (!isfinite(o->scale))
            return cli_usage_error("--scale: expected a finite number, got '%s'", value);
    } else if (strcmp(opt, "--window") == 0) {
        o->window = true;
        return cli_parse_window(opt, value, &o->window_left, &o->window_right);
    } else if (strcmp(opt, "--softcap") == 0) {
        if (!cli_parse_double(value, &o->softcap)) return cli_bad_number(opt, value, "a number");
        if (!(o->softcap >= 0.0) || isinf(o->softcap))
            return cli_usage_error("--softcap: expected a finite number >= 0 (0: off), got '%s'",
                                   value);
    } else if (strcmp(opt, "--dropout") == 0) {
        if (!cli_parse_double(value, &o->dropout))
            return cli_bad_number(opt, value, "a probability in [0, 1)");
        if (!(o->dropout >= 0.0 && o->dropout < 1.0))
            return cli_usage_error("--dropout: expected a probability in [0, 1), got '%s'", value);
    } else if (strcmp(opt, "--seed") == 0) {
        if (!cli_parse_u64(value, &o->seed))
            return cli_usage_error("--seed: expected a non-negative integer, got '%s'", value);
        o->seed_given = true;
    } else if (strcmp(opt, "--rel-buckets") == 0 || strcmp(opt, "--rel-max-distance") == 0) {
        size_t *n = opt[6] == 'b' ? &o->rel_buckets : &o->rel_max_distance;
        if (!cli_parse_size(value, n) || *n == 0)
            return cli_usage_error("%s: expected a positive integer, got '%s'", opt, value);
        o->rel_given = true;
    } else if (strcmp(opt, "--rel-offset") == 0) {
        o->rel_by_distance = true;
        return cli_parse_offset(opt, value, &o->rel_offset);
    } else if (strcmp(opt, "--threads") == 0) {
        if (!cli_parse_size(value, &o->threads) || o->threads == 0)
            return cli_usage_error("--threads: expected a positive integer, got '%s'", value);
    } else { /* --kernels */
        return cli_parse_kernels(value, &o->kernels);
    }
    return CLI_OK;
}

static int parse_args(int argc, char **argv, sdpa_options *o) {
    *o = (sdpa_options){.seed = 123, .threads = cli_default_threads(),
                        .kernels = ATTN_KERNELS_AUTO, .rel_max_distance = 128};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rel-bidirectional") == 0) {
            o->rel_bidirectional = o->rel_given = true;
            continue;
        }
        if (strcmp(argv[i], "--rel-signed") == 0) {
            o->rel_signed = true;
            continue;
        }
        if (strcmp(argv[i], "--causal") == 0 || strcmp(argv[i], "--explain") == 0) {
            *(strcmp(argv[i], "--causal") == 0 ? &o->causal : &o->explain) = true;
            continue;
        }
        const char *value = cli_option_value(argc, argv, &i, sdpa_value_options);
        if (!value || take_value(o, argv[i - 1], value) != CLI_OK) return CLI_USAGE;
    }
    if (!o->q || !o->k || !o->v || !o->output)
        return cli_usage_error("sdpa: --q, --k, --v and --output are required (try 'attn sdpa "
                               "--help')");
    if (o->align_given && o->offset_given)
        return cli_usage_error("sdpa: --q-offset places the queries itself: drop --align");
    if (o->offset_given) o->align = ATTN_ALIGN_OFFSET;
    if (!o->cu_q != !o->cu_kv)
        return cli_usage_error("sdpa: --cu-seqlens-q and --cu-seqlens-kv go together");
    if (!o->grad_output != !o->grad_dir)
        return cli_usage_error("sdpa: --grad-output and --grad-dir go together");
    int rc = cli_mask_check(&o->map);
    if (rc != CLI_OK) return rc;
    if (o->rel_given && !o->rel_table)
        return cli_usage_error("sdpa: --rel-buckets, --rel-max-distance and --rel-bidirectional "
                               "go with --rel-bias-table");
    if (o->rel_signed && !o->rel_by_distance)
        return cli_usage_error("sdpa: --rel-signed goes with --rel-offset");
    if (o->rel_by_distance && !o->rel_table)
        return cli_usage_error("sdpa: --rel-offset goes with --rel-bias-table");
    if (o->rel_by_distance && o->rel_given)
        return cli_usage_error("sdpa: --rel-offset reads the table by distance; T5's "
                               "--rel-buckets, --rel-max-distance and --rel-bidirectional do "
                               "not apply");
    return CLI_OK;
}

static int parse_sdpa(int argc, char **argv) {
    sdpa_options o;
    return parse_args(argc, argv, &o);
}

/* ---- cu_seqlens: a 1-D int32 or int64 .npy ------------------------------- */

/* Offsets 0 = cu[0] <= cu[1] <= ... <= cu[B] = rows; the longest length. */
static int check_offsets(const char *opt, const int32_t *cu, size_t n, size_t rows,
                         size_t *longest) {
    if (cu[0] != 0)
        return cli_usage_error("%s: the offsets must start at 0, not %d", opt, (int)cu[0]);
    *longest = 0;
    for (size_t b = 0; b + 1 < n; b++) {
        if (cu[b + 1] < cu[b])
            return cli_usage_error("%s: offsets must not decrease: cu[%zu] = %d > cu[%zu] = %d",
                                   opt, b, (int)cu[b], b + 1, (int)cu[b + 1]);
        size_t length = (size_t)(cu[b + 1] - cu[b]);
        if (length > *longest) *longest = length;
    }
    if ((size_t)cu[n - 1] != rows)
        return cli_usage_error("%s: the last offset (%d) must be the number of rows (%zu)", opt,
                               (int)cu[n - 1], rows);
    return CLI_OK;
}

/* ---- running -------------------------------------------------------------- */

/* a * b * c * d, false on overflow. */
static bool product(const size_t *dims, size_t n, size_t *out) {
    size_t p = 1;
    for (size_t i = 0; i < n; i++) {
        if (dims[i] && p > (size_t)-1 / sizeof(float) / dims[i]) return false;
        p *= dims[i];
    }
    *out = p;
    return true;
}

/* Reads a float32 (or float64) .npy; a failure is the library's message. */
static int read_floats(attn_ctx *ctx, const char *opt, const char *path, attn_npy *out) {
    return attn_npy_read(ctx, path, out) == ATTN_OK ? CLI_OK : cli_library_error(ctx, opt);
}

/* Reads path, a 1-D int32 or int64 .npy of values that fit int32 (the
 * library checks dtype and range, and names the value at fault). */
static int read_offsets(attn_ctx *ctx, const char *opt, const char *path, attn_npy_i32 *out) {
    if (attn_npy_read_i32(ctx, path, out) != ATTN_OK) return cli_library_error(ctx, opt);
    if (out->ndim == 1) return CLI_OK;
    char got[128];
    cli_format_shape(got, sizeof got, out->ndim, out->shape);
    return cli_usage_error("%s: '%s' must be one-dimensional, (B + 1,), not %s", opt, path, got);
}

/* CLI_OK when a has the given shape, else a usage error: "--sinks: shape
 * (3,) must be (4,): one per query head". */
static int want_shape(const char *opt, const attn_npy *a, size_t rank, const size_t *shape,
                      const char *why) {
    bool same = a->ndim == rank;
    for (size_t i = 0; same && i < rank; i++) same = a->shape[i] == shape[i];
    if (same) return CLI_OK;
    char want[128], got[128];
    cli_format_shape(want, sizeof want, rank, shape);
    cli_format_shape(got, sizeof got, a->ndim, a->shape);
    return cli_usage_error("%s: shape %s must be %s: %s", opt, got, want, why);
}

/* CLI_OK when every value of a per-head array (--alibi, --sinks) is finite,
 * else a failure naming the option, the file and the head: the library's
 * own check names only its config field. */
static int finite_per_head(const char *opt, const char *path, const attn_npy *a,
                           const char *what) {
    for (size_t i = 0; i < a->numel; i++)
        if (!isfinite(a->data[i]))
            return cli_failure("%s: '%s' holds %g at (%zu,): each query head's %s must be finite",
                               opt, path, (double)a->data[i], i, what);
    return CLI_OK;
}

typedef struct sdpa_run {
    attn_ctx *ctx;
    attn_rng *rng;
    attn_npy q, k, v, alibi, sinks, dout, bias, rel_table;
    attn_npy_i32 cu_q, cu_kv;
    cli_mask_built map;
    attn_score_mod mods[5]; /* softcap, alibi, bias, rel-bias, the float mask */
    size_t mod_count;
    float *out, *lse, *dq, *dk, *dv, *dsinks, *dbias, *drel;
} sdpa_run;

static void sdpa_run_close(sdpa_run *r) {
    attn_npy *arrays[] = {&r->q, &r->k, &r->v, &r->alibi, &r->sinks, &r->dout, &r->bias,
                          &r->rel_table};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) attn_npy_free(arrays[i]);
    cli_mask_built_free(&r->map);
    float *buffers[] = {r->out, r->lse, r->dq, r->dk, r->dv, r->dsinks, r->dbias, r->drel};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) free(buffers[i]);
    attn_npy_i32_free(&r->cu_q);
    attn_npy_i32_free(&r->cu_kv);
    attn_rng_free(r->rng);
    attn_ctx_free(r->ctx);
}

/* Reads the tensors and fills cfg's shape and strides; out_shape, lse_shape
 * get the output's shapes (ranks in *out_rank, *lse_rank). */
static int read_inputs(sdpa_run *r, const sdpa_options *o, attn_sdpa_config *cfg,
                       size_t out_shape[4], size_t *out_rank, size_t lse_shape[3],
                       size_t *lse_rank) {
    int rc;
    if ((rc = read_floats(r->ctx, "--q", o->q, &r->q)) != CLI_OK ||
        (rc = read_floats(r->ctx, "--k", o->k, &r->k)) != CLI_OK ||
        (rc = read_floats(r->ctx, "--v", o->v, &r->v)) != CLI_OK)
        return rc;
    const attn_npy *q = &r->q, *k = &r->k, *v = &r->v;
    bool packed = o->cu_q != NULL;
    size_t rank = packed ? 3 : 4;
    const char *layout = packed ? "(total, H, D)" : "(B, H, T, D)";
    const attn_npy *tensors[] = {q, k, v};
    const char *names[] = {"--q", "--k", "--v"}, *paths[] = {o->q, o->k, o->v};
    for (size_t i = 0; i < 3; i++) {
        if (tensors[i]->ndim != rank) {
            char got[128];
            cli_format_shape(got, sizeof got, tensors[i]->ndim, tensors[i]->shape);
            return cli_usage_error("%s: '%s' is %s: expected %zu dimensions %s%s, got %zu",
                                   names[i], paths[i], got, rank, layout,
                                   packed ? " with --cu-seqlens" : "", tensors[i]->ndim);
        }
        for (size_t d = 0; d < rank; d++)
            if (!tensors[i]->shape[d]) {
                char got[128];
                cli_format_shape(got, sizeof got, rank, tensors[i]->shape);
                return cli_usage_error("%s: empty shape %s", names[i], got);
            }
    }
    /* dims from the end: D, then T (dense) or H (packed) */
    size_t D = q->shape[rank - 1], Dv = v->shape[rank - 1];
    size_t H = q->shape[rank - 3 + (packed ? 1 : 0)];
    size_t Hkv = k->shape[rank - 3 + (packed ? 1 : 0)];
    if (k->shape[rank - 1] != D)
        return cli_usage_error("--k: head_dim %zu does not match q's %zu", k->shape[rank - 1], D);
    for (size_t d = 0; d + 1 < rank; d++)
        if (v->shape[d] != k->shape[d]) {
            char ks[128], vs[128];
            cli_format_shape(ks, sizeof ks, rank, k->shape);
            cli_format_shape(vs, sizeof vs, rank, v->shape);
            return cli_usage_error("--v: shape %s must match k's %s in all but the last dimension",
                                   vs, ks);
        }
    cfg->heads = H;
    cfg->kv_heads = Hkv;
    cfg->head_dim = D;
    cfg->v_head_dim = Dv;
    if (packed) {
        size_t Tq, Tk;
        if ((rc = read_offsets(r->ctx, "--cu-seqlens-q", o->cu_q, &r->cu_q)) != CLI_OK ||
            (rc = read_offsets(r->ctx, "--cu-seqlens-kv", o->cu_kv, &r->cu_kv)) != CLI_OK)
            return rc;
        size_t nq = r->cu_q.numel, nkv = r->cu_kv.numel;
        if (nq < 2 || nq != nkv)
            return cli_usage_error("--cu-seqlens-q and --cu-seqlens-kv: expected B + 1 >= 2 "
                                   "offsets each, got %zu and %zu",
                                   nq, nkv);
        if ((rc = check_offsets("--cu-seqlens-q", r->cu_q.data, nq, q->shape[0], &Tq)) != CLI_OK ||
            (rc = check_offsets("--cu-seqlens-kv", r->cu_kv.data, nkv, k->shape[0], &Tk)) != CLI_OK)
            return rc;
        cfg->batch = nq - 1;
        cfg->q_tokens = Tq;
        cfg->kv_tokens = Tk;
        cfg->cu_seqlens_q = r->cu_q.data;
        cfg->cu_seqlens_kv = r->cu_kv.data;
        /* (total, H, D): b strides ignored */
        cfg->q_strides[1] = H * D, cfg->q_strides[2] = D;
        cfg->kv_strides[1] = Hkv * D, cfg->kv_strides[2] = D;
        cfg->v_strides[1] = Hkv * Dv, cfg->v_strides[2] = Dv;
        cfg->out_strides[1] = H * Dv, cfg->out_strides[2] = Dv;
        out_shape[0] = q->shape[0], out_shape[1] = H, out_shape[2] = Dv;
        *out_rank = 3;
        lse_shape[0] = H, lse_shape[1] = q->shape[0];
        *lse_rank = 2;
    } else {
        size_t B = q->shape[0], T = q->shape[2], S = k->shape[2];
        if (k->shape[0] != B)
            return cli_usage_error("--k: batch %zu does not match q's %zu", k->shape[0], B);
        cfg->batch = B;
        cfg->q_tokens = T;
        cfg->kv_tokens = S;
        /* (B, H, T, D) as (b, t, h) strides */
        cfg->q_strides[0] = H * T * D, cfg->q_strides[1] = D, cfg->q_strides[2] = T * D;
        cfg->kv_strides[0] = Hkv * S * D, cfg->kv_strides[1] = D, cfg->kv_strides[2] = S * D;
        cfg->v_strides[0] = Hkv * S * Dv, cfg->v_strides[1] = Dv, cfg->v_strides[2] = S * Dv;
        cfg->out_strides[0] = H * T * Dv, cfg->out_strides[1] = Dv, cfg->out_strides[2] = T * Dv;
        out_shape[0] = B, out_shape[1] = H, out_shape[2] = T, out_shape[3] = Dv;
        *out_rank = 4;
        lse_shape[0] = B, lse_shape[1] = H, lse_shape[2] = T;
        *lse_rank = 3;
    }
    size_t heads[1] = {H};
    if (o->alibi) {
        if ((rc = read_floats(r->ctx, "--alibi", o->alibi, &r->alibi)) != CLI_OK ||
            (rc = want_shape("--alibi", &r->alibi, 1, heads, "one per query head")) != CLI_OK ||
            (rc = finite_per_head("--alibi", o->alibi, &r->alibi, "slope")) != CLI_OK)
            return rc;
        cfg->alibi_slopes = r->alibi.data;
    }
    if (o->sinks) {
        if ((rc = read_floats(r->ctx, "--sinks", o->sinks, &r->sinks)) != CLI_OK ||
            (rc = want_shape("--sinks", &r->sinks, 1, heads, "one per query head")) != CLI_OK ||
            (rc = finite_per_head("--sinks", o->sinks, &r->sinks, "sink logit")) != CLI_OK)
            return rc;
        cfg->sinks = r->sinks.data;
    }
    return CLI_OK;
}

/* Each query's position less its index, as the config's align places it:
 * where chunks, causal and ALiBi count from. Bottom-right with cu_seqlens
 * places each sequence's queries by its own lengths: false (and *at, the
 * first sequence that differs from sequence 0) when they differ, as a map
 * and an ALiBi modifier hold one offset for all. */
static bool position_offset(const sdpa_options *o, const attn_sdpa_config *cfg,
                            int64_t *offset, size_t *at) {
    *at = 0;
    *offset = (int64_t)cfg->kv_tokens - (int64_t)cfg->q_tokens;
    if (o->align == ATTN_ALIGN_TOP_LEFT) *offset = 0;
    if (o->align == ATTN_ALIGN_OFFSET) *offset = (int64_t)o->q_offset;
    if (o->align != ATTN_ALIGN_BOTTOM_RIGHT || !cfg->cu_seqlens_q) return true;
    const int32_t *cq = cfg->cu_seqlens_q, *ck = cfg->cu_seqlens_kv;
    *offset = (int64_t)(ck[1] - ck[0]) - (int64_t)(cq[1] - cq[0]);
    for (size_t b = 1; b < cfg->batch; b++)
        if ((int64_t)(ck[b + 1] - ck[b]) - (int64_t)(cq[b + 1] - cq[b]) != *offset) {
            *at = b;
            return false;
        }
    return true;
}

/* The usage error of an option that needs one position offset for every
 * packed sequence where sequences 0 and b differ. */
static int offsets_differ(const char *what, const attn_sdpa_config *cfg, int64_t first,
                          size_t b) {
    const int32_t *cq = cfg->cu_seqlens_q, *ck = cfg->cu_seqlens_kv;
    return cli_usage_error("sdpa: %s with --cu-seqlens and bottom-right alignment: sequences 0 "
                           "and %zu place their queries at different offsets (S - T = %lld and "
                           "%lld), and the map or modifier holds one; use --align top-left or "
                           "--q-offset",
                           what, b, (long long)first,
                           (long long)(ck[b + 1] - ck[b]) - (long long)(cq[b + 1] - cq[b]));
}

/* The block map and the score-modifier chain the options ask for, into cfg
 * (with cu_seqlens in each sequence's own positions). The library refuses
 * softcap and ALiBi beside a chain, so with one they move into it, first,
 * where the config applies them. */
static int read_programmable(sdpa_run *r, const sdpa_options *o, attn_sdpa_config *cfg) {
    int rc;
    int64_t offset;
    size_t differs;
    bool one_offset = position_offset(o, cfg, &offset, &differs);
    if (!one_offset && o->map.chunk_given) return offsets_differ("--chunk", cfg, offset, differs);
    if (cli_mask_wanted(&o->map)) {
        cli_mask_geometry g = {.batch = cfg->batch, .heads = cfg->heads, .q_len = cfg->q_tokens,
                               .kv_len = cfg->kv_tokens, .offset = offset};
        if ((rc = cli_mask_build(r->ctx, &o->map, &g, &r->map)) != CLI_OK) return rc;
        cfg->block_mask = r->map.map;
    }
    size_t target[4] = {cfg->batch, cfg->heads, cfg->q_tokens, cfg->kv_tokens};
    size_t bias_strides[4] = {0};
    if (o->bias &&
        ((rc = read_floats(r->ctx, "--bias", o->bias, &r->bias)) != CLI_OK ||
         (rc = cli_finite_additive("--bias", o->bias, &r->bias)) != CLI_OK ||
         (rc = cli_broadcast_strides("--bias", r->bias.ndim, r->bias.shape, target,
                                     bias_strides)) != CLI_OK))
        return rc;
    size_t buckets = 0;
    if (o->rel_table) {
        if ((rc = read_floats(r->ctx, "--rel-bias-table", o->rel_table, &r->rel_table)) != CLI_OK ||
            (rc = cli_finite_additive("--rel-bias-table", o->rel_table, &r->rel_table)) != CLI_OK)
            return rc;
        const attn_npy *t = &r->rel_table;
        if (t->ndim != 2 || t->shape[0] != cfg->heads) {
            char got[128];
            cli_format_shape(got, sizeof got, t->ndim, t->shape);
            return cli_usage_error("--rel-bias-table: shape %s must be (H, N) = (%zu, N): a row "
                                   "of buckets per query head",
                                   got, cfg->heads);
        }
        buckets = t->shape[1];
        if (o->rel_buckets && o->rel_buckets != buckets)
            return cli_usage_error("--rel-buckets %zu: the table --rel-bias-table has %zu",
                                   o->rel_buckets, buckets);
    }
    if (!o->bias && !o->rel_table && !r->map.additive) return CLI_OK;
    if (!one_offset && cfg->alibi_slopes)
        return offsets_differ("--alibi beside a chain of modifiers", cfg, offset, differs);
    size_t n = 0;
    if (cfg->softcap > 0.0)
        r->mods[n++] = (attn_score_mod){.kind = ATTN_SCORE_SOFTCAP, .value = cfg->softcap};
    if (cfg->alibi_slopes)
        r->mods[n++] = (attn_score_mod){.kind = ATTN_SCORE_ALIBI, .tensor = cfg->alibi_slopes,
                                        .offset = offset};
    if (o->bias) {
        if (o->grad_output && !(r->dbias = calloc(r->bias.numel ? r->bias.numel : 1,
                                                  sizeof *r->dbias)))
            return cli_failure("out of memory for dbias (%zu floats)", r->bias.numel);
        r->mods[n] = (attn_score_mod){.kind = ATTN_SCORE_BIAS, .tensor = r->bias.data,
                                      .tensor_grad = r->dbias};
        memcpy(r->mods[n++].strides, bias_strides, sizeof bias_strides);
    }
    if (o->rel_table) {
        if (o->grad_output && !(r->drel = calloc(r->rel_table.numel, sizeof *r->drel)))
            return cli_failure("out of memory for drel_bias_table (%zu floats)",
                               r->rel_table.numel);
        if (o->rel_by_distance)
            r->mods[n++] = (attn_score_mod){.kind = ATTN_SCORE_REL_TABLE,
                                            .tensor = r->rel_table.data, .tensor_grad = r->drel,
                                            .buckets = buckets, .offset = o->rel_offset,
                                            .signed_distance = o->rel_signed};
        else
            r->mods[n++] = (attn_score_mod){.kind = ATTN_SCORE_REL_BIAS,
                                            .tensor = r->rel_table.data, .tensor_grad = r->drel,
                                            .buckets = buckets,
                                            .max_distance = o->rel_max_distance,
                                            .bidirectional = o->rel_bidirectional};
    }
    if (r->map.additive) {
        r->mods[n] = (attn_score_mod){.kind = ATTN_SCORE_BIAS, .tensor = r->map.values.data};
        memcpy(r->mods[n++].strides, r->map.strides, sizeof r->map.strides);
    }
    cfg->softcap = 0.0;
    cfg->alibi_slopes = NULL;
    cfg->score_mods = r->mods;
    cfg->score_mod_count = n;
    return CLI_OK;
}

/* The outputs' numbers in a cli_outputs. */
typedef struct sdpa_outputs {
    size_t out, lse, dq, dk, dv, dsinks, dbias, drel;
} sdpa_outputs;

/* Checks and opens every output (the gradient directory made if missing)
 * and checks that none is an input, before anything is read or computed. */
static int open_outputs(cli_outputs *out, const sdpa_options *o, sdpa_outputs *at) {
    int rc;
    if ((rc = cli_outputs_add(out, "--output", o->output, &at->out)) != CLI_OK) return rc;
    if (o->lse && (rc = cli_outputs_add(out, "--lse", o->lse, &at->lse)) != CLI_OK) return rc;
    if (o->grad_output) {
        const char *dir = o->grad_dir;
        if ((rc = cli_outputs_dir(out, "--grad-dir", dir)) != CLI_OK ||
            (rc = cli_outputs_add_in_dir(out, "--grad-dir", dir, "dq", &at->dq)) != CLI_OK ||
            (rc = cli_outputs_add_in_dir(out, "--grad-dir", dir, "dk", &at->dk)) != CLI_OK ||
            (rc = cli_outputs_add_in_dir(out, "--grad-dir", dir, "dv", &at->dv)) != CLI_OK)
            return rc;
        if (o->sinks &&
            (rc = cli_outputs_add_in_dir(out, "--grad-dir", dir, "dsinks", &at->dsinks)) != CLI_OK)
            return rc;
        if (o->bias &&
            (rc = cli_outputs_add_in_dir(out, "--grad-dir", dir, "dbias", &at->dbias)) != CLI_OK)
            return rc;
        if (o->rel_table && (rc = cli_outputs_add_in_dir(out, "--grad-dir", dir,
                                                          "drel_bias_table", &at->drel)) != CLI_OK)
            return rc;
    }
    const char *in_opts[] = {"--q", "--k", "--v", "--alibi", "--sinks", "--cu-seqlens-q",
                             "--cu-seqlens-kv", "--grad-output"};
    const char *in_paths[] = {o->q, o->k, o->v, o->alibi, o->sinks, o->cu_q, o->cu_kv,
                              o->grad_output};
    for (size_t i = 0; i < sizeof in_opts / sizeof in_opts[0]; i++)
        if ((rc = cli_outputs_not_input(out, in_opts[i], in_paths[i])) != CLI_OK) return rc;
    const char *map_opts[3], *map_paths[3];
    size_t map_inputs;
    cli_mask_inputs(&o->map, map_opts, map_paths, &map_inputs);
    for (size_t i = 0; i < map_inputs; i++)
        if ((rc = cli_outputs_not_input(out, map_opts[i], map_paths[i])) != CLI_OK) return rc;
    if ((rc = cli_outputs_not_input(out, "--bias", o->bias)) != CLI_OK ||
        (rc = cli_outputs_not_input(out, "--rel-bias-table", o->rel_table)) != CLI_OK)
        return rc;
    return CLI_OK;
}

static int run_sdpa(int argc, char **argv) {
    sdpa_options o;
    int rc = parse_args(argc, argv, &o);
    if (rc != CLI_OK) return rc;
    sdpa_run r = {0};
    if ((rc = cli_ctx_new(&(attn_ctx_config){.num_threads = o.threads, .kernels = o.kernels},
                          &r.ctx)) != CLI_OK)
        return rc;
    cli_outputs out;
    cli_outputs_init(&out, r.ctx);
    sdpa_outputs at = {0};
    attn_sdpa_config cfg = {.scale = o.scale, .causal = o.causal, .dropout = o.dropout,
                            .align = o.align, .q_offset = o.q_offset, .window = o.window,
                            .window_left = o.window_left, .window_right = o.window_right,
                            .softcap = o.softcap};
    size_t out_shape[4] = {0}, lse_shape[3] = {0}, out_rank = 0, lse_rank = 0, out_n, lse_n;
    if ((rc = open_outputs(&out, &o, &at)) != CLI_OK) goto done;
    rc = read_inputs(&r, &o, &cfg, out_shape, &out_rank, lse_shape, &lse_rank);
    if (rc != CLI_OK || (rc = read_programmable(&r, &o, &cfg)) != CLI_OK) goto done;
    if (o.grad_output &&
        ((rc = read_floats(r.ctx, "--grad-output", o.grad_output, &r.dout)) != CLI_OK ||
         (rc = want_shape("--grad-output", &r.dout, out_rank, out_shape, "the output's shape")) !=
             CLI_OK))
        goto done;
    if (!product(out_shape, out_rank, &out_n) || !product(lse_shape, lse_rank, &lse_n)) {
        rc = cli_failure("the output's size overflows");
        goto done;
    }
    r.out = malloc(out_n * sizeof *r.out);
    r.lse = malloc(lse_n * sizeof *r.lse);
    if (!r.out || !r.lse) {
        rc = cli_failure("out of memory for the output (%zu floats)", out_n + lse_n);
        goto done;
    }
    attn_sdpa_dropout drawn = {0};
    if (o.dropout > 0.0) {
        if (attn_rng_new(r.ctx, o.seed, &r.rng) != ATTN_OK ||
            attn_rng_set_bernoulli_method(r.rng, ATTN_BERNOULLI_PHILOX) != ATTN_OK) {
            rc = cli_library_error(r.ctx, "--seed");
            goto done;
        }
    } else if (o.seed_given) {
        fprintf(stderr, "attn: note: --seed has no effect without --dropout\n");
    }
    if (o.map.block_size && !cli_mask_wanted(&o.map))
        fprintf(stderr, "attn: note: --block-size has no effect without a map (--mask, "
                        "--block-topk, --prefix-lm, --doc-ids, --chunk)\n");
    if (attn_sdpa_forward(r.ctx, &cfg, r.q.data, r.k.data, r.v.data, r.out, r.lse, r.rng,
                          &drawn) != ATTN_OK) {
        rc = cli_library_error(r.ctx, "sdpa forward");
        goto done;
    }
    if (o.explain) fprintf(stderr, "attn: sdpa forward: %s\n", attn_ctx_last_explain(r.ctx));
    if ((rc = cli_outputs_npy(&out, at.out, r.out, out_rank, out_shape)) != CLI_OK) goto done;
    if (o.lse && (rc = cli_outputs_npy(&out, at.lse, r.lse, lse_rank, lse_shape)) != CLI_OK)
        goto done;
    if (o.grad_output) {
        size_t H = cfg.heads;
        r.dq = malloc(r.q.numel * sizeof *r.dq);
        r.dk = malloc(r.k.numel * sizeof *r.dk);
        r.dv = malloc(r.v.numel * sizeof *r.dv);
        r.dsinks = cfg.sinks ? malloc(H * sizeof *r.dsinks) : NULL;
        if (!r.dq || !r.dk || !r.dv || (cfg.sinks && !r.dsinks)) {
            rc = cli_failure("out of memory for the gradients (%zu floats)",
                             r.q.numel + r.k.numel + r.v.numel);
            goto done;
        }
        cfg.sinks_grad = r.dsinks;
        if (attn_sdpa_backward(r.ctx, &cfg, r.q.data, r.k.data, r.v.data, r.out, r.lse,
                               r.dout.data, r.dq, r.dk, r.dv,
                               o.dropout > 0.0 ? &drawn : NULL) != ATTN_OK) {
            rc = cli_library_error(r.ctx, "sdpa backward");
            goto done;
        }
        if (o.explain)
            fprintf(stderr, "attn: sdpa backward: %s\n", attn_ctx_last_explain(r.ctx));
        if ((rc = cli_outputs_npy(&out, at.dq, r.dq, r.q.ndim, r.q.shape)) != CLI_OK ||
            (rc = cli_outputs_npy(&out, at.dk, r.dk, r.k.ndim, r.k.shape)) != CLI_OK ||
            (rc = cli_outputs_npy(&out, at.dv, r.dv, r.v.ndim, r.v.shape)) != CLI_OK)
            goto done;
        if (cfg.sinks && (rc = cli_outputs_npy(&out, at.dsinks, r.dsinks, 1, &H)) != CLI_OK)
            goto done;
        if (r.dbias && (rc = cli_outputs_npy(&out, at.dbias, r.dbias, r.bias.ndim,
                                             r.bias.shape)) != CLI_OK)
            goto done;
        if (r.drel && (rc = cli_outputs_npy(&out, at.drel, r.drel, r.rel_table.ndim,
                                            r.rel_table.shape)) != CLI_OK)
            goto done;
    }
    rc = cli_outputs_commit(&out, false);
done:
    cli_outputs_free(&out);
    sdpa_run_close(&r);
    return rc;
}

const cli_command cli_sdpa_command = {
    .name = "sdpa",
    .summary = "attention on .npy q, k, v (GQA, window, sinks, varlen...), gradients",
    .help = sdpa_help,
    .value_options = sdpa_value_options,
    .parse = parse_sdpa,
    .run = run_sdpa,
};
