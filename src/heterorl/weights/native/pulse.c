/* Compiled kernels of the PULSE codec (heterorl.weights): the diff scan with its hashes, the integer-stream
 * coding of intcode.py, the magnitude-class passes of the v2 format, and the checked decode's in-place chunk pass
 * and its revert. Each kernel is the numpy reference's algorithm in one loop (tests compare bytes and results bit for
 * bit); each releases the GIL for its whole loop, so threads over tensors run side by side.
 *
 * Arrays come in through the buffer protocol (numpy arrays, bytes, memoryviews); arrays of unknown length come
 * out as `Buf` objects (a malloc'd block exposed through the buffer protocol, np.frombuffer views it without a
 * copy). Malformed input raises CodecError (a ValueError) with a message; the Python side names the tensor.
 * No numpy C-API: the module builds with a C compiler and Python's headers only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
/* Kernels with loops for three instruction-set levels, each compiled by a target attribute and chosen at run time
 * by what the CPU has: the baseline (x86-64: SSE2; elsewhere portable C), AVX2 (with BMI1/2 and POPCNT: every x86
 * CPU since 2013-2015 that lacks AVX-512), AVX-512 (BW and VBMI2, whose compress instruction writes a block's
 * differing lanes side by side). `level` is the switch (set_level: tests compare every loop the CPU can run with
 * the reference); it stays at the baseline where HAVE_WIDE is not defined. */
#define LEVEL_BASE 0
#define LEVEL_AVX2 1
#define LEVEL_AVX512 2
static int level;
static int pdep_fast; /* pdep is one instruction of a few cycles (not AMD's Zen 1 / 2, which microcode it) */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_WIDE 1

static int level_supported(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("bmi2"))
        return LEVEL_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt"))
        return LEVEL_AVX2;
    return LEVEL_BASE;
}
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include "xxh_x86dispatch.c" /* xxHash inline, XXH3 updates dispatched to SSE2 / AVX2 / AVX-512 at run time */
/* The dispatching entry point by name: after XXH_INLINE_ALL, XXH3_128bits_update is the inline SSE2-only build
 * (x86-64's baseline), which hashed at ~half the speed of the AVX2 / AVX-512 loops the CPU may have. */
#define HASH_UPDATE XXH3_128bits_update_dispatch
#else
#define XXH_INLINE_ALL
#include "xxhash.h"
#define HASH_UPDATE XXH3_128bits_update
#endif

#define ESCAPE 3
#define SCAN_CHUNK (1 << 18) /* bytes per tensor per pass step: base and new chunks stay in L2 */

static PyObject *CodecError;

/* ------------------------------------------------------------------------------------------------ block pool */
/* Freed output blocks are kept for the next call instead of going back to the OS: fresh memory costs a page fault
 * per 4 KiB page on first touch (measured 0.45-0.8 GB/s on this project's VM, hugepages or not), which was most of
 * a kernel's time, while a codec that runs every step asks for blocks of the same sizes every step. Blocks of
 * POOL_MIN bytes or more have power-of-two capacities and wait in one stack per size (linked through their first
 * bytes), so a get or a put is O(1); smaller ones go to malloc, whose heap reuses them. The pool holds at most
 * pool_limit bytes (set_pool_limit); a block that would exceed it is freed. */
#include <pthread.h>
#define POOL_MIN_LOG 16
#define POOL_MIN (1 << POOL_MIN_LOG)
#define POOL_CLASSES 48
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static void *pool_head[POOL_CLASSES];
static size_t pool_bytes, pool_limit = (size_t)1 << 30;

static inline int ceil_log2(size_t v) { return v <= 1 ? 0 : 64 - __builtin_clzll((unsigned long long)(v - 1)); }

/* A block of at least `need` bytes (its capacity in *cap). */
static void *pool_get(size_t need, size_t *cap) {
    if (need < POOL_MIN) {
        *cap = need ? need : 1;
        return malloc(*cap);
    }
    int c = ceil_log2(need);
    if (c >= POOL_CLASSES) return NULL;
    *cap = (size_t)1 << c;
    pthread_mutex_lock(&pool_lock);
    void *p = pool_head[c];
    if (p != NULL) {
        pool_head[c] = *(void **)p;
        pool_bytes -= *cap;
    }
    pthread_mutex_unlock(&pool_lock);
    return p != NULL ? p : malloc(*cap);
}

static void pool_put(void *p, size_t cap) {
    if (p == NULL) return;
    if (cap < POOL_MIN) {
        free(p);
        return;
    }
    int c = ceil_log2(cap);
    pthread_mutex_lock(&pool_lock);
    if (pool_bytes + cap <= pool_limit) {
        *(void **)p = pool_head[c];
        pool_head[c] = p;
        pool_bytes += cap;
        p = NULL;
    }
    pthread_mutex_unlock(&pool_lock);
    free(p);
}

/* ------------------------------------------------------------------------------------------------ Buf */
typedef struct {
    PyObject_HEAD void *data;
    Py_ssize_t size;
    size_t cap; /* bytes of the block (pool_put) */
} BufObject;

static void Buf_dealloc(BufObject *self) {
    pool_put(self->data, self->cap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Buf_getbuffer(BufObject *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->size, 0, flags);
}

static PyBufferProcs Buf_as_buffer = {(getbufferproc)Buf_getbuffer, NULL};

static PyTypeObject BufType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "heterorl.weights.native._pulse.Buf",
    .tp_basicsize = sizeof(BufObject),
    .tp_dealloc = (destructor)Buf_dealloc,
    .tp_as_buffer = &Buf_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A block of memory owned by the codec kernels, read through the buffer protocol.",
};

/* A Buf owning `data` (a pool block of `cap` bytes, `size` of them used; back to the pool with the object). Returns
 * the block on failure. */
static PyObject *buf_adopt(void *data, Py_ssize_t size, size_t cap) {
    if (data == NULL) return PyErr_NoMemory();
    BufObject *self = PyObject_New(BufObject, &BufType);
    if (self == NULL) {
        pool_put(data, cap);
        return NULL;
    }
    self->data = data;
    self->size = size;
    self->cap = cap;
    return (PyObject *)self;
}

/* A new Buf of `size` bytes (uninitialised). */
static PyObject *buf_new(size_t size, void **data) {
    size_t cap;
    *data = pool_get(size, &cap);
    return buf_adopt(*data, (Py_ssize_t)size, cap);
}

/* ------------------------------------------------------------------------------------------------ growable */
typedef struct {
    char *data;
    size_t len, cap; /* elements */
    size_t item;     /* bytes per element */
} Vec;

static inline int vec_reserve(Vec *v, size_t extra) {
    if (v->len + extra <= v->cap) return 0;
    size_t cap = v->cap ? 2 * v->cap : 4096, got;
    while (cap < v->len + extra) cap *= 2;
    char *data = pool_get(cap * v->item, &got);
    if (data == NULL) return -1;
    if (v->len) memcpy(data, v->data, v->len * v->item);
    pool_put(v->data, v->cap * v->item);
    v->data = data;
    v->cap = got / v->item;
    return 0;
}

static void vec_free(Vec *v) {
    pool_put(v->data, v->cap * v->item);
    v->data = NULL;
}

/* The Vec's elements as a Buf (its block, not copied). */
static PyObject *vec_to_buf(Vec *v) {
    if (v->data == NULL && vec_reserve(v, 1)) return PyErr_NoMemory();
    PyObject *out = buf_adopt(v->data, (Py_ssize_t)(v->len * v->item), v->cap * v->item);
    v->data = NULL;
    return out;
}

/* ------------------------------------------------------------------------------------------------ helpers */
static int check_itemsize(int itemsize) {
    if (itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8) return 0;
    PyErr_Format(PyExc_ValueError, "itemsize must be 1, 2, 4 or 8, got %d", itemsize);
    return -1;
}

static inline __attribute__((always_inline)) uint64_t load_item(const void *base, size_t i, int itemsize) {
    switch (itemsize) {
    case 1: return ((const uint8_t *)base)[i];
    case 2: return ((const uint16_t *)base)[i];
    case 4: return ((const uint32_t *)base)[i];
    default: return ((const uint64_t *)base)[i];
    }
}

static inline __attribute__((always_inline)) void store_item(void *base, size_t i, int itemsize, uint64_t v) {
    switch (itemsize) {
    case 1: ((uint8_t *)base)[i] = (uint8_t)v; break;
    case 2: ((uint16_t *)base)[i] = (uint16_t)v; break;
    case 4: ((uint32_t *)base)[i] = (uint32_t)v; break;
    default: ((uint64_t *)base)[i] = v; break;
    }
}

static inline uint64_t load64(const void *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

static PyObject *digest_bytes(XXH3_state_t *state) {
    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(state));
    return PyBytes_FromStringAndSize((const char *)canon.digest, 16);
}

/* The start of a kernel over a base and a new tensor's raw bytes (scan, dense_codes): the same item size and
 * length, and the two hash states, reset. Returns -1 with an exception set (the caller frees what is not NULL). */
