/*
 * test_print.c — tensor_print against literal text that PyTorch 1.13's
 * print(tensor) produced for the same float32 data.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tensor_print.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Reads back what fn wrote to a temporary FILE. Caller frees. */
static char *capture_tensor(const float *data, size_t ndim, const size_t *shape, int size_only) {
    FILE *f = tmpfile();
    if (!f) return NULL;
    if (size_only) attn_print_size(f, ndim, shape);
    else attn_print_tensor(f, data, ndim, shape);
    long n = ftell(f);
    char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (text) {
        rewind(f);
        size_t got = fread(text, 1, (size_t)n, f);
        text[got] = '\0';
    }
    fclose(f);
    return text;
}

/* attn_format_tensor and attn_print_tensor both produce want exactly. */
static void check_tensor_at(const char *file, int line, const float *data, size_t ndim,
                            const size_t *shape, const char *want) {
    size_t want_len = strlen(want);
    size_t cap = want_len + 16;
    char *buf = malloc(cap);
    size_t len = attn_format_tensor(buf, cap, data, ndim, shape);
    if (len == want_len && strcmp(buf, want) == 0) {
        check_passed++;
    } else {
        check_failed++;
        fprintf(stderr, "%s:%d: attn_format_tensor (length %zu, want %zu)\n--- want:\n%s--- got:\n%s---\n",
                file, line, len, want_len, want, buf);
    }
    free(buf);

    char *printed = capture_tensor(data, ndim, shape, 0);
    if (printed && strcmp(printed, want) == 0) {
        check_passed++;
    } else {
        check_failed++;
        fprintf(stderr, "%s:%d: attn_print_tensor\n--- want:\n%s--- got:\n%s---\n", file, line,
                want, printed ? printed : "(null)");
    }
    free(printed);
}

#define CHECK_TENSOR(data, ndim, shape, want) check_tensor_at(__FILE__, __LINE__, data, ndim, shape, want)

static void test_spec_examples(void) {
    const float v[] = {0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865};
    const size_t s6[] = {6};
    CHECK_TENSOR(v, 1, s6, "tensor([0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865])\n");

    const float m[] = {
        2, 2, 2, 2, 2, 2, /**/ 0, 2, 0, 0, 0, 0, /**/ 2, 2, 2, 0, 0, 0,
        0, 0, 0, 2, 0, 0, /**/ 2, 0, 2, 0, 2, 0, /**/ 0, 0, 0, 0, 0, 2,
    };
    const size_t s66[] = {6, 6};
    CHECK_TENSOR(m, 2, s66,
                 "tensor([[2., 2., 2., 2., 2., 2.],\n"
                 "        [0., 2., 0., 0., 0., 0.],\n"
                 "        [2., 2., 2., 0., 0., 0.],\n"
                 "        [0., 0., 0., 2., 0., 0.],\n"
                 "        [2., 0., 2., 0., 2., 0.],\n"
                 "        [0., 0., 0., 0., 0., 2.]])\n");

    const float one = 1.0f;
    CHECK_TENSOR(&one, 0, NULL, "tensor(1.)\n");
}

static void test_masked(void) {
    const float ninf = -INFINITY;
    const float m[] = {
        0.2899f, ninf, ninf, ninf, /**/ 0.1f, -0.25f, ninf, ninf,
        1.5f, 0.75f, -2.125f, ninf, /**/ 0.5f, 0.5f, 0.5f, 0.5f,
    };
    const size_t s[] = {4, 4};
    CHECK_TENSOR(m, 2, s,
                 "tensor([[ 0.2899,    -inf,    -inf,    -inf],\n"
                 "        [ 0.1000, -0.2500,    -inf,    -inf],\n"
                 "        [ 1.5000,  0.7500, -2.1250,    -inf],\n"
                 "        [ 0.5000,  0.5000,  0.5000,  0.5000]])\n");
}

