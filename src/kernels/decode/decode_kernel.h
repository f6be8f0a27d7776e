/*
 * decode_kernel.h — the decode chunk kernel (decode.h), written once over a
 * small vector vocabulary and compiled once per instruction set
 * (decode_avx512.c, decode_avx2.c, decode_portable.c define it, then
 * include this).
 *
 * The includer includes its instruction set's vector vocabulary
 * (kernels/vec/vec_*.h: VW, a divisor of ATTN_DECODE_BLOCK, vec, v_zero,
 * v_set1, v_load, v_in_register, v_store, v_fma, v_mul, v_sub, v_add,
 * v_max, v_exp2 for x <= 0 (exactly 0 at -inf), v_tanh, v_hmax, v_hsum),
 * then defines:
 *   v_reduce_block(part, out, max)  out[j] = the sum of part[j]'s lanes
 *                      (max: their largest), j < 16, all at once
 *   v_from_bf16(p), v_from_f16(p)  VW 16-bit elements widened (exact)
 *   DECODE_BF16_PAIRS 1 and v_from_bf16_pair(p, &even, &odd)  (optional)
 *                      2 VW bf16 elements as the vector of the even ones
 *                      and the vector of the odd ones
 *   v_from_e4m3(p)     VW fp8 e4m3 codes as their value / 256 (exact)
 *   v_from_i8(p)       VW int8 codes
 *   v_from_i4(p, hi)   the low (hi 0) or high nibbles of VW bytes, less 8
 *   DECODE_KERNELS     the name of the attn_decode_kernels table to define
 *   DECODE_ISA_NAME    "avx512", ...
 *
 * Per block of keys (16 positions) and KV head: up to 4 query heads of the
 * group score the block's 16 key slices together (each key vector loaded
 * once for them; partial vectors summed together by v_reduce_block), each
 * takes the block's max and weights (online softmax), and the heads then
 * weigh the value slices together, each value vector loaded once for them
 * (GQA). The block visits each position's row once per KV head, a slice
 * at a time, an order the hardware prefetchers do not follow: the next
 * block's rows are asked for in address order, spread over this block's
 * arithmetic (prefetch_stream).
 * A block map (decode.h) turns into hidden lanes per block, per row or per
 * (row, query head): a block no row sees is not read, and a key block of
 * the map that no row sees is jumped over.
 *
 * K and V are read in their stored formats (contract/kv_format.h), widened
 * in registers as they are loaded: a row's one scale (F8_E4M3, I8) is
 * applied once to its key's score and to its value's weight, an I4 group's
 * to the group's elements. The format is a constant in each function below
 * (always inlined from a switch), so that each format's loop is its own.
 * A kernel set may read bf16 two vectors at a time, the even elements and
 * the odd ones (DECODE_BF16_PAIRS: a shift or a mask a vector): the
 * queries are then put in that order once per chunk, and the value sums
 * are kept in it until the chunk ends (pair_order).
 *
 * Softcap and ALiBi change a (row, head)'s block of scores between scoring
 * and its softmax step (modify_scores), a branch per block that a call
 * without them never takes; sinks are the caller's (decode.h).
 */
#include "kernels/decode/decode.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#define BK ATTN_DECODE_BLOCK
_Static_assert(BK % VW == 0, "a key block is whole vectors");
_Static_assert(BK == 16, "v_reduce_block folds 16 vectors");

#define ALWAYS_INLINE inline __attribute__((always_inline))

#ifndef DECODE_BF16_PAIRS
#define DECODE_BF16_PAIRS 0
/* Not called where DECODE_BF16_PAIRS is 0 (bf16_pairs); correct anyway. */
static inline void v_from_bf16_pair(const uint16_t *p, vec *even, vec *odd) {
    float e[VW], o[VW];
    for (size_t i = 0; i < VW; i++) {
        e[i] = attn_bf16_to_float(p[2 * i]);
        o[i] = attn_bf16_to_float(p[2 * i + 1]);
    }
    *even = v_load(e);
    *odd = v_load(o);
}
#endif

/* Whether rows of format T are read in pairs of vectors. */
static ALWAYS_INLINE bool bf16_pairs(attn_dtype T) {
    return DECODE_BF16_PAIRS && T == ATTN_DTYPE_BF16;
}

/* CALL(T) with T the storage format dtype as a constant: each format's
 * always-inlined loops become a function body of their own. */
#define FOR_FORMAT(dtype, CALL)                                                                \
    switch (dtype) {                                                                           \
    case ATTN_DTYPE_BF16: CALL(ATTN_DTYPE_BF16); break;                                        \
    case ATTN_DTYPE_F16: CALL(ATTN_DTYPE_F16); break;                                          \
    case ATTN_DTYPE_F8_E4M3: CALL(ATTN_DTYPE_F8_E4M3); break;                                  \
    case ATTN_DTYPE_I8: CALL(ATTN_DTYPE_I8); break;                                            \
    case ATTN_DTYPE_I4: CALL(ATTN_DTYPE_I4); break;                                            \
    default: CALL(ATTN_DTYPE_F32); break;                                                      \
    }

/* Elements [d, d + VW) of a row of format T (codes row, scales sc): F8_E4M3
 * and I8 without their row's scale, I4 with its group's. */
static ALWAYS_INLINE vec load_elems(attn_dtype T, const uint8_t *row, const float *sc, size_t d) {
    switch (T) {
    case ATTN_DTYPE_BF16: return v_from_bf16((const uint16_t *)row + d);
    case ATTN_DTYPE_F16: return v_from_f16((const uint16_t *)row + d);
    case ATTN_DTYPE_F8_E4M3: return v_from_e4m3(row + d);
    case ATTN_DTYPE_I8: return v_from_i8((const int8_t *)row + d);
    case ATTN_DTYPE_I4: {
        size_t g = d / ATTN_KV_I4_GROUP, i = d % ATTN_KV_I4_GROUP;
        return v_mul(v_from_i4(row + g * (ATTN_KV_I4_GROUP / 2) + i % 16, i >= 16),
                     v_set1(sc[g]));
    }
    default: return v_load((const float *)row + d);
    }
}

/* Element d of a row, as load_elems reads it. */
static inline float load_one(attn_dtype T, const uint8_t *row, const float *sc, size_t d) {
    switch (T) {
    case ATTN_DTYPE_F8_E4M3: return attn_e4m3_to_float(row[d]) * 0x1p-8f;
    case ATTN_DTYPE_I8: return (float)((const int8_t *)row)[d];
    case ATTN_DTYPE_F32: return ((const float *)row)[d];
    default: {
        attn_kv_format f = {.dtype = T};
        return attn_kv_read(&f, row, sc, d);
    }
    }
}

/* Whether T's rows carry one scale, applied outside load_elems. */
static inline bool row_scaled(attn_dtype T) {
    return T == ATTN_DTYPE_F8_E4M3 || T == ATTN_DTYPE_I8;
}

/* That scale as the factor of load_elems' values. */
static inline float row_factor(attn_dtype T, const float *sc) {
    return T == ATTN_DTYPE_F8_E4M3 ? sc[0] * 256.0f : sc[0];
}

/* KV head kh's codes and scales in a position's row of K (v false) or V. */
static inline const uint8_t *head_codes(const attn_decode_row *r, bool v, const attn_kv_format *f,
                                        size_t kh) {
    return (v ? r->v : r->k) + kh * f->head_bytes;
}
static inline const float *head_scales(const attn_decode_row *r, bool v, const attn_kv_format *f,
                                       size_t kh) {
    return attn_decode_scales_at(v ? r->vs : r->ks, kh, f->head_scales);
}

/*
 * The next block's rows, asked for while this block is worked on: every
 * row's K codes, then every row's V codes, then their scales, in address
 * order, a few cache lines at a time. The block's own reads visit each row
 * a head's slice at a time, an order the hardware prefetchers follow
 * poorly once arithmetic sits between the reads; a stream in address order,
 * spread evenly over the block's arithmetic (a share per vector the block
 * loads), keeps the memory busy under it. Lines go to L2 (locality 1),
 * leaving L1 and its fill buffers to the block's own loads.
 */
