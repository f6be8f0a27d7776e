/*
 * optim.c — torch.optim.SGD, torch.optim.AdamW and clip_grad_norm_, as
 * PyTorch computes them on the CPU by default (torch/optim/sgd.py and
 * adam.py, the single-tensor path); AdamW's step is PyTorch 2's, whose
 * first moment is a lerp.
 *
 * Every update is float32 arithmetic in PyTorch's order. Python scalars
 * (lr, betas, ...) become float when they meet a float tensor; a.add(b,
 * alpha=s) and a.addcmul_(b, c, value=s) are fused multiply-adds in
 * PyTorch's CPU kernels (fma(b, s, a) and fma(s * b, c, a)), while
 * a.addcdiv_(b, c, value=s) is a + (s * b) / c, unfused. The suite checks
 * every formula bit for bit against torch.optim.
 */
#include "internal.h"
#include "parallel.h"
#include "train/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

/* Elements per thread below which one thread does the whole tensor. */
#define OPTIM_MIN_PER_THREAD ((size_t)1 << 15)

struct attn_optimizer {
    attn_ctx *ctx;
    attn_optimizer_config cfg;
    size_t count;
    attn_param *params; /* copies of the caller's descriptors */
    /* Per parameter, numel floats each: SGD the momentum buffer; AdamW
     * exp_avg, exp_avg_sq and (amsgrad) max_exp_avg_sq. */
    float **state;
    float *state_storage;
    size_t state_floats; /* state_storage's length */
    size_t steps;
};

attn_optimizer_config attn_optimizer_defaults(attn_optimizer_kind kind) {
    if (kind == ATTN_OPTIMIZER_ADAMW)
        return (attn_optimizer_config){.kind = kind, .lr = 1e-3, .weight_decay = 1e-2,
                                       .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    /* torch.optim.SGD's lr is `required`: no default. */
    return (attn_optimizer_config){.kind = kind, .lr = NAN};
}

static const char *kind_name(attn_optimizer_kind kind) {
    return kind == ATTN_OPTIMIZER_ADAMW ? "AdamW" : "SGD";
}

/* PyTorch's checks (ValueError in the constructors), plus finiteness. */
static attn_status check_config(attn_ctx *ctx, const attn_optimizer_config *c) {
    if (c->kind != ATTN_OPTIMIZER_SGD && c->kind != ATTN_OPTIMIZER_ADAMW)
        return attn_fail(ctx, ATTN_ERR_INVALID, "optimizer: unknown kind %d", (int)c->kind);
    const char *name = kind_name(c->kind);
    if (isnan(c->lr) && c->kind == ATTN_OPTIMIZER_SGD)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "SGD: lr is required (PyTorch has no default); got nan");
    if (!(c->lr >= 0.0) || !isfinite(c->lr))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: lr (%g) must be finite and >= 0", name, c->lr);
    if (!(c->weight_decay >= 0.0) || !isfinite(c->weight_decay))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: weight_decay (%g) must be finite and >= 0",
                         name, c->weight_decay);
    if (c->kind == ATTN_OPTIMIZER_SGD) {
        if (!(c->momentum >= 0.0) || !isfinite(c->momentum))
            return attn_fail(ctx, ATTN_ERR_INVALID, "SGD: momentum (%g) must be finite and >= 0",
                             c->momentum);
        if (!isfinite(c->dampening))
            return attn_fail(ctx, ATTN_ERR_INVALID, "SGD: dampening (%g) must be finite",
                             c->dampening);
        if (c->nesterov && (c->momentum <= 0.0 || c->dampening != 0.0))
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "SGD: nesterov needs momentum > 0 and dampening 0 (got momentum %g, "
                             "dampening %g)",
                             c->momentum, c->dampening);
        return ATTN_OK;
    }
    if (!(c->eps >= 0.0) || !isfinite(c->eps))
        return attn_fail(ctx, ATTN_ERR_INVALID, "AdamW: eps (%g) must be finite and >= 0", c->eps);
    char number[ATTN_NUMBER_CHARS];
    if (!(c->beta1 >= 0.0 && c->beta1 < 1.0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "AdamW: beta1 (%s) must be in [0, 1)",
                         attn_number_text(c->beta1, number));
    if (!(c->beta2 >= 0.0 && c->beta2 < 1.0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "AdamW: beta2 (%s) must be in [0, 1)",
                         attn_number_text(c->beta2, number));
    return ATTN_OK;
}

/* A parameter descriptor the optimizer can use: data and grad, and a numel
 * that its shape gives. */
static attn_status check_param(attn_ctx *ctx, const char *what, const attn_param *p,
                               size_t index) {
    const char *name = p->name ? p->name : "(unnamed)";
    if (!p->data || !p->grad)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: parameter %zu (%s) has no %s", what, index, name,
                         !p->data ? "data" : "grad");
    size_t numel = 0;
    if (p->ndim != 1 && p->ndim != 2)
        return attn_fail(ctx, ATTN_ERR_SHAPE, "%s: parameter %zu (%s) has ndim %zu (want 1 or 2)",
                         what, index, name, p->ndim);
    if (p->ndim == 1)
        numel = p->shape[0];
    else if (!attn_mul_size(p->shape[0], p->shape[1], &numel))
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "%s: parameter %zu (%s) has shape (%zu, %zu), which overflows size_t",
                         what, index, name, p->shape[0], p->shape[1]);
    if (numel != p->numel)
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "%s: parameter %zu (%s) has numel %zu but its shape holds %zu", what,
                         index, name, p->numel, numel);
    return ATTN_OK;
}

