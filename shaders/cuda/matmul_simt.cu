// Matmul on the CUDA cores: the f32 path (`matmul_f32`) and the naive bench reference
// (`naive_matmul_<dtype>`).
//
// `matmul_f32` follows the cuBLAS-class SIMT SGEMM design (as in CUTLASS's SIMT kernels and
// siboehm/SGEMM_CUDA):
// - a 128×128 block tile with a 16-deep K slice, 256 threads (8 warps as 4 along M × 2 along
//   N, each warp 32×64), and an 8×8 register tile per thread split into 2×2 sub-tiles of 4×4,
//   so a warp's shared-memory reads are 4 (A) and 8 (B) distinct float4s: one wavefront each;
// - a 3-stage shared-memory ring: two K slices stream in while the third is multiplied, one
//   barrier per slice (`cp.async.wait_group 1`, then `__syncthreads`, then the refill of the
//   stage everybody finished reading in the previous slice);
// - op(A) with A stored M×K (K contiguous) goes through registers: 16-byte global loads along
//   K, issued before the current slice is multiplied and written to shared memory after it as
//   4 scalar stores each (the register transpose; `cp.async` cannot transpose). Every other
//   operand layout is copied by `cp.async`: 16 bytes where the operand is contiguous along the
//   tile's fast dimension and aligned, 4 bytes (with zero fill past the edges) otherwise,
//   including the transposing copies of Bᵀ (N×K);
// - both tiles are stored K-major (`[k][m]`, `[k][n]`), padded by 4 floats per row: the pad
//   keeps rows 16-byte aligned for the float4 reads and shifts consecutive rows by 4 banks;
// - the fused epilogue (alpha, bias, beta·C, activation) with float4 stores where the output
//   view is aligned, the accumulators kept in registers throughout (no dynamic index);
// - blocks remapped to bands of 8 tile rows (`swizzled_tile`) for L2 reuse.
//
// The thread-to-element maps of the loaders, the stage ring's ordering and the banks of every
// shared access are replayed on the host by `crates/kernels/src/catalogue/cuda/simt.rs`,
// whose tests also read the `SG_*` constants below from this file.
#include "common.cuh"

// Block tile 128×128×16: 8×8 outputs for each of 256 threads; three 16-deep slices of A and B
// (3·2·16·132·4 B = 49.5 KiB): over the 48 KiB of static shared memory, so the ring is dynamic
// shared memory and the host raises the kernel's limit (`simt::SMEM_BYTES` in the catalogue).
// Two blocks per SM still fit on sm_80 (164 KiB) and sm_90 (228 KiB).
#define SG_BM 128
#define SG_BN 128
#define SG_BK 16
#define SG_PAD 4
#define SG_STAGES 3
#define SG_THREADS 256

struct SgemmTiles {
    float a[SG_STAGES][SG_BK][SG_BM + SG_PAD];
    float b[SG_STAGES][SG_BK][SG_BN + SG_PAD];
};

// The main loop's ring and the epilogue's accumulator slab share the dynamic shared memory.
union SgemmSmem {
    SgemmTiles t;
    float slab[EPI_ROWS * EPI_STRIDE];
};
#define SG_SMEM_BYTES 50688
static_assert(sizeof(SgemmSmem) == SG_SMEM_BYTES, "the host launches matmul_f32 with SG_SMEM_BYTES");

// Indices are recomputed from the parameter block (constant memory) on every slice instead of
// being kept in registers: registers are the scarce resource at 8×8 outputs per thread, and
// the extra integer work hides under the FMAs.

// The register-transpose loads of A stored M×K: thread t owns row t/2 of the tile and the
// float4s of K at quads (t % 2) + 2j, j = 0, 1. A warp thus covers 16 rows × 2 adjacent quads
// (32 contiguous bytes of each row); in shared memory the two quads' rows are 16 banks apart
// (4 rows × 4 banks of pad), so each of the 4 scalar stores per float4 hits 32 distinct banks.
__device__ __forceinline__ void sgemm_ldg_a(const MatmulParams& p, const float* A, int m0, int k0, int tid,
                                            float4 (&r)[2]) {
    const int row = tid >> 1, gm = m0 + row;
    const float* s = A + (i64)gm * p.a_ld + k0;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int kq = ((tid & 1) + 2 * j) * 4, gk = k0 + kq;
        if ((p.flags & MM_A_VEC) && gm < p.m && gk + 3 < p.k) {
            r[j] = *(const float4*)(s + kq);
        } else {
            float e[4];
#pragma unroll
            for (int i = 0; i < 4; i++) e[i] = (gm < p.m && gk + i < p.k) ? s[kq + i] : 0.0f;
            r[j] = make_float4(e[0], e[1], e[2], e[3]);
        }
    }
}

__device__ __forceinline__ void sgemm_sts_a(SgemmTiles& t, int stage, int tid, const float4 (&r)[2]) {
    const int row = tid >> 1;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int kq = ((tid & 1) + 2 * j) * 4;
        t.a[stage][kq + 0][row] = r[j].x;
        t.a[stage][kq + 1][row] = r[j].y;
        t.a[stage][kq + 2][row] = r[j].z;
        t.a[stage][kq + 3][row] = r[j].w;
    }
}

