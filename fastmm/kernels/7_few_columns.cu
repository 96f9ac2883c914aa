// Rung 6 of the ladder: few columns (matrix-vector, a handful of right-hand sides). C (M x N) = A (M x K) @ B
// (K x N) with N <= NMAX. Such a product does 2 FLOPs per element of A that it reads once: it is bound by
// memory bandwidth, not by FMAs, and tiles built for FMA reuse waste their time (a 64 x 64 tile computes 64 columns
// of which one is wanted). So: read each element of A exactly once, in wide coalesced copies, with enough bytes in
// flight per SM to cover the memory latency; reduce in a fixed order (the same result every run).
// Few rows (M <= 16, or up to NMAX below more columns) run the same kernel on the transposed product C^T = B^T A^T
// (fastmm/_runtime/gemm.py), which is why C is written through both of its strides.
//
// Who computes what: a block computes ROWS_PER_BLOCK = 32 rows of C, all NMAX columns from blockIdx.x * NMAX, over
// the whole of K (long K is split into slices by the plan, as a batch of products summed afterwards). K is walked
// in steps of STEP = 128.
//
// Bytes in flight: each step's slice of A (32 rows x 128 k, 16 KiB) and of B (128 k x NMAX) is copied into shared
// memory by cp.async, STAGES - 1 steps ahead of the FMAs (a ring of STAGES slots, one barrier per step), so about
// (STAGES - 1) x 16 KiB of A per block is always on its way, and none of it occupies registers. (The previous design
// loaded A into registers within 256-deep chunks: the 16-column kernel's accumulators left no registers for loads
// in flight, one memory round trip per chunk stayed exposed, and 4096x16x4096 ran at 0.55x cuBLAS.)
//
// A with unit stride along k (A_T = 0, a row-major matrix): warp w owns rows 4w .. 4w + 3 of the block's 32; lane l
// takes k = 4l .. 4l + 3 of each step, so a warp reads 512 contiguous bytes of a row per copy and per shared load,
// and multiplies them with B^T staged as Bt[j][k] (k contiguous: 16-byte shared reads). Each lane keeps 4 x NMAX
// partial sums (4 x 4 for a matrix-vector product), reduced across the warp's lanes by shuffles at the end.
//
// A with unit stride along m (A_T = 1, a transposed view): A is staged as As[k][32 rows] (128 contiguous bytes of a
// column per k); lane l owns row l and warp w the k's congruent to w mod 8 of each step, and B is staged as
// Bs[k][j], read as a broadcast. The 8 warps' partial sums are added in shared memory in a fixed order.
//
// Split K in one launch (CLUSTER > 1): where the rows alone would leave SMs idle (2048x1x16384: 64 blocks of rows for
// 132 SMs), a thread-block cluster of CLUSTER blocks (Hopper, sm_90) shares each block of rows, block z of the cluster
// taking the z-th run of K's steps. Each block leaves its partial sums in its own shared memory, and after the
// cluster's barrier each block adds every block's partial sums for a share of the elements, reading them through
// distributed shared memory in a fixed tree: the same result every run, with no workspace and no second launch (the
// slice-sum pass that split K needs otherwise cost 5-8% of these memory-bound products). The grid's z axis holds a
// cluster per batch item.
//
// More than 16 columns (NMAX = 32, 64: LANE_ROWS): with A row-major too, lane l owns row l and warp w the k's congruent
// to w mod 8, as for A_T = 1, so that a thread keeps NMAX sums, not 4 x NMAX (4 x 64 would not fit its registers, and
// fewer rows per warp would make every warp re-read all of B's step for a few rows). A row-major A is then staged
// k-major, As[k][33] (a pitch of 33: the 32 lanes' copies of consecutive k fall in distinct banks), by 4-byte copies of
// consecutive k per warp: 16 copies per thread and step, cheap against the 32-64 FMAs per element of A. A B with unit
// stride along k (B_T = 1) is copied by lanes that cover 8 k x 4 columns, so that their writes to Bs[k][j] (a row pitch
// of 4 mod 32 floats) fall in distinct banks too.
//
// Macros: NMAX (columns per block), THREADS (256: 8 warps), STAGES (ring slots), MIN_BLOCKS, CLUSTER (blocks that
// split K), A_T, B_T, VEC (4: the rows (A_T = 0) or columns (A_T = 1) of A start 16-byte aligned, so A is copied 16
// bytes at a time; B and C do not matter, they are copied and written in 4-byte pieces).

