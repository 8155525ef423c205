//! Depthwise convolution against the reference: layouts, strides, dilation, padding,
//! multiplier, half types.

use super::*;

pub(super) fn conv_desc(layout: Layout, c: usize, m: usize, hw: (usize, usize), k: (usize, usize)) -> Conv2dDesc {
    Conv2dDesc {
        batch: 2,
        channels: c,
        height: hw.0,
        width: hw.1,
        multiplier: m,
        kernel_h: k.0,
        kernel_w: k.1,
        stride_h: 1,
        stride_w: 1,
        pad_top: 0,
        pad_bottom: 0,
        pad_left: 0,
        pad_right: 0,
        dilation_h: 1,
        dilation_w: 1,
        layout,
        has_bias: false,
        activation: Activation::None,
    }
}

pub(super) fn run_conv_case(dev: &Device, dtype: DType, d: &Conv2dDesc, seed: u64) {
    let input = dev.tensor_from_f32(&d.input_shape(), dtype, &values(d.input_shape().iter().product(), seed)).unwrap();
    let weight =
        dev.tensor_from_f32(&d.weight_shape(), dtype, &values(d.weight_shape().iter().product(), seed + 1)).unwrap();
    let bias = d.has_bias.then(|| upload(dev, dtype, &values(d.out_channels(), seed + 2)));
    let opts = crate::Conv2dOptions {
        stride: [d.stride_h, d.stride_w],
        padding: [d.pad_top, d.pad_bottom, d.pad_left, d.pad_right],
        dilation: [d.dilation_h, d.dilation_w],
        layout: d.layout,
        activation: d.activation,
    };
    let out = dev.depthwise_conv2d(&input, &weight, bias.as_ref(), &opts).unwrap();
    let got = out.to_f32_vec().unwrap();
    let (iw, ww) = (widen(&input), widen(&weight));
    let bw = bias.as_ref().map(widen);
    let mut want = vec![0.0; got.len()];
    reference::depthwise_conv2d(d, &iw, &ww, bw.as_deref(), &mut want);
    let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
    let mut mag = vec![0.0; got.len()];
    let mut dm = *d;
    dm.activation = Activation::None;
    reference::depthwise_conv2d(&dm, &abs(&iw), &abs(&ww), bw.as_deref().map(abs).as_deref(), &mut mag);
    assert_close(&format!("conv {dtype} {d:?}"), dtype, &got, &want, &mag, d.kernel_h * d.kernel_w);
}

#[test]
fn depthwise_conv_layouts_strides_dilation_padding_multiplier() {
    let Some(dev) = device(false) else { return };
    let mut cases = Vec::new();
    for layout in [Layout::Nchw, Layout::Nhwc] {
        // Plain 3x3, odd sizes, no padding.
        cases.push(conv_desc(layout, 3, 1, (5, 7), (3, 3)));
        // Multiplier 2, stride 2, asymmetric padding, bias, relu6.
        let mut d = conv_desc(layout, 3, 2, (9, 6), (3, 3));
        d.stride_h = 2;
        d.stride_w = 2;
        d.pad_top = 1;
        d.pad_bottom = 0;
        d.pad_left = 2;
        d.pad_right = 1;
        d.has_bias = true;
        d.activation = Activation::Relu6;
        cases.push(d);
        // Dilation 2, non-square filter, gelu.
        let mut d = conv_desc(layout, 5, 1, (8, 9), (3, 2));
        d.dilation_h = 2;
        d.dilation_w = 3;
        d.pad_left = 1;
        d.has_bias = true;
        d.activation = Activation::Gelu;
        cases.push(d);
        // Vector paths: OW a multiple of 4 (NCHW) and C a multiple of 4 (NHWC).
        let mut d = conv_desc(layout, 8, 1, (6, 8), (3, 3));
        d.pad_top = 1;
        d.pad_bottom = 1;
        d.pad_left = 1;
        d.pad_right = 1;
        d.has_bias = true;
        d.activation = Activation::GeluTanh;
        cases.push(d);
    }
    for (i, d) in cases.iter().enumerate() {
        run_conv_case(dev, DType::F32, d, 500 + i as u64);
    }
}

#[test]
fn depthwise_conv_half_types() {
    for (dev, dtype) in variants() {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let mut d = conv_desc(layout, 3, 2, (5, 5), (3, 3));
            d.pad_top = 1;
            d.pad_left = 1;
            d.has_bias = true;
            d.activation = Activation::Relu;
            run_conv_case(dev, dtype, &d, 600);
            let mut d = conv_desc(layout, 4, 1, (4, 8), (3, 3));
            d.pad_top = 1;
            d.pad_bottom = 1;
            d.pad_left = 1;
            d.pad_right = 1;
            run_conv_case(dev, dtype, &d, 610);
        }
    }
}
