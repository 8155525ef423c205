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
    // Weight element (oc, tap) is at oc·w_ch + tap·w_tap: [C·m, 1, kh, kw] or packed [kh, kw, C·m]
    // (the launch checks that C·m·kh·kw fits i32, so these indices are 32-bit).
    i32 w_tap, w_ch;
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
// Activations: `Activation::apply_f32` (crates/kernels/src/activation.rs), except that GELU (erf
// form), GELU-tanh and SiLU use the SFU's `ex2.approx`/`rcp.approx` (proven inside
// `gelu_error_bound` and `silu_error_bound` by the host models in xtask/src/fast_gelu_erf.rs,
// fast_gelu.rs and fast_silu.rs). No activation uses `expf` or an IEEE division. The kernels
// are not built with fast math (NVRTC's defaults, no `-ftz`), so the plain f32 operations below
// are IEEE and keep subnormals.

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
// max(x, y) that returns NaN if either is NaN (`max.NaN`, sm_80+; `fmaxf` returns the other).
__device__ __forceinline__ float fmax_nan(float x, float y) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    return r;
}

// GELU, erf form, x·Φ(x) with Φ the normal CDF. With a = min(|x|, 13.3) and q = Φ(−a):
// gelu(x) = x − a·q for x ≥ 0 and x·q for x < 0, that is max(x, 0) + min(x, −a)·q, one FFMA
// (the 1 − q of the positive side never rounds on its own, and the negative tail keeps its
// relative accuracy: no cancellation). q = 2^y with y = log2 Φ(−a) ≈ −1 + N(a)/D(a), a rational
// function of type (5, 3) (N(0) = 0, D(0) = 1): one `rcp.approx` and one `ex2.approx`. Both
// polynomials are evaluated by Horner for a ≥ 0 only, where N's coefficients are all negative and
// D's all positive, so no step cancels. The coefficients are a weighted minimax fit of log2 Φ(−a)
// on [0, 13.3] (weight 1/(5e-7·(1 + a²) − 3.6e-7), the bound left after the SFU's and the
// roundings' share, up to a = 11.7 where |gelu| falls below 1e-30; loose beyond), by linearised
// LP iterations in f64 against mpmath values, then rounded to f32: xtask/src/fast_gelu_erf_fit.py
// (numpy, scipy, mpmath; run by hand, not by the build). Of total degree 7, types (4, 3) and
// (5, 2) miss that weighted tolerance by 2.6 times; a single polynomial in a needed degree 13–14
// and then lost it to cancellation in f32 near a = 11 (log Φ(−a) is singular at the zeros of
// Φ(−a), a ≈ −1.9 ± 2.8i, close to the interval). 13.3 is past
// 2^y = 2^-132: there `ex2.approx.ftz` flushes q to 0 and the floor makes it 2^-149, so
// min(x, −a)·q is at most 2^128·2^-149 ≈ 4.8e-7 for every finite x (inside the 1e-6 absolute
// bound) and gelu(−Inf) = −Inf·2^-149 = −Inf, as the scalar form; +Inf gives +Inf (a = 13.3, so
// no Inf·0), and NaN gives NaN through `max.NaN`. Every operation is an `__f*_rn` (no
// contraction), so the host model in xtask (`fast_gelu_erf.rs`) computes the same roundings with
// the two SFU instructions at their worst errors; no branch per element.
__device__ __forceinline__ float gelu_erf(float x) {
    const float a = fminf(fabsf(x), 13.3f);
    float n = __fmaf_rn(-0.00908084959f, a, -0.0996252596f);
    n = __fmaf_rn(n, a, -0.464242965f);
    n = __fmaf_rn(n, a, -1.09575653f);
    n = __fmaf_rn(n, a, -1.15110338f);
    n = __fmul_rn(n, a);
    float d = __fmaf_rn(0.0125988815f, a, 0.137181506f);
    d = __fmaf_rn(d, a, 0.552969098f);
    d = __fmaf_rn(d, a, 1.0f);
    const float y = __fmaf_rn(n, rcp_approx(d), -1.0f);
    // 2^-149, the smallest subnormal (the kernels keep subnormals: no -ftz).
    const float q = fmaxf(ex2_approx(y), 1.40129846e-45f);
    return __fmaf_rn(fminf(x, -a), q, fmax_nan(x, 0.0f));
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

// Element (bt, row, col) of split `split`'s plane in a GEMV split-K workspace
// `[splits][batch][M][N]` of f32 (`batch` the launch's): gemv.cu and qmatmul.cu store there,
// `gemv_finalize_<T>` adds the planes in split order.
__device__ __forceinline__ i64 gemv_ws_index(const MatmulParams& p, int split, i64 bt, int row, int col) {
    return (((i64)split * p.batch + bt) * p.m + row) * (i64)p.n + col;
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