#define WARPS (THREADS / 32)
#define ROWS_PER_BLOCK 32
#define ROWS_PER_WARP (ROWS_PER_BLOCK / WARPS)
#define STEP 128
#define KPW (STEP / WARPS)  // k per warp and step, A_T = 1
// Row pitches of the two layouts of B's stage, padded so that the copies of consecutive threads fall in distinct
// banks (STEP + 4 keeps the 16-byte alignment of the k-contiguous layout's reads). Bs[k][j] rows of a multiple of 4
// columns are read as 16-byte broadcasts (a 4-byte shared load per FMA left the A_T = 1 kernel bound by shared
// loads: 8x4096x4096 ran at 0.48x cuBLAS), so they keep 16-byte alignment.
#define KPITCH (STEP + 4)
#define LANE_ROWS (A_T == 1 || NMAX > 16)
#define JPITCH (NMAX == 1 ? 1 : NMAX % 4 == 0 ? NMAX + 4 : NMAX + 1)
// A with unit stride along m (A_T = 1) whose columns are not 16-byte aligned: each k's 32 rows are copied as 9 aligned
// 16-byte pieces from the column's last 16-byte boundary, into a row of APITCH = 36 floats of which the rows start at
// the column's shift (see issue_step). 4-byte copies ran v . 4097^2 at 0.66x cuBLAS, and issued 32 copies per k where
// these issue 9: with 16-32 columns, 9787x30x1523 (Fortran) ran at 0.48x (docs/kernels/few-columns.md).
#define WINDOW_T (A_T == 1 && VEC == 1)
#define APITCH (ROWS_PER_BLOCK + (WINDOW_T ? 4 : A_T == 0 && LANE_ROWS ? 1 : 0))
#define A_FLOATS (A_T == 0 && !LANE_ROWS ? ROWS_PER_BLOCK * AROW : APITCH * STEP)
// A matrix-vector product with A_T = 0 gives each thread its own copy of the 4 values of the vector it multiplies
// (16 bytes a step): then every thread reads back only what it copied, and the K loop needs no barrier at all.
#define PRIVATE_B (A_T == 0 && NMAX == 1)
// A matrix-vector product whose rows of A are not 16-byte aligned (VEC = 1) still copies A 16 bytes at a time, through
// an aligned window per row: row r starts MIS_r = 0..3 floats past a 16-byte boundary, and lane l of step s copies
// the aligned piece 32 s + l of the row, k = 4 (32 s + l) - MIS_r .. + 3 (the first piece's elements before k = 0 are
// zero-filled). Each row then needs the vector at k = 4 (32 s + l) - MIS_r .. + 3: the lane's own 4 values (its private
// copy, as for aligned rows) and the 4 before them, which the lane to its left holds (a shuffle; lane 0 keeps lane 31's
// from the step before). K then spans up to 3 more values: one step more at most. (Copied 4 bytes at a time, these
// rows ran at 0.66-0.85x cuBLAS: four times the copy instructions. A private copy of all 8 values of the vector per
// thread read the vector twice, in 16-byte pieces 32 bytes apart: 2.2x the L2 sectors, and 0.33x.)
#define WINDOW (PRIVATE_B && VEC == 1)
// With 8 or 16 columns (B shared by the block, not private), unaligned rows of A are copied in the same aligned pieces,
// one more a row (33: k - shift .. up to k + 131 - shift), into rows of AROW = STEP + 4 floats; each lane then reads
// its own 4 values of k from its piece and the next, picked by the row's shift, so B is read as for aligned rows.
// Against 4-byte copies (four times the copy instructions) 1.05x on 24 sweep products of 8-16 columns; with 4 columns
// 0.95x (the pick costs what the copies saved: 4 x 4 FMAs a row and step), so they keep 4-byte copies
// (docs/kernels/few-columns.md).
#define AWIN (A_T == 0 && !LANE_ROWS && NMAX >= 8 && VEC == 1)
#define AROW (AWIN ? STEP + 4 : STEP)
#define KSTEPS(K) (((K) + (WINDOW ? 3 : 0) + STEP - 1) / STEP)
// Matrix-vector products keep their running sums short, for accuracy: several partial sums per element (PARTS), and
// every FOLD steps those are added into a second set and restarted (a blocked sum: each addition then rounds a sum
// of at most FOLD steps' terms, or of K / (FOLD x STEP) blocks, instead of one of K / 128 or K / 8 terms). One
// running sum per lane over K / 8 terms gave A^T.v at 8192^2 a relative error of 5.8e-7 against cuBLAS gemv's 4.2e-7.
// Up to 4 columns too: one sum of K / 8 terms per lane gave 2 x 2580 x 6677 (B^T) 1.9x cuBLAS's error and
// 2 x 812 x 11345 1.2x (the random sweep, 2026-11-28). A lane that owns a row (LANE_ROWS) adds 16 terms a step into
// each sum (4 into each of a matrix-vector product's 4): it folds every 2 steps, so that its runs are as short (32
// terms; 8); up to 16 columns the second set costs NMAX registers (41 sweep products: 6 above 1.1x cuBLAS's error ->
// none; docs/kernels/few-columns.md).
// 8 columns fold with A_T = 0 too (4 x 8 sums and as many totals). (16 columns with A_T = 0 keep one sum: their 4 x 16
// sums fill the registers. Folding them across the warp every 8 steps instead, by a reduce-scatter, ran a third slower.
// 32 and 64 columns keep one sum too; the plan's slices of K keep those runs short.)
#define BLOCKED (NMAX <= 8 || LANE_ROWS && NMAX <= 16)
#define FOLD (LANE_ROWS ? 2 : 8)
#define PARTS (NMAX == 1 ? 4 : 1)
#define B_FLOATS (PRIVATE_B ? THREADS * 4 : !LANE_ROWS ? NMAX * KPITCH : STEP * JPITCH)
#define B_FLOATS_ALIGNED ((B_FLOATS + 3) / 4 * 4)
#define SLOT_FLOATS (A_FLOATS + B_FLOATS_ALIGNED)
// LANE_ROWS: the warps' partial sums at the end, from the ring's start, in rows of PPITCH (NMAX + 1 past 16 columns:
// the lanes' stores of one column then fall in distinct banks); a cluster's block sums after them, or after the first
// slot, whichever ends later.
#define PPITCH (NMAX > 16 ? NMAX + 1 : NMAX)
#define PARTIAL_FLOATS (LANE_ROWS ? WARPS * ROWS_PER_BLOCK * PPITCH : 0)
#define SUMS_AT (PARTIAL_FLOATS > SLOT_FLOATS ? PARTIAL_FLOATS : SLOT_FLOATS)

