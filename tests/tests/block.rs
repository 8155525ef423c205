//! The inverted-residual block: fused and unfused, on every backend present, every dtype and
//! both layouts, against the f64 reference under `tilekit_kernels::block::bounds` (the
//! tolerance rule carried through the three stages), bit for bit on integer data; every output
//! element written; bad inputs as typed errors.
//!
//! Shapes are small (lavapipe is slow) but cover odd and prime H/W, channel counts that are no
//! multiple of any tile (3, 5, 7), stride 1 and 2, with and without expand and residual, and
//! one wide case whose hidden channels the CPU kernel walks in several chunks.

use tilekit::{BlockOptions, BlockWeights, DType, Device, Error, Layout, Tensor};
use tilekit_kernels::InvertedResidualDesc;
use tilekit_kernels::block::{bounds, reference};
use tilekit_kernels::tolerance::accepts;
use tilekit_tests::{Data, Rng, SENTINEL, backends_for};

/// `(N, C, H, W, hidden or 0 for no expand, C', stride)`.
const CASES: [(usize, usize, usize, usize, usize, usize, usize); 11] = [
    (1, 3, 5, 7, 18, 3, 1),      // expand, residual, odd H/W
    (2, 5, 4, 3, 30, 7, 2),      // stride 2, batch 2, even/odd
    (1, 4, 6, 5, 0, 4, 1),       // no expand, residual
    (1, 8, 3, 3, 48, 5, 1),      // stride 1 without residual (C != C')
    (1, 7, 9, 4, 42, 7, 2),      // stride 2, C = C' but no residual
    (1, 3, 1, 1, 6, 3, 1),       // a single pixel
    (1, 3, 13, 67, 40, 3, 1),    // wide rows: several hidden chunks on the CPU
    (2, 3, 5, 3, 12, 3, 1),      // batch 2 whose rows do not split evenly into CPU bands
    (1, 4, 3, 10, 20, 70, 2),    // C' not a multiple of the WGSL kernel's 8 lanes, W over one tile (8)
    (1, 3, 3, 9, 12, 330, 1),    // C' over two WGSL output-channel blocks (160)
    (1, 160, 3, 5, 320, 320, 1), // MobileNetV2's last block's widths (C = 160, C' = 320) on a small image
];

fn desc(case: usize, layout: Layout) -> InvertedResidualDesc {
    let (batch, channels, height, width, hidden, out_channels, stride) = CASES[case];
    InvertedResidualDesc::new(layout, [batch, channels, height, width], out_channels)
        .hidden(if hidden == 0 { channels } else { hidden })
        .stride(stride)
        .expand(hidden != 0)
        // Every other case drops the optional biases.
        .expand_bias(hidden != 0 && case.is_multiple_of(2))
        .dw_bias(case.is_multiple_of(2))
        .project_bias(case != 3)
}

/// Host data of one block: values as stored in `dtype`.
struct Inputs {
    x: Vec<f32>,
    we: Option<Vec<f32>>,
    be: Option<Vec<f32>>,
    wd: Vec<f32>,
    bd: Option<Vec<f32>>,
    wp: Vec<f32>,
    bp: Option<Vec<f32>>,
}

impl Inputs {
    fn new(d: &InvertedResidualDesc, dtype: DType, data: Data, seed: u64) -> Inputs {
        let mut rng = Rng::new(seed);
        let l = d.checked_lens().expect("test shapes fit");
        let mut fill = |n: usize| data.fill(&mut rng, n, dtype);
        let x = fill(l.input);
        let we = d.expand.then(|| fill(l.expand_weight));
        let be = (d.expand && d.expand_bias).then(|| fill(d.hidden));
        let wd = fill(l.dw_weight);
        let bd = d.dw_bias.then(|| fill(d.hidden));
        let wp = fill(l.project_weight);
        let bp = d.project_bias.then(|| fill(d.out_channels));
        Inputs { x, we, be, wd, bd, wp, bp }
    }