typedef struct prefetch_stream {
    const uint8_t *seg[4 * BK]; /* line-aligned starts of the rows' parts */
    size_t seg_end[4 * BK];     /* and their lengths from there */
    size_t segs, seg_at, byte_at;
    size_t lines, issued;  /* lines in all, asked for so far */
    uint64_t rate, credit; /* lines per vector read, 16.16 fixed point */
} prefetch_stream;

static void stream_add(prefetch_stream *ps, const void *p, size_t bytes) {
    if (!bytes) return;
    uintptr_t at = (uintptr_t)p, start = at & ~(uintptr_t)63;
    ps->seg[ps->segs] = (const uint8_t *)start;
    ps->seg_end[ps->segs++] = at + bytes - start;
    ps->lines += (at + bytes - start + 63) / 64;
}

/* A stream over the n rows of a block whose reading loads `vectors` vectors
 * of K and V. */
static void stream_start(prefetch_stream *ps, const attn_decode_keys *keys,
                         const attn_decode_row *rows, size_t n, size_t vectors) {
    ps->segs = ps->seg_at = ps->byte_at = ps->lines = ps->issued = 0;
    ps->credit = 0;
    for (size_t j = 0; j < n; j++) stream_add(ps, rows[j].k, keys->k.row_bytes);
    for (size_t j = 0; j < n; j++) stream_add(ps, rows[j].v, keys->v.row_bytes);
    for (size_t j = 0; j < n; j++) {
        stream_add(ps, rows[j].ks, keys->k.row_scales * sizeof(float));
        stream_add(ps, rows[j].vs, keys->v.row_scales * sizeof(float));
    }
    ps->rate = vectors ? (((uint64_t)ps->lines << 16) + vectors - 1) / vectors : 0;
}

/* Asks for the next n lines of the stream (fewer where it ends). */
static inline void stream_issue(prefetch_stream *ps, size_t n) {
    size_t seg = ps->seg_at, at = ps->byte_at, left = n;
    while (left && seg < ps->segs) {
        const uint8_t *p = ps->seg[seg];
        size_t end = ps->seg_end[seg];
        for (; left && at < end; left--, at += 64) __builtin_prefetch(p + at, 0, 1);
        if (at >= end) {
            seg++;
            at = 0;
        }
    }
    ps->seg_at = seg;
    ps->byte_at = at;
    ps->issued += n - left;
}

/* The stream's share for `vectors` vectors of K or V read (ps NULL: none). */
static inline void stream_step(prefetch_stream *ps, size_t vectors) {
    if (!ps) return;
    ps->credit += vectors * ps->rate;
    stream_issue(ps, (size_t)(ps->credit >> 16));
    ps->credit &= 0xFFFF;
}

/* Asks for the stream's lines up to fraction num / den of it, where the
 * steps fell behind (a row that sees part of a block, a map). */
static inline void stream_catch_up(prefetch_stream *ps, size_t num, size_t den) {
    size_t want = ps->lines * num / den;
    if (want > ps->issued) stream_issue(ps, want - ps->issued);
}

/* Keys scored at once in score_heads: with 4 query heads, 4 x KEYS
 * accumulators, KEYS key vectors and a query vector in registers. */
#define KEYS (VW == 16 ? 4 : 2)

/* Registers of accumulators per query head in weigh_heads. */
#define WEIGH_VECS (VW == 16 ? 4 : 2)
_Static_assert(WEIGH_VECS % 2 == 0, "weigh_heads' passes cover whole pairs of vectors");

/* The elements of a row of D that a bf16 row's pairs of vectors cover
 * (bf16_pairs): weigh_heads' whole passes of WEIGH_VECS vectors, which
 * score_heads reads in pairs too, the rest one vector or one element at a
 * time in order. */
static inline size_t paired_dims(size_t D) {
    return DECODE_BF16_PAIRS ? D / (WEIGH_VECS * VW) * (WEIGH_VECS * VW) : 0;
}

/* x (D) into pair order (to_pairs), or back: each 2 VW elements of the
 * first paired_dims(D) as v_from_bf16_pair loads them, the even ones
 * first. The queries go into it, so that a pair of key vectors meets the
 * query elements it multiplies; the value sums are made in it, and come
 * back to element order once a chunk is done. */
static void pair_order(float *x, size_t D, bool to_pairs) {
    float t[2 * VW];
    for (size_t c = 0; c < paired_dims(D); c += 2 * VW) {
        for (size_t i = 0; i < 2 * VW; i++) t[i] = x[c + i];
        for (size_t i = 0; i < VW; i++) {
            if (to_pairs) {
                x[c + i] = t[2 * i];
                x[c + VW + i] = t[2 * i + 1];
            } else {
                x[c + 2 * i] = t[i];
                x[c + 2 * i + 1] = t[VW + i];
            }
        }
    }
}

/* The block's scores (base 2) of a row-scaled K (F8_E4M3, I8) that came
 * out infinite or NaN, summed again in double: the float sum of a query
 * with a row's raw codes (up to 127, or 1.75) overflows where the query is
 * far above 1 (past about FLT_MAX / (127 head_dim)), while the key, the
 * codes times their small factor, scores finite. A score that is not
 * finite in double either (a NaN row, a non-finite query) stays so. Out
 * of line: the scores of a block only test for it. */
__attribute__((noinline, cold)) static void
rescore_overflow(attn_dtype T, const float *q, const attn_decode_row *rows,
                 const attn_kv_format *f, size_t kh, size_t jlo, size_t jhi, float scale2,
                 const float *kfac, float *o) {
    for (size_t j = jlo; j < jhi; j++) {
        if (fabsf(o[j]) <= 3.4028235e38f) continue;
        const uint8_t *codes = head_codes(&rows[j], false, f, kh);
        double sum = 0.0;
        for (size_t d = 0; d < f->head_dim; d++)
            sum += (double)q[d] * load_one(T, codes, NULL, d);
        o[j] = (float)(sum * kfac[j] * scale2);
    }
}

/*
 * out_g[j] = base-2 scores of the NG query heads q_g (NG <= 4, a constant
 * where inlined) of one KV head kh against its keys in rows[j], j in [jlo,
 * jhi) (the rest of the block 0). Keys go KEYS at a time: each element
 * vector of a key is loaded (and widened) once for the NG heads, and each
 * query vector once for the KEYS keys, so that a fused multiply-add needs
 * half a load; the partial vectors of a head's 16 keys are summed all at
 * once. A score's operations are the same whatever NG and whichever keys
 * share its pass. Where T is read in pairs (bf16_pairs), q is in pair
 * order (pair_order).
 */