static_assert(THREADS == 256 && ROWS_PER_WARP == 4, "8 warps of 4 rows (A_T = 0) or 32 rows x 8 k-groups (A_T = 1)");
static_assert(CLUSTER >= 1 && CLUSTER <= 16, "at most 16 blocks a cluster (past 8: Hopper's non-portable sizes)");
#if CLUSTER > 1
#include <cooperative_groups.h>
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "split K in a cluster (CLUSTER > 1) needs thread-block clusters: compile for sm_90 or later"
#endif
#endif
static_assert(STAGES >= 2, "a ring of at least two slots");
static_assert(STAGES * SLOT_FLOATS >= PARTIAL_FLOATS, "the ring holds the warps' partial sums (LANE_ROWS)");
static_assert(CLUSTER == 1 || STAGES * SLOT_FLOATS >= SUMS_AT + ROWS_PER_BLOCK * NMAX,
              "the ring holds the block's sums (CLUSTER > 1) past the warps'");
static_assert(THREADS % (B_T ? STEP : NMAX) == 0, "a pass of B's copies covers whole rows along its unit-stride axis");

// Copy step `s` (k from s * STEP) of A and B into `slot`, zero outside A and B. A copy that reads nothing (src-size 0)
// may point anywhere: cp.async reads no byte. (A_T = 0: `a` is the thread's own start in A, see below.)
__device__ __forceinline__ void issue_step(float* slot, int s, const float* a, long long a_sm, long long a_sk,
                                           int rows, const float* b, long long b_sk, long long b_sn, int m0, int M,
                                           int K, int n0, int N)
{
    const int tid = threadIdx.x, k0 = s * STEP;
    float* as = slot;
    float* bs = slot + A_FLOATS;
#if A_T == 0 && LANE_ROWS
    // As[k][APITCH]: thread t copies k = t % STEP of rows t / STEP + 2 q, 4 bytes at a time; `a` is the block's first row.
    {
        constexpr int ROWS_PER_PASS = THREADS / STEP;
        const int kk = tid % STEP, r0 = tid / STEP;
        const int rows_left = M - m0 - r0;
        const bool k_in = k0 + kk < K;
        const float* src = a + (long long)r0 * a_sm + k0 + kk;
        const long long pass = ROWS_PER_PASS * a_sm;
#pragma unroll
        for (int q = 0; q < ROWS_PER_BLOCK / ROWS_PER_PASS; ++q, src += pass) {
            const bool in = k_in && ROWS_PER_PASS * q < rows_left;
            cp_async4_if(smem_addr(as + kk * APITCH + r0 + ROWS_PER_PASS * q), in ? src : a, in);
        }
    }
#elif A_T == 0
    // The thread's own 4 rows x 4 k: what it reads back after the step's barrier. `a` points at the lane's first
    // value of k in the warp's first row (WINDOW: at the warp's first row), `rows` counts the warp's rows inside A.
    const int warp = tid / 32, lane = tid % 32;
    const int left = K - k0 - 4 * lane;  // values of k left in the row from the lane's first
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        float* dst = as + (warp * ROWS_PER_WARP + r) * AROW + 4 * lane;
        const float* src = a + r * a_sm + k0;
        const bool inside = r < rows;
        if (AWIN) {
            // The row's aligned piece 32 s + lane, k from 4 (32 s + lane) - mis; values before k = 0 are read from the
            // row's first 16-byte piece and never used, those from K on are zero-filled.
            const float* row = a + r * a_sm;
            const float* piece = reinterpret_cast<const float*>(reinterpret_cast<unsigned long long>(row) & ~15ull);
            const int bytes = inside ? 4 * max(0, min(4, K - k0 - 4 * lane + static_cast<int>(row - piece))) : 0;
            cp_async16(smem_addr(dst), bytes ? piece + k0 + 4 * lane : a, bytes);
        } else if (WINDOW) {
            // The row's aligned piece 32 s + lane, k from k_first = 4 (32 s + lane) - mis.
            const int mis = fastmm_misalignment(a + r * a_sm);
            const float* piece = a + r * a_sm - mis + k0 + 4 * lane;
            const int k_first = k0 + 4 * lane - mis;
            if (k_first >= 0) {
                const int bytes = inside ? 4 * max(0, min(4, K - k_first)) : 0;
                cp_async16(smem_addr(dst), bytes ? piece : a, bytes);
            } else {  // the row's first piece: its first `mis` values lie before the row, zero them
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const bool in = inside && e >= mis && k_first + e < K;
                    cp_async4_if(smem_addr(dst + e), in ? piece + e : a, in);
                }
            }
        } else if (VEC == 4) {
            const int bytes = inside ? 4 * max(0, min(4, left)) : 0;
            cp_async16(smem_addr(dst), bytes ? src : a, bytes);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool in = inside && e < left;
                cp_async4_if(smem_addr(dst + e), in ? src + e : a, in);
            }
        }
    }
    if (AWIN && lane < ROWS_PER_WARP) {
        // Lane r copies row r's piece 32 s + 32 (k from 4 (32 s + 32) - mis), which lane 31 reads too.
        const float* row = a + lane * a_sm;
        const int mis = fastmm_misalignment(row);
        const int bytes = lane < rows ? 4 * max(0, min(4, K - (k0 + STEP - mis))) : 0;
        cp_async16(smem_addr(as + (warp * ROWS_PER_WARP + lane) * AROW + STEP), bytes ? row - mis + k0 + STEP : a, bytes);
    }
