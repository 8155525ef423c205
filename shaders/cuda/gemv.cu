// GEMV / skinny GEMM (M <= 16): `gemv_<storage>[_bf16]_<nk|kn>_m{4,16}` and the split-K
// epilogue `gemv_finalize_<storage>`.
//
// A decode step streams the weight matrix once, so these kernels are about bytes in flight:
// 16-byte loads of B everywhere, K split across warps and, when the columns alone give under
// two waves of blocks on a 132-SM GPU, across blocks too (the host picks `splits`).
//
// - `nk` (B stored [N, K]: nn.Linear / GGUF weights, `trans_b`): each warp owns GV_NK_COLS = 2
//   columns, i.e. two stored rows; lane l reads 16 bytes (V = 16 / sizeof(T) elements) at
//   k = l·V, l·V + 32·V, ... of each, so a warp reads 512 contiguous bytes of each row per step.
//   op(A)'s V elements per row come from L1 (A is at most 16 rows). Each warp's partial sums
//   are reduced with `__shfl_xor_sync` (5 steps), no shared memory. A block (8 warps) owns 16
//   columns: N = 4096 gives 256 blocks.
// - `kn` (B stored [K, N]): lane l owns V consecutive columns (one 16-byte load per row of B),
//   a warp 32·V columns; the 8 warps of a block split K (rows warp, warp + 8, ...; 2 or 4 of
//   them per step, all their loads of B and op(A) issued before the step's FMAs), and their
//   partials meet in shared memory in warp order (warp 0 stores, warps 1..7 add one after
//   another between barriers; 16 KiB at most). A block owns 32·V columns (128 for f32, 256 for
//   f16/bf16), so K is split across blocks for most shapes.
// - Split K (`splits` > 1, gridDim.y): block y takes K range [y·k_chunk, (y+1)·k_chunk) and
//   stores its sums in plane y of an f32 workspace `ws[splits][batch][M][N]`; then
//   `gemv_finalize_<T>` adds the planes in split order and applies the epilogue. With
//   `splits` = 1 the kernel applies it itself.
// - MT (4 or 16): the register tile's rows; rows past M are skipped (`nk`) or computed on row
//   M − 1's values and never emitted (`kn`, so that its loads need no guard); the loops over
//   rows are unrolled, the guards uniform.
// Every sum is taken in an order fixed by the launch (no atomics): a product gives the same bits
// on every run.
// `BF`: round both inputs to bf16 first (the bf16-compute policy).
// `kn_m16` is built with `__launch_bounds__(256, 1)`: with the default bound ptxas 12.4 kept
// f32 at 80 registers and spilled 12 bytes on sm_80; one block per SM lets it use 96 instead.
#include "common.cuh"

// The matmul's parameters plus the split-K workspace. Twin: `GemvParams` in
// crates/kernels/src/catalogue/cuda.rs.
struct GemvParams {
    MatmulParams mm;
    u64 ws;      // f32 [batch][M][N] partial sums (zeroed), when splits > 1; else 0
    i32 splits;  // blocks along K (gridDim.y)
    i32 k_chunk; // K per split, a multiple of 32·V (nk) or 8 (kn)
};

#define GV_WARPS 8
#define GV_NK_COLS 2
// Rows of B a warp of `gemv_kn` loads per step: 4, or 2 with 16-row tiles (registers).
#define GV_KN_ROWS(MT) ((MT) == 16 ? 2 : 4)

template <typename T, bool BF> __device__ __forceinline__ float gv_in(T x) {
    float v = to_f32(x);
    return BF ? to_f32(from_f32<bf16>(v)) : v;
}

// V elements of T from a 16-byte vector load (aligned by the caller's checks).
template <typename T> __device__ __forceinline__ void load_vec16(const T* src, float* dst);
template <> __device__ __forceinline__ void load_vec16<float>(const float* src, float* dst) {
    const float4 v = __ldg((const float4*)src);
    dst[0] = v.x;
    dst[1] = v.y;
    dst[2] = v.z;
    dst[3] = v.w;
}
template <typename T> __device__ __forceinline__ void load_vec16_half(const T* src, float* dst) {
    const uint4 v = __ldg((const uint4*)src);
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        T lo, hi;
        lo.bits = (u16)(w[i] & 0xffffu);
        hi.bits = (u16)(w[i] >> 16);
        dst[2 * i] = to_f32(lo);
        dst[2 * i + 1] = to_f32(hi);
    }
}
template <> __device__ __forceinline__ void load_vec16<f16>(const f16* src, float* dst) { load_vec16_half(src, dst); }
template <> __device__ __forceinline__ void load_vec16<bf16>(const bf16* src, float* dst) { load_vec16_half(src, dst); }

