// The fused inverted-residual block (see `InvertedResidualDesc`): expand 1x1 + ReLU6,
// depthwise 3x3 (padding 1, stride 1 or 2) + ReLU6, projection 1x1, residual; the expanded
// tensor never leaves the workgroup.
//
// Design: a workgroup owns a TW x TH tile of output pixels of one image and up to OB = 160
// output channels (grid: x = tiles, y = output-channel blocks, z = images; 16 of MobileNetV2's
// 17 blocks have C' <= 160, so y is 1 there and each tile's expand stage runs once; the last,
// C' = 320, runs it twice). It walks the hidden channels in chunks of HC:
// 1. the chunk's expanded activations over the tile's input footprint (the tile and its
//    3x3 halo: ((TH-1)s+3) x ((TW-1)s+3) pixels) are computed into workgroup memory
//    (`e_s`), zero in the padding, and the chunk's projection weights are staged (`wp_s`);
// 2. the depthwise filter + ReLU6 of the chunk, one (pixel, hidden channel) per invocation, goes
//    to `f_s` (stored channel-major, so step 3's reads of 32 pixels are 32 consecutive words);
// 3. each invocation adds the chunk's projection onto its ACC accumulators in registers: one
//    pixel (lid & 31) and the output channels lane + 8k (lane = lid >> 5, k < ACC).
// After the last chunk each invocation adds bias and residual and stores its outputs. Only
// the input, the weights and the output touch memory.
//
// Tile constants (fixed; workgroup storage 11,040 bytes, under WebGPU's 16 KiB minimum):
// TW x TH = 8 x 4 = 32 output pixels, LANES = 8 invocations per pixel (256 invocations, the
// WebGPU default limit); HC = 8 hidden channels per chunk and the projection weights of 160
// output channels (`wp_s`, 5 KiB). ACC (an override, ceil(min(C', 160) / 8), at most
// MAX_ACC = 20) is the accumulators an invocation uses: the pipeline is specialised to it, so
// the accumulator loops have constant bounds (registers, not local memory, on a GPU).
// MAX_ACC = 40 (OB = 320) was tried first: on lavapipe the block with C = 160, C' = 320 then
// wrote nothing (all zeros, no error) while 20 accumulators run it correctly.

const TW: u32 = 8u;
const TH: u32 = 4u;
const TP: u32 = 32u; // TW * TH
const HC: u32 = 8u;
const LANES: u32 = 8u;
const OB: u32 = 160u; // LANES * MAX_ACC
const WG: u32 = 256u; // TP * LANES
override ACC: u32 = 20u;
// The largest footprint: stride 2, (TH - 1) * 2 + 3 = 9 rows of (TW - 1) * 2 + 3 = 17.
const MAX_FOOT: u32 = 153u;

const EXPAND: u32 = 1u;
const EXPAND_BIAS: u32 = 2u;
const DW_BIAS: u32 = 4u;
const PROJECT_BIAS: u32 = 8u;
const RESIDUAL: u32 = 16u;
const NHWC: u32 = 32u;

