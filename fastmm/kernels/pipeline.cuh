// cp.async copies of operand slices into shared-memory stages, shared by the pipelined kernel families
// (4_warptile.cu, 5_tf32.cu). Prepended after common.cuh and cp_async.cuh by fastmm/kernels/build.py for
// configurations that use it.
//
// Needs these macros: THREADS (threads per block), BK (the K-depth of a stage), PAD (floats of padding per
// shared-memory row), VEC (4: 16-byte copies are legal; 1: 4-byte copies), SUB_K (rows per sub-slice, or 0).

// Copies of one BK-deep slice of an operand into a shared stage laid out [BK][X + PAD], X = BM (A) or BN (B).
//
// In global memory the slice is X x BK with element (x, k) at g[x * sx + k * sk], where exactly one of the
// strides is 1: TRANS = true when that is k's (the copy transposes), false when it is x's (ld is the other).
// The block copies the slice in passes of P_X x P_K elements; a thread's copies sit at fixed offsets from its
// first one, so the main loop spends one pointer add per slice and per thread on addresses, not one per copy.
// Transposing: a warp covers 8 consecutive k by 4 consecutive x, so each x's 8 k's are one 32-byte global
// segment and the 32 shared words fall in 32 distinct banks (row length X + 4 = 4 mod 32 words).
// Otherwise: consecutive threads take consecutive vectors along x (coalesced, conflict-free).
template <int X, bool TRANS>
struct SliceCopy {
    static constexpr int LDS = X + PAD;
    static constexpr int V = TRANS ? 1 : VEC;              // elements per copy
    static constexpr int P_X = TRANS ? THREADS / 8 : X;
    static constexpr int P_K = TRANS ? 8 : THREADS * V / X;
    static constexpr int N_X = X / P_X, N_K = BK / P_K;     // passes
    static_assert(P_X > 0 && P_K > 0 && N_X * P_X == X && N_K * P_K == BK && (TRANS || P_K * X == THREADS * V),
                  "the block's threads must cover a slice in whole passes");

    const float* src;  // this thread's first element of the next slice to copy
    int x0, k0;        // ... and its place in a pass
    unsigned dst;      // ... and in stage 0 (a shared-memory byte address)

    __device__ __forceinline__ SliceCopy(const float* g, long long ld, int tid, unsigned slice0)
    {
        x0 = TRANS ? tid / 8 : (tid % (X / V)) * V;
        k0 = TRANS ? tid % 8 : tid / (X / V);
        src = g + (TRANS ? x0 * ld + k0 : k0 * ld + x0);
        dst = slice0 + 4 * (k0 * LDS + x0);
    }

    static constexpr int COUNT = N_X * N_K;  // copies per thread per slice

    // Issue copy number `i` (0 <= i < COUNT) of this thread's share of the next slice, into the stage
    // `stage_bytes` past stage 0; zero past x_left and k_left. Copies are issued one at a time so that the
    // main loop can spread them over the FMAs of a K-tile.
    __device__ __forceinline__ void copy(int i, unsigned stage_bytes, long long ld, int x_left, int k_left) const
    {
        const int ix = i / N_K, ik = i % N_K;
        const int x = x0 + ix * P_X, k = k0 + ik * P_K;
        const unsigned d = dst + stage_bytes + 4 * (ik * P_K * LDS + ix * P_X);
        // A copy that reads nothing (src-size 0) may point past the matrix: cp.async reads no byte.
        if (TRANS) {
            cp_async4(d, src + ix * P_X * ld + ik * P_K, x < x_left && k < k_left ? 4 : 0);
        } else {
            const float* s = src + ik * P_K * ld + ix * P_X;
            if (V == 4) {
                const int valid = k < k_left ? min(max(x_left - x, 0), V) : 0;
                cp_async16(d, s, 4 * valid);
            } else {
                cp_async4_if(d, s, k < k_left && x < x_left);
            }
        }
    }

    // The same copy when the whole slice lies inside the matrix.
    __device__ __forceinline__ void copy_all(int i, unsigned stage_bytes, long long ld) const
    {
        const int ix = i / N_K, ik = i % N_K;
        const unsigned d = dst + stage_bytes + 4 * (ik * P_K * LDS + ix * P_X);
        if (TRANS) {
            cp_async4(d, src + ix * P_X * ld + ik * P_K, 4);
        } else if (V == 4) {
            cp_async16(d, src + ik * P_K * ld + ix * P_X, 16);
        } else {
            cp_async4(d, src + ik * P_K * ld + ix * P_X, 4);
        }
    }

    __device__ __forceinline__ void next_slice(long long ld) { src += TRANS ? BK : BK * ld; }

