/*
 * test_pretrain.c — the pretraining run's contracts in C (the numbers
 * against the book are tests/train/test_pretrain_vs_book.py's), on a tiny
 * GPTModel over data/the-verdict.txt with GPT-2's tokenizer:
 *   - the events in the book's order (STEP; EVAL when global_step %
 *     eval_freq == 0; SAMPLE after each epoch's last step; DONE, repeated);
 *   - save + resume at many points (mid-epoch, with an EVAL due, after an
 *     epoch, after DONE with more epochs) into a run made from other seeds:
 *     the later events bit for bit the uninterrupted run's;
 *   - every refusal of _new and _resume as a value, with a message naming
 *     the values, nothing changed; a loss that turns NaN;
 *   - the generator's and the optimizer's state round trips;
 *   - a save whose state file cannot be written whole (a file size limit
 *     between the model's size and the state's) leaves the last pair as it
 *     was, resumable: the model is not put in place alone; nor does one
 *     whose state cannot be renamed into place after the model was (the
 *     model is put back, byte for byte);
 *   - a sample that fits the context (generated with a KV cache) is the
 *     text generate_text_simple's recomputation of every position gives,
 *     with the model's weights after the epoch.
 * The seed is fresh each run (ATTN_TEST_SEED repeats one).
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"
#include "train/model.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef ATTN_TEST_DATA_DIR
#error "ATTN_TEST_DATA_DIR (the repository's data/) must be defined"
#endif

/* rename as the C library's, except that it fails (EIO) for a destination
 * ending in fail_rename_suffix: the test's way to make a commit fail after
 * every write succeeded. The library, linked in statically, calls this one. */
static const char *fail_rename_suffix;
/* and, when set, for every rename to a destination ending in it after the
 * first: the model's commit goes through, putting the old model back fails */
static const char *fail_again_suffix;
static int renames_to_again;

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = suffix ? strlen(suffix) : 0;
    return k && n >= k && strcmp(s + n - k, suffix) == 0;
}

int rename(const char *from, const char *to) {
    if (ends_with(to, fail_rename_suffix) ||
        (ends_with(to, fail_again_suffix) && renames_to_again++ > 0)) {
        errno = EIO;
        return -1;
    }
    return renameat(AT_FDCWD, from, AT_FDCWD, to);
}

/* The whole file at path (malloc'd, *size bytes), or NULL. */
static unsigned char *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct stat st;
    unsigned char *buf = fstat(fileno(f), &st) == 0 ? malloc((size_t)st.st_size + 1) : NULL;
    *size = buf ? fread(buf, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    return buf;
}

static const attn_gpt_config TINY = {.vocab_size = 50257, .context_length = 8, .emb_dim = 8,
                                     .n_heads = 2, .n_layers = 1, .drop_rate = 0.1,
                                     .qkv_bias = false};

static char *read_text(const char *path, size_t *length) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 16);
    size_t n = buf ? fread(buf, 1, 1 << 16, f) : 0;
    fclose(f);
    *length = n;
    return buf;
}

typedef struct fixture {
    attn_ctx *ctx;
    attn_tokenizer *tok;
    char *text;
    size_t length;
} fixture;

/* A model and generator as torch.manual_seed(seed); GPTModel(cfg) leaves them. */
typedef struct runner {
    attn_rng *rng;
    attn_model *model;
    attn_pretrain *run;
} runner;

static attn_pretrain_options small_options(void) {
    attn_pretrain_options o = attn_pretrain_defaults();
    o.epochs = 2;
    o.batch_size = 4;
    o.stride = 128;
    o.eval_freq = 3;
    o.eval_iter = 2;
    o.sample_tokens = 6;
    return o;
}

static attn_status runner_new_of(fixture *f, const attn_gpt_config *cfg, uint64_t seed,
                                 const attn_pretrain_options *o, runner *r) {
    *r = (runner){0};
    attn_status st = attn_rng_new(f->ctx, seed, &r->rng);
    if (st == ATTN_OK) st = attn_model_new_gpt(f->ctx, cfg, r->rng, &r->model);
    if (st == ATTN_OK)
        st = attn_pretrain_new(f->ctx, r->model, f->tok, f->text, f->length, o, r->rng, &r->run);
    return st;
}

static attn_status runner_new(fixture *f, uint64_t seed, const attn_pretrain_options *o,
                              runner *r) {
    return runner_new_of(f, &TINY, seed, o, r);
}

static void runner_free(runner *r) {
    attn_pretrain_free(r->run);
    attn_model_free(r->model);
    attn_rng_free(r->rng);
}

typedef struct recorded {
    attn_pretrain_event_kind kind;
    size_t epoch, step;
    uint64_t tokens_seen;
    double step_loss, train_loss, val_loss;
    char sample[512];
} recorded;

static void record(recorded *out, const attn_pretrain_event *ev) {
    *out = (recorded){.kind = ev->kind, .epoch = ev->epoch, .step = ev->step,
                      .tokens_seen = ev->tokens_seen, .step_loss = ev->step_loss,
                      .train_loss = ev->train_loss, .val_loss = ev->val_loss};
    if (ev->kind == ATTN_PRETRAIN_SAMPLE) {
        size_t n = ev->sample_length < sizeof out->sample - 1 ? ev->sample_length
                                                              : sizeof out->sample - 1;
        memcpy(out->sample, ev->sample, n);
    }
}

