// Tiled matmul with a fused epilogue:
//   out = act(alpha * op(A) * op(B) + bias[j] + beta * C)     (see `MatmulDesc`)
//
// Design (the classic register-blocked SGEMM, as in siboehm's SGEMM_CUDA kernels 5-6 and
// wgpu/burn matmul shaders):
// - A workgroup of WG_X x WG_Y invocations owns a BM x BN block of the output, BM = 4 WG_Y and
//   BN = 4 WG_X (64 x 64 with the default 16 x 16 invocations).
// - Each invocation owns a 4 x 4 register tile (`acc`, four vec4 rows): per k step it reads one
//   vec4 of A and one vec4 of B from workgroup memory and does 16 FMAs, so workgroup-memory
//   traffic is 8 floats per 16 FMAs instead of 2 per 1.
// - The K loop walks BK-deep slabs (16 by default). Each slab of op(A) (BM x BK) and op(B)
//   (BK x BN) is staged in workgroup memory, stored k-major (`As[k][m]`, `Bs[k][n]`) so the
//   inner loop reads contiguous vec4s for both operands whatever the transposes.
// - Global loads are 4 consecutive elements of the *stored* matrix (along its rows), issued
//   as one vec4 load when the view is 16-byte aligned (offset, batch stride and ld multiples
//   of 4: the host sets the A_VEC/B_VEC flags) and the 4 elements are inside the matrix;
//   otherwise 4 guarded scalar loads with zero fill. Zero fill makes every M, N, K correct,
//   including K = 0 (no slab: the epilogue of zeros).
// - Rows of the workgroup arrays are padded by 4 floats (one vec4): it keeps every row 16-byte
//   aligned for the vec4 reads and shifts the banks of the transposing scalar stores of
//   row-major A (without it the 4 invocations writing one A row hit the same bank).
// - The epilogue runs once per output, in registers, and stores a vec4 where the output view
//   is aligned (O_VEC) and the 4 columns are inside N.
// - Precision::Bf16 (flag PREC_BF16): A and B values are rounded to bf16 (nearest even, bit
//   operations) when staged, and the products are summed in f32: an emulation of what tensor
//   cores do, bit-compatible with the CPU reference's rounding.
// - Grid: x = column blocks, y = row blocks, z = batches of this launch (the host splits
//   batches over launches of at most 65535 and passes `batch_base`).

// Invocations per workgroup along N (x) and M (y). 16 x 16 = 256, the WebGPU default maximum
// invocations per workgroup; part of the pipeline-cache key.
override WG_X: u32 = 16u;
override WG_Y: u32 = 16u;
// Depth of a K slab. 16 keeps both slabs at 16 x 68 floats (8.5 KiB together, under the
// 16 KiB WebGPU minimum of workgroup storage) while giving 16 FMAs per vec4 pair loaded.
override BK: u32 = 16u;

// Register tile per invocation: 4 x 4 (four vec4 accumulators). A `const` because
// function-scope arrays need a constant size.
const TM: u32 = 4u;
const TN: u32 = 4u;
// Row padding of the workgroup arrays, in vec4s (see above).
const PAD4: u32 = 1u;

const A_VEC: u32 = 1u;
const B_VEC: u32 = 2u;
const O_VEC: u32 = 4u;
const PREC_BF16: u32 = 8u;
const HAS_BIAS: u32 = 16u;
const HAS_C: u32 = 32u;

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

// Row length of the staged slabs in vec4s: BM / 4 + PAD4 and BN / 4 + PAD4.
override ROW_A4: u32 = WG_Y * TM / 4u + PAD4;
override ROW_B4: u32 = WG_X * TN / 4u + PAD4;
override AS_LEN: u32 = BK * ROW_A4;
override BS_LEN: u32 = BK * ROW_B4;

var<workgroup> As: array<vec4<f32>, AS_LEN>;
var<workgroup> Bs: array<vec4<f32>, BS_LEN>;

fn stage(v: f32) -> f32 {
    if ((p.flags & PREC_BF16) != 0u) {
        return round_bf16(v);
    }
    return v;
}

// Four consecutive elements of stored A, row `r`, columns `c0..c0+4`, zero outside.
fn load4_a(base: u32, rows: u32, cols: u32, r: u32, c0: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (r >= rows || c0 >= cols) {
        return v;
    }
    let idx = base + r * p.a_ld + c0;
    if ((p.flags & A_VEC) != 0u && c0 + 4u <= cols) {
        v = ld4_a(idx >> 2u);
    } else {
        for (var j = 0u; j < 4u; j++) {
            if (c0 + j < cols) {
                v[j] = ld_a(idx + j);
            }
        }
    }
    if ((p.flags & PREC_BF16) != 0u) {
        v = vec4<f32>(round_bf16(v.x), round_bf16(v.y), round_bf16(v.z), round_bf16(v.w));
    }
    return v;
}

