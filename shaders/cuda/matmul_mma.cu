// Matmul on the tensor cores (sm_80+): `mma.sync.m16n8k16` with f32 accumulation.
//
// Entry points `matmul_<storage>_<compute>_<ta><tb>`:
// - `matmul_f16_f16_*`, `matmul_bf16_bf16_*`: 16-bit storage multiplied as stored (the
//   products of two f16 or two bf16 values are exact in f32, so this is the `Highest` policy);
// - `matmul_f32_bf16_*`, `matmul_f16_bf16_*`: the bf16-compute policy (`Precision::Bf16`):
//   inputs rounded to bf16 (nearest even) as their fragments are read out of shared memory;
// - `<ta><tb>` is `n` (as stored) or `t` (transposed) for A and B. The shared-memory tile of an
//   operand keeps the operand's own contiguous dimension contiguous, so every global load and
//   every shared store is a 16-byte vector whatever the transposes; the fragments are then read
//   with `ldmatrix` (K-contiguous tiles) or `ldmatrix.trans` (M- or N-contiguous tiles).
//
// Design: 128×128 block tile, 256 threads as 2 (M) × 4 (N) warps of 64×32; per warp and
// 16-deep step, 4 `ldmatrix.x4` for A, 2 for B and 16 MMAs; 64 f32 accumulators per thread.
// Blocks are remapped to bands of tile rows for L2 reuse (`swizzled_tile`). Every variant is a
// `cp.async` pipeline of 16-deep K slices (no register staging), ≤ 128 registers, so two blocks
// per SM on sm_80 and sm_90.
// - 16-bit storage (`matmul_f16_f16_*`, `matmul_bf16_bf16_*`, `matmul_f16_bf16_*`): a 4-stage
//   `cp.async` pipeline of 16-deep K slices (48 KiB of shared memory): global memory goes
//   straight to shared memory in 16-byte copies (no register staging), three slices in flight
//   while the fourth is multiplied, one barrier per slice. Rows are padded by 8 elements: with
//   48- or 272-byte row strides the 8 row addresses of an `ldmatrix` land on 8 distinct 16-byte
//   bank groups, so fragment reads are conflict-free. Shared memory holds the stored f16 bits
//   for `matmul_f16_bf16_*` too; each fragment register (two f16) is rounded to bf16x2 after
//   its `ldmatrix` (`f16x2_to_bf16x2`), bit for bit the rounding these kernels used to do on the
//   way into shared memory (f16 -> f32 is exact, then the same `cvt.rn` to bf16 of that f32).
// - f32 inputs rounded to bf16 (`matmul_f32_bf16_*`): a 3-stage ring of raw f32 tiles
//   (72 KiB of dynamic shared memory); `ldmatrix` reads 16-bit elements only, so each fragment
//   register is read in the m16n8k16 layout with one 64-bit load (K-contiguous tiles) or two
//   32-bit loads (M/N-contiguous tiles) and rounded with `cvt.rn.bf16x2.f32`; 96- or 528-byte
//   row strides keep those reads conflict-free.
#include "common.cuh"

#define TC_BM 128
#define TC_BN 128
#define TC_THREADS 256
#define TC_PAD 8
// The 16-bit cp.async pipeline: 16-deep slices, four stages (4 × 12 KiB: the 48 KiB of static
// shared memory, and two blocks per SM on sm_80 and sm_90 with ≤ 128 registers).
#define TC_BKP 16
#define TC_STAGES 4
// The f32 ring (`matmul_f32_bf16_*`): 16-deep slices of raw f32, three stages (3 × 24 KiB =
// 72 KiB of dynamic shared memory: two blocks per SM on sm_80 and sm_90), rows padded by 8
// floats when K is contiguous (96-byte stride: the 64-bit fragment reads of a half-warp land on
// 16 distinct bank pairs) and by 4 otherwise (528-byte stride: the 32-bit reads of a warp on 32
// distinct banks). Twin: `catalogue::cuda::mma` (F32_*).
#define TC_STAGES32 3
#define TC_PAD32_KC 8
#define TC_PAD32_MN 4
#define TC_SMEM32_BYTES 73728