/* Equal bit for bit (NaN equal to NaN of the same bits). */
static bool same_double(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static bool same_event(const recorded *a, const recorded *b) {
    return a->kind == b->kind && a->epoch == b->epoch && a->step == b->step &&
           a->tokens_seen == b->tokens_seen && same_double(a->step_loss, b->step_loss) &&
           same_double(a->train_loss, b->train_loss) && same_double(a->val_loss, b->val_loss) &&
           strcmp(a->sample, b->sample) == 0;
}

enum { MAX_EVENTS = 400 };

/* Events up to and including the first DONE. */
static size_t run_all(attn_pretrain *run, recorded *out, size_t from) {
    size_t n = from;
    attn_pretrain_event ev;
    while (n < MAX_EVENTS && attn_pretrain_next(run, &ev) == ATTN_OK) {
        record(&out[n++], &ev);
        if (ev.kind == ATTN_PRETRAIN_DONE) break;
    }
    return n;
}

static void test_order(fixture *f, uint64_t seed, recorded *all, size_t *count) {
    attn_pretrain_options o = small_options();
    runner r;
    CHECK_STATUS(runner_new(f, seed, &o, &r), ATTN_OK);
    size_t n = run_all(r.run, all, 0);
    *count = n;
    size_t steps = 0, spe = 0, expect_step = 0;
    bool ok = n > 0 && all[n - 1].kind == ATTN_PRETRAIN_DONE;
    attn_pretrain_event ev;
    for (size_t i = 0; i < n && ok; i++) {
        const recorded *e = &all[i];
        if (e->kind == ATTN_PRETRAIN_STEP) {
            ok = e->step == expect_step++ && isfinite(e->step_loss) &&
                 e->tokens_seen == (uint64_t)(e->step + 1) * o.batch_size * TINY.context_length;
            steps++;
            /* an EVAL follows exactly the steps due one */
            bool due = e->step % o.eval_freq == 0;
            ok = ok && i + 1 < n && (all[i + 1].kind == ATTN_PRETRAIN_EVAL) == due;
        } else if (e->kind == ATTN_PRETRAIN_EVAL) {
            ok = isfinite(e->train_loss) && isfinite(e->val_loss) && e->step == all[i - 1].step;
        } else if (e->kind == ATTN_PRETRAIN_SAMPLE) {
            if (!spe) spe = steps;
            ok = steps == spe * e->epoch &&
                 strncmp(e->sample, "Every effort moves you", 22) == 0 &&
                 strlen(e->sample) > 22;
        }
    }
    CHECK(ok);
    CHECK(spe > 0 && steps == 2 * spe);
    /* DONE again, and again */
    CHECK_STATUS(attn_pretrain_next(r.run, &ev), ATTN_OK);
    CHECK(ev.kind == ATTN_PRETRAIN_DONE && ev.total_steps == 2 * spe && ev.epoch == 2);
    size_t hist = 0;
    const double *train = NULL, *val = NULL;
    const uint64_t *tokens = NULL;
    CHECK_STATUS(attn_pretrain_history(r.run, &hist, &tokens, &train, &val), ATTN_OK);
    size_t evals = 0;
    for (size_t i = 0; i < n; i++) evals += all[i].kind == ATTN_PRETRAIN_EVAL;
    CHECK(hist == evals);
    for (size_t i = 0, k = 0; i < n && hist == evals; i++)
        if (all[i].kind == ATTN_PRETRAIN_EVAL) {
            CHECK(train[k] == all[i].train_loss && val[k] == all[i].val_loss &&
                  tokens[k] == all[i].tokens_seen);
            k++;
        }
    runner_free(&r);
    printf("  events: %zu steps (%zu per epoch), %zu evaluations, 2 samples, DONE\n", steps, spe,
           evals);
}

/* Save after `at` events, resume into a run made from another seed. */
static void check_resume_at(fixture *f, uint64_t seed, const recorded *all, size_t count,
                            size_t at, const char *path, size_t epochs_after) {
    attn_pretrain_options o = small_options();
    runner a, b;
    recorded got[MAX_EVENTS];
    CHECK_STATUS(runner_new(f, seed, &o, &a), ATTN_OK);
    size_t n = 0;
    attn_pretrain_event ev;
    for (; n < at; n++) {
        CHECK_STATUS(attn_pretrain_next(a.run, &ev), ATTN_OK);
        record(&got[n], &ev);
    }
    CHECK_STATUS(attn_pretrain_save(a.run, path), ATTN_OK);
    runner_free(&a);
    o.epochs = epochs_after;
    CHECK_STATUS(runner_new(f, seed + 1, &o, &b), ATTN_OK);
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_OK);
    size_t end = run_all(b.run, got, n);
    bool same = true;
    if (epochs_after == 2) {
        same = end == count;
        for (size_t i = at; same && i < count; i++) same = same_event(&got[i], &all[i]);
    }
    CHECK(same);
    if (!same) fprintf(stderr, "  resume after %zu events: the events differ\n", at);
    runner_free(&b);
}

static void test_resume(fixture *f, uint64_t seed, const recorded *all, size_t count,
                        const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
    /* the points: the first step, an EVAL due, mid-epoch, each SAMPLE, DONE */
    size_t points[8], n = 0;
    points[n++] = 1;
    for (size_t i = 0; i < count && n < 6; i++)
        if (all[i].kind == ATTN_PRETRAIN_SAMPLE || (all[i].kind == ATTN_PRETRAIN_STEP &&
                                                    all[i].step == 3))
            points[n++] = i + 1;
    points[n++] = count / 2;
    for (size_t k = 0; k < n; k++) check_resume_at(f, seed, all, count, points[k], path, 2);

    /* a finished 1-epoch run resumed for 2 epochs is the 2-epoch run */
    attn_pretrain_options o = small_options();
    o.epochs = 1;
    runner a, b;
    recorded got[MAX_EVENTS];
    CHECK_STATUS(runner_new(f, seed, &o, &a), ATTN_OK);
    size_t first = run_all(a.run, got, 0);
    CHECK_STATUS(attn_pretrain_save(a.run, path), ATTN_OK);
    runner_free(&a);
    o.epochs = 2;
    CHECK_STATUS(runner_new(f, seed + 7, &o, &b), ATTN_OK);
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_OK);
    size_t end = run_all(b.run, got, first - 1); /* over the first run's DONE */
    bool same = end == count;
    for (size_t i = 0; same && i < count; i++) same = same_event(&got[i], &all[i]);
    CHECK(same);
    size_t hist = 0;
    CHECK_STATUS(attn_pretrain_history(b.run, &hist, NULL, NULL, NULL), ATTN_OK);
    size_t evals = 0;
    for (size_t i = 0; i < count; i++) evals += all[i].kind == ATTN_PRETRAIN_EVAL;
    CHECK(hist == evals);
    runner_free(&b);
    printf("  resume at %zu points and past a finished epoch: the same events bit for bit\n",
           n);
}