static int pair_begin(const Py_buffer *bb, const Py_buffer *nb, int itemsize, XXH3_state_t *sb, XXH3_state_t *sn) {
    if (check_itemsize(itemsize)) return -1;
    if (bb->len != nb->len || bb->len % itemsize) {
        PyErr_SetString(PyExc_ValueError, "base and new must have the same size, a multiple of itemsize");
        return -1;
    }
    if (sb == NULL || sn == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    XXH3_128bits_reset(sb);
    XXH3_128bits_reset(sn);
    return 0;
}

/* (first, second, base digest, new digest) of such a kernel; a digest not asked for is b''. NULL on failure. */
static PyObject *pair_result(PyObject *first, PyObject *second, XXH3_state_t *sb, XXH3_state_t *sn, int hash_base,
                             int hash_new) {
    PyObject *out = NULL;
    PyObject *hb = hash_base ? digest_bytes(sb) : PyBytes_FromStringAndSize(NULL, 0);
    PyObject *hn = hash_new ? digest_bytes(sn) : PyBytes_FromStringAndSize(NULL, 0);
    if (first && second && hb && hn) out = PyTuple_Pack(4, first, second, hb, hn);
    Py_XDECREF(hb);
    Py_XDECREF(hn);
    return out;
}

/* ------------------------------------------------------------------------------------------------ diff scan */
/* Lanes of the 64-bit words x (base) and y (new) that differ: positions and wrapped differences new - base. */
#define SCAN_LANES(T, LANES)                                                                                       \
    for (size_t w = 0; w < words; w++) {                                                                           \
        uint64_t x = load64(wb + 8 * w), y = load64(wn + 8 * w);                                                   \
        if (x == y) continue;                                                                                      \
        if (vec_reserve(&pos, LANES) || vec_reserve(&dif, LANES)) {                                                \
            failed = 1;                                                                                            \
            break;                                                                                                 \
        }                                                                                                          \
        int64_t *p = (int64_t *)pos.data + pos.len;                                                                \
        T *d = (T *)dif.data + dif.len;                                                                            \
        size_t k = 0;                                                                                              \
        for (int l = 0; l < LANES; l++) {                                                                          \
            T a = (T)(x >> (l * 8 * sizeof(T))), b = (T)(y >> (l * 8 * sizeof(T)));                                \
            p[k] = (int64_t)(first + w * LANES + l);                                                               \
            d[k] = (T)(b - a);                                                                                     \
            k += a != b;                                                                                           \
        }                                                                                                          \
        pos.len += k;                                                                                              \
        dif.len += k;                                                                                              \
    }

#ifdef HAVE_WIDE
/* scan16's AVX-512 loop, 32 elements (one 64-byte line of each tensor) at a time and no branch per block: the
 * mask of lanes that differ, the differences and the lane numbers compressed to the front of a register, stored
 * whole (room for 32 elements per block is reserved for 64 blocks at a time; the length grows by the count),
 * lane numbers widened to int64 eight at a time. Returns the words done (a multiple of 8), or (size_t)-1 when
 * out of memory. */
#define WIDE_GROUP 64
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi2,popcnt"))) static size_t
scan16_wide(const char *wb, const char *wn, size_t words, size_t first, Vec *pos, Vec *dif) {
    const __m512i lanes = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                                           12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i step = _mm512_set1_epi64(32);
    size_t w = 0;
    while (w + 8 <= words) {
        size_t blocks = (words - w) / 8 < WIDE_GROUP ? (words - w) / 8 : WIDE_GROUP;
        if (vec_reserve(pos, 32 * blocks) || vec_reserve(dif, 32 * blocks)) return (size_t)-1;
        int64_t *p = (int64_t *)pos->data + pos->len;
        uint16_t *dd = (uint16_t *)dif->data + dif->len;
        size_t n = 0;
        __m512i at = _mm512_set1_epi64((long long)(first + 4 * w));
        for (size_t b = 0; b < blocks; b++, w += 8) {
            __m512i x = _mm512_loadu_si512((const void *)(wb + 8 * w));
            __m512i y = _mm512_loadu_si512((const void *)(wn + 8 * w));
            __mmask32 m = _mm512_cmpneq_epi16_mask(x, y);
            int count = __builtin_popcount((unsigned)m);
            _mm512_storeu_si512((void *)(dd + n), _mm512_maskz_compress_epi16(m, _mm512_sub_epi16(y, x)));
            __m512i idx = _mm512_maskz_compress_epi16(m, lanes);
            __m512i first8 = _mm512_cvtepu16_epi64(_mm512_castsi512_si128(idx));
            _mm512_storeu_si512((void *)(p + n), _mm512_add_epi64(first8, at));
            for (int q = 1; q < 4 && 8 * q < count; q++) /* more than 8 differ: rare at a few percent of changes */
                _mm512_storeu_si512((void *)(p + n + 8 * q),
                                    _mm512_add_epi64(_mm512_cvtepu16_epi64(_mm512_extracti32x4_epi32(idx, q)), at));
            n += (size_t)count;
            at = _mm512_add_epi64(at, step);
        }
        pos->len += n;
        dif->len += n;
    }
    return w;
}
#endif

/* scan16's AVX2 loop, 64 elements (two lines of each tensor) at a time: equal lanes by 16-lane compares packed
 * into one 64-bit mask (packs works per 128-bit half: a qword permutation puts the lanes in order), the
 * differences stored to a 128-byte buffer, then the first four differing elements taken without a data-dependent
 * branch (an empty mask reads lane 0 and does not advance) and any further ones in a loop (~6% of blocks at the 3%
 * of changes of a fine-tuning step). Returns the words done (a multiple of 16), or (size_t)-1 when out of memory. */
#ifdef HAVE_WIDE
#define AVX2_GROUP 64
__attribute__((target("avx2,bmi,bmi2,popcnt"))) static size_t scan16_avx2(const char *wb, const char *wn, size_t words,
                                                                          size_t first, Vec *pos, Vec *dif) {
    size_t w = 0;
    while (w + 16 <= words) {
        size_t blocks = (words - w) / 16 < AVX2_GROUP ? (words - w) / 16 : AVX2_GROUP;
        if (vec_reserve(pos, 64 * blocks) || vec_reserve(dif, 64 * blocks)) return (size_t)-1;
        int64_t *p = (int64_t *)pos->data + pos->len;
        uint16_t *dd = (uint16_t *)dif->data + dif->len;
        size_t k = 0;
        for (size_t b = 0; b < blocks; b++, w += 16) {
            const __m256i *xb = (const __m256i *)(wb + 8 * w), *yn = (const __m256i *)(wn + 8 * w);
            uint16_t d16[64];
            uint64_t eq = 0;
            for (int h = 0; h < 2; h++) {
                __m256i x0 = _mm256_loadu_si256(xb + 2 * h), y0 = _mm256_loadu_si256(yn + 2 * h);
                __m256i x1 = _mm256_loadu_si256(xb + 2 * h + 1), y1 = _mm256_loadu_si256(yn + 2 * h + 1);
                _mm256_storeu_si256((__m256i *)(d16 + 32 * h), _mm256_sub_epi16(y0, x0));
                _mm256_storeu_si256((__m256i *)(d16 + 32 * h + 16), _mm256_sub_epi16(y1, x1));
                __m256i packed = _mm256_packs_epi16(_mm256_cmpeq_epi16(x0, y0), _mm256_cmpeq_epi16(x1, y1));
                eq |= (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_permute4x64_epi64(packed, 0xD8)) << (32 * h);
            }
            uint64_t mask = ~eq;
            const int64_t at = (int64_t)(first + 4 * w);
            for (int s = 0; s < 4; s++) {
                int e = __builtin_ctzll(mask | (mask ? 0 : 1)); /* lane 0 for an empty mask */
                p[k] = at + e;
                dd[k] = d16[e];
                k += mask != 0;
                mask &= mask - 1;
            }
            while (mask) {
                int e = __builtin_ctzll(mask);
                mask &= mask - 1;
                p[k] = at + e;
                dd[k++] = d16[e];
            }
        }
        pos->len += k;
        dif->len += k;
    }
    return w;
}
#endif

/* 16-bit elements: a mask of the lanes that differ, then one iteration per differing element. Returns -1
 * when out of memory. */
static int scan16(const char *wb, const char *wn, size_t words, size_t first, Vec *pos, Vec *dif) {
    size_t w = 0;
#ifdef HAVE_WIDE
    if (level >= LEVEL_AVX2) {
        w = level == LEVEL_AVX512 ? scan16_wide(wb, wn, words, first, pos, dif)
                                  : scan16_avx2(wb, wn, words, first, pos, dif);
        if (w == (size_t)-1) return -1;
    }
#endif
#ifdef __SSE2__
    /* x86-64 (SSE2 is its baseline): 8 lanes per compare, movemask gives each lane two equal bits; 32 elements make
     * a 64-bit mask of bit pairs, and each differing element clears its pair. */
    for (; w + 8 <= words; w += 8) {
        uint64_t mask = 0;
        for (int j = 0; j < 4; j++) {
            __m128i x = _mm_loadu_si128((const __m128i *)(wb + 8 * w + 16 * j));
            __m128i y = _mm_loadu_si128((const __m128i *)(wn + 8 * w + 16 * j));
            mask |= (uint64_t)((uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi16(x, y)) ^ 0xFFFFu) << (16 * j);
        }
        if (vec_reserve(pos, 32) || vec_reserve(dif, 32)) return -1;
        int64_t *p = (int64_t *)pos->data + pos->len;
        uint16_t *dd = (uint16_t *)dif->data + dif->len;
        const uint16_t *b16 = (const uint16_t *)(wb + 8 * w), *n16 = (const uint16_t *)(wn + 8 * w);
        size_t k = 0;
        /* The first four differing elements without a data-dependent branch (a mask with fewer writes its last
         * element past the end, which the next write or the length leaves out): a loop that ran once per
         * differing element mispredicted its exit about once per block, most of the scan's time at a few percent
         * of changes. Blocks with more than four go on in the loop. */
        for (int s = 0; s < 4; s++) {
            int e = __builtin_ctzll(mask | (1ull << 63)) >> 1;
            p[k] = (int64_t)(first + 4 * w + e);
            dd[k] = (uint16_t)(n16[e] - b16[e]);
            k += mask != 0;
            mask &= mask - 1;
            mask &= mask - 1;
        }
        while (mask) {
            int e = __builtin_ctzll(mask) >> 1;
            mask &= mask - 1;
            mask &= mask - 1;
            p[k] = (int64_t)(first + 4 * w + e);
            dd[k++] = (uint16_t)(n16[e] - b16[e]);
        }
        pos->len += k;
        dif->len += k;
    }
#else
    /* SWAR, 64 elements at a time: per 64-bit word d = x ^ y, ((d & 0x7FFF..) + 0x7FFF..) | d sets each lane's top
     * bit iff the lane is non-zero (no carry crosses lanes); one multiplication gathers the four top bits into
     * four adjacent bits (their products land at distinct positions, so nothing carries). */
    const uint64_t low15 = 0x7FFF7FFF7FFF7FFFull, high1 = 0x8000800080008000ull, gather = 0x0000200040008001ull;
    for (; w + 16 <= words; w += 16) {
        uint64_t mask = 0;
        for (int j = 0; j < 16; j++) {
            uint64_t d = load64(wb + 8 * (w + j)) ^ load64(wn + 8 * (w + j));
            uint64_t t = (((d & low15) + low15) | d) & high1;
            mask |= (((t >> 15) * gather) >> 45 & 0xF) << (4 * j);
        }
        if (!mask) continue;
        if (vec_reserve(pos, 64) || vec_reserve(dif, 64)) return -1;
        int64_t *p = (int64_t *)pos->data + pos->len;
        uint16_t *dd = (uint16_t *)dif->data + dif->len;
        const uint16_t *b16 = (const uint16_t *)(wb + 8 * w), *n16 = (const uint16_t *)(wn + 8 * w);
        size_t k = 0;
        while (mask) {
            int e = __builtin_ctzll(mask);
            mask &= mask - 1;
            p[k] = (int64_t)(first + 4 * w + e);
            dd[k++] = (uint16_t)(n16[e] - b16[e]);
        }
        pos->len += k;
        dif->len += k;
    }
#endif
    for (; w < words; w++) {
        uint64_t x = load64(wb + 8 * w), y = load64(wn + 8 * w);
        if (x == y) continue;
        if (vec_reserve(pos, 4) || vec_reserve(dif, 4)) return -1;
        for (int l = 0; l < 4; l++) {
            uint16_t a = (uint16_t)(x >> (16 * l)), b = (uint16_t)(y >> (16 * l));
            if (a == b) continue;
            ((int64_t *)pos->data)[pos->len++] = (int64_t)(first + 4 * w + l);
            ((uint16_t *)dif->data)[dif->len++] = (uint16_t)(b - a);
        }
    }
    return 0;
}

PyDoc_STRVAR(scan_doc,
             "scan(base, new, itemsize, hash_base, hash_new) -> (positions int64 Buf, differences Buf, base digest, "
             "new digest)\n\nSorted positions whose raw bits differ, the wrapped differences new - base, and the "
             "xxh3-128 digests of both (b'' when not asked for); one chunked pass over memory.");

static PyObject *py_scan(PyObject *self, PyObject *args) {
    Py_buffer bb, nb;
    int itemsize, hash_base, hash_new;
    if (!PyArg_ParseTuple(args, "y*y*ipp", &bb, &nb, &itemsize, &hash_base, &hash_new)) return NULL;
    PyObject *out = NULL;
    XXH3_state_t *sb = XXH3_createState(), *sn = XXH3_createState();
    Vec pos = {NULL, 0, 0, 8}, dif = {NULL, 0, 0, (size_t)itemsize};
    if (pair_begin(&bb, &nb, itemsize, sb, sn)) goto done;
    int failed = 0;
    const char *b0 = bb.buf, *n0 = nb.buf;
    size_t nbytes = (size_t)bb.len;
    Py_BEGIN_ALLOW_THREADS;
    for (size_t start = 0; start < nbytes && !failed; start += SCAN_CHUNK) {
        size_t len = nbytes - start < SCAN_CHUNK ? nbytes - start : SCAN_CHUNK;
        if (hash_base) HASH_UPDATE(sb, b0 + start, len);
        if (hash_new) HASH_UPDATE(sn, n0 + start, len);
        size_t words = len / 8;
        const char *wb = b0 + start, *wn = n0 + start;
        size_t first = start / itemsize; /* element index of the chunk's first element */
        switch (itemsize) {
        case 1: SCAN_LANES(uint8_t, 8) break;
        case 2: failed = scan16(wb, wn, words, first, &pos, &dif); break;
        case 4: SCAN_LANES(uint32_t, 2) break;
        default: SCAN_LANES(uint64_t, 1) break;
        }
        for (size_t i = words * 8 / itemsize; i < len / itemsize && !failed; i++) { /* the tail of the tensor */
            uint64_t a = load_item(b0 + start, i, itemsize), b = load_item(n0 + start, i, itemsize);
            if (a == b) continue;
            if (vec_reserve(&pos, 1) || vec_reserve(&dif, 1)) {
                failed = 1;
                break;
            }
            ((int64_t *)pos.data)[pos.len++] = (int64_t)(first + i);
            store_item(dif.data, dif.len++, itemsize, b - a);
        }
    }
    Py_END_ALLOW_THREADS;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *p = vec_to_buf(&pos), *d = vec_to_buf(&dif);
    out = pair_result(p, d, sb, sn, hash_base, hash_new);
    Py_XDECREF(p);
    Py_XDECREF(d);
done:
    vec_free(&pos);
    vec_free(&dif);
    XXH3_freeState(sb);
    XXH3_freeState(sn);
    PyBuffer_Release(&bb);
    PyBuffer_Release(&nb);
    return out;
}

PyDoc_STRVAR(sampled_changes_doc, "sampled_changes(base, new, itemsize, step) -> count\n\nHow many of the elements "
                                  "0, step, 2 step, ... differ between base and new (dense.is_dense's sample).");

static PyObject *py_sampled_changes(PyObject *self, PyObject *args) {
    Py_buffer bb, nb;
    int itemsize;
    Py_ssize_t step;
    if (!PyArg_ParseTuple(args, "y*y*in", &bb, &nb, &itemsize, &step)) return NULL;
    PyObject *out = NULL;
    if (check_itemsize(itemsize)) goto done;
    if (bb.len != nb.len || bb.len % itemsize || step < 1) {
        PyErr_SetString(PyExc_ValueError, "sampled_changes: sizes do not fit");
        goto done;
    }
    size_t n = (size_t)bb.len / itemsize, changed = 0;
    for (size_t i = 0; i < n; i += (size_t)step) { /* a cache line each: all requested before any is read */
        __builtin_prefetch((const char *)bb.buf + i * itemsize);
        __builtin_prefetch((const char *)nb.buf + i * itemsize);
    }
    for (size_t i = 0; i < n; i += (size_t)step)
        changed += load_item(bb.buf, i, itemsize) != load_item(nb.buf, i, itemsize);
    out = PyLong_FromSize_t(changed);
done:
    PyBuffer_Release(&bb);
    PyBuffer_Release(&nb);
    return out;
}

/* ------------------------------------------------------------------------------------------------ dense codes */
/* A dense tensor's changes (dense.py): every element's code zigzag(new - base) (0 = unchanged, 1, 2 = -1, +1, ...),
 * in the elements' width, computed while the chunk is hashed. */
#define DENSE_CODES(T)                                                                                             \
    do {                                                                                                           \
        const T *b = (const T *)(b0 + start), *n = (const T *)(n0 + start);                                        \
        T *c = (T *)(out + start);                                                                                 \
        size_t m = len / sizeof(T);                                                                                \
        for (size_t i = 0; i < m; i++) {                                                                           \
            T d = (T)(n[i] - b[i]);                                                                                \
            c[i] = (T)((T)(d << 1) ^ (T)(0 - (T)(d >> (8 * sizeof(T) - 1))));                                      \
            changed += c[i] != 0;                                                                                  \
        }                                                                                                          \
    } while (0)

PyDoc_STRVAR(dense_codes_doc,
             "dense_codes(base, new, itemsize, hash_base, hash_new) -> (codes Buf, changed, base digest, new digest)"
             "\n\nzigzag(new - base) of every element, the count of elements that differ, and the xxh3-128 digests "
             "of both (b'' when not asked for); one chunked pass over memory.");

static PyObject *py_dense_codes(PyObject *self, PyObject *args) {
    Py_buffer bb, nb;
    int itemsize, hash_base, hash_new;
    if (!PyArg_ParseTuple(args, "y*y*ipp", &bb, &nb, &itemsize, &hash_base, &hash_new)) return NULL;
    PyObject *out_buf = NULL, *result = NULL;
    XXH3_state_t *sb = XXH3_createState(), *sn = XXH3_createState();
    if (pair_begin(&bb, &nb, itemsize, sb, sn)) goto done;
    void *data;
    out_buf = buf_new((size_t)bb.len, &data);
    if (out_buf == NULL) goto done;
    char *out = data;
    const char *b0 = bb.buf, *n0 = nb.buf;
    size_t nbytes = (size_t)bb.len, changed = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (size_t start = 0; start < nbytes; start += SCAN_CHUNK) {
        size_t len = nbytes - start < SCAN_CHUNK ? nbytes - start : SCAN_CHUNK; /* a multiple of itemsize */
        if (hash_base) HASH_UPDATE(sb, b0 + start, len);
        if (hash_new) HASH_UPDATE(sn, n0 + start, len);
        switch (itemsize) {
        case 1: DENSE_CODES(uint8_t); break;
        case 2: DENSE_CODES(uint16_t); break;
        case 4: DENSE_CODES(uint32_t); break;
        default: DENSE_CODES(uint64_t); break;
        }
    }
    Py_END_ALLOW_THREADS;
    PyObject *count = PyLong_FromSize_t(changed);
    result = pair_result(out_buf, count, sb, sn, hash_base, hash_new);
    Py_XDECREF(count);
done:
    Py_XDECREF(out_buf);
    XXH3_freeState(sb);
    XXH3_freeState(sn);
    PyBuffer_Release(&bb);
    PyBuffer_Release(&nb);
    return result;
}

/* ------------------------------------------------------------------------------------------------ intcode */
static inline int width_of(uint64_t v) { return v < (1ull << 8) ? 1 : v < (1ull << 16) ? 2 : v < (1ull << 32) ? 4 : 8; }

/* x_i: the stream's values, as gaps of sorted positions (kind 1: x_i = p_i - p_(i-1) - 1, p_(-1) = -1) or as
 * value codes of wrapped differences (kind 2: zigzag(d) - 1 in the differences' width) or as they are (kind 0). */
static inline __attribute__((always_inline)) uint64_t stream_value(const void *src, size_t i, int itemsize, int kind) {
    if (kind == 1) {
        const int64_t *p = src;
        return (uint64_t)(i ? p[i] - p[i - 1] - 1 : p[0]);
    }
    uint64_t v = load_item(src, i, itemsize);
    if (kind == 2) {
        int bits = 8 * itemsize;
        uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
        uint64_t sign = (v >> (bits - 1)) & 1 ? mask : 0;
        v = (((v << 1) ^ sign) - 1) & mask;
    }
    return v;
}

/* intcode.choose_k on the stream's strided sample (SAMPLE elements): the candidates around log2 of the sample's
 * median, each priced as 8 bits per lo byte + the entropy of its symbols + its escape bytes. The float sums run in
 * another order than numpy's, so costs can differ from the reference's in the last bits: when another candidate
 * lies within REFINE bits of the best, *close is set and the caller lets the reference decide. */
#define SAMPLE 2048
#define REFINE 1e-9
#include <math.h>

/* c * log2(c) for every count a sample's histogram bin can hold: a candidate's entropy is then
 * log2(n) - sum_v c_v log2(c_v) / n, one table look-up per distinct symbol instead of a log2 (most of choose_k's
 * time when the symbols are 8 bits wide). Filled when the module loads. */
static double clog2c[SAMPLE * 2 + 3];

static void init_clog2c(void) {
    for (size_t c = 1; c < sizeof clog2c / sizeof clog2c[0]; c++) clog2c[c] = (double)c * log2((double)c);
}

/* The element of rank `rank` (0-based, ascending) of v[0:n], by quickselect (v is reordered). */
static uint64_t select_rank(uint64_t *v, size_t n, size_t rank) {
    size_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint64_t pivot = v[lo + (hi - lo) / 2];
        size_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot) i++;
            while (v[j] > pivot) j--;
            if (i <= j) {
                uint64_t t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                if (j == 0) break;
                j--;
            }
        }
        if (rank <= j) hi = j;
        else if (rank >= i) lo = i;
        else return v[rank];
    }
    return v[rank];
}