// Eight consecutive 16-bit input elements in registers (the pipeline's fallback for vectors the
// copies cannot take).
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
        *(uint4*)r.v = q[0];
    } else {
        for (int i = 0; i < 8; i++) {
            bool ok = row < rows && col + i < cols;
            r.v[i] = ok ? s[i] : from_f32<TIn>(0.0f);
        }
    }
    return r;
}

// Eight 16-bit inputs stored as they are (the pipeline's fallback for vectors the copies cannot
// take: shared memory holds what `cp.async` would have put there).
template <typename TIn> __device__ __forceinline__ void store8_raw(u16* dst, const Vec8<TIn>& x) {
    static_assert(sizeof(TIn) == 2, "the pipeline stages 16-bit inputs");
    u32 w[4];
    for (int i = 0; i < 4; i++) w[i] = (u32)x.v[2 * i].bits | ((u32)x.v[2 * i + 1].bits << 16);
    *(uint4*)dst = make_uint4(w[0], w[1], w[2], w[3]);
}

// Rounds one fragment register of two f16 (low half: the lower K or M/N index, as `ldmatrix`
// packs them) to two bf16, nearest even, in the same halves. f16 -> f32 is exact (every f16,
// subnormals included, is a normal f32 or zero; no `.ftz`), so the one rounding is that of the
// f16 value itself, by `cvt.rn.bf16x2.f32`: the packed form of the `cvt.rn.bf16.f32` that
// the f16-input kernels applied on the way into shared memory before they moved to the
// pipeline (`f32_to_bf16_bits(to_f32(x))`, i.e. `from_f32<bf16>`), NaN included. Its operand
// order: `a` goes to the upper half, `b` to the lower.
__device__ __forceinline__ u32 f16x2_to_bf16x2(u32 x) {
    u32 r;
    asm("{\n\t.reg .b16 lo, hi;\n\t.reg .f32 flo, fhi;\n\t"
        "mov.b32 {lo, hi}, %1;\n\t"
        "cvt.f32.f16 flo, lo;\n\t"
        "cvt.f32.f16 fhi, hi;\n\t"
        "cvt.rn.bf16x2.f32 %0, fhi, flo;\n\t}"
        : "=r"(r)
        : "r"(x));
    return r;
}

// Whether shared memory holds f16 that the MMAs take as bf16 (rounded per fragment register).
template <typename TIn, bool BF> struct CvtF16 { static constexpr bool V = false; };
template <> struct CvtF16<f16, true> { static constexpr bool V = true; };

// One operand's tile geometry. `KC`: K is the contiguous dimension (A as M×K, B as N×K), the
// tile is 128 rows × BK (+pad) and fragments are read with plain `ldmatrix`; otherwise the
// tile is BK rows of K × 128 (+pad) and fragments are read with `ldmatrix.trans`.
template <int BK, bool KC> struct TileShape {
    static constexpr int ROWS = KC ? TC_BM : BK;
    static constexpr int COLS = KC ? BK : TC_BM;
    static constexpr int STRIDE = COLS + TC_PAD;
    static constexpr int VECS_PER_ROW = COLS / 8;
};
// Elements of one operand tile: the larger of the K-contiguous (128 × (BK + 8)) and the
// M/N-contiguous (BK × 136) shapes.
template <int BK> struct TileSize {
    static constexpr int A = TC_BM * (BK + TC_PAD), B = BK * (TC_BM + TC_PAD);
    static constexpr int N = A > B ? A : B;
};
#define TC_TILEP TileSize<TC_BKP>::N

