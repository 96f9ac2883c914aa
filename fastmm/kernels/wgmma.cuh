// Hopper's asynchronous instructions as 6_wgmma.cu and 8_int8_wgmma.cu use them (prepended after common.cuh by
// fastmm/kernels/build.py): warpgroup MMA (wgmma.mma_async, sm_90a) on TF32 or INT8 operands in 128-byte-swizzled shared
// memory, barriers in shared memory (mbarrier) and bulk copies that complete on them. A macro BN (128 or 256) picks
// wgmma_tile's and wgmma_s8_tile's n.

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

// The accumulators of one wgmma, 64 or 128 registers per thread: their PTX operands %0 ... and the C arrays' elements
// bound to them under constraint K ("+f": FP32, "+r": int32).
#define WGMMA_REGS64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_REGS128 WGMMA_REGS64 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WGMMA_D64(K) \
    K(d[0]), K(d[1]), K(d[2]), K(d[3]), K(d[4]), K(d[5]), K(d[6]), K(d[7]), \
    K(d[8]), K(d[9]), K(d[10]), K(d[11]), K(d[12]), K(d[13]), K(d[14]), K(d[15]), \
    K(d[16]), K(d[17]), K(d[18]), K(d[19]), K(d[20]), K(d[21]), K(d[22]), K(d[23]), \
    K(d[24]), K(d[25]), K(d[26]), K(d[27]), K(d[28]), K(d[29]), K(d[30]), K(d[31]), \
    K(d[32]), K(d[33]), K(d[34]), K(d[35]), K(d[36]), K(d[37]), K(d[38]), K(d[39]), \
    K(d[40]), K(d[41]), K(d[42]), K(d[43]), K(d[44]), K(d[45]), K(d[46]), K(d[47]), \
    K(d[48]), K(d[49]), K(d[50]), K(d[51]), K(d[52]), K(d[53]), K(d[54]), K(d[55]), \
    K(d[56]), K(d[57]), K(d[58]), K(d[59]), K(d[60]), K(d[61]), K(d[62]), K(d[63])
#define WGMMA_D128(K) WGMMA_D64(K), \
    K(d[64]), K(d[65]), K(d[66]), K(d[67]), K(d[68]), K(d[69]), K(d[70]), K(d[71]), \
    K(d[72]), K(d[73]), K(d[74]), K(d[75]), K(d[76]), K(d[77]), K(d[78]), K(d[79]), \
    K(d[80]), K(d[81]), K(d[82]), K(d[83]), K(d[84]), K(d[85]), K(d[86]), K(d[87]), \
    K(d[88]), K(d[89]), K(d[90]), K(d[91]), K(d[92]), K(d[93]), K(d[94]), K(d[95]), \
    K(d[96]), K(d[97]), K(d[98]), K(d[99]), K(d[100]), K(d[101]), K(d[102]), K(d[103]), \
    K(d[104]), K(d[105]), K(d[106]), K(d[107]), K(d[108]), K(d[109]), K(d[110]), K(d[111]), \
    K(d[112]), K(d[113]), K(d[114]), K(d[115]), K(d[116]), K(d[117]), K(d[118]), K(d[119]), \
    K(d[120]), K(d[121]), K(d[122]), K(d[123]), K(d[124]), K(d[125]), K(d[126]), K(d[127])

// D (64 x BN, this warpgroup's) = A * B + (scale_d ? D : 0), A and B K-major in swizzled shared memory.
__device__ __forceinline__ void wgmma_n128(float (&d)[64], unsigned long long a, unsigned long long b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {" WGMMA_REGS64 "}, %64, %65, p, 1, 1;\n}\n"
                 : WGMMA_D64("+f") : "l"(a), "l"(b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_n256(float (&d)[128], unsigned long long a, unsigned long long b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {" WGMMA_REGS128 "}, %128, %129, p, 1, 1;\n}\n"
                 : WGMMA_D128("+f") : "l"(a), "l"(b), "r"(scale_d));
}

#if BN == 128
#define wgmma_tile wgmma_n128
#else
#define wgmma_tile wgmma_n256
#endif

