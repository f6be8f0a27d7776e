/*
 * test_errors.c — hostile tests of every error path of the public API.
 *
 * Each failing call is checked for its status AND for a message fragment
 * that names the offending values (attn_ctx_last_error). Every pointer
 * argument is passed NULL once; every size is passed 0, one past its limit,
 * and large enough that its products overflow size_t. Edge sizes that must
 * succeed (T = 1, head_dim 1, dropout 1 in training, ...) are checked too,
 * as is that a successful call clears the previous call's message and that
 * the library writes nothing to stdout.
 *
 * Calls that a careless library would answer by reading or writing far out
 * of bounds (sizes whose byte count overflows size_t, runaway loops) run in
 * a forked child with an alarm, so that a crash or a hang is reported as a
 * failed check and the rest of the suite still runs. Set
 * ATTN_TEST_VERBOSE=1 to see the children's sanitizer reports.
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"

#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- sanitizer settings ------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif

#ifdef TEST_ASAN
/* Allocations too large to satisfy must come back NULL (the library then
 * reports ATTN_ERR_NO_MEMORY) instead of aborting the test. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=1:soft_rss_limit_mb=3072";
}
#endif

/* ---- shared state and helpers -------------------------------------------- */

static attn_ctx *g_ctx;
static attn_rng *g_rng;

#define SZ_MAX ((size_t)-1)
#define POW2(n) ((size_t)1 << (n))

/* The call fails with want and the message holds frag. */
#define EXPECT_FAIL(call, want, frag)       \
    do {                                    \
        CHECK_STATUS((call), (want));       \
        CHECK_MESSAGE(g_ctx, (frag));       \
    } while (0)

#define EXPECT_FAIL2(call, want, frag1, frag2) \
    do {                                       \
        CHECK_STATUS((call), (want));          \
        CHECK_MESSAGE(g_ctx, (frag1));         \
        CHECK_MESSAGE(g_ctx, (frag2));         \
    } while (0)

/* The last call through ctx succeeded and left no message. */
#define CHECK_CLEARED(c)                                                                 \
    do {                                                                                 \
        const char *m_ = attn_ctx_last_error(c);                                         \
        if (m_ && m_[0] == '\0') {                                                       \
            check_passed++;                                                              \
        } else {                                                                         \
            check_failed++;                                                              \
            fprintf(stderr, "%s:%d: message not cleared after success: \"%s\"\n", __FILE__, \
                    __LINE__, m_ ? m_ : "(null)");                                       \
        }                                                                                \
    } while (0)

static bool all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

static bool all_zero(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f) return false;
    return true;
}

static void fill(float *x, size_t n, float base) {
    for (size_t i = 0; i < n; i++) x[i] = base + 0.01f * (float)(i % 97) - 0.3f * (float)(i % 5);
}

static const attn_module_kind all_kinds[] = {ATTN_MODULE_SIMPLE, ATTN_MODULE_SA_V1,
                                             ATTN_MODULE_SA_V2,  ATTN_MODULE_CAUSAL,
                                             ATTN_MODULE_MHA_WRAPPER, ATTN_MODULE_MHA,
                                             ATTN_MODULE_GPT2, ATTN_MODULE_GQA,
                                             ATTN_MODULE_MLA, ATTN_MODULE_SWA};
#define NUM_KINDS (sizeof all_kinds / sizeof all_kinds[0])

static const char *kind_class(attn_module_kind kind) {
    switch (kind) {
    case ATTN_MODULE_SIMPLE: return "SimplifiedSelfAttention";
    case ATTN_MODULE_SA_V1: return "SelfAttention_v1";
    case ATTN_MODULE_SA_V2: return "SelfAttention_v2";
    case ATTN_MODULE_CAUSAL: return "CausalAttention";
    case ATTN_MODULE_MHA_WRAPPER: return "MultiHeadAttentionWrapper";
    case ATTN_MODULE_MHA: return "MultiHeadAttention";
    case ATTN_MODULE_GPT2: return "CausalSelfAttention";
    case ATTN_MODULE_GQA: return "GroupedQueryAttention";
    case ATTN_MODULE_MLA: return "MultiHeadLatentAttention";
    case ATTN_MODULE_SWA: return "MultiHeadAttentionWithSWA";
    }
    return "?";
}

static bool kind_has_context(attn_module_kind kind) {
    return kind == ATTN_MODULE_CAUSAL || kind == ATTN_MODULE_MHA_WRAPPER ||
           kind == ATTN_MODULE_MHA || kind == ATTN_MODULE_GPT2;
}

/* Everything any module needs; fields a kind does not have are ignored.
 * gpt2: n_embd = d_in, n_head = heads, block_size = context. */
typedef struct spec {
    attn_module_kind kind;
    size_t d_in, d_out, context, heads;
    double dropout;
    bool bias;
    double scale;
    attn_mask_method mask;
} spec;

static attn_status build(attn_ctx *c, attn_rng *rng, const spec *s, attn_module **out) {
    attn_status st = ATTN_ERR_INVALID;
    *out = NULL;
    switch (s->kind) {
    case ATTN_MODULE_SIMPLE: {
        attn_simple *m = NULL;
        st = attn_simple_new(c, &(attn_simple_config){.d_in = s->d_in}, &m);
        *out = attn_simple_module(m);
        break;
    }
    case ATTN_MODULE_SA_V1: {
        attn_sa_v1 *m = NULL;
        attn_sa_v1_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .scale = s->scale};
        st = attn_sa_v1_new(c, &cfg, rng, &m);
        *out = attn_sa_v1_module(m);
        break;
    }
    case ATTN_MODULE_SA_V2: {
        attn_sa_v2 *m = NULL;
        attn_sa_v2_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .qkv_bias = s->bias,
                                 .scale = s->scale};
        st = attn_sa_v2_new(c, &cfg, rng, &m);
        *out = attn_sa_v2_module(m);
        break;
    }
    case ATTN_MODULE_CAUSAL: {
        attn_causal *m = NULL;
        attn_causal_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .context_length = s->context,
                                  .dropout = s->dropout, .qkv_bias = s->bias, .scale = s->scale,
                                  .mask = s->mask};
        st = attn_causal_new(c, &cfg, rng, &m);
        *out = attn_causal_module(m);
        break;
    }
    case ATTN_MODULE_MHA_WRAPPER: {
        attn_mha_wrapper *m = NULL;
        attn_mha_wrapper_config cfg = {.d_in = s->d_in, .d_out = s->d_out,
                                       .context_length = s->context, .num_heads = s->heads,
                                       .dropout = s->dropout, .qkv_bias = s->bias,
                                       .scale = s->scale, .mask = s->mask};
        st = attn_mha_wrapper_new(c, &cfg, rng, &m);
        *out = attn_mha_wrapper_module(m);
        break;
    }
    case ATTN_MODULE_MHA: {
        attn_mha *m = NULL;
        attn_mha_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .context_length = s->context,
                               .num_heads = s->heads, .dropout = s->dropout, .qkv_bias = s->bias,
                               .scale = s->scale, .mask = s->mask};
        st = attn_mha_new(c, &cfg, rng, &m);
        *out = attn_mha_module(m);
        break;
    }
    case ATTN_MODULE_GPT2: {
        attn_gpt2 *m = NULL;
        attn_gpt2_config cfg = {.n_embd = s->d_in, .n_head = s->heads, .block_size = s->context,
                                .dropout = s->dropout, .scale = s->scale};
        st = attn_gpt2_new(c, &cfg, rng, &m);
        *out = attn_gpt2_module(m);
        break;
    }
    /* the book's chapter-4 modules: no context; one KV head (divides any
     * heads), the default latent, a window of 2 */
    case ATTN_MODULE_GQA: {
        attn_gqa *m = NULL;
        attn_gqa_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .num_heads = s->heads,
                               .num_kv_groups = 1, .dropout = s->dropout, .qkv_bias = s->bias,
                               .scale = s->scale};
        st = attn_gqa_new(c, &cfg, rng, &m);
        *out = attn_gqa_module(m);
        break;
    }
    case ATTN_MODULE_MLA: {
        attn_mla *m = NULL;
        attn_mla_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .num_heads = s->heads,
                               .dropout = s->dropout, .qkv_bias = s->bias, .scale = s->scale};
        st = attn_mla_new(c, &cfg, rng, &m);
        *out = attn_mla_module(m);
        break;
    }
    case ATTN_MODULE_SWA: {
        attn_swa *m = NULL;
        attn_swa_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .num_heads = s->heads,
                               .sliding_window_size = 2, .dropout = s->dropout,
                               .qkv_bias = s->bias, .scale = s->scale};
        st = attn_swa_new(c, &cfg, rng, &m);
        *out = attn_swa_module(m);
        break;
    }
    }
    return st;
}

/* A small valid spec of each kind: d_in 4, d_out 4 (wrapper: 2 heads of 2),
 * context 4, 2 heads. */
static spec small_spec(attn_module_kind kind) {
    spec s = {.kind = kind, .d_in = 4, .d_out = 4, .context = 4, .heads = 2};
    if (kind == ATTN_MODULE_MHA_WRAPPER) s.d_out = 2;
    return s;
}

static attn_module *build_ok(const spec *s, uint64_t seed) {
    attn_module *m = NULL;
    attn_rng_manual_seed(g_rng, seed);
    attn_status st = build(g_ctx, g_rng, s, &m);
    if (st != ATTN_OK) {
        check_failed++;
        fprintf(stderr, "%s:%d: building %s failed: %s: %s\n", __FILE__, __LINE__,
                kind_class(s->kind), attn_status_name(st), attn_ctx_last_error(g_ctx));
        return NULL;
    }
    check_passed++;
    return m;
}

/* ---- running hostile calls in a child ------------------------------------ */

typedef struct hostile_args {
    attn_module *m;
    attn_simple *simple;
    size_t n1, n2, n3;
    const void *cfg;
} hostile_args;

typedef attn_status (*hostile_fn)(const hostile_args *a);

/* Small buffers the hostile calls pretend are huge. */
static float hostile_in[256], hostile_out[256], hostile_w[256];

typedef struct isolated_result {
    bool completed; /* the child returned a status (no crash, no hang) */
    attn_status status;
    char message[1024];
} isolated_result;

