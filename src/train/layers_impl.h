/*
 * layers_impl.h — the small model's layers, forward and backward side by
 * side, written once over a scalar type.
 *
 * Before including this file, define
 *   REAL       the tensor element type (float in the library)
 *   LAYER(n)   the name of layer function n (attn_layer_##n in the library)
 *   LAYER_API  the linkage of the layer functions (empty, or static)
 * src/train/layers.c instantiates it for float; the finite-difference test
 * instantiates it for double, so the gradients are checked in double
 * precision on the very code the model runs.
 *
 * Conventions (llm.c's): flat row-major arrays with explicit sizes, N = B * T
 * rows; every backward adds (+=) into the gradients it produces, of inputs
 * and of parameters alike, so the caller zeroes them once and branches that
 * meet (the residual stream) simply accumulate. Sums run in double. Kernels
 * never allocate and never fail: the model checks every argument first.
 *
 * The linear layers are the library's own kernels (kernels/dispatch.h:
 * attn_k_linear and its backward, reference or fast as the ctx chooses).
 *
 * The residual connection, out = a + b, needs no kernel of its own
 * backward: both inputs receive dout unchanged, which the model gets by
 * keeping a single dresidual buffer that every branch adds into.
 */
#include "parallel.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef ATTN_LAYERS_IMPL_COMMON
#define ATTN_LAYERS_IMPL_COMMON
/* Work below which starting a thread costs more than it saves. */
#define LAYER_MIN_WORK_PER_THREAD ((size_t)1 << 16)
#define LAYER_SQRT1_2 0.70710678118654752440 /* 1 / sqrt(2) */
/* Columns summed at once in the parameter-gradient loops (a stack buffer). */
#define LAYER_COLUMN_CHUNK 64
/* The number of items per thread so that each gets at least the minimum
 * work, when one item costs cost. */
static inline size_t layer_min_items(size_t cost) {
    return LAYER_MIN_WORK_PER_THREAD / (cost ? cost : 1) + 1;
}
#endif

/* ---- embedding ------------------------------------------------------------ */

/* out (B, T, C) = wte[tokens[b, t]] + wpe[t]; tokens (B, T) lie in [0, V),
 * wte is (V, C), wpe is (context, C), or NULL for a model without learned
 * positions (Llama's, whose positions are RoPE's): out = wte[tokens]. */
LAYER_API void LAYER(embedding_forward)(REAL *out, const int32_t *tokens, const REAL *wte,
                                        const REAL *wpe, size_t B, size_t T, size_t C) {
    for (size_t b = 0; b < B; b++) {
        for (size_t t = 0; t < T; t++) {
            const REAL *tok_row = wte + (size_t)tokens[b * T + t] * C;
            REAL *out_row = out + (b * T + t) * C;
            if (!wpe) {
                for (size_t c = 0; c < C; c++) out_row[c] = tok_row[c];
                continue;
            }
            const REAL *pos_row = wpe + t * C;
            for (size_t c = 0; c < C; c++) out_row[c] = (REAL)((double)tok_row[c] + pos_row[c]);
        }
    }
}

typedef struct LAYER(embedding_job) {
    REAL *dwte, *dwpe;
    const REAL *dout;
    const int32_t *tokens;
    size_t B, T, C;
} LAYER(embedding_job);

/* Items [begin, end): below N = B T, position n, which adds into dwte the
 * row of its token when n is the token's first position (and nothing
 * otherwise); past N, row t = item - N of dwpe. Each gradient row is one
 * thread's, summed in double over every (b, t) that used it, in order; the
 * rows of tokens the batch does not hold are left as they are. */
