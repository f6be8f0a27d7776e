/*
 * file.c — files written whole or not at all: the one place in the library
 * (and the CLI, through attn.h) that opens a file for writing.
 *
 * A regular file, or a path that names nothing yet, is written to a new
 * temporary in the same directory (so that the rename cannot cross file
 * systems), flushed, fsync'd, closed with every status checked, and only
 * then renamed over the destination: a full disk, a size limit or a crash
 * leaves the previous file as it was, and a reader never sees half a file.
 * A path through a symbolic link replaces the file the link names, as
 * writing through the link would. Anything else that exists (a terminal, a
 * pipe, /dev/full, /dev/null), and a path that names an open descriptor
 * (/dev/stdout, /dev/fd/N, /proc/self/fd/N, a link to a deleted file),
 * cannot be replaced and is written in place; a descriptor of this
 * process through a copy of it, never reopened (which would truncate).
 *
 * Steps: attn_file_open checks the destination and creates the temporary,
 * attn_file_write appends, attn_file_close makes the temporary complete and
 * durable, attn_file_commit renames it into place (closing first if needed).
 * A caller that writes several files closes them all before committing any,
 * so that no destination changes unless every write succeeded.
 * attn_file_discard removes the temporary at any step before the commit.
 *
 * attn_file_read_whole is its reading counterpart for files read whole.
 */
#define _XOPEN_SOURCE 700
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The part of the destination's name kept in the temporary's: the rest of
 * the name ('.', 12 hex digits, ".attn-tmp") fits NAME_MAX (255) with it. */
#define TEMP_BASE_MAX 200
#define TEMP_ATTEMPTS 64

static char *copy_string(const char *s) {
    size_t n = strlen(s) + 1;
    char *copy = attn_malloc(n);
    if (copy) memcpy(copy, s, n);
    return copy;
}

/* SplitMix64's finaliser: spreads the bits of the name's seed. */
static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* "DIR/.BASE.<12 hex>.attn-tmp" beside target, or NULL when out of memory.
 * The name need only be unlikely to exist: O_EXCL refuses one that does,
 * and the caller draws again. */
static char *temp_name(const char *target, uint64_t draw) {
    const char *slash = strrchr(target, '/');
    size_t dir_len = slash ? (size_t)(slash - target) + 1 : 0;
    const char *base = target + dir_len;
    size_t base_len = strlen(base);
    if (base_len > TEMP_BASE_MAX) base_len = TEMP_BASE_MAX;
    size_t size = dir_len + 1 + base_len + 1 + 12 + sizeof ".attn-tmp";
    char *name = attn_malloc(size);
    if (!name) return NULL;
    memcpy(name, target, dir_len);
    name[dir_len] = '.';
    memcpy(name + dir_len + 1, base, base_len);
    snprintf(name + dir_len + 1 + base_len, size - dir_len - 1 - base_len, ".%012llx.attn-tmp",
             (unsigned long long)(draw & 0xffffffffffffu));
    return name;
}

