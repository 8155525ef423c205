// Elementwise kernels: the fused activation (`activation_<dtype>`), the gated linear unit
// (`glu_<dtype>`, SwiGLU's `silu(gate) · up`) and the byte copy that is the bench's bandwidth
// roof (`copy_bytes`).
//
// Both move 16 bytes per load and store (4 f32 or 8 f16/bf16 elements) in a grid-stride
// loop; the buffers start at allocation boundaries (256-byte aligned), so every full vector is
// aligned, and the last partial vector falls back to element accesses.
#include "common.cuh"

template <typename T> struct Vec16 { T v[16 / sizeof(T)]; };

template <typename T> __device__ __forceinline__ void activation_kernel(const ActParams& p) {
    constexpr int V = 16 / sizeof(T);
    const T* x = (const T*)p.x;
    const T* bias = (const T*)p.bias;
    T* out = (T*)p.out;
    const i64 nvec = (p.len + V - 1) / V;
    for (i64 vi = (i64)blockIdx.x * blockDim.x + threadIdx.x; vi < nvec; vi += (i64)gridDim.x * blockDim.x) {
        const i64 i0 = vi * V;
        // The bias index of the first element, then stepped with a wrap instead of a division
        // per element.
        i64 bi = p.bias_len > 0 ? i0 % p.bias_len : 0;
        if (i0 + V <= p.len) {
            __align__(16) Vec16<T> in;
            *(uint4*)&in = *(const uint4*)(x + i0);
            __align__(16) Vec16<T> res;
            for (int j = 0; j < V; j++) {
                float v = to_f32(in.v[j]);
                if (p.bias_len > 0) {
                    v += to_f32(bias[bi]);
                    bi = bi + 1 == p.bias_len ? 0 : bi + 1;
                }
                res.v[j] = from_f32<T>(activate(p.act, v));
            }
            *(uint4*)(out + i0) = *(const uint4*)&res;
        } else {
            for (i64 i = i0; i < p.len; i++) {
                float v = to_f32(x[i]);
                if (p.bias_len > 0) {
                    v += to_f32(bias[bi]);
                    bi = bi + 1 == p.bias_len ? 0 : bi + 1;
                }
                out[i] = from_f32<T>(activate(p.act, v));
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) activation_f32(const ActParams p) { activation_kernel<float>(p); }
extern "C" __global__ void __launch_bounds__(256) activation_f16(const ActParams p) { activation_kernel<f16>(p); }
extern "C" __global__ void __launch_bounds__(256) activation_bf16(const ActParams p) { activation_kernel<bf16>(p); }

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
