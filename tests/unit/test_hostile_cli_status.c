/*
 * test_hostile_cli_status.c — the attn command with each of the library's
 * allocations failed in turn: a failure in the library is reported, never
 * printed over.
 *
 * Built only with -DATTN_ALLOC_FAILURE_INJECTION=ON (make sanitize), as
 * test_alloc_failure is: the allocator's failure hook is the one way to make
 * the library fail inside a command whose inputs are all valid, which is
 * where a discarded attn_status hides (tests/lint/check_status.py finds the
 * discards by reading; this finds what they would do). Each command line
 * below runs in this process (cli_main) once cleanly, then with the
 * allocator's n-th call failing, for n = 1, 2, ... until a run makes fewer
 * than n calls. A run whose allocation failed must either
 *   - exit 1 with one line on stderr, "attn: ...", naming the memory it
 *     could not get; stdout a prefix of the clean run's (what was printed
 *     before the failure, nothing computed from a step that failed); and
 *     no file left in the work directory, neither an output nor a
 *     temporary nor a directory it made; or
 *   - succeed as the clean run did: the same stdout, stderr and output
 *     files, byte for byte (or, where the failed allocation had a fallback
 *     and the reference kernel ran, the same files and lines of output).
 * The leak checker (make sanitize) checks that each failed run frees what
 * it made. The closing lines give the allocations swept per command.
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"
#include "cli.h"
#include "internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef ATTN_ALLOC_FAILURE_INJECTION
#error "build with -DATTN_ALLOC_FAILURE_INJECTION=ON"
#endif

#define MAX_CALLS 20000 /* a runaway sweep is a failure, not a hang */
#define MAX_ARGS 32
#define MAX_FILES 64

static char g_work[64];    /* the commands' inputs and outputs */
static char g_capture[64]; /* their stdout and stderr */

typedef struct cli_case {
    const char *name;
    /* the arguments after "attn"; "@name" is the path of name in the work
     * directory */
    const char *args[MAX_ARGS];
    bool timed; /* stdout carries timings: compared by line count only */
} cli_case;

typedef struct run_result {
    int rc;
    char *out, *err;
    size_t out_len, err_len;
} run_result;

/* A file's bytes (NUL-terminated), or NULL. */
static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n < 2) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown) free(buf);
            buf = grown;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    *len = n;
    return buf;
}

/* Runs "attn args..." with stdout and stderr captured. */
static run_result run_cli(const cli_case *c) {
    char paths[MAX_ARGS][128];
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = "attn";
    for (int i = 0; c->args[i]; i++, argc++) {
        if (c->args[i][0] == '@') {
            snprintf(paths[i], sizeof paths[i], "%s/%s", g_work, c->args[i] + 1);
            argv[argc] = paths[i];
        } else {
            argv[argc] = (char *)c->args[i];
        }
    }
    argv[argc] = NULL;
    char out_path[128], err_path[128];
    snprintf(out_path, sizeof out_path, "%s/stdout", g_capture);
    snprintf(err_path, sizeof err_path, "%s/stderr", g_capture);
    fflush(stdout);
    fflush(stderr);
    int saved_out = dup(1), saved_err = dup(2);
    int out_fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err_fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    run_result r = {.rc = -1};
    if (saved_out < 0 || saved_err < 0 || out_fd < 0 || err_fd < 0) {
        fprintf(stderr, "cannot capture the output\n");
        exit(2);
    }
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    r.rc = cli_main(argc, argv, false);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(out_fd);
    close(err_fd);
    close(saved_out);
    close(saved_err);
    r.out = read_all(out_path, &r.out_len);
    r.err = read_all(err_path, &r.err_len);
    if (!r.out || !r.err) {
        fprintf(stderr, "cannot read the captured output\n");
        exit(2);
    }
    return r;
}

static void result_free(run_result *r) {
    free(r->out);
    free(r->err);
}

/* The regular files under dir and one level of folders below it, as
 * "name" or "folder/name", sorted, in names; returns the count. */
static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static size_t list_files(const char *dir, const char *prefix, char **names, size_t count) {
    DIR *d = opendir(dir);
    if (!d) return count;
    struct dirent *e;
    while ((e = readdir(d)) && count < MAX_FILES) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[600], name[600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(name, sizeof name, "%s%s", prefix, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        names[count++] = strdup(name);
        if (S_ISDIR(st.st_mode) && !*prefix) {
            char sub[300];
            snprintf(sub, sizeof sub, "%s/", e->d_name);
            count = list_files(path, sub, names, count);
        }
    }
    closedir(d);
    return count;
}

typedef struct listing {
    char *names[MAX_FILES]; /* "name" or "folder/name" */
    size_t count;
} listing;

static listing list_work(void) {
    listing l = {.count = 0};
    l.count = list_files(g_work, "", l.names, 0);
    qsort(l.names, l.count, sizeof l.names[0], compare_names);
    return l;
}

static void listing_free(listing *l) {
    for (size_t i = 0; i < l->count; i++) free(l->names[i]);
    l->count = 0;
}

static bool same_listing(const listing *a, const listing *b) {
    if (a->count != b->count) return false;
    for (size_t i = 0; i < a->count; i++)
        if (strcmp(a->names[i], b->names[i]) != 0) return false;
    return true;
}

/* Removes what the command wrote (every name not in the inputs' listing):
 * files first, then the folders they were in. */
static void remove_outputs(const listing *inputs) {
    listing now = list_work();
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = now.count; i-- > 0;) {
            bool input = false;
            for (size_t j = 0; j < inputs->count && !input; j++)
                input = strcmp(now.names[i], inputs->names[j]) == 0;
            if (input) continue;
            char path[256];
            snprintf(path, sizeof path, "%s/%s", g_work, now.names[i]);
            if (pass == 0) unlink(path);
            else rmdir(path);
        }
    listing_free(&now);
}