/* The directory that holds target, for its fsync after the rename. */
static void sync_directory(const char *target) {
    const char *slash = strrchr(target, '/');
    char dir[PATH_MAX];
    if (!slash) {
        memcpy(dir, ".", 2);
    } else {
        size_t n = slash == target ? 1 : (size_t)(slash - target);
        if (n >= sizeof dir) return;
        memcpy(dir, target, n);
        dir[n] = '\0';
    }
    int fd = open(dir, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    /* The rename is done and the data is synced; a directory that cannot
     * be synced (some file systems refuse) leaves nothing to undo. */
    (void)fsync(fd);
    close(fd);
}

/* Whether path names an open descriptor rather than a file (/dev/stdout,
 * /dev/fd/N, /proc/self/fd/N): the caller means the descriptor, whose
 * file a rename would leave behind. */
static bool names_descriptor(const char *path) {
    return strncmp(path, "/dev/std", 8) == 0 || strncmp(path, "/dev/fd/", 8) == 0 ||
           (strncmp(path, "/proc/", 6) == 0 && strstr(path, "/fd/") != NULL);
}

static void file_free(attn_file *f) {
    attn_free(f->temp);
    if (f->target != f->path) attn_free(f->target);
    attn_free(f->path);
    attn_free(f);
}

/* Closes the stream (if open) and removes the temporary (if any). */
static void abandon(attn_file *f) {
    if (f->stream) fclose(f->stream); /* what it held is being thrown away */
    f->stream = NULL;
    if (f->temp) {
        unlink(f->temp);
        attn_free(f->temp);
        f->temp = NULL;
    }
    f->failed = true;
}

/* Creates the temporary beside f->target, with the destination's
 * permissions when it exists (mode), else those a new file gets. */
static attn_status open_temp(attn_ctx *ctx, attn_file *f, const struct stat *existing) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t seed = ((uint64_t)getpid() << 32) ^ (uint64_t)now.tv_nsec ^
                    ((uint64_t)now.tv_sec * 0x9e3779b97f4a7c15u) ^ (uint64_t)(uintptr_t)f;
    for (int attempt = 0; attempt < TEMP_ATTEMPTS; attempt++) {
        f->temp = temp_name(f->target, mix(seed + (uint64_t)attempt));
        if (!f->temp) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", f->path);
        int fd = open(f->temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0) {
            int saved = errno;
            attn_free(f->temp);
            f->temp = NULL;
            if (saved == EEXIST) continue;
            if (f->target != f->path)
                return attn_fail(ctx, ATTN_ERR_IO,
                                 "%s: cannot open for writing: %s (its link names %s)", f->path,
                                 strerror(saved), f->target);
            return attn_fail(ctx, ATTN_ERR_IO, "%s: cannot open for writing: %s", f->path,
                             strerror(saved));
        }
        /* The replacement keeps the permissions of the file it replaces; if
         * they cannot be copied it still has those of a new file. */
        if (existing) (void)fchmod(fd, existing->st_mode & 07777);
        f->stream = fdopen(fd, "wb");
        if (!f->stream) {
            int saved = errno;
            close(fd);
            abandon(f);
            return attn_fail(ctx, ATTN_ERR_IO, "%s: cannot open for writing: %s", f->path,
                             strerror(saved));
        }
        return ATTN_OK;
    }
    return attn_fail(ctx, ATTN_ERR_IO,
                     "%s: cannot open for writing: %d temporary names beside it were all taken",
                     f->path, TEMP_ATTEMPTS);
}

/* The number of the descriptor of this process that path names
 * (/dev/stdin, /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N,
 * /proc/<this process>/fd/N), or -1. */
static int descriptor_number(const char *path) {
    static const char *const std[] = {"/dev/stdin", "/dev/stdout", "/dev/stderr"};
    for (int i = 0; i < 3; i++)
        if (strcmp(path, std[i]) == 0) return i;
    const char *at = NULL;
    if (strncmp(path, "/dev/fd/", 8) == 0) {
        at = path + 8;
    } else if (strncmp(path, "/proc/self/fd/", 14) == 0) {
        at = path + 14;
    } else if (strncmp(path, "/proc/", 6) == 0) {
        char *end;
        long pid = strtol(path + 6, &end, 10);
        if (end != path + 6 && pid == (long)getpid() && strncmp(end, "/fd/", 4) == 0)
            at = end + 4;
    }
    if (!at || *at < '0' || *at > '9') return -1;
    char *end;
    long fd = strtol(at, &end, 10);
    return *end == '\0' && fd <= INT_MAX ? (int)fd : -1;
}

/* Opens path itself for writing, for a destination that has no file to
 * replace; frees f on failure. A descriptor of this process is written
 * where it stands (a copy of it): opening its name again would truncate
 * its file, the output a shell's >> appends to, or the input < reads. */
static attn_status open_in_place(attn_ctx *ctx, attn_file *f, const char *path,
                                 attn_file **out) {
    int fd = descriptor_number(path), copy = -1, flags = fd < 0 ? 0 : fcntl(fd, F_GETFL);
    if (fd >= 0 && flags != -1 && (flags & O_ACCMODE) == O_RDONLY) {
        file_free(f);
        return attn_fail(ctx, ATTN_ERR_IO,
                         "%s: cannot open for writing: descriptor %d is open for reading only",
                         path, fd);
    }
    if (fd >= 0 && flags != -1 && (copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)) >= 0) {
        f->stream = fdopen(copy, "wb");
        if (!f->stream) {
            int saved = errno;
            close(copy);
            errno = saved;
        }
    } else {
        f->stream = fopen(path, "wb");
    }
    if (!f->stream) {
        int saved = errno;
        file_free(f);
        return attn_fail(ctx, ATTN_ERR_IO, "%s: cannot open for writing: %s", path,
                         strerror(saved));
    }
    *out = f;
    return ATTN_OK;
}