static void test_rank3_and_4(void) {
    const float b[] = {
        2.0409,  -2.5557, 0.4181,  -0.5678, -0.4526, -0.2156, -2.0200, -0.2319,
        -0.8652, 3.3230,  0.2258,  -0.3526, -0.2813, -0.6680, -1.0552, -0.3908,
        0.4819,  -0.2386, 0.9578,  -0.1998, 0.0243,  1.5458,  0.5451,  -0.5052,
    };
    const size_t s[] = {2, 6, 2};
    CHECK_TENSOR(b, 3, s,
                 "tensor([[[ 2.0409, -2.5557],\n"
                 "         [ 0.4181, -0.5678],\n"
                 "         [-0.4526, -0.2156],\n"
                 "         [-2.0200, -0.2319],\n"
                 "         [-0.8652,  3.3230],\n"
                 "         [ 0.2258, -0.3526]],\n"
                 "\n"
                 "        [[-0.2813, -0.6680],\n"
                 "         [-1.0552, -0.3908],\n"
                 "         [ 0.4819, -0.2386],\n"
                 "         [ 0.9578, -0.1998],\n"
                 "         [ 0.0243,  1.5458],\n"
                 "         [ 0.5451, -0.5052]]])\n");

    float r4[8];
    for (size_t i = 0; i < 8; i++) r4[i] = (float)i / 4.0f - 0.5f;
    const size_t s4[] = {2, 2, 1, 2};
    CHECK_TENSOR(r4, 4, s4,
                 "tensor([[[[-0.5000, -0.2500]],\n"
                 "\n"
                 "         [[ 0.0000,  0.2500]]],\n"
                 "\n"
                 "\n"
                 "        [[[ 0.5000,  0.7500]],\n"
                 "\n"
                 "         [[ 1.0000,  1.2500]]]])\n");
}

static void test_modes(void) {
    const size_t s4[] = {4}, s5[] = {5};
    /* sci: min nonzero < 1e-4 and max/min > 1000 */
    const float sci[] = {1.5e-5f, 2.0f, -3.25e6f, 0.0f};
    CHECK_TENSOR(sci, 1, s4, "tensor([ 1.5000e-05,  2.0000e+00, -3.2500e+06,  0.0000e+00])\n");
    /* int mode that still goes sci: max > 1e8 */
    const float sci_int[] = {1.0f, 2.0e9f, -7.0f, 0.0f};
    CHECK_TENSOR(sci_int, 1, s4, "tensor([ 1.0000e+00,  2.0000e+09, -7.0000e+00,  0.0000e+00])\n");
    /* int mode: "N." right-aligned; -0 keeps its sign */
    const float ints[] = {-12.0f, 3.0f, 100.0f, 0.0f, -0.0f};
    CHECK_TENSOR(ints, 1, s5, "tensor([-12.,   3., 100.,   0.,  -0.])\n");
}

static void test_nonfinite(void) {
    const size_t s5[] = {5};
    const float mixed[] = {NAN, INFINITY, -INFINITY, 1.25f, -0.5f};
    CHECK_TENSOR(mixed, 1, s5, "tensor([    nan,     inf,    -inf,  1.2500, -0.5000])\n");
    /* no nonzero finite value: int mode, width 1, no "." on inf/nan */
    const float none[] = {0.0f, INFINITY, -NAN, -INFINITY, -0.0f};
    CHECK_TENSOR(none, 1, s5, "tensor([0., inf, nan, -inf, -0.])\n");
}

static void test_scalars(void) {
    const float nz = -0.0f, half = 0.5f, qnan = NAN, big = 123456.0f;
    CHECK_TENSOR(&nz, 0, NULL, "tensor(-0.)\n");
    CHECK_TENSOR(&half, 0, NULL, "tensor(0.5000)\n");
    CHECK_TENSOR(&qnan, 0, NULL, "tensor(nan)\n");
    CHECK_TENSOR(&big, 0, NULL, "tensor(123456.)\n");
}

static void test_empty(void) {
    const size_t s0[] = {0}, s03[] = {0, 3}, s203[] = {2, 0, 3};
    CHECK_TENSOR(NULL, 1, s0, "tensor([])\n");
    CHECK_TENSOR(NULL, 2, s03, "tensor([], size=(0, 3))\n");
    CHECK_TENSOR(NULL, 3, s203, "tensor([], size=(2, 0, 3))\n");
    /* a suffix that would pass column 80 goes on its own line */
    const size_t huge[] = {0, 1000000000000000u, 1000000000000000u, 1000000000000000u,
                           1000000000000000u};
    if (sizeof(size_t) >= 8)
        CHECK_TENSOR(NULL, 5, huge,
                     "tensor([],\n"
                     "       size=(0, 1000000000000000, 1000000000000000, 1000000000000000, "
                     "1000000000000000))\n");
}

