// Not a product's kernel: the reconstruction pass of Ozaki scheme II (fastmm/_plan/ozaki.py, `crt_table` and
// `matmul_reference`). For each element (i, j) of C (M x N, rows c_sm apart, unit column stride), the n INT8 products,
// each reduced modulo its modulus m_t by the product kernel (r_t in [0, m_t), uint8: element (i, j) at
// A[t * a_sk + i * a_sm + j]), are residues of one integer x in [-P/2, P/2), P the product of the n moduli. By the
// Chinese remainder theorem x = sum_t s_t (P / m_t) mod P with s_t = r_t v_t mod m_t, v_t = (P / m_t)^-1 mod m_t;
// so x / P is the fractional part of sum_t s_t / m_t, which double holds to within n ulps of 8 (2^-47): x to within
// 2^-47 P, where |x| may reach nearly P / 2 (the scaling's bound, `side_bits`); far below the float32 rounding of C
// at up to 9 moduli (`choose_moduli` takes no more: with more, 2^-47 P grows past it). Then C = x * 2^-(ea_i + eb_j),
// rounded to float32. Elements of rows or columns whose shift is NONFINITE are written 0: the FP32 path overwrites
// them.
//
// (128-bit integer sums of r_t w_t, exact, ran this pass at 4x the time its bytes take; docs/kernels/ozaki.md.)
//
// The table (B, 8-byte words): v_t at word t (t < n), P as a double at word NMODULI; then, as ints from B, the shifts
// of A's rows at b_sk and of B's columns at b_sn (the first row and column of this launch's C).
//
// Bound by memory: n bytes read per float written, coalesced along j. COLUMNS (4) elements of a row per thread, each
// modulus's 4 residues in one load and the 4 floats in one store where the strides allow (a byte a thread ran at a
// quarter of the memory's rate); the moduli are constants (MODULI), so each `%` and 1 / m_t is folded.
//
// Launched through the same runtime as the products (FASTMM_GEMM_PARAMS, reinterpreted): M, N; K = n; A the residues
// (a_sm, a_sk their row and modulus strides in bytes); B the table; C, c_sm. Grid (N / (256 COLUMNS) rounded up, M).

#define THREADS 256

static_assert(COLUMNS == 4, "one 4-byte load of residues per modulus");

extern "C" __global__ void __launch_bounds__(THREADS)
fastmm_ozakicrt(FASTMM_GEMM_PARAMS)
{
    constexpr int moduli[NMODULI] = {MODULI};
    const long long i = blockIdx.y, j0 = ((long long)blockIdx.x * THREADS + threadIdx.x) * COLUMNS;
    if (j0 >= N) return;
    const unsigned long long* const table = reinterpret_cast<const unsigned long long*>(B);
    const int ea = reinterpret_cast<const int*>(B)[b_sk + i];
    const unsigned char* const residues = reinterpret_cast<const unsigned char*>(A) + i * a_sm + j0;
    const bool whole = j0 + COLUMNS <= N;
    const bool vec_in = whole && reinterpret_cast<unsigned long long>(residues) % 4 == 0 && a_sk % 4 == 0;
    double fraction[COLUMNS] = {};
#pragma unroll
    for (int t = 0; t < NMODULI; ++t) {
        if (t >= K) break;
        unsigned char r[COLUMNS] = {};
        if (vec_in) {
            const uchar4 four = *reinterpret_cast<const uchar4*>(residues + t * a_sk);
            r[0] = four.x, r[1] = four.y, r[2] = four.z, r[3] = four.w;
        } else {
            for (int q = 0; q < COLUMNS; ++q)
                if (j0 + q < N) r[q] = residues[t * a_sk + q];
        }
        const int v = (int)table[t];
#pragma unroll
        for (int q = 0; q < COLUMNS; ++q) fraction[q] += ((int)r[q] * v % moduli[t]) * (1.0 / moduli[t]);
    }
    const double total = __longlong_as_double((long long)table[NMODULI]);
    float x[COLUMNS];
#pragma unroll
    for (int q = 0; q < COLUMNS; ++q) {
        const int eb = j0 + q < N ? reinterpret_cast<const int*>(B)[b_sn + j0 + q] : 0;
        double f = fraction[q] - floor(fraction[q]);
        f = f >= 0.5 ? f - 1.0 : f;  // symmetric: x in [-P/2, P/2)
        x[q] = ea == NONFINITE || eb == NONFINITE ? 0.0f : (float)ldexp(f * total, -(ea + eb));
    }
    float* const out = C + i * c_sm + j0;
    if (whole && reinterpret_cast<unsigned long long>(out) % 16 == 0) {
        *reinterpret_cast<float4*>(out) = make_float4(x[0], x[1], x[2], x[3]);
    } else {
        for (int q = 0; q < COLUMNS; ++q)
            if (j0 + q < N) out[q] = x[q];
    }
}
