// Matmul with a fused epilogue:
//   out = act(alpha * op(A) * op(B) + bias[j] + beta * C)     (see `MatmulDesc`)
// Two entry points share the parameter block, the loads and the epilogue: `matmul` (tiled,
// below) and `matmul_small_m` (M <= 4, further down).
//
// Design of `matmul` (the register-blocked SGEMM of siboehm's SGEMM_CUDA kernels 6 and 10:
// 8 x 8 outputs per invocation, vec4 shared-memory reads, invocations grouped in warp tiles):
// - A workgroup of WG_X x WG_Y invocations owns a BM x BN block of the output, BM = 8 WG_Y and
//   BN = 8 WG_X (128 x 128 with the default 16 x 16 invocations; the backends switch to a
//   16-row block for 4 < M <= 16, see `MatmulTile` in the catalogue).
// - Each invocation owns an 8 x 8 register tile (`acc`, sixteen vec4s): rows ty*4..+4 and
//   BM/2 + ty*4..+4, columns tx*4..+4 and BN/2 + tx*4..+4. Per k step it reads two vec4s of A
//   and two of B from workgroup memory and does 64 FMAs (4 reads per 64 FMAs; a 4 x 4 tile
//   needs 2 per 16). Splitting the tile in halves BM/2 and BN/2 apart makes neighbouring
//   invocations read neighbouring vec4s, which is what keeps the reads free of bank conflicts.
// - Warp tiles: the linear invocation index is cut into groups of WARP_X x WARP_Y = 32 (one
//   subgroup on most GPUs) and each group owns a WARP_X x WARP_Y patch of (tx, ty), 8 x 4 by
//   default, instead of two whole rows of the workgroup: a subgroup then reads 4 distinct A
//   vec4s and 8 distinct B vec4s per k step (siboehm kernel 10's warp tiling).
// - The K loop walks BK-deep slabs (8 by default). Each slab of op(A) (BM x BK) and op(B)
//   (BK x BN) is staged in workgroup memory, stored k-major (`As[k][m]`, `Bs[k][n]`) so the
//   inner loop reads contiguous vec4s for both operands whatever the transposes.
// - Global loads are 4 consecutive elements of the *stored* matrix (along its rows), issued
//   as one vec4 load when the view is 16-byte aligned (offset, batch stride and ld multiples
//   of 4: the host sets the A_VEC/B_VEC flags) and the 4 elements are inside the matrix;
//   otherwise 4 guarded scalar loads with zero fill. Zero fill makes every M, N, K correct,
//   including K = 0 (no slab: the epilogue of zeros).
// - Staging without bank conflicts (checked by `catalogue::wgsl::layout` in a unit test, for
//   32- and 8-wide groups of invocations): where the stored rows run along the staged rows
//   (transposed A, untransposed B) consecutive invocations store consecutive vec4s; where the
//   4 loaded elements must be scattered over 4 staged rows (untransposed A, transposed B),
//   consecutive invocations take consecutive m (or n) at the same k, so each of the 4 scalar
//   stores hits consecutive words. With a 16-row block two k groups (c = 0 and c = 4) share a
//   32-wide group of invocations; store j of group g writes element (j + g) % 4, so the two
//   groups write rows an odd number apart, 16 banks apart with 16-word rows. Rows need no
//   padding (a padded 16-row block would put two rows of a vec4 store in one phase on the same
//   banks).
// - The slabs are software-pipelined: slab s+1 is loaded into registers while slab s is
//   multiplied, then stored to workgroup memory.
// - Transposes, bias, C and the activation are `override` constants: each pipeline is
//   specialised to its switches, so the branches fold away (the backends key pipelines by them).
// - The epilogue runs once per output, in registers, and stores a vec4 where the output view
//   is aligned (O_VEC) and the 4 columns are inside N.
// - Precision::Bf16 (flag PREC_BF16): A and B values are rounded to bf16 (nearest even, bit
//   operations) when staged, and the products are summed in f32: an emulation of what tensor
//   cores do, bit-compatible with the CPU reference's rounding.
// - Grid: x = column blocks, y = row blocks, z = batches of this launch (the host splits
//   batches over launches of at most 65535 and passes `batch_base`).

