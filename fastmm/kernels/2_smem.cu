// Rung 2 of the ladder: shared-memory tiling over K.
//
// A TILE x TILE block computes a TILE x TILE tile of C; thread (x, y) owns C[tile_m + y, tile_n + x].
// The block walks K in steps of TILE: it stages a TILE x TILE tile of A and of B in shared memory, then
// every thread reads its row of As and column of Bs from there. Each global element is now read
// K / TILE times instead of K times, so the kernel moves from load-bound towards shared-memory-bound
// (two shared loads per FMA), which is what register tiling (3_regtile.cu) fixes next.
//
// Layout: which thread loads which element is chosen per operand at run time (uniform across the grid),
// so that consecutive threads read consecutive addresses whether the operand is stored row- or
// column-major.
//
// Preconditions: none beyond M, N, K >= 0. Ragged edges are zero-filled in shared memory.
// Macros: TILE.

// MIN_BLOCKS: as many blocks as fill an SM's 2048 threads, which caps registers at 32 per thread; with more,
// occupancy halves and this latency-bound kernel loses about a third of its speed (measured: 5.7 -> 8+ TFLOP/s).
extern "C" __global__ void __launch_bounds__(TILE * TILE, 2048 / (TILE * TILE))
fastmm_smem(FASTMM_GEMM_PARAMS)
{
    // No padding: a thread's row of As is then 16-byte aligned and the compiler reads it 4 floats at a time
    // (LDS.128), one shared load per FMA instead of two on the inner loop's critical path. The transposed
    // stores of a column-major operand do conflict, but they happen once per TILE inner steps.
    __shared__ __align__(16) float As[TILE][TILE];  // As[m][k]
    __shared__ __align__(16) float Bs[TILE][TILE];  // Bs[k][n]

    const int tx = threadIdx.x, ty = threadIdx.y;
    const int tile_m = blockIdx.y * TILE, tile_n = blockIdx.x * TILE;
    const int z = z0 + blockIdx.z;
    // Which element of each tile this thread loads: consecutive threads (x) walk the operand's unit-stride
    // axis, so loads are coalesced for row- and column-major operands alike.
    const bool a_m_fast = (a_sm == 1 && a_sk != 1);
    const bool b_k_fast = (b_sk == 1 && b_sn != 1);
    const int a_mm = a_m_fast ? tx : ty, a_kk = a_m_fast ? ty : tx;
    const int b_kk = b_k_fast ? tx : ty, b_nn = b_k_fast ? ty : tx;
    const bool a_in = tile_m + a_mm < M, b_in = tile_n + b_nn < N;
    // Pointers to this thread's element of the first K-tile, stepped TILE along k per tile.
    const float* pa = A + fastmm_batch_offset(z, batch_inner, a_sb0, a_sb1) + (long long)(tile_m + a_mm) * a_sm
                      + (long long)a_kk * a_sk;
    const float* pb = B + fastmm_batch_offset(z, batch_inner, b_sb0, b_sb1) + (long long)b_kk * b_sk
                      + (long long)(tile_n + b_nn) * b_sn;
    const long long a_step = TILE * a_sk, b_step = TILE * b_sk;

    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        // Stage one tile of A and of B (zeros outside the matrices).
        As[a_mm][a_kk] = (a_in && k0 + a_kk < K) ? *pa : 0.0f;
        Bs[b_kk][b_nn] = (b_in && k0 + b_kk < K) ? *pb : 0.0f;
        pa += a_step;
        pb += b_step;
        __syncthreads();  // the tile is complete before anyone reads it
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk)
            acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
        __syncthreads();  // everyone is done reading before the next tile overwrites it
    }
    const int m = tile_m + ty, n = tile_n + tx;
    if (m < M && n < N)
        C[fastmm_batch_offset(z, batch_inner, c_sb0, c_sb1) + (long long)m * c_sm + (long long)n * c_sn] = acc;
}