    /// The reference output and its per-element bound.
    fn expected(&self, d: &InvertedResidualDesc, dtype: DType) -> (Vec<f64>, Vec<f64>) {
        let w = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
        let ow = |v: &Option<Vec<f32>>| v.as_deref().map(w);
        let (x, we, be, wd, bd, wp, bp) =
            (w(&self.x), ow(&self.we), ow(&self.be), w(&self.wd), ow(&self.bd), w(&self.wp), ow(&self.bp));
        let expand = we.as_deref().map(|we| (we, be.as_deref()));
        let mut out = vec![f64::NAN; d.checked_lens().expect("fits").output];
        reference(d, &x, expand, (&wd, bd.as_deref()), (&wp, bp.as_deref()), &mut out);
        let b = bounds(d, dtype, &x, expand, (&wd, bd.as_deref()), (&wp, bp.as_deref()));
        (out, b)
    }

    /// Runs the block on `dev`, fused or not, into a sentinel-filled output; then with the
    /// weights packed (`Device::pack_block_weights`), whose output comes second.
    fn run(&self, dev: &Device, d: &InvertedResidualDesc, dtype: DType, fused: bool) -> Result<[Vec<f32>; 2], Error> {
        let t = |shape: &[usize], v: &[f32]| dev.tensor_from_f32(shape, dtype, v);
        let tb = |v: &Option<Vec<f32>>| v.as_deref().map(|v| t(&[v.len()], v)).transpose();
        let (c, hid, co) = (d.channels, d.hidden, d.out_channels);
        let x = t(&d.input_shape(), &self.x)?;
        let we = self.we.as_deref().map(|v| t(&[hid, c, 1, 1], v)).transpose()?;
        let (be, bd, bp) = (tb(&self.be)?, tb(&self.bd)?, tb(&self.bp)?);
        let wd = t(&[hid, 1, 3, 3], &self.wd)?;
        let wp = t(&[co, hid, 1, 1], &self.wp)?;
        let weights = BlockWeights {
            expand: we.as_ref(),
            expand_bias: be.as_ref(),
            depthwise: &wd,
            depthwise_bias: bd.as_ref(),
            project: &wp,
            project_bias: bp.as_ref(),
        };
        let opts = BlockOptions::default().stride(d.stride).layout(d.layout).fused(fused);
        let len = d.checked_lens().expect("fits").output;
        let out = t(&d.output_shape(), &vec![SENTINEL; len])?;
        dev.inverted_residual_into(&x, &weights, &opts, &out)?;
        // The allocating form gives the same result.
        let again = dev.inverted_residual(&x, &weights, &opts)?;
        let (a, b) = (out.to_f32_vec()?, again.to_f32_vec()?);
        if a.iter().zip(&b).any(|(p, q)| p.to_bits() != q.to_bits()) {
            panic!("{d:?} {dtype} fused={fused}: inverted_residual and inverted_residual_into differ");
        }
        let packed = dev.pack_block_weights(&weights)?;
        assert_eq!(
            packed.is_transposed(),
            dev.kind() == tilekit::BackendKind::Cpu,
            "{d:?}: transposed on the CPU only"
        );
        let p_out = t(&d.output_shape(), &vec![SENTINEL; len])?;
        dev.inverted_residual_packed_into(&x, &packed, &opts, &p_out)?;
        let p = p_out.to_f32_vec()?;
        let again = dev.inverted_residual_packed(&x, &packed, &opts)?.to_f32_vec()?;
        if p.iter().zip(&again).any(|(u, v)| u.to_bits() != v.to_bits()) {
            panic!("{d:?} {dtype} fused={fused}: inverted_residual_packed and its _into differ");
        }
        Ok([a, p])
    }
}

fn check(what: &str, dtype: DType, exact: bool, got: &[f32], want: &[f64], bound: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, ((&g, &r), &b)) in got.iter().zip(want).zip(bound).enumerate() {
        assert!(g != SENTINEL, "{what}: element {i} was not written");
        let ok = if exact { f64::from(g) == r } else { accepts(dtype, g, r, b) };
        assert!(ok, "{what}: element {i} is {g}, reference {r} (bound {b})");
    }
}

