/*
 * attn_bench.c — attn-bench: timings of the library's kernels, each next to
 * the machine's practical peak (OpenBLAS, loaded at run time when present).
 * A program of the source tree, built by make and never installed: the
 * installed attn is the user's tool, this one the developers'.
 *
 * The program parses its options, describes the machine, finds OpenBLAS,
 * and runs the sections of the table below in order; each section lives
 * in a file of its own (bench_<name>.c, see bench.h). The argument helpers
 * and the CPU lines are attn's own (cli/args.c, cli/print_cpu.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

typedef struct bench_section {
    const char *name;
    const char *summary;
    int (*run)(const bench_options *o, const bench_blas *blas);
} bench_section;

static const bench_section sections[] = {
    {"peak", "the FMA peak: independent float fmas, 512- and 256-bit, on each thread count",
     bench_peak},
    {"sgemm", "2048^3 and the GPT-2 projection shapes, every transpose case the modules use",
     bench_sgemm},
    {"attention", "fused attention forward and backward, B=1 H=12 hd=64, T up to 16384",
     bench_attention},
    {"layer", "the whole GPT-2-small attention layer, forward and forward+backward",
     bench_layer},
    {"dropout", "the mha module in training mode under each dropout mask, and without",
     bench_dropout},
    {"variants", "window, GQA/MQA, softcap, ALiBi, sinks and varlen against plain attention",
     bench_variants},
    {"decode", "one token against a KV cache (GB/s vs copy, vs PyTorch), then GPT-2 generating",
     bench_decode},
    {"bf16", "bf16 attention (AMX tiles, vdpbf16ps) against fp32, forward and forward+backward", bench_bf16},
    {"masks", "row-interval block maps (prefix-LM, window, documents) against the fixed features",
     bench_masks},
};
enum { SECTIONS = sizeof sections / sizeof sections[0] };

static const char bench_help[] =
    "usage: attn-bench [--threads LIST] [--runs N] [--quick] [--kernels LIST]\n"
    "                  [--section NAME] [--tokens LIST] [--peer-python PATH]\n"
    "                  [--kv-dtypes LIST]\n"
    "\n"
    "Times the library's kernels and, in the same run, OpenBLAS's on the same\n"
    "work: the machine's practical peak. Each line gives the median of N timed\n"
    "runs (after one warm-up), GFLOP/s, and the ratio to OpenBLAS. OpenBLAS is\n"
    "loaded at run time if installed (apt install libopenblas0-pthread, or\n"
    "scripts/install-bench-deps.sh); the library never links it.\n"
    "\n"
    "  --threads LIST   comma-separated thread counts, 'all' for every online\n"
    "                   CPU (default 1,all)\n"
    "  --runs N         timed runs per measurement (default 5; --quick: 3)\n"
    "  --quick          fewer shapes and runs\n"
    "  --kernels LIST   kernel sets to time: auto (default), all (every set\n"
    "                   this CPU runs), or a list of portable, avx2, avx512\n"
    "  --section NAME   run one section only\n"
    "  --tokens LIST    sequence lengths for the attention, layer, dropout and\n"
    "                   bf16 sections (default: each section's own)\n"
    "  --kv-dtypes LIST the decode section's KV cache types, of f32, bf16, f16,\n"
    "                   fp8, int8, int4 (default all)\n"
    "  --peer-python PATH  the python with PyTorch 2.15 for the decode section's\n"
    "                   peers (default .venv-peers/bin/python where present)\n"
    "\n"
    "sections:\n";

/* ---- shared helpers (bench.h) ---------------------------------------------- */

double bench_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *values, size_t n) {
    if (n == 0) return NAN;
    qsort(values, n, sizeof *values, compare_doubles);
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double bench_time_median(bench_fn fn, void *arg, size_t runs) {
    double t0 = bench_now();
    fn(arg);
    double first = bench_now() - t0, times[64];
    if (runs <= 1) return first;
    if (runs > 64) runs = 64;
    for (size_t r = 0; r < runs; r++) {
        t0 = bench_now();
        fn(arg);
        times[r] = bench_now() - t0;
    }
    return bench_median(times, runs);
}

float *bench_random(size_t n, unsigned seed) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    if (!x) return NULL;
    unsigned long long s = 0x9E3779B97F4A7C15ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) / 8388608.0 - 1.0);
    }
    return x;
}

double bench_rel_l2(const float *a, const float *b, size_t n) {
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        err += d * d;
        norm += (double)b[i] * b[i];
    }
    return norm > 0.0 ? sqrt(err / norm) : sqrt(err);
}

