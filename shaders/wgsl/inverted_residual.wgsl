// The fused inverted-residual block (see `InvertedResidualDesc`): expand 1x1 + ReLU6,
// depthwise 3x3 (padding 1, stride 1 or 2) + ReLU6, projection 1x1, residual; the expanded
// tensor never leaves the workgroup.
//
// Design: a workgroup owns a TW x TH tile of output pixels of one image and a block of OB
// output channels (grid: x = tiles, y = output-channel blocks, z = images). It walks the
// hidden channels in chunks of HC:
// 1. the chunk's expanded activations over the tile's input footprint (the tile and its
//    3x3 halo: ((TH-1)s+3) x ((TW-1)s+3) pixels) are computed into workgroup memory
//    (`e_s`), zero in the padding, and the chunk's projection weights are staged (`wp_s`);
// 2. the depthwise filter + ReLU6 of the chunk for every output pixel goes to `f_s`;
// 3. each invocation adds the chunk's projection onto its OPI accumulators in registers (one
//    pixel, OPI consecutive output channels).
// After the last chunk each invocation adds bias and residual and stores its outputs. Only
// the input, the weights and the output touch memory. Output-channel blocks recompute the
// expand and depthwise stages of their tile (ceil(C'/OB) times), the price of keeping the
// projection's accumulators in registers; OB = 64 keeps that at most 5x for MobileNetV2.
//
// Tile constants (fixed; workgroup storage 15,936 bytes, under WebGPU's 16 KiB minimum):
// TW x TH = 8 x 4 = 32 output pixels, two invocations per pixel (64 = two 32-wide subgroups);
// HC = 16 hidden channels per chunk; OPI = 32 accumulators per invocation, OB = 2 x OPI = 64.

const TW: u32 = 8u;
const TH: u32 = 4u;
const TP: u32 = 32u; // TW * TH
const HC: u32 = 16u;
const OPI: u32 = 32u;
const OB: u32 = 64u;
const WG: u32 = 64u;
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

var<workgroup> e_s: array<f32, 2448>; // MAX_FOOT * HC
var<workgroup> f_s: array<f32, 512>;  // TP * HC
var<workgroup> wp_s: array<f32, 1024>; // OB * HC

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

@compute @workgroup_size(64)
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
    // This invocation's pixel and output channels.
    let px = lid % TP;
    let og = ob0 + (lid / TP) * OPI;
    let oy = oy0 + px / TW;
    let ox = ox0 + px % TW;
    var acc: array<f32, 32>; // OPI
    for (var k = 0u; k < OPI; k++) {
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
        for (var i = lid; i < OB * HC; i += WG) {
            let o = ob0 + i / HC;
            let j = j0 + i % HC;
            var w = 0.0;
            if (o < p.out_c && j < p.hidden) {
                w = ld_wp(o * p.hidden + j);
            }
            wp_s[i] = w;
        }
        workgroupBarrier();
        // 2. Depthwise + ReLU6 for every pixel of the tile.
        for (var i = lid; i < TP * HC; i += WG) {
            let t = i / HC;
            let jj = i % HC;
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
            f_s[i] = relu6(a);
        }
        workgroupBarrier();
        // 3. The chunk's projection onto this invocation's accumulators.
        let wrow = (lid / TP) * OPI;
        for (var jj = 0u; jj < HC; jj++) {
            let f = f_s[px * HC + jj];
            for (var k = 0u; k < OPI; k++) {
                acc[k] += f * wp_s[(wrow + k) * HC + jj];
            }
        }
        workgroupBarrier();
    }
    if (oy >= p.out_h || ox >= p.out_w) {
        return;
    }
    for (var k = 0u; k < OPI; k++) {
        let o = og + k;
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