static ALWAYS_INLINE void score_heads(attn_dtype T, size_t NG, const float *const *q,
                                      const attn_decode_row *rows, const attn_kv_format *f,
                                      size_t kh, size_t jlo, size_t jhi, float scale2,
                                      const float *kfac, float *const *out, prefetch_stream *ps) {
    size_t D = f->head_dim, whole = D / VW * VW;
    vec part[4][BK];
    for (size_t j0 = 0; j0 < BK; j0 += KEYS) {
        stream_step(ps, KEYS * (D / VW));
        if (j0 + KEYS <= jlo || j0 >= jhi) {
            for (size_t g = 0; g < NG; g++)
                for (size_t jj = 0; jj < KEYS; jj++) part[g][j0 + jj] = v_zero();
            continue;
        }
        /* a key outside [jlo, jhi) reads key jlo's row, and its sum is dropped */
        const uint8_t *kc[KEYS];
        const float *ks[KEYS];
        for (size_t jj = 0; jj < KEYS; jj++) {
            size_t j = j0 + jj >= jlo && j0 + jj < jhi ? j0 + jj : jlo;
            kc[jj] = head_codes(&rows[j], false, f, kh);
            ks[jj] = head_scales(&rows[j], false, f, kh);
        }
        vec acc[4][KEYS];
        for (size_t g = 0; g < NG; g++)
            for (size_t jj = 0; jj < KEYS; jj++) acc[g][jj] = v_zero();
        size_t d = 0;
        for (; bf16_pairs(T) && d < paired_dims(D); d += 2 * VW) {
            vec even[KEYS], odd[KEYS];
            for (size_t jj = 0; jj < KEYS; jj++)
                v_from_bf16_pair((const uint16_t *)kc[jj] + d, &even[jj], &odd[jj]);
            for (size_t g = 0; g < NG; g++) {
                vec qe = v_load(q[g] + d), qo = v_load(q[g] + d + VW);
                v_in_register(&qe);
                v_in_register(&qo);
                for (size_t jj = 0; jj < KEYS; jj++)
                    acc[g][jj] = v_fma(qo, odd[jj], v_fma(qe, even[jj], acc[g][jj]));
            }
        }
        for (; d < whole; d += VW) {
            vec kv[KEYS];
            for (size_t jj = 0; jj < KEYS; jj++) kv[jj] = load_elems(T, kc[jj], ks[jj], d);
            for (size_t g = 0; g < NG; g++) {
                vec qv = v_load(q[g] + d);
                v_in_register(&qv); /* one load for the KEYS keys */
                for (size_t jj = 0; jj < KEYS; jj++) acc[g][jj] = v_fma(qv, kv[jj], acc[g][jj]);
            }
        }
        for (size_t g = 0; g < NG; g++)
            for (size_t jj = 0; jj < KEYS; jj++)
                part[g][j0 + jj] = j0 + jj >= jlo && j0 + jj < jhi ? acc[g][jj] : v_zero();
    }
    vec s = v_set1(scale2), bad = v_zero(); /* NaN where a score is infinite or NaN (x * 0) */
    for (size_t g = 0; g < NG; g++) {
        float *o = out[g];
        v_reduce_block(part[g], o, 0);
        for (size_t d = whole; d < D; d++) /* the tail */
            for (size_t j = jlo; j < jhi; j++)
                o[j] = fmaf(q[g][d], load_one(T, head_codes(&rows[j], false, f, kh),
                                              head_scales(&rows[j], false, f, kh), d),
                            o[j]);
        if (row_scaled(T))
            for (size_t t = 0; t < BK; t += VW)
                v_store(o + t, v_mul(v_load(o + t), v_load(kfac + t)));
        for (size_t t = 0; t < BK; t += VW) {
            vec x = v_mul(v_load(o + t), s);
            v_store(o + t, x);
            if (row_scaled(T)) bad = v_add(bad, v_mul(x, v_zero()));
        }
    }
    if (row_scaled(T) && v_any_nan(bad))
        for (size_t g = 0; g < NG; g++)
            rescore_overflow(T, q[g], rows, f, kh, jlo, jhi, scale2, kfac, out[g]);
}

/* score_heads with NG and T constants. */
static ALWAYS_INLINE void score_group_t(attn_dtype T, size_t NG, const float *const *q,
                                        const attn_decode_row *rows, const attn_kv_format *f,
                                        size_t kh, size_t jlo, size_t jhi, float scale2,
                                        const float *kfac, float *const *out, prefetch_stream *ps) {
#define HEADS(n) score_heads(T, n, q, rows, f, kh, jlo, jhi, scale2, kfac, out, ps)
    switch (NG) {
    case 4: HEADS(4); break;
    case 3: HEADS(3); break;
    case 2: HEADS(2); break;
    default: HEADS(1); break;
    }
#undef HEADS
}

/* The scores of NG heads (score_heads); kfac: the block's keys' row
 * factors (row_factor) where K's format has one; ps: the next block's
 * stream, stepped meanwhile (NULL: none). */
static void score_group(size_t NG, const float *const *q, const attn_decode_row *rows,
                        const attn_kv_format *f, size_t kh, size_t jlo, size_t jhi, float scale2,
                        const float *kfac, float *const *out, prefetch_stream *ps) {
#define SCORE(T) score_group_t(T, NG, q, rows, f, kh, jlo, jhi, scale2, kfac, out, ps)
    FOR_FORMAT(f->dtype, SCORE);
#undef SCORE
}

#ifndef DECODE_AMX
#define DECODE_AMX 0
#endif

#if DECODE_AMX
/*
 * bf16 and int8 keys on AMX tiles (the includer compiles with -mamx-tile
 * -mamx-bf16 -mamx-int8). A block's scores for a group of up to 4 query
 * heads are one tile product per 64 bytes of a key's row (amx_dims: 32
 * bf16 elements, 64 int8 ones): A, the block's 16 keys (rows) by those 64
 * bytes, read straight from the cache where the keys' rows lie evenly
 * apart, else copied; B, the group's queries in the pairs (bf16) or fours
 * (int8) of elements the product takes, by 16 columns; C, 16 keys by 16
 * columns, sums them. Column 4 p + g holds part p of head g's query:
 *   bf16: a float32 query is the exact sum of three bf16 parts, the top,
 *     middle and last 8 bits of its significand (each cut by truncation,
 *     so that each remainder is exact; column 12 on, zeros). Each product
 *     of a key and a part is exact, and a score loses what a float32 dot
 *     product loses; the parts' sums join, the smallest first. The tiles
 *     flush subnormal inputs, products and sums to zero: a head whose
 *     largest element is below 1 is scaled up to [1, 2) first (exactly,
 *     by a power of two taken back out with the scale), and a part below
 *     2^-126 (an element about 2^-110 of its head's largest) counts as 0.
 *   int8: a head's queries in fixed point, x 2^(27 - e) rounded to nearest
 *     (|q| < 2^e for the head's every element), as four signed base-128
 *     digits; each digit's sum over a key's codes is an exact integer (at
 *     most 64 x 128 x 127 in a product), the four join in float, and the
 *     head's 2^(e - 27) and the key's row factor scale the sum. A query
 *     element is then within 2^-27 of the head's largest; a chunk whose
 *     queries hold a NaN or an infinity, or a head whose largest element
 *     is far above the rest, stays on the vector path (amx_queries_i8).
 */
/* Tile registers (literals: the intrinsics paste them into register
 * names): three pairs of A and B, taken in turn so that a pair's loads
 * need not wait for the product just issued, and two C, one a group, so
 * that a group's products need not wait for the last group's store.
 * Every tile is 16 rows of 64 bytes (amx_tiles.h). */
#define AMX_PRODUCT(A, B, C)                                                                       \
    do {                                                                                           \
        _tile_loadd(A, a, a_stride);                                                               \
        _tile_loadd(B, bt, 64);                                                                    \
        if (T == ATTN_DTYPE_I8) _tile_dpbssd(C, A, B);                                             \
        else _tile_dpbf16ps(C, A, B);                                                              \
    } while (0)
#define AMX_B_WORDS 512  /* a B tile's 16-bit words */
#define AMX_C_FLOATS 256 /* a C tile's floats (or int32) */
_Static_assert(BK == 16, "a block's keys are a tile's 16 rows");
_Static_assert(AMX_C_FLOATS * 4 == 1024 && AMX_B_WORDS * 2 == 1024, "16 rows of 64 bytes");

/* Elements of head_dim one tile product covers: 64 bytes of a key. */
static inline size_t amx_dims(attn_dtype T) { return T == ATTN_DTYPE_I8 ? 64 : 32; }

/* A group's B tiles and, after them, its heads' factors (4 floats). */
static inline size_t amx_group_words(attn_dtype T, size_t D) {
    return D / amx_dims(T) * AMX_B_WORDS + 8;
}

/* The B tiles of a group's NG heads' queries q_g, bf16 (amx_group_words
 * words): tile t's row i holds 16 dwords, dword n the pair of elements
 * 32 t + 2 i, 32 t + 2 i + 1 of part n / 4 of head n % 4 (zeros past NG
 * and past 12). A part's 16 pairs of elements are 16 dwords, one a row.
 * A head whose largest |q| is below 1 goes in times 2^shift, which brings
 * it to [1, 2) exactly, so that the tiles, which flush subnormal products
 * and sums to zero, meet no smaller ones than its own elements make. The
 * heads' factors follow the tiles: scale2 times 2^-shift, rounded once (in
 * double, where 2^-shift may pass float's range). */