// Invocations per workgroup along N (x) and M (y). 16 x 16 = 256, the WebGPU default maximum
// invocations per workgroup; part of the pipeline-cache key.
override WG_X: u32 = 16u;
override WG_Y: u32 = 16u;
// Depth of a K slab. 8 keeps both slabs of the 128 x 128 block at 8 x 128 floats (8 KiB
// together, half the 16 KiB WebGPU minimum of workgroup storage).
override BK: u32 = 8u;
// The warp tile: invocations WARP_X (along N) x WARP_Y (along M) per group of consecutive
// invocations (32, or the whole workgroup when it is smaller). WG_X and WG_Y are multiples.
override WARP_X: u32 = 8u;
override WARP_Y: u32 = 4u;

// The switches each pipeline is specialised to (`MatmulSwitches` in the catalogue): A or B
// stored transposed, a bias, a C term, the activation code (`ACT_*`).
override TRANS_A: bool = false;
override TRANS_B: bool = false;
override HAS_BIAS: bool = false;
override HAS_C: bool = false;
override ACT: u32 = 0u;

// Invocations per workgroup of the small-M kernel: 64 (two 32-wide subgroups), 256 columns.
override WG_N: u32 = 64u;
// Rows the small-M kernel computes per invocation (1 to 4): M itself, so a matrix-vector
// product does no wasted FMAs. A pipeline constant, so the row loops unroll.
override SM_ROWS: u32 = 4u;

// Register tile per invocation of `matmul`: 8 x 8 (sixteen vec4 accumulators). A `const`
// because function-scope arrays need a constant size.
const TM: u32 = 8u;
const TN: u32 = 8u;
// Rows of one epilogue call and of the small-M register tile: a 4 x 4 quarter of the tile.
const Q: u32 = 4u;
// Most vec4s of one operand an invocation stages per slab (the register arrays of the
// software pipeline need a constant size): BM * BK / 4 and BN * BK / 4 divided by the
// invocations (`MatmulTile::loads_per_invocation` checks the bound for every candidate).
const MAX_LOADS: u32 = 8u;

const A_VEC: u32 = 1u;
const B_VEC: u32 = 2u;
const O_VEC: u32 = 4u;
const PREC_BF16: u32 = 8u;

struct MatmulParams {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,
    a_off: u32,
    a_ld: u32,
    a_bs: u32,
    trans_a: u32,
    b_off: u32,
    b_ld: u32,
    b_bs: u32,
    trans_b: u32,
    c_off: u32,
    c_ld: u32,
    c_bs: u32,
    bias_off: u32,
    o_off: u32,
    o_ld: u32,
    o_bs: u32,
    act: u32,
    alpha: f32,
    beta: f32,
    batch_base: u32,
    _pad: u32,
}

@group(0) @binding(5) var<uniform> p: MatmulParams;

// Rows and columns of the output block and row lengths of the staged slabs in vec4s (no
// padding, see above).
override BM: u32 = WG_Y * TM;
override BN: u32 = WG_X * TN;
override ROW_A4: u32 = BM / 4u;
override ROW_B4: u32 = BN / 4u;
override AS_LEN: u32 = BK * ROW_A4;
override BS_LEN: u32 = BK * ROW_B4;

var<workgroup> As: array<vec4<f32>, AS_LEN>;
var<workgroup> Bs: array<vec4<f32>, BS_LEN>;

// Four consecutive elements of stored A, row `r`, columns `c0..c0+4`, zero outside.
fn load4_a(base: u32, rows: u32, cols: u32, r: u32, c0: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (r >= rows || c0 >= cols) {
        return v;
    }
    let idx = base + r * p.a_ld + c0;
    if ((p.flags & A_VEC) != 0u && c0 + 4u <= cols) {
        v = ld4_a(idx >> 2u);
    } else {
        for (var j = 0u; j < 4u; j++) {
            if (c0 + j < cols) {
                v[j] = ld_a(idx + j);
            }
        }
    }
    if ((p.flags & PREC_BF16) != 0u) {
        v = vec4<f32>(round_bf16(v.x), round_bf16(v.y), round_bf16(v.z), round_bf16(v.w));
    }
    return v;
}

