// Copy: the bandwidth roof the bench compares memory-bound kernels with. It moves raw 32-bit
// words whatever the dtype (no conversion, so every bit pattern survives): one vec4<u32>
// (16 bytes) per invocation, the widest load WGSL has. A trailing half word (an odd number of
// 16-bit elements) is merged into the destination word by the one invocation that owns it.

// 64 invocations (1 KiB) per workgroup.
override WG: u32 = 64u;

struct CopyParams {
    // Whole 32-bit words to copy.
    words: u32,
    // 1 when a 16-bit element follows the whole words (odd f16/bf16 length).
    tail_half: u32,
    // Invocations needed: ceil((words + tail_half) / 4).
    items: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@group(0) @binding(2) var<uniform> p: CopyParams;

@compute @workgroup_size(WG, 1, 1)
fn copy(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let g = folded_group(wid, nwg) * WG + li;
    if (g >= p.items) {
        return;
    }
    let w0 = g * 4u;
    if (w0 + 4u <= p.words) {
        dst[g] = src[g];
        return;
    }
    for (var w = w0; w < min(w0 + 4u, p.words); w++) {
        dst[w >> 2u][w & 3u] = src[w >> 2u][w & 3u];
    }
    let t = p.words;
    if (p.tail_half != 0u && t >= w0 && t < w0 + 4u) {
        let old = dst[t >> 2u][t & 3u];
        dst[t >> 2u][t & 3u] = (old & 0xffff0000u) | (src[t >> 2u][t & 3u] & 0xffffu);
    }
}
