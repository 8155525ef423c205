//! The inverted-residual block (MobileNetV2's building block) as one op: what it computes,
//! which elements it reads and writes, and its f64 reference.
//!
//! For an input `x` of `C` channels:
//! 1. *expand* (optional): `e = relu6(W_e · x + b_e)`, a 1×1 convolution to `hidden` channels
//!    (weight `[hidden, C, 1, 1]`); without it `e = x` and `hidden = C`;
//! 2. *depthwise*: `d = relu6(dw3x3(e) + b_d)`, a 3×3 depthwise convolution with padding 1 and
//!    stride 1 or 2 (weight `[hidden, 1, 3, 3]`); the padding is zero in the expanded tensor;
//! 3. *project*: `y = W_p · d + b_p (+ x)`, a linear 1×1 convolution to `C'` channels
//!    (weight `[C', hidden, 1, 1]`), plus the input when the block is residual (stride 1 and
//!    `C = C'`, as torchvision's `InvertedResidual` decides).
//!
//! Every bias is optional. Input and output share the layout (NCHW or NHWC); the weights are in
//! PyTorch's layout whatever the activations' layout is.

use crate::{Activation, Conv2dDesc, DType, Layout};

/// The descriptor of one inverted-residual block. Plain data; [`InvertedResidualDesc::checked_lens`]
/// says whether its element counts are representable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct InvertedResidualDesc {
    /// Batch size `N`.
    pub batch: usize,
    /// Input channels `C`.
    pub channels: usize,
    /// Input height.
    pub height: usize,
    /// Input width.
    pub width: usize,
    /// Expanded channels (`C · t`, e.g. `6C`); equals `channels` when there is no expand.
    pub hidden: usize,
    /// Output channels `C'`.
    pub out_channels: usize,
    /// Depthwise stride (1 or 2, both directions).
    pub stride: usize,
    /// Whether the expand 1×1 convolution is present.
    pub expand: bool,
    /// Layout of input and output.
    pub layout: Layout,
    /// Whether the expand convolution has a bias.
    pub expand_bias: bool,
    /// Whether the depthwise convolution has a bias.
    pub dw_bias: bool,
    /// Whether the projection has a bias.
    pub project_bias: bool,
}

/// Element counts of every tensor a block touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLens {
    /// Input `N·C·H·W`.
    pub input: usize,
    /// Output `N·C'·H'·W'`.
    pub output: usize,
    /// Expand weight `hidden·C` (0 without expand).
    pub expand_weight: usize,
    /// Depthwise weight `hidden·9`.
    pub dw_weight: usize,
    /// Projection weight `C'·hidden`.
    pub project_weight: usize,
    /// The expanded tensor `N·hidden·H·W` (what the unfused chain writes and reads).
    pub expanded: usize,
    /// The depthwise output `N·hidden·H'·W'`.
    pub filtered: usize,
}

impl InvertedResidualDesc {
    /// Output height `H' = ⌈H / stride⌉` (a 3×3 filter with padding 1).
    pub fn out_h(&self) -> usize {
        if self.stride == 0 { 0 } else { self.height.div_ceil(self.stride) }
    }

    /// Output width `W' = ⌈W / stride⌉`.
    pub fn out_w(&self) -> usize {
        if self.stride == 0 { 0 } else { self.width.div_ceil(self.stride) }
    }

    /// Whether the input is added to the projection (stride 1 and `C = C'`).
    pub fn residual(&self) -> bool {
        self.stride == 1 && self.channels == self.out_channels
    }

    /// Input shape in the desc's layout.
    pub fn input_shape(&self) -> [usize; 4] {
        match self.layout {
            Layout::Nchw => [self.batch, self.channels, self.height, self.width],
            Layout::Nhwc => [self.batch, self.height, self.width, self.channels],
        }
    }

    /// Output shape in the desc's layout.
    pub fn output_shape(&self) -> [usize; 4] {
        let (oh, ow) = (self.out_h(), self.out_w());
        match self.layout {
            Layout::Nchw => [self.batch, self.out_channels, oh, ow],
            Layout::Nhwc => [self.batch, oh, ow, self.out_channels],
        }
    }