fn load4_b(base: u32, rows: u32, cols: u32, r: u32, c0: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (r >= rows || c0 >= cols) {
        return v;
    }
    let idx = base + r * p.b_ld + c0;
    if ((p.flags & B_VEC) != 0u && c0 + 4u <= cols) {
        v = ld4_b(idx >> 2u);
    } else {
        for (var j = 0u; j < 4u; j++) {
            if (c0 + j < cols) {
                v[j] = ld_b(idx + j);
            }
        }
    }
    if ((p.flags & PREC_BF16) != 0u) {
        v = vec4<f32>(round_bf16(v.x), round_bf16(v.y), round_bf16(v.z), round_bf16(v.w));
    }
    return v;
}

// The v-th vec4 of the stored slab of A starting at k0 (BM x BK of op(A)). Untransposed
// (stored rows are m, a vec4 runs along k): v walks m first, so consecutive invocations take
// consecutive rows at the same k. Transposed (stored rows are k, a vec4 runs along m): v walks
// the vec4s of a stored row first. `put_a` and `catalogue::wgsl::layout` use the same indices.
fn fetch_a(v: u32, k0: u32, m0: u32, a_base: u32, a_rows: u32, a_cols: u32) -> vec4<f32> {
    if (!TRANS_A) {
        let m = v % BM;
        let c = (v / BM) * 4u;
        return load4_a(a_base, a_rows, a_cols, m0 + m, k0 + c);
    }
    let r = v / (BM / 4u);
    let c = (v % (BM / 4u)) * 4u;
    return load4_a(a_base, a_rows, a_cols, k0 + r, m0 + c);
}

// Stores what `fetch_a(v, ...)` loaded into As[k][m]: scattered over 4 rows (store j writes
// element (j + g) % 4 of k group g, see above), or one vec4.
fn put_a(v: u32, x: vec4<f32>) {
    if (!TRANS_A) {
        let m = v % BM;
        let g = v / BM;
        let c = g * 4u;
        for (var j = 0u; j < 4u; j++) {
            let e = (j + g) % 4u;
            As[(c + e) * ROW_A4 + m / 4u][m % 4u] = x[e];
        }
    } else {
        let r = v / (BM / 4u);
        let c4 = v % (BM / 4u);
        As[r * ROW_A4 + c4] = x;
    }
}

// The v-th vec4 of the stored slab of B starting at k0 (BK x BN of op(B)): the mirror image
// of `fetch_a` (untransposed B has its rows along n; transposed B is scattered).
fn fetch_b(v: u32, k0: u32, n0: u32, b_base: u32, b_rows: u32, b_cols: u32) -> vec4<f32> {
    if (!TRANS_B) {
        let r = v / (BN / 4u);
        let c = (v % (BN / 4u)) * 4u;
        return load4_b(b_base, b_rows, b_cols, k0 + r, n0 + c);
    }
    let n = v % BN;
    let c = (v / BN) * 4u;
    return load4_b(b_base, b_rows, b_cols, n0 + n, k0 + c);
}

// Stores what `fetch_b(v, ...)` loaded into Bs[k][n].
fn put_b(v: u32, x: vec4<f32>) {
    if (!TRANS_B) {
        let r = v / (BN / 4u);
        let c4 = v % (BN / 4u);
        Bs[r * ROW_B4 + c4] = x;
    } else {
        let n = v % BN;
        let g = v / BN;
        let c = g * 4u;
        for (var j = 0u; j < 4u; j++) {
            let e = (j + g) % 4u;
            Bs[(c + e) * ROW_B4 + n / 4u][n % 4u] = x[e];
        }
    }
}

