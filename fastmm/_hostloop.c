/* fastmm's stand-in for NumPy's float32 matmul inner loop (np.matmul's "ff->f" loop), for accelerate_numpy().
 *
 * Why C: once installed, this loop runs for every float32 matmul in the process, 3x3 products that take a
 * microsecond included. Deciding "too small for the GPU" here costs nanoseconds; a ctypes callback would cost
 * about as much as such a product. Products with enough work go to `offload` (a ctypes callback into fastmm's
 * Python, which takes the GIL itself): it returns 1 when it computed the product, and whatever it declines (0) runs
 * NumPy's own loop, unchanged. A KeyboardInterrupt during fastmm's part declines (2): NumPy's loop computes the whole
 * product, and only then is the interrupt raised again (PyErr_SetInterrupt, which needs no GIL), so that it reaches
 * the program after NumPy returns rather than inside the callback, where ctypes would swallow it.
 * No Python or NumPy headers: the loop's arguments are pointers and integers, so any C compiler builds this.
 *
 * NumPy calls a gufunc loop with args = {a, b, c}, dimensions = {batch, m, k, n} and steps = the three batch
 * strides followed by the core strides of a (m, k), b (k, n) and c (m, n), all in bytes.
 */
#include <sched.h>
#include <stddef.h>

typedef ptrdiff_t npy_intp;
typedef void (*loop_t)(char **args, npy_intp const *dimensions, npy_intp const *steps, void *data);
typedef int (*offload_t)(char **args, npy_intp const *dimensions, npy_intp const *steps);
typedef void (*interrupt_t)(void);
enum { DECLINED = 0, DONE = 1, INTERRUPTED = 2 };

/* NumPy's loop is learnt from the first install (the slot's previous content) and never cleared: a thread that
 * read this loop's address before an uninstall may still arrive here afterwards, and must find NumPy's loop. */
static loop_t numpy_loop;
static offload_t offload; /* NULL while the hook is off */
static double min_flops = 1e300;
static interrupt_t interrupt; /* Python's PyErr_SetInterrupt */

void fastmm_set_numpy_loop(loop_t loop)
{
    __atomic_store_n(&numpy_loop, loop, __ATOMIC_RELEASE);
}

void fastmm_configure(offload_t callback, double flops, interrupt_t set_interrupt)
{
    __atomic_store_n(&interrupt, set_interrupt, __ATOMIC_RELEASE);
    __atomic_store(&min_flops, &flops, __ATOMIC_RELEASE);
    __atomic_store_n(&offload, callback, __ATOMIC_RELEASE);
}

void fastmm_matmul_loop(char **args, npy_intp const *dimensions, npy_intp const *steps, void *data)
{
    offload_t callback = __atomic_load_n(&offload, __ATOMIC_ACQUIRE);
    double threshold;
    __atomic_load(&min_flops, &threshold, __ATOMIC_ACQUIRE);
    double flops = 2.0 * (double)dimensions[0] * (double)dimensions[1] * (double)dimensions[2] *
                   (double)dimensions[3];
    int outcome = DECLINED;
    if (callback != NULL && flops >= threshold)
        outcome = callback(args, dimensions, steps);
    if (outcome == DONE)
        return;
    loop_t loop;
    /* Only between the first install's swap and fastmm_set_numpy_loop (microseconds) can this be NULL. */
    while ((loop = __atomic_load_n(&numpy_loop, __ATOMIC_ACQUIRE)) == NULL)
        sched_yield();
    loop(args, dimensions, steps, data);
    if (outcome == INTERRUPTED)
        __atomic_load_n(&interrupt, __ATOMIC_ACQUIRE)();
}