static void copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    char buf[1 << 15];
    size_t got;
    while (in && out && (got = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, got, out);
    if (in) fclose(in);
    if (out) fclose(out);
}

static void flip_byte(const char *path, long at) {
    FILE *fp = fopen(path, "r+b");
    if (!fp) return;
    fseek(fp, at, at < 0 ? SEEK_END : SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, -1, SEEK_CUR);
    fputc(c ^ 0x10, fp);
    fclose(fp);
}

/* The state file at from with the little-endian value of width bytes put
 * at byte at, written to to with its checksum (FNV-1a over every byte but
 * the last 8) made right again: a forged state, which only the checks of
 * its contents can refuse. Returns the value that was there. */
static uint64_t forge_state(const char *from, const char *to, size_t at, uint64_t value,
                            int width) {
    FILE *in = fopen(from, "rb");
    long size = in && fseek(in, 0, SEEK_END) == 0 ? ftell(in) : -1;
    unsigned char *buf = size > 0 ? malloc((size_t)size) : NULL;
    size_t n = buf && fseek(in, 0, SEEK_SET) == 0 ? fread(buf, 1, (size_t)size, in) : 0;
    if (in) fclose(in);
    CHECK(n == (size_t)size && n > at + (size_t)width + 8);
    if (!(n == (size_t)size && n > at + (size_t)width + 8)) {
        free(buf);
        return 0;
    }
    uint64_t old = 0;
    for (int i = 0; i < width; i++) {
        old |= (uint64_t)buf[at + (size_t)i] << (8 * i);
        buf[at + (size_t)i] = (unsigned char)(value >> (8 * i));
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i + 8 < n; i++) h = (h ^ buf[i]) * 0x100000001b3ull;
    for (int i = 0; i < 8; i++) buf[n - 8 + (size_t)i] = (unsigned char)(h >> (8 * i));
    FILE *out = fopen(to, "wb");
    if (out) {
        fwrite(buf, 1, n, out);
        fclose(out);
    }
    free(buf);
    return old;
}

/* The safetensors file at from written to to with every tensor in BF16
 * (each float's top half), its metadata kept: what a checkpoint converted
 * with .to(torch.bfloat16) and saved again holds. */
static void write_bf16_copy(attn_ctx *ctx, const char *from, const char *to) {
    attn_safetensors *st = NULL;
    CHECK_STATUS(attn_safetensors_open(ctx, from, &st), ATTN_OK);
    if (!st) return;
    size_t n = attn_safetensors_count(st), header_cap = 1 << 16, used = 0, data_bytes = 0;
    char *header = malloc(header_cap);
    CHECK(header != NULL);
    if (!header) {
        attn_safetensors_free(st);
        return;
    }
    used += (size_t)snprintf(header + used, header_cap - used, "{\"__metadata__\":{");
    for (size_t i = 0; i < attn_safetensors_metadata_count(st); i++) {
        attn_metadata_entry e;
        CHECK_STATUS(attn_safetensors_metadata_at(st, i, &e), ATTN_OK);
        used += (size_t)snprintf(header + used, header_cap - used, "%s\"%s\":\"%s\"",
                                 i ? "," : "", e.key, e.value);
    }
    used += (size_t)snprintf(header + used, header_cap - used, "}");
    for (size_t i = 0; i < n; i++) {
        attn_safetensors_info info;
        CHECK_STATUS(attn_safetensors_info_at(st, i, &info), ATTN_OK);
        used += (size_t)snprintf(header + used, header_cap - used,
                                 ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[", info.name);
        for (size_t d = 0; d < info.ndim; d++)
            used += (size_t)snprintf(header + used, header_cap - used, "%s%zu", d ? "," : "",
                                     info.shape[d]);
        used += (size_t)snprintf(header + used, header_cap - used,
                                 "],\"data_offsets\":[%zu,%zu]}", data_bytes,
                                 data_bytes + 2 * info.numel);
        data_bytes += 2 * info.numel;
    }
    used += (size_t)snprintf(header + used, header_cap - used, "}");
    CHECK(used < header_cap);
    while (used % 8 != 0 && used + 1 < header_cap) header[used++] = ' ';
    FILE *out = fopen(to, "wb");
    CHECK(out != NULL);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)used >> (8 * i));
    if (out) {
        fwrite(len, 1, 8, out);
        fwrite(header, 1, used, out);
    }
    for (size_t i = 0; out && i < n; i++) {
        attn_safetensors_info info;
        CHECK_STATUS(attn_safetensors_info_at(st, i, &info), ATTN_OK);
        float *x = malloc((info.numel ? info.numel : 1) * sizeof *x);
        CHECK(x != NULL);
        if (!x) break;
        CHECK_STATUS(attn_safetensors_load(st, info.index, x, info.numel), ATTN_OK);
        for (size_t k = 0; k < info.numel; k++) {
            uint32_t bits;
            memcpy(&bits, &x[k], sizeof bits);
            unsigned char half[2] = {(unsigned char)(bits >> 16), (unsigned char)(bits >> 24)};
            fwrite(half, 1, 2, out);
        }
        free(x);
    }
    if (out) fclose(out);
    free(header);
    attn_safetensors_free(st);
}

/* Byte offsets in a state file (pretrain.c's order): after the header's
 * twelve 8-byte fields the model's architecture (for TINY, a GPT: a count,
 * then ten fields of a 4-byte name length, the name and a double; the
 * names 109 bytes in all), then the position, the loader order, the
 * generator. */
enum {
    STATE_ARCH = 108,
    STATE_PHASE = STATE_ARCH + 4 + 10 * (4 + 8) + 109,
    STATE_BATCH = STATE_PHASE + 12,
    STATE_BEGUN = STATE_PHASE + 20,
    STATE_WINDOWS = STATE_PHASE + 48
};

/* A runner whose model is in eval mode with gradients off (as a caller
 * leaves it after evaluating it) when its run is made. */