    // Sub-slices, for the sub-tile loop: the SUB_K rows of k [s * SUB_K, (s + 1) * SUB_K) of a slice. src moves
    // SUB_K rows per sub-slice (next_sub), which over a whole slice adds up to next_slice.
    static constexpr int SUB_COUNT = N_X * (SUB_K > 0 ? SUB_K / P_K : 1);  // copies per thread per sub-slice
    static_assert(SUB_K % P_K == 0, "a sub-slice must be copied in whole passes");

    // Copy number i (0 <= i < SUB_COUNT) of this thread's share of the next sub-slice, `d_off` bytes past stage
    // 0's copy of its first row; `has` false (past the last K-tile) copies nothing.
    __device__ __forceinline__ void copy_sub(int i, unsigned d_off, long long ld, bool has) const
    {
        const int ix = i % N_X, ik = i / N_X;
        const unsigned d = dst + d_off + 4 * (ik * P_K * LDS + ix * P_X);
        const float* s = src + (TRANS ? ix * P_X * ld + ik * P_K : ik * P_K * ld + ix * P_X);
        // (cp_async4_if in the 4-byte layouts only: the 16-byte ones keep the schedules they were timed with.)
        if (V == 4) {
            cp_async16(d, s, has ? 16 : 0);
        } else if (VEC == 1) {
            cp_async4_if(d, s, has);
        } else {
            cp_async4(d, s, has ? 4 : 0);
        }
    }

    __device__ __forceinline__ void next_sub(long long ld) { src += TRANS ? SUB_K : SUB_K * ld; }

    // For a block across the matrix's edge on the sub-tile loop (4_warptile.cu's RAGGED): what this thread's copies may
    // read along x, below x_left: of a transposing copy, how many of its passes along x (they lie in order along x);
    // else the bytes of its one vector.
    __device__ __forceinline__ unsigned edge_mask(int x_left) const
    {
        if (TRANS) return (unsigned)min(max((x_left - x0 + P_X - 1) / P_X, 0), N_X);
        return 4 * min(max(x_left - x0, 0), V);  // (N_X is 1: one place along x)
    }

    // copy_sub within edge_mask's answer `ok`: past x_left the stage's elements are zeros.
    __device__ __forceinline__ void copy_sub_edge(int i, unsigned d_off, long long ld, bool has, unsigned ok) const
    {
        const int ix = i % N_X, ik = i / N_X;
        const unsigned d = dst + d_off + 4 * (ik * P_K * LDS + ix * P_X);
        const float* s = src + (TRANS ? ix * P_X * ld + ik * P_K : ik * P_K * ld + ix * P_X);
        const unsigned bytes = has ? (TRANS ? ((unsigned)ix < ok ? 4u : 0u) : ok) : 0u;
        if (V == 4) {
            cp_async16(d, s, bytes);
        } else if (VEC == 1) {
            cp_async4_if(d, s, bytes != 0);
        } else {
            cp_async4(d, s, bytes);
        }
    }
};

// The opening of a pipelined kernel, the same in every family, in two parts (a family declares its own lane
// coordinates in between). FASTMM_PIPELINE_WARP: the copiers' types, this thread's warp and the origin of its warp
// tile (CopyA, CopyB, tid, warp, lane, wm0, wn0). FASTMM_PIPELINE_TILE: the block's tile and batch item, each
// operand's leading dimension (the stride that is not 1) and its copier at K-tile 0 of the tile (bm, bn, z, a, b,
// c, lda, ldb, smem0, copy_a, copy_b, m_left, n_left, num_k_tiles, STAGE_BYTES; the family defines LDA_S and
// STAGE_FLOATS).
#define FASTMM_PIPELINE_WARP                                                                  \
    using CopyA = SliceCopy<BM, A_T == 0>;                                                    \
    using CopyB = SliceCopy<BN, B_T == 1>;                                                    \
    const int tid = threadIdx.x;                                                              \
    const int warp = tid / 32, lane = tid % 32;                                               \
    const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN

#define FASTMM_PIPELINE_TILE(smem)                                                            \
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;                                     \
    const int z = z0 + blockIdx.z;                                                            \
    const float* a = A + fastmm_batch_offset(z, batch_inner, a_sb0, a_sb1);                  \
    const float* b = B + fastmm_batch_offset(z, batch_inner, b_sb0, b_sb1);                  \
    float* c = C + fastmm_batch_offset(z, batch_inner, c_sb0, c_sb1);                        \
    const long long lda = A_T ? a_sk : a_sm;                                                  \
    const long long ldb = B_T ? b_sn : b_sk;                                                  \
    const unsigned smem0 = smem_addr(smem);                                                   \
    CopyA copy_a(a + (A_T ? bm : bm * lda), lda, tid, smem0);                                 \
    CopyB copy_b(b + (B_T ? bn * ldb : bn), ldb, tid, smem0 + 4 * BK * LDA_S);                \
    const int m_left = M - bm, n_left = N - bn;                                               \
    const int num_k_tiles = (K + BK - 1) / BK;                                                \
    constexpr unsigned STAGE_BYTES = 4 * STAGE_FLOATS
