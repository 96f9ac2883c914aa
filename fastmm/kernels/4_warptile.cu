// Rung 4 of the ladder: warp tiling with a multi-stage cp.async pipeline.
//
// Who computes what: a block of THREADS = (BM/WM) * (BN/WN) * 32 threads computes a BM x BN tile of C. Each
// warp owns one WM x WN warp tile; inside it, lane (tx, ty) = (lane % LX, lane / LX) keeps a TM x TN thread
// tile in registers, made of (TM/4) x (TN/4) blocks of 4 x 4 spaced WM/(TM/4) rows and WN/(TN/4) columns
// apart. Keeping a warp's lanes on one compact WM x WN patch (instead of spreading them over the whole block
// tile, as rung 3 does) is what makes the shared-memory reads cheap: per step of k a warp reads LY distinct
// 16-byte A vectors and LX distinct B vectors, each broadcast to the lanes that share it.
//
// Shared memory holds STAGES BK-deep stages, A as As[k][m] and B as Bs[k][n], each row padded by 4 floats:
// fragments are 128-bit reads along m or n whatever the global layout. Global -> shared copies go through
// cp.async, so no registers stage them and no thread waits on them: the copy of K-tile kt + STAGES - 1 is
// issued while the warps multiply K-tile kt. An operand whose unit stride runs along m or n (row-major B,
// a transposed view of A) is copied 16 bytes at a time; one whose unit stride runs along k (row-major A,
// a transposed view of B) must be transposed on the way in, which cp.async can only do 4 bytes at a time.
// Those scalar copies are arranged 8 along k by 4 along m per warp: 32-byte global segments, and with the
// 4-float row padding the 32 shared-memory words land in 32 distinct banks.
//
// Inside a stage, fragments are double-buffered in registers: the reads for step k + 1 are in flight while
// the FMAs of step k run. The last step of a K-tile waits for the next stage (cp.async.wait_group plus one
// barrier, the only barrier per K-tile) and reads that stage's first fragments before its own FMAs, so the
// read latency hides behind them. Copies for the next tile start at step 1, either in one burst (SPREAD = 0)
// or a few per step (SPREAD = 1), which keeps the 255-register configurations from stalling on them.
// Fragment addresses are 32-bit shared addresses carried through the K loop (reads are register + immediate).
//
// Sub-tile loop (SUB_K > 0): the fully unrolled K-tile above is BK x TM x TN FMAs of straight-line code (72 KB for
// 128 x 256 x 32 tiles), more than the SMs' instruction caches keep: ncu counted 0.17 warps per issued
// instruction stalled on instruction fetch (cuBLAS, whose loop is 18 KB: 0.02). Blocks whose tile lies wholly
// inside A, B and C, when K is a multiple of BK, instead run a loop whose body is SUB_K steps of k (1,150
// instructions for SUB_K = 8): the same stages, the same one barrier per K-tile (at the end of its last body),
// and each body copies the matching SUB_K rows of a stage STAGES - 1 K-tiles ahead, with no bounds to check
// (a copy past the last K-tile reads nothing: source size zero). Edge blocks take the unrolled path (but see RAGGED).
//
// RAGGED: the loop for any K and any block. It covers the whole K-tiles, and the last K % BK terms are read from
// global memory after it (`add_tail`): fewer than BK a thread tile, under a percent of its FMAs from K = 1024 (their
// loads' latency is not hidden). Blocks across C's edges take the loop too, their copies zeroing what lies past the
// edge as the unrolled path's do, so that their sums run in runs as well (but see EDGE_LOOP). A macro, not a test
// alone: the extra code moved ptxas' schedule of the whole-K interior loop, which had been tuned to half a percent.
//
// Edges: cp.async's source size zero-fills whatever lies outside the matrix (a vector that crosses the edge
// copies only its valid bytes), so the FMAs never test bounds; C stores are guarded per row and element.
//
// The cp.async copies of a BK-deep slice of each operand are pipeline.cuh's (shared with the tensor-core family).
//
// Macros: THREADS = (BM / WM) * (BN / WN) * 32, PAD (floats of padding per shared row: keeps 16-byte alignment,
// spreads banks), BM, BN, BK, WM, WN, TM, TN, STAGES, MIN_BLOCKS, SPREAD, TILE_SUMS, SUB_K, FLUSH (steps of k per
// partial sum, a multiple of BK, or 0), RAGGED (1: the sub-tile loop for any K and any block), and the layout as in
// rung 3: A_T = 1 when A has unit stride along m, B_T = 1 when B has unit stride along k, VEC = 4 when 16-byte copies
// of the operands copied along their unit stride (A where A_T = 1, B where B_T = 0) are legal (else 4-byte copies; the
// other layouts are copied 4 bytes at a time, transposing, either way; C's 16-byte stores are decided per block, see
// fastmm_c_vec4).

