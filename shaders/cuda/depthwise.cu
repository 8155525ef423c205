// Depthwise 2-D convolution with fused bias and activation (`Conv2dDesc`): output channel oc
// reads input channel oc / multiplier through its own kh × kw filter.
//
// The op does about 2 FLOP per byte (3×3 filter), so it is memory-bound everywhere; the
// kernels aim at 16-byte global loads, coalesced across a warp, and at reusing each loaded
// value several times. `V` is the elements per 16-byte vector: 4 (f32) or 8 (f16, bf16).
// - NCHW (`depthwise_conv2d_<dtype>_nchw`): a thread computes V consecutive output columns of
//   one row; neighbouring threads take neighbouring column groups, so a warp reads one
//   contiguous stretch of each input row per filter row. With `vec` (3-wide filter, left pad
//   1, dilation 1, stride 1 or 2, width a multiple of V, aligned input: MobileNet's layers)
//   a filter row is three aligned 16-byte loads per thread (the window the V outputs and
//   their neighbours' edges need), kept in registers across the 3 taps; otherwise one scalar
//   load per tap and output.
// - NHWC (`depthwise_conv2d_<dtype>_nhwc`): a thread computes V consecutive channels at 2
//   consecutive output columns; neighbouring threads take neighbouring channel groups, so a
//   warp reads 32·V consecutive channels of one pixel per tap, as one 16-byte vector per
//   thread with `vec` (multiplier 1, channels a multiple of V, aligned input and output),
//   and each filter tap is read once per 2 outputs.
// Work items are numbered in one dimension and walked with a grid-stride loop, so any tensor
// size fits the grid limits.
#include "common.cuh"

// Outputs along x per thread (NCHW), channels per thread (NHWC): one 16-byte vector.
template <typename T> struct DwVec { static constexpr int V = 16 / sizeof(T); };
// Output columns per thread (NHWC).
#define DW_NHWC_X 2

template <typename T> struct Vec16 { T v[16 / sizeof(T)]; };

// The `vec` NCHW path for a 3-wide filter with left pad 1, dilation 1 and stride SW (1 or 2):
// outputs ox0..ox0+V-1 read input columns ox0·SW - 1 .. (ox0+V-1)·SW + 1, which lie in the
// three aligned vectors starting at ox0·SW - V. Every index into the window is a compile-time
// constant, so the window stays in registers. Width is a multiple of V, so each vector is
// wholly inside the row or wholly outside (zero padding: its taps are skipped).
template <typename T, int SW> __device__ __forceinline__ void dw_nchw_vec(const ConvParams& p) {
    constexpr int V = DwVec<T>::V;
    const T* in = (const T*)p.input;
    const T* wt = (const T*)p.weight;
    T* out = (T*)p.out;
    const int occ = p.channels * p.multiplier;
    const int xq = (p.ow + V - 1) / V;
    for (i64 w = (i64)blockIdx.x * blockDim.x + threadIdx.x; w < p.work; w += (i64)gridDim.x * blockDim.x) {
        i64 r = w;
        const int ox0 = (int)(r % xq) * V;
        r /= xq;
        const int oy = (int)(r % p.oh);
        r /= p.oh;
        const int oc = (int)(r % occ);
        const i64 n = r / occ;
        const int ic = oc / p.multiplier;
        const T* plane = in + (n * p.channels + ic) * (i64)p.height * p.width;
        const T* filt = wt + oc * p.w_ch;
        const int x0 = ox0 * SW - V;
        float acc[V];
#pragma unroll
        for (int j = 0; j < V; j++) acc[j] = 0.0f;
        for (int ky = 0; ky < p.kh; ky++) {
            const int iy = oy * p.sh - p.pt + ky * p.dh;
            if (iy < 0 || iy >= p.height) continue;
            const T* row = plane + (i64)iy * p.width;
            float win[3 * V];
            bool ok[3];
#pragma unroll
            for (int v = 0; v < 3; v++) {
                const int x = x0 + v * V;
                ok[v] = x >= 0 && x < p.width;
                __align__(16) Vec16<T> t;
                *(uint4*)&t = ok[v] ? *(const uint4*)(row + x) : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int e = 0; e < V; e++) win[v * V + e] = to_f32(t.v[e]);
            }
#pragma unroll
            for (int kx = 0; kx < 3; kx++) {
                const float f = to_f32(filt[(ky * 3 + kx) * p.w_tap]);
#pragma unroll
                for (int j = 0; j < V; j++) {
                    // Input column (ox0 + j)·SW - 1 + kx, at this index of the window.
                    const int idx = j * SW + kx - 1 + V;
                    if (ok[idx / V]) acc[j] = fmaf(win[idx], f, acc[j]);
                }
            }
        }
        const float b = p.has_bias ? to_f32(((const T*)p.bias)[oc]) : 0.0f;
        T* o = out + ((n * occ + oc) * p.oh + oy) * (i64)p.ow + ox0;
        __align__(16) Vec16<T> res;
#pragma unroll
        for (int j = 0; j < V; j++) res.v[j] = from_f32<T>(activate(p.act, acc[j] + b));
        if (ox0 + V <= p.ow && ((size_t)o & 15) == 0) {
            *(uint4*)o = *(const uint4*)&res;
        } else {
#pragma unroll
            for (int j = 0; j < V; j++)
                if (ox0 + j < p.ow) o[j] = res.v[j];
        }
    }
}

