// Elementwise activation with a broadcast bias: out[i] = act(x[i] + bias[i % bias_len]).
//
// Each invocation handles 4 consecutive elements: one vec4 load of x (a 16-byte load for f32,
// 8 bytes for f16 and bf16), one vec4 load of the bias when bias_len is a multiple of 4 (the 4
// elements then share one bias row segment), one vec4 store. The last, partial group of 4 is
// done element by element. The in-place variant binds only `out` and reads x from it (a buffer
// may not be bound read-only and read-write in one dispatch); each invocation reads its own
// elements before it writes them, so in place is race-free.

// 64 invocations (256 elements) per workgroup: a memory-bound kernel needs no more.
override WG: u32 = 64u;

const HAS_BIAS: u32 = 1u;
const BIAS_VEC: u32 = 2u;

struct ActivationParams {
    len: u32,
    bias_len: u32,
    act: u32,
    flags: u32,
    items: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(3) var<uniform> p: ActivationParams;

@compute @workgroup_size(WG, 1, 1)
fn activation(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let g = folded_group(wid, nwg) * WG + li;
    if (g >= p.items) {
        return;
    }
    let i0 = g * 4u;
    if (i0 + 4u <= p.len) {
        var v = ld4_x(g);
        if ((p.flags & HAS_BIAS) != 0u) {
            let b0 = i0 % p.bias_len;
            if ((p.flags & BIAS_VEC) != 0u) {
                v = v + ld4_bias(b0 >> 2u);
            } else {
                for (var j = 0u; j < 4u; j++) {
                    v[j] = v[j] + ld_bias((i0 + j) % p.bias_len);
                }
            }
        }
        st4_out(g, apply_act4(v, p.act));
    } else {
        for (var i = i0; i < p.len; i++) {
            var v = ld_x(i);
            if ((p.flags & HAS_BIAS) != 0u) {
                v = v + ld_bias(i % p.bias_len);
            }
            st_out(i, apply_act(v, p.act));
        }
    }
}