static void runner_new_in_eval(fixture *f, uint64_t seed, const attn_pretrain_options *o,
                               runner *r) {
    *r = (runner){0};
    CHECK_STATUS(attn_rng_new(f->ctx, seed, &r->rng), ATTN_OK);
    CHECK_STATUS(attn_model_new_gpt(f->ctx, &TINY, r->rng, &r->model), ATTN_OK);
    CHECK_STATUS(attn_model_set_training(r->model, false), ATTN_OK);
    CHECK_STATUS(attn_model_set_grad_enabled(r->model, false), ATTN_OK);
    CHECK_STATUS(attn_pretrain_new(f->ctx, r->model, f->tok, f->text, f->length, o, r->rng,
                                   &r->run),
                 ATTN_OK);
}

/* train_model_simple's steps run in training mode with gradients whatever
 * mode the model came in: a fresh run, and a run resumed in the middle of
 * an epoch (where no epoch's beginning sets the mode), give the events of
 * the run made from a model as GPTModel(cfg) leaves it. */
static void test_model_in_eval_mode(fixture *f, uint64_t seed, const recorded *all, size_t count,
                                    const char *dir) {
    attn_pretrain_options o = small_options();
    runner r;
    recorded got[MAX_EVENTS];
    runner_new_in_eval(f, seed, &o, &r);
    size_t n = run_all(r.run, got, 0);
    bool same = n == count;
    for (size_t i = 0; same && i < n; i++) same = same_event(&got[i], &all[i]);
    CHECK(same);
    runner_free(&r);

    /* saved after the step of global_step 4 (mid-epoch: not due an EVAL) */
    size_t at = 0;
    while (at < count && !(all[at].kind == ATTN_PRETRAIN_STEP && all[at].step == 4)) at++;
    CHECK(at < count && all[at].epoch == 1 && all[at + 1].kind == ATTN_PRETRAIN_STEP);
    char path[512];
    snprintf(path, sizeof path, "%s/eval_mode.safetensors", dir);
    runner a, b;
    CHECK_STATUS(runner_new(f, seed, &o, &a), ATTN_OK);
    attn_pretrain_event ev;
    for (size_t i = 0; i <= at; i++) CHECK_STATUS(attn_pretrain_next(a.run, &ev), ATTN_OK);
    CHECK_STATUS(attn_pretrain_save(a.run, path), ATTN_OK);
    runner_free(&a);
    runner_new_in_eval(f, seed + 1, &o, &b);
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_OK);
    n = run_all(b.run, got, at + 1);
    same = n == count;
    for (size_t i = at + 1; same && i < n; i++) same = same_event(&got[i], &all[i]);
    CHECK(same);
    runner_free(&b);
    printf("  a model in eval mode with gradients off: fresh and resumed mid-epoch, the "
           "events of the run from a new model\n");
}

static void test_resume_refusals(fixture *f, uint64_t seed, const char *dir) {
    char path[512], other[512], state[600], other_state[600];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    snprintf(other, sizeof other, "%s/b.safetensors", dir);
    snprintf(state, sizeof state, "%s.state", path);
    snprintf(other_state, sizeof other_state, "%s.state", other);
    attn_pretrain_options o = small_options();
    runner a, b;
    attn_pretrain_event ev;
    CHECK_STATUS(runner_new(f, seed, &o, &a), ATTN_OK);
    CHECK_STATUS(attn_pretrain_next(a.run, &ev), ATTN_OK);
    CHECK_STATUS(attn_pretrain_save(a.run, path), ATTN_OK);
    CHECK_STATUS(attn_pretrain_next(a.run, &ev), ATTN_OK);
    CHECK_STATUS(attn_pretrain_next(a.run, &ev), ATTN_OK);
    CHECK_STATUS(attn_pretrain_save(a.run, other), ATTN_OK);
    runner_free(&a);

    /* another batch_size: refused, naming both */
    o.batch_size = 2;
    CHECK_STATUS(runner_new(f, seed, &o, &b), ATTN_OK);
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_ERR_INVALID);
    CHECK_MESSAGE(f->ctx, "batch_size is 4, this run's 2");
    runner_free(&b);
    o.batch_size = 4;

    /* the checkpoint's metadata edited to another dropout rate (the same
     * length, the tensors in place) and a model made as that metadata
     * says, as attn pretrain --resume makes it: the metadata agrees with
     * the model, the weights with the state's hash, and only the state
     * knows the run's rate. Refused by name, the weights as they were */
    char edited[600], edited_state[700];
    snprintf(edited, sizeof edited, "%s/edited.safetensors", dir);
    snprintf(edited_state, sizeof edited_state, "%s.state", edited);
    size_t size = 0;
    unsigned char *bytes = read_all(path, &size);
    const char *rate = "\"drop_rate\":\"0.10000000000000001\"";
    unsigned char *at = NULL;
    for (size_t i = 0; bytes && !at && i + strlen(rate) <= size; i++)
        if (memcmp(bytes + i, rate, strlen(rate)) == 0) at = bytes + i;
    CHECK(at != NULL);
    if (at) {
        memcpy(at, "\"drop_rate\":\"0.20000000000000001\"", strlen(rate));
        FILE *out = fopen(edited, "wb");
        CHECK(out && fwrite(bytes, 1, size, out) == size);
        if (out) fclose(out);
        copy_file(state, edited_state);
        attn_gpt_config other_rate = TINY;
        other_rate.drop_rate = 0.2;
        CHECK_STATUS(runner_new_of(f, &other_rate, seed, &o, &b), ATTN_OK);
        attn_param w;
        CHECK_STATUS(attn_model_param_at(b.model, 1, &w), ATTN_OK);
        float kept = w.data[3];
        CHECK_STATUS(attn_pretrain_resume(b.run, edited), ATTN_ERR_INVALID);
        CHECK_MESSAGE(f->ctx, "saved with drop_rate 0.1, this run's model has 0.2");
        CHECK(w.data[3] == kept);
        runner_free(&b);
    }
    free(bytes);

    CHECK_STATUS(runner_new(f, seed + 3, &o, &b), ATTN_OK);
    attn_param p;
    CHECK_STATUS(attn_model_param_at(b.model, 0, &p), ATTN_OK);
    float before = p.data[5];
    /* a model from one save and a state from another */
    copy_file(other_state, state);
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_ERR_INVALID);
    CHECK_MESSAGE(f->ctx, "is not the model");
    CHECK(p.data[5] == before);
    /* its own state, but the model converted to bf16: refused, naming the
     * dtype that changed the weights */
    copy_file(other_state, state);
    write_bf16_copy(f->ctx, other, path);
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_ERR_INVALID);
    CHECK_MESSAGE(f->ctx, "as BF16, where attn_pretrain_save writes F32");
    CHECK(p.data[5] == before);
    /* a damaged state */
    copy_file(other_state, state);
    flip_byte(state, 100);
    CHECK_STATUS(attn_pretrain_resume(b.run, other), ATTN_OK); /* its own pair still loads */
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(f->ctx, "damaged");
    /* forged states, their checksums right: a position no run stops at (a
     * step past the epoch's last batch read the loader order past its
     * end), a generator's bytes it cannot hold and an optimizer step
     * count it cannot take (each refused once after the weights were
     * replaced): refused before anything changes */
    before = p.data[5];
    uint64_t windows = forge_state(other_state, state, STATE_WINDOWS, 0, 8);
    size_t steps_per_epoch = (size_t)(windows / o.batch_size);
    forge_state(other_state, state, STATE_PHASE, 0, 4);
    forge_state(state, state, STATE_BEGUN, 1, 4);
    forge_state(state, state, STATE_BATCH, steps_per_epoch, 8);
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(f->ctx, "(the position)");
    size_t rng_next = STATE_WINDOWS + 8 + 8 * (size_t)windows + 8 + 624 * 4;
    CHECK(forge_state(other_state, state, rng_next, 100000, 4) <= 624);
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(f->ctx, "(the generator)");
    CHECK(p.data[5] == before);
    /* an optimizer step count past what its state may hold */
    size_t opt_steps_at = STATE_WINDOWS + 8 + 8 * (size_t)windows + 8 + attn_rng_state_size();
    CHECK(forge_state(other_state, state, opt_steps_at, ((uint64_t)1 << 53) + 1, 8) == 2);
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(f->ctx, "(the optimizer's size or steps)");
    CHECK(p.data[5] == before);
    /* a state that is a device: refused, not read without end */
    remove(state);
    CHECK(symlink("/dev/zero", state) == 0);
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_ERR_IO);
    CHECK_MESSAGE(f->ctx, "not a regular file");
    CHECK(p.data[5] == before);
    /* no state at all */
    remove(state);
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_ERR_IO);
    CHECK_MESSAGE(f->ctx, "a.safetensors.state");
    runner_free(&b);

    /* other text */
    fixture g = *f;
    g.length = f->length / 2;
    CHECK_STATUS(runner_new(&g, seed, &o, &b), ATTN_OK);
    CHECK_STATUS(attn_pretrain_resume(b.run, other), ATTN_ERR_INVALID);
    CHECK_MESSAGE(f->ctx, "token count");
    runner_free(&b);
    printf("  resume refuses another batch_size, an edited dropout rate, a mismatched pair, a "
           "damaged or missing state, other text\n");
}