static void LAYER(embedding_backward_rows)(void *arg, size_t begin, size_t end) {
    const LAYER(embedding_job) *j = arg;
    size_t C = j->C, N = j->B * j->T;
    for (size_t r = begin; r < end; r++) {
        int32_t token = r < N ? j->tokens[r] : -1;
        if (r < N) {
            bool first = true;
            for (size_t n = 0; n < r && first; n++) first = j->tokens[n] != token;
            if (!first) continue;
        }
        for (size_t c0 = 0; c0 < C; c0 += LAYER_COLUMN_CHUNK) {
            size_t c1 = c0 + LAYER_COLUMN_CHUNK < C ? c0 + LAYER_COLUMN_CHUNK : C;
            double acc[LAYER_COLUMN_CHUNK] = {0};
            REAL *grad_row;
            if (r < N) {
                /* in the forward pass this was: out[b, t] = wte[tokens[b, t]] + ... */
                grad_row = j->dwte + (size_t)token * C;
                for (size_t n = r; n < N; n++) {
                    if (j->tokens[n] != token) continue;
                    for (size_t c = c0; c < c1; c++) acc[c - c0] += j->dout[n * C + c];
                }
            } else {
                /* in the forward pass this was: out[b, t] = ... + wpe[t] */
                size_t t = r - N;
                grad_row = j->dwpe + t * C;
                for (size_t b = 0; b < j->B; b++)
                    for (size_t c = c0; c < c1; c++) acc[c - c0] += j->dout[(b * j->T + t) * C + c];
            }
            for (size_t c = c0; c < c1; c++) grad_row[c] = (REAL)(grad_row[c] + acc[c - c0]);
        }
    }
}

/* dwte (V, C) and dwpe (context, C; rows 0..T-1 touched) += from dout (B, T, C);
 * dwpe NULL when the forward had no wpe. */
LAYER_API void LAYER(embedding_backward)(attn_workers w, REAL *dwte, REAL *dwpe,
                                         const REAL *dout, const int32_t *tokens, size_t B,
                                         size_t T, size_t C, size_t V) {
    (void)V; /* the tokens lie in [0, V): the model checks them */
    LAYER(embedding_job) job = {dwte, dwpe, dout, tokens, B, T, C};
    attn_pool_for(w.pool, w.threads, B * T + (dwpe ? T : 0), layer_min_items(C),
                  LAYER(embedding_backward_rows), &job);
}

/* ---- LayerNorm -------------------------------------------------------------- */

typedef struct LAYER(norm_forward_job) {
    REAL *out;
    double *mean, *rstd; /* mean NULL: RMSNorm */
    const REAL *inp, *weight, *bias;
    size_t C;
    double eps;
} LAYER(norm_forward_job);

static void LAYER(layernorm_forward_rows)(void *arg, size_t begin, size_t end) {
    const LAYER(norm_forward_job) *j = arg;
    size_t C = j->C;
    for (size_t n = begin; n < end; n++) {
        const REAL *x = j->inp + n * C;
        double m = 0.0;
        for (size_t c = 0; c < C; c++) m += x[c];
        m /= (double)C;
        double v = 0.0;
        for (size_t c = 0; c < C; c++) v += ((double)x[c] - m) * ((double)x[c] - m);
        v /= (double)C;
        double s = 1.0 / sqrt(v + j->eps);
        REAL *y = j->out + n * C;
        for (size_t c = 0; c < C; c++)
            y[c] = (REAL)(((double)x[c] - m) * s * j->weight[c] + j->bias[c]);
        j->mean[n] = m;
        j->rstd[n] = s;
    }
}

/* Per row of inp (N, C):
 *   out (N, C) = (inp - mean) * rstd * weight + bias,
 *   rstd = 1 / sqrt(var + eps) (var biased, as nn.LayerNorm's)
 * mean and rstd (N) are kept, in double, for the backward. Each row is one
 * thread's: the bits do not depend on w. */
LAYER_API void LAYER(layernorm_forward)(attn_workers w, REAL *out, double *mean, double *rstd,
                                        const REAL *inp, const REAL *weight, const REAL *bias,
                                        size_t N, size_t C, double eps) {
    LAYER(norm_forward_job) job = {out, mean, rstd, inp, weight, bias, C, eps};
    attn_pool_for(w.pool, w.threads, N, layer_min_items(3 * C), LAYER(layernorm_forward_rows),
                  &job);
}

