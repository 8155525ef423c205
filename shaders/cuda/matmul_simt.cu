// Matmul on the CUDA cores: the f32 path (`matmul_f32`) and the naive bench reference
// (`naive_matmul_<dtype>`).
//
// `matmul_f32` follows the cuBLAS-class SIMT SGEMM design (as in CUTLASS's SIMT kernels and
// siboehm/SGEMM_CUDA):
// - a 128×128 block tile with an 8-deep K slice, 256 threads (8 warps as 4 along M × 2 along
//   N, each warp 32×64), and an 8×8 register tile per thread split into 2×2 sub-tiles of 4×4,
//   so a warp's shared-memory reads are 4 (A) and 8 (B) distinct float4s: one wavefront each;
// - shared memory double-buffered and filled with `cp.async` (sm_80+): the next K slice
//   streams in while the current one is multiplied; 16-byte copies where the operand is
//   contiguous along the tile's fast dimension and aligned, 4-byte copies (with zero fill
//   past the edges) otherwise, including the transposing copies of `A` (M×K) and `Bᵀ` (N×K);
// - both tiles are stored K-major (`[k][m]`, `[k][n]`), padded by 4 floats per row: the pad
//   keeps rows 16-byte aligned for the float4 reads and shifts consecutive rows by 4 banks;
// - the fused epilogue (alpha, bias, beta·C, activation) with float4 stores where the output
//   view is aligned, the accumulators kept in registers throughout (no dynamic index);
// - blocks remapped to bands of 8 tile rows (`swizzled_tile`) for L2 reuse.
#include "common.cuh"

// Block tile 128×128×8: 8×8 outputs for each of 256 threads; two 8-deep slices of A and B
// (2·2·8·132·4 B = 16.5 KiB) leave room for two blocks per SM on every sm_80+ part.
#define SG_BM 128
#define SG_BN 128
#define SG_BK 8
#define SG_PAD 4
#define SG_THREADS 256

struct SgemmTiles {
    float a[2][SG_BK][SG_BM + SG_PAD];
    float b[2][SG_BK][SG_BN + SG_PAD];
};

// The main loop's tiles and the epilogue's accumulator slab share one shared-memory block
// (33 KiB: two blocks per SM still fit on every sm_80+ part).
union SgemmSmem {
    SgemmTiles t;
    float slab[EPI_ROWS * EPI_STRIDE];
};

// Queues the copy of the K slice starting at k0 of A (rows m0..) and B (columns n0..) into
// buffer `buf`. Indices are recomputed from the parameter block (constant memory) on every
// slice instead of being kept in registers: registers are the scarce resource at 8×8 outputs
// per thread, and the extra integer work hides under the FMAs.
__device__ __forceinline__ void sgemm_load_tile(const MatmulParams& p, SgemmTiles& t, int buf, const float* A,
                                                const float* B, int m0, int n0, int k0, int tid) {
    if (!(p.flags & MM_TRANS_A)) {
        // A is M×K, K contiguous: each thread copies 4 consecutive k of one row, transposing
        // them into the K-major tile.
        int row = tid >> 1, ks = (tid & 1) * 4;
        int gm = m0 + row;
        const float* s = A + (i64)gm * p.a_ld + k0 + ks;
        for (int i = 0; i < 4; i++) {
            bool ok = gm < p.m && k0 + ks + i < p.k;
            cp_async4(&t.a[buf][ks + i][row], ok ? s + i : A, ok);
        }
    } else {
        // A is stored K×M, M contiguous: each thread copies 4 consecutive m of one k.
        int kr = tid >> 5, ms = (tid & 31) * 4;
        int gk = k0 + kr, gm = m0 + ms;
        const float* s = A + (i64)gk * p.a_ld + gm;
        if ((p.flags & MM_A_VEC) && gk < p.k && gm + 3 < p.m) {
            cp_async16(&t.a[buf][kr][ms], s, true);
        } else {
            for (int i = 0; i < 4; i++) {
                bool ok = gk < p.k && gm + i < p.m;
                cp_async4(&t.a[buf][kr][ms + i], ok ? s + i : A, ok);
            }
        }
    }
    if (!(p.flags & MM_TRANS_B)) {
        // B is K×N, N contiguous.
        int kr = tid >> 5, ns = (tid & 31) * 4;
        int gk = k0 + kr, gn = n0 + ns;
        const float* s = B + (i64)gk * p.b_ld + gn;
        if ((p.flags & MM_B_VEC) && gk < p.k && gn + 3 < p.n) {
            cp_async16(&t.b[buf][kr][ns], s, true);
        } else {
            for (int i = 0; i < 4; i++) {
                bool ok = gk < p.k && gn + i < p.n;
                cp_async4(&t.b[buf][kr][ns + i], ok ? s + i : B, ok);
            }
        }
    } else {
        // B is stored N×K, K contiguous: transposed into the K-major tile like A.
        int col = tid >> 1, ks = (tid & 1) * 4;
        int gn = n0 + col;
        const float* s = B + (i64)gn * p.b_ld + k0 + ks;
        for (int i = 0; i < 4; i++) {
            bool ok = gn < p.n && k0 + ks + i < p.k;
            cp_async4(&t.b[buf][ks + i][col], ok ? s + i : B, ok);
        }
    }
}

