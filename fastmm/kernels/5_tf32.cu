// Rung 5 of the ladder: tensor cores. mma.sync m16n8k8 TF32, either one pass ("medium": each operand rounded to
// TF32, 10 mantissa bits) or three ("high", 3xTF32: FP32 accuracy from TF32 tensor cores).
//
// 3xTF32: every FP32 operand x is split into big = tf32(x) and small = tf32(x - big), and a product is
// accumulated in FP32 as a_small * b_big + a_big * b_small + a_big * b_big; the dropped a_small * b_small is
// below 2^-22 of a_big * b_big. The split is done in registers, on fragments read from shared memory, so global
// and shared memory traffic are those of a plain FP32 kernel. (The method: CUTLASS's examples 27 and 28 and
// Triton's input_precision="tf32x3"; the code here is fastmm's own.)
//
// Non-finite inputs keep NumPy's pattern. For x = inf, x - big is inf - inf = NaN, and a cross term
// a_big * b_small is inf * 0 = NaN whenever the other operand is exact in TF32 (b_small = 0): so for an infinite
// x the small part is 0 and the cross terms use 0 in place of big ("cross"), and only a_big * b_big sees the inf
// (inf * 0 there is NaN, as in FP32). NaNs propagate through every term. Rounding to TF32 must not change what a
// product does with x otherwise either: see tf32_big (near FLT_MAX, below 2^-137, NaN payloads).
//
// Who computes what: a block of THREADS = (BM/WM) * (BN/WN) * 32 threads computes a BM x BN tile of C; each warp
// a WM x WN warp tile of (WM/16) x (WN/8) mma tiles, accumulated in registers in the mma's C layout: lane l holds
// rows g = l / 4 and g + 8, columns 2t and 2t + 1 (t = l % 4) of each 16 x 8 tile.
//
// Shared memory and copies are the warp-tiled kernel's (pipeline.cuh): STAGES BK-deep stages, A as As[k][m] and
// B as Bs[k][n] with rows padded by PAD = 8 floats, filled by cp.async (16-byte copies along m or n, 4-byte
// transposing copies along k), zero past the matrix edges. With rows of BM + 8 (BN + 8) floats, the mma
// fragments' reads are conflict-free: lane (g, t) reads word t * (BM + 8) + g, i.e. bank 8t + g. (With the SIMT
// kernels' PAD = 4, banks 4t + g, every read was a two-way conflict: measured with ncu, 2 wavefronts per load.)
// The transposing copies stay conflict-free: a warp writes 8 k by 4 m, banks 8k + m.
//
// Rounding: on a k-step where no operand value of the warp is infinite, NaN or within half a TF32 step of FLT_MAX
// (one compare per value and one vote per warp), a value rounds to TF32 by integer arithmetic (add half a step,
// clear the low 13 bits: ties away from zero, as cvt.rna) and tiny values (below 2^-137) round to 0, which only
// matters next to an infinity; otherwise the whole warp takes the careful path (tf32_big, split3). With the careful
// path on every value, ncu counted 17 instructions per mma and the tensor pipe 11% busy (one pass, 4096^3, H100);
// with the vote, 6.5 and 31%.
//
// Macros: THREADS, PAD, BM, BN, BK, WM, WN, STAGES, MIN_BLOCKS, PASSES (1 or 3), SUB_K (0: no sub-slices), and the
// layout: A_T = 1 when A has unit stride along m, B_T = 1 when B has unit stride along k, VEC = 4 when 16-byte
// copies of the operands copied along their unit stride (A where A_T = 1, B where B_T = 0) are legal (else 4-byte
// copies; pipeline.cuh copies the others 4 bytes at a time, transposing); C's 8-byte stores are decided per block.

#define MT (WM / 16)   // mma tiles per warp along m
#define NT (WN / 8)    // ... along n
#define LDA_S (BM + PAD)
#define LDB_S (BN + PAD)
#define STAGE_FLOATS (BK * (LDA_S + LDB_S))

