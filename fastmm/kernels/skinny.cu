// Rung 6 of the ladder: few columns (matrix-vector, a handful of right-hand sides). C (M x N) = A (M x K) @ B
// (K x N) with N <= NMAX. Such a product does 2 FLOPs per element of A that it reads once: it is bound by
// memory bandwidth, not by FMAs, and tiles built for FMA reuse waste their time (a 64 x 64 tile computes 64 columns
// of which one is wanted). So: read each element of A exactly once, in wide coalesced loads, with enough loads in
// flight per SM; keep B, which is small, in shared memory; reduce in a fixed order (the same result every run).
// Few rows (M <= 16) run the same kernel on the transposed product C^T = B^T A^T (fastmm/_gemm.py), which is why
// C is written through both of its strides.
//
// Who computes what: a block computes ROWS_PER_BLOCK = 32 rows of C, all NMAX columns from blockIdx.x * NMAX, over
// the whole of K (long K is split into slices by the plan, as a batch of products summed afterwards). K is walked
// in chunks of KC rows of B, staged in shared memory by the whole block.
//
// A with unit stride along k (A_T = 0, a row-major matrix): warp w owns rows 4w .. 4w + 3 of the block's 32; lane l
// reads A[row][k .. k + 3] for k = 4l + 128i (one 16-byte load with VEC = 4, four 4-byte loads otherwise), so a
// warp reads 512 contiguous bytes of a row per instruction, and multiplies them with B^T staged as Bt[j][k]
// (k contiguous: the 16-byte shared reads of a warp are contiguous too). Each lane keeps 4 x NMAX partial sums
// (4 x 4 for a matrix-vector product), reduced across the warp's lanes by shuffles at the end.
//
// A with unit stride along m (A_T = 1, a transposed view): lane l owns row l of the block's 32 and warp w the k's
// congruent to w mod 8 of each chunk; a warp reads 128 contiguous bytes of a column of A per instruction, and B is
// staged as Bs[k][j], read as a broadcast. The 8 warps' partial sums are added in shared memory in a fixed order.
//
// Macros: NMAX (columns per block), THREADS (256: 8 warps), KC (k per chunk), MIN_BLOCKS, A_T, B_T, VEC (4: A's rows
// are 16-byte aligned, so 16-byte loads along k are legal; B and C do not matter, they are read and written in
// 4-byte pieces).

#define WARPS (THREADS / 32)
#define ROWS_PER_BLOCK 32
#define ROWS_PER_WARP (ROWS_PER_BLOCK / WARPS)
// Row pitches of the two stage layouts, padded so that the staging stores of consecutive threads fall in distinct
// banks (KC + 4 keeps the 16-byte alignment of the k-contiguous layout's reads).
#define KPITCH (KC + 4)
// Bs[k][j] rows of a multiple of 4 columns are read as 16-byte broadcasts (a 4-byte shared load per FMA left the
// A_T = 1 kernel bound by shared loads: 8x4096x4096 ran at 0.48x cuBLAS), so they keep 16-byte alignment.
#define JPITCH (NMAX == 1 ? 1 : NMAX % 4 == 0 ? NMAX + 4 : NMAX + 1)
#define STAGE_FLOATS (NMAX * KPITCH > KC * JPITCH ? NMAX * KPITCH : KC * JPITCH)

static_assert(THREADS == 256 && ROWS_PER_WARP == 4, "8 warps of 4 rows (A_T = 0) or 32 rows x 8 k-groups (A_T = 1)");
static_assert(KC % 128 == 0 && KC >= WARPS * ROWS_PER_BLOCK, "a chunk is whole passes of a warp's 32 lanes x 4 k, "
              "and its stage holds the warps' partial sums");
static_assert(VEC == 4 || VEC == 1, "VEC is 4 (16-byte loads of A along k) or 1");

// B's chunk [k0, k0 + KC) x [n0, n0 + NMAX) is copied into one of two shared stages by cp.async (zero outside B),
// issued before the FMAs of the chunk before it, so that the copies' latency hides behind them. (Staged with plain
// loads between two barriers, every chunk stalled the whole block on its B loads: 4096x16x4096 ran at 0.67 TB/s
// against cuBLAS's 1.50; prefetched into registers instead, the 16-column kernel spilled.) Consecutive threads
// take the elements that are consecutive in global memory (k when B has unit stride along k, else j): coalesced
// reads. `kfast` lays the stage out k-contiguous (Bt[j][k], rows KPITCH apart) rather than j-contiguous (Bs[k][j],
// rows JPITCH apart). One cp.async group per chunk, committed by every thread.
static_assert(KC * NMAX % THREADS == 0, "a chunk of B divides evenly among the threads");

