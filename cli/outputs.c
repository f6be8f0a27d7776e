/* outputs.c — a command's output files, written as one (outputs.h). */
#define _POSIX_C_SOURCE 200809L
#include "outputs.h"

#include "cli.h"
#include "interrupt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct cli_output {
    const char *opt;
    char *path;
    attn_file *file;
    /* A copy of the file's temporary path, tracked (interrupt.h) while the
     * temporary exists: a signal that ends the process removes it. */
    char *temp;
    /* Identity: the directory's device and inode with the file's name, and
     * the file's own when it exists (a hard or symbolic link to it). */
    dev_t dir_dev, dev;
    ino_t dir_ino, ino;
    const char *base;
    bool exists;
    char summary[96];
};

void cli_outputs_init(cli_outputs *out, attn_ctx *ctx) { *out = (cli_outputs){.ctx = ctx}; }

int cli_outputs_dir(cli_outputs *out, const char *opt, const char *dir) {
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return CLI_OK;
        return cli_usage_error("%s: '%s' exists and is not a directory", opt, dir);
    }
    out->made_dir = malloc(strlen(dir) + 1);
    if (!out->made_dir) return cli_failure("out of memory for a path");
    strcpy(out->made_dir, dir);
    /* made and tracked as one: a signal that ends the process removes it */
    cli_interrupt_hold();
    int made = mkdir(dir, 0777), saved = errno;
    if (made == 0) cli_interrupt_track_dir(out->made_dir);
    cli_interrupt_release();
    if (made != 0) {
        free(out->made_dir);
        out->made_dir = NULL;
        return cli_usage_error("%s: cannot create directory '%s': %s", opt, dir,
                               strerror(saved));
    }
    return CLI_OK;
}

/* The directory part of path ("." for none) into buf, or false if too long. */
static bool parent_of(const char *path, char *buf, size_t size) {
    const char *slash = strrchr(path, '/');
    size_t n = !slash ? 0 : slash == path ? 1 : (size_t)(slash - path);
    if (n + 2 > size) return false;
    if (n == 0) buf[n++] = '.';
    else memcpy(buf, path, n);
    buf[n] = '\0';
    return true;
}

int cli_outputs_add(cli_outputs *out, const char *opt, const char *path, size_t *index) {
    if (!*path) return cli_usage_error("%s: the path is empty", opt);
    if (out->count == out->cap) {
        size_t cap = out->cap ? 2 * out->cap : 8;
        cli_output *items = realloc(out->items, cap * sizeof *items);
        if (!items) return cli_failure("out of memory for the outputs");
        out->items = items;
        out->cap = cap;
    }
    cli_output *o = &out->items[out->count];
    *o = (cli_output){.opt = opt};
    char dir[4096];
    struct stat st;
    if (*path && parent_of(path, dir, sizeof dir) && stat(dir, &st) == 0) {
        o->dir_dev = st.st_dev;
        o->dir_ino = st.st_ino;
    }
    const char *slash = strrchr(path, '/');
    o->base = slash ? slash + 1 : path;
    bool found = stat(path, &st) == 0;
    o->exists = found && S_ISREG(st.st_mode);
    /* Something else that exists (a FIFO, a terminal, a device) is written in
     * place, with no temporary to track: it is opened with the signals free,
     * as opening a FIFO waits for its reader, and Ctrl-C must end that wait. */
    bool hold = !found || S_ISREG(st.st_mode);
    if (o->exists) o->dev = st.st_dev, o->ino = st.st_ino;
    for (size_t i = 0; i < out->count; i++) {
        const cli_output *p = &out->items[i];
        bool same = (o->exists && p->exists && o->dev == p->dev && o->ino == p->ino) ||
                    (o->dir_dev == p->dir_dev && o->dir_ino == p->dir_ino &&
                     strcmp(o->base, p->base) == 0);
        if (same)
            return cli_usage_error("%s: '%s' is also written by %s ('%s'): give each output "
                                   "its own file",
                                   opt, path, p->opt, p->path);
    }
    o->path = malloc(strlen(path) + 1);
    if (!o->path) return cli_failure("out of memory for a path");
    strcpy(o->path, path);
    /* The temporary is made and tracked as one: no signal falls between. */
    if (hold) cli_interrupt_hold();
    if (attn_file_open(out->ctx, path, &o->file) != ATTN_OK) {
        if (hold) cli_interrupt_release();
        free(o->path);
        return cli_library_error(out->ctx, opt);
    }
    const char *temp = attn_file_temporary_path(o->file);
    if (temp) {
        o->temp = malloc(strlen(temp) + 1);
        if (o->temp) strcpy(o->temp, temp);
        if (!o->temp || !cli_interrupt_track(o->temp)) {
            attn_file_discard(o->file);
            if (hold) cli_interrupt_release();
            free(o->temp);
            free(o->path);
            return cli_failure("out of memory for a path");
        }
    }
    if (hold) cli_interrupt_release();
    o->base = o->path + (o->base - path);
    *index = out->count++;
    return CLI_OK;
}