static void expect_refused(fixture *f, const attn_gpt_config *cfg, const attn_pretrain_options *o,
                           size_t length, const char *fragment) {
    attn_rng *rng = NULL;
    attn_model *m = NULL;
    attn_pretrain *run = (attn_pretrain *)(uintptr_t)1;
    CHECK_STATUS(attn_rng_new(f->ctx, 1, &rng), ATTN_OK);
    CHECK_STATUS(attn_model_new_gpt(f->ctx, cfg, rng, &m), ATTN_OK);
    uint32_t before = 0, after = 0;
    CHECK_STATUS(attn_pretrain_new(f->ctx, m, f->tok, f->text, length, o, rng, &run),
                 ATTN_ERR_INVALID);
    CHECK(run == NULL);
    CHECK_MESSAGE(f->ctx, fragment);
    /* nothing drawn */
    attn_rng *fresh = NULL;
    CHECK_STATUS(attn_rng_new(f->ctx, 1, &fresh), ATTN_OK);
    attn_model *m2 = NULL;
    CHECK_STATUS(attn_model_new_gpt(f->ctx, cfg, fresh, &m2), ATTN_OK);
    CHECK_STATUS(attn_rng_next_u32(rng, &before), ATTN_OK);
    CHECK_STATUS(attn_rng_next_u32(fresh, &after), ATTN_OK);
    CHECK(before == after);
    attn_model_free(m2);
    attn_rng_free(fresh);
    attn_model_free(m);
    attn_rng_free(rng);
}

static void test_refusals(fixture *f) {
    attn_pretrain_options o = small_options();
    attn_pretrain_options bad;
    bad = o, bad.batch_size = 0;
    expect_refused(f, &TINY, &bad, f->length, "batch_size is 0");
    bad = o, bad.eval_freq = 0;
    expect_refused(f, &TINY, &bad, f->length, "eval_freq is 0");
    bad = o, bad.eval_iter = 0;
    expect_refused(f, &TINY, &bad, f->length, "eval_iter is 0");
    bad = o, bad.max_length = 9;
    expect_refused(f, &TINY, &bad, f->length, "max_length 9 is longer than the model's context_length 8");
    bad = o, bad.lr = 0.0;
    expect_refused(f, &TINY, &bad, f->length, "lr 0 must be");
    bad = o, bad.lr = NAN;
    expect_refused(f, &TINY, &bad, f->length, "lr nan must be");
    bad = o, bad.lr = INFINITY;
    expect_refused(f, &TINY, &bad, f->length, "lr inf must be");
    bad = o, bad.weight_decay = -0.5;
    expect_refused(f, &TINY, &bad, f->length, "weight_decay -0.5");
    bad = o, bad.train_ratio = 0.0;
    expect_refused(f, &TINY, &bad, f->length, "train_ratio 0 must be in (0, 1]");
    bad = o, bad.train_ratio = 1.5;
    expect_refused(f, &TINY, &bad, f->length, "train_ratio 1.5");
    /* the events' total_steps would wrap */
    bad = o, bad.epochs = SIZE_MAX;
    expect_refused(f, &TINY, &bad, f->length, "epochs 18446744073709551615 of");
    attn_gpt_config other_vocab = TINY;
    other_vocab.vocab_size = 50000;
    expect_refused(f, &other_vocab, &o, f->length, "vocabulary is 50257 tokens but the model's "
                                                   "vocab_size is 50000");
    /* "I HAD always thought Jack Gisburn" ... : too few windows for a batch */
    expect_refused(f, &TINY, &o, 40, "windows of max_length 8");
    /* the validation part too short for a window */
    bad = o, bad.train_ratio = 0.999;
    expect_refused(f, &TINY, &bad, f->length, "the validation text");
    printf("  _new refuses a zero batch, eval_freq or eval_iter, max_length past the context, "
           "lr 0/nan/inf, negative weight_decay, train_ratio outside (0, 1], another "
           "vocabulary, too little text\n");
}