#define LX (WN / TN)             // lanes of a warp along n
#define LY (WM / TM)             // ... and along m
#define RM (TM / 4)              // 4 x 4 blocks per thread along m
#define RN (TN / 4)              // ... and along n
#define LDA_S (BM + PAD)
#define LDB_S (BN + PAD)
#define STAGE_FLOATS (BK * (LDA_S + LDB_S))
#define FLUSH_TILES (FLUSH ? FLUSH / BK : 1)  // K-tiles per partial sum

static_assert(LX * LY == 32, "a warp's lanes must tile its warp tile exactly");
static_assert(BM % WM == 0 && BN % WN == 0 && WM % TM == 0 && WN % TN == 0, "tiles must nest");
static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % 8 == 0, "thread tiles are 4 x 4 blocks; BK a multiple of 8");
static_assert(STAGES >= 2, "cp.async pipelining needs at least two stages");
static_assert(VEC == 4 || VEC == 1, "VEC is 4 (16-byte copies) or 1 (4-byte copies)");
static_assert(SUB_K == 0 || (BK % SUB_K == 0 && SUB_K >= 2 && !TILE_SUMS), "SUB_K divides BK; no tile sums");
static_assert(FLUSH % BK == 0 && (FLUSH == 0 || SUB_K > 0), "partial sums span whole K-tiles, on the sub-tile loop");
static_assert(RAGGED == 0 || SUB_K > 0, "a ragged K's tail follows the sub-tile loop");
// Not the 128 x 256 tile's loop with B copied transposing (B_T): the edges' masks spilled its registers.
#define EDGE_LOOP (RAGGED && !(B_T && BN > 128))

// 128-bit shared-memory read at a byte address. Fragment addresses are kept as 32-bit shared addresses that
// live through the whole K loop, so every read is [register + immediate]: recomputing them per K-tile made
// the compiler borrow an accumulator's register, and the FMA that wrote it back had to wait for the read.
__device__ __forceinline__ float4 lds128(unsigned addr)
{
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
    return v;
}

__device__ __forceinline__ void sts128(unsigned addr, float4 v)
{
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" :: "r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}

// Copies issued per K step when they are spread over a tile: 8, or more if needed to finish by the tile's last
// step. 8 came from compiling every layout: with 4 per step ptxas kept more row pointers live and spilled in
// some layouts of the 255-register configurations; from 6 up none spilled.
__host__ __device__ constexpr int copies_per_step(int copies)
{
    return 8 > (copies + BK - 2) / (BK - 1) ? 8 : (copies + BK - 2) / (BK - 1);
}

