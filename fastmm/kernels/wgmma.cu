// Rung 5b of the ladder: tensor cores through Hopper's warpgroup MMA (wgmma.mma_async, sm_90a), one TF32 pass
// ("medium") or three ("high", 3xTF32). mma.sync (tf32.cu) keeps the tensor pipe at most about a third busy on this
// GPU; wgmma reads both operands straight from shared memory, 64 x BN x 8 per instruction, while the warps go on.
//
// The operands come split: a pass over A and one over B (split.cu) write each value's TF32 big part and, for 3xTF32,
// its small part, as rows of whole 32-deep K-tiles, k contiguous (K-major: the only layout wgmma reads TF32 in),
// zero-padded to whole block tiles. So one kernel serves every layout (B, A^T and unaligned views are transposed or
// copied by the split pass), the main loop has no bounds checks, and each part is rounded once rather than once per
// block that reads it. The price is the split pass itself (read 4 bytes, write 8 per element, 3xTF32) and twice an
// FP32 kernel's reads in the main loop.
//
// Who computes what: a block of WGS = BM / 64 warpgroups computes a BM x BN tile of C, warpgroup w rows 64w to
// 64w + 63 across all BN columns, accumulated in registers in wgmma's layout: thread (warp v of the warpgroup, lane
// 4g + t) holds rows 16v + g and 16v + g + 8, columns 8j + 2t and 8j + 2t + 1 (j < BN / 8) of its warpgroup's tile.
//
// Shared memory: STAGES stages of [A big | B big | A small | B small], each a tile of rows of 128 bytes (one K-tile
// of 32 floats) in the 128-byte swizzle that wgmma's descriptors name: the 16-byte piece c of row r sits at piece
// c ^ (r % 8), so that the 8 rows an instruction reads at one k fall in distinct banks. cp.async copies the pieces
// (16 bytes, no bounds), one K-tile ahead of the one the tensor cores read.
//
// 3xTF32 sums each K-tile's twelve products (4 k-steps x 3 terms) in a fresh partial sum that is added to the
// accumulators on the FP32 cores, as tf32.cu does per k-step: the tensor cores' FP32 accumulation truncates, and
// chained over all of K its bias grows with K. Each K-tile waits for its own products before the add (ptxas
// serialises every wgmma of a kernel that reads an accumulator while a group may be in flight), so the stage it
// read is free once the next barrier passes: two stages suffice.
//
// Tiles whose rows of A or columns of B hold an infinity (flags set by split.cu) run FP32 FMAs on big + small
// instead: 3xTF32's cross terms would turn inf * (a value exact in TF32) into inf * 0 = NaN. Slow, and exact in its
// non-finite pattern; one TF32 pass needs no such care (big * big is what FP32 does with an infinity).
//
// Macros: BM (64 or 128: warpgroups x 64), BN (128 or 256), STAGES, PASSES (1 or 3), THREADS = BM * 2.
// Parameters (FASTMM_GEMM_PARAMS, reinterpreted): M, N the product's; K the padded K (a multiple of 32); A the big
// parts of A (rows of K floats), its small parts at A + a_sm; B the big parts of B^T, its small parts at B + b_sk;
// C and c_sm as for every product; split.cu's flags of A at A + a_sb0, of B^T at B + b_sb0.

#define BK 32
#define WGS (BM / 64)
#define NREG (BN / 2)  // accumulators per thread: 64 x BN over 128 threads
#define ROW_BYTES 128  // one K-tile of a row
#define TILE_A_BYTES (BM * ROW_BYTES)
#define TILE_B_BYTES (BN * ROW_BYTES)
#define BIG_BYTES (TILE_A_BYTES + TILE_B_BYTES)
#define STAGE_BYTES (PASSES == 3 ? 2 * BIG_BYTES : BIG_BYTES)  // big parts, then small ones for 3xTF32

static_assert(BM == 64 || BM == 128, "one or two warpgroups along m");
static_assert(BN == 128 || BN == 256, "wgmma's n: 128 or 256");
static_assert(PASSES == 1 || PASSES == 3, "one TF32 pass or three");
static_assert(STAGES >= 3 || (PASSES == 3 && PART_TILES == 1),
              "K-tile kt + 1 is copied while kt and, unless every K-tile waits for its products, kt - 1 are read");
static_assert(THREADS == WGS * 128, "128 threads per warpgroup");
static_assert((BM + BN) * 8 % THREADS == 0, "every thread copies the same number of 16-byte pieces");

