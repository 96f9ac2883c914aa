// Rounding FP32 to TF32 and 3xTF32's split, shared by the tensor-core kernels (5_tf32.cu, which splits fragments in
// registers) and the split pass of the wgmma kernels (pass_tf32_split.cu, which splits whole operands once). Prepended after
// common.cuh by fastmm/kernels/build.py for configurations that use it.

// x rounded to TF32 when x is finite and below FLT_MAX's last TF32 step (see `plain`): to nearest, ties away from
// zero (as cvt.rna.tf32.f32), in FP32 layout with the low 13 bits zero: add half a TF32 step, clear the low bits.
__device__ __forceinline__ unsigned tf32_near(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }

// Whether tf32_near(x) is tf32_big(x) up to tiny values: false for inf, NaN (the compare is false) and values
// that would round up to inf.
__device__ __forceinline__ bool plain(float x) { return fabsf(x) < __int_as_float(0x7f7ff000); }

// The big part of x: x rounded to TF32, except where rounding would change what an FP32 product does with it:
// a finite x never becomes infinite (near FLT_MAX: truncated instead), a nonzero x never becomes 0 (below 2^-137:
// the smallest TF32 value of its sign, 2^-136, so that inf * x stays inf and not NaN), and a NaN stays a NaN
// (rounding would turn one whose payload lies only in the low 13 bits into inf).
__device__ __forceinline__ unsigned tf32_big(float x)
{
    const unsigned u = __float_as_uint(x), e = u & 0x7fffffffu;
    if (e >= 0x7f7ff000u) return e > 0x7f800000u ? 0x7fffe000u : u & 0xffffe000u;  // NaN; inf, near FLT_MAX
    if (e != 0u && e < 0x1000u) return (u & 0x80000000u) | 0x2000u;                   // tiny
    return tf32_near(x);
}

// 3xTF32's three values of x: big, big for the cross terms (0 for an infinite x), small (0 for an infinite x).
__device__ __forceinline__ void split3(float x, unsigned& big, unsigned& cross, unsigned& small)
{
    big = tf32_big(x);
    const bool inf = fabsf(x) == __int_as_float(0x7f800000);
    small = inf ? 0u : tf32_near(x - __uint_as_float(big));  // (NaN for a NaN x: whatever it rounds to, big is NaN)
    cross = inf ? 0u : big;
}