static void amx_queries_bf16(size_t NG, const float *const *q, size_t D, float scale2,
                             uint16_t *b) {
    const __m512i top_bits = _mm512_set1_epi32((int)0xFFFF0000u);
    memset(b, 0, amx_group_words(ATTN_DTYPE_BF16, D) * sizeof *b);
    float *factor = (float *)(b + D / 32 * AMX_B_WORDS);
    int shift[4];
    __m512 up[4][2]; /* 2^shift as two factors: past 2^127 it passes float */
    for (size_t g = 0; g < NG; g++) {
        __m512 mx = _mm512_setzero_ps();
        for (size_t d = 0; d < D; d += 16)
            mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(q[g] + d)));
        float amax = _mm512_reduce_max_ps(mx);
        int e = 1;
        if (amax > 0.0f && amax < 1.0f) (void)frexpf(amax, &e); /* amax < 2^e */
        shift[g] = 1 - e;
        factor[g] = (float)ldexp((double)scale2, -shift[g]);
        up[g][0] = _mm512_set1_ps(ldexpf(1.0f, shift[g] > 127 ? 127 : shift[g]));
        up[g][1] = _mm512_set1_ps(ldexpf(1.0f, shift[g] > 127 ? shift[g] - 127 : 0));
    }
    for (size_t t = 0; t < D / 32; t++) {
        uint32_t *tile = (uint32_t *)(b + t * AMX_B_WORDS);
        for (size_t g = 0; g < NG; g++) {
            __m512 x[2];
            for (size_t h = 0; h < 2; h++) /* exact: scaled up, below 2 */
                x[h] = _mm512_mul_ps(
                    _mm512_mul_ps(_mm512_loadu_ps(q[g] + t * 32 + 16 * h), up[g][0]), up[g][1]);
            for (size_t part = 0; part < 3; part++) {
                uint32_t pairs[16];
                for (size_t h = 0; h < 2; h++) {
                    __m512i bits = _mm512_and_si512(_mm512_castps_si512(x[h]), top_bits);
                    _mm256_storeu_si256((__m256i *)pairs + h,
                                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
                    /* exact: the part is x with its low 16 bits cleared */
                    x[h] = _mm512_sub_ps(x[h], _mm512_castsi512_ps(bits));
                }
                for (size_t i = 0; i < 16; i++) tile[i * 16 + 4 * part + g] = pairs[i];
            }
        }
    }
}

/* The same for int8 keys: tile t's row i, dword n holds elements 64 t +
 * 4 i .. 64 t + 4 i + 3 of digit n / 4 (the top first) of head n % 4;
 * the heads' factors scale2 2^(e - 27) after the tiles (the digits are q
 * 2^(27 - e); in double, rounded once).
 * False, the tiles unfinished, where a head does not go on the tiles: an
 * element not finite (the digits need a finite largest), or its largest
 * |q| past 16 times its mean |q|. A digit's step is 2^-27 of the largest,
 * or less, so a score errs by at most 2^-27 max|q| sum|k|, inside
 * float32's rounding of sum |q k| only while the largest element is not
 * far above the rest: a head with one element far above the others (a
 * "massive activation") goes on the vector path. */
static bool amx_queries_i8(size_t NG, const float *const *q, size_t D, float scale2,
                           uint16_t *b) {
    memset(b, 0, amx_group_words(ATTN_DTYPE_I8, D) * sizeof *b);
    float *factor = (float *)(b + D / 64 * AMX_B_WORDS);
    for (size_t g = 0; g < NG; g++) {
        __m512 bad = _mm512_setzero_ps(), mx = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
        for (size_t d = 0; d < D; d += 16) {
            __m512 v = _mm512_loadu_ps(q[g] + d), a = _mm512_abs_ps(v);
            bad = _mm512_or_ps(bad, _mm512_sub_ps(v, v)); /* 0, or NaN */
            mx = _mm512_max_ps(mx, a);
            sum = _mm512_add_ps(sum, a);
        }
        float amax = _mm512_reduce_max_ps(mx);
        if (_mm512_reduce_add_ps(bad) != 0.0f ||
            (double)amax * (double)D > 16.0 * (double)_mm512_reduce_add_ps(sum))
            return false;
        if (amax == 0.0f) continue;
        int e;
        (void)frexpf(amax, &e); /* amax < 2^e */
        factor[g] = (float)ldexp((double)scale2, e - 27);
        __m512d up = _mm512_set1_pd(ldexp(1.0, 27 - e)); /* in double: 2^(27 - e) may pass float */
        for (size_t d = 0; d < D; d += 16) {
            __m512 x = _mm512_loadu_ps(q[g] + d);
            __m256i lo = _mm512_cvtpd_epi32(
                _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), up));
            __m256i hi = _mm512_cvtpd_epi32(
                _mm512_mul_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)), up));
            __m512i X = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            uint32_t *tile = (uint32_t *)(b + d / 64 * AMX_B_WORDS);
            for (int digit = 3; digit >= 0; digit--) {
                __m512i dig = X;
                if (digit) { /* balanced: in [-64, 63], X - dig a multiple of 128 */
                    dig = _mm512_sub_epi32(
                        _mm512_and_si512(_mm512_add_epi32(X, _mm512_set1_epi32(64)),
                                         _mm512_set1_epi32(127)),
                        _mm512_set1_epi32(64));
                    X = _mm512_srai_epi32(_mm512_sub_epi32(X, dig), 7);
                }
                uint32_t fours[4];
                _mm_storeu_si128((__m128i *)fours, _mm512_cvtepi32_epi8(dig));
                for (size_t i = 0; i < 4; i++)
                    tile[(d % 64 / 4 + i) * 16 + 4 * (size_t)digit + g] = fours[i];
            }
        }
    }
    return true;
}

/* The stride of a block's key rows where all 16 lie evenly apart (the
 * positions of one page, or of a contiguous cache without its ring's end
 * between them), else 0. */
static size_t amx_even_stride(const attn_decode_row *rows) {
    if (rows[1].k <= rows[0].k) return 0;
    size_t stride = (size_t)(rows[1].k - rows[0].k);
    for (size_t j = 2; j < BK; j++)
        if (rows[j].k != rows[0].k + j * stride) return 0;
    return stride;
}

/* c (AMX_C_FLOATS) = C of a group (tiles b from amx_queries_*) against KV
 * head kh's keys of format T in rows[j], j in [jlo, jhi); the other rows
 * of C hold anything, finite or not (softmax_step drops their lanes).
 * stride: amx_even_stride of a block whose 16 rows are all there, or 0
 * (the rows in [jlo, jhi) are copied, the others zeros). slot: the group's
 * C tile (0 or 1); *turn: the A and B pair to take next. The next block's
 * stream is not stepped here: asked for between the tile loads, its lines
 * held up the loads (the block's later steps catch it up). */
static ALWAYS_INLINE void amx_products_t(attn_dtype T, size_t *turn, size_t slot,
                                         const uint16_t *b, const attn_decode_row *rows,
                                         const attn_kv_format *f, size_t kh, size_t jlo,
                                         size_t jhi, size_t stride, float *c) {
    size_t D = f->head_dim;
    const uint8_t *base = head_codes(&rows[0], false, f, kh);
    _Alignas(64) uint8_t copied[3][BK * 64];
    if (slot) _tile_zero(7);
    else _tile_zero(6);
    for (size_t t = 0; t < D / amx_dims(T); t++) {
        size_t pair = (*turn)++ % 3;
        const uint8_t *a = base + t * 64;
        const uint16_t *bt = b + t * AMX_B_WORDS;
        size_t a_stride = stride;
        if (!stride) {
            a = copied[pair];
            a_stride = 64;
            for (size_t j = 0; j < BK; j++) {
                __m512i x = j >= jlo && j < jhi
                                ? _mm512_loadu_si512(head_codes(&rows[j], false, f, kh) + t * 64)
                                : _mm512_setzero_si512();
                _mm512_store_si512(copied[pair] + j * 64, x);
            }
        }
        switch (pair * 2 + slot) {
        case 0: AMX_PRODUCT(0, 1, 6); break;
        case 1: AMX_PRODUCT(0, 1, 7); break;
        case 2: AMX_PRODUCT(2, 3, 6); break;
        case 3: AMX_PRODUCT(2, 3, 7); break;
        case 4: AMX_PRODUCT(4, 5, 6); break;
        default: AMX_PRODUCT(4, 5, 7); break;
        }
    }
    if (slot) _tile_stored(7, c, 64);
    else _tile_stored(6, c, 64);
}