static int choose_k(const void *src, size_t count, int itemsize, int kind, int bits, int *close) {
    *close = 0;
    if (count == 0) return 0;
    size_t step = count / SAMPLE > 1 ? count / SAMPLE : 1, total = (count + step - 1) / step;
    uint64_t xs[SAMPLE * 2 + 2];
    uint64_t top = 0;
    size_t isz = kind == 1 ? 8 : (size_t)itemsize; /* the sample's elements lie a stride apart: one cache line each, */
    for (size_t t = 0; step * isz >= 64 && t < total; t++) { /* so all are requested before any is read */
        __builtin_prefetch((const char *)src + t * step * isz);
        if (kind == 1 && t) __builtin_prefetch((const char *)src + (t * step - 1) * isz);
    }
    for (size_t t = 0; t < total; t++) {
        xs[t] = stream_value(src, t * step, itemsize, kind);
        if (xs[t] > top) top = xs[t];
    }
    /* the sample's small values (below 4 x its size: most of a gap or code stream's) as a histogram with the list
     * of values that occur, the others as a list: they give the median, and each candidate is priced per distinct
     * small value and per large one instead of per sample element (a code stream's sample holds a few large codes
     * among many 0s and 1s). The histogram is cleared after use through that list, not by a memset of its range
     * before: a code stream's range runs to 4 x the sample size (~11 us a stream with both, then ~2) */
    static __thread uint32_t dense_tls[4 * (SAMPLE * 2 + 2)]; /* all zero between calls */
    uint32_t *dense = dense_tls;
    __asm__("" : "+r"(dense)); /* an opaque pointer: else GCC calls __tls_get_addr again in the loops below */
    uint64_t cap = 4 * (uint64_t)total, large[SAMPLE * 2 + 2];
    uint32_t distinct[SAMPLE * 2 + 2]; /* the small values that occur, in order of first occurrence */
    size_t n_large = 0, n_small, n_distinct = 0;
    for (size_t t = 0; t < total; t++) {
        uint64_t x = xs[t];
        if (x < cap) {
            if (!dense[x]++) distinct[n_distinct++] = (uint32_t)x;
        } else {
            large[n_large++] = x;
        }
    }
    n_small = total - n_large;
    uint64_t median = 0;
    size_t rank = total / 2, seen = 0;
    if (rank < n_small)
        while ((seen += dense[median]) <= rank) median++;
    else
        median = select_rank(large, n_large, rank - n_small); /* reorders the list: the sums below do not care */
    int center = median ? 64 - __builtin_clzll(median) : 0;
    int lo = center - 2 > 0 ? center - 2 : 0, hi = center + 1 < bits - 1 ? center + 1 : bits - 1;
    double best = INFINITY, costs[8];
    int best_k = 0, best_i = 0, ks[8], nk = 0;
    size_t hists[8][256], esc_terms[8];
    for (int k = lo; k <= hi; k++) {
        if (k % 8 == 7) continue;
        int n_lo = k / 8, r = k % 8;
        uint64_t rmask = (1ull << r) - 1, limit = (uint64_t)ESCAPE << k;
        size_t *hist = hists[nk], escaped = 0;
        memset(hist, 0, sizeof hists[0]);
        for (size_t d = 0; d < n_distinct; d++) { /* integer counts: the same histogram in any order */
            uint64_t v = distinct[d], y = v >> (8 * n_lo), sym = (y & rmask) | ((uint64_t)ESCAPE << r);
            hist[y < sym ? y : sym] += dense[v];
            escaped += v >= limit ? dense[v] : 0;
        }
        for (size_t t = 0; t < n_large; t++) {
            uint64_t y = large[t] >> (8 * n_lo), sym = (y & rmask) | ((uint64_t)ESCAPE << r);
            hist[y < sym ? y : sym]++;
            escaped += large[t] >= limit;
        }
        double sum = 0.0;
        for (int v = 0; v < 4 << r; v++) sum += clog2c[hist[v]]; /* symbols lie below 4 << r (the rest: +0.0) */
        double entropy = log2((double)total) - sum / (double)total;
        int esc_bytes = escaped ? width_of((top >> k) - ESCAPE) : 0;
        double cost = 8.0 * n_lo + entropy + 8.0 * esc_bytes * (double)escaped / (double)total;
        ks[nk] = k;
        esc_terms[nk] = (size_t)esc_bytes * escaped;
        if (cost < best) {
            best = cost;
            best_k = k;
            best_i = nk;
        }
        costs[nk++] = cost;
    }
    for (size_t d = 0; d < n_distinct; d++) dense[distinct[d]] = 0;
    /* A candidate with the same lo bytes, symbol histogram and escape bytes costs exactly the same in both
     * implementations (the first wins in both); any other within REFINE is too close to call here. */
    for (int i = 0; i < nk; i++)
        if (i != best_i && fabs(costs[i] - best) <= REFINE &&
            (ks[i] / 8 != best_k / 8 || esc_terms[i] != esc_terms[best_i] ||
             memcmp(hists[i], hists[best_i], sizeof hists[0]) != 0))
            *close = 1;
    return best_k;
}

/* Escape e of a stream's `escapes`: the high field h written across its `ew` byte planes (plane j holds byte j). */
static inline void put_escape(uint8_t *es, size_t escapes, int ew, size_t e, uint64_t h) {
    for (int j = 0; j < ew; j++) es[j * escapes + e] = (uint8_t)(h >> (8 * j));
}

/* The escape planes of a value stream (kind 0): h = (x >> k) - ESCAPE of every x >= limit, in order, as `ew` byte
 * planes of `escapes` bytes. For 16-bit (32-bit) values a mask of 32 (16) elements at a time (SSE2: a biased
 * signed compare, movemask), then one iteration per escape: a branch per element mispredicted on every escape (a
 * few percent of a dense tensor's codes), the pass cost more than packing the symbols. Returns the escapes
 * written. */
static size_t write_escapes(const void *src, int itemsize, size_t count, uint64_t limit, int k, uint8_t *es,
                            size_t escapes, int ew) {
    size_t e = 0, i = 0;
#ifdef __SSE2__
    if (itemsize == 2 && limit <= 0xFFFF) {
        const uint16_t *v = src;
        const __m128i bias = _mm_set1_epi16((short)0x8000), below = _mm_set1_epi16((short)((limit - 1) ^ 0x8000));
        for (; i + 32 <= count; i += 32) {
            uint64_t mask = 0;
            for (int j = 0; j < 4; j++) {
                __m128i x = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(v + i + 8 * j)), bias);
                mask |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_cmpgt_epi16(x, below)) << (16 * j);
            }
            while (mask) {
                int l = __builtin_ctzll(mask) >> 1;
                mask &= mask - 1;
                mask &= mask - 1;
                put_escape(es, escapes, ew, e++, ((uint64_t)v[i + l] >> k) - ESCAPE);
            }
        }
    }
    if (itemsize == 4 && limit <= 0xFFFFFFFFull) { /* gaps of positions: 16 elements, four lanes per compare */
        const uint32_t *v = src;
        const __m128i bias = _mm_set1_epi32((int)0x80000000u),
                      below = _mm_set1_epi32((int)((uint32_t)(limit - 1) ^ 0x80000000u));
        for (; i + 16 <= count; i += 16) {
            unsigned mask = 0;
            for (int j = 0; j < 4; j++) {
                __m128i x = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(v + i + 4 * j)), bias);
                mask |= (unsigned)_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(x, below))) << (4 * j);
            }
            while (mask) {
                int l = __builtin_ctz(mask);
                mask &= mask - 1;
                put_escape(es, escapes, ew, e++, ((uint64_t)v[i + l] >> k) - ESCAPE);
            }
        }
    }
#endif
    for (; i < count; i++) {
        uint64_t x = load_item(src, i, itemsize);
        if (x < limit) continue;
        put_escape(es, escapes, ew, e++, (x >> k) - ESCAPE);
    }
    return e;
}

PyDoc_STRVAR(encode_uints_doc,
             "encode_uints(src, itemsize, kind, k, bits=64) -> (parts Buf, escapes, escape_width, k, close)\n\n"
             "intcode.encode_uints's "
             "parts, concatenated: k // 8 lo byte planes, (k % 8 + 2)-bit symbols packed least significant first, "
             "escape planes. kind 0: src holds the values (itemsize bytes each); 1: src holds sorted int64 "
             "positions and the values are their gaps - 1; 2: src holds wrapped differences and the values are "
             "their codes zigzag(d) - 1. k = -1: chosen as intcode.choose_k chooses it for a stream of `bits`-bit "
             "integers (close: another candidate's cost is within rounding of it, let the reference decide).");