@compute @workgroup_size(WG_X, WG_Y, 1)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) flat: u32) {
    let m0 = wid.y * BM;
    let n0 = wid.x * BN;
    let bt = p.batch_base + wid.z;
    let threads = WG_X * WG_Y;
    // The warp-tile arrangement (see above): invocation `flat` is lane `lane` of warp tile
    // `warp`; the warp tiles cover the WG_X x WG_Y grid of (tx, ty) row by row.
    let warp_size = WARP_X * WARP_Y;
    let lane = flat % warp_size;
    let warp = flat / warp_size;
    let warps_x = WG_X / WARP_X;
    let tx = (warp % warps_x) * WARP_X + lane % WARP_X;
    let ty = (warp / warps_x) * WARP_Y + lane / WARP_X;

    let a_base = p.a_off + bt * p.a_bs;
    let b_base = p.b_off + bt * p.b_bs;
    // Stored shapes: A is M x K (K x M transposed), B is K x N (N x K transposed).
    var a_rows = p.m;
    var a_cols = p.k;
    if (TRANS_A) {
        a_rows = p.k;
        a_cols = p.m;
    }
    var b_rows = p.k;
    var b_cols = p.n;
    if (TRANS_B) {
        b_rows = p.n;
        b_cols = p.k;
    }

    // acc[2 i + h]: row i of the tile (i < 4: ty*4 + i; i >= 4: BM/2 + ty*4 + i - 4), column
    // half h (0: tx*4..+4; 1: BN/2 + tx*4..+4).
    var acc: array<vec4<f32>, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = vec4<f32>(0.0);
    }

    // Software pipelining: the next slab's global loads are issued into registers (pa, pb)
    // before the current slab is multiplied, so their latency hides behind the FMAs; the
    // registers go to workgroup memory at the top of the next iteration.
    let na = BM * BK / 4u;
    let nb = BN * BK / 4u;
    let la = (na + threads - 1u) / threads;
    let lb = (nb + threads - 1u) / threads;
    var pa: array<vec4<f32>, MAX_LOADS>;
    var pb: array<vec4<f32>, MAX_LOADS>;
    for (var l = 0u; l < la; l++) {
        let v = flat + l * threads;
        if (v < na) {
            pa[l] = fetch_a(v, 0u, m0, a_base, a_rows, a_cols);
        }
    }
    for (var l = 0u; l < lb; l++) {
        let v = flat + l * threads;
        if (v < nb) {
            pb[l] = fetch_b(v, 0u, n0, b_base, b_rows, b_cols);
        }
    }

    let slabs = (p.k + BK - 1u) / BK;
    for (var s = 0u; s < slabs; s++) {
        for (var l = 0u; l < la; l++) {
            let v = flat + l * threads;
            if (v < na) {
                put_a(v, pa[l]);
            }
        }
        for (var l = 0u; l < lb; l++) {
            let v = flat + l * threads;
            if (v < nb) {
                put_b(v, pb[l]);
            }
        }
        workgroupBarrier();
        if (s + 1u < slabs) {
            let k0 = (s + 1u) * BK;
            for (var l = 0u; l < la; l++) {
                let v = flat + l * threads;
                if (v < na) {
                    pa[l] = fetch_a(v, k0, m0, a_base, a_rows, a_cols);
                }
            }
            for (var l = 0u; l < lb; l++) {
                let v = flat + l * threads;
                if (v < nb) {
                    pb[l] = fetch_b(v, k0, n0, b_base, b_rows, b_cols);
                }
            }
        }
        for (var kk = 0u; kk < BK; kk++) {
            let a0 = As[kk * ROW_A4 + ty];
            let a1 = As[kk * ROW_A4 + WG_Y + ty];
            let b0 = Bs[kk * ROW_B4 + tx];
            let b1 = Bs[kk * ROW_B4 + WG_X + tx];
            acc[0] = fma(vec4<f32>(a0.x), b0, acc[0]);
            acc[1] = fma(vec4<f32>(a0.x), b1, acc[1]);
            acc[2] = fma(vec4<f32>(a0.y), b0, acc[2]);
            acc[3] = fma(vec4<f32>(a0.y), b1, acc[3]);
            acc[4] = fma(vec4<f32>(a0.z), b0, acc[4]);
            acc[5] = fma(vec4<f32>(a0.z), b1, acc[5]);
            acc[6] = fma(vec4<f32>(a0.w), b0, acc[6]);
            acc[7] = fma(vec4<f32>(a0.w), b1, acc[7]);
            acc[8] = fma(vec4<f32>(a1.x), b0, acc[8]);
            acc[9] = fma(vec4<f32>(a1.x), b1, acc[9]);
            acc[10] = fma(vec4<f32>(a1.y), b0, acc[10]);
            acc[11] = fma(vec4<f32>(a1.y), b1, acc[11]);
            acc[12] = fma(vec4<f32>(a1.z), b0, acc[12]);
            acc[13] = fma(vec4<f32>(a1.z), b1, acc[13]);
            acc[14] = fma(vec4<f32>(a1.w), b0, acc[14]);
            acc[15] = fma(vec4<f32>(a1.w), b1, acc[15]);
        }
        workgroupBarrier();
    }

    // The four 4 x 4 quarters of the tile, each through the epilogue.
    let r0 = m0 + ty * 4u;
    let r1 = m0 + BM / 2u + ty * 4u;
    let c0 = n0 + tx * 4u;
    let c1 = n0 + BN / 2u + tx * 4u;
    epilogue(array<vec4<f32>, 4>(acc[0], acc[2], acc[4], acc[6]), r0, p.m, c0, bt);
    epilogue(array<vec4<f32>, 4>(acc[1], acc[3], acc[5], acc[7]), r0, p.m, c1, bt);
    epilogue(array<vec4<f32>, 4>(acc[8], acc[10], acc[12], acc[14]), r1, p.m, c0, bt);
    epilogue(array<vec4<f32>, 4>(acc[9], acc[11], acc[13], acc[15]), r1, p.m, c1, bt);
}