int cli_outputs_add_in_dir(cli_outputs *out, const char *opt, const char *dir, const char *name,
                           size_t *index) {
    size_t len = strlen(dir) + strlen(name) + 6;
    char *path = malloc(len);
    if (!path) return cli_failure("out of memory for a path");
    /* "DIR/" is joined as "DIR/NAME.npy": the path the command names has
     * no "//" */
    bool slash = *dir && dir[strlen(dir) - 1] == '/';
    snprintf(path, len, "%s%s%s.npy", dir, slash ? "" : "/", name);
    int rc = cli_outputs_add(out, opt, path, index);
    free(path);
    return rc;
}

int cli_outputs_not_input(cli_outputs *out, const char *in_opt, const char *in_path) {
    struct stat st;
    if (!in_path || stat(in_path, &st) != 0) return CLI_OK; /* reading it says what is wrong */
    for (size_t i = 0; i < out->count; i++) {
        const cli_output *o = &out->items[i];
        if (o->exists && o->dev == st.st_dev && o->ino == st.st_ino)
            return cli_usage_error("%s: '%s' is the input %s ('%s'): write the output to "
                                   "another file",
                                   o->opt, o->path, in_opt, in_path);
    }
    return CLI_OK;
}

static void format_summary(char *buf, size_t size, size_t rank, const size_t *shape) {
    size_t used = (size_t)snprintf(buf, size, rank ? "" : "scalar");
    for (size_t i = 0; i < rank && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, i ? "x%zu" : "%zu", shape[i]);
    if (used < size) snprintf(buf + used, size - used, " float32");
}

int cli_outputs_npy(cli_outputs *out, size_t index, const float *data, size_t rank,
                    const size_t *shape) {
    cli_output *o = &out->items[index];
    if (attn_npy_write_file(out->ctx, o->file, data, rank, shape) != ATTN_OK)
        return cli_library_error(out->ctx, o->opt);
    format_summary(o->summary, sizeof o->summary, rank, shape);
    return CLI_OK;
}

attn_file *cli_outputs_file(cli_outputs *out, size_t index, const char *summary) {
    cli_output *o = &out->items[index];
    snprintf(o->summary, sizeof o->summary, "%s", summary ? summary : "");
    return o->file;
}

int cli_outputs_close(cli_outputs *out) {
    for (size_t i = 0; i < out->count; i++)
        if (attn_file_close(out->ctx, out->items[i].file) != ATTN_OK)
            return cli_library_error(out->ctx, out->items[i].opt);
    return CLI_OK;
}

int cli_outputs_commit(cli_outputs *out, bool quiet) {
    /* Every output complete and durable before the first is put in place. */
    int rc = cli_outputs_close(out);
    if (rc != CLI_OK) return rc;
    /* a command whose printing failed fails: it leaves no file new or changed */
    if (out->count > 0 && !cli_stdout_flushed()) return CLI_FAILED;
    /* Put in place with the signals held: a signal finds either no output
     * or all of them in place. */
    cli_interrupt_hold();
    for (size_t i = 0; i < out->count; i++) {
        cli_output *o = &out->items[i];
        attn_status s = attn_file_commit(out->ctx, o->file);
        o->file = NULL;
        cli_interrupt_untrack(o->temp);
        free(o->temp);
        o->temp = NULL;
        if (s != ATTN_OK) {
            cli_interrupt_release();
            return cli_library_error(out->ctx, o->opt);
        }
        out->committed = true;
    }
    cli_interrupt_release();
    if (quiet || out->count == 0) return CLI_OK;
    size_t len = 1;
    for (size_t i = 0; i < out->count; i++)
        len += strlen(out->items[i].path) + strlen(out->items[i].summary) + 5;
    char *list = malloc(len);
    if (!list) return CLI_OK; /* the files are written; only the summary is lost */
    size_t used = 0;
    list[0] = '\0';
    for (size_t i = 0; i < out->count; i++) {
        const cli_output *o = &out->items[i];
        used += (size_t)snprintf(list + used, len - used, o->summary[0] ? "%s%s (%s)" : "%s%s",
                                 i ? ", " : "", o->path, o->summary);
    }
    cli_note("wrote %s", list);
    free(list);
    return CLI_OK;
}

void cli_outputs_free(cli_outputs *out) {
    cli_interrupt_hold();
    for (size_t i = 0; i < out->count; i++) {
        attn_file_discard(out->items[i].file);
        cli_interrupt_untrack(out->items[i].temp);
        free(out->items[i].temp);
        free(out->items[i].path);
    }
    if (out->made_dir) {
        if (!out->committed) rmdir(out->made_dir);
        cli_interrupt_track_dir(NULL);
    }
    cli_interrupt_release();
    free(out->made_dir);
    free(out->items);
    *out = (cli_outputs){0};
}
