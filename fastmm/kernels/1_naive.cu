// Rung 1 of the ladder: one thread per element of C.
//
// Thread (x, y) of a BLOCK_X x BLOCK_Y block computes C[m, n] with n along x, so the 32 threads of a warp
// read 32 neighbouring elements of a row of B and write 32 neighbouring elements of C (coalesced when
// those rows are contiguous). Every operand element is read from global memory K times over: the kernel
// is bound by load traffic, which is what the shared-memory kernel (2_smem.cu) fixes.
//
// F64_SUMS: each product of two floats is exact in float64 and so, nearly, is their sum: C is the exact product
// rounded once, below any float32 running sum's error. The plan's `small` rule runs it where the launch, not the
// arithmetic (float64 at half the FP32 rate, two conversions per term), sets the time of a call.
//
// K_LANES (with F64_SUMS, BLOCK_X = 32): one warp per element of C instead, its lanes taking every 32nd k and their
// sums added in a shuffle tree: K a warp's lanes share walks 32 times fewer steps in a row, for few elements of C.
//
// TM x TN > 1 (the plan's outer-products kernel): each thread computes TM rows x TN = 4 neighbouring columns of C, a
// warp 128 columns. A product with K of a few terms (the plan: K <= 3) does a few FLOPs per element of C it writes: it
// is bound by writing C, and what counts is keeping enough stores in flight. Here no shared memory, no barrier and few
// registers: a thread reads its rows of A (the same for the whole warp: one broadcast load) and 16 bytes of a row of
// B per k (from L1: the block's 8 warps read the same 512 bytes), and writes 16 bytes per row of C, a warp 512
// contiguous bytes. (The 64x64 tile wrote C at 1.6 TB/s where cuBLAS wrote 2.2: docs/kernels/heuristic.md,
// outer-products.)
//
// Preconditions: none beyond M, N, K >= 0 and valid strides (any sign of layout, any alignment). Rows past the grid's
// y limit are launched again with A and C offset (the runtime's chunks, common.cuh).
// Macros: BLOCK_X, BLOCK_Y, F64_SUMS, K_LANES, TM, TN.

#if F64_SUMS
// One term of a float64 sum. A float32 product that overflows is inf in NumPy's float32 products (and so is C): here
// too, where the float64 product would stay finite.
__device__ __forceinline__ double fastmm_f64_term(float x, float y, double acc)
{
    const float p = x * y;
    return isinf(p) ? acc + (double)p : fma((double)x, (double)y, acc);
}

// The float64 sum of a[k] * b[k] over k = first, first + stride, ... below K, in two chains: one float64 FMA's
// latency, not the loads, would bound a single chain.
__device__ __forceinline__ double fastmm_f64_dot(const float* a, long long a_sk, const float* b, long long b_sk,
                                                 int K, int first, int stride)
{
    double even = 0.0, odd = 0.0;
    int k = first;
#pragma unroll 4
    for (; k + stride < K; k += 2 * stride) {
        even = fastmm_f64_term(a[k * a_sk], b[k * b_sk], even);
        odd = fastmm_f64_term(a[(k + stride) * a_sk], b[(k + stride) * b_sk], odd);
    }
    if (k < K)
        even = fastmm_f64_term(a[k * a_sk], b[k * b_sk], even);
    return even + odd;
}
#endif

#if K_LANES
static_assert(BLOCK_X == 32 && F64_SUMS, "K_LANES: a warp's 32 lanes share K, summing in float64");