// Queues this thread's 16-byte piece of the 16-deep slice at k0 of one operand (a 128 × 16
// or 16 × 128 tile is 256 vectors: one per thread) with `cp.async`. A vector past the edges is
// zero-filled by the copy; a vector cut by an edge, or an operand whose view is not 16-byte
// aligned, goes through registers element by element (plain shared store of the stored bits,
// made visible by the barrier that also publishes the copies). Zero bits are +0 in f16 and
// bf16 alike.
template <typename TIn, bool KC>
__device__ __forceinline__ void cp_operand(u16* tile, const TIn* base, i64 ld, int extent, int kdim, int outer,
                                           int k0, bool vec, int tid) {
    using S = TileShape<TC_BKP, KC>;
    const int r = tid / S::VECS_PER_ROW, c = (tid % S::VECS_PER_ROW) * 8;
    u16* dst = tile + r * S::STRIDE + c;
    const int row = KC ? outer + r : k0 + r, col = KC ? k0 + c : outer + c;
    const int rows = KC ? extent : kdim, cols = KC ? kdim : extent;
    if (row >= rows || col >= cols) {
        cp_async16(dst, base, false);
    } else if (vec && col + 7 < cols) {
        cp_async16(dst, base + (i64)row * ld + col, true);
    } else {
        store8_raw<TIn>(dst, load8<TIn>(base, ld, rows, cols, row, col, false));
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

// One 16-deep step of a warp's 64×32 tile: fragments from the A tile `ta` and the B tile `tb`
// (K offset `ks` inside them), 16 MMAs. `CVT`: the tiles hold f16, rounded to bf16 per fragment
// register before the MMAs.
template <bool BF, bool A_KC, bool B_KC, int SA, int SB, bool CVT = false>
__device__ __forceinline__ void mma_step(float (&acc)[4][4][4], const u16* ta, const u16* tb, int ks, int wm, int wn,
                                         int lane) {
    // Lane roles in `ldmatrix.x4`: lanes 8j..8j+7 give the row addresses of matrix j.
    const int lj = lane >> 3, lr = lane & 7;
    u32 af[4][4], bf[4][2];
#pragma unroll
    for (int mt = 0; mt < 4; mt++) {
        const int mb = wm + mt * 16;
        if (A_KC) {
            // Matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15).
            ldmatrix_x4(af[mt], ta + (mb + lr + (lj & 1) * 8) * SA + ks + (lj >> 1) * 8);
        } else {
            // The same four matrices read transposed out of the K-major tile.
            ldmatrix_x4_trans(af[mt], ta + (ks + lr + (lj >> 1) * 8) * SA + mb + (lj & 1) * 8);
        }
    }
#pragma unroll
    for (int np = 0; np < 2; np++) {
        const int nb = wn + np * 16;
        u32 r[4];
        if (B_KC) {
            // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
            ldmatrix_x4(r, tb + (nb + lr + (lj >> 1) * 8) * SB + ks + (lj & 1) * 8);
        } else {
            ldmatrix_x4_trans(r, tb + (ks + lr + (lj & 1) * 8) * SB + nb + (lj >> 1) * 8);
        }
        bf[2 * np][0] = r[0];
        bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2];
        bf[2 * np + 1][1] = r[3];
    }
    if (CVT) {
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int i = 0; i < 4; i++) af[mt][i] = f16x2_to_bf16x2(af[mt][i]);
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 2; i++) bf[nt][i] = f16x2_to_bf16x2(bf[nt][i]);
    }
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++) mma16816<BF>(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
}

// 16-bit inputs: the 4-stage cp.async pipeline. Stage s of the ring holds the A and B tiles of
// slice kt ≡ s (mod 4), as stored; f16 taken as bf16 is rounded as its fragments are read.
template <typename TIn, bool BF, bool A_KC, bool B_KC>
__device__ __forceinline__ void mainloop_cp_async(float (&acc)[4][4][4], u16* smem, const MatmulParams& p,
                                                  const TIn* A, const TIn* B, int kdim, int m0, int n0, int tid,
                                                  int wm, int wn, int lane) {
    const bool avec = p.flags & MM_A_VEC, bvec = p.flags & MM_B_VEC;
    const int ktiles = (kdim + TC_BKP - 1) / TC_BKP;
    auto sa = [&](int st) { return smem + st * 2 * TC_TILEP; };
    auto sb = [&](int st) { return smem + st * 2 * TC_TILEP + TC_TILEP; };
    auto issue = [&](int kt) {
        const int st = kt % TC_STAGES;
        cp_operand<TIn, A_KC>(sa(st), A, p.a_ld, p.m, kdim, m0, kt * TC_BKP, avec, tid);
        cp_operand<TIn, B_KC>(sb(st), B, p.b_ld, p.n, kdim, n0, kt * TC_BKP, bvec, tid);
    };
    // Prologue: the first three slices in flight, one commit group each (empty past the end,
    // so the group count the waits rely on stays the same).
#pragma unroll
    for (int kt = 0; kt < TC_STAGES - 1; kt++) {
        if (kt < ktiles) issue(kt);
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; kt++) {
        // This thread's copies of slice kt have landed; after the barrier everyone's have, and
        // every warp is done with slice kt - 1, whose stage the next copy refills.
        cp_async_wait<TC_STAGES - 2>();
        __syncthreads();
        if (kt + TC_STAGES - 1 < ktiles) issue(kt + TC_STAGES - 1);
        cp_async_commit();
        const int st = kt % TC_STAGES;
        mma_step<BF, A_KC, B_KC, TileShape<TC_BKP, A_KC>::STRIDE, TileShape<TC_BKP, B_KC>::STRIDE,
                 CvtF16<TIn, BF>::V>(acc, sa(st), sb(st), 0, wm, wn, lane);
    }
    cp_async_wait_all();
}

