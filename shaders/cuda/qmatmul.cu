// Quantized matmul: `out = act(alpha·op(A)·dequant(W)ᵀ + bias + beta·C)` with W a GGUF weight
// [N, K] in one of five block formats (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K), A in f32/f16/bf16, f32
// accumulation, the dense matmul's epilogue. Entry points:
// - `qgemv_<fmt>_<storage>_m{4,16}` (M <= 16): the decode kernels. Weights are dequantized in
//   registers, never written anywhere.
// - `qmatmul_<fmt>_<storage>` (M > 16): 64×64 output tiles; each K step of 64 dequantizes a
//   64×64 tile of W into shared memory next to a tile of A.
// The split-K epilogue is gemv.cu's `gemv_finalize_<storage>` (the block's prefix is
// `GemvParams`).
//
// # The planes (crates/dispatch/src/quant_tensor.rs)
// A QTensor is stored as two planes of bytes, both in GGUF order: block g = n·(K/BS) + kb of row
// n has its scale bytes at g·SCALE in the scale plane and its body at g·BODY in the body plane:
//   Q8_0  BS 32   scale: f16 d (2 bytes)          body: 32 × i8 (32 bytes)
//   Q4_0  BS 32   scale: f16 d                     body: 16 bytes of nibbles
//   Q4_1  BS 32   scale: f16 d, f16 m (one word)   body: 16 bytes of nibbles
//   Q4_K  BS 256  scale: f16 d, f16 dmin (a word)  body: 12 bytes of 6-bit scales/mins, 128 of nibbles (140)
//   Q6_K  BS 256  scale: f16 d                     body: ql[128], qh[64], i8 scales[16] (208)
// Both planes are tilekit allocations (256-byte aligned, sized in whole 16-byte vectors).
//
// # Runs: one unit of work for every format
// Every format is read in *runs* of 16 consecutive weights of one row: run r of a block covers
// k ∈ [16r, 16r + 16) inside it, and its bytes are one aligned 16-byte vector of the body plane
// (plus, for Q6_K, one 16-byte vector of high bits, and for Q4_K a second vector when the run is
// not 16-byte aligned: Q4_K bodies are 140 bytes, so the nibbles of block g start 12·(g + 1)
// mod 16 bytes into a vector and two aligned 16-byte loads are stitched with selects). The
// dequantization follows `tilekit_kernels::quant::dequant` (llama.cpp's `dequantize_row_*`)
// operation for operation, with `__f*_rn` so no multiply-add is contracted: the weights are the
// reference's f32 values bit for bit.
//   Q8_0  r ∈ {0,1}: bytes 16r..16r+16, w = q·d
//   Q4_0  r ∈ {0,1}: the 16 bytes, low (r = 0) or high (r = 1) nibbles, w = (q − 8)·d
//   Q4_1  as Q4_0,  w = q·d + m
//   Q4_K  r ∈ 0..16: sub-block s = r/2 (scale, min by `get_scale_min_k4`), nibble bytes
//         32·(r/4) + 16·(r%2) of the 128, high nibbles when (r/2) is odd; w = (d·sc)·q − dmin·m
//   Q6_K  r ∈ 0..16: half h = r/8, quarter t = (r%8)/2, j = r%2: ql bytes 64h + 32(t%2) + 16j
//         (low nibbles for t < 2, high for t >= 2), qh bytes 32h + 16j (bits 2t, 2t+1), scale
//         sc[8h + j + 2t]; w = (d·sc)·(q − 32)
//
// # Decode (M <= 16)
// As `gemv_nk` in gemv.cu: a warp owns QG_COLS = 2 output columns (two rows of W), a block 8
// warps = 16 columns (N = 4096 gives 256 blocks, two waves on 132 SMs). Lane l takes runs
// l, l + 32, ... of its K range: consecutive lanes read consecutive runs, so a warp's loads of
// one column are one contiguous stretch of the row's body (lanes that share a vector, as the two
// runs of a Q4_0 block do, are served by the same request). op(A)'s 16 values per row come from
// L1 (A is at most 16 rows), 16-byte vectors where A's view allows. The partial sums meet by
// `__shfl_xor_sync`. When the columns alone give under two waves (`qgemv_plan` in
// crates/kernels/src/catalogue/cuda/quant.rs) K is split across blocks (gridDim.y, whole
// quantization blocks per split): each split stores its sums in its own plane of an f32
// workspace, and gemv.cu's `gemv_finalize_<T>` adds the planes in split order and applies the
// epilogue (no atomics: the same bits on every run).
// `_m4` is built with `__launch_bounds__(256, 2)` (at most 128 registers, two blocks per SM);
// `_m16` with `(256, 1)`: capped at 128 registers its 16 × 2 accumulators and 16-value rows of A
// spilled (ptxas 12.4, sm_80 and sm_90), uncapped it uses up to 254 without spilling.
//
// # Tiled (M > 16)
// A block computes 64×64 outputs, 4×4 per thread. Per K step of 64 each thread loads 16 values
// of op(A) (row tid % 64, k offset 16·(tid / 64)) and one run of W (column tid % 64, the same k
// offset), dequantizes it in registers and stores both k-major into shared memory (consecutive
// lanes write consecutive words: no bank conflicts). The global loads of step s + 1 are issued
// before step s's products, so their latency hides behind the FMAs.
#include "common.cuh"

