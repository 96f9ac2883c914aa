// Rung 3 of the ladder: register tiling with double buffering (the seeds' 128x128x8 / 8x8 design,
// generalised to any tile shape, ragged edges, both storage orders of A and B, and unaligned data).
//
// Who computes what: a block of THREADS = (BM/TM) * (BN/TN) threads computes a BM x BN tile of C.
// Thread (tx, ty) keeps a TM x TN sub-tile of C in registers. The sub-tile is made of (TM/4) x (TN/4)
// blocks of 4 x 4, spaced BM/(TM/4) rows and BN/(TN/4) columns apart, so that a warp's 128-bit
// shared-memory reads are either broadcasts (A) or consecutive (B), and its C stores are coalesced.
// Per step of k each thread reads TM + TN values from shared memory and does TM * TN FMAs: with 8 x 8,
// four times fewer shared loads per FMA than a 4 x 4 tile, sixteen times fewer than the smem kernel.
//
// Pipeline: shared memory holds two BK-deep stages. While the block multiplies stage s, each thread has
// already issued its global loads for the next stage into registers; it writes them to stage s^1 after
// the FMAs, so global latency hides behind arithmetic, and one barrier per step suffices (stage s^1 was
// last read before the previous step's barrier).
//
// Storage: A is kept in shared memory transposed (As[k][m]) and B as Bs[k][n], so both fragments are
// contiguous 128-bit reads. Global loads go 4 elements at a time along each operand's unit-stride axis:
//   A_T = 0: A has unit stride along k (row-major A),    A_T = 1: unit stride along m (A is a transposed view)
//   B_T = 0: B has unit stride along n (row-major B),    B_T = 1: unit stride along k (B is a transposed view)
// VEC = 4 uses float4 loads of A and B, which needs their rows 16-byte aligned (fastmm/_runtime/gemm.py checks base
// pointers, leading dimensions and batch strides); VEC = 1 reads the same 4 elements one by one. C's rows are
// checked by each block for its float4 stores (fastmm_c_vec4).
//
// Edges: a 4-vector that crosses the end of a matrix is read element by element with zero fill, and
// stores are guarded per row and per element, so any M, N, K >= 0 is correct with no out-of-bounds
// access. C must have unit stride along n (the dispatcher transposes the problem or stages C otherwise).
//
// Macros: BM, BN, BK, TM, TN, MIN_BLOCKS, A_T, B_T, VEC.

#define THREADS ((BM / TM) * (BN / TN))
#define RM (TM / 4)              // 4 x 4 blocks per thread along m
#define RN (TN / 4)              // ... and along n
#define A_VECS (BM * BK / 4 / THREADS)  // 4-vectors of the A tile each thread loads per stage
#define B_VECS (BN * BK / 4 / THREADS)

static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % 4 == 0, "tiles are built from 4-vectors");
static_assert((BM * BK / 4) % THREADS == 0 && (BN * BK / 4) % THREADS == 0,
              "every thread loads the same number of 4-vectors");
static_assert(VEC == 4 || VEC == 1, "VEC is 4 (float4) or 1 (scalar)");

// Load 4 consecutive elements starting at p, of which the first `valid` lie inside the matrix.
__device__ __forceinline__ float4 load4(const float* p, int valid)
{
#if VEC == 4
    if (valid >= 4) return __ldg(reinterpret_cast<const float4*>(p));
#else
    if (valid >= 4) return make_float4(__ldg(p), __ldg(p + 1), __ldg(p + 2), __ldg(p + 3));
#endif
    float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
    if (valid > 0) r.x = __ldg(p);
    if (valid > 1) r.y = __ldg(p + 1);
    if (valid > 2) r.z = __ldg(p + 2);
    return r;
}

__device__ __forceinline__ int clamp4(int n) { return n < 0 ? 0 : (n > 4 ? 4 : n); }

