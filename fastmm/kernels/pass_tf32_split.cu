// Not a product's kernel: the split pass of the wgmma tensor-core kernels (6_wgmma.cu). One operand, R x K with element
// (r, k) at A[r * a_sm + k * a_sk] (A itself, or B read as B^T: r = n), is written in the layout 6_wgmma.cu copies with
// one bulk copy per stage and reads without a bounds check: block tiles of T = b_sk rows (the kernel's BM for A, BN
// for B^T) by K-tiles of 32, tile (rows r / T, K-tile k / 32) at ((r / T) * (c_sm / 32) + k / 32) * parts * T * 32,
// each part T rows of 128 bytes in the 128-byte swizzle that wgmma's descriptors name (the 16-byte piece q of row rr
// at piece q ^ (rr % 8)). c_sm is K rounded up to whole K-tiles and N the rows rounded up to whole block tiles: zeros
// past R and K. Each value x is written as its TF32 big part (tf32_big: rounded to nearest, ties away, without ever
// turning a finite value infinite or a nonzero one zero) and, for 3xTF32 (c_sb0 = T * 32, where the small parts start
// from the big ones), its small part tf32(x - big) (0 for an infinite x; see below for values below 2^-137 and near
// FLT_MAX).
//
// Each block also writes its tile's flag (ints at C + c_sb1, one per 32 x 32 tile in the grid's order; c_sb1 = 0:
// none): 1 where the tile holds an infinity, else 0. 3xTF32's cross terms big * small would give inf * 0 = NaN against
// a value that is exact in TF32, so the wgmma kernel runs the block tiles whose rows meet a flagged tile on FP32 FMAs
// instead. Every flag is written every time: the workspace needs no zeroing.
//
// Bound by memory: a 32 x 32 tile goes through shared memory, read coalesced along whichever axis has unit stride and
// written coalesced along k. Launched through the same runtime as the products (FASTMM_GEMM_PARAMS; B, b_sn, the
// batch offsets other than c_sb0 and c_sb1 unused): M = R, N = the padded rows, K = K, grid (c_sm / 32, N / 32).

#define THREADS 256
#define TILE 32
static_assert(THREADS == TILE * TILE / 4, "one 16-byte piece of each output per thread");

extern "C" __global__ void __launch_bounds__(THREADS)
fastmm_split(FASTMM_GEMM_PARAMS)
{
    __shared__ float tile[TILE][TILE + 1];  // [r][k]; rows of 33: conflict-free along both axes
    const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;
    const int r0 = blockIdx.y * TILE, k0 = blockIdx.x * TILE;
    // Read along the unit stride: k for rows of A (or of B^T from a transposed B), r otherwise.
    const bool along_k = a_sk == 1 || a_sm != 1;
#pragma unroll
    for (int i = 0; i < TILE; i += THREADS / TILE) {
        const int r = r0 + (along_k ? ty + i : tx), k = k0 + (along_k ? tx : ty + i);
        const float x = r < M && k < K ? A[(long long)r * a_sm + (long long)k * a_sk] : 0.0f;
        tile[r - r0][k - k0] = x;
    }
    __syncthreads();
    // Written 16 bytes at a time: thread i takes k = 4 (i % 8) ... + 3 of row i / 8 (banks r + 4 (i % 8) + j: distinct).
    const int q = threadIdx.x % (TILE / 4), rw = threadIdx.x / (TILE / 4);
    const int r = r0 + rw, k = k0 + 4 * q;
    float4 big, small;
    float* const bp = &big.x;
    float* const sp = &small.x;
    bool inf = false;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float x = tile[rw][4 * q + j];
        const unsigned b = tf32_big(x);
        const bool x_inf = fabsf(x) == __int_as_float(0x7f800000);
        inf |= x_inf;
        bp[j] = __uint_as_float(b);
        // The FP32 path of flagged tiles multiplies big + small, which must stay what x is to a product: nonzero for
        // a nonzero x (a value below 2^-137 is its big part alone, the smallest TF32 value of its sign, as in
        // tf32_big: a small part would cancel it) and finite for a finite x (near FLT_MAX the small part rounded
        // up can carry big + small to inf: truncated instead).
        const unsigned e = __float_as_uint(x) & 0x7fffffffu;
        const float rest = x - __uint_as_float(b);
        float lo = x_inf || (e != 0u && e < 0x1000u) ? 0.0f : __uint_as_float(tf32_near(rest));
        if (fabsf(__uint_as_float(b) + lo) == __int_as_float(0x7f800000) && !x_inf)
            lo = __uint_as_float(__float_as_uint(rest) & 0xffffe000u);
        sp[j] = lo;
    }
    // One 16-byte piece of a swizzled row (C, c_sm and c_sb0 are multiples of 4 floats; b_sk of 8 rows).
    const long long rows = b_sk, rb = r / rows, rr = r % rows;
    float* const out =
        C + ((rb * (c_sm / TILE) + blockIdx.x) * (c_sb0 ? 2 : 1) * rows + rr) * TILE + ((q ^ (rr & 7)) << 2);
    *reinterpret_cast<float4*>(out) = big;
    if (c_sb0) *reinterpret_cast<float4*>(out + c_sb0) = small;
    if (c_sb1) {
        const int any = __syncthreads_or(inf);
        if (threadIdx.x == 0) reinterpret_cast<int*>(C + c_sb1)[blockIdx.y * gridDim.x + blockIdx.x] = any;
    }
}