static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 8 == 0, "tiles must nest in 16 x 8 mma tiles");
static_assert(THREADS == (BM / WM) * (BN / WN) * 32, "one warp per warp tile");
static_assert(BK % 8 == 0 && STAGES >= 2, "BK a multiple of the mma's k = 8; at least two stages");
static_assert(PASSES == 1 || PASSES == 3, "one TF32 pass or three");
static_assert(VEC == 4 || VEC == 1, "VEC is 4 (16-byte copies) or 1 (4-byte copies)");

// d += a * b on one 16 x 8 x 8 tile.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2])
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a * b over one k-step of 3xTF32, from the parts of a and b: big, small and big as the cross terms use it.
// The three terms go into a fresh partial sum, added to d on the FP32 cores (rounded to nearest). The tensor
// cores' own FP32 accumulation truncates: chained over all of K, that bias grew the error linearly with K
// (measured on an H100: 7e-6 at K = 1024 and 5.7e-5 at 8192, against cuBLAS SGEMM's 5.7e-7 and 1.6e-6);
// truncated over 24 products only, it stays below the FP32 rounding of the sum.
// The large term first: a cross term can only overflow when its large term (2^10 times larger) has overflowed
// already, with the product's sign; added first, the small terms' own overflow (of either sign, as the small
// parts' signs are the rounding's) cannot turn +inf into NaN.
__device__ __forceinline__ void three_terms(float (&d)[4], const unsigned (&a_big)[4], const unsigned (&a_small)[4],
                                            const unsigned (&a_cross)[4], const unsigned (&b_big)[2],
                                            const unsigned (&b_small)[2], const unsigned (&b_cross)[2])
{
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_tf32(part, a_big, b_big);
    mma_tf32(part, a_small, b_cross);
    mma_tf32(part, a_cross, b_small);
#pragma unroll
    for (int r = 0; r < 4; ++r) d[r] += part[r];
}

// One k-step (k = 8) of the warp tile: acc += A's fragments x times B's fragments, this lane's at b0[j * 8] and
// b4[j * 8] (k = t and t + 4) for n tile j. PLAIN: the warp's values are all plain, rounded by tf32_near; else
// the careful split (split3), which keeps NumPy's non-finite pattern. (B's values are read from shared memory
// again rather than passed from the vote: the compiler may keep the vote's reads, and it is free to.)
template <bool PLAIN>
__device__ __forceinline__ void k_step(float (&acc)[MT][NT][4], const float (&x)[MT][4], const float* b0,
                                       const float* b4)
{
#if PASSES == 3
    if (PLAIN) {
        // A's parts made once and used for every n tile, B's one n tile at a time (within the register budget
        // of the widest warp tiles); plain values are finite, so the cross terms' big parts are the big parts.
        unsigned a_big[MT][4], a_small[MT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                a_big[i][r] = tf32_near(x[i][r]);
                a_small[i][r] = tf32_near(x[i][r] - __uint_as_float(a_big[i][r]));
            }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            unsigned b_big[2], b_small[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                b_big[r] = tf32_near(r ? b4[j * 8] : b0[j * 8]);
                b_small[r] = tf32_near((r ? b4[j * 8] : b0[j * 8]) - __uint_as_float(b_big[r]));
            }
#pragma unroll
            for (int i = 0; i < MT; ++i) three_terms(acc[i][j], a_big[i], a_small[i], a_big[i], b_big, b_small, b_big);
        }
    } else {
        // Rare (a non-finite value or one near FLT_MAX in the warp's k-step): A's parts are remade for every n
        // tile, which holds fewer registers than the plain path (a second copy of that path made the kernel
        // spill).
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            unsigned b_big[2], b_cross[2], b_small[2];
            split3(b0[j * 8], b_big[0], b_cross[0], b_small[0]);
            split3(b4[j * 8], b_big[1], b_cross[1], b_small[1]);
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                unsigned a_big[4], a_cross[4], a_small[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) split3(x[i][r], a_big[r], a_cross[r], a_small[r]);
                three_terms(acc[i][j], a_big, a_small, a_cross, b_big, b_small, b_cross);
            }
        }
    }
#else
    unsigned a_big[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) a_big[i][r] = PLAIN ? tf32_near(x[i][r]) : tf32_big(x[i][r]);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const unsigned b_big[2] = {PLAIN ? tf32_near(b0[j * 8]) : tf32_big(b0[j * 8]),
                                   PLAIN ? tf32_near(b4[j * 8]) : tf32_big(b4[j * 8])};
