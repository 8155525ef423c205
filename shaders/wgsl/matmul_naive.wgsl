// The deliberately naive matmul the bench compares the tiled kernel with: one output per
// invocation, every operand read straight from global memory, no epilogue (out = op(A) op(B)).
// It shares `MatmulParams` with `matmul.wgsl` (views, transposes, batch) and ignores the
// epilogue fields.

// 16 x 16 invocations: the same workgroup shape as the tiled kernel, so the comparison is about
// tiling alone.
override WG_X: u32 = 16u;
override WG_Y: u32 = 16u;

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

@group(0) @binding(3) var<uniform> p: MatmulParams;

@compute @workgroup_size(WG_X, WG_Y, 1)
fn matmul_naive(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    let row = gid.y;
    if (row >= p.m || col >= p.n) {
        return;
    }
    let bt = p.batch_base + gid.z;
    let a_base = p.a_off + bt * p.a_bs;
    let b_base = p.b_off + bt * p.b_bs;
    var acc = 0.0;
    for (var q = 0u; q < p.k; q++) {
        var ai = a_base + row * p.a_ld + q;
        if (p.trans_a != 0u) {
            ai = a_base + q * p.a_ld + row;
        }
        var bi = b_base + q * p.b_ld + col;
        if (p.trans_b != 0u) {
            bi = b_base + col * p.b_ld + q;
        }
        acc = fma(ld_a(ai), ld_b(bi), acc);
    }
    st_out(p.o_off + bt * p.o_bs + row * p.o_ld + col, acc);
}
