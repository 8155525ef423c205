// Depthwise 2-D convolution with fused bias and activation (see `Conv2dDesc`): output channel
// oc reads input channel oc / multiplier through its own kh x kw filter.
//
// Two entry points. `depthwise_tiled` (below) stages an input tile plus halo in workgroup
// memory; the backends take it wherever its patch fits. `depthwise_conv2d` is the general
// kernel for the rest (NHWC with a multiplier > 1, patches over the workgroup arrays, more
// taps than they hold): depthwise convolution does ~2 FLOP per byte, so it aims at few, wide
// memory transactions and reuse through the cache (taps are read directly).
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
    // Weight strides: element (oc, tap) is at w_off + oc * w_ch + tap * w_tap, so one kernel
    // reads both the `[C*m, 1, kh, kw]` layout (w_ch = kh*kw, w_tap = 1) and the pre-packed
    // `[kh, kw, C*m]` one (w_ch = 1, w_tap = C*m).
    w_tap: u32,
    w_ch: u32,
    // The tiled entry point only (see `depthwise_tiled`): output rows per tile, the staged
    // patch's rows and width (NCHW: in vec4s; NHWC: in pixels), the first z of this launch
    // (grids over 65535 in z are split over launches) and the 16-channel blocks per image (NHWC).
    tile_h: u32,
    patch_h: u32,
    patch_w: u32,
    z_base: u32,
    c_blocks: u32,
    _pad: u32,
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
    let w_base = p.w_off + oc * p.w_ch;
    var acc = vec4<f32>(0.0);
    for (var ky = 0u; ky < p.kh; ky++) {
        let py = oy * p.stride_h + ky * p.dil_h;
        if (py < p.pad_top || py - p.pad_top >= p.height) {
            continue;
        }
        let row = in_base + (py - p.pad_top) * p.width;
        for (var kx = 0u; kx < p.kw; kx++) {
            let w = ld_weight(w_base + (ky * p.kw + kx) * p.w_tap);
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
                let wb = p.w_off + tap * p.w_tap;
                let w = vec4<f32>(ld_weight(wb + oc0 * p.w_ch), ld_weight(wb + (oc0 + 1u) * p.w_ch),
                    ld_weight(wb + (oc0 + 2u) * p.w_ch), ld_weight(wb + (oc0 + 3u) * p.w_ch));
                acc = fma(x, w, acc);
            } else {
                for (var j = 0u; j < 4u; j++) {
                    let oc = oc0 + j;
                    if (oc < p.out_c) {
                        acc[j] = fma(ld_input(pix + oc / p.mult), ld_weight(p.w_off + oc * p.w_ch + tap * p.w_tap), acc[j]);
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

// ---- The tiled kernel (entry `depthwise_tiled`) ----
// A 3-D grid: x = output column tiles, y = output row tiles, z = (image, channel block) from
// `z_base` on. Each workgroup stages the input patch its outputs reach (the tile plus its halo)
// and the filter taps of its channels in workgroup memory once, then every invocation reads
// its taps from there: each input element is loaded from memory once per workgroup instead of
// once per tap. The workgroup decodes its position with one division (z); an invocation's
// place in the tile is bit fields of its local index, so there is no per-element div/mod chain.
// - NCHW: one output channel per workgroup, a tile of TILE_ROWS x 32 outputs; invocation
//   (row = li >> 3, x4 = li & 7) computes 4 consecutive outputs of one row (one vec4 store).
//   The patch is staged as vec4s of 4 input columns starting at a 16-byte-aligned column, so
//   with W a multiple of 4 every staging load is one vec4 (wholly inside the row or wholly in
//   the padding). Any multiplier works: the workgroup reads input channel oc / m.
// - NHWC (multiplier 1): a tile of tile_h x 8 pixels x 16 channels; invocation (slot = li >> 2,
//   c4 = li & 3) owns 4 channels and walks the tile's pixels 16 apart. With C a multiple of 4
//   the staging loads and output stores are vec4s of 4 channels; with pre-packed weights
//   (`[kh, kw, C]`, w_ch = 1) the taps of 4 channels are one vec4 load too.
// Padded taps are skipped, not multiplied by zero, so an Inf weight meets only real inputs
// (as in the reference). The host (`backend/wgpu/depthwise.rs`) picks tile_h so the patch fits
// PATCH_VEC4 and falls back to `depthwise_conv2d` where it does not, or where the taps do not
// fit `wtile` (256 in NCHW, one per vec4; 64 in NHWC, four vec4s each).

// Invocations per workgroup of the tiled kernel: 64 (two 32-wide subgroups); the bit fields
// below assume it.
const TILED_WG: u32 = 64u;
// NCHW output tile: 8 rows (li >> 3) of 8 vec4s (li & 7), i.e. 8 x 32 outputs.
const TILE_ROWS: u32 = 8u;
const NCHW_TILE_W: u32 = 32u;
// NHWC output tile: 8 columns (q & 7), tile_h rows, 16 channels (4 vec4s).
const NHWC_TILE_W: u32 = 8u;
const NHWC_TILE_C: u32 = 16u;
// The patch: 768 vec4<f32> = 12 KiB, and the taps: 256 vec4<f32> = 4 KiB, together the
// 16 KiB every WebGPU device offers. 768 holds MobileNetV2's largest patch (stride 2, NCHW:
// 17 rows x 17 vec4s = 289; NHWC with tile_h 4: 9 x 17 pixels x 4 = 612).
const PATCH_VEC4: u32 = 768u;
const W_VEC: u32 = 8u;

var<workgroup> halo: array<vec4<f32>, 768>;
var<workgroup> wtile: array<vec4<f32>, 256>;

fn tiled_nchw(wid: vec3<u32>, li: u32) {
    let x4 = li & 7u;
    let row = li >> 3u;
    let ox0 = wid.x * NCHW_TILE_W;
    let oy0 = wid.y * TILE_ROWS;
    let z = wid.z + p.z_base;
    let oc = z % p.out_c;
    let n = z / p.out_c;
    let plane = p.in_off + (n * p.channels + oc / p.mult) * p.height * p.width;
    let taps = p.kh * p.kw;
    for (var t = li; t < taps; t += TILED_WG) {
        wtile[t] = vec4<f32>(ld_weight(p.w_off + oc * p.w_ch + t * p.w_tap), 0.0, 0.0, 0.0);
    }
    // Patch origin in input coordinates, its columns from the aligned xa on.
    let ys = i32(oy0 * p.stride_h) - i32(p.pad_top);
    let xs = i32(ox0 * p.stride_w) - i32(p.pad_left);
    let xa = xs & -4;
    let shift = u32(xs - xa);
    let h = i32(p.height);
    let w = i32(p.width);
    for (var r = row; r < p.patch_h; r += TILE_ROWS) {
        let iy = ys + i32(r);
        let row_ok = iy >= 0 && iy < h;
        let base = plane + u32(max(iy, 0)) * p.width;
        for (var v = x4; v < p.patch_w; v += 8u) {
            let ix = xa + i32(v * 4u);
            var val = vec4<f32>(0.0);
            if (row_ok) {
                if ((p.flags & IN_VEC) != 0u) {
                    if (ix >= 0 && ix < w) {
                        val = ld4_input((base + u32(ix)) >> 2u);
                    }
                } else {
                    for (var j = 0; j < 4; j++) {
                        let x = ix + j;
                        if (x >= 0 && x < w) {
                            val[j] = ld_input(base + u32(x));
                        }
                    }
                }
            }
            halo[r * p.patch_w + v] = val;
        }
    }
    workgroupBarrier();
    let oy = oy0 + row;
    let oxb = ox0 + x4 * 4u;
    if (oy >= p.out_h || oxb >= p.out_w) {
        return;
    }
    var acc = vec4<f32>(0.0);
    for (var ky = 0u; ky < p.kh; ky++) {
        let pr = row * p.stride_h + ky * p.dil_h;
        let iy = ys + i32(pr);
        if (iy < 0 || iy >= h) {
            continue;
        }
        let prow = pr * p.patch_w;
        for (var kx = 0u; kx < p.kw; kx++) {
            let f = wtile[ky * p.kw + kx].x;
            for (var j = 0u; j < 4u; j++) {
                let pc = (x4 * 4u + j) * p.stride_w + kx * p.dil_w + shift;
                let ix = xa + i32(pc);
                if (ix >= 0 && ix < w) {
                    acc[j] = fma(halo[prow + (pc >> 2u)][pc & 3u], f, acc[j]);
                }
            }
        }
    }
    if ((p.flags & HAS_BIAS) != 0u) {
        acc = acc + vec4<f32>(ld_bias(p.b_off + oc));
    }
    acc = apply_act4(acc, p.act);
    let o = p.o_off + ((n * p.out_c + oc) * p.out_h + oy) * p.out_w + oxb;
    if ((p.flags & OUT_VEC) != 0u) {
        st4_out(o >> 2u, acc);
    } else {
        for (var j = 0u; j < 4u; j++) {
            if (oxb + j < p.out_w) {
                st_out(o + j, acc[j]);
            }
        }
    }
}

fn tiled_nhwc(wid: vec3<u32>, li: u32) {
    let c4 = li & 3u;
    let slot = li >> 2u;
    let ox0 = wid.x * NHWC_TILE_W;
    let oy0 = wid.y * p.tile_h;
    let z = wid.z + p.z_base;
    let cb = z % p.c_blocks;
    let n = z / p.c_blocks;
    let c0 = cb * NHWC_TILE_C;
    let c = c0 + c4 * 4u;
    let taps = p.kh * p.kw;
    // Taps of the block's 16 channels: wtile[tap * 4 + group].
    for (var e = li; e < taps * 4u; e += TILED_WG) {
        let t = e >> 2u;
        let ch = c0 + (e & 3u) * 4u;
        var f = vec4<f32>(0.0);
        if ((p.flags & W_VEC) != 0u) {
            if (ch < p.out_c) {
                f = ld4_weight((p.w_off + t * p.w_tap + ch) >> 2u);
            }
        } else {
            for (var j = 0u; j < 4u; j++) {
                if (ch + j < p.out_c) {
                    f[j] = ld_weight(p.w_off + (ch + j) * p.w_ch + t * p.w_tap);
                }
            }
        }
        wtile[e] = f;
    }
    let ys = i32(oy0 * p.stride_h) - i32(p.pad_top);
    let xs = i32(ox0 * p.stride_w) - i32(p.pad_left);
    let h = i32(p.height);
    let w = i32(p.width);
    let img = p.in_off + n * p.height * p.width * p.channels;
    for (var r = 0u; r < p.patch_h; r++) {
        let iy = ys + i32(r);
        let row_ok = iy >= 0 && iy < h;
        for (var x = slot; x < p.patch_w; x += 16u) {
            let ix = xs + i32(x);
            var val = vec4<f32>(0.0);
            if (row_ok && ix >= 0 && ix < w) {
                let pix = img + (u32(iy) * p.width + u32(ix)) * p.channels + c;
                if ((p.flags & IN_VEC) != 0u) {
                    if (c < p.channels) {
                        val = ld4_input(pix >> 2u);
                    }
                } else {
                    for (var j = 0u; j < 4u; j++) {
                        if (c + j < p.channels) {
                            val[j] = ld_input(pix + j);
                        }
                    }
                }
            }
            halo[(r * p.patch_w + x) * 4u + c4] = val;
        }
    }
    workgroupBarrier();
    if (c >= p.out_c) {
        return;
    }
    var b = vec4<f32>(0.0);
    if ((p.flags & HAS_BIAS) != 0u) {
        for (var j = 0u; j < 4u; j++) {
            if (c + j < p.out_c) {
                b[j] = ld_bias(p.b_off + c + j);
            }
        }
    }
    for (var q = slot; q < p.tile_h * NHWC_TILE_W; q += 16u) {
        let ty = q >> 3u;
        let tx = q & 7u;
        let oy = oy0 + ty;
        let ox = ox0 + tx;
        if (oy >= p.out_h || ox >= p.out_w) {
            continue;
        }
        var acc = vec4<f32>(0.0);
        for (var ky = 0u; ky < p.kh; ky++) {
            let pr = ty * p.stride_h + ky * p.dil_h;
            let iy = ys + i32(pr);
            if (iy < 0 || iy >= h) {
                continue;
            }
            for (var kx = 0u; kx < p.kw; kx++) {
                let pc = tx * p.stride_w + kx * p.dil_w;
                let ix = xs + i32(pc);
                if (ix < 0 || ix >= w) {
                    continue;
                }
                acc = fma(halo[(pr * p.patch_w + pc) * 4u + c4], wtile[(ky * p.kw + kx) * 4u + c4], acc);
            }
        }
        if ((p.flags & HAS_BIAS) != 0u) {
            acc = acc + b;
        }
        acc = apply_act4(acc, p.act);
        let o = p.o_off + ((n * p.out_h + oy) * p.out_w + ox) * p.out_c + c;
        if ((p.flags & OUT_VEC) != 0u) {
            st4_out(o >> 2u, acc);
        } else {
            for (var j = 0u; j < 4u; j++) {
                if (c + j < p.out_c) {
                    st_out(o + j, acc[j]);
                }
            }
        }
    }
}

@compute @workgroup_size(64, 1, 1)
fn depthwise_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    if (p.nhwc == 0u) {
        tiled_nchw(wid, li);
    } else {
        tiled_nhwc(wid, li);
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
