//! The oracle: MobileNetV2's forward pass in f64, NCHW, composed of the CPU reference ops of
//! `tilekit_kernels::reference` (depthwise conv for the im2col and the depthwise layers, matmul
//! for the 1×1 convs and the classifier), on the weights and input *as a device stores them*
//! (rounded to the dtype). A device's result differs from it only by the roundings of its own
//! f32 arithmetic and of each layer's output to the storage dtype.

use crate::Weights;
use crate::arch::{self, HEAD_CHANNELS, NUM_CLASSES};
use tilekit::{Activation, Conv2dDesc, DType, Layout, MatmulDesc, MatrixView};
use tilekit_kernels::reference;

fn rounded(dtype: DType, v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| dtype.round_f32(x) as f64).collect()
}

/// `act(W·x + b + residual)` over an input `[n, cin, hw]` in f64.
fn pointwise(
    x: &[f64],
    [n, cin, hw]: [usize; 3],
    w: &[f64],
    b: &[f64],
    act: Activation,
    residual: Option<&[f64]>,
) -> Vec<f64> {
    let cout = b.len();
    let per_image = MatrixView::dense(cout, hw);
    let desc = MatmulDesc::new(cout, hw, cin)
        .batch(n)
        .a(MatrixView::new(0, cin, 0))
        .b(MatrixView::dense(cin, hw))
        .c(residual.map(|_| per_image))
        .out(per_image)
        .beta(1.0);
    let mut out = vec![0.0; n * cout * hw];
    reference::matmul(&desc, w, x, None, residual, &mut out);
    for (i, v) in out.iter_mut().enumerate() {
        *v = act.apply_f64(*v + b[(i / hw) % cout]);
    }
    out
}

/// The logits `[N, 1000]` of `input` (`[N, 3, H, W]`, NCHW) with `weights` rounded to `dtype`.
///
/// # Panics
/// Like the reference ops it composes, on arguments a caller must have checked: `weights`
/// without the 52 convs, or `H`, `W` below 32.
pub fn forward(weights: &Weights, dtype: DType, shape: [usize; 4], input: &[f32]) -> Vec<f64> {
    let [n, _, mut h, mut w] = shape;
    let mut convs = weights.convs.iter();
    let mut next = || convs.next().expect("52 convs");
    let r = |v: &[f32]| rounded(dtype, v);
    // Stem: im2col (a one-hot depthwise conv, multiplier 9) then a pointwise conv 27 -> 32.
    let mut desc = Conv2dDesc::mobilenet_v2_block(n, 3, 0, 2, Layout::Nchw);
    (desc.height, desc.width, desc.multiplier, desc.has_bias, desc.activation) = (h, w, 9, false, Activation::None);
    let one_hot: Vec<f64> = (0..27 * 9).map(|i| if i / 9 % 9 == i % 9 { 1.0 } else { 0.0 }).collect();
    let (oh, ow) = (desc.out_h().expect("H >= 32"), desc.out_w().expect("W >= 32"));
    let mut patches = vec![0.0; n * 27 * oh * ow];
    reference::depthwise_conv2d(&desc, &r(input), &one_hot, None, &mut patches);
    (h, w) = (oh, ow);
    let stem = next();
    let mut x = pointwise(&patches, [n, 27, h * w], &r(&stem.weight), &r(&stem.bias), Activation::Relu6, None);
    for spec in arch::blocks() {
        let hidden = if spec.has_expand() {
            let c = next();
            pointwise(&x, [n, spec.inp, h * w], &r(&c.weight), &r(&c.bias), Activation::Relu6, None)
        } else {
            x.clone()
        };
        let c = next();
        let desc = Conv2dDesc::mobilenet_v2_block(n, spec.hidden, 0, spec.stride, Layout::Nchw).height(h).width(w);
        let (oh, ow) = (desc.out_h().expect("valid"), desc.out_w().expect("valid"));
        let mut filtered = vec![0.0; n * spec.hidden * oh * ow];
        reference::depthwise_conv2d(&desc, &hidden, &r(&c.weight), Some(&r(&c.bias)), &mut filtered);
        (h, w) = (oh, ow);
        let c = next();
        let residual = spec.residual().then_some(x.as_slice());
        x = pointwise(&filtered, [n, spec.hidden, h * w], &r(&c.weight), &r(&c.bias), Activation::None, residual);
    }
    let head = next();
    let x = pointwise(&x, [n, 320, h * w], &r(&head.weight), &r(&head.bias), Activation::Relu6, None);
    let hw = h * w;
    let pooled: Vec<f64> = x.chunks(hw).map(|c| c.iter().sum::<f64>() / hw as f64).collect();
    let desc = MatmulDesc::new(n, NUM_CLASSES, HEAD_CHANNELS)
        .trans_b(true)
        .b(MatrixView::dense(NUM_CLASSES, HEAD_CHANNELS))
        .bias_offset(Some(0));
    let mut logits = vec![0.0; n * NUM_CLASSES];
    reference::matmul(&desc, &pooled, &r(&weights.fc_weight), Some(&r(&weights.fc_bias)), None, &mut logits);
    logits
}