// `n` (<= V) elements at `src` with a stride of `step`, zero after them; bf16-rounded when BF.
template <typename T, bool BF, int V>
__device__ __forceinline__ void load_run(const T* src, i64 step, int n, bool vec, float (&dst)[V]) {
    if (vec && n == V) {
        load_vec16<T>(src, dst);
        if (BF) {
#pragma unroll
            for (int j = 0; j < V; j++) dst[j] = to_f32(from_f32<bf16>(dst[j]));
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; j++) dst[j] = j < n ? gv_in<T, BF>(src[j * step]) : 0.0f;
    }
}

// Sends sum `v` of output (row, col): the epilogue and store, or this split's workspace plane.
template <typename T>
__device__ __forceinline__ void gv_emit(const GemvParams& g, float v, i64 bt, int row, int col) {
    const MatmulParams& p = g.mm;
    if (g.splits > 1) {
        ((float*)g.ws)[gemv_ws_index(p, blockIdx.y, bt, row, col)] = v;
    } else {
        *out_ptr<T>(p, bt, row, col) = from_f32<T>(matmul_epilogue<T>(p, v, bt, row, col));
    }
}

template <typename T, bool BF, int MT> __device__ __forceinline__ void gemv_nk(const GemvParams& g) {
    constexpr int V = 16 / sizeof(T);
    const MatmulParams& p = g.mm;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col0 = (blockIdx.x * GV_WARPS + warp) * GV_NK_COLS;
    if (col0 >= p.n) return; // whole warps leave together: no block-wide barrier below
    const i64 bt = blockIdx.z;
    const T* A = (const T*)p.a + p.a_off + bt * p.a_bs;
    const T* B = (const T*)p.b + p.b_off + bt * p.b_bs;
    const bool ta = p.flags & MM_TRANS_A;
    const bool a_vec = !ta && (p.flags & MM_A_VEC), b_vec = p.flags & MM_B_VEC;
    const int k_begin = blockIdx.y * g.k_chunk;
    const int k_end = min(p.k, k_begin + g.k_chunk);
    float acc[MT][GV_NK_COLS];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int c = 0; c < GV_NK_COLS; c++) acc[m][c] = 0.0f;

#pragma unroll 1
    for (int k = k_begin + lane * V; k < k_end; k += 32 * V) {
        const int kn = min(V, k_end - k);
        float b[GV_NK_COLS][V];
#pragma unroll
        for (int c = 0; c < GV_NK_COLS; c++) {
            if (col0 + c < p.n) {
                load_run<T, BF, V>(B + (i64)(col0 + c) * p.b_ld + k, 1, kn, b_vec, b[c]);
            } else {
#pragma unroll
                for (int j = 0; j < V; j++) b[c][j] = 0.0f;
            }
        }
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if (m < p.m) {
                float a[V];
                if (ta) {
                    load_run<T, BF, V>(A + (i64)k * p.a_ld + m, p.a_ld, kn, false, a);
                } else {
                    load_run<T, BF, V>(A + (i64)m * p.a_ld + k, 1, kn, a_vec, a);
                }
#pragma unroll
                for (int c = 0; c < GV_NK_COLS; c++)
#pragma unroll
                    for (int j = 0; j < V; j++) acc[m][c] = fmaf(a[j], b[c][j], acc[m][c]);
            }
        }
    }
    // Butterfly: every lane ends with every sum; lane m·COLS + c emits (m, c).
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int c = 0; c < GV_NK_COLS; c++) {
            float v = acc[m][c];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == m * GV_NK_COLS + c && m < p.m && col0 + c < p.n) gv_emit<T>(g, v, bt, m, col0 + c);
        }
}

