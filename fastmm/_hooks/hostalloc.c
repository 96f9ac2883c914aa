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
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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
    uint64_t serial;  /* new each time an array takes the block: which array's contents it holds */
} block_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static block_t *blocks;   /* sorted by base */
static size_t count, room;
static size_t pooled, pool_limit = (size_t)1 << 31;
static uint64_t tick, serials;
static int stopped; /* interpreter exit, or a forked child: no more driver calls */
static register_fn do_register;
static unregister_fn do_unregister;
static ctx_get_fn ctx_get;
static ctx_push_fn ctx_push;
static ctx_pop_fn ctx_pop;
static size_t stat_pinned_bytes, stat_reused, stat_mapped;

static void untrack(const char *base);
static void forget_slot(const char *base);

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
        forget_slot(blocks[oldest].base);
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
        b->serial = ++serials;
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
    block_t b = {p, cap, size, NULL, UNPINNED, 1, 0, 0};
    pthread_mutex_lock(&lock);
    b.serial = ++serials;
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
    untrack(blocks[i].base);
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
        untrack(blocks[i].base); /* NumPy writes the grown part next: the block is another array's now */
        blocks[i].used = new_size; /* fits in place */
        blocks[i].serial = ++serials;
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


/* ---- Write tracking: blocks whose contents the GPU keeps a copy of ----
 *
 * The hook keeps a device copy of an operand that programs multiply again unchanged (docs/numpy-hook.md, section
 * 'Operands that stay on the GPU'). To know when that copy goes stale, the block is made read-only (mprotect) and
 * recorded here: the first write into it, by any thread or any C code, faults, and the SIGSEGV handler below gives
 * the block a new generation and makes it writable again, so the write goes on a few microseconds later. A device
 * copy is used only while the block's generation is the one it was made at. Writes by the kernel (read(2) into the
 * buffer) fail with EFAULT instead of faulting, and DMA by a GPU is not seen at all: both are in the docs.
 *
 * The table is read without a lock by the handler and by the matmul loop: a slot's fields are atomics, and only
 * fastmm's side writes them, under `lock`. A slot whose block went back to the pool stays, retired, until the slot is
 * needed: a handler that was already running for a write into that block still finds it. */
#define TRACK_SLOTS 256
enum { FREE = 0, TRACKED = 1, RETIRED = 2 };

typedef struct {
    uintptr_t base, end;  /* end: base + cap (the whole mapping) */
    uint64_t generation;  /* new at every write seen; never reused (drawn from `generations`) */
    uint64_t armed;       /* the generation the block was made read-only at: != generation, writable */
    int state;            /* FREE, TRACKED, RETIRED */
    uint64_t retired;     /* when it retired: the oldest is taken first */
} track_t;

static track_t tracked[TRACK_SLOTS];
static size_t tracked_top; /* every slot in use lies below it: the scans stay short */
static uint64_t generations, retirements;
static struct sigaction previous; /* the handler that was there when ours went on top */
static int installed;
static volatile sig_atomic_t forwarding; /* a fault that is not ours went on to `previous` (see forward) */
static uint64_t stat_faults, stat_protected;

static uint64_t next_generation(void)
{
    return __atomic_add_fetch(&generations, 1, __ATOMIC_SEQ_CST);
}

/* (lock-free) the slot whose block holds p, or -1; TRACKED or RETIRED ones only if `any` */
static long slot_of(uintptr_t p, int any)
{
    size_t top = __atomic_load_n(&tracked_top, __ATOMIC_ACQUIRE);
    for (size_t i = 0; i < top; ++i) {
        int state = __atomic_load_n(&tracked[i].state, __ATOMIC_ACQUIRE);
        if (state == TRACKED || (any && state == RETIRED)) {
            uintptr_t base = __atomic_load_n(&tracked[i].base, __ATOMIC_ACQUIRE);
            if (base <= p && p < __atomic_load_n(&tracked[i].end, __ATOMIC_ACQUIRE))
                return (long)i;
        }
    }
    return -1;
}

