// The fused inverted-residual block (see `InvertedResidualDesc` in crates/kernels/src/block.rs):
// expand 1x1 + ReLU6, depthwise 3x3 (padding 1, stride 1 or 2) + ReLU6, projection 1x1, residual,
// in one kernel: `inverted_residual_<dtype>`. The expanded tensor never leaves the SM.
//
// The design is the WGSL kernel's (shaders/wgsl/inverted_residual.wgsl) with CUDA's sizes: a
// block of 256 threads owns a TW x TH = 8 x 8 tile of output pixels of one image and OB = 64
// output channels (grid: x = tiles, y = output-channel blocks, z = images). It walks the hidden
// channels in chunks of HC = 16:
// 1. the chunk's expanded activations over the tile's input footprint (the tile and its 3x3
//    halo: ((TH-1)s+3) x ((TW-1)s+3) pixels, at most 17 x 17) go to shared memory (`e_s`,
//    [channel][pixel], zero in the padding), and the chunk's projection weights are staged
//    (`wp_s`, [output channel][channel], 16-byte loads where the rows allow);
// 2. the depthwise filter + ReLU6 of the chunk for every output pixel goes to `f_s`
//    ([channel][pixel]: a warp reads 32 consecutive pixels of one channel);
// 3. each thread adds the chunk's projection onto its OPI = 16 accumulators in registers (one
//    pixel, 16 consecutive output channels; the weights are a broadcast float4 per 4 channels).
// After the last chunk each thread adds the projection bias and the residual and stores its
// outputs. Only the input, the weights and the output touch memory; the expanded and filtered
// values stay f32 (the unfused chain rounds them to the dtype in between, hence the block's
// documented tolerance). Output-channel blocks recompute the expand and depthwise stages of their
// tile (ceil(C'/64) times: at most 5x for MobileNetV2), the price of keeping the projection's
// accumulators in registers.
//
// Shared memory: e_s 289 x 16 x 4 = 18,496 bytes, f_s 4 KiB, wp_s 4 KiB: 26.5 KiB per block.
// The expand's dot products read x and the expand weights through L1 (a chunk's 16 weight rows
// are at most 16 x C elements; consecutive threads take consecutive footprint pixels of one
// hidden channel, so the weight is a broadcast and NCHW input rows are coalesced), 16 bytes at a
// time when C is a multiple of the vector (`BK_WE_VEC`, and `BK_X_VEC` for NHWC input).
#include "common.cuh"

// Twin: `BlockParams` in crates/kernels/src/catalogue/cuda/block.rs.
struct BlockParams {
    u64 x, we, be, wd, bd, wp, bp, out;
    i32 n0; // the first image of this launch (grids hold at most 65535 images)
    i32 channels, height, width, hidden, out_c, stride, out_h, out_w, tiles_w;
    u32 flags, pad0;
};

#define BK_EXPAND 1u
#define BK_EXPAND_BIAS 2u
#define BK_DW_BIAS 4u
#define BK_PROJECT_BIAS 8u
#define BK_RESIDUAL 16u
#define BK_NHWC 32u
// C is a multiple of the 16-byte vector: expand weight rows load 16 bytes at a time.
#define BK_WE_VEC 64u
// hidden is a multiple of the vector: projection weight rows load 16 bytes at a time.
#define BK_WP_VEC 128u
// NHWC and C a multiple of the vector: a pixel's channels load 16 bytes at a time.
#define BK_X_VEC 256u

#define BK_TW 8
#define BK_TH 8
#define BK_TP 64 // TW * TH
#define BK_HC 16
#define BK_OB 64
#define BK_OPI 16
#define BK_THREADS 256
#define BK_MAX_FOOT 289 // stride 2: (8 - 1) * 2 + 3 = 17 rows of 17

template <typename T> __device__ __forceinline__ float bk_ld(u64 base, i64 i) { return to_f32(((const T*)base)[i]); }

