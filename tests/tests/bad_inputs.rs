//! The bad-input catalogue: one row per bad input the public API can meet, each asserting the
//! exact `tilekit::Error` variant (and the argument it names), for every op, on every backend
//! present, in every dtype it runs. Zero-sized dims are here too: they are not errors (M or
//! N = 0 gives an empty result, K = 0 the epilogue of zeros).

use tilekit::{
    Activation, BackendKind, Conv2dOptions, DType, Device, Error, Layout, MatmulDesc, MatmulOptions, MatrixView,
    Result, Tensor, WgpuOptions,
};
use tilekit_tests::{backends, backends_for, skip};

/// One row: what is wrong, the call, and the outcome it must have.
struct Row {
    name: &'static str,
    call: fn(&Device, DType) -> Result<()>,
    expect: fn(&Result<()>) -> bool,
}

fn t(dev: &Device, dtype: DType, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
    dev.tensor_from_f32(shape, dtype, &data).unwrap_or_else(|e| panic!("building a {shape:?} tensor: {e}"))
}

/// The other 16-bit dtype, or f32's neighbour: a dtype different from `d`.
fn other(d: DType) -> DType {
    match d {
        DType::F32 => DType::F16,
        DType::F16 => DType::Bf16,
        DType::Bf16 => DType::F32,
        other => unimplemented!("{other:?}"),
    }
}

/// A second device of the same kind as `dev` (a tensor from it is "from another device").
fn twin(dev: &Device) -> Device {
    match dev.kind() {
        BackendKind::Wgpu => Device::wgpu(&WgpuOptions::allow_software()).unwrap_or_else(|e| panic!("{e}")),
        BackendKind::Cuda => Device::cuda(0).unwrap_or_else(|e| panic!("{e}")),
        _ => Device::cpu(),
    }
}

fn mm(dev: &Device, a: &Tensor, b: &Tensor, opts: &MatmulOptions<'_>) -> Result<()> {
    dev.matmul(a, b, opts).map(|_| ())
}

fn into(dev: &Device, d: DType, desc: &MatmulDesc, lens: [usize; 3]) -> Result<()> {
    let (a, b, out) = (t(dev, d, &[lens[0]]), t(dev, d, &[lens[1]]), t(dev, d, &[lens[2]]));
    dev.matmul_into(desc, &a, &b, None, None, &out)
}

fn conv(
    dev: &Device,
    d: DType,
    input: &[usize],
    weight: &[usize],
    bias: Option<usize>,
    o: Conv2dOptions,
) -> Result<()> {
    let bias = bias.map(|n| t(dev, d, &[n]));
    dev.depthwise_conv2d(&t(dev, d, input), &t(dev, d, weight), bias.as_ref(), &o).map(|_| ())
}