/* Whether [a, a + na) and [b, b + nb) share an element. */
static bool floats_overlap(const float *a, size_t na, const float *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb * sizeof(float) && y < x + na * sizeof(float);
}

static attn_status check_params(attn_ctx *ctx, const char *what, const attn_param *params,
                                size_t count) {
    if (count == 0) return attn_fail(ctx, ATTN_ERR_INVALID, "%s: got an empty parameter list", what);
    if (!params) return attn_fail(ctx, ATTN_ERR_NULL, "%s: params is NULL (count %zu)", what, count);
    for (size_t i = 0; i < count; i++) {
        attn_status st = check_param(ctx, what, &params[i], i);
        if (st != ATTN_OK) return st;
    }
    return ATTN_OK;
}

attn_status attn_optimizer_new(attn_ctx *ctx, const attn_optimizer_config *cfg,
                               const attn_param *params, size_t count, attn_optimizer **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_optimizer_new: %s is NULL", !cfg ? "cfg" : "out");
    attn_status st = check_config(ctx, cfg);
    if (st == ATTN_OK) st = check_params(ctx, "attn_optimizer_new", params, count);
    if (st != ATTN_OK) return st;
    for (size_t i = 0; i < count; i++)
        for (size_t k = 0; k < i; k++) {
            const attn_param *p = &params[k], *q = &params[i];
            const char *pn = p->name ? p->name : "(unnamed)", *qn = q->name ? q->name : "(unnamed)";
            if (p->data == q->data)
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "attn_optimizer_new: parameters %zu and %zu (%s) are the same "
                                 "tensor",
                                 k, i, qn);
            /* a step writes every data and reads every grad: one that another's
             * span reaches would be changed under it (PyTorch's parameters are
             * leaves, never views of one another) */
            const char *what = floats_overlap(p->data, p->numel, q->data, q->numel) ? "data"
                               : floats_overlap(p->grad, p->numel, q->grad, q->numel) ? "grad"
                               : floats_overlap(p->data, p->numel, q->grad, q->numel) ||
                                       floats_overlap(p->grad, p->numel, q->data, q->numel)
                                   ? "data and grad"
                                   : NULL;
            if (what)
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "attn_optimizer_new: parameters %zu (%s) and %zu (%s) share "
                                 "memory (%s)",
                                 k, pn, i, qn, what);
        }
    for (size_t i = 0; i < count; i++)
        if (floats_overlap(params[i].data, params[i].numel, params[i].grad, params[i].numel))
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "attn_optimizer_new: parameter %zu (%s): data and grad share memory",
                             i, params[i].name ? params[i].name : "(unnamed)");

    size_t per_param = cfg->kind == ATTN_OPTIMIZER_SGD ? (cfg->momentum != 0.0 ? 1 : 0)
                                                       : (cfg->amsgrad ? 3 : 2);
    size_t total = 0;
    for (size_t i = 0; i < count; i++) {
        size_t n;
        if (!attn_mul_size(params[i].numel, per_param, &n) || !attn_add_size(total, n, &total) ||
            !attn_floats_fit(total))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "attn_optimizer_new: optimizer state overflows");
    }
    attn_optimizer *opt = attn_calloc(1, sizeof *opt);
    if (opt) {
        opt->params = attn_calloc(count, sizeof *opt->params);
        opt->state = attn_calloc(count * 3, sizeof *opt->state);
        opt->state_storage = attn_alloc_floats(total);
    }
    if (!opt || !opt->params || !opt->state || !opt->state_storage) {
        attn_optimizer_free(opt);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_optimizer_new: cannot allocate state for "
                         "%zu parameters (%zu floats)", count, total);
    }
    opt->ctx = ctx;
    opt->cfg = *cfg;
    opt->count = count;
    opt->state_floats = total;
    memcpy(opt->params, params, count * sizeof *params);
    float *next = opt->state_storage;
    for (size_t i = 0; i < count; i++) {
        for (size_t s = 0; s < per_param; s++) {
            opt->state[i * 3 + s] = next;
            next += params[i].numel;
        }
    }
    *out = opt;
    return ATTN_OK;
}

