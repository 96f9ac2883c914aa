// Rung 8 of the ladder: INT8 products on Hopper's warpgroup MMA (wgmma.mma_async ... .s32.s8.s8, sm_90a), the products
// of Ozaki scheme II (fastmm/_plan/ozaki.py): for each batch item z, C[z] (M x N, int32, rows c_sm apart) = A[z] (M x K,
// int8) @ B[z] (K x N, int8), exact (int32 sums wrap past 2^31: K * 128 * 128 must stay below it, ozaki.MAX_EXACT_K).
// Ozaki-II multiplies the same shapes once per modulus, so a batch item is one modulus's residues: blockIdx.z picks
// it, and A, B and C advance by their batch strides.
//
// The operands come as tiles, written by whoever makes the int8 values (fastmm/_plan/ozaki.py's `tiles` says the
// layout; the Ozaki passes write residues in it directly): A, and B as B^T, each K-major (the only layout wgmma reads
// 8-bit integers in), zero-padded, cut into block tiles of T rows (BM for A, BN for B^T) by K-tiles of 128 values,
// tile (r / T, k / 128) at byte (r / T * (K / 128) + k / 128) * T * 128, each T rows of 128 bytes in the 128-byte
// swizzle that wgmma's descriptors name (the 16-byte piece q of row rr at piece q ^ (rr % 8)). That is 6_wgmma.cu's
// layout byte for byte (a 128-byte row holds 32 floats there, 128 int8 values here), so the same descriptors, the same
// bulk copies and the same specialised warps serve: one stage of one operand is one contiguous run of global memory,
// one bulk copy; warpgroup WGS copies, warpgroups 0 .. WGS-1 multiply, and they meet at a "full" and an "empty"
// barrier per stage (6_wgmma.cu's top says why this shape).
//
// Clusters (CLUSTER = 2): the two blocks of a thread-block cluster take block tiles one above the other, which read the
// same tile of B^T. Each copies its own tile of A and half of that tile of B^T into both blocks' stages at once (a
// multicast bulk copy), so each K-tile costs an SM 32 KiB from L2 instead of 48: at INT8's rate a 128 x 256 block
// tile needs as many bytes per second as FP16 GEMM's, more than L2 gives every SM without sharing. A stage is then
// refilled only once the multiplying warps of both blocks are done with it (their "empty" arrivals go to both
// blocks' barriers), and neither block leaves before the other is done with its barriers.
//
// Who computes what: warpgroup w computes rows 64w to 64w + 63 of the BM x BN block tile across all BN columns in
// int32 registers, wgmma's layout: thread (warp v of the warpgroup, lane 4g + t) holds rows 16v + g and 16v + g + 8,
// columns 8j + 2t and 8j + 2t + 1 (j < BN / 8). Exact sums need no partial sums: the accumulators chain over all of K.
//
// Macros: BM (64 or 128: multiplying warpgroups x 64), BN (128 or 256), STAGES, GROUP (rows of clusters per group of
// the launch order), CLUSTER (1 or 2 blocks along m; the grid's y a multiple of it), THREADS = BM * 2 + 128, RESIDUES
// (1: C is uint8, each sum reduced modulo MODULI's z-th, z the batch item: the reconstruction pass reads a quarter of
// int32's bytes; NMODULI, MODULI as the Ozaki passes have them), PERSISTENT (1: a grid of about one block per SM along
// x, each walking tiles gridDim.x apart of its batch item, so that the copies of the next tile overlap the epilogue of
// the last and no block pays the pipeline's fill again).
//
// Parameters (FASTMM_GEMM_PARAMS, reinterpreted): M, N the product's; K the padded K (a multiple of 128); A, B the tiles
// of A and of B^T (int8); C the result (int32, or uint8 with RESIDUES), c_sm its row stride in elements; batch item
// z = z0 + blockIdx.z at A + its offset (a_sb0, a_sb1, in bytes), B + (b_sb0, b_sb1, bytes), C + (c_sb0, c_sb1, C's
// elements), split into two axes by batch_inner as every product's is (common.cuh).

#define BK 128  // int8 values of k per K-tile: one 128-byte swizzled row
#define WGS (BM / 64)  // multiplying warpgroups; warpgroup WGS copies
#define NREG (BN / 2)
#define TILE_A_BYTES (BM * BK)  // one K-tile of A's block tile
#define TILE_B_BYTES (BN * BK)
#define STAGE_BYTES (TILE_A_BYTES + TILE_B_BYTES)
#define SHARE_B (TILE_B_BYTES / CLUSTER)  // the part of B^T's tile that each block of a cluster copies

static_assert(BM == 64 || BM == 128, "one or two multiplying warpgroups along m");
static_assert(BN == 128 || BN == 256, "wgmma's n: 128 or 256");
static_assert(CLUSTER == 1 || CLUSTER == 2, "one block, or a pair along m sharing B^T's tiles");
static_assert(STAGES >= 2, "a stage filling while another is read");
static_assert(THREADS == (WGS + 1) * 128, "128 threads per warpgroup, one warpgroup copying");
static_assert(!PERSISTENT || CLUSTER == 1, "persistent blocks walk tiles alone");