// f32 inputs: one operand tile of the f32 ring. K-contiguous: 128 rows × (16 + 8) floats;
// otherwise 16 rows of K × (128 + 4).
template <bool KC> struct Tile32 {
    static constexpr int ROWS = KC ? TC_BM : TC_BKP;
    static constexpr int COLS = KC ? TC_BKP : TC_BM;
    static constexpr int STRIDE = COLS + (KC ? TC_PAD32_KC : TC_PAD32_MN);
    static constexpr int VECS_PER_ROW = COLS / 4;
};
// Floats of one operand's stage: the larger shape (128 × 24 = 3072 against 16 × 132 = 2112).
#define TC_TILE32 (TC_BM * (TC_BKP + TC_PAD32_KC))
static_assert(TC_TILE32 >= TC_BKP * (TC_BM + TC_PAD32_MN), "the K-contiguous tile is the larger");
static_assert(TC_STAGES32 * 2 * TC_TILE32 * 4 == TC_SMEM32_BYTES, "the f32 ring is the dynamic shared memory");

// Queues this thread's two 16-byte pieces (4 floats each) of the f32 slice at k0 of one operand
// (128 × 16 floats = 512 vectors). As `cp_operand`: zero-filled past the edges, element by
// element (guarded loads, zero fill, one 16-byte shared store) where a vector is cut by an edge
// or the view is not 16-byte aligned.
template <bool KC>
__device__ __forceinline__ void cp_operand32(float* tile, const float* base, i64 ld, int extent, int kdim, int outer,
                                             int k0, bool vec, int tid) {
    using S = Tile32<KC>;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int v = tid + i * TC_THREADS;
        const int r = v / S::VECS_PER_ROW, c = (v % S::VECS_PER_ROW) * 4;
        float* dst = tile + r * S::STRIDE + c;
        const int row = KC ? outer + r : k0 + r, col = KC ? k0 + c : outer + c;
        const int rows = KC ? extent : kdim, cols = KC ? kdim : extent;
        if (row >= rows || col >= cols) {
            cp_async16(dst, base, false);
        } else if (vec && col + 3 < cols) {
            cp_async16(dst, base + (i64)row * ld + col, true);
        } else {
            const float* src = base + (i64)row * ld + col;
            float x[4];
#pragma unroll
            for (int j = 0; j < 4; j++) x[j] = col + j < cols ? src[j] : 0.0f;
            *(float4*)dst = make_float4(x[0], x[1], x[2], x[3]);
        }
    }
}

// Two f32 rounded to bf16 (nearest even, NaN stays NaN: `cvt.rn.bf16.f32`'s packed form) in one
// register: `lo` in the low half (the lower K index), as the MMA fragments want them.
__device__ __forceinline__ u32 f32x2_to_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// One fragment register: the two f32 at K offsets kk and kk + 1 of outer index i, read from a
// tile of stride S (`KC`: one 64-bit load; else two 32-bit loads, K rows apart), rounded.
template <bool KC, int S> __device__ __forceinline__ u32 frag32(const float* t, int i, int kk) {
    if (KC) {
        const float2 x = *(const float2*)(t + i * S + kk);
        return f32x2_to_bf16x2(x.x, x.y);
    } else {
        return f32x2_to_bf16x2(t[kk * S + i], t[(kk + 1) * S + i]);
    }
}

