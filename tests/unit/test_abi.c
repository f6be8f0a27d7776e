/*
 * test_abi.c — the ABI version and the layout table (attn_abi_layout)
 * against attn.h itself: the header's struct definitions are parsed here,
 * and every struct and every field, in order, must be in the table, so a
 * field added to attn.h and not to src/core/abi.c fails this test. Then
 * the table's own sense (offsets in order, inside the struct, no overlap),
 * a few entries against offsetof written out here, and the version rule of
 * docs/abi.md (while 0.x, the ABI version is the minor version).
 *   test_abi path/to/attn.h
 */
#include "attn.h"
#include "check.h"

#include <ctype.h>
#include <stdlib.h>

#define MAX_STRUCTS 128
#define MAX_FIELDS 64
#define MAX_NAME 64

typedef struct parsed_struct {
    char name[MAX_NAME];
    size_t num_fields;
    char fields[MAX_FIELDS][MAX_NAME];
} parsed_struct;

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *text = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1))) {
            size_t got = fread(text, 1, (size_t)n, f);
            text[got] = '\0';
        }
    }
    fclose(f);
    return text;
}

/* Comments become spaces, so that what remains is declarations. */
static void strip_comments(char *s) {
    for (char *p = s; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            char *end = strstr(p + 2, "*/");
            char *stop = end ? end + 2 : p + strlen(p);
            while (p < stop) *p++ = ' ';
            p--;
        } else if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n') *p++ = ' ';
            if (!*p) break;
        }
    }
}

