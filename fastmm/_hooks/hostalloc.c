/* fastmm's allocator for NumPy's array buffers (NEP 49's PyDataMem_Handler), for accelerate_numpy().
 *
 * Why: a float32 product offloaded from plain NumPy crosses host memory on its way to the GPU and back. From
 * ordinary (pageable) memory the GPU cannot copy directly: fastmm stages every byte through page-locked buffers, a
 * second pass over host memory that cost more than the product itself (2048^3: 3.2 ms through staging, 1.0 ms
 * with the operands and the result page-locked, against NumPy's 14.5 ms). So while the hook is on, NumPy's large
 * buffers come from here: page-aligned blocks of their own mapping, which fastmm page-locks for the GPU
 * (cuMemHostRegister) the first time a product sends one there, and which go back to a pool when NumPy frees
 * them, still page-locked, for the next array of about that size (page-locking costs about a millisecond per
 * 16 MiB, once per block, not per product). Buffers below MIN_BYTES come from malloc, as NumPy's own would.
 *
 * Every entry point may run in any thread, with or without the GIL: one mutex guards the blocks, and nothing here
 * calls Python. The driver is called only through pointers fastmm sets (fastmm_hostalloc_driver), outside the
 * mutex, and never after fastmm_hostalloc_shutdown (interpreter exit) or in a forked child.
 * No Python or NumPy headers: NumPy's handler is a plain struct (numpy/ndarraytypes.h, version 1).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} allocator_t;

typedef struct {
    char name[127];
    uint8_t version;
    allocator_t allocator;
} handler_t;

typedef int (*register_fn)(void *p, size_t bytes, unsigned int flags); /* cuMemHostRegister_v2 */
typedef int (*unregister_fn)(void *p);                                  /* cuMemHostUnregister */
typedef int (*ctx_get_fn)(void **ctx);                                  /* cuCtxGetCurrent */
typedef int (*ctx_push_fn)(void *ctx);                                  /* cuCtxPushCurrent_v2 */
typedef int (*ctx_pop_fn)(void **ctx);                                  /* cuCtxPopCurrent_v2 */

#define MIN_BYTES ((size_t)1 << 20)
#define PAGE ((size_t)4096)
/* From 4 MiB, blocks are 2 MiB-aligned and asked for transparent huge pages, as NumPy's own allocator asks for its
 * (without them, BLAS on the pool's arrays ran up to a third slower: 16x8192 @ 8192x8192 9.2 against 6.1 ms). */
#define HUGE_FROM ((size_t)4 << 20)
#define HUGE ((size_t)2 << 20)
#define PORTABLE 1u /* CU_MEMHOSTREGISTER_PORTABLE: page-locked for every context, every GPU */

enum { UNPINNED = 0, PINNING = 1, PINNED = 2, FAILED = 3 };

typedef struct {
    char *base;
    size_t cap;       /* bytes mapped */
    size_t used;      /* bytes the array asked for */
    void *ctx;        /* the context it was page-locked in (unlocked in it) */
    int pin;          /* UNPINNED .. FAILED */
    int live;         /* held by an array; else in the pool */
    uint64_t freed;   /* when it went to the pool: the oldest leaves first */
} block_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static block_t *blocks;   /* sorted by base */
static size_t count, room;
static size_t pooled, pool_limit = (size_t)1 << 31;
static uint64_t tick;
static int stopped; /* interpreter exit, or a forked child: no more driver calls */
static register_fn do_register;
static unregister_fn do_unregister;
static ctx_get_fn ctx_get;
static ctx_push_fn ctx_push;
static ctx_pop_fn ctx_pop;
static size_t stat_pinned_bytes, stat_reused, stat_mapped;

/* (lock held) the index of the block holding address p, or -1 */
static long find(const char *p)
{
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (blocks[mid].base + blocks[mid].cap <= p)
            lo = mid + 1;
        else if (blocks[mid].base > p)
            hi = mid;
        else
            return (long)mid;
    }
    return -1;
}

/* (lock held) */
static int insert(block_t b)
{
    if (count == room) {
        size_t n = room ? 2 * room : 64;
        block_t *grown = realloc(blocks, n * sizeof(block_t));
        if (grown == NULL)
            return -1;
        blocks = grown;
        room = n;
    }
    size_t at = 0;
    while (at < count && blocks[at].base < b.base)
        ++at;
    memmove(blocks + at + 1, blocks + at, (count - at) * sizeof(block_t));
    blocks[at] = b;
    ++count;
    return 0;
}

/* (lock held) */
static void remove_at(size_t i)
{
    memmove(blocks + i, blocks + i + 1, (count - i - 1) * sizeof(block_t));
    --count;
}

