// Rung 2 of the ladder: shared-memory tiling over K.
//
// A TILE x TILE block computes a TILE x TILE tile of C; thread (x, y) owns C[tile_m + y, tile_n + x].
// The block walks K in steps of TILE: it stages a TILE x TILE tile of A and of B in shared memory, then
// every thread reads its row of As and column of Bs from there. Each global element is now read
// K / TILE times instead of K times, so the kernel moves from load-bound towards shared-memory-bound
// (two shared loads per FMA), which is what register tiling (regtile.cu) fixes next.
//
// Layout: which thread loads which element is chosen per operand at run time (uniform across the grid),
// so that consecutive threads read consecutive addresses whether the operand is stored row- or
// column-major. The +1 padding keeps the transposed stores free of bank conflicts.
//
// Preconditions: none beyond M, N, K >= 0. Ragged edges are zero-filled in shared memory.
// Macros: TILE.

extern "C" __global__ void __launch_bounds__(TILE * TILE, 1)
fastmm_smem(FASTMM_GEMM_PARAMS)
{
    __shared__ float As[TILE][TILE + 1];  // As[m][k]
    __shared__ float Bs[TILE][TILE + 1];  // Bs[k][n]

    const int tx = threadIdx.x, ty = threadIdx.y;
    const int tile_n = blockIdx.x * TILE;
    // A column-major operand (unit stride along m) is loaded with x along m, else with x along k.
    const bool a_m_fast = (a_sm == 1 && a_sk != 1);
    const bool b_k_fast = (b_sk == 1 && b_sn != 1);

    const int tile_m = blockIdx.y * TILE;
    const int z = z0 + blockIdx.z;
    const float* a = A + fastmm_batch_offset(z, batch_inner, a_sb0, a_sb1);
    const float* b = B + fastmm_batch_offset(z, batch_inner, b_sb0, b_sb1);
    float* c = C + fastmm_batch_offset(z, batch_inner, c_sb0, c_sb1);
    {
        {
            float acc = 0.0f;
            for (int k0 = 0; k0 < K; k0 += TILE) {
                // Stage one tile of A and B (zeros outside the matrices).
                {
                    const int mm = a_m_fast ? tx : ty, kk = a_m_fast ? ty : tx;
                    const int m = tile_m + mm, k = k0 + kk;
                    As[mm][kk] = (m < M && k < K) ? a[m * a_sm + k * a_sk] : 0.0f;
                }
                {
                    const int kk = b_k_fast ? tx : ty, nn = b_k_fast ? ty : tx;
                    const int k = k0 + kk, n = tile_n + nn;
                    Bs[kk][nn] = (k < K && n < N) ? b[k * b_sk + n * b_sn] : 0.0f;
                }
                __syncthreads();  // the tile is complete before anyone reads it
#pragma unroll
                for (int kk = 0; kk < TILE; ++kk)
                    acc += As[ty][kk] * Bs[kk][tx];
                __syncthreads();  // everyone is done reading before the next tile overwrites it
            }
            const int m = tile_m + ty, n = tile_n + tx;
            if (m < M && n < N)
                c[m * c_sm + n * c_sn] = acc;
        }
    }
}
