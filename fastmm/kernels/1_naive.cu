// Rung 1 of the ladder: one thread per element of C.
//
// Thread (x, y) of a BLOCK_X x BLOCK_Y block computes C[m, n] with n along x, so the 32 threads of a warp
// read 32 neighbouring elements of a row of B and write 32 neighbouring elements of C (coalesced when
// those rows are contiguous). Every operand element is read from global memory K times over: the kernel
// is bound by load traffic, which is what the shared-memory kernel (2_smem.cu) fixes.
//
// Preconditions: none beyond M, N, K >= 0 and valid strides (any sign of layout, any alignment).
// Macros: BLOCK_X, BLOCK_Y.

extern "C" __global__ void __launch_bounds__(BLOCK_X * BLOCK_Y)
fastmm_naive(FASTMM_GEMM_PARAMS)
{
    const int n = blockIdx.x * BLOCK_X + threadIdx.x;
    const int m = blockIdx.y * BLOCK_Y + threadIdx.y;
    if (m >= M || n >= N) return;
    const int z = z0 + blockIdx.z;
    const float* a = A + fastmm_batch_offset(z, batch_inner, a_sb0, a_sb1) + m * a_sm;
    const float* b = B + fastmm_batch_offset(z, batch_inner, b_sb0, b_sb1) + n * b_sn;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k)
        acc += a[k * a_sk] * b[k * b_sk];
    C[fastmm_batch_offset(z, batch_inner, c_sb0, c_sb1) + m * c_sm + n * c_sn] = acc;
}