typedef struct LAYER(layernorm_job) {
    REAL *dinp, *dweight, *dbias;
    const REAL *dout, *inp, *weight;
    const double *mean, *rstd;
    size_t N, C;
} LAYER(layernorm_job);

/* dinp rows [begin, end). With xhat = (x - mean) * rstd and g = dout * weight,
 * in the forward pass this was: out = xhat * weight + bias, so
 *   dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)). */
static void LAYER(layernorm_dinp_rows)(void *arg, size_t begin, size_t end) {
    const LAYER(layernorm_job) *j = arg;
    size_t C = j->C;
    for (size_t n = begin; n < end; n++) {
        const REAL *x = j->inp + n * C, *dy = j->dout + n * C;
        double m = j->mean[n], s = j->rstd[n];
        double g_mean = 0.0, gx_mean = 0.0;
        for (size_t c = 0; c < C; c++) {
            double g = (double)dy[c] * j->weight[c];
            g_mean += g;
            gx_mean += g * ((double)x[c] - m) * s;
        }
        g_mean /= (double)C;
        gx_mean /= (double)C;
        REAL *dx = j->dinp + n * C;
        for (size_t c = 0; c < C; c++) {
            double g = (double)dy[c] * j->weight[c];
            double xhat = ((double)x[c] - m) * s;
            dx[c] = (REAL)(dx[c] + (g - g_mean - xhat * gx_mean) * s);
        }
    }
}

/* dweight and dbias columns [begin, end): dweight += sum_n dout * xhat,
 * dbias += sum_n dout. */
static void LAYER(layernorm_dparam_cols)(void *arg, size_t begin, size_t end) {
    const LAYER(layernorm_job) *j = arg;
    size_t C = j->C;
    for (size_t c0 = begin; c0 < end; c0 += LAYER_COLUMN_CHUNK) {
        size_t c1 = c0 + LAYER_COLUMN_CHUNK < end ? c0 + LAYER_COLUMN_CHUNK : end;
        double dw[LAYER_COLUMN_CHUNK] = {0}, db[LAYER_COLUMN_CHUNK] = {0};
        for (size_t n = 0; n < j->N; n++) {
            const REAL *x = j->inp + n * C, *dy = j->dout + n * C;
            for (size_t c = c0; c < c1; c++) {
                dw[c - c0] += (double)dy[c] * (((double)x[c] - j->mean[n]) * j->rstd[n]);
                db[c - c0] += dy[c];
            }
        }
        for (size_t c = c0; c < c1; c++) {
            j->dweight[c] = (REAL)(j->dweight[c] + dw[c - c0]);
            j->dbias[c] = (REAL)(j->dbias[c] + db[c - c0]);
        }
    }
}

/* dinp (N, C), dweight (C), dbias (C) += from dout (N, C). */
LAYER_API void LAYER(layernorm_backward)(attn_workers w, REAL *dinp, REAL *dweight, REAL *dbias,
                                         const REAL *dout, const REAL *inp, const REAL *weight,
                                         const double *mean, const double *rstd, size_t N,
                                         size_t C) {
    LAYER(layernorm_job) job = {dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C};
    attn_pool_for(w.pool, w.threads, N, layer_min_items(4 * C), LAYER(layernorm_dinp_rows), &job);
    attn_pool_for(w.pool, w.threads, C, layer_min_items(2 * N), LAYER(layernorm_dparam_cols), &job);
}

/* ---- RMSNorm (nn.RMSNorm(C, eps), Llama's norms) -------------------------- */

static void LAYER(rmsnorm_forward_rows)(void *arg, size_t begin, size_t end) {
    const LAYER(norm_forward_job) *j = arg;
    size_t C = j->C;
    for (size_t n = begin; n < end; n++) {
        const REAL *x = j->inp + n * C;
        double ms = 0.0;
        for (size_t c = 0; c < C; c++) ms += (double)x[c] * x[c];
        double s = 1.0 / sqrt(ms / (double)C + j->eps);
        REAL *y = j->out + n * C;
        for (size_t c = 0; c < C; c++) y[c] = (REAL)((double)x[c] * s * j->weight[c]);
        j->rstd[n] = s;
    }
}

