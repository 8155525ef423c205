// Depthwise 2-D convolution with fused bias and activation (see `Conv2dDesc`): output channel
// oc reads input channel oc / multiplier through its own kh x kw filter.
//
// Design: depthwise convolution does ~2 FLOP per byte, so it is memory-bound everywhere; the
// kernel aims at few, wide memory transactions and reuse through the cache rather than at
// workgroup-memory tiling (taps are read directly).
// - NCHW: each invocation computes 4 consecutive outputs along W of one (n, oc, oy) row. Each
//   filter tap is loaded once and used for the 4 outputs; neighbouring invocations read
//   neighbouring input columns, so the loads coalesce. The 4 outputs are stored as one vec4
//   when OW is a multiple of 4 (OUT_VEC).
// - NHWC: each invocation computes 4 consecutive output channels of one pixel. With multiplier
//   1 and C a multiple of 4 (IN_VEC) each tap is one vec4 load of 4 channels; the output is
//   one vec4 store when C*m is a multiple of 4 (OUT_VEC).
// - Padding is handled per tap in padded coordinates (unsigned: a tap is inside when
//   pad <= pos < pad + extent), stride, dilation and multiplier are run-time parameters.
// - The 1-D grid of items is folded into 2-D (at most 65535 workgroups per dimension).

// 64 invocations per workgroup: 256 outputs per workgroup, two wavefronts / subgroups of 32
// on most GPUs; the conv is memory-bound, so larger groups buy nothing.
override WG: u32 = 64u;

const HAS_BIAS: u32 = 1u;
const IN_VEC: u32 = 2u;
const OUT_VEC: u32 = 4u;

struct ConvParams {
    batch: u32,
    channels: u32,
    height: u32,
    width: u32,
    mult: u32,
    kh: u32,
    kw: u32,
    stride_h: u32,
    stride_w: u32,
    dil_h: u32,
    dil_w: u32,
    pad_top: u32,
    pad_left: u32,
    out_h: u32,
    out_w: u32,
    out_c: u32,
    nhwc: u32,
    flags: u32,
    act: u32,
    items: u32,
    // Element offsets of input, weight, bias and output inside their bindings (a split
    // convolution binds windows of its buffers; see the wgpu backend's `split_conv`).
    in_off: u32,
    w_off: u32,
    b_off: u32,
    o_off: u32,
}

@group(0) @binding(4) var<uniform> p: ConvParams;

fn conv_nchw(item: u32) {
    let qn = (p.out_w + 3u) / 4u;
    let ox0 = (item % qn) * 4u;
    var rest = item / qn;
    let oy = rest % p.out_h;
    rest = rest / p.out_h;
    let oc = rest % p.out_c;
    let n = rest / p.out_c;
    let ic = oc / p.mult;
    let in_base = p.in_off + (n * p.channels + ic) * p.height * p.width;
    let w_base = p.w_off + oc * p.kh * p.kw;
    var acc = vec4<f32>(0.0);
    for (var ky = 0u; ky < p.kh; ky++) {
        let py = oy * p.stride_h + ky * p.dil_h;
        if (py < p.pad_top || py - p.pad_top >= p.height) {
            continue;
        }
        let row = in_base + (py - p.pad_top) * p.width;
        for (var kx = 0u; kx < p.kw; kx++) {
            let w = ld_weight(w_base + ky * p.kw + kx);
            for (var j = 0u; j < 4u; j++) {
                let px = (ox0 + j) * p.stride_w + kx * p.dil_w;
                if (ox0 + j < p.out_w && px >= p.pad_left && px - p.pad_left < p.width) {
                    acc[j] = fma(ld_input(row + px - p.pad_left), w, acc[j]);
                }
            }
        }
    }
    if ((p.flags & HAS_BIAS) != 0u) {
        acc = acc + vec4<f32>(ld_bias(p.b_off + oc));
    }
    acc = apply_act4(acc, p.act);
    let o = p.o_off + ((n * p.out_c + oc) * p.out_h + oy) * p.out_w + ox0;
    if ((p.flags & OUT_VEC) != 0u) {
        st4_out(o >> 2u, acc);
    } else {
        for (var j = 0u; j < 4u; j++) {
            if (ox0 + j < p.out_w) {
                st_out(o + j, acc[j]);
            }
        }
    }
}

