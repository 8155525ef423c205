//! Shared harness of tilekit's test suite.
//!
//! - [`backends`]: the devices under test, created once per test binary: the CPU always, wgpu
//!   on whatever adapter is present (software adapters accepted) plus a second wgpu device
//!   forced onto the packed-f16 path, and CUDA device 0. A backend that cannot be created
//!   prints `SKIP <backend>: <reason>` to stderr (and appends it to `$TILEKIT_SKIP_LOG` when
//!   that is set, so `cargo xtask test` can count it) — never a silent pass.
//! - [`tolerance`]: the error model every comparison uses.
//! - Deterministic input generators ([`Rng`]), host-side rounding to the storage dtype
//!   ([`round_to`]), and the case runners [`run_matmul`], [`run_conv`] and [`run_activation`],
//!   which compute the `f64` reference once per dtype, run every backend, compare with the
//!   tolerance model and check guard words around matmul outputs.

/// The tolerance model, stated once in `tilekit-kernels` ([`tilekit_kernels::tolerance`]).
pub use tilekit::kernels::tolerance;

use std::collections::HashSet;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use tilekit::{
    Activation, ActivationDesc, Conv2dDesc, Conv2dOptions, DType, Device, Error, Layout, MatmulDesc, MatrixView,
    Tensor, WgpuOptions,
};
use tilekit_kernels::reference;

/// One device under test, with the label the messages use.
#[derive(Debug)]
pub struct TestBackend {
    /// `cpu`, `wgpu`, `wgpu-packed-f16` or `cuda`.
    pub label: &'static str,
    /// The device.
    pub device: Device,
}

/// Prints a skip line and appends it to `$TILEKIT_SKIP_LOG` if that is set. Each distinct line
/// is reported once per test binary.
pub fn skip(what: &str, reason: &str) {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let line = format!("SKIP {what}: {reason}");
    let seen = SEEN.get_or_init(|| Mutex::new(HashSet::new()));
    let first = seen.lock().unwrap_or_else(|e| e.into_inner()).insert(line.clone());
    if !first {
        return;
    }
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("TILEKIT_SKIP_LOG") {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
        match file {
            Ok(mut f) => {
                if let Err(e) = writeln!(f, "{line}") {
                    eprintln!("could not append to TILEKIT_SKIP_LOG {}: {e}", path.to_string_lossy());
                }
            }
            Err(e) => eprintln!("could not open TILEKIT_SKIP_LOG {}: {e}", path.to_string_lossy()),
        }
    }
}

/// The devices under test, created on first use (once per test binary).
pub fn backends() -> &'static [TestBackend] {
    static DEVICES: OnceLock<Vec<TestBackend>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let mut v = vec![TestBackend { label: "cpu", device: Device::cpu() }];
        match Device::wgpu(&WgpuOptions::allow_software()) {
            Ok(device) => {
                eprintln!("testing wgpu on {}", device.description());
                v.push(TestBackend { label: "wgpu", device });
                let mut packed = WgpuOptions::allow_software();
                packed.force_packed_f16 = true;
                match Device::wgpu(&packed) {
                    Ok(device) => {
                        eprintln!("testing wgpu-packed-f16 on {}", device.description());
                        v.push(TestBackend { label: "wgpu-packed-f16", device });
                    }
                    Err(e) => skip("wgpu-packed-f16", &e.to_string()),
                }
            }
            Err(e) => {
                skip("wgpu", &e.to_string());
                skip("wgpu-packed-f16", &e.to_string());
            }
        }
        match Device::cuda(0) {
            Ok(device) => {
                eprintln!("testing cuda on {}", device.description());
                v.push(TestBackend { label: "cuda", device });
            }
            Err(e) => skip("cuda", &e.to_string()),
        }
        v
    })
}

/// The backends that can run `dtype`; the others get a skip line.
pub fn backends_for(dtype: DType) -> impl Iterator<Item = &'static TestBackend> {
    backends().iter().filter(move |b| match b.device.check_dtype(dtype) {
        Ok(()) => true,
        Err(e) => {
            skip(&format!("{} {dtype}", b.label), &e.to_string());
            false
        }
    })
}

/// Guard words checked so far in this test binary (see [`run_matmul`]).
pub static GUARD_WORDS: AtomicUsize = AtomicUsize::new(0);