/* The name a chain of symbolic links from path ends at (malloc'd; NULL out
 * of memory, or *err set: a loop or an unreadable link), each link's text
 * taken relative to the directory that holds it. A link with no file behind
 * it is written where it points, as the shell's > writes it: the link
 * stays, and its file is created. */
static char *link_end(const char *path, int *err) {
    char *at = copy_string(path);
    for (int hop = 0; at && hop < 40; hop++) {
        struct stat link;
        if (lstat(at, &link) != 0 || !S_ISLNK(link.st_mode)) return at;
        char to[PATH_MAX];
        ssize_t n = readlink(at, to, sizeof to - 1);
        if (n < 0) {
            *err = errno;
            attn_free(at);
            return NULL;
        }
        to[n] = '\0';
        /* a relative link is relative to the directory that holds it */
        const char *slash = strrchr(at, '/');
        size_t dir = to[0] == '/' || !slash ? 0 : (size_t)(slash - at) + 1;
        char *next = attn_malloc(dir + (size_t)n + 1);
        if (next) {
            memcpy(next, at, dir);
            memcpy(next + dir, to, (size_t)n + 1);
        }
        attn_free(at);
        at = next;
    }
    if (at) {
        attn_free(at);
        *err = ELOOP;
    }
    return NULL;
}

attn_status attn_file_open(attn_ctx *ctx, const char *path, attn_file **out) {
    attn_clear_error(ctx);
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "attn_file_open: out is NULL");
    *out = NULL;
    if (!path) return attn_fail(ctx, ATTN_ERR_NULL, "attn_file_open: path is NULL");
    if (!*path) return attn_fail(ctx, ATTN_ERR_INVALID, "attn_file_open: path is empty");
    attn_file *f = attn_calloc(1, sizeof *f);
    if (f) f->path = copy_string(path);
    if (!f || !f->path) {
        if (f) attn_free(f);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", path);
    }
    f->target = f->path;

    struct stat st, link;
    bool exists = stat(path, &st) == 0;
    int stat_errno = errno;
    if (!exists && stat_errno != ENOENT) {
        file_free(f);
        return attn_fail(ctx, ATTN_ERR_IO, "%s: cannot open for writing: %s", path,
                         strerror(stat_errno));
    }
    if (exists && S_ISDIR(st.st_mode)) {
        file_free(f);
        return attn_fail(ctx, ATTN_ERR_IO, "%s: cannot open for writing: it is a directory",
                         path);
    }
    if (!exists && lstat(path, &link) == 0 && S_ISLNK(link.st_mode)) {
        int err = 0;
        f->target = link_end(path, &err);
        if (!f->target) {
            f->target = f->path;
            file_free(f);
            return err ? attn_fail(ctx, ATTN_ERR_IO, "%s: cannot open for writing: %s", path,
                                   strerror(err))
                       : attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", path);
        }
    }
    if (exists && (!S_ISREG(st.st_mode) || names_descriptor(path)))
        return open_in_place(ctx, f, path, out); /* a device, a pipe, an open descriptor */
    if (exists && lstat(path, &link) == 0 && S_ISLNK(link.st_mode)) {
        char resolved[PATH_MAX];
        struct stat there;
        /* realpath's answer is canonical, but longer than PATH_MAX it has
         * none (a deep working directory): the chain followed by hand names
         * the same file by a shorter, relative name. */
        int err = 0;
        char *found = realpath(path, resolved) ? copy_string(resolved) : link_end(path, &err);
        if (!found && !err) {
            file_free(f);
            return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", path);
        }
        if (!found || stat(found, &there) != 0 || there.st_dev != st.st_dev ||
            there.st_ino != st.st_ino) {
            /* A link with no name to rename over (a deleted file, a memfd
             * behind /proc/self/fd/N): only writing in place reaches it. */
            attn_free(found);
            return open_in_place(ctx, f, path, out);
        }
        f->target = found;
    }
    attn_status s = open_temp(ctx, f, exists ? &st : NULL);
    if (s != ATTN_OK) {
        file_free(f);
        return s;
    }
    *out = f;
    return ATTN_OK;
}

