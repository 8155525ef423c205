// Shared definitions of tilekit's CUDA kernels: parameter blocks, storage conversions and the
// fused activations.
//
// The kernels include no CUDA header at all. Conversions between f32 and the 16-bit storage
// types are single PTX instructions written inline, so `cargo xtask ptx` needs only NVRTC (no
// toolkit headers) and the PTX does not depend on the header version.
//
// Every parameter block here has a `#[repr(C)]` twin in
// `crates/kernels/src/catalogue/cuda.rs`; the two must change together (the Rust side checks
// the sizes in a unit test).
#pragma once

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef int i32;
typedef unsigned short u16;

// Activation codes, as `Activation::code` in `crates/kernels/src/activation.rs`.
#define ACT_NONE 0u
#define ACT_RELU 1u
#define ACT_RELU6 2u
#define ACT_GELU 3u
#define ACT_GELU_TANH 4u
#define ACT_SILU 5u

// Flags of `MatmulParams::flags`.
#define MM_TRANS_A 1u
#define MM_TRANS_B 2u
#define MM_HAS_BIAS 4u
#define MM_HAS_C 8u
// MM_A_VEC, MM_B_VEC: the operand's offset, leading dimension and batch stride are multiples
// of 16 bytes' worth of elements, so 128-bit loads are aligned wherever the column index is a
// multiple of the vector width. MM_OUT_VEC: the same for `out` in multiples of 4 elements (the
// epilogue stores 4 outputs at once).
#define MM_A_VEC 16u
#define MM_B_VEC 32u
#define MM_OUT_VEC 64u

// `out = act(alpha·op(A)·op(B) + bias + beta·C)`, element (r, c) of batch b of an operand at
// `off + b·bs + r·ld + c` (see `MatmulDesc`). Pointers are device addresses (0 = absent).
struct MatmulParams {
    u64 a, b, bias, c, out;
    i64 a_off, a_ld, a_bs;
    i64 b_off, b_ld, b_bs;
    i64 c_off, c_ld, c_bs;
    i64 o_off, o_ld, o_bs;
    i64 bias_off;
    i32 m, n, k, batch;
    float alpha, beta;
    u32 act, flags;
};

// A depthwise convolution (see `Conv2dDesc`); `work` is the number of thread work items.
// `vec`: 16-byte vectors of V = 16 / sizeof(T) elements are allowed. NHWC: multiplier 1,
// channels a multiple of V and both tensors 16-byte aligned, so a thread's V channels are one
// aligned vector in the input and the output. NCHW: a 3-wide filter, left pad 1, dilation 1,
// stride 1 or 2, width a multiple of V and the input 16-byte aligned (`dw_nchw_vec`).
struct ConvParams {
    u64 input, weight, bias, out;
    i64 work;
    i32 batch, channels, height, width, multiplier, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow;
    u32 act, has_bias, vec;
};

// `out[i] = act(x[i] + bias[i % bias_len])` (bias_len 0 = no bias).
struct ActParams {
    u64 x, bias, out;
    i64 len, bias_len;
    u32 act, pad0;
};

// `out[r, c] = act(h[r, c]) · h[r, f + c]`: h is [rows, 2f], out is [rows, f] (see `GluDesc`).
// `vec`: f is a multiple of the 16-byte vector (so every vector of out lies in one row and
// both of its h vectors are aligned).
struct GluParams {
    u64 h, out;
    i64 rows, f;
    u32 act, vec;
};

// A plain byte copy (the bandwidth roof).
struct CopyParams {
    u64 src, dst;
    i64 bytes;
};

// ---------------------------------------------------------------------------------------------
// Storage types. `f16` and `bf16` are 16-bit payloads; arithmetic is always in f32, and every
// store rounds once, to nearest even.