/// A small deterministic generator (SplitMix64): the proptest strategies draw a seed, and the
/// data follows from it, so a failing case is reproducible from its printed seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }

    /// A uniform integer in `[lo, hi]`.
    pub fn int(&mut self, lo: i32, hi: i32) -> i32 {
        let span = (hi - lo + 1) as u64;
        lo + (self.next_u64() % span) as i32
    }
}

/// What the inputs of a case look like.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Data {
    /// Uniform in `[-1, 1)`, rounded to the storage dtype: the tolerance model applies.
    Uniform,
    /// Integers in `[-r, r]`: every partial sum is exact in `f32`, so results must match the
    /// reference bit for bit, up to the sign of zero (the caller picks `r` and shapes so
    /// results are representable).
    Integers(i32),
}

impl Data {
    /// `n` values rounded to `dtype`.
    pub fn fill(self, rng: &mut Rng, n: usize, dtype: DType) -> Vec<f32> {
        let v: Vec<f32> = match self {
            Data::Uniform => (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect(),
            Data::Integers(r) => (0..n).map(|_| rng.int(-r, r) as f32).collect(),
        };
        round_to(dtype, &v)
    }

    fn exact(self) -> bool {
        matches!(self, Data::Integers(_))
    }
}

/// `v` rounded (nearest even) to `dtype` and widened back to `f32`.
pub fn round_to(dtype: DType, v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| dtype.round_f32(x)).collect()
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn abs64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| (x as f64).abs()).collect()
}

/// The guard value every word outside an output view holds: a finite value that no kernel
/// computes from our inputs, exactly representable in every dtype.
pub const SENTINEL: f32 = -1234.0;

/// The bytes of `values` in `dtype`.
pub fn to_storage_bytes(dtype: DType, values: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => values.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
        DType::Bf16 => values.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
        other => panic!("no storage bytes for {other} in the tests"),
    }
}

/// One storage word of `bytes` (element `i` of `dtype`), as raw bits.
pub fn word(dtype: DType, bytes: &[u8], i: usize) -> u32 {
    let s = dtype.size_bytes();
    let mut w = [0u8; 4];
    w[..s].copy_from_slice(&bytes[i * s..(i + 1) * s]);
    u32::from_le_bytes(w)
}

/// Compares `got[i]` with `pre[i]` (pre-activation) through the activation for each `i` of
/// `indices`, under the tolerance model (or exactly); `bound(magnitude, pre, reference)` is the
/// op's bound ([`tolerance::bound`], or [`tolerance::matmul_bound`] for a matmul's precision).
/// Returns a message naming the first bad element.
#[allow(clippy::too_many_arguments)]
fn compare(
    what: &str,
    dtype: DType,
    act: Activation,
    bound: &dyn Fn(f64, f64, f64) -> f64,
    exact: bool,
    got: &[f32],
    pre: &[f64],
    magnitude: &[f64],
    indices: impl Iterator<Item = usize>,
) -> Result<(), String> {
    let mut bad = 0usize;
    let mut first = String::new();
    for i in indices {
        let r = act.apply_f64(pre[i]);
        let (ok, b) = if exact {
            // Bit for bit, except that +0 and -0 are equal: WGSL's `max`/`clamp` may return
            // either zero (relu6(-0) is +0 on some devices), and nothing downstream can tell.
            let want = dtype.round_f32(r as f32);
            (got[i].to_bits() == want.to_bits() || got[i] == want || (got[i].is_nan() && want.is_nan()), 0.0)
        } else {
            let b = bound(magnitude[i], pre[i], r);
            (tolerance::accepts(dtype, got[i], r, b), b)
        };
        if !ok {
            if bad == 0 {
                first = format!("first bad element {i}: got {:e}, expected {r:e} (bound {b:e})", got[i]);
            }
            bad += 1;
        }
    }
    if bad > 0 {
        return Err(format!("{what}: {bad} bad elements; {first}"));
    }
    Ok(())
}

/// Buffer lengths and contents of one matmul case.
#[derive(Debug, Clone)]
pub struct MatmulInputs {
    /// `A`'s buffer.
    pub a: Vec<f32>,
    /// `B`'s buffer.
    pub b: Vec<f32>,
    /// The bias buffer, if any.
    pub bias: Option<Vec<f32>>,
    /// `C`'s buffer, if any.
    pub c: Option<Vec<f32>>,
    /// Length of the output buffer (view plus guard words).
    pub out_len: usize,
}