static void amx_products(attn_dtype T, size_t *turn, size_t slot, const uint16_t *b,
                         const attn_decode_row *rows, const attn_kv_format *f, size_t kh,
                         size_t jlo, size_t jhi, size_t stride, float *c) {
    if (T == ATTN_DTYPE_I8)
        amx_products_t(ATTN_DTYPE_I8, turn, slot, b, rows, f, kh, jlo, jhi, stride, c);
    else
        amx_products_t(ATTN_DTYPE_BF16, turn, slot, b, rows, f, kh, jlo, jhi, stride, c);
}

/* out_g[j] = base-2 scores of a group's NG heads from its C (amx_products)
 * and its tiles b, j < 16: row j's parts joined, the smallest first, then
 * (int8) times the key's row factor kfac[j], then times the head's factor
 * (scale2 and its power of two, amx_queries_*). */
static void amx_scores(attn_dtype T, size_t NG, const float *c, const uint16_t *b, size_t D,
                       const float *kfac, float *const *out) {
    /* row j of C: 128-bit lane p holds part p's sums of the 4 heads;
     * z[k4]'s lane k: key 4 k4 + k's scores */
    __m512 z[4];
    for (size_t k4 = 0; k4 < 4; k4++) {
        __m512 r[4];
        for (size_t i = 0; i < 4; i++) {
            const float *row = c + (4 * k4 + i) * 16;
            r[i] = T == ATTN_DTYPE_I8 ? _mm512_cvtepi32_ps(_mm512_loadu_si512(row))
                                      : _mm512_loadu_ps(row);
        }
        __m512 t01 = _mm512_shuffle_f32x4(r[0], r[1], _MM_SHUFFLE(1, 0, 1, 0));
        __m512 t23 = _mm512_shuffle_f32x4(r[2], r[3], _MM_SHUFFLE(1, 0, 1, 0));
        __m512 u01 = _mm512_shuffle_f32x4(r[0], r[1], _MM_SHUFFLE(3, 2, 3, 2));
        __m512 u23 = _mm512_shuffle_f32x4(r[2], r[3], _MM_SHUFFLE(3, 2, 3, 2));
        __m512 p0 = _mm512_shuffle_f32x4(t01, t23, _MM_SHUFFLE(2, 0, 2, 0));
        __m512 p1 = _mm512_shuffle_f32x4(t01, t23, _MM_SHUFFLE(3, 1, 3, 1));
        __m512 p2 = _mm512_shuffle_f32x4(u01, u23, _MM_SHUFFLE(2, 0, 2, 0));
        if (T == ATTN_DTYPE_I8) {
            __m512 p3 = _mm512_shuffle_f32x4(u01, u23, _MM_SHUFFLE(3, 1, 3, 1));
            z[k4] = _mm512_fmadd_ps(
                p0, _mm512_set1_ps(0x1p21f),
                _mm512_fmadd_ps(p1, _mm512_set1_ps(0x1p14f),
                                _mm512_fmadd_ps(p2, _mm512_set1_ps(0x1p7f), p3)));
        } else {
            z[k4] = _mm512_add_ps(_mm512_add_ps(p2, p1), p0);
        }
    }
    /* head g's lane j = z[j / 4]'s element 4 (j % 4) + g */
    const float *factor = (const float *)(b + D / amx_dims(T) * AMX_B_WORDS);
    for (size_t g = 0; g < NG; g++) {
        __m512 s = _mm512_set1_ps(factor[g]);
        int i = (int)g;
        __m512i lo = _mm512_setr_epi32(i, 4 + i, 8 + i, 12 + i, 16 + i, 20 + i, 24 + i, 28 + i,
                                       0, 0, 0, 0, 0, 0, 0, 0);
        __m512i hi = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, i, 4 + i, 8 + i, 12 + i, 16 + i,
                                       20 + i, 24 + i, 28 + i);
        __m512 first = _mm512_permutex2var_ps(z[0], lo, z[1]);
        __m512 second = _mm512_permutex2var_ps(z[2], hi, z[3]);
        __m512 x = _mm512_mask_blend_ps(0xFF00, first, second);
        if (T == ATTN_DTYPE_I8) x = _mm512_mul_ps(x, _mm512_loadu_ps(kfac));
        _mm512_storeu_ps(out[g], _mm512_mul_ps(x, s));
    }
}
#endif /* DECODE_AMX */

/* Key j - b0 of a block as a float: ALiBi's lane offsets. */
static const float lane_of[BK] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* Softcap and ALiBi on the base-2 scores p (BK) of query head h against
 * the block at b0, for a row at position pos (>= b0: the block holds a key
 * it sees), in vectors, where score_heads left them. A score that was NaN
 * or infinite before softcap stays NaN (adding x - x), as softmax_step
 * needs to see it: the cap would make it finite. ALiBi's distance pos - j
 * is exact in float (below 2^24 positions), its product fused into the
 * subtraction. */
static inline void modify_scores(const attn_decode_seq *s, float *p, size_t h, size_t pos,
                                 size_t b0) {
    if (s->cap2 != 0.0f) {
        vec inv = v_set1(s->inv_cap2), cap = v_set1(s->cap2);
        for (size_t t = 0; t < BK; t += VW) {
            vec x = v_load(p + t);
            v_store(p + t, v_add(v_mul(cap, v_tanh(v_mul(x, inv))), v_sub(x, x)));
        }
    }
    if (s->alibi_slopes) {
        vec neg_slope = v_set1(-(float)((double)s->alibi_slopes[h] * ATTN_DECODE_LOG2E));
        vec at = v_set1((float)(pos - b0));
        for (size_t t = 0; t < BK; t += VW)
            v_store(p + t, v_fma(neg_slope, v_sub(at, v_load(lane_of + t)), v_load(p + t)));
    }
}

/* 2^x of one float, by the vector exp2 (the same numbers as the lanes). */
static inline float exp2_one(float x) {
    float lanes[VW];
    v_store(lanes, v_exp2(v_set1(x)));
    return lanes[0];
}

/* sc[j] for j in [jlo, jhi) holds a row's base-2 scores; the others become
 * -inf. Returns the block's max. */
static inline float block_max(float *sc, size_t jlo, size_t jhi) {
    for (size_t j = 0; j < jlo; j++) sc[j] = -INFINITY;
    for (size_t j = jhi; j < BK; j++) sc[j] = -INFINITY;
    vec mx = v_load(sc);
    for (size_t t = VW; t < BK; t += VW) mx = v_max(mx, v_load(sc + t));
    return v_hmax(mx);
}

/*
 * For NG query heads of one KV head (NG <= 4, a constant where inlined):
 * acc_g (D) = acc_g * alpha_g + sum_j p_g[j] v[j], j in [jlo, jhi), v[j]
 * the values of KV head kh in rows[j], of format T (p_g already holding a
 * row's scale where T has one). Each value row is loaded once for the NG
 * heads. Per head and element the operations are the same in the same
 * order whatever NG. The block's sum starts from zero and joins acc in one
 * fma: a row's output over a deep cache is then chains of one block each,
 * not one chain over every key, whose rounding grows with the depth. Where
 * T is read in pairs (bf16_pairs), acc_g is in pair order (pair_order).
 */