/* Runs fn(a) in a child that may use at most `seconds` seconds. */
static isolated_result run_isolated(const char *what, hostile_fn fn, const hostile_args *a,
                                    unsigned seconds, int line) {
    isolated_result r = {.completed = false, .status = ATTN_OK, .message = ""};
    fflush(NULL);
    int fds[2];
    if (pipe(fds) != 0) {
        fprintf(stderr, "%s:%d: pipe failed for %s\n", __FILE__, line, what);
        return r;
    }
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "%s:%d: fork failed for %s\n", __FILE__, line, what);
        close(fds[0]);
        close(fds[1]);
        return r;
    }
    if (pid == 0) {
        close(fds[0]);
        const char *verbose = getenv("ATTN_TEST_VERBOSE");
        if (!verbose || !*verbose || strcmp(verbose, "0") == 0) {
            int devnull = open("/dev/null", O_WRONLY);
            if (devnull >= 0) dup2(devnull, 2);
        }
#ifndef TEST_ASAN
        /* A runaway allocation loop fails at 4 GiB instead of eating the machine. */
        struct rlimit lim = {(rlim_t)4 << 30, (rlim_t)4 << 30};
        setrlimit(RLIMIT_AS, &lim);
#endif
        alarm(seconds);
        attn_status st = fn(a);
        int code = (int)st;
        const char *msg = attn_ctx_last_error(g_ctx);
        ssize_t ignored = write(fds[1], &code, sizeof code);
        ignored = write(fds[1], msg, strlen(msg));
        (void)ignored;
        _exit(0);
    }
    close(fds[1]);
    int code = 0;
    size_t got = 0, len = 0;
    char *dst = (char *)&code;
    while (got < sizeof code) {
        ssize_t n = read(fds[0], dst + got, sizeof code - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    while (got == sizeof code && len + 1 < sizeof r.message) {
        ssize_t n = read(fds[0], r.message + len, sizeof r.message - 1 - len);
        if (n <= 0) break;
        len += (size_t)n;
    }
    r.message[len] = '\0';
    close(fds[0]);
    int wstatus = 0;
    while (waitpid(pid, &wstatus, 0) < 0) {
    }
    if (got == sizeof code && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) {
        r.completed = true;
        r.status = (attn_status)code;
    } else if (WIFSIGNALED(wstatus)) {
        fprintf(stderr, "%s:%d: %s: the child died of signal %d%s\n", __FILE__, line, what,
                WTERMSIG(wstatus),
                WTERMSIG(wstatus) == SIGALRM ? " (did not return in time)" : "");
    } else {
        fprintf(stderr, "%s:%d: %s: the child exited with %d before returning (sanitizer "
                "report? rerun with ATTN_TEST_VERBOSE=1)\n",
                __FILE__, line, what, WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1);
    }
    return r;
}

/* The hostile call returns one of the wanted statuses without crashing, and
 * its message holds frag (NULL: any non-empty message). */
static void expect_isolated(const char *what, hostile_fn fn, const hostile_args *a,
                            unsigned seconds, attn_status want1, attn_status want2,
                            const char *frag, int line) {
    isolated_result r = run_isolated(what, fn, a, seconds, line);
    if (!r.completed) {
        check_failed++;
        return;
    }
    if (r.status == want1 || r.status == want2) {
        check_passed++;
    } else {
        check_failed++;
        fprintf(stderr, "%s:%d: %s returned %s, want %s%s%s (message \"%s\")\n", __FILE__, line,
                what, attn_status_name(r.status), attn_status_name(want1),
                want2 != want1 ? " or " : "", want2 != want1 ? attn_status_name(want2) : "",
                r.message);
        return;
    }
    if (frag ? strstr(r.message, frag) != NULL : r.message[0] != '\0') {
        check_passed++;
    } else {
        check_failed++;
        fprintf(stderr, "%s:%d: %s: message \"%s\" lacks \"%s\"\n", __FILE__, line, what,
                r.message, frag ? frag : "(anything)");
    }
}

#define EXPECT_ISOLATED(what, fn, args, secs, w1, w2, frag) \
    expect_isolated((what), (fn), (args), (secs), (w1), (w2), (frag), __LINE__)

/* ---- status names, version, context -------------------------------------- */

static void test_status_names(void) {
    static const struct {
        attn_status status;
        const char *name;
    } names[] = {
        {ATTN_OK, "ATTN_OK"},
        {ATTN_ERR_NULL, "ATTN_ERR_NULL"},
        {ATTN_ERR_INVALID, "ATTN_ERR_INVALID"},
        {ATTN_ERR_SHAPE, "ATTN_ERR_SHAPE"},
        {ATTN_ERR_OVERFLOW, "ATTN_ERR_OVERFLOW"},
        {ATTN_ERR_NO_MEMORY, "ATTN_ERR_NO_MEMORY"},
        {ATTN_ERR_NOT_FOUND, "ATTN_ERR_NOT_FOUND"},
        {ATTN_ERR_IO, "ATTN_ERR_IO"},
        {ATTN_ERR_FORMAT, "ATTN_ERR_FORMAT"},
        {ATTN_ERR_UNSUPPORTED, "ATTN_ERR_UNSUPPORTED"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *got = attn_status_name(names[i].status);
        CHECK(got != NULL && strcmp(got, names[i].name) == 0);
    }
    /* Values no enumerator has: never NULL, never a valid name. */
    int bogus[] = {9, 10, 100, -1, 0x7fffffff};
    for (size_t i = 0; i < sizeof bogus / sizeof bogus[0]; i++) {
        const char *got = attn_status_name((attn_status)bogus[i]);
        CHECK(got != NULL && got[0] != '\0');
        CHECK(got != NULL && strcmp(got, "ATTN_OK") != 0 && strcmp(got, "ATTN_ERR_NULL") != 0);
    }
    CHECK(strcmp(attn_version(), ATTN_VERSION_STRING) == 0);
}

static void test_ctx(void) {
    attn_ctx *c = (attn_ctx *)&c; /* garbage the call must overwrite */
    CHECK_STATUS(attn_ctx_new(NULL, NULL), ATTN_ERR_NULL);
    attn_ctx_config cfg = {.num_threads = SZ_MAX};
    CHECK_STATUS(attn_ctx_new(&cfg, &c), ATTN_ERR_INVALID);
    CHECK(c == NULL);
    c = (attn_ctx *)&c;
    cfg.num_threads = 1u << 20;
    CHECK_STATUS(attn_ctx_new(&cfg, &c), ATTN_ERR_INVALID);
    CHECK(c == NULL);
    cfg.num_threads = 4097;
    CHECK_STATUS(attn_ctx_new(&cfg, &c), ATTN_ERR_INVALID);
    CHECK(c == NULL);
    CHECK_STATUS(attn_ctx_new(&cfg, NULL), ATTN_ERR_NULL);

    /* The defaults, and 0 threads meaning 1. */
    CHECK_STATUS(attn_ctx_new(NULL, &c), ATTN_OK);
    CHECK(c != NULL && attn_ctx_num_threads(c) == 1);
    CHECK(c != NULL && strcmp(attn_ctx_last_error(c), "") == 0);
    attn_ctx_free(c);
    cfg.num_threads = 0;
    CHECK_STATUS(attn_ctx_new(&cfg, &c), ATTN_OK);
    CHECK(attn_ctx_num_threads(c) == 1);
    attn_ctx_free(c);
    cfg.num_threads = 3;
    CHECK_STATUS(attn_ctx_new(&cfg, &c), ATTN_OK);
    CHECK(attn_ctx_num_threads(c) == 3);
    attn_ctx_free(c);

    /* NULL ctx in the accessors. */
    CHECK(attn_ctx_last_error(NULL) != NULL && attn_ctx_last_error(NULL)[0] == '\0');
    CHECK(attn_ctx_num_threads(NULL) == 0);
    attn_ctx_free(NULL);
}

/* ---- rng ----------------------------------------------------------------- */

/* Bounds beyond float32, and widths beyond FLT_MAX, are
 * refused as PyTorch's uniform_ refuses them ("from is out of bounds for
 * float", "to - from ... max"), and the output is not touched. */
static void test_rng_uniform_bounds(void) {
    float buf[4] = {7, 7, 7, 7};
    EXPECT_FAIL2(attn_rng_uniform(g_rng, buf, 4, -1e300, 1e300), ATTN_ERR_INVALID, "from=-1e+300",
                 "out of bounds for float32");
    EXPECT_FAIL2(attn_rng_uniform(g_rng, buf, 4, 0.0, 1e300), ATTN_ERR_INVALID, "to=1e+300",
                 "out of bounds for float32");
    EXPECT_FAIL2(attn_rng_uniform(g_rng, buf, 4, -3.4e38, 3.4e38), ATTN_ERR_INVALID, "to - from",
                 "exceeds float32's max");
    EXPECT_FAIL(attn_rng_uniform(g_rng, buf, 4, -(double)FLT_MAX * 1.0000001, 0.0),
                ATTN_ERR_INVALID, "out of bounds");
    CHECK(buf[0] == 7 && buf[1] == 7 && buf[2] == 7 && buf[3] == 7);
    /* The widest intervals PyTorch accepts still give finite values. */
    CHECK_STATUS(attn_rng_uniform(g_rng, buf, 4, -(double)FLT_MAX / 2, (double)FLT_MAX / 2), ATTN_OK);
    CHECK(all_finite(buf, 4));
    CHECK_STATUS(attn_rng_uniform(g_rng, buf, 4, 0.0, (double)FLT_MAX), ATTN_OK);
    CHECK(all_finite(buf, 4));
    CHECK_STATUS(attn_rng_uniform(g_rng, buf, 4, -(double)FLT_MAX, -(double)FLT_MAX), ATTN_OK);
    CHECK(buf[0] == -FLT_MAX);
}

static void test_rng_errors(void) {
    float buf[8] = {0}, w[6], b[2];
    uint32_t u;
    attn_rng *r = NULL;

    EXPECT_FAIL(attn_rng_new(g_ctx, 1, NULL), ATTN_ERR_NULL, "out is NULL");

    /* NULL rng everywhere: ATTN_ERR_NULL, no crash. */
    CHECK_STATUS(attn_rng_manual_seed(NULL, 1), ATTN_ERR_NULL);
    CHECK_STATUS(attn_rng_set_bernoulli_method(NULL, ATTN_BERNOULLI_MT19937), ATTN_ERR_NULL);
    CHECK_STATUS(attn_rng_next_u32(NULL, &u), ATTN_ERR_NULL);
    CHECK_STATUS(attn_rng_rand(NULL, buf, 4), ATTN_ERR_NULL);
    CHECK_STATUS(attn_rng_uniform(NULL, buf, 4, 0.0, 1.0), ATTN_ERR_NULL);
    CHECK_STATUS(attn_rng_randn(NULL, buf, 4), ATTN_ERR_NULL);
    CHECK_STATUS(attn_rng_linear_init(NULL, w, b, 2, 3), ATTN_ERR_NULL);
    CHECK_STATUS(attn_rng_dropout(NULL, buf, buf, 4, 0.5, NULL), ATTN_ERR_NULL);
    attn_rng_free(NULL);

    /* NULL outputs. */
    EXPECT_FAIL(attn_rng_next_u32(g_rng, NULL), ATTN_ERR_NULL, "out is NULL");
    EXPECT_FAIL(attn_rng_rand(g_rng, NULL, 3), ATTN_ERR_NULL, "out is NULL");
    EXPECT_FAIL(attn_rng_uniform(g_rng, NULL, 3, 0.0, 1.0), ATTN_ERR_NULL, "out is NULL");
    EXPECT_FAIL(attn_rng_randn(g_rng, NULL, 3), ATTN_ERR_NULL, "out is NULL");
    EXPECT_FAIL(attn_rng_linear_init(g_rng, NULL, b, 2, 3), ATTN_ERR_NULL, "weight is NULL");
    EXPECT_FAIL(attn_rng_dropout(g_rng, NULL, buf, 4, 0.5, NULL), ATTN_ERR_NULL, "x is NULL");
    EXPECT_FAIL(attn_rng_dropout(g_rng, buf, NULL, 4, 0.5, NULL), ATTN_ERR_NULL, "y is NULL");
    /* n == 0 needs no buffer. */
    CHECK_STATUS(attn_rng_rand(g_rng, NULL, 0), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    CHECK_STATUS(attn_rng_randn(g_rng, NULL, 0), ATTN_OK);
    CHECK_STATUS(attn_rng_dropout(g_rng, NULL, NULL, 0, 0.5, NULL), ATTN_OK);

    /* Bad ranges name the values. */
    EXPECT_FAIL2(attn_rng_uniform(g_rng, buf, 3, 2.0, 1.0), ATTN_ERR_INVALID, "from=2", "to=1");
    EXPECT_FAIL(attn_rng_uniform(g_rng, buf, 3, NAN, 1.0), ATTN_ERR_INVALID, "from=nan");
    EXPECT_FAIL(attn_rng_uniform(g_rng, buf, 3, 0.0, INFINITY), ATTN_ERR_INVALID, "to=inf");
    EXPECT_FAIL(attn_rng_uniform(g_rng, buf, 3, -INFINITY, 0.0), ATTN_ERR_INVALID, "from=-inf");
    test_rng_uniform_bounds();
    EXPECT_FAIL(attn_rng_dropout(g_rng, buf, buf, 4, 1.5, NULL), ATTN_ERR_INVALID, "p (1.5)");
    EXPECT_FAIL(attn_rng_dropout(g_rng, buf, buf, 4, -0.25, NULL), ATTN_ERR_INVALID, "p (-0.25)");
    EXPECT_FAIL(attn_rng_dropout(g_rng, buf, buf, 4, NAN, NULL), ATTN_ERR_INVALID, "p (nan)");
    EXPECT_FAIL(attn_rng_dropout(g_rng, buf, buf, 4, INFINITY, NULL), ATTN_ERR_INVALID, "p (inf)");
    EXPECT_FAIL2(attn_rng_linear_init(g_rng, w, NULL, SZ_MAX / 2, 3), ATTN_ERR_OVERFLOW,
                 "9223372036854775807", "(3)");
    /* nn.Linear(0, 2) is legal in PyTorch: an empty weight and a bias drawn
     * from U(-0, 0), i.e. zeros. */
    b[0] = b[1] = 9.0f;
    CHECK_STATUS(attn_rng_linear_init(g_rng, w, b, 2, 0), ATTN_OK);
    CHECK(b[0] == 0.0f && b[1] == 0.0f);
    CHECK_STATUS(attn_rng_linear_init(g_rng, w, NULL, 0, 0), ATTN_OK);
    EXPECT_FAIL(attn_rng_set_bernoulli_method(g_rng, (attn_bernoulli_method)7), ATTN_ERR_INVALID,
                "unknown method 7");
    EXPECT_FAIL(attn_rng_set_bernoulli_method(g_rng, (attn_bernoulli_method)-1), ATTN_ERR_INVALID,
                "unknown method -1");
    CHECK_STATUS(attn_rng_set_bernoulli_method(g_rng, ATTN_BERNOULLI_MKL_MCG31), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    CHECK_STATUS(attn_rng_set_bernoulli_method(g_rng, ATTN_BERNOULLI_MT19937), ATTN_OK);

    /* A failed call leaves the generator where it was: same next draw. */
    attn_rng *fresh = NULL;
    CHECK_STATUS(attn_rng_new(g_ctx, 77, &fresh), ATTN_OK);
    attn_rng_manual_seed(g_rng, 77);
    attn_rng_uniform(g_rng, buf, 3, 2.0, 1.0);
    attn_rng_dropout(g_rng, buf, buf, 4, 2.0, NULL);
    uint32_t u1 = 0, u2 = 1;
    attn_rng_next_u32(g_rng, &u1);
    attn_rng_next_u32(fresh, &u2);
    CHECK(u1 == u2);

    /* Dropout p = 0 and p = 1 draw nothing; p = 1 zeroes, p = 0 copies. */
    float x[6] = {1, -2, 3, 4.5f, -0.5f, 7}, y[6];
    uint8_t keep[6];
    attn_rng_manual_seed(g_rng, 5);
    attn_rng_manual_seed(fresh, 5);
    CHECK_STATUS(attn_rng_dropout(g_rng, x, y, 6, 1.0, keep), ATTN_OK);
    CHECK(all_zero(y, 6));
    CHECK(keep[0] == 0 && keep[5] == 0);
    CHECK_STATUS(attn_rng_dropout(g_rng, x, y, 6, 0.0, keep), ATTN_OK);
    CHECK(memcmp(x, y, sizeof x) == 0);
    CHECK(keep[0] == 1 && keep[5] == 1);
    attn_rng_next_u32(g_rng, &u1);
    attn_rng_next_u32(fresh, &u2);
    CHECK(u1 == u2);
    attn_rng_free(fresh);

    /* An rng made without a ctx (the header does not say whether ctx may be
     * NULL): whatever the answer, no crash, and a failing call on it must not
     * crash for want of a ctx to hold the message. */
    attn_status st = attn_rng_new(NULL, 1, &r);
    CHECK(st == ATTN_OK || st == ATTN_ERR_NULL);
    if (st == ATTN_OK) {
        CHECK(r != NULL);
        CHECK_STATUS(attn_rng_uniform(r, buf, 3, 2.0, 1.0), ATTN_ERR_INVALID);
        CHECK_STATUS(attn_rng_next_u32(r, NULL), ATTN_ERR_NULL);
        attn_rng_free(r);
    }
}

/* ---- ops ----------------------------------------------------------------- */

static void test_ops_errors(void) {
    float a[12], b[12], c[16], w[12];
    fill(a, 12, 0.1f);
    fill(b, 12, -0.2f);
    fill(w, 12, 0.3f);

    /* NULL ctx: ATTN_ERR_NULL, even with valid buffers. */
    CHECK_STATUS(attn_matmul(NULL, a, b, c, 2, 3, 2, false), ATTN_ERR_NULL);
    CHECK_STATUS(attn_softmax(NULL, a, c, 2, 3), ATTN_ERR_NULL);
    CHECK_STATUS(attn_linear(NULL, a, w, NULL, c, 2, 3, 2), ATTN_ERR_NULL);
    CHECK_STATUS(attn_mask_causal_neg_inf(NULL, c, 3), ATTN_ERR_NULL);
    CHECK_STATUS(attn_mask_causal_renormalize(NULL, c, 3), ATTN_ERR_NULL);

    /* NULL buffers are named. */
    EXPECT_FAIL(attn_matmul(g_ctx, NULL, b, c, 2, 3, 2, false), ATTN_ERR_NULL, "a is NULL");
    EXPECT_FAIL(attn_matmul(g_ctx, a, NULL, c, 2, 3, 2, false), ATTN_ERR_NULL, "b is NULL");
    EXPECT_FAIL(attn_matmul(g_ctx, a, b, NULL, 2, 3, 2, true), ATTN_ERR_NULL, "c is NULL");
    EXPECT_FAIL(attn_softmax(g_ctx, NULL, c, 2, 3), ATTN_ERR_NULL, "x is NULL");
    EXPECT_FAIL(attn_softmax(g_ctx, a, NULL, 2, 3), ATTN_ERR_NULL, "y is NULL");
    EXPECT_FAIL(attn_linear(g_ctx, NULL, w, NULL, c, 2, 3, 2), ATTN_ERR_NULL, "x is NULL");
    EXPECT_FAIL(attn_linear(g_ctx, a, NULL, NULL, c, 2, 3, 2), ATTN_ERR_NULL, "weight is NULL");
    EXPECT_FAIL(attn_linear(g_ctx, a, w, NULL, NULL, 2, 3, 2), ATTN_ERR_NULL, "y is NULL");
    EXPECT_FAIL(attn_mask_causal_neg_inf(g_ctx, NULL, 3), ATTN_ERR_NULL, "scores is NULL");
    EXPECT_FAIL(attn_mask_causal_renormalize(g_ctx, NULL, 3), ATTN_ERR_NULL, "weights is NULL");

    /* Element counts that overflow size_t, with the sizes in the message. */
    EXPECT_FAIL2(attn_matmul(g_ctx, a, b, c, SZ_MAX / 2, 3, 2, false), ATTN_ERR_OVERFLOW,
                 "m=9223372036854775807", "k=3");
    EXPECT_FAIL2(attn_matmul(g_ctx, a, b, c, 2, POW2(40), POW2(40), true), ATTN_ERR_OVERFLOW,
                 "k=1099511627776", "n=1099511627776");
    EXPECT_FAIL2(attn_matmul(g_ctx, a, b, c, POW2(33), 1, POW2(33), false), ATTN_ERR_OVERFLOW,
                 "m=8589934592", "n=8589934592");
    EXPECT_FAIL(attn_softmax(g_ctx, a, c, POW2(40), POW2(40)), ATTN_ERR_OVERFLOW,
                "1099511627776");
    EXPECT_FAIL(attn_linear(g_ctx, a, w, NULL, c, 3, SZ_MAX / 2, 5), ATTN_ERR_OVERFLOW,
                "9223372036854775807");
    EXPECT_FAIL(attn_linear(g_ctx, a, w, NULL, c, POW2(40), 1, POW2(40)), ATTN_ERR_OVERFLOW,
                "1099511627776");
    EXPECT_FAIL(attn_mask_causal_neg_inf(g_ctx, c, POW2(32)), ATTN_ERR_OVERFLOW, "4294967296");
    EXPECT_FAIL(attn_mask_causal_renormalize(g_ctx, c, POW2(32)), ATTN_ERR_OVERFLOW,
                "4294967296");

    /* Zero sizes are empty operations, not errors. */
    CHECK_STATUS(attn_matmul(g_ctx, a, b, c, 0, 3, 2, false), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    CHECK_STATUS(attn_matmul(g_ctx, a, b, c, 2, 0, 2, false), ATTN_OK);
    CHECK(c[0] == 0.0f && c[3] == 0.0f); /* an empty sum is 0 */
    CHECK_STATUS(attn_softmax(g_ctx, a, c, 0, 3), ATTN_OK);
    CHECK_STATUS(attn_softmax(g_ctx, a, c, 3, 0), ATTN_OK);
    CHECK_STATUS(attn_linear(g_ctx, a, w, NULL, c, 0, 3, 2), ATTN_OK);
    CHECK_STATUS(attn_mask_causal_neg_inf(g_ctx, c, 0), ATTN_OK);
    CHECK_STATUS(attn_mask_causal_renormalize(g_ctx, c, 0), ATTN_OK);
    /* T = 1: nothing to mask, the single weight renormalizes to 1. */
    c[0] = 0.25f;
    CHECK_STATUS(attn_mask_causal_neg_inf(g_ctx, c, 1), ATTN_OK);
    CHECK(c[0] == 0.25f);
    CHECK_STATUS(attn_mask_causal_renormalize(g_ctx, c, 1), ATTN_OK);
    CHECK(c[0] == 1.0f);

    /* Every op clears a previous failure's message on success. */
    attn_matmul(g_ctx, NULL, b, c, 2, 3, 2, false);
    CHECK_STATUS(attn_softmax(g_ctx, a, c, 2, 3), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_softmax(g_ctx, NULL, c, 2, 3);
    CHECK_STATUS(attn_linear(g_ctx, a, w, w, c, 2, 3, 2), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_linear(g_ctx, NULL, w, NULL, c, 2, 3, 2);
    CHECK_STATUS(attn_mask_causal_neg_inf(g_ctx, c, 3), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_mask_causal_neg_inf(g_ctx, NULL, 3);
    fill(c, 9, 0.5f);
    CHECK_STATUS(attn_mask_causal_renormalize(g_ctx, c, 3), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_mask_causal_renormalize(g_ctx, NULL, 3);
    CHECK_STATUS(attn_matmul(g_ctx, a, b, c, 2, 3, 2, true), ATTN_OK);
    CHECK_CLEARED(g_ctx);
}

/* Sizes whose element count fits size_t but whose byte count does not: no
 * such buffer can exist, so the only right answer is an error. A library that
 * checks only the element count runs its kernel off the end of the buffers. */
static attn_status hostile_matmul(const hostile_args *a) {
    return attn_matmul(g_ctx, hostile_in, hostile_w, hostile_out, a->n1, a->n2, a->n3, false);
}
static attn_status hostile_softmax(const hostile_args *a) {
    return attn_softmax(g_ctx, hostile_in, hostile_out, a->n1, a->n2);
}
static attn_status hostile_linear(const hostile_args *a) {
    return attn_linear(g_ctx, hostile_in, hostile_w, NULL, hostile_out, a->n1, a->n2, a->n3);
}
static attn_status hostile_mask_neg_inf(const hostile_args *a) {
    return attn_mask_causal_neg_inf(g_ctx, hostile_out, a->n1);
}
static attn_status hostile_mask_renorm(const hostile_args *a) {
    for (size_t i = 0; i < 256; i++) hostile_out[i] = 1.0f;
    return attn_mask_causal_renormalize(g_ctx, hostile_out, a->n1);
}

static void test_ops_byte_overflow(void) {
    hostile_args a = {.n1 = POW2(62), .n2 = 1, .n3 = 1};
    EXPECT_ISOLATED("attn_matmul(m=2^62, k=1, n=1)", hostile_matmul, &a, 5, ATTN_ERR_OVERFLOW,
                    ATTN_ERR_OVERFLOW, "4611686018427387904");
    a = (hostile_args){.n1 = 1, .n2 = POW2(62), .n3 = 1};
    EXPECT_ISOLATED("attn_matmul(m=1, k=2^62, n=1)", hostile_matmul, &a, 5, ATTN_ERR_OVERFLOW,
                    ATTN_ERR_OVERFLOW, "4611686018427387904");
    a = (hostile_args){.n1 = POW2(62), .n2 = 1};
    EXPECT_ISOLATED("attn_softmax(rows=2^62, cols=1)", hostile_softmax, &a, 5, ATTN_ERR_OVERFLOW,
                    ATTN_ERR_OVERFLOW, "4611686018427387904");
    a = (hostile_args){.n1 = POW2(62), .n2 = 1, .n3 = 1};
    EXPECT_ISOLATED("attn_linear(rows=2^62, in=1, out=1)", hostile_linear, &a, 5,
                    ATTN_ERR_OVERFLOW, ATTN_ERR_OVERFLOW, "4611686018427387904");
    a = (hostile_args){.n1 = POW2(31)};
    EXPECT_ISOLATED("attn_mask_causal_neg_inf(tokens=2^31)", hostile_mask_neg_inf, &a, 5,
                    ATTN_ERR_OVERFLOW, ATTN_ERR_OVERFLOW, "2147483648");
    EXPECT_ISOLATED("attn_mask_causal_renormalize(tokens=2^31)", hostile_mask_renorm, &a, 5,
                    ATTN_ERR_OVERFLOW, ATTN_ERR_OVERFLOW, "2147483648");
}

/* ---- constructors -------------------------------------------------------- */

/* One rule for *out. Every constructor sets it to NULL on
 * every failure when out is not NULL: NULL ctx, NULL cfg, NULL rng, bad
 * values alike (before the fix, a NULL argument left it unchanged). */
static void test_out_null_on_every_failure(void) {
    attn_module *stale = (attn_module *)&g_ctx; /* any non-NULL pointer */
    for (size_t k = 0; k < NUM_KINDS; k++) {
        spec s = small_spec(all_kinds[k]);
        for (int how = 0; how < 3; how++) {
            /* how 0: NULL ctx; 1: NULL init_rng; 2: a bad value */
            spec bad = s;
            if (how == 2) bad.d_in = 0;
            attn_module *m = stale;
            attn_status st;
            switch (all_kinds[k]) {
            case ATTN_MODULE_SIMPLE: {
                attn_simple *p = (attn_simple *)stale;
                st = attn_simple_new(how == 0 ? NULL : g_ctx,
                                     how == 1 ? NULL : &(attn_simple_config){.d_in = bad.d_in}, &p);
                m = (attn_module *)p;
                break;
            }
            default:
                st = build(how == 0 ? NULL : g_ctx, how == 1 ? NULL : g_rng, &bad, &m);
                break;
            }
            CHECK(st != ATTN_OK);
            if (m) fprintf(stderr, "  %s, failure %d: *out not NULL\n", kind_class(all_kinds[k]), how);
            CHECK(m == NULL);
        }
    }
    /* The typed constructors directly (build() clears *out itself). */
    attn_sa_v1 *sa1 = (attn_sa_v1 *)stale;
    CHECK_STATUS(attn_sa_v1_new(NULL, &(attn_sa_v1_config){.d_in = 2, .d_out = 2}, g_rng, &sa1),
                 ATTN_ERR_NULL);
    CHECK(sa1 == NULL);
    attn_mha *mha = (attn_mha *)stale;
    CHECK_STATUS(attn_mha_new(g_ctx, NULL, g_rng, &mha), ATTN_ERR_NULL);
    CHECK(mha == NULL);
    attn_gpt2 *gpt2 = (attn_gpt2 *)stale;
    CHECK_STATUS(attn_gpt2_new(g_ctx, &(attn_gpt2_config){.n_embd = 4, .n_head = 2, .block_size = 2},
                               NULL, &gpt2),
                 ATTN_ERR_NULL);
    CHECK(gpt2 == NULL);
    attn_causal *causal = (attn_causal *)stale;
    CHECK_STATUS(attn_causal_new(NULL, NULL, NULL, &causal), ATTN_ERR_NULL);
    CHECK(causal == NULL);
    attn_mha_wrapper *wrapper = (attn_mha_wrapper *)stale;
    CHECK_STATUS(attn_mha_wrapper_new(NULL, NULL, NULL, &wrapper), ATTN_ERR_NULL);
    CHECK(wrapper == NULL);
    attn_sa_v2 *sa2 = (attn_sa_v2 *)stale;
    CHECK_STATUS(attn_sa_v2_new(NULL, NULL, NULL, &sa2), ATTN_ERR_NULL);
    CHECK(sa2 == NULL);
    attn_simple *simple = (attn_simple *)stale;
    CHECK_STATUS(attn_simple_new(NULL, NULL, &simple), ATTN_ERR_NULL);
    CHECK(simple == NULL);
    attn_ctx *ctx = (attn_ctx *)stale;
    CHECK_STATUS(attn_ctx_new(&(attn_ctx_config){.num_threads = (size_t)1 << 40}, &ctx),
                 ATTN_ERR_INVALID);
    CHECK(ctx == NULL);
    attn_rng *rng = (attn_rng *)stale;
    CHECK_STATUS(attn_rng_new(NULL, 1, &rng), ATTN_OK);
    attn_rng_free(rng);
}

/* The scale is a double, 0 is the default and every other
 * finite value is used or refused by name. 1e-50 (0 in float32) gives
 * uniform attention, as PyTorch's scores * 1e-50 does; 3.5e38 (beyond
 * float32) is refused naming it; subnormal doubles are scales too. */
static void test_scale_range(void) {
    enum { B = 1, T = 4, C = 4 };
    float x[B * T * C], y_default[B * T * C], y[B * T * C], y_uniform[B * T * C];
    fill(x, B * T * C, 2.0f);
    for (size_t k = 1; k < NUM_KINDS; k++) { /* every module that takes a scale */
        spec s = small_spec(all_kinds[k]);
        attn_module *m = build_ok(&s, 11);
        CHECK_STATUS(attn_module_set_training(m, false), ATTN_OK);
        CHECK_STATUS(attn_module_forward(m, x, B, T, y_default, NULL), ATTN_OK);
        attn_module_free(m);
        s.scale = 1e-30; /* a float32 scale small enough for uniform weights */
        m = build_ok(&s, 11);
        CHECK_STATUS(attn_module_set_training(m, false), ATTN_OK);
        CHECK_STATUS(attn_module_forward(m, x, B, T, y_uniform, NULL), ATTN_OK);
        attn_module_free(m);
        const double tiny[] = {1e-50, -1e-50, 1e-310, 4.9e-324};
        for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
            s.scale = tiny[i];
            m = build_ok(&s, 11);
            CHECK(m != NULL);
            if (!m) continue;
            CHECK_STATUS(attn_module_set_training(m, false), ATTN_OK);
            CHECK_STATUS(attn_module_forward(m, x, B, T, y, NULL), ATTN_OK);
            CHECK(memcmp(y, y_default, sizeof y) != 0); /* not silently the default */
            CHECK(memcmp(y, y_uniform, sizeof y) == 0); /* uniform, like 1e-30 */
            attn_module_free(m);
        }
        const double huge[] = {3.5e38, -3.5e38, 0x1.ffffffp127, 1e300};
        for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
            s.scale = huge[i];
            attn_module *none = NULL;
            attn_rng_manual_seed(g_rng, 11);
            CHECK_STATUS(build(g_ctx, g_rng, &s, &none), ATTN_ERR_INVALID);
            CHECK_MESSAGE(g_ctx, "beyond float32's range");
            CHECK(none == NULL);
        }
        s.scale = 3.5e38;
        attn_module *none = NULL;
        attn_rng_manual_seed(g_rng, 11);
        EXPECT_FAIL2(build(g_ctx, g_rng, &s, &none), ATTN_ERR_INVALID, "scale (3.5e+38)",
                     kind_class(all_kinds[k]));
        s.scale = (double)FLT_MAX; /* the largest float32 is a scale */
        m = build_ok(&s, 11);
        CHECK(m != NULL);
        attn_module_free(m);
    }
}

/* The same rule for attn_sdpa_forward's config: 1e-50 is uniform attention
 * (not the default), 3.5e38 is refused by name. */
static void test_sdpa_scale_range(void) {
    enum { T = 3, D = 2 };
    float q[T * D] = {1, 2, -3, 0.5f, 2, -1}, k[T * D] = {0.3f, -2, 1, 1, 4, 0};
    float v[T * D] = {1, 0, 0, 1, 2, 2}, out[T * D], out_default[T * D];
    attn_sdpa_config cfg = {.batch = 1, .heads = 1, .q_tokens = T, .kv_tokens = T, .head_dim = D};
    CHECK_STATUS(attn_sdpa_forward(g_ctx, &cfg, q, k, v, out_default, NULL, NULL, NULL), ATTN_OK);
    cfg.scale = 1e-50;
    CHECK_STATUS(attn_sdpa_forward(g_ctx, &cfg, q, k, v, out, NULL, NULL, NULL), ATTN_OK);
    CHECK(memcmp(out, out_default, sizeof out) != 0);
    for (int i = 0; i < T; i++) CHECK_NEAR(out[i * D], 1.0f, 1e-6); /* the mean of v */
    cfg.scale = 3.5e38;
    EXPECT_FAIL2(attn_sdpa_forward(g_ctx, &cfg, q, k, v, out, NULL, NULL, NULL), ATTN_ERR_INVALID,
                 "scale (3.5e+38)", "beyond float32's range");
}

/* Messages quote caller text with its control characters
 * escaped (a path with a newline and an ANSI escape, a parameter name). */
static void test_messages_escaped(void) {
    attn_npy npy;
    CHECK_STATUS(attn_npy_read(g_ctx, "no\nsuch\x1b[31mfile\x9b.npy", &npy), ATTN_ERR_IO);
    const char *msg = attn_ctx_last_error(g_ctx);
    CHECK(strchr(msg, '\n') == NULL && strchr(msg, '\x1b') == NULL && strchr(msg, '\x9b') == NULL);
    CHECK_MESSAGE(g_ctx, "no\\nsuch\\x1b[31mfile\\x9b.npy");
    spec s = small_spec(ATTN_MODULE_MHA);
    attn_module *m = build_ok(&s, 1);
    attn_param p;
    CHECK_STATUS(attn_module_param(m, "W_\tquery\r", &p), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(g_ctx, "'W_\\tquery\\r'");
    /* Valid UTF-8 passes as it is. */
    CHECK_STATUS(attn_module_param(m, "W_qu\xc3\xa9ry", &p), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(g_ctx, "'W_qu\xc3\xa9ry'");
    attn_module_free(m);
}

/* A message past the ctx's capacity leaves out its middle: a path of 700
 * bytes keeps its start and its end, and the reason after it. */
static void test_long_message_keeps_its_end(void) {
    char path[800] = "/no_such_dir_";
    size_t at = strlen(path);
    for (; at < 690; at++) path[at] = at % 50 == 0 ? '/' : (char)('a' + at % 26);
    strcpy(path + at, "/the_end.npy");
    attn_npy npy;
    CHECK_STATUS(attn_npy_read(g_ctx, path, &npy), ATTN_ERR_IO);
    const char *msg = attn_ctx_last_error(g_ctx);
    CHECK(strlen(msg) < 512 && strlen(msg) > 400);
    CHECK(strncmp(msg, path, 100) == 0); /* the start, as it is */
    CHECK_MESSAGE(g_ctx, " ... ");
    CHECK_MESSAGE(g_ctx, "/the_end.npy");
    CHECK_MESSAGE(g_ctx, "No such file or directory");
    /* escapes are whole on both sides of the cut */
    for (size_t i = 20; i < at; i += 7) path[i] = '\x1b';
    CHECK_STATUS(attn_npy_read(g_ctx, path, &npy), ATTN_ERR_IO);
    msg = attn_ctx_last_error(g_ctx);
    CHECK(strlen(msg) < 512 && strchr(msg, '\x1b') == NULL);
    CHECK_MESSAGE(g_ctx, " ... ");
    CHECK_MESSAGE(g_ctx, "No such file or directory");
    /* the message is the escaped text's start and end, cut between escapes */
    char escaped[4 * sizeof path], *e = escaped;
    for (const char *c = path; *c; c++)
        e += *c == '\x1b' ? sprintf(e, "\\x1b") : sprintf(e, "%c", *c);
    const char *cut = strstr(msg, " ... ");
    CHECK(cut != NULL);
    if (!cut) return;
    size_t head = (size_t)(cut - msg), tail = strlen(cut + 5);
    CHECK(head > 200 && strncmp(msg, escaped, head) == 0);
    const char *end = strstr(cut + 5, ": ");
    size_t tail_path = end ? (size_t)(end - (cut + 5)) : 0;
    CHECK(tail > 200 && tail_path > 0 && strncmp(cut + 5, e - tail_path, tail_path) == 0);
    CHECK(head < 3 || memchr(msg + head - 3, '\\', 3) == NULL); /* no escape cut short */
    const char *from = e - tail_path; /* where the end starts in the escaped text */
    CHECK(from - escaped < 3 || memchr(from - 3, '\\', 3) == NULL);
}

typedef struct shape_trace {
    int calls, with_data;
} shape_trace;

static void count_trace(void *user, const char *module, const char *name, size_t ndim,
                        const size_t *shape, const float *data) {
    (void)module, (void)name, (void)ndim, (void)shape;
    shape_trace *t = user;
    t->calls++;
    t->with_data += data != NULL;
}

/* trace_shapes_only reports every tensor with data NULL. */
static void test_trace_shapes_only(void) {
    for (int shapes_only = 0; shapes_only < 2; shapes_only++) {
        shape_trace t = {0};
        attn_ctx *c;
        attn_ctx_config cfg = {.trace = count_trace, .trace_user = &t,
                               .trace_shapes_only = shapes_only};
        CHECK_STATUS(attn_ctx_new(&cfg, &c), ATTN_OK);
        attn_rng *rng;
        CHECK_STATUS(attn_rng_new(c, 3, &rng), ATTN_OK);
        for (size_t k = 0; k < NUM_KINDS; k++) {
            spec s = small_spec(all_kinds[k]);
            s.dropout = 0.5;
            attn_module *m = NULL;
            CHECK_STATUS(build(c, rng, &s, &m), ATTN_OK);
            float x[2 * 4 * 4], y[2 * 4 * 4];
            fill(x, sizeof x / sizeof x[0], 0.5f);
            CHECK_STATUS(attn_module_forward(m, x, 2, 4, y, rng), ATTN_OK);
            attn_module_free(m);
        }
        CHECK(t.calls > 20);
        if (shapes_only) CHECK(t.with_data == 0);
        else CHECK(t.with_data > 0);
        attn_rng_free(rng);
        attn_ctx_free(c);
    }
}

static void test_constructor_nulls(void) {
    attn_simple *simple = NULL;
    attn_sa_v1 *sa1 = NULL;
    attn_sa_v2 *sa2 = NULL;
    attn_causal *causal = NULL;
    attn_mha_wrapper *wrapper = NULL;
    attn_mha *mha = NULL;
    attn_gpt2 *gpt2 = NULL;
    attn_simple_config simple_cfg = {.d_in = 4};
    attn_sa_v1_config sa1_cfg = {.d_in = 4, .d_out = 2};
    attn_sa_v2_config sa2_cfg = {.d_in = 4, .d_out = 2};
    attn_causal_config causal_cfg = {.d_in = 4, .d_out = 2, .context_length = 4};
    attn_mha_wrapper_config wrapper_cfg = {.d_in = 4, .d_out = 2, .context_length = 4,
                                           .num_heads = 2};
    attn_mha_config mha_cfg = {.d_in = 4, .d_out = 4, .context_length = 4, .num_heads = 2};
    attn_gpt2_config gpt2_cfg = {.n_embd = 4, .n_head = 2, .block_size = 4};

    /* NULL ctx: ATTN_ERR_NULL, no crash. */
    CHECK_STATUS(attn_simple_new(NULL, &simple_cfg, &simple), ATTN_ERR_NULL);
    CHECK_STATUS(attn_sa_v1_new(NULL, &sa1_cfg, g_rng, &sa1), ATTN_ERR_NULL);
    CHECK_STATUS(attn_sa_v2_new(NULL, &sa2_cfg, g_rng, &sa2), ATTN_ERR_NULL);
    CHECK_STATUS(attn_causal_new(NULL, &causal_cfg, g_rng, &causal), ATTN_ERR_NULL);
    CHECK_STATUS(attn_mha_wrapper_new(NULL, &wrapper_cfg, g_rng, &wrapper), ATTN_ERR_NULL);
    CHECK_STATUS(attn_mha_new(NULL, &mha_cfg, g_rng, &mha), ATTN_ERR_NULL);
    CHECK_STATUS(attn_gpt2_new(NULL, &gpt2_cfg, g_rng, &gpt2), ATTN_ERR_NULL);
    CHECK(!simple && !sa1 && !sa2 && !causal && !wrapper && !mha && !gpt2);

    /* NULL cfg. */
    EXPECT_FAIL(attn_simple_new(g_ctx, NULL, &simple), ATTN_ERR_NULL, "cfg is NULL");
    EXPECT_FAIL(attn_sa_v1_new(g_ctx, NULL, g_rng, &sa1), ATTN_ERR_NULL, "cfg is NULL");
    EXPECT_FAIL(attn_sa_v2_new(g_ctx, NULL, g_rng, &sa2), ATTN_ERR_NULL, "cfg is NULL");
    EXPECT_FAIL(attn_causal_new(g_ctx, NULL, g_rng, &causal), ATTN_ERR_NULL, "cfg is NULL");
    EXPECT_FAIL(attn_mha_wrapper_new(g_ctx, NULL, g_rng, &wrapper), ATTN_ERR_NULL, "cfg is NULL");
    EXPECT_FAIL(attn_mha_new(g_ctx, NULL, g_rng, &mha), ATTN_ERR_NULL, "cfg is NULL");
    EXPECT_FAIL(attn_gpt2_new(g_ctx, NULL, g_rng, &gpt2), ATTN_ERR_NULL, "cfg is NULL");

    /* Parameter counts past size_t: the parameter named with its size; and
     * a count whose data and gradients together pass size_t bytes is an
     * overflow, not a failed allocation. */
    EXPECT_FAIL(attn_sa_v1_new(g_ctx, &(attn_sa_v1_config){.d_in = (size_t)1 << 32,
                                                           .d_out = (size_t)1 << 31},
                               g_rng, &sa1),
                ATTN_ERR_OVERFLOW,
                "W_key (9223372036854775808 scalars) after 9223372036854775808 earlier scalars "
                "overflows size_t");
    attn_mla *mla_big = NULL;
    EXPECT_FAIL(attn_mla_new(g_ctx, &(attn_mla_config){.d_in = 4, .d_out = 8, .num_heads = 2,
                                                        .latent_dim = (SIZE_MAX / 4) / 8 + 1},
                             g_rng, &mla_big),
                ATTN_ERR_OVERFLOW, "parameters and as many gradients overflow size_t bytes");
    CHECK(sa1 == NULL && mla_big == NULL);

    /* NULL init_rng. */
    EXPECT_FAIL(attn_sa_v1_new(g_ctx, &sa1_cfg, NULL, &sa1), ATTN_ERR_NULL, "init_rng is NULL");
    EXPECT_FAIL(attn_sa_v2_new(g_ctx, &sa2_cfg, NULL, &sa2), ATTN_ERR_NULL, "init_rng is NULL");
    EXPECT_FAIL(attn_causal_new(g_ctx, &causal_cfg, NULL, &causal), ATTN_ERR_NULL,
                "init_rng is NULL");
    EXPECT_FAIL(attn_mha_wrapper_new(g_ctx, &wrapper_cfg, NULL, &wrapper), ATTN_ERR_NULL,
                "init_rng is NULL");
    EXPECT_FAIL(attn_mha_new(g_ctx, &mha_cfg, NULL, &mha), ATTN_ERR_NULL, "init_rng is NULL");
    EXPECT_FAIL(attn_gpt2_new(g_ctx, &gpt2_cfg, NULL, &gpt2), ATTN_ERR_NULL, "init_rng is NULL");

    /* NULL out. */
    EXPECT_FAIL(attn_simple_new(g_ctx, &simple_cfg, NULL), ATTN_ERR_NULL, "out is NULL");
    EXPECT_FAIL(attn_sa_v1_new(g_ctx, &sa1_cfg, g_rng, NULL), ATTN_ERR_NULL, "out is NULL");
    EXPECT_FAIL(attn_sa_v2_new(g_ctx, &sa2_cfg, g_rng, NULL), ATTN_ERR_NULL, "out is NULL");
    EXPECT_FAIL(attn_causal_new(g_ctx, &causal_cfg, g_rng, NULL), ATTN_ERR_NULL, "out is NULL");
    EXPECT_FAIL(attn_mha_wrapper_new(g_ctx, &wrapper_cfg, g_rng, NULL), ATTN_ERR_NULL,
                "out is NULL");
    EXPECT_FAIL(attn_mha_new(g_ctx, &mha_cfg, g_rng, NULL), ATTN_ERR_NULL, "out is NULL");
    EXPECT_FAIL(attn_gpt2_new(g_ctx, &gpt2_cfg, g_rng, NULL), ATTN_ERR_NULL, "out is NULL");

    /* The same calls with every argument valid succeed and clear the message. */
    attn_simple_new(g_ctx, NULL, &simple);
    CHECK_STATUS(attn_simple_new(g_ctx, &simple_cfg, &simple), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_sa_v1_new(g_ctx, NULL, g_rng, &sa1);
    CHECK_STATUS(attn_sa_v1_new(g_ctx, &sa1_cfg, g_rng, &sa1), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_sa_v2_new(g_ctx, NULL, g_rng, &sa2);
    CHECK_STATUS(attn_sa_v2_new(g_ctx, &sa2_cfg, g_rng, &sa2), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_causal_new(g_ctx, NULL, g_rng, &causal);
    CHECK_STATUS(attn_causal_new(g_ctx, &causal_cfg, g_rng, &causal), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_mha_wrapper_new(g_ctx, NULL, g_rng, &wrapper);
    CHECK_STATUS(attn_mha_wrapper_new(g_ctx, &wrapper_cfg, g_rng, &wrapper), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_mha_new(g_ctx, NULL, g_rng, &mha);
    CHECK_STATUS(attn_mha_new(g_ctx, &mha_cfg, g_rng, &mha), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_gpt2_new(g_ctx, NULL, g_rng, &gpt2);
    CHECK_STATUS(attn_gpt2_new(g_ctx, &gpt2_cfg, g_rng, &gpt2), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_simple_free(simple);
    attn_sa_v1_free(sa1);
    attn_sa_v2_free(sa2);
    attn_causal_free(causal);
    attn_mha_wrapper_free(wrapper);
    attn_mha_free(mha);
    attn_gpt2_free(gpt2);

    /* free(NULL) and the module views of NULL. */
    attn_simple_free(NULL);
    attn_sa_v1_free(NULL);
    attn_sa_v2_free(NULL);
    attn_causal_free(NULL);
    attn_mha_wrapper_free(NULL);
    attn_mha_free(NULL);
    attn_gpt2_free(NULL);
    attn_module_free(NULL);
    CHECK(attn_simple_module(NULL) == NULL);
    CHECK(attn_sa_v1_module(NULL) == NULL);
    CHECK(attn_sa_v2_module(NULL) == NULL);
    CHECK(attn_causal_module(NULL) == NULL);
    CHECK(attn_mha_wrapper_module(NULL) == NULL);
    CHECK(attn_mha_module(NULL) == NULL);
    CHECK(attn_gpt2_module(NULL) == NULL);
}

/* Builds s and expects failure `want` with fragments in the message, and
 * *out left NULL. */
static void expect_build_fail(const spec *s, attn_status want, const char *frag1,
                              const char *frag2, int line) {
    attn_module *m = (attn_module *)&m; /* garbage */
    attn_status st = build(g_ctx, g_rng, s, &m);
    const char *msg = attn_ctx_last_error(g_ctx);
    if (st == want) {
        check_passed++;
    } else {
        check_failed++;
        fprintf(stderr, "%s:%d: building %s returned %s, want %s (message \"%s\")\n", __FILE__,
                line, kind_class(s->kind), attn_status_name(st), attn_status_name(want), msg);
    }
    const char *frags[3] = {kind_class(s->kind), frag1, frag2};
    for (int i = 0; i < 3; i++) {
        if (!frags[i]) continue;
        if (strstr(msg, frags[i])) {
            check_passed++;
        } else {
            check_failed++;
            fprintf(stderr, "%s:%d: building %s: message \"%s\" lacks \"%s\"\n", __FILE__, line,
                    kind_class(s->kind), msg, frags[i]);
        }
    }
    if (m == NULL) {
        check_passed++;
    } else {
        check_failed++;
        fprintf(stderr, "%s:%d: building %s failed but left a module\n", __FILE__, line,
                kind_class(s->kind));
        if (st == ATTN_OK) attn_module_free(m);
    }
}
#define EXPECT_BUILD_FAIL(s, want, f1, f2) expect_build_fail((s), (want), (f1), (f2), __LINE__)

static void test_constructor_values(void) {
    for (size_t i = 0; i < NUM_KINDS; i++) {
        attn_module_kind kind = all_kinds[i];
        spec s = small_spec(kind);

        s.d_in = 0;
        EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID, kind == ATTN_MODULE_GPT2 ? "n_embd" : "d_in",
                          "must be positive, got 0");
        s = small_spec(kind);

        if (kind != ATTN_MODULE_SIMPLE && kind != ATTN_MODULE_GPT2) {
            s.d_out = 0;
            EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID, "d_out must be positive, got 0", NULL);
            s = small_spec(kind);
        }
        if (kind_has_context(kind)) {
            s.context = 0;
            EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID,
                              kind == ATTN_MODULE_GPT2 ? "block_size" : "context_length",
                              "must be positive, got 0");
            s = small_spec(kind);

            double bad_dropout[] = {1.5, -0.5, 1.0000001, -1e-12, NAN, INFINITY, -INFINITY};
            /* quoted as given: 1.0000001 is not "1", which would be in range */
            const char *bad_text[] = {"dropout (1.5)", "dropout (-0.5)", "dropout (1.0000001)",
                                      "dropout (-1e-12)", "dropout (nan)", "dropout (inf)",
                                      "dropout (-inf)"};
            for (size_t j = 0; j < sizeof bad_dropout / sizeof bad_dropout[0]; j++) {
                s.dropout = bad_dropout[j];
                EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID, bad_text[j], "must be in [0, 1]");
            }
            s = small_spec(kind);
        }
        if (kind != ATTN_MODULE_SIMPLE) {
            float bad_scale[] = {INFINITY, -INFINITY, NAN};
            const char *scale_text[] = {"scale (inf)", "scale (-inf)", "scale (nan)"};
            for (size_t j = 0; j < 3; j++) {
                s.scale = bad_scale[j];
                EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID, scale_text[j], "must be finite");
            }
            s = small_spec(kind);
        }
        if (kind == ATTN_MODULE_CAUSAL || kind == ATTN_MODULE_MHA_WRAPPER ||
            kind == ATTN_MODULE_MHA) {
            s.mask = (attn_mask_method)3;
            EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID, "unknown mask method 3", NULL);
            s.mask = (attn_mask_method)-7;
            EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID, "unknown mask method -7", NULL);
            s = small_spec(kind);
        }
        if (kind == ATTN_MODULE_MHA_WRAPPER || kind == ATTN_MODULE_MHA) {
            s.heads = 0;
            EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID, "num_heads must be positive, got 0", NULL);
            s = small_spec(kind);
        }
        if (kind == ATTN_MODULE_GPT2) {
            s.heads = 0;
            EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID, "n_head must be positive, got 0", NULL);
            s = small_spec(kind);
        }
    }

    /* Heads that do not divide the width. */
    spec s = {.kind = ATTN_MODULE_MHA, .d_in = 768, .d_out = 768, .context = 1024, .heads = 7};
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID, "d_out (768) must be divisible by num_heads (7)", NULL);
    s.d_out = 3;
    s.heads = 4; /* more heads than width */
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID, "d_out (3) must be divisible by num_heads (4)", NULL);
    s = (spec){.kind = ATTN_MODULE_GPT2, .d_in = 768, .context = 1024, .heads = 7};
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID, "n_embd (768) must be divisible by n_head (7)", NULL);
    s.d_in = 2;
    s.heads = 3;
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_INVALID, "n_embd (2) must be divisible by n_head (3)", NULL);
    /* The wrapper's d_out is per head: any head count works. */
    s = (spec){.kind = ATTN_MODULE_MHA_WRAPPER, .d_in = 4, .d_out = 3, .context = 4, .heads = 7};
    attn_module *m = build_ok(&s, 1);
    CHECK(attn_module_d_out(m) == 21);
    attn_module_free(m);

    /* Boundary values that are valid: dropout exactly 0 and 1, a huge
     * context (no mask is materialised), a negative or tiny scale. */
    for (size_t i = 0; i < NUM_KINDS; i++) {
        if (!kind_has_context(all_kinds[i])) continue;
        s = small_spec(all_kinds[i]);
        s.dropout = 1.0;
        attn_module_free(build_ok(&s, 1));
        s.dropout = 0.0;
        s.context = SZ_MAX;
        attn_module_free(build_ok(&s, 1));
        s.context = 4;
        s.scale = -1e-30f;
        attn_module_free(build_ok(&s, 1));
    }
}

/* Sizes whose parameter counts overflow: ATTN_ERR_OVERFLOW up front. */
static void test_constructor_overflow(void) {
    spec s = {.kind = ATTN_MODULE_SA_V1, .d_in = POW2(33), .d_out = POW2(33)};
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_OVERFLOW, "8589934592", "overflows");
    s.kind = ATTN_MODULE_SA_V2;
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_OVERFLOW, "8589934592", "overflows");
    s = (spec){.kind = ATTN_MODULE_CAUSAL, .d_in = POW2(33), .d_out = POW2(33), .context = 4};
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_OVERFLOW, "8589934592", "overflows");
    s.kind = ATTN_MODULE_MHA;
    s.heads = 1;
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_OVERFLOW, "8589934592", "overflows");
    s = (spec){.kind = ATTN_MODULE_SA_V1, .d_in = SZ_MAX, .d_out = 2};
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_OVERFLOW, "18446744073709551615", "overflows");
    s = (spec){.kind = ATTN_MODULE_MHA_WRAPPER, .d_in = 4, .d_out = SZ_MAX / 2, .context = 4,
               .heads = 3};
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_OVERFLOW, "num_heads (3)", "d_out (9223372036854775807)");
    s = (spec){.kind = ATTN_MODULE_MHA_WRAPPER, .d_in = 4, .d_out = 2, .context = 4,
               .heads = SZ_MAX};
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_OVERFLOW, "num_heads (18446744073709551615)", NULL);
    s = (spec){.kind = ATTN_MODULE_GPT2, .d_in = SZ_MAX - 15, .context = 4, .heads = 1};
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_OVERFLOW, "18446744073709551600", NULL);
    s = (spec){.kind = ATTN_MODULE_GPT2, .d_in = POW2(33), .context = 4, .heads = 1};
    EXPECT_BUILD_FAIL(&s, ATTN_ERR_OVERFLOW, "8589934592", "overflows");
}

