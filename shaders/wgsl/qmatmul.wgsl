// Quantized matmul: out = act(alpha * op(A) * dequantize(W)^T + bias[j] + beta * C), with W a
// GGUF / llama.cpp block-quantized weight [N, K] (`QTensor`) and A in f32, f16 or bf16.
// The weights are dequantized in registers (decode kernel) or into workgroup memory (tiled
// kernel); there is never a dequantized copy in device memory. Accumulation is f32.
//
// Weight storage (`crates/dispatch/src/quant_tensor.rs`): two planes of u32 words.
// - `qscale` (binding 1): per block its f16 scale(s), in GGUF byte order. Q8_0, Q4_0, Q6_K: one
//   f16 `d` per block, two blocks per word (block g in the low half of word g / 2 when g is
//   even); Q4_1: one word per block, `d` low, `m` high; Q4_K: one word, `d` low, `dmin` high.
// - `qbody` (binding 6): per block the rest of its bytes (Q8_0: 8 words, Q4_0 / Q4_1: 4, Q4_K:
//   35 = 12 bytes of packed 6-bit scales and mins + 128 bytes of nibbles, Q6_K: 52 = ql, qh,
//   int8 scales). Block g of row n is g = n * (K / block size) + (k / block size).
// - Every format is read in *units* of 32 consecutive weights of one row: one Q8_0 / Q4_0 /
//   Q4_1 block, one Q4_K sub-block (scale and min of its own), one Q6_K quadrant (two int8
//   scales, one per 16 weights). `load_unit` reads a unit's words (as vec4<u32> where the
//   block's words are 16-byte aligned: all formats but Q4_K, whose 35-word blocks are not) and
//   scales; `unit_group(u, j)` gives weights 4j..4j+4 of it as f32, evaluated exactly as
//   `tilekit_kernels::quant::dequant` does (llama.cpp's `dequantize_row_*`): the f16 scales
//   widened with the bit-exact `f32_from_f16_bits`, then `q * d`, `(q - 8) * d`, `q * d + m`,
//   `(d * sc) * q - dmin * m`, `(d * sc) * q`.
//
// The product's switches (transposed A, bias, C, activation) are read from the parameter
// block, not specialised as `override` constants as in `matmul.wgsl`: they are uniform branches
// (A's loads, the epilogue once per output) in a memory-bound kernel, and a pipeline per switch
// set would multiply the pipelines (each a shader compile, ~0.5 s on lavapipe) by 48.
//
// Entry points (the format is the `QTYPE` override constant, one pipeline per format):
// - `qgemv_subgroup` / `qgemv` (M <= 16): as `gemv.wgsl`, a workgroup of WG invocations owns
//   QG_COLS = 4 output columns (weight rows) and all M rows of them; its invocations split K
//   unit by unit (invocation t takes units t, t + WG, ...), so consecutive invocations read
//   consecutive units of a weight row (Q8_0: 32 contiguous bytes each, Q4_0: 16). Each keeps
//   an M x 4 partial tile in registers; the tiles are summed with `subgroupAdd` (where the
//   device has `wgpu::Features::SUBGROUP`) or a workgroup-memory tree, as in `gemv.wgsl`.
// - `qmatmul` (M > 16): 16 x 16 invocations own a 64 x 64 output block, 4 x 4 outputs each in
//   registers. Per 32-deep K slab (one unit): the invocations stage op(A) (64 x 32) and the
//   dequantized weights (64 x 32) in workgroup memory, k-major, 16 KiB together (the WebGPU
//   minimum); each invocation writes one scalar per stage row and consecutive invocations
//   write consecutive words (row m or column n = t mod 64), so the staging stores are free of
//   bank conflicts, and the inner loop reads one vec4 of each per k (a broadcast along the
//   invocations of a row or column).
// - Zero-filled guarded loads make every M and N correct; K is a multiple of the block size
//   (the op checks it), so a unit never straddles the end of a row.
// - Grid: qgemv x = column groups of 4; qmatmul x = column blocks, y = row blocks; z = batches
//   of this launch (`batch_base`). The weight is shared by every batch.

// Invocations per workgroup of `qgemv` (a power of two, at most 256).
override WG: u32 = 64u;
// Rows of op(A) of `qgemv` (M, 1 to 16).
override GV_ROWS: u32 = 16u;
// The block format: QT_Q8_0 ... QT_Q6_K (`QuantFormat::code` in the catalogue).
override QTYPE: u32 = 0u;


