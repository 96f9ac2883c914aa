// Not a product's kernel: an operand copied into rows padded to 16 bytes, for a product whose A or B rows do not
// start 16-byte aligned (an odd leading dimension). The tiles then copy the operand 16 bytes at a time, which is
// worth a pass over it on large products (the aligned-copy rule in fastmm/_plan/table.py). C (M x N, row stride c_sm a multiple
// of 4, 16-byte aligned) = A (M x K, row stride a_sm, any alignment), zeros past A's K columns: N is K rounded up to
// 4, or further where the rows are the product's K, padded with zeros to whole K-tiles (then the kernels run their
// loops). Launched through the same runtime as the products (FASTMM_GEMM_PARAMS; B unused).
//
// Bound by memory: a thread writes 4 consecutive elements of each of ROWS rows as 16-byte stores and reads them one
// by one (a warp reads 512 consecutive bytes of a row: coalesced whatever A's alignment), all ROWS x 4 loads issued
// before the first store so that each thread keeps 64 bytes in flight. (The slice-sum kernel over one slice did
// the same copy at 1.3 TB/s on an H100, half a contiguous copy's rate: a flat index divided per element, 16 bytes
// per thread.)

#define THREADS 256
#define ROWS 4  // rows per thread (configs.py's Repitch.ROWS)

extern "C" __global__ void __launch_bounds__(THREADS)
fastmm_repitch(FASTMM_GEMM_PARAMS)
{
    const int n = 4 * (blockIdx.x * THREADS + threadIdx.x);
    if (n >= N) return;
    const int m0 = blockIdx.y * ROWS;
    float4 v[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const float* a = A + (long long)(m0 + r) * a_sm + n;
        const bool row = m0 + r < M;
        v[r].x = row && n < K ? __ldg(a) : 0.0f;
        v[r].y = row && n + 1 < K ? __ldg(a + 1) : 0.0f;
        v[r].z = row && n + 2 < K ? __ldg(a + 2) : 0.0f;
        v[r].w = row && n + 3 < K ? __ldg(a + 3) : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
        if (m0 + r < M) *reinterpret_cast<float4*>(C + (long long)(m0 + r) * c_sm + n) = v[r];
}