#elif WINDOW_T
    // As[k][APITCH]: the column of k starts MIS_k floats past a 16-byte boundary; its aligned pieces p = 0..8 (rows
    // m0 - MIS_k + 4p ..) land at As[k][4p], so that row m0 + r is at As[k][r + MIS_k]. Thread t copies piece t % 8 of
    // k = t / 8 + 32 q, and threads t < STEP the ninth piece of k = t where the column is shifted. The first piece's
    // values before the column's first row (m0 = 0) are read, from the same allocation, and never used.
    {
        const int p = tid % 8, kk0 = tid / 8;
#pragma unroll
        for (int q = 0; q < STEP / 32; ++q) {
            const int kk = kk0 + 32 * q;
            const float* col = a + (long long)(k0 + kk) * a_sk + m0;
            const int mis = fastmm_misalignment(col);
            const int bytes = k0 + kk < K ? 4 * max(0, min(4, M - (m0 - mis + 4 * p))) : 0;
            cp_async16(smem_addr(as + kk * APITCH + 4 * p), bytes ? col - mis + 4 * p : a, bytes);
        }
        if (tid < STEP) {
            const float* col = a + (long long)(k0 + tid) * a_sk + m0;
            const int mis = fastmm_misalignment(col);
            const int bytes = mis > 0 && k0 + tid < K ? 4 * max(0, min(4, M - (m0 - mis + 32))) : 0;
            cp_async16(smem_addr(as + tid * APITCH + 32), bytes ? col - mis + 32 : a, bytes);
        }
    }
#else
    // As[k][row]: 128 k x 32 rows; 16-byte copies of 4 rows when A's columns are 16-byte aligned. Thread t copies the
    // same rows at k = t / (pieces per k) + q x (k per pass) for each pass q: one pointer, moved by a fixed stride.
    constexpr int PIECE = VEC == 4 ? 4 : 1;                  // rows per copy
    constexpr int PER_K = ROWS_PER_BLOCK / PIECE;            // copies per k
    constexpr int K_PER_PASS = THREADS / PER_K;
    const int r = PIECE * (tid % PER_K), kk0 = tid / PER_K;
    const int piece_rows = min(PIECE, M - m0 - r);
    const float* src = a + (long long)(k0 + kk0) * a_sk + m0 + r;
    const long long pass = (long long)K_PER_PASS * a_sk;