const QT_Q8_0: u32 = 0u;
const QT_Q4_0: u32 = 1u;
const QT_Q4_1: u32 = 2u;
const QT_Q4_K: u32 = 3u;
const QT_Q6_K: u32 = 4u;

// Output columns per `qgemv` workgroup: one vec4 of outputs per row.
const QG_COLS: u32 = 4u;
const MAX_ROWS: u32 = 16u;
// Weights per unit: 8 groups of 4.
const UNIT: u32 = 32u;
// The `qmatmul` block: 64 x 64 outputs, 16 x 16 invocations of 4 x 4.
const QT_BM: u32 = 64u;
const QT_BN: u32 = 64u;

const A_VEC: u32 = 1u;
// The body plane's view starts at a multiple of 4 words: vec4<u32> loads.
const Q_VEC: u32 = 2u;
const O_VEC: u32 = 4u;
const HAS_BIAS: u32 = 16u;
const HAS_C: u32 = 32u;

// `MatmulParams` of the catalogue, field for field; B's fields carry the weight planes:
// `q_off` (b_off) is the body plane's first word, `s_off` (b_bs) the scale plane's first
// half-word (even for Q4_1 and Q4_K, whose scales are whole words).
struct QParams {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,
    a_off: u32,
    a_ld: u32,
    a_bs: u32,
    trans_a: u32,
    q_off: u32,
    b_ld: u32,
    s_off: u32,
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

@group(0) @binding(5) var<uniform> p: QParams;
@group(0) @binding(1) var<storage, read> qscale: array<u32>;
@group(0) @binding(6) var<storage, read> qbody: array<vec4<u32>>;

// Reduction scratch of `qgemv` (as `gemv.wgsl`'s): 4 WG vec4s, 4 KiB at WG = 64.
override PART_LEN: u32 = 4u * WG;
var<workgroup> part: array<vec4<f32>, PART_LEN>;
// Staged slabs of `qmatmul`, k-major: element (k, m) of A at [k * 16 + m / 4][m % 4], element
// (k, n) of the dequantized weights likewise. 8 KiB each.
var<workgroup> qa: array<vec4<f32>, 512>;
var<workgroup> qb: array<vec4<f32>, 512>;

// 32 weights of one row: the words they come from and their scales.
struct QUnit {
    // Q8_0: the 8 words of quants; Q4_0 / Q4_1: the 4 words of nibbles (twice); Q4_K: the 8
    // words whose nibbles (at `shift`) are the unit; Q6_K: the 8 words of `ql` (at `shift`).
    q: array<u32, 8>,
    // Q6_K: the 8 words of `qh` (bit pair at `hshift`).
    h: array<u32, 8>,
    // The scale of groups 0-3 and 4-7 (equal but for Q6_K).
    d0: f32,
    d1: f32,
    // Q4_1: the min `m`; Q4_K: `dmin * m`.
    mn: f32,
    shift: u32,
    hshift: u32,
}

fn ldq(i: u32) -> u32 {
    return qbody[i >> 2u][i & 3u];
}

// Body words w..w+4 of the view (w a multiple of 4).
fn ldq4(w: u32) -> vec4<u32> {
    let i = p.q_off + w;
    if ((p.flags & Q_VEC) != 0u) {
        return qbody[i >> 2u];
    }
    return vec4<u32>(ldq(i), ldq(i + 1u), ldq(i + 2u), ldq(i + 3u));
}

// The f16 at half-word h of the scale plane's view, widened.
fn scale_half(h: u32) -> f32 {
    let i = p.s_off + h;
    return f32_from_f16_bits(qscale[i >> 1u] >> ((i & 1u) * 16u));
}

fn scale_word(g: u32) -> u32 {
    return qscale[(p.s_off >> 1u) + g];
}

// Byte b of three words.
fn byte3(w: array<u32, 3>, b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

fn set8(u: ptr<function, QUnit>, lo: vec4<u32>, hi: vec4<u32>) {
    (*u).q = array<u32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
}

// Unit `sub` (0 to block size / 32 - 1) of block g.
fn load_unit(g: u32, sub: u32) -> QUnit {
    var u: QUnit;
    u.mn = 0.0;
    u.shift = 0u;
    u.hshift = 0u;
    if (QTYPE == QT_Q8_0) {
        set8(&u, ldq4(8u * g), ldq4(8u * g + 4u));
        u.d0 = scale_half(g);
    } else if (QTYPE == QT_Q4_0 || QTYPE == QT_Q4_1) {
        let w = ldq4(4u * g);
        set8(&u, w, w);
        if (QTYPE == QT_Q4_0) {
            u.d0 = scale_half(g);
        } else {
            let s = scale_word(g);
            u.d0 = f32_from_f16_bits(s);
            u.mn = f32_from_f16_bits(s >> 16u);
        }
    } else if (QTYPE == QT_Q4_K) {
        // 35 words per block: scalar loads. Sub-block `sub` is the low (even) or high (odd)
        // nibbles of the 32 bytes of chunk sub / 2.
        let base = p.q_off + 35u * g;
        let sw = array<u32, 3>(ldq(base), ldq(base + 1u), ldq(base + 2u));
        // get_scale_min_k4
        var sc: u32;
        var mn: u32;
        if (sub < 4u) {
            sc = byte3(sw, sub) & 63u;
            mn = byte3(sw, sub + 4u) & 63u;
        } else {
            sc = (byte3(sw, sub + 4u) & 0xfu) | ((byte3(sw, sub - 4u) >> 6u) << 4u);
            mn = (byte3(sw, sub + 4u) >> 4u) | ((byte3(sw, sub) >> 6u) << 4u);
        }
        let s = scale_word(g);
        u.d0 = f32_from_f16_bits(s) * f32(sc);
        u.mn = f32_from_f16_bits(s >> 16u) * f32(mn);
        let q0 = base + 3u + 8u * (sub >> 1u);
        for (var j = 0u; j < 8u; j++) {
            u.q[j] = ldq(q0 + j);
        }
        u.shift = 4u * (sub & 1u);
    } else {
        // Q6_K: half hf = sub / 4 (128 weights), quadrant qd = sub % 4: weight l of the unit
        // is ql[64 hf + 32 (qd & 1) + l] at nibble qd / 2 and qh[32 hf + l] at bit pair qd.
        let hf = sub >> 2u;
        let qd = sub & 3u;
        let base = 52u * g;
        set8(&u, ldq4(base + 16u * hf + 8u * (qd & 1u)), ldq4(base + 16u * hf + 8u * (qd & 1u) + 4u));
        let h0 = ldq4(base + 32u + 8u * hf);
        let h1 = ldq4(base + 36u + 8u * hf);
        u.h = array<u32, 8>(h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w);
        u.shift = 4u * (qd >> 1u);
        u.hshift = 2u * qd;
        // int8 scales 8 hf + 2 qd (weights 0-15) and the next (16-31): one word holds both.
        let si = 8u * hf + 2u * qd;
        let sw = i32(ldq(p.q_off + base + 48u + (si >> 2u)));
        let d = scale_half(g);
        u.d0 = d * f32(extractBits(sw, (si & 3u) * 8u, 8u));
        u.d1 = d * f32(extractBits(sw, ((si & 3u) + 1u) * 8u, 8u));
        return u;
    }
    u.d1 = u.d0;
    return u;
}

// Weights 4j..4j+4 of a unit.
fn unit_group(u: QUnit, j: u32) -> vec4<f32> {
    let bytes = vec4<u32>(0u, 8u, 16u, 24u);
    if (QTYPE == QT_Q8_0) {
        let w = i32(u.q[j]);
        let q = vec4<i32>(extractBits(w, 0u, 8u), extractBits(w, 8u, 8u), extractBits(w, 16u, 8u), extractBits(w, 24u, 8u));
        return vec4<f32>(q) * u.d0;
    }
    if (QTYPE == QT_Q4_0 || QTYPE == QT_Q4_1) {
        // Weights 0-15 are the low nibbles of the 16 bytes, 16-31 the high ones.
        let nib = (vec4<u32>(u.q[j & 3u]) >> (bytes + 4u * (j >> 2u))) & vec4<u32>(0xfu);
        if (QTYPE == QT_Q4_0) {
            return (vec4<f32>(nib) - 8.0) * u.d0;
        }
        return vec4<f32>(nib) * u.d0 + u.mn;
    }
    let nib = (vec4<u32>(u.q[j]) >> (bytes + u.shift)) & vec4<u32>(0xfu);
    if (QTYPE == QT_Q4_K) {
        return u.d0 * vec4<f32>(nib) - u.mn;
    }
    let hi = (vec4<u32>(u.h[j]) >> (bytes + u.hshift)) & vec4<u32>(3u);
    let q = vec4<i32>(nib | (hi << vec4<u32>(4u))) - vec4<i32>(32);
    return select(u.d1, u.d0, j < 4u) * vec4<f32>(q);
}

fn block_size() -> u32 {
    return select(32u, 256u, QTYPE >= QT_Q4_K);
}

// op(A)[i][k..k+4], zero outside (k + 4 <= K always: K is a multiple of 32).
fn load4_op_a(base: u32, i: u32, k: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (i >= p.m || k >= p.k) {
        return v;
    }
    if (p.trans_a == 0u) {
        let idx = base + i * p.a_ld + k;
        if ((p.flags & A_VEC) != 0u) {
            v = ld4_a(idx >> 2u);
        } else {
            for (var j = 0u; j < 4u; j++) {
                v[j] = ld_a(idx + j);
            }
        }
    } else {
        // Stored [K, M]: the 4 elements lie in 4 stored rows.
        for (var j = 0u; j < 4u; j++) {
            v[j] = ld_a(base + (k + j) * p.a_ld + i);
        }
    }
    return v;
}

// The fused epilogue of row `row`, columns col0..col0+4 of batch bt (as `matmul.wgsl`'s).
fn q_store(row: u32, col0: u32, bt: u32, acc: vec4<f32>) {
    if (row >= p.m || col0 >= p.n) {
        return;
    }
    let full = col0 + 4u <= p.n;
    var v = p.alpha * acc;
    if ((p.flags & HAS_BIAS) != 0u) {
        var bias = vec4<f32>(0.0);
        for (var j = 0u; j < 4u; j++) {
            if (col0 + j < p.n) {
                bias[j] = ld_bias(p.bias_off + col0 + j);
            }
        }
        v = v + bias;
    }
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

// Unit `un` of weight row n, or a zero unit (all weights 0) past the last row.
fn row_unit(n: u32, un: u32, upb: u32, bpr: u32) -> QUnit {
    if (n >= p.n) {
        var z: QUnit;
        return z;
    }
    return load_unit(n * bpr + un / upb, un % upb);
}

// The partial GV_ROWS x 4 tile of invocation t of `qgemv`: columns col0..col0+4, units t,
// t + WG, ... of their weight rows. The four units are loaded first, so each vec4 of op(A) is
// read once per unit and used for all four columns.
fn qgemv_partial(col0: u32, bt: u32, t: u32) -> array<vec4<f32>, MAX_ROWS> {
    let a_base = p.a_off + bt * p.a_bs;
    let upb = block_size() / UNIT;
    let bpr = p.k / block_size();
    let units = p.k / UNIT;
    var acc: array<vec4<f32>, MAX_ROWS>;
    for (var i = 0u; i < MAX_ROWS; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    for (var un = t; un < units; un += WG) {
        let u0 = row_unit(col0, un, upb, bpr);
        let u1 = row_unit(col0 + 1u, un, upb, bpr);
        let u2 = row_unit(col0 + 2u, un, upb, bpr);
        let u3 = row_unit(col0 + 3u, un, upb, bpr);
        for (var j = 0u; j < 8u; j++) {
            let w0 = unit_group(u0, j);
            let w1 = unit_group(u1, j);
            let w2 = unit_group(u2, j);
            let w3 = unit_group(u3, j);
            for (var i = 0u; i < GV_ROWS; i++) {
                let a = load4_op_a(a_base, i, UNIT * un + 4u * j);
                acc[i] += vec4<f32>(dot(a, w0), dot(a, w1), dot(a, w2), dot(a, w3));
            }
        }
    }
    return acc;
}

// ---- BEGIN SUBGROUP ENTRY (left out of the `qgemv` module) ----
// Subgroup reduction, as `gemv_subgroup`.
@compute @workgroup_size(WG, 1, 1)
fn qgemv_subgroup(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let col0 = wid.x * QG_COLS;
    let bt = p.batch_base + wid.z;
    var acc = qgemv_partial(col0, bt, t);
    for (var i = 0u; i < GV_ROWS; i++) {
        let s = subgroupAdd(acc[i]);
        if (lane == 0u && sg < WG / 4u) {
            part[sg * GV_ROWS + i] = s;
        }
    }
    workgroupBarrier();
    if (t < GV_ROWS) {
        var v = vec4<f32>(0.0);
        for (var s = 0u; s < min(nsg, WG / 4u); s++) {
            v += part[s * GV_ROWS + t];
        }
        q_store(t, col0, bt, v);
    }
}
// ---- END SUBGROUP ENTRY ----

// Workgroup-memory reduction, as `gemv`.
@compute @workgroup_size(WG, 1, 1)
fn qgemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let col0 = wid.x * QG_COLS;
    let bt = p.batch_base + wid.z;
    var acc = qgemv_partial(col0, bt, t);
    for (var r0 = 0u; r0 < GV_ROWS; r0 += 4u) {
        for (var i = 0u; i < 4u; i++) {
            part[i * WG + t] = acc[min(r0 + i, MAX_ROWS - 1u)];
        }
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (t < s) {
                for (var i = 0u; i < 4u; i++) {
                    part[i * WG + t] += part[i * WG + t + s];
                }
            }
            workgroupBarrier();
        }
        if (t < 4u && r0 + t < GV_ROWS) {
            q_store(r0 + t, col0, bt, part[t * WG]);
        }
        workgroupBarrier();
    }
}

// The tiled kernel for M > 16 (see the header).
@compute @workgroup_size(16, 16, 1)
fn qmatmul(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let row0 = wid.y * QT_BM;
    let col0 = wid.x * QT_BN;
    let bt = p.batch_base + wid.z;
    let a_base = p.a_off + bt * p.a_bs;
    let upb = block_size() / UNIT;
    let bpr = p.k / block_size();
    let units = p.k / UNIT;
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    // Staging coordinates: row m (column n) = t mod 64 and groups j0, j0 + 4 of the slab.
    let r = t % 64u;
    let j0 = t / 64u;
    let n = col0 + r;
    for (var un = 0u; un < units; un++) {
        for (var h = 0u; h < 2u; h++) {
            let j = j0 + 4u * h;
            let v = load4_op_a(a_base, row0 + r, UNIT * un + 4u * j);
            for (var i = 0u; i < 4u; i++) {
                qa[(4u * j + i) * 16u + (r >> 2u)][r & 3u] = v[i];
            }
        }
        var w0 = vec4<f32>(0.0);
        var w1 = vec4<f32>(0.0);
        if (n < p.n) {
            let u = load_unit(n * bpr + un / upb, un % upb);
            w0 = unit_group(u, j0);
            w1 = unit_group(u, j0 + 4u);
        }
        for (var i = 0u; i < 4u; i++) {
            qb[(4u * j0 + i) * 16u + (r >> 2u)][r & 3u] = w0[i];
            qb[(4u * (j0 + 4u) + i) * 16u + (r >> 2u)][r & 3u] = w1[i];
        }
        workgroupBarrier();
        for (var kk = 0u; kk < UNIT; kk++) {
            let av = qa[kk * 16u + lid.y];
            let bv = qb[kk * 16u + lid.x];
            for (var i = 0u; i < 4u; i++) {
                acc[i] = fma(vec4<f32>(av[i]), bv, acc[i]);
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        q_store(row0 + 4u * lid.y + i, col0 + 4u * lid.x, bt, acc[i]);
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
@group(0) @binding(0) var<storage, read> a: array<vec4<f32>>;
fn ld_a(i: u32) -> f32 { return (a[i >> 2u][i & 3u]); }
fn ld4_a(v: u32) -> vec4<f32> { return (a[v]); }
@group(0) @binding(2) var<storage, read> bias: array<vec4<f32>>;
fn ld_bias(i: u32) -> f32 { return (bias[i >> 2u][i & 3u]); }
fn ld4_bias(v: u32) -> vec4<f32> { return (bias[v]); }
@group(0) @binding(3) var<storage, read> c: array<vec4<f32>>;
fn ld_c(i: u32) -> f32 { return (c[i >> 2u][i & 3u]); }
fn ld4_c(v: u32) -> vec4<f32> { return (c[v]); }
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
fn ld_out(i: u32) -> f32 { return (out[i >> 2u][i & 3u]); }
fn ld4_out(v: u32) -> vec4<f32> { return (out[v]); }
fn st_out(i: u32, x: f32) { out[i >> 2u][i & 3u] = x; }
fn st4_out(v: u32, x: vec4<f32>) { out[v] = x; }
// ---- END GENERATED ----