/* Per row of inp (N, C):
 *   out (N, C) = inp * rstd * weight,  rstd = 1 / sqrt(mean(inp^2) + eps)
 * rstd (N) is kept, in double, for the backward. Each row is one thread's. */
LAYER_API void LAYER(rmsnorm_forward)(attn_workers w, REAL *out, double *rstd, const REAL *inp,
                                      const REAL *weight, size_t N, size_t C, double eps) {
    LAYER(norm_forward_job) job = {out, NULL, rstd, inp, weight, NULL, C, eps};
    attn_pool_for(w.pool, w.threads, N, layer_min_items(2 * C), LAYER(rmsnorm_forward_rows), &job);
}

typedef struct LAYER(rmsnorm_job) {
    REAL *dinp, *dweight;
    const REAL *dout, *inp, *weight;
    const double *rstd;
    size_t N, C;
} LAYER(rmsnorm_job);

/* dinp rows [begin, end). With xhat = x * rstd and g = dout * weight, in the
 * forward pass this was: out = xhat * weight, and d rstd / dx = -rstd^3 x / C,
 * so
 *   dinp += rstd * (g - xhat * mean(g * xhat)). */
static void LAYER(rmsnorm_dinp_rows)(void *arg, size_t begin, size_t end) {
    const LAYER(rmsnorm_job) *j = arg;
    size_t C = j->C;
    for (size_t n = begin; n < end; n++) {
        const REAL *x = j->inp + n * C, *dy = j->dout + n * C;
        double s = j->rstd[n], gx_mean = 0.0;
        for (size_t c = 0; c < C; c++) gx_mean += (double)dy[c] * j->weight[c] * x[c] * s;
        gx_mean /= (double)C;
        REAL *dx = j->dinp + n * C;
        for (size_t c = 0; c < C; c++) {
            double g = (double)dy[c] * j->weight[c];
            dx[c] = (REAL)(dx[c] + (g - (double)x[c] * s * gx_mean) * s);
        }
    }
}

/* dweight columns [begin, end): dweight += sum_n dout * xhat. */
static void LAYER(rmsnorm_dweight_cols)(void *arg, size_t begin, size_t end) {
    const LAYER(rmsnorm_job) *j = arg;
    size_t C = j->C;
    for (size_t c0 = begin; c0 < end; c0 += LAYER_COLUMN_CHUNK) {
        size_t c1 = c0 + LAYER_COLUMN_CHUNK < end ? c0 + LAYER_COLUMN_CHUNK : end;
        double dw[LAYER_COLUMN_CHUNK] = {0};
        for (size_t n = 0; n < j->N; n++) {
            const REAL *x = j->inp + n * C, *dy = j->dout + n * C;
            for (size_t c = c0; c < c1; c++) dw[c - c0] += (double)dy[c] * x[c] * j->rstd[n];
        }
        for (size_t c = c0; c < c1; c++) j->dweight[c] = (REAL)(j->dweight[c] + dw[c - c0]);
    }
}

/* dinp (N, C) and dweight (C) += from dout (N, C). */
LAYER_API void LAYER(rmsnorm_backward)(attn_workers w, REAL *dinp, REAL *dweight,
                                       const REAL *dout, const REAL *inp, const REAL *weight,
                                       const double *rstd, size_t N, size_t C) {
    LAYER(rmsnorm_job) job = {dinp, dweight, dout, inp, weight, rstd, N, C};
    attn_pool_for(w.pool, w.threads, N, layer_min_items(3 * C), LAYER(rmsnorm_dinp_rows), &job);
    attn_pool_for(w.pool, w.threads, C, layer_min_items(N), LAYER(rmsnorm_dweight_cols), &job);
}

/* ---- element-wise layers over the threads ------------------------------- */