// One 16-deep step of a warp's 64×32 tile out of the f32 ring: the m16n8k16 fragments read
// directly in their register layout (A: a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 8),
// a3 (g + 8, 2t + 8), each two consecutive K; B: b0 (k 2t, n g), b1 (k 2t + 8, n g)), rounded
// to bf16 as they are read, 16 MMAs.
template <bool A_KC, bool B_KC>
__device__ __forceinline__ void mma_step32(float (&acc)[4][4][4], const float* ta, const float* tb, int wm, int wn,
                                           int lane) {
    constexpr int SA = Tile32<A_KC>::STRIDE, SB = Tile32<B_KC>::STRIDE;
    const int g = lane >> 2, t2 = (lane & 3) * 2;
    u32 bf[4][2];
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        const int n = wn + nt * 8 + g;
        bf[nt][0] = frag32<B_KC, SB>(tb, n, t2);
        bf[nt][1] = frag32<B_KC, SB>(tb, n, t2 + 8);
    }
    // A one 16-row block at a time: 4 fragment registers live instead of 16 (the f32 reads
    // and their conversions take the registers the 16-bit path's `ldmatrix` does not need).
#pragma unroll
    for (int mt = 0; mt < 4; mt++) {
        const int m = wm + mt * 16 + g;
        u32 af[4];
        af[0] = frag32<A_KC, SA>(ta, m, t2);
        af[1] = frag32<A_KC, SA>(ta, m + 8, t2);
        af[2] = frag32<A_KC, SA>(ta, m, t2 + 8);
        af[3] = frag32<A_KC, SA>(ta, m + 8, t2 + 8);
#pragma unroll
        for (int nt = 0; nt < 4; nt++) mma16816<true>(acc[mt][nt], af, bf[nt][0], bf[nt][1]);
    }
}

// f32 inputs: the 3-stage cp.async ring of raw f32 (`smem`: the 72 KiB of dynamic shared
// memory). Stage s holds slice kt ≡ s (mod 3); the same wait/barrier order as the 16-bit
// pipeline, two slices in flight while the third is multiplied.
template <bool A_KC, bool B_KC>
__device__ __forceinline__ void mainloop_f32(float (&acc)[4][4][4], float* smem, const MatmulParams& p,
                                             const float* A, const float* B, int kdim, int m0, int n0, int tid,
                                             int wm, int wn, int lane) {
    const bool avec = p.flags & MM_A_VEC, bvec = p.flags & MM_B_VEC;
    const int ktiles = (kdim + TC_BKP - 1) / TC_BKP;
    auto sa = [&](int st) { return smem + st * 2 * TC_TILE32; };
    auto sb = [&](int st) { return smem + st * 2 * TC_TILE32 + TC_TILE32; };
    auto issue = [&](int kt) {
        const int st = kt % TC_STAGES32;
        cp_operand32<A_KC>(sa(st), A, p.a_ld, p.m, kdim, m0, kt * TC_BKP, avec, tid);
        cp_operand32<B_KC>(sb(st), B, p.b_ld, p.n, kdim, n0, kt * TC_BKP, bvec, tid);
    };
#pragma unroll
    for (int kt = 0; kt < TC_STAGES32 - 1; kt++) {
        if (kt < ktiles) issue(kt);
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<TC_STAGES32 - 2>();
        __syncthreads();
        if (kt + TC_STAGES32 - 1 < ktiles) issue(kt + TC_STAGES32 - 1);
        cp_async_commit();
        const int st = kt % TC_STAGES32;
        mma_step32<A_KC, B_KC>(acc, sa(st), sb(st), wm, wn, lane);
    }
    cp_async_wait_all();
}