static PyObject *py_encode_uints(PyObject *self, PyObject *args) {
    Py_buffer sb;
    int itemsize, kind, k, bits = 64, close = 0;
    if (!PyArg_ParseTuple(args, "y*iii|i", &sb, &itemsize, &kind, &k, &bits)) return NULL;
    PyObject *out = NULL;
    void *narrow = NULL; /* the stream's values in their narrowest width (below) */
    size_t narrow_cap = 0;
    if (check_itemsize(kind == 1 ? 8 : itemsize)) goto done;
    int isz = kind == 1 ? 8 : itemsize;
    if (sb.len % isz || k < -1 || k >= 64 || k % 8 == 7 || kind < 0 || kind > 2 || bits < 1 || bits > 64) {
        PyErr_SetString(PyExc_ValueError, "encode_uints: bad arguments");
        goto done;
    }
    size_t count = (size_t)sb.len / isz;
    if (k < 0) {
        Py_BEGIN_ALLOW_THREADS;
        k = choose_k(sb.buf, count, itemsize, kind, bits, &close);
        Py_END_ALLOW_THREADS;
    }
    int n_lo = k / 8, r = k % 8, per = 8 / (r + 2), pshift = per == 4 ? 2 : per == 2 ? 1 : 0;
    size_t packed = (count + per - 1) / per;
    uint64_t limit = (uint64_t)ESCAPE << k; /* values >= limit escape (k <= 62: no overflow) */
    size_t escapes = 0;
    uint64_t top = 0;
    const void *src = sb.buf;
    if (n_lo == 0 && count && ((kind == 1 && bits <= 32) || (kind == 2 && itemsize == 2))) {
        narrow = pool_get(count * (kind == 1 ? 4 : 2), &narrow_cap);
        if (narrow == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS;
    /* The two streams of every sparse tensor, split below a byte: gaps of positions below 2^32 (truncated to 32
     * bits, as the reference's uint32 gaps are) and codes of 16-bit differences. Their values go to a narrow
     * array first, in loops the compiler vectorizes, and are then counted, packed and escaped as values (kind 0)
     * by the vectorized loops below: one pass per element with the value computed in 64 bits and its symbol ORed
     * into its byte cost ~4-5 ns per value. */
    if (narrow != NULL && kind == 1) {
        const int64_t *p = (const int64_t *)src;
        uint32_t *g = narrow;
        g[0] = (uint32_t)p[0];
        for (size_t i = 1; i < count; i++) g[i] = (uint32_t)(p[i] - p[i - 1] - 1);
        src = narrow, kind = 0, itemsize = 4;
    } else if (narrow != NULL) {
        const uint16_t *d = (const uint16_t *)src;
        uint16_t *c = narrow;
        for (size_t i = 0; i < count; i++) { /* zigzag(d) - 1 in 16 bits */
            int x = d[i];
            c[i] = (uint16_t)((((x << 1) ^ -(x >> 15)) - 1) & 0xFFFF);
        }
        src = narrow, kind = 0;
    }
    /* the escapes' count and widest field: for the two streams every patch has (gaps of int64 positions, codes of
     * 16-bit differences) a branch-free loop with kind and width as constants (the generic one tests both per
     * element); ~15% of encode_uints' time */
#define COUNT_LOOP(KIND, ISZ)                                                                                      \
    for (size_t i = 0; i < count; i++) {                                                                           \
        uint64_t x = stream_value(src, i, ISZ, KIND);                                                              \
        int over = x >= limit;                                                                                     \
        uint64_t h = over ? (x >> k) - ESCAPE : 0;                                                                 \
        escapes += (size_t)over;                                                                                   \
        top = h > top ? h : top;                                                                                   \
    }
    switch (kind * 16 + itemsize) {
    case 16 + 8: COUNT_LOOP(1, 8) break;
    case 32 + 2: COUNT_LOOP(2, 2) break;
    case 4: COUNT_LOOP(0, 4) break;
    case 2: { /* 16-bit values (dense.py's codes): int arithmetic, which SSE2 vectorizes (k <= 14: no overflow) */
        const uint16_t *v = (const uint16_t *)src;
        int lim = (int)limit, t = 0;
        size_t n_esc = 0;
        for (size_t i = 0; i < count; i++) {
            int x = v[i], over = x >= lim, h = over ? (x >> k) - ESCAPE : 0;
            n_esc += (size_t)over;
            t = h > t ? h : t;
        }
        escapes = n_esc;
        top = (uint64_t)t;
        break;
    }
    default:
        for (size_t i = 0; i < count; i++) {
            uint64_t x = stream_value(src, i, itemsize, kind);
            if (x >= limit) {
                escapes++;
                uint64_t h = (x >> k) - ESCAPE;
                if (h > top) top = h;
            }
        }
    }
#undef COUNT_LOOP
    Py_END_ALLOW_THREADS;
    int ew = escapes ? width_of(top) : 0;
    size_t total = n_lo * count + packed + escapes * ew;
    void *bufp;
    PyObject *parts = buf_new(total, &bufp);
    if (parts == NULL) goto done;
    uint8_t *buf = bufp;
    Py_BEGIN_ALLOW_THREADS;
    uint8_t *lo = buf, *pk = buf + n_lo * count, *es = pk + packed;
    memset(pk, 0, packed);
    size_t e = 0;
    uint64_t rmask = (1ull << r) - 1;
    /* A value stream split below its first byte (dense.py's codes of every element: mostly 0-4): one packed byte of
     * PER symbols at a time, no lo planes, the escapes in a second pass when there are any -- straight-line code
     * the compiler vectorizes, where the general loop below ORs each symbol into its byte (~3 ns per value). */
#define PACK_SMALL(T, A, PER) /* A: the arithmetic's type (int for narrow values: SSE2 compares ints) */           \
    do {                                                                                                           \
        const T *v = (const T *)src;                                                                               \
        const A cap = (A)((unsigned)ESCAPE << r), low = (A)rmask; /* the symbols fit a byte */                     \
        const int shift = r + 2;                                                                                   \
        size_t full = count / (PER);                                                                               \
        for (size_t g = 0; g < full; g++) {                                                                        \
            unsigned byte = 0;                                                                                     \
            for (int q = 0; q < (PER); q++) {                                                                      \
                A x = v[g * (PER) + q], sym = (A)((x & low) | cap);                                                \
                byte |= (unsigned)(uint8_t)(x < sym ? x : sym) << (shift * q);                                     \
            }                                                                                                      \
            pk[g] = (uint8_t)byte;                                                                                 \
        }                                                                                                          \
        for (size_t i = full * (PER); i < count; i++) {                                                            \
            uint64_t x = v[i], sym = (x & rmask) | cap;                                                            \
            pk[i / (PER)] |= (uint8_t)((x < sym ? x : sym) << ((r + 2) * (i % (PER))));                            \
        }                                                                                                          \
        if (escapes) e = write_escapes(src, sizeof(T), count, limit, k, es, escapes, ew);                          \
    } while (0)
#define PACK_SMALL_WIDTH(PER)                                                                                      \
    switch (itemsize) {                                                                                            \
    case 1: PACK_SMALL(uint8_t, int, PER); break;                                                                  \
    case 2: PACK_SMALL(uint16_t, int, PER); break;                                                                 \
    case 4: PACK_SMALL(uint32_t, uint32_t, PER); break;                                                            \
    default: PACK_SMALL(uint64_t, uint64_t, PER); break;                                                           \
    }
    int small = kind == 0 && n_lo == 0;
    if (small && per == 1) PACK_SMALL_WIDTH(1)
    else if (small && per == 2) PACK_SMALL_WIDTH(2)
    else if (small && per == 4) PACK_SMALL_WIDTH(4)
#undef PACK_SMALL_WIDTH
#undef PACK_SMALL
    /* one loop per (kind, width), so that the value's computation is straight-line code */
#define ENCODE_LOOP(KIND, ISZ)                                                                                     \
    for (size_t i = 0; i < count; i++) {                                                                           \
        uint64_t x = stream_value(src, i, ISZ, KIND);                                                              \
        for (int j = 0; j < n_lo; j++) lo[j * count + i] = (uint8_t)(x >> (8 * j));                                \
        uint64_t y = x >> (8 * n_lo);                                                                              \
        uint64_t sym = (y & rmask) | ((uint64_t)ESCAPE << r);                                                      \
        if (y < sym) sym = y;                                                                                      \
        pk[i >> pshift] |= (uint8_t)(sym << ((r + 2) * (i & (per - 1))));                                          \
        if (x >= limit) put_escape(es, escapes, ew, e++, (x >> k) - ESCAPE);                                       \
    }
    else switch (kind * 16 + itemsize) {
    case 16 + 8: ENCODE_LOOP(1, 8) break;
    case 16 + 4: ENCODE_LOOP(1, 4) break;
    case 16 + 2: ENCODE_LOOP(1, 2) break;
    case 16 + 1: ENCODE_LOOP(1, 1) break;
    case 32 + 2: ENCODE_LOOP(2, 2) break;
    case 32 + 4: ENCODE_LOOP(2, 4) break;
    case 32 + 1: ENCODE_LOOP(2, 1) break;
    case 32 + 8: ENCODE_LOOP(2, 8) break;
    case 2: ENCODE_LOOP(0, 2) break;
    case 4: ENCODE_LOOP(0, 4) break;
    case 1: ENCODE_LOOP(0, 1) break;
    default: ENCODE_LOOP(0, 8) break;
    }
#undef ENCODE_LOOP
    Py_END_ALLOW_THREADS;
    out = Py_BuildValue("(Onnii)", parts, (Py_ssize_t)escapes, (Py_ssize_t)ew, k, close);
    Py_DECREF(parts);
done:
    pool_put(narrow, narrow_cap);
    PyBuffer_Release(&sb);
    return out;
}

/* Decoding one stream: symbols checked (padding, escape count), values assembled, escapes checked for overflow.
 * Calls emit(i, x) per value in order; returns NULL or an error message. */
typedef struct {
    const uint8_t *buf;
    size_t count;
    int k, ew, bits;
    size_t escapes;
} Stream;

/* The escape fields among a packed byte's symbols, for the splits with several symbols per byte (r = 0, 1, 2). */
static uint8_t escapes_in_byte[3][256];

static void init_escapes_in_byte(void) {
    for (int r = 0; r < 3; r++) {
        int width = r + 2, per = 8 / width;
        for (int b = 0; b < 256; b++) {
            int n = 0;
            for (int j = 0; j < per; j++) n += ((b >> (width * j)) & ((1 << width) - 1)) >> r == ESCAPE;
            escapes_in_byte[r][b] = (uint8_t)n;
        }
    }
}

static const char *padding_check(const Stream *s) {
    int n_lo = s->k / 8, r = s->k % 8, per = 8 / (r + 2);
    size_t packed = (s->count + per - 1) / per;
    const uint8_t *pk = s->buf + n_lo * s->count;
    if (per > 1 && s->count % per) { /* padding after the last symbol */
        unsigned used = (unsigned)((s->count % per) * (r + 2)), full = (unsigned)(per * (r + 2));
        /* the symbol slots after the last symbol must be zero; bits above per * (r + 2) carry no slot (as in
         * the reference, which unpacks bytes by table) */
        if ((pk[packed - 1] & ((1u << full) - 1)) >> used) return "non-zero padding after the last packed symbol";
    }
    return NULL;
}

#define ESCAPES_DIFFER "stream's escape fields do not match its spec"

/* The padding, and the escape fields counted against the spec (before a decode loop that trusts the count). */
static const char *stream_check(const Stream *s) {
    const char *err = padding_check(s);
    if (err) return err;
    int n_lo = s->k / 8, r = s->k % 8, per = 8 / (r + 2);
    size_t packed = (s->count + per - 1) / per;
    const uint8_t *pk = s->buf + n_lo * s->count;
    /* the escape fields counted: a symbol per byte escapes iff its byte lies in [3 << r, 4 << r) (r = 6: the top
     * quarter), a compare the compiler vectorizes; several per byte by table */
    size_t esc = 0;
    if (per == 1) {
        uint8_t lo = (uint8_t)(ESCAPE << r), width = (uint8_t)(1u << r);
        for (size_t i = 0; i < s->count; i++) esc += (uint8_t)(pk[i] - lo) < width;
    } else {
        const uint8_t *table = escapes_in_byte[r];
        for (size_t b = 0; b < packed; b++) esc += table[pk[b]];
    }
    if (esc != s->escapes) return ESCAPES_DIFFER;
    return NULL;
}

/* The bits above the lo bytes of an escaped symbol `sym` (split r): its escape field, the next (`*e`) in order,
 * read across the `ew` byte planes and checked to fit the stream's width. NULL, or an error: the stream has fewer
 * escape fields than escaped symbols (a loop that counts as it goes), or the value overflows. */
static inline __attribute__((always_inline)) const char *escaped_high(const Stream *s, const uint8_t *es, size_t *e,
                                                                      unsigned sym, int r, uint64_t *high) {
    if (*e == s->escapes) return ESCAPES_DIFFER;
    uint64_t h = 0;
    for (int j = 0; j < s->ew; j++) h |= (uint64_t)es[j * s->escapes + *e] << (8 * j);
    (*e)++;
    if (h > ~0ull - ESCAPE || (s->bits - s->k < 64 && h + ESCAPE >= (1ull << (s->bits - s->k))))
        return "escaped value overflows the stream's integer width";
    *high = ((h + ESCAPE) << r) | (sym & ((1u << r) - 1));
    return NULL;
}

#define STREAM_DECODE_AT(EMIT, N_LO, R)                                                                                      \
    do {                                                                                                           \
        const int n_lo = (N_LO), r = (R), per = 8 / (r + 2), pshift = per == 4 ? 2 : per == 2 ? 1 : 0;             \
        size_t packed = (s->count + per - 1) / per, e = 0;                                                         \
        const uint8_t *lo = s->buf, *pk = s->buf + n_lo * s->count, *es = pk + packed;                             \
        uint8_t smask = per == 1 ? 0xFF : (uint8_t)((1u << (r + 2)) - 1); /* one per byte: the whole byte */       \
        for (size_t i = 0; i < s->count; i++) {                                                                    \
            uint8_t sym = (uint8_t)((pk[i >> pshift] >> ((r + 2) * (i & (per - 1)))) & smask);                     \
            uint64_t x = 0;                                                                                        \
            for (int j = 0; j < n_lo; j++) x |= (uint64_t)lo[j * s->count + i] << (8 * j);                         \
            int escaped = r < 6 ? (sym >> r) == ESCAPE : sym >= (ESCAPE << r);                                     \
            if (escaped) {                                                                                         \
                uint64_t high;                                                                                     \
                if ((err = escaped_high(s, es, &e, sym, r, &high)) != NULL) break;                                 \
                x |= high << (8 * n_lo);                                                                           \
            } else {                                                                                               \
                x |= (uint64_t)sym << (8 * n_lo);                                                                  \
            }                                                                                                      \
            EMIT                                                                                                   \
        }                                                                                                          \
    } while (0)

/* STREAM_DECODE_AT with the split point as constants for k < 16 (the values' byte layout becomes straight-line
 * code), as variables beyond. */
#define STREAM_DECODE(EMIT)                                                                                        \
    switch (s->k) {                                                                                                \
    case 0: STREAM_DECODE_AT(EMIT, 0, 0); break;                                                                   \
    case 1: STREAM_DECODE_AT(EMIT, 0, 1); break;                                                                   \
    case 2: STREAM_DECODE_AT(EMIT, 0, 2); break;                                                                   \
    case 3: STREAM_DECODE_AT(EMIT, 0, 3); break;                                                                   \
    case 4: STREAM_DECODE_AT(EMIT, 0, 4); break;                                                                   \
    case 5: STREAM_DECODE_AT(EMIT, 0, 5); break;                                                                   \
    case 6: STREAM_DECODE_AT(EMIT, 0, 6); break;                                                                   \
    case 8: STREAM_DECODE_AT(EMIT, 1, 0); break;                                                                   \
    case 9: STREAM_DECODE_AT(EMIT, 1, 1); break;                                                                   \
    case 10: STREAM_DECODE_AT(EMIT, 1, 2); break;                                                                  \
    case 11: STREAM_DECODE_AT(EMIT, 1, 3); break;                                                                  \
    case 12: STREAM_DECODE_AT(EMIT, 1, 4); break;                                                                  \
    case 13: STREAM_DECODE_AT(EMIT, 1, 5); break;                                                                  \
    case 14: STREAM_DECODE_AT(EMIT, 1, 6); break;                                                                  \
    default: STREAM_DECODE_AT(EMIT, s->k / 8, s->k % 8); break;                                                    \
    }

static int parse_stream(Py_buffer *b, Py_ssize_t offset, Py_ssize_t count, int k, Py_ssize_t escapes, int ew,
                        int bits, Stream *s) {
    int n_lo = k / 8, r = k % 8;
    if (k < 0 || k >= bits || r == 7 || count < 0 || escapes < 0 || escapes > count || offset < 0) goto bad;
    if (!(ew == 0 || ew == 1 || ew == 2 || ew == 4 || ew == 8) || (ew == 0) != (escapes == 0)) goto bad;
    int per = 8 / (r + 2);
    size_t need = n_lo * (size_t)count + ((size_t)count + per - 1) / per + (size_t)escapes * ew;
    if ((size_t)offset + need > (size_t)b->len) goto bad;
    s->buf = (const uint8_t *)b->buf + offset;
    s->count = (size_t)count;
    s->k = k;
    s->ew = ew;
    s->bits = bits;
    s->escapes = (size_t)escapes;
    return 0;
bad:
    PyErr_SetString(CodecError, "stream spec does not fit its buffer");
    return -1;
}

/* Positions from a gap stream whose symbols are whole bytes (k = 3..6: one symbol per byte, no lo planes, the
 * gap streams of most tensors): a byte that does not escape is the gap itself, so the loop is a load, an add and
 * a store (the escapes counted against the spec as they come); the bound is checked once at the end for those (p only grows, by at most 256 a step, so it cannot
 * wrap before), and at every escape, where a gap may be large. */
static const char *decode_gap_bytes(const Stream *s, uint64_t lim, int64_t *pos) {
    const int r = s->k;
    const uint8_t *pk = s->buf, *es = pk + s->count;
    const unsigned esc_lo = ESCAPE << r, esc_w = 1u << r; /* r = 6 too: the top quarter [192, 256) */
    const size_t count = s->count;
    uint64_t p = ~0ull; /* p_(-1) = -1 */
    size_t e = 0;
    for (size_t i = 0; i < count; i++) {
        unsigned b = pk[i];
        if (__builtin_expect((unsigned)(b - esc_lo) < esc_w, 0)) {
            uint64_t x;
            const char *err = escaped_high(s, es, &e, b, r, &x);
            if (err) return err;
            if (x >= lim || (p = p + x + 1) >= lim) return "positions run past its elements";
        } else {
            p += (uint64_t)b + 1;
        }
        pos[i] = (int64_t)p;
    }
    if (e != s->escapes) return ESCAPES_DIFFER;
    return count && p >= lim ? "positions run past its elements" : NULL;
}

PyDoc_STRVAR(decode_positions_doc,
             "decode_positions(raw, offset, count, k, escapes, escape_width, bits, limit) -> positions int64 Buf\n\n"
             "Sorted positions from a gap stream (gaps - 1 of `bits`-bit integers), each checked to lie in "
             "[0, limit).");

static PyObject *py_decode_positions(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t offset, count, escapes, limit;
    int k, ew, bits;
    if (!PyArg_ParseTuple(args, "y*nniniin", &b, &offset, &count, &k, &escapes, &ew, &bits, &limit)) return NULL;
    PyObject *out = NULL;
    Stream st, *s = &st;
    if (parse_stream(&b, offset, count, k, escapes, ew, bits, s)) goto done;
    void *posp;
    PyObject *ob = buf_new((size_t)count * 8, &posp);
    if (ob == NULL) goto done;
    int64_t *pos = posp;
    const char *err = NULL;
    Py_BEGIN_ALLOW_THREADS;
    int bytes = s->k >= 3 && s->k <= 6; /* counts its escapes as it goes */
    err = bytes ? padding_check(s) : stream_check(s);
    if (err == NULL && bytes) {
        err = decode_gap_bytes(s, (uint64_t)limit, pos);
    } else if (err == NULL) {
        uint64_t p = ~0ull, lim = (uint64_t)limit; /* p_(-1) = -1 */
        STREAM_DECODE({
            if (x >= lim || (p = p + x + 1) >= lim) {
                err = "positions run past its elements";
                break;
            }
            pos[i] = (int64_t)p;
        });
    }
    Py_END_ALLOW_THREADS;
    if (err) {
        Py_DECREF(ob);
        PyErr_SetString(CodecError, err);
        goto done;
    }
    out = ob;
done:
    PyBuffer_Release(&b);
    return out;
}

/* The differences of a 16-bit value-code stream split below a byte (k < 8: no lo planes), a packed byte at a
 * time (the escapes counted against the spec as they come, so only the padding is checked before): a byte none of whose symbols escapes gives its PER differences from a table built for the stream's r
 * (one 16-, 32- or 64-bit store); a byte with an escape, and the last byte's symbols, go symbol by symbol as in
 * STREAM_DECODE_AT. Same values and the same first error; ~4x fewer cycles per value than the per-symbol loop. */
static const char *decode_codes16_small(const Stream *s, uint16_t *dif) {
    const int r = s->k, per = 8 / (r + 2), width = r + 2;
    const uint8_t smask = per == 1 ? 0xFF : (uint8_t)((1u << width) - 1);
    const uint8_t *pk = s->buf, *es = pk + (s->count + per - 1) / per;
    uint64_t table[256];
    uint8_t has_escape[256];
    for (int b = 0; b < 256; b++) {
        uint64_t word = 0;
        int esc = 0;
        for (int q = 0; q < per; q++) {
            unsigned sym = (unsigned)(b >> (width * q)) & smask;
            esc |= r < 6 ? (sym >> r) == ESCAPE : sym >= (unsigned)(ESCAPE << r);
            unsigned zz = (sym + 1) & 0xFFFF;
            word |= (uint64_t)(uint16_t)((zz >> 1) ^ (zz & 1 ? 0xFFFF : 0)) << (16 * q);
        }
        table[b] = word;
        has_escape[b] = (uint8_t)esc;
    }
    const size_t count = s->count, full = count / per, bytes = full + (count % per != 0);
    size_t e = 0;
    for (size_t g = 0; g < bytes; g++) {
        uint8_t byte = pk[g];
        if (g < full && !has_escape[byte]) {
            uint64_t word = table[byte];
            switch (per) { /* the stores' width as a constant */
            case 4: memcpy(dif + 4 * g, &word, 8); break;
            case 2: memcpy(dif + 2 * g, &word, 4); break;
            default: dif[g] = (uint16_t)word;
            }
            continue;
        }
        for (int q = 0; q < per && g * per + q < count; q++) {
            unsigned sym = (unsigned)(byte >> (width * q)) & smask;
            uint64_t x = sym;
            if (r < 6 ? (sym >> r) == ESCAPE : sym >= (unsigned)(ESCAPE << r)) {
                const char *err = escaped_high(s, es, &e, sym, r, &x);
                if (err) return err;
            }
            if (x == 0xFFFF && s->escapes) return "a value code decodes to a zero change";
            uint64_t zz = (x + 1) & 0xFFFF;
            dif[g * per + q] = (uint16_t)((zz >> 1) ^ (zz & 1 ? 0xFFFF : 0));
        }
    }
    return e == s->escapes ? NULL : ESCAPES_DIFFER;
}

PyDoc_STRVAR(decode_diffs_doc,
             "decode_diffs(raw, offset, count, k, escapes, escape_width, itemsize) -> differences Buf\n\nWrapped "
             "differences from a value-code stream (codes zigzag(d) - 1 of itemsize bytes); a code that decodes "
             "to a zero change is an error.");

static PyObject *py_decode_diffs(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t offset, count, escapes;
    int k, ew, itemsize;
    if (!PyArg_ParseTuple(args, "y*nninii", &b, &offset, &count, &k, &escapes, &ew, &itemsize)) return NULL;
    PyObject *out = NULL;
    Stream st, *s = &st;
    if (check_itemsize(itemsize) || parse_stream(&b, offset, count, k, escapes, ew, 8 * itemsize, s)) goto done;
    void *difp;
    PyObject *ob = buf_new((size_t)count * itemsize, &difp);
    if (ob == NULL) goto done;
    char *dif = difp;
    const char *err = NULL;
    int bits = 8 * itemsize;
    uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    Py_BEGIN_ALLOW_THREADS;
    int small = itemsize == 2 && s->k < 8; /* counts its escapes as it goes */
    err = small ? padding_check(s) : stream_check(s);
    int table = s->k < 8 && s->escapes == 0; /* intcode.decode_values looks such codes up, no zero check */
    if (err == NULL && small) {
        err = decode_codes16_small(s, (uint16_t *)dif);
    } else if (err == NULL && itemsize == 2) { /* bf16 / fp16: the width as a constant */
        STREAM_DECODE({
            if (x == 0xFFFF && !table) {
                err = "a value code decodes to a zero change";
                break;
            }
            uint64_t zz = (x + 1) & 0xFFFF; /* wraps as the reference's table does */
            ((uint16_t *)dif)[i] = (uint16_t)((zz >> 1) ^ (zz & 1 ? 0xFFFF : 0));
        });
    } else if (err == NULL) {
        STREAM_DECODE({
            if (x == mask && !table) {
                err = "a value code decodes to a zero change";
                break;
            }
            uint64_t zz = (x + 1) & mask; /* wraps as the reference's table does */
            uint64_t d = ((zz >> 1) ^ (zz & 1 ? mask : 0)) & mask;
            store_item(dif, i, itemsize, d);
        });
    }
    Py_END_ALLOW_THREADS;
    if (err) {
        Py_DECREF(ob);
        PyErr_SetString(CodecError, err);
        goto done;
    }
    out = ob;
done:
    PyBuffer_Release(&b);
    return out;
}

PyDoc_STRVAR(dense_decode_doc,
             "dense_decode(raw, offset, numel, k, escapes, escape_width, itemsize, changed) -> (positions int64 Buf, "
             "differences Buf)\n\nThe changes held by a dense tensor's code stream (zigzag(d) of every element): "
             "positions in order and wrapped differences; an error unless exactly `changed` codes are not zero.");

static PyObject *py_dense_decode(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t offset, count, escapes, changed_in;
    int k, ew, itemsize;
    if (!PyArg_ParseTuple(args, "y*nniniin", &b, &offset, &count, &k, &escapes, &ew, &itemsize, &changed_in))
        return NULL;
    PyObject *pos_buf = NULL, *dif_buf = NULL, *out = NULL;
    Stream st, *s = &st;
    if (check_itemsize(itemsize) || parse_stream(&b, offset, count, k, escapes, ew, 8 * itemsize, s)) goto done;
    if (changed_in < 0 || changed_in > count) {
        PyErr_SetString(CodecError, "more changed elements than elements");
        goto done;
    }
    size_t changed = (size_t)changed_in, n = 0;
    void *pdata, *ddata;
    pos_buf = buf_new((changed + 1) * 8, &pdata); /* one spare slot: every element writes, a change advances */
    dif_buf = buf_new((changed + 1) * (size_t)itemsize, &ddata);
    if (pos_buf == NULL || dif_buf == NULL) goto done;
    ((BufObject *)pos_buf)->size = (Py_ssize_t)(changed * 8);
    ((BufObject *)dif_buf)->size = (Py_ssize_t)(changed * (size_t)itemsize);
    int64_t *pos = pdata;
    char *dif = ddata;
    const char *err = NULL;
    int bits = 8 * itemsize;
    uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    Py_BEGIN_ALLOW_THREADS;
    err = stream_check(s);
    if (err == NULL) {
        /* branch-free (a data-dependent branch mispredicts at every density between the extremes) */
        STREAM_DECODE({
            pos[n] = (int64_t)i;
            store_item(dif, n, itemsize, ((x >> 1) ^ (0 - (x & 1))) & mask);
            n += x != 0;
            if (n > changed) {
                err = "the codes hold more changed elements than the header says";
                break;
            }
        });
        if (err == NULL && n != changed) err = "the codes hold fewer changed elements than the header says";
    }
    Py_END_ALLOW_THREADS;
    if (err) {
        PyErr_SetString(CodecError, err);
        goto done;
    }
    out = PyTuple_Pack(2, pos_buf, dif_buf);
done:
    Py_XDECREF(pos_buf);
    Py_XDECREF(dif_buf);
    PyBuffer_Release(&b);
    return out;
}

/* ------------------------------------------------------------------------------------------------ staged */
/* view[pos[t] - off] += (sign) dif[t] for t in [lo, hi), in the element width */
static void add_changes(char *view, int itemsize, const int64_t *pos, int64_t off, const char *dif, size_t lo,
                        size_t hi, int sign) {
#define ADD_LOOP(T)                                                                                                \
    for (size_t t = lo; t < hi; t++) {                                                                             \
        T d = ((const T *)dif)[t];                                                                                 \
        T *x = (T *)view + (pos[t] - off);                                                                         \
        *x = (T)(*x + (sign > 0 ? d : (T)(0 - d)));                                                                \
    }
    switch (itemsize) {
    case 2: ADD_LOOP(uint16_t) break;
    case 4: ADD_LOOP(uint32_t) break;
    case 1: ADD_LOOP(uint8_t) break;
    default: ADD_LOOP(uint64_t) break;
    }
#undef ADD_LOOP
}

PyDoc_STRVAR(apply_digest_doc,
             "apply_digest(view, itemsize, positions, differences, chunk, offset) -> result digest\n\nOne chunked "
             "pass over a tensor's bits, in place: each chunk's changed elements set to base + difference, then the "
             "chunk hashed while it is in cache. positions / differences: lists of runs (at most 32), positions "
             "counted from `offset` (the tensor's first element), each run's increasing (runs disjoint); when a "
             "run's are not in chunk order, what was written is subtracted again and the tensor is as it was.");

#define APPLY_RUNS 32
#define SCRATCH 8192 /* 16-bit elements per step of apply_digest's gathering path for several runs (16 KB, in L1) */

#ifdef HAVE_WIDE
/* view[i] += scratch[i] for i < len, the scratch zeroed again: one 32-lane add per step, stored only in the lanes
 * whose difference is not zero (so a line without a change is not written), no branch on where the changes are. */
__attribute__((target("avx512f,avx512bw"))) static void add_scratch16_wide(uint16_t *view, uint16_t *scratch,
                                                                         size_t len) {
    const __m512i zero = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 32 <= len; i += 32) {
        __m512i d = _mm512_loadu_si512((const void *)(scratch + i));
        __mmask32 m = _mm512_test_epi16_mask(d, d);
        _mm512_mask_storeu_epi16(view + i, m, _mm512_add_epi16(_mm512_loadu_si512((const void *)(view + i)), d));
        _mm512_storeu_si512((void *)(scratch + i), zero);
    }
    for (; i < len; i++) {
        view[i] = (uint16_t)(view[i] + scratch[i]);
        scratch[i] = 0;
    }
}

/* The same with AVX2, which has no 16-bit masked store: a line (32 elements) whose differences are all zero is
 * neither read nor written, the others are added whole (adding zero leaves an element as it was). */
__attribute__((target("avx2"))) static void add_scratch16_avx2(uint16_t *view, uint16_t *scratch, size_t len) {
    const __m256i zero = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 32 <= len; i += 32) {
        __m256i d0 = _mm256_loadu_si256((const __m256i *)(scratch + i));
        __m256i d1 = _mm256_loadu_si256((const __m256i *)(scratch + i + 16));
        __m256i any = _mm256_or_si256(d0, d1);
        if (_mm256_testz_si256(any, any)) continue;
        __m256i *v = (__m256i *)(view + i);
        _mm256_storeu_si256(v, _mm256_add_epi16(_mm256_loadu_si256(v), d0));
        _mm256_storeu_si256(v + 1, _mm256_add_epi16(_mm256_loadu_si256(v + 1), d1));
        _mm256_storeu_si256((__m256i *)(scratch + i), zero);
        _mm256_storeu_si256((__m256i *)(scratch + i + 16), zero);
    }
    for (; i < len; i++) {
        view[i] = (uint16_t)(view[i] + scratch[i]);
        scratch[i] = 0;
    }
}
#endif

