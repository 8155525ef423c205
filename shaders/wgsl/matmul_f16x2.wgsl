enable f16;

// Matmul with a fused epilogue for f16 storage under `Precision::F16`:
//   out = act(alpha * op(A) * op(B) + bias[j] + beta * C)     (see `MatmulDesc`)
// products and partial sums of up to CHUNK = 8 consecutive products in f16 (`vec2<f16>` pairs,
// `fma`), each partial added to f32 accumulators. Built for f16 storage only (`enable f16`, the
// device's `SHADER_F16`): `Kernel::MatmulF16x2` in the catalogue, `catalogue::wgsl::f16x2`.
//
// Design: the tiled kernel of `matmul.wgsl` (read its header first) with the arithmetic and the
// staging in f16:
// - The same workgroup tiles (`MatmulTile`, the same tuning candidates), warp tiles, 8 x 8
//   register tile per invocation (rows ty*4..+4 and BM/2 + ty*4..+4, columns tx*4..+4 and
//   BN/2 + tx*4..+4), BK-deep slabs staged k-major, software pipelining of the global loads,
//   zero-filled guarded loads, `override` switches (transposes, bias, C, activation), the same
//   parameter block `MatmulParams` and epilogue (in f32).
// - Global loads read the f16 storage as it is (`vec4<f16>` where the view is 16-byte aligned,
//   scalars otherwise): no widening, no rounding, subnormals kept as bits.
// - The slabs are staged as `vec4<f16>` (8 bytes), with the index formulas of `matmul.wgsl`:
//   half its workgroup memory. The bank check is `catalogue::wgsl::f16x2` (the layout model of
//   `catalogue::wgsl::layout` with 8-byte vectors served in phases of 16 invocations and 2-byte
//   stores to the word that holds them): no bank conflicts for any tuning candidate.
// - Per k step an invocation reads two `vec4<f16>` of A and two of B and does 32 `vec2<f16>`
//   FMAs (64 products) into 32 `vec2<f16>` partials `ph` (row r, column half h, pair q at
//   ph[4 r + 2 h + q]); a column pair is the natural width of packed f16 hardware (HFMA2).
// - Every CHUNK k steps (and at the end of each slab, so with BK = 4 every 4) the partials are
//   widened into the 16 `vec4<f32>` accumulators and zeroed. `Precision::F16_CHUNK` is the
//   same 8; `tolerance::matmul_bound` derives the bound from it.
// - f16 overflow: a product or partial above 65504 turns into +-Inf (or NaN), which sticks
//   through the f32 sums. After the K loop each invocation checks its 64 sums (bit test, not
//   `isinf`: WGSL may assume finite math) and recomputes any non-finite one in f32 from the
//   stored inputs (`dot_f32`, rare and slow): that output is then the `Precision::Highest`
//   result, so overflow never shows and Inf/NaN inputs give what they give on the f32 path.
// - Grid: x = column blocks, y = row blocks, z = batches of this launch (`batch_base`), as
//   `matmul`.
// The generated block at the end of this file is the f16 one (the only variant the kernel is
// built in; its standard first lines say f32), so that the file is valid WGSL as it stands.

// Invocations per workgroup along N (x) and M (y), the slab depth and the warp tile: as in
// `matmul.wgsl` (the catalogue passes the same `MatmulTile` values).
override WG_X: u32 = 16u;
override WG_Y: u32 = 16u;
override BK: u32 = 8u;
override WARP_X: u32 = 8u;
override WARP_Y: u32 = 4u;

// The switches each pipeline is specialised to (`MatmulSwitches`).
override TRANS_A: bool = false;
override TRANS_B: bool = false;
override HAS_BIAS: bool = false;
override HAS_C: bool = false;
override ACT: u32 = 0u;

// Register tile per invocation: 8 x 8, as `matmul.wgsl`.
const TM: u32 = 8u;
const TN: u32 = 8u;
// Rows of one epilogue call: a 4 x 4 quarter of the tile.
const Q: u32 = 4u;
// Most vec4s of one operand an invocation stages per slab (`MatmulTile::loads_per_invocation`).
const MAX_LOADS: u32 = 8u;
// Products per f16 partial sum before it is added to the f32 accumulators
// (`Precision::F16_CHUNK`).
const CHUNK: u32 = 8u;