// C's elements: int32 sums, or (RESIDUES) their residues, one byte each; Pair two of them side by side.
#if RESIDUES
typedef unsigned char Out;
typedef uchar2 Pair;
#else
typedef int Out;
typedef int2 Pair;
#endif

// Two consecutive elements of one row of C at column n (even): one store of a Pair when both lie inside C and C's
// rows allow it, else up to two guarded stores.
__device__ __forceinline__ void store_pair(Out* crow, int n, int N, int x, int y, bool vec)
{
    if (vec && n + 1 < N) {
        Pair pair;
        pair.x = (Out)x;
        pair.y = (Out)y;
        *reinterpret_cast<Pair*>(crow + n) = pair;
    } else {
        if (n < N) crow[n] = (Out)x;
        if (n + 1 < N) crow[n + 1] = (Out)y;
    }
}

// A multiplying warp (lane 0; `warp` its number in its warpgroup) is done with a stage. Alone: one arrival per warp
// on the block's "empty" barrier. In a cluster, one arrival per warpgroup on each block's, warp r sending block r's,
// so the remote arrivals leave from different warps at once (CUTLASS's PipelineTmaAsync does the same): the
// warpgroup's products are done when any of its warps has waited for them.
#if CLUSTER > 1
#define EMPTY_ARRIVALS (WGS * CLUSTER)
#else
#define EMPTY_ARRIVALS (WGS * 4)
#endif
__device__ __forceinline__ void release_stage(unsigned empty, int warp)
{
#if CLUSTER > 1
    if (warp < CLUSTER) mbar_arrive_in(empty, warp);
#else
    mbar_arrive(empty);
#endif
}

// A warp's sums of one block tile into C: rows m and m + 8, columns n + 8j and n + 8j + 1 (j < BN / 8).
__device__ __forceinline__ void epilogue(int (&acc)[NREG], void* C_, int M, int N, long long c_sm, int z,
                                         int batch_inner, long long c_sb0, long long c_sb1, int m, int n)
{
    Out* const c = reinterpret_cast<Out*>(C_) + fastmm_batch_offset(z, batch_inner, c_sb0, c_sb1);
    const bool vec = reinterpret_cast<unsigned long long>(c) % sizeof(Pair) == 0 && c_sm % 2 == 0;
#if RESIDUES
    // Each sum modulo batch item z's modulus, in [0, modulus): one byte for the reconstruction pass to read.
    constexpr int moduli[NMODULI] = {MODULI};
    int modulus = moduli[0];
#pragma unroll
    for (int i = 1; i < NMODULI; ++i) modulus = z == i ? moduli[i] : modulus;
    // By a reciprocal in double (the quotient of |sum| < 2^31 off by at most one, then corrected). This epilogue
    // costs the kernel 5-8% against int32 stores at 8192^3 and 16384^3 (H100), repaid by the reconstruction
    // reading a quarter of the bytes (docs/kernels/ozaki.md).
    const double inverse = 1.0 / modulus;
#pragma unroll
    for (int i = 0; i < NREG; ++i) {
        int r = acc[i] - __double2int_rd((double)acc[i] * inverse) * modulus;
        r += r < 0 ? modulus : 0;
        acc[i] = r >= modulus ? r - modulus : r;
    }
#endif
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        if (m < M) store_pair(c + (long long)m * c_sm, n + 8 * j, N, acc[4 * j], acc[4 * j + 1], vec);
        if (m + 8 < M) store_pair(c + (long long)(m + 8) * c_sm, n + 8 * j, N, acc[4 * j + 2], acc[4 * j + 3], vec);
    }
}