void attn_optimizer_free(attn_optimizer *opt) {
    if (!opt) return;
    attn_free(opt->params);
    attn_free(opt->state);
    attn_free(opt->state_storage);
    attn_free(opt);
}

/* ---- the updates, one tensor at a time, split over threads -------------- */

typedef struct update_job {
    float *p;
    const float *g;
    float *s0, *s1, *s2; /* the parameter's state buffers */
    /* scalars, already float as PyTorch makes them */
    float weight_decay, momentum, one_minus_dampening, neg_lr;
    bool use_weight_decay, use_momentum, first_step, nesterov;
    float decay, lerp_coeff, beta2, one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size;
    bool lerp_small; /* the lerp weight 1 - beta1 is below 0.5 */
    bool amsgrad;
} update_job;

/* SGD (sgd.py, _single_tensor_sgd) on elements [begin, end). */
static void sgd_range(void *arg, size_t begin, size_t end) {
    const update_job *j = arg;
    for (size_t i = begin; i < end; i++) {
        float d = j->g[i];
        /* d_p = d_p.add(param, alpha=weight_decay) */
        if (j->use_weight_decay) d = fmaf(j->p[i], j->weight_decay, d);
        if (j->use_momentum) {
            float *buf = j->s0;
            /* buf = clone(d_p), or buf.mul_(momentum).add_(d_p, alpha=1 - dampening) */
            buf[i] = j->first_step ? d : fmaf(d, j->one_minus_dampening, buf[i] * j->momentum);
            /* d_p = d_p.add(buf, alpha=momentum) if nesterov else buf */
            d = j->nesterov ? fmaf(buf[i], j->momentum, d) : buf[i];
        }
        /* param.add_(d_p, alpha=-lr) */
        j->p[i] = fmaf(d, j->neg_lr, j->p[i]);
    }
}

/* torch.maximum: NaN if either is NaN. */
static float maximum_nan(float a, float b) {
    if (isnan(a) || isnan(b)) return NAN;
    return a > b ? a : b;
}

/* exp_avg.lerp_(grad, w), w = 1 - beta1, as ATen's CPU kernel computes it:
 * m + w (g - m) for |w| < 0.5, else g + (w - 1) (g - m), each one fused
 * multiply-add (lerp_coeff is w or w - 1). */