/// Extra words after the last element of every view, so a kernel that reads or writes past its
/// view is caught (for outputs) and views do not end exactly at the buffer's end.
pub const TAIL: usize = 5;

impl MatmulInputs {
    /// Buffers for `desc`, filled from `seed` with `data` rounded to `dtype`.
    pub fn new(desc: &MatmulDesc, dtype: DType, data: Data, seed: u64) -> MatmulInputs {
        let mut rng = Rng::new(seed);
        let (ar, ac) = desc.a_stored();
        let (br, bc) = desc.b_stored();
        let len = |v: &MatrixView, r, c| v.required_len(desc.batch, r, c).unwrap_or(0) + TAIL;
        let a = data.fill(&mut rng, len(&desc.a, ar, ac), dtype);
        let b = data.fill(&mut rng, len(&desc.b, br, bc), dtype);
        let bias = desc.bias_offset.map(|off| data.fill(&mut rng, off + desc.n + TAIL, dtype));
        let c = desc.c.map(|cv| data.fill(&mut rng, len(&cv, desc.m, desc.n), dtype));
        let out_len = len(&desc.out, desc.m, desc.n);
        MatmulInputs { a, b, bias, c, out_len }
    }
}

/// Runs `desc` through `matmul_into` on every backend that has `dtype`, with the output view
/// inside a buffer of sentinels, and checks every element of the view against the reference
/// and every other word against the sentinel. Returns the number of guard words checked (summed
/// over the backends that ran).
pub fn run_matmul(desc: &MatmulDesc, dtype: DType, data: Data, seed: u64) -> Result<usize, String> {
    let inp = MatmulInputs::new(desc, dtype, data, seed);
    run_matmul_with(desc, dtype, data.exact(), &inp)
}

/// [`run_matmul`] on given inputs (`exact` asks for bit-exact results).
pub fn run_matmul_with(desc: &MatmulDesc, dtype: DType, exact: bool, inp: &MatmulInputs) -> Result<usize, String> {
    let mut total_guards = 0;
    // The reference: pre-activation values, then the magnitudes for the bound.
    let mut plain = *desc;
    plain.activation = Activation::None;
    // An empty product (which validates whatever its other dims, even usize::MAX) writes
    // nothing: every word of the output buffer is a guard word, and there is no reference to
    // compute (looping over a huge M with N = 0 would never end).
    let empty = desc.batch == 0 || desc.m == 0 || desc.n == 0;
    let mut pre = vec![f64::NAN; inp.out_len];
    let (a64, b64) = (widen(&inp.a), widen(&inp.b));
    let (bias64, c64) = (inp.bias.as_deref().map(widen), inp.c.as_deref().map(widen));
    if !empty {
        reference::matmul(&plain, &a64, &b64, bias64.as_deref(), c64.as_deref(), &mut pre);
    }
    let mut magnitude = vec![0.0; inp.out_len];
    if !exact && !empty {
        let mut abs_desc = plain;
        abs_desc.alpha = desc.alpha.abs();
        abs_desc.beta = desc.beta.abs();
        let (bias_a, c_a) = (inp.bias.as_deref().map(abs64), inp.c.as_deref().map(abs64));
        reference::matmul(&abs_desc, &abs64(&inp.a), &abs64(&inp.b), bias_a.as_deref(), c_a.as_deref(), &mut magnitude);
    }
    // Which words of the output buffer the view covers.
    let mut in_view = vec![false; inp.out_len];
    for bt in 0..if empty { 0 } else { desc.batch } {
        for i in 0..desc.m {
            for j in 0..desc.n {
                in_view[desc.out.index(bt, i, j)] = true;
            }
        }
    }
    let sentinel = word(dtype, &to_storage_bytes(dtype, &[SENTINEL]), 0);
    for be in backends_for(dtype) {
        let dev = &be.device;
        let what = format!("{} {dtype} matmul {desc:?}", be.label);
        let up = |v: &[f32]| dev.tensor_from_f32(&[v.len()], dtype, v).map_err(|e| format!("{what}: upload: {e}"));
        let a = up(&inp.a)?;
        let b = up(&inp.b)?;
        let bias = inp.bias.as_deref().map(up).transpose()?;
        let c = inp.c.as_deref().map(up).transpose()?;
        let out = up(&vec![SENTINEL; inp.out_len])?;
        dev.matmul_into(desc, &a, &b, bias.as_ref(), c.as_ref(), &out).map_err(|e| format!("{what}: {e}"))?;
        let bytes = out.to_bytes().map_err(|e| format!("{what}: download: {e}"))?;
        let got = out.to_f32_vec().map_err(|e| format!("{what}: download: {e}"))?;
        let mut guards = 0;
        for (i, &v) in in_view.iter().enumerate() {
            if !v {
                let w = word(dtype, &bytes, i);
                if w != sentinel {
                    return Err(format!("{what}: guard word {i} outside the output view changed to {:e}", got[i]));
                }
                guards += 1;
            }
        }
        GUARD_WORDS.fetch_add(guards, Ordering::Relaxed);
        total_guards += guards;
        let indices = (0..inp.out_len).filter(|&i| in_view[i]);
        let rule = |s: f64, p: f64, r: f64| tolerance::matmul_bound(desc, dtype, s, p, r);
        compare(&what, dtype, desc.activation, &rule, exact, &got, &pre, &magnitude, indices)?;
        // Out-of-bounds stores are clamped onto the last element on some backends: check it
        // exactly against the (bit-exact or toleranced) reference once more, by name.
        if let Some(last) = (0..inp.out_len).rev().find(|&i| in_view[i]) {
            compare(
                &format!("{what} (last element)"),
                dtype,
                desc.activation,
                &rule,
                exact,
                &got,
                &pre,
                &magnitude,
                [last].into_iter(),
            )?;
        }
        // The same product with B packed as a weight (`pack_matmul_weights` +
        // `matmul_packed`, dense operands copied out of the views), where B is one matrix
        // shared by the batches: the same reference, the same bound (bit-exact on exact data).
        if !empty && (desc.batch == 1 || desc.b.batch_stride == 0) {
            let packed = run_packed(dev, desc, dtype, inp).map_err(|e| format!("{what} (packed B): {e}"))?;
            let mut got_p = vec![f32::NAN; inp.out_len];
            for bt in 0..desc.batch {
                for i in 0..desc.m {
                    for j in 0..desc.n {
                        got_p[desc.out.index(bt, i, j)] = packed[(bt * desc.m + i) * desc.n + j];
                    }
                }
            }
            let indices = (0..inp.out_len).filter(|&i| in_view[i]);
            let what = format!("{what} (packed B)");
            compare(&what, dtype, desc.activation, &rule, exact, &got_p, &pre, &magnitude, indices)?;
        }
    }
    Ok(total_guards)
}