/* Parameter counts that fit size_t but not any machine: NO_MEMORY (or
 * OVERFLOW), never a crash; run in a child in case the allocator aborts. */
static attn_status hostile_build(const hostile_args *a) {
    attn_module *m = NULL;
    attn_status st = build(g_ctx, g_rng, (const spec *)a->cfg, &m);
    attn_module_free(m);
    return st;
}

static void test_constructor_no_memory(void) {
    /* 3 x 2^46 floats: 768 TiB, more than any address space. */
    spec s = {.kind = ATTN_MODULE_SA_V1, .d_in = POW2(23), .d_out = POW2(23)};
    hostile_args a = {.cfg = &s};
    EXPECT_ISOLATED("SelfAttention_v1(d_in=2^23, d_out=2^23)", hostile_build, &a, 20,
                    ATTN_ERR_NO_MEMORY, ATTN_ERR_OVERFLOW, "SelfAttention_v1");
    spec s2 = {.kind = ATTN_MODULE_MHA, .d_in = POW2(23), .d_out = POW2(23), .context = 8,
               .heads = 8};
    a.cfg = &s2;
    EXPECT_ISOLATED("MultiHeadAttention(d_in=d_out=2^23)", hostile_build, &a, 20,
                    ATTN_ERR_NO_MEMORY, ATTN_ERR_OVERFLOW, "MultiHeadAttention");
    spec s3 = {.kind = ATTN_MODULE_GPT2, .d_in = POW2(23), .context = 8, .heads = 8};
    a.cfg = &s3;
    EXPECT_ISOLATED("CausalSelfAttention(n_embd=2^23)", hostile_build, &a, 20,
                    ATTN_ERR_NO_MEMORY, ATTN_ERR_OVERFLOW, "CausalSelfAttention");

    /* 2^40 wrapper heads of d_in 2^30: 3 x 2^70 parameters overflow size_t.
     * That is knowable before declaring a single head; a constructor that
     * declares head after head grinds through memory instead. */
    spec s4 = {.kind = ATTN_MODULE_MHA_WRAPPER, .d_in = POW2(30), .d_out = 1, .context = 4,
               .heads = POW2(40)};
    a.cfg = &s4;
    EXPECT_ISOLATED("MultiHeadAttentionWrapper(num_heads=2^40, d_in=2^30)", hostile_build, &a, 2,
                    ATTN_ERR_OVERFLOW, ATTN_ERR_OVERFLOW, "overflow");
    /* 2^40 heads of 1 x 1: 3 x 2^40 parameters fit size_t (12 TiB), but no
     * machine holds them or their 3 x 2^40 parameter records: a prompt
     * NO_MEMORY (or OVERFLOW), not a loop through 2^40 heads. */
    spec s5 = {.kind = ATTN_MODULE_MHA_WRAPPER, .d_in = 1, .d_out = 1, .context = 4,
               .heads = POW2(40)};
    a.cfg = &s5;
    EXPECT_ISOLATED("MultiHeadAttentionWrapper(num_heads=2^40, d_in=d_out=1)", hostile_build, &a,
                    2, ATTN_ERR_NO_MEMORY, ATTN_ERR_OVERFLOW, "MultiHeadAttentionWrapper");
}