/* scratch[pos[t] - off] += dif[t] for t in [lo, hi): the changes of several runs gathered where they land (L1),
 * then added to the tensor in one pass; adding, not storing, keeps apply_digest's sum if runs overlapped. */
static void gather_changes16(uint16_t *scratch, const int64_t *pos, int64_t off, const uint16_t *dif, size_t lo,
                             size_t hi) {
    for (size_t t = lo; t < hi; t++) scratch[pos[t] - off] = (uint16_t)(scratch[pos[t] - off] + dif[t]);
}

static PyObject *py_apply_digest(PyObject *self, PyObject *args) {
    Py_buffer vb, pb[APPLY_RUNS], db[APPLY_RUNS];
    int itemsize, held = 0;
    Py_ssize_t chunk, offset;
    PyObject *pos_l, *dif_l;
    if (!PyArg_ParseTuple(args, "w*iOOnn", &vb, &itemsize, &pos_l, &dif_l, &chunk, &offset)) return NULL;
    PyObject *out = NULL;
    XXH3_state_t *sr = XXH3_createState();
    Py_ssize_t nr = PySequence_Size(pos_l);
    size_t count[APPLY_RUNS], j[APPLY_RUNS];
    if (check_itemsize(itemsize) || nr < 0) goto done;
    size_t n = (size_t)vb.len / itemsize;
    if (vb.len % itemsize || chunk <= 0 || offset < 0 || nr > APPLY_RUNS || PySequence_Size(dif_l) != nr) {
        PyErr_SetString(PyExc_ValueError, "apply_digest: sizes do not fit");
        goto done;
    }
    for (Py_ssize_t r = 0; r < nr; r++) {
        PyObject *po = PySequence_GetItem(pos_l, r), *d = PySequence_GetItem(dif_l, r);
        int ok = po && d && PyObject_GetBuffer(po, &pb[r], PyBUF_SIMPLE) == 0;
        if (ok && PyObject_GetBuffer(d, &db[r], PyBUF_SIMPLE) != 0) {
            PyBuffer_Release(&pb[r]);
            ok = 0;
        }
        Py_XDECREF(po);
        Py_XDECREF(d);
        if (!ok) goto done;
        held++;
        count[r] = (size_t)pb[r].len / 8;
        j[r] = 0;
        if (pb[r].len % 8 || (size_t)db[r].len != count[r] * itemsize) {
            PyErr_SetString(PyExc_ValueError, "apply_digest: sizes do not fit");
            goto done;
        }
    }
    if (sr == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    XXH3_128bits_reset(sr);
    char *view = vb.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    /* Several runs of 16-bit elements on an AVX2 or AVX-512 CPU: each step's changes gathered in an L1 scratch,
     * then added in one pass (a chunk written run after run, each across the whole chunk, took twice a single
     * run's time). */
    int gather = 0;
#ifdef HAVE_WIDE
    gather = level >= LEVEL_AVX2 && nr > 1 && itemsize == 2;
#endif
    uint16_t scratch[SCRATCH]; /* zeroed only where used: a single run (every v1 tensor) never touches it */
    if (gather) memset(scratch, 0, sizeof scratch);
    const size_t step = gather ? SCRATCH : (size_t)chunk;
    for (size_t start = 0; start < n; start += step) {
        size_t end = n - start < step ? n : start + step;
        const int64_t lo = (int64_t)start + offset, hi = (int64_t)end + offset; /* the chunk in run positions */
        for (Py_ssize_t r = 0; r < nr; r++) {
            const int64_t *pos = pb[r].buf;
            size_t j0 = j[r], k = j0;
            while (k < count[r] && pos[k] >= lo && pos[k] < hi) k++;
            if (gather)
                gather_changes16(scratch, pos, lo, db[r].buf, j0, k);
            else
                add_changes(view, itemsize, pos, offset, db[r].buf, j0, k, 1);
            j[r] = k;
        }
#ifdef HAVE_WIDE
        if (gather && level == LEVEL_AVX512) add_scratch16_wide((uint16_t *)view + start, scratch, end - start);
        if (gather && level == LEVEL_AVX2) add_scratch16_avx2((uint16_t *)view + start, scratch, end - start);
#endif
        HASH_UPDATE(sr, view + start * itemsize, (end - start) * itemsize);
    }
    for (Py_ssize_t r = 0; r < nr; r++) bad |= j[r] != count[r];
    if (bad) /* only positions inside their chunk were added */
        for (Py_ssize_t r = 0; r < nr; r++) add_changes(view, itemsize, pb[r].buf, offset, db[r].buf, 0, j[r], -1);
    Py_END_ALLOW_THREADS;
    if (bad) {
        PyErr_SetString(CodecError, "changed positions are not grouped by chunk within the tensor");
        goto done;
    }
    out = digest_bytes(sr);
done:
    XXH3_freeState(sr);
    PyBuffer_Release(&vb);
    for (int r = 0; r < held; r++) {
        PyBuffer_Release(&pb[r]);
        PyBuffer_Release(&db[r]);
    }
    return out;
}

PyDoc_STRVAR(revert_doc, "revert(view, itemsize, positions, differences, offset)\n\nview[positions - offset] -= "
                         "differences (wrapping): undoes apply_digest. Every position must lie in the tensor.");

static PyObject *py_revert(PyObject *self, PyObject *args) {
    Py_buffer vb, pb, db;
    int itemsize;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(args, "w*iy*y*n", &vb, &itemsize, &pb, &db, &offset)) return NULL;
    PyObject *out = NULL;
    if (check_itemsize(itemsize)) goto done;
    size_t n = (size_t)vb.len / itemsize, count = (size_t)pb.len / 8;
    if (vb.len % itemsize || pb.len % 8 || (size_t)db.len != count * itemsize) {
        PyErr_SetString(PyExc_ValueError, "revert: sizes do not fit");
        goto done;
    }
    const int64_t *pos = pb.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (size_t t = 0; t < count; t++) bad |= pos[t] < offset || (size_t)(pos[t] - offset) >= n;
    if (!bad) add_changes(vb.buf, itemsize, pos, offset, db.buf, 0, count, -1);
    Py_END_ALLOW_THREADS;
    if (bad) {
        PyErr_SetString(CodecError, "revert: a position lies outside the tensor");
        goto done;
    }
    out = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&vb);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&db);
    return out;
}