// Any filter, padding, stride and dilation: one scalar load per tap and output.
template <typename T> __device__ __forceinline__ void dw_nchw_any(const ConvParams& p) {
    constexpr int X = DwVec<T>::V;
    const T* in = (const T*)p.input;
    const T* wt = (const T*)p.weight;
    T* out = (T*)p.out;
    const int occ = p.channels * p.multiplier;
    const int xq = (p.ow + X - 1) / X;
    for (i64 w = (i64)blockIdx.x * blockDim.x + threadIdx.x; w < p.work; w += (i64)gridDim.x * blockDim.x) {
        i64 r = w;
        const int ox0 = (int)(r % xq) * X;
        r /= xq;
        const int oy = (int)(r % p.oh);
        r /= p.oh;
        const int oc = (int)(r % occ);
        const i64 n = r / occ;
        const int ic = oc / p.multiplier;
        const T* plane = in + (n * p.channels + ic) * (i64)p.height * p.width;
        const T* filt = wt + oc * p.w_ch;
        float acc[X];
#pragma unroll
        for (int j = 0; j < X; j++) acc[j] = 0.0f;
        for (int ky = 0; ky < p.kh; ky++) {
            const int iy = oy * p.sh - p.pt + ky * p.dh;
            if (iy < 0 || iy >= p.height) continue;
            const T* row = plane + (i64)iy * p.width;
            for (int kx = 0; kx < p.kw; kx++) {
                const float f = to_f32(filt[(ky * p.kw + kx) * p.w_tap]);
#pragma unroll
                for (int j = 0; j < X; j++) {
                    const int ix = (ox0 + j) * p.sw - p.pl + kx * p.dw;
                    if (ox0 + j < p.ow && ix >= 0 && ix < p.width) acc[j] = fmaf(to_f32(row[ix]), f, acc[j]);
                }
            }
        }
        const float b = p.has_bias ? to_f32(((const T*)p.bias)[oc]) : 0.0f;
        T* o = out + ((n * occ + oc) * p.oh + oy) * (i64)p.ow;
#pragma unroll
        for (int j = 0; j < X; j++)
            if (ox0 + j < p.ow) o[ox0 + j] = from_f32<T>(activate(p.act, acc[j] + b));
    }
}

template <typename T> __device__ __forceinline__ void dw_nchw(const ConvParams& p) {
    if (p.vec && p.sw == 1) dw_nchw_vec<T, 1>(p);
    else if (p.vec && p.sw == 2) dw_nchw_vec<T, 2>(p);
    else dw_nchw_any<T>(p);
}