fn run_all(data: Data, dtypes: &[DType], cases: &[usize]) -> usize {
    let mut ran = 0;
    for &dtype in dtypes {
        for &case in cases {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                let d = desc(case, layout);
                let inputs = Inputs::new(&d, dtype, data, 0x5eed + case as u64);
                let (want, bound) = inputs.expected(&d, dtype);
                for be in backends_for(dtype) {
                    for fused in [true, false] {
                        let what = format!("{} {dtype} case {case} {layout:?} fused={fused} {d:?}", be.label);
                        match inputs.run(&be.device, &d, dtype, fused) {
                            Ok([got, packed]) => {
                                check(&what, dtype, data != Data::Uniform, &got, &want, &bound);
                                let what = format!("{what} packed");
                                check(&what, dtype, data != Data::Uniform, &packed, &want, &bound);
                            }
                            Err(Error::Backend { message, .. }) if fused && message.contains("no fused") => {
                                tilekit_tests::skip(&format!("{} fused inverted_residual", be.label), &message);
                                continue;
                            }
                            Err(e) => panic!("{what}: {e}"),
                        }
                        ran += 1;
                    }
                }
            }
        }
    }
    ran
}

#[test]
fn fused_and_unfused_blocks_match_the_reference_in_every_dtype() {
    let all: Vec<usize> = (0..CASES.len()).collect();
    let ran = run_all(Data::Uniform, &[DType::F32, DType::F16, DType::Bf16], &all);
    assert!(ran > 0);
}

#[test]
fn integer_blocks_are_bit_exact() {
    // Integers in [-1, 1]: every sum is a small integer, ReLU6 clamps to integers, and every
    // intermediate is exact in f32 and in bf16/f16 (|values| stay far below 256).
    let ran = run_all(Data::Integers(1), &[DType::F32, DType::Bf16], &[0, 1, 2, 4]);
    assert!(ran > 0);
}

