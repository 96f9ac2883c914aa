// The reduction of split-K: C (M x N) = the sum of the K slices A[s] (M x N), in an order fixed by K alone, so a
// split product gives the same result on every run. A is the workspace the slices of a split product wrote (slice
// stride a_sk, row stride a_sm, unit stride along n); C is the caller's result (row stride c_sm, column stride c_sn).
// A batch of split products (blockIdx.z) takes its workspace and result through the batch strides, as any product.
// It takes FASTMM_GEMM_PARAMS (B unused) so that the runtime launches it like any product's kernel, on the same
// stream, with the same fault handling and replay.
//
// Bound by memory (K x M x N reads) and by latency when K is long and M x N small (16x16x2^20 has 264 slices of
// 256 elements): so each thread adds a quad of 4 elements over every G-th slice, and the block's G groups of threads
// add their partial sums in group order. G grows with K (see slice_groups, which fastmm/kernels/configs.py's
// SliceSum.grid mirrors). Where the workspace's rows are 16-byte aligned (a_sm and a_sk multiples of 4: the runtime
// pads the tiles' workspace rows so), quads lie in rows, 4 consecutive columns, and are read 16 bytes at a time but
// for a row's last partial quad; C takes 16-byte stores where its own rows allow. Otherwise (the few-column
// kernels' workspace: rows of 1 to 16 floats, not padded) a quad is 4 consecutive elements of the flattened M x N
// index space, read one by one. The layout is tested here rather than compiled in (uniform across the grid, free
// beside the loads).

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

// acc += load(s) for s = g, g + G, g + 2G, ... below K, in that order, with the loads of IN_FLIGHT slices issued
// before their adds: one slice at a time, each add waited on its load (13 slices of 289 x 178 took 15 us).
constexpr int IN_FLIGHT = 8;

template <class Load>
__device__ __forceinline__ void add_slices(float4& acc, int g, int G, int K, Load load)
{
    for (int s = g; s < K; s += IN_FLIGHT * G) {
        float4 x[IN_FLIGHT];
#pragma unroll
        for (int i = 0; i < IN_FLIGHT; ++i)
            x[i] = load(min(s + i * G, K - 1));  // past K a slice read again (a cache hit), not added
#pragma unroll
        for (int i = 0; i < IN_FLIGHT; ++i) {
            if (s + i * G < K) {
                acc.x += x[i].x;
                acc.y += x[i].y;
                acc.z += x[i].z;
                acc.w += x[i].w;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
fastmm_slicesum(FASTMM_GEMM_PARAMS)
{
    __shared__ float4 partial[THREADS];
    const int z = z0 + blockIdx.z;
    A += fastmm_batch_offset(z, batch_inner, a_sb0, a_sb1);
    C += fastmm_batch_offset(z, batch_inner, c_sb0, c_sb1);
    const int G = slice_groups(K), E = THREADS / G;  // slice groups, element groups per block
    const int g = threadIdx.x / E, e = threadIdx.x % E;
    const long long quad = (long long)blockIdx.x * E + e;
    const bool rows = a_sm % 4 == 0 && a_sk % 4 == 0 && reinterpret_cast<unsigned long long>(A) % 16 == 0;
    const int per_row = (N + 3) / 4;  // quads per row (rows)
    const long long quads = rows ? (long long)M * per_row : ((long long)M * N + 3) / 4;
    const long long total = (long long)M * N;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    long long m = 0, n = 0;           // rows: the quad's row and first column
    long long offset[4];              // flat: the 4 elements' offsets in a slice
    int valid = 0;                    // elements of the quad inside C
    if (quad < quads) {
        if (rows) {
            row_col(quad, quads, per_row, m, n);
            n *= 4;
            valid = (int)min(4LL, N - n);
            const float* a = A + m * a_sm + n;
            if (valid == 4) {
                add_slices(acc, g, G, K, [&](int s) {
                    return __ldg(reinterpret_cast<const float4*>(a + (long long)s * a_sk));
                });
            } else {
                add_slices(acc, g, G, K, [&](int s) {
                    const float* x = a + (long long)s * a_sk;
                    return make_float4(__ldg(x), valid > 1 ? __ldg(x + 1) : 0.0f, valid > 2 ? __ldg(x + 2) : 0.0f,
                                       0.0f);
                });
            }
        } else {
            const long long first = quad * 4;
            valid = (int)min(4LL, total - first);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                long long r, col;
                row_col(min(first + i, total - 1), total, N, r, col);
                offset[i] = r * a_sm + col;
            }
            add_slices(acc, g, G, K, [&](int s) {
                const float* a = A + (long long)s * a_sk;
                return make_float4(__ldg(a + offset[0]), valid > 1 ? __ldg(a + offset[1]) : 0.0f,
                                   valid > 2 ? __ldg(a + offset[2]) : 0.0f, valid > 3 ? __ldg(a + offset[3]) : 0.0f);
            });
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
    if (quad >= quads) return;
    const float v[4] = {acc.x, acc.y, acc.z, acc.w};
    if (rows) {
        float* c = C + m * c_sm + n * c_sn;
        if (valid == 4 && c_sn == 1 && reinterpret_cast<unsigned long long>(c) % 16 == 0) {
            *reinterpret_cast<float4*>(c) = acc;
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if (i < valid) c[i * c_sn] = v[i];
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (i >= valid) break;
        long long r, col;
        row_col(quad * 4 + i, total, N, r, col);
        C[r * c_sm + col * c_sn] = v[i];
    }
}