template <typename T> __device__ __forceinline__ void dw_nhwc(const ConvParams& p) {
    constexpr int C = DwVec<T>::V;
    const T* in = (const T*)p.input;
    const T* wt = (const T*)p.weight;
    T* out = (T*)p.out;
    const int occ = p.channels * p.multiplier;
    const int cq = (occ + C - 1) / C;
    const int xq = (p.ow + DW_NHWC_X - 1) / DW_NHWC_X;
    for (i64 w = (i64)blockIdx.x * blockDim.x + threadIdx.x; w < p.work; w += (i64)gridDim.x * blockDim.x) {
        i64 r = w;
        const int oc0 = (int)(r % cq) * C;
        r /= cq;
        const int ox0 = (int)(r % xq) * DW_NHWC_X;
        r /= xq;
        const int oy = (int)(r % p.oh);
        const i64 n = r / p.oh;
        float acc[DW_NHWC_X][C];
#pragma unroll
        for (int x = 0; x < DW_NHWC_X; x++)
#pragma unroll
            for (int c = 0; c < C; c++) acc[x][c] = 0.0f;
        for (int ky = 0; ky < p.kh; ky++) {
            const int iy = oy * p.sh - p.pt + ky * p.dh;
            if (iy < 0 || iy >= p.height) continue;
            for (int kx = 0; kx < p.kw; kx++) {
                // This tap's weights of the C channels, w_ch apart.
                const T* ft = wt + oc0 * p.w_ch + (ky * p.kw + kx) * p.w_tap;
                float f[C];
#pragma unroll
                for (int c = 0; c < C; c++)
                    f[c] = oc0 + c < occ ? to_f32(ft[c * p.w_ch]) : 0.0f;
#pragma unroll
                for (int x = 0; x < DW_NHWC_X; x++) {
                    const int ix = (ox0 + x) * p.sw - p.pl + kx * p.dw;
                    if (ox0 + x >= p.ow || ix < 0 || ix >= p.width) continue;
                    const T* px = in + ((n * p.height + iy) * p.width + ix) * (i64)p.channels;
                    if (p.vec) {
                        // The C channels in one 16-byte load.
                        __align__(16) Vec16<T> v;
                        *(uint4*)&v = *(const uint4*)(px + oc0);
#pragma unroll
                        for (int c = 0; c < C; c++) acc[x][c] = fmaf(to_f32(v.v[c]), f[c], acc[x][c]);
                    } else {
#pragma unroll
                        for (int c = 0; c < C; c++)
                            if (oc0 + c < occ) acc[x][c] = fmaf(to_f32(px[(oc0 + c) / p.multiplier]), f[c], acc[x][c]);
                    }
                }
            }
        }
#pragma unroll
        for (int x = 0; x < DW_NHWC_X; x++) {
            if (ox0 + x >= p.ow) continue;
            T* o = out + ((n * p.oh + oy) * p.ow + ox0 + x) * (i64)occ;
            __align__(16) Vec16<T> res;
#pragma unroll
            for (int c = 0; c < C; c++) {
                const float b = p.has_bias && oc0 + c < occ ? to_f32(((const T*)p.bias)[oc0 + c]) : 0.0f;
                res.v[c] = from_f32<T>(activate(p.act, acc[x][c] + b));
            }
            if (p.vec) {
                *(uint4*)(o + oc0) = *(const uint4*)&res;
            } else {
#pragma unroll
                for (int c = 0; c < C; c++)
                    if (oc0 + c < occ) o[oc0 + c] = res.v[c];
            }
        }
    }
}

// 256 threads: a multiple of the warp size that keeps enough blocks per SM for this
// latency-bound loop; the grid is sized by the host to a few waves. NHWC asks for at least 3
// blocks per SM: without it ptxas held the f16/bf16 variants at 64 registers for sm_80 and
// spilled 8 bytes once the activation switch grew a sixth case (SiLU); with it they use 63
// registers and no spill, the same 4 blocks per SM on sm_80 and 3 on sm_90 as before
// (`cargo xtask ptx` tables in shaders/cuda/README.md).
#define DW_ENTRY(DT, T)                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) depthwise_conv2d_##DT##_nchw(const ConvParams p) {          \
        dw_nchw<T>(p);                                                                                                 \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 3) depthwise_conv2d_##DT##_nhwc(const ConvParams p) {          \
        dw_nhwc<T>(p);                                                                                                 \
    }

