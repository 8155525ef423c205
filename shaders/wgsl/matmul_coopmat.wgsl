enable f16;
enable wgpu_cooperative_matrix;

// Matmul with a fused epilogue on cooperative matrices (f16 storage only):
//   out = act(alpha * op(A) * op(B) + bias[j] + beta * C)     (see `MatmulDesc`)
// Same parameter block, bindings and `override` switches as `matmul.wgsl`; the catalogue builds
// it as `Kernel::MatmulCoop` (`catalogue/wgsl/coopmat.rs`) and the wgpu backend picks it only
// where the device has `wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX` and reports an S x S x S
// configuration with f16 A/B and an f32 accumulator (`coopmat::choose`).
//
// STATUS: compiled and validated; run once, on an H200 through NVIDIA's Vulkan driver (16 x 16
// tiles), where it matched the reference; not timed (lavapipe has no cooperative matrices, so
// CI runs the fallback only). Checked: naga parse + validate with the
// capabilities the features give, `process_overrides`, SPIR-V 1.6 output with the
// cooperative-matrix ops and `spirv-val --target-env vulkan1.3` (`backend/wgpu/tests/coop.rs`);
// the alignment of every cooperative load and store (`coopmat::tests`).
//
// What the extension allows (naga 30, `enable wgpu_cooperative_matrix`): square tiles only,
// `coop_mat8x8<T, R>` and `coop_mat16x16<T, R>`, T in {f16, f32}, role R in {A, B, C};
// `coopLoad`/`coopLoadT` (column- / row-major, stride in elements) from storage or workgroup
// memory, `coopStore`/`coopStoreT`, `coopMultiplyAdd(a, b, c)` = a * b + c with the type of c.
// The validator accepts f16 A and B with an f32 C, and wgpu reports per adapter which
// (M, N, K, AB type, C type) configurations the driver runs. So: f16 A/B tiles, f32
// accumulators — every f16 x f16 product is exact in f32 and the sums are f32, which is the
// `Precision::Highest` rule (f32 accumulation) that every other tilekit kernel follows.
//
// Design:
// - Coop tile S x S x S, S = 16 (`const S`; the catalogue swaps the type names and S for the
//   8 x 8 variant, which Metal's simdgroup matrices give). A workgroup is 4 subgroups
//   (WG = 4 x the subgroup size, an `override`; the backend picks this kernel only on devices
//   with one fixed subgroup size, so `subgroup_id` is 0..3) and owns a BM x BN = 4S x 4S output
//   block (64 x 64): subgroup g owns the 2S x 2S quadrant (g / 2, g % 2) as 2 x 2 coop
//   accumulators in registers.
// - The K loop walks BK = 2S deep slabs. Each slab of op(A) (BM x BK) and op(B) (BK x BN) is
//   staged in workgroup memory as f16, row-major (`As[m][k]`, `Bs[k][n]`), by all WG
//   invocations with guarded scalar loads (zero outside the matrix, so every M, N, K is right,
//   K = 0 included); consecutive invocations read consecutive elements of a stored row. The
//   values are f16 already (f16 storage), so the f16 conversion is exact.
// - Per slab each subgroup does BK / S steps of 2 A loads, 2 B loads and 4 coopMultiplyAdd.
//   Every cooperative load and store starts at a multiple of 16 bytes with a stride that is one
//   (Vulkan wants the lesser of 16 bytes and a row): offsets are multiples of S elements, the
//   strides BK, BN and S (`every_cooperative_access_is_aligned` mirrors them).
// - Epilogue: each accumulator is stored (`coopStoreT`) to the subgroup's S x S f32 patch of
//   workgroup memory (`Cs`), and the subgroup's own invocations read it back element by element
//   (consecutive lanes take consecutive columns) and apply alpha, bias, beta * C and the
//   activation in f32 exactly as `matmul.wgsl` orders them, then store with the f16 rounding
//   of the storage prelude. The patches are reused for the 4 accumulators one after another,
//   so workgroup memory stays at 2 x 4 KiB (slabs) + 4 KiB (patches) = 12 KiB for S = 16
//   (`CoopSize::workgroup_bytes`), under the 16 KiB WebGPU minimum.
// - Cooperative operations must run in uniform control flow: every loop around them has a
//   trip count from the parameter block, and the barriers between the stores to `Cs` and the
//   reads are executed by the whole workgroup.
// - Grid: x = column blocks, y = row blocks, z = batches of this launch (as `matmul.wgsl`).

// Invocations per workgroup: 4 subgroups (4 x the device's fixed subgroup size).
override WG: u32 = 128u;

// The switches each pipeline is specialised to (`MatmulSwitches`), as in `matmul.wgsl`.
override TRANS_A: bool = false;
override TRANS_B: bool = false;
override HAS_BIAS: bool = false;
override HAS_C: bool = false;
override ACT: u32 = 0u;

