// GEMV / skinny GEMM: `gemv_<storage>[_bf16]_<nk|kn>_m{4,16}` (M <= 16), the shared-memory ring
// `gemv_<storage>[_bf16]_kn_s{16,32}` (B stored [K, N], 4 < M <= 32; see `gemv_kn_smem` below)
// and the split-K epilogue `gemv_finalize_<storage>`. With B [K, N] the host takes `_kn_m4` for
// M <= 4 and the ring above; `_kn_m16` stays as the bench's reference for what the ring replaced.
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

// The warps' partials meeting in warp order: the first warp stores its `R` rows of V sums (rows
// row0.. of `red`, those past M skipped), each later one adds its own, between barriers.
template <int R, int V, int BCOLS>
__device__ __forceinline__ void gv_park(float (*red)[BCOLS], const float (&acc)[R][V], int row0, int m, int lane,
                                        bool first) {
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (row0 + i < m) {
            float4* r = (float4*)&red[row0 + i][lane * V];
#pragma unroll
            for (int q = 0; q < V / 4; q++) {
                float4 v = make_float4(acc[i][4 * q], acc[i][4 * q + 1], acc[i][4 * q + 2], acc[i][4 * q + 3]);
                if (!first) {
                    const float4 o = r[q];
                    v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
                }
                r[q] = v;
            }
        }
    }
}

// Sends the block's `MT` rows × BCOLS sums in `red` (columns from n0) to `gv_emit`, consecutive
// threads on consecutive columns.
template <typename T, int MT, int BCOLS>
__device__ __forceinline__ void gv_emit_rows(const GemvParams& g, const float (*red)[BCOLS], int n0, i64 bt, int tid) {
    const MatmulParams& p = g.mm;
    for (int e = tid; e < MT * BCOLS; e += GV_WARPS * 32) {
        const int m = e / BCOLS, c = n0 + e % BCOLS;
        if (m < p.m && c < p.n) gv_emit<T>(g, red[m][e % BCOLS], bt, m, c);
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
        if (warp == w && cn > 0) gv_park<MT, V, BCOLS>(red, acc, 0, p.m, lane, w == 0);
        __syncthreads();
    }
    gv_emit_rows<T, MT, BCOLS>(g, red, n0, bt, tid);
}

// ---------------------------------------------------------------------------------------------
// `kn` through shared memory: `gemv_<storage>[_bf16]_kn_s{16,32}` (4 < M <= 32). With 16 or 32
// rows the register tiles above hold few loads in flight (one block of 8 warps per SM at 16 rows),
// so here B streams through a ring of GS_STAGES shared-memory stages filled by `cp.async`
// (GS_KC rows of the block's 512-byte column strip each, 8 KiB; three stages in flight while
// one is read), which costs no registers. op(A)'s GS_KC × MT elements of a stage are loaded
// into registers when the stage is queued and stored (as f32, [k][m]) after the current stage's
// FMAs, so their latency hides behind them too. The 8 warps form G groups of W warps: group g
// owns rows [g·MR, (g + 1)·MR) of the tile (MR·V = 64 accumulators per lane) and its W warps
// split each stage's rows (row r of the stage to warp r mod W). The groups' partials meet in
// shared memory in warp order, as in `gemv_kn`; the ring becomes that buffer once drained.
// A vector of B cut by N, or a view not 16-byte aligned, goes through registers element by
// element (plain shared stores, published by the barrier that publishes the copies).
#define GS_KC 16
#define GS_STAGES 4

template <typename T> __device__ __forceinline__ T zero_elem() {
    T z;
    *(u16*)&z = 0;
    return z;
}
template <> __device__ __forceinline__ float zero_elem<float>() { return 0.0f; }

