// Rung 5b of the ladder: tensor cores through Hopper's warpgroup MMA (wgmma.mma_async, sm_90a), one TF32 pass
// ("medium") or three ("high", 3xTF32). mma.sync (5_tf32.cu) keeps the tensor pipe at most about a third busy on this
// GPU; wgmma reads both operands straight from shared memory, 64 x BN x 8 per instruction, while the warps go on.
//
// The operands come split: a pass over A and one over B (pass_tf32_split.cu) write each value's TF32 big part and, for 3xTF32,
// its small part, K-major (the only layout wgmma reads TF32 in), zero-padded, as block tiles of 32-deep K-tiles each
// already in the 128-byte swizzle that wgmma's descriptors name, big part then small part. So one kernel serves every
// layout (B, A^T and unaligned views are transposed or copied by the split pass), the main loop has no bounds checks,
// each part is rounded once rather than once per block that reads it, and one stage of one operand is one contiguous
// run of global memory: a single bulk copy (cp.async.bulk, the TMA engine's one-dimensional form, which needs no
// tensor map built on the host) brings it in.
//
// Specialised warps: warpgroup WGS only copies (one thread issues two bulk copies per K-tile), warpgroups 0 .. WGS-1
// only multiply, and they meet at barriers in shared memory (mbarrier), a "full" and an "empty" one per stage. A
// multiplying warpgroup waits for its stage to be full, runs its products, waits for them, marks the stage empty and
// adds its partial sum; the copier refills a stage once both warpgroups have marked it. The first version of this
// kernel had every thread copy its share with cp.async and met at a block-wide barrier per K-tile: both warpgroups then
// waited for their products and added their partial sums at the same moment, and the tensor pipe was busy 65% of the
// time (docs/kernels/wgmma.md). Here one warpgroup's products keep it busy while the other adds.
//
// Who computes what: warpgroup w computes rows 64w to 64w + 63 of the BM x BN block tile across all BN columns,
// accumulated in registers in wgmma's layout: thread (warp v of the warpgroup, lane 4g + t) holds rows 16v + g and
// 16v + g + 8, columns 8j + 2t and 8j + 2t + 1 (j < BN / 8) of its warpgroup's tile.
//
// 3xTF32 sums each K-tile's twelve products (4 k-steps x 3 terms) in a fresh partial sum that is added to the
// accumulators on the FP32 cores, as 5_tf32.cu does per k-step: the tensor cores' FP32 accumulation truncates, and
// chained over all of K its bias grows with K. ptxas serialises every wgmma of a kernel that reads an accumulator
// while a group may be in flight, so each K-tile waits for its own products before the add.
//
// Tiles whose rows of A or columns of B hold an infinity (flags set by pass_tf32_split.cu) run FP32 FMAs on big + small
// instead: 3xTF32's cross terms would turn inf * (a value exact in TF32) into inf * 0 = NaN. Slow, and exact in its
// non-finite pattern; one TF32 pass needs no such care (big * big is what FP32 does with an infinity) where the split
// pass rounds. Through a tensor map the engine rounds, without the split pass's care for inf times a value below
// TF32's smallest step, a NaN with a low payload and values next to FLT_MAX: a block tile that stores a non-finite
// value flags itself, and pass_nonfinite_fix.cu computes those elements again in FP32.
//
// One TF32 pass with A_TMA or B_TMA: that operand is not split beforehand. A row-major A (or a B given as B^T
// row-major, as in x @ x.T) is K-major already, and a tensor map of type TFLOAT32 has the TMA engine round each value
// to TF32 (to nearest, ties to even) as it copies a 32-deep K-tile of the block's rows into the stage, in the same
// 128-byte swizzle, zeros past the edges: the split pass and its workspace go. (Copied by cp.async, 128 bytes from
// each of 128 rows and rounded in shared memory, A cost more than its split pass: docs/history.md.) The maps are the
// parameters after FASTMM_GEMM_PARAMS, A's first; the operand's pointer is not read.
//
// One TF32 pass with A_RS: A comes from registers (wgmma's register operand), so it may lie along M: A's rows
// contiguous along M, as B^T's are in C^T = B^T A^T, which is how fastmm runs A @ B with B's rows along N (TF32 wgmma
// reads no such operand from shared memory; gemm.py swaps the operands and writes C transposed, c_sn its row stride).
// A tensor map of A's K x M view copies 32 x 32 boxes (rounded to TF32, 128-byte swizzle) into the stage, and each
// thread reads its fragment from them: K-tile by K-tile, all four k-steps' fragments, then the products, waited for
// before the registers are read again (the other warpgroup's products keep the tensor cores busy meanwhile).
//
// Macros (A_RS above): BM (64 or 128: multiplying warpgroups x 64), BN (128 or 256), STAGES, PASSES (1 or 3), GROUP (rows of
// block tiles per group of the launch order), THREADS = BM * 2 + 128, A_TMA and B_TMA (0 or 1). Parameters (FASTMM_GEMM_PARAMS, reinterpreted):
// M, N the product's; K the padded K (a multiple of 32); A, B pass_tf32_split.cu's tiles of A and of B^T; C and c_sm as for
// every product; pass_tf32_split.cu's flags of A at A + a_sb0, of B^T at B + b_sb0.