// Epilogue: each row of a 4 x 4 block is one 16-byte store when it lies inside C (and C's rows allow it: vec4),
// else up to four guarded scalar stores. The 8 (or LX) lanes sharing a row write consecutive 16-byte pieces of it.
// (row0, col0) is the thread's first element of C. Where C's rows are not 16-byte aligned (an odd N), a row's pieces
// go out in its widest aligned stores (fastmm_store4_at: 8-byte ones on even rows of an N = 2 mod 4, 4 + 8 + 4 bytes
// on odd ones): a warp's lanes store rows 4 apart, which start equally far past a 16-byte boundary, so its lanes take
// the same stores. Four scalar stores a piece touched 4.5x the sectors of 16-byte ones (ncu, 11185x351x148: the
// epilogue's share of its time).
__device__ __forceinline__ void store_tile(float* c, long long c_sm, int row0, int col0, int M, int N,
                                           const float (&acc)[TM][TN], bool vec4)
{
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int m = row0 + i * (WM / RM) + r;
            if (m < M) {
                float* crow = c + (long long)m * c_sm;
                const int s = vec4 ? 0 : fastmm_misalignment(crow);  // (col0 and the pieces' columns: multiples of 4)
#pragma unroll
                for (int j = 0; j < RN; ++j) {
                    const float4 v = make_float4(acc[i * 4 + r][j * 4 + 0], acc[i * 4 + r][j * 4 + 1],
                                                 acc[i * 4 + r][j * 4 + 2], acc[i * 4 + r][j * 4 + 3]);
                    fastmm_store4_at(crow, col0 + j * (WN / RN), N, v, s);
                }
            }
        }
}

// STAGED_C (a configuration of its own, for K within one K-tile, where writing C is the product's time): where C's
// rows take neither 16- nor 8-byte stores (an odd N, a view at an odd offset), the stores straight from the thread
// tiles write pieces of 4 bytes (and 8) 16 bytes apart, so each warp store touches 4 rows' 128-byte segments for part
// of their bytes. Instead the block tile goes through shared memory (the stages are
// free by then: row stride BN + 4 floats, the 16-byte writes of a warp's 8 lanes along n conflict-free) and each warp
// store writes 32 consecutive floats of one row. A longer K keeps the direct stores (the staged ones measured no
// faster there); the other configurations do not compile the path, so their schedules stay as tuned.
#define LDC_S (BN + 4)
static_assert(!STAGED_C || BM * LDC_S <= STAGES * STAGE_FLOATS, "the staged C tile must fit in the stages");

__device__ __forceinline__ void store_staged(float* c, long long c_sm, int bm, int bn, int M, int N,
                                             const float (&acc)[TM][TN], unsigned cs, int row0, int col0)
{
    __syncthreads();  // every warp's last reads of the stages are done
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int j = 0; j < RN; ++j)
                sts128(cs + 4 * ((row0 + i * (WM / RM) + r) * LDC_S + col0 + j * (WN / RN)),
                       make_float4(acc[i * 4 + r][j * 4 + 0], acc[i * 4 + r][j * 4 + 1], acc[i * 4 + r][j * 4 + 2],
                                   acc[i * 4 + r][j * 4 + 3]));
    __syncthreads();
    const int rows = min(M - bm, BM), cols = min(N - bn, BN);
#pragma unroll 4
    for (int e = threadIdx.x; e < BM * BN; e += THREADS) {
        const int r = e / BN, col = e % BN;
        if (r < rows && col < cols) {
            float x;
            asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"(cs + 4 * (r * LDC_S + col)));
            c[(long long)(bm + r) * c_sm + bn + col] = x;
        }
    }
}