/* A fault that is not a write into a tracked block: to the handler that was there before ours, as if ours were not
 * installed, every time (a runtime that cures its own faults, a JVM's polls say, faults at the same address again and
 * again, and gets each one). When that handler is SIG_DFL, or a SIGSEGV raised by a handler (not by the hardware)
 * arrives after one was handed on (faulthandler, having printed its traceback, puts its previous handler back, ours
 * when ours was there first, and raises the signal again), SIG_DFL is put back and the fault happens again on return
 * (or is raised again): a real crash still crashes, with faulthandler's traceback once. A handler that returns without
 * curing a hardware fault gets it again, as it would without ours. */
static void forward(int sig, siginfo_t *info, void *context)
{
    struct sigaction to = previous;
    int hardware = info != NULL && info->si_code > 0;
    if (forwarding && !hardware) {
        memset(&to, 0, sizeof to);
        to.sa_handler = SIG_DFL;
    }
    if ((to.sa_flags & SA_SIGINFO) && to.sa_sigaction != NULL) {
        forwarding = 1;
        to.sa_sigaction(sig, info, context);
        return;
    }
    if (!(to.sa_flags & SA_SIGINFO) && to.sa_handler != SIG_DFL && to.sa_handler != SIG_IGN) {
        forwarding = 1;
        to.sa_handler(sig);
        return;
    }
    sigaction(SIGSEGV, &to, NULL);
    if (!hardware)
        raise(sig); /* pending until this handler returns */
}

static void on_segv(int sig, siginfo_t *info, void *context)
{
    int saved = errno;
    if (info != NULL && info->si_code == SEGV_ACCERR) {
        long i = slot_of((uintptr_t)info->si_addr, 1);
        if (i >= 0) {
            uintptr_t base = __atomic_load_n(&tracked[i].base, __ATOMIC_ACQUIRE);
            uintptr_t end = __atomic_load_n(&tracked[i].end, __ATOMIC_ACQUIRE);
            /* Writable first, then the new generation: the write runs after both, once this returns. */
            if (mprotect((void *)base, end - base, PROT_READ | PROT_WRITE) == 0) {
                __atomic_store_n(&tracked[i].generation, next_generation(), __ATOMIC_SEQ_CST);
                __atomic_add_fetch(&stat_faults, 1, __ATOMIC_RELAXED);
                errno = saved;
                return;
            }
        }
    }
    forward(sig, info, context);
    errno = saved;
}

/* (lock held) ours as the SIGSEGV handler, on top of whatever was installed since (faulthandler.enable() after
 * accelerate_numpy(), say), chaining to it. A sigaction query: well under a microsecond. */
static void ensure_handler(void)
{
    struct sigaction now, ours;
    if (sigaction(SIGSEGV, NULL, &now) != 0)
        return;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_segv) {
        forwarding = 0;
        return;
    }
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_segv;
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&ours.sa_mask);
    installed = 1;
    previous = now; /* (ours is not the one running now: no handler of ours reads it meanwhile) */
    forwarding = 0;
    sigaction(SIGSEGV, &ours, NULL);
}

/* (lock held) the block at `base` writable and no longer tracked (retired: see above) */
static void untrack(const char *base)
{
    long i = slot_of((uintptr_t)base, 0);
    if (i < 0)
        return;
    track_t *t = &tracked[i];
    mprotect((void *)t->base, t->end - t->base, PROT_READ | PROT_WRITE);
    __atomic_store_n(&t->generation, next_generation(), __ATOMIC_SEQ_CST);
    t->retired = ++retirements;
    __atomic_store_n(&t->state, RETIRED, __ATOMIC_RELEASE);
}

/* (lock held) the slot of the block at `base` freed for good: its mapping is about to be returned to the system */
static void forget_slot(const char *base)
{
    untrack(base);
    long i = slot_of((uintptr_t)base, 1);
    if (i >= 0)
        __atomic_store_n(&tracked[i].state, FREE, __ATOMIC_RELEASE);
}