attn_status attn_file_write(attn_ctx *ctx, attn_file *file, const void *bytes, size_t size) {
    attn_clear_error(ctx);
    if (!file) return attn_fail(ctx, ATTN_ERR_NULL, "attn_file_write: file is NULL");
    if (size && !bytes)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: bytes is NULL for %zu bytes", file->path, size);
    if (file->failed || !file->stream)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: written after it %s", file->path,
                         file->failed ? "failed" : "was closed");
    if (size == 0) return ATTN_OK;
    if (fwrite(bytes, 1, size, file->stream) != size) {
        int saved = errno;
        abandon(file);
        return attn_fail(ctx, ATTN_ERR_IO, "%s: write failed: %s", file->path, strerror(saved));
    }
    return ATTN_OK;
}

attn_status attn_file_write_f32le(attn_ctx *ctx, attn_file *file, const float *data,
                                  size_t numel) {
    if (!attn_host_is_big_endian() || numel == 0)
        return attn_file_write(ctx, file, data, numel * sizeof *data);
    unsigned char chunk[16384];
    const size_t per_chunk = sizeof chunk / 4;
    for (size_t done = 0; done < numel;) {
        size_t n = numel - done < per_chunk ? numel - done : per_chunk;
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &data[done + i], sizeof u);
            for (int k = 0; k < 4; k++) chunk[4 * i + (size_t)k] = (unsigned char)(u >> (8 * k));
        }
        attn_status s = attn_file_write(ctx, file, chunk, 4 * n);
        if (s != ATTN_OK) return s;
        done += n;
    }
    return ATTN_OK;
}

attn_status attn_file_close(attn_ctx *ctx, attn_file *file) {
    attn_clear_error(ctx);
    if (!file) return attn_fail(ctx, ATTN_ERR_NULL, "attn_file_close: file is NULL");
    if (file->closed) return ATTN_OK;
    if (file->failed)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: closed after a write failed", file->path);
    FILE *stream = file->stream;
    file->stream = NULL;
    /* Each step is checked: stdio reports a full disk at the flush, NFS
     * and quotas may report it only at the sync or the close. A pipe or a
     * terminal cannot be synced, and has nothing to make durable. */
    bool ok = fflush(stream) == 0 && !ferror(stream);
    int saved = errno;
    if (ok && file->temp && fsync(fileno(stream)) != 0) {
        ok = false;
        saved = errno;
    }
    if (fclose(stream) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    if (!ok) {
        abandon(file);
        return attn_fail(ctx, ATTN_ERR_IO, "%s: write failed: %s", file->path, strerror(saved));
    }
    file->closed = true;
    return ATTN_OK;
}

attn_status attn_file_commit(attn_ctx *ctx, attn_file *file) {
    attn_clear_error(ctx);
    if (!file) return attn_fail(ctx, ATTN_ERR_NULL, "attn_file_commit: file is NULL");
    attn_status s = attn_file_close(ctx, file);
    if (s == ATTN_OK && file->temp) {
        if (rename(file->temp, file->target) != 0) {
            int saved = errno;
            s = attn_fail(ctx, ATTN_ERR_IO, "%s: cannot put the written file in place: %s",
                          file->path, strerror(saved));
        } else {
            attn_free(file->temp);
            file->temp = NULL;
            sync_directory(file->target);
        }
    }
    abandon(file); /* removes the temporary that a failure left */
    file_free(file);
    return s;
}

attn_status attn_file_commit_pair(attn_ctx *ctx, attn_file *first, attn_file *second) {
    attn_clear_error(ctx);
    if (!first || !second) {
        attn_file_discard(first);
        attn_file_discard(second);
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_file_commit_pair: %s is NULL",
                         !first ? "first" : "second");
    }
    attn_status s = attn_file_close(ctx, first);
    if (s == ATTN_OK) s = attn_file_close(ctx, second);
    if (s != ATTN_OK) {
        attn_file_discard(first);
        attn_file_discard(second);
        return s;
    }
    /* first's present file, kept under a second name until second is in
     * place; where the file system cannot link it, the pair is committed
     * as two files */
    char *kept = NULL, *target = NULL;
    bool was_absent = false, no_memory = false;
    if (first->temp && second->temp) {
        target = copy_string(first->target);
        struct stat st;
        if (!target) {
            no_memory = true;
        } else if (lstat(target, &st) != 0) {
            was_absent = errno == ENOENT;
        } else {
            for (int attempt = 0; attempt < TEMP_ATTEMPTS && !kept && !no_memory; attempt++) {
                kept = temp_name(target, mix((uint64_t)(uintptr_t)first + (uint64_t)attempt));
                no_memory = !kept;
                if (kept && link(target, kept) != 0) {
                    int err = errno;
                    attn_free(kept);
                    kept = NULL;
                    if (err != EEXIST) break;
                }
            }
        }
    }
    if (no_memory) {
        s = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", first->path);
        attn_file_discard(first);
        attn_file_discard(second);
        attn_free(target);
        return s;
    }
    s = attn_file_commit(ctx, first);
    if (s != ATTN_OK) {
        attn_file_discard(second);
    } else if ((s = attn_file_commit(ctx, second)) != ATTN_OK && (kept || was_absent)) {
        /* second could not be put in place: first's destination goes back
         * to what it held, so that the two still belong together */
        bool restored = kept ? rename(kept, target) == 0 : unlink(target) == 0;
        char message[ATTN_ERROR_CAPACITY];
        snprintf(message, sizeof message, "%s", attn_ctx_last_error(ctx));
        if (restored) {
            if (kept) attn_free(kept);
            kept = NULL;
            sync_directory(target);
            s = attn_fail(ctx, s, "%s (%s is as it was)", message, target);
        } else if (kept) {
            /* the previous first stays where the caller can take it back */
            s = attn_fail(ctx, s, "%s (%s is new; its previous contents are kept as %s)",
                          message, target, kept);
            attn_free(kept);
            kept = NULL;
        }
    }
    if (kept) unlink(kept);
    attn_free(kept);
    attn_free(target);
    return s;
}