// The kernel's body, for one block of a batch item K deep (fastmm_warptile below says how deep).
__device__ __forceinline__ void warptile(FASTMM_GEMM_PARAMS)
{
    extern __shared__ __align__(16) float smem[];  // STAGES x (As[BK][LDA_S], Bs[BK][LDB_S])

    FASTMM_PIPELINE_WARP;
    const int tx = lane % LX, ty = lane / LX;
    FASTMM_PIPELINE_TILE(smem);

    // The copies of the next K-tile into its stage form one cp.async group (empty past the last tile, so that
    // every thread commits the same number of groups and wait_group counts stay uniform). Stages are used
    // round-robin; a running offset avoids a division by STAGES.
    constexpr int COPIES = CopyA::COUNT + CopyB::COUNT;  // a K-tile's copies: A's, then B's
    int next_kt = 0;
    unsigned write_stage = 0;
    // Copy c of the next K-tile (`all`: it lies inside A and B, so no bounds need checking).
    auto issue_copy = [&](int c, bool all, int k_left) {
        if (c < CopyA::COUNT) {
            if (all) copy_a.copy_all(c, write_stage, lda);
            else copy_a.copy(c, write_stage, lda, m_left, k_left);
        } else {
            if (all) copy_b.copy_all(c - CopyA::COUNT, write_stage, ldb);
            else copy_b.copy(c - CopyA::COUNT, write_stage, ldb, n_left, k_left);
        }
    };
    auto finish_tile_copies = [&]() {
        copy_a.next_slice(lda);
        copy_b.next_slice(ldb);
        ++next_kt;
        write_stage = write_stage == (STAGES - 1) * STAGE_BYTES ? 0 : write_stage + STAGE_BYTES;
        cp_async_commit();
    };
    auto issue_next = [&]() {
        if (next_kt < num_k_tiles) {
            const int k_left = K - next_kt * BK;
#pragma unroll
            for (int c = 0; c < COPIES; ++c) issue_copy(c, false, k_left);
        }
        finish_tile_copies();
    };

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
#if TILE_SUMS
    // Two-level accumulation: the products of each run of up to TILE_SUMS K-tiles are summed on their own, then
    // added to acc (see the K loop below). A long running sum grows, and each rounding error with it (error ~ K,
    // against ~ run + K / run here): this keeps the small tiles, which serve narrow and split-K products with long
    // K, as accurate as cuBLAS.
    float part[TM][TN];
#endif

    // This thread's fragments in the stage being read: A at (k, wm0 + ty * 4), B at (k, wn0 + tx * 4).
    const unsigned a_frag0 = smem0 + 4 * (wm0 + ty * 4);
    const unsigned b_frag0 = smem0 + 4 * (BK * LDA_S + wn0 + tx * 4);
    unsigned a_frag = a_frag0, b_frag = b_frag0;
    float af[2][TM], bf[2][TN];
    // Fragments into buffer buf from the row of a stage at shared addresses a_at (A) and b_at (B).
    auto load_at = [&](int buf, unsigned a_at, unsigned b_at) {
#pragma unroll
        for (int i = 0; i < RM; ++i) {
            const float4 v = lds128(a_at + 4 * (i * (WM / RM)));
            af[buf][i * 4 + 0] = v.x; af[buf][i * 4 + 1] = v.y; af[buf][i * 4 + 2] = v.z; af[buf][i * 4 + 3] = v.w;
        }
#pragma unroll
        for (int j = 0; j < RN; ++j) {
            const float4 v = lds128(b_at + 4 * (j * (WN / RN)));
            bf[buf][j * 4 + 0] = v.x; bf[buf][j * 4 + 1] = v.y; bf[buf][j * 4 + 2] = v.z; bf[buf][j * 4 + 3] = v.w;
        }
    };
    // Fragments of step k of the stage being read into buffer buf.
    auto load_fragments = [&](int buf, int k) { load_at(buf, a_frag + 4 * k * LDA_S, b_frag + 4 * k * LDB_S); };

    if (num_k_tiles > 0) {
        // Prologue: STAGES - 1 tiles in flight, then wait for the first and read its first fragments.
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) issue_next();
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        load_fragments(0, 0);
    }
    // A tile inside A and B copies without bounds: no per-copy comparisons, which were half the copy code's
    // instructions (4096^3: 0.96 -> 0.98x cuBLAS with 4 stages). The test is per group of copies and the same
    // for the whole block.
    // Only where copies are few (at most one operand copied 4 bytes at a time): a second copy of many copies'
    // code cost the 255-register layouts their spill-free budget, and the others their full unrolling.
    constexpr bool FAST_COPIES = COPIES <= 24 && (CopyA::V == 4 || CopyB::V == 4);
    auto inside = [&](int k_left) { return FAST_COPIES && m_left >= BM && n_left >= BN && k_left >= BK; };
    // The next tile's copies, spread from step 1 on (PER_STEP at a time) so that their address arithmetic and
    // issue slots mix with the FMAs instead of stalling the warp in one burst (a burst made the address
    // registers' reuse wait on the copies reading them).
    constexpr int PER_STEP = SPREAD ? copies_per_step(COPIES) : COPIES;
    auto copy_step = [&](int k) {
        if (k >= 1 && (k - 1) * PER_STEP < COPIES) {
            if (next_kt < num_k_tiles) {
                const int k_left = K - next_kt * BK;
                // Two loops, so that the test is made once per group rather than once per copy.
                if (inside(k_left)) {
#pragma unroll
                    for (int c = (k - 1) * PER_STEP; c < (k - 1) * PER_STEP + PER_STEP && c < COPIES; ++c)
                        issue_copy(c, true, k_left);
                } else {
#pragma unroll
                    for (int c = (k - 1) * PER_STEP; c < (k - 1) * PER_STEP + PER_STEP && c < COPIES; ++c)
                        issue_copy(c, false, k_left);
                }
            }
            if (k * PER_STEP >= COPIES) finish_tile_copies();
        }
    };
    // FMA order: two rows of the thread tile at a time, alternating between them along a column walk that
    // reverses direction from one pair to the next, so each B value and the A values of the pair are read
    // back to back (the operand reuse cache) and the walk's turns reuse the last column. Measured against row
    // by row: 4096^3 0.942 -> 0.958x cuBLAS, 8192^3 0.967 -> 0.981x, A^T.B 0.921 -> 0.946x, and 237 -> 221
    // registers. `first`: the first step of a run of K-tiles (with TILE_SUMS, it starts the partial sums afresh).
    auto fma_step = [&](int buf, bool first) {
#if SUB_K
        // With the sub-tile loop: down each column of the thread tile, reversing direction from one column to
        // the next. In a loop body this is what let ptxas keep most accumulators in place: with the pair order
        // below it renamed half of them in every body, with register-bank conflicts (ncu, 4096^3: 0.30 warps
        // per issue stalled on dispatch against 0.17; 0.95x cuBLAS against 1.01x). The unrolled path, which
        // these configurations run on edge blocks only, takes the same order: one order per path gave the
        // loop a worse register allocation again (0.98x).
#pragma unroll
        for (int j = 0; j < TN; ++j)
#pragma unroll
            for (int i0 = 0; i0 < TM; ++i0) {
                const int i = (j & 1) ? TM - 1 - i0 : i0;
                acc[i][j] = fmaf(af[buf][i], bf[buf][j], acc[i][j]);
            }
        return;
#endif
#pragma unroll
        for (int ip = 0; ip < TM / 2; ++ip)
#pragma unroll
            for (int t = 0; t < 2 * TN; ++t) {
                const int i = 2 * ip + (t & 1), j = (ip & 1) ? TN - 1 - t / 2 : t / 2;
#if TILE_SUMS
                part[i][j] = first ? af[buf][i] * bf[buf][j] : fmaf(af[buf][i], bf[buf][j], part[i][j]);
#else
                acc[i][j] = fmaf(af[buf][i], bf[buf][j], acc[i][j]);
#endif
            }
    };
    // The last step of a K-tile: the block's one barrier per K-tile, placed before the step's FMAs so that the
    // first fragments of K-tile kt + 1 are read while they run. It publishes that K-tile's copies (landed once
    // at most STAGES - 2 younger groups are pending) and frees the stage read during kt, which the copies
    // issued from step 1 of K-tile kt + 1 refill.
    auto last_step = [&](bool more, bool fresh) {
        if (more) {
            const bool wrap = a_frag == a_frag0 + (STAGES - 1) * STAGE_BYTES;
            a_frag = wrap ? a_frag0 : a_frag + STAGE_BYTES;
            b_frag = wrap ? b_frag0 : b_frag + STAGE_BYTES;
            cp_async_wait<STAGES - 2>();
            __syncthreads();
            load_fragments(BK % 2, 0);
        }
        copy_step(BK - 1);
        fma_step((BK - 1) % 2, fresh && BK == 1);
    };
    // Partial sums (FLUSH > 0): after every FLUSH steps of k the accumulators are added to this thread's slots in
    // shared memory past the stages (stored the first time) and start again from zero; the epilogue adds the slots
    // to the last run. One running sum over all of K grows, and each rounding error with it (relative error
    // ~ sqrt(K)); runs of FLUSH steps added in order give ~ sqrt(FLUSH + K / FLUSH). Slots rather than a second set
    // of accumulators (tile sums: twice the registers) or C (guarded row addresses spilled every layout): a slot is
    // one base address plus an immediate, vector v of the thread at v * THREADS + tid (conflict-free 16-byte access).
    const unsigned sums = smem0 + STAGES * STAGE_BYTES + 16 * tid;
    auto add_sums = [&](bool load, bool store) {
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; j += 4) {
                const unsigned at = sums + 16 * THREADS * ((i * TN + j) / 4);
                if (load) {
                    const float4 v = lds128(at);
                    acc[i][j] += v.x; acc[i][j + 1] += v.y; acc[i][j + 2] += v.z; acc[i][j + 3] += v.w;
                }
                if (store) sts128(at, make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]));
            }
    };
    // The sub-tile loop, `loop(kt0, kt1)` over K-tiles [kt0, kt1): in runs of FLUSH_TILES K-tiles, each but the last
    // followed by a flush, or in one run. A loop per run, not a test per K-tile, and on the sub-tile loop only: the
    // unrolled path with partial sums, flushing or not, ran 6-8% slower (4097^3, 1000^3: ptxas laid its K loop out
    // worse), while the loop lost 0-2% (4096^3 A^T.B 1.02 -> 1.00x cuBLAS, 512x512x32768 1.00x). Edge blocks and a K
    // that is not a multiple of BK keep one running sum.
    bool flushed = false;