static ALWAYS_INLINE void weigh_heads(attn_dtype T, size_t NG, float *const *acc,
                                      const float *alpha, const float *const *p,
                                      const attn_decode_row *rows, const attn_kv_format *f,
                                      size_t kh, size_t jlo, size_t jhi, uint32_t skip,
                                      prefetch_stream *ps) {
    size_t D = f->head_dim, d = 0;
    const uint8_t *v[BK];
    const float *vs[BK];
    for (size_t j = jlo; j < jhi; j++) {
        v[j] = head_codes(&rows[j], true, f, kh);
        vs[j] = head_scales(&rows[j], true, f, kh);
    }
    for (; d + WEIGH_VECS * VW <= D; d += WEIGH_VECS * VW) {
        vec a[4][WEIGH_VECS];
        for (size_t g = 0; g < NG; g++)
            for (size_t c = 0; c < WEIGH_VECS; c++)
                a[g][c] = v_zero();
        stream_step(ps, WEIGH_VECS * (jhi - jlo));
        for (size_t j = jlo; j < jhi; j++) {
            if (skip >> j & 1u) continue;
            vec pb[4];
            for (size_t g = 0; g < NG; g++) pb[g] = v_set1(p[g][j]);
            const size_t loaded = bf16_pairs(T) ? 2 : 1; /* vectors a load gives */
            for (size_t c = 0; c < WEIGH_VECS; c += loaded) {
                vec x[2];
                if (bf16_pairs(T))
                    v_from_bf16_pair((const uint16_t *)v[j] + d + c * VW, &x[0], &x[1]);
                else
                    x[0] = load_elems(T, v[j], vs[j], d + c * VW);
                for (size_t i = 0; i < loaded; i++)
                    for (size_t g = 0; g < NG; g++) a[g][c + i] = v_fma(pb[g], x[i], a[g][c + i]);
            }
        }
        for (size_t g = 0; g < NG; g++)
            for (size_t c = 0; c < WEIGH_VECS; c++) {
                float *out = acc[g] + d + c * VW;
                v_store(out, v_fma(v_load(out), v_set1(alpha[g]), a[g][c]));
            }
    }
    for (; d + VW <= D; d += VW)
        for (size_t g = 0; g < NG; g++) {
            vec a = v_zero();
            for (size_t j = jlo; j < jhi; j++)
                if (!(skip >> j & 1u)) a = v_fma(v_set1(p[g][j]), load_elems(T, v[j], vs[j], d), a);
            v_store(acc[g] + d, v_fma(v_load(acc[g] + d), v_set1(alpha[g]), a));
        }
    for (; d < D; d++)
        for (size_t g = 0; g < NG; g++) {
            float a = 0.0f;
            for (size_t j = jlo; j < jhi; j++)
                if (!(skip >> j & 1u)) a = fmaf(p[g][j], load_one(T, v[j], vs[j], d), a);
            acc[g][d] = fmaf(acc[g][d], alpha[g], a);
        }
}

/* weigh_heads with NG and T constants, so that its loops unroll into
 * registers. */
static ALWAYS_INLINE void weigh_group_t(attn_dtype T, size_t NG, float *const *acc,
                                        const float *alpha, const float *const *p,
                                        const attn_decode_row *rows, const attn_kv_format *f,
                                        size_t kh, size_t jlo, size_t jhi, prefetch_stream *ps) {
#define HEADS(n) weigh_heads(T, n, acc, alpha, p, rows, f, kh, jlo, jhi, 0, ps)
    switch (NG) {
    case 4: HEADS(4); break;
    case 3: HEADS(3); break;
    case 2: HEADS(2); break;
    default: HEADS(1); break;
    }
#undef HEADS
}

/* weigh_heads of NG heads; ps as score_group's. */
static void weigh_group(size_t NG, float *const *acc, const float *alpha, const float *const *p,
                        const attn_decode_row *rows, const attn_kv_format *f, size_t kh, size_t jlo,
                        size_t jhi, prefetch_stream *ps) {
#define WEIGH(T) weigh_group_t(T, NG, acc, alpha, p, rows, f, kh, jlo, jhi, ps)
    FOR_FORMAT(f->dtype, WEIGH);
#undef WEIGH
}

/* weigh_group where a tree or the map hides lanes of the block: head g
 * leaves out the value rows of the lanes hid[g] hides, one head at a time
 * (each head's sums are weigh_heads' for any NG), so that a value it does
 * not see, an infinite or NaN one, never meets its zero weight (0 x inf is
 * NaN); ps as score_group's. */
static void weigh_hidden(size_t NG, float *const *acc, const float *alpha, const float *const *p,
                         const uint32_t *hid, const attn_decode_row *rows,
                         const attn_kv_format *f, size_t kh, size_t jlo, size_t jhi,
                         prefetch_stream *ps) {
    for (size_t g = 0; g < NG; g++) {
#define WEIGH(T)                                                                                   \
    weigh_heads(T, 1, acc + g, alpha + g, p + g, rows, f, kh, jlo, jhi, hid[g], g ? NULL : ps)
        FOR_FORMAT(f->dtype, WEIGH);
#undef WEIGH
    }
}

/* The online-softmax step of one (row, query head) for a block: the
 * block's scores p (BK) become weights; returns alpha, the factor of the
 * earlier sums. A NaN or infinite score (a NaN or infinite query or key)
 * makes the row's sum NaN, and so its output; the vector max and exp2 would
 * pass over it. The lanes of hidden (a tree of draft tokens or a block
 * map; 0 without either) weigh nothing, and a block whose lanes are all
 * hidden leaves the row's sums as they are (alpha 1). */
static inline float softmax_step(float *p, uint32_t hidden, size_t jlo, size_t jhi, float *m,
                                 float *l) {
    /* x - x: 0 for a finite score, NaN for a NaN or infinite one; lanes
     * outside [jlo, jhi) (which may hold a factor's NaN) count as 0 */
    for (size_t j = 0; j < jlo; j++) p[j] = 0.0f;
    for (size_t j = jhi; j < BK; j++) p[j] = 0.0f;
    for (size_t j = jlo; hidden && j < jhi; j++)
        if (hidden >> j & 1u) p[j] = 0.0f;
    vec z = v_zero();
    for (size_t t = 0; t < BK; t += VW) z = v_add(z, v_sub(v_load(p + t), v_load(p + t)));
    bool bad = v_hsum(z) != 0.0f;
    for (size_t j = jlo; hidden && j < jhi; j++)
        if (hidden >> j & 1u) p[j] = -INFINITY;
    float mx = block_max(p, jlo, jhi);
    if (hidden && mx == -INFINITY && !bad) {
        for (size_t j = 0; j < BK; j++) p[j] = 0.0f;
        return 1.0f;
    }
    float mn = *m > mx ? *m : mx;
    float alpha = exp2_one(*m - mn);
    vec vm = v_set1(mn), sum = v_zero();
    for (size_t t = 0; t < BK; t += VW) {
        vec e = v_exp2(v_sub(v_load(p + t), vm));
        v_store(p + t, e);
        sum = v_add(sum, e);
    }
    *l = bad ? NAN : *l * alpha + v_hsum(sum);
    *m = mn;
    return alpha;
}

/* softmax_step for n <= BK (row, query head)s at once whose blocks are
 * whole: every lane in [0, BK) seen, none hidden. p: their blocks of
 * scores (BK floats each, one after the other); m, l, alpha: theirs. The
 * steps are softmax_step's, their reductions (the NaN test, the max, the
 * sum) made for the n heads together by v_reduce_block and the factors
 * alpha by one exp2 a vector of heads, where one head at a time waits on
 * each reduction in turn. */