    /// The element counts of every tensor, or `None` when one of them overflows `usize`.
    pub fn checked_lens(&self) -> Option<BlockLens> {
        let prod = |dims: &[usize]| dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let (oh, ow) = (self.out_h(), self.out_w());
        Some(BlockLens {
            input: prod(&[self.batch, self.channels, self.height, self.width])?,
            output: prod(&[self.batch, self.out_channels, oh, ow])?,
            expand_weight: if self.expand { prod(&[self.hidden, self.channels])? } else { 0 },
            dw_weight: prod(&[self.hidden, 9])?,
            project_weight: prod(&[self.out_channels, self.hidden])?,
            expanded: prod(&[self.batch, self.hidden, self.height, self.width])?,
            filtered: prod(&[self.batch, self.hidden, oh, ow])?,
        })
    }

    /// Input element index of `(n, c, y, x)`.
    #[inline]
    pub fn input_index(&self, n: usize, c: usize, y: usize, x: usize) -> usize {
        match self.layout {
            Layout::Nchw => ((n * self.channels + c) * self.height + y) * self.width + x,
            Layout::Nhwc => ((n * self.height + y) * self.width + x) * self.channels + c,
        }
    }

    /// Output element index of `(n, c', y, x)`.
    #[inline]
    pub fn output_index(&self, n: usize, c: usize, y: usize, x: usize) -> usize {
        let (oh, ow) = (self.out_h(), self.out_w());
        match self.layout {
            Layout::Nchw => ((n * self.out_channels + c) * oh + y) * ow + x,
            Layout::Nhwc => ((n * oh + y) * ow + x) * self.out_channels + c,
        }
    }

    /// The depthwise stage as a [`Conv2dDesc`] over the expanded tensor (the unfused chain's
    /// middle op): 3×3, padding 1, the block's stride, ReLU6.
    pub fn depthwise_desc(&self) -> Conv2dDesc {
        let mut d = Conv2dDesc::mobilenet_v2_block(self.batch, self.hidden, 0, self.stride, self.layout);
        d.height = self.height;
        d.width = self.width;
        d.has_bias = self.dw_bias;
        d
    }

    /// Bytes the unfused chain must move through DRAM at the least (every tensor written once
    /// and read once per op that takes it, weights once per op), for `dtype` storage.
    pub fn unfused_dram_bytes(&self, dtype: DType) -> Option<u64> {
        let l = self.checked_lens()?;
        let w = self.weight_elems()?;
        let expand = if self.expand { l.input as u64 + 2 * l.expanded as u64 } else { 0 };
        // Expand reads x and writes e; depthwise reads e and writes d; project reads d (and x
        // when residual) and writes y.
        // Without expand the depthwise reads x itself (hidden = C, so as many elements).
        let dw_in = l.expanded as u64;
        let residual = if self.residual() { l.input as u64 } else { 0 };
        let elems = expand + dw_in + 2 * l.filtered as u64 + residual + l.output as u64 + w;
        elems.checked_mul(dtype.size_bytes() as u64)
    }

    /// Bytes the fused kernel must move through DRAM at the least: the input once (again for
    /// the residual), the weights and the output; the expanded tensors stay on chip.
    pub fn fused_dram_bytes(&self, dtype: DType) -> Option<u64> {
        let l = self.checked_lens()?;
        let residual = if self.residual() { l.input as u64 } else { 0 };
        let elems = l.input as u64 + residual + l.output as u64 + self.weight_elems()?;
        elems.checked_mul(dtype.size_bytes() as u64)
    }

    /// Elements of all weights and biases.
    fn weight_elems(&self) -> Option<u64> {
        let l = self.checked_lens()?;
        let biases = [
            (self.expand && self.expand_bias, self.hidden),
            (self.dw_bias, self.hidden),
            (self.project_bias, self.out_channels),
        ];
        let b: usize = biases.iter().filter(|(on, _)| *on).map(|(_, n)| n).sum();
        Some((l.expand_weight + l.dw_weight + l.project_weight + b) as u64)
    }