fn rows() -> Vec<Row> {
    use Error::*;
    vec![
        // ---- matmul: shapes and ranks ----
        Row {
            name: "matmul: inner dimensions differ",
            call: |dev, d| mm(dev, &t(dev, d, &[2, 3]), &t(dev, d, &[4, 5]), &MatmulOptions::default()),
            expect: |r| matches!(r, Err(ShapeMismatch { op: "matmul", tensor: "b", .. })),
        },
        Row {
            name: "matmul: rank-1 a",
            call: |dev, d| mm(dev, &t(dev, d, &[6]), &t(dev, d, &[6, 2]), &MatmulOptions::default()),
            expect: |r| matches!(r, Err(WrongRank { op: "matmul", tensor: "a", actual: 1, .. })),
        },
        Row {
            name: "matmul: rank-4 b",
            call: |dev, d| mm(dev, &t(dev, d, &[2, 3]), &t(dev, d, &[1, 1, 3, 2]), &MatmulOptions::default()),
            expect: |r| matches!(r, Err(WrongRank { op: "matmul", tensor: "b", actual: 4, .. })),
        },
        Row {
            name: "matmul: batch counts 2 and 3",
            call: |dev, d| mm(dev, &t(dev, d, &[2, 2, 3]), &t(dev, d, &[3, 3, 2]), &MatmulOptions::default()),
            expect: |r| matches!(r, Err(ShapeMismatch { op: "matmul", tensor: "b", .. })),
        },
        Row {
            name: "matmul: bias of the wrong length",
            call: |dev, d| {
                let bias = t(dev, d, &[3]);
                let o = MatmulOptions::default().bias(Some(&bias));
                mm(dev, &t(dev, d, &[2, 3]), &t(dev, d, &[3, 2]), &o)
            },
            expect: |r| matches!(r, Err(ShapeMismatch { op: "matmul", tensor: "bias", .. })),
        },
        Row {
            name: "matmul: rank-2 bias",
            call: |dev, d| {
                let bias = t(dev, d, &[1, 2]);
                let o = MatmulOptions::default().bias(Some(&bias));
                mm(dev, &t(dev, d, &[2, 3]), &t(dev, d, &[3, 2]), &o)
            },
            expect: |r| matches!(r, Err(ShapeMismatch { op: "matmul", tensor: "bias", .. })),
        },
        Row {
            name: "matmul: residual of the wrong shape",
            call: |dev, d| {
                let c = t(dev, d, &[2, 3]);
                let o = MatmulOptions::default().c(Some(&c));
                mm(dev, &t(dev, d, &[2, 3]), &t(dev, d, &[3, 2]), &o)
            },
            expect: |r| matches!(r, Err(ShapeMismatch { op: "matmul", tensor: "c", .. })),
        },
        // ---- matmul: zero-sized dims are fine ----
        Row {
            name: "matmul: M = 0 gives an empty [0, N] result",
            call: |dev, d| {
                let y = dev.matmul(&t(dev, d, &[0, 3]), &t(dev, d, &[3, 4]), &MatmulOptions::default())?;
                assert_eq!(y.shape(), [0, 4]);
                Ok(())
            },
            expect: |r| r.is_ok(),
        },
        Row {
            name: "matmul: N = 0 in a batch gives an empty [2, M, 0] result",
            call: |dev, d| {
                let y = dev.matmul(&t(dev, d, &[2, 5, 3]), &t(dev, d, &[3, 0]), &MatmulOptions::default())?;
                assert_eq!(y.shape(), [2, 5, 0]);
                Ok(())
            },
            expect: |r| r.is_ok(),
        },
        Row {
            name: "matmul: batch 0 gives an empty result",
            call: |dev, d| {
                let y = dev.matmul(&t(dev, d, &[0, 5, 3]), &t(dev, d, &[3, 2]), &MatmulOptions::default())?;
                assert_eq!(y.shape(), [0, 5, 2]);
                Ok(())
            },
            expect: |r| r.is_ok(),
        },
        Row {
            name: "matmul: K = 0 gives the epilogue of zeros (relu(bias))",
            call: |dev, d| {
                let bias = dev.tensor_from_f32(&[3], d, &[1.0, -2.0, 3.0])?;
                let o = MatmulOptions::default().bias(Some(&bias)).activation(Activation::Relu);
                let y = dev.matmul(&t(dev, d, &[2, 0]), &t(dev, d, &[0, 3]), &o)?;
                assert_eq!(y.to_f32_vec()?, [1.0, 0.0, 3.0, 1.0, 0.0, 3.0]);
                Ok(())
            },
            expect: |r| r.is_ok(),
        },
        // ---- matmul: counts, views and strides ----
        Row {
            name: "matmul: a leading dimension whose extent overflows usize",
            call: |dev, d| {
                let mut desc = MatmulDesc::new(3, 2, 2);
                desc.a.ld = usize::MAX / 2;
                into(dev, d, &desc, [6, 4, 6])
            },
            expect: |r| matches!(r, Err(Overflow { op: "matmul", .. })),
        },
        Row {
            name: "matmul: an offset that overflows usize",
            call: |dev, d| {
                let mut desc = MatmulDesc::new(2, 2, 2);
                desc.out.offset = usize::MAX - 1;
                into(dev, d, &desc, [4, 4, 4])
            },
            expect: |r| matches!(r, Err(Overflow { op: "matmul", .. })),
        },
        Row {
            name: "matmul: a batch stride whose extent overflows usize",
            call: |dev, d| {
                let mut desc = MatmulDesc::new(2, 2, 2);
                desc.batch = 3;
                desc.a.batch_stride = 0;
                desc.b.batch_stride = usize::MAX / 2;
                desc.out.batch_stride = 4;
                into(dev, d, &desc, [4, 4, 12])
            },
            expect: |r| matches!(r, Err(Overflow { op: "matmul", .. })),
        },
        Row {
            name: "matmul: a's view runs past its buffer",
            call: |dev, d| {
                let mut desc = MatmulDesc::new(2, 2, 2);
                desc.a.offset = 1;
                into(dev, d, &desc, [4, 4, 4])
            },
            expect: |r| matches!(r, Err(ViewOutOfBounds { op: "matmul", tensor: "a", needed: 5, len: 4 })),
        },
        Row {
            name: "matmul: out's view runs past its buffer",
            call: |dev, d| into(dev, d, &MatmulDesc::new(2, 3, 2), [4, 6, 5]),
            expect: |r| matches!(r, Err(ViewOutOfBounds { op: "matmul", tensor: "out", needed: 6, len: 5 })),
        },
        Row {
            name: "matmul: a batched b view needs more batches than its buffer has",
            call: |dev, d| {
                let mut desc = MatmulDesc::new(2, 2, 2);
                desc.batch = 2;
                desc.out.batch_stride = 4;
                into(dev, d, &desc, [8, 4, 8])
            },
            expect: |r| matches!(r, Err(ViewOutOfBounds { op: "matmul", tensor: "b", .. })),
        },
        Row {
            name: "matmul: a leading dimension below the column count",
            call: |dev, d| {
                let mut desc = MatmulDesc::new(3, 2, 4);
                desc.a.ld = 3;
                into(dev, d, &desc, [12, 8, 6])
            },
            expect: |r| matches!(r, Err(InvalidParameter { op: "matmul", param: "leading dimension", .. })),
        },
        Row {
            name: "matmul: output batches that overlap",
            call: |dev, d| {
                let mut desc = MatmulDesc::new(2, 2, 2);
                desc.batch = 2;
                desc.a.batch_stride = 0;
                desc.b.batch_stride = 0;
                desc.out.batch_stride = 3;
                into(dev, d, &desc, [4, 4, 8])
            },
            expect: |r| matches!(r, Err(InvalidParameter { op: "matmul", param: "out batch stride", .. })),
        },
        Row {
            name: "matmul: output batch stride 0 (every batch on one matrix)",
            call: |dev, d| {
                let mut desc = MatmulDesc::new(2, 2, 2);
                desc.batch = 2;
                desc.a.batch_stride = 0;
                desc.b.batch_stride = 0;
                desc.out.batch_stride = 0;
                into(dev, d, &desc, [4, 4, 4])
            },
            expect: |r| matches!(r, Err(InvalidParameter { op: "matmul", param: "out batch stride", .. })),
        },
        Row {
            name: "matmul: a bias offset without a bias tensor",
            call: |dev, d| {
                let mut desc = MatmulDesc::new(2, 2, 2);
                desc.bias_offset = Some(0);
                into(dev, d, &desc, [4, 4, 4])
            },
            expect: |r| matches!(r, Err(InvalidParameter { op: "matmul", param: "bias", .. })),
        },
        Row {
            name: "matmul: a bias view past its buffer",
            call: |dev, d| {
                let mut desc = MatmulDesc::new(2, 3, 2);
                desc.bias_offset = Some(2);
                let (a, b, bias, out) = (t(dev, d, &[4]), t(dev, d, &[6]), t(dev, d, &[4]), t(dev, d, &[6]));
                dev.matmul_into(&desc, &a, &b, Some(&bias), None, &out)
            },
            expect: |r| matches!(r, Err(ViewOutOfBounds { op: "matmul", tensor: "bias", needed: 5, len: 4 })),
        },
        // ---- matmul: aliasing, dtypes, devices, scalars ----
        Row {
            name: "matmul: the output aliases a",
            call: |dev, d| {
                let a = t(dev, d, &[4]);
                dev.matmul_into(&MatmulDesc::new(2, 2, 2), &a, &t(dev, d, &[4]), None, None, &a)
            },
            expect: |r| matches!(r, Err(Aliasing { op: "matmul", tensor: "a" })),
        },
        Row {
            name: "matmul: the output aliases c (a clone of the same buffer)",
            call: |dev, d| {
                let mut desc = MatmulDesc::new(2, 2, 2);
                desc.c = Some(MatrixView::dense(2, 2));
                let c = t(dev, d, &[4]);
                let out = c.clone();
                dev.matmul_into(&desc, &t(dev, d, &[4]), &t(dev, d, &[4]), None, Some(&c), &out)
            },
            expect: |r| matches!(r, Err(Aliasing { op: "matmul", tensor: "c" })),
        },
        Row {
            name: "matmul: the output aliases the bias through a reshape",
            call: |dev, d| {
                let mut desc = MatmulDesc::new(2, 2, 2);
                desc.bias_offset = Some(0);
                let bias = t(dev, d, &[4]);
                let out = bias.reshape(&[2, 2])?;
                dev.matmul_into(&desc, &t(dev, d, &[4]), &t(dev, d, &[4]), Some(&bias), None, &out)
            },
            expect: |r| matches!(r, Err(Aliasing { op: "matmul", tensor: "bias" })),
        },
        Row {
            name: "matmul: mixed dtypes (b in another dtype)",
            call: |dev, d| {
                let b = dev.tensor_from_f32(&[3, 2], other(d), &[0.0; 6]);
                match b {
                    Ok(b) => mm(dev, &t(dev, d, &[2, 3]), &b, &MatmulOptions::default()),
                    // The other dtype does not run here; the row is then about nothing.
                    Err(_) => Err(DTypeMismatch { op: "matmul", tensor: "b", expected: d, actual: other(d) }),
                }
            },
            expect: |r| matches!(r, Err(DTypeMismatch { op: "matmul", tensor: "b", .. })),
        },
        Row {
            name: "matmul: b from another device",
            call: |dev, d| mm(dev, &t(dev, d, &[2, 3]), &t(&twin(dev), d, &[3, 2]), &MatmulOptions::default()),
            expect: |r| matches!(r, Err(DeviceMismatch { op: "matmul", tensor: "b" })),
        },
        Row {
            name: "matmul_into: out from the CPU device",
            call: |dev, d| {
                let out = t(&Device::cpu(), d, &[4]);
                dev.matmul_into(&MatmulDesc::new(2, 2, 2), &t(dev, d, &[4]), &t(dev, d, &[4]), None, None, &out)
            },
            expect: |r| matches!(r, Err(DeviceMismatch { op: "matmul", tensor: "out" })),
        },
        Row {
            name: "matmul: NaN alpha",
            call: |dev, d| {
                let o = MatmulOptions::default().alpha(f32::NAN);
                mm(dev, &t(dev, d, &[2, 3]), &t(dev, d, &[3, 2]), &o)
            },
            expect: |r| matches!(r, Err(InvalidParameter { op: "matmul", param: "alpha", .. })),
        },
        Row {
            name: "matmul: infinite beta",
            call: |dev, d| {
                let c = t(dev, d, &[2, 2]);
                let o = MatmulOptions::default().beta(f32::NEG_INFINITY).c(Some(&c));
                mm(dev, &t(dev, d, &[2, 3]), &t(dev, d, &[3, 2]), &o)
            },
            expect: |r| matches!(r, Err(InvalidParameter { op: "matmul", param: "beta", .. })),
        },
        // ---- depthwise conv ----
        Row {
            name: "conv: stride 0",
            call: |dev, d| conv(dev, d, &[1, 2, 5, 5], &[2, 1, 3, 3], None, Conv2dOptions::default().stride([1, 0])),
            expect: |r| matches!(r, Err(InvalidParameter { op: "depthwise_conv2d", param: "stride", .. })),
        },
        Row {
            name: "conv: dilation 0",
            call: |dev, d| conv(dev, d, &[1, 2, 5, 5], &[2, 1, 3, 3], None, Conv2dOptions::default().dilation([0, 1])),
            expect: |r| matches!(r, Err(InvalidParameter { op: "depthwise_conv2d", param: "dilation", .. })),
        },
        Row {
            name: "conv: empty output (a 5×5 filter over a 3×3 input, no padding)",
            call: |dev, d| conv(dev, d, &[1, 2, 3, 3], &[2, 1, 5, 5], None, Conv2dOptions::default()),
            expect: |r| matches!(r, Err(InvalidParameter { op: "depthwise_conv2d", param: "padding", .. })),
        },
        Row {
            name: "conv: empty output from dilation",
            call: |dev, d| conv(dev, d, &[1, 2, 4, 4], &[2, 1, 3, 3], None, Conv2dOptions::default().dilation([2, 2])),
            expect: |r| matches!(r, Err(InvalidParameter { op: "depthwise_conv2d", param: "padding", .. })),
        },
        Row {
            name: "conv: padding that overflows usize",
            call: |dev, d| {
                conv(
                    dev,
                    d,
                    &[1, 2, 4, 4],
                    &[2, 1, 3, 3],
                    None,
                    Conv2dOptions::default().padding([usize::MAX, 1, 0, 0]),
                )
            },
            expect: |r| {
                matches!(
                    r,
                    Err(InvalidParameter { op: "depthwise_conv2d", param: "padding", .. })
                        | Err(Overflow { op: "depthwise_conv2d", .. })
                )
            },
        },
        Row {
            name: "conv: weight [C·m, 2, kh, kw]",
            call: |dev, d| conv(dev, d, &[1, 2, 5, 5], &[2, 2, 3, 3], None, Conv2dOptions::default()),
            expect: |r| matches!(r, Err(ShapeMismatch { op: "depthwise_conv2d", tensor: "weight", .. })),
        },
        Row {
            name: "conv: weight channels not a multiple of the input's",
            call: |dev, d| conv(dev, d, &[1, 2, 5, 5], &[3, 1, 3, 3], None, Conv2dOptions::default()),
            expect: |r| matches!(r, Err(ShapeMismatch { op: "depthwise_conv2d", tensor: "weight", .. })),
        },
        Row {
            name: "conv: rank-3 weight",
            call: |dev, d| conv(dev, d, &[1, 2, 5, 5], &[2, 3, 3], None, Conv2dOptions::default()),
            expect: |r| matches!(r, Err(WrongRank { op: "depthwise_conv2d", tensor: "weight", actual: 3, .. })),
        },
        Row {
            name: "conv: a 0×3 filter",
            call: |dev, d| conv(dev, d, &[1, 2, 5, 5], &[2, 1, 0, 3], None, Conv2dOptions::default()),
            expect: |r| matches!(r, Err(InvalidParameter { op: "depthwise_conv2d", param: "weight", .. })),
        },
        Row {
            name: "conv: rank-3 input",
            call: |dev, d| conv(dev, d, &[2, 5, 5], &[2, 1, 3, 3], None, Conv2dOptions::default()),
            expect: |r| matches!(r, Err(WrongRank { op: "depthwise_conv2d", tensor: "input", actual: 3, .. })),
        },
        Row {
            name: "conv: bias of the wrong length (C instead of C·m)",
            call: |dev, d| conv(dev, d, &[1, 2, 5, 5], &[4, 1, 3, 3], Some(2), Conv2dOptions::default()),
            expect: |r| matches!(r, Err(ShapeMismatch { op: "depthwise_conv2d", tensor: "bias", .. })),
        },
        Row {
            name: "conv: NHWC input with an NCHW-sized weight",
            call: |dev, d| {
                conv(dev, d, &[1, 5, 5, 2], &[5, 1, 3, 3], None, Conv2dOptions::default().layout(Layout::Nhwc))
            },
            expect: |r| matches!(r, Err(ShapeMismatch { op: "depthwise_conv2d", tensor: "weight", .. })),
        },
        Row {
            name: "conv: weight in another dtype",
            call: |dev, d| match dev.tensor_from_f32(&[2, 1, 3, 3], other(d), &[0.0; 18]) {
                Ok(w) => {
                    dev.depthwise_conv2d(&t(dev, d, &[1, 2, 5, 5]), &w, None, &Conv2dOptions::default()).map(|_| ())
                }
                Err(_) => {
                    Err(DTypeMismatch { op: "depthwise_conv2d", tensor: "weight", expected: d, actual: other(d) })
                }
            },
            expect: |r| matches!(r, Err(DTypeMismatch { op: "depthwise_conv2d", tensor: "weight", .. })),
        },
        Row {
            name: "conv: weight from another device",
            call: |dev, d| {
                let w = t(&twin(dev), d, &[2, 1, 3, 3]);
                dev.depthwise_conv2d(&t(dev, d, &[1, 2, 5, 5]), &w, None, &Conv2dOptions::default()).map(|_| ())
            },
            expect: |r| matches!(r, Err(DeviceMismatch { op: "depthwise_conv2d", tensor: "weight" })),
        },
        Row {
            name: "conv_into: the output aliases the input",
            call: |dev, d| {
                let x = t(dev, d, &[1, 2, 5, 5]);
                dev.depthwise_conv2d_into(&x, &t(dev, d, &[2, 1, 1, 1]), None, &Conv2dOptions::default(), &x)
            },
            expect: |r| matches!(r, Err(Aliasing { op: "depthwise_conv2d", tensor: "input" })),
        },
        Row {
            name: "conv_into: an output of the wrong shape",
            call: |dev, d| {
                let out = t(dev, d, &[1, 2, 5, 5]);
                dev.depthwise_conv2d_into(
                    &t(dev, d, &[1, 2, 5, 5]),
                    &t(dev, d, &[2, 1, 3, 3]),
                    None,
                    &Conv2dOptions::default(),
                    &out,
                )
            },
            expect: |r| matches!(r, Err(ShapeMismatch { op: "depthwise_conv2d", tensor: "out", .. })),
        },
        Row {
            name: "conv: batch 0 and 0 channels give empty outputs",
            call: |dev, d| {
                let y = dev.depthwise_conv2d(
                    &t(dev, d, &[0, 2, 5, 5]),
                    &t(dev, d, &[2, 1, 3, 3]),
                    None,
                    &Conv2dOptions::default(),
                )?;
                assert_eq!(y.shape(), [0, 2, 3, 3]);
                let y = dev.depthwise_conv2d(
                    &t(dev, d, &[1, 0, 5, 5]),
                    &t(dev, d, &[0, 1, 3, 3]),
                    None,
                    &Conv2dOptions::default(),
                )?;
                assert_eq!(y.shape(), [1, 0, 3, 3]);
                Ok(())
            },
            expect: |r| r.is_ok(),
        },
        // ---- activation ----
        Row {
            name: "activation: bias of the wrong length",
            call: |dev, d| dev.activation(&t(dev, d, &[3, 4]), Some(&t(dev, d, &[3])), Activation::Relu).map(|_| ()),
            expect: |r| matches!(r, Err(ShapeMismatch { op: "activation", tensor: "bias", .. })),
        },
        Row {
            name: "activation: a bias on a rank-0 tensor",
            call: |dev, d| dev.activation(&t(dev, d, &[]), Some(&t(dev, d, &[1])), Activation::Relu).map(|_| ()),
            expect: |r| matches!(r, Err(WrongRank { op: "activation", tensor: "x", .. })),
        },
        Row {
            name: "activation_into: an output of the wrong shape",
            call: |dev, d| dev.activation_into(&t(dev, d, &[3, 4]), None, Activation::Gelu, &t(dev, d, &[4, 3])),
            expect: |r| matches!(r, Err(ShapeMismatch { op: "activation", tensor: "out", .. })),
        },
        Row {
            name: "activation_in_place: the bias is x itself",
            call: |dev, d| {
                let x = t(dev, d, &[4]);
                dev.activation_in_place(&x, Some(&x), Activation::Relu)
            },
            expect: |r| matches!(r, Err(Aliasing { op: "activation", tensor: "bias" })),
        },
        Row {
            name: "activation_into: the output is the bias",
            call: |dev, d| {
                let bias = t(dev, d, &[4]);
                dev.activation_into(&t(dev, d, &[4]), Some(&bias), Activation::Relu, &bias)
            },
            expect: |r| matches!(r, Err(Aliasing { op: "activation", tensor: "bias" })),
        },
        Row {
            name: "activation: bias in another dtype",
            call: |dev, d| match dev.tensor_from_f32(&[4], other(d), &[0.0; 4]) {
                Ok(b) => dev.activation(&t(dev, d, &[2, 4]), Some(&b), Activation::Relu).map(|_| ()),
                Err(_) => Err(DTypeMismatch { op: "activation", tensor: "bias", expected: d, actual: other(d) }),
            },
            expect: |r| matches!(r, Err(DTypeMismatch { op: "activation", tensor: "bias", .. })),
        },
        Row {
            name: "activation: x from another device",
            call: |dev, d| dev.activation(&t(&twin(dev), d, &[4]), None, Activation::Relu).map(|_| ()),
            expect: |r| matches!(r, Err(DeviceMismatch { op: "activation", tensor: "x" })),
        },
        Row {
            name: "activation: an empty tensor is fine",
            call: |dev, d| {
                let y = dev.activation(&t(dev, d, &[3, 0]), Some(&t(dev, d, &[0])), Activation::Gelu)?;
                assert_eq!(y.shape(), [3, 0]);
                Ok(())
            },
            expect: |r| r.is_ok(),
        },
        // ---- glu ----
        Row {
            name: "glu: an odd last dimension",
            call: |dev, d| dev.glu(&t(dev, d, &[2, 5]), Activation::Silu).map(|_| ()),
            expect: |r| matches!(r, Err(InvalidParameter { op: "glu", param: "h", .. })),
        },
        Row {
            name: "glu: a rank-0 tensor",
            call: |dev, d| dev.glu(&t(dev, d, &[]), Activation::Silu).map(|_| ()),
            expect: |r| matches!(r, Err(WrongRank { op: "glu", tensor: "h", .. })),
        },
        Row {
            name: "glu_into: an output of the wrong shape",
            call: |dev, d| dev.glu_into(&t(dev, d, &[3, 8]), Activation::Silu, &t(dev, d, &[3, 8])),
            expect: |r| matches!(r, Err(ShapeMismatch { op: "glu", tensor: "out", .. })),
        },
        Row {
            name: "glu_into: the output is h",
            call: |dev, d| {
                let h = t(dev, d, &[2, 4]);
                dev.glu_into(&h, Activation::Silu, &h)
            },
            expect: |r| matches!(r, Err(Aliasing { op: "glu", tensor: "h" })),
        },
        Row {
            name: "glu_into: an output in another dtype",
            call: |dev, d| match dev.tensor_from_f32(&[2, 2], other(d), &[0.0; 4]) {
                Ok(o) => dev.glu_into(&t(dev, d, &[2, 4]), Activation::Silu, &o),
                Err(_) => Err(DTypeMismatch { op: "glu", tensor: "out", expected: d, actual: other(d) }),
            },
            expect: |r| matches!(r, Err(DTypeMismatch { op: "glu", tensor: "out", .. })),
        },
        Row {
            name: "glu: h from another device",
            call: |dev, d| dev.glu(&t(&twin(dev), d, &[4]), Activation::Silu).map(|_| ()),
            expect: |r| matches!(r, Err(DeviceMismatch { op: "glu", tensor: "h" })),
        },
        Row {
            name: "glu: an empty tensor is fine",
            call: |dev, d| {
                let y = dev.glu(&t(dev, d, &[0, 6]), Activation::Silu)?;
                assert_eq!(y.shape(), [0, 3]);
                let y = dev.glu(&t(dev, d, &[3, 0]), Activation::Silu)?;
                assert_eq!(y.shape(), [3, 0]);
                Ok(())
            },
            expect: |r| r.is_ok(),
        },
        // ---- tensors ----
        Row {
            name: "tensor: host data of the wrong length",
            call: |dev, d| dev.tensor_from_f32(&[2, 3], d, &[0.0; 5]).map(|_| ()),
            expect: |r| matches!(r, Err(DataLength { expected: 6, actual: 5, .. })),
        },
        Row {
            name: "tensor: a shape whose element count overflows",
            call: |dev, d| dev.zeros(&[usize::MAX, 2], d).map(|_| ()),
            expect: |r| matches!(r, Err(Overflow { .. })),
        },
        Row {
            name: "tensor: an allocation no machine has (2^60 elements)",
            call: |dev, d| dev.zeros(&[1usize << 60], d).map(|_| ()),
            // Every backend says out of memory: the CPU's allocator, the CUDA driver, and the
            // wgpu backend, which refuses a size above the device's `max_buffer_size` up front.
            expect: |r| matches!(r, Err(OutOfMemory { .. })),
        },
        Row {
            name: "tensor: to_vec in the wrong element type",
            call: |dev, d| match d {
                DType::F32 => t(dev, d, &[2]).to_vec::<half::f16>().map(|_| ()),
                _ => t(dev, d, &[2]).to_vec::<f32>().map(|_| ()),
            },
            expect: |r| matches!(r, Err(DTypeMismatch { .. })),
        },
        Row {
            name: "tensor: reshape to another element count",
            call: |dev, d| t(dev, d, &[2, 3]).reshape(&[5]).map(|_| ()),
            expect: |r| matches!(r, Err(InvalidParameter { op: "reshape", param: "shape", .. })),
        },
    ]
}