// V elements of T from 16 bytes of shared memory, bf16-rounded when BF.
template <typename T, bool BF, int V> __device__ __forceinline__ void smem_vec16(const T* src, float (&dst)[V]) {
    if (sizeof(T) == 4) {
        const float4 v = *(const float4*)src;
        dst[0] = v.x;
        dst[1] = v.y;
        dst[2] = v.z;
        dst[3] = v.w;
    } else {
        const uint4 v = *(const uint4*)src;
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            T lo, hi;
            *(u16*)&lo = (u16)(w[i] & 0xffffu);
            *(u16*)&hi = (u16)(w[i] >> 16);
            dst[2 * i] = to_f32(lo);
            dst[2 * i + 1] = to_f32(hi);
        }
    }
    if (BF) {
#pragma unroll
        for (int j = 0; j < V; j++) dst[j] = to_f32(from_f32<bf16>(dst[j]));
    }
}

template <typename T, int MT> struct GsRing {
    T b[GS_STAGES][GS_KC][32 * (16 / sizeof(T))]; // 32 KiB
    float a[GS_STAGES][GS_KC][MT];                // 4 or 8 KiB
};
template <typename T, int MT> union GsSmem {
    GsRing<T, MT> ring;
    float red[MT][32 * (16 / sizeof(T))]; // at most 32 KiB
};