fn load4_b(base: u32, rows: u32, cols: u32, r: u32, c0: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (r >= rows || c0 >= cols) {
        return v;
    }
    let idx = base + r * p.b_ld + c0;
    if ((p.flags & B_VEC) != 0u && c0 + 4u <= cols) {
        v = ld4_b(idx >> 2u);
    } else {
        for (var j = 0u; j < 4u; j++) {
            if (c0 + j < cols) {
                v[j] = ld_b(idx + j);
            }
        }
    }
    if ((p.flags & PREC_BF16) != 0u) {
        v = vec4<f32>(round_bf16(v.x), round_bf16(v.y), round_bf16(v.z), round_bf16(v.w));
    }
    return v;
}

@compute @workgroup_size(WG_X, WG_Y, 1)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let bm = WG_Y * TM;
    let bn = WG_X * TN;
    let m0 = wid.y * bm;
    let n0 = wid.x * bn;
    let bt = p.batch_base + wid.z;
    let tx = lid.x;
    let ty = lid.y;
    let flat = ty * WG_X + tx;
    let threads = WG_X * WG_Y;

    let a_base = p.a_off + bt * p.a_bs;
    let b_base = p.b_off + bt * p.b_bs;
    // Stored shapes: A is M x K (K x M transposed), B is K x N (N x K transposed).
    var a_rows = p.m;
    var a_cols = p.k;
    if (p.trans_a != 0u) {
        a_rows = p.k;
        a_cols = p.m;
    }
    var b_rows = p.k;
    var b_cols = p.n;
    if (p.trans_b != 0u) {
        b_rows = p.n;
        b_cols = p.k;
    }

    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < TM; i++) {
        acc[i] = vec4<f32>(0.0);
    }

    let slabs = (p.k + BK - 1u) / BK;
    for (var s = 0u; s < slabs; s++) {
        let k0 = s * BK;
        // Stage op(A)[m0.., k0..] into As[k][m]: BM x BK elements, one vec4 of stored A per step.
        for (var v = flat; v < bm * BK / 4u; v += threads) {
            if (p.trans_a == 0u) {
                // Stored rows are m, columns k: a vec4 runs along k and is scattered into 4 rows.
                let r = v / (BK / 4u);
                let c = (v % (BK / 4u)) * 4u;
                let x = load4_a(a_base, a_rows, a_cols, m0 + r, k0 + c);
                for (var j = 0u; j < 4u; j++) {
                    As[(c + j) * ROW_A4 + r / 4u][r % 4u] = x[j];
                }
            } else {
                // Stored rows are k, columns m: a vec4 runs along m, one vec4 store.
                let r = v / (bm / 4u);
                let c = (v % (bm / 4u)) * 4u;
                As[r * ROW_A4 + c / 4u] = load4_a(a_base, a_rows, a_cols, k0 + r, m0 + c);
            }
        }
        // Stage op(B)[k0.., n0..] into Bs[k][n].
        for (var v = flat; v < bn * BK / 4u; v += threads) {
            if (p.trans_b == 0u) {
                let r = v / (bn / 4u);
                let c = (v % (bn / 4u)) * 4u;
                Bs[r * ROW_B4 + c / 4u] = load4_b(b_base, b_rows, b_cols, k0 + r, n0 + c);
            } else {
                let r = v / (BK / 4u);
                let c = (v % (BK / 4u)) * 4u;
                let x = load4_b(b_base, b_rows, b_cols, n0 + r, k0 + c);
                for (var j = 0u; j < 4u; j++) {
                    Bs[(c + j) * ROW_B4 + r / 4u][r % 4u] = x[j];
                }
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let av = As[kk * ROW_A4 + ty];
            let bv = Bs[kk * ROW_B4 + tx];
            acc[0] = fma(vec4<f32>(av.x), bv, acc[0]);
            acc[1] = fma(vec4<f32>(av.y), bv, acc[1]);
            acc[2] = fma(vec4<f32>(av.z), bv, acc[2]);
            acc[3] = fma(vec4<f32>(av.w), bv, acc[3]);
        }
        workgroupBarrier();
    }

    // Fused epilogue, once per output.
    let col0 = n0 + tx * TN;
    if (col0 >= p.n) {
        return;
    }
    let full = col0 + 4u <= p.n;
    var bias = vec4<f32>(0.0);
    if ((p.flags & HAS_BIAS) != 0u) {
        for (var j = 0u; j < 4u; j++) {
            if (col0 + j < p.n) {
                bias[j] = ld_bias(p.bias_off + col0 + j);
            }
        }
    }
    for (var i = 0u; i < TM; i++) {
        let row = m0 + ty * TM + i;
        if (row >= p.m) {
            break;
        }
        var v = p.alpha * acc[i] + bias;
        if ((p.flags & HAS_C) != 0u) {
            let cidx = p.c_off + bt * p.c_bs + row * p.c_ld + col0;
            var cv = vec4<f32>(0.0);
            for (var j = 0u; j < 4u; j++) {
                if (col0 + j < p.n) {
                    cv[j] = ld_c(cidx + j);
                }
            }
            v = v + p.beta * cv;
        }
        v = apply_act4(v, p.act);
        let oidx = p.o_off + bt * p.o_bs + row * p.o_ld + col0;
        if ((p.flags & O_VEC) != 0u && full) {
            st4_out(oidx >> 2u, v);
        } else {
            for (var j = 0u; j < 4u; j++) {
                if (col0 + j < p.n) {
                    st_out(oidx + j, v[j]);
                }
            }
        }
    }
}