#pragma unroll
    for (int q = 0; q < STEP / K_PER_PASS; ++q, src += pass) {
        const int kk = kk0 + q * K_PER_PASS;
        const int bytes = k0 + kk < K && piece_rows > 0 ? 4 * piece_rows : 0;
        if (PIECE == 4) cp_async16(smem_addr(as + kk * ROWS_PER_BLOCK + r), bytes ? src : a, bytes);
        else cp_async4_if(smem_addr(as + kk * ROWS_PER_BLOCK + r), bytes ? src : a, bytes != 0);
    }
#endif
#if PRIVATE_B
    {
        // The thread's own 4 values of the vector, beside its own 4 rows of A.
        const int lane = tid % 32;
        const int left = K - k0 - 4 * lane;
        const float* src = b + (long long)n0 * b_sn + (long long)(k0 + 4 * lane) * b_sk;
        float* dst = bs + 4 * tid;
        if (b_sk == 1 && reinterpret_cast<unsigned long long>(b + (long long)n0 * b_sn) % 16 == 0) {
            const int bytes = 4 * max(0, min(4, left));
            cp_async16(smem_addr(dst), bytes ? src : b, bytes);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) cp_async4_if(smem_addr(dst + e), e < left ? src + e * b_sk : b, e < left);
        }
        return;
    }
#endif
#if B_T == 1 && NMAX > 16
    // Bs[k][j] from a B with unit stride along k: a warp's lanes copy 8 consecutive k (32 bytes) of 4 columns, whose
    // banks 4 k + j (mod 32) are distinct. Warp w takes the 8-k runs w, w + 8 and every 4th column from its lane's.
    {
        static_assert(NMAX % 4 == 0 && STEP == 2 * 8 * WARPS, "8-k runs of 4 columns, two per warp");
        const int lane = tid % 32, kk0 = 8 * (tid / 32) + lane % 8, j0 = lane / 8;
        const float* bsrc = b + (long long)(k0 + kk0) * b_sk + (long long)(n0 + j0) * b_sn;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int kk = kk0 + 8 * WARPS * h;
            const bool k_in = k0 + kk < K;
#pragma unroll
            for (int q = 0; q < NMAX / 4; ++q) {
                const int j = j0 + 4 * q;
                const bool in = k_in && n0 + j < N;
                const float* src = bsrc + (long long)(8 * WARPS * h) * b_sk + (long long)(4 * q) * b_sn;
                cp_async4_if(smem_addr(bs + kk * JPITCH + j), in ? src : b, in);
            }
        }
        return;
    }
#endif
    // B: STEP x NMAX; consecutive threads take the elements that are consecutive in global memory (k when B has unit
    // stride along k, else j): coalesced reads. As for A, a thread keeps its column (or k) and moves by a fixed
    // stride from pass to pass.
    constexpr int FAST = B_T ? STEP : NMAX;                  // elements along B's unit-stride axis
    constexpr int PASSES = (STEP * NMAX + THREADS - 1) / THREADS;
    const int f0 = tid % FAST, s0 = tid / FAST;              // position along the fast and the slow axis
    constexpr int SLOW_PER_PASS = THREADS / FAST > 0 ? THREADS / FAST : 1;
    const long long slow_stride = B_T ? b_sn : b_sk;
    const int kb = B_T ? k0 + f0 : k0 + s0, jb = B_T ? n0 + s0 : n0 + f0;
    const float* bsrc = b + (long long)kb * b_sk + (long long)jb * b_sn;
#pragma unroll
    for (int q = 0; q < PASSES; ++q, bsrc += SLOW_PER_PASS * slow_stride) {
        const int slow = s0 + q * SLOW_PER_PASS;
        if (STEP * NMAX % THREADS != 0 && slow * FAST + f0 >= STEP * NMAX) break;
        const int kk = B_T ? f0 : slow, j = B_T ? slow : f0;
        const bool in = k0 + kk < K && n0 + j < N;
        cp_async4_if(smem_addr(bs + (!LANE_ROWS ? j * KPITCH + kk : kk * JPITCH + j)), in ? bsrc : b, in);
    }
}

// The sum of v[0 .. COUNT) in a fixed tree: pairs, then pairs of pairs, an odd one out carried up a level (a chain of
// 8 rounds sums of up to 8 partials again and again; a tree adds each partial in at most 3 additions).
template <int COUNT>
__device__ __forceinline__ float tree_sum(float* v)
{
#pragma unroll
    for (int w = 1; w < COUNT; w *= 2)
#pragma unroll
        for (int q = 0; q + w < COUNT; q += 2 * w) v[q] += v[q + w];
    return v[0];
}