__device__ __forceinline__ void issue_b(float* stage, bool kfast, const float* b, long long b_sk, long long b_sn,
                                        int k0, int K, int n0, int N)
{
#pragma unroll 4
    for (int i = threadIdx.x; i < KC * NMAX; i += THREADS) {
        const int k = B_T ? i % KC : i / NMAX;
        const int j = B_T ? i / KC : i % NMAX;
        const bool inside = k0 + k < K && n0 + j < N;
        // A copy that reads nothing (src-size 0) may point anywhere: cp.async reads no byte.
        cp_async4(smem_addr(stage + (kfast ? j * KPITCH + k : k * JPITCH + j)),
                  b + (inside ? (long long)(k0 + k) * b_sk + (long long)(n0 + j) * b_sn : 0), inside ? 4 : 0);
    }
}

// MIN_BLOCKS = 2 blocks per SM (16 warps, up to 128 registers each): enough loads in flight to cover the memory
// latency. (Without it ptxas kept the A_T = 1 layout of 16 columns to 64 registers and spilled.)
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
fastmm_skinny(FASTMM_GEMM_PARAMS)
{
    // Two stages of B; after the K loop (A_T = 1) the warps' partial sums, which fit in the first (KC >= 256).
    __shared__ __align__(16) float stages[2][STAGE_FLOATS];

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int m0 = blockIdx.y * ROWS_PER_BLOCK, n0 = blockIdx.x * NMAX;
    const int z = z0 + blockIdx.z;
    const float* a = A + fastmm_batch_offset(z, batch_inner, a_sb0, a_sb1);
    const float* b = B + fastmm_batch_offset(z, batch_inner, b_sb0, b_sb1);
    float* c = C + fastmm_batch_offset(z, batch_inner, c_sb0, c_sb1);

    constexpr bool KFAST = A_T == 0;
    // (A matrix-vector product with A_T = 1 reads its vector directly: see below.)
    if (A_T == 0 || NMAX > 1) issue_b(stages[0], KFAST, b, b_sk, b_sn, 0, K, n0, N);
    cp_async_commit();
#if A_T == 0
    // PARTS partial sums per element of C: for a matrix-vector product, one per k of the lane's 16-byte load (four
    // running sums a quarter as long: with one, the error came out at 2.7x cuBLAS gemv's at 16384^2); with more
    // columns the registers hold one (four spilled).
    constexpr int PARTS = NMAX == 1 ? 4 : 1;
    float acc[ROWS_PER_WARP][NMAX][PARTS];
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r)
#pragma unroll
        for (int j = 0; j < NMAX; ++j)
