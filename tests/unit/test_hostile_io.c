/*
 * test_hostile_io.c — every file the library writes is replaced whole or
 * not at all: a size limit (RLIMIT_FSIZE, with SIGXFSZ ignored so that the
 * write fails with EFBIG instead of killing the process) in the middle of
 * attn_npy_write, attn_safetensors_write or a group of attn_files leaves the
 * previous file byte for byte and no temporary beside it; a directory, a
 * missing parent and /dev/full fail with a message naming the path. The
 * same through a symbolic link, in a working directory deeper than PATH_MAX
 * too.
 */
#define _XOPEN_SOURCE 700
#include "attn.h"
#include "check.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[1024];

/* dir/name */
static const char *in_dir(const char *name) {
    static char paths[4][4200];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, sizeof paths[0], "%s/%s", dir, name);
    return p;
}

/* The whole file (malloc'd, *size bytes), or NULL. */
static unsigned char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *data = malloc(n > 0 ? (size_t)n : 1);
    *size = data ? fread(data, 1, (size_t)n, f) : 0;
    fclose(f);
    return data;
}

/* The number of entries in dir (without . and ..). */
static int entries(void) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static bool same_bytes(const char *path, const unsigned char *want, size_t want_size) {
    size_t size = 0;
    unsigned char *got = slurp(path, &size);
    bool same = got && size == want_size && memcmp(got, want, size) == 0;
    free(got);
    return same;
}

/* Files up to limit bytes for the calls between this and unlimit. */
static struct rlimit saved_limit;
static void limit_size(rlim_t limit) {
    getrlimit(RLIMIT_FSIZE, &saved_limit);
    struct rlimit l = saved_limit;
    l.rlim_cur = limit;
    setrlimit(RLIMIT_FSIZE, &l);
}
static void unlimit(void) { setrlimit(RLIMIT_FSIZE, &saved_limit); }

#define N_BIG (256 * 256) /* 262 kB of floats: past the 64 kB limit */

static void test_npy_over_limit(attn_ctx *ctx, const float *big) {
    const char *path = in_dir("o.npy");
    size_t shape[2] = {256, 256};
    CHECK_STATUS(attn_npy_write(ctx, path, big, 2, shape), ATTN_OK);
    size_t old_size = 0;
    unsigned char *old = slurp(path, &old_size);
    CHECK(old && old_size == 4 * N_BIG + 128);
    int before = entries();

    /* Another array of the same size, which does not fit. */
    float *other = malloc(N_BIG * sizeof *other);
    for (size_t i = 0; i < N_BIG; i++) other[i] = -big[i];
    limit_size(64 * 1024);
    attn_status s = attn_npy_write(ctx, path, other, 2, shape);
    unlimit();
    CHECK_STATUS(s, ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, path);
    CHECK_MESSAGE(ctx, strerror(EFBIG));
    CHECK(same_bytes(path, old, old_size));
    CHECK(entries() == before);

    /* Without the limit the same call replaces it. */
    CHECK_STATUS(attn_npy_write(ctx, path, other, 2, shape), ATTN_OK);
    attn_npy back;
    CHECK_STATUS(attn_npy_read(ctx, path, &back), ATTN_OK);
    CHECK(back.numel == N_BIG && back.data && memcmp(back.data, other, 4 * N_BIG) == 0);
    attn_npy_free(&back);
    CHECK(entries() == before);
    free(other);
    free(old);
}

static void test_safetensors_over_limit(attn_ctx *ctx, const float *big) {
    const char *path = in_dir("w.safetensors");
    attn_named_tensor t[2] = {{.name = "a", .data = big, .ndim = 1, .shape = {N_BIG / 2}},
                              {.name = "b", .data = big + N_BIG / 2, .ndim = 1,
                               .shape = {N_BIG / 2}}};
    CHECK_STATUS(attn_safetensors_write(ctx, path, t, 2, NULL, 0), ATTN_OK);
    size_t old_size = 0;
    unsigned char *old = slurp(path, &old_size);
    CHECK(old && old_size > 4 * N_BIG);
    int before = entries();
    t[0].name = "c"; /* a different file, as a checkpoint after training is */
    limit_size(64 * 1024);
    attn_status s = attn_safetensors_write(ctx, path, t, 2, NULL, 0);
    unlimit();
    CHECK_STATUS(s, ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, path);
    CHECK(same_bytes(path, old, old_size));
    CHECK(entries() == before);
    free(old);
}