struct BlockParams {
    channels: u32,
    height: u32,
    width: u32,
    hidden: u32,
    out_c: u32,
    stride: u32,
    out_h: u32,
    out_w: u32,
    tiles_w: u32,
    flags: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(8) var<uniform> p: BlockParams;

var<workgroup> e_s: array<f32, 1224>; // MAX_FOOT * HC
var<workgroup> f_s: array<f32, 256>;  // HC * TP, channel-major
var<workgroup> wp_s: array<f32, 1280>; // OB * HC

fn relu6(v: f32) -> f32 {
    return clamp(v, 0.0, 6.0);
}

fn has(flag: u32) -> bool {
    return (p.flags & flag) != 0u;
}

fn x_index(n: u32, c: u32, y: u32, x: u32) -> u32 {
    if has(NHWC) {
        return ((n * p.height + y) * p.width + x) * p.channels + c;
    }
    return ((n * p.channels + c) * p.height + y) * p.width + x;
}

fn out_index(n: u32, o: u32, y: u32, x: u32) -> u32 {
    if has(NHWC) {
        return ((n * p.out_h + y) * p.out_w + x) * p.out_c + o;
    }
    return ((n * p.out_c + o) * p.out_h + y) * p.out_w + x;
}

@compute @workgroup_size(256)
fn inverted_residual(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = wid.z;
    let oy0 = (wid.x / p.tiles_w) * TH;
    let ox0 = (wid.x % p.tiles_w) * TW;
    let ob0 = wid.y * OB;
    let s = p.stride;
    // The footprint's origin in padded coordinates (image row = padded row - 1).
    let fy0 = oy0 * s;
    let fx0 = ox0 * s;
    let foot_w = (TW - 1u) * s + 3u;
    let foot = ((TH - 1u) * s + 3u) * foot_w;
    // This invocation's pixel and output-channel lane.
    let px = lid & (TP - 1u);
    let lane = lid >> 5u;
    let oy = oy0 + px / TW;
    let ox = ox0 + px % TW;
    var acc: array<f32, 20>; // MAX_ACC
    for (var k = 0u; k < ACC; k++) {
        acc[k] = 0.0;
    }
    for (var j0 = 0u; j0 < p.hidden; j0 += HC) {
        // 1. The expanded chunk over the footprint, and the chunk's projection weights.
        for (var i = lid; i < foot * HC; i += WG) {
            let q = i / HC;
            let j = j0 + i % HC;
            let py = fy0 + q / foot_w;
            let pxx = fx0 + q % foot_w;
            var v = 0.0;
            if (j < p.hidden && py >= 1u && pxx >= 1u && py <= p.height && pxx <= p.width) {
                let iy = py - 1u;
                let ix = pxx - 1u;
                if has(EXPAND) {
                    var a = 0.0;
                    if has(EXPAND_BIAS) {
                        a = ld_be(j);
                    }
                    for (var c = 0u; c < p.channels; c++) {
                        a += ld_we(j * p.channels + c) * ld_x(x_index(n, c, iy, ix));
                    }
                    v = relu6(a);
                } else {
                    v = ld_x(x_index(n, j, iy, ix));
                }
            }
            e_s[i] = v;
        }
        for (var i = lid; i < ACC * LANES * HC; i += WG) {
            let o = ob0 + i / HC;
            let j = j0 + i % HC;
            var w = 0.0;
            if (o < p.out_c && j < p.hidden) {
                w = ld_wp(o * p.hidden + j);
            }
            wp_s[i] = w;
        }
        workgroupBarrier();
        // 2. Depthwise + ReLU6: invocation (pixel t = lid & 31, chunk channel jj = lid >> 5).
        {
            let t = px;
            let jj = lane;
            let j = j0 + jj;
            var a = 0.0;
            if (j < p.hidden) {
                if has(DW_BIAS) {
                    a = ld_bd(j);
                }
                let base = ((t / TW) * s * foot_w + (t % TW) * s) * HC + jj;
                for (var ky = 0u; ky < 3u; ky++) {
                    for (var kx = 0u; kx < 3u; kx++) {
                        a += ld_wd(j * 9u + ky * 3u + kx) * e_s[base + (ky * foot_w + kx) * HC];
                    }
                }
            }
            f_s[jj * TP + t] = relu6(a);
        }
        workgroupBarrier();
        // 3. The chunk's projection onto this invocation's accumulators.
        for (var jj = 0u; jj < HC; jj++) {
            let f = f_s[jj * TP + px];
            for (var k = 0u; k < ACC; k++) {
                acc[k] += f * wp_s[(lane + LANES * k) * HC + jj];
            }
        }
        workgroupBarrier();
    }
    if (oy >= p.out_h || ox >= p.out_w) {
        return;
    }
    for (var k = 0u; k < ACC; k++) {
        let o = ob0 + lane + LANES * k;
        if (o >= p.out_c) {
            break;
        }
        var y = acc[k];
        if has(PROJECT_BIAS) {
            y += ld_bp(o);
        }
        if has(RESIDUAL) {
            y += ld_x(x_index(n, o, oy, ox));
        }
        st_out(out_index(n, o, oy, ox), y);
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
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
fn ld_x(i: u32) -> f32 { return (x[i >> 2u][i & 3u]); }
fn ld4_x(v: u32) -> vec4<f32> { return (x[v]); }
@group(0) @binding(1) var<storage, read> we: array<vec4<f32>>;
fn ld_we(i: u32) -> f32 { return (we[i >> 2u][i & 3u]); }
fn ld4_we(v: u32) -> vec4<f32> { return (we[v]); }
@group(0) @binding(2) var<storage, read> be: array<vec4<f32>>;
fn ld_be(i: u32) -> f32 { return (be[i >> 2u][i & 3u]); }
fn ld4_be(v: u32) -> vec4<f32> { return (be[v]); }
@group(0) @binding(3) var<storage, read> wd: array<vec4<f32>>;
fn ld_wd(i: u32) -> f32 { return (wd[i >> 2u][i & 3u]); }
fn ld4_wd(v: u32) -> vec4<f32> { return (wd[v]); }
@group(0) @binding(4) var<storage, read> bd: array<vec4<f32>>;
fn ld_bd(i: u32) -> f32 { return (bd[i >> 2u][i & 3u]); }
fn ld4_bd(v: u32) -> vec4<f32> { return (bd[v]); }
@group(0) @binding(5) var<storage, read> wp: array<vec4<f32>>;
fn ld_wp(i: u32) -> f32 { return (wp[i >> 2u][i & 3u]); }
fn ld4_wp(v: u32) -> vec4<f32> { return (wp[v]); }
@group(0) @binding(6) var<storage, read> bp: array<vec4<f32>>;
fn ld_bp(i: u32) -> f32 { return (bp[i >> 2u][i & 3u]); }
fn ld4_bp(v: u32) -> vec4<f32> { return (bp[v]); }
@group(0) @binding(7) var<storage, read_write> out: array<vec4<f32>>;
fn ld_out(i: u32) -> f32 { return (out[i >> 2u][i & 3u]); }
fn ld4_out(v: u32) -> vec4<f32> { return (out[v]); }
fn st_out(i: u32, x: f32) { out[i >> 2u][i & 3u] = x; }
fn st4_out(v: u32, x: vec4<f32>) { out[v] = x; }
// ---- END GENERATED ----
