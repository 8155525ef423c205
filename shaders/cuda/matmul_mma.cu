// Matmul on the tensor cores (sm_80+): `mma.sync.m16n8k16` with f32 accumulation.
//
// Entry points `matmul_<storage>_<compute>_<ta><tb>`:
// - `matmul_f16_f16_*`, `matmul_bf16_bf16_*`: 16-bit storage multiplied as stored (the
//   products of two f16 or two bf16 values are exact in f32, so this is the `Highest` policy);
// - `matmul_f32_bf16_*`, `matmul_f16_bf16_*`: the bf16-compute policy (`Precision::Bf16`):
//   inputs rounded to bf16 (nearest even) on their way into shared memory;
// - `<ta><tb>` is `n` (as stored) or `t` (transposed) for A and B. The shared-memory tile of an
//   operand keeps the operand's own contiguous dimension contiguous, so every global load and
//   every shared store is a 16-byte vector whatever the transposes; the fragments are then read
//   with `ldmatrix` (K-contiguous tiles) or `ldmatrix.trans` (M- or N-contiguous tiles).
//
// Design: 128×128 block tile, 32-deep K slices, 256 threads as 2 (M) × 4 (N) warps of 64×32;
// per warp and 16-deep step, 4 `ldmatrix.x4` for A, 2 for B and 16 MMAs; 64 f32 accumulators
// per thread. Shared memory is double-buffered through registers (the next slice is loaded
// into registers before the current one is multiplied and stored after it), which lets the
// same loader round f32 or f16 inputs to bf16 on the way. Rows are padded by 8 elements
// (16 bytes): with 80- or 272-byte row strides the 8 row addresses of an `ldmatrix` land on 8
// distinct 16-byte bank groups, so fragment reads are conflict-free.
#include "common.cuh"

#define TC_BM 128
#define TC_BN 128
#define TC_BK 32
#define TC_THREADS 256
#define TC_PAD 8
// The larger of a K-contiguous tile (128 rows × 40) and an M/N-contiguous one (32 × 136).
#define TC_TILE (TC_BM * (TC_BK + TC_PAD))

// The 16-bit pattern the tensor cores multiply: the stored value, or its bf16 rounding.
template <typename TIn, bool BF> __device__ __forceinline__ u16 mma_bits(TIn x);
template <> __device__ __forceinline__ u16 mma_bits<f16, false>(f16 x) { return x.bits; }
template <> __device__ __forceinline__ u16 mma_bits<bf16, true>(bf16 x) { return x.bits; }
template <> __device__ __forceinline__ u16 mma_bits<f16, true>(f16 x) { return f32_to_bf16_bits(to_f32(x)); }
template <> __device__ __forceinline__ u16 mma_bits<float, true>(float x) { return f32_to_bf16_bits(x); }

// Eight consecutive input elements staged in registers between their global load and their
// shared store.
template <typename TIn> struct __align__(16) Vec8 { TIn v[8]; };

// Loads eight consecutive elements (along the operand's contiguous dimension) at `row`,
// `col..col+8` of a `rows × cols` operand, zero past the edges. `vec`: the operand's offset,
// leading dimension and batch stride allow 16-byte loads.
template <typename TIn>
__device__ __forceinline__ Vec8<TIn> load8(const TIn* base, i64 ld, int rows, int cols, int row, int col, bool vec) {
    Vec8<TIn> r;
    const TIn* s = base + (i64)row * ld + col;
    if (vec && row < rows && col + 7 < cols) {
        const uint4* q = (const uint4*)s;
        if (sizeof(TIn) == 2) {
            *(uint4*)r.v = q[0];
        } else {
            *(uint4*)&r.v[0] = q[0];
            *(uint4*)&r.v[4] = q[1];
        }
    } else {
        for (int i = 0; i < 8; i++) {
            bool ok = row < rows && col + i < cols;
            r.v[i] = ok ? s[i] : from_f32<TIn>(0.0f);
        }
    }
    return r;
}

template <typename TIn, bool BF> __device__ __forceinline__ void store8(u16* dst, const Vec8<TIn>& x) {
    u32 w[4];
    for (int i = 0; i < 4; i++) w[i] = (u32)mma_bits<TIn, BF>(x.v[2 * i]) | ((u32)mma_bits<TIn, BF>(x.v[2 * i + 1]) << 16);
    *(uint4*)dst = make_uint4(w[0], w[1], w[2], w[3]);
}