// V = 16 / sizeof(T) elements at `p` (16-byte aligned) as f32.
template <typename T> __device__ __forceinline__ void bk_ld_vec(const T* p, float* v);
template <> __device__ __forceinline__ void bk_ld_vec<float>(const float* p, float* v) {
    const float4 q = __ldg((const float4*)p);
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
}
template <typename T> __device__ __forceinline__ void bk_ld_vec_half(const T* p, float* v) {
    const uint4 q = __ldg((const uint4*)p);
    const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        T lo, hi;
        lo.bits = (u16)(w[i] & 0xffffu);
        hi.bits = (u16)(w[i] >> 16);
        v[2 * i] = to_f32(lo);
        v[2 * i + 1] = to_f32(hi);
    }
}
template <> __device__ __forceinline__ void bk_ld_vec<f16>(const f16* p, float* v) { bk_ld_vec_half(p, v); }
template <> __device__ __forceinline__ void bk_ld_vec<bf16>(const bf16* p, float* v) { bk_ld_vec_half(p, v); }

__device__ __forceinline__ float bk_relu6(float v) { return activate(ACT_RELU6, v); }

template <typename T>
__device__ __forceinline__ i64 bk_x_index(const BlockParams& p, i64 n, i64 c, i64 y, i64 x) {
    return (p.flags & BK_NHWC) ? ((n * p.height + y) * p.width + x) * p.channels + c
                               : ((n * p.channels + c) * p.height + y) * p.width + x;
}