/* ------------------------------------------------------------------------------------------------ classes */
#define MAX_CLASSES 16

typedef struct {
    int itemsize, nb; /* nb: bounds (classes below the top) */
    uint64_t mask, bounds[MAX_CLASSES];
} Classes;

static int classes_init(Classes *cl, int itemsize, unsigned long long mask, PyObject *bounds) {
    cl->itemsize = itemsize;
    cl->mask = mask;
    Py_ssize_t nb = PySequence_Size(bounds);
    if (nb < 1 || nb >= MAX_CLASSES) {
        PyErr_SetString(PyExc_ValueError, "classes: 1 to 15 bounds");
        return -1;
    }
    cl->nb = (int)nb;
    for (Py_ssize_t c = 0; c < nb; c++) {
        PyObject *item = PySequence_GetItem(bounds, c);
        if (item == NULL) return -1;
        cl->bounds[c] = PyLong_AsUnsignedLongLong(item);
        Py_DECREF(item);
        if (PyErr_Occurred()) return -1;
        if ((c && cl->bounds[c] <= cl->bounds[c - 1]) || cl->bounds[c] == 0 || cl->bounds[c] > mask) {
            PyErr_SetString(PyExc_ValueError, "classes: bounds must increase within (0, mask]");
            return -1;
        }
    }
    return 0;
}

/* A segment's tensors as parts (a sequence of buffers of itemsize-byte elements), so that the class passes read
 * them where they are: a v2 segment groups small tensors, whose concatenation was a copy of every one. */
typedef struct {
    Py_ssize_t n;
    Py_buffer *bufs;
} Parts;

static int parts_get(PyObject *seq, int itemsize, Parts *p) {
    p->n = 0;
    p->bufs = NULL;
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0) return -1;
    if ((p->bufs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        int bad = item == NULL || PyObject_GetBuffer(item, &p->bufs[i], PyBUF_SIMPLE) != 0;
        Py_XDECREF(item);
        if (bad) return -1;
        p->n++;
        if (p->bufs[i].len % itemsize) {
            PyErr_SetString(PyExc_ValueError, "parts: a part's size is not a whole number of elements");
            return -1;
        }
    }
    return 0;
}

static void parts_release(Parts *p) {
    for (Py_ssize_t i = 0; i < p->n; i++) PyBuffer_Release(&p->bufs[i]);
    PyMem_Free(p->bufs);
}

/* Both class passes see a segment in chunks of 64 elements, as one mask per bound: bit l of lt[c] is set iff
 * element l of the chunk has a magnitude below bounds[c]. The bounds increase, so the masks nest; class c's
 * members in the chunk are lt[c] & ~lt[c-1] (lt[-1] = 0) and the top class's ~lt[nb-1]. A member's rank in its
 * class is the class's count before the chunk plus a popcount below its lane, and the counts advance by one
 * popcount per class and chunk, so no element is visited one by one but the changed ones (the passes this
 * replaced enumerated every element below the top bound; docs/weight-sync.md has the figures). Masks are made a
 * block of chunks at a time, so that the loop that makes them is one call with the bounds in registers. */
#define CHUNK 64
#define BLOCK_CHUNKS 64

/* A chunk's masks are stored with sentinels, MASKS(nb) words per chunk: m[0] = 0 (below class 0), m[c + 1] = lt[c],
 * m[nb + 1] = all lanes (the top class's upper edge); class c's members are then m[c + 1] & ~m[c] for every c. */
#define MASKS(nb) ((size_t)(nb) + 2)

/* Any element width, and the tail of a segment: element by element (len <= CHUNK). */
static void masks_scalar(const Classes *cl, const void *base, size_t start, size_t len, uint64_t *m) {
    for (int c = 1; c <= cl->nb; c++) m[c] = 0;
    for (size_t l = 0; l < len; l++) {
        uint64_t x = load_item(base, start + l, cl->itemsize) & cl->mask;
        for (int c = 0; c < cl->nb; c++) m[c + 1] |= (uint64_t)(x < cl->bounds[c]) << l;
    }
}

#ifdef HAVE_WIDE
/* 16-bit magnitudes, AVX-512 BW: 32 lanes per compare, the compare's mask register is the chunk's half mask. */
__attribute__((target("avx512f,avx512bw"))) static inline void masks16_wide(const Classes *cl, const char *p,
                                                                            size_t chunks, uint64_t *m) {
    __m512i bv[MAX_CLASSES];
    const int nb = cl->nb;
    for (int c = 0; c < nb; c++) bv[c] = _mm512_set1_epi16((short)cl->bounds[c]);
    const __m512i low15 = _mm512_set1_epi16(0x7FFF);
    for (size_t q = 0; q < chunks; q++, p += 2 * CHUNK, m += MASKS(nb)) {
        __m512i x0 = _mm512_and_si512(_mm512_loadu_si512((const void *)p), low15);
        __m512i x1 = _mm512_and_si512(_mm512_loadu_si512((const void *)(p + 64)), low15);
        for (int c = 0; c < nb; c++) /* the two halves joined in a mask register, stored from there */
            _store_mask64((__mmask64 *)(m + c + 1), _mm512_kunpackd((__mmask64)_mm512_cmplt_epu16_mask(x1, bv[c]),
                                                                   (__mmask64)_mm512_cmplt_epu16_mask(x0, bv[c])));
    }
}
#endif

#ifdef HAVE_WIDE
/* 16-bit magnitudes, AVX2: 16 lanes per compare (signed compares are exact: the sign bit is cleared and the
 * bounds are at most 0x7FFF); two compares pack into 32 bytes, in the order 0-7, 16-23, 8-15, 24-31 (packs works
 * per 128-bit half), which one qword permutation puts right, whose movemask is 32 lanes. */
__attribute__((target("avx2"))) static inline void masks16_avx2(const Classes *cl, const char *p, size_t chunks,
                                                                uint64_t *m) {
    __m256i bv[MAX_CLASSES];
    const int nb = cl->nb;
    for (int c = 0; c < nb; c++) bv[c] = _mm256_set1_epi16((short)cl->bounds[c]);
    const __m256i low15 = _mm256_set1_epi16(0x7FFF);
    for (size_t q = 0; q < chunks; q++, p += 2 * CHUNK, m += MASKS(nb)) {
        __m256i x[4];
        for (int j = 0; j < 4; j++) x[j] = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 32 * j)), low15);
        for (int c = 0; c < nb; c++) {
            uint64_t lt = 0;
            for (int h = 0; h < 2; h++) {
                __m256i packed = _mm256_packs_epi16(_mm256_cmpgt_epi16(bv[c], x[2 * h]),
                                                    _mm256_cmpgt_epi16(bv[c], x[2 * h + 1]));
                lt |= (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_permute4x64_epi64(packed, 0xD8)) << (32 * h);
            }
            m[c + 1] = lt;
        }
    }
}
#endif

#ifdef __SSE2__
/* 16-bit magnitudes, SSE2 (x86-64's baseline): 8 lanes per compare (signed compares are exact: the sign bit is
 * cleared and the bounds are at most 0x7FFF); two compares pack into 16 bytes, whose movemask is 16 lanes. */
static void masks16_sse2(const Classes *cl, const char *p, size_t chunks, uint64_t *m) {
    const int nb = cl->nb;
    const __m128i low15 = _mm_set1_epi16(0x7FFF);
    for (size_t q = 0; q < chunks; q++, p += 2 * CHUNK, m += MASKS(nb)) {
        __m128i x[8];
        for (int j = 0; j < 8; j++) x[j] = _mm_and_si128(_mm_loadu_si128((const __m128i *)(p + 16 * j)), low15);
        for (int c = 0; c < nb; c++) {
            const __m128i b = _mm_set1_epi16((short)cl->bounds[c]);
            uint64_t lt = 0;
            for (int j = 0; j < 4; j++) {
                __m128i packed = _mm_packs_epi16(_mm_cmplt_epi16(x[2 * j], b), _mm_cmplt_epi16(x[2 * j + 1], b));
                lt |= (uint64_t)(uint32_t)_mm_movemask_epi8(packed) << (16 * j);
            }
            m[c + 1] = lt;
        }
    }
}
#endif

/* The masks of the chunks of [start, start + len), len <= CHUNK * BLOCK_CHUNKS: chunk q's at m + q * MASKS(nb). */
static inline __attribute__((always_inline)) void block_masks(const Classes *cl, const void *base, size_t start,
                                                              size_t len, uint64_t *m, int lvl) {
    size_t whole = 0, stride = MASKS(cl->nb);
    if (cl->itemsize == 2 && cl->mask == 0x7FFF) {
        whole = len / CHUNK;
        const char *p = (const char *)base + 2 * start;
#ifdef HAVE_WIDE
        if (lvl == LEVEL_AVX512)
            masks16_wide(cl, p, whole, m);
        else if (lvl == LEVEL_AVX2)
            masks16_avx2(cl, p, whole, m);
        else
#endif
#ifdef __SSE2__
            masks16_sse2(cl, p, whole, m);
#else
            whole = 0;
#endif
    }
    for (size_t q = whole; q * CHUNK < len; q++) {
        size_t at = q * CHUNK;
        masks_scalar(cl, base, start + at, len - at < CHUNK ? len - at : CHUNK, m + q * stride);
    }
    for (size_t q = 0; q * CHUNK < len; q++) {
        m[q * stride] = 0;
        m[q * stride + stride - 1] = ~0ull;
    }
}

/* Each class pass is compiled once per level (its masks loop inlined, popcount one instruction where the level
 * has it): for AVX-512, for AVX2, and for the baseline, which GCC clones once more for CPUs with POPCNT (x86-64's
 * baseline has none, and a library call per popcount cost more than the masks). PASS calls the one `level` picks. */
#define PASS_BAD 1
#define PASS_NOMEM 2
#define PASS_COUNT 3
#ifdef HAVE_WIDE
#define PASS_VARIANTS(NAME, ARGS, ...)                                                                            \
    __attribute__((target("avx512f,avx512bw,popcnt,bmi2"))) static int NAME##_wide(ARGS) {                       \
        return NAME##_pass(__VA_ARGS__, LEVEL_AVX512);                                                             \
    }                                                                                                              \
    __attribute__((target("avx2,popcnt,bmi,bmi2"))) static int NAME##_avx2(ARGS) {                                \
        return NAME##_pass(__VA_ARGS__, LEVEL_AVX2);                                                               \
    }                                                                                                              \
    __attribute__((target_clones("popcnt", "default"))) static int NAME##_base(ARGS) {                            \
        return NAME##_pass(__VA_ARGS__, LEVEL_BASE);                                                               \
    }
#define PASS(NAME, ...)                                                                                            \
    (level == LEVEL_AVX512 ? NAME##_wide(__VA_ARGS__)                                                              \
     : level == LEVEL_AVX2 ? NAME##_avx2(__VA_ARGS__)                                                              \
                           : NAME##_base(__VA_ARGS__))
#else
#define PASS_VARIANTS(NAME, ARGS, ...)                                                                            \
    static int NAME##_base(ARGS) { return NAME##_pass(__VA_ARGS__, 0); }
#define PASS(NAME, ...) NAME##_base(__VA_ARGS__)
#endif

/* Class counts: cnt[c] is how many members of class c precede the current chunk (lanes up to MAX_CLASSES, those
 * past nb unused). The AVX-512 loops keep them in two vectors and add a chunk's counts in one step for eight
 * classes (nibble-table popcounts, which every AVX-512 BW CPU has), where the baseline adds them one by one. */
#define AI inline __attribute__((always_inline))
#ifdef HAVE_WIDE
#define WIDE __attribute__((target("avx512f,avx512bw,popcnt,bmi2")))

/* Per-qword popcounts: bytes by a nibble table, summed per qword. */
WIDE static inline __m512i popcnt64_wide(__m512i v) {
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4));
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512i a = _mm512_shuffle_epi8(table, _mm512_and_si512(v, low4));
    __m512i b = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
    return _mm512_sad_epu8(_mm512_add_epi8(a, b), _mm512_setzero_si512());
}

/* A chunk's member counts of classes 8h .. 8h + 7: lane c is popcount(m[8h + c + 1] & ~m[8h + c]). */
WIDE static inline __m512i chunk_counts_wide(const uint64_t *m, int h) {
    return popcnt64_wide(_mm512_andnot_si512(_mm512_loadu_si512((const void *)(m + 8 * h)),
                                             _mm512_loadu_si512((const void *)(m + 8 * h + 1))));
}
#endif

/* class_split's changes of one block [start, start + len) of a part (which starts at segment position off):
 * pos[*jp .. jend) into their classes' outputs, in one loop over the changes (a loop per chunk mispredicted its
 * exit once per chunk). prefix[q * MAX_CLASSES + c]: class c's members before chunk q. itemsize is cl->itemsize,
 * a constant where the caller inlines it for 16-bit elements (no width switch per change). */
static AI int split_changes(const Classes *cl, const uint8_t *lut, int lut_shift, const void *base, size_t start,
                            const uint64_t *masks, const uint64_t *prefix, const int64_t *pos, int64_t off,
                            const char *code, size_t *jp, size_t jend, int64_t **rp, char **cp, const int itemsize) {
    const int nb = cl->nb;
    const size_t stride = MASKS(nb);
    for (size_t j = *jp; j < jend; j++) {
        int64_t p = pos[j] - off;
        if (p < (int64_t)start || (j && pos[j] <= pos[j - 1])) return PASS_BAD;
        uint64_t x = load_item(base, (size_t)p, itemsize) & cl->mask;
        size_t q = ((size_t)p - start) / CHUNK;
        int l = (int)(((size_t)p - start) % CHUNK), c;
        if (lut)
            c = lut[x >> lut_shift];
        else
            for (c = 0; c < nb && x >= cl->bounds[c];) c++;
        const uint64_t *m = masks + q * stride;
        uint64_t rank = prefix[q * MAX_CLASSES + (size_t)c] +
                        (uint64_t)__builtin_popcountll(m[c + 1] & ~m[c] & ((1ull << l) - 1));
        *rp[c]++ = c == nb ? pos[j] : (int64_t)rank; /* the top class: flat positions */
        store_item(cp[c], 0, itemsize, load_item(code, j, itemsize));
        cp[c] += itemsize;
    }
    *jp = jend;
    return 0;
}

/* The class counts before each chunk of a block (prefix, as split_changes reads it), cnt advanced past it. */
#define PREFIX_ARGS const Classes *cl, size_t len, const uint64_t *masks, uint64_t *cnt, uint64_t *prefix

#ifdef HAVE_WIDE
WIDE static void class_prefix_wide(PREFIX_ARGS) {
    const size_t stride = MASKS(cl->nb);
    const int two = cl->nb > 8;
    __m512i seen0 = _mm512_loadu_si512((const void *)cnt), seen1 = _mm512_loadu_si512((const void *)(cnt + 8));
    const uint64_t *m = masks;
    for (size_t q = 0; q * CHUNK < len; q++, m += stride) {
        _mm512_storeu_si512((void *)(prefix + q * MAX_CLASSES), seen0);
        _mm512_storeu_si512((void *)(prefix + q * MAX_CLASSES + 8), seen1);
        seen0 = _mm512_add_epi64(seen0, chunk_counts_wide(m, 0));
        if (two) seen1 = _mm512_add_epi64(seen1, chunk_counts_wide(m, 1));
    }
    _mm512_storeu_si512((void *)cnt, seen0);
    _mm512_storeu_si512((void *)(cnt + 8), seen1);
}
#endif

static AI void class_prefix(PREFIX_ARGS) {
    const int nb = cl->nb;
    const uint64_t *m = masks;
    for (size_t q = 0; q * CHUNK < len; q++, m += MASKS(nb)) {
        /* the whole row, a constant size (a copy of nb counts became a library call per chunk) */
        memcpy(prefix + q * MAX_CLASSES, cnt, MAX_CLASSES * sizeof *cnt);
        for (int c = 0; c < nb; c++) cnt[c] += (uint64_t)__builtin_popcountll(m[c + 1] & ~m[c]);
    }
}

