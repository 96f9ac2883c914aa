// The reduction of split-K: C (M x N) = the sum of the K slices A[s] (M x N), in an order fixed by K alone, so a
// split product gives the same result on every run. A is the workspace the slices of a split product wrote (slice
// stride a_sk, row stride a_sm, unit stride along n); C is the caller's result (row stride c_sm, column stride c_sn).
// It takes FASTMM_GEMM_PARAMS (B unused) so that the runtime launches it like any product's kernel, on the same
// stream, with the same fault handling and replay.
//
// Bound by memory (K x M x N reads) and by latency when K is long and M x N small (16x16x2^20 has 264 slices of
// 256 elements): so each thread adds 4 consecutive elements of the flattened M x N index space over every G-th
// slice, and the block's G groups of threads add their partial sums in group order. G grows with K (see
// slice_groups, which fastmm/kernels/configs.py's SliceSum.grid mirrors). Elements are read 16 bytes at a time when
// N is a multiple of 4 and both arrays' rows are 16-byte aligned (the 4 are then in one row), else one by one; the
// layout is tested here rather than compiled in (uniform across the grid, free beside the loads).

#define THREADS 256

// Groups of threads that share a block's elements, each adding every G-th slice: 1 for a few slices, up to 32.
__device__ __forceinline__ int slice_groups(int slices)
{
    int g = 1;
    while (g < 32 && 16 * g <= slices) g *= 2;
    return g;
}

// Row and column of flat index i: in 32 bits when the whole of C is indexable so (64-bit division is a call into a
// slow subroutine).
__device__ __forceinline__ void row_col(long long i, long long total, int N, long long& m, long long& n)
{
    if (total <= 0x7fffffffLL) {
        m = (int)i / N;
        n = (int)i % N;
    } else {
        m = i / N;
        n = i % N;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
fastmm_slicesum(FASTMM_GEMM_PARAMS)
{
    __shared__ float4 partial[THREADS];
    const int G = slice_groups(K), E = THREADS / G;  // slice groups, element groups per block
    const int g = threadIdx.x / E, e = threadIdx.x % E;
    const long long first = ((long long)blockIdx.x * E + e) * 4;
    const long long total = (long long)M * N;
    const bool vec4 = N % 4 == 0 && c_sn == 1 && a_sm % 4 == 0 && a_sk % 4 == 0 && c_sm % 4 == 0 &&
                      reinterpret_cast<unsigned long long>(A) % 16 == 0 && reinterpret_cast<unsigned long long>(C) % 16 == 0;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    long long offset[4];  // the 4 elements' offsets in a slice (vec4: the first's)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        long long m, n;
        row_col(min(first + i, total - 1), total, N, m, n);
        offset[i] = m * a_sm + n;
    }
    if (first < total) {
        if (vec4) {
            // N % 4 == 0: the 4 elements share a row.
            const float* a = A + offset[0];
#pragma unroll 8
            for (int s = g; s < K; s += G) {
                const float4 x = __ldg(reinterpret_cast<const float4*>(a + (long long)s * a_sk));
                acc.x += x.x;
                acc.y += x.y;
                acc.z += x.z;
                acc.w += x.w;
            }
        } else {
            const int valid = (int)min(4LL, total - first);
#pragma unroll 4
            for (int s = g; s < K; s += G) {
                const float* a = A + (long long)s * a_sk;
                acc.x += __ldg(a + offset[0]);
                if (valid > 1) acc.y += __ldg(a + offset[1]);
                if (valid > 2) acc.z += __ldg(a + offset[2]);
                if (valid > 3) acc.w += __ldg(a + offset[3]);
            }
        }
    }
    if (G > 1) {
        partial[threadIdx.x] = acc;
        __syncthreads();
        if (g != 0) return;
        for (int h = 1; h < G; ++h) {
            const float4 p = partial[h * E + e];
            acc.x += p.x;
            acc.y += p.y;
            acc.z += p.z;
            acc.w += p.w;
        }
    }
    if (first >= total) return;
    if (vec4) {
        long long m, n;
        row_col(first, total, N, m, n);
        *reinterpret_cast<float4*>(C + m * c_sm + n) = acc;
    } else {
        const float v[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if (first + i >= total) break;
            long long m, n;
            row_col(first + i, total, N, m, n);
            C[m * c_sm + n * c_sn] = v[i];
        }
    }
}