extern "C" __global__ void __launch_bounds__(BLOCK_X * BLOCK_Y)
fastmm_naive(FASTMM_GEMM_PARAMS)
{
    const int n = blockIdx.x * BLOCK_Y + threadIdx.y, m = blockIdx.y;  // one element of C per warp
    if (n >= N || m >= M) return;  // (the warp leaves as a whole)
    const int lane = threadIdx.x, z = z0 + blockIdx.z;
    const float* a = A + fastmm_batch_offset(z, batch_inner, a_sb0, a_sb1) + m * a_sm;
    const float* b = B + fastmm_batch_offset(z, batch_inner, b_sb0, b_sb1) + n * b_sn;
    double sum = fastmm_f64_dot(a, a_sk, b, b_sk, K, lane, 32);
    for (int step = 16; step > 0; step >>= 1)
        sum += __shfl_down_sync(0xffffffffu, sum, step);
    if (lane == 0)
        C[fastmm_batch_offset(z, batch_inner, c_sb0, c_sb1) + m * c_sm + n * c_sn] = (float)sum;
}
#elif TM * TN > 1
static_assert(TN == 4 && !F64_SUMS, "a thread's piece of C: TM rows x 4 columns (a 16-byte store), FP32 sums");

extern "C" __global__ void __launch_bounds__(BLOCK_X * BLOCK_Y)
fastmm_naive(FASTMM_GEMM_PARAMS)
{
    const int n0 = (blockIdx.x * BLOCK_X + threadIdx.x) * TN, m0 = (blockIdx.y * BLOCK_Y + threadIdx.y) * TM;
    if (n0 >= N || m0 >= M) return;
    const int z = z0 + blockIdx.z;
    const float* a = A + fastmm_batch_offset(z, batch_inner, a_sb0, a_sb1) + m0 * a_sm;
    const float* b = B + fastmm_batch_offset(z, batch_inner, b_sb0, b_sb1) + n0 * b_sn;
    float* c = C + fastmm_batch_offset(z, batch_inner, c_sb0, c_sb1);
    // B's 4 columns in one 16-byte load where its rows are contiguous and every row's piece is 16-byte aligned.
    const bool b_vec = b_sn == 1 && b_sk % 4 == 0 && reinterpret_cast<unsigned long long>(b) % 16 == 0 && n0 + TN <= N;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
        float y[TN];
        if (b_vec) {
            const float4 v = *reinterpret_cast<const float4*>(b + k * b_sk);
            y[0] = v.x, y[1] = v.y, y[2] = v.z, y[3] = v.w;
        } else {
#pragma unroll
            for (int j = 0; j < TN; ++j) y[j] = n0 + j < N ? b[k * b_sk + j * b_sn] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const float x = m0 + i < M ? a[i * a_sm + k * a_sk] : 0.0f;
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(x, y[j], acc[i][j]);
        }
    }
    const bool c_vec = c_sn == 1 && fastmm_c_vec4(c, c_sm);
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        if (m0 + i >= M) break;
        float* crow = c + (long long)(m0 + i) * c_sm;
        if (c_sn == 1) {
            fastmm_store4(crow, n0, N, make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]), c_vec);
        } else {
#pragma unroll
            for (int j = 0; j < TN; ++j)
                if (n0 + j < N) crow[(long long)(n0 + j) * c_sn] = acc[i][j];
        }
    }
}
#else
extern "C" __global__ void __launch_bounds__(BLOCK_X * BLOCK_Y)
fastmm_naive(FASTMM_GEMM_PARAMS)
{
    const int n = blockIdx.x * BLOCK_X + threadIdx.x, m = blockIdx.y * BLOCK_Y + threadIdx.y;
    if (n >= N || m >= M) return;
    const int z = z0 + blockIdx.z;
    const float* a = A + fastmm_batch_offset(z, batch_inner, a_sb0, a_sb1) + m * a_sm;
    const float* b = B + fastmm_batch_offset(z, batch_inner, b_sb0, b_sb1) + n * b_sn;
#if F64_SUMS
    const float acc = (float)fastmm_f64_dot(a, a_sk, b, b_sk, K, 0, 1);
#else
    float acc = 0.0f;
    for (int k = 0; k < K; ++k)
        acc += a[k * a_sk] * b[k * b_sk];
#endif
    C[fastmm_batch_offset(z, batch_inner, c_sb0, c_sb1) + m * c_sm + n * c_sn] = acc;
}
#endif