// One operand's tile geometry. `KC`: K is the contiguous dimension (A as M×K, B as N×K), the
// tile is 128 rows × 32 (+pad) and fragments are read with plain `ldmatrix`; otherwise the
// tile is 32 rows of K × 128 (+pad) and fragments are read with `ldmatrix.trans`.
template <bool KC> struct TileShape {
    static constexpr int ROWS = KC ? TC_BM : TC_BK;
    static constexpr int COLS = KC ? TC_BK : TC_BM;
    static constexpr int STRIDE = COLS + TC_PAD;
    static constexpr int VECS_PER_ROW = COLS / 8;
};

// Loads this thread's two vectors of the slice at k0. `outer` is the tile's first row or
// column along M (or N); `extent` the operand's M (or N).
template <typename TIn, bool KC>
__device__ __forceinline__ void load_operand(Vec8<TIn> (&st)[2], const TIn* base, i64 ld, int extent, int kdim,
                                             int outer, int k0, bool vec, int tid) {
    for (int i = 0; i < 2; i++) {
        int v = tid + i * TC_THREADS;
        int r = v / TileShape<KC>::VECS_PER_ROW, c = (v % TileShape<KC>::VECS_PER_ROW) * 8;
        if (KC) st[i] = load8<TIn>(base, ld, extent, kdim, outer + r, k0 + c, vec);
        else st[i] = load8<TIn>(base, ld, kdim, extent, k0 + r, outer + c, vec);
    }
}