// Queues the copy of a K-major slice from an operand contiguous along the tile's fast
// dimension (A stored K×M, B stored K×N): thread t copies 4 consecutive elements of slice rows
// t/32 and t/32 + 8, 16 bytes at once where `vec` and the vector lies inside the matrix.
__device__ __forceinline__ void sgemm_cp_rows(float (*dst)[SG_BM + SG_PAD], const float* X, i64 ld, int k0, int c0,
                                              int kmax, int cmax, bool vec, int tid) {
    const int cs = (tid & 31) * 4, gc = c0 + cs;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int kr = (tid >> 5) + 8 * j, gk = k0 + kr;
        const float* s = X + (i64)gk * ld + gc;
        if (vec && gk < kmax && gc + 3 < cmax) {
            cp_async16(&dst[kr][cs], s, true);
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const bool ok = gk < kmax && gc + i < cmax;
                cp_async4(&dst[kr][cs + i], ok ? s + i : X, ok);
            }
        }
    }
}

// Queues the transposing copy of B stored N×K: the register transpose's map (column t/2,
// quads (t % 2) + 2j of K) with one 4-byte copy per element.
__device__ __forceinline__ void sgemm_cp_bt(const MatmulParams& p, float (*dst)[SG_BN + SG_PAD], const float* B,
                                            int n0, int k0, int tid) {
    const int col = tid >> 1, gn = n0 + col;
    const float* s = B + (i64)gn * p.b_ld + k0;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int kq = ((tid & 1) + 2 * j) * 4;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const bool ok = gn < p.n && k0 + kq + i < p.k;
            cp_async4(&dst[kq + i][col], ok ? s + kq + i : B, ok);
        }
    }
}

// Starts the fetch of slice `kt` into `stage`: B's and (A stored K×M) A's `cp.async` copies,
// or (A stored M×K) A's global loads into `ra`, which `sgemm_sts_a` stores later.
__device__ __forceinline__ void sgemm_fetch(const MatmulParams& p, SgemmTiles& t, int stage, const float* A,
                                            const float* B, int m0, int n0, int kt, int tid, float4 (&ra)[2]) {
    const int k0 = kt * SG_BK;
    if (!(p.flags & MM_TRANS_A)) {
        sgemm_ldg_a(p, A, m0, k0, tid, ra);
    } else {
        sgemm_cp_rows(t.a[stage], A, p.a_ld, k0, m0, p.k, p.m, p.flags & MM_A_VEC, tid);
    }
    if (!(p.flags & MM_TRANS_B)) {
        sgemm_cp_rows(t.b[stage], B, p.b_ld, k0, n0, p.k, p.n, p.flags & MM_B_VEC, tid);
    } else {
        sgemm_cp_bt(p, t.b[stage], B, n0, k0, tid);
    }
}

extern "C" __global__ void __launch_bounds__(SG_THREADS, 2) matmul_f32(const MatmulParams p) {
    extern __shared__ __align__(16) unsigned char sg_dyn[];
    SgemmSmem& smem = *reinterpret_cast<SgemmSmem*>(sg_dyn);
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
    const bool a_regs = !(p.flags & MM_TRANS_A);
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
        float4 ra[2];

        // Prologue: slices 0 .. STAGES-2 into stages 0 .. STAGES-2, one commit group each
        // (empty past the last slice, so the group count below stays exact).
#pragma unroll
        for (int s = 0; s < SG_STAGES - 1; s++) {
            if (s < ktiles) {
                sgemm_fetch(p, t, s, A, B, m0, n0, s, tid, ra);
                if (a_regs) sgemm_sts_a(t, s, tid, ra);
            }
            cp_async_commit();
        }
        for (int kt = 0; kt < ktiles; kt++) {
            const int stage = kt % SG_STAGES;
            // Groups committed so far: slices 0 .. kt+1. Waiting until at most STAGES-2 are in
            // flight completes this thread's copies of slice kt; the barrier makes everybody's
            // visible, and it also means everybody has finished multiplying slice kt-1, whose
            // stage the fetch below refills.
            cp_async_wait<SG_STAGES - 2>();
            __syncthreads();
            const int next = kt + SG_STAGES - 1, next_stage = next % SG_STAGES;
            const bool fetch = next < ktiles;
            if (fetch) sgemm_fetch(p, t, next_stage, A, B, m0, n0, next, tid, ra);
            cp_async_commit();
#pragma unroll
            for (int kk = 0; kk < SG_BK; kk++) {
                float4 a0 = *(const float4*)&t.a[stage][kk][r0];
                float4 a1 = *(const float4*)&t.a[stage][kk][r0 + 16];
                float4 b0 = *(const float4*)&t.b[stage][kk][c0];
                float4 b1 = *(const float4*)&t.b[stage][kk][c0 + 32];
                float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int i = 0; i < 8; i++)
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
            // A's registers of slice `next` go to its stage now: nobody reads that stage
            // until the barrier of iteration `next`, and nobody has read it since this
            // iteration's barrier.
            if (fetch && a_regs) sgemm_sts_a(t, next_stage, tid, ra);
        }
        // Only empty groups can be in flight here; the first barrier below ends every read of
        // the ring before the slab (the same memory) is written.
        cp_async_wait_all();

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