/// `desc` through `Device::matmul_packed`: A, C and the bias copied out of their views into
/// dense tensors (A `[batch, ..]` when `desc.batch > 1`, stored transposed with `trans_a`; C
/// `[batch, M, N]`), B (batch 0's) packed with `desc.trans_b`. Returns the dense output,
/// `[batch, M, N]` in order.
fn run_packed(dev: &Device, desc: &MatmulDesc, dtype: DType, inp: &MatmulInputs) -> Result<Vec<f32>, String> {
    let batched = desc.batch > 1;
    let up = |shape: &[usize], v: &[f32]| dev.tensor_from_f32(shape, dtype, v).map_err(|e| format!("upload: {e}"));
    let dense = |view: &MatrixView, src: &[f32], batches: usize, rows: usize, cols: usize| -> Vec<f32> {
        let mut out = Vec::with_capacity(batches * rows * cols);
        for bt in 0..batches {
            for r in 0..rows {
                for c in 0..cols {
                    out.push(src[view.index(bt, r, c)]);
                }
            }
        }
        out
    };
    let (ar, ac) = desc.a_stored();
    let (br, bc) = desc.b_stored();
    let a_shape = if batched { vec![desc.batch, ar, ac] } else { vec![ar, ac] };
    let a = up(&a_shape, &dense(&desc.a, &inp.a, desc.batch, ar, ac))?;
    let b = up(&[br, bc], &dense(&desc.b, &inp.b, 1, br, bc))?;
    let c = match (desc.c, &inp.c) {
        (Some(cv), Some(c)) => Some(up(&[desc.batch, desc.m, desc.n], &dense(&cv, c, desc.batch, desc.m, desc.n))?),
        _ => None,
    };
    let bias = match (desc.bias_offset, &inp.bias) {
        (Some(off), Some(bias)) => Some(up(&[desc.n], &bias[off..off + desc.n])?),
        _ => None,
    };
    let packed = dev.pack_matmul_weights(&b, desc.trans_b).map_err(|e| format!("pack: {e}"))?;
    let opts = tilekit::MatmulOptions::new()
        .trans_a(desc.trans_a)
        .alpha(desc.alpha)
        .beta(desc.beta)
        .bias(bias.as_ref())
        .c(c.as_ref())
        .activation(desc.activation)
        .precision(desc.precision);
    let out = dev.matmul_packed(&a, &packed, &opts).map_err(|e| e.to_string())?;
    out.to_f32_vec().map_err(|e| format!("download: {e}"))
}