    /// The 17 inverted-residual blocks of MobileNetV2 (width 1.0) at a `size × size` input
    /// to the network: `(C, hidden, C', stride, H×W of the block's input)` as torchvision
    /// builds them (t, c, n, s = 1,16,1,1; 6,24,2,2; 6,32,3,2; 6,64,4,2; 6,96,3,1; 6,160,3,2;
    /// 6,320,1,1 after a stride-2 stem of 32 channels).
    pub fn mobilenet_v2_blocks(batch: usize, size: usize, layout: Layout) -> Vec<InvertedResidualDesc> {
        const SETTINGS: [(usize, usize, usize, usize); 7] =
            [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)];
        let mut blocks = Vec::new();
        let mut c = 32;
        let mut hw = size.div_ceil(2);
        for (t, c_out, n, s) in SETTINGS {
            for i in 0..n {
                let stride = if i == 0 { s } else { 1 };
                blocks.push(InvertedResidualDesc {
                    batch,
                    channels: c,
                    height: hw,
                    width: hw,
                    hidden: c * t,
                    out_channels: c_out,
                    stride,
                    expand: t != 1,
                    layout,
                    expand_bias: t != 1,
                    dw_bias: true,
                    project_bias: true,
                });
                hw = hw.div_ceil(stride);
                c = c_out;
            }
        }
        blocks
    }
}

/// The reference inverted-residual block, in f64: the naive composition of a 1×1 conv, the
/// depthwise conv and a 1×1 conv (no intermediate rounding). Biases absent from the descriptor
/// are ignored; `expand` is ignored without expand.
///
/// # Panics
/// If a slice is shorter than the descriptor says (the caller validates).
#[allow(clippy::too_many_arguments)]
pub fn reference(
    d: &InvertedResidualDesc,
    x: &[f64],
    expand: Option<(&[f64], Option<&[f64]>)>,
    dw: (&[f64], Option<&[f64]>),
    project: (&[f64], Option<&[f64]>),
    out: &mut [f64],
) {
    let (c, hid, co, h, w) = (d.channels, d.hidden, d.out_channels, d.height, d.width);
    let (oh, ow) = (d.out_h(), d.out_w());
    let relu6 = |v: f64| Activation::Relu6.apply_f64(v);
    for n in 0..d.batch {
        // The expanded tensor of this image, [hidden][H][W].
        let mut e = vec![0.0f64; hid * h * w];
        for j in 0..hid {
            for y in 0..h {
                for xx in 0..w {
                    e[(j * h + y) * w + xx] = match (d.expand, expand) {
                        (true, Some((we, be))) => {
                            let mut acc = 0.0;
                            for ci in 0..c {
                                acc += we[j * c + ci] * x[d.input_index(n, ci, y, xx)];
                            }
                            if let (true, Some(be)) = (d.expand_bias, be) {
                                acc += be[j];
                            }
                            relu6(acc)
                        }
                        _ => x[d.input_index(n, j, y, xx)],
                    };
                }
            }
        }
        // The depthwise output, [hidden][H'][W'].
        let mut f = vec![0.0f64; hid * oh * ow];
        for j in 0..hid {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = 0.0;
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (py, px) = (oy * d.stride + ky, ox * d.stride + kx);
                            if py == 0 || px == 0 || py > h || px > w {
                                continue; // The zero padding of the expanded tensor.
                            }
                            acc += dw.0[j * 9 + ky * 3 + kx] * e[(j * h + py - 1) * w + px - 1];
                        }
                    }
                    if let (true, Some(b)) = (d.dw_bias, dw.1) {
                        acc += b[j];
                    }
                    f[(j * oh + oy) * ow + ox] = relu6(acc);
                }
            }
        }
        for o in 0..co {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = 0.0;
                    for j in 0..hid {
                        acc += project.0[o * hid + j] * f[(j * oh + oy) * ow + ox];
                    }
                    if let (true, Some(b)) = (d.project_bias, project.1) {
                        acc += b[o];
                    }
                    if d.residual() {
                        acc += x[d.input_index(n, o, oy, ox)];
                    }
                    out[d.output_index(n, o, oy, ox)] = acc;
                }
            }
        }
    }
}