/* Two files written as one: the second fails at its close, and neither
 * destination changes. */
static void test_group(attn_ctx *ctx, const float *big) {
    const char *a = in_dir("a.npy"), *b = in_dir("b.npy");
    size_t small_shape[1] = {4}, big_shape[1] = {N_BIG};
    CHECK_STATUS(attn_npy_write(ctx, a, big, 1, small_shape), ATTN_OK);
    CHECK_STATUS(attn_npy_write(ctx, b, big, 1, small_shape), ATTN_OK);
    size_t a_size = 0, b_size = 0;
    unsigned char *a_old = slurp(a, &a_size), *b_old = slurp(b, &b_size);
    int before = entries();

    attn_file *fa = NULL, *fb = NULL;
    CHECK_STATUS(attn_file_open(ctx, a, &fa), ATTN_OK);
    CHECK_STATUS(attn_file_open(ctx, b, &fb), ATTN_OK);
    CHECK(entries() == before + 2); /* the two temporaries */
    float neg[4] = {-1, -2, -3, -4};
    CHECK_STATUS(attn_npy_write_file(ctx, fa, neg, 1, small_shape), ATTN_OK);
    limit_size(64 * 1024);
    attn_status s = attn_npy_write_file(ctx, fb, big, 1, big_shape);
    if (s == ATTN_OK) s = attn_file_close(ctx, fb);
    unlimit();
    CHECK_STATUS(s, ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, b);
    /* The failed file only discards; the other is discarded unwritten. */
    CHECK_STATUS(attn_file_write(ctx, fb, neg, 4), ATTN_ERR_INVALID);
    attn_file_discard(fb);
    attn_file_discard(fa);
    CHECK(same_bytes(a, a_old, a_size));
    CHECK(same_bytes(b, b_old, b_size));
    CHECK(entries() == before);

    /* Closed both, committed both: both replaced. */
    CHECK_STATUS(attn_file_open(ctx, a, &fa), ATTN_OK);
    CHECK_STATUS(attn_file_open(ctx, b, &fb), ATTN_OK);
    CHECK_STATUS(attn_npy_write_file(ctx, fa, neg, 1, small_shape), ATTN_OK);
    CHECK_STATUS(attn_npy_write_file(ctx, fb, neg, 1, small_shape), ATTN_OK);
    CHECK_STATUS(attn_file_close(ctx, fa), ATTN_OK);
    CHECK_STATUS(attn_file_close(ctx, fb), ATTN_OK);
    CHECK_STATUS(attn_file_commit(ctx, fa), ATTN_OK);
    CHECK_STATUS(attn_file_commit(ctx, fb), ATTN_OK);
    attn_npy back;
    CHECK_STATUS(attn_npy_read(ctx, b, &back), ATTN_OK);
    CHECK(back.numel == 4 && back.data && back.data[3] == -4.0f);
    attn_npy_free(&back);
    CHECK(entries() == before);
    free(a_old);
    free(b_old);
}

/* Destinations that cannot be written: nothing created, the path named. */
static void test_bad_destinations(attn_ctx *ctx) {
    float x[2] = {1, 2};
    size_t shape[1] = {2};
    int before = entries();
    CHECK_STATUS(attn_npy_write(ctx, dir, x, 1, shape), ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, "is a directory");
    CHECK_STATUS(attn_npy_write(ctx, in_dir("missing/x.npy"), x, 1, shape), ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, "missing/x.npy: cannot open for writing: ");
    CHECK_MESSAGE(ctx, strerror(ENOENT));
    CHECK_STATUS(attn_npy_write(ctx, "", x, 1, shape), ATTN_ERR_INVALID);
    attn_file *f = (attn_file *)x;
    CHECK_STATUS(attn_file_open(ctx, NULL, &f), ATTN_ERR_NULL);
    CHECK(f == NULL);
    CHECK(entries() == before);
    if (access("/dev/full", W_OK) == 0) {
        CHECK_STATUS(attn_npy_write(ctx, "/dev/full", x, 1, shape), ATTN_ERR_IO);
        CHECK_MESSAGE(ctx, "/dev/full: write failed: ");
        CHECK_MESSAGE(ctx, strerror(ENOSPC));
    }
}

/* A replaced file keeps its permissions; through a symbolic link the file
 * it names is replaced and the link stays a link. */