/// Builds tensors for a depthwise conv case, runs it on every backend that has `dtype` (through
/// `depthwise_conv2d`, or `depthwise_conv2d_into` when `into` is set) and compares with the
/// reference; the same weights pre-packed (`depthwise_conv2d_packed(_into)`) must give the
/// same bytes. Returns the number of backends that ran.
pub fn run_conv(desc: &Conv2dDesc, dtype: DType, data: Data, seed: u64, into: bool) -> Result<usize, String> {
    let mut rng = Rng::new(seed);
    let in_shape = desc.input_shape();
    let w_shape = desc.weight_shape();
    let out_shape = desc.output_shape();
    let x = data.fill(&mut rng, in_shape.iter().product(), dtype);
    let w = data.fill(&mut rng, w_shape.iter().product(), dtype);
    let bias = desc.has_bias.then(|| data.fill(&mut rng, desc.out_channels(), dtype));
    let out_len: usize = out_shape.iter().product();
    let mut plain = *desc;
    plain.activation = Activation::None;
    let mut pre = vec![f64::NAN; out_len];
    let bias64 = bias.as_deref().map(widen);
    reference::depthwise_conv2d(&plain, &widen(&x), &widen(&w), bias64.as_deref(), &mut pre);
    let mut magnitude = vec![0.0; out_len];
    let bias_abs = bias.as_deref().map(abs64);
    reference::depthwise_conv2d(&plain, &abs64(&x), &abs64(&w), bias_abs.as_deref(), &mut magnitude);
    let opts = Conv2dOptions::default()
        .stride([desc.stride_h, desc.stride_w])
        .padding([desc.pad_top, desc.pad_bottom, desc.pad_left, desc.pad_right])
        .dilation([desc.dilation_h, desc.dilation_w])
        .layout(desc.layout)
        .activation(desc.activation);
    let mut ran = 0;
    for be in backends_for(dtype) {
        let dev = &be.device;
        let what = format!("{} {dtype} depthwise_conv2d {desc:?}", be.label);
        let err = |e: Error| format!("{what}: {e}");
        let xt = dev.tensor_from_f32(&in_shape, dtype, &x).map_err(err)?;
        let wt = dev.tensor_from_f32(&w_shape, dtype, &w).map_err(err)?;
        let bt = bias.as_deref().map(|b| dev.tensor_from_f32(&[b.len()], dtype, b)).transpose().map_err(err)?;
        let out = if into {
            let out = dev.tensor_from_f32(&out_shape, dtype, &vec![SENTINEL; out_len]).map_err(err)?;
            dev.depthwise_conv2d_into(&xt, &wt, bt.as_ref(), &opts, &out).map_err(err)?;
            out
        } else {
            dev.depthwise_conv2d(&xt, &wt, bt.as_ref(), &opts).map_err(err)?
        };
        if out.shape() != out_shape {
            return Err(format!("{what}: output shape {:?}, expected {out_shape:?}", out.shape()));
        }
        // The same convolution with the weights pre-packed (`[kh, kw, C·m]`): the same bytes.
        let packed = dev.pack_depthwise_weights(&wt, desc.channels).map_err(err)?;
        let out_packed = if into {
            let o = dev.tensor_from_f32(&out_shape, dtype, &vec![SENTINEL; out_len]).map_err(err)?;
            dev.depthwise_conv2d_packed_into(&xt, &packed, bt.as_ref(), &opts, &o).map_err(err)?;
            o
        } else {
            dev.depthwise_conv2d_packed(&xt, &packed, bt.as_ref(), &opts).map_err(err)?
        };
        if out_packed.to_bytes().map_err(err)? != out.to_bytes().map_err(err)? {
            return Err(format!("{what}: the packed weights' output differs from the unpacked weights'"));
        }
        let got = out.to_f32_vec().map_err(err)?;
        let k = desc.kernel_h * desc.kernel_w;
        let rule = |s: f64, p: f64, r: f64| tolerance::bound(dtype, desc.activation, k, s, p, r);
        compare(&what, dtype, desc.activation, &rule, data.exact(), &got, &pre, &magnitude, 0..out_len)?;
        ran += 1;
    }
    Ok(ran)
}