#pragma unroll
        for (int i = 0; i < MT; ++i) mma_tf32(acc[i][j], a_big[i], b_big);
    }
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
fastmm_tf32(FASTMM_GEMM_PARAMS)
{
    extern __shared__ __align__(16) float smem[];  // STAGES x (As[BK][LDA_S], Bs[BK][LDB_S])

    FASTMM_PIPELINE_WARP;
    const int g = lane / 4, t = lane % 4;  // the mma fragments' group and thread in group
    FASTMM_PIPELINE_TILE(smem);

    // The copies of the next K-tile into its stage form one cp.async group (empty past the last tile, so that
    // every thread commits the same number of groups and wait_group counts stay uniform).
    int next_kt = 0;
    unsigned write_stage = 0;
    auto issue_next = [&]() {
        if (next_kt < num_k_tiles) {
            const int k_left = K - next_kt * BK;
#pragma unroll
            for (int i = 0; i < CopyA::COUNT; ++i) copy_a.copy(i, write_stage, lda, m_left, k_left);
#pragma unroll
            for (int i = 0; i < CopyB::COUNT; ++i) copy_b.copy(i, write_stage, ldb, n_left, k_left);
        }
        copy_a.next_slice(lda);
        copy_b.next_slice(ldb);
        ++next_kt;
        write_stage = write_stage == (STAGES - 1) * STAGE_BYTES ? 0 : write_stage + STAGE_BYTES;
        cp_async_commit();
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue_next();

    const float* stage = smem;  // the stage of K-tile kt
    for (int kt = 0; kt < num_k_tiles; ++kt) {
        // K-tile kt has landed once at most STAGES - 2 younger groups are pending; the barrier publishes it and
        // frees the stage read during kt - 1, which the copies of K-tile kt + STAGES - 1 refill now.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        issue_next();
        const float* As = stage + wm0 + g;
        const float* Bs = stage + BK * LDA_S + wn0 + g;
        // One k-step at a time: unrolled, the compiler hoisted the next step's reads and splits over this one's
        // mmas and ran out of registers (the 128 x 256 tiles spilled).
#pragma unroll 1
        for (int ks = 0; ks < BK / 8; ++ks) {
            const int k0 = (ks * 8 + t) * LDA_S, k4 = (ks * 8 + t + 4) * LDA_S;
            const int j0 = (ks * 8 + t) * LDB_S, j4 = (ks * 8 + t + 4) * LDB_S;
            // This lane's values of the k-step: A's fragments (rows g and g + 8, k = t and t + 4) for every m
            // tile, B's (k = t and t + 4, column g) for every n tile.
            float x[MT][4];
            bool all_plain = true;
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                x[i][0] = As[k0 + i * 16];
                x[i][1] = As[k0 + i * 16 + 8];
                x[i][2] = As[k4 + i * 16];
                x[i][3] = As[k4 + i * 16 + 8];
#pragma unroll
                for (int r = 0; r < 4; ++r) all_plain &= plain(x[i][r]);
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) all_plain &= plain(Bs[j0 + j * 8]) & plain(Bs[j4 + j * 8]);
            if (__all_sync(0xffffffffu, all_plain)) {
                k_step<true>(acc, x, Bs + j0, Bs + j4);
            } else {
                k_step<false>(acc, x, Bs + j0, Bs + j4);
            }
        }
        stage = stage == smem + (STAGES - 1) * STAGE_FLOATS ? smem : stage + STAGE_FLOATS;
    }
    cp_async_wait<0>();  // nothing may still be writing shared memory when the block exits

    const bool vec = VEC == 4 && fastmm_c_vec4(c, c_sm);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const int m = bm + wm0 + i * 16 + g;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int n = bn + wn0 + j * 8 + 2 * t;
            if (m < M) fastmm_store2(c + (long long)m * c_sm, n, N, acc[i][j][0], acc[i][j][1], vec);
            if (m + 8 < M) fastmm_store2(c + (long long)(m + 8) * c_sm, n, N, acc[i][j][2], acc[i][j][3], vec);
        }
    }
}
