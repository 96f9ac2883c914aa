// The reduction of split-K: C (M x N) = the sum over s = 0 .. K-1 of A[s] (M x N), added in order of s, so a split
// product gives the same result on every run. A is the workspace the slices of a split product wrote (slice stride
// a_sk, row stride a_sm, unit stride along n); C is the caller's result (row stride c_sm, column stride c_sn).
// It takes FASTMM_GEMM_PARAMS (B unused) so that the runtime launches it like any product's kernel, on the same
// stream, with the same fault handling and replay.
//
// Bound by memory and tiny beside the product (K x M x N reads): each thread adds 4 consecutive elements of the
// flattened M x N index space, as one 16-byte load per slice when N is a multiple of 4 and both arrays' rows are
// 16-byte aligned (the 4 are then in one row), else element by element. The loads of consecutive slices are
// independent, so an unrolled loop keeps several in flight; only the additions are sequential. The layout is tested
// here rather than compiled in: the test is uniform across the grid and costs nothing beside the loads.

#define THREADS 256

// Row and column of flat index i: in 32 bits when the whole of C is indexable so (64-bit division is a call into a
// slow, stack-using subroutine).
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
    const long long first = ((long long)blockIdx.x * THREADS + threadIdx.x) * 4;
    const long long total = (long long)M * N;
    if (first >= total) return;
    const bool vec4 = N % 4 == 0 && c_sn == 1 && a_sm % 4 == 0 && a_sk % 4 == 0 && c_sm % 4 == 0 &&
                      reinterpret_cast<unsigned long long>(A) % 16 == 0 && reinterpret_cast<unsigned long long>(C) % 16 == 0;
    if (vec4) {
        long long m, n;
        row_col(first, total, N, m, n);
        const float* a = A + m * a_sm + n;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int s = 0; s < K; ++s) {
            const float4 x = __ldg(reinterpret_cast<const float4*>(a + (long long)s * a_sk));
            acc.x += x.x;
            acc.y += x.y;
            acc.z += x.z;
            acc.w += x.w;
        }
        *reinterpret_cast<float4*>(C + m * c_sm + n) = acc;
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const long long i = first + e;
            if (i >= total) break;
            long long m, n;
            row_col(i, total, N, m, n);
            const float* a = A + m * a_sm + n;
            float acc = 0.0f;
#pragma unroll 8
            for (int s = 0; s < K; ++s) acc += __ldg(a + (long long)s * a_sk);
            C[m * c_sm + n * c_sn] = acc;
        }
    }
}
