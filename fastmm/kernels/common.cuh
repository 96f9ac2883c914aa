// Shared by every fastmm SGEMM kernel (prepended to each family's source by fastmm/kernels/build.py).
//
// Every kernel computes, for each batch index z in [0, batch):
//     C[z] (M x N) = A[z] (M x K) @ B[z] (K x N)
// with element strides (not bytes) for each axis, so transposed and sliced views need no copy.
// A batch index is split into two broadcastable batch axes, z = z0 * batch_inner + z1, each with its own
// stride per operand (0 for a broadcast axis): NumPy batch shapes collapse to at most two such axes in
// nearly every real case (fastmm/_dispatch/products.py loops over any further ones).
//
// One block computes one tile of one batch item: blockIdx.x walks tiles along n, blockIdx.y along m and
// blockIdx.z batch items from z0. Where a problem needs more than the hardware's 65535 blocks along y or z,
// the host launches again with offset pointers (m) or a larger z0 (batch): a grid-stride loop here would
// keep pointers live across tiles and cost the register-tiled kernel its spill-free register budget.

//
// k_total (split-K's slices on the warp tiles, else 0): the batch items are slices of one product's K, item z
// reading K from z * K of it; the last slice ends at k_total, short of a whole slice (4_warptile.cu). Other kernels
// ignore it.
#define FASTMM_GEMM_PARAMS                                                              \
    const int M, const int N, const int K,                                             \
    const float* __restrict__ A, const long long a_sm, const long long a_sk,           \
    const float* __restrict__ B, const long long b_sk, const long long b_sn,           \
    float* __restrict__ C, const long long c_sm, const long long c_sn,                 \
    const int z0, const int batch_inner, const int k_total,                            \
    const long long a_sb0, const long long a_sb1,                                      \
    const long long b_sb0, const long long b_sb1,                                      \
    const long long c_sb0, const long long c_sb1

// Element offset of batch item z for one operand.
__device__ __forceinline__ long long fastmm_batch_offset(int z, int inner, long long s0, long long s1)
{
    return (long long)(z / inner) * s0 + (long long)(z % inner) * s1;
}

// C's rows admit 16-byte stores (c: the block's batch item of C). Checked by each block in its epilogue rather than
// compiled in: VEC speaks for A's and B's loads only, so that a product whose operands' rows are aligned runs its
// 16-byte copies whatever C's rows are (an out= view, or C copied out of an aligned workspace), and costs nothing
// in the K loop's registers.
__device__ __forceinline__ bool fastmm_c_vec4(const float* c, long long c_sm)
{
    return reinterpret_cast<unsigned long long>(c) % 16 == 0 && c_sm % 4 == 0;
}

// Store 4 consecutive elements of one row of C, starting at column n: one 16-byte store when all four lie
// inside C and 16-byte stores are legal (vec4), else up to four guarded scalar stores.
__device__ __forceinline__ void fastmm_store4(float* crow, int n, int N, float4 v, bool vec4)
{
    if (vec4 && n + 3 < N) {
        *reinterpret_cast<float4*>(crow + n) = v;
    } else {
        if (n + 0 < N) crow[n + 0] = v.x;
        if (n + 1 < N) crow[n + 1] = v.y;
        if (n + 2 < N) crow[n + 2] = v.z;
        if (n + 3 < N) crow[n + 3] = v.w;
    }
}

// Two consecutive elements of one row of C at column n (even): one 8-byte store when both lie inside C and C's
// rows allow it (vec: 16-byte aligned rows, see fastmm_c_vec4), else up to two guarded scalar stores.
__device__ __forceinline__ void fastmm_store2(float* crow, int n, int N, float x, float y, bool vec)
{
    if (vec && n + 1 < N) {
        *reinterpret_cast<float2*>(crow + n) = make_float2(x, y);
    } else {
        if (n < N) crow[n] = x;
        if (n + 1 < N) crow[n + 1] = y;
    }
}

// Floats from the last 16-byte boundary to p (0..3): where a row's aligned copies start.
__device__ __forceinline__ int fastmm_misalignment(const float* p)
{
    return static_cast<int>((reinterpret_cast<unsigned long long>(p) >> 2) & 3);
}

// Store 4 consecutive elements of one row of C at column n, the first `s` floats past a 16-byte boundary (s = 0..3,
// from fastmm_misalignment), in the widest aligned pieces when all four lie inside C: one 16-byte store (s = 0), two
// 8-byte ones (s = 2), or 4 + 8 + 4 bytes (s odd); else up to four guarded scalar stores.
__device__ __forceinline__ void fastmm_store4_at(float* crow, int n, int N, float4 v, int s)
{
    float* p = crow + n;
    if (n + 3 < N) {
        if (s == 0) {
            *reinterpret_cast<float4*>(p) = v;
        } else if (s == 2) {
            *reinterpret_cast<float2*>(p) = make_float2(v.x, v.y);
            *reinterpret_cast<float2*>(p + 2) = make_float2(v.z, v.w);
        } else {
            p[0] = v.x;
            *reinterpret_cast<float2*>(p + 1) = make_float2(v.y, v.z);
            p[3] = v.w;
        }
    } else {
        if (n + 0 < N) p[0] = v.x;
        if (n + 1 < N) p[1] = v.y;
        if (n + 2 < N) p[2] = v.z;
        if (n + 3 < N) p[3] = v.w;
    }
}