// The tensor-core kernels' parameter block: the matmul's, then the split-K workspace. Twin:
// `SplitKParams` in crates/kernels/src/catalogue/cuda/splitk.rs.
struct SplitKParams {
    MatmulParams mm;
    u64 ws;      // f32 [splits][batch][M][splitk_ld(N)] partial products when splits > 1, else 0
    i32 splits;  // K splits: grid z is batch × splits
    i32 k_chunk; // K per split, a multiple of 32 (K itself, or more, when splits is 1)
};

// Row stride of the workspace: N rounded up to 4, so every row starts 16-byte aligned.
__device__ __forceinline__ i64 splitk_ld(int n) { return ((i64)n + 3) & ~(i64)3; }

// Split-K: the block's raw f32 sums of slab rows go to its split's plane of the workspace (no
// epilogue), 16 bytes per store; the padding columns past N receive the zero-filled tiles' sums.
template <typename RowMap>
__device__ __forceinline__ void splitk_park_slab(const SplitKParams& g, const float* slab, int split, i64 bt, int m0,
                                                 int n0, RowMap row_of, int tid, int nthreads) {
    const MatmulParams& p = g.mm;
    const i64 ld = splitk_ld(p.n);
    float* ws = (float*)g.ws + ((i64)split * p.batch + bt) * p.m * ld;
#pragma unroll 1
    for (int e = tid; e < EPI_ROWS * EPI_COLS / 4; e += nthreads) {
        const int lr = e / (EPI_COLS / 4), c4 = (e % (EPI_COLS / 4)) * 4;
        const int row = m0 + row_of(lr), col = n0 + c4;
        if (row >= p.m || col >= p.n) continue;
        *(float4*)&ws[(i64)row * ld + col] = *(const float4*)&slab[lr * EPI_STRIDE + c4];
    }
}

template <typename TIn, bool BF, bool TA, bool TB>
__device__ __forceinline__ void matmul_mma(const SplitKParams& sp) {
    const MatmulParams& p = sp.mm;
    // A is K-contiguous unless transposed; B is K-contiguous only when transposed.
    constexpr bool A_KC = !TA;
    constexpr bool B_KC = TB;
    // The tiles (48 KiB of 16-bit stages, 72 KiB of f32 ones), reused by the epilogue's 33 KiB
    // slab.
    constexpr int SMEM = TC_STAGES * 2 * TC_TILEP;
    static_assert(SMEM * 2 >= EPI_BYTES && TC_SMEM32_BYTES >= EPI_BYTES, "the epilogue slab fits in the tiles");
    constexpr bool F32 = sizeof(TIn) == 4;
    u16* smem;
    if constexpr (F32) {
        // The f32 ring: dynamic shared memory (`Kernel::dynamic_smem_bytes`).
        extern __shared__ __align__(16) u16 tc_dyn[];
        smem = tc_dyn;
    } else {
        __shared__ __align__(16) u16 tc_static[SMEM];
        smem = tc_static;
    }

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
    const int2 tile = swizzled_tile<TILE_BAND>();
    const int m0 = tile.x * TC_BM, n0 = tile.y * TC_BN;
    // Grid layer z is split z % splits of batch z / splits; the host splits larger batches
    // into several launches. Split s multiplies K range [s·k_chunk, min((s + 1)·k_chunk, K)):
    // the operands start k0 further along K and the split sees a K of `kdim`. k_chunk is a
    // multiple of 32, so the moved starts keep the 16-byte alignment the vector flags promise.
    const int split = (int)(blockIdx.z % (u32)sp.splits);
    const i64 bt = blockIdx.z / (u32)sp.splits;
    const int k0 = split * sp.k_chunk;
    const int kdim = p.k - k0 < sp.k_chunk ? p.k - k0 : sp.k_chunk;
    const TIn* A = (const TIn*)p.a + p.a_off + bt * p.a_bs + (TA ? (i64)k0 * p.a_ld : (i64)k0);
    const TIn* B = (const TIn*)p.b + p.b_off + bt * p.b_bs + (TB ? (i64)k0 : (i64)k0 * p.b_ld);

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    // `if constexpr`: the pipeline's raw stores exist for 16-bit inputs only.
    if constexpr (F32) mainloop_f32<A_KC, B_KC>(acc, (float*)smem, p, A, B, kdim, m0, n0, tid, wm, wn, lane);
    else mainloop_cp_async<TIn, BF, A_KC, B_KC>(acc, smem, p, A, B, kdim, m0, n0, tid, wm, wn, lane);

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
        const auto row_of = [h](int lr) { return h * 64 + lr; };
        if (sp.splits > 1) splitk_park_slab(sp, slab, split, bt, m0, n0, row_of, tid, TC_THREADS);
        else epilogue_slab<TIn>(p, slab, bt, m0, n0, row_of, tid, TC_THREADS);
    }
}