/* One element-wise layer's operands: out (and out2) written, a, b, c read,
 * element by element; each range is one thread's, so the bits do not
 * depend on the thread count. */
typedef struct LAYER(pointwise_job) {
    REAL *out, *out2;
    const REAL *a, *b, *c;
} LAYER(pointwise_job);

typedef void LAYER(pointwise_fn)(void *job, size_t begin, size_t end);

/* fn over [0, n) on w's threads, an element costing about cost adds. */
static void LAYER(pointwise)(attn_workers w, size_t n, size_t cost, LAYER(pointwise_fn) *fn,
                             LAYER(pointwise_job) job) {
    attn_pool_for(w.pool, w.threads, n, layer_min_items(cost), fn, &job);
}

/* A transcendental function's cost in adds, for LAYER(pointwise). */
#define LAYER_TRANSCENDENTAL_COST 32

/* ---- SwiGLU (Llama's FeedForward: silu(fc1 x) * fc2 x) ------------------- */

static void LAYER(swiglu_forward_range)(void *arg, size_t begin, size_t end) {
    const LAYER(pointwise_job) *j = arg;
    for (size_t i = begin; i < end; i++) {
        double a = j->a[i];
        j->out[i] = (REAL)(a / (1.0 + exp(-a)) * j->b[i]);
    }
}

/* out (n) = silu(gate) * up, silu(a) = a * sigmoid(a); gate and up (n). */
LAYER_API void LAYER(swiglu_forward)(attn_workers w, REAL *out, const REAL *gate, const REAL *up,
                                     size_t n) {
    LAYER(pointwise)(w, n, LAYER_TRANSCENDENTAL_COST, LAYER(swiglu_forward_range),
                     (LAYER(pointwise_job)){.out = out, .a = gate, .b = up});
}

static void LAYER(swiglu_backward_range)(void *arg, size_t begin, size_t end) {
    const LAYER(pointwise_job) *j = arg;
    for (size_t i = begin; i < end; i++) {
        double a = j->a[i], s = 1.0 / (1.0 + exp(-a));
        double dy = j->c[i];
        j->out[i] = (REAL)(j->out[i] + dy * j->b[i] * (s * (1.0 + a * (1.0 - s))));
        j->out2[i] = (REAL)(j->out2[i] + dy * a * s);
    }
}

/* in the forward pass this was: out = silu(gate) * up, so with
 * s = sigmoid(gate), silu'(a) = s * (1 + a * (1 - s)):
 *   dgate (n) += dout * up * silu'(gate),  dup (n) += dout * silu(gate). */
LAYER_API void LAYER(swiglu_backward)(attn_workers w, REAL *dgate, REAL *dup, const REAL *gate,
                                      const REAL *up, const REAL *dout, size_t n) {
    LAYER(pointwise)(w, n, LAYER_TRANSCENDENTAL_COST, LAYER(swiglu_backward_range),
                     (LAYER(pointwise_job)){.out = dgate, .out2 = dup, .a = gate, .b = up,
                                            .c = dout});
}

/* ---- RoPE (the book's apply_rope: split halves) ------------------------- */

/* x (B, T, heads, D) at positions t = 0..T-1, with half = D / 2 and tables
 * cosines, sines (context, half) (compute_rope_params' cos and sin, whose
 * two halves are equal, one half kept):
 *   out[..., i]        = x[i] cos[t, i] - x[i + half] sin[t, i]
 *   out[..., i + half] = x[i + half] cos[t, i] + x[i] sin[t, i]
 * i.e. x * cos + cat(-x2, x1) * sin. out may be x (in place). */
LAYER_API void LAYER(rope_forward)(REAL *out, const REAL *x, const float *cosines,
                                   const float *sines, size_t B, size_t T, size_t heads,
                                   size_t D) {
    size_t half = D / 2;
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++) {
            const float *cs = cosines + t * half, *sn = sines + t * half;
            for (size_t h = 0; h < heads; h++) {
                size_t row = ((b * T + t) * heads + h) * D;
                for (size_t i = 0; i < half; i++) {
                    double x1 = x[row + i], x2 = x[row + i + half];
                    out[row + i] = (REAL)(x1 * cs[i] - x2 * sn[i]);
                    out[row + i + half] = (REAL)(x2 * cs[i] + x1 * sn[i]);
                }
            }
        }
}

