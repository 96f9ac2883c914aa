/* fastmm's stand-in for NumPy's matmul inner loop of one dtype (np.matmul's "ff->f" loop for float32; "dd->d", "FF->F"
 * and "DD->D" alike, each from a copy of this library of its own), for accelerate_numpy().
 *
 * Why C: once installed, this loop runs for every matmul of its dtype in the process, 3x3 products that take a
 * microsecond included. Deciding "too small for the GPU" here costs nanoseconds; a ctypes callback would cost
 * about as much as such a product. Products with enough work go to `offload` (a ctypes callback into fastmm's
 * Python, which takes the GIL itself): it returns 1 when it computed the product, and whatever it declines (0) runs
 * NumPy's own loop, unchanged. A KeyboardInterrupt during fastmm's part declines (2): NumPy's loop computes the whole
 * product, and then the KeyboardInterrupt is set on the calling thread, so that np.matmul itself raises it (NumPy
 * checks for a Python error after a gufunc's loops). Setting it here rather than inside the callback matters: ctypes
 * would print and clear it there; and a simulated signal (PyErr_SetInterrupt) is handled at the main thread's next
 * check, which may run inside a finalizer that the garbage collector calls, where the interrupt is printed and lost.
 * No Python or NumPy headers: the loop's arguments are pointers and integers, and the few Python C-API functions it
 * calls are handed over as pointers, so any C compiler builds this.
 *
 * NumPy calls a gufunc loop with args = {a, b, c}, dimensions = {batch, m, k, n} and steps = the three batch
 * strides followed by the core strides of a (m, k), b (k, n) and c (m, n), all in bytes.
 */
#include <sched.h>
#include <stddef.h>
#include <time.h>

typedef ptrdiff_t npy_intp;
typedef void (*loop_t)(char **args, npy_intp const *dimensions, npy_intp const *steps, void *data);
typedef int (*offload_t)(char **args, npy_intp const *dimensions, npy_intp const *steps);
typedef int (*gil_ensure_t)(void);
typedef void (*gil_release_t)(int);
typedef void *(*err_occurred_t)(void);
typedef void (*err_set_t)(void *);
typedef int (*candidate_t)(const char *p);

/* The Python C-API functions the loop needs, and the KeyboardInterrupt type (set once, before the first offload). */
struct python_api {
    gil_ensure_t ensure;
    gil_release_t release;
    err_occurred_t occurred;
    err_set_t set_none;
    void *keyboard_interrupt;
};
enum { DECLINED = 0, DONE = 1, INTERRUPTED = 2 };

/* NumPy's loop is learnt from the first install (the slot's previous content) and never cleared: a thread that
 * read this loop's address before an uninstall may still arrive here afterwards, and must find NumPy's loop. */
static loop_t numpy_loop;
static offload_t offload; /* NULL while the hook is off */
static double min_flops = 1e300;
static long long below_threshold; /* products the hook left to NumPy without asking fastmm (too little work) */
/* Below the threshold, a product may still win on the GPU when an operand is already there (or may be kept there):
 * fastmm is asked when an operand lies in a block of fastmm's allocator (`candidate`, nanoseconds) and NumPy would
 * take at least `resident_seconds` (its FLOPs at `host_rate` or its bytes at `memory_rate`, the slower), so that
 * asking (microseconds) costs NumPy's loop at most about a percent. */
struct resident {
    candidate_t candidate; /* NULL: never */
    double host_rate, memory_rate, itemsize, seconds;
};
static struct resident resident; /* the figures are written before `candidate` (release), read after it (acquire) */
static struct python_api python;
/* Where the products' time goes (nanoseconds, and how many products): on fastmm's path (the GPU, staging included),
 * in NumPy's own loop, and in fastmm's part for products it then declined. Two clock reads a product (tens of ns):
 * a program's share of time in products, and the hook's, are read from here. */
enum { GPU_NS, GPU_COUNT, NUMPY_NS, NUMPY_COUNT, DECLINED_NS, TIMES };
static long long times[TIMES];

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

void fastmm_loop_times(long long *out)
{
    for (int i = 0; i < TIMES; i++)
        out[i] = __atomic_load_n(&times[i], __ATOMIC_RELAXED);
}

void fastmm_set_numpy_loop(loop_t loop)
{
    __atomic_store_n(&numpy_loop, loop, __ATOMIC_RELEASE);
}

void fastmm_set_python_api(gil_ensure_t ensure, gil_release_t release, err_occurred_t occurred, err_set_t set_none,
                           void *keyboard_interrupt)
{
    python.ensure = ensure;
    python.release = release;
    python.occurred = occurred;
    python.set_none = set_none;
    python.keyboard_interrupt = keyboard_interrupt;
}

