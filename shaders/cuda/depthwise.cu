// Depthwise 2-D convolution with fused bias and activation (`Conv2dDesc`): output channel oc
// reads input channel oc / multiplier through its own kh × kw filter.
//
// The op does about 2 FLOP per byte (3×3 filter), so it is memory-bound everywhere; the
// kernels aim at coalesced loads and at reusing each loaded value several times:
// - NCHW (`depthwise_conv2d_<dtype>_nchw`): a thread computes 4 consecutive output columns of
//   one row; neighbouring threads take neighbouring column groups, so a warp reads one
//   contiguous stretch of each input row per tap, and each filter tap is read once per 4
//   outputs.
// - NHWC (`depthwise_conv2d_<dtype>_nhwc`): a thread computes 4 consecutive channels at 2
//   consecutive output columns; neighbouring threads take neighbouring channel groups, so a
//   warp reads 128 consecutive channels of one pixel per tap (as one vector per thread when
//   the multiplier is 1 and the channel count a multiple of 4), and each filter tap is read
//   once per 2 outputs.
// Work items are numbered in one dimension and walked with a grid-stride loop, so any tensor
// size fits the grid limits.
#include "common.cuh"

// Outputs per thread along x (NCHW) and channels × columns per thread (NHWC).
#define DW_NCHW_X 4
#define DW_NHWC_C 4
#define DW_NHWC_X 2

template <typename T> __device__ __forceinline__ void dw_nchw(const ConvParams& p) {
    const T* in = (const T*)p.input;
    const T* wt = (const T*)p.weight;
    T* out = (T*)p.out;
    const int occ = p.channels * p.multiplier;
    const int xq = (p.ow + DW_NCHW_X - 1) / DW_NCHW_X;
    for (i64 w = (i64)blockIdx.x * blockDim.x + threadIdx.x; w < p.work; w += (i64)gridDim.x * blockDim.x) {
        i64 r = w;
        const int ox0 = (int)(r % xq) * DW_NCHW_X;
        r /= xq;
        const int oy = (int)(r % p.oh);
        r /= p.oh;
        const int oc = (int)(r % occ);
        const i64 n = r / occ;
        const int ic = oc / p.multiplier;
        const T* plane = in + (n * p.channels + ic) * (i64)p.height * p.width;
        const T* filt = wt + (i64)oc * p.kh * p.kw;
        float acc[DW_NCHW_X];
        for (int j = 0; j < DW_NCHW_X; j++) acc[j] = 0.0f;
        for (int ky = 0; ky < p.kh; ky++) {
            const int iy = oy * p.sh - p.pt + ky * p.dh;
            if (iy < 0 || iy >= p.height) continue;
            const T* row = plane + (i64)iy * p.width;
            for (int kx = 0; kx < p.kw; kx++) {
                const float f = to_f32(filt[ky * p.kw + kx]);
                for (int j = 0; j < DW_NCHW_X; j++) {
                    const int ix = (ox0 + j) * p.sw - p.pl + kx * p.dw;
                    if (ox0 + j < p.ow && ix >= 0 && ix < p.width) acc[j] = fmaf(to_f32(row[ix]), f, acc[j]);
                }
            }
        }
        const float b = p.has_bias ? to_f32(((const T*)p.bias)[oc]) : 0.0f;
        T* o = out + ((n * occ + oc) * p.oh + oy) * (i64)p.ow;
        for (int j = 0; j < DW_NCHW_X; j++)
            if (ox0 + j < p.ow) o[ox0 + j] = from_f32<T>(activate(p.act, acc[j] + b));
    }
}

template <typename T> __device__ __forceinline__ void dw_nhwc(const ConvParams& p) {
    const T* in = (const T*)p.input;
    const T* wt = (const T*)p.weight;
    T* out = (T*)p.out;
    const int occ = p.channels * p.multiplier;
    const int cq = (occ + DW_NHWC_C - 1) / DW_NHWC_C;
    const int xq = (p.ow + DW_NHWC_X - 1) / DW_NHWC_X;
    const int taps = p.kh * p.kw;
    for (i64 w = (i64)blockIdx.x * blockDim.x + threadIdx.x; w < p.work; w += (i64)gridDim.x * blockDim.x) {
        i64 r = w;
        const int oc0 = (int)(r % cq) * DW_NHWC_C;
        r /= cq;
        const int ox0 = (int)(r % xq) * DW_NHWC_X;
        r /= xq;
        const int oy = (int)(r % p.oh);
        const i64 n = r / p.oh;
        float acc[DW_NHWC_X][DW_NHWC_C];
        for (int x = 0; x < DW_NHWC_X; x++)
            for (int c = 0; c < DW_NHWC_C; c++) acc[x][c] = 0.0f;
        for (int ky = 0; ky < p.kh; ky++) {
            const int iy = oy * p.sh - p.pt + ky * p.dh;
            if (iy < 0 || iy >= p.height) continue;
            for (int kx = 0; kx < p.kw; kx++) {
                float f[DW_NHWC_C];
                for (int c = 0; c < DW_NHWC_C; c++)
                    f[c] = oc0 + c < occ ? to_f32(wt[(i64)(oc0 + c) * taps + ky * p.kw + kx]) : 0.0f;
                for (int x = 0; x < DW_NHWC_X; x++) {
                    const int ix = (ox0 + x) * p.sw - p.pl + kx * p.dw;
                    if (ox0 + x >= p.ow || ix < 0 || ix >= p.width) continue;
                    const T* px = in + ((n * p.height + iy) * p.width + ix) * (i64)p.channels;
                    if (p.vec4) {
                        // The 4 channels in one 16-byte (f32) or 8-byte (f16, bf16) load.
                        __align__(16) T v[DW_NHWC_C];
                        if (sizeof(T) == 4) *(uint4*)v = *(const uint4*)(px + oc0);
                        else *(uint2*)v = *(const uint2*)(px + oc0);
                        for (int c = 0; c < DW_NHWC_C; c++) acc[x][c] = fmaf(to_f32(v[c]), f[c], acc[x][c]);
                    } else {
                        for (int c = 0; c < DW_NHWC_C; c++)
                            if (oc0 + c < occ) acc[x][c] = fmaf(to_f32(px[(oc0 + c) / p.multiplier]), f[c], acc[x][c]);
                    }
                }
            }
        }
        for (int x = 0; x < DW_NHWC_X; x++) {
            if (ox0 + x >= p.ow) continue;
            T* o = out + ((n * p.oh + oy) * p.ow + ox0 + x) * (i64)occ;
            for (int c = 0; c < DW_NHWC_C; c++) {
                if (oc0 + c >= occ) continue;
                const float b = p.has_bias ? to_f32(((const T*)p.bias)[oc0 + c]) : 0.0f;
                o[oc0 + c] = from_f32<T>(activate(p.act, acc[x][c] + b));
            }
        }
    }
}

// 256 threads: a multiple of the warp size that keeps enough blocks per SM for this
// latency-bound loop; the grid is sized by the host to a few waves.
#define DW_ENTRY(DT, T)                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) depthwise_conv2d_##DT##_nchw(const ConvParams p) {          \
        dw_nchw<T>(p);                                                                                                 \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(256) depthwise_conv2d_##DT##_nhwc(const ConvParams p) {          \
        dw_nhwc<T>(p);                                                                                                 \
    }

DW_ENTRY(f32, float)
DW_ENTRY(f16, f16)
DW_ENTRY(bf16, bf16)
