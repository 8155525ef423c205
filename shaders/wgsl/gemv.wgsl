// GEMV / skinny GEMM (M <= 16) with the fused epilogue of `matmul.wgsl`:
//   out = act(alpha * op(A) * op(B) + bias[j] + beta * C)     (see `MatmulDesc`)
// A decode step streams the weight matrix once: the kernel is memory-bound, so the design is
// about keeping enough loads in flight, not about reuse.
//
// Design:
// - A workgroup of WG invocations (64 by default, two 32-wide subgroups on most GPUs) owns
//   GV_COLS = 4 output columns and all GV_ROWS = M rows of them, so N = 4096 launches 1024
//   workgroups (about 8 per SM of a 132-SM GPU, 4 per CU of a 256-CU one).
// - Its invocations split K: invocation t takes k = 4t, 4t + 4 WG, ... and accumulates a
//   GV_ROWS x 4 partial tile in registers (`acc`, one vec4 of columns per row).
// - B stored [N, K] (TRANS_B, nn.Linear / GGUF weights): each of the 4 columns is a stored
//   row; an invocation reads one vec4 along K from each (16-byte loads where the view is
//   aligned, B_VEC), and consecutive invocations read consecutive vec4s of the same row, so a
//   32-wide subgroup reads 512 contiguous bytes of each of the 4 rows per step.
// - B stored [K, N]: an invocation reads the 4 columns of 4 consecutive stored rows (one vec4
//   per row; 16 bytes per row and workgroup, the neighbouring workgroup reads the next 16).
// - op(A) rows are read as vec4s along K (A is at most 16 rows, cached); transposed A with
//   guarded scalar loads.
// - The partial tiles are summed over the workgroup: with subgroup operations (`subgroupAdd`,
//   entry `gemv_subgroup`, where the device has `wgpu::Features::SUBGROUP`) and one
//   workgroup-memory slot per subgroup, or by a workgroup-memory tree (entry `gemv`, 4 rows at
//   a time, log2(WG) barriers). The catalogue builds `gemv` without the subgroup entry, so it
//   compiles on devices without the feature. (naga 30 takes subgroup operations without an
//   `enable` directive and rejects `enable subgroups;`; the device feature gates them.)
// - The epilogue runs once per output (invocation r stores row r's 4 columns), vec4 stores
//   where the output view is aligned (O_VEC) and the 4 columns are inside N.
// - Zero-filled guarded loads make every M, N, K correct (K = 0: the epilogue of zeros).
//   Precision::Bf16 rounds A and B to bf16 as they are loaded, as `matmul` does.
// - Grid: x = column groups of 4, y = 1, z = batches of this launch (`batch_base`).

// Invocations per workgroup (a power of two, at most 256); part of the pipeline-cache key.
override WG: u32 = 64u;
// Rows of op(A) (M, 1 to 16): the register tile covers exactly M rows, so a matrix-vector
// product does no wasted FMAs. A pipeline constant, so the row loops unroll.
override GV_ROWS: u32 = 16u;

// The switches each pipeline is specialised to (`MatmulSwitches` in the catalogue).
override TRANS_A: bool = false;
override TRANS_B: bool = false;
override HAS_BIAS: bool = false;
override HAS_C: bool = false;
override ACT: u32 = 0u;

// Columns per workgroup: one vec4 of outputs per row.
const GV_COLS: u32 = 4u;
// The largest GV_ROWS (function-scope arrays need a constant size).
const MAX_ROWS: u32 = 16u;

const A_VEC: u32 = 1u;
const B_VEC: u32 = 2u;
const O_VEC: u32 = 4u;
const PREC_BF16: u32 = 8u;

// Field for field `MatmulParams` of `matmul.wgsl` (the catalogue's `MatmulParams`).
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

// Reduction scratch: 4 rows x WG partials (the tree), or GV_ROWS rows x WG / 4 subgroups
// (subgroups have at least 4 invocations, wgpu's MINIMUM_SUBGROUP_MIN_SIZE): 4 WG vec4s
// either way, 4 KiB at WG = 64.
override PART_LEN: u32 = 4u * WG;
var<workgroup> part: array<vec4<f32>, PART_LEN>;

fn bf16_if(v: vec4<f32>) -> vec4<f32> {
    if ((p.flags & PREC_BF16) != 0u) {
        return vec4<f32>(round_bf16(v.x), round_bf16(v.y), round_bf16(v.z), round_bf16(v.w));
    }
    return v;
}

// op(A)[i][k..k+4], zero outside.
fn load4_op_a(base: u32, i: u32, k: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (i >= p.m || k >= p.k) {
        return v;
    }
    if (!TRANS_A) {
        let idx = base + i * p.a_ld + k;
        if ((p.flags & A_VEC) != 0u && k + 4u <= p.k) {
            v = ld4_a(idx >> 2u);
        } else {
            for (var j = 0u; j < 4u; j++) {
                if (k + j < p.k) {
                    v[j] = ld_a(idx + j);
                }
            }
        }
    } else {
        // Stored [K, M]: the 4 elements lie in 4 stored rows.
        for (var j = 0u; j < 4u; j++) {
            if (k + j < p.k) {
                v[j] = ld_a(base + (k + j) * p.a_ld + i);
            }
        }
    }
    return bf16_if(v);
}