// The coop tile edge (16; 8 in the catalogue's 8 x 8 variant), the output block (2 x 2
// quadrants of 2 x 2 tiles) and the slab depth (two coop steps per barrier pair).
const S: u32 = 16u;
const BM: u32 = 4u * S;
const BN: u32 = 4u * S;
const BK: u32 = 2u * S;

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

// The staged slabs (row-major, f16) and the four subgroups' accumulator patches (f32).
var<workgroup> As: array<f16, BM * BK>;
var<workgroup> Bs: array<f16, BK * BN>;
var<workgroup> Cs: array<f32, 4u * S * S>;

// Stages the slab of op(A) and op(B) starting at k0: element e of a slab is taken by
// invocation e % WG, in the order of the stored rows so neighbouring invocations read
// neighbouring addresses.
fn stage(flat: u32, k0: u32, m0: u32, n0: u32, a_base: u32, b_base: u32) {
    for (var e = flat; e < BM * BK; e += WG) {
        var m = e / BK;
        var k = e % BK;
        if (TRANS_A) {
            k = e / BM;
            m = e % BM;
        }
        let gm = m0 + m;
        let gk = k0 + k;
        var v = 0.0;
        if (gm < p.m && gk < p.k) {
            var idx = a_base + gm * p.a_ld + gk;
            if (TRANS_A) {
                idx = a_base + gk * p.a_ld + gm;
            }
            v = ld_a(idx);
        }
        As[m * BK + k] = f16(v);
    }
    for (var e = flat; e < BK * BN; e += WG) {
        var k = e / BN;
        var n = e % BN;
        if (TRANS_B) {
            n = e / BK;
            k = e % BK;
        }
        let gk = k0 + k;
        let gn = n0 + n;
        var v = 0.0;
        if (gk < p.k && gn < p.n) {
            var idx = b_base + gk * p.b_ld + gn;
            if (TRANS_B) {
                idx = b_base + gn * p.b_ld + gk;
            }
            v = ld_b(idx);
        }
        Bs[k * BN + n] = f16(v);
    }
}

// The epilogue of one S x S accumulator tile the subgroup stored at Cs[cpatch..]: rows r0..,
// columns c0.. of the output, batch bt; lanes take consecutive columns.
fn tile_epilogue(cpatch: u32, r0: u32, c0: u32, lane: u32, lanes: u32, bt: u32) {
    for (var e = lane; e < S * S; e += lanes) {
        let row = r0 + e / S;
        let col = c0 + e % S;
        if (row < p.m && col < p.n) {
            var bias = 0.0;
            if (HAS_BIAS) {
                bias = ld_bias(p.bias_off + col);
            }
            var v = p.alpha * Cs[cpatch + e] + bias;
            if (HAS_C) {
                v = v + p.beta * ld_c(p.c_off + bt * p.c_bs + row * p.c_ld + col);
            }
            st_out(p.o_off + bt * p.o_bs + row * p.o_ld + col, apply_act(v, ACT));
        }
    }
}

@compute @workgroup_size(WG)
fn matmul_coopmat(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) flat: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) lanes: u32,
) {
    let m0 = wid.y * BM;
    let n0 = wid.x * BN;
    let bt = p.batch_base + wid.z;
    let a_base = p.a_off + bt * p.a_bs;
    let b_base = p.b_off + bt * p.b_bs;
    // This subgroup's quadrant of the block.
    let qm = (sg / 2u) * 2u * S;
    let qn = (sg % 2u) * 2u * S;

    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();

    let slabs = (p.k + BK - 1u) / BK;
    for (var s = 0u; s < slabs; s++) {
        stage(flat, s * BK, m0, n0, a_base, b_base);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += S) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&As[qm * BK + kk], BK);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&As[(qm + S) * BK + kk], BK);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&Bs[kk * BN + qn], BN);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&Bs[kk * BN + qn + S], BN);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }

    // The four accumulators through the subgroup's cpatch, one after another.
    let cpatch = sg * S * S;
    let r0 = m0 + qm;
    let c0 = n0 + qn;
    coopStoreT(c00, &Cs[cpatch], S);
    workgroupBarrier();
    tile_epilogue(cpatch, r0, c0, lane, lanes, bt);
    workgroupBarrier();
    coopStoreT(c01, &Cs[cpatch], S);
    workgroupBarrier();
    tile_epilogue(cpatch, r0, c0 + S, lane, lanes, bt);
    workgroupBarrier();
    coopStoreT(c10, &Cs[cpatch], S);
    workgroupBarrier();
    tile_epilogue(cpatch, r0 + S, c0, lane, lanes, bt);
    workgroupBarrier();
    coopStoreT(c11, &Cs[cpatch], S);
    workgroupBarrier();
    tile_epilogue(cpatch, r0 + S, c0 + S, lane, lanes, bt);
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