void attn_file_discard(attn_file *file) {
    if (!file) return;
    abandon(file);
    file_free(file);
}

const char *attn_file_temporary_path(const attn_file *file) {
    return file ? file->temp : NULL;
}

FILE *attn_file_open_read(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return NULL;
    /* reads block again, as a stream's reader expects */
    int flags = fcntl(fd, F_GETFL);
    FILE *f = flags != -1 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != -1 ? fdopen(fd, "rb")
                                                                          : NULL;
    if (!f) {
        int saved = errno;
        close(fd);
        errno = saved;
    }
    return f;
}

attn_status attn_file_read_whole(attn_ctx *ctx, const char *who, const char *path,
                                 unsigned char **out, size_t *size) {
    const char *at = who ? who : "", *sep = who ? ": " : "";
    *out = NULL;
    *size = 0;
    FILE *f = attn_file_open_read(path);
    if (!f) return attn_fail(ctx, ATTN_ERR_IO, "%s%scannot open %s: %s", at, sep, path,
                             strerror(errno));
    struct stat info;
    bool unknown = fstat(fileno(f), &info) != 0;
    int err = errno;
    if (unknown || !S_ISREG(info.st_mode)) {
        fclose(f);
        return attn_fail(ctx, ATTN_ERR_IO, "%s%s%s: %s", at, sep, path,
                         unknown                  ? strerror(err)
                         : S_ISDIR(info.st_mode) ? "is a directory, not a file"
                                                 : "not a regular file (a device or a pipe is "
                                                   "not read)");
    }
    /* the size fstat gave, and one byte more to see the end where it grew */
    size_t want = (size_t)info.st_size;
    unsigned char *buf = (uint64_t)info.st_size < SIZE_MAX - 1 ? attn_malloc(want + 2) : NULL;
    if (!buf) {
        fclose(f);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s%sno memory to read %s (%lld bytes)", at,
                         sep, path, (long long)info.st_size);
    }
    size_t got = fread(buf, 1, want + 1, f);
    bool failed = ferror(f) != 0;
    err = errno;
    fclose(f);
    if (failed || got != want) {
        attn_free(buf);
        return attn_fail(ctx, ATTN_ERR_IO, "%s%scannot read %s: %s", at, sep, path,
                         failed ? strerror(err) : "its size changed while it was read");
    }
    buf[got] = 0;
    *out = buf;
    *size = got;
    return ATTN_OK;
}
