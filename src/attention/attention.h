/*
 * attention.h — the runner of the attention contract (the problem itself:
 * contract/attention_problem.h) and the backends it chooses from: every
 * module, op and public entry point runs its attention through
 * attn_attention_forward / attn_attention_backward, which ask the
 * registered backends in order (attention/registry.c) and run the first
 * that takes the problem.
 */
#ifndef ATTN_ATTENTION_H
#define ATTN_ATTENTION_H

#include "contract/attention_problem.h"

/* ---- backends ------------------------------------------------------------ */

/* What a pass asks of a backend besides the problem. */
typedef struct attn_pass {
    bool backward; /* the backward (else the forward) */
    bool traced;   /* the reference's copies of the scores are wanted (attn_attention_trace) */
    bool dropout;  /* the weights are dropped (attn_attention_dropout) */
} attn_pass;

/* max |x| of p's q and k (scores false: 0), v, and dout (NULL: 0; out's
 * type and layout), inf where one holds NaN or inf, raised to p's
 * whole_tops where p has them: the fused backends' scan (scan.c) of
 * float32 or bf16 views, on the ctx's threads. */
void attn_value_tops(attn_ctx *ctx, const attn_attention_problem *p, bool scores,
                     const void *dout, float top[4]);

/* top (as attn_value_tops gives it) raised to p's whole_tops, where p has
 * them, for each tensor read (top above 0, or scanned: read) */
void attn_value_tops_whole(const attn_attention_problem *p, bool scores, bool dout,
                           float top[4]);

/* The floats a score modifier's tensor (and its tensor_grad) spans over
 * p: the slopes of ALiBi, the tables of the relative ones, a bias's
 * largest element read plus one; 0 for the kinds that hold none. For a
 * chain the runner's checks have passed. */
size_t attn_score_mod_elements(const attn_attention_problem *p, const attn_score_mod *m);

/* Whether values of magnitude v (max |v|) and d_o (max |dO|) could carry
 * past 2^-48 of a row's output or of dP's sum through the keys the fast
 * kernels weigh 0: their exp2 gives 0 below 2^-125 of a row's largest
 * weight. Such calls go to the reference. */
static inline bool attn_values_past_weight_floor(const attn_attention_problem *p, double v,
                                                 double d_o) {
    double dropped = 0x1p-125 * (double)p->kv_len;
    return dropped * v >= 0x1p-48 || dropped * (double)p->head_dim * d_o * v >= 0x1p-48;
}

typedef struct attn_attention_backend {
    const char *name;
    /* The kernels it runs p on, for the record (NULL: name says it all) */
    const char *(*kernel_name)(const attn_ctx *ctx, const attn_attention_problem *p);
    /* NULL when the backend runs the problem in this pass (a forward's
     * backend runs its backward too), else why not, e.g. "v_head_dim !=
     * head_dim" */
    const char *(*declines)(const attn_ctx *ctx, const attn_attention_problem *p,
                            attn_pass pass);
    /* NULL when it runs these values, else why not (a NULL function: any
     * values): the fused kernels refuse non-finite inputs and magnitudes
     * past float32's range in their tiles. dout: the backward's, or NULL */
    const char *(*declines_values)(attn_ctx *ctx, const attn_attention_problem *p,
                                   const void *dout);
    /* Whether its pass measures the values as it reads them (NULL: never):
     * the runner then asks nothing before, and the pass answers as
     * declines_values would, after it */
    bool (*measures_values)(const attn_ctx *ctx, const attn_attention_problem *p,
                            const attn_attention_dropout *drop, bool backward);
    /* Bytes of workspace a pass needs. */
    size_t (*forward_bytes)(const attn_ctx *ctx, const attn_attention_problem *p,
                            const attn_attention_trace *trace);
    size_t (*backward_bytes)(const attn_ctx *ctx, const attn_attention_problem *p);
    /* The passes, on workspace of the size asked (zeroed or not), on the
     * ctx's threads (attn_ctx_workers). NULL when done; where the pass
     * measured the values, else why it declined them: the outputs are then
     * the next backend's to write; or attn_pass_failed, after attn_fail
     * recorded why (ATTN_ERR_INVALID), when the call itself fails (a score
     * callback's error): the runner then asks no other backend and returns
     * the message, led by its caller's name. */
    const char *(*forward)(attn_ctx *ctx, const attn_attention_problem *p,
                           const attn_attention_dropout *drop,
                           const attn_attention_trace *trace, void *workspace);
    const char *(*backward)(attn_ctx *ctx, const attn_attention_problem *p,
                            const attn_attention_dropout *drop, const attn_attention_grads *g,
                            void *workspace);
    /* Whether its forward writes p->row_stats (the fused kernels'); after
     * any other forward the runner marks them NaN, so that a backward never
     * reads another pass's statistics */
    bool writes_row_stats;
} attn_attention_backend;

