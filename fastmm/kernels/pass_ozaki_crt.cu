// Not a product's kernel: the reconstruction pass of Ozaki scheme II (fastmm/_plan/ozaki.py, `crt_table` and
// `matmul_reference`). For each element (i, j) of C (M x N, rows c_sm apart, unit column stride), the n INT8 products,
// each reduced modulo its modulus m_t by the product kernel (r_t in [0, m_t), uint8: element (i, j) at
// A[t * a_sk + i * a_sm + j]), are residues of one integer x in [-P/2, P/2), P the product of the n moduli; the
// Chinese remainder theorem gives it exactly: x = sum_t r_t * w_t mod P, with w_t = (P / m_t) * ((P / m_t)^-1 mod m_t), in 128-bit integers (x < 2^100: the table's limit). Then
// C = x * 2^-(ea_i + eb_j), rounded once to double (x exactly there where |x| < 2^53) and once to float32, as the
// reference rounds. Elements of rows or columns whose shift is NONFINITE are written 0: the FP32 path overwrites
// them.
//
// The table (B, 8-byte words): w_t as (low, high) words at 2t, 2t + 1 (t < NMODULI), P at 2 NMODULI, 2 NMODULI + 1,
// 1 / P as a double at 2 NMODULI + 2; then, as ints from B, the shifts of A's rows at b_sk and of B's columns at b_sn
// (the first row and column of this launch's C).
//
// Bound by memory: n bytes read per float written, coalesced along j. One thread per element.
//
// Launched through the same runtime as the products (FASTMM_GEMM_PARAMS, reinterpreted): M, N; K = n; A the residues
// (a_sm, a_sk their row and modulus strides in bytes); B the table; C, c_sm. Grid (N / 256 rounded up, M).

#define THREADS 256

typedef unsigned __int128 u128;

extern "C" __global__ void __launch_bounds__(THREADS)
fastmm_ozakicrt(FASTMM_GEMM_PARAMS)
{
    const long long i = blockIdx.y, j = (long long)blockIdx.x * THREADS + threadIdx.x;
    if (j >= N) return;
    const unsigned long long* const table = reinterpret_cast<const unsigned long long*>(B);
    const int ea = reinterpret_cast<const int*>(B)[b_sk + i], eb = reinterpret_cast<const int*>(B)[b_sn + j];
    float* const out = C + i * c_sm + j;
    if (ea == NONFINITE || eb == NONFINITE) {
        *out = 0.0f;
        return;
    }
    const unsigned char* const residues = reinterpret_cast<const unsigned char*>(A) + i * a_sm + j;
    u128 sum = 0;
#pragma unroll
    for (int t = 0; t < NMODULI; ++t) {
        if (t >= K) break;
        sum += (u128)residues[t * a_sk] * (((u128)table[2 * t + 1] << 64) | table[2 * t]);
    }
    const u128 total = ((u128)table[2 * NMODULI + 1] << 64) | table[2 * NMODULI];
    const double inverse = __longlong_as_double((long long)table[2 * NMODULI + 2]);
    // sum < n * 256 * P: take away q P with q from floating point (off by at most one), then correct.
    const double approx = (double)(unsigned long long)(sum >> 64) * 0x1p64 + (double)(unsigned long long)sum;
    const u128 q = (u128)(unsigned long long)floor(approx * inverse);
    sum -= q * total;  // as a signed value, within (-P, 2P)
    if ((__int128)sum < 0) sum += total;
    if (sum >= total) sum -= total;
    // Symmetric: x = sum - P where sum >= P / 2 (the reference's acc >= total // 2).
    const bool negative = sum >= total / 2;
    const u128 magnitude = negative ? total - sum : sum;
    double x = (double)(unsigned long long)(magnitude >> 64) * 0x1p64 + (double)(unsigned long long)magnitude;
    x = negative ? -x : x;
    *out = (float)ldexp(x, -(ea + eb));
}