/* ---- the generic view and parameters -------------------------------------- */

static void test_module_nulls(void) {
    float x[16] = {0}, y[16];
    attn_param p;
    (void)attn_module_get_kind(NULL); /* no crash */
    CHECK(attn_module_class_name(NULL) != NULL);
    CHECK(attn_module_d_in(NULL) == 0);
    CHECK(attn_module_d_out(NULL) == 0);
    CHECK(attn_module_param_count(NULL) == 0);
    CHECK(attn_module_num_scalars(NULL) == 0);
    CHECK(!attn_module_training(NULL));
    CHECK_STATUS(attn_module_param_at(NULL, 0, &p), ATTN_ERR_NULL);
    CHECK_STATUS(attn_module_param(NULL, "W_query.weight", &p), ATTN_ERR_NULL);
    CHECK_STATUS(attn_module_set_training(NULL, true), ATTN_ERR_NULL);
    CHECK_STATUS(attn_module_forward(NULL, x, 1, 2, y, g_rng), ATTN_ERR_NULL);
    CHECK_STATUS(attn_simple_forward(NULL, x, 1, 2, y), ATTN_ERR_NULL);
    CHECK_STATUS(attn_simple_forward_query(NULL, x, 2, 0, y, y, y), ATTN_ERR_NULL);
    CHECK_STATUS(attn_sa_v1_forward(NULL, x, 1, 2, y), ATTN_ERR_NULL);
    CHECK_STATUS(attn_sa_v2_forward(NULL, x, 1, 2, y), ATTN_ERR_NULL);
    CHECK_STATUS(attn_causal_forward(NULL, x, 1, 2, y, g_rng), ATTN_ERR_NULL);
    CHECK_STATUS(attn_mha_wrapper_forward(NULL, x, 1, 2, y, g_rng), ATTN_ERR_NULL);
    CHECK_STATUS(attn_mha_forward(NULL, x, 1, 2, y, g_rng), ATTN_ERR_NULL);
    CHECK_STATUS(attn_gpt2_forward(NULL, x, 1, 2, y, g_rng), ATTN_ERR_NULL);
}