struct f16 { u16 bits; };
struct bf16 { u16 bits; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(f16 x) {
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x.bits));
    return r;
}
__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float(((u32)x.bits) << 16); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ f16 from_f32<f16>(float x) {
    f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) {
    // `cvt.rn.bf16.f32` (sm_80+) rounds to nearest even and keeps NaN a NaN.
    bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}

// Rounds an f32 to the nearest bf16 (even on ties) and returns the 16-bit pattern: the input
// rounding of the bf16-compute policy.
__device__ __forceinline__ u16 f32_to_bf16_bits(float x) { return from_f32<bf16>(x).bits; }

template <typename T> __device__ __forceinline__ T load_elem(const T* p) { return *p; }

// ---------------------------------------------------------------------------------------------
// Activations: `Activation::apply_f32` (crates/kernels/src/activation.rs), except that GELU-tanh
// and SiLU use the SFU's `ex2.approx`/`rcp.approx` (proven inside `gelu_error_bound` and
// `silu_error_bound` by the host models in xtask/src/fast_gelu.rs and fast_silu.rs). `expf` is the accurate libdevice form (the kernels are not built
// with fast math). The erf form keeps `expf`: with `ex2.approx` its error near x = 0 would pass
// the bound's 5e-7 relative there (the host model measured up to 1.7 times the bound).