static void test_summarized(void) {
    static float v[2000];
    for (size_t i = 0; i < LEN(v); i++) v[i] = (float)i * 0.5f;
    const size_t s1[] = {2000};
    CHECK_TENSOR(v, 1, s1,
                 "tensor([0.0000e+00, 5.0000e-01, 1.0000e+00,  ..., 9.9850e+02, 9.9900e+02,\n"
                 "        9.9950e+02])\n");

    static float m[40 * 50];
    for (size_t i = 0; i < LEN(m); i++) m[i] = (float)(i % 97) / 4.0f;
    const size_t s2[] = {40, 50};
    CHECK_TENSOR(m, 2, s2,
                 "tensor([[ 0.0000,  0.2500,  0.5000,  ..., 11.7500, 12.0000, 12.2500],\n"
                 "        [12.5000, 12.7500, 13.0000,  ...,  0.0000,  0.2500,  0.5000],\n"
                 "        [ 0.7500,  1.0000,  1.2500,  ..., 12.5000, 12.7500, 13.0000],\n"
                 "        ...,\n"
                 "        [ 1.7500,  2.0000,  2.2500,  ..., 13.5000, 13.7500, 14.0000],\n"
                 "        [14.2500, 14.5000, 14.7500,  ...,  1.7500,  2.0000,  2.2500],\n"
                 "        [ 2.5000,  2.7500,  3.0000,  ..., 14.2500, 14.5000, 14.7500]])\n");

    static float c[10 * 10 * 12];
    for (size_t i = 0; i < LEN(c); i++) c[i] = (float)i - 600.0f;
    const size_t s3[] = {10, 10, 12};
    CHECK_TENSOR(c, 3, s3,
                 "tensor([[[-600., -599., -598.,  ..., -591., -590., -589.],\n"
                 "         [-588., -587., -586.,  ..., -579., -578., -577.],\n"
                 "         [-576., -575., -574.,  ..., -567., -566., -565.],\n"
                 "         ...,\n"
                 "         [-516., -515., -514.,  ..., -507., -506., -505.],\n"
                 "         [-504., -503., -502.,  ..., -495., -494., -493.],\n"
                 "         [-492., -491., -490.,  ..., -483., -482., -481.]],\n"
                 "\n"
                 "        [[-480., -479., -478.,  ..., -471., -470., -469.],\n"
                 "         [-468., -467., -466.,  ..., -459., -458., -457.],\n"
                 "         [-456., -455., -454.,  ..., -447., -446., -445.],\n"
                 "         ...,\n"
                 "         [-396., -395., -394.,  ..., -387., -386., -385.],\n"
                 "         [-384., -383., -382.,  ..., -375., -374., -373.],\n"
                 "         [-372., -371., -370.,  ..., -363., -362., -361.]],\n"
                 "\n"
                 "        [[-360., -359., -358.,  ..., -351., -350., -349.],\n"
                 "         [-348., -347., -346.,  ..., -339., -338., -337.],\n"
                 "         [-336., -335., -334.,  ..., -327., -326., -325.],\n"
                 "         ...,\n"
                 "         [-276., -275., -274.,  ..., -267., -266., -265.],\n"
                 "         [-264., -263., -262.,  ..., -255., -254., -253.],\n"
                 "         [-252., -251., -250.,  ..., -243., -242., -241.]],\n"
                 "\n"
                 "        ...,\n"
                 "\n"
                 "        [[ 240.,  241.,  242.,  ...,  249.,  250.,  251.],\n"
                 "         [ 252.,  253.,  254.,  ...,  261.,  262.,  263.],\n"
                 "         [ 264.,  265.,  266.,  ...,  273.,  274.,  275.],\n"
                 "         ...,\n"
                 "         [ 324.,  325.,  326.,  ...,  333.,  334.,  335.],\n"
                 "         [ 336.,  337.,  338.,  ...,  345.,  346.,  347.],\n"
                 "         [ 348.,  349.,  350.,  ...,  357.,  358.,  359.]],\n"
                 "\n"
                 "        [[ 360.,  361.,  362.,  ...,  369.,  370.,  371.],\n"
                 "         [ 372.,  373.,  374.,  ...,  381.,  382.,  383.],\n"
                 "         [ 384.,  385.,  386.,  ...,  393.,  394.,  395.],\n"
                 "         ...,\n"
                 "         [ 444.,  445.,  446.,  ...,  453.,  454.,  455.],\n"
                 "         [ 456.,  457.,  458.,  ...,  465.,  466.,  467.],\n"
                 "         [ 468.,  469.,  470.,  ...,  477.,  478.,  479.]],\n"
                 "\n"
                 "        [[ 480.,  481.,  482.,  ...,  489.,  490.,  491.],\n"
                 "         [ 492.,  493.,  494.,  ...,  501.,  502.,  503.],\n"
                 "         [ 504.,  505.,  506.,  ...,  513.,  514.,  515.],\n"
                 "         ...,\n"
                 "         [ 564.,  565.,  566.,  ...,  573.,  574.,  575.],\n"
                 "         [ 576.,  577.,  578.,  ...,  585.,  586.,  587.],\n"
                 "         [ 588.,  589.,  590.,  ...,  597.,  598.,  599.]]])\n");
}