/* A block's masks and its class counts before each chunk (cnt advanced past the block). */
static AI void block_counts(const Classes *cl, const void *base, size_t start, size_t len, uint64_t *masks,
                            uint64_t *cnt, uint64_t *prefix, int lvl) {
    block_masks(cl, base, start, len, masks, lvl);
#ifdef HAVE_WIDE
    if (lvl == LEVEL_AVX512)
        class_prefix_wide(cl, len, masks, cnt, prefix);
    else
#endif
        class_prefix(cl, len, masks, cnt, prefix);
}

/* class_counts' pass over one part: the members of each class, added to cnt. */
#define COUNT_ARGS const Classes *cl, const void *base, size_t n, uint64_t *cnt
static AI int count_pass(COUNT_ARGS, int lvl) {
    uint64_t masks[BLOCK_CHUNKS * MASKS(MAX_CLASSES) + 16], prefix[BLOCK_CHUNKS * MAX_CLASSES];
    for (size_t start = 0; start < n; start += CHUNK * BLOCK_CHUNKS) {
        size_t len = n - start < CHUNK * BLOCK_CHUNKS ? n - start : CHUNK * BLOCK_CHUNKS;
        block_counts(cl, base, start, len, masks, cnt, prefix, lvl);
    }
    return 0;
}
PASS_VARIANTS(count, COUNT_ARGS, cl, base, n, cnt)

PyDoc_STRVAR(bound_histograms_doc,
             "bound_histograms(parts, itemsize, mask, shift, stride, positions, codes) -> (sample counts, change "
             "counts)\n\nclasses.histograms from the base itself: per exponent bin ((bits & mask) >> shift), the "
             "elements at every stride-th position of the segment the parts make up (from 0), and per (exponent "
             "bin, value bin) the changed elements at `positions` (sorted, in the segment) with their value codes "
             "(min(code, 63)); int64 Bufs of (mask >> shift) + 1 and 64 times that many counts.");

static PyObject *py_bound_histograms(PyObject *self, PyObject *args) {
    Py_buffer pb, cb;
    int itemsize, shift;
    unsigned long long mask;
    Py_ssize_t stride;
    PyObject *parts_seq, *out = NULL, *sample = NULL, *changes = NULL;
    if (!PyArg_ParseTuple(args, "OiKiny*y*", &parts_seq, &itemsize, &mask, &shift, &stride, &pb, &cb)) return NULL;
    Parts parts = {0, NULL};
    if (check_itemsize(itemsize) || parts_get(parts_seq, itemsize, &parts)) goto done;
    size_t count = (size_t)pb.len / 8, bins = (size_t)(mask >> shift) + 1;
    if (pb.len % 8 || (size_t)cb.len != count * itemsize || stride < 1 || shift < 0 || shift > 63 || bins > 4096) {
        PyErr_SetString(PyExc_ValueError, "bound_histograms: sizes do not fit");
        goto done;
    }
    int64_t *sh, *ch;
    if ((sample = buf_new(bins * 8, (void **)&sh)) == NULL || (changes = buf_new(bins * 64 * 8, (void **)&ch)) == NULL)
        goto done;
    memset(sh, 0, bins * 8);
    memset(ch, 0, bins * 64 * 8);
    const int64_t *pos = pb.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    size_t off = 0, j = 0, s = 0; /* s: the next sampled segment position */
    for (Py_ssize_t i = 0; i < parts.n; i++) {
        const void *base = parts.bufs[i].buf;
        size_t n = (size_t)parts.bufs[i].len / itemsize;
        for (; s < off + n; s += (size_t)stride) sh[(load_item(base, s - off, itemsize) & mask) >> shift]++;
        for (; j < count && pos[j] < (int64_t)(off + n); j++) {
            bad |= pos[j] < (int64_t)off || (j && pos[j] <= pos[j - 1]);
            if (bad) break;
            uint64_t code = load_item(cb.buf, j, itemsize);
            ch[((load_item(base, (size_t)pos[j] - off, itemsize) & mask) >> shift) * 64 + (code < 63 ? code : 63)]++;
        }
        if (bad) break;
        off += n;
    }
    bad |= j != count;
    Py_END_ALLOW_THREADS;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "bound_histograms: positions must be sorted and in the segment");
        goto done;
    }
    out = PyTuple_Pack(2, sample, changes);
done:
    Py_XDECREF(sample);
    Py_XDECREF(changes);
    parts_release(&parts);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&cb);
    return out;
}

PyDoc_STRVAR(class_counts_doc, "class_counts(parts, itemsize, mask, bounds) -> [members per class below the top]\n\n"
                               "The member count of each class below the top in the segment the parts make up (the "
                               "class passes' first phase when a segment is cut into ranges for threads).");

static PyObject *py_class_counts(PyObject *self, PyObject *args) {
    int itemsize;
    unsigned long long mask;
    PyObject *parts_seq, *bounds, *out = NULL;
    if (!PyArg_ParseTuple(args, "OiKO", &parts_seq, &itemsize, &mask, &bounds)) return NULL;
    Classes clv, *cl = &clv;
    Parts parts = {0, NULL};
    if (check_itemsize(itemsize) || classes_init(cl, itemsize, mask, bounds) || parts_get(parts_seq, itemsize, &parts))
        goto done;
    uint64_t cnt[MAX_CLASSES] = {0};
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < parts.n; i++)
        PASS(count, cl, parts.bufs[i].buf, (size_t)parts.bufs[i].len / itemsize, cnt);
    Py_END_ALLOW_THREADS;
    out = PyList_New(cl->nb);
    for (int c = 0; out && c < cl->nb; c++) {
        PyObject *v = PyLong_FromUnsignedLongLong(cnt[c]);
        if (v == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, c, v);
    }
done:
    parts_release(&parts);
    return out;
}

/* class_split's pass over one part of the segment (n elements from segment position off): its changes, from
 * pos[*jp] on, into their classes' Vecs (ranks, or flat positions for the top class, with codes); PASS_BAD for
 * positions out of order, PASS_NOMEM when a Vec cannot grow. A change's class comes from its magnitude (a table
 * where the bounds allow one), its rank from the class counts and the chunk's masks. cnt: MAX_CLASSES counts, carried
 * from part to part: class c's member count at the end. */
#define SPLIT_ARGS                                                                                                 \
    const Classes *cl, const uint8_t *lut, int lut_shift, const void *base, size_t n, size_t off,                 \
        const int64_t *pos, const char *code, size_t count, size_t *jp, Vec *outp, Vec *outc, uint64_t *cnt
static AI int split_pass(SPLIT_ARGS, int lvl) {
    const int nb = cl->nb, itemsize = cl->itemsize;
    uint64_t masks[BLOCK_CHUNKS * MASKS(MAX_CLASSES) + 16]; /* + the wide loads past the last chunk */
    uint64_t prefix[BLOCK_CHUNKS * MAX_CLASSES]; /* class counts before each chunk of the block */
    int64_t *rp[MAX_CLASSES + 1];
    char *cp[MAX_CLASSES + 1];
    size_t j = *jp;
    for (size_t start = 0; start < n; start += CHUNK * BLOCK_CHUNKS) {
        size_t len = n - start < CHUNK * BLOCK_CHUNKS ? n - start : CHUNK * BLOCK_CHUNKS, jend = j;
        while (jend < count && pos[jend] < (int64_t)(off + start + len)) jend++;
        for (int c = 0; c <= nb; c++) { /* room for every change of the block in any class */
            if (vec_reserve(&outp[c], jend - j) || vec_reserve(&outc[c], jend - j)) return PASS_NOMEM;
            rp[c] = (int64_t *)outp[c].data + outp[c].len;
            cp[c] = outc[c].data + outc[c].len * itemsize;
        }
        block_counts(cl, base, start, len, masks, cnt, prefix, lvl);
        int status = itemsize == 2 ? split_changes(cl, lut, lut_shift, base, start, masks, prefix, pos, (int64_t)off,
                                                   code, &j, jend, rp, cp, 2)
                                   : split_changes(cl, lut, lut_shift, base, start, masks, prefix, pos, (int64_t)off,
                                                   code, &j, jend, rp, cp, itemsize);
        for (int c = 0; c <= nb; c++) {
            outp[c].len = (size_t)(rp[c] - (int64_t *)outp[c].data);
            outc[c].len = outp[c].len;
        }
        if (status || j != jend) return PASS_BAD;
    }
    *jp = j;
    return 0;
}
PASS_VARIANTS(split, SPLIT_ARGS, cl, lut, lut_shift, base, n, off, pos, code, count, jp, outp, outc, cnt)

PyDoc_STRVAR(class_split_doc,
             "class_split(parts, itemsize, mask, bounds, positions, codes) -> (members, ranks, codes, top positions, "
             "top codes)\n\nThe encoder's view of a segment's magnitude classes: per class below the top, its member "
             "count, the member ranks of its changed elements (int64 Bufs) and their value codes; the top class's "
             "changed positions (flat) and codes. parts: the segment's tensors in order (their concatenation is the "
             "segment); positions: sorted changed positions in the segment; codes: their value codes (itemsize "
             "bytes each). One pass over the parts in chunks of 64 elements (one mask per bound).");

static PyObject *py_class_split(PyObject *self, PyObject *args) {
    Py_buffer pb, cb;
    int itemsize;
    unsigned long long mask;
    PyObject *parts_seq, *bounds, *out = NULL;
    if (!PyArg_ParseTuple(args, "OiKOy*y*", &parts_seq, &itemsize, &mask, &bounds, &pb, &cb)) return NULL;
    Classes clv, *cl = &clv;
    Parts parts = {0, NULL};
    /* out[c]: class c's ranks (c < nb) or the top class's flat positions (c = nb), with their codes */
    Vec outp[MAX_CLASSES + 1], outc[MAX_CLASSES + 1];
    memset(outp, 0, sizeof outp);
    memset(outc, 0, sizeof outc);
    /* the class of every magnitude >> lut_shift, where all bounds are multiples of 2^lut_shift: 256 entries for
     * the exponent-aligned bounds that choose_bounds gives bf16 and float32, at most 2^16 for any 16-bit bounds */
    uint8_t *lut = NULL;
    int lut_shift = 0;
    if (check_itemsize(itemsize) || classes_init(cl, itemsize, mask, bounds) || parts_get(parts_seq, itemsize, &parts))
        goto done;
    lut_shift = 63;
    for (int c = 0; c < cl->nb; c++)
        if (__builtin_ctzll(cl->bounds[c]) < lut_shift) lut_shift = __builtin_ctzll(cl->bounds[c]);
    if ((mask >> lut_shift) < (1u << 16)) {
        if ((lut = malloc((size_t)(mask >> lut_shift) + 1)) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (int c = 0; c <= cl->nb; c++) {
            uint64_t lo = c ? cl->bounds[c - 1] >> lut_shift : 0;
            uint64_t hi = c < cl->nb ? cl->bounds[c] >> lut_shift : (mask >> lut_shift) + 1;
            memset(lut + lo, c, hi - lo);
        }
    }
    size_t count = (size_t)pb.len / 8;
    const int nb = cl->nb;
    if ((size_t)cb.len != count * itemsize) {
        PyErr_SetString(PyExc_ValueError, "class_split: positions and codes differ in length");
        goto done;
    }
    for (int c = 0; c <= nb; c++) {
        outp[c].item = 8;
        outc[c].item = (size_t)itemsize;
    }
    uint64_t cnt[MAX_CLASSES] = {0}; /* members per class */
    int status = 0;
    Py_BEGIN_ALLOW_THREADS;
    size_t j = 0, off = 0;
    for (Py_ssize_t i = 0; i < parts.n && !status; i++) {
        size_t n = (size_t)parts.bufs[i].len / itemsize;
        status = PASS(split, cl, lut, lut_shift, parts.bufs[i].buf, n, off, pb.buf, cb.buf, count, &j, outp, outc, cnt);
        off += n;
    }
    if (!status && j != count) status = PASS_BAD;
    Py_END_ALLOW_THREADS;
    int failed = status == PASS_NOMEM, bad = status == PASS_BAD;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "class_split: positions must be sorted and lie in the segment");
        goto done;
    }
    PyObject *members = PyList_New(nb), *rl = PyList_New(nb), *cl_codes = PyList_New(nb);
    PyObject *tp = vec_to_buf(&outp[nb]), *tc = vec_to_buf(&outc[nb]);
    if (members && rl && cl_codes && tp && tc) {
        int ok = 1;
        for (int c = 0; c < nb; c++) {
            PyObject *mc = PyLong_FromUnsignedLongLong(cnt[c]), *r = vec_to_buf(&outp[c]),
                     *x = vec_to_buf(&outc[c]);
            ok &= mc && r && x;
            PyList_SET_ITEM(members, c, mc ? mc : Py_NewRef(Py_None));
            PyList_SET_ITEM(rl, c, r ? r : Py_NewRef(Py_None));
            PyList_SET_ITEM(cl_codes, c, x ? x : Py_NewRef(Py_None));
        }
        if (ok) out = PyTuple_Pack(5, members, rl, cl_codes, tp, tc);
    }
    Py_XDECREF(members);
    Py_XDECREF(rl);
    Py_XDECREF(cl_codes);
    Py_XDECREF(tp);
    Py_XDECREF(tc);
done:
    free(lut);
    for (int c = 0; c <= MAX_CLASSES; c++) {
        vec_free(&outp[c]);
        vec_free(&outc[c]);
    }
    parts_release(&parts);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&cb);
    return out;
}

/* class_positions' state: per class below the top its changes' ranks (nch of them), how many it has turned into
 * positions (nxt), how many members it has met (cnt, MAX_CLASSES lanes) and its output; bad is set by a rank that
 * does not exceed the one before it. */
typedef struct {
    const int64_t **rk;
    const size_t *nch;
    size_t *nxt;
    uint64_t *cnt;
    int64_t **out;
    int bad, top_bad;
    const int64_t *tpos; /* the top class's positions: ntop of them, t checked, the last of them prev */
    size_t ntop, t;
    int64_t prev;
} Ranks;

/* The k-th set bit of mem (k < popcount(mem)), by pdep (inlined into both levels that have BMI2). */
#ifdef HAVE_WIDE
__attribute__((target("bmi2"))) static inline int nth_set_bit_pdep(uint64_t mem, uint64_t k) {
    return __builtin_ctzll(_pdep_u64(1ull << k, mem));
}
#endif

/* One block [start, start + len) of a part (which starts at segment position off), its masks and its class counts
 * before each chunk (prefix, as block_counts makes them; cnt already advanced past the block): every class's ranks
 * below its count at the block's end become positions. A rank's chunk is the last whose count before it is at most
 * the rank, found by a binary search without branches (the counts never decrease; chunks past the block count as
 * infinitely many), its lane by pdep in the chunk's member mask: no branch depends on where the changes are but the
 * loop over each class's ranks, which ends once per class and block. */
#define POSITIONS_BLOCK_ARGS                                                                                       \
    const Classes *cl, size_t start, size_t len, int64_t off, const uint64_t *masks, uint64_t *prefix, Ranks *r,  \
        int by_pdep