/// The tolerance of each output of a block stored in `dtype`: the rule of
/// [`crate::tolerance`] applied to each stage and carried through the next ones.
///
/// With `S` the magnitudes (every term made positive; a ReLU6 output is at most 6) and `E` the
/// allowed errors:
/// - expand: `E_e = bound_from_magnitude(dtype, ReLU6, C, S_e)` (0 without expand: `e = x`);
/// - depthwise: `E_f = Σ|w_d|·E_e + bound_from_magnitude(dtype, ReLU6, 9, S_f)`;
/// - project: `E_y = Σ|W_p|·E_f + bound_from_magnitude(dtype, none, hidden + 1, S_y)`.
///
/// Each stage's bound includes one rounding to `dtype`, which is where the unfused chain stores
/// `e` and `d`; the fused kernels keep them in f32 and are inside the same bound. The inputs
/// are the stored values (as for [`reference`]); the result has one entry per output element.
///
/// # Panics
/// If a slice is shorter than the descriptor says.
#[allow(clippy::too_many_arguments)]
pub fn bounds(
    d: &InvertedResidualDesc,
    dtype: DType,
    x: &[f64],
    expand: Option<(&[f64], Option<&[f64]>)>,
    dw: (&[f64], Option<&[f64]>),
    project: (&[f64], Option<&[f64]>),
) -> Vec<f64> {
    use crate::tolerance::bound_from_magnitude;
    let (c, hid, co, h, w) = (d.channels, d.hidden, d.out_channels, d.height, d.width);
    let (oh, ow) = (d.out_h(), d.out_w());
    let mut out = vec![0.0; d.checked_lens().map_or(0, |l| l.output)];
    let bias = |b: Option<&[f64]>, on: bool, i: usize| if on { b.map_or(0.0, |b| b[i].abs()) } else { 0.0 };
    for n in 0..d.batch {
        let (mut se, mut ee) = (vec![0.0; hid * h * w], vec![0.0; hid * h * w]);
        for j in 0..hid {
            for y in 0..h {
                for xx in 0..w {
                    let i = (j * h + y) * w + xx;
                    match (d.expand, expand) {
                        (true, Some((we, be))) => {
                            let mut s = bias(be, d.expand_bias, j);
                            for ci in 0..c {
                                s += (we[j * c + ci] * x[d.input_index(n, ci, y, xx)]).abs();
                            }
                            ee[i] = bound_from_magnitude(dtype, Activation::Relu6, c, s, s.min(6.0));
                            se[i] = s.min(6.0);
                        }
                        _ => se[i] = x[d.input_index(n, j, y, xx)].abs(),
                    }
                }
            }
        }
        let (mut sf, mut ef) = (vec![0.0; hid * oh * ow], vec![0.0; hid * oh * ow]);
        for j in 0..hid {
            for oy in 0..oh {
                for ox in 0..ow {
                    let (mut s, mut e) = (bias(dw.1, d.dw_bias, j), 0.0);
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (py, px) = (oy * d.stride + ky, ox * d.stride + kx);
                            if py == 0 || px == 0 || py > h || px > w {
                                continue;
                            }
                            let wk = dw.0[j * 9 + ky * 3 + kx].abs();
                            let i = (j * h + py - 1) * w + px - 1;
                            s += wk * se[i];
                            e += wk * ee[i];
                        }
                    }
                    let i = (j * oh + oy) * ow + ox;
                    ef[i] = e + bound_from_magnitude(dtype, Activation::Relu6, 9, s, s.min(6.0));
                    sf[i] = s.min(6.0);
                }
            }
        }
        for o in 0..co {
            for oy in 0..oh {
                for ox in 0..ow {
                    let (mut s, mut e) = (bias(project.1, d.project_bias, o), 0.0);
                    for j in 0..hid {
                        let wk = project.0[o * hid + j].abs();
                        let i = (j * oh + oy) * ow + ox;
                        s += wk * sf[i];
                        e += wk * ef[i];
                    }
                    if d.residual() {
                        s += x[d.input_index(n, o, oy, ox)].abs();
                    }
                    out[d.output_index(n, o, oy, ox)] =
                        e + bound_from_magnitude(dtype, Activation::None, hid + 1, s, s);
                }
            }
        }
    }
    out
}