/* (lock held) a slot for a new block: a free one, else the longest retired; -1 if every one is tracked */
static long new_slot(void)
{
    long best = -1;
    for (size_t i = 0; i < TRACK_SLOTS; ++i) {
        int state = tracked[i].state;
        if (state == FREE)
            return (long)i;
        if (state == RETIRED && (best < 0 || tracked[i].retired < tracked[best].retired))
            best = (long)i;
    }
    return best;
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

/* Make the block holding p read-only and track its writes (see 'Write tracking'), if it is not already: returns its
 * generation, or 0 where p lies in no live block of this allocator, every slot is taken, or the block could not be
 * protected (or was written meanwhile). Page-lock the block first: the driver may refuse to lock read-only pages. */
uint64_t fastmm_hostalloc_track(const char *p)
{
    pthread_mutex_lock(&lock);
    long b = find(p);
    if (b < 0 || !blocks[b].live || stopped) {
        pthread_mutex_unlock(&lock);
        return 0;
    }
    ensure_handler();
    uintptr_t base = (uintptr_t)blocks[b].base;
    long i = slot_of(base, 1);
    if (i >= 0 && tracked[i].state == RETIRED) { /* the block's own retired slot: one slot per block, always */
        __atomic_store_n(&tracked[i].generation, next_generation(), __ATOMIC_SEQ_CST);
        tracked[i].armed = 0;
        __atomic_store_n(&tracked[i].state, TRACKED, __ATOMIC_RELEASE);
    } else if (i < 0) {
        i = new_slot();
        if (i < 0) {
            pthread_mutex_unlock(&lock);
            return 0;
        }
        track_t *t = &tracked[i];
        __atomic_store_n(&t->state, FREE, __ATOMIC_RELEASE); /* (a retired slot: out of the scans while rewritten) */
        __atomic_store_n(&t->base, base, __ATOMIC_RELEASE);
        __atomic_store_n(&t->end, base + blocks[b].cap, __ATOMIC_RELEASE);
        __atomic_store_n(&t->generation, next_generation(), __ATOMIC_SEQ_CST);
        t->armed = 0;
        __atomic_store_n(&t->state, TRACKED, __ATOMIC_RELEASE);
        if ((size_t)i >= tracked_top)
            __atomic_store_n(&tracked_top, (size_t)i + 1, __ATOMIC_RELEASE);
    }
    track_t *t = &tracked[i];
    uint64_t g = __atomic_load_n(&t->generation, __ATOMIC_SEQ_CST);
    if (t->armed != g) {
        /* Read-only, then armed at g, then g checked again: a write in between (its fault makes the block writable
         * and then draws a new generation) leaves g stale, and the copy made at g is never used. */
        if (mprotect((void *)t->base, t->end - t->base, PROT_READ) != 0) {
            pthread_mutex_unlock(&lock);
            return 0;
        }
        t->armed = g;
        ++stat_protected;
    }
    uint64_t now = __atomic_load_n(&t->generation, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&lock);
    return now == g ? g : 0;
}

/* Ours on top of the SIGSEGV handlers again, once it was installed (after faulthandler.enable() or .disable()). */
void fastmm_hostalloc_guard(void)
{
    pthread_mutex_lock(&lock);
    if (installed && !stopped)
        ensure_handler();
    pthread_mutex_unlock(&lock);
}

/* (lock-free, nanoseconds) The generation of the tracked block holding p, or 0 where none does. */
uint64_t fastmm_hostalloc_generation(const char *p)
{
    long i = slot_of((uintptr_t)p, 0);
    return i < 0 ? 0 : __atomic_load_n(&tracked[i].generation, __ATOMIC_SEQ_CST);
}

/* The tracked block holding p was written without a fault (fastmm's own download into it, by DMA): a new
 * generation. The block stays read-only; the next track finds it disarmed and arms it again. */
void fastmm_hostalloc_touch(const char *p)
{
    long i = slot_of((uintptr_t)p, 0);
    if (i >= 0)
        __atomic_store_n(&tracked[i].generation, next_generation(), __ATOMIC_SEQ_CST);
}

/* (nanoseconds) Whether p lies in a tracked block, or in a live block of this allocator: a product reading it may be
 * worth the hook's question even below its threshold (hostloop.c). */
int fastmm_hostalloc_candidate(const char *p)
{
    if (slot_of((uintptr_t)p, 0) >= 0)
        return 1;
    pthread_mutex_lock(&lock);
    long i = find(p);
    int mine = i >= 0 && blocks[i].live;
    pthread_mutex_unlock(&lock);
    return mine;
}

/* The block holding p writable again and untracked (the GPU keeps no copy of it any more). */
void fastmm_hostalloc_untrack(const char *p)
{
    pthread_mutex_lock(&lock);
    long i = slot_of((uintptr_t)p, 0);
    if (i >= 0)
        untrack((const char *)tracked[i].base);
    pthread_mutex_unlock(&lock);
}

/* Every tracked block writable and untracked (restore_numpy, interpreter exit); ours stays the SIGSEGV handler, and
 * lets a write that faulted just before go on. */
void fastmm_hostalloc_untrack_all(void)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < tracked_top; ++i)
        if (tracked[i].state == TRACKED)
            untrack((const char *)tracked[i].base);
    pthread_mutex_unlock(&lock);
}