#if CLUSTER > 1
// The cluster's partial sums of one element of C, added in a fixed tree (see the top): `partial` is the element's
// place in the calling block's shared memory, the same place in every block of the cluster.
__device__ __forceinline__ float cluster_sum(float* partial)
{
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    float v[CLUSTER];
#pragma unroll
    for (int q = 0; q < CLUSTER; ++q) v[q] = *cluster.map_shared_rank(partial, q);
    return tree_sum<CLUSTER>(v);
}
#endif

// MIN_BLOCKS blocks per SM (2: 16 warps; the registers hold the accumulators only, so that is no squeeze).
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
#if CLUSTER > 1
__cluster_dims__(1, 1, CLUSTER)
#endif
fastmm_fewcol(FASTMM_GEMM_PARAMS)
{
    extern __shared__ __align__(16) float smem[];  // STAGES slots of (A's step, B's step)

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int m0 = blockIdx.y * ROWS_PER_BLOCK, n0 = blockIdx.x * NMAX;
#if CLUSTER > 1
    // The grid's z axis holds CLUSTER blocks per batch item, one cluster; block `slice` of the cluster takes steps
    // [first, last) of K's.
    const int z = z0 + blockIdx.z / CLUSTER, slice = blockIdx.z % CLUSTER;
    const int per = (KSTEPS(K) + CLUSTER - 1) / CLUSTER;
    const int first = slice * per, last = min(KSTEPS(K), first + per);
#else
    const int z = z0 + blockIdx.z;
    const int first = 0, last = KSTEPS(K);
#endif
    const float* a = A + fastmm_batch_offset(z, batch_inner, a_sb0, a_sb1);
    const float* b = B + fastmm_batch_offset(z, batch_inner, b_sb0, b_sb1);
    float* c = C + fastmm_batch_offset(z, batch_inner, c_sb0, c_sb1);
    // A_T = 0: each thread copies (and reads back) 4 rows of its warp from the lane's 4 values of k.
    const int rows = !LANE_ROWS ? M - m0 - warp * ROWS_PER_WARP : 0;
    const float* a_copy = !LANE_ROWS ? a + (long long)(m0 + warp * ROWS_PER_WARP) * a_sm
                                       + (WINDOW || AWIN ? 0 : 4 * lane)
                        : A_T == 0 ? a + (long long)m0 * a_sm : a;
#if AWIN
    // The 4 rows' shifts, 2 bits each (one register: the clusters' kernels of 8 and 16 columns had none to spare).
    int shifts = 0;
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) shifts |= fastmm_misalignment(a_copy + r * a_sm) << (2 * r);
#endif
#if WINDOW_T
    const int mis0 = fastmm_misalignment(a + m0), a_sk4 = static_cast<int>(a_sk & 3);
#endif
#if WINDOW
    // Each row's shift against its aligned pieces (the same for every lane of the warp).
    int mis[ROWS_PER_WARP];
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) mis[r] = fastmm_misalignment(a_copy + r * a_sm);
    // Lane 0's 4 values before its own: those of the block's first step come from global memory (zero before k = 0).
    float4 carry;
    {
        const int kc = first * STEP - 4;
        const float* bc = b + (long long)n0 * b_sn;
        carry.x = kc >= 0 && kc < K ? bc[(long long)kc * b_sk] : 0.0f;
        carry.y = kc + 1 >= 0 && kc + 1 < K ? bc[(long long)(kc + 1) * b_sk] : 0.0f;
        carry.z = kc + 2 >= 0 && kc + 2 < K ? bc[(long long)(kc + 2) * b_sk] : 0.0f;
        carry.w = kc + 3 >= 0 && kc + 3 < K ? bc[(long long)(kc + 3) * b_sk] : 0.0f;
    }
#endif

    // The ring's first STAGES - 1 steps; one cp.async group per step (empty past the last), so that "all but the
    // newest STAGES - 2 groups have landed" always means "this step's slot has".
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (first + s < last)
            issue_step(smem + s * SLOT_FLOATS, first + s, a_copy, a_sm, a_sk, rows, b, b_sk, b_sn, m0, M, K, n0, N);
        cp_async_commit();
    }

    // PARTS partial sums per element of C: for a matrix-vector product, one per k of the lane's 16-byte load (A_T = 0)
    // or per k of a warp's step modulo 4 (A_T = 1): four running sums a quarter as long (A_T = 0 with one: the error
    // came out at 2.7x cuBLAS gemv's at 16384^2); with more columns, one.
#if !LANE_ROWS
    constexpr int ACC = ROWS_PER_WARP * NMAX * PARTS;  // acc[(r * NMAX + j) * PARTS + p]
#else
    constexpr int ACC = NMAX * PARTS;                  // acc[j * PARTS + p]
