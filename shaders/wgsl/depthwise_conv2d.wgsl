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
    let in_base = (n * p.channels + ic) * p.height * p.width;
    let w_base = oc * p.kh * p.kw;
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
        acc = acc + vec4<f32>(ld_bias(oc));
    }
    acc = apply_act4(acc, p.act);
    let o = ((n * p.out_c + oc) * p.out_h + oy) * p.out_w + ox0;
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
            let pix = ((n * p.height + py - p.pad_top) * p.width + px - p.pad_left) * p.channels;
            let tap = ky * p.kw + kx;
            if ((p.flags & IN_VEC) != 0u) {
                let x = ld4_input((pix + oc0) >> 2u);
                let w = vec4<f32>(ld_weight(oc0 * taps + tap), ld_weight((oc0 + 1u) * taps + tap),
                    ld_weight((oc0 + 2u) * taps + tap), ld_weight((oc0 + 3u) * taps + tap));
                acc = fma(x, w, acc);
            } else {
                for (var j = 0u; j < 4u; j++) {
                    let oc = oc0 + j;
                    if (oc < p.out_c) {
                        acc[j] = fma(ld_input(pix + oc / p.mult), ld_weight(oc * taps + tap), acc[j]);
                    }
                }
            }
        }
    }
    if ((p.flags & HAS_BIAS) != 0u) {
        for (var j = 0u; j < 4u; j++) {
            if (oc0 + j < p.out_c) {
                acc[j] = acc[j] + ld_bias(oc0 + j);
            }
        }
    }
    acc = apply_act4(acc, p.act);
    let o = ((n * p.out_h + oy) * p.out_w + ox) * p.out_c + oc0;
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