/* in the forward pass this was a rotation by the angle at t, so its
 * gradient is the rotation back (the transpose):
 *   dx[i] += dout[i] cos + dout[i + half] sin
 *   dx[i + half] += dout[i + half] cos - dout[i] sin
 * dx and dout (B, T, heads, D) do not overlap. */
LAYER_API void LAYER(rope_backward)(REAL *dx, const REAL *dout, const float *cosines,
                                    const float *sines, size_t B, size_t T, size_t heads,
                                    size_t D) {
    size_t half = D / 2;
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++) {
            const float *cs = cosines + t * half, *sn = sines + t * half;
            for (size_t h = 0; h < heads; h++) {
                size_t row = ((b * T + t) * heads + h) * D;
                for (size_t i = 0; i < half; i++) {
                    double d1 = dout[row + i], d2 = dout[row + i + half];
                    dx[row + i] = (REAL)(dx[row + i] + d1 * cs[i] + d2 * sn[i]);
                    dx[row + i + half] = (REAL)(dx[row + i + half] + d2 * cs[i] - d1 * sn[i]);
                }
            }
        }
}

/* ---- GELU (exact, nn.GELU() with approximate='none') -------------------- */

static void LAYER(gelu_forward_range)(void *arg, size_t begin, size_t end) {
    const LAYER(pointwise_job) *j = arg;
    for (size_t i = begin; i < end; i++) {
        double x = j->a[i];
        j->out[i] = (REAL)(0.5 * x * (1.0 + erf(x * LAYER_SQRT1_2)));
    }
}

/* out (n) = 0.5 * x * (1 + erf(x / sqrt(2))) */
LAYER_API void LAYER(gelu_forward)(attn_workers w, REAL *out, const REAL *inp, size_t n) {
    LAYER(pointwise)(w, n, LAYER_TRANSCENDENTAL_COST, LAYER(gelu_forward_range),
                     (LAYER(pointwise_job)){.out = out, .a = inp});
}

static void LAYER(gelu_backward_range)(void *arg, size_t begin, size_t end) {
    const LAYER(pointwise_job) *j = arg;
    const double inv_sqrt_2pi = 0.3989422804014327; /* 1 / sqrt(2 pi) */
    for (size_t i = begin; i < end; i++) {
        double x = j->a[i];
        double cdf = 0.5 * (1.0 + erf(x * LAYER_SQRT1_2));
        double pdf = inv_sqrt_2pi * exp(-0.5 * x * x);
        j->out[i] = (REAL)(j->out[i] + (double)j->b[i] * (cdf + x * pdf));
    }
}

/* dinp (n) += dout * gelu'(x), gelu'(x) = Phi(x) + x * phi(x): the normal
 * CDF and density. */
LAYER_API void LAYER(gelu_backward)(attn_workers w, REAL *dinp, const REAL *inp, const REAL *dout,
                                    size_t n) {
    LAYER(pointwise)(w, n, 2 * LAYER_TRANSCENDENTAL_COST, LAYER(gelu_backward_range),
                     (LAYER(pointwise_job)){.out = dinp, .a = inp, .b = dout});
}

/* ---- GELU, tanh form (the book's GELU module) ----------------------------- */

static void LAYER(gelu_tanh_forward_range)(void *arg, size_t begin, size_t end) {
    const LAYER(pointwise_job) *j = arg;
    const double k = 0.7978845608028654; /* sqrt(2 / pi) */
    for (size_t i = begin; i < end; i++) {
        double x = j->a[i];
        j->out[i] = (REAL)(0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x))));
    }
}