DW_ENTRY(f32, float)
DW_ENTRY(f16, f16)
DW_ENTRY(bf16, bf16)

// ---- The tiled kernels: `depthwise_tiled_<dtype>_<nchw|nhwc>` ----
// An input tile plus its halo, and the block's filter taps, staged in shared memory once per
// block; every thread then reads its taps from there, so each input element leaves global
// memory once per block rather than once per tap (the 16-byte loads of the kernels above hit
// L1/L2 for the other taps; these do not depend on it). Grid: x = output column tiles, y =
// output row tiles, z = images × output channels (NCHW) or × channel blocks (NHWC), walked with
// a stride of gridDim.z so any batch fits. A thread's place in the tile is bit fields of
// threadIdx.x and the block's is blockIdx (one division per z step): no per-element div/mod.
// The host (`backend/cuda/depthwise.rs`, `catalogue::cuda::DwTiledPlan`) picks tile_h so the
// patch fits DWT_PATCH_BYTES and runs the kernels above where no plan fits.
// - NCHW: 256 threads as 8 rows × 32 column groups, each V consecutive outputs of one row (one
//   16-byte store); a tile is 8 × 32V outputs of one channel, any multiplier. The patch rows
//   are staged as 16-byte vectors from a 16-byte-aligned column (with `in_vec`: W a multiple
//   of V and an aligned input, every vector is wholly inside the row or wholly padding).
// - NHWC (multiplier 1): 256 threads as 32 pixel slots × 8 channel vectors; a block covers
//   tile_h × 8 pixels × 8V channels, and a thread's V channels of a pixel are one 16-byte
//   load from the patch and one 16-byte store (with `in_vec` / `out_vec`: C a multiple of V,
//   aligned tensors). The taps are staged as f32, 8V per tap.
// Padded taps are skipped (not multiplied by zero), as in the reference.

// Parameters of the tiled kernels (`DwTiledParams` in `crates/kernels/src/catalogue/cuda.rs`).
struct DwTiledParams {
    u64 input;
    u64 weight;
    u64 bias;
    u64 out;
    i64 z_total;
    i32 channels, height, width, multiplier;
    i32 kh, kw, sh, sw, pt, pl, dh, dw;
    i32 oh, ow;
    // Output rows per tile (NHWC), the patch's rows and width (NCHW: 16-byte vectors; NHWC:
    // pixels) and the channel blocks per image (NHWC).
    i32 tile_h, patch_h, patch_w, c_blocks;
    // Weight element (oc, tap) is at oc·w_ch + tap·w_tap: [C·m, 1, kh, kw] or packed [kh, kw, C·m].
    i32 w_tap, w_ch;
    u32 act;
    u32 flags;
};
#define DWT_BIAS 1u
#define DWT_IN_VEC 2u
#define DWT_OUT_VEC 4u
#define DWT_THREADS 256
// 40 KiB of patch and 6.25 KiB of taps: under the 48 KiB of static shared memory, 4 blocks per
// SM on sm_90 (228 KiB). The largest MobileNetV2 patch is NHWC stride 2 with 8-row tiles:
// 17 × 17 pixels × 8 vectors × 16 bytes = 36,992 bytes.
#define DWT_PATCH_BYTES 40960
#define DWT_W_FLOATS 1600