/// Every row, on every backend present, in every dtype it runs.
#[test]
fn bad_input_catalogue() {
    let rows = rows();
    let mut tried = 0;
    let mut failures = Vec::new();
    for dtype in DType::ALL {
        for be in backends_for(dtype) {
            for row in &rows {
                let r = (row.call)(&be.device, dtype);
                if !(row.expect)(&r) {
                    failures.push(format!("{} {dtype}: {}: got {r:?}", be.label, row.name));
                }
                tried += 1;
            }
        }
    }
    eprintln!("bad_input_catalogue: {} rows, {tried} (row, backend, dtype) calls", rows.len());
    assert!(failures.is_empty(), "{} rows failed:\n{}", failures.len(), failures.join("\n"));
}

/// Backend selection errors: unknown names and backends that are not there.
#[test]
fn backend_selection_errors() {
    assert!(matches!(BackendKind::parse("tpu"), Err(Error::UnknownBackend(name)) if name == "tpu"));
    assert!(matches!(BackendKind::parse(" CPU "), Ok(Some(BackendKind::Cpu))));
    assert!(matches!(BackendKind::parse("auto"), Ok(None)));
    let mut opts = WgpuOptions::allow_software();
    opts.adapter_name = Some("no adapter is called this".into());
    assert!(
        matches!(Device::wgpu(&opts), Err(Error::BackendUnavailable { backend: BackendKind::Wgpu, .. })),
        "an adapter name that matches nothing"
    );
    if backends().iter().any(|b| b.label == "cuda") {
        skip("cuda-unavailable row", "a CUDA device is present, so Device::cuda(0) cannot fail here");
    } else {
        assert!(matches!(Device::cuda(0), Err(Error::BackendUnavailable { backend: BackendKind::Cuda, .. })));
    }
    assert!(
        matches!(Device::cuda(usize::MAX), Err(Error::BackendUnavailable { backend: BackendKind::Cuda, .. })),
        "a CUDA ordinal no machine has"
    );
}

/// A dtype a device cannot run is refused with `UnsupportedDType`, by the dtype check and by
/// every constructor, never by a panic or a silent fallback; a dtype it can run works.
#[test]
fn unsupported_dtypes_are_typed_errors() {
    for be in backends() {
        let dev = &be.device;
        for dtype in DType::ALL {
            let zeros = dev.zeros(&[3], dtype).map(|_| ());
            let from_f32 = dev.tensor_from_f32(&[2], dtype, &[1.0, 2.0]).map(|_| ());
            match dev.check_dtype(dtype) {
                Ok(()) => {
                    assert!(
                        zeros.is_ok() && from_f32.is_ok(),
                        "{} {dtype}: supported, yet {zeros:?} {from_f32:?}",
                        be.label
                    )
                }
                Err(e) => {
                    assert!(matches!(e, Error::UnsupportedDType { .. }), "{} {dtype}: {e:?}", be.label);
                    for r in [zeros, from_f32] {
                        assert!(matches!(r, Err(Error::UnsupportedDType { .. })), "{} {dtype}: {r:?}", be.label);
                    }
                }
            }
        }
    }
}