// erfc(z) for z >= 0 by the Chebyshev fit of Numerical Recipes §6.2 (fractional error below
// 1.2e-7); z is clamped to 10, where erfc is below f32's smallest normal number.
__device__ __forceinline__ float erfc_nonneg(float z) {
    z = fminf(z, 10.0f);
    float t = 1.0f / (1.0f + 0.5f * z);
    // The coefficients exactly as `erfc_nonneg_f32` spells them, so both round to the same f32.
    float p = -1.2655122f +
              t * (1.0000237f +
                   t * (0.37409196f +
                        t * (0.09678418f +
                             t * (-0.18628806f +
                                  t * (0.27886807f +
                                       t * (-1.13520398f +
                                            t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
    return t * expf(p - z * z);
}

__device__ __forceinline__ float gelu_erf(float x) {
    float z = fabsf(x) * 0.70710678118654752f;
    float e = erfc_nonneg(z);
    // 1 + erf(x/√2) is 2 − erfc(z) for x >= 0 and erfc(z) for x < 0: no cancellation.
    return x >= 0.0f ? 0.5f * x * (2.0f - e) : 0.5f * x * e;
}

// 2^x and 1/x on the special-function unit: `ex2.approx.ftz.f32` (relative error at most
// 2^-22, the 2 ulp of exp2f, which is this instruction) and `rcp.approx.ftz.f32` (1 ulp). The
// `.ftz` forms are one `MUFU` each; without `.ftz` ptxas wraps each in range checks and
// rescaling for subnormal results (six more instructions per call, seen in the SASS). Where
// they are used below, a subnormal result flushed to zero only ever meets results whose true
// value is below 1e-30 in magnitude (the bounds' absolute part) or a correction below half an
// ulp of x; the host models flush exactly as the instructions do.
__device__ __forceinline__ float ex2_approx(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float rcp_approx(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// GELU, tanh form, as x · sigmoid(2u) with e = exp(−2u) = 2^(−2u·log2 e) from `ex2.approx` and
// 1/(1 + e) from `rcp.approx` instead of the accurate expf and the IEEE division (with its
// slow path). For x ≥ 0 it is x − x·e/(1 + e): the correction is at most
// x/2 and vanishes as x grows, so the 1-ulp reciprocal never touches the large results that
// the 1e-6 absolute bound covers; for x < 0 it is x/(1 + e), where the bound is relative.
// Every operation is spelled out with `__f*_rn` (no contraction), so the host model in
// xtask (`fast_gelu.rs`) computes the same roundings and proves the `gelu_error_bound` with the
// two instructions at their worst errors. Beyond ±20 the sigmoid has saturated and x³ could
// overflow (xc), and 2u is clamped to ±87 (not ±88 as `gelu_tanh_f32`): then 1/(1 + e) stays a
// normal number (above 2^-125.6), so the flushing `rcp.approx.ftz` keeps x < 0 finite results
// and gelu(−Inf) = −Inf · q = −Inf, as the scalar form; the true values there are below 1e-36.
__device__ __forceinline__ float gelu_tanh(float x) {
    const float xc = fminf(fmaxf(x, -20.0f), 20.0f);
    const float u = __fmul_rn(__fmul_rn(0.7978846f, xc), __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, xc), xc)));
    const float t = fminf(fmaxf(__fmul_rn(-2.0f, u), -87.0f), 87.0f);
    const float e = ex2_approx(__fmul_rn(t, 1.44269504f));
    const float q = rcp_approx(__fadd_rn(1.0f, e));
    // xc, not x, in the correction: +Inf · 0 would be NaN, and beyond 20 the correction is 0.
    const float pos = __fmaf_rn(-__fmul_rn(xc, e), q, x), neg = __fmul_rn(x, q);
    return x >= 0.0f ? pos : neg;
}

// SiLU, x · sigmoid(x), in `silu_f32`'s form with the SFU in place of the accurate `expf` and
// the IEEE division: e = exp(min(−x, 88)) = 2^(min(−x, 88)·log2 e) from `ex2.approx` and
// q = 1/(1 + e) from `rcp.approx`; x − min(x, 88)·e·q for x ≥ 0 (the correction is at most
// x/2 and vanishes as x grows), x·q for −88 ≤ x < 0 (no cancellation in the tail) and −0
// below. Every other operation is an `__f*_rn` (no contraction), so the host model in xtask
// (`fast_silu.rs`) computes the same roundings and proves `silu_error_bound` with both
// instructions at their documented worst errors. NaN gives NaN (fminf(NaN, 88) is 88, and
// x·q keeps the NaN), +Inf gives +Inf (e = ex2(−Inf) = 0), −Inf gives −0.
__device__ __forceinline__ float silu(float x) {
    const float e = ex2_approx(__fmul_rn(fminf(-x, 88.0f), 1.44269504f));
    const float q = rcp_approx(__fadd_rn(1.0f, e));
    // Both sides are computed and one is selected: no branch per element.
    const float pos = __fmaf_rn(-__fmul_rn(fminf(x, 88.0f), e), q, x);
    const float neg = x < -88.0f ? -0.0f : __fmul_rn(x, q);
    return x >= 0.0f ? pos : neg;
}

__device__ __forceinline__ float activate(u32 act, float x) {
    switch (act) {
    case ACT_RELU:
        // NaN propagates: `x > 0 || x != x`.
        return (x > 0.0f || x != x) ? x : 0.0f;
    case ACT_RELU6:
        return (x != x) ? x : fminf(fmaxf(x, 0.0f), 6.0f);
    case ACT_GELU:
        return gelu_erf(x);
    case ACT_GELU_TANH:
        return gelu_tanh(x);
    case ACT_SILU:
        return silu(x);
    default:
        return x;
    }
}

// ---------------------------------------------------------------------------------------------
// Asynchronous copies (sm_80+). `src_size` 0 fills the destination with zeros without reading
// global memory: the out-of-bounds guard of the tile loaders.

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
                 "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
                 "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
// Waits until at most one committed group is still in flight (the prefetch of the next tile).
__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::); }
// Waits until at most N committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Threadblock swizzle for L2 reuse: blocks are launched x-fastest, so the natural order walks
// a whole row of output tiles (reading all of B) before the next row. Remapped, consecutive
// blocks walk a band of `BAND` tile rows column by column, so the A rows of the band and each
// column tile of B are read by several blocks close in time. A bijection on the grid: the
// last band may be narrower. Returns (tile row, tile column).
template <int BAND> __device__ __forceinline__ int2 swizzled_tile() {
    const int gx = gridDim.x, gy = gridDim.y;
    const int lin = blockIdx.y * gx + blockIdx.x;
    const int band = lin / (BAND * gx), rem = lin % (BAND * gx);
    const int rows = gy - band * BAND < BAND ? gy - band * BAND : BAND;
    return make_int2(band * BAND + rem % rows, rem / rows);
}
#define TILE_BAND 8

// ---------------------------------------------------------------------------------------------
// The matmul epilogue, shared by every matmul kernel: `act(alpha·acc + bias[col] + beta·C)`,
// rounded once to the storage type by the caller's store.

template <typename T>
__device__ __forceinline__ float matmul_epilogue(const MatmulParams& p, float acc, i64 batch, i64 row, i64 col) {
    float v = p.alpha * acc;
    if (p.flags & MM_HAS_BIAS) v += to_f32(((const T*)p.bias)[p.bias_off + col]);
    if (p.flags & MM_HAS_C) v += p.beta * to_f32(((const T*)p.c)[p.c_off + batch * p.c_bs + row * p.c_ld + col]);
    return activate(p.act, v);
}

template <typename T> __device__ __forceinline__ T* out_ptr(const MatmulParams& p, i64 batch, i64 row, i64 col) {
    return (T*)p.out + p.o_off + batch * p.o_bs + row * p.o_ld + col;
}

// Stores 4 consecutive outputs (`n_valid` of them inside the matrix): one 16- or 8-byte store
// where the output view allows it.
template <typename T> __device__ __forceinline__ void store4(const MatmulParams& p, T* o, const float (&v)[4], int n_valid) {
    if ((p.flags & MM_OUT_VEC) && n_valid == 4) {
        if (sizeof(T) == 4) {
            *(float4*)o = make_float4(v[0], v[1], v[2], v[3]);
        } else {
            u16 b[4];
            for (int j = 0; j < 4; j++) {
                T t = from_f32<T>(v[j]);
                b[j] = *(const u16*)&t;
            }
            *(uint2*)o = make_uint2((u32)b[0] | ((u32)b[1] << 16), (u32)b[2] | ((u32)b[3] << 16));
        }
        return;
    }
    for (int j = 0; j < n_valid; j++) o[j] = from_f32<T>(v[j]);
}

// The epilogue goes through shared memory: the accumulators of 64 rows × 128 columns of the
// block tile are parked there, then every thread walks the slab 4 columns at a time. Stores
// become row-contiguous across a warp (coalesced) whatever the MMA or register-tile layout, and
// the epilogue, with its activation, is compiled once instead of once per accumulator (which
// had made the tensor-core PTX several megabytes).
#define EPI_ROWS 64
#define EPI_COLS 128
#define EPI_STRIDE (EPI_COLS + 4)
#define EPI_BYTES (EPI_ROWS * EPI_STRIDE * 4)

// `row_of(lr)` maps a slab row to its row inside the block tile.
template <typename T, typename RowMap>
__device__ __forceinline__ void epilogue_slab(const MatmulParams& p, const float* slab, i64 bt, int m0, int n0,
                                              RowMap row_of, int tid, int nthreads) {
#pragma unroll 1
    for (int e = tid; e < EPI_ROWS * EPI_COLS / 4; e += nthreads) {
        const int lr = e / (EPI_COLS / 4), c4 = (e % (EPI_COLS / 4)) * 4;
        const int row = m0 + row_of(lr), col = n0 + c4;
        if (row >= p.m || col >= p.n) continue;
        const float4 a = *(const float4*)&slab[lr * EPI_STRIDE + c4];
        const float acc[4] = {a.x, a.y, a.z, a.w};
        const int n_valid = p.n - col < 4 ? p.n - col : 4;
        float v[4];
        for (int j = 0; j < 4; j++) v[j] = j < n_valid ? matmul_epilogue<T>(p, acc[j], bt, row, col + j) : 0.0f;
        store4<T>(p, out_ptr<T>(p, bt, row, col), v, n_valid);
    }
}