static void test_no_validation_and_nan(fixture *f, uint64_t seed, const char *dir) {
    /* train_ratio 1: no validation part, val_loss NaN as the book's
     * calc_loss_loader gives for an empty loader */
    attn_pretrain_options o = small_options();
    o.train_ratio = 1.0;
    o.start_context = "";
    runner r;
    attn_pretrain_event ev;
    CHECK_STATUS(runner_new(f, seed, &o, &r), ATTN_OK);
    CHECK_STATUS(attn_pretrain_next(r.run, &ev), ATTN_OK);
    CHECK(ev.kind == ATTN_PRETRAIN_STEP);
    CHECK_STATUS(attn_pretrain_next(r.run, &ev), ATTN_OK);
    CHECK(ev.kind == ATTN_PRETRAIN_EVAL && isnan(ev.val_loss) && isfinite(ev.train_loss));
    /* no SAMPLE events with start_context "" */
    bool sample = false;
    while (attn_pretrain_next(r.run, &ev) == ATTN_OK && ev.kind != ATTN_PRETRAIN_DONE)
        sample |= ev.kind == ATTN_PRETRAIN_SAMPLE;
    CHECK(!sample && ev.kind == ATTN_PRETRAIN_DONE);
    runner_free(&r);

    /* a loss that is not finite stops the run, naming the step */
    o = small_options();
    o.lr = 1e30;
    CHECK_STATUS(runner_new(f, seed, &o, &r), ATTN_OK);
    attn_status st = ATTN_OK;
    size_t steps = 0;
    while ((st = attn_pretrain_next(r.run, &ev)) == ATTN_OK && ev.kind != ATTN_PRETRAIN_DONE)
        steps += ev.kind == ATTN_PRETRAIN_STEP;
    CHECK(st == ATTN_ERR_INVALID);
    char want[64];
    snprintf(want, sizeof want, "step %zu: loss is ", steps);
    CHECK_MESSAGE(f->ctx, want);
    CHECK_STATUS(attn_pretrain_next(r.run, &ev), ATTN_ERR_INVALID);
    CHECK_MESSAGE(f->ctx, want);
    char path[512];
    snprintf(path, sizeof path, "%s/failed.safetensors", dir);
    CHECK_STATUS(attn_pretrain_save(r.run, path), ATTN_ERR_INVALID);
    CHECK(access(path, F_OK) != 0);
    runner_free(&r);
    printf("  train_ratio 1: val_loss NaN; lr 1e30: \"%s...\" after %zu steps\n", want, steps);
}