static void softmax_heads(float *p, size_t n, float *m, float *l, float *alpha) {
    vec part[BK];
    float bad[BK], mx[BK], total[BK], mn[BK], x[BK], a[BK];
    for (size_t h = 0; h < BK; h++) { /* x - x, as softmax_step */
        vec z = v_zero();
        for (size_t t = 0; h < n && t < BK; t += VW)
            z = v_add(z, v_sub(v_load(p + h * BK + t), v_load(p + h * BK + t)));
        part[h] = z;
    }
    v_reduce_block(part, bad, 0);
    for (size_t h = 0; h < BK; h++) {
        vec y = v_zero();
        for (size_t t = 0; h < n && t < BK; t += VW)
            y = t ? v_max(y, v_load(p + h * BK + t)) : v_load(p + h * BK);
        part[h] = y;
    }
    v_reduce_block(part, mx, 1);
    for (size_t h = 0; h < BK; h++) {
        mn[h] = h < n && m[h] > mx[h] ? m[h] : mx[h];
        x[h] = h < n ? m[h] - mn[h] : 0.0f;
    }
    for (size_t t = 0; t < BK; t += VW) v_store(a + t, v_exp2(v_load(x + t)));
    for (size_t h = 0; h < BK; h++) {
        vec sum = v_zero(), vm = v_set1(mn[h]);
        for (size_t t = 0; h < n && t < BK; t += VW) {
            vec e = v_exp2(v_sub(v_load(p + h * BK + t), vm));
            v_store(p + h * BK + t, e);
            sum = v_add(sum, e);
        }
        part[h] = sum;
    }
    v_reduce_block(part, total, 0);
    for (size_t h = 0; h < n; h++) {
        l[h] = bad[h] != 0.0f ? NAN : l[h] * a[h] + total[h];
        m[h] = mn[h];
        alpha[h] = a[h];
    }
}

/* An alpha that marks a group of heads the block map hides the block from:
 * a softmax factor is never negative. */
#define SKIPPED (-1.0f)