static void test_params_lookup(void) {
    spec s = {.kind = ATTN_MODULE_MHA, .d_in = 4, .d_out = 4, .context = 4, .heads = 2,
              .bias = true};
    attn_module *m = build_ok(&s, 3);
    if (!m) return;
    attn_param p;
    CHECK(attn_module_param_count(m) == 8);
    EXPECT_FAIL2(attn_module_param_at(m, 8, &p), ATTN_ERR_NOT_FOUND, "index 8",
                 "has 8 parameters");
    EXPECT_FAIL(attn_module_param_at(m, SZ_MAX, &p), ATTN_ERR_NOT_FOUND,
                "index 18446744073709551615");
    EXPECT_FAIL(attn_module_param_at(m, 0, NULL), ATTN_ERR_NULL, "out is NULL");
    CHECK_STATUS(attn_module_param_at(m, 7, &p), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    CHECK(strcmp(p.name, "out_proj.bias") == 0 && p.ndim == 1 && p.numel == 4);

    EXPECT_FAIL2(attn_module_param(m, "W_bogus.weight", &p), ATTN_ERR_NOT_FOUND,
                 "'W_bogus.weight'", "MultiHeadAttention");
    EXPECT_FAIL(attn_module_param(m, "", &p), ATTN_ERR_NOT_FOUND, "''");
    EXPECT_FAIL(attn_module_param(m, "w_query.weight", &p), ATTN_ERR_NOT_FOUND,
                "'w_query.weight'");
    EXPECT_FAIL(attn_module_param(m, "W_query", &p), ATTN_ERR_NOT_FOUND, "'W_query'");
    EXPECT_FAIL(attn_module_param(m, "W_query.weight ", &p), ATTN_ERR_NOT_FOUND,
                "'W_query.weight '");
    EXPECT_FAIL(attn_module_param(m, NULL, &p), ATTN_ERR_NULL, "name is NULL");
    EXPECT_FAIL(attn_module_param(m, "W_query.weight", NULL), ATTN_ERR_NULL, "out is NULL");
    CHECK_STATUS(attn_module_param(m, "W_query.bias", &p), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    CHECK(p.ndim == 1 && p.shape[0] == 4 && p.data != NULL);

    /* A name far longer than the message buffer: a truncated message, no
     * overflow. */
    char longname[2000];
    memset(longname, 'q', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    CHECK_STATUS(attn_module_param(m, longname, &p), ATTN_ERR_NOT_FOUND);
    CHECK(strlen(attn_ctx_last_error(g_ctx)) > 0 && strlen(attn_ctx_last_error(g_ctx)) < 2000);

    /* set_training clears a previous message. */
    attn_module_param(m, "nope", &p);
    CHECK_STATUS(attn_module_set_training(m, false), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    CHECK(!attn_module_training(m));
    attn_module_free(m);

    /* The wrapper: per-head names. */
    s = (spec){.kind = ATTN_MODULE_MHA_WRAPPER, .d_in = 4, .d_out = 2, .context = 4, .heads = 2};
    m = build_ok(&s, 3);
    if (!m) return;
    CHECK_STATUS(attn_module_param(m, "heads.1.W_value.weight", &p), ATTN_OK);
    EXPECT_FAIL(attn_module_param(m, "heads.2.W_value.weight", &p), ATTN_ERR_NOT_FOUND,
                "'heads.2.W_value.weight'");
    EXPECT_FAIL(attn_module_param_at(m, 6, &p), ATTN_ERR_NOT_FOUND, "index 6");
    attn_module_free(m);
}

/* ---- forward ------------------------------------------------------------- */

static void test_forward_errors(void) {
    float x[64], y[64];
    fill(x, 64, 0.2f);
    for (size_t i = 0; i < NUM_KINDS; i++) {
        attn_module_kind kind = all_kinds[i];
        const char *cls = kind_class(kind);
        spec s = small_spec(kind);
        attn_module *m = build_ok(&s, 11);
        if (!m) continue;
        attn_module_set_training(m, false);

        EXPECT_FAIL2(attn_module_forward(m, NULL, 1, 3, y, NULL), ATTN_ERR_NULL, cls, "x is NULL");
        EXPECT_FAIL2(attn_module_forward(m, x, 1, 3, NULL, NULL), ATTN_ERR_NULL, cls, "y is NULL");
        EXPECT_FAIL2(attn_module_forward(m, x, 0, 3, y, NULL), ATTN_ERR_SHAPE, "batch (0)",
                     "tokens (3)");
        EXPECT_FAIL2(attn_module_forward(m, x, 2, 0, y, NULL), ATTN_ERR_SHAPE, "batch (2)",
                     "tokens (0)");
        EXPECT_FAIL(attn_module_forward(m, x, 0, 0, y, NULL), ATTN_ERR_SHAPE, "must be positive");
        CHECK_STATUS(attn_module_forward(m, x, 2, 3, y, NULL), ATTN_OK);
        CHECK_CLEARED(g_ctx);

        /* batch x tokens x width overflowing size_t, with the values. */
        EXPECT_FAIL2(attn_module_forward(m, x, SZ_MAX / 2, 3, y, NULL), ATTN_ERR_OVERFLOW,
                     "batch (9223372036854775807)", "tokens (3)");
        EXPECT_FAIL2(attn_module_forward(m, x, SZ_MAX, 1, y, NULL), ATTN_ERR_OVERFLOW,
                     "batch (18446744073709551615)", "overflows");
        EXPECT_FAIL2(attn_module_forward(m, x, POW2(62), 4, y, NULL), ATTN_ERR_OVERFLOW,
                     "batch (4611686018427387904)", "tokens (4)");

        if (kind_has_context(kind)) {
            /* T > context_length: 5 tokens, context 4. */
            EXPECT_FAIL2(attn_module_forward(m, x, 1, 5, y, NULL), ATTN_ERR_SHAPE,
                         "sequence length (5)", "exceeds context_length (4)");
            EXPECT_FAIL(attn_module_forward(m, x, 1, SZ_MAX, y, NULL), ATTN_ERR_SHAPE,
                        "sequence length (18446744073709551615)");
            CHECK_STATUS(attn_module_forward(m, x, 1, 4, y, NULL), ATTN_OK);
            CHECK_CLEARED(g_ctx);

            /* Training with dropout > 0 and no rng. */
            attn_module_free(m);
            s.dropout = 0.5;
            m = build_ok(&s, 11);
            if (!m) continue;
            CHECK(attn_module_training(m)); /* modules start in training mode */
            EXPECT_FAIL2(attn_module_forward(m, x, 1, 3, y, NULL), ATTN_ERR_NULL, cls,
                         "needs an rng");
            CHECK_STATUS(attn_module_forward(m, x, 1, 3, y, g_rng), ATTN_OK);
            CHECK_CLEARED(g_ctx);
            CHECK(all_finite(y, 3 * attn_module_d_out(m)));
            /* eval mode: no rng needed even with dropout > 0 */
            attn_module_set_training(m, false);
            CHECK_STATUS(attn_module_forward(m, x, 1, 3, y, NULL), ATTN_OK);
        } else {
            /* Unlimited context: a long sequence is fine (T x T scores). */
            float *xl = calloc(300 * 4, sizeof *xl), *yl = calloc(300 * 4, sizeof *yl);
            if (xl && yl) {
                fill(xl, 300 * 4, 0.1f);
                CHECK_STATUS(attn_module_forward(m, xl, 1, 300, yl, NULL), ATTN_OK);
                CHECK(all_finite(yl, 300 * attn_module_d_out(m)));
            }
            free(xl);
            free(yl);
        }
        attn_module_free(m);
    }

    /* The type-specific forwards check the same things. */
    attn_causal *causal = NULL;
    attn_causal_config ccfg = {.d_in = 4, .d_out = 2, .context_length = 6, .dropout = 0.25};
    CHECK_STATUS(attn_causal_new(g_ctx, &ccfg, g_rng, &causal), ATTN_OK);
    EXPECT_FAIL2(attn_causal_forward(causal, x, 1, 7, y, g_rng), ATTN_ERR_SHAPE,
                 "sequence length (7)", "exceeds context_length (6)");
    EXPECT_FAIL(attn_causal_forward(causal, x, 1, 6, y, NULL), ATTN_ERR_NULL, "needs an rng");
    CHECK_STATUS(attn_causal_forward(causal, x, 1, 6, y, g_rng), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_causal_free(causal);

    attn_mha_wrapper *wrapper = NULL;
    attn_mha_wrapper_config wcfg = {.d_in = 4, .d_out = 2, .context_length = 6, .num_heads = 2,
                                    .dropout = 0.25};
    CHECK_STATUS(attn_mha_wrapper_new(g_ctx, &wcfg, g_rng, &wrapper), ATTN_OK);
    EXPECT_FAIL2(attn_mha_wrapper_forward(wrapper, x, 1, 7, y, g_rng), ATTN_ERR_SHAPE,
                 "sequence length (7)", "exceeds context_length (6)");
    EXPECT_FAIL(attn_mha_wrapper_forward(wrapper, x, 1, 6, y, NULL), ATTN_ERR_NULL,
                "needs an rng");
    CHECK_STATUS(attn_mha_wrapper_forward(wrapper, x, 1, 6, y, g_rng), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_mha_wrapper_free(wrapper);

    attn_mha *mha = NULL;
    attn_mha_config mcfg = {.d_in = 4, .d_out = 4, .context_length = 6, .num_heads = 2,
                            .dropout = 0.25};
    CHECK_STATUS(attn_mha_new(g_ctx, &mcfg, g_rng, &mha), ATTN_OK);
    EXPECT_FAIL2(attn_mha_forward(mha, x, 1, 7, y, g_rng), ATTN_ERR_SHAPE, "sequence length (7)",
                 "exceeds context_length (6)");
    EXPECT_FAIL(attn_mha_forward(mha, x, 1, 6, y, NULL), ATTN_ERR_NULL, "needs an rng");
    EXPECT_FAIL(attn_mha_forward(mha, NULL, 1, 6, y, g_rng), ATTN_ERR_NULL, "x is NULL");
    CHECK_STATUS(attn_mha_forward(mha, x, 1, 6, y, g_rng), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_mha_free(mha);

    attn_gpt2 *gpt2 = NULL;
    attn_gpt2_config gcfg = {.n_embd = 4, .n_head = 2, .block_size = 6, .dropout = 0.25};
    CHECK_STATUS(attn_gpt2_new(g_ctx, &gcfg, g_rng, &gpt2), ATTN_OK);
    EXPECT_FAIL2(attn_gpt2_forward(gpt2, x, 1, 7, y, g_rng), ATTN_ERR_SHAPE,
                 "sequence length (7)", "exceeds context_length (6)");
    EXPECT_FAIL(attn_gpt2_forward(gpt2, x, 1, 6, y, NULL), ATTN_ERR_NULL, "needs an rng");
    CHECK_STATUS(attn_gpt2_forward(gpt2, x, 1, 6, y, g_rng), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_gpt2_free(gpt2);

    attn_simple *simple = NULL;
    CHECK_STATUS(attn_simple_new(g_ctx, &(attn_simple_config){.d_in = 4}, &simple), ATTN_OK);
    EXPECT_FAIL(attn_simple_forward(simple, x, 1, 3, NULL), ATTN_ERR_NULL, "y is NULL");
    EXPECT_FAIL(attn_simple_forward(simple, x, SZ_MAX / 4, 8, y), ATTN_ERR_OVERFLOW,
                "batch (4611686018427387903)");
    CHECK_STATUS(attn_simple_forward(simple, x, 1, 3, y), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_simple_free(simple);

    attn_sa_v1 *sa1 = NULL;
    CHECK_STATUS(attn_sa_v1_new(g_ctx, &(attn_sa_v1_config){.d_in = 4, .d_out = 2}, g_rng, &sa1),
                 ATTN_OK);
    EXPECT_FAIL(attn_sa_v1_forward(sa1, NULL, 1, 3, y), ATTN_ERR_NULL, "x is NULL");
    EXPECT_FAIL(attn_sa_v1_forward(sa1, x, 1, 0, y), ATTN_ERR_SHAPE, "tokens (0)");
    CHECK_STATUS(attn_sa_v1_forward(sa1, x, 1, 3, y), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_sa_v1_free(sa1);

    attn_sa_v2 *sa2 = NULL;
    CHECK_STATUS(attn_sa_v2_new(g_ctx, &(attn_sa_v2_config){.d_in = 4, .d_out = 2}, g_rng, &sa2),
                 ATTN_OK);
    EXPECT_FAIL(attn_sa_v2_forward(sa2, x, 0, 3, y), ATTN_ERR_SHAPE, "batch (0)");
    CHECK_STATUS(attn_sa_v2_forward(sa2, x, 1, 3, y), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_sa_v2_free(sa2);

    /* T x T overflowing with an unlimited context: tokens 2^32. */
    spec big = {.kind = ATTN_MODULE_CAUSAL, .d_in = 4, .d_out = 4, .context = SZ_MAX};
    attn_module *m = build_ok(&big, 1);
    if (m) {
        attn_module_set_training(m, false);
        EXPECT_FAIL2(attn_module_forward(m, x, 1, POW2(32), y, NULL), ATTN_ERR_OVERFLOW,
                     "tokens (4294967296)", "overflows");
        EXPECT_FAIL(attn_module_forward(m, x, 1, POW2(31), y, NULL), ATTN_ERR_OVERFLOW,
                    "tokens (2147483648)");
        attn_module_free(m);
    }
}

/* batch x tokens x width whose element count fits size_t but whose bytes do
 * not: no caller can hold such an x, so an error, never a kernel run. */
static attn_status hostile_forward(const hostile_args *a) {
    return attn_module_forward(a->m, hostile_in, a->n1, a->n2, hostile_out, NULL);
}

static void test_forward_byte_overflow(void) {
    for (size_t i = 0; i < NUM_KINDS; i++) {
        spec s = small_spec(all_kinds[i]);
        attn_module *m = build_ok(&s, 5);
        if (!m) continue;
        attn_module_set_training(m, false);
        char what[160];
        snprintf(what, sizeof what, "%s forward(batch=2^60, tokens=1, d_in=4)",
                 kind_class(all_kinds[i]));
        hostile_args a = {.m = m, .n1 = POW2(60), .n2 = 1};
        EXPECT_ISOLATED(what, hostile_forward, &a, 10, ATTN_ERR_OVERFLOW, ATTN_ERR_NO_MEMORY,
                        kind_class(all_kinds[i]));
        attn_module_free(m);
    }
}

/* ---- simplified attention's one-query steps ------------------------------ */

static attn_status hostile_query(const hostile_args *a) {
    return attn_simple_forward_query(a->simple, hostile_in, a->n1, 0, hostile_out, hostile_w,
                                     hostile_out + 128);
}

static void test_simple_query(void) {
    attn_simple *m = NULL;
    CHECK_STATUS(attn_simple_new(g_ctx, &(attn_simple_config){.d_in = 3}, &m), ATTN_OK);
    if (!m) return;
    float x[18], scores[6], weights[6], context[3];
    fill(x, 18, 0.4f);
    EXPECT_FAIL(attn_simple_forward_query(m, NULL, 6, 1, scores, weights, context), ATTN_ERR_NULL,
                "x is NULL");
    EXPECT_FAIL(attn_simple_forward_query(m, x, 6, 1, NULL, weights, context), ATTN_ERR_NULL,
                "scores is NULL");
    EXPECT_FAIL(attn_simple_forward_query(m, x, 6, 1, scores, NULL, context), ATTN_ERR_NULL,
                "weights is NULL");
    EXPECT_FAIL(attn_simple_forward_query(m, x, 6, 1, scores, weights, NULL), ATTN_ERR_NULL,
                "context is NULL");
    EXPECT_FAIL(attn_simple_forward_query(m, x, 0, 0, scores, weights, context), ATTN_ERR_SHAPE,
                "tokens must be positive");
    EXPECT_FAIL2(attn_simple_forward_query(m, x, 6, 6, scores, weights, context), ATTN_ERR_SHAPE,
                 "query_index (6)", "tokens (6)");
    EXPECT_FAIL2(attn_simple_forward_query(m, x, 6, SZ_MAX, scores, weights, context),
                 ATTN_ERR_SHAPE, "query_index (18446744073709551615)", "tokens (6)");
    EXPECT_FAIL2(attn_simple_forward_query(m, x, SZ_MAX / 2, 0, scores, weights, context),
                 ATTN_ERR_OVERFLOW, "tokens (9223372036854775807)", "d_in (3)");
    /* outputs over x or over one another: refused by name, nothing written */
    float before[18];
    memcpy(before, x, sizeof x);
    EXPECT_FAIL2(attn_simple_forward_query(m, x, 6, 1, x, weights, context), ATTN_ERR_INVALID,
                 "scores", "overlaps x");
    EXPECT_FAIL2(attn_simple_forward_query(m, x, 6, 1, scores, weights, weights + 4),
                 ATTN_ERR_INVALID, "context", "overlaps weights");
    CHECK(memcmp(before, x, sizeof x) == 0);
    CHECK_STATUS(attn_simple_forward_query(m, x, 6, 5, scores, weights, context), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    /* T = 1: the only weight is 1 and the context is the token itself. */
    CHECK_STATUS(attn_simple_forward_query(m, x, 1, 0, scores, weights, context), ATTN_OK);
    CHECK(weights[0] == 1.0f);
    CHECK_NEAR(context[0], x[0], 1e-7);
    CHECK_NEAR(context[2], x[2], 1e-7);
    attn_simple_free(m);

    /* tokens x d_in bytes overflowing: 2^62 tokens of width 1. */
    attn_simple *narrow = NULL;
    CHECK_STATUS(attn_simple_new(g_ctx, &(attn_simple_config){.d_in = 1}, &narrow), ATTN_OK);
    hostile_args a = {.simple = narrow, .n1 = POW2(62)};
    EXPECT_ISOLATED("attn_simple_forward_query(tokens=2^62, d_in=1)", hostile_query, &a, 5,
                    ATTN_ERR_OVERFLOW, ATTN_ERR_OVERFLOW, "4611686018427387904");
    attn_simple_free(narrow);
}

/* ---- presets ------------------------------------------------------------- */

static void test_presets(void) {
    attn_gpt2_preset p;
    CHECK(attn_gpt2_preset_count() == 4);
    CHECK_STATUS(attn_gpt2_preset_at(4, &p), ATTN_ERR_NOT_FOUND);
    CHECK_STATUS(attn_gpt2_preset_at(SZ_MAX, &p), ATTN_ERR_NOT_FOUND);
    CHECK_STATUS(attn_gpt2_preset_at(0, NULL), ATTN_ERR_NULL);

    EXPECT_FAIL2(attn_gpt2_preset_find(g_ctx, "gpt2-tiny", &p), ATTN_ERR_NOT_FOUND, "'gpt2-tiny'",
                 "gpt2-small, gpt2-medium, gpt2-large, gpt2-xl");
    EXPECT_FAIL(attn_gpt2_preset_find(g_ctx, "", &p), ATTN_ERR_NOT_FOUND, "''");
    EXPECT_FAIL(attn_gpt2_preset_find(g_ctx, "gpt2-", &p), ATTN_ERR_NOT_FOUND, "'gpt2-'");
    EXPECT_FAIL(attn_gpt2_preset_find(g_ctx, "gpt2-small ", &p), ATTN_ERR_NOT_FOUND,
                "'gpt2-small '");
    EXPECT_FAIL(attn_gpt2_preset_find(g_ctx, "all", &p), ATTN_ERR_NOT_FOUND, "'all'");
    EXPECT_FAIL(attn_gpt2_preset_find(g_ctx, NULL, &p), ATTN_ERR_NULL, "name is NULL");
    EXPECT_FAIL(attn_gpt2_preset_find(g_ctx, "small", NULL), ATTN_ERR_NULL, "out is NULL");
    CHECK_STATUS(attn_gpt2_preset_find(g_ctx, "small", &p), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    CHECK(strcmp(p.name, "gpt2-small") == 0 && p.n_embd == 768 && p.n_head == 12);
    /* NULL ctx is allowed here (nowhere to put the message) and must not crash. */
    CHECK_STATUS(attn_gpt2_preset_find(NULL, "nope", &p), ATTN_ERR_NOT_FOUND);

    static const struct {
        const char *name;
        size_t heads, total;
    } want[] = {{"gpt2-small", 12, 124439808},
                {"gpt2-medium", 16, 354823168},
                {"gpt2-large", 20, 774030080},
                {"gpt2-xl", 25, 1557611200}};
    for (size_t i = 0; i < 4; i++) {
        CHECK_STATUS(attn_gpt2_preset_at(i, &p), ATTN_OK);
        CHECK(strcmp(p.name, want[i].name) == 0);
        CHECK(p.n_head == want[i].heads && p.n_embd % p.n_head == 0);
        size_t total = 0;
        attn_gpt2_preset_model_params(g_ctx, NULL, &total);
        CHECK_STATUS(attn_gpt2_preset_model_params(g_ctx, &p, &total), ATTN_OK);
        CHECK_CLEARED(g_ctx);
        CHECK(total == want[i].total);
    }

    size_t total = 0;
    EXPECT_FAIL(attn_gpt2_preset_model_params(g_ctx, NULL, &total), ATTN_ERR_NULL,
                "preset is NULL");
    EXPECT_FAIL(attn_gpt2_preset_model_params(g_ctx, &p, NULL), ATTN_ERR_NULL, "out is NULL");
    attn_gpt2_preset huge = {.name = "huge", .vocab_size = SZ_MAX, .context_length = 1024,
                             .n_embd = 768, .n_head = 12, .n_layer = 12};
    EXPECT_FAIL(attn_gpt2_preset_model_params(g_ctx, &huge, &total), ATTN_ERR_OVERFLOW, "huge");
    huge = (attn_gpt2_preset){.name = "wide", .vocab_size = 1, .context_length = 1,
                              .n_embd = POW2(31), .n_head = 1, .n_layer = 1};
    EXPECT_FAIL(attn_gpt2_preset_model_params(g_ctx, &huge, &total), ATTN_ERR_OVERFLOW, "wide");
    huge = (attn_gpt2_preset){.vocab_size = SZ_MAX, .context_length = 1, .n_embd = 2,
                              .n_head = 1, .n_layer = 1};
    EXPECT_FAIL(attn_gpt2_preset_model_params(g_ctx, &huge, &total), ATTN_ERR_OVERFLOW,
                "(unnamed)");
    /* Every term fits size_t but their sum does not: the sum must be checked
     * too (vocab*C + context*C + layers*(12C^2 + 13C) + 2C). */
    huge = (attn_gpt2_preset){.name = "sum", .vocab_size = SZ_MAX / 2, .context_length = SZ_MAX / 2,
                              .n_embd = 1, .n_head = 1, .n_layer = 1};
    total = 0;
    attn_status st = attn_gpt2_preset_model_params(g_ctx, &huge, &total);
    if (st != ATTN_ERR_OVERFLOW)
        fprintf(stderr, "%s:%d: model_params of a preset whose terms sum past SIZE_MAX returned "
                "%s with total %zu (wrapped)\n", __FILE__, __LINE__, attn_status_name(st), total);
    CHECK_STATUS(st, ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(g_ctx, "sum");
    huge = (attn_gpt2_preset){.name = "layers", .vocab_size = 1, .context_length = 1,
                              .n_embd = 1024, .n_head = 16, .n_layer = SZ_MAX / 12582912 + 1};
    EXPECT_FAIL(attn_gpt2_preset_model_params(g_ctx, &huge, &total), ATTN_ERR_OVERFLOW, "layers");

    /* c_attn's bias counted only with qkv_bias: 3 n_embd a layer */
    CHECK_STATUS(attn_gpt2_preset_at(0, &p), ATTN_OK);
    p.qkv_bias = false;
    CHECK_STATUS(attn_gpt2_preset_model_params(g_ctx, &p, &total), ATTN_OK);
    CHECK(total == 124439808 - 12 * 3 * 768);
    /* a preset of zeros, or heads that do not divide the width: refused */
    total = 7;
    EXPECT_FAIL(attn_gpt2_preset_model_params(g_ctx, &(attn_gpt2_preset){0}, &total),
                ATTN_ERR_INVALID, "vocab_size is 0");
    p.n_head = 7;
    EXPECT_FAIL(attn_gpt2_preset_model_params(g_ctx, &p, &total), ATTN_ERR_INVALID,
                "n_embd (768) must be divisible by n_head (7)");
    CHECK(total == 7);
}

/* ---- npy (the rest is test_npy.c's) --------------------------------------- */

static void test_npy_errors(void) {
    attn_npy npy;
    EXPECT_FAIL2(attn_npy_read(g_ctx, "/nonexistent/dir/x.npy", &npy), ATTN_ERR_IO,
                 "/nonexistent/dir/x.npy", "cannot open");
    CHECK(npy.data == NULL && npy.numel == 0);
    EXPECT_FAIL(attn_npy_read(g_ctx, NULL, &npy), ATTN_ERR_NULL, "path is NULL");
    EXPECT_FAIL(attn_npy_read(g_ctx, "/nonexistent/x.npy", NULL), ATTN_ERR_NULL, "out is NULL");
    EXPECT_FAIL(attn_npy_parse(g_ctx, NULL, 4, &npy), ATTN_ERR_NULL, "bytes is NULL");
    EXPECT_FAIL(attn_npy_parse(g_ctx, "NOPE", 4, &npy), ATTN_ERR_FORMAT, "bad magic");
    EXPECT_FAIL(attn_npy_write(g_ctx, NULL, NULL, 0, NULL), ATTN_ERR_NULL, "path is NULL");
    float v = 1.0f;
    size_t shape = 1;
    EXPECT_FAIL(attn_npy_write(g_ctx, "/nonexistent/dir/y.npy", &v, 1, &shape), ATTN_ERR_IO,
                "/nonexistent/dir/y.npy");
    /* A directory is not a readable file. */
    attn_status st = attn_npy_read(g_ctx, "/", &npy);
    CHECK(st == ATTN_ERR_IO || st == ATTN_ERR_FORMAT);
    CHECK_MESSAGE(g_ctx, "/");
    attn_npy_free(&npy);
}

/* ---- edge sizes that must succeed ---------------------------------------- */

static void test_edges(void) {
    float x[256], y[256], y2[256];
    fill(x, 256, 0.3f);

    /* T = 1 and batch = 1 for every module. */
    for (size_t i = 0; i < NUM_KINDS; i++) {
        spec s = small_spec(all_kinds[i]);
        s.context = 1;
        attn_module *m = build_ok(&s, 21);
        if (!m) continue;
        attn_module_set_training(m, false);
        CHECK_STATUS(attn_module_forward(m, x, 1, 1, y, NULL), ATTN_OK);
        CHECK(all_finite(y, attn_module_d_out(m)));
        /* context_length == T, several batches */
        CHECK_STATUS(attn_module_forward(m, x, 3, 1, y, NULL), ATTN_OK);
        CHECK(all_finite(y, 3 * attn_module_d_out(m)));
        attn_module_free(m);
    }

    /* T = 1 for CausalAttention: softmax of one score is 1, so the output is
     * the value projection of the token. */
    spec cs = {.kind = ATTN_MODULE_CAUSAL, .d_in = 5, .d_out = 3, .context = 1, .bias = true};
    attn_module *m = build_ok(&cs, 8);
    if (m) {
        attn_param wv, bv;
        CHECK_STATUS(attn_module_param(m, "W_value.weight", &wv), ATTN_OK);
        CHECK_STATUS(attn_module_param(m, "W_value.bias", &bv), ATTN_OK);
        CHECK_STATUS(attn_module_forward(m, x, 1, 1, y, NULL), ATTN_OK); /* training, p = 0 */
        for (size_t j = 0; j < 3; j++) {
            double want = bv.data[j];
            for (size_t k = 0; k < 5; k++) want += (double)wv.data[j * 5 + k] * x[k];
            CHECK_NEAR(y[j], want, 1e-6);
        }
        attn_module_free(m);
    }

    /* d_out = 1 everywhere it is a choice. */
    spec d1[] = {
        {.kind = ATTN_MODULE_SA_V1, .d_in = 3, .d_out = 1},
        {.kind = ATTN_MODULE_SA_V2, .d_in = 3, .d_out = 1, .bias = true},
        {.kind = ATTN_MODULE_CAUSAL, .d_in = 3, .d_out = 1, .context = 5},
        {.kind = ATTN_MODULE_MHA_WRAPPER, .d_in = 3, .d_out = 1, .context = 5, .heads = 3},
        {.kind = ATTN_MODULE_MHA, .d_in = 3, .d_out = 1, .context = 5, .heads = 1},
        {.kind = ATTN_MODULE_GPT2, .d_in = 1, .context = 5, .heads = 1},
        {.kind = ATTN_MODULE_SIMPLE, .d_in = 1},
    };
    for (size_t i = 0; i < sizeof d1 / sizeof d1[0]; i++) {
        m = build_ok(&d1[i], 4);
        if (!m) continue;
        attn_module_set_training(m, false);
        CHECK_STATUS(attn_module_forward(m, x, 2, 5, y, NULL), ATTN_OK);
        CHECK(all_finite(y, 10 * attn_module_d_out(m)));
        attn_module_free(m);
    }

    /* num_heads == d_out (head_dim 1). With T = 1 every head's weight is 1,
     * so the output does not depend on the head count: compare with 1 head
     * (same seed, same weights). */
    attn_module_kind multi[] = {ATTN_MODULE_MHA, ATTN_MODULE_GPT2};
    for (size_t i = 0; i < 2; i++) {
        spec one = {.kind = multi[i], .d_in = 6, .d_out = 6, .context = 4, .heads = 1};
        spec many = one;
        many.heads = 6;
        attn_module *a = build_ok(&one, 99), *b = build_ok(&many, 99);
        if (a && b) {
            attn_module_set_training(a, false);
            attn_module_set_training(b, false);
            CHECK_STATUS(attn_module_forward(a, x, 2, 1, y, NULL), ATTN_OK);
            CHECK_STATUS(attn_module_forward(b, x, 2, 1, y2, NULL), ATTN_OK);
            bool same = true;
            for (size_t j = 0; j < 12; j++) same = same && fabsf(y[j] - y2[j]) <= 1e-6f;
            CHECK(same);
            /* and T = 4 runs with head_dim 1 */
            CHECK_STATUS(attn_module_forward(b, x, 2, 4, y2, NULL), ATTN_OK);
            CHECK(all_finite(y2, 48));
        }
        attn_module_free(a);
        attn_module_free(b);
    }

    /* dropout 1.0 in training: every attention weight dropped. The context is
     * 0: CausalAttention and the wrapper give zeros, MultiHeadAttention gives
     * out_proj.bias, GPT-2 (residual dropout too) zeros. */
    for (size_t i = 0; i < NUM_KINDS; i++) {
        attn_module_kind kind = all_kinds[i];
        if (!kind_has_context(kind)) continue;
        spec s = small_spec(kind);
        s.dropout = 1.0;
        s.bias = true;
        m = build_ok(&s, 31);
        if (!m) continue;
        size_t n = 2 * 4 * attn_module_d_out(m);
        CHECK_STATUS(attn_module_forward(m, x, 2, 4, y, NULL), ATTN_ERR_NULL); /* needs rng */
        CHECK_STATUS(attn_module_forward(m, x, 2, 4, y, g_rng), ATTN_OK);
        CHECK(all_finite(y, n));
        if (kind == ATTN_MODULE_MHA) {
            attn_param bias;
            CHECK_STATUS(attn_module_param(m, "out_proj.bias", &bias), ATTN_OK);
            bool is_bias = true;
            for (size_t r = 0; r < 8; r++)
                for (size_t j = 0; j < 4; j++) is_bias = is_bias && y[r * 4 + j] == bias.data[j];
            CHECK(is_bias);
        } else {
            CHECK(all_zero(y, n));
        }
        attn_module_free(m);
    }

    /* dropout 0 in training needs no rng and equals eval; eval with dropout
     * > 0 needs no rng and equals the dropout-0 module of the same seed. */
    for (size_t i = 0; i < NUM_KINDS; i++) {
        attn_module_kind kind = all_kinds[i];
        if (!kind_has_context(kind)) continue;
        spec s = small_spec(kind);
        attn_module *zero = build_ok(&s, 41);
        s.dropout = 0.75;
        attn_module *drop = build_ok(&s, 41);
        if (zero && drop) {
            size_t n = 3 * 4 * attn_module_d_out(zero);
            CHECK(attn_module_training(zero));
            CHECK_STATUS(attn_module_forward(zero, x, 3, 4, y, NULL), ATTN_OK);
            CHECK_CLEARED(g_ctx);
            attn_module_set_training(drop, false);
            CHECK_STATUS(attn_module_forward(drop, x, 3, 4, y2, NULL), ATTN_OK);
            CHECK(memcmp(y, y2, n * sizeof *y) == 0);
            attn_module_set_training(zero, false);
            CHECK_STATUS(attn_module_forward(zero, x, 3, 4, y2, NULL), ATTN_OK);
            CHECK(memcmp(y, y2, n * sizeof *y) == 0);
        }
        attn_module_free(zero);
        attn_module_free(drop);
    }

    /* Very large and very small finite scales do not make NaN out of a
     * causal row (the first row has a single unmasked score). */
    spec sc = {.kind = ATTN_MODULE_CAUSAL, .d_in = 4, .d_out = 4, .context = 4, .scale = 1e30f};
    m = build_ok(&sc, 2);
    if (m) {
        attn_module_set_training(m, false);
        CHECK_STATUS(attn_module_forward(m, x, 1, 4, y, NULL), ATTN_OK);
        CHECK(all_finite(y, 16));
        attn_module_free(m);
    }
}

/* ---- a success after a failure clears the message ------------------------ */

static void test_error_cleared(void) {
    attn_rng *r = NULL;
    attn_rng_next_u32(g_rng, NULL);
    CHECK_STATUS(attn_rng_new(g_ctx, 3, &r), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    float buf[4];
    uint32_t u;
    attn_rng_next_u32(r, NULL);
    CHECK_STATUS(attn_rng_manual_seed(r, 4), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_rng_next_u32(r, NULL);
    CHECK_STATUS(attn_rng_next_u32(r, &u), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_rng_next_u32(r, NULL);
    CHECK_STATUS(attn_rng_rand(r, buf, 4), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_rng_next_u32(r, NULL);
    CHECK_STATUS(attn_rng_uniform(r, buf, 4, -1.0, 1.0), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_rng_next_u32(r, NULL);
    CHECK_STATUS(attn_rng_randn(r, buf, 4), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_rng_next_u32(r, NULL);
    CHECK_STATUS(attn_rng_linear_init(r, buf, NULL, 2, 2), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_rng_next_u32(r, NULL);
    CHECK_STATUS(attn_rng_dropout(r, buf, buf, 4, 0.5, NULL), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    attn_rng_free(r);

    attn_gpt2_preset p;
    attn_gpt2_preset_find(g_ctx, "nope", &p);
    CHECK_STATUS(attn_gpt2_preset_find(g_ctx, "gpt2-xl", &p), ATTN_OK);
    CHECK_CLEARED(g_ctx);
    size_t total;
    attn_gpt2_preset_find(g_ctx, "nope", &p);
    CHECK_STATUS(attn_gpt2_preset_model_params(g_ctx, &p, &total), ATTN_OK);
    CHECK_CLEARED(g_ctx);

    /* Every module's forward and constructor, after a failure. */
    float x[64], y[64];
    fill(x, 64, 0.1f);
    for (size_t i = 0; i < NUM_KINDS; i++) {
        spec s = small_spec(all_kinds[i]);
        attn_module *m = NULL;
        spec bad = s;
        bad.d_in = 0;
        build(g_ctx, g_rng, &bad, &m);
        CHECK(attn_ctx_last_error(g_ctx)[0] != '\0');
        CHECK_STATUS(build(g_ctx, g_rng, &s, &m), ATTN_OK);
        CHECK_CLEARED(g_ctx);
        if (!m) continue;
        attn_module_forward(m, NULL, 1, 2, y, g_rng);
        CHECK(attn_ctx_last_error(g_ctx)[0] != '\0');
        CHECK_STATUS(attn_module_forward(m, x, 1, 2, y, g_rng), ATTN_OK);
        CHECK_CLEARED(g_ctx);
        attn_param param;
        attn_module_forward(m, x, 0, 2, y, g_rng);
        if (attn_module_param_count(m) > 0) {
            CHECK_STATUS(attn_module_param_at(m, 0, &param), ATTN_OK);
            CHECK_CLEARED(g_ctx);
            attn_module_forward(m, x, 0, 2, y, g_rng);
            CHECK_STATUS(attn_module_param(m, param.name, &param), ATTN_OK);
            CHECK_CLEARED(g_ctx);
        } else {
            /* SimplifiedSelfAttention has no parameters at all */
            EXPECT_FAIL2(attn_module_param_at(m, 0, &param), ATTN_ERR_NOT_FOUND, "0 parameters",
                         "index 0");
        }
        attn_module_free(m);
    }

    /* npy: a failed read, then a good write and read. */
    char path[] = "/tmp/attn_test_errors_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        close(fd);
        attn_npy npy;
        float data[6] = {1, 2, 3, 4, 5, 6};
        size_t shape[2] = {2, 3};
        attn_npy_read(g_ctx, "/nonexistent/x.npy", &npy);
        CHECK_STATUS(attn_npy_write(g_ctx, path, data, 2, shape), ATTN_OK);
        CHECK_CLEARED(g_ctx);
        attn_npy_read(g_ctx, "/nonexistent/x.npy", &npy);
        CHECK_STATUS(attn_npy_read(g_ctx, path, &npy), ATTN_OK);
        CHECK_CLEARED(g_ctx);
        CHECK(npy.ndim == 2 && npy.numel == 6 && npy.data && npy.data[5] == 6.0f);
        attn_npy_free(&npy);
        unlink(path);
    }
}

/* ---- main: the library must not write to stdout -------------------------- */

int main(void) {
    /* Everything the library could print to stdout lands in a temporary
     * file that must stay empty. (stderr carries the harness' own failure
     * lines; run the binary with 2>file to see that nothing else is there.) */
    fflush(stdout);
    int saved_stdout = dup(1);
    FILE *capture = tmpfile();
    if (saved_stdout >= 0 && capture) dup2(fileno(capture), 1);

    if (attn_ctx_new(NULL, &g_ctx) != ATTN_OK || attn_rng_new(g_ctx, 123, &g_rng) != ATTN_OK) {
        fprintf(stderr, "cannot create a context and an rng\n");
        return 1;
    }
    test_status_names();
    test_ctx();
    test_rng_errors();
    test_ops_errors();
    test_ops_byte_overflow();
    test_constructor_nulls();
    test_out_null_on_every_failure();
    test_scale_range();
    test_sdpa_scale_range();
    test_messages_escaped();
    test_long_message_keeps_its_end();
    test_trace_shapes_only();
    test_constructor_values();
    test_constructor_overflow();
    test_constructor_no_memory();
    test_module_nulls();
    test_params_lookup();
    test_forward_errors();
    test_forward_byte_overflow();
    test_simple_query();
    test_presets();
    test_npy_errors();
    test_edges();
    test_error_cleared();
    attn_rng_free(g_rng);
    attn_ctx_free(g_ctx);

    fflush(stdout);
    if (saved_stdout >= 0 && capture) {
        dup2(saved_stdout, 1);
        close(saved_stdout);
        long printed = ftell(capture);
        if (fseek(capture, 0, SEEK_END) == 0) printed = ftell(capture);
        if (printed != 0)
            fprintf(stderr, "%s: the library wrote %ld bytes to stdout\n", __FILE__, printed);
        CHECK(printed == 0);
        fclose(capture);
    }
    return check_summary();
}