const A_VEC: u32 = 1u;
const B_VEC: u32 = 2u;
const O_VEC: u32 = 4u;

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

// Rows and columns of the output block and row lengths of the staged slabs in vec4s.
override BM: u32 = WG_Y * TM;
override BN: u32 = WG_X * TN;
override ROW_A4: u32 = BM / 4u;
override ROW_B4: u32 = BN / 4u;
override AS_LEN: u32 = BK * ROW_A4;
override BS_LEN: u32 = BK * ROW_B4;

var<workgroup> As: array<vec4<f16>, AS_LEN>;
var<workgroup> Bs: array<vec4<f16>, BS_LEN>;

// Four consecutive elements of stored A, row `r`, columns `c0..c0+4`, zero outside, read as
// stored (the binding `a` is `array<vec4<f16>>` in the f16 storage prelude).
fn load4_a(base: u32, rows: u32, cols: u32, r: u32, c0: u32) -> vec4<f16> {
    var v = vec4<f16>(0.0h);
    if (r >= rows || c0 >= cols) {
        return v;
    }
    let idx = base + r * p.a_ld + c0;
    if ((p.flags & A_VEC) != 0u && c0 + 4u <= cols) {
        v = a[idx >> 2u];
    } else {
        for (var j = 0u; j < 4u; j++) {
            if (c0 + j < cols) {
                let i = idx + j;
                v[j] = a[i >> 2u][i & 3u];
            }
        }
    }
    return v;
}

fn load4_b(base: u32, rows: u32, cols: u32, r: u32, c0: u32) -> vec4<f16> {
    var v = vec4<f16>(0.0h);
    if (r >= rows || c0 >= cols) {
        return v;
    }
    let idx = base + r * p.b_ld + c0;
    if ((p.flags & B_VEC) != 0u && c0 + 4u <= cols) {
        v = b[idx >> 2u];
    } else {
        for (var j = 0u; j < 4u; j++) {
            if (c0 + j < cols) {
                let i = idx + j;
                v[j] = b[i >> 2u][i & 3u];
            }
        }
    }
    return v;
}

// The v-th vec4 of the stored slab of A starting at k0: `matmul.wgsl`'s `fetch_a`.
fn fetch_a(v: u32, k0: u32, m0: u32, a_base: u32, a_rows: u32, a_cols: u32) -> vec4<f16> {
    if (!TRANS_A) {
        let m = v % BM;
        let c = (v / BM) * 4u;
        return load4_a(a_base, a_rows, a_cols, m0 + m, k0 + c);
    }
    let r = v / (BM / 4u);
    let c = (v % (BM / 4u)) * 4u;
    return load4_a(a_base, a_rows, a_cols, k0 + r, m0 + c);
}