// The small-M kernel (M <= 4: matrix-vector-like products, batch-1 inference). With 4 rows
// there is nothing to share between invocations (each B element feeds one invocation's 4
// outputs only), so staging through workgroup memory would cost barriers and buy nothing:
// each invocation owns an SM_ROWS x 4 output tile (SM_ROWS = M rows x 4 consecutive columns),
// walks K four at a time, reads an SM_ROWS x 4 block of op(A) (vec4 loads along the stored
// rows; A is tiny and cached) and a 4 x 4 block of op(B) (vec4 loads along N, coalesced across
// neighbouring invocations), and does 16 SM_ROWS FMAs per step. No barriers, so any
// invocation may return early.
@compute @workgroup_size(WG_N, 1, 1)
fn matmul_small_m(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let col0 = (wid.x * WG_N + lid.x) * Q;
    let row0 = wid.y * SM_ROWS;
    let bt = p.batch_base + wid.z;
    if (col0 >= p.n) {
        return;
    }
    let a_base = p.a_off + bt * p.a_bs;
    let b_base = p.b_off + bt * p.b_bs;
    var a_rows = p.m;
    var a_cols = p.k;
    if (TRANS_A) {
        a_rows = p.k;
        a_cols = p.m;
    }
    var b_rows = p.k;
    var b_cols = p.n;
    if (TRANS_B) {
        b_rows = p.n;
        b_cols = p.k;
    }
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < Q; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    for (var k = 0u; k < p.k; k += 4u) {
        // ab[i] = op(A)[row0 + i][k..k+4], bb[q] = op(B)[k + q][col0..col0+4]; zero outside.
        var ab: array<vec4<f32>, 4>;
        var bb: array<vec4<f32>, 4>;
        if (!TRANS_A) {
            for (var i = 0u; i < SM_ROWS; i++) {
                ab[i] = load4_a(a_base, a_rows, a_cols, row0 + i, k);
            }
        } else {
            let c = mat4x4<f32>(load4_a(a_base, a_rows, a_cols, k, row0), load4_a(a_base, a_rows, a_cols, k + 1u, row0),
                load4_a(a_base, a_rows, a_cols, k + 2u, row0), load4_a(a_base, a_rows, a_cols, k + 3u, row0));
            let t = transpose(c);
            for (var i = 0u; i < 4u; i++) {
                ab[i] = t[i];
            }
        }
        if (!TRANS_B) {
            for (var q = 0u; q < 4u; q++) {
                bb[q] = load4_b(b_base, b_rows, b_cols, k + q, col0);
            }
        } else {
            let c = mat4x4<f32>(load4_b(b_base, b_rows, b_cols, col0, k), load4_b(b_base, b_rows, b_cols, col0 + 1u, k),
                load4_b(b_base, b_rows, b_cols, col0 + 2u, k), load4_b(b_base, b_rows, b_cols, col0 + 3u, k));
            let t = transpose(c);
            for (var q = 0u; q < 4u; q++) {
                bb[q] = t[q];
            }
        }
        for (var i = 0u; i < SM_ROWS; i++) {
            acc[i] = fma(vec4<f32>(ab[i].x), bb[0], acc[i]);
            acc[i] = fma(vec4<f32>(ab[i].y), bb[1], acc[i]);
            acc[i] = fma(vec4<f32>(ab[i].z), bb[2], acc[i]);
            acc[i] = fma(vec4<f32>(ab[i].w), bb[3], acc[i]);
        }
    }
    epilogue(acc, row0, min(p.m, row0 + SM_ROWS), col0, bt);
}