#if RAGGED
    const int loop_tiles = K / BK;  // whole K-tiles: the loop's; the rest is the tail's
#else
    const int loop_tiles = num_k_tiles;
#endif
    auto in_runs = [&](auto&& loop) {
#if FLUSH
        for (int kt0 = 0; kt0 < loop_tiles; kt0 += FLUSH_TILES) {
            const int kt1 = min(kt0 + FLUSH_TILES, loop_tiles);
            loop(kt0, kt1);
            if (kt1 < loop_tiles) {
                add_sums(flushed, true);
                flushed = true;
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
            }
        }
#else
        loop(0, loop_tiles);
#endif
    };
#if RAGGED
    // The terms of k in [k0, K) (fewer than BK) into the last run, in order, straight from global memory, through the
    // fragment buffers, which are free once the loop is done; 16 bytes at a time along an operand's unit stride. Rows
    // and columns past C's edge read the last one instead (their sums are never stored). (Loading the next step's
    // values during a step's FMAs spilled the 128x256 loop.)
    // Four values of step k of one operand, at x .. x + 3 along M (A) or N (B): one 16-byte load where they are
    // contiguous (`unit`: that operand's unit stride) and inside, else four, each past x_end reading x_end - 1.
    auto tail4 = [&](const float* p, bool unit, long long x, int x_end, long long ld, int k) {
        if (unit && VEC == 4 && x + 3 < x_end) return *reinterpret_cast<const float4*>(p + (long long)k * ld + x);
        float v[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const long long xr = x + r < x_end ? x + r : x_end - 1;
            v[r] = p[unit ? (long long)k * ld + xr : xr * ld + k];
        }
        return make_float4(v[0], v[1], v[2], v[3]);
    };
    auto load_tail = [&](int buf, int k) {
        const int row0 = bm + wm0 + ty * 4, col0 = bn + wn0 + tx * 4;
#pragma unroll
        for (int i = 0; i < RM; ++i) {
            const float4 v = tail4(a, A_T, row0 + i * (WM / RM), M, lda, k);
            af[buf][i * 4 + 0] = v.x; af[buf][i * 4 + 1] = v.y; af[buf][i * 4 + 2] = v.z; af[buf][i * 4 + 3] = v.w;
        }
#pragma unroll
        for (int j = 0; j < RN; ++j) {
            const float4 v = tail4(b, !B_T, col0 + j * (WN / RN), N, ldb, k);
            bf[buf][j * 4 + 0] = v.x; bf[buf][j * 4 + 1] = v.y; bf[buf][j * 4 + 2] = v.z; bf[buf][j * 4 + 3] = v.w;
        }
    };
    auto add_tail = [&](int k0) {
#pragma unroll 1
        for (int k = k0; k < K; ++k) {
            load_tail(0, k);
            fma_step(0, false);
        }
    };