const char *bench_load(char *buf, size_t size) {
    FILE *f = fopen("/proc/loadavg", "r");
    double l1, l5, l15;
    if (f && fscanf(f, "%lf %lf %lf", &l1, &l5, &l15) == 3)
        snprintf(buf, size, "%.2f %.2f %.2f", l1, l5, l15);
    else
        snprintf(buf, size, "?");
    if (f) fclose(f);
    return buf;
}

enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };

void bench_blas_sgemm(const bench_blas *blas, size_t threads, bool trans_a, bool trans_b,
                      size_t m, size_t n, size_t k, float alpha, const float *a, size_t lda,
                      const float *b, size_t ldb, float beta, float *c, size_t ldc) {
    if (blas->set_num_threads) blas->set_num_threads((int)threads);
    blas->sgemm(CBLAS_ROW_MAJOR, trans_a ? CBLAS_TRANS : CBLAS_NO_TRANS,
                trans_b ? CBLAS_TRANS : CBLAS_NO_TRANS, (int)m, (int)n, (int)k, alpha, a,
                (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* ---- finding OpenBLAS ----------------------------------------------------- */

/* dlsym's object pointer as a function pointer, the way POSIX allows. */
static void *symbol(void *handle, const char *name) { return dlsym(handle, name); }

/* The first of names that loads and is OpenBLAS, or {0}. */
static bench_blas load_openblas(void) {
    /* libblas.so.3 counts only when it is OpenBLAS (has openblas_* calls):
     * the reference BLAS would be no peak at all. */
    static const char *const names[] = {"libopenblas.so.0", "libopenblas.so", "libblas.so.3"};
    bench_blas blas = {0};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        void *sgemm = symbol(h, "cblas_sgemm"), *threads = symbol(h, "openblas_set_num_threads");
        if (!sgemm || !threads) {
            dlclose(h);
            continue;
        }
        blas.handle = h;
        blas.library = names[i];
        memcpy(&blas.sgemm, &sgemm, sizeof sgemm);
        memcpy(&blas.set_num_threads, &threads, sizeof threads);
        void *core = symbol(h, "openblas_get_corename"), *config = symbol(h, "openblas_get_config");
        char *(*get)(void);
        blas.core = "?";
        blas.config = "?";
        if (core) {
            memcpy(&get, &core, sizeof core);
            blas.core = get();
        }
        if (config) {
            memcpy(&get, &config, sizeof config);
            blas.config = get();
        }
        break;
    }
    return blas;
}

/* The OPENBLAS_CORETYPE to ask for when OpenBLAS chose kernels older than
 * the CPU's vectors, or NULL. A DYNAMIC_ARCH OpenBLAS falls back to SSE3
 * ("Prescott") on a core it does not know: Debian 12's 0.3.21 does so on
 * Emerald Rapids (family 6, model 207), whose vectors the SSE3 kernels
 * leave idle: no peak to compare with. */
static const char *better_openblas_core(const char *core) {
    static const char *const vector_cores[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake",
                                               "SapphireRapids", "Excavator"};
    for (size_t i = 0; i < sizeof vector_cores / sizeof vector_cores[0]; i++)
        if (strcmp(core, vector_cores[i]) == 0) return NULL;
    attn_cpu_info cpu;
    if (strcmp(core, "?") == 0 || attn_cpu_info_get(&cpu) != ATTN_OK) return NULL;
    if (cpu.avx512f) return "SkylakeX";
    return cpu.avx2_fma ? "Haswell" : NULL;
}

static bench_blas find_openblas(void) {
    /* OpenBLAS's idle threads spin for 2^28 cycles (~70 ms) after each call
     * before they sleep, on the cores our kernel is about to be timed on: the
     * first cases after an OpenBLAS run would run at one thread's speed on two.
     * It reads this at load; a value the user set stays. */
    setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0);
    bench_blas blas = load_openblas();
    if (!blas.handle || getenv("OPENBLAS_CORETYPE")) return blas; /* the user's choice stays */
    const char *better = better_openblas_core(blas.core);
    if (!better) return blas;
    /* OpenBLAS reads OPENBLAS_CORETYPE when it loads: load it again */
    char *chosen = strdup(blas.core);
    dlclose(blas.handle);
    setenv("OPENBLAS_CORETYPE", better, 1);
    blas = load_openblas();
    if (chosen && blas.handle)
        snprintf(blas.core_note, sizeof blas.core_note,
                 strcmp(blas.core, chosen) != 0 ? "; it chose %s on this CPU, so OPENBLAS_CORETYPE=%s"
                                                : "; it chose %s on this CPU, and OPENBLAS_CORETYPE=%s "
                                                  "did not take (it stayed loaded)",
                 chosen, better);
    free(chosen);
    return blas;
}

/* ---- options ---------------------------------------------------------------- */

/* A comma-separated list of counts from 1 to max, repeats dropped, into
 * out[0 .. *count); 'all' means all_value where that is not 0. */
static int parse_counts(const char *option, const char *text, size_t all_value, size_t max,
                        size_t *out, size_t capacity, size_t *count) {
    const char *what = all_value ? "positive counts or 'all'" : "positive counts";
    *count = 0;
    const char *p = text;
    while (*p) {
        char item[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item || *count == capacity)
            return cli_usage_error("%s: expected up to %zu %s, got '%s'", option, capacity, what,
                                   text);
        memcpy(item, p, len);
        item[len] = '\0';
        size_t n;
        if (all_value && strcmp(item, "all") == 0) n = all_value;
        else if (!cli_parse_size(item, &n) || n == 0 || n > max)
            return cli_usage_error("%s: expected %s up to %zu, got '%s'", option, what, max, item);
        bool seen = false;
        for (size_t i = 0; i < *count; i++) seen = seen || out[i] == n;
        if (!seen) out[(*count)++] = n;
        p += len;
        if (*p == ',') p++;
    }
    if (*count == 0) return cli_usage_error("%s: expected %s, got '%s'", option, what, text);
    return CLI_OK;
}

size_t bench_tokens(const bench_options *o, const size_t *own, size_t own_count,
                    size_t quick_count, const size_t **tokens) {
    if (o->token_counts) {
        *tokens = o->tokens;
        return o->token_counts;
    }
    *tokens = own;
    return o->quick ? quick_count : own_count;
}

static int parse_kernels(const char *text, bench_options *o) {
    static const attn_kernels fast[] = {ATTN_KERNELS_AVX512, ATTN_KERNELS_AVX2,
                                        ATTN_KERNELS_PORTABLE};
    o->kernel_counts = 0;
    if (strcmp(text, "all") == 0) {
        for (size_t i = 0; i < sizeof fast / sizeof fast[0]; i++)
            if (attn_kernels_supported(fast[i])) o->kernels[o->kernel_counts++] = fast[i];
        return CLI_OK;
    }
    const char *p = text;
    while (*p) {
        size_t len = strcspn(p, ",");
        attn_kernels k = ATTN_KERNELS_AUTO;
        bool known = false;
        for (attn_kernels c = ATTN_KERNELS_AUTO; c <= ATTN_KERNELS_AVX512; c++) {
            const char *name = attn_kernels_name(c);
            if (strlen(name) == len && strncmp(p, name, len) == 0) {
                k = c;
                known = true;
            }
        }
        if (!known || k == ATTN_KERNELS_REFERENCE)
            return cli_usage_error("--kernels: expected auto, all, or a list of portable, avx2, "
                                   "avx512, got '%.*s'", (int)len, p);
        if (k == ATTN_KERNELS_AUTO) {
            attn_ctx *ctx;
            if (attn_ctx_new(NULL, &ctx) != ATTN_OK)
                return cli_usage_error("--kernels auto: the ATTN_KERNELS environment variable "
                                       "names no kernels this CPU runs");
            k = attn_ctx_kernels(ctx);
            attn_ctx_free(ctx);
        } else if (!attn_kernels_supported(k)) {
            return cli_usage_error("--kernels: this CPU (or build) does not run %s",
                                   attn_kernels_name(k));
        }
        bool seen = false;
        for (size_t i = 0; i < o->kernel_counts; i++) seen = seen || o->kernels[i] == k;
        if (!seen && o->kernel_counts < BENCH_MAX_KERNELS) o->kernels[o->kernel_counts++] = k;
        p += len;
        if (*p == ',') p++;
    }
    if (o->kernel_counts == 0) return cli_usage_error("--kernels: empty list");
    return CLI_OK;
}

/* "model name" of /proc/cpuinfo, or "?" */
static const char *cpu_model(char *buf, size_t size) {
    snprintf(buf, size, "?");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return buf;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *v = strchr(line, ':');
            if (v) {
                v++;
                while (*v == ' ' || *v == '\t') v++;
                snprintf(buf, size, "%.*s", (int)strcspn(v, "\n"), v);
            }
            break;
        }
    }
    fclose(f);
    return buf;
}

