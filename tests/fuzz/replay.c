/*
 * replay.c — runs a fuzz target over files, without libFuzzer: each
 * argument is a file, or a directory whose files are all run. Built with
 * every compiler, so the committed corpus (tests/fuzz/corpus) is replayed by
 * every test run, sanitized builds included.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 1 << 16, size = 0;
    unsigned char *buf = malloc(cap);
    for (size_t n; buf && (n = fread(buf + size, 1, cap - size, f)) > 0;) {
        size += n;
        if (size == cap) {
            unsigned char *grown = realloc(buf, cap *= 2);
            if (!grown) free(buf);
            buf = grown;
        }
    }
    fclose(f);
    if (!buf) return 1;
    LLVMFuzzerTestOneInput(buf, size);
    free(buf);
    return 0;
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    size_t files = 0;
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        struct stat s;
        if (stat(argv[i], &s) != 0) {
            fprintf(stderr, "replay: no such file or directory: %s\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(s.st_mode)) {
            failed |= run_file(argv[i]);
            files++;
            continue;
        }
        DIR *dir = opendir(argv[i]);
        if (!dir) return 1;
        char **names = NULL;
        size_t count = 0;
        for (struct dirent *e; (e = readdir(dir));) {
            if (e->d_name[0] == '.') continue;
            char **grown = realloc(names, (count + 1) * sizeof *names);
            if (!grown) return 1;
            names = grown;
            size_t len = strlen(argv[i]) + strlen(e->d_name) + 2;
            names[count] = malloc(len);
            snprintf(names[count++], len, "%s/%s", argv[i], e->d_name);
        }
        closedir(dir);
        qsort(names, count, sizeof *names, compare_names);
        for (size_t k = 0; k < count; k++) {
            failed |= run_file(names[k]);
            free(names[k]);
            files++;
        }
        free(names);
    }
    printf("replayed %zu inputs\n", files);
    return failed || files == 0;
}