// MIN_BLOCKS caps registers so that many blocks fit on one SM (the occupancy the config plans for).
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
fastmm_regtile(FASTMM_GEMM_PARAMS)
{
    __shared__ __align__(16) float As[2][BK][BM];
    __shared__ __align__(16) float Bs[2][BK][BN];

    const int tid = threadIdx.x;
    const int tx = tid % (BN / TN), ty = tid / (BN / TN);
    const int bn = blockIdx.x * BN;
    // Leading dimensions: the stride of each operand's non-unit axis.
    const long long lda = A_T ? a_sk : a_sm;
    const long long ldb = B_T ? b_sn : b_sk;
    const int num_k_tiles = (K + BK - 1) / BK;

    // Where this thread's 4-vectors sit inside a tile (fixed for the whole kernel).
    // For A: (row, col) = (m, k) with the vector along k when A_T = 0, (k, m) with it along m when A_T = 1.
    int a_outer[A_VECS], a_inner[A_VECS];
#pragma unroll
    for (int i = 0; i < A_VECS; ++i) {
        const int v = tid + i * THREADS;
        const int per_row = A_T ? BM / 4 : BK / 4;
        a_outer[i] = v / per_row;            // m (A_T = 0) or k (A_T = 1)
        a_inner[i] = (v % per_row) * 4;      // k (A_T = 0) or m (A_T = 1)
    }
    int b_outer[B_VECS], b_inner[B_VECS];
#pragma unroll
    for (int i = 0; i < B_VECS; ++i) {
        const int v = tid + i * THREADS;
        const int per_row = B_T ? BK / 4 : BN / 4;
        b_outer[i] = v / per_row;            // k (B_T = 0) or n (B_T = 1)
        b_inner[i] = (v % per_row) * 4;      // n (B_T = 0) or k (B_T = 1)
    }

    {
        const int z = z0 + blockIdx.z;
        const float* a = A + fastmm_batch_offset(z, batch_inner, a_sb0, a_sb1);
        const float* b = B + fastmm_batch_offset(z, batch_inner, b_sb0, b_sb1);
        float* c = C + fastmm_batch_offset(z, batch_inner, c_sb0, c_sb1);
        {
            const int bm = blockIdx.y * BM;
            // Each of this thread's 4-vectors gets a pointer for K-tile 0, advanced by a fixed step per
            // tile, and a bound along k: this keeps 64-bit address arithmetic out of the main loop. The
            // bound along m or n is recomputed at each load rather than kept: with 64 accumulators, one
            // more live register per vector is what tipped the 128x128 configuration into spilling.
            const float* a_ptr[A_VECS]; int a_lim[A_VECS];
#pragma unroll
            for (int i = 0; i < A_VECS; ++i) {
#if A_T == 0
                const int m = bm + a_outer[i];
                a_ptr[i] = a + (long long)m * lda + a_inner[i];
                a_lim[i] = m < M ? K - a_inner[i] : -4;   // elements left along k, minus k0
#else
                const int m = bm + a_inner[i];
                a_ptr[i] = a + (long long)a_outer[i] * lda + m;
                a_lim[i] = K - a_outer[i];                 // the vector's k is in range while k0 < a_lim
#endif
            }
            const float* b_ptr[B_VECS]; int b_lim[B_VECS];
#pragma unroll
            for (int i = 0; i < B_VECS; ++i) {
#if B_T == 0
                const int n = bn + b_inner[i];
                b_ptr[i] = b + (long long)b_outer[i] * ldb + n;
                b_lim[i] = K - b_outer[i];
#else
                const int n = bn + b_outer[i];
                b_ptr[i] = b + (long long)n * ldb + b_inner[i];
                b_lim[i] = n < N ? K - b_inner[i] : -4;
#endif
            }
            const long long a_step = A_T ? BK * lda : BK;
            const long long b_step = B_T ? BK : BK * ldb;
            float4 a_reg[A_VECS], b_reg[B_VECS];

            // Issue the global loads of the K-tile starting at k0 into registers (zero outside the matrices).
            auto load_tile = [&](int k0) {
#pragma unroll
                for (int i = 0; i < A_VECS; ++i) {
                    const int valid = A_T ? (k0 < a_lim[i] ? clamp4(M - bm - a_inner[i]) : 0) : clamp4(a_lim[i] - k0);
                    a_reg[i] = load4(a_ptr[i], valid);
                    a_ptr[i] += a_step;
                }
#pragma unroll
                for (int i = 0; i < B_VECS; ++i) {
                    const int valid = B_T ? clamp4(b_lim[i] - k0) : (k0 < b_lim[i] ? clamp4(N - bn - b_inner[i]) : 0);
                    b_reg[i] = load4(b_ptr[i], valid);
                    b_ptr[i] += b_step;
                }
            };
            // Write the staged registers into shared-memory stage s (A transposed to [k][m]).
            auto store_tile = [&](int s) {
#pragma unroll
                for (int i = 0; i < A_VECS; ++i) {
#if A_T == 0
                    As[s][a_inner[i] + 0][a_outer[i]] = a_reg[i].x;
                    As[s][a_inner[i] + 1][a_outer[i]] = a_reg[i].y;
                    As[s][a_inner[i] + 2][a_outer[i]] = a_reg[i].z;
                    As[s][a_inner[i] + 3][a_outer[i]] = a_reg[i].w;
#else
                    *reinterpret_cast<float4*>(&As[s][a_outer[i]][a_inner[i]]) = a_reg[i];
#endif
                }
#pragma unroll
                for (int i = 0; i < B_VECS; ++i) {
#if B_T == 0
                    *reinterpret_cast<float4*>(&Bs[s][b_outer[i]][b_inner[i]]) = b_reg[i];
#else
                    Bs[s][b_inner[i] + 0][b_outer[i]] = b_reg[i].x;
                    Bs[s][b_inner[i] + 1][b_outer[i]] = b_reg[i].y;
                    Bs[s][b_inner[i] + 2][b_outer[i]] = b_reg[i].z;
                    Bs[s][b_inner[i] + 3][b_outer[i]] = b_reg[i].w;
#endif
                }
            };

            float acc[TM][TN];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

            if (num_k_tiles > 0) {
                // Prologue: the first tile goes straight to stage 0.
                load_tile(0);
                store_tile(0);
                __syncthreads();
            }
            for (int kt = 0; kt < num_k_tiles; ++kt) {
                const int s = kt & 1;
                const bool more = kt + 1 < num_k_tiles;
                if (more) load_tile((kt + 1) * BK);  // in flight while we compute below
#pragma unroll
                for (int k = 0; k < BK; ++k) {
                    float af[TM], bf[TN];
#pragma unroll
                    for (int i = 0; i < RM; ++i) {
                        const float4 v = *reinterpret_cast<const float4*>(&As[s][k][i * (BM / RM) + ty * 4]);
                        af[i * 4 + 0] = v.x; af[i * 4 + 1] = v.y; af[i * 4 + 2] = v.z; af[i * 4 + 3] = v.w;
                    }
#pragma unroll
                    for (int j = 0; j < RN; ++j) {
                        const float4 v = *reinterpret_cast<const float4*>(&Bs[s][k][j * (BN / RN) + tx * 4]);
                        bf[j * 4 + 0] = v.x; bf[j * 4 + 1] = v.y; bf[j * 4 + 2] = v.z; bf[j * 4 + 3] = v.w;
                    }
#pragma unroll
                    for (int i = 0; i < TM; ++i)
#pragma unroll
                        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(af[i], bf[j], acc[i][j]);
                }
                if (more) store_tile(s ^ 1);
                __syncthreads();  // stage s^1 complete for everyone; stage s free to be overwritten
            }

            // Epilogue: each row of a 4 x 4 block is one 16-byte store when it lies inside C (and C's rows
            // allow it), else up to 4 guarded scalar stores.
            const bool vec4 = VEC == 4 && fastmm_c_vec4(c, c_sm);
#pragma unroll
            for (int i = 0; i < RM; ++i)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int m = bm + i * (BM / RM) + ty * 4 + r;
                    if (m < M) {
                        float* crow = c + (long long)m * c_sm;
#pragma unroll
                        for (int j = 0; j < RN; ++j) {
                            const int n = bn + j * (BN / RN) + tx * 4;
                            const float4 v = make_float4(acc[i * 4 + r][j * 4 + 0], acc[i * 4 + r][j * 4 + 1],
                                                         acc[i * 4 + r][j * 4 + 2], acc[i * 4 + r][j * 4 + 3]);
                            fastmm_store4(crow, n, N, v, vec4);
                        }
                    }
                }
        }
    }
}