#endif
#if SUB_K
    // (num_k_tiles > 0 adds nothing to K % BK == 0 for the K > 0 the dispatcher launches, but with it ptxas laid
    // the loop out the way that ran 0.5% faster, 4096^3 1.004x against 0.999x cuBLAS: same loop statistics.)
#if RAGGED
#if EDGE_LOOP
    // Every block with a whole K-tile, its copies kept within C's edges.
    const unsigned a_ok = copy_a.edge_mask(m_left), b_ok = copy_b.edge_mask(n_left);
    if (loop_tiles > 0) {
#else
    if (m_left >= BM && n_left >= BN && loop_tiles > 0) {
#endif
#else
    if (m_left >= BM && n_left >= BN && K % BK == 0 && num_k_tiles > 0) {
#endif
        constexpr int SUBS = BK / SUB_K;  // loop bodies per K-tile
        constexpr int SUB_COPIES = CopyA::SUB_COUNT + CopyB::SUB_COUNT;
        constexpr int SUB_PER_STEP = (SUB_COPIES + SUB_K - 2) / (SUB_K - 1);  // from step 1 on
        static_assert((SUB_K - 2) * SUB_PER_STEP >= SUB_COPIES, "a body's copies fit its steps 1 .. SUB_K - 2");
        constexpr unsigned A_ROWS = 4 * SUB_K * LDA_S, B_ROWS = 4 * SUB_K * LDB_S;  // a sub-slice, in bytes
        in_runs([&](int kt0, int kt1) {
            for (int it = kt0 * SUBS; it < kt1 * SUBS; ++it) {
                const int sub = it % SUBS;
                // Copies of this body go to K-tile it / SUBS + STAGES - 1, into the stage at write_stage.
                const bool has = it / SUBS + STAGES - 1 < loop_tiles;
                const unsigned a_rd = a_frag + sub * A_ROWS, b_rd = b_frag + sub * B_ROWS;
                const unsigned wa = write_stage + sub * A_ROWS, wb = write_stage + sub * B_ROWS;
#pragma unroll
                for (int k = 0; k < SUB_K - 1; ++k) {
                    load_at((k + 1) % 2, a_rd + 4 * (k + 1) * LDA_S, b_rd + 4 * (k + 1) * LDB_S);
#pragma unroll
                    for (int c = (k - 1) * SUB_PER_STEP; c < k * SUB_PER_STEP && c < SUB_COPIES; ++c) {
                        if (c < 0) continue;
#if EDGE_LOOP
                        if (c < CopyA::SUB_COUNT) copy_a.copy_sub_edge(c, wa, lda, has, a_ok);
                        else copy_b.copy_sub_edge(c - CopyA::SUB_COUNT, wb, ldb, has, b_ok);
#else
                        if (c < CopyA::SUB_COUNT) copy_a.copy_sub(c, wa, lda, has);
                        else copy_b.copy_sub(c - CopyA::SUB_COUNT, wb, ldb, has);
#endif
                    }
                    fma_step(k % 2, false);
                }
                copy_a.next_sub(lda);
                copy_b.next_sub(ldb);
                // The first fragments of the next body: the next sub-slice of this stage, or, after the K-tile's
                // last body, the next stage once its copies have landed (the K-tile's one barrier).
                unsigned a_next = a_rd + A_ROWS, b_next = b_rd + B_ROWS;
                if (sub == SUBS - 1) {
                    cp_async_commit();
                    write_stage = write_stage == (STAGES - 1) * STAGE_BYTES ? 0 : write_stage + STAGE_BYTES;
                    const bool wrap = a_frag == a_frag0 + (STAGES - 1) * STAGE_BYTES;
                    a_frag = wrap ? a_frag0 : a_frag + STAGE_BYTES;
                    b_frag = wrap ? b_frag0 : b_frag + STAGE_BYTES;
                    a_next = a_frag;
                    b_next = b_frag;
                    cp_async_wait<STAGES - 2>();
                    __syncthreads();
                }
                load_at(0, a_next, b_next);
                fma_step((SUB_K - 1) % 2, false);
            }
        });
#if RAGGED
        if (K % BK && M > 0 && N > 0) add_tail(K - K % BK);  // (an empty C launches one block: nothing to clamp to)
#endif
    } else
#endif
    {
        // K-tile kt, unrolled; `fresh`: its first step starts the partial sums afresh (TILE_SUMS).
        auto k_tile = [&](int kt, bool fresh) {
#pragma unroll
            for (int k = 0; k < BK - 1; ++k) {
                load_fragments((k + 1) % 2, k + 1);
                copy_step(k);
                fma_step(k % 2, fresh && k == 0);
            }
            last_step(kt + 1 < num_k_tiles, fresh);
        };
#if TILE_SUMS
        // Partial sums over runs of up to TILE_SUMS K-tiles, each run's first K-tile a copy of its own (it starts them
        // with products instead of adding: one FADD per accumulator a run, not per K-tile, and no zeroing). A run is
        // at most a quarter of the K-tiles, so that a short K keeps as many sums as sums per K-tile gave it (the error
        // goes as sqrt(run + K / run)): runs of 4 ran 2% faster than runs of 1 on the 64x64 tile (its FADDs: 6% of its
        // instructions), and had 1.5x cuBLAS's error on K = 31-73 (docs/kernels/warptile.md, 'Sums per run of K-tiles').
        // (runs.py's run_of reads the same length.)
        const int run_tiles = max(1, min(TILE_SUMS, num_k_tiles / 4));
        for (int kt = 0; kt < num_k_tiles;) {
            k_tile(kt++, true);
#pragma unroll 1
            for (int r = 1; r < run_tiles && kt < num_k_tiles; ++r) k_tile(kt++, false);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += part[i][j];
        }
#else
        for (int kt = 0; kt < num_k_tiles; ++kt) k_tile(kt, false);
#endif
    }
    cp_async_wait<0>();  // nothing may still be writing shared memory when the block exits
    if (FLUSH && flushed) add_sums(true, false);
    // C's own rows decide, in the 4-byte-copy binaries too: split-K pads its workspace's rows for them, and a result
    // can be aligned where its operands are not (docs/kernels/split-k.md, section 'The workspace's rows').
    const bool vec4 = fastmm_c_vec4(c, c_sm);
    // (Staged only where C's rows take no 8-byte stores either: rows 8-byte aligned measured 1.07-1.22x faster on their
    // own 8-byte stores, 5885x4766x15 and 6395x4502x6; odd rows 0.81-0.93x on theirs, 5330x3663x6 and 4251x4277x6.)
    if (STAGED_C && !vec4 && K <= BK && (c_sm % 2 != 0 || reinterpret_cast<unsigned long long>(c) % 8 != 0)) {
        store_staged(c, c_sm, bm, bn, M, N, acc, smem_addr(smem), wm0 + ty * 4, wn0 + tx * 4);
        return;
    }
    store_tile(c, c_sm, bm + wm0 + ty * 4, bn + wn0 + tx * 4, M, N, acc, vec4);
}

// Split-K's slices (k_total > 0): the inner batch axis counts the slices, every one K deep but the last, which ends at
// k_total, so that one launch runs a K that the slices do not divide (its last K-tile zero-filled past the end, as at
// C's edges); an outer batch axis, where there is one, counts the products of a batch split alike. The sub-tile
// loops' slices are whole K-tiles (the plan's split_cut): they read K from the parameters as ever, since a K computed
// in registers moved ptxas' schedule of the 128x256 ragged loop, 7-12% slower on large products (docs/kernels/split-k.md).
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
fastmm_warptile(FASTMM_GEMM_PARAMS)
{
#if SUB_K
    const int k = K;
#else
    const int k = k_total > 0 ? min(K, k_total - ((z0 + (int)blockIdx.z) % batch_inner) * K) : K;
#endif
    warptile(M, N, k, A, a_sm, a_sk, B, b_sk, b_sn, C, c_sm, c_sn, z0, batch_inner, k_total, a_sb0, a_sb1, b_sb0,
             b_sb1, c_sb0, c_sb1);
}
