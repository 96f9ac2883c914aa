// Not a product's kernel: the scaling pass of Ozaki scheme II (fastmm/_plan/ozaki.py, `scaled_integers`). One operand,
// R x K with element (r, k) at A[r * a_sm + k * a_sk] (A itself, or B read as B^T: r = n), gets one int per row: the
// power of two `shift` that puts the row's 2-norm (summed in double, times NORM_SLACK) below 2^bits (bits - frexp's
// exponent; 0 for a row of zeros), or NONFINITE where the row holds a NaN or an infinity (that row takes the FP32
// path).
//
// One block per 32 rows. Magnitudes compare as unsigned ints of their bits (sign cleared), so one maximum finds
// non-finite values: a NaN's or an infinity's bits are at least 0x7f800000, every finite value's below. Squares are
// exact in double (24-bit mantissas); their sum's rounding is far inside NORM_SLACK. Read along the
// unit stride: a warp per row (lanes along k) where k has it, else a lane per row (the 8 warps along k), then the
// block's partial maxima meet in shared memory.
//
// Launched through the same runtime as the products (FASTMM_GEMM_PARAMS, reinterpreted): M = R, K = K, A and its
// strides; C the shifts (int, one per row); c_sn = bits (the norm's bound). Grid (R / 32 rounded up, 1, 1).

#define THREADS 256
#define ROWS 32
#define WARPS (THREADS / 32)

extern "C" __global__ void __launch_bounds__(THREADS)
fastmm_ozakiscale(FASTMM_GEMM_PARAMS)
{
    __shared__ unsigned largest[WARPS][ROWS];
    __shared__ double squares[WARPS][ROWS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const long long r0 = (long long)blockIdx.x * ROWS;
    const bool along_k = a_sk == 1 || a_sm != 1;
    if (along_k) {
        // Warp w takes rows w, w + 8, w + 16, w + 24 of the block's 32, its lanes every 32nd k.
        for (int i = warp; i < ROWS; i += WARPS) {
            unsigned most = 0;
            double sq = 0.0;
            if (r0 + i < M)
                for (int k = lane; k < K; k += 32) {
                    const float x = A[(r0 + i) * a_sm + (long long)k * a_sk];
                    most = max(most, __float_as_uint(x) & 0x7fffffffu);
                    sq = fma((double)x, (double)x, sq);
                }
            for (int d = 16; d > 0; d /= 2) {
                most = max(most, __shfl_xor_sync(0xffffffffu, most, d));
                sq += __shfl_xor_sync(0xffffffffu, sq, d);
            }
            if (lane == 0) largest[0][i] = most, squares[0][i] = sq;
        }
    } else {
        // Lane l takes row l, warp w every 8th k from w: 32 consecutive rows per load where r has the unit stride.
        unsigned most = 0;
        double sq = 0.0;
        if (r0 + lane < M)
            for (int k = warp; k < K; k += WARPS) {
                const float x = A[(r0 + lane) * a_sm + (long long)k * a_sk];
                most = max(most, __float_as_uint(x) & 0x7fffffffu);
                sq = fma((double)x, (double)x, sq);
            }
        largest[warp][lane] = most;
        squares[warp][lane] = sq;
        __syncthreads();
        if (warp == 0) {
#pragma unroll
            for (int w = 1; w < WARPS; ++w) most = max(most, largest[w][lane]), sq += squares[w][lane];
            largest[0][lane] = most;
            squares[0][lane] = sq;
        }
    }
    __syncthreads();
    if (threadIdx.x < ROWS && r0 + threadIdx.x < M) {
        const unsigned most = largest[0][threadIdx.x];
        int shift = 0;
        if (most >= 0x7f800000u) {
            shift = NONFINITE;
        } else if (most != 0u) {
            int exponent;
            frexp(sqrt(squares[0][threadIdx.x]) * NORM_SLACK, &exponent);  // norm = f * 2^exponent, f in [0.5, 1)
            shift = (int)c_sn - exponent;
        }
        reinterpret_cast<int*>(C)[r0 + threadIdx.x] = shift;
    }
}