/* A block's mapping returned to the system, unlocked first if fastmm locked it (no lock held: the driver call may
 * take a millisecond). After shutdown a locked block is left as it is: the process is ending. */
static void release(block_t b)
{
    if (b.pin == PINNED) {
        if (stopped || ctx_push == NULL || ctx_push(b.ctx) != 0)
            return;
        do_unregister(b.base);
        void *ignored;
        ctx_pop(&ignored);
    }
    munmap(b.base, b.cap);
}

/* (lock held) Pool over its limit: the oldest free blocks taken out into `out` (at most `most`), to be released
 * once the lock is dropped. */
static size_t evict(block_t *out, size_t most)
{
    size_t n = 0;
    while (pooled > pool_limit && n < most) {
        long oldest = -1;
        for (size_t i = 0; i < count; ++i)
            if (!blocks[i].live && (oldest < 0 || blocks[i].freed < blocks[oldest].freed))
                oldest = (long)i;
        if (oldest < 0)
            break;
        out[n++] = blocks[oldest];
        pooled -= blocks[oldest].cap;
        remove_at((size_t)oldest);
    }
    return n;
}

/* A fresh mapping of `cap` bytes (huge-page aligned and advised from HUGE_FROM), or NULL. */
static void *map_block(size_t cap)
{
    if (cap < HUGE_FROM) {
        void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    char *raw = mmap(NULL, cap + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *p = (char *)(((uintptr_t)raw + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    if (p + cap < raw + cap + HUGE)
        munmap(p + cap, (size_t)(raw + cap + HUGE - (p + cap)));
#ifdef MADV_HUGEPAGE
    madvise(p, cap, MADV_HUGEPAGE); /* advice: where the system has none to give, ordinary pages */
#endif
    return p;
}

static void *take(size_t size, int zero)
{
    size_t cap = (size + PAGE - 1) / PAGE * PAGE;
    if (cap >= HUGE_FROM)
        cap = (cap + HUGE - 1) / HUGE * HUGE;
    pthread_mutex_lock(&lock);
    /* The smallest pooled block that holds `size` and wastes at most a quarter of itself. */
    long best = -1;
    for (size_t i = 0; i < count; ++i)
        if (!blocks[i].live && blocks[i].cap >= cap && blocks[i].cap - cap <= blocks[i].cap / 4 &&
            (best < 0 || blocks[i].cap < blocks[best].cap))
            best = (long)i;
    if (best >= 0) {
        block_t *b = &blocks[best];
        b->live = 1;
        b->used = size;
        pooled -= b->cap;
        ++stat_reused;
        char *p = b->base;
        pthread_mutex_unlock(&lock);
        if (zero)
            memset(p, 0, size);
        return p;
    }
    pthread_mutex_unlock(&lock);
    void *p = map_block(cap);
    if (p == NULL)
        return NULL;
    block_t b = {p, cap, size, NULL, UNPINNED, 1, 0};
    pthread_mutex_lock(&lock);
    int failed = insert(b);
    if (!failed)
        ++stat_mapped;
    pthread_mutex_unlock(&lock);
    if (failed) {
        munmap(p, cap);
        return NULL;
    }
    return p; /* a fresh mapping reads as zeros */
}

/* The block that starts at ptr back to the pool (the oldest pooled ones released past the limit); 0 where ptr
 * starts none of this allocator's blocks. */
static int give_back(void *ptr)
{
    block_t victims[8];
    pthread_mutex_lock(&lock);
    long i = find(ptr);
    if (i < 0 || blocks[i].base != (char *)ptr) {
        pthread_mutex_unlock(&lock);
        return 0;
    }
    blocks[i].live = 0;
    blocks[i].freed = ++tick;
    pooled += blocks[i].cap;
    size_t n = evict(victims, 8);
    pthread_mutex_unlock(&lock);
    for (size_t j = 0; j < n; ++j)
        release(victims[j]);
    return 1;
}

static void *h_malloc(void *ctx, size_t size)
{
    (void)ctx;
    return size < MIN_BYTES ? malloc(size ? size : 1) : take(size, 0);
}

static void *h_calloc(void *ctx, size_t nelem, size_t elsize)
{
    (void)ctx;
    if (elsize && nelem > SIZE_MAX / elsize)
        return NULL;
    size_t size = nelem * elsize;
    return size < MIN_BYTES ? calloc(nelem ? nelem : 1, elsize ? elsize : 1) : take(size, 1);
}

static void h_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    if (ptr == NULL)
        return;
    /* NumPy passes the size it asked for: a small one is malloc's; a large one may still be (realloc'd there). */
    if (size < MIN_BYTES || !give_back(ptr))
        free(ptr);
}

static void *h_realloc(void *ctx, void *ptr, size_t new_size)
{
    if (ptr == NULL)
        return h_malloc(ctx, new_size);
    pthread_mutex_lock(&lock);
    long i = find(ptr);
    int mine = i >= 0 && blocks[i].base == (char *)ptr;
    size_t used = mine ? blocks[i].used : 0;
    if (mine && new_size >= MIN_BYTES && new_size <= blocks[i].cap) {
        blocks[i].used = new_size; /* fits in place */
        pthread_mutex_unlock(&lock);
        return ptr;
    }
    pthread_mutex_unlock(&lock);
    if (!mine)
        return realloc(ptr, new_size ? new_size : 1);
    void *moved = h_malloc(ctx, new_size);
    if (moved == NULL)
        return NULL; /* the old block stays the array's, as realloc's contract says */
    memcpy(moved, ptr, used < new_size ? used : new_size);
    give_back(ptr);
    return moved;
}

static handler_t handler = {
    "fastmm_pinned", 1, {NULL, h_malloc, h_calloc, h_realloc, h_free},
};

/* ---- fastmm's side ---- */

void *fastmm_hostalloc_handler(void)
{
    return &handler;
}

void fastmm_hostalloc_driver(register_fn reg, unregister_fn unreg, ctx_get_fn get, ctx_push_fn push, ctx_pop_fn pop)
{
    pthread_mutex_lock(&lock);
    do_register = reg;
    do_unregister = unreg;
    ctx_get = get;
    ctx_push = push;
    ctx_pop = pop;
    pthread_mutex_unlock(&lock);
}

void fastmm_hostalloc_limit(size_t bytes)
{
    block_t victims[64];
    size_t n;
    pthread_mutex_lock(&lock);
    pool_limit = bytes;
    n = evict(victims, 64);
    pthread_mutex_unlock(&lock);
    for (size_t j = 0; j < n; ++j)
        release(victims[j]);
}

/* Whether [p, p + bytes) lies in one of this allocator's blocks and that block is page-locked, locking it now if it
 * is not yet (in the calling thread's current context, which must be the device's). 1: page-locked; 0: not ours,
 * another thread is locking it, no driver, or locking failed (then never tried again for that block). */
int fastmm_hostalloc_pin(const char *p, size_t bytes)
{
    pthread_mutex_lock(&lock);
    long i = find(p);
    if (i < 0 || p + bytes > blocks[i].base + blocks[i].cap || !blocks[i].live) {
        pthread_mutex_unlock(&lock);
        return 0;
    }
    int state = blocks[i].pin;
    if (state != UNPINNED || stopped || do_register == NULL) {
        pthread_mutex_unlock(&lock);
        return state == PINNED;
    }
    blocks[i].pin = PINNING;
    char *base = blocks[i].base;
    size_t cap = blocks[i].cap;
    pthread_mutex_unlock(&lock);
    /* The block stays put meanwhile: the caller's array holds it live. */
    void *ctx = NULL;
    int ok = ctx_get(&ctx) == 0 && ctx != NULL && do_register(base, cap, PORTABLE) == 0;
    pthread_mutex_lock(&lock);
    i = find(base);
    blocks[i].pin = ok ? PINNED : FAILED;
    blocks[i].ctx = ctx;
    if (ok)
        stat_pinned_bytes += cap;
    pthread_mutex_unlock(&lock);
    return ok;
}

/* Interpreter exit: no driver calls from now on (blocks freed later are left to the process's end). */
void fastmm_hostalloc_shutdown(void)
{
    pthread_mutex_lock(&lock);
    stopped = 1;
    pthread_mutex_unlock(&lock);
}

/* In a forked child: the parent's page-locking does not carry over, and the driver is not usable here. */
void fastmm_hostalloc_forget(void)
{
    pthread_mutex_lock(&lock);
    stopped = 1;
    for (size_t i = 0; i < count; ++i)
        blocks[i].pin = blocks[i].pin == PINNED ? FAILED : blocks[i].pin;
    pthread_mutex_unlock(&lock);
}

/* live blocks, pooled blocks, pooled bytes, page-locked bytes (ever), reuses, mappings */
void fastmm_hostalloc_stats(size_t out[6])
{
    pthread_mutex_lock(&lock);
    size_t live = 0;
    for (size_t i = 0; i < count; ++i)
        live += blocks[i].live;
    out[0] = live;
    out[1] = count - live;
    out[2] = pooled;
    out[3] = stat_pinned_bytes;
    out[4] = stat_reused;
    out[5] = stat_mapped;
    pthread_mutex_unlock(&lock);
}