static void decode_chunk(const attn_decode_seq *s, size_t row0, size_t rows, size_t begin,
                         size_t end, float *m, float *l, float *acc, float *scratch) {
    const size_t H = s->q_heads, KH = s->kv_heads, D = s->head_dim, G = H / KH;
    for (size_t i = 0; i < rows * H; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    for (size_t i = 0; i < rows * H * D; i++) acc[i] = 0.0f;
    float *sc = scratch;                    /* (rows, H, BK) scores, then weights */
    float *alpha = scratch + rows * H * BK; /* (rows, H) the blocks' softmax factors */
    float *q_paired = alpha + rows * H;     /* (rows, H, D) the queries in pair order */
    const attn_kv_format *kf = &s->keys.k.fmt, *vf = &s->keys.v.fmt;
#if DECODE_AMX
    /* K on tiles: bf16, or int8 under queries the digits hold (amx_queries_i8) */
    bool amx_k = (kf->dtype == ATTN_DTYPE_BF16 || kf->dtype == ATTN_DTYPE_I8) &&
                 D % amx_dims(kf->dtype) == 0;
    /* (rows, KH, groups of 4 heads) the groups' B tiles (amx_queries_*),
     * then a block's C of each (amx_products) */
    const size_t group_words = amx_group_words(kf->dtype, D), groups = (G + 3) / 4;
    uint16_t *q_tiles = (uint16_t *)(q_paired + rows * H * D);
    float *c_tiles = (float *)(q_tiles + rows * KH * groups * group_words);
#else
    const bool amx_k = false;
#endif
    const bool k_pairs = bf16_pairs(kf->dtype) && paired_dims(D) > 0 && !amx_k;
    const bool v_pairs = bf16_pairs(vf->dtype) && paired_dims(D) > 0;
    bool k_scaled = row_scaled(kf->dtype), v_scaled = row_scaled(vf->dtype);
    float kfac[BK], vfac[BK];     /* the row factors of a block's keys and values */
    attn_decode_row rw[BK];       /* the rows of a block's keys */
    attn_decode_row rw_next[BK];  /* and of the next block's */
    prefetch_stream stream;       /* over rw_next */
    size_t row_lo[ATTN_DECODE_ROWS], row_hi[ATTN_DECODE_ROWS];
    bool modified = s->cap2 != 0.0f || s->alibi_slopes; /* softcap or ALiBi */
    for (size_t r = 0; r < rows; r++) attn_decode_visible(s, row0 + r, &row_lo[r], &row_hi[r]);
    /* no row sees a key before start (rows are in position order); blocks
     * stay aligned to multiples of BK (begin is one), so that a key's lane
     * is the same whoever runs the chunk */
    size_t start = begin > row_lo[0] ? begin : row_lo[0];
    if (start >= end) return;
    for (size_t i = 0; k_pairs && i < rows * H; i++) {
        memcpy(q_paired + i * D, s->q + (row0 * H + i) * D, D * sizeof(float));
        pair_order(q_paired + i * D, D, true);
    }
#if DECODE_AMX
    for (size_t r = 0; amx_k && r < rows; r++)
        for (size_t kh = 0; amx_k && kh < KH; kh++)
            for (size_t g0 = 0; amx_k && g0 < G; g0 += 4) {
                const float *q_g[4];
                size_t ng = G - g0 < 4 ? G - g0 : 4;
                for (size_t g = 0; g < ng; g++)
                    q_g[g] = s->q + ((row0 + r) * H + kh * G + g0 + g) * D;
                uint16_t *b = q_tiles + ((r * KH + kh) * groups + g0 / 4) * group_words;
                if (kf->dtype == ATTN_DTYPE_I8) amx_k = amx_queries_i8(ng, q_g, D, s->scale2, b);
                else amx_queries_bf16(ng, q_g, D, s->scale2, b);
            }
    if (amx_k) attn_amx_load_tiles();
#endif
    /* a block map of one map for every head hides lanes per row; one per
     * head, per (row, query head) below */
    const bool map_heads = s->map && s->map->heads > 1;
    for (size_t b0 = start / BK * BK; b0 < end;) {
        size_t b1 = b0 + BK < end ? b0 + BK : end;
        size_t from = b0 > start ? b0 : start; /* the first block: keys from start */
        /* block-relative keys [jlo, jhi) of each row (empty: 0, 0) */
        size_t jlo[ATTN_DECODE_ROWS], jhi[ATTN_DECODE_ROWS];
        uint32_t hidden[ATTN_DECODE_ROWS]; /* lanes a draft tree (or the map) hides */
        for (size_t r = 0; r < rows; r++) {
            size_t lo = row_lo[r] > b0 ? row_lo[r] : b0, hi = row_hi[r] < b1 ? row_hi[r] : b1;
            jlo[r] = lo < hi ? lo - b0 : 0;
            jhi[r] = lo < hi ? hi - b0 : 0;
            hidden[r] = attn_decode_tree_hidden(s, row0 + r, b0, jlo[r], jhi[r]);
        }
        if (s->map) {
            /* rows the map shows nothing of this block drop out; a block no
             * row sees is skipped unread, and where the map leaves the
             * whole key block out for every row the walk jumps past it */
            size_t jump = (b0 / s->map->block_kv + 1) * s->map->block_kv;
            bool seen = false;
            for (size_t r = 0; r < rows; r++) {
                if (jlo[r] == jhi[r]) {
                    if (row_lo[r] >= b1 && row_lo[r] / BK * BK < jump) jump = row_lo[r] / BK * BK;
                    continue;
                }
                uint32_t lanes = (1u << jhi[r]) - (1u << jlo[r]), shown = 0, absent = 1;
                for (size_t h = 0; h < (map_heads ? H : 1) && !shown; h++) {
                    uint32_t x = attn_decode_map_hidden(s, row0 + r, h, b0);
                    if (!map_heads) hidden[r] |= x & lanes;
                    shown = ~x & lanes;
                    absent &= x >> 16;
                }
                if (shown) seen = true;
                else jlo[r] = jhi[r] = 0;
                if (!absent && b1 < jump) jump = b1;
            }
            if (!seen) {
                b0 = jump;
                continue;
            }
        }
        attn_decode_key_rows(&s->keys, from, b1 - from, rw + (from - b0));
        /* the next block's rows, streamed in while this block is read */
        size_t next = b1 + BK < end ? BK : end > b1 ? end - b1 : 0;
        prefetch_stream *ps = next && s->keys.stream ? &stream : NULL;
        if (ps) {
            attn_decode_key_rows(&s->keys, b1, next, rw_next);
            stream_start(ps, &s->keys, rw_next, next, KH * 2 * BK * (D / VW));
        }
#if DECODE_AMX
        /* keys on tiles: every group's tile products first, each group's C
         * (rows, KV heads, groups of 4 heads) into c_tiles; the keys' rows
         * as one tile where all 16 are there evenly apart */
        if (amx_k) {
            size_t stride = from == b0 && b1 - b0 == BK ? amx_even_stride(rw) : 0, turn = 0;
            for (size_t kh = 0; kh < KH; kh++)
                for (size_t r = 0; r < rows; r++) {
                    if (jlo[r] == jhi[r]) continue;
                    for (size_t g0 = 0; g0 < G; g0 += 4) {
                        size_t n = (r * KH + kh) * groups + g0 / 4;
                        amx_products(kf->dtype, &turn, n & 1, q_tiles + n * group_words, rw, kf,
                                     kh, jlo[r], jhi[r], stride, c_tiles + n * AMX_C_FLOATS);
                    }
                }
        }
#endif
        /* Every head's scores and softmax step first, then every head's
         * weighing: the steps' chains of dependent operations (a block's
         * max, its exponentials, its sum) then overlap one another and the
         * loads of the keys, where each weighing waiting on its own head's
         * step would stall the core. A row that sees the whole block takes
         * its heads' steps together once every head is scored
         * (softmax_heads); the others, one head at a time as it is scored. */
        bool whole[ATTN_DECODE_ROWS], any_whole = false;
        for (size_t r = 0; r < rows; r++) {
            whole[r] = jlo[r] == 0 && jhi[r] == BK && !hidden[r] && !map_heads;
            any_whole |= whole[r];
        }
        for (size_t kh = 0; kh < KH; kh++) {
            for (size_t j = 0; (k_scaled || v_scaled) && j < BK; j++) { /* 0 outside the block */
                bool in = j >= from - b0 && j < b1 - b0;
                kfac[j] = k_scaled && in ? row_factor(kf->dtype, head_scales(&rw[j], false, kf, kh))
                                         : 0.0f;
                vfac[j] = v_scaled && in ? row_factor(vf->dtype, head_scales(&rw[j], true, vf, kh))
                                         : 0.0f;
            }
            for (size_t r = 0; r < rows; r++) {
                if (jlo[r] == jhi[r]) continue;
                size_t i0 = r * H + kh * G; /* the group's first (row, query head) */
                for (size_t g0 = 0; g0 < G; g0 += 4) {
                    size_t ng = G - g0 < 4 ? G - g0 : 4;
                    const float *q_g[4];
                    float *p_all[4];
                    uint32_t hid[4] = {hidden[r], hidden[r], hidden[r], hidden[r]};
                    if (map_heads) { /* a group whose heads the map shows nothing is skipped */
                        uint32_t lanes = (1u << jhi[r]) - (1u << jlo[r]), shown = 0;
                        for (size_t g = 0; g < ng; g++) {
                            hid[g] |= attn_decode_map_hidden(s, row0 + r, kh * G + g0 + g, b0) &
                                      lanes;
                            shown |= ~hid[g] & lanes;
                        }
                        if (!shown) {
                            alpha[i0 + g0] = SKIPPED;
                            continue;
                        }
                    }
                    for (size_t g = 0; g < ng; g++) {
                        size_t i = r * H + kh * G + g0 + g;
                        q_g[g] = k_pairs ? q_paired + i * D : s->q + (row0 * H + i) * D;
                        p_all[g] = sc + (i0 + g0 + g) * BK;
                    }
                    /* the first group of the first row steps the stream */
                    prefetch_stream *step = r == 0 && g0 == 0 ? ps : NULL;
#if DECODE_AMX
                    if (amx_k) {
                        size_t n = (r * KH + kh) * groups + g0 / 4;
                        amx_scores(kf->dtype, ng, c_tiles + n * AMX_C_FLOATS,
                                   q_tiles + n * group_words, D, kfac, p_all);
                    } else
#endif
                        score_group(ng, q_g, rw, kf, kh, jlo[r], jhi[r], s->scale2, kfac, p_all,
                                    step);
                    for (size_t g = 0; g < ng; g++) {
                        size_t i = i0 + g0 + g;
                        float *p = p_all[g];
                        if (modified)
                            modify_scores(s, p, kh * G + g0 + g, s->first_pos + row0 + r, b0);
                        if (whole[r]) continue;
                        alpha[i] = softmax_step(p, hid[g], jlo[r], jhi[r], &m[i], &l[i]);
                        if (v_scaled) /* the weights times the value rows' scales */
                            for (size_t t = 0; t < BK; t += VW)
                                v_store(p + t, v_mul(v_load(p + t), v_load(vfac + t)));
                    }
                }
            }
            if (ps) stream_catch_up(ps, kh + 1, 2 * KH);
        }
        for (size_t r = 0; r < rows; r++) {
            if (!whole[r]) continue;
            for (size_t h0 = 0; h0 < H; h0 += BK) {
                size_t i = r * H + h0;
                softmax_heads(sc + i * BK, H - h0 < BK ? H - h0 : BK, m + i, l + i, alpha + i);
            }
        }
        for (size_t kh = 0; v_scaled && any_whole && kh < KH; kh++) {
            for (size_t j = 0; j < BK; j++) /* a whole block: every lane in it */
                vfac[j] = row_factor(vf->dtype, head_scales(&rw[j], true, vf, kh));
            for (size_t r = 0; r < rows; r++)
                for (size_t g = 0; whole[r] && g < G; g++) {
                    float *p = sc + (r * H + kh * G + g) * BK;
                    for (size_t t = 0; t < BK; t += VW)
                        v_store(p + t, v_mul(v_load(p + t), v_load(vfac + t)));
                }
        }
        for (size_t kh = 0; kh < KH; kh++) {
            for (size_t r = 0; r < rows; r++) {
                if (jlo[r] == jhi[r]) continue;
                size_t i0 = r * H + kh * G;
                for (size_t g0 = 0; g0 < G; g0 += 4) {
                    size_t ng = G - g0 < 4 ? G - g0 : 4;
                    if (alpha[i0 + g0] == SKIPPED) continue;
                    float *acc_g[4];
                    const float *p_g[4];
                    for (size_t g = 0; g < ng; g++) {
                        acc_g[g] = acc + (i0 + g0 + g) * D;
                        p_g[g] = sc + (i0 + g0 + g) * BK;
                    }
                    prefetch_stream *step = r == 0 && g0 == 0 ? ps : NULL;
                    uint32_t hid[4] = {hidden[r], hidden[r], hidden[r], hidden[r]}, any = 0;
                    for (size_t g = 0; g < ng; g++) {
                        if (map_heads)
                            hid[g] |= attn_decode_map_hidden(s, row0 + r, kh * G + g0 + g, b0) &
                                      ((1u << jhi[r]) - (1u << jlo[r]));
                        any |= hid[g];
                    }
                    if (any)
                        weigh_hidden(ng, acc_g, alpha + i0 + g0, p_g, hid, rw, vf, kh, jlo[r],
                                     jhi[r], step);
                    else
                        weigh_group(ng, acc_g, alpha + i0 + g0, p_g, rw, vf, kh, jlo[r], jhi[r],
                                    step);
                }
            }
            if (ps) stream_catch_up(ps, KH + kh + 1, 2 * KH);
        }
        b0 = b1;
    }
    for (size_t i = 0; v_pairs && i < rows * H; i++) pair_order(acc + i * D, D, false);
#if DECODE_AMX
    if (amx_k) _tile_release();
#endif
}

const attn_decode_kernels DECODE_KERNELS = {DECODE_ISA_NAME, decode_chunk};