template <typename T> __device__ __forceinline__ void dwt_nchw(const DwTiledParams& p, uint4* sm, float* sw) {
    constexpr int V = 16 / sizeof(T);
    constexpr int TW = 32 * V;
    const T* in = (const T*)p.input;
    const T* wt = (const T*)p.weight;
    T* out = (T*)p.out;
    const T* patch = (const T*)sm;
    const int tx = threadIdx.x & 31;
    const int ty = threadIdx.x >> 5;
    const int occ = p.channels * p.multiplier;
    const int ox0 = blockIdx.x * TW;
    const int oy0 = blockIdx.y * 8;
    const int ys = oy0 * p.sh - p.pt;
    const int xs = ox0 * p.sw - p.pl;
    const int xa = xs & ~(V - 1);
    const int shift = xs - xa;
    const int taps = p.kh * p.kw;
    const int pw = p.patch_w * V;
    for (i64 z = blockIdx.z; z < p.z_total; z += gridDim.z) {
        const int oc = (int)(z % occ);
        const i64 n = z / occ;
        const T* plane = in + (n * p.channels + oc / p.multiplier) * (i64)p.height * p.width;
        // The previous step's readers are done with the shared arrays.
        __syncthreads();
        for (int t = threadIdx.x; t < taps; t += DWT_THREADS) sw[t] = to_f32(wt[(i64)oc * p.w_ch + (i64)t * p.w_tap]);
        for (int r = ty; r < p.patch_h; r += 8) {
            const int iy = ys + r;
            const bool rok = iy >= 0 && iy < p.height;
            const T* row = plane + (i64)(rok ? iy : 0) * p.width;
            for (int v = tx; v < p.patch_w; v += 32) {
                const int ix = xa + v * V;
                uint4 val = make_uint4(0, 0, 0, 0);
                if (p.flags & DWT_IN_VEC) {
                    if (rok && ix >= 0 && ix < p.width) val = *(const uint4*)(row + ix);
                } else {
                    __align__(16) Vec16<T> t;
#pragma unroll
                    for (int e = 0; e < V; e++) {
                        const int x = ix + e;
                        t.v[e] = rok && x >= 0 && x < p.width ? row[x] : T{};
                    }
                    val = *(const uint4*)&t;
                }
                sm[r * p.patch_w + v] = val;
            }
        }
        __syncthreads();
        const int oy = oy0 + ty;
        const int oxb = ox0 + tx * V;
        if (oy >= p.oh || oxb >= p.ow) continue;
        float acc[V];
#pragma unroll
        for (int j = 0; j < V; j++) acc[j] = 0.0f;
        for (int ky = 0; ky < p.kh; ky++) {
            const int pr = ty * p.sh + ky * p.dh;
            const int iy = ys + pr;
            if (iy < 0 || iy >= p.height) continue;
            const T* prow = patch + pr * pw;
            for (int kx = 0; kx < p.kw; kx++) {
                const float f = sw[ky * p.kw + kx];
#pragma unroll
                for (int j = 0; j < V; j++) {
                    const int pc = (tx * V + j) * p.sw + kx * p.dw + shift;
                    const int ix = xa + pc;
                    if (ix >= 0 && ix < p.width) acc[j] = fmaf(to_f32(prow[pc]), f, acc[j]);
                }
            }
        }
        const float b = (p.flags & DWT_BIAS) ? to_f32(((const T*)p.bias)[oc]) : 0.0f;
        T* o = out + ((n * occ + oc) * p.oh + oy) * (i64)p.ow + oxb;
        __align__(16) Vec16<T> res;
#pragma unroll
        for (int j = 0; j < V; j++) res.v[j] = from_f32<T>(activate(p.act, acc[j] + b));
        if ((p.flags & DWT_OUT_VEC) && oxb + V <= p.ow) {
            *(uint4*)o = *(const uint4*)&res;
        } else {
#pragma unroll
            for (int j = 0; j < V; j++)
                if (oxb + j < p.ow) o[j] = res.v[j];
        }
    }
}