/* What a pass returns when it failed rather than declined (a score
 * modifier's callback returned nonzero): it has left the message in the
 * ctx (attn_fail), and the runner returns ATTN_ERR_INVALID with it instead
 * of asking the next backend. Compared by address (registry.c). */
extern const char attn_pass_failed[];

/* The backends (one file each) and the registry, the order the runner asks
 * them in (registry.c): fused float32, fused bf16, split-KV decode, flex
 * (block maps and score modifiers, fused), the reference. A 16-bit problem
 * none of them takes is widened to float32 by the runner (widen16.c) and
 * asked again. */
extern const attn_attention_backend attn_attention_fused;
extern const attn_attention_backend attn_attention_fused16;
extern const attn_attention_backend attn_attention_decode;
extern const attn_attention_backend attn_attention_flex;
extern const attn_attention_backend attn_attention_reference;
/* The registry, *count backends in order (at most ATTN_MAX_BACKENDS). */
#define ATTN_MAX_BACKENDS 8
const attn_attention_backend *const *attn_attention_registry(size_t *count);

/* The column of a relative modifier's table (attn_score_mod_relative) at
 * distance rel = kv_idx - q_idx: T5's bucket (REL_BIAS) or the table's
 * element (REL_TABLE), as the flex and fused kernels both read it. */
int32_t attn_rel_bucket(const attn_score_mod *m, int64_t rel);

/* ---- the runner ----------------------------------------------------------- */

/*
 * Checks p (a message naming who and the values at fault), then asks the
 * registry's backends in order and runs the first that takes the problem
 * and its values; every decline and its reason is kept for
 * attn_ctx_last_explain. workspace: bytes from attn_attention_*_bytes, or
 * NULL to take the ctx's; either way all memory is in hand before
 * anything is drawn or written, so a failure changes nothing.
 *
 * Dropout in the forward: stream (NULL: none) draws the mask. A Philox
 * stream is drawn inside the kernels (drop_out receives its record for the
 * backward); a serial one (PyTorch's mt19937/MKL order) is drawn first
 * into keep_bits ((B, Hq, T, S) bits, zeroed by the caller; NULL: into the
 * workspace), and drop_out records those bits.
 */
attn_status attn_attention_check(attn_ctx *ctx, const char *who,
                                 const attn_attention_problem *p);
/* mask_in_workspace: a serial stream will draw with keep_bits NULL (its
 * bits then live in the workspace); traced: the trace is wanted. */
size_t attn_attention_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p,
                                    bool mask_in_workspace, bool traced);
attn_status attn_attention_forward(attn_ctx *ctx, const char *who,
                                   const attn_attention_problem *p,
                                   struct attn_dropout_stream *stream, uint8_t *keep_bits,
                                   const attn_attention_trace *trace,
                                   attn_attention_dropout *drop_out, void *workspace);
size_t attn_attention_backward_bytes(const attn_ctx *ctx, const attn_attention_problem *p);
attn_status attn_attention_backward(attn_ctx *ctx, const char *who,
                                    const attn_attention_problem *p,
                                    const attn_attention_dropout *drop,
                                    const attn_attention_grads *g, void *workspace);

/* ---- the runner's widening of 16-bit problems (widen16.c) ----------------- */

/* The float32 problem of p's 16-bit views: its copies head-major in one
 * buffer (*buffer, freed with attn_free; NULL and a message when out of
 * memory), the inputs widened (exactly) and the outputs (out, and with a
 * backward dq, dk, dv, which *g receives) zeroed. dout: the backward's,
 * or NULL for a forward. */
attn_status attn_widen16(attn_ctx *ctx, const char *who, const attn_attention_problem *p,
                         const void *dout, attn_attention_problem *wide,
                         attn_attention_grads *g, float **buffer);
/* The widened outputs rounded back into p's views (to nearest even; NaN
 * stays NaN): out (g NULL), or g's dq, dk, dv into p_grads'. */
void attn_narrow16(attn_ctx *ctx, const attn_attention_problem *p,
                   const attn_attention_problem *wide, const attn_attention_grads *g,
                   const attn_attention_grads *p_grads);

/* ---- explaining a choice --------------------------------------------------- */

/* Starts the ctx's record of a top-level attention call (nested calls,
 * such as the widened problem's, add to it). */
void attn_explain_begin(attn_ctx *ctx);
/* Adds "name: reason" (reason NULL: "ran") to the record. */
void attn_explain_note(attn_ctx *ctx, const char *name, const char *reason);

#endif /* ATTN_ATTENTION_H */