fn conv_nhwc(item: u32) {
    let qn = (p.out_c + 3u) / 4u;
    let oc0 = (item % qn) * 4u;
    var rest = item / qn;
    let ox = rest % p.out_w;
    rest = rest / p.out_w;
    let oy = rest % p.out_h;
    let n = rest / p.out_h;
    let taps = p.kh * p.kw;
    var acc = vec4<f32>(0.0);
    for (var ky = 0u; ky < p.kh; ky++) {
        let py = oy * p.stride_h + ky * p.dil_h;
        if (py < p.pad_top || py - p.pad_top >= p.height) {
            continue;
        }
        for (var kx = 0u; kx < p.kw; kx++) {
            let px = ox * p.stride_w + kx * p.dil_w;
            if (px < p.pad_left || px - p.pad_left >= p.width) {
                continue;
            }
            let pix = p.in_off + ((n * p.height + py - p.pad_top) * p.width + px - p.pad_left) * p.channels;
            let tap = ky * p.kw + kx;
            if ((p.flags & IN_VEC) != 0u) {
                let x = ld4_input((pix + oc0) >> 2u);
                let wb = p.w_off + tap;
                let w = vec4<f32>(ld_weight(wb + oc0 * taps), ld_weight(wb + (oc0 + 1u) * taps),
                    ld_weight(wb + (oc0 + 2u) * taps), ld_weight(wb + (oc0 + 3u) * taps));
                acc = fma(x, w, acc);
            } else {
                for (var j = 0u; j < 4u; j++) {
                    let oc = oc0 + j;
                    if (oc < p.out_c) {
                        acc[j] = fma(ld_input(pix + oc / p.mult), ld_weight(p.w_off + oc * taps + tap), acc[j]);
                    }
                }
            }
        }
    }
    if ((p.flags & HAS_BIAS) != 0u) {
        for (var j = 0u; j < 4u; j++) {
            if (oc0 + j < p.out_c) {
                acc[j] = acc[j] + ld_bias(p.b_off + oc0 + j);
            }
        }
    }
    acc = apply_act4(acc, p.act);
    let o = p.o_off + ((n * p.out_h + oy) * p.out_w + ox) * p.out_c + oc0;
    if ((p.flags & OUT_VEC) != 0u) {
        st4_out(o >> 2u, acc);
    } else {
        for (var j = 0u; j < 4u; j++) {
            if (oc0 + j < p.out_c) {
                st_out(o + j, acc[j]);
            }
        }
    }
}

@compute @workgroup_size(WG, 1, 1)
fn depthwise_conv2d(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let item = folded_group(wid, nwg) * WG + li;
    if (item >= p.items) {
        return;
    }
    if (p.nhwc == 0u) {
        conv_nchw(item);
    } else {
        conv_nhwc(item);
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
@group(0) @binding(0) var<storage, read> input: array<vec4<f32>>;
fn ld_input(i: u32) -> f32 { return (input[i >> 2u][i & 3u]); }
fn ld4_input(v: u32) -> vec4<f32> { return (input[v]); }
@group(0) @binding(1) var<storage, read> weight: array<vec4<f32>>;
fn ld_weight(i: u32) -> f32 { return (weight[i >> 2u][i & 3u]); }
fn ld4_weight(v: u32) -> vec4<f32> { return (weight[v]); }
@group(0) @binding(2) var<storage, read> bias: array<vec4<f32>>;
fn ld_bias(i: u32) -> f32 { return (bias[i >> 2u][i & 3u]); }
fn ld4_bias(v: u32) -> vec4<f32> { return (bias[v]); }
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;
fn ld_out(i: u32) -> f32 { return (out[i >> 2u][i & 3u]); }
fn ld4_out(v: u32) -> vec4<f32> { return (out[v]); }
fn st_out(i: u32, x: f32) { out[i >> 2u][i & 3u] = x; }
fn st4_out(v: u32, x: vec4<f32>) { out[v] = x; }
// ---- END GENERATED ----