static inline __attribute__((always_inline)) float lerp_moment(const update_job *j, float m,
                                                               float g) {
    return fmaf(j->lerp_coeff, g - m, j->lerp_small ? m : g);
}

/* AdamW (adam.py, _single_tensor_adam with decoupled weight decay,
 * capturable=False) on [begin, end). */
static inline __attribute__((always_inline)) void adamw_elements(const update_job *j,
                                                                 size_t begin, size_t end) {
    float *exp_avg = j->s0, *exp_avg_sq = j->s1, *max_exp_avg_sq = j->s2;
    for (size_t i = begin; i < end; i++) {
        float g = j->g[i];
        /* param.mul_(1 - lr * weight_decay) */
        float p = j->p[i] * j->decay;
        /* exp_avg.lerp_(grad, 1 - beta1) */
        exp_avg[i] = lerp_moment(j, exp_avg[i], g);
        /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2) */
        exp_avg_sq[i] = fmaf(j->one_minus_beta2 * g, g, exp_avg_sq[i] * j->beta2);
        float second = exp_avg_sq[i];
        if (j->amsgrad) {
            /* torch.maximum(max_exp_avg_sqs[i], exp_avg_sq, out=max_exp_avg_sqs[i]) */
            max_exp_avg_sq[i] = maximum_nan(max_exp_avg_sq[i], exp_avg_sq[i]);
            second = max_exp_avg_sq[i];
        }
        /* denom = (second.sqrt() / bias_correction2_sqrt).add_(eps) */
        float denom = sqrtf(second) / j->bias_correction2_sqrt + j->eps;
        /* param.addcdiv_(exp_avg, denom, value=-step_size) */
        j->p[i] = p + (j->neg_step_size * exp_avg[i]) / denom;
    }
}

static void adamw_range(void *arg, size_t begin, size_t end) {
    adamw_elements(arg, begin, end);
}

/* The same loop where the CPU has FMA: fmaf is then one instruction, not a
 * call into libm, with the same correctly rounded result, so the update's
 * bits do not depend on which of the two runs. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define OPTIM_FMA_CLONE 1
__attribute__((target("fma"))) static void adamw_range_fma(void *arg, size_t begin, size_t end) {
    adamw_elements(arg, begin, end);
}

/* Without amsgrad, eight elements at once where the CPU has AVX2: every
 * operation of adamw_elements in its order, each correctly rounded in a
 * vector lane as in a scalar one (sqrt and the divisions included), so the
 * bits are the scalar loop's. The scalar loop, compiled with libm's errno
 * rules for sqrtf, stays scalar; its divisions and square root bound the
 * step more than memory does. */
__attribute__((target("avx2,fma"))) static void adamw_range_avx2(void *arg, size_t begin,
                                                                 size_t end) {
    const update_job *j = arg;
    float *p = j->p, *exp_avg = j->s0, *exp_avg_sq = j->s1;
    const float *g = j->g;
    const __m256 decay = _mm256_set1_ps(j->decay), lerp_coeff = _mm256_set1_ps(j->lerp_coeff);
    const __m256 beta2 = _mm256_set1_ps(j->beta2);
    const __m256 one_minus_beta2 = _mm256_set1_ps(j->one_minus_beta2);
    const __m256 bc2_sqrt = _mm256_set1_ps(j->bias_correction2_sqrt);
    const __m256 eps = _mm256_set1_ps(j->eps), neg_step = _mm256_set1_ps(j->neg_step_size);
    size_t i = begin;
    for (; i + 8 <= end; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 pv = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
        __m256 m0 = _mm256_loadu_ps(exp_avg + i);
        __m256 m = _mm256_fmadd_ps(lerp_coeff, _mm256_sub_ps(gv, m0), j->lerp_small ? m0 : gv);
        __m256 v = _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, gv), gv,
                                   _mm256_mul_ps(_mm256_loadu_ps(exp_avg_sq + i), beta2));
        _mm256_storeu_ps(exp_avg + i, m);
        _mm256_storeu_ps(exp_avg_sq + i, v);
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2_sqrt), eps);
        _mm256_storeu_ps(p + i, _mm256_add_ps(pv, _mm256_div_ps(_mm256_mul_ps(neg_step, m), denom)));
    }
    adamw_elements(j, i, end);
}
#endif