// The GEMV block (`GemvParams` in gemv.cu: mm, ws, splits, k_chunk) followed by the planes.
// Twin: `QuantParams` in crates/kernels/src/catalogue/cuda/quant.rs.
struct QuantParams {
    MatmulParams mm; // `b` and `b_*` unused
    u64 ws;          // f32 [batch][M][N] partial sums (zeroed) when splits > 1, else 0
    i32 splits;      // blocks along K (gridDim.y)
    i32 kb_chunk;    // quantization blocks of K per split
    u64 scales;      // the scale plane
    u64 body;        // the body plane
};

#define QF_Q8_0 0
#define QF_Q4_0 1
#define QF_Q4_1 2
#define QF_Q4_K 3
#define QF_Q6_K 4

// Block size (weights) and body bytes per block.
template <int F> struct QFmt;
template <> struct QFmt<QF_Q8_0> { static constexpr int BS = 32, BODY = 32; };
template <> struct QFmt<QF_Q4_0> { static constexpr int BS = 32, BODY = 16; };
template <> struct QFmt<QF_Q4_1> { static constexpr int BS = 32, BODY = 16; };
template <> struct QFmt<QF_Q4_K> { static constexpr int BS = 256, BODY = 140; };
template <> struct QFmt<QF_Q6_K> { static constexpr int BS = 256, BODY = 208; };

// The bytes one run needs, as loaded (dequantized later, so loads can be issued early).
struct QRaw {
    uint4 v0, v1; // body vectors (v1: Q4_K's second half, Q6_K's qh)
    u32 s0, s1, s2; // Q4_K: the 12 bytes of packed scales; Q6_K: s0 the word holding the scale, s1 its byte
    u32 d;          // the scale-plane bits: f16 d (low half) and, for Q4_1/Q4_K, f16 m/dmin (high half)
};

__device__ __forceinline__ uint4 ldg16(const unsigned char* p) { return __ldg((const uint4*)p); }
__device__ __forceinline__ u32 ldg32(const unsigned char* p) { return __ldg((const u32*)p); }
__device__ __forceinline__ float half_bits_to_f32(u32 bits) {
    f16 h;
    h.bits = (u16)(bits & 0xffffu);
    return to_f32(h);
}
__device__ __forceinline__ uint4 zero4() { return make_uint4(0u, 0u, 0u, 0u); }