static void print_sections(FILE *out) {
    for (size_t i = 0; i < SECTIONS; i++)
        fprintf(out, "  %-9s %s\n", sections[i].name, sections[i].summary);
}

static const char *const bench_value_options[] = {"--threads", "--runs",  "--kernels",
                                                  "--section", "--tokens", "--peer-python",
                                                  "--kv-dtypes", NULL};

/* --kv-dtypes: a comma-separated list of the CLI's KV type names. */
static int parse_kv_dtypes(const char *text, bench_options *o) {
    const char *p = text;
    o->kv_dtype_counts = 0;
    while (*p) {
        char item[16];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item || o->kv_dtype_counts == 6)
            return cli_usage_error("--kv-dtypes: expected up to 6 of f32, bf16, f16, fp8, int8, "
                                   "int4, got '%s'", text);
        memcpy(item, p, len);
        item[len] = '\0';
        if (cli_parse_kv_dtype("--kv-dtypes", item, &o->kv_dtypes[o->kv_dtype_counts++]) !=
            CLI_OK)
            return CLI_USAGE;
        p += len + (p[len] == ',');
    }
    return o->kv_dtype_counts ? CLI_OK
                              : cli_usage_error("--kv-dtypes: expected a list, got '%s'", text);
}

typedef struct bench_args {
    bench_options o;
    const char *only;
} bench_args;