#define BK 32
#define WGS (BM / 64)  // multiplying warpgroups; warpgroup WGS copies
#define NREG (BN / 2)
#define PARTS (PASSES == 3 ? 2 : 1)
#define TILE_A_BYTES (BM * 128)  // one part of one K-tile of A's block tile
#define TILE_B_BYTES (BN * 128)
#define STAGE_A_BYTES (PARTS * TILE_A_BYTES)
#define STAGE_BYTES (STAGE_A_BYTES + PARTS * TILE_B_BYTES)

static_assert(BM == 64 || BM == 128, "one or two multiplying warpgroups along m");
static_assert(BN == 128 || BN == 256, "wgmma's n: 128 or 256");
static_assert(PASSES == 1 || PASSES == 3, "one TF32 pass or three");
static_assert(STAGES >= 2, "a stage filling while another is read");
static_assert(THREADS == (WGS + 1) * 128, "128 threads per warpgroup, one warpgroup copying");
#ifndef A_TMA
#define A_TMA 0
#endif
#ifndef B_TMA
#define B_TMA 0
#endif
#ifndef A_RS
#define A_RS 0
#endif
#define A_MAP (A_TMA || A_RS)
static_assert(!(A_MAP || B_TMA) || PASSES == 1, "tensor maps: one TF32 pass (the engine rounds; no small part)");
static_assert(!(A_TMA && A_RS), "A through one map: K-major into wgmma's descriptors, or M-major into registers");
static_assert(!A_RS || THREADS == 384, "setmaxnreg's 40 / 232 balance the registers of 384 threads at 168 each");

extern "C" __global__ void __launch_bounds__(THREADS, 1)
#if A_MAP && B_TMA
fastmm_wgmma(FASTMM_GEMM_PARAMS, const __grid_constant__ fastmm_tensor_map a_map,
             const __grid_constant__ fastmm_tensor_map b_map)
#elif A_MAP
fastmm_wgmma(FASTMM_GEMM_PARAMS, const __grid_constant__ fastmm_tensor_map a_map)
#elif B_TMA
fastmm_wgmma(FASTMM_GEMM_PARAMS, const __grid_constant__ fastmm_tensor_map b_map)
#else
fastmm_wgmma(FASTMM_GEMM_PARAMS)
#endif
{
    // The stages, then the barriers (full[s], then empty[s]); swizzled tiles start on 1024-byte boundaries, so the
    // launch asks for 1024 bytes more than stages and barriers need.
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const unsigned raw = smem_addr(smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
#if PASSES == 3 || A_RS
    const unsigned char* const smem = smem_raw + (base - raw);  // generic: the FP32 path and A_RS read the stages
#endif
    const unsigned full0 = base + STAGES * STAGE_BYTES, empty0 = full0 + 8 * STAGES;

    const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    // Blocks start in launch order, x fastest: taken as they come, a wave of blocks would be one or two rows of
    // block tiles that read all of B, which does not stay in L2 for large products. So launch order walks groups of
    // GROUP rows of block tiles column by column: a wave of W blocks covers GROUP rows and W / GROUP columns.
    int by = blockIdx.y, bx = blockIdx.x;
    if (GROUP > 1) {
        const int lin = blockIdx.y * gridDim.x + blockIdx.x, first = lin / (GROUP * gridDim.x) * GROUP;
        const int rows = min(GROUP, (int)gridDim.y - first), in = lin % (GROUP * gridDim.x);
        by = first + in % rows;
        bx = in / rows;
    }
    const int bm = by * BM, bn = bx * BN;
    const int k_tiles = K / BK;

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full0 + 8 * s, 1);             // the copier's arrival, plus the copies' bytes
            mbar_init(empty0 + 8 * s, WGS * 128);    // every multiplying thread, once its products are done
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }

#if PASSES == 3
    // Whether any 32 x 32 tile of this block's rows of A or columns of B holds an infinity (pass_tf32_split.cu's flags).
    int any = 0;
    {
        const int k_blocks = K / 32;
        const int* flags_a = reinterpret_cast<const int*>(A + a_sb0) + (long long)(bm / 32) * k_blocks;
        const int* flags_b = reinterpret_cast<const int*>(B + b_sb0) + (long long)(bn / 32) * k_blocks;
        for (int i = tid; i < BM / 32 * k_blocks; i += THREADS) any |= flags_a[i];
        for (int i = tid; i < BN / 32 * k_blocks; i += THREADS) any |= flags_b[i];
    }
    const bool special = __syncthreads_or(any);  // also publishes the barriers' initialisation
#else
    constexpr bool special = false;
    __syncthreads();
#endif

    if (wg == WGS) {
#if A_RS
        // Registers to the multiplying warpgroups, which hold A's fragments besides the accumulators (without it,
        // ptxas spilled at the 168 a thread that one block of 384 threads gets).
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
#endif
        // The copier: K-tile kt into stage kt % STAGES once both warpgroups are done with what it held.
        if (tid % 128 == 0) {
#if A_MAP
            tensor_map_prefetch(&a_map);
#else
            const char* a_tiles = reinterpret_cast<const char*>(A) + (long long)by * k_tiles * STAGE_A_BYTES;
#endif
#if B_TMA
            tensor_map_prefetch(&b_map);
#else
            const char* b_tiles = reinterpret_cast<const char*>(B) + (long long)bx * k_tiles * (PARTS * TILE_B_BYTES);
#endif
            for (int kt = 0; kt < k_tiles; ++kt) {
                const int s = kt % STAGES;
                if (kt >= STAGES) mbar_wait(empty0 + 8 * s, (kt / STAGES - 1) & 1);
                const unsigned stage = base + s * STAGE_BYTES;
                mbar_expect(full0 + 8 * s, STAGE_BYTES);
#if A_TMA
                tensor_copy_2d(stage, &a_map, kt * BK, bm, full0 + 8 * s);  // BM rows x 32, the full box counted
#elif A_RS
                for (int b = 0; b < BM / 32; ++b)  // 32 k x 32 rows of A each (A's K x M view: M innermost)
                    tensor_copy_2d(stage + 4096 * b, &a_map, bm + 32 * b, kt * BK, full0 + 8 * s);
#else
                bulk_copy(stage, a_tiles + (long long)kt * STAGE_A_BYTES, STAGE_A_BYTES, full0 + 8 * s);
#endif
#if B_TMA
                tensor_copy_2d(stage + STAGE_A_BYTES, &b_map, kt * BK, bn, full0 + 8 * s);  // BN rows of B^T x 32
#else
                bulk_copy(stage + STAGE_A_BYTES, b_tiles + (long long)kt * (PARTS * TILE_B_BYTES),
                          PARTS * TILE_B_BYTES, full0 + 8 * s);
#endif
            }
        }
        return;  // the multiplying warpgroups wait for every copy before they read it, and so before they exit
    }

#if A_RS
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
#endif
    float acc[NREG];
#pragma unroll
    for (int i = 0; i < NREG; ++i) acc[i] = 0.0f;
    const unsigned a_off = wg * 64 * 128;

    if (!special) {
#if PASSES == 3
        float part[NREG];
#endif
        for (int kt = 0; kt < k_tiles; ++kt) {
            const int s = kt % STAGES;
            mbar_wait(full0 + 8 * s, (kt / STAGES) & 1);
            const unsigned stage = base + s * STAGE_BYTES;
            const unsigned a_big = stage + a_off, b_big = stage + STAGE_A_BYTES;
#if A_RS
            (void)a_big;  // (A's fragments come from registers)
            // This thread's fragments of its warpgroup's 64 rows, all four k-steps: box r / 32, row k, column r % 32.
            unsigned frag[BK / 8][4];
            {
                const unsigned char* a_tile = smem + s * STAGE_BYTES;
#pragma unroll
                for (int ks = 0; ks < BK / 8; ++ks)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int r = wg * 64 + warp * 16 + g + 8 * (i & 1), k = ks * 8 + t + 4 * (i >> 1);
                        frag[ks][i] = __float_as_uint(swizzled(a_tile + (r >> 5) * 4096, k, r & 31));
                    }
            }
#endif
            wgmma_fence();
#if PASSES == 3
            // The cross terms first, the large terms last: each wgmma adds to the partial sum with truncation, an
            // error of the sum's magnitude, so the K-tile's 8 small additions come while the sum is 2^11 times
            // smaller and only its 4 large ones at full size (measured at K = 64: 3.0e-7 interleaved, SGEMM 1.4e-7).
#pragma unroll
            for (int ks = 0; ks < BK / 8; ++ks) {
                wgmma_tile(part, smem_descriptor(a_big + ks * 32), smem_descriptor(b_big + TILE_B_BYTES + ks * 32),
                           ks > 0);
                wgmma_tile(part, smem_descriptor(a_big + TILE_A_BYTES + ks * 32), smem_descriptor(b_big + ks * 32),
                           1);
            }
#pragma unroll
            for (int ks = 0; ks < BK / 8; ++ks)
                wgmma_tile(part, smem_descriptor(a_big + ks * 32), smem_descriptor(b_big + ks * 32), 1);
            wgmma_commit();
            wgmma_wait<0>();
            mbar_arrive(empty0 + 8 * s);
#pragma unroll
            for (int i = 0; i < NREG; ++i) acc[i] += part[i];
#elif A_RS
#pragma unroll
            for (int ks = 0; ks < BK / 8; ++ks)
                wgmma_rs_tile(acc, frag[ks], smem_descriptor(b_big + ks * 32), 1);
            wgmma_commit();
            wgmma_wait<0>();  // frag is read until the products are done; then the stage may be refilled
#pragma unroll
            for (int ks = 0; ks < BK / 8; ++ks)
#pragma unroll
                for (int i = 0; i < 4; ++i)  // (live until here: their registers must not be reused before the wait)
                    asm volatile("" : "+r"(frag[ks][i])::"memory");
            mbar_arrive(empty0 + 8 * s);
#else
#pragma unroll
            for (int ks = 0; ks < BK / 8; ++ks)
                wgmma_tile(acc, smem_descriptor(a_big + ks * 32), smem_descriptor(b_big + ks * 32), 1);
            wgmma_commit();
            wgmma_wait<1>();  // K-tile kt - 1's products are done: its stage may be refilled
            if (kt > 0) mbar_arrive(empty0 + 8 * ((kt - 1) % STAGES));
#endif
        }
        wgmma_wait<0>();
    }