// Stores what `fetch_a(v, ...)` loaded into As[k][m] (`matmul.wgsl`'s `put_a`).
fn put_a(v: u32, x: vec4<f16>) {
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

// The v-th vec4 of the stored slab of B starting at k0 (`matmul.wgsl`'s `fetch_b`).
fn fetch_b(v: u32, k0: u32, n0: u32, b_base: u32, b_rows: u32, b_cols: u32) -> vec4<f16> {
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
fn put_b(v: u32, x: vec4<f16>) {
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

// Whether every component is finite, on the bits (WGSL may assume finite math).
fn finite4(v: vec4<f32>) -> bool {
    return all((bitcast<vec4<u32>>(v) & vec4<u32>(0x7f800000u)) != vec4<u32>(0x7f800000u));
}

// op(A)[row] . op(B)[:, col] in f32, k in order, from the stored inputs: the recomputation of
// an output whose f16 sums overflowed.
fn dot_f32(a_base: u32, b_base: u32, row: u32, col: u32) -> f32 {
    var s = 0.0;
    for (var k = 0u; k < p.k; k++) {
        var ai = a_base + row * p.a_ld + k;
        if (TRANS_A) {
            ai = a_base + k * p.a_ld + row;
        }
        var bi = b_base + k * p.b_ld + col;
        if (TRANS_B) {
            bi = b_base + col * p.b_ld + k;
        }
        s = fma(ld_a(ai), ld_b(bi), s);
    }
    return s;
}

@compute @workgroup_size(WG_X, WG_Y, 1)
fn matmul_f16x2(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) flat: u32) {
    let m0 = wid.y * BM;
    let n0 = wid.x * BN;
    let bt = p.batch_base + wid.z;
    let threads = WG_X * WG_Y;
    let warp_size = WARP_X * WARP_Y;
    let lane = flat % warp_size;
    let warp = flat / warp_size;
    let warps_x = WG_X / WARP_X;
    let tx = (warp % warps_x) * WARP_X + lane % WARP_X;
    let ty = (warp / warps_x) * WARP_Y + lane / WARP_X;

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

    // acc[2 r + h]: f32 sums of row r of the tile (r < 4: ty*4 + r; r >= 4: BM/2 + ty*4 + r - 4),
    // column half h (0: tx*4..+4; 1: BN/2 + tx*4..+4). ph[4 r + 2 h + q]: the f16 partials of
    // columns 2q, 2q + 1 of that quarter row, since the last flush.
    var acc: array<vec4<f32>, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    var ph: array<vec2<f16>, 32>;
    for (var i = 0u; i < 32u; i++) {
        ph[i] = vec2<f16>(0.0h);
    }

    let na = BM * BK / 4u;
    let nb = BN * BK / 4u;
    let la = (na + threads - 1u) / threads;
    let lb = (nb + threads - 1u) / threads;
    var pa: array<vec4<f16>, MAX_LOADS>;
    var pb: array<vec4<f16>, MAX_LOADS>;
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
        for (var kc = 0u; kc < BK; kc += CHUNK) {
            let kend = min(kc + CHUNK, BK);
            for (var kk = kc; kk < kend; kk++) {
                let a0 = As[kk * ROW_A4 + ty];
                let a1 = As[kk * ROW_A4 + WG_Y + ty];
                let b0 = Bs[kk * ROW_B4 + tx];
                let b1 = Bs[kk * ROW_B4 + WG_X + tx];
                let x0 = vec2<f16>(a0.x);
                ph[0] = fma(x0, b0.xy, ph[0]);
                ph[1] = fma(x0, b0.zw, ph[1]);
                ph[2] = fma(x0, b1.xy, ph[2]);
                ph[3] = fma(x0, b1.zw, ph[3]);
                let x1 = vec2<f16>(a0.y);
                ph[4] = fma(x1, b0.xy, ph[4]);
                ph[5] = fma(x1, b0.zw, ph[5]);
                ph[6] = fma(x1, b1.xy, ph[6]);
                ph[7] = fma(x1, b1.zw, ph[7]);
                let x2 = vec2<f16>(a0.z);
                ph[8] = fma(x2, b0.xy, ph[8]);
                ph[9] = fma(x2, b0.zw, ph[9]);
                ph[10] = fma(x2, b1.xy, ph[10]);
                ph[11] = fma(x2, b1.zw, ph[11]);
                let x3 = vec2<f16>(a0.w);
                ph[12] = fma(x3, b0.xy, ph[12]);
                ph[13] = fma(x3, b0.zw, ph[13]);
                ph[14] = fma(x3, b1.xy, ph[14]);
                ph[15] = fma(x3, b1.zw, ph[15]);
                let x4 = vec2<f16>(a1.x);
                ph[16] = fma(x4, b0.xy, ph[16]);
                ph[17] = fma(x4, b0.zw, ph[17]);
                ph[18] = fma(x4, b1.xy, ph[18]);
                ph[19] = fma(x4, b1.zw, ph[19]);
                let x5 = vec2<f16>(a1.y);
                ph[20] = fma(x5, b0.xy, ph[20]);
                ph[21] = fma(x5, b0.zw, ph[21]);
                ph[22] = fma(x5, b1.xy, ph[22]);
                ph[23] = fma(x5, b1.zw, ph[23]);
                let x6 = vec2<f16>(a1.z);
                ph[24] = fma(x6, b0.xy, ph[24]);
                ph[25] = fma(x6, b0.zw, ph[25]);
                ph[26] = fma(x6, b1.xy, ph[26]);
                ph[27] = fma(x6, b1.zw, ph[27]);
                let x7 = vec2<f16>(a1.w);
                ph[28] = fma(x7, b0.xy, ph[28]);
                ph[29] = fma(x7, b0.zw, ph[29]);
                ph[30] = fma(x7, b1.xy, ph[30]);
                ph[31] = fma(x7, b1.zw, ph[31]);
            }
            // The flush: at most CHUNK products per partial.
            for (var t = 0u; t < 16u; t++) {
                acc[t] += vec4<f32>(vec2<f32>(ph[2u * t]), vec2<f32>(ph[2u * t + 1u]));
                ph[2u * t] = vec2<f16>(0.0h);
                ph[2u * t + 1u] = vec2<f16>(0.0h);
            }
        }
        workgroupBarrier();
    }

    let r0 = m0 + ty * 4u;
    let r1 = m0 + BM / 2u + ty * 4u;
    let c0 = n0 + tx * 4u;
    let c1 = n0 + BN / 2u + tx * 4u;

    // The overflow guard (see the header): recompute non-finite sums in f32.
    var finite = true;
    for (var t = 0u; t < 16u; t++) {
        finite = finite && finite4(acc[t]);
    }
    if (!finite) {
        for (var t = 0u; t < 16u; t++) {
            let r = t / 2u;
            let row = select(r1 + r - 4u, r0 + r, r < 4u);
            let col = select(c1, c0, (t % 2u) == 0u);
            for (var j = 0u; j < 4u; j++) {
                let bits = bitcast<u32>(acc[t][j]) & 0x7f800000u;
                if (bits == 0x7f800000u && row < p.m && col + j < p.n) {
                    acc[t][j] = dot_f32(a_base, b_base, row, col + j);
                }
            }
        }
    }

    epilogue(array<vec4<f32>, 4>(acc[0], acc[2], acc[4], acc[6]), r0, p.m, c0, bt);
    epilogue(array<vec4<f32>, 4>(acc[1], acc[3], acc[5], acc[7]), r0, p.m, c1, bt);
    epilogue(array<vec4<f32>, 4>(acc[8], acc[10], acc[12], acc[14]), r1, p.m, c0, bt);
    epilogue(array<vec4<f32>, 4>(acc[9], acc[11], acc[13], acc[15]), r1, p.m, c1, bt);
}

// The fused epilogue in f32, once per output (`matmul.wgsl`'s, unchanged): rows
// row0..min(row0 + 4, row_end), columns col0..col0+4 of batch bt; a vec4 store where the
// output view is aligned (O_VEC) and the 4 columns are inside N. The f16 store rounds to
// nearest even bit-exactly (the storage prelude).
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

// Storage prelude: f16 elements.
@group(0) @binding(0) var<storage, read> a: array<vec4<f16>>;
fn ld_a(i: u32) -> f32 { return f32(a[i >> 2u][i & 3u]); }
fn ld4_a(v: u32) -> vec4<f32> { return vec4<f32>(a[v]); }
@group(0) @binding(1) var<storage, read> b: array<vec4<f16>>;
fn ld_b(i: u32) -> f32 { return f32(b[i >> 2u][i & 3u]); }
fn ld4_b(v: u32) -> vec4<f32> { return vec4<f32>(b[v]); }
@group(0) @binding(2) var<storage, read> bias: array<vec4<f16>>;
fn ld_bias(i: u32) -> f32 { return f32(bias[i >> 2u][i & 3u]); }
fn ld4_bias(v: u32) -> vec4<f32> { return vec4<f32>(bias[v]); }
@group(0) @binding(3) var<storage, read> c: array<vec4<f16>>;
fn ld_c(i: u32) -> f32 { return f32(c[i >> 2u][i & 3u]); }
fn ld4_c(v: u32) -> vec4<f32> { return vec4<f32>(c[v]); }
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f16>>;
fn ld_out(i: u32) -> f32 { return f32(out[i >> 2u][i & 3u]); }
fn ld4_out(v: u32) -> vec4<f32> { return vec4<f32>(out[v]); }
fn st_out(i: u32, x: f32) { out[i >> 2u][i & 3u] = f16(f32_from_f16_bits(f16_bits_from_f32(x))); }
fn st4_out(v: u32, x: vec4<f32>) {
    let r = vec4<f32>(f32_from_f16_bits(f16_bits_from_f32(x.x)), f32_from_f16_bits(f16_bits_from_f32(x.y)),
        f32_from_f16_bits(f16_bits_from_f32(x.z)), f32_from_f16_bits(f16_bits_from_f32(x.w)));
    out[v] = vec4<f16>(r);
}
// ---- END GENERATED ----