// Word i (a compile-time constant once the callers' loops are unrolled) of a vector.
__device__ __forceinline__ u32 word_of(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
// Byte i (compile-time) of a vector.
__device__ __forceinline__ u32 byte_of(const uint4& v, int i) { return (word_of(v, i >> 2) >> (8 * (i & 3))) & 0xffu; }
// Byte i (run-time, 0..11) of three words: selects, no indexed register array.
__device__ __forceinline__ u32 byte12(u32 w0, u32 w1, u32 w2, int i) {
    const u32 w = i < 4 ? w0 : (i < 8 ? w1 : w2);
    return (w >> (8 * (i & 3))) & 0xffu;
}

// Loads what run r of block g needs.
template <int F> __device__ __forceinline__ void qraw_load(const QuantParams& q, i64 g, int r, QRaw& raw) {
    const unsigned char* body = (const unsigned char*)q.body;
    const unsigned char* sc = (const unsigned char*)q.scales;
    raw.v1 = zero4();
    raw.s0 = raw.s1 = raw.s2 = 0u;
    if (F == QF_Q8_0) {
        raw.v0 = ldg16(body + g * 32 + 16 * r);
        raw.d = __ldg((const u16*)sc + g);
    } else if (F == QF_Q4_0) {
        raw.v0 = ldg16(body + g * 16);
        raw.d = __ldg((const u16*)sc + g);
    } else if (F == QF_Q4_1) {
        raw.v0 = ldg16(body + g * 16);
        raw.d = ldg32(sc + g * 4);
    } else if (F == QF_Q4_K) {
        const i64 base = g * 140;
        raw.s0 = ldg32(body + base);
        raw.s1 = ldg32(body + base + 4);
        raw.s2 = ldg32(body + base + 8);
        const i64 off = base + 12 + 32 * (r >> 2) + 16 * (r & 1);
        const i64 al = off & ~(i64)15;
        raw.v0 = ldg16(body + al);
        // The run's 16 bytes reach into the next vector unless they start on a boundary.
        if (off != al) raw.v1 = ldg16(body + al + 16);
        raw.d = ldg32(sc + g * 4);
    } else { // Q6_K
        const i64 base = g * 208;
        const int h = r >> 3, t = (r & 7) >> 1, j = r & 1;
        raw.v0 = ldg16(body + base + 64 * h + 32 * (t & 1) + 16 * j);
        raw.v1 = ldg16(body + base + 128 + 32 * h + 16 * j);
        const i64 so = base + 192 + 8 * h + j + 2 * t;
        raw.s0 = ldg32(body + (so & ~(i64)3));
        raw.s1 = (u32)(so & 3);
        raw.d = __ldg((const u16*)sc + g);
    }
}

// The 16 weights of run r of block g from its loaded bytes, exactly as the host reference.
template <int F> __device__ __forceinline__ void qraw_dequant(const QRaw& raw, i64 g, int r, float (&w)[16]) {
    if (F == QF_Q8_0) {
        const float d = half_bits_to_f32(raw.d);
#pragma unroll
        for (int i = 0; i < 16; i++) w[i] = __fmul_rn((float)(int)(signed char)byte_of(raw.v0, i), d);
    } else if (F == QF_Q4_0 || F == QF_Q4_1) {
        const float d = half_bits_to_f32(raw.d);
        const float m = half_bits_to_f32(raw.d >> 16);
        const int sh = 4 * r;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int nib = (int)((byte_of(raw.v0, i) >> sh) & 15u);
            w[i] = F == QF_Q4_0 ? __fmul_rn((float)(nib - 8), d) : __fadd_rn(__fmul_rn((float)nib, d), m);
        }
    } else if (F == QF_Q4_K) {
        const float d = half_bits_to_f32(raw.d);
        const float dmin = half_bits_to_f32(raw.d >> 16);
        // `get_scale_min_k4(s)`.
        const int s = r >> 1;
        u32 scv, mv;
        if (s < 4) {
            scv = byte12(raw.s0, raw.s1, raw.s2, s) & 63u;
            mv = byte12(raw.s0, raw.s1, raw.s2, s + 4) & 63u;
        } else {
            const u32 hi = byte12(raw.s0, raw.s1, raw.s2, s + 4);
            scv = (hi & 15u) | ((byte12(raw.s0, raw.s1, raw.s2, s - 4) >> 6) << 4);
            mv = (hi >> 4) | ((byte12(raw.s0, raw.s1, raw.s2, s) >> 6) << 4);
        }
        const float d1 = __fmul_rn(d, (float)scv);
        const float m1 = __fmul_rn(dmin, (float)mv);
        // The run starts 12·(g + 1) mod 16 bytes into v0 (see qraw_load): word shift 0..3.
        const int wsh = (int)((3 * (g + 1)) & 3);
        const int nsh = 4 * ((r >> 1) & 1);
#pragma unroll
        for (int wi = 0; wi < 4; wi++) {
            const u32 a0 = word_of(raw.v0, wi);
            const u32 a1 = wi + 1 < 4 ? word_of(raw.v0, wi + 1) : raw.v1.x;
            const u32 a2 = wi + 2 < 4 ? word_of(raw.v0, wi + 2) : word_of(raw.v1, wi - 2);
            const u32 a3 = wi + 3 < 4 ? word_of(raw.v0, wi + 3) : word_of(raw.v1, wi - 1);
            const u32 word = wsh == 0 ? a0 : wsh == 1 ? a1 : wsh == 2 ? a2 : a3;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const u32 nib = (word >> (8 * b + nsh)) & 15u;
                w[4 * wi + b] = __fsub_rn(__fmul_rn(d1, (float)nib), m1);
            }
        }
    } else { // Q6_K
        const float d = half_bits_to_f32(raw.d);
        const int t = (r & 7) >> 1;
        const int scale = (int)(signed char)((raw.s0 >> (8 * raw.s1)) & 0xffu);
        const float ds = __fmul_rn(d, (float)scale);
        const int lsh = 4 * (t >> 1), hsh = 2 * t;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const u32 lo = (byte_of(raw.v0, i) >> lsh) & 15u;
            const u32 hb = (byte_of(raw.v1, i) >> hsh) & 3u;
            w[i] = __fmul_rn(ds, (float)((int)(lo | (hb << 4)) - 32));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// op(A): 16 consecutive values along K of one row.

__device__ __forceinline__ u32 bits_of(float x) { return __float_as_uint(x); }
__device__ __forceinline__ u32 bits_of(f16 x) { return x.bits; }
__device__ __forceinline__ u32 bits_of(bf16 x) { return x.bits; }

// Raw bits of op(A)[row, k .. k + 16): f32 one value per word, 16-bit types two per word (low
// half first). Zero when `valid` is false.
template <typename T> struct ARaw { u32 w[sizeof(T) == 4 ? 16 : 8]; };

template <typename T>
__device__ __forceinline__ void a_load(const T* A, const MatmulParams& p, bool ta, bool vec, i64 row, i64 k, bool valid,
                                       ARaw<T>& raw) {
    constexpr int W = sizeof(T) == 4 ? 16 : 8;
    if (!valid) {
#pragma unroll
        for (int i = 0; i < W; i++) raw.w[i] = 0u;
    } else if (!ta && vec) {
        // k is a multiple of 16 and the view's offset, ld and batch stride are multiples of 16
        // bytes (MM_A_VEC): every vector is aligned.
        const uint4* src = (const uint4*)(A + row * p.a_ld + k);
#pragma unroll
        for (int v = 0; v < W / 4; v++) {
            const uint4 x = __ldg(src + v);
            raw.w[4 * v] = x.x;
            raw.w[4 * v + 1] = x.y;
            raw.w[4 * v + 2] = x.z;
            raw.w[4 * v + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const u32 b = bits_of(ta ? A[(k + i) * p.a_ld + row] : A[row * p.a_ld + k + i]);
            if (sizeof(T) == 4) {
                raw.w[i] = b;
            } else if (i & 1) {
                raw.w[i >> 1] |= b << 16;
            } else {
                raw.w[i >> 1] = b;
            }
        }
    }
}

template <typename T> __device__ __forceinline__ void a_unpack(const ARaw<T>& raw, float (&a)[16]);
template <> __device__ __forceinline__ void a_unpack<float>(const ARaw<float>& raw, float (&a)[16]) {
#pragma unroll
    for (int i = 0; i < 16; i++) a[i] = __uint_as_float(raw.w[i]);
}
template <typename T> __device__ __forceinline__ void a_unpack16(const ARaw<T>& raw, float (&a)[16]) {
#pragma unroll
    for (int i = 0; i < 16; i++) {
        T x;
        x.bits = (u16)((raw.w[i >> 1] >> (16 * (i & 1))) & 0xffffu);
        a[i] = to_f32(x);
    }
}
template <> __device__ __forceinline__ void a_unpack<f16>(const ARaw<f16>& raw, float (&a)[16]) { a_unpack16(raw, a); }
template <> __device__ __forceinline__ void a_unpack<bf16>(const ARaw<bf16>& raw, float (&a)[16]) { a_unpack16(raw, a); }

// Sends sum `v` of output (row, col): the epilogue and store, or the workspace under split K.
template <typename T>
__device__ __forceinline__ void q_emit(const QuantParams& q, float v, i64 bt, int row, int col) {
    const MatmulParams& p = q.mm;
    if (q.splits > 1) {
        ((float*)q.ws)[gemv_ws_index(p, blockIdx.y, bt, row, col)] = v;
    } else {
        *out_ptr<T>(p, bt, row, col) = from_f32<T>(matmul_epilogue<T>(p, v, bt, row, col));
    }
}

// ---------------------------------------------------------------------------------------------
// Decode: M <= MT rows, a warp per QG_COLS columns.

#define QG_WARPS 8
#define QG_COLS 2

template <typename T, int F, int MT> __device__ __forceinline__ void qgemv(const QuantParams& q) {
    constexpr int RUNS = QFmt<F>::BS / 16;
    const MatmulParams& p = q.mm;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col0 = (blockIdx.x * QG_WARPS + warp) * QG_COLS;
    if (col0 >= p.n) return; // whole warps leave together: no block-wide barrier below
    const i64 bt = blockIdx.z;
    const T* A = (const T*)p.a + p.a_off + bt * p.a_bs;
    const bool ta = p.flags & MM_TRANS_A;
    const bool a_vec = !ta && (p.flags & MM_A_VEC);
    const int nb = p.k / QFmt<F>::BS;
    const int kb_begin = blockIdx.y * q.kb_chunk;
    const int kb_end = min(nb, kb_begin + q.kb_chunk);
    float acc[MT][QG_COLS];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int c = 0; c < QG_COLS; c++) acc[m][c] = 0.0f;

#pragma unroll 1
    for (int run = kb_begin * RUNS + lane; run < kb_end * RUNS; run += 32) {
        const int kb = run / RUNS, r = run % RUNS;
        QRaw raw[QG_COLS];
#pragma unroll
        for (int c = 0; c < QG_COLS; c++)
            if (col0 + c < p.n) qraw_load<F>(q, (i64)(col0 + c) * nb + kb, r, raw[c]);
        float w[QG_COLS][16];
#pragma unroll
        for (int c = 0; c < QG_COLS; c++) {
            if (col0 + c < p.n) {
                qraw_dequant<F>(raw[c], (i64)(col0 + c) * nb + kb, r, w[c]);
            } else {
#pragma unroll
                for (int i = 0; i < 16; i++) w[c][i] = 0.0f;
            }
        }
        const i64 k = (i64)run * 16;
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if (m < p.m) {
                ARaw<T> ar;
                a_load<T>(A, p, ta, a_vec, m, k, true, ar);
                float a[16];
                a_unpack<T>(ar, a);
#pragma unroll
                for (int c = 0; c < QG_COLS; c++)
#pragma unroll
                    for (int i = 0; i < 16; i++) acc[m][c] = fmaf(a[i], w[c][i], acc[m][c]);
            }
        }
    }
    // Butterfly: every lane ends with every sum; lane m·COLS + c keeps (m, c) and emits it, so
    // the epilogue (with its activation) is compiled once, not once per accumulator.
    float mine = 0.0f;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int c = 0; c < QG_COLS; c++) {
            float v = acc[m][c];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == m * QG_COLS + c) mine = v;
        }
    const int em = lane / QG_COLS, ec = col0 + lane % QG_COLS;
    if (em < MT && em < p.m && ec < p.n) q_emit<T>(q, mine, bt, em, ec);
}