template <typename T, bool BF, int MT> __device__ __forceinline__ void gemv_kn_smem(const GemvParams& g) {
    constexpr int V = 16 / sizeof(T), BCOLS = 32 * V;
    constexpr int G = MT * V / 64, MR = MT / G, W = GV_WARPS / G, RPW = GS_KC / W;
    constexpr int BVECS = GS_KC * 32 / (GV_WARPS * 32); // 16-byte vectors of B per thread a stage
    constexpr int AE = GS_KC * MT / (GV_WARPS * 32);    // elements of op(A) per thread a stage
    static_assert(G * MR == MT && G * W == GV_WARPS && W * RPW == GS_KC && MR % 4 == 0, "tile shape");
    static_assert(BVECS * GV_WARPS * 32 == GS_KC * 32 && AE * GV_WARPS * 32 == GS_KC * MT, "stage shape");
    __shared__ __align__(16) GsSmem<T, MT> sm;
    const MatmulParams& p = g.mm;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int grp = warp / W, wi = warp % W;
    const int n0 = blockIdx.x * BCOLS;
    const i64 bt = blockIdx.z;
    const T* A = (const T*)p.a + p.a_off + bt * p.a_bs;
    const T* B = (const T*)p.b + p.b_off + bt * p.b_bs;
    const bool ta = p.flags & MM_TRANS_A;
    const bool b_vec = p.flags & MM_B_VEC;
    const int k_begin = blockIdx.y * g.k_chunk;
    const int k_end = min(p.k, k_begin + g.k_chunk);
    const int stages = k_end > k_begin ? (k_end - k_begin + GS_KC - 1) / GS_KC : 0;

    // Queues this thread's vectors of B for stage s (zero-filled past K or N).
    auto issue_b = [&](int s) {
        const int st = s % GS_STAGES, k0 = k_begin + s * GS_KC;
#pragma unroll
        for (int i = 0; i < BVECS; i++) {
            const int v = tid + i * GV_WARPS * 32, r = v >> 5, c = (v & 31) * V;
            const int row = k0 + r, col = n0 + c;
            T* dst = &sm.ring.b[st][r][c];
            if (row >= k_end || col >= p.n) {
                cp_async16(dst, B, false);
            } else if (b_vec && col + V <= p.n) {
                cp_async16(dst, B + (i64)row * p.b_ld + col, true);
            } else {
#pragma unroll
                for (int j = 0; j < V; j++) dst[j] = col + j < p.n ? B[(i64)row * p.b_ld + col + j] : zero_elem<T>();
            }
        }
    };
    // Element i of this thread's share of op(A) in stage s: consecutive threads take consecutive
    // addresses of A (along M when A is stored transposed, along K otherwise).
    auto a_index = [&](int i, int& r, int& m) {
        const int e = tid + i * GV_WARPS * 32;
        if (ta) {
            r = e / MT;
            m = e % MT;
        } else {
            r = e % GS_KC;
            m = e / GS_KC;
        }
    };
    auto load_a = [&](int s, float (&v)[AE]) {
        const int k0 = k_begin + s * GS_KC;
#pragma unroll
        for (int i = 0; i < AE; i++) {
            int r, m;
            a_index(i, r, m);
            const int kk = k0 + r;
            v[i] = 0.0f;
            if (m < p.m && kk < k_end) v[i] = gv_in<T, BF>(ta ? A[(i64)kk * p.a_ld + m] : A[(i64)m * p.a_ld + kk]);
        }
    };
    auto store_a = [&](int s, const float (&v)[AE]) {
        const int st = s % GS_STAGES;
#pragma unroll
        for (int i = 0; i < AE; i++) {
            int r, m;
            a_index(i, r, m);
            sm.ring.a[st][r][m] = v[i];
        }
    };

    float acc[MR][V];
#pragma unroll
    for (int m = 0; m < MR; m++)
#pragma unroll
        for (int j = 0; j < V; j++) acc[m][j] = 0.0f;

    // Prologue: the first GS_STAGES − 1 stages, one commit group each (empty past the end, so
    // the count the waits rely on stays the same).
#pragma unroll
    for (int s = 0; s < GS_STAGES - 1; s++) {
        if (s < stages) {
            float v[AE];
            issue_b(s);
            load_a(s, v);
            store_a(s, v);
        }
        cp_async_commit();
    }
#pragma unroll 1
    for (int s = 0; s < stages; s++) {
        // This thread's copies of stage s have landed; after the barrier everyone's have (and
        // the stores of its op(A)), and every warp is done with stage s − 1, refilled below.
        cp_async_wait<GS_STAGES - 2>();
        __syncthreads();
        const int next = s + GS_STAGES - 1;
        float an[AE];
        if (next < stages) {
            issue_b(next);
            load_a(next, an);
        }
        cp_async_commit();
        const int st = s % GS_STAGES, k0 = k_begin + s * GS_KC;
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            const int r = wi + i * W;
            if (k0 + r < k_end) {
                float b[V];
                smem_vec16<T, BF, V>(&sm.ring.b[st][r][lane * V], b);
#pragma unroll
                for (int q = 0; q < MR / 4; q++) {
                    const float4 a4 = *(const float4*)&sm.ring.a[st][r][grp * MR + 4 * q];
                    const float a[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
                    for (int t = 0; t < 4; t++)
#pragma unroll
                        for (int j = 0; j < V; j++) acc[4 * q + t][j] = fmaf(a[t], b[j], acc[4 * q + t][j]);
                }
            }
        }
        if (next < stages) store_a(next, an);
    }
    cp_async_wait_all();
    __syncthreads();

    // The warps of each group meet in warp order (as in `gemv_kn`), in the drained ring.
    const int col = n0 + lane * V;
#pragma unroll 1
    for (int w = 0; w < W; w++) {
        if (wi == w && col < p.n) gv_park<MR, V, BCOLS>(sm.red, acc, grp * MR, p.m, lane, w == 0);
        __syncthreads();
    }
    gv_emit_rows<T, MT, BCOLS>(g, sm.red, n0, bt, tid);
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
    extern "C" __global__ void __launch_bounds__(256, 1) NAME##_kn_m16(const GemvParams g) { gemv_kn<T, BF, 16>(g); } \
    extern "C" __global__ void __launch_bounds__(256, 2) NAME##_kn_s16(const GemvParams g) {                       \
        gemv_kn_smem<T, BF, 16>(g);                                                                                    \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 2) NAME##_kn_s32(const GemvParams g) { gemv_kn_smem<T, BF, 32>(g); }

GV_ENTRY(gemv_f32, float, false)
GV_ENTRY(gemv_f16, f16, false)
GV_ENTRY(gemv_bf16, bf16, false)
GV_ENTRY(gemv_f32_bf16, float, true)
GV_ENTRY(gemv_f16_bf16, f16, true)

extern "C" __global__ void __launch_bounds__(256) gemv_finalize_f32(const GemvParams g) { gemv_finalize<float>(g); }
extern "C" __global__ void __launch_bounds__(256) gemv_finalize_f16(const GemvParams g) { gemv_finalize<f16>(g); }
extern "C" __global__ void __launch_bounds__(256) gemv_finalize_bf16(const GemvParams g) { gemv_finalize<bf16>(g); }
