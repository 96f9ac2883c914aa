// Not a product's kernel: the residue pass of Ozaki scheme II (fastmm/_plan/ozaki.py, `scaled_integers`,
// `symmetric_residues` and `tiles`). One operand, R x K with element (r, k) at A[r * a_sm + k * a_sk] (A itself, or B
// read as B^T: r = n), scaled row by row by the scaling pass's power of two and rounded to an integer v (|v| <= 2^30,
// round half to even, as NumPy's rint), is written for each of the first n moduli m as v's symmetric residue (in
// [-m/2, m/2), int8) in the INT8 product kernel's layout (8_int8_wgmma.cu): block tiles of T = b_sk rows by K-tiles
// of 128 values, tile (r / T, k / 128) at byte (r / T * (c_sm / 128) + k / 128) * T * 128, each T rows of 128 bytes in
// the 128-byte swizzle (the 16-byte piece q of row rr at piece q ^ (rr % 8)); modulus i's tiles c_sb0 bytes after
// modulus i-1's. Zeros past R and K, and in rows whose shift is NONFINITE (the FP32 path computes those): every byte
// of the padded layout is written, so the workspace needs no zeroing.
//
// One block per 64 x 64 tile: read through shared memory along whichever axis has unit stride, then each thread
// takes 16 consecutive k of one row, one 16-byte piece per modulus. The moduli are constants (MODULI, the list
// fastmm/_plan/ozaki.py's MODULI names), so each `%` is a multiplication.
//
// Launched through the same runtime as the products (FASTMM_GEMM_PARAMS, reinterpreted): M = R, N = the padded rows
// (whole block tiles), K = K, A and its strides; B the shifts (int, one per row); b_sk = T, b_sn = n; C the tiles
// (int8), c_sm = the padded K (whole K-tiles), c_sb0 = the bytes of one modulus's tiles. Grid (c_sm / 64, N / 64).

#define THREADS 256
#define TILE 64

__device__ __forceinline__ int symmetric(int v, int m)
{
    int r = v % m;
    r += r < 0 ? m : 0;
    return r >= (m + 1) / 2 ? r - m : r;
}

extern "C" __global__ void __launch_bounds__(THREADS)
fastmm_ozakiresidues(FASTMM_GEMM_PARAMS)
{
    constexpr int moduli[NMODULI] = {MODULI};
    __shared__ float tile[TILE][TILE + 1];  // [r][k]
    const int* const shifts = reinterpret_cast<const int*>(B);
    const long long r0 = (long long)blockIdx.y * TILE;
    const int k0 = blockIdx.x * TILE;
    const bool along_k = a_sk == 1 || a_sm != 1;
    const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;
#pragma unroll 4
    for (int i = 0; i < TILE; i += THREADS / TILE) {
        const long long r = r0 + (along_k ? ty + i : tx);
        const int k = k0 + (along_k ? tx : ty + i);
        const float x = r < M && k < K ? A[r * a_sm + (long long)k * a_sk] : 0.0f;
        tile[r - r0][k - k0] = x;
    }
    __syncthreads();
    // Thread i: row i / 4 of the tile, k = 16 (i % 4) ... + 15.
    const int rw = threadIdx.x / 4, q = threadIdx.x % 4;
    const long long r = r0 + rw;
    const int shift = r < M ? shifts[r] : NONFINITE;
    int v[16];
#pragma unroll
    for (int j = 0; j < 16; ++j)
        v[j] = shift == NONFINITE ? 0 : __double2int_rn(ldexp((double)tile[rw][16 * q + j], shift));
    const int n = (int)b_sn;
    const long long rows = b_sk, kb = (k0 + 16 * q) / 128, piece = (k0 % 128) / 16 + q;
    signed char* out = reinterpret_cast<signed char*>(C) + ((r / rows) * (c_sm / 128) + kb) * rows * 128
                       + (r % rows) * 128 + ((piece ^ (r % 8)) << 4);
#pragma unroll
    for (int t = 0; t < NMODULI; ++t) {
        if (t >= n) break;
        unsigned word[4];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            unsigned packed = 0;
#pragma unroll
            for (int j = 0; j < 4; ++j) packed |= (unsigned)(symmetric(v[4 * w + j], moduli[t]) & 0xff) << (8 * j);
            word[w] = packed;
        }
        *reinterpret_cast<uint4*>(out + t * c_sb0) = make_uint4(word[0], word[1], word[2], word[3]);
    }
}