/* Whether p lies in a live block of this allocator: out[0] its base, out[1] the bytes the array asked for, out[2] the
 * block's serial (new each time an array takes it). */
int fastmm_hostalloc_block(const char *p, uint64_t out[3])
{
    pthread_mutex_lock(&lock);
    long i = find(p);
    int mine = i >= 0 && blocks[i].live;
    if (mine) {
        out[0] = (uintptr_t)blocks[i].base;
        out[1] = blocks[i].used;
        out[2] = blocks[i].serial;
    }
    pthread_mutex_unlock(&lock);
    return mine;
}

/* A cheap sample of [p, p + bytes): 64 bytes from each of up to 64 places spread over it (about a microsecond).
 * Equal samples before and after a product say "probably unchanged", which is all the decision needs: the write
 * tracking, not this, keeps results right. */
uint64_t fastmm_hostalloc_fingerprint(const char *p, size_t bytes)
{
    uint64_t h = 1469598103934665603ull;
    size_t spots = 64, line = 64;
    if (bytes < spots * line)
        spots = bytes / line;
    for (size_t s = 0; s < spots; ++s) {
        size_t at = (bytes - line) / (spots > 1 ? spots - 1 : 1) * s;
        for (size_t j = 0; j < line; j += 8) {
            uint64_t w;
            memcpy(&w, p + at + j, 8);
            h = (h ^ w) * 1099511628211ull;
        }
    }
    for (size_t j = spots * line; j < bytes && j < line; ++j) /* (tiny ranges: every byte) */
        h = (h ^ (unsigned char)p[j]) * 1099511628211ull;
    return h;
}

/* tracked blocks, write faults seen, blocks made read-only (ever) */
void fastmm_hostalloc_track_stats(size_t out[3])
{
    size_t n = 0;
    for (size_t i = 0; i < tracked_top; ++i)
        n += __atomic_load_n(&tracked[i].state, __ATOMIC_ACQUIRE) == TRACKED;
    out[0] = n;
    out[1] = __atomic_load_n(&stat_faults, __ATOMIC_RELAXED);
    out[2] = stat_protected;
}

/* Interpreter exit: no driver calls from now on (blocks freed later are left to the process's end). */
void fastmm_hostalloc_shutdown(void)
{
    fastmm_hostalloc_untrack_all();
    pthread_mutex_lock(&lock);
    stopped = 1;
    pthread_mutex_unlock(&lock);
}

/* In a forked child: the parent's page-locking does not carry over, and the driver is not usable here; the child
 * keeps no device copies, so its blocks are writable again and untracked. */
void fastmm_hostalloc_forget(void)
{
    pthread_mutex_lock(&lock);
    stopped = 1;
    for (size_t i = 0; i < tracked_top; ++i)
        if (tracked[i].state != FREE)
            forget_slot((const char *)tracked[i].base);
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