// Stored B, row r, columns c0..c0+4 of a `rows` x `cols` matrix, zero outside.
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
    return bf16_if(v);
}

// The partial GV_ROWS x 4 tile of invocation t: columns col0..col0+4, k = 4t, 4t + 4 WG, ...
fn gemv_partial(col0: u32, bt: u32, t: u32) -> array<vec4<f32>, MAX_ROWS> {
    let a_base = p.a_off + bt * p.a_bs;
    let b_base = p.b_off + bt * p.b_bs;
    var acc: array<vec4<f32>, MAX_ROWS>;
    for (var i = 0u; i < MAX_ROWS; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    for (var k = 4u * t; k < p.k; k += 4u * WG) {
        var ab: array<vec4<f32>, MAX_ROWS>;
        for (var i = 0u; i < GV_ROWS; i++) {
            ab[i] = load4_op_a(a_base, i, k);
        }
        if (TRANS_B) {
            // Stored [N, K]: column col0 + c is stored row col0 + c, read along K.
            let b0 = load4_b(b_base, p.n, p.k, col0, k);
            let b1 = load4_b(b_base, p.n, p.k, col0 + 1u, k);
            let b2 = load4_b(b_base, p.n, p.k, col0 + 2u, k);
            let b3 = load4_b(b_base, p.n, p.k, col0 + 3u, k);
            for (var i = 0u; i < GV_ROWS; i++) {
                acc[i] += vec4<f32>(dot(ab[i], b0), dot(ab[i], b1), dot(ab[i], b2), dot(ab[i], b3));
            }
        } else {
            // Stored [K, N]: rows k..k+4, the 4 columns of this workgroup.
            let b0 = load4_b(b_base, p.k, p.n, k, col0);
            let b1 = load4_b(b_base, p.k, p.n, k + 1u, col0);
            let b2 = load4_b(b_base, p.k, p.n, k + 2u, col0);
            let b3 = load4_b(b_base, p.k, p.n, k + 3u, col0);
            for (var i = 0u; i < GV_ROWS; i++) {
                acc[i] = fma(vec4<f32>(ab[i].x), b0, acc[i]);
                acc[i] = fma(vec4<f32>(ab[i].y), b1, acc[i]);
                acc[i] = fma(vec4<f32>(ab[i].z), b2, acc[i]);
                acc[i] = fma(vec4<f32>(ab[i].w), b3, acc[i]);
            }
        }
    }
    return acc;
}

// The fused epilogue of row `row`, columns col0..col0+4 of batch bt (as `matmul.wgsl`'s).
fn gemv_store(row: u32, col0: u32, bt: u32, acc: vec4<f32>) {
    if (row >= p.m || col0 >= p.n) {
        return;
    }
    let full = col0 + 4u <= p.n;
    var v = p.alpha * acc;
    if (HAS_BIAS) {
        var bias = vec4<f32>(0.0);
        for (var j = 0u; j < 4u; j++) {
            if (col0 + j < p.n) {
                bias[j] = ld_bias(p.bias_off + col0 + j);
            }
        }
        v = v + bias;
    }
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

// ---- BEGIN SUBGROUP ENTRY (left out of the `gemv` module) ----
// Subgroup reduction: each subgroup sums its partial tiles with `subgroupAdd`, its first
// invocation parks the sums in `part` (row-major per subgroup), and invocation r adds the
// subgroups' sums of row r. One barrier.
@compute @workgroup_size(WG, 1, 1)
fn gemv_subgroup(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let col0 = wid.x * GV_COLS;
    let bt = p.batch_base + wid.z;
    var acc = gemv_partial(col0, bt, t);
    for (var i = 0u; i < GV_ROWS; i++) {
        let s = subgroupAdd(acc[i]);
        if (lane == 0u && sg < WG / 4u) {
            part[sg * GV_ROWS + i] = s;
        }
    }
    workgroupBarrier();
    if (t < GV_ROWS) {
        var v = vec4<f32>(0.0);
        for (var s = 0u; s < min(nsg, WG / 4u); s++) {
            v += part[s * GV_ROWS + t];
        }
        gemv_store(t, col0, bt, v);
    }
}
// ---- END SUBGROUP ENTRY ----

// Workgroup-memory reduction: 4 rows at a time, each invocation parks its 4 partial vec4s,
// then a tree halves the active invocations per barrier; invocation r < 4 stores row r0 + r.
@compute @workgroup_size(WG, 1, 1)
fn gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let col0 = wid.x * GV_COLS;
    let bt = p.batch_base + wid.z;
    var acc = gemv_partial(col0, bt, t);
    for (var r0 = 0u; r0 < GV_ROWS; r0 += 4u) {
        for (var i = 0u; i < 4u; i++) {
            part[i * WG + t] = acc[min(r0 + i, MAX_ROWS - 1u)];
        }
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (t < s) {
                for (var i = 0u; i < 4u; i++) {
                    part[i * WG + t] += part[i * WG + t + s];
                }
            }
            workgroupBarrier();
        }
        if (t < 4u && r0 + t < GV_ROWS) {
            gemv_store(r0 + t, col0, bt, part[t * WG]);
        }
        // The next rows overwrite `part` only after these stores read it.
        workgroupBarrier();
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