#if PASSES == 3
    else {
        // FP32 FMAs on big + small (exact for an infinity, whose small part is 0), from the same stages.
        const int ra = wg * 64 + warp * 16 + g;
        for (int kt = 0; kt < k_tiles; ++kt) {
            const int s = kt % STAGES;
            mbar_wait(full0 + 8 * s, (kt / STAGES) & 1);
            const unsigned char* a_tile = smem + s * STAGE_BYTES;
            const unsigned char* b_tile = a_tile + STAGE_A_BYTES;
            for (int k = 0; k < BK; ++k) {
                float a[2];
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    a[h] = swizzled(a_tile, ra + 8 * h, k) + swizzled(a_tile + TILE_A_BYTES, ra + 8 * h, k);
#pragma unroll
                for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int n = 8 * j + 2 * t + e;
                        const float b = swizzled(b_tile, n, k) + swizzled(b_tile + TILE_B_BYTES, n, k);
                        acc[4 * j + e] = fmaf(a[0], b, acc[4 * j + e]);
                        acc[4 * j + 2 + e] = fmaf(a[1], b, acc[4 * j + 2 + e]);
                    }
            }
            mbar_arrive(empty0 + 8 * s);
        }
    }
#endif

#if A_MAP || B_TMA
    // The guard of the maps' rounding (pass_nonfinite_fix.cu): a block tile that stores a non-finite value flags
    // itself with this call's mark (c_sb1: the flags' address, c_sb0: the tiles in a row, a_sb1: the mark), so the
    // flags need no zeroing first (a stale mark only has the guard look at a tile's values again); finite data costs
    // the test alone.
    bool bad = false;
#pragma unroll
    for (int i = 0; i < NREG; ++i) bad |= !isfinite(acc[i]);
    if (__any_sync(0xffffffffu, bad) && lane == 0)
        reinterpret_cast<int*>(c_sb1)[(long long)by * c_sb0 + bx] = (int)a_sb1;
#endif
    const int m = bm + wg * 64 + warp * 16 + g;
    if (c_sn != 1) {  // C^T = B^T A^T: this tile's rows are C's columns (lanes g write 8 consecutive floats of C)
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int n = bn + 8 * j + 2 * t + e;
                if (n >= N) continue;
                if (m < M) C[(long long)m * c_sm + (long long)n * c_sn] = acc[4 * j + e];
                if (m + 8 < M) C[(long long)(m + 8) * c_sm + (long long)n * c_sn] = acc[4 * j + 2 + e];
            }
        return;
    }
    const bool vec = fastmm_c_vec4(C, c_sm);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int n = bn + 8 * j + 2 * t;
        if (m < M) fastmm_store2(C + (long long)m * c_sm, n, N, acc[4 * j], acc[4 * j + 1], vec);
        if (m + 8 < M) fastmm_store2(C + (long long)(m + 8) * c_sm, n, N, acc[4 * j + 2], acc[4 * j + 3], vec);
    }
}