/* out (n) = 0.5 * x * (1 + tanh(u)), u = sqrt(2 / pi) * (x + 0.044715 x^3) */
LAYER_API void LAYER(gelu_tanh_forward)(attn_workers w, REAL *out, const REAL *inp, size_t n) {
    LAYER(pointwise)(w, n, LAYER_TRANSCENDENTAL_COST, LAYER(gelu_tanh_forward_range),
                     (LAYER(pointwise_job)){.out = out, .a = inp});
}

static void LAYER(gelu_tanh_backward_range)(void *arg, size_t begin, size_t end) {
    const LAYER(pointwise_job) *j = arg;
    const double k = 0.7978845608028654; /* sqrt(2 / pi) */
    for (size_t i = begin; i < end; i++) {
        double x = j->a[i];
        double t = tanh(k * (x + 0.044715 * x * x * x));
        double du = k * (1.0 + 3.0 * 0.044715 * x * x);
        double g = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
        j->out[i] = (REAL)(j->out[i] + (double)j->b[i] * g);
    }
}

/* dinp (n) += dout * gelu'(x),
 * gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) du/dx,
 * du/dx = sqrt(2 / pi) (1 + 3 * 0.044715 x^2). */
LAYER_API void LAYER(gelu_tanh_backward)(attn_workers w, REAL *dinp, const REAL *inp,
                                         const REAL *dout, size_t n) {
    LAYER(pointwise)(w, n, LAYER_TRANSCENDENTAL_COST, LAYER(gelu_tanh_backward_range),
                     (LAYER(pointwise_job)){.out = dinp, .a = inp, .b = dout});
}

/* ---- residual ------------------------------------------------------------ */

static void LAYER(residual_forward_range)(void *arg, size_t begin, size_t end) {
    const LAYER(pointwise_job) *j = arg;
    for (size_t i = begin; i < end; i++) j->out[i] = (REAL)((double)j->a[i] + j->b[i]);
}

/* out (n) = a + b (out may alias either). Its backward: see the top. */
LAYER_API void LAYER(residual_forward)(attn_workers w, REAL *out, const REAL *a, const REAL *b,
                                       size_t n) {
    LAYER(pointwise)(w, n, 1, LAYER(residual_forward_range),
                     (LAYER(pointwise_job)){.out = out, .a = a, .b = b});
}

/* ---- cross-entropy (F.cross_entropy, ignore_index, reduction='mean') ---- */

/* Rows of cross-entropy the threads share: a block's rows run in parallel,
 * each row whole on one thread, so a row's numbers do not depend on the
 * thread count. */
#define LAYER_CE_BLOCK 256

/* A row's loss and its backward, computed by the loops below or, where the
 * caller passes them, by vector kernels of the same contract
 * (kernels/activation/activation.h). */
typedef struct LAYER(crossentropy_rows) {
    double (*loss)(const REAL *z, size_t V, int32_t target);
    void (*backward)(const REAL *z, size_t V, int32_t target, double scale, REAL *dz);
} LAYER(crossentropy_rows);

typedef struct LAYER(crossentropy_job) {
    LAYER(crossentropy_rows) rows;
    const REAL *logits;
    const int32_t *targets;
    size_t V;
    int32_t ignore_index;
    double *row_loss; /* forward: the block's rows, from row0 */
    size_t row0;
    REAL *dlogits;    /* backward */
    double scale;
} LAYER(crossentropy_job);

/* logsumexp(z) - z[target] of one row z (V). */
static double LAYER(crossentropy_row)(const REAL *z, size_t V, int32_t target) {
    double max = -INFINITY;
    for (size_t v = 0; v < V; v++)
        if (z[v] > max) max = z[v];
    double sum = 0.0;
    for (size_t v = 0; v < V; v++) sum += exp((double)z[v] - max);
    return max + log(sum) - (double)z[target];
}

static void LAYER(crossentropy_forward_rows)(void *arg, size_t begin, size_t end) {
    const LAYER(crossentropy_job) *j = arg;
    for (size_t n = begin; n < end; n++) {
        size_t row = j->row0 + n;
        if (j->targets[row] == j->ignore_index) continue;
        j->row_loss[n] = j->rows.loss(j->logits + row * j->V, j->V, j->targets[row]);
    }
}