impl InvertedResidualDesc {
    /// A block on a dense `[batch, channels, height, width]` input (given in that order
    /// whatever the layout) projecting to `out_channels`: no expand (`hidden = channels`),
    /// stride 1, no biases; the setters change the rest (`.expand(true).hidden(6 * c)`).
    pub const fn new(layout: Layout, [batch, channels, height, width]: [usize; 4], out_channels: usize) -> Self {
        InvertedResidualDesc {
            batch,
            channels,
            height,
            width,
            hidden: channels,
            out_channels,
            stride: 1,
            expand: false,
            layout,
            expand_bias: false,
            dw_bias: false,
            project_bias: false,
        }
    }
}

crate::field_setters!(InvertedResidualDesc {
    batch: usize,
    channels: usize,
    height: usize,
    width: usize,
    hidden: usize,
    out_channels: usize,
    stride: usize,
    expand: bool,
    layout: Layout,
    expand_bias: bool,
    dw_bias: bool,
    project_bias: bool,
});
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mobilenet_v2_has_seventeen_blocks_ending_at_7x7_320() {
        let b = InvertedResidualDesc::mobilenet_v2_blocks(1, 224, Layout::Nchw);
        assert_eq!(b.len(), 17);
        assert_eq!((b[0].channels, b[0].hidden, b[0].out_channels, b[0].height, b[0].expand), (32, 32, 16, 112, false));
        assert_eq!((b[1].hidden, b[1].stride, b[1].height), (96, 2, 112));
        let last = b[16];
        assert_eq!((last.channels, last.hidden, last.out_channels, last.out_h()), (160, 960, 320, 7));
        assert_eq!(b.iter().filter(|d| d.residual()).count(), 10);
    }

    #[test]
    fn an_identity_block_adds_the_input_once() {
        // No expand, depthwise = centre tap 1, projection = identity: relu6(x) + x.
        let d = InvertedResidualDesc {
            batch: 1,
            channels: 2,
            height: 1,
            width: 2,
            hidden: 2,
            out_channels: 2,
            stride: 1,
            expand: false,
            layout: Layout::Nchw,
            expand_bias: false,
            dw_bias: false,
            project_bias: true,
        };
        let mut wd = [0.0; 18];
        wd[4] = 1.0;
        wd[13] = 1.0;
        let x = [1.0, 7.0, -1.0, 2.0];
        let mut out = [0.0; 4];
        reference(&d, &x, None, (&wd, None), (&[1.0, 0.0, 0.0, 1.0], Some(&[0.5, 0.0])), &mut out);
        assert_eq!(out, [2.5, 13.5, -1.0, 4.0]);
    }

    #[test]
    fn fused_traffic_is_far_below_the_chain_on_expanded_blocks() {
        for d in InvertedResidualDesc::mobilenet_v2_blocks(1, 224, Layout::Nhwc).iter().filter(|d| d.expand) {
            let (f, u) =
                (d.fused_dram_bytes(DType::F32).expect("fits"), d.unfused_dram_bytes(DType::F32).expect("fits"));
            // At 7x7 and 14x14 the weights dominate both paths; above, the expanded tensor does.
            let factor = if d.height >= 28 { 3 } else { 1 };
            assert!(u > factor * f, "{d:?}: {u} vs {f}");
        }
    }
}