template <typename T> __device__ __forceinline__ void dwt_nhwc(const DwTiledParams& p, uint4* sm, float* sw) {
    constexpr int V = 16 / sizeof(T);
    constexpr int CB = 8 * V;
    const T* in = (const T*)p.input;
    const T* wt = (const T*)p.weight;
    T* out = (T*)p.out;
    const int cv = threadIdx.x & 7;
    const int slot = threadIdx.x >> 3;
    const int ox0 = blockIdx.x * 8;
    const int oy0 = blockIdx.y * p.tile_h;
    const int ys = oy0 * p.sh - p.pt;
    const int xs = ox0 * p.sw - p.pl;
    const int C = p.channels;
    const int taps = p.kh * p.kw;
    for (i64 z = blockIdx.z; z < p.z_total; z += gridDim.z) {
        const int c0 = (int)(z % p.c_blocks) * CB;
        const i64 n = z / p.c_blocks;
        const int c = c0 + cv * V;
        const T* img = in + n * p.height * (i64)p.width * C;
        __syncthreads();
        for (int e = threadIdx.x; e < taps * CB; e += DWT_THREADS) {
            const int ch = c0 + (e & (CB - 1));
            sw[e] = ch < C ? to_f32(wt[(i64)ch * p.w_ch + (i64)(e / CB) * p.w_tap]) : 0.0f;
        }
        for (int r = 0; r < p.patch_h; r++) {
            const int iy = ys + r;
            const bool rok = iy >= 0 && iy < p.height;
            for (int x = slot; x < p.patch_w; x += 32) {
                const int ix = xs + x;
                uint4 val = make_uint4(0, 0, 0, 0);
                if (rok && ix >= 0 && ix < p.width) {
                    const T* px = img + ((i64)iy * p.width + ix) * C + c;
                    if (p.flags & DWT_IN_VEC) {
                        if (c < C) val = *(const uint4*)px;
                    } else {
                        __align__(16) Vec16<T> t;
#pragma unroll
                        for (int e = 0; e < V; e++) t.v[e] = c + e < C ? px[e] : T{};
                        val = *(const uint4*)&t;
                    }
                }
                sm[(r * p.patch_w + x) * 8 + cv] = val;
            }
        }
        __syncthreads();
        if (c >= C) continue;
        float b[V];
#pragma unroll
        for (int j = 0; j < V; j++)
            b[j] = (p.flags & DWT_BIAS) && c + j < C ? to_f32(((const T*)p.bias)[c + j]) : 0.0f;
        for (int q = slot; q < p.tile_h * 8; q += 32) {
            const int ty = q >> 3;
            const int tx = q & 7;
            const int oy = oy0 + ty;
            const int ox = ox0 + tx;
            if (oy >= p.oh || ox >= p.ow) continue;
            float acc[V];
#pragma unroll
            for (int j = 0; j < V; j++) acc[j] = 0.0f;
            for (int ky = 0; ky < p.kh; ky++) {
                const int pr = ty * p.sh + ky * p.dh;
                const int iy = ys + pr;
                if (iy < 0 || iy >= p.height) continue;
                for (int kx = 0; kx < p.kw; kx++) {
                    const int pc = tx * p.sw + kx * p.dw;
                    const int ix = xs + pc;
                    if (ix < 0 || ix >= p.width) continue;
                    __align__(16) Vec16<T> t;
                    *(uint4*)&t = sm[(pr * p.patch_w + pc) * 8 + cv];
                    const float* f = sw + (ky * p.kw + kx) * CB + cv * V;
#pragma unroll
                    for (int j = 0; j < V; j++) acc[j] = fmaf(to_f32(t.v[j]), f[j], acc[j]);
                }
            }
            T* o = out + ((n * p.oh + oy) * (i64)p.ow + ox) * C + c;
            __align__(16) Vec16<T> res;
#pragma unroll
            for (int j = 0; j < V; j++) res.v[j] = from_f32<T>(activate(p.act, acc[j] + b[j]));
            if (p.flags & DWT_OUT_VEC) {
                *(uint4*)o = *(const uint4*)&res;
            } else {
#pragma unroll
                for (int j = 0; j < V; j++)
                    if (c + j < C) o[j] = res.v[j];
            }
        }
    }
}

#define DWT_ENTRY(DT, T)                                                                                             \
    extern "C" __global__ void __launch_bounds__(DWT_THREADS) depthwise_tiled_##DT##_nchw(const DwTiledParams p) {    \
        __shared__ uint4 sm[DWT_PATCH_BYTES / 16];                                                                     \
        __shared__ float sw[DWT_W_FLOATS];                                                                             \
        dwt_nchw<T>(p, sm, sw);                                                                                        \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(DWT_THREADS) depthwise_tiled_##DT##_nhwc(const DwTiledParams p) {    \
        __shared__ uint4 sm[DWT_PATCH_BYTES / 16];                                                                     \
        __shared__ float sw[DWT_W_FLOATS];                                                                             \
        dwt_nhwc<T>(p, sm, sw);                                                                                        \
    }

DWT_ENTRY(f32, float)
DWT_ENTRY(f16, f16)
DWT_ENTRY(bf16, bf16)