// The fused epilogue, once per output: rows row0..min(row0 + 4, row_end) and columns
// col0..col0+4 of batch bt (both kernels). Stores a vec4 where the output view is aligned
// (O_VEC) and the 4 columns are inside N. HAS_BIAS, HAS_C and ACT are pipeline constants.
fn epilogue(acc: array<vec4<f32>, 4>, row0: u32, row_end: u32, col0: u32, bt: u32) {
    if (col0 >= p.n) {
        return;
    }
    let full = col0 + 4u <= p.n;
    var bias = vec4<f32>(0.0);
    if (HAS_BIAS) {
        for (var j = 0u; j < 4u; j++) {
            if (col0 + j < p.n) {
                bias[j] = ld_bias(p.bias_off + col0 + j);
            }
        }
    }
    for (var i = 0u; i < Q; i++) {
        let row = row0 + i;
        if (row >= row_end) {
            break;
        }
        var v = p.alpha * acc[i] + bias;
        if (HAS_C) {
            let cidx = p.c_off + bt * p.c_bs + row * p.c_ld + col0;
            var cv = vec4<f32>(0.0);
            for (var j = 0u; j < 4u; j++) {
                if (col0 + j < p.n) {
                    cv[j] = ld_c(cidx + j);
                }
            }
            v = v + p.beta * cv;
        }
        v = apply_act4(v, ACT);
        let oidx = p.o_off + bt * p.o_bs + row * p.o_ld + col0;
        if ((p.flags & O_VEC) != 0u && full) {
            st4_out(oidx >> 2u, v);
        } else {
            for (var j = 0u; j < 4u; j++) {
                if (col0 + j < p.n) {
                    st_out(oidx + j, v[j]);
                }
            }
        }
    }
}

// ---- BEGIN GENERATED: common.wgsl and the storage prelude (crates/kernels/src/catalogue/wgsl.rs) ----
// Do not edit: the catalogue replaces this block with the one of the dtype variant it builds;
// here it holds the f32 variant so that this file is valid WGSL on its own.

// Shared helpers of every tilekit WGSL module. The kernel catalogue
// (`crates/kernels/src/catalogue/wgsl.rs`) appends this file, followed by the storage prelude
// it generates for the module's dtype variant (bindings plus `ld_*`/`ld4_*`/`st_*`/`st4_*`
// accessors), to each kernel file; the kernel files carry the f32 version of that block so
// that they are valid WGSL on their own.
//
// The activations are EXACTLY the formulas of `Activation::apply_f32` in
// `crates/kernels/src/activation.rs`; the conversions are bit-exact ports of the `half` crate's
// round-to-nearest-even conversions, done with integer operations because WGSL lets an
// implementation flush denormals and pick either neighbour when it converts floats.