#endif
    float acc[ACC];
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;
#if BLOCKED
    float total[ACC];
#pragma unroll
    for (int i = 0; i < ACC; ++i) total[i] = 0.0f;
#endif

    for (int s = 0; s < last - first; ++s) {  // s counts the block's own steps; step first + s of K's
        // Step s's copies have landed for every thread, and every warp is done with the slot of step s - 1, into
        // which step s + STAGES - 1 now goes. (With PRIVATE_B, a thread's own copies are all it reads: its own
        // wait is enough.)
        cp_async_wait<STAGES - 2>();
        if (!PRIVATE_B) __syncthreads();
        const int ahead = s + STAGES - 1;
        if (first + ahead < last)
            issue_step(smem + (ahead % STAGES) * SLOT_FLOATS, first + ahead, a_copy, a_sm, a_sk, rows, b, b_sk, b_sn, m0,
                       M, K, n0, N);
        cp_async_commit();
        const float* as = smem + (s % STAGES) * SLOT_FLOATS;
        const float* bs = as + A_FLOATS;
        // Past K, A and B's stages hold zeros: the FMAs add nothing.
#if !LANE_ROWS
        float4 x[ROWS_PER_WARP];
#pragma unroll
        for (int r = 0; r < ROWS_PER_WARP; ++r) {
            const float* row = as + (warp * ROWS_PER_WARP + r) * AROW + 4 * lane;
#if AWIN
            // k = 4 lane .. + 3 of the step: the row's shift into the lane's piece and the next.
            const float4 p = *reinterpret_cast<const float4*>(row), q = *reinterpret_cast<const float4*>(row + 4);
            const int mis = (shifts >> (2 * r)) & 3;
            x[r] = mis == 0 ? p
                 : mis == 1 ? make_float4(p.y, p.z, p.w, q.x)
                 : mis == 2 ? make_float4(p.z, p.w, q.x, q.y)
                            : make_float4(p.w, q.x, q.y, q.z);
#else
            x[r] = *reinterpret_cast<const float4*>(row);
#endif
        }
#if WINDOW
        const float4 hi = *reinterpret_cast<const float4*>(bs + 4 * tid);  // the lane's own 4 values
        float4 lo = make_float4(__shfl_up_sync(0xffffffffu, hi.x, 1), __shfl_up_sync(0xffffffffu, hi.y, 1),
                                __shfl_up_sync(0xffffffffu, hi.z, 1), __shfl_up_sync(0xffffffffu, hi.w, 1));
        const float4 next = make_float4(__shfl_sync(0xffffffffu, hi.x, 31), __shfl_sync(0xffffffffu, hi.y, 31),
                                        __shfl_sync(0xffffffffu, hi.z, 31), __shfl_sync(0xffffffffu, hi.w, 31));
        if (lane == 0) lo = carry;
        carry = next;
#endif
#pragma unroll
        for (int j = 0; j < NMAX; ++j) {
#if !WINDOW
            const float4 y = *reinterpret_cast<const float4*>(PRIVATE_B ? bs + 4 * tid : bs + j * KPITCH + 4 * lane);
#endif
#pragma unroll
            for (int r = 0; r < ROWS_PER_WARP; ++r) {
#if WINDOW
                // The vector's values at the row's piece: k - 4 (32 s + lane) = -mis .. 3 - mis, window index 4 - mis ...
                const float4 y = mis[r] == 0 ? hi
                               : mis[r] == 1 ? make_float4(lo.w, hi.x, hi.y, hi.z)
                               : mis[r] == 2 ? make_float4(lo.z, lo.w, hi.x, hi.y)
                                             : make_float4(lo.y, lo.z, lo.w, hi.x);
#endif
                float* sum = acc + (r * NMAX + j) * PARTS;
                if (PARTS == 4) {
                    sum[0] = fmaf(x[r].x, y.x, sum[0]);
                    sum[PARTS - 3] = fmaf(x[r].y, y.y, sum[PARTS - 3]);
                    sum[PARTS - 2] = fmaf(x[r].z, y.z, sum[PARTS - 2]);
                    sum[PARTS - 1] = fmaf(x[r].w, y.w, sum[PARTS - 1]);
                } else {
                    sum[0] = fmaf(x[r].w, y.w, fmaf(x[r].z, y.z, fmaf(x[r].y, y.y, fmaf(x[r].x, y.x, sum[0]))));
                }
            }
        }
#else
#pragma unroll
        for (int u = 0; u < KPW; ++u) {
            const int kk = warp + u * WARPS;
#if WINDOW_T
            // The column's shift: that of the block's first column, moved by k x (its stride mod 4).
            const float x = as[kk * APITCH + lane + ((mis0 + ((first + s) * STEP + kk) * a_sk4) & 3)];
#else
            const float x = as[kk * APITCH + lane];
#endif
            const float* y = bs + kk * JPITCH;
            if (NMAX % 4 == 0) {
#pragma unroll
                for (int j = 0; j < NMAX; j += 4) {  // PARTS == 1 here
                    const float4 y4 = *reinterpret_cast<const float4*>(y + j);
                    acc[j] = fmaf(x, y4.x, acc[j]);
                    acc[j + 1] = fmaf(x, y4.y, acc[j + 1]);
                    acc[j + 2] = fmaf(x, y4.z, acc[j + 2]);
                    acc[j + 3] = fmaf(x, y4.w, acc[j + 3]);
                }
            } else {
#pragma unroll
                for (int j = 0; j < NMAX; ++j) acc[j * PARTS + u % PARTS] = fmaf(x, y[j], acc[j * PARTS + u % PARTS]);
            }
        }
#endif
#if BLOCKED
        if (s % FOLD == FOLD - 1) {
#pragma unroll
            for (int i = 0; i < ACC; ++i) {
                total[i] += acc[i];
                acc[i] = 0.0f;
            }
        }
#endif
    }
