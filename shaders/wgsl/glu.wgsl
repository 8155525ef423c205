// Gated linear unit: out[r, c] = act(h[r, c]) * h[r, F + c] for h of shape [rows, 2F] and out of
// shape [rows, F] (SwiGLU with act = silu: the gate half first, the up half second, as one
// matmul against the concatenated [W_gate; W_up] writes them).
//
// Each invocation handles 4 consecutive outputs. When F is a multiple of 4 (VEC) they lie in one
// row and both halves' 4 elements start on a vec4 boundary (2F and F are multiples of 4): two
// vec4 loads and one vec4 store. Otherwise they are done element by element (they may cross a
// row end). Indices stay below 2^32: the backend checks rows * 2F against the u32 range.

// 64 invocations (256 outputs) per workgroup: a memory-bound kernel needs no more.
override WG: u32 = 64u;

const VEC: u32 = 1u;

struct GluParams {
    // Output elements: rows * F.
    len: u32,
    // The width of one half (F).
    f: u32,
    act: u32,
    flags: u32,
    // Invocations that do work: ceil(len / 4).
    items: u32,
    // Element offsets of h and out in their bindings (the base of a tensor over an engine's
    // buffer). VEC is set only when both are multiples of 4.
    h_off: u32,
    o_off: u32,
    _pad0: u32,
}

@group(0) @binding(2) var<uniform> p: GluParams;

@compute @workgroup_size(WG, 1, 1)
fn glu(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let g = folded_group(wid, nwg) * WG + li;
    if (g >= p.items) {
        return;
    }
    let i0 = g * 4u;
    if ((p.flags & VEC) != 0u) {
        // len is a multiple of 4 here, so the group is whole and inside one row.
        let r = i0 / p.f;
        let gate = r * 2u * p.f + (i0 - r * p.f);
        let h0 = p.h_off + gate;
        let v = apply_act4(ld4_h(h0 >> 2u), p.act) * ld4_h((h0 + p.f) >> 2u);
        st4_out((p.o_off >> 2u) + g, v);
    } else {
        for (var i = i0; i < min(i0 + 4u, p.len); i++) {
            let r = i / p.f;
            let gate = r * 2u * p.f + (i - r * p.f);
            st_out(p.o_off + i, apply_act(ld_h(p.h_off + gate), p.act) * ld_h(p.h_off + gate + p.f));
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
@group(0) @binding(0) var<storage, read> h: array<vec4<f32>>;
fn ld_h(i: u32) -> f32 { return (h[i >> 2u][i & 3u]); }
fn ld4_h(v: u32) -> vec4<f32> { return (h[v]); }
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
fn ld_out(i: u32) -> f32 { return (out[i >> 2u][i & 3u]); }
fn ld4_out(v: u32) -> vec4<f32> { return (out[v]); }
fn st_out(i: u32, x: f32) { out[i >> 2u][i & 3u] = x; }
fn st4_out(v: u32, x: vec4<f32>) { out[v] = x; }
// ---- END GENERATED ----
