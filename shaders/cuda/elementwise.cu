// Elementwise kernels: the fused activation (`activation_<dtype>_<act>`), the gated linear unit
// (`glu_<dtype>`, SwiGLU's `silu(gate) · up`) and the byte copy that is the bench's bandwidth
// roof (`copy_bytes`).
//
// Both move 16 bytes per load and store (4 f32 or 8 f16/bf16 elements) in a grid-stride
// loop; the buffers start at allocation boundaries (256-byte aligned), so every full vector is
// aligned, and the last partial vector falls back to element accesses.
#include "common.cuh"

template <typename T> struct Vec16 { T v[16 / sizeof(T)]; };

// The activation kernels are specialised to their activation (`activation_<dtype>_<act>`): the
// activation is a template constant, so each element's code is straight-line, and the audit
// can count the instructions per element of each one (the "Activation cost" table in
// shaders/cuda/README.md). Full vectors go through one of three grid-stride loops chosen once
// per thread: no bias; a 16-byte bias vector per 16-byte input vector (bias_len a multiple of
// V: the vector's V elements then sit at bias[bi..bi + V), aligned, since every buffer start is
// 16-byte aligned); or one bias element per element, its index stepped with a wrap. Bias
// indices are 32-bit (the host refuses bias_len ≥ 2^31): one 64-bit remainder per thread
// before the loop gives the first index and the per-stride step, then adds and a compare.
// The last len % V elements (fewer than V) are done one per thread by the first block.
template <typename T, u32 ACT, int BIAS>
__device__ __forceinline__ void activation_loop(const ActParams& p, const T* x, T* out, i64 nfull) {
    constexpr int V = 16 / sizeof(T);
    const T* bias = (const T*)p.bias;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    i64 vi = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const u32 bl = (u32)p.bias_len;
    // bi < bl and step < bl ≤ 2^31, so bi + step does not wrap in 32 bits.
    u32 bi = BIAS ? (u32)((vi * V) % p.bias_len) : 0u;
    const u32 step = BIAS ? (u32)((stride * V) % p.bias_len) : 0u;
    for (; vi < nfull; vi += stride) {
        const i64 i0 = vi * V;
        __align__(16) Vec16<T> in, b, res;
        *(uint4*)&in = *(const uint4*)(x + i0);
        if (BIAS == 1) *(uint4*)&b = *(const uint4*)(bias + bi);
        u32 bj = bi;
#pragma unroll
        for (int j = 0; j < V; j++) {
            float v = to_f32(in.v[j]);
            if (BIAS == 1) v = __fadd_rn(v, to_f32(b.v[j]));
            if (BIAS == 2) {
                v = __fadd_rn(v, to_f32(bias[bj]));
                bj = bj + 1 == bl ? 0u : bj + 1;
            }
            res.v[j] = from_f32<T>(activate(ACT, v));
        }
        *(uint4*)(out + i0) = *(const uint4*)&res;
        if (BIAS) {
            bi += step;
            bi = bi >= bl ? bi - bl : bi;
        }
    }
}

template <typename T, u32 ACT> __device__ __forceinline__ void activation_kernel(const ActParams& p) {
    constexpr int V = 16 / sizeof(T);
    const T* x = (const T*)p.x;
    T* out = (T*)p.out;
    const i64 nfull = p.len / V;
    if (p.bias_len == 0) activation_loop<T, ACT, 0>(p, x, out, nfull);
    else if (p.bias_len % V == 0) activation_loop<T, ACT, 1>(p, x, out, nfull);
    else activation_loop<T, ACT, 2>(p, x, out, nfull);
    const i64 i = nfull * V + threadIdx.x;
    if (blockIdx.x == 0 && i < p.len) {
        float v = to_f32(x[i]);
        if (p.bias_len > 0) v = __fadd_rn(v, to_f32(((const T*)p.bias)[i % p.bias_len]));
        out[i] = from_f32<T>(activate(ACT, v));
    }
}

#define ACTIVATION_ENTRY(DT, T, NAME, ACT)                                                                             \
    extern "C" __global__ void __launch_bounds__(256) activation_##DT##_##NAME(const ActParams p) {                  \
        activation_kernel<T, ACT>(p);                                                                                  \
    }
#define ACTIVATION_ENTRIES(DT, T)                                                                                      \
    ACTIVATION_ENTRY(DT, T, none, ACT_NONE)                                                                            \
    ACTIVATION_ENTRY(DT, T, relu, ACT_RELU)                                                                            \
    ACTIVATION_ENTRY(DT, T, relu6, ACT_RELU6)                                                                          \
    ACTIVATION_ENTRY(DT, T, gelu, ACT_GELU)                                                                            \
    ACTIVATION_ENTRY(DT, T, gelu_tanh, ACT_GELU_TANH)                                                                  \
    ACTIVATION_ENTRY(DT, T, silu, ACT_SILU)

ACTIVATION_ENTRIES(f32, float)
ACTIVATION_ENTRIES(f16, f16)
ACTIVATION_ENTRIES(bf16, bf16)

// GLU: each thread step makes V = 16 / sizeof(T) consecutive outputs. With `p.vec` (f a multiple
// of V) they lie in one row and the gate and up halves are one aligned 16-byte load each;
// otherwise element by element (an output vector may cross a row end).
template <typename T> __device__ __forceinline__ void glu_kernel(const GluParams& p) {
    constexpr int V = 16 / sizeof(T);
    const T* h = (const T*)p.h;
    T* out = (T*)p.out;
    const i64 len = p.rows * p.f;
    const i64 nvec = (len + V - 1) / V;
    for (i64 vi = (i64)blockIdx.x * blockDim.x + threadIdx.x; vi < nvec; vi += (i64)gridDim.x * blockDim.x) {
        const i64 i0 = vi * V;
        if (p.vec) {
            const i64 r = i0 / p.f;
            const i64 gate = r * 2 * p.f + (i0 - r * p.f);
            __align__(16) Vec16<T> g, u, res;
            *(uint4*)&g = *(const uint4*)(h + gate);
            *(uint4*)&u = *(const uint4*)(h + gate + p.f);
            for (int j = 0; j < V; j++)
                res.v[j] = from_f32<T>(__fmul_rn(activate(p.act, to_f32(g.v[j])), to_f32(u.v[j])));
            *(uint4*)(out + i0) = *(const uint4*)&res;
        } else {
            const i64 end = i0 + V < len ? i0 + V : len;
            for (i64 i = i0; i < end; i++) {
                const i64 r = i / p.f;
                const i64 gate = r * 2 * p.f + (i - r * p.f);
                out[i] = from_f32<T>(__fmul_rn(activate(p.act, to_f32(h[gate])), to_f32(h[gate + p.f])));
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) glu_f32(const GluParams p) { glu_kernel<float>(p); }
extern "C" __global__ void __launch_bounds__(256) glu_f16(const GluParams p) { glu_kernel<f16>(p); }
extern "C" __global__ void __launch_bounds__(256) glu_bf16(const GluParams p) { glu_kernel<bf16>(p); }

extern "C" __global__ void __launch_bounds__(256) copy_bytes(const CopyParams p) {
    const unsigned char* src = (const unsigned char*)p.src;
    unsigned char* dst = (unsigned char*)p.dst;
    const i64 nvec = p.bytes / 16;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride)
        ((uint4*)dst)[i] = ((const uint4*)src)[i];
    // The tail of fewer than 16 bytes, one byte per thread of the first block.
    const i64 tail = nvec * 16 + (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (blockIdx.x == 0 && tail < p.bytes) dst[tail] = src[tail];
}