static void test_mode_and_link(attn_ctx *ctx) {
    const char *path = in_dir("m.npy"), *link = in_dir("l.npy");
    float x[2] = {1, 2}, y[2] = {3, 4};
    size_t shape[1] = {2};
    CHECK_STATUS(attn_npy_write(ctx, path, x, 1, shape), ATTN_OK);
    chmod(path, 0604);
    CHECK(symlink("m.npy", link) == 0);
    CHECK_STATUS(attn_npy_write(ctx, link, y, 1, shape), ATTN_OK);
    struct stat st;
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(stat(path, &st) == 0 && (st.st_mode & 07777) == 0604);
    attn_npy back;
    CHECK_STATUS(attn_npy_read(ctx, path, &back), ATTN_OK);
    CHECK(back.numel == 2 && back.data && back.data[1] == 4.0f);
    attn_npy_free(&back);
    /* a link to no file (two links deep): the file it names is created,
     * as the shell's > creates it, and the links stay links */
    const char *first = in_dir("d1.npy"), *second = in_dir("d2.npy"), *made = in_dir("dm.npy");
    CHECK(symlink("d2.npy", first) == 0 && symlink("dm.npy", second) == 0);
    CHECK_STATUS(attn_npy_write(ctx, first, y, 1, shape), ATTN_OK);
    CHECK(lstat(first, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(lstat(second, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK_STATUS(attn_npy_read(ctx, made, &back), ATTN_OK);
    CHECK(back.numel == 2 && back.data && back.data[1] == 4.0f);
    attn_npy_free(&back);
    /* one whose file cannot be made: refused, naming where it points */
    const char *nowhere = in_dir("dn.npy");
    CHECK(symlink("/nonexistent-attn-dir/x.npy", nowhere) == 0);
    CHECK_STATUS(attn_npy_write(ctx, nowhere, y, 1, shape), ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, "its link names /nonexistent-attn-dir/x.npy");
    CHECK(lstat(nowhere, &st) == 0 && S_ISLNK(st.st_mode));
    unlink(first), unlink(second), unlink(made), unlink(nowhere);
}

/* The entries of the working directory (without . and ..). */
static int entries_here(void) {
    DIR *d = opendir(".");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* A symbolic link in a working directory deeper than PATH_MAX, where
 * realpath has no answer: the file it names is still replaced whole, so a
 * size limit in the middle of the write leaves it byte for byte. */
static void test_link_in_deep_directory(attn_ctx *ctx, const float *big) {
    enum { DEPTH = 20 }; /* 20 names of 250 bytes: 5020 bytes below dir */
    char name[251];
    memset(name, 'd', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    int back = open(".", O_RDONLY | O_DIRECTORY);
    CHECK(back >= 0 && chdir(dir) == 0);
    int depth = 0;
    while (depth < DEPTH && mkdir(name, 0700) == 0 && chdir(name) == 0) depth++;
    CHECK(depth == DEPTH);
    char where[PATH_MAX];
    CHECK(depth < DEPTH || realpath(".", where) == NULL);
    size_t shape[2] = {256, 256};
    if (depth == DEPTH) {
        CHECK_STATUS(attn_npy_write(ctx, "o.npy", big, 2, shape), ATTN_OK);
        CHECK(symlink("o.npy", "ol.npy") == 0);
        size_t old_size = 0;
        unsigned char *old = slurp("o.npy", &old_size);
        CHECK(old && old_size == 4 * N_BIG + 128);
        float *other = malloc(N_BIG * sizeof *other);
        for (size_t i = 0; i < N_BIG; i++) other[i] = -big[i];
        limit_size(64 * 1024);
        attn_status s = attn_npy_write(ctx, "ol.npy", other, 2, shape);
        unlimit();
        CHECK_STATUS(s, ATTN_ERR_IO);
        CHECK_MESSAGE(ctx, strerror(EFBIG));
        CHECK(same_bytes("o.npy", old, old_size));
        CHECK(entries_here() == 2);
        /* without the limit it replaces the file, and the link stays */
        CHECK_STATUS(attn_npy_write(ctx, "ol.npy", other, 2, shape), ATTN_OK);
        struct stat st;
        CHECK(lstat("ol.npy", &st) == 0 && S_ISLNK(st.st_mode));
        attn_npy read;
        CHECK_STATUS(attn_npy_read(ctx, "o.npy", &read), ATTN_OK);
        CHECK(read.numel == N_BIG && read.data && memcmp(read.data, other, 4 * N_BIG) == 0);
        attn_npy_free(&read);
        CHECK(entries_here() == 2);
        free(other);
        free(old);
        unlink("ol.npy");
        unlink("o.npy");
    }
    while (depth-- > 0)
        if (chdir("..") != 0 || rmdir(name) != 0) break;
    if (back >= 0) {
        CHECK(fchdir(back) == 0);
        close(back);
    }
}

/* A path that names an open descriptor writes to that descriptor's file
 * (the same inode), where the descriptor stands, as the caller holding it
 * expects. */
static void test_descriptor_path(attn_ctx *ctx) {
    const char *path = in_dir("fd.npy");
    FILE *held = fopen(path, "wb+");
    CHECK(held != NULL);
    if (!held) return;
    struct stat before, after;
    fstat(fileno(held), &before);
    char fd_path[64];
    snprintf(fd_path, sizeof fd_path, "/proc/self/fd/%d", fileno(held));
    float x[3] = {7, 8, 9};
    size_t shape[1] = {3};
    if (access(fd_path, F_OK) == 0) {
        CHECK_STATUS(attn_npy_write(ctx, fd_path, x, 1, shape), ATTN_OK);
        CHECK(stat(path, &after) == 0 && after.st_ino == before.st_ino);
        attn_npy back;
        CHECK_STATUS(attn_npy_read(ctx, path, &back), ATTN_OK);
        CHECK(back.numel == 3 && back.data && back.data[2] == 9.0f);
        attn_npy_free(&back);
    }
    fclose(held);

    /* A descriptor opened to append (a shell's >>) is appended to, its
     * file's bytes kept; one open for reading only (a shell's <) is
     * refused, and its file stays as it was. */
    const char *log = in_dir("log.txt");
    FILE *f = fopen(log, "wb");
    CHECK(f && fputs("keep me\n", f) >= 0 && fclose(f) == 0);
    int fd = open(log, O_WRONLY | O_APPEND);
    CHECK(fd >= 0);
    snprintf(fd_path, sizeof fd_path, "/dev/fd/%d", fd);
    if (fd >= 0 && access(fd_path, F_OK) == 0) {
        CHECK_STATUS(attn_npy_write(ctx, fd_path, x, 1, shape), ATTN_OK);
        size_t size = 0;
        unsigned char *bytes = slurp(log, &size);
        CHECK(bytes && size > 8 && memcmp(bytes, "keep me\n", 8) == 0);
        if (bytes && size > 8) {
            attn_npy back;
            CHECK_STATUS(attn_npy_parse(ctx, bytes + 8, size - 8, &back), ATTN_OK);
            CHECK(back.numel == 3 && back.data && back.data[2] == 9.0f);
            attn_npy_free(&back);
        }
        free(bytes);
    }
    if (fd >= 0) close(fd);
    fd = open(log, O_RDONLY);
    CHECK(fd >= 0);
    size_t old_size = 0;
    unsigned char *old = slurp(log, &old_size);
    snprintf(fd_path, sizeof fd_path, "/proc/self/fd/%d", fd);
    if (fd >= 0 && access(fd_path, F_OK) == 0) {
        CHECK_STATUS(attn_npy_write(ctx, fd_path, x, 1, shape), ATTN_ERR_IO);
        CHECK_MESSAGE(ctx, "open for reading only");
        CHECK(same_bytes(log, old, old_size));
    }
    if (fd >= 0) close(fd);
    free(old);
}

static void remove_all(void) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(in_dir(e->d_name));
    closedir(d);
    rmdir(dir);
}

int main(void) {
    signal(SIGXFSZ, SIG_IGN);
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/attn_hostile_io_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    attn_ctx *ctx = NULL;
    CHECK_STATUS(attn_ctx_new(NULL, &ctx), ATTN_OK);
    float *big = malloc(N_BIG * sizeof *big);
    for (size_t i = 0; i < N_BIG; i++) big[i] = (float)i * 0.5f;
    test_npy_over_limit(ctx, big);
    test_safetensors_over_limit(ctx, big);
    test_group(ctx, big);
    test_bad_destinations(ctx);
    test_mode_and_link(ctx);
    test_descriptor_path(ctx);
    test_link_in_deep_directory(ctx, big);
    free(big);
    attn_ctx_free(ctx);
    remove_all();
    return check_summary();
}