template <typename T, bool BF, int MT> __device__ __forceinline__ void gemv_kn(const GemvParams& g) {
    constexpr int V = 16 / sizeof(T);
    constexpr int BCOLS = 32 * V;
    __shared__ __align__(16) float red[MT][BCOLS];
    const MatmulParams& p = g.mm;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n0 = blockIdx.x * BCOLS, col = n0 + lane * V;
    const i64 bt = blockIdx.z;
    const T* A = (const T*)p.a + p.a_off + bt * p.a_bs;
    const T* B = (const T*)p.b + p.b_off + bt * p.b_bs;
    const bool ta = p.flags & MM_TRANS_A;
    const bool b_vec = p.flags & MM_B_VEC;
    const int k_begin = blockIdx.y * g.k_chunk;
    const int k_end = min(p.k, k_begin + g.k_chunk);
    const int cn = col < p.n ? min(V, p.n - col) : 0;
    float acc[MT][V];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < V; j++) acc[m][j] = 0.0f;
    if (cn > 0) {
        // Each step issues all its loads before its first FMA (the GPU issues in order, so a
        // load behind an FMA waits for the FMA's operands): U rows of B per warp, and every row
        // of op(A) for them, rows past M reading row M − 1 (in bounds; their sums are never
        // emitted). Rows of the step past the range are loaded as the last row and skipped.
        constexpr int U = GV_KN_ROWS(MT);
#pragma unroll 1
        for (int k = k_begin + warp; k < k_end; k += GV_WARPS * U) {
            float b[U][V];
            float a[U][MT];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int ku = min(k + u * GV_WARPS, k_end - 1);
                load_run<T, BF, V>(B + (i64)ku * p.b_ld + col, 1, cn, b_vec, b[u]);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    // One element of op(A) per row, the same for the whole warp (a broadcast).
                    const int r = min(m, p.m - 1);
                    a[u][m] = gv_in<T, BF>(ta ? A[(i64)ku * p.a_ld + r] : A[(i64)r * p.a_ld + ku]);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (k + u * GV_WARPS < k_end) {
#pragma unroll
                    for (int m = 0; m < MT; m++)
#pragma unroll
                        for (int j = 0; j < V; j++) acc[m][j] = fmaf(a[u][m], b[u][j], acc[m][j]);
                }
            }
        }
    }
    // The warps' partials meet in warp order: warp 0 stores, then warps 1..7 add one at a time,
    // so every run adds them the same way. Each lane's V sums are 16-byte aligned in `red`.
#pragma unroll 1
    for (int w = 0; w < GV_WARPS; w++) {
        if (warp == w && cn > 0) {
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (m < p.m) {
                    float4* r = (float4*)&red[m][lane * V];
#pragma unroll
                    for (int q = 0; q < V / 4; q++) {
                        float4 v = make_float4(acc[m][4 * q], acc[m][4 * q + 1], acc[m][4 * q + 2], acc[m][4 * q + 3]);
                        if (w > 0) {
                            const float4 o = r[q];
                            v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
                        }
                        r[q] = v;
                    }
                }
            }
        }
        __syncthreads();
    }
    for (int e = tid; e < MT * BCOLS; e += GV_WARPS * 32) {
        const int m = e / BCOLS, c = n0 + e % BCOLS;
        if (m < p.m && c < p.n) gv_emit<T>(g, red[m][e % BCOLS], bt, m, c);
    }
}

// The split-K epilogue: one thread per output of the launch's batches, adding the splits' planes
// in split order.
template <typename T> __device__ __forceinline__ void gemv_finalize(const GemvParams& g) {
    const MatmulParams& p = g.mm;
    const i64 per = (i64)p.m * p.n, plane = per * p.batch;
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= plane) return;
    const i64 bt = i / per, row = (i % per) / p.n, col = i % p.n;
    const float* ws = (const float*)g.ws;
    float v = ws[i];
#pragma unroll 1
    for (int s = 1; s < g.splits; s++) v += ws[s * plane + i];
    *out_ptr<T>(p, bt, row, col) = from_f32<T>(matmul_epilogue<T>(p, v, bt, row, col));
}

#define GV_ENTRY(NAME, T, BF)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) NAME##_nk_m4(const GemvParams g) { gemv_nk<T, BF, 4>(g); }   \
    extern "C" __global__ void __launch_bounds__(256) NAME##_nk_m16(const GemvParams g) { gemv_nk<T, BF, 16>(g); } \
    extern "C" __global__ void __launch_bounds__(256) NAME##_kn_m4(const GemvParams g) { gemv_kn<T, BF, 4>(g); }   \
    extern "C" __global__ void __launch_bounds__(256, 1) NAME##_kn_m16(const GemvParams g) { gemv_kn<T, BF, 16>(g); }

GV_ENTRY(gemv_f32, float, false)
GV_ENTRY(gemv_f16, f16, false)
GV_ENTRY(gemv_bf16, bf16, false)
GV_ENTRY(gemv_f32_bf16, float, true)
GV_ENTRY(gemv_f16_bf16, f16, true)

extern "C" __global__ void __launch_bounds__(256) gemv_finalize_f32(const GemvParams g) { gemv_finalize<float>(g); }
extern "C" __global__ void __launch_bounds__(256) gemv_finalize_f16(const GemvParams g) { gemv_finalize<f16>(g); }
extern "C" __global__ void __launch_bounds__(256) gemv_finalize_bf16(const GemvParams g) { gemv_finalize<bf16>(g); }