attn_status attn_optimizer_step(attn_optimizer *opt) {
    if (!opt) return ATTN_ERR_NULL;
    attn_clear_error(opt->ctx);
    const attn_optimizer_config *c = &opt->cfg;
    update_job base = {0};
    attn_range_fn body;
    if (c->kind == ATTN_OPTIMIZER_SGD) {
        base.use_weight_decay = c->weight_decay != 0.0;
        base.weight_decay = (float)c->weight_decay;
        base.use_momentum = c->momentum != 0.0;
        base.momentum = (float)c->momentum;
        base.one_minus_dampening = (float)(1.0 - c->dampening);
        base.nesterov = c->nesterov;
        base.first_step = opt->steps == 0;
        base.neg_lr = (float)-c->lr;
        body = sgd_range;
    } else {
        /* step_t += 1; step = step_t.item() */
        double step = (double)(opt->steps + 1);
        double bias_correction1 = 1.0 - pow(c->beta1, step);
        double bias_correction2 = 1.0 - pow(c->beta2, step);
        double step_size = c->lr / bias_correction1;
        base.decay = (float)(1.0 - c->lr * c->weight_decay);
        /* the lerp's weight, a float as it meets the tensor; w - 1 is exact */
        float weight = (float)(1.0 - c->beta1);
        base.lerp_small = fabsf(weight) < 0.5f;
        base.lerp_coeff = base.lerp_small ? weight : weight - 1.0f;
        base.beta2 = (float)c->beta2;
        base.one_minus_beta2 = (float)(1.0 - c->beta2);
        /* bias_correction2 ** 0.5: Python's float power, libm's pow */
        base.bias_correction2_sqrt = (float)pow(bias_correction2, 0.5);
        base.eps = (float)c->eps;
        base.neg_step_size = (float)-step_size;
        base.amsgrad = c->amsgrad;
        body = adamw_range;
#ifdef OPTIM_FMA_CLONE
        if (__builtin_cpu_supports("fma")) body = adamw_range_fma;
        if (!c->amsgrad && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            body = adamw_range_avx2;
#endif
    }
    attn_workers w = attn_ctx_workers(opt->ctx);
    for (size_t i = 0; i < opt->count; i++) {
        update_job job = base;
        job.p = opt->params[i].data;
        job.g = opt->params[i].grad;
        job.s0 = opt->state[i * 3];
        job.s1 = opt->state[i * 3 + 1];
        job.s2 = opt->state[i * 3 + 2];
        attn_pool_for(w.pool, w.threads, opt->params[i].numel, OPTIM_MIN_PER_THREAD, body, &job);
    }
    opt->steps++;
    return ATTN_OK;
}

attn_status attn_optimizer_zero_grad(attn_optimizer *opt) {
    if (!opt) return ATTN_ERR_NULL;
    attn_clear_error(opt->ctx);
    for (size_t i = 0; i < opt->count; i++)
        memset(opt->params[i].grad, 0, opt->params[i].numel * sizeof(float));
    return ATTN_OK;
}

attn_status attn_optimizer_set_lr(attn_optimizer *opt, double lr) {
    if (!opt) return ATTN_ERR_NULL;
    attn_clear_error(opt->ctx);
    if (!(lr >= 0.0) || !isfinite(lr))
        return attn_fail(opt->ctx, ATTN_ERR_INVALID, "%s: lr (%g) must be finite and >= 0",
                         kind_name(opt->cfg.kind), lr);
    opt->cfg.lr = lr;
    return ATTN_OK;
}

double attn_optimizer_lr(const attn_optimizer *opt) { return opt ? opt->cfg.lr : NAN; }

size_t attn_optimizer_steps(const attn_optimizer *opt) { return opt ? opt->steps : 0; }

size_t attn_optimizer_state_size(const attn_optimizer *opt) { return opt ? opt->state_floats : 0; }

attn_status attn_optimizer_get_state(const attn_optimizer *opt, float *state, size_t n,
                                     size_t *steps) {
    if (!opt) return ATTN_ERR_NULL;
    attn_clear_error(opt->ctx);
    if ((!state && n > 0) || !steps)
        return attn_fail(opt->ctx, ATTN_ERR_NULL, "attn_optimizer_get_state: %s is NULL",
                         !steps ? "steps" : "state");
    if (n != opt->state_floats)
        return attn_fail(opt->ctx, ATTN_ERR_SHAPE,
                         "attn_optimizer_get_state: n %zu, the state holds %zu floats", n,
                         opt->state_floats);
    if (n > 0) memcpy(state, opt->state_storage, n * sizeof(float));
    *steps = opt->steps;
    return ATTN_OK;
}

attn_status attn_optimizer_set_state(attn_optimizer *opt, const float *state, size_t n,
                                     size_t steps) {
    if (!opt) return ATTN_ERR_NULL;
    attn_clear_error(opt->ctx);
    if (!state && n > 0)
        return attn_fail(opt->ctx, ATTN_ERR_NULL, "attn_optimizer_set_state: state is NULL");
    if (n != opt->state_floats)
        return attn_fail(opt->ctx, ATTN_ERR_SHAPE,
                         "attn_optimizer_set_state: n %zu, the state holds %zu floats", n,
                         opt->state_floats);
    if (steps > ATTN_OPTIMIZER_MAX_STEPS)
        return attn_fail(opt->ctx, ATTN_ERR_INVALID,
                         "attn_optimizer_set_state: steps %zu is past 2^53, where a step "
                         "count is no longer exact in the bias corrections' double",
                         steps);
    if (n > 0) memcpy(opt->state_storage, state, n * sizeof(float));
    opt->steps = steps;
    return ATTN_OK;
}

/* ---- clip_grad_norm_ ------------------------------------------------------ */

attn_status attn_clip_grad_norm(attn_ctx *ctx, const attn_param *params, size_t count,
                                double max_norm, float *total_norm) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    /* inf is PyTorch's way to read the norm without clipping: the factor
     * below is then inf, clamped to 1 (NaN where the norm is inf, as
     * PyTorch's) */
    if (!(max_norm >= 0.0))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_clip_grad_norm: max_norm (%g) must be >= 0 (inf: no clipping)",
                         max_norm);
    if (count == 0) { /* clip_grad_norm_([]) is 0, and clips nothing */
        if (total_norm) *total_norm = 0.0f;
        return ATTN_OK;
    }
    attn_status st = check_params(ctx, "attn_clip_grad_norm", params, count);
    if (st != ATTN_OK) return st;
    /* total_norm = torch.norm(torch.stack([torch.norm(g) for g in grads])):
     * each norm a float32 result, the sums of squares in double here. */
    double sum_of_norms = 0.0;
    for (size_t i = 0; i < count; i++) {
        double sum = 0.0;
        const float *g = params[i].grad;
        for (size_t k = 0; k < params[i].numel; k++) sum += (double)g[k] * g[k];
        float norm = (float)sqrt(sum);
        sum_of_norms += (double)norm * norm;
    }
    float total = (float)sqrt(sum_of_norms);
    if (total_norm) *total_norm = total;
    /* clip_coef = max_norm / (total_norm + 1e-6): a float tensor, and a
     * Python number divided by a tensor is tensor.reciprocal() * number */
    float clip_coef = (1.0f / (total + (float)1e-6)) * (float)max_norm;
    /* torch.clamp(clip_coef, max=1.0) keeps NaN */
    if (clip_coef > 1.0f) clip_coef = 1.0f;
    /* g.mul_(clip_coef_clamped), for every gradient */
    for (size_t i = 0; i < count; i++) {
        float *g = params[i].grad;
        for (size_t k = 0; k < params[i].numel; k++) g[k] *= clip_coef;
    }
    return ATTN_OK;
}