#if BLOCKED
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] += total[i];  // the last, partial block first: then the blocks' sum
#endif

#if !LANE_ROWS
#if CLUSTER > 1
    // The block's sums go to the second slot (element (r, j) at r * NMAX + j), once no copy can land there and every
    // warp is done reading it.
    cp_async_wait<0>();
    __syncthreads();
    float* mine = smem + SLOT_FLOATS;
#endif
    // The lanes' partial sums of each element, added in a fixed tree.
    const int row0 = m0 + warp * ROWS_PER_WARP;
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r)
#pragma unroll
        for (int j = 0; j < NMAX; ++j) {
            const float* sum = acc + (r * NMAX + j) * PARTS;
            float v = PARTS == 4 ? (sum[0] + sum[PARTS - 3]) + (sum[PARTS - 2] + sum[PARTS - 1]) : sum[0];
#pragma unroll
            for (int d = 16; d > 0; d /= 2) v += __shfl_xor_sync(0xffffffffu, v, d);
#if CLUSTER > 1
            if (lane == 0) mine[(warp * ROWS_PER_WARP + r) * NMAX + j] = v;
#else
            if (lane == 0 && row0 + r < M && n0 + j < N)
                c[(long long)(row0 + r) * c_sm + (long long)(n0 + j) * c_sn] = v;
#endif
        }
#else
    // The 8 warps' partial sums of each element, added in a fixed tree (pairs of warps, then pairs of pairs), through
    // the first slot.
    cp_async_wait<0>();  // the last groups are empty, but a slot may not be reused while a copy could land in it
    __syncthreads();     // every warp is done with the last step's slot
    float* partial = smem;
#pragma unroll
    for (int j = 0; j < NMAX; ++j) {
        const float* sum = acc + j * PARTS;
        partial[(warp * ROWS_PER_BLOCK + lane) * PPITCH + j] =
            PARTS == 4 ? (sum[0] + sum[PARTS - 3]) + (sum[PARTS - 2] + sum[PARTS - 1]) : sum[0];
    }
    __syncthreads();
#if CLUSTER > 1
    float* mine = smem + SUMS_AT;  // the block's sums (element (r, j) at r * NMAX + j), past the warps'
#endif
    for (int i = tid; i < ROWS_PER_BLOCK * NMAX; i += THREADS) {
        const int r = i / NMAX, j = i % NMAX;
        float w8[WARPS];
#pragma unroll
        for (int w = 0; w < WARPS; ++w) w8[w] = partial[(w * ROWS_PER_BLOCK + r) * PPITCH + j];
        const float v = tree_sum<WARPS>(w8);
#if CLUSTER > 1
        mine[i] = v;
#else
        if (m0 + r < M && n0 + j < N) c[(long long)(m0 + r) * c_sm + (long long)(n0 + j) * c_sn] = v;
#endif
    }
#endif
#if CLUSTER > 1
    // Every block's sums are in place; block `slice` of the cluster adds the elements congruent to it, in block
    // order, and no block leaves (taking its shared memory with it) before all have read.
    cooperative_groups::this_cluster().sync();
    for (int i = CLUSTER * tid + slice; i < ROWS_PER_BLOCK * NMAX; i += CLUSTER * THREADS) {
        const int r = i / NMAX, j = i % NMAX;
        const float v = cluster_sum(mine + i);
        if (m0 + r < M && n0 + j < N) c[(long long)(m0 + r) * c_sm + (long long)(n0 + j) * c_sn] = v;
    }
    cooperative_groups::this_cluster().sync();
#endif
}