/* Whether this thread already has a Python error pending: NumPy calls the loop once per outer iteration and goes on
 * after an error, and Python code must not run (the callback) while an error is set. */
static int error_pending(void)
{
    int state = python.ensure();
    int pending = python.occurred() != NULL;
    python.release(state);
    return pending;
}

long long fastmm_below_threshold(void)
{
    return __atomic_load_n(&below_threshold, __ATOMIC_RELAXED);
}

void fastmm_configure(offload_t callback, double flops)
{
    __atomic_store(&min_flops, &flops, __ATOMIC_RELEASE);
    __atomic_store_n(&offload, callback, __ATOMIC_RELEASE);
}

void fastmm_configure_resident(candidate_t candidate, double host_rate, double memory_rate, double itemsize,
                               double seconds)
{
    __atomic_store_n(&resident.candidate, NULL, __ATOMIC_RELEASE);
    __atomic_store(&resident.host_rate, &host_rate, __ATOMIC_RELAXED);
    __atomic_store(&resident.memory_rate, &memory_rate, __ATOMIC_RELAXED);
    __atomic_store(&resident.itemsize, &itemsize, __ATOMIC_RELAXED);
    __atomic_store(&resident.seconds, &seconds, __ATOMIC_RELAXED);
    __atomic_store_n(&resident.candidate, candidate, __ATOMIC_RELEASE);
}

/* Whether a product below the threshold is still worth asking fastmm about (see `resident`). */
static int ask_below(char **args, npy_intp const *d, npy_intp const *steps, double flops)
{
    struct resident r;
    r.candidate = __atomic_load_n(&resident.candidate, __ATOMIC_ACQUIRE);
    if (r.candidate == NULL)
        return 0;
    __atomic_load(&resident.host_rate, &r.host_rate, __ATOMIC_RELAXED);
    __atomic_load(&resident.memory_rate, &r.memory_rate, __ATOMIC_RELAXED);
    __atomic_load(&resident.itemsize, &r.itemsize, __ATOMIC_RELAXED);
    __atomic_load(&resident.seconds, &r.seconds, __ATOMIC_RELAXED);
    double a = (double)d[1] * d[2] * (steps[0] ? d[0] : 1), b = (double)d[2] * d[3] * (steps[1] ? d[0] : 1);
    double bytes = r.itemsize * (a + b + (double)d[0] * d[1] * d[3]);
    double seconds = flops / r.host_rate > bytes / r.memory_rate ? flops / r.host_rate : bytes / r.memory_rate;
    return seconds >= r.seconds && (r.candidate(args[0]) || r.candidate(args[1]));
}

void fastmm_matmul_loop(char **args, npy_intp const *dimensions, npy_intp const *steps, void *data)
{
    offload_t callback = __atomic_load_n(&offload, __ATOMIC_ACQUIRE);
    double threshold;
    __atomic_load(&min_flops, &threshold, __ATOMIC_ACQUIRE);
    double flops = 2.0 * (double)dimensions[0] * (double)dimensions[1] * (double)dimensions[2] *
                   (double)dimensions[3];
    int outcome = DECLINED;
    long long start = now_ns(), asked = start;
    int worth = callback != NULL && (flops >= threshold || ask_below(args, dimensions, steps, flops));
    if (worth && !error_pending()) {
        outcome = callback(args, dimensions, steps);
        asked = now_ns();
    } else if (callback != NULL && !worth)
        __atomic_add_fetch(&below_threshold, 1, __ATOMIC_RELAXED);
    if (outcome == DONE) {
        __atomic_add_fetch(&times[GPU_NS], asked - start, __ATOMIC_RELAXED);
        __atomic_add_fetch(&times[GPU_COUNT], 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_add_fetch(&times[DECLINED_NS], asked - start, __ATOMIC_RELAXED);
    loop_t loop;
    /* Only between the first install's swap and fastmm_set_numpy_loop (microseconds) can this be NULL. */
    while ((loop = __atomic_load_n(&numpy_loop, __ATOMIC_ACQUIRE)) == NULL)
        sched_yield();
    loop(args, dimensions, steps, data);
    __atomic_add_fetch(&times[NUMPY_NS], now_ns() - asked, __ATOMIC_RELAXED);
    __atomic_add_fetch(&times[NUMPY_COUNT], 1, __ATOMIC_RELAXED);
    if (outcome == INTERRUPTED) {
        int state = python.ensure();
        python.set_none(python.keyboard_interrupt);
        python.release(state);
    }
}
