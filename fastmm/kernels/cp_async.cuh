// cp.async: copies from global to shared memory that run while the SM computes. Shared by the kernels that stage
// their operands this way (pipeline.cuh's families, 7_few_columns.cu); prepended after common.cuh by
// fastmm/kernels/build.py for configurations that use it.

__device__ __forceinline__ unsigned smem_addr(const void* p)
{
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte copy global -> shared; the bytes past `src_bytes` (0..16) are zero-filled. .cg skips L1: each
// block reads its tiles once, and L2 is where blocks share them.
__device__ __forceinline__ void cp_async16(unsigned dst, const float* src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// 4-byte copy (the only size that can transpose); .ca is the only cache mode cp.async allows at this size.
__device__ __forceinline__ void cp_async4(unsigned dst, const float* src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// A 4-byte copy or zeros: `copy` false zero-fills (cp.async's ignore-src predicate). With a source size in a register
// ptxas also emits the arithmetic for partial sizes, five instructions a copy (1,175 a warp in the prologue of
// 11185x351x148 with A m-contiguous); the predicate costs one compare.
__device__ __forceinline__ void cp_async4_if(unsigned dst, const float* src, bool copy)
{
    asm volatile("{\n .reg .pred p;\n setp.eq.u32 p, %2, 0;\n cp.async.ca.shared.global [%0], [%1], 4, p;\n}\n"
                 ::"r"(dst), "l"(src), "r"((unsigned)copy));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