template <typename T> __device__ __forceinline__ void inverted_residual(const BlockParams& p) {
    constexpr int V = 16 / sizeof(T);
    __shared__ __align__(16) float e_s[BK_MAX_FOOT * BK_HC];
    __shared__ __align__(16) float f_s[BK_HC * BK_TP];
    __shared__ __align__(16) float wp_s[BK_OB * BK_HC];
    const int tid = threadIdx.x;
    const i64 n = (i64)p.n0 + blockIdx.z;
    const int oy0 = (blockIdx.x / p.tiles_w) * BK_TH, ox0 = (blockIdx.x % p.tiles_w) * BK_TW;
    const int ob0 = blockIdx.y * BK_OB;
    const int s = p.stride;
    // The footprint's origin in padded coordinates (image row = padded row - 1).
    const int fy0 = oy0 * s, fx0 = ox0 * s;
    const int foot_w = (BK_TW - 1) * s + 3;
    const int foot = ((BK_TH - 1) * s + 3) * foot_w;
    const bool nhwc = p.flags & BK_NHWC;
    // This thread's pixel and output channels.
    const int px = tid % BK_TP, og = (tid / BK_TP) * BK_OPI;
    const int oy = oy0 + px / BK_TW, ox = ox0 + px % BK_TW;
    float acc[BK_OPI];
#pragma unroll
    for (int k = 0; k < BK_OPI; k++) acc[k] = 0.0f;

#pragma unroll 1
    for (int j0 = 0; j0 < p.hidden; j0 += BK_HC) {
        // 1. The expanded chunk over the footprint ([channel][pixel]) ...
#pragma unroll 1
        for (int i = tid; i < foot * BK_HC; i += BK_THREADS) {
            const int jj = i / foot, q = i % foot;
            const int j = j0 + jj;
            const int py = fy0 + q / foot_w, pxx = fx0 + q % foot_w;
            float v = 0.0f;
            if (j < p.hidden && py >= 1 && pxx >= 1 && py <= p.height && pxx <= p.width) {
                const int iy = py - 1, ix = pxx - 1;
                if (p.flags & BK_EXPAND) {
                    float a = (p.flags & BK_EXPAND_BIAS) ? bk_ld<T>(p.be, j) : 0.0f;
                    const T* wrow = (const T*)p.we + (i64)j * p.channels;
                    int c = 0;
                    if (p.flags & BK_WE_VEC) {
                        const bool xv = p.flags & BK_X_VEC;
                        const T* xpix = (const T*)p.x + bk_x_index<T>(p, n, 0, iy, ix);
#pragma unroll 1
                        for (; c + V <= p.channels; c += V) {
                            float w[V], xs[V];
                            bk_ld_vec<T>(wrow + c, w);
                            if (xv) {
                                bk_ld_vec<T>(xpix + c, xs);
                            } else {
#pragma unroll
                                for (int e = 0; e < V; e++) xs[e] = bk_ld<T>(p.x, bk_x_index<T>(p, n, c + e, iy, ix));
                            }
#pragma unroll
                            for (int e = 0; e < V; e++) a = fmaf(w[e], xs[e], a);
                        }
                    }
#pragma unroll 1
                    for (; c < p.channels; c++) a = fmaf(to_f32(wrow[c]), bk_ld<T>(p.x, bk_x_index<T>(p, n, c, iy, ix)), a);
                    v = bk_relu6(a);
                } else {
                    v = bk_ld<T>(p.x, bk_x_index<T>(p, n, j, iy, ix));
                }
            }
            e_s[jj * foot + q] = v;
        }
        // ... and the chunk's projection weights ([output channel][channel]).
#pragma unroll 1
        for (int i = tid; i < BK_OB * (BK_HC / V); i += BK_THREADS) {
            const int ol = i / (BK_HC / V), jv = (i % (BK_HC / V)) * V;
            const int o = ob0 + ol, j = j0 + jv;
            float w[V];
            if ((p.flags & BK_WP_VEC) && o < p.out_c && j + V <= p.hidden) {
                bk_ld_vec<T>((const T*)p.wp + (i64)o * p.hidden + j, w);
            } else {
#pragma unroll
                for (int e = 0; e < V; e++) w[e] = (o < p.out_c && j + e < p.hidden) ? bk_ld<T>(p.wp, (i64)o * p.hidden + j + e) : 0.0f;
            }
#pragma unroll
            for (int e = 0; e < V; e++) wp_s[ol * BK_HC + jv + e] = w[e];
        }
        __syncthreads();
        // 2. Depthwise + ReLU6 for every pixel of the tile ([channel][pixel]).
#pragma unroll 1
        for (int i = tid; i < BK_HC * BK_TP; i += BK_THREADS) {
            const int jj = i / BK_TP, t = i % BK_TP;
            const int j = j0 + jj;
            float a = 0.0f;
            if (j < p.hidden) {
                if (p.flags & BK_DW_BIAS) a = bk_ld<T>(p.bd, j);
                const float* e = e_s + jj * foot + (t / BK_TW) * s * foot_w + (t % BK_TW) * s;
                const T* wd = (const T*)p.wd + (i64)j * 9;
#pragma unroll
                for (int ky = 0; ky < 3; ky++)
#pragma unroll
                    for (int kx = 0; kx < 3; kx++) a = fmaf(to_f32(wd[ky * 3 + kx]), e[ky * foot_w + kx], a);
            }
            f_s[jj * BK_TP + t] = bk_relu6(a);
        }
        __syncthreads();
        // 3. The chunk's projection onto this thread's accumulators.
#pragma unroll
        for (int j4 = 0; j4 < BK_HC; j4 += 4) {
            const float f[4] = {f_s[j4 * BK_TP + px], f_s[(j4 + 1) * BK_TP + px], f_s[(j4 + 2) * BK_TP + px],
                                f_s[(j4 + 3) * BK_TP + px]};
#pragma unroll
            for (int k = 0; k < BK_OPI; k++) {
                const float4 w = *(const float4*)&wp_s[(og + k) * BK_HC + j4];
                acc[k] = fmaf(f[0], w.x, acc[k]);
                acc[k] = fmaf(f[1], w.y, acc[k]);
                acc[k] = fmaf(f[2], w.z, acc[k]);
                acc[k] = fmaf(f[3], w.w, acc[k]);
            }
        }
        __syncthreads();
    }
    if (oy >= p.out_h || ox >= p.out_w) return;
#pragma unroll
    for (int k = 0; k < BK_OPI; k++) {
        const int o = ob0 + og + k;
        if (o < p.out_c) {
            float y = acc[k];
            if (p.flags & BK_PROJECT_BIAS) y += bk_ld<T>(p.bp, o);
            if (p.flags & BK_RESIDUAL) y += bk_ld<T>(p.x, bk_x_index<T>(p, n, o, oy, ox));
            const i64 oi = nhwc ? ((n * p.out_h + oy) * p.out_w + ox) * p.out_c + o
                                : ((n * p.out_c + o) * p.out_h + oy) * p.out_w + ox;
            ((T*)p.out)[oi] = from_f32<T>(y);
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) inverted_residual_f32(const BlockParams p) { inverted_residual<float>(p); }
extern "C" __global__ void __launch_bounds__(256) inverted_residual_f16(const BlockParams p) { inverted_residual<f16>(p); }
extern "C" __global__ void __launch_bounds__(256) inverted_residual_bf16(const BlockParams p) { inverted_residual<bf16>(p); }