template <typename TIn, bool BF, bool KC>
__device__ __forceinline__ void store_operand(u16* tile, const Vec8<TIn> (&st)[2], int tid) {
    for (int i = 0; i < 2; i++) {
        int v = tid + i * TC_THREADS;
        int r = v / TileShape<KC>::VECS_PER_ROW, c = (v % TileShape<KC>::VECS_PER_ROW) * 8;
        store8<TIn, BF>(tile + r * TileShape<KC>::STRIDE + c, st[i]);
    }
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

template <bool BF> __device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if (BF) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

template <typename TIn, bool BF, bool TA, bool TB> __device__ __forceinline__ void matmul_mma(const MatmulParams& p) {
    // A is K-contiguous unless transposed; B is K-contiguous only when transposed.
    constexpr bool A_KC = !TA;
    constexpr bool B_KC = TB;
    // The A and B tiles of both buffers (40 KiB), reused by the epilogue's 33 KiB slab.
    __shared__ __align__(16) u16 smem[4 * TC_TILE];
    u16(*sa)[TC_TILE] = (u16(*)[TC_TILE])smem;
    u16(*sb)[TC_TILE] = (u16(*)[TC_TILE])(smem + 2 * TC_TILE);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
    const int m0 = blockIdx.y * TC_BM, n0 = blockIdx.x * TC_BN;
    // One batch per grid layer; the host splits larger batches into several launches.
    const i64 bt = blockIdx.z;
    const TIn* A = (const TIn*)p.a + p.a_off + bt * p.a_bs;
    const TIn* B = (const TIn*)p.b + p.b_off + bt * p.b_bs;
    const bool avec = p.flags & MM_A_VEC, bvec = p.flags & MM_B_VEC;
    const int ktiles = (p.k + TC_BK - 1) / TC_BK;

    float acc[4][4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    Vec8<TIn> sta[2], stb[2];
    if (ktiles > 0) {
        load_operand<TIn, A_KC>(sta, A, p.a_ld, p.m, p.k, m0, 0, avec, tid);
        load_operand<TIn, B_KC>(stb, B, p.b_ld, p.n, p.k, n0, 0, bvec, tid);
        store_operand<TIn, BF, A_KC>(sa[0], sta, tid);
        store_operand<TIn, BF, B_KC>(sb[0], stb, tid);
    }
    __syncthreads();

    // Lane roles in `ldmatrix.x4`: lanes 8j..8j+7 give the row addresses of matrix j.
    const int lj = lane >> 3, lr = lane & 7;
    for (int kt = 0; kt < ktiles; kt++) {
        const int buf = kt & 1;
        const bool more = kt + 1 < ktiles;
        if (more) {
            load_operand<TIn, A_KC>(sta, A, p.a_ld, p.m, p.k, m0, (kt + 1) * TC_BK, avec, tid);
            load_operand<TIn, B_KC>(stb, B, p.b_ld, p.n, p.k, n0, (kt + 1) * TC_BK, bvec, tid);
        }
        const u16* ta = sa[buf];
        const u16* tb = sb[buf];
#pragma unroll
        for (int ks = 0; ks < TC_BK; ks += 16) {
            u32 af[4][4], bf[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; mt++) {
                const int mb = wm + mt * 16;
                if (A_KC) {
                    // Matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15).
                    ldmatrix_x4(af[mt], ta + (mb + lr + (lj & 1) * 8) * TileShape<A_KC>::STRIDE + ks + (lj >> 1) * 8);
                } else {
                    // The same four matrices read transposed out of the K-major tile.
                    ldmatrix_x4_trans(af[mt],
                                      ta + (ks + lr + (lj >> 1) * 8) * TileShape<A_KC>::STRIDE + mb + (lj & 1) * 8);
                }
            }
#pragma unroll
            for (int np = 0; np < 2; np++) {
                const int nb = wn + np * 16;
                u32 r[4];
                if (B_KC) {
                    // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
                    ldmatrix_x4(r, tb + (nb + lr + (lj >> 1) * 8) * TileShape<B_KC>::STRIDE + ks + (lj & 1) * 8);
                } else {
                    ldmatrix_x4_trans(r, tb + (ks + lr + (lj & 1) * 8) * TileShape<B_KC>::STRIDE + nb + (lj >> 1) * 8);
                }
                bf[2 * np][0] = r[0];
                bf[2 * np][1] = r[1];
                bf[2 * np + 1][0] = r[2];
                bf[2 * np + 1][1] = r[3];
            }
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) mma16816<BF>(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
        }
        if (more) {
            // The other buffer was last read in the previous iteration, before its closing
            // barrier.
            store_operand<TIn, BF, A_KC>(sa[buf ^ 1], sta, tid);
            store_operand<TIn, BF, B_KC>(sb[buf ^ 1], stb, tid);
        }
        __syncthreads();
    }

    // Accumulator layout of m16n8: c0,c1 at (g, 2t..2t+1), c2,c3 at (g + 8, 2t..2t+1). The two
    // rows of warps park their 64×128 halves in the slab in turn.
    const int g = lane >> 2, t4 = lane & 3;
    float* slab = (float*)smem;
#pragma unroll 1
    for (int h = 0; h < 2; h++) {
        __syncthreads();
        if ((warp >> 2) == h) {
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    float* s = slab + (mt * 16 + g) * EPI_STRIDE + wn + nt * 8 + 2 * t4;
                    *(float2*)s = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
                    *(float2*)(s + 8 * EPI_STRIDE) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
                }
        }
        __syncthreads();
        epilogue_slab<TIn>(p, slab, bt, m0, n0, [h](int lr) { return h * 64 + lr; }, tid, TC_THREADS);
    }
}

// MINB 2 (at most 128 registers a thread) gives 16 warps per SM to hide the shared-memory and
// global latencies that one block of 8 cannot. The f32-input variant stages twice the bytes in
// registers and would spill under that cap, so it runs one block per SM.
#define TC_ENTRY(NAME, TIN, BF, MINB)                                                                                      \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, MINB) NAME##_nn(const MatmulParams p) {                        \
        matmul_mma<TIN, BF, false, false>(p);                                                                          \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, MINB) NAME##_nt(const MatmulParams p) {                        \
        matmul_mma<TIN, BF, false, true>(p);                                                                           \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, MINB) NAME##_tn(const MatmulParams p) {                        \
        matmul_mma<TIN, BF, true, false>(p);                                                                           \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, MINB) NAME##_tt(const MatmulParams p) {                        \
        matmul_mma<TIN, BF, true, true>(p);                                                                            \
    }

TC_ENTRY(matmul_f16_f16, f16, false, 2)
TC_ENTRY(matmul_bf16_bf16, bf16, true, 2)
TC_ENTRY(matmul_f16_bf16, f16, true, 2)
TC_ENTRY(matmul_f32_bf16, float, true, 1)