// The same with A from registers (6_wgmma.cu's A_RS): `a` holds this thread's four TF32 values of A's 64 x 8 slice,
// (16w + g, t), (16w + g + 8, t), (16w + g, t + 4), (16w + g + 8, t + 4) for warp w of the warpgroup and lane 4g + t;
// B K-major in swizzled shared memory. A's registers are read until the group's wgmma_wait says it is done.
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const unsigned (&a)[4], unsigned long long b,
                                              int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {" WGMMA_REGS64 "}, {%64, %65, %66, %67}, %68, "
                 "p, 1, 1;\n}\n"
                 : WGMMA_D64("+f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_rs_n256(float (&d)[128], const unsigned (&a)[4], unsigned long long b,
                                              int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {" WGMMA_REGS128 "}, {%128, %129, %130, %131}, "
                 "%132, p, 1, 1;\n}\n"
                 : WGMMA_D128("+f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

#if BN == 128
#define wgmma_rs_tile wgmma_rs_n128
#else
#define wgmma_rs_tile wgmma_rs_n256
#endif

// The same on INT8 operands (8_int8_wgmma.cu): D (64 x BN, int32) = A * B + (scale_d ? D : 0), exact, 32 values of k
// per instruction; A and B K-major (the only layout wgmma reads 8-bit integers in), a swizzled row 128 values of k.
__device__ __forceinline__ void wgmma_s8_n128(int (&d)[64], unsigned long long a, unsigned long long b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {" WGMMA_REGS64 "}, %64, %65, p;\n}\n"
                 : WGMMA_D64("+r") : "l"(a), "l"(b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_s8_n256(int (&d)[128], unsigned long long a, unsigned long long b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 {" WGMMA_REGS128 "}, %128, %129, p;\n}\n"
                 : WGMMA_D128("+r") : "l"(a), "l"(b), "r"(scale_d));
}

#if BN == 128
#define wgmma_s8_tile wgmma_s8_n128
#else
#define wgmma_s8_tile wgmma_s8_n256
#endif


// Element (r, k) of a swizzled tile.
__device__ __forceinline__ float swizzled(const unsigned char* tile, int r, int k)
{
    return *reinterpret_cast<const float*>(tile + r * 128 + (((k >> 2) ^ (r & 7)) << 4) + (k & 3) * 4);
}

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// One arrival that also expects `bytes` more to be written by bulk copies before the phase completes.
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
    asm volatile(
        "{\n.reg .pred done;\n"
        "LAB_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra LAB_WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// `bytes` (a multiple of 16) from global to shared memory on the TMA engine, counted by barrier `bar`.
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// A tensor map (CUtensorMap: 128 opaque bytes, encoded on the host by cuTensorMapEncodeTiled) passed as a
// __grid_constant__ parameter, and the copy of one 2-D box of it into shared memory, completing on `bar` as
// bulk_copy does: (c0, c1) are the box's first element along the map's inner and outer dimensions. The engine writes
// the box in the map's swizzle and fills what lies outside the tensor with zeros.
struct __align__(64) fastmm_tensor_map { unsigned long long bits[16]; };

__device__ __forceinline__ void tensor_copy_2d(unsigned dst, const fastmm_tensor_map* map, int c0, int c1, unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

__device__ __forceinline__ void tensor_map_prefetch(const fastmm_tensor_map* map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

// Thread-block clusters (8_int8_wgmma.cu's CLUSTER > 1): this block's rank in its cluster, a barrier of every thread of
// every block of the cluster, and an arrival on the barrier at the same place in block `rank`'s shared memory.
__device__ __forceinline__ unsigned cluster_rank()
{
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// (The default .release.cta, as CUTLASS's ClusterBarrier::arrive: the stage's only reader, wgmma, is finished by
// then. ".release.cluster" made ptxas put a GPU-wide memory barrier before every arrival, in the multiplying warps'
// K loop.)
__device__ __forceinline__ void mbar_arrive_in(unsigned bar, unsigned rank)
{
    asm volatile(
        "{\n.reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar), "r"(rank)
        : "memory");
}

// bulk_copy into the same place of the shared memory of every block of the cluster named in `blocks` (a bit mask),
// each block's barrier at `bar` counting the bytes.
__device__ __forceinline__ void bulk_copy_multicast(unsigned dst, const void* src, unsigned bytes, unsigned bar,
                                                    unsigned short blocks)
{
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;\n"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "h"(blocks) : "memory");
}