/// How an activation case is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActMode {
    /// `Device::activation` (a new tensor).
    New,
    /// `Device::activation_in_place`.
    InPlace,
    /// `Device::activation_into` a separate tensor.
    Into,
    /// `Device::activation_into` with `x` itself (a clone of its handle) as the output.
    IntoSelf,
}

/// Runs `act(x + bias)` over a tensor of `shape` on every backend that has `dtype` and compares
/// with the reference. `x` is generated from `seed` unless given.
#[allow(clippy::too_many_arguments)]
pub fn run_activation(
    shape: &[usize],
    with_bias: bool,
    act: Activation,
    mode: ActMode,
    dtype: DType,
    data: Data,
    seed: u64,
    x: Option<&[f32]>,
) -> Result<usize, String> {
    let mut rng = Rng::new(seed);
    let len: usize = shape.iter().product();
    let x = match x {
        Some(x) => round_to(dtype, x),
        None => data.fill(&mut rng, len, dtype),
    };
    let last = shape.last().copied().unwrap_or(1);
    let bias = with_bias.then(|| data.fill(&mut rng, last, dtype));
    let desc = ActivationDesc::new(len, bias.as_ref().map(|_| last), Activation::None);
    let mut pre = vec![f64::NAN; len];
    let bias64 = bias.as_deref().map(widen);
    reference::activation(&desc, &widen(&x), bias64.as_deref(), &mut pre);
    let mut magnitude = vec![0.0; len];
    let bias_abs = bias.as_deref().map(abs64);
    reference::activation(&desc, &abs64(&x), bias_abs.as_deref(), &mut magnitude);
    let mut ran = 0;
    for be in backends_for(dtype) {
        let dev = &be.device;
        let what = format!("{} {dtype} activation {act} {mode:?} shape {shape:?} bias {with_bias}", be.label);
        let err = |e: Error| format!("{what}: {e}");
        let xt = dev.tensor_from_f32(shape, dtype, &x).map_err(err)?;
        let bt = bias.as_deref().map(|b| dev.tensor_from_f32(&[b.len()], dtype, b)).transpose().map_err(err)?;
        let out: Tensor = match mode {
            ActMode::New => dev.activation(&xt, bt.as_ref(), act).map_err(err)?,
            ActMode::InPlace => {
                dev.activation_in_place(&xt, bt.as_ref(), act).map_err(err)?;
                xt
            }
            ActMode::Into => {
                let out = dev.tensor_from_f32(shape, dtype, &vec![SENTINEL; len]).map_err(err)?;
                dev.activation_into(&xt, bt.as_ref(), act, &out).map_err(err)?;
                out
            }
            ActMode::IntoSelf => {
                let out = xt.clone();
                dev.activation_into(&xt, bt.as_ref(), act, &out).map_err(err)?;
                out
            }
        };
        let got = out.to_f32_vec().map_err(err)?;
        let rule = |s: f64, p: f64, r: f64| tolerance::bound(dtype, act, 0, s, p, r);
        compare(&what, dtype, act, &rule, data.exact(), &got, &pre, &magnitude, 0..len)?;
        ran += 1;
    }
    Ok(ran)
}

/// A dense NCHW/NHWC conv descriptor with no padding, stride or dilation (tests adjust it).
pub fn conv_desc(
    batch: usize,
    channels: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    layout: Layout,
) -> Conv2dDesc {
    Conv2dDesc::new(layout, [batch, channels, h, w], [kh, kw])
        .multiplier(1)
        .stride_h(1)
        .stride_w(1)
        .pad_top(0)
        .pad_bottom(0)
        .pad_left(0)
        .pad_right(0)
        .dilation_h(1)
        .dilation_w(1)
        .has_bias(false)
        .activation(Activation::None)
}

/// Prints how many guard words this binary has checked so far (all tests together).
pub fn report_guard_words(test: &str) {
    eprintln!("{test}: guard words checked so far in this binary (all tests): {}", GUARD_WORDS.load(Ordering::Relaxed));
}