// Block tile number `lin` of a gx x gy grid of cluster tiles (gy rows of clusters) in the launch order: groups of GROUP
// rows of clusters walked column by column, so that a wave's tiles of B stay in L2 (6_wgmma.cu's launch order).
__device__ __forceinline__ void tile_at(int lin, int gx, int gy, int& cy, int& bx)
{
    cy = lin / gx;
    bx = lin % gx;
    if (GROUP > 1) {
        const int first = lin / (GROUP * gx) * GROUP;
        const int rows = min(GROUP, gy - first), in = lin % (GROUP * gx);
        cy = first + in % rows;
        bx = in / rows;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
#if CLUSTER > 1
__cluster_dims__(1, CLUSTER, 1)
#endif
fastmm_int8(FASTMM_GEMM_PARAMS)
{
    // The stages, then the barriers (full[s], then empty[s]); swizzled tiles start on 1024-byte boundaries, so the
    // launch asks for 1024 bytes more than stages and barriers need.
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const unsigned raw = smem_addr(smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    const unsigned full0 = base + STAGES * STAGE_BYTES, empty0 = full0 + 8 * STAGES;

    const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
#if CLUSTER > 1
    const unsigned rank = cluster_rank();
#else
    constexpr unsigned rank = 0;
#endif
    const int k_tiles = K / BK;
    const int z = z0 + blockIdx.z;
#if PERSISTENT
    // Each block walks tiles blockIdx.x, blockIdx.x + gridDim.x, ... of its batch item: its copier fills the next
    // tile's stages while the multiplying warps write the last one out, and the barriers' uses count on across tiles.
    const int gx = (N + BN - 1) / BN, gy = (M + BM - 1) / BM, first_tile = blockIdx.x, tile_step = gridDim.x;
#else
    const int gx = gridDim.x, gy = gridDim.y / CLUSTER, first_tile = blockIdx.y / CLUSTER * gridDim.x + blockIdx.x;
    const int tile_step = gx * gy;  // one tile a block
#endif
    const int tiles = gx * gy;

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full0 + 8 * s, 1);             // the copier's arrival, plus the copies' bytes
            mbar_init(empty0 + 8 * s, EMPTY_ARRIVALS);  // the multiplying warps' (or warpgroups') `release_stage`
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
#if CLUSTER > 1
    cluster_sync();  // publishes the barriers' initialisation to the other block, whose copies and arrivals reach them
#else
    __syncthreads();  // publishes the barriers' initialisation
#endif

    if (wg == WGS) {
        // The copier: the u-th K-tile this block multiplies (counted across its tiles) into stage u % STAGES once
        // every multiplying warp is done with what it held. A block past M (the grid's rows rounded up to whole
        // clusters) copies only its share of B^T, for its partner.
        if (tid % 128 == 0) {
            int u = 0;
            for (int tile = first_tile; tile < tiles; tile += tile_step) {
                int cy, bx;
                tile_at(tile, gx, gy, cy, bx);
                const int by = cy * CLUSTER + rank, bm = by * BM;
                const unsigned a_bytes = bm < M ? TILE_A_BYTES : 0;
                const char* a_tiles = reinterpret_cast<const char*>(A)
                                      + fastmm_batch_offset(z, batch_inner, a_sb0, a_sb1)
                                      + (long long)by * k_tiles * TILE_A_BYTES;
                const char* b_tiles = reinterpret_cast<const char*>(B)
                                      + fastmm_batch_offset(z, batch_inner, b_sb0, b_sb1)
                                      + (long long)bx * k_tiles * TILE_B_BYTES;
                for (int kt = 0; kt < k_tiles; ++kt, ++u) {
                    const int s = u % STAGES;
                    if (u >= STAGES) mbar_wait(empty0 + 8 * s, (u / STAGES - 1) & 1);
                    const unsigned stage = base + s * STAGE_BYTES;
                    mbar_expect(full0 + 8 * s, a_bytes + TILE_B_BYTES);
                    // B^T's share first: the partner's stage waits for it, and for nothing else of this block's.
                    const unsigned b_at = stage + TILE_A_BYTES + rank * SHARE_B;
                    const char* b_src = b_tiles + (long long)kt * TILE_B_BYTES + rank * SHARE_B;
#if CLUSTER > 1
                    bulk_copy_multicast(b_at, b_src, SHARE_B, full0 + 8 * s, (1u << CLUSTER) - 1);
#else
                    bulk_copy(b_at, b_src, SHARE_B, full0 + 8 * s);
#endif
                    if (a_bytes) bulk_copy(stage, a_tiles + (long long)kt * TILE_A_BYTES, TILE_A_BYTES, full0 + 8 * s);
                }
            }
        }
        // The multiplying warpgroups wait for every copy before they read it, and so before they exit.
    } else {
        const unsigned a_off = wg * 64 * 128;
        int u = 0;
        for (int tile = first_tile; tile < tiles; tile += tile_step) {
            int cy, bx;
            tile_at(tile, gx, gy, cy, bx);
            const int by = cy * CLUSTER + rank, bm = by * BM, bn = bx * BN;
            int acc[NREG];
#pragma unroll
            for (int i = 0; i < NREG; ++i) acc[i] = 0;

            for (int kt = 0; kt < k_tiles; ++kt, ++u) {
                // Block until the bytes of the u-th K-tile have landed, then queue its four 32-deep products.
                const int s = u % STAGES;
                mbar_wait(full0 + 8 * s, (u / STAGES) & 1);
                const unsigned a_tile = base + s * STAGE_BYTES + a_off, b_tile = base + s * STAGE_BYTES + TILE_A_BYTES;
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < BK / 32; ++ks)
                    wgmma_s8_tile(acc, smem_descriptor(a_tile + ks * 32), smem_descriptor(b_tile + ks * 32), 1);
                wgmma_commit();
                wgmma_wait<1>();  // this warp's products of the previous K-tile are done: its stage may be refilled
                if (kt > 0 && lane == 0) release_stage(empty0 + 8 * ((u - 1) % STAGES), warp);
            }
            wgmma_wait<0>();
#if PERSISTENT
            // The tile's last stage: the copier refills it with the next tile's K-tiles while this one is written.
            if (k_tiles > 0 && lane == 0) release_stage(empty0 + 8 * ((u - 1) % STAGES), warp);
#endif
            epilogue(acc, C, M, N, c_sm, z, batch_inner, c_sb0, c_sb1, bm + wg * 64 + warp * 16 + g, bn + 2 * t);
        }
    }
#if CLUSTER > 1
    cluster_sync();  // neither block leaves while the other may still copy into its stages or arrive on its barriers
#endif
}