const ACT_NONE: u32 = 0u;
const ACT_RELU: u32 = 1u;
const ACT_RELU6: u32 = 2u;
const ACT_GELU: u32 = 3u;
const ACT_GELU_TANH: u32 = 4u;
const ACT_SILU: u32 = 5u;

// NaN test on the bits: WGSL may assume finite math, so `x != x` can be folded away.
fn is_nan_f32(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// erfc(z) for z >= 0: the Chebyshev fit of Numerical Recipes 6.2 (`erfcc`), z clamped to 10.
fn erfc_nonneg(z_in: f32) -> f32 {
    let z = min(z_in, 10.0);
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -1.2655122 + t * (1.0000237 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
        + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    return t * exp(p - z * z);
}

// GELU, erf form: 0.5x(2 - erfc(z)) for x >= 0 and 0.5x erfc(z) for x < 0, z = |x|/sqrt(2),
// so the negative tail never cancels.
fn gelu_erf(x: f32) -> f32 {
    let e = erfc_nonneg(abs(x) * 0.70710677);
    if (x >= 0.0) {
        return 0.5 * x * (2.0 - e);
    }
    return 0.5 * x * e;
}

// GELU, tanh form, as x * sigmoid(2u): no tanh overflow, no cancellation in the tail.
fn gelu_tanh(x: f32) -> f32 {
    let xc = clamp(x, -20.0, 20.0);
    let u = 0.7978846 * xc * (1.0 + 0.044715 * xc * xc);
    let t = clamp(-2.0 * u, -88.0, 88.0);
    return x / (1.0 + exp(t));
}

// SiLU, x * sigmoid(x): x - min(x, 88) e/(1 + e) for x >= 0, x/(1 + e) for -88 <= x < 0 and
// -0 below, with e = exp(min(-x, 88)) (finite). A NaN x takes the x/(1 + e) path.
fn silu(x: f32) -> f32 {
    let e = exp(min(-x, 88.0));
    let pos = x >= 0.0;
    let v = select(x, e, pos) / (1.0 + e);
    if (pos) {
        return x - min(x, 88.0) * v;
    }
    if (x < -88.0) {
        return -0.0;
    }
    return v;
}

fn apply_act(x: f32, act: u32) -> f32 {
    switch act {
        case 1u: {
            // relu propagates NaN, as the reference does.
            if (x > 0.0 || is_nan_f32(x)) {
                return x;
            }
            return 0.0;
        }
        case 2u: {
            if (is_nan_f32(x)) {
                return x;
            }
            return clamp(x, 0.0, 6.0);
        }
        case 3u: {
            return gelu_erf(x);
        }
        case 4u: {
            return gelu_tanh(x);
        }
        case 5u: {
            return silu(x);
        }
        default: {
            return x;
        }
    }
}

fn apply_act4(v: vec4<f32>, act: u32) -> vec4<f32> {
    if (act == ACT_NONE) {
        return v;
    }
    return vec4<f32>(apply_act(v.x, act), apply_act(v.y, act), apply_act(v.z, act), apply_act(v.w, act));
}

// bf16 bits (low 16 bits of the result) from an f32, round to nearest even. A NaN stays a NaN
// with its top payload bits; the quiet bit is set only where truncation would leave no payload,
// so every bf16 pattern survives a bf16 -> f32 -> bf16 round trip.
fn bf16_bits_from_f32(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        let hi = x >> 16u;
        if ((hi & 0x7fu) != 0u) {
            return hi;
        }
        return hi | 0x40u;
    }
    let round_bit = 0x8000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) {
        return (x >> 16u) + 1u;
    }
    return x >> 16u;
}

fn f32_from_bf16_bits(h: u32) -> f32 {
    return bitcast<f32>((h & 0xffffu) << 16u);
}