static int parse_args(int argc, char **argv, bench_args *a) {
    *a = (bench_args){.o = {.runs = 0}};
    bench_options *o = &a->o;
    const char *threads = "1,all", *kernels = "auto", *tokens = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            o->quick = true;
            continue;
        }
        const char *opt = argv[i], *value = cli_option_value(argc, argv, &i, bench_value_options);
        if (!value) return CLI_USAGE;
        if (strcmp(opt, "--threads") == 0) {
            threads = value;
        } else if (strcmp(opt, "--kernels") == 0) {
            kernels = value;
        } else if (strcmp(opt, "--section") == 0) {
            a->only = value;
        } else if (strcmp(opt, "--tokens") == 0) {
            tokens = value;
        } else if (strcmp(opt, "--peer-python") == 0) {
            o->peer_python = value;
        } else if (strcmp(opt, "--kv-dtypes") == 0) {
            if (parse_kv_dtypes(value, o) != CLI_OK) return CLI_USAGE;
        } else if (!cli_parse_size(value, &o->runs) || o->runs == 0 || o->runs > 1000) {
            return cli_usage_error("--runs: expected a count from 1 to 1000, got '%s'", value);
        }
    }
    if (parse_counts("--threads", threads, cli_default_threads(), 4096, o->threads,
                     BENCH_MAX_THREAD_COUNTS, &o->thread_counts) != CLI_OK ||
        (tokens && parse_counts("--tokens", tokens, 0, 65536, o->tokens, BENCH_MAX_TOKEN_COUNTS,
                                &o->token_counts) != CLI_OK) ||
        parse_kernels(kernels, o) != CLI_OK)
        return CLI_USAGE;
    if (o->runs == 0) o->runs = o->quick ? 3 : 5;
    if (a->only) {
        bool found = false;
        for (size_t i = 0; i < SECTIONS; i++) found = found || strcmp(a->only, sections[i].name) == 0;
        if (!found)
            return cli_usage_error("--section: no section '%s' (try 'attn-bench --help')", a->only);
    }
    return CLI_OK;
}

static int run_bench(int argc, char **argv) {
    bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != CLI_OK) return rc;
    bench_options o = a.o;
    const char *only = a.only;
#if defined(__GLIBC__)
    /* Blocks of 1 MiB and more straight from the system and back, so that
     * each case's resident peak counts its own allocations: after the first
     * large free glibc would raise this threshold and keep later blocks in
     * its heap, resident from one case to the next. */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif

    char model[256], load[64];
    printf("attn-bench (attn %s): %s, %zu online CPUs; load average %s\n", attn_version(),
           cpu_model(model, sizeof model), cli_default_threads(), bench_load(load, sizeof load));
    cli_print_cpu(stdout, "cpu: "); /* what the kernels are chosen and tuned for */
    bench_blas blas = find_openblas();
    if (blas.handle)
        printf("OpenBLAS: %s (core %s%s; %s)\n", blas.library, blas.core, blas.core_note,
               blas.config);
    else
        printf("OpenBLAS: not found, so no comparison (apt install libopenblas0-pthread, or\n"
               "          scripts/install-bench-deps.sh)\n");
    printf("median of %zu runs after a warm-up; threads:", o.runs);
    for (size_t i = 0; i < o.thread_counts; i++) printf(" %zu", o.threads[i]);
    printf("\n");

    for (size_t i = 0; i < SECTIONS && rc == CLI_OK; i++) {
        if (only && strcmp(only, sections[i].name) != 0) continue;
        printf("\n");
        rc = sections[i].run(&o, &blas);
    }
    printf("\nload average at the end: %s\n", bench_load(load, sizeof load));
    if (blas.handle) dlclose(blas.handle);
    return rc;
}

const char cli_program_name[] = "attn-bench";

int main(int argc, char **argv) {
    /* the errors name the program as its user knows it, whatever path ran it */
    char program[] = "attn-bench";
    argv[0] = program;
    if (cli_wants_help(argc, argv, bench_value_options)) {
        fputs(bench_help, stdout);
        print_sections(stdout);
        return cli_finish(CLI_OK);
    }
    return cli_finish(run_bench(argc, argv));
}