/* The files the clean run wrote, with their bytes. */
typedef struct snapshot {
    listing files;
    char *data[MAX_FILES];
    size_t len[MAX_FILES];
} snapshot;

static snapshot take_snapshot(void) {
    snapshot s = {.files = list_work()};
    for (size_t i = 0; i < s.files.count; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", g_work, s.files.names[i]);
        s.data[i] = read_all(path, &s.len[i]); /* NULL for a folder */
    }
    return s;
}

static bool same_files(const snapshot *a, const snapshot *b, bool bytes) {
    if (!same_listing(&a->files, &b->files)) return false;
    for (size_t i = 0; i < a->files.count; i++) {
        if (!a->data[i] != !b->data[i]) return false;
        if (bytes && a->data[i] &&
            (a->len[i] != b->len[i] || memcmp(a->data[i], b->data[i], a->len[i]) != 0))
            return false;
    }
    return true;
}

static void snapshot_free(snapshot *s) {
    for (size_t i = 0; i < s->files.count; i++) free(s->data[i]);
    listing_free(&s->files);
}

static size_t count_lines(const char *text) {
    size_t n = 0;
    for (; *text; text++) n += *text == '\n';
    return n;
}

/* One line, "attn: ...\n", with more than the prefix. */
static bool one_error_line(const char *err) {
    size_t len = strlen(err);
    return strncmp(err, "attn: ", 6) == 0 && len > 8 && err[len - 1] == '\n' &&
           strchr(err, '\n') == err + len - 1;
}

/* The clean run, then the sweep; returns the allocations swept. */
static size_t sweep(const cli_case *c, const listing *inputs) {
    attn_alloc_fail_at(0);
    run_result clean = run_cli(c);
    size_t calls = attn_alloc_calls();
    snapshot clean_files = take_snapshot();
    if (clean.rc != CLI_OK) {
        fprintf(stderr, "%s: the clean run failed (exit %d): %s", c->name, clean.rc, clean.err);
        CHECK(clean.rc == CLI_OK);
    }
    remove_outputs(inputs);
    size_t n = 1;
    for (; n <= MAX_CALLS; n++) {
        attn_alloc_fail_at(n);
        run_result r = run_cli(c);
        bool injected = attn_alloc_calls() >= n;
        bool fell_back = attn_alloc_failed_with_fallback();
        attn_alloc_fail_at(0);
        snapshot files = take_snapshot();
        bool ok;
        if (r.rc == CLI_OK) {
            /* a success must be the clean run's, and only where no
             * allocation failed or the one that failed had a fallback */
            bool exact = !fell_back && !c->timed;
            ok = (!injected || fell_back) && same_files(&files, &clean_files, !fell_back) &&
                 (exact ? r.out_len == clean.out_len && memcmp(r.out, clean.out, r.out_len) == 0
                        : count_lines(r.out) == count_lines(clean.out)) &&
                 strcmp(r.err, clean.err) == 0;
            if (!ok)
                fprintf(stderr,
                        "%s, allocation %zu failed%s: exit 0%s (stderr: %s)\n", c->name, n,
                        fell_back ? " (with a fallback)" : "",
                        injected && !fell_back ? ": a silent success"
                                               : " but not the clean run's output",
                        r.err);
        } else {
            /* a failure is said once, and nothing computed after it shows */
            bool prefix = c->timed ? count_lines(r.out) <= count_lines(clean.out)
                                   : r.out_len <= clean.out_len &&
                                         memcmp(r.out, clean.out, r.out_len) == 0;
            bool nothing_left = same_listing(&files.files, inputs);
            ok = injected && !fell_back && r.rc == CLI_FAILED && one_error_line(r.err) &&
                 prefix && nothing_left;
            if (!ok)
                fprintf(stderr,
                        "%s, allocation %zu failed: exit %d, stderr \"%s\", stdout %s, "
                        "files %s\n",
                        c->name, n, r.rc, r.err, prefix ? "a prefix of the clean run's" : "DIFFERS",
                        nothing_left ? "none left" : "LEFT BEHIND");
        }
        CHECK(ok);
        snapshot_free(&files);
        remove_outputs(inputs);
        result_free(&r);
        if (!injected) break; /* this run made fewer than n calls: all swept */
    }
    CHECK(n <= MAX_CALLS);
    snapshot_free(&clean_files);
    result_free(&clean);
    printf("  %-16s %5zu allocations\n", c->name, calls);
    return calls;
}