// f16 bits from an f32, round to nearest even, overflow to infinity, subnormals exact
// (a port of `half`'s `f32_to_f16_fallback`; NaN payloads kept as in `bf16_bits_from_f32`).
fn f16_bits_from_f32(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = (x >> 16u) & 0x8000u;
    let ex = x & 0x7f800000u;
    let man = x & 0x007fffffu;
    if (ex == 0x7f800000u) {
        if (man == 0u) {
            return sign | 0x7c00u;
        }
        let payload = man >> 13u;
        if (payload != 0u) {
            return sign | 0x7c00u | payload;
        }
        return sign | 0x7e00u;
    }
    let half_exp = i32(ex >> 23u) - 127 + 15;
    if (half_exp >= 31) {
        return sign | 0x7c00u;
    }
    if (half_exp <= 0) {
        if (14 - half_exp > 24) {
            return sign;
        }
        let m = man | 0x00800000u;
        let shift = u32(14 - half_exp);
        var half_man = m >> shift;
        let round_bit = 1u << (shift - 1u);
        if ((m & round_bit) != 0u && (m & (3u * round_bit - 1u)) != 0u) {
            half_man = half_man + 1u;
        }
        return sign | half_man;
    }
    let bits = sign | (u32(half_exp) << 10u) | (man >> 13u);
    let round_bit = 0x1000u;
    if ((man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u) {
        return bits + 1u;
    }
    return bits;
}

// f32 from f16 bits (low 16 bits of `h`), exact, NaN payloads kept (no quieting).
fn f32_from_f16_bits(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let ex = h & 0x7c00u;
    let man = h & 0x03ffu;
    if (ex == 0x7c00u) {
        return bitcast<f32>(sign | 0x7f800000u | (man << 13u));
    }
    if (ex == 0u) {
        // Zero or subnormal: man * 2^-24 is exact in f32 and a normal number there.
        let mag = f32(man) * 5.9604645e-8;
        return bitcast<f32>(sign | bitcast<u32>(mag));
    }
    return bitcast<f32>(sign | (((ex >> 10u) + 112u) << 23u) | (man << 13u));
}

// Rounds an f32 to the nearest bf16 value (ties to even): the `Precision::Bf16` input rounding.
fn round_bf16(v: f32) -> f32 {
    return bitcast<f32>(bf16_bits_from_f32(v) << 16u);
}

// The linear workgroup index of a 1-D launch folded into a 2-D grid (at most 65535 workgroups
// per dimension).
fn folded_group(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// Storage prelude: f32 elements.
@group(0) @binding(0) var<storage, read> a: array<vec4<f32>>;
fn ld_a(i: u32) -> f32 { return (a[i >> 2u][i & 3u]); }
fn ld4_a(v: u32) -> vec4<f32> { return (a[v]); }
@group(0) @binding(1) var<storage, read> b: array<vec4<f32>>;
fn ld_b(i: u32) -> f32 { return (b[i >> 2u][i & 3u]); }
fn ld4_b(v: u32) -> vec4<f32> { return (b[v]); }
@group(0) @binding(2) var<storage, read> bias: array<vec4<f32>>;
fn ld_bias(i: u32) -> f32 { return (bias[i >> 2u][i & 3u]); }
fn ld4_bias(v: u32) -> vec4<f32> { return (bias[v]); }
@group(0) @binding(3) var<storage, read> c: array<vec4<f32>>;
fn ld_c(i: u32) -> f32 { return (c[i >> 2u][i & 3u]); }
fn ld4_c(v: u32) -> vec4<f32> { return (c[v]); }
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
fn ld_out(i: u32) -> f32 { return (out[i >> 2u][i & 3u]); }
fn ld4_out(v: u32) -> vec4<f32> { return (out[v]); }
fn st_out(i: u32, x: f32) { out[i >> 2u][i & 3u] = x; }
fn st4_out(v: u32, x: vec4<f32>) { out[v] = x; }
// ---- END GENERATED ----