static bool is_ident(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* The last identifier of s[0 .. n), or false if there is none. */
static bool last_ident(const char *s, size_t n, char *out) {
    size_t end = n;
    while (end > 0 && !is_ident(s[end - 1])) end--;
    size_t begin = end;
    while (begin > 0 && is_ident(s[begin - 1])) begin--;
    if (begin == end || end - begin >= MAX_NAME) return false;
    memcpy(out, s + begin, end - begin);
    out[end - begin] = '\0';
    return true;
}

/* One member declaration ("const int32_t *a, *b[3]"): its names in order.
 * A declarator with parentheses (a function pointer written out) is not
 * read: the header names such types with a typedef, and a failure here
 * says so rather than miscounting. */
static bool parse_declaration(const char *s, size_t n, parsed_struct *out, const char **why) {
    if (memchr(s, '(', n)) {
        *why = "a member with parentheses (declare its type with a typedef)";
        return false;
    }
    size_t begin = 0;
    while (begin < n) {
        size_t end = begin;
        while (end < n && s[end] != ',') end++;
        size_t cut = begin;
        while (cut < end && s[cut] != '[') cut++;
        if (out->num_fields == MAX_FIELDS) {
            *why = "more members than the test holds";
            return false;
        }
        if (!last_ident(s + begin, cut - begin, out->fields[out->num_fields])) {
            *why = "a declarator without a name";
            return false;
        }
        out->num_fields++;
        begin = end + 1;
    }
    return true;
}

/* Every "typedef struct name { ... } name;" of text, in order. Returns the
 * count, or -1 with *why and *where set when the text is not of that form. */
static int parse_structs(char *text, parsed_struct *out, int max, const char **why,
                         const char **where) {
    strip_comments(text);
    int count = 0;
    for (char *p = text; (p = strstr(p, "struct")) != NULL; p += 6) {
        if ((p > text && is_ident(p[-1])) || is_ident(p[6])) continue;
        char *q = p + 6;
        while (isspace((unsigned char)*q)) q++;
        char *name = q;
        while (is_ident(*q)) q++;
        size_t name_len = (size_t)(q - name);
        while (isspace((unsigned char)*q)) q++;
        if (*q != '{') continue; /* a declaration or a use, not a definition */
        *where = p;
        char *before = p;
        while (before > text && isspace((unsigned char)before[-1])) before--;
        if (before - text < 7 || strncmp(before - 7, "typedef", 7) != 0 || name_len == 0 ||
            name_len >= MAX_NAME) {
            *why = "a struct defined other than as typedef struct name { ... } name;";
            return -1;
        }
        if (count == max) {
            *why = "more structs than the test holds";
            return -1;
        }
        parsed_struct *st = &out[count++];
        memcpy(st->name, name, name_len);
        st->name[name_len] = '\0';
        st->num_fields = 0;
        char *body = q + 1, *close = strchr(body, '}');
        char *inner = strchr(body, '{');
        if (!close || (inner && inner < close)) {
            *why = "a struct body with braces inside (a nested definition)";
            return -1;
        }
        for (char *d = body; d < close;) {
            char *semi = memchr(d, ';', (size_t)(close - d));
            if (!semi) {
                char *rest = d;
                while (rest < close && isspace((unsigned char)*rest)) rest++;
                if (rest != close) {
                    *why = "a member without its semicolon";
                    return -1;
                }
                break;
            }
            if (!parse_declaration(d, (size_t)(semi - d), st, why)) return -1;
            d = semi + 1;
        }
        char typedef_name[MAX_NAME];
        char *semi = strchr(close, ';');
        if (!semi || !last_ident(close, (size_t)(semi - close), typedef_name) ||
            strcmp(typedef_name, st->name) != 0) {
            *why = "a typedef named other than its struct";
            return -1;
        }
        p = semi - 6;
    }
    return count;
}

/* The parser on a text made to hold every form it reads. */
static void check_parser(void) {
    char text[] =
        "/* struct fake { int no; }; */\n"
        "typedef struct attn_one {\n"
        "    size_t a, b; /* two */\n"
        "    const int32_t *c, *d;\n"
        "    size_t shape[ATTN_NPY_MAX_DIMS];\n"
        "    attn_sampling s; // nested by type\n"
        "} attn_one;\n"
        "typedef struct attn_opaque attn_opaque;\n"
        "attn_status f(const struct attn_one *x);\n"
        "typedef struct attn_two { char v[16]; bool x, y, z; } attn_two;\n";
    parsed_struct got[4];
    const char *why = "", *where = "";
    int n = parse_structs(text, got, 4, &why, &where);
    CHECK(n == 2);
    if (n != 2) return;
    const char *one[] = {"a", "b", "c", "d", "shape", "s"}, *two[] = {"v", "x", "y", "z"};
    CHECK(strcmp(got[0].name, "attn_one") == 0 && got[0].num_fields == 6);
    for (size_t i = 0; i < 6 && i < got[0].num_fields; i++)
        CHECK(strcmp(got[0].fields[i], one[i]) == 0);
    CHECK(strcmp(got[1].name, "attn_two") == 0 && got[1].num_fields == 4);
    for (size_t i = 0; i < 4 && i < got[1].num_fields; i++)
        CHECK(strcmp(got[1].fields[i], two[i]) == 0);

    char pointer_member[] = "typedef struct attn_f { void (*fn)(int, int); } attn_f;";
    CHECK(parse_structs(pointer_member, got, 4, &why, &where) == -1);
    char untyped[] = "struct attn_g { int a; };";
    CHECK(parse_structs(untyped, got, 4, &why, &where) == -1);
}

static const attn_abi_struct *find(const attn_abi_struct *table, size_t count, const char *name) {
    for (size_t i = 0; i < count; i++)
        if (strcmp(table[i].name, name) == 0) return &table[i];
    return NULL;
}

static const attn_abi_field *field(const attn_abi_struct *st, const char *name) {
    for (size_t i = 0; st && i < st->num_fields; i++)
        if (strcmp(st->fields[i].name, name) == 0) return &st->fields[i];
    return NULL;
}

/* The table holds attn.h's structs and fields, in the header's order. */
static void check_against_header(const char *header, const attn_abi_struct *table, size_t count) {
    char *text = read_file(header);
    CHECK(text != NULL);
    if (!text) {
        fprintf(stderr, "cannot read %s\n", header);
        return;
    }
    static parsed_struct parsed[MAX_STRUCTS];
    const char *why = "", *where = "";
    int n = parse_structs(text, parsed, MAX_STRUCTS, &why, &where);
    if (n < 0) fprintf(stderr, "%s: cannot read %.60s: %s\n", header, where, why);
    /* attn.h defines 30 structs as this test is written; fewer means the
     * parser lost some. */
    CHECK(n >= 30);
    if (n >= 0 && (size_t)n != count)
        fprintf(stderr, "attn.h defines %d structs, attn_abi_layout has %zu\n", n, count);
    CHECK(n >= 0 && (size_t)n == count);
    for (int i = 0; i < n; i++) {
        const parsed_struct *want = &parsed[i];
        const attn_abi_struct *got = (size_t)i < count ? &table[i] : NULL;
        if (!got || strcmp(got->name, want->name) != 0) {
            fprintf(stderr, "attn.h's struct %d is %s; attn_abi_layout's is %s\n", i, want->name,
                    got ? got->name : "(none)");
            CHECK(false);
            continue;
        }
        for (size_t k = 0; k < want->num_fields || k < got->num_fields; k++) {
            const char *w = k < want->num_fields ? want->fields[k] : "(none)";
            const char *g = k < got->num_fields ? got->fields[k].name : "(none)";
            if (strcmp(w, g) != 0) {
                fprintf(stderr, "%s: attn.h's field %zu is %s; attn_abi_layout's is %s\n",
                        want->name, k, w, g);
                CHECK(false);
                break;
            }
        }
        CHECK(want->num_fields == got->num_fields);
    }
    free(text);
}

/* Offsets ascend, fields lie inside the struct and do not overlap. */
static void check_table_sense(const attn_abi_struct *table, size_t count) {
    for (size_t i = 0; i < count; i++) {
        const attn_abi_struct *st = &table[i];
        CHECK(st->size > 0 && st->num_fields > 0 && st->fields != NULL);
        size_t end = 0;
        for (size_t k = 0; k < st->num_fields; k++) {
            const attn_abi_field *f = &st->fields[k];
            if (f->size == 0 || f->offset < end || f->offset + f->size > st->size) {
                fprintf(stderr, "%s.%s: offset %zu size %zu, previous field ends at %zu, "
                        "struct size %zu\n", st->name, f->name, f->offset, f->size, end, st->size);
                CHECK(false);
            }
            end = f->offset + f->size;
        }
        for (size_t j = 0; j < i; j++) CHECK(strcmp(table[j].name, st->name) != 0);
    }
}

/* A few entries against the compiler, written out independently of abi.c. */
static void check_entries(const attn_abi_struct *table, size_t count) {
    const attn_abi_struct *sdpa = find(table, count, "attn_sdpa_config");
    CHECK(sdpa && sdpa->size == sizeof(attn_sdpa_config));
    const attn_abi_field *f = field(sdpa, "cu_seqlens_kv");
    CHECK(f && f->offset == offsetof(attn_sdpa_config, cu_seqlens_kv) &&
          f->size == sizeof(const int32_t *));
    f = field(sdpa, "kv_strides");
    CHECK(f && f->offset == offsetof(attn_sdpa_config, kv_strides) &&
          f->size == 3 * sizeof(size_t));
    f = field(sdpa, "causal");
    CHECK(f && f->offset == offsetof(attn_sdpa_config, causal) && f->size == sizeof(bool));

    const attn_abi_struct *gen = find(table, count, "attn_generate_args");
    CHECK(gen && gen->size == sizeof(attn_generate_args) && gen->num_fields == 12);
    f = field(gen, "sampling");
    CHECK(f && f->offset == offsetof(attn_generate_args, sampling) &&
          f->size == sizeof(attn_sampling));

    const attn_abi_struct *cpu = find(table, count, "attn_cpu_info");
    f = field(cpu, "model_name");
    CHECK(f && f->offset == offsetof(attn_cpu_info, model_name) && f->size == 64);

    const attn_abi_struct *self = find(table, count, "attn_abi_struct");
    CHECK(self && self->size == sizeof(attn_abi_struct) && self->num_fields == 4);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_abi path/to/attn.h\n");
        return 2;
    }
    size_t count = 0;
    const attn_abi_struct *table = attn_abi_layout(&count);
    CHECK(table != NULL && count > 0);
    CHECK(attn_abi_layout(NULL) == table);

    CHECK(attn_abi_version() == ATTN_ABI_VERSION);
    /* docs/abi.md: while the version is 0.x, the ABI version is the minor. */
#if ATTN_VERSION_MAJOR == 0
    CHECK(ATTN_ABI_VERSION == ATTN_VERSION_MINOR);
#endif

    check_parser();
    check_against_header(argv[1], table, count);
    check_table_sense(table, count);
    check_entries(table, count);
    return check_summary();
}