static void test_wrapping(void) {
    float v[30], w[30];
    for (size_t i = 0; i < 30; i++) {
        v[i] = (float)i / 8.0f;
        w[i] = (float)(-3 * (int)i); /* integer math: no -0 at i == 0 */
    }
    const size_t s[] = {30};
    CHECK_TENSOR(v, 1, s,
                 "tensor([0.0000, 0.1250, 0.2500, 0.3750, 0.5000, 0.6250, 0.7500, 0.8750, 1.0000,\n"
                 "        1.1250, 1.2500, 1.3750, 1.5000, 1.6250, 1.7500, 1.8750, 2.0000, 2.1250,\n"
                 "        2.2500, 2.3750, 2.5000, 2.6250, 2.7500, 2.8750, 3.0000, 3.1250, 3.2500,\n"
                 "        3.3750, 3.5000, 3.6250])\n");
    CHECK_TENSOR(w, 1, s,
                 "tensor([  0.,  -3.,  -6.,  -9., -12., -15., -18., -21., -24., -27., -30., -33.,\n"
                 "        -36., -39., -42., -45., -48., -51., -54., -57., -60., -63., -66., -69.,\n"
                 "        -72., -75., -78., -81., -84., -87.])\n");
}

static void test_truncation(void) {
    const float v[] = {0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865};
    const size_t s[] = {6};
    const char *full = "tensor([0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865])\n";
    const size_t full_len = strlen(full);
    char buf[128];

    /* cap 0: nothing written, NULL allowed, full length returned */
    CHECK(attn_format_tensor(NULL, 0, v, 1, s) == full_len);
    memset(buf, 'X', sizeof buf);
    CHECK(attn_format_tensor(buf, 0, v, 1, s) == full_len);
    CHECK(buf[0] == 'X');

    /* cap 1: just the terminator */
    memset(buf, 'X', sizeof buf);
    CHECK(attn_format_tensor(buf, 1, v, 1, s) == full_len);
    CHECK(buf[0] == '\0' && buf[1] == 'X');

    /* cap 10: the first 9 bytes, terminated, nothing past cap touched */
    memset(buf, 'X', sizeof buf);
    CHECK(attn_format_tensor(buf, 10, v, 1, s) == full_len);
    CHECK(strcmp(buf, "tensor([0") == 0);
    CHECK(buf[10] == 'X');

    /* cap == length: everything but the final newline */
    memset(buf, 'X', sizeof buf);
    CHECK(attn_format_tensor(buf, full_len, v, 1, s) == full_len);
    CHECK(strlen(buf) == full_len - 1 && strncmp(buf, full, full_len - 1) == 0);
    CHECK(buf[full_len] == 'X');

    /* cap == length + 1: the whole text */
    memset(buf, 'X', sizeof buf);
    CHECK(attn_format_tensor(buf, full_len + 1, v, 1, s) == full_len);
    CHECK(strcmp(buf, full) == 0);
    CHECK(buf[full_len + 1] == 'X');

    /* a truncated summarized tensor still reports the full length */
    static float big[2000];
    for (size_t i = 0; i < LEN(big); i++) big[i] = (float)i * 0.5f;
    const size_t sb[] = {2000};
    const char *big_text = "tensor([0.0000e+00, 5.0000e-01, 1.0000e+00,  ..., 9.9850e+02, 9.9900e+02,\n"
                           "        9.9950e+02])\n";
    memset(buf, 'X', sizeof buf);
    CHECK(attn_format_tensor(buf, 16, big, 1, sb) == strlen(big_text));
    CHECK(strcmp(buf, "tensor([0.0000e") == 0);
}

static void test_size(void) {
    const size_t s3[] = {2, 6, 3}, s1[] = {5}, s0[] = {0, 4};
    char *t;
    t = capture_tensor(NULL, 3, s3, 1);
    CHECK(t && strcmp(t, "torch.Size([2, 6, 3])\n") == 0);
    free(t);
    t = capture_tensor(NULL, 1, s1, 1);
    CHECK(t && strcmp(t, "torch.Size([5])\n") == 0);
    free(t);
    t = capture_tensor(NULL, 0, NULL, 1);
    CHECK(t && strcmp(t, "torch.Size([])\n") == 0);
    free(t);
    t = capture_tensor(NULL, 2, s0, 1);
    CHECK(t && strcmp(t, "torch.Size([0, 4])\n") == 0);
    free(t);
}

int main(void) {
    test_spec_examples();
    test_masked();
    test_rank3_and_4();
    test_modes();
    test_nonfinite();
    test_scalars();
    test_empty();
    test_summarized();
    test_wrapping();
    test_truncation();
    test_size();
    return check_summary();
}