/* loss = mean over the rows n whose target is not ignore_index of
 *   logsumexp(logits[n]) - logits[n, targets[n]]
 * logits (N, V); targets (N) lie in [0, V) or equal ignore_index. Returns
 * the mean (NaN when every row is ignored: 0 / 0, as PyTorch); *scored
 * receives the number of rows that count. The rows are summed in order,
 * whatever w's thread count. row_loss: a vector kernel for a row's loss,
 * or NULL for crossentropy_row. */
LAYER_API double LAYER(crossentropy_forward)(attn_workers w, const REAL *logits,
                                             const int32_t *targets, size_t N, size_t V,
                                             int32_t ignore_index, size_t *scored,
                                             double (*row_loss_kernel)(const REAL *, size_t,
                                                                       int32_t)) {
    double total = 0.0, row_loss[LAYER_CE_BLOCK];
    size_t count = 0;
    LAYER(crossentropy_job) job = {
        {row_loss_kernel ? row_loss_kernel : LAYER(crossentropy_row), NULL},
        logits, targets, V, ignore_index, row_loss, 0, NULL, 0.0};
    for (size_t n0 = 0; n0 < N; n0 += LAYER_CE_BLOCK) {
        size_t rows = N - n0 < LAYER_CE_BLOCK ? N - n0 : LAYER_CE_BLOCK;
        job.row0 = n0;
        attn_pool_for(w.pool, w.threads, rows, layer_min_items(V), LAYER(crossentropy_forward_rows),
                      &job);
        for (size_t n = 0; n < rows; n++) {
            if (targets[n0 + n] == ignore_index) continue;
            total += row_loss[n];
            count++;
        }
    }
    *scored = count;
    return total / (double)count;
}

/* in the forward pass this was: loss = mean_n (logsumexp(z_n) - z_n[target_n]), so
 *   dlogits[n, v] += dloss * (softmax(z_n)[v] - [v == target_n]) / scored
 * for the scored rows; ignored rows get nothing. */
static void LAYER(crossentropy_backward_row)(const REAL *z, size_t V, int32_t target,
                                             double scale, REAL *dz) {
    double max = -INFINITY;
    for (size_t v = 0; v < V; v++)
        if (z[v] > max) max = z[v];
    double sum = 0.0;
    for (size_t v = 0; v < V; v++) sum += exp((double)z[v] - max);
    for (size_t v = 0; v < V; v++) {
        double p = exp((double)z[v] - max) / sum;
        double indicator = (int32_t)v == target ? 1.0 : 0.0;
        dz[v] = (REAL)(dz[v] + scale * (p - indicator));
    }
}

static void LAYER(crossentropy_backward_rows)(void *arg, size_t begin, size_t end) {
    const LAYER(crossentropy_job) *j = arg;
    size_t V = j->V;
    for (size_t n = begin; n < end; n++) {
        int32_t target = j->targets[n];
        if (target == j->ignore_index) continue;
        j->rows.backward(j->logits + n * V, V, target, j->scale, j->dlogits + n * V);
    }
}

LAYER_API void LAYER(crossentropy_backward)(attn_workers w, REAL *dlogits, const REAL *logits,
                                            const int32_t *targets, size_t N, size_t V,
                                            int32_t ignore_index, double dloss,
                                            void (*row_backward_kernel)(const REAL *, size_t,
                                                                        int32_t, double, REAL *)) {
    size_t count = 0;
    for (size_t n = 0; n < N; n++) count += targets[n] != ignore_index;
    if (count == 0) return;
    LAYER(crossentropy_job) job = {
        {NULL, row_backward_kernel ? row_backward_kernel : LAYER(crossentropy_backward_row)},
        logits, targets, V, ignore_index, NULL, 0, dlogits, dloss / (double)count};
    attn_pool_for(w.pool, w.threads, N, layer_min_items(V), LAYER(crossentropy_backward_rows),
                  &job);
}
