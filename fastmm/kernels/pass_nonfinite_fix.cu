// Not a product's kernel: the guard of a one-pass wgmma product whose operands went through tensor maps
// (6_wgmma.cu, A_TMA / B_TMA). There the TMA engine rounds each value to TF32 as it copies, without the split pass's
// care for three cases whose rounding would change what the product does: inf times a value below TF32's smallest
// step (rounded to 0: NaN instead of inf), a NaN whose payload lies in the low 13 bits, a value within half a TF32
// step of FLT_MAX (rounded to inf). Each changes an element of C from or to a non-finite value, and the product
// flags every block tile that stored one with the call's mark; here, in the flagged tiles only, each non-finite element
// of C is computed again in FP32 from A and B as they are, in order along K, so that C holds NumPy's pattern of NaN and
// infinities. Where nothing is flagged (finite data), every block returns after reading its flag. The flags are not
// zeroed before the product: a tile whose flag holds the mark by chance (an earlier call's, or a value left in the
// memory) is only looked at again, and its finite values are left as they are.
//
// FASTMM_GEMM_PARAMS, reinterpreted: M, N, K, A, B and C with their strides as the product's (A and B the caller's
// operands, not their tiles); a_sb0 the flags' address (an int per block tile, row-major), a_sb1 the tiles in a row,
// b_sb0 the call's mark.
// Grid: one block per BM x BN tile of C.

#define THREADS 256

extern "C" __global__ void __launch_bounds__(THREADS)
fastmm_nonfinitefix(FASTMM_GEMM_PARAMS)
{
    const int* const flags = reinterpret_cast<const int*>(a_sb0);
    if (flags[(long long)blockIdx.y * a_sb1 + blockIdx.x] != (int)b_sb0) return;
    for (int i = threadIdx.x; i < BM * BN; i += THREADS) {
        const long long m = (long long)blockIdx.y * BM + i / BN;
        const long long n = (long long)blockIdx.x * BN + i % BN;
        if (m >= M || n >= N) continue;
        float* const c = C + m * c_sm + n * c_sn;
        if (isfinite(*c)) continue;
        float s = 0.0f;
        for (int k = 0; k < K; ++k) s = fmaf(A[m * a_sm + k * a_sk], B[k * b_sk + n * b_sn], s);
        *c = s;
    }
}