static AI void positions_block(POSITIONS_BLOCK_ARGS) {
    const int nb = cl->nb;
    const size_t stride = MASKS(nb), chunks = (len + CHUNK - 1) / CHUNK;
    for (size_t q = chunks; q < BLOCK_CHUNKS; q++)
        for (int c = 0; c < nb; c++) prefix[q * MAX_CLASSES + (size_t)c] = UINT64_MAX;
    for (int c = 0; c < nb; c++) {
        const int64_t *rk = r->rk[c];
        int64_t *out = r->out[c];
        const uint64_t *pc = prefix + c, end = r->cnt[c];
        size_t i = r->nxt[c], nch = r->nch[c];
        int64_t last = i ? rk[i - 1] : -1;
        int bad = 0;
        for (; i < nch && (uint64_t)rk[i] < end; i++) {
            const uint64_t rank = (uint64_t)rk[i];
            bad |= (int64_t)rank <= last || rank < pc[0];
            last = (int64_t)rank;
            size_t q = 0;
            for (size_t h = BLOCK_CHUNKS / 2; h; h >>= 1) q = pc[(q + h) * MAX_CLASSES] <= rank ? q + h : q;
            const uint64_t *m = masks + q * stride, mem = m[c + 1] & ~m[c], k = (rank - pc[q * MAX_CLASSES]) & 63;
            int lane;
#ifdef HAVE_WIDE
            if (by_pdep)
                lane = nth_set_bit_pdep(mem, k);
            else
#endif
            {
                uint64_t rest = mem;
                for (uint64_t s = 0; s < k; s++) rest &= rest - 1;
                lane = __builtin_ctzll(rest | (1ull << 63));
            }
            out[i] = off + (int64_t)(start + q * CHUNK) + lane;
        }
        r->nxt[c] = i;
        r->bad |= bad;
    }
}

/* The top class's changes in one part (segment positions from *tp on, those below off + n): each must exceed the
 * one before (prev) and have a magnitude of at least the top bound. Branch-free but for the loop: a bad position
 * reads element 0 instead and sets bad. The positions pass calls it block by block, while the block is in cache. */
static int top_check(const Classes *cl, const void *base, size_t n, size_t off, const int64_t *tpos, size_t ntop,
                     size_t *tp, int64_t *prev) {
    const uint64_t top = cl->bounds[cl->nb - 1];
    size_t t = *tp;
    int64_t last = *prev;
    int bad = 0;
    for (; t < ntop && tpos[t] < (int64_t)(off + n); t++) {
        int64_t p = tpos[t] - (int64_t)off;
        int outside = p < 0;
        bad |= outside | (tpos[t] <= last);
        uint64_t x = load_item(base, outside ? 0 : (size_t)p, cl->itemsize) & cl->mask;
        bad |= x < top;
        last = tpos[t];
    }
    *tp = t;
    *prev = last;
    return bad;
}

/* class_positions' pass over one part (n elements from segment position off): the ranks of every class below the
 * top that fall in it into segment positions, and its top-class positions checked. A class's rank out of order
 * sets r->bad, a bad top-class position r->top_bad; a rank past its class's members or a top position past the
 * segment is never reached (nxt stays short of nch, t of ntop). The caller reports them. */
#define POSITIONS_ARGS const Classes *cl, const void *base, size_t n, size_t off, Ranks *r
static AI int positions_pass(POSITIONS_ARGS, int lvl) {
    uint64_t masks[BLOCK_CHUNKS * MASKS(MAX_CLASSES) + 16]; /* + the wide loads past the last chunk */
    uint64_t prefix[BLOCK_CHUNKS * MAX_CLASSES];           /* class counts before each chunk of the block */
    for (size_t start = 0; start < n; start += CHUNK * BLOCK_CHUNKS) {
        size_t len = n - start < CHUNK * BLOCK_CHUNKS ? n - start : CHUNK * BLOCK_CHUNKS;
        block_counts(cl, base, start, len, masks, r->cnt, prefix, lvl);
        positions_block(cl, start, len, (int64_t)off, masks, prefix, r,
                        lvl == LEVEL_AVX512 || (lvl == LEVEL_AVX2 && pdep_fast));
        r->top_bad |= top_check(cl, base, start + len, off, r->tpos, r->ntop, &r->t, &r->prev);
    }
    return 0;
}
PASS_VARIANTS(positions, POSITIONS_ARGS, cl, base, n, off, r)

PyDoc_STRVAR(class_positions_doc,
             "class_positions(parts, itemsize, mask, bounds, members, ranks, top_positions) -> [positions int64 "
             "Buf per class below the top]\n\nThe decoder's view: each class's changed members (sorted ranks < its "
             "member count) as sorted positions in the segment the parts make up (the segment's tensors, in order). "
             "Checked: every class has the member count the header gives, its ranks increase and are all used, "
             "the top class's positions increase, lie in the segment and are top-class members. One pass over the "
             "parts in chunks of 64 elements (one mask per bound); a class's positions pair with its differences "
             "as they came.");

static PyObject *py_class_positions(PyObject *self, PyObject *args) {
    Py_buffer tpb;
    int itemsize;
    unsigned long long mask;
    PyObject *parts_seq, *bounds, *members, *ranks_l, *out = NULL, *list = NULL;
    if (!PyArg_ParseTuple(args, "OiKOOOy*", &parts_seq, &itemsize, &mask, &bounds, &members, &ranks_l, &tpb))
        return NULL;
    Classes clv, *cl = &clv;
    Parts parts = {0, NULL};
    Py_buffer rb[MAX_CLASSES];
    int held = 0;
    if (check_itemsize(itemsize) || classes_init(cl, itemsize, mask, bounds) || parts_get(parts_seq, itemsize, &parts))
        goto done;
    const int nb = cl->nb;
    if (PySequence_Size(members) != nb || PySequence_Size(ranks_l) != nb || tpb.len % 8) {
        PyErr_SetString(PyExc_ValueError, "class_positions: one member count and rank array per class");
        goto done;
    }
    size_t want[MAX_CLASSES], nxt[MAX_CLASSES] = {0}, nch[MAX_CLASSES];
    uint64_t cnt[MAX_CLASSES] = {0};
    const int64_t *rk[MAX_CLASSES];
    int64_t *op[MAX_CLASSES];
    if ((list = PyList_New(nb)) == NULL) goto done;
    for (int c = 0; c < nb; c++) {
        PyObject *mo = PySequence_GetItem(members, c), *ro = PySequence_GetItem(ranks_l, c);
        int ok = mo && ro;
        if (ok) want[c] = PyLong_AsSize_t(mo);
        ok = ok && !PyErr_Occurred() && PyObject_GetBuffer(ro, &rb[c], PyBUF_SIMPLE) == 0;
        Py_XDECREF(mo);
        Py_XDECREF(ro);
        if (!ok) goto done;
        held++;
        if (rb[c].len % 8) {
            PyErr_SetString(PyExc_ValueError, "class_positions: ranks are int64");
            goto done;
        }
        nch[c] = (size_t)rb[c].len / 8;
        rk[c] = rb[c].buf;
        PyObject *buf = buf_new(nch[c] * 8, (void **)&op[c]);
        if (buf == NULL) goto done;
        PyList_SET_ITEM(list, c, buf);
    }
    Ranks ranks = {.rk = rk, .nch = nch, .nxt = nxt, .cnt = cnt, .out = op, .bad = 0, .top_bad = 0};
    ranks.tpos = tpb.buf;
    ranks.ntop = (size_t)tpb.len / 8;
    ranks.t = 0;
    ranks.prev = -1;
    const char *err = NULL;
    Py_BEGIN_ALLOW_THREADS;
    size_t off = 0;
    for (Py_ssize_t i = 0; i < parts.n; i++) {
        size_t n = (size_t)parts.bufs[i].len / itemsize;
        PASS(positions, cl, parts.bufs[i].buf, n, off, &ranks);
        off += n;
    }
    for (int c = 0; c < nb && err == NULL; c++)
        if (cnt[c] != want[c]) err = "a class's member count differs from the header's";
        else if (nxt[c] != nch[c] || ranks.bad) err = "a class's change ranks are not sorted members";
    if (err == NULL && (ranks.top_bad || ranks.t != ranks.ntop)) err = "a top-class position is not in the top class";
    Py_END_ALLOW_THREADS;
    if (err) {
        PyErr_SetString(CodecError, err);
        goto done;
    }
    out = Py_NewRef(list);
done:
    for (int c = 0; c < held; c++) PyBuffer_Release(&rb[c]);
    Py_XDECREF(list);
    parts_release(&parts);
    PyBuffer_Release(&tpb);
    return out;
}

/* ------------------------------------------------------------------------------------------------ bit fields */
PyDoc_STRVAR(bitmap_ranks_doc,
             "bitmap_ranks(raw, offset, n, count) -> ranks int64 Buf\n\nThe set bits of an n-bit field (least "
             "significant bit first); the padding must be zero and `count` bits set.");

static PyObject *py_bitmap_ranks(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t offset, n, count;
    if (!PyArg_ParseTuple(args, "y*nnn", &b, &offset, &n, &count)) return NULL;
    PyObject *out = NULL;
    size_t nbytes = ((size_t)n + 7) / 8;
    if (offset < 0 || n < 0 || count < 0 || count > n || (size_t)offset + nbytes > (size_t)b.len) {
        PyErr_SetString(CodecError, "bit field does not fit its buffer");
        goto done;
    }
    void *rp;
    PyObject *ob = buf_new((size_t)count * 8, &rp);
    if (ob == NULL) goto done;
    int64_t *ranks = rp;
    const uint8_t *bits = (const uint8_t *)b.buf + offset;
    const char *err = NULL;
    Py_BEGIN_ALLOW_THREADS;
    if (n % 8 && bits[nbytes - 1] >> (n % 8)) err = "non-zero padding after a bit field";
    size_t k = 0;
    for (size_t i = 0; i < nbytes / 8 * 8 && err == NULL; i += 8) {
        uint64_t w;
        memcpy(&w, bits + i, 8); /* little-endian hosts: bit j of the word is element i * 8 + j */
        while (w) {
            if (k == (size_t)count) {
                err = "bit field has more changes than its header says";
                break;
            }
            ranks[k++] = (int64_t)(i * 8 + __builtin_ctzll(w));
            w &= w - 1;
        }
    }
    for (size_t i = nbytes / 8 * 8; i < nbytes && err == NULL; i++)
        for (int j = 0; j < 8; j++)
            if (bits[i] >> j & 1) {
                if (k == (size_t)count) {
                    err = "bit field has more changes than its header says";
                    break;
                }
                ranks[k++] = (int64_t)(i * 8 + j);
            }
    if (err == NULL && k != (size_t)count) err = "bit field has fewer changes than its header says";
    Py_END_ALLOW_THREADS;
    if (err) {
        Py_DECREF(ob);
        PyErr_SetString(CodecError, err);
        goto done;
    }
    out = ob;
done:
    PyBuffer_Release(&b);
    return out;
}

PyDoc_STRVAR(ranks_bitmap_doc, "ranks_bitmap(ranks, n) -> bytes\n\nAn n-bit field (least significant bit first) "
                               "with the bits of the sorted int64 ranks set.");

static PyObject *py_ranks_bitmap(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*n", &b, &n)) return NULL;
    PyObject *out = NULL;
    if (n < 0 || b.len % 8) {
        PyErr_SetString(PyExc_ValueError, "ranks_bitmap: bad arguments");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    if (out == NULL) goto done;
    uint8_t *bits = (uint8_t *)PyBytes_AS_STRING(out);
    const int64_t *ranks = b.buf;
    size_t count = (size_t)b.len / 8;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    memset(bits, 0, (n + 7) / 8);
    for (size_t k = 0; k < count; k++) {
        if (ranks[k] < 0 || ranks[k] >= n) {
            bad = 1;
            break;
        }
        bits[ranks[k] >> 3] |= (uint8_t)(1u << (ranks[k] & 7));
    }
    Py_END_ALLOW_THREADS;
    if (bad) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_ValueError, "ranks_bitmap: a rank lies outside the field");
    }
done:
    PyBuffer_Release(&b);
    return out;
}

PyDoc_STRVAR(empty_doc, "empty(nbytes) -> Buf\n\nAn uninitialised block from the pool (output arrays of callers).");

static PyObject *py_empty(PyObject *self, PyObject *args) {
    Py_ssize_t nbytes;
    if (!PyArg_ParseTuple(args, "n", &nbytes)) return NULL;
    if (nbytes < 0) return PyErr_Format(PyExc_ValueError, "empty: negative size");
    void *data;
    return buf_new((size_t)nbytes, &data);
}

PyDoc_STRVAR(set_pool_limit_doc, "set_pool_limit(nbytes) -> previous limit\n\nMost bytes of freed blocks the pool keeps.");

PyDoc_STRVAR(set_level_doc, "set_level(n) -> level used\n\nRun the loops of instruction-set level n (0 baseline, 1 "
                            "AVX2, 2 AVX-512), or the highest the CPU has below it; the default is the highest.");

static PyObject *py_set_level(PyObject *self, PyObject *args) {
    int want;
    if (!PyArg_ParseTuple(args, "i", &want)) return NULL;
#ifdef HAVE_WIDE
    int top = level_supported();
    level = want < 0 ? LEVEL_BASE : want < top ? want : top;
    return PyLong_FromLong(level);
#else
    (void)want;
    return PyLong_FromLong(0);
#endif
}

static PyObject *py_set_pool_limit(PyObject *self, PyObject *args) {
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "n", &limit)) return NULL;
    if (limit < 0) return PyErr_Format(PyExc_ValueError, "set_pool_limit: negative size");
    pthread_mutex_lock(&pool_lock);
    size_t before = pool_limit;
    pool_limit = (size_t)limit;
    for (int c = POOL_CLASSES - 1; c >= 0 && pool_bytes > pool_limit; c--)
        while (pool_head[c] != NULL && pool_bytes > pool_limit) {
            void *p = pool_head[c];
            pool_head[c] = *(void **)p;
            pool_bytes -= (size_t)1 << c;
            free(p);
        }
    pthread_mutex_unlock(&pool_lock);
    return PyLong_FromSize_t(before);
}

/* ------------------------------------------------------------------------------------------------ module */
static PyMethodDef methods[] = {
    {"scan", py_scan, METH_VARARGS, scan_doc},
    {"sampled_changes", py_sampled_changes, METH_VARARGS, sampled_changes_doc},
    {"dense_codes", py_dense_codes, METH_VARARGS, dense_codes_doc},
    {"encode_uints", py_encode_uints, METH_VARARGS, encode_uints_doc},
    {"decode_positions", py_decode_positions, METH_VARARGS, decode_positions_doc},
    {"decode_diffs", py_decode_diffs, METH_VARARGS, decode_diffs_doc},
    {"dense_decode", py_dense_decode, METH_VARARGS, dense_decode_doc},
    {"apply_digest", py_apply_digest, METH_VARARGS, apply_digest_doc},
    {"revert", py_revert, METH_VARARGS, revert_doc},
    {"class_split", py_class_split, METH_VARARGS, class_split_doc},
    {"class_positions", py_class_positions, METH_VARARGS, class_positions_doc},
    {"class_counts", py_class_counts, METH_VARARGS, class_counts_doc},
    {"bound_histograms", py_bound_histograms, METH_VARARGS, bound_histograms_doc},
    {"bitmap_ranks", py_bitmap_ranks, METH_VARARGS, bitmap_ranks_doc},
    {"ranks_bitmap", py_ranks_bitmap, METH_VARARGS, ranks_bitmap_doc},
    {"empty", py_empty, METH_VARARGS, empty_doc},
    {"set_pool_limit", py_set_pool_limit, METH_VARARGS, set_pool_limit_doc},
    {"set_level", py_set_level, METH_VARARGS, set_level_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pulse", "Compiled kernels of the PULSE codec.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__pulse(void) {
    if (PyType_Ready(&BufType) < 0) return NULL;
    init_clog2c();
    init_escapes_in_byte();
#ifdef HAVE_WIDE
    level = level_supported();
    pdep_fast = !__builtin_cpu_is("amdfam17h");
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    CodecError = PyErr_NewException("heterorl.weights.native._pulse.CodecError", PyExc_ValueError, NULL);
    if (CodecError == NULL || PyModule_AddObjectRef(m, "CodecError", CodecError) < 0 ||
        PyModule_AddObjectRef(m, "Buf", (PyObject *)&BufType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