// The split-K reduction: each thread sums 4 consecutive outputs over the splits, in split order
// (16-byte workspace loads; the same order on every run), and applies the epilogue once.
template <typename T> __device__ __forceinline__ void splitk_reduce(const SplitKParams& g) {
    const MatmulParams& p = g.mm;
    // 32-bit indices: the host splits K only for grids under one wave of 128 × 128 tiles, so
    // batch·M·N stays far below 2^31 (`catalogue::cuda::splitk`).
    const u32 ld = (u32)splitk_ld(p.n), per_row = ld / 4, m = (u32)p.m;
    const i64 plane = (i64)p.batch * p.m * ld;
    const u32 total = (u32)p.batch * m * per_row;
    const float* ws = (const float*)g.ws;
    for (u32 e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const u32 r = e / per_row, col = (e - r * per_row) * 4;
        const u32 bt = r / m, row = r - bt * m;
        if (col >= (u32)p.n) continue;
        const float* w = ws + (i64)r * ld + col;
        float4 a = *(const float4*)w;
        for (int s = 1; s < g.splits; s++) {
            const float4 b = *(const float4*)(w + s * plane);
            a = make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
        }
        const float acc[4] = {a.x, a.y, a.z, a.w};
        const int n_valid = p.n - (int)col < 4 ? p.n - (int)col : 4;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = j < n_valid ? matmul_epilogue<T>(p, acc[j], bt, row, col + j) : 0.0f;
        T* o = out_ptr<T>(p, bt, row, col);
        if ((p.flags & MM_OUT_VEC) && n_valid == 4) {
            store4<T>(p, o, v, 4);
        } else {
            // Element stores with constant indices (`store4`'s loop to n_valid would index v
            // dynamically and put it in local memory).
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (j < n_valid) o[j] = from_f32<T>(v[j]);
        }
    }
}

// MINB 2 (at most 128 registers a thread) gives 16 warps per SM to hide the shared-memory and
// global latencies that one block of 8 cannot; every variant fits it without spills on sm_80
// and sm_90 (the f32 one since its inputs go through the `cp.async` ring rather than
// registers: staged through registers, `_tt` had spilled).
#define TC_ENTRY(NAME, TIN, BF)                                                                                        \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, 2) NAME##_nn(const SplitKParams p) {                  \
        matmul_mma<TIN, BF, false, false>(p);                                                                          \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, 2) NAME##_nt(const SplitKParams p) {                  \
        matmul_mma<TIN, BF, false, true>(p);                                                                           \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, 2) NAME##_tn(const SplitKParams p) {                  \
        matmul_mma<TIN, BF, true, false>(p);                                                                           \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, 2) NAME##_tt(const SplitKParams p) {                  \
        matmul_mma<TIN, BF, true, true>(p);                                                                            \
    }

TC_ENTRY(matmul_f16_f16, f16, false)
TC_ENTRY(matmul_bf16_bf16, bf16, true)
TC_ENTRY(matmul_f16_bf16, f16, true)
TC_ENTRY(matmul_f32_bf16, float, true)

extern "C" __global__ void __launch_bounds__(256) matmul_splitk_reduce_f32(const SplitKParams g) { splitk_reduce<float>(g); }
extern "C" __global__ void __launch_bounds__(256) matmul_splitk_reduce_f16(const SplitKParams g) { splitk_reduce<f16>(g); }
extern "C" __global__ void __launch_bounds__(256) matmul_splitk_reduce_bf16(const SplitKParams g) { splitk_reduce<bf16>(g); }