#[test]
fn bad_inputs_are_typed_errors() {
    let dev = Device::cpu();
    let f = |shape: &[usize]| dev.zeros(shape, DType::F32).expect("alloc");
    let x = f(&[1, 4, 5, 5]);
    let (we, wd, wp) = (f(&[24, 4, 1, 1]), f(&[24, 1, 3, 3]), f(&[4, 24, 1, 1]));
    let b24 = f(&[24]);
    let good = BlockWeights {
        expand: Some(&we),
        expand_bias: Some(&b24),
        depthwise: &wd,
        depthwise_bias: Some(&b24),
        project: &wp,
        project_bias: None,
    };
    let opts = BlockOptions::default();
    assert_eq!(dev.inverted_residual(&x, &good, &opts).expect("valid").shape(), [1, 4, 5, 5]);
    let err =
        |w: &BlockWeights<'_>, o: &BlockOptions, x: &Tensor| dev.inverted_residual(x, w, o).expect_err("a bad input");
    // Rank, stride, weight shapes, bias lengths, a stray expand bias, dtypes.
    assert!(matches!(err(&good, &opts, &f(&[4, 5, 5])), Error::WrongRank { tensor: "x", .. }));
    let stride3 = opts.stride(3);
    assert!(matches!(err(&good, &stride3, &x), Error::InvalidParameter { param: "stride", .. }));
    let we_bad = f(&[24, 3, 1, 1]);
    assert!(matches!(
        err(&BlockWeights { expand: Some(&we_bad), ..good }, &opts, &x),
        Error::ShapeMismatch { tensor: "expand", .. }
    ));
    let wd_bad = f(&[24, 1, 5, 5]);
    assert!(matches!(
        err(&BlockWeights { depthwise: &wd_bad, ..good }, &opts, &x),
        Error::ShapeMismatch { tensor: "depthwise", .. }
    ));
    let wp_bad = f(&[4, 23, 1, 1]);
    assert!(matches!(
        err(&BlockWeights { project: &wp_bad, ..good }, &opts, &x),
        Error::ShapeMismatch { tensor: "project", .. }
    ));
    let b5 = f(&[5]);
    assert!(matches!(
        err(&BlockWeights { project_bias: Some(&b5), ..good }, &opts, &x),
        Error::ShapeMismatch { tensor: "project_bias", .. }
    ));
    let stray = BlockWeights { expand: None, expand_bias: Some(&b24), ..good };
    assert!(matches!(err(&stray, &opts, &x), Error::InvalidParameter { param: "expand_bias", .. }));
    let x16 = dev.zeros(&[1, 4, 5, 5], DType::F16).expect("alloc");
    assert!(matches!(err(&good, &opts, &x16), Error::DTypeMismatch { .. }));
    let x0 = f(&[1, 0, 5, 5]);
    assert!(matches!(err(&good, &opts, &x0), Error::InvalidParameter { param: "x", .. }));
    // The layout decides which axis is C: this NCHW tensor read as NHWC has C = 5.
    let nhwc = opts.layout(Layout::Nhwc);
    assert!(matches!(err(&good, &nhwc, &x), Error::ShapeMismatch { tensor: "expand", .. }));
    // Another device's tensor.
    let other = Device::cpu();
    let x_other = other.zeros(&[1, 4, 5, 5], DType::F32).expect("alloc");
    assert!(matches!(err(&good, &opts, &x_other), Error::DeviceMismatch { tensor: "x", .. }));
    // The output of `_into`: shape, dtype, aliasing an input.
    let into = |out: &Tensor| dev.inverted_residual_into(&x, &good, &opts, out).expect_err("a bad output");
    assert!(matches!(into(&f(&[1, 4, 3, 3])), Error::ShapeMismatch { tensor: "out", .. }));
    assert!(matches!(into(&dev.zeros(&[1, 4, 5, 5], DType::Bf16).expect("alloc")), Error::DTypeMismatch { .. }));
    assert!(matches!(into(&x), Error::Aliasing { .. }));
    // Packing checks the weights as the op does, and a packed block takes the op's checks.
    let pack_err = |w: &BlockWeights<'_>| dev.pack_block_weights(w).expect_err("bad weights");
    let wp_bad = f(&[4, 23, 1, 1]);
    assert!(matches!(
        pack_err(&BlockWeights { project: &wp_bad, ..good }),
        Error::ShapeMismatch { tensor: "project", .. }
    ));
    let we_rank2 = f(&[24, 4]);
    assert!(matches!(
        pack_err(&BlockWeights { expand: Some(&we_rank2), ..good }),
        Error::WrongRank { tensor: "expand", .. }
    ));
    let b16 = dev.zeros(&[24], DType::F16).expect("alloc");
    assert!(matches!(pack_err(&BlockWeights { depthwise_bias: Some(&b16), ..good }), Error::DTypeMismatch { .. }));
    assert!(matches!(
        pack_err(&BlockWeights { expand: None, expand_bias: Some(&b24), ..good }),
        Error::InvalidParameter { param: "expand_bias", .. }
    ));
    let packed = dev.pack_block_weights(&good).expect("valid weights");
    let want = dev.inverted_residual(&x, &good, &opts).expect("valid").to_f32_vec().expect("read");
    let got = dev.inverted_residual_packed(&x, &packed, &opts).expect("valid").to_f32_vec().expect("read");
    assert_eq!(got, want, "zeros in, the same out");
    let perr = |x: &Tensor, o: &BlockOptions| dev.inverted_residual_packed(x, &packed, o).expect_err("a bad input");
    let pinto = |out: &Tensor| dev.inverted_residual_packed_into(&x, &packed, &opts, out).expect_err("a bad output");
    assert!(matches!(pinto(&f(&[1, 4, 3, 3])), Error::ShapeMismatch { tensor: "out", .. }));
    assert!(matches!(pinto(&x), Error::Aliasing { .. }));
    assert!(matches!(pinto(&wd), Error::ShapeMismatch { tensor: "out", .. } | Error::Aliasing { .. }));
    assert!(matches!(perr(&x16, &opts), Error::DTypeMismatch { .. }));
    assert!(matches!(perr(&x, &nhwc), Error::ShapeMismatch { tensor: "expand", .. }));
    assert!(matches!(perr(&x, &stride3), Error::InvalidParameter { param: "stride", .. }));
    let packed_other = other
        .pack_block_weights(&BlockWeights {
            expand: Some(&other.zeros(&[24, 4, 1, 1], DType::F32).expect("alloc")),
            expand_bias: None,
            depthwise: &other.zeros(&[24, 1, 3, 3], DType::F32).expect("alloc"),
            depthwise_bias: None,
            project: &other.zeros(&[4, 24, 1, 1], DType::F32).expect("alloc"),
            project_bias: None,
        })
        .expect("valid on its own device");
    assert!(matches!(
        dev.inverted_residual_packed(&x, &packed_other, &opts).expect_err("another device's weights"),
        Error::DeviceMismatch { .. }
    ));
    // An empty batch is an empty result, not an error.
    let empty = dev.inverted_residual(&f(&[0, 4, 5, 5]), &good, &opts).expect("empty batch");
    assert_eq!(empty.shape(), [0, 4, 5, 5]);
}