#pragma unroll
            for (int p = 0; p < PARTS; ++p) acc[r][j][p] = 0.0f;
    const int row0 = m0 + warp * ROWS_PER_WARP;
    for (int k0 = 0, c = 0; k0 < K; k0 += KC, c ^= 1) {
        // This chunk's copies have landed for every thread, and every warp is done with the other stage (the
        // previous chunk's), into which the next chunk's copies now go.
        cp_async_wait<0>();
        __syncthreads();
        if (k0 + KC < K) issue_b(stages[c ^ 1], KFAST, b, b_sk, b_sn, k0 + KC, K, n0, N);
        cp_async_commit();
        const float* stage = stages[c];
#pragma unroll 2
        for (int kk = 4 * lane; kk < KC; kk += 128) {
            const int k = k0 + kk;
            if (k >= K) break;
            float4 x[ROWS_PER_WARP];
#pragma unroll
            for (int r = 0; r < ROWS_PER_WARP; ++r) {
                const float* row = a + (long long)(row0 + r) * a_sm + k;
                if (row0 + r >= M) {
                    x[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                } else if (VEC == 4 && k + 3 < K) {
                    x[r] = __ldg(reinterpret_cast<const float4*>(row));
                } else {
                    x[r] = make_float4(__ldg(row), k + 1 < K ? __ldg(row + 1) : 0.0f,
                                       k + 2 < K ? __ldg(row + 2) : 0.0f, k + 3 < K ? __ldg(row + 3) : 0.0f);
                }
            }
#pragma unroll
            for (int j = 0; j < NMAX; ++j) {
                const float4 y = *reinterpret_cast<const float4*>(stage + j * KPITCH + kk);
#pragma unroll
                for (int r = 0; r < ROWS_PER_WARP; ++r) {
                    float* sum = acc[r][j];
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
        }
    }
    // The lanes' partial sums of each element, added in a fixed tree.
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r)
#pragma unroll
        for (int j = 0; j < NMAX; ++j) {
            float v = PARTS == 4 ? (acc[r][j][0] + acc[r][j][PARTS - 3]) + (acc[r][j][PARTS - 2] + acc[r][j][PARTS - 1])
                                 : acc[r][j][0];
#pragma unroll
            for (int d = 16; d > 0; d /= 2) v += __shfl_xor_sync(0xffffffffu, v, d);
            if (lane == 0 && row0 + r < M && n0 + j < N)
                c[(long long)(row0 + r) * c_sm + (long long)(n0 + j) * c_sn] = v;
        }
#else
    float acc[NMAX];
#pragma unroll
    for (int j = 0; j < NMAX; ++j) acc[j] = 0.0f;
    const int row = m0 + lane;
    const float* col = a + row;  // A[row][k] = col[k * a_sk]
    if (NMAX == 1) {
        // A matrix-vector product reads its vector directly: a warp-uniform load per k (one cached transaction), no
        // stage and no barriers, and one loop over K that keeps more of A's loads in flight. (Staged by cp.async
        // chunk by chunk it ran at 0.67x cuBLAS at 8192^2, against 0.85x staged by plain loads.)
        const float* v = b + (long long)n0 * b_sn;
#pragma unroll 8
        for (int k = warp; k < K; k += WARPS) {
            const float x = row < M ? __ldg(col + (long long)k * a_sk) : 0.0f;
            acc[0] = fmaf(x, __ldg(v + (long long)k * b_sk), acc[0]);
        }
    }
    for (int k0 = 0, c = 0; NMAX > 1 && k0 < K; k0 += KC, c ^= 1) {
        // This chunk's copies have landed for every thread, and every warp is done with the other stage (the
        // previous chunk's), into which the next chunk's copies now go.
        cp_async_wait<0>();
        __syncthreads();
        if (k0 + KC < K) issue_b(stages[c ^ 1], KFAST, b, b_sk, b_sn, k0 + KC, K, n0, N);
        cp_async_commit();
        const float* stage = stages[c];
        const int kend = min(KC, K - k0);
#pragma unroll 4
        for (int kk = warp; kk < kend; kk += WARPS) {
            const float x = row < M ? __ldg(col + (long long)(k0 + kk) * a_sk) : 0.0f;
            if (NMAX % 4 == 0) {
#pragma unroll
                for (int j = 0; j < NMAX; j += 4) {
                    const float4 y = *reinterpret_cast<const float4*>(stage + kk * JPITCH + j);
                    acc[j] = fmaf(x, y.x, acc[j]);
                    acc[j + 1] = fmaf(x, y.y, acc[j + 1]);
                    acc[j + 2] = fmaf(x, y.z, acc[j + 2]);
                    acc[j + 3] = fmaf(x, y.w, acc[j + 3]);
                }
            } else {
#pragma unroll
                for (int j = 0; j < NMAX; ++j) acc[j] = fmaf(x, stage[kk * JPITCH + j], acc[j]);
            }
        }
    }
    // The 8 warps' partial sums of each element, added in warp order.
    float* partial = stages[0];
    __syncthreads();  // every warp is done with the last chunk's stage (no copies are pending: the last group is empty)
#pragma unroll
    for (int j = 0; j < NMAX; ++j) partial[(warp * ROWS_PER_BLOCK + lane) * NMAX + j] = acc[j];
    __syncthreads();
    for (int i = tid; i < ROWS_PER_BLOCK * NMAX; i += THREADS) {
        const int r = i / NMAX, j = i % NMAX;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) v += partial[(w * ROWS_PER_BLOCK + r) * NMAX + j];
        if (m0 + r < M && n0 + j < N) c[(long long)(m0 + r) * c_sm + (long long)(n0 + j) * c_sn] = v;
    }
#endif
}