extern "C" __global__ void __launch_bounds__(SG_THREADS, 2) matmul_f32(const MatmulParams p) {
    __shared__ __align__(16) SgemmSmem smem;
    SgemmTiles& t = smem.t;
    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    // Warps 4 (M) × 2 (N), lanes 4 (M) × 8 (N); each thread owns rows r0+{0..3}, r0+16+{0..3}
    // and columns c0+{0..3}, c0+32+{0..3} of the block tile.
    const int r0 = (warp >> 1) * 32 + (lane >> 3) * 4;
    const int c0 = (warp & 1) * 64 + (lane & 7) * 4;
    const int2 tile = swizzled_tile<TILE_BAND>();
    const int m0 = tile.x * SG_BM, n0 = tile.y * SG_BN;
    const int ktiles = (p.k + SG_BK - 1) / SG_BK;
    // One batch per grid layer; the host splits batches beyond the grid's 65535 layers into
    // several launches by moving the operand offsets.
    const i64 bt = blockIdx.z;
    {
        const float* A = (const float*)p.a + p.a_off + bt * p.a_bs;
        const float* B = (const float*)p.b + p.b_off + bt * p.b_bs;
        float acc[8][8];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;

        if (ktiles > 0) {
            sgemm_load_tile(p, t, 0, A, B, m0, n0, 0, tid);
            cp_async_commit();
        }
        for (int kt = 0; kt < ktiles; kt++) {
            const int buf = kt & 1;
            if (kt + 1 < ktiles) {
                sgemm_load_tile(p, t, buf ^ 1, A, B, m0, n0, (kt + 1) * SG_BK, tid);
                cp_async_commit();
                cp_async_wait_1();
            } else {
                cp_async_wait_all();
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < SG_BK; kk++) {
                float4 a0 = *(const float4*)&t.a[buf][kk][r0];
                float4 a1 = *(const float4*)&t.a[buf][kk][r0 + 16];
                float4 b0 = *(const float4*)&t.b[buf][kk][c0];
                float4 b1 = *(const float4*)&t.b[buf][kk][c0 + 32];
                float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int i = 0; i < 8; i++)
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
            // The next iteration refills this buffer's twin; nobody may still be reading it.
            __syncthreads();
        }

        // Two passes of 64 rows: pass q parks accumulator rows i = 4q..4q+3 of every thread, which
        // are block rows w·32 + 16q + (0..15) for w = 0..3; slab row lr holds block row
        // (lr / 16)·32 + 16q + lr % 16.
        // The pass loop is not unrolled (one copy of the epilogue), so the accumulator row is
        // chosen with a select on q: indexing acc by 4q + i would be a dynamic index, which puts
        // the whole 8×8 array in local memory (a 256-byte stack frame).
        const int lr0 = (warp >> 1) * 16 + (lane >> 3) * 4;
#pragma unroll 1
        for (int q = 0; q < 2; q++) {
            __syncthreads();
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float* s = &smem.slab[(lr0 + i) * EPI_STRIDE];
                float a[8];
#pragma unroll
                for (int j = 0; j < 8; j++) a[j] = q ? acc[4 + i][j] : acc[i][j];
                *(float4*)&s[c0] = make_float4(a[0], a[1], a[2], a[3]);
                *(float4*)&s[c0 + 32] = make_float4(a[4], a[5], a[6], a[7]);
            }
            __syncthreads();
            epilogue_slab<float>(
                p, smem.slab, bt, m0, n0, [q](int lr) { return (lr >> 4) * 32 + q * 16 + (lr & 15); }, tid,
                SG_THREADS);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Skinny products (M <= 32, B stored K×N): `matmul_skinny_<dtype>[_bf16]`.
//
// With few rows the 128×128 tiles leave most of the GPU idle (N = 4096 gives 32 blocks) and
// the op is bound by reading B once. Here a block owns 32 columns and all M rows; its 8 warps
// split K, each lane streams one column of B (a warp reads 128 contiguous bytes of a row of B
// per k), the current 64-deep slice of A sits in shared memory and is read as a broadcast, and
// the 8 partial sums per output are added in shared memory before the common epilogue.
// `BF`: round both inputs to bf16 first (the bf16-compute policy).

#define SK_COLS 32
#define SK_KT 64
#define SK_WARPS 8
#define SK_MAX_M 32
#define SK_THREADS (SK_WARPS * 32)

template <typename T, bool BF> __device__ __forceinline__ float skinny_in(T x) {
    float v = to_f32(x);
    return BF ? to_f32(from_f32<bf16>(v)) : v;
}

template <typename T, bool BF, int MT> __device__ __forceinline__ void matmul_skinny(const MatmulParams& p) {
    // A's slice is stored K-major so that one 16-byte broadcast read feeds 4 FMAs.
    __shared__ __align__(16) float as[SK_KT][MT];
    __shared__ float red[SK_WARPS][MT][SK_COLS];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n0 = blockIdx.x * SK_COLS, col = n0 + lane;
    const i64 bt = blockIdx.z;
    const T* A = (const T*)p.a + p.a_off + bt * p.a_bs;
    const T* B = (const T*)p.b + p.b_off + bt * p.b_bs;
    const bool ta = p.flags & MM_TRANS_A;
    float acc[MT];
#pragma unroll
    for (int m = 0; m < MT; m++) acc[m] = 0.0f;

    for (int k0 = 0; k0 < p.k; k0 += SK_KT) {
        // Stage A[0..M][k0..k0+64] (zero past the edges).
        for (int e = tid; e < MT * SK_KT; e += SK_WARPS * 32) {
            const int m = e % MT, kk = e / MT;
            float v = 0.0f;
            if (m < p.m && k0 + kk < p.k)
                v = skinny_in<T, BF>(ta ? A[(i64)(k0 + kk) * p.a_ld + m] : A[(i64)m * p.a_ld + k0 + kk]);
            as[kk][m] = v;
        }
        __syncthreads();
        if (col < p.n) {
            // Warp w takes rows k0 + w, k0 + w + 8, ...: eight independent loads in flight.
#pragma unroll
            for (int i = 0; i < SK_KT / SK_WARPS; i++) {
                const int kk = warp + i * SK_WARPS;
                if (k0 + kk < p.k) {
                    const float b = skinny_in<T, BF>(B[(i64)(k0 + kk) * p.b_ld + col]);
#pragma unroll
                    for (int m = 0; m < MT; m += 4) {
                        const float4 a4 = *(const float4*)&as[kk][m];
                        acc[m] = fmaf(a4.x, b, acc[m]);
                        acc[m + 1] = fmaf(a4.y, b, acc[m + 1]);
                        acc[m + 2] = fmaf(a4.z, b, acc[m + 2]);
                        acc[m + 3] = fmaf(a4.w, b, acc[m + 3]);
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < MT; m++) red[warp][m][lane] = acc[m];
    __syncthreads();
    for (int e = tid; e < MT * SK_COLS; e += SK_WARPS * 32) {
        const int m = e / SK_COLS, c = e % SK_COLS;
        if (m >= p.m || n0 + c >= p.n) continue;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < SK_WARPS; w++) sum += red[w][m][c];
        *out_ptr<T>(p, bt, m, n0 + c) = from_f32<T>(matmul_epilogue<T>(p, sum, bt, m, n0 + c));
    }
}

// Two register-tile heights: up to 8 rows (decode-style M = 1..8) and up to 32.
#define SK_ENTRY(NAME, T, BF)                                                                                        \
    extern "C" __global__ void __launch_bounds__(256) NAME##_m8(const MatmulParams p) { matmul_skinny<T, BF, 8>(p); } \
    extern "C" __global__ void __launch_bounds__(256) NAME##_m32(const MatmulParams p) {                            \
        matmul_skinny<T, BF, 32>(p);                                                                                   \
    }

SK_ENTRY(matmul_skinny_f32, float, false)
SK_ENTRY(matmul_skinny_f16, f16, false)
SK_ENTRY(matmul_skinny_bf16, bf16, false)
SK_ENTRY(matmul_skinny_f32_bf16, float, true)
SK_ENTRY(matmul_skinny_f16_bf16, f16, true)

// ---------------------------------------------------------------------------------------------
// The naive reference: one thread per output, operands read straight from global memory, f32
// accumulation, no epilogue (what a first CUDA matmul looks like; the bench's lower anchor).

template <typename T> __device__ __forceinline__ void naive_matmul(const MatmulParams& p) {
    i64 col = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    i64 row = (i64)blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= p.m || col >= p.n) return;
    const bool ta = p.flags & MM_TRANS_A, tb = p.flags & MM_TRANS_B;
    {
        const i64 bt = blockIdx.z;
        const T* A = (const T*)p.a + p.a_off + bt * p.a_bs;
        const T* B = (const T*)p.b + p.b_off + bt * p.b_bs;
        float acc = 0.0f;
        for (i64 k = 0; k < p.k; k++) {
            float a = to_f32(ta ? A[k * p.a_ld + row] : A[row * p.a_ld + k]);
            float b = to_f32(tb ? B[col * p.b_ld + k] : B[k * p.b_ld + col]);
            acc = fmaf(a, b, acc);
        }
        *out_ptr<T>(p, bt, row, col) = from_f32<T>(acc);
    }
}

extern "C" __global__ void naive_matmul_f32(const MatmulParams p) { naive_matmul<float>(p); }
extern "C" __global__ void naive_matmul_f16(const MatmulParams p) { naive_matmul<f16>(p); }
extern "C" __global__ void naive_matmul_bf16(const MatmulParams p) { naive_matmul<bf16>(p); }