static void test_state_round_trips(fixture *f, uint64_t seed) {
    attn_rng *rng = NULL;
    CHECK_STATUS(attn_rng_new(f->ctx, seed, &rng), ATTN_OK);
    float x[7];
    CHECK_STATUS(attn_rng_randn(rng, x, 1), ATTN_OK); /* a cached normal */
    size_t size = attn_rng_state_size();
    unsigned char *state = malloc(size);
    CHECK_STATUS(attn_rng_get_state(rng, state, size), ATTN_OK);
    float a[7], b[7];
    CHECK_STATUS(attn_rng_randn(rng, a, 3), ATTN_OK);
    CHECK_STATUS(attn_rng_rand(rng, a + 3, 4), ATTN_OK);
    attn_rng *other = NULL;
    CHECK_STATUS(attn_rng_new(f->ctx, seed + 1, &other), ATTN_OK);
    CHECK_STATUS(attn_rng_set_state(other, state, size), ATTN_OK);
    CHECK_STATUS(attn_rng_randn(other, b, 3), ATTN_OK);
    CHECK_STATUS(attn_rng_rand(other, b + 3, 4), ATTN_OK);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK_STATUS(attn_rng_get_state(rng, state, size - 1), ATTN_ERR_SHAPE);
    /* a Philox offset past 2^63 calls (at 2^64 - 1 the next calls wrapped
     * to a fresh generator's offsets, repeating its dropout masks) */
    CHECK_STATUS(attn_rng_get_state(rng, state, size), ATTN_OK);
    memset(state + 624 * 4 + 16, 0xff, 8);
    CHECK_STATUS(attn_rng_set_state(other, state, size), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(f->ctx, "Philox offset 18446744073709551615, past 2^63 calls");
    CHECK_STATUS(attn_rng_get_state(rng, state, size), ATTN_OK);
    state[624 * 4] = 0xff; /* the position past the 624 words */
    state[624 * 4 + 1] = 0xff;
    CHECK_STATUS(attn_rng_set_state(other, state, size), ATTN_ERR_FORMAT);
    free(state);
    attn_rng_free(other);
    attn_rng_free(rng);

    /* the optimizer: moments and step count */
    float w[3] = {1, 2, 3}, g[3] = {0.5f, -1, 2};
    attn_param p = {.name = "w", .data = w, .grad = g, .ndim = 1, .shape = {3}, .numel = 3};
    attn_optimizer_config c = attn_optimizer_defaults(ATTN_OPTIMIZER_ADAMW);
    attn_optimizer *o1 = NULL, *o2 = NULL;
    CHECK_STATUS(attn_optimizer_new(f->ctx, &c, &p, 1, &o1), ATTN_OK);
    CHECK_STATUS(attn_optimizer_step(o1), ATTN_OK);
    CHECK(attn_optimizer_state_size(o1) == 6);
    float s[6], t[6];
    size_t steps = 0;
    CHECK_STATUS(attn_optimizer_get_state(o1, s, 6, &steps), ATTN_OK);
    CHECK(steps == 1 && s[0] != 0.0f && s[3] != 0.0f);
    float w2[3] = {1, 2, 3};
    attn_param q = p;
    q.data = w2;
    CHECK_STATUS(attn_optimizer_new(f->ctx, &c, &q, 1, &o2), ATTN_OK);
    CHECK_STATUS(attn_optimizer_set_state(o2, s, 6, steps), ATTN_OK);
    memcpy(w2, w, sizeof w);
    CHECK_STATUS(attn_optimizer_step(o1), ATTN_OK);
    CHECK_STATUS(attn_optimizer_step(o2), ATTN_OK);
    CHECK(memcmp(w, w2, sizeof w) == 0 && attn_optimizer_steps(o2) == 2);
    CHECK_STATUS(attn_optimizer_get_state(o2, t, 5, &steps), ATTN_ERR_SHAPE);
    CHECK_STATUS(attn_optimizer_set_state(o2, t, 7, 1), ATTN_ERR_SHAPE);
    /* a step count past 2^53 (SIZE_MAX wrapped to 0 at the next step, and
     * the bias corrections divided by 0): refused, the state unchanged */
    CHECK_STATUS(attn_optimizer_set_state(o2, t, 6, SIZE_MAX), ATTN_ERR_INVALID);
    CHECK_MESSAGE(f->ctx, "steps 18446744073709551615 is past 2^53");
    CHECK_STATUS(attn_optimizer_set_state(o2, t, 6, ((size_t)1 << 53) + 1), ATTN_ERR_INVALID);
    CHECK(attn_optimizer_steps(o2) == 2);
    attn_optimizer_free(o1);
    attn_optimizer_free(o2);
    printf("  the generator's and AdamW's state round trip\n");
}

static void test_save_is_a_pair(fixture *f, uint64_t seed, const char *dir) {
    char path[512], state[600];
    snprintf(path, sizeof path, "%s/pair.safetensors", dir);
    snprintf(state, sizeof state, "%s.state", path);
    attn_pretrain_options o = small_options();
    runner a, b;
    attn_pretrain_event ev;
    CHECK_STATUS(runner_new(f, seed, &o, &a), ATTN_OK);
    CHECK_STATUS(attn_pretrain_next(a.run, &ev), ATTN_OK);
    CHECK_STATUS(attn_pretrain_save(a.run, path), ATTN_OK);
    struct stat model_st, state_st;
    CHECK(stat(path, &model_st) == 0 && stat(state, &state_st) == 0);
    CHECK(state_st.st_size > model_st.st_size + 4096); /* the optimizer's two moments */
    /* a step, so that the weights (and the model file) differ from the pair's */
    do CHECK_STATUS(attn_pretrain_next(a.run, &ev), ATTN_OK);
    while (ev.kind != ATTN_PRETRAIN_STEP && ev.kind != ATTN_PRETRAIN_DONE);
    CHECK(ev.kind == ATTN_PRETRAIN_STEP);
    struct rlimit old;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    struct rlimit cut = old;
    cut.rlim_cur = (rlim_t)(model_st.st_size + 4096);
    if (old.rlim_cur == RLIM_INFINITY || old.rlim_cur > cut.rlim_cur) {
        void (*kept)(int) = signal(SIGXFSZ, SIG_IGN); /* a write past the limit fails */
        CHECK(setrlimit(RLIMIT_FSIZE, &cut) == 0);
        CHECK_STATUS(attn_pretrain_save(a.run, path), ATTN_ERR_IO);
        CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
        signal(SIGXFSZ, kept);
        CHECK_MESSAGE(f->ctx, "pair.safetensors.state");
    }
    /* every byte written, the model put in place, then the state's rename
     * fails: the model goes back to the pair's, byte for byte */
    size_t model_size = 0, after_size = 0;
    unsigned char *model_bytes = read_all(path, &model_size);
    fail_rename_suffix = ".state";
    CHECK_STATUS(attn_pretrain_save(a.run, path), ATTN_ERR_IO);
    fail_rename_suffix = NULL;
    CHECK_MESSAGE(f->ctx, "pair.safetensors.state: cannot put the written file in place");
    CHECK_MESSAGE(f->ctx, "pair.safetensors is as it was)");
    unsigned char *after = read_all(path, &after_size);
    CHECK(model_bytes && after && after_size == model_size &&
          memcmp(after, model_bytes, model_size) == 0);
    free(model_bytes);
    free(after);
    DIR *listing = opendir(dir); /* no temporary, and no second link of the model, left */
    int leftovers = 0;
    for (struct dirent *e; listing && (e = readdir(listing));)
        leftovers += strncmp(e->d_name, ".pair.safetensors", 17) == 0;
    if (listing) closedir(listing);
    CHECK(listing && leftovers == 0);
    /* and where putting the old model back fails too: the new model stays,
     * and the message names the link that keeps the old one */
    fail_rename_suffix = ".state";
    fail_again_suffix = "pair.safetensors";
    renames_to_again = 0;
    CHECK_STATUS(attn_pretrain_save(a.run, path), ATTN_ERR_IO);
    fail_rename_suffix = fail_again_suffix = NULL;
    CHECK_MESSAGE(f->ctx, "pair.safetensors is new; its previous contents are kept as");
    const char *kept_at = strstr(attn_ctx_last_error(f->ctx), "kept as ");
    char kept_path[4096] = "";
    if (kept_at) snprintf(kept_path, sizeof kept_path, "%s", kept_at + 8);
    if (kept_at && strlen(kept_path)) kept_path[strlen(kept_path) - 1] = '\0'; /* its ")" */
    size_t kept_size = 0;
    unsigned char *kept_bytes = kept_at ? read_all(kept_path, &kept_size) : NULL;
    model_bytes = read_all(path, &model_size);
    CHECK(kept_bytes && model_bytes && kept_size == after_size); /* the old model, whole */
    if (kept_bytes && kept_at) CHECK(rename(kept_path, path) == 0); /* taken back */
    free(kept_bytes);
    free(model_bytes);
    runner_free(&a);
    /* the first save's pair resumes: its model's hash is its state's */
    CHECK_STATUS(runner_new(f, seed + 5, &o, &b), ATTN_OK);
    CHECK_STATUS(attn_pretrain_resume(b.run, path), ATTN_OK);
    runner_free(&b);
}

/* The epoch's sample against generate_text_simple done by hand: greedy
 * over attn_model_forward of the whole context at every step. */
static void test_sample_fits_context(fixture *f, uint64_t seed) {
    attn_gpt_config cfg = TINY;
    cfg.context_length = 40; /* "Every effort moves you" (4 tokens) + 30 fits */
    attn_pretrain_options o = small_options();
    o.epochs = 1;
    o.sample_tokens = 30;
    attn_rng *rng = NULL;
    attn_model *model = NULL;
    attn_pretrain *run = NULL;
    CHECK_STATUS(attn_rng_new(f->ctx, seed, &rng), ATTN_OK);
    CHECK_STATUS(attn_model_new_gpt(f->ctx, &cfg, rng, &model), ATTN_OK);
    CHECK_STATUS(attn_pretrain_new(f->ctx, model, f->tok, f->text, f->length, &o, rng, &run),
                 ATTN_OK);
    if (!run) return;
    attn_pretrain_event ev = {0};
    do CHECK_STATUS(attn_pretrain_next(run, &ev), ATTN_OK);
    while (ev.kind != ATTN_PRETRAIN_SAMPLE && ev.kind != ATTN_PRETRAIN_DONE);
    CHECK(ev.kind == ATTN_PRETRAIN_SAMPLE);
    char *got = strndup(ev.sample, ev.sample_length);
    int32_t ids[40];
    size_t n = 0;
    CHECK_STATUS(attn_tokenizer_encode(f->tok, "Every effort moves you", 22, ids, 40, &n),
                 ATTN_OK);
    float *logits = malloc(40 * cfg.vocab_size * sizeof *logits);
    CHECK_STATUS(attn_model_set_training(model, false), ATTN_OK);
    CHECK_STATUS(attn_model_set_grad_enabled(model, false), ATTN_OK);
    for (size_t k = 0; k < o.sample_tokens && logits; k++) {
        CHECK_STATUS(attn_model_forward(model, ids, NULL, 1, n, logits, NULL, NULL), ATTN_OK);
        const float *z = logits + (n - 1) * cfg.vocab_size;
        size_t best = 0;
        for (size_t v = 1; v < cfg.vocab_size; v++)
            if (z[v] > z[best]) best = v;
        ids[n++] = (int32_t)best;
    }
    char want[1024];
    size_t length = 0;
    CHECK_STATUS(attn_tokenizer_decode(f->tok, ids, n, want, sizeof want, &length), ATTN_OK);
    bool same = got && length == strlen(got) && memcmp(want, got, length) == 0;
    if (!same) fprintf(stderr, "sample: got \"%s\"\n  recomputed \"%.*s\"\n", got ? got : "",
                       (int)length, want);
    CHECK(same);
    printf("  a sample within the context (%zu tokens) equals the recomputed one\n", n);
    free(logits);
    free(got);
    attn_pretrain_free(run);
    attn_model_free(model);
    attn_rng_free(rng);
}

/* The memory check before AdamW's state: 16 bytes a parameter against a
 * limit, at it and one byte below it; the machine's own memory holds the
 * tiny model. */
static void test_memory_limit(fixture *f, uint64_t seed) {
    runner r;
    attn_pretrain_options o = small_options();
    CHECK_STATUS(runner_new(f, seed, &o, &r), ATTN_OK);
    const attn_param *params = NULL;
    size_t count = 0, floats = 0;
    CHECK_STATUS(attn_model_params(r.model, &params, &count), ATTN_OK);
    for (size_t i = 0; i < count; i++) floats += params[i].numel;
    CHECK(floats > 0);
    CHECK_STATUS(attn_training_fits_memory(f->ctx, "who", params, count, 16 * floats), ATTN_OK);
    CHECK_STATUS(attn_training_fits_memory(f->ctx, "who", params, count, 0), ATTN_OK);
    CHECK_STATUS(attn_training_fits_memory(f->ctx, "who", params, count, 16 * floats - 1),
                 ATTN_ERR_NO_MEMORY);
    char want[160];
    snprintf(want, sizeof want, "who: the model's %zu parameters, their gradients and AdamW's "
             "two moments take %zu bytes, past this machine's memory (%zu bytes)", floats,
             16 * floats, 16 * floats - 1);
    CHECK_MESSAGE(f->ctx, want);
    runner_free(&r);
    printf("  _new refuses a model whose weights, gradients and moments pass the memory\n");
}

int main(void) {
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16);
    const char *env = getenv("ATTN_TEST_SEED");
    if (env && *env) seed = strtoull(env, NULL, 10);
    seed %= 1000000007u;
    printf("test_pretrain seed %llu (ATTN_TEST_SEED=%llu repeats it)\n",
           (unsigned long long)seed, (unsigned long long)seed);
    fixture f = {0};
    attn_ctx_config cc = {.num_threads = 2};
    if (attn_ctx_new(&cc, &f.ctx) != ATTN_OK) return 1;
    f.text = read_text(ATTN_TEST_DATA_DIR "/the-verdict.txt", &f.length);
    CHECK(f.text != NULL && f.length > 20000);
    CHECK_STATUS(attn_tokenizer_load(f.ctx, ATTN_TEST_DATA_DIR "/gpt2-bpe", &f.tok), ATTN_OK);
    char dir[] = "/tmp/attn_test_pretrain_XXXXXX";
    if (!f.text || !f.tok || !mkdtemp(dir)) return 1;

    static recorded all[MAX_EVENTS];
    size_t count = 0;
    test_order(&f, seed, all, &count);
    test_resume(&f, seed, all, count, dir);
    test_model_in_eval_mode(&f, seed, all, count, dir);
    test_resume_refusals(&f, seed, dir);
    test_refusals(&f);
    test_no_validation_and_nan(&f, seed, dir);
    test_state_round_trips(&f, seed);
    test_save_is_a_pair(&f, seed, dir);
    test_sample_fits_context(&f, seed);
    test_memory_limit(&f, seed);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    attn_tokenizer_free(f.tok);
    free(f.text);
    attn_ctx_free(f.ctx);
    return check_summary();
}