// ---------------------------------------------------------------------------------------------
// Tiled: 64×64 outputs per block, K steps of 64.

#define QT_BM 64
#define QT_BN 64
#define QT_KT 64

template <typename T, int F> __device__ __forceinline__ void qmatmul_tiled(const QuantParams& q) {
    constexpr int RUNS = QFmt<F>::BS / 16;
    // k-major tiles; 16 KiB each.
    __shared__ __align__(16) float As[QT_KT][QT_BM];
    __shared__ __align__(16) float Bs[QT_KT][QT_BN];
    const MatmulParams& p = q.mm;
    const int tid = threadIdx.x;
    const int m0 = blockIdx.y * QT_BM, n0 = blockIdx.x * QT_BN;
    const i64 bt = blockIdx.z;
    const T* A = (const T*)p.a + p.a_off + bt * p.a_bs;
    const bool ta = p.flags & MM_TRANS_A;
    const bool a_vec = !ta && (p.flags & MM_A_VEC);
    const int nb = p.k / QFmt<F>::BS;
    // Loader roles: row / column tid % 64, k offset 16·(tid / 64) inside the step.
    const int lrow = tid % 64, lk = (tid / 64) * 16;
    const bool a_ok = m0 + lrow < p.m, b_ok = n0 + lrow < p.n;
    const i64 w_row = (i64)(n0 + lrow) * nb;
    // Compute roles: rows 4·ty.., columns 4·tx...
    const int tx = tid % 16, ty = tid / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;

    const int steps = (p.k + QT_KT - 1) / QT_KT;
    ARaw<T> ar;
    QRaw wr;
    // This thread's loads of step 0; each step issues the next step's before its FMAs.
    if (steps > 0) {
        a_load<T>(A, p, ta, a_vec, m0 + lrow, lk, a_ok && lk < p.k, ar);
        // K is a multiple of 32: a run is wholly inside K or wholly outside.
        if (b_ok && lk < p.k) qraw_load<F>(q, w_row + (lk / 16) / RUNS, (lk / 16) % RUNS, wr);
    }
#pragma unroll 1
    for (int s = 0; s < steps; s++) {
        const int k = s * QT_KT + lk;
        {
            float a[16];
            a_unpack<T>(ar, a);
            float w[16];
            if (b_ok && k < p.k) {
                const int run = k / 16;
                qraw_dequant<F>(wr, w_row + run / RUNS, run % RUNS, w);
            } else {
#pragma unroll
                for (int i = 0; i < 16; i++) w[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 16; i++) {
                As[lk + i][lrow] = a[i];
                Bs[lk + i][lrow] = w[i];
            }
        }
        __syncthreads();
        if (s + 1 < steps) {
            const int kn = k + QT_KT;
            a_load<T>(A, p, ta, a_vec, m0 + lrow, kn, a_ok && kn < p.k, ar);
            if (b_ok && kn < p.k) qraw_load<F>(q, w_row + (kn / 16) / RUNS, (kn / 16) % RUNS, wr);
        }
#pragma unroll 4
        for (int kk = 0; kk < QT_KT; kk++) {
            const float4 av = *(const float4*)&As[kk][4 * ty];
            const float4 bv = *(const float4*)&Bs[kk][4 * tx];
            const float a4[4] = {av.x, av.y, av.z, av.w};
            const float b4[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a4[i], b4[j], acc[i][j]);
        }
        __syncthreads();
    }
    // The epilogue walks the tile 4 columns at a time through shared memory (As is free after
    // the last barrier): one copy of the epilogue code instead of sixteen, coalesced stores.
    float* slab = &As[0][0];
#pragma unroll
    for (int i = 0; i < 4; i++)
        *(float4*)&slab[(4 * ty + i) * QT_BN + 4 * tx] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    __syncthreads();
#pragma unroll 1
    for (int e = tid; e < QT_BM * QT_BN / 4; e += 256) {
        const int row = m0 + e / (QT_BN / 4), c4 = 4 * (e % (QT_BN / 4)), col = n0 + c4;
        if (row >= p.m || col >= p.n) continue;
        const float4 a = *(const float4*)&slab[(e / (QT_BN / 4)) * QT_BN + c4];
        const float sums[4] = {a.x, a.y, a.z, a.w};
        const int n_valid = p.n - col < 4 ? p.n - col : 4;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = j < n_valid ? matmul_epilogue<T>(p, sums[j], bt, row, col + j) : 0.0f;
        store4<T>(p, out_ptr<T>(p, bt, row, col), v, n_valid);
    }
}

#define Q_ENTRY(FMT, F, NAME, T)                                                                                      \
    extern "C" __global__ void __launch_bounds__(256, 2) qgemv_##FMT##_##NAME##_m4(const QuantParams q) {             \
        qgemv<T, F, 4>(q);                                                                                         \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256, 1) qgemv_##FMT##_##NAME##_m16(const QuantParams q) {            \
        qgemv<T, F, 16>(q);                                                                                        \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) qmatmul_##FMT##_##NAME(const QuantParams q) {                \
        qmatmul_tiled<T, F>(q);                                                                                    \
    }

#define Q_FORMAT(FMT, F)                                                                                            \
    Q_ENTRY(FMT, F, f32, float)                                                                                    \
    Q_ENTRY(FMT, F, f16, f16)                                                                                      \
    Q_ENTRY(FMT, F, bf16, bf16)

Q_FORMAT(q8_0, QF_Q8_0)
Q_FORMAT(q4_0, QF_Q4_0)
Q_FORMAT(q4_1, QF_Q4_1)
Q_FORMAT(q4k, QF_Q4_K)
Q_FORMAT(q6k, QF_Q6_K)