/* Writes a float32 .npy of shape (a, b, c[, d]) with values from a fixed
 * sequence into the work directory. */
static void write_input(attn_ctx *ctx, const char *name, size_t ndim, const size_t *shape,
                        unsigned seed) {
    size_t n = 1;
    for (size_t i = 0; i < ndim; i++) n *= shape[i];
    float *data = malloc(n * sizeof *data);
    CHECK(data != NULL);
    if (!data) return;
    unsigned s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        data[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    char path[128];
    snprintf(path, sizeof path, "%s/%s", g_work, name);
    CHECK_STATUS(attn_npy_write(ctx, path, data, ndim, shape), ATTN_OK);
    free(data);
}

int main(void) {
    snprintf(g_work, sizeof g_work, "/tmp/attn_cli_status_XXXXXX");
    snprintf(g_capture, sizeof g_capture, "/tmp/attn_cli_capture_XXXXXX");
    if (!mkdtemp(g_work) || !mkdtemp(g_capture)) {
        perror("mkdtemp");
        return 2;
    }
    attn_ctx *ctx;
    if (attn_ctx_new(NULL, &ctx) != ATTN_OK) return 2;
    write_input(ctx, "x.npy", 3, (size_t[]){2, 5, 8}, 1);
    write_input(ctx, "dy.npy", 3, (size_t[]){2, 5, 8}, 2);
    write_input(ctx, "q.npy", 4, (size_t[]){1, 2, 4, 4}, 3);
    write_input(ctx, "k.npy", 4, (size_t[]){1, 2, 4, 4}, 4);
    write_input(ctx, "v.npy", 4, (size_t[]){1, 2, 4, 4}, 5);
    write_input(ctx, "do.npy", 4, (size_t[]){1, 2, 4, 4}, 6);
    attn_ctx_free(ctx);
    listing inputs = list_work();

    static const cli_case cases[] = {
        {.name = "demo", .args = {"demo", NULL}},
        {.name = "params", .args = {"params", "--preset", "gpt2-small", NULL}},
        {.name = "trace mha", .args = {"trace", "--module", "mha", "--tokens", "4", NULL}},
        {.name = "trace gpt2", .args = {"trace", "--module", "gpt2", "--tokens", "4", NULL}},
        {.name = "forward mha",
         .args = {"forward", "--module", "mha", "--heads", "2", "--d-out", "8", "--input", "@x.npy",
          "--output", "@y.npy", NULL}},
        {.name = "forward gqa",
         .args = {"forward", "--module", "gqa", "--heads", "4", "--kv-groups", "2", "--d-out", "8",
          "--input", "@x.npy", "--output", "@y.npy", NULL}},
        {.name = "grad mha",
         .args = {"grad", "--module", "mha", "--heads", "2", "--d-out", "8", "--input", "@x.npy",
          "--grad-output", "@dy.npy", "--out", "@g", NULL}},
        {.name = "grad gpt2",
         .args = {"grad", "--module", "gpt2", "--heads", "2", "--input", "@x.npy", "--grad-output",
          "@dy.npy", "--out", "@g", NULL}},
        {.name = "heatmap",
         .args = {"heatmap", "--module", "mha", "--heads", "2", "--d-out", "8", "--input", "@x.npy",
          "--terminal", "--save-weights", "@w.npy", NULL}},
        {.name = "sdpa",
         .args = {"sdpa", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--output", "@o.npy",
          "--lse", "@lse.npy", "--causal", "--grad-output", "@do.npy", "--grad-dir", "@gd",
          NULL}},
        {.name = "train",
         .args = {"train", "--steps", "2", "--layers", "1", "--heads", "2", "--d-model", "8",
          "--context", "8", "--vocab", "8", "--batch", "2", "--eval", "2", "--log-every", "1",
          "--threads", "1", "--save", "@model.safetensors", NULL},
         .timed = true},
    };
    size_t total = 0, count = sizeof cases / sizeof cases[0];
    printf("the attn command, each library allocation failed in turn:\n");
    for (size_t i = 0; i < count; i++) total += sweep(&cases[i], &inputs);
    printf("  %zu command lines, %zu allocations swept\n", count, total);

    remove_outputs(&inputs);
    for (size_t i = 0; i < inputs.count; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", g_work, inputs.names[i]);
        unlink(path);
    }
    listing_free(&inputs);
    char path[128];
    snprintf(path, sizeof path, "%s/stdout", g_capture);
    unlink(path);
    snprintf(path, sizeof path, "%s/stderr", g_capture);
    unlink(path);
    rmdir(g_capture);
    rmdir(g_work);
    return check_summary();
}