__device__ __forceinline__ unsigned long long smem_descriptor(unsigned addr)
{
    // wgmma's shared-memory matrix descriptor: start address / 16 (bits 0-13), leading byte offset / 16 (16-29;
    // unused by K-major swizzled layouts, 1 by convention), stride byte offset / 16 (32-45: 1024 bytes from one
    // group of 8 rows to the next), swizzle mode (62-63: 1 = 128 bytes).
    return (unsigned long long)((addr & 0x3ffff) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32)
           | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// cp.async writes shared memory through the generic proxy, wgmma reads it through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// D (64 x BN, this warpgroup's) = A * B + (scale_d ? D : 0), A and B K-major in swizzled shared memory.
__device__ __forceinline__ void wgmma_n128(float (&d)[64], unsigned long long a, unsigned long long b, int scale_d)
{
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_n256(float (&d)[128], unsigned long long a, unsigned long long b, int scale_d)
{
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(a), "l"(b), "r"(scale_d));
}

#if BN == 128
#define wgmma_tile wgmma_n128
#else
#define wgmma_tile wgmma_n256
#endif

// Element (r, k) of a swizzled tile.
__device__ __forceinline__ float swizzled(const unsigned char* tile, int r, int k)
{
    return *reinterpret_cast<const float*>(tile + r * ROW_BYTES + (((k >> 2) ^ (r & 7)) << 4) + (k & 3) * 4);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
fastmm_wgmma(FASTMM_GEMM_PARAMS)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // Swizzled tiles must start on 1024-byte boundaries (the swizzle repeats every 8 rows of 128 bytes); the launch
    // asks for 1024 bytes more than the stages need.
    const unsigned raw = smem_addr(smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    unsigned char* const smem = smem_raw + (base - raw);

    const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const int k_tiles = K / BK;
    const float* a_rows = A + (long long)bm * K;
    const float* b_rows = B + (long long)bn * K;

    // Copies of K-tile kt into stage s: thread i copies piece i % 8 of rows i / 8, i / 8 + THREADS / 8, ... of each
    // tile (a warp: 4 whole rows, 512 contiguous bytes of global memory).
    const int piece = tid % 8, row0 = tid / 8;
    auto load = [&](int kt, int s) {
        const unsigned stage = base + s * STAGE_BYTES;
        const long long k = (long long)kt * BK + piece * 4;
#pragma unroll
        for (int i = 0; i < (BM + BN) * 8 / THREADS; ++i) {
            const bool is_a = i < BM * 8 / THREADS;  // known at compile time once unrolled
            const int r = row0 + (is_a ? i : i - BM * 8 / THREADS) * (THREADS / 8);
            const float* src = (is_a ? a_rows : b_rows) + r * (long long)K + k;
            const unsigned dst = stage + (is_a ? 0 : TILE_A_BYTES) + r * ROW_BYTES + ((piece ^ (r & 7)) << 4);
            cp_async16(dst, src, 16);
#if PASSES == 3
            cp_async16(dst + BIG_BYTES, src + (is_a ? a_sm : b_sk), 16);
#endif
        }
        cp_async_commit();
    };

    float acc[NREG];
#pragma unroll
    for (int i = 0; i < NREG; ++i) acc[i] = 0.0f;

#if PASSES == 3
    // Whether any 32 x 32 tile of this block's rows of A or columns of B holds an infinity (split.cu's flags,
    // [rows / 32][K / 32] per operand).
    int any = 0;
    {
        const int k_blocks = K / 32;
        const int* flags_a = reinterpret_cast<const int*>(A + a_sb0) + (long long)(bm / 32) * k_blocks;
        const int* flags_b = reinterpret_cast<const int*>(B + b_sb0) + (long long)(bn / 32) * k_blocks;
        for (int i = tid; i < BM / 32 * k_blocks; i += THREADS) any |= flags_a[i];
        for (int i = tid; i < BN / 32 * k_blocks; i += THREADS) any |= flags_b[i];
    }
    const bool special = __syncthreads_or(any);
#else
    constexpr bool special = false;
#endif

    // K-tile kt is read from stage kt % STAGES; K-tile kt + 1 is copied while the tensor cores run kt. Before the
    // copies of kt + 1 go into the stage that kt + 1 - STAGES was read from, the barrier has seen every warpgroup
    // finish that K-tile's products (3xTF32 waits for all of a K-tile's products, one pass for all but the newest).
    load(0, 0);
    if (!special) {
        const unsigned a_off = wg * 64 * ROW_BYTES;
#if PASSES == 3
        float part[NREG];
#endif
        for (int kt = 0; kt < k_tiles; ++kt) {
            cp_async_wait<0>();
            fence_proxy_async();
            __syncthreads();
            if (kt + 1 < k_tiles) load(kt + 1, (kt + 1) % STAGES);
            const unsigned stage = base + (kt % STAGES) * STAGE_BYTES;
            wgmma_fence();
#if PASSES == 3
            // The cross terms first, the large terms last: each wgmma adds to the partial sum with truncation, an
            // error of the sum's magnitude, so the K-tile's 8 small additions come while the sum is 2^11 times
            // smaller and only its 4 large ones at full size (measured at K = 64: 3.0e-7 interleaved, SGEMM 1.4e-7).
#pragma unroll
            for (int ks = 0; ks < BK / 8; ++ks) {
                const unsigned long long a_big = smem_descriptor(stage + a_off + ks * 32);
                const unsigned long long b_big = smem_descriptor(stage + TILE_A_BYTES + ks * 32);
                const unsigned long long a_small = smem_descriptor(stage + BIG_BYTES + a_off + ks * 32);
                const unsigned long long b_small = smem_descriptor(stage + BIG_BYTES + TILE_A_BYTES + ks * 32);
                wgmma_tile(part, a_big, b_small, ks > 0 || kt % PART_TILES != 0);
                wgmma_tile(part, a_small, b_big, 1);
            }
#pragma unroll
            for (int ks = 0; ks < BK / 8; ++ks)
                wgmma_tile(part, smem_descriptor(stage + a_off + ks * 32),
                           smem_descriptor(stage + TILE_A_BYTES + ks * 32), 1);
#else
#pragma unroll
            for (int ks = 0; ks < BK / 8; ++ks)
                wgmma_tile(acc, smem_descriptor(stage + a_off + ks * 32),
                           smem_descriptor(stage + TILE_A_BYTES + ks * 32), 1);
#endif
            wgmma_commit();
#if PASSES == 3
            // ptxas serialises every wgmma of a kernel that reads an accumulator while any group may be in flight
            // (it does not follow wait_group 1 across iterations): the partial sum waits for all of them.
            if ((kt + 1) % PART_TILES == 0 || kt + 1 == k_tiles) {
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < NREG; ++i) acc[i] += part[i];
            } else {
                wgmma_wait<1>();
            }
#else
            wgmma_wait<1>();  // K-tile kt - 1's products are done: its stage is free for the copies of kt + 2
#endif
        }
        wgmma_wait<0>();
    }
#if PASSES == 3
    else {
        // FP32 FMAs on big + small (exact for an infinity, whose small part is 0), from the same stages.
        const int ra = wg * 64 + warp * 16 + g;
        for (int kt = 0; kt < k_tiles; ++kt) {
            cp_async_wait<0>();
            __syncthreads();
            if (kt + 1 < k_tiles) load(kt + 1, (kt + 1) % STAGES);
            const unsigned char* stage = smem + (kt % STAGES) * STAGE_BYTES;
            for (int k = 0; k < BK; ++k) {
                float a[2];
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    a[h] = swizzled(stage, ra + 8 * h, k) + swizzled(stage + BIG_BYTES, ra + 8 * h, k);
#pragma unroll
                for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int n = 8 * j + 2 * t + e;
                        const float b = swizzled(stage + TILE_A_BYTES, n, k)
                                        + swizzled(stage + BIG_BYTES + TILE_A_BYTES, n, k);
                        acc[4 * j + e] = fmaf(a[0], b, acc[4 * j + e]);
                        acc[4 * j + 2 + e] = fmaf(a[1], b, acc[4 * j + 2 + e]);
                    }
            }
        }
    }
#endif
    cp_async_wait<0>();  // nothing may still be writing shared memory when the block exits

    const bool vec = fastmm_c_vec4(C, c_sm);
    const int m = bm + wg * 64 + warp * 16 + g;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int n = bn + 8 * j + 2 * t;
        if (m < M) fastmm_store2(C + (long long)m * c_sm, n, N, acc[4 * j], acc[4 * j + 1], vec);
        if (m + 8 < M) fastmm_store2(C + (long long)(m + 8) * c_sm, n, N, acc[4 * j + 2], acc[4 * j + 3], vec);
    }
}
