//! Operation descriptors: plain data saying which elements an op reads and writes.
//!
//! The descriptors index flat buffers by element (not byte) offsets. They are checked by the
//! `tilekit` crate before any backend sees them; [`MatmulDesc::required_len`] and friends give
//! the buffer lengths a valid descriptor needs.

use crate::Activation;

/// How a matmul multiplies: the f32 path, TPU-style bf16 products, or f16 products summed
/// in short f16 runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Precision {
    /// Products and sums in (at least) f32. The default.
    #[default]
    Highest,
    /// Inputs rounded to bf16 (nearest even) before they are multiplied; products summed in
    /// f32. The path tensor cores take; emulated elsewhere. Meaningful for f32 storage (bf16
    /// storage is already bf16; f16 storage is rounded to bf16 as well).
    Bf16,
    /// For f16 storage only (other storage is refused with `Error::InvalidParameter`): the
    /// products, and partial sums of up to [`Precision::F16_CHUNK`] consecutive products, may be
    /// computed in f16; the partial sums are added in f32. Opt-in, because it is held to a looser
    /// bound than the f32 paths ([`crate::tolerance::matmul_bound`]: about `8·2⁻¹¹` of
    /// `Σ|a·b|` more). The wgpu backend runs the `vec2<f16>` kernel
    /// (`shaders/wgsl/matmul_f16x2.wgsl`) where the device has `SHADER_F16` and M > 16;
    /// everywhere else (the CPU and CUDA backends, wgpu without `SHADER_F16`, M ≤ 16) the
    /// [`Precision::Highest`] path runs, which is inside the same bound. A partial sum that
    /// overflows f16 (above 65504) never shows: the kernel recomputes such outputs in f32.
    F16,
}

impl Precision {
    /// The most consecutive products one f16 partial sum of [`Precision::F16`] holds before it
    /// is added to the f32 accumulator (`CHUNK` in `matmul_f16x2.wgsl`).
    pub const F16_CHUNK: usize = 8;
}

/// A strided, batched matrix inside a flat buffer. Element `(r, c)` of batch `b` lives at
/// `offset + b·batch_stride + r·ld + c` (row-major with a leading dimension `ld`).
/// A `batch_stride` of 0 broadcasts one matrix to every batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct MatrixView {
    /// Element offset of the first element of batch 0.
    pub offset: usize,
    /// Leading dimension: elements between the starts of consecutive rows.
    pub ld: usize,
    /// Elements between the starts of consecutive batches (0 broadcasts).
    pub batch_stride: usize,
}

impl MatrixView {
    /// A dense `rows × cols` matrix per batch, batches packed one after another. A
    /// `rows · cols` past `usize` saturates (never panics): such a view fails
    /// [`MatrixView::required_len`] for a second batch, as no buffer can hold it anyway.
    pub fn dense(rows: usize, cols: usize) -> MatrixView {
        MatrixView { offset: 0, ld: cols, batch_stride: rows.saturating_mul(cols) }
    }

    /// The one-past-last element index the view touches for `batch` matrices of
    /// `rows × cols`, or `None` on overflow. Zero-sized views need no storage.
    pub fn required_len(&self, batch: usize, rows: usize, cols: usize) -> Option<usize> {
        if batch == 0 || rows == 0 || cols == 0 {
            return Some(0);
        }
        let last_batch = (batch - 1).checked_mul(self.batch_stride)?;
        let last_row = (rows - 1).checked_mul(self.ld)?;
        self.offset.checked_add(last_batch)?.checked_add(last_row)?.checked_add(cols)
    }

    /// The element index of `(b, r, c)`. The caller has checked the view.
    #[inline]
    pub fn index(&self, b: usize, r: usize, c: usize) -> usize {
        self.offset + b * self.batch_stride + r * self.ld + c
    }

    /// The same elements for `batch` matrices of `rows × cols`, with every field the view
    /// never reads made plain: an empty view is `offset 0, ld cols, batch_stride 0`; a single
    /// row has `ld = cols`; a single batch has `batch_stride 0`. A value no element index
    /// uses (say `ld = usize::MAX` on a one-row view) then cannot overflow a backend's own
    /// index type, so every backend sees the same call.
    pub fn canonical(self, batch: usize, rows: usize, cols: usize) -> MatrixView {
        if batch == 0 || rows == 0 || cols == 0 {
            return MatrixView { offset: 0, ld: cols, batch_stride: 0 };
        }
        MatrixView {
            offset: self.offset,
            ld: if rows > 1 { self.ld } else { cols },
            batch_stride: if batch > 1 { self.batch_stride } else { 0 },
        }
    }
}

/// `out = act(alpha · op(A) · op(B) + bias + beta · C)` over `batch` independent products.
///
/// `op(A)` is `M × K`: stored `M × K` (`trans_a = false`) or `K × M` (`trans_a = true`).
/// `op(B)` is `K × N`: stored `K × N` or `N × K`. `bias` has `N` elements, one per output
/// column. `C` and `out` are `M × N`. `K = 0` gives the epilogue applied to zeros.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct MatmulDesc {
    /// Number of products.
    pub batch: usize,
    /// Rows of `op(A)` and of the output.
    pub m: usize,
    /// Columns of `op(B)` and of the output.
    pub n: usize,
    /// The reduction length.
    pub k: usize,
    /// `A` is stored transposed (`K × M`).
    pub trans_a: bool,
    /// `B` is stored transposed (`N × K`).
    pub trans_b: bool,
    /// Where `A` lives.
    pub a: MatrixView,
    /// Where `B` lives.
    pub b: MatrixView,
    /// Where `C` (the residual) lives, if there is one.
    pub c: Option<MatrixView>,
    /// Element offset of the bias vector, if there is one.
    pub bias_offset: Option<usize>,
    /// Where the output goes.
    pub out: MatrixView,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of `C` (ignored without `C`).
    pub beta: f32,
    /// Activation applied last.
    pub activation: Activation,
    /// Multiplication precision.
    pub precision: Precision,
}

impl MatmulDesc {
    /// A dense, unbatched `M × K · K × N` product with no epilogue.
    pub fn new(m: usize, n: usize, k: usize) -> MatmulDesc {
        MatmulDesc {
            batch: 1,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            a: MatrixView::dense(m, k),
            b: MatrixView::dense(k, n),
            c: None,
            bias_offset: None,
            out: MatrixView::dense(m, n),
            alpha: 1.0,
            beta: 0.0,
            activation: Activation::None,
            precision: Precision::Highest,
        }
    }

    /// The same product with every view field it never reads made plain
    /// ([`MatrixView::canonical`]): with `K = 0`, `A` and `B` are empty and their views
    /// unused. Validation accepts such fields whatever their value, so the backends are
    /// handed the canonical form.
    pub fn canonical(&self) -> MatmulDesc {
        let (ar, ac) = self.a_stored();
        let (br, bc) = self.b_stored();
        MatmulDesc {
            a: self.a.canonical(self.batch, ar, ac),
            b: self.b.canonical(self.batch, br, bc),
            c: self.c.map(|c| c.canonical(self.batch, self.m, self.n)),
            out: self.out.canonical(self.batch, self.m, self.n),
            ..*self
        }
    }

    /// Stored shape `(rows, cols)` of `A`.
    pub fn a_stored(&self) -> (usize, usize) {
        if self.trans_a { (self.k, self.m) } else { (self.m, self.k) }
    }

    /// Stored shape `(rows, cols)` of `B`.
    pub fn b_stored(&self) -> (usize, usize) {
        if self.trans_b { (self.n, self.k) } else { (self.k, self.n) }
    }

    /// Element index of `op(A)[i][p]` in batch `bt`.
    #[inline]
    pub fn a_index(&self, bt: usize, i: usize, p: usize) -> usize {
        if self.trans_a { self.a.index(bt, p, i) } else { self.a.index(bt, i, p) }
    }

    /// Element index of `op(B)[p][j]` in batch `bt`.
    #[inline]
    pub fn b_index(&self, bt: usize, p: usize, j: usize) -> usize {
        if self.trans_b { self.b.index(bt, j, p) } else { self.b.index(bt, p, j) }
    }

    /// Floating-point operations of the op (2·batch·M·N·K), for throughput figures.
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// Memory layout of a 4-D activation tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Layout {
    /// `[N, C, H, W]`.
    #[default]
    Nchw,
    /// `[N, H, W, C]`.
    Nhwc,
}

impl Layout {
    /// The name used on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Layout::Nchw => "nchw",
            Layout::Nhwc => "nhwc",
        }
    }

    /// Parses the names printed by [`Layout::name`].
    pub fn parse(s: &str) -> Option<Layout> {
        match s {
            "nchw" => Some(Layout::Nchw),
            "nhwc" => Some(Layout::Nhwc),
            _ => None,
        }
    }
}

/// A depthwise 2-D convolution: output channel `oc` of `C·m` reads input channel `oc / m`
/// through its own `kh × kw` filter (weight `[C·m, 1, kh, kw]` in both layouts), then adds
/// `bias[oc]` and applies the activation. Tensors are dense in their layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Conv2dDesc {
    /// Batch size.
    pub batch: usize,
    /// Input channels.
    pub channels: usize,
    /// Input height.
    pub height: usize,
    /// Input width.
    pub width: usize,
    /// Channel multiplier `m` (output channels = `channels · m`).
    pub multiplier: usize,
    /// Filter height.
    pub kernel_h: usize,
    /// Filter width.
    pub kernel_w: usize,
    /// Vertical stride.
    pub stride_h: usize,
    /// Horizontal stride.
    pub stride_w: usize,
    /// Zero padding above.
    pub pad_top: usize,
    /// Zero padding below.
    pub pad_bottom: usize,
    /// Zero padding on the left.
    pub pad_left: usize,
    /// Zero padding on the right.
    pub pad_right: usize,
    /// Vertical dilation.
    pub dilation_h: usize,
    /// Horizontal dilation.
    pub dilation_w: usize,
    /// Layout of input and output.
    pub layout: Layout,
    /// Whether a bias of `C·m` elements is added.
    pub has_bias: bool,
    /// Activation applied last.
    pub activation: Activation,
}

impl Conv2dDesc {
    /// MobileNetV2's depthwise block, the workload the bench, the tuner and the criterion
    /// benches share: a 3×3 filter, padding 1 on every side, multiplier 1, dilation 1, a bias
    /// and ReLU6, on a square `size × size` input.
    pub fn mobilenet_v2_block(batch: usize, channels: usize, size: usize, stride: usize, layout: Layout) -> Conv2dDesc {
        Conv2dDesc {
            batch,
            channels,
            height: size,
            width: size,
            multiplier: 1,
            kernel_h: 3,
            kernel_w: 3,
            stride_h: stride,
            stride_w: stride,
            pad_top: 1,
            pad_bottom: 1,
            pad_left: 1,
            pad_right: 1,
            dilation_h: 1,
            dilation_w: 1,
            layout,
            has_bias: true,
            activation: Activation::Relu6,
        }
    }

    /// Output height, or `None` when the (dilated) filter does not fit or a parameter is 0.
    pub fn out_h(&self) -> Option<usize> {
        out_extent(self.height, self.pad_top, self.pad_bottom, self.kernel_h, self.dilation_h, self.stride_h)
    }

    /// Output width, or `None` when the (dilated) filter does not fit or a parameter is 0.
    pub fn out_w(&self) -> Option<usize> {
        out_extent(self.width, self.pad_left, self.pad_right, self.kernel_w, self.dilation_w, self.stride_w)
    }

    /// Output channels (`channels · multiplier`), or `None` when the product overflows.
    pub fn checked_out_channels(&self) -> Option<usize> {
        self.channels.checked_mul(self.multiplier)
    }

    /// Output channels (`channels · multiplier`) of a descriptor that passed
    /// [`Conv2dDesc::checked_lens`]. Never panics: on overflow it saturates to `usize::MAX`,
    /// which no buffer can match (the checked forms are the ones to validate with).
    pub fn out_channels(&self) -> usize {
        self.channels.saturating_mul(self.multiplier)
    }

    /// The output shape in the desc's layout, or `None` when the output is empty (the filter
    /// does not fit, a stride or dilation is 0) or the output channels overflow.
    pub fn checked_output_shape(&self) -> Option<[usize; 4]> {
        let (oh, ow, oc) = (self.out_h()?, self.out_w()?, self.checked_out_channels()?);
        Some(match self.layout {
            Layout::Nchw => [self.batch, oc, oh, ow],
            Layout::Nhwc => [self.batch, oh, ow, oc],
        })
    }

    /// Element counts `(input, weight, output)`, or `None` when the output is empty or any
    /// count (or the output channels) overflows `usize`. A descriptor with `Some` here has
    /// every element index of [`Conv2dDesc::input_index`] and [`Conv2dDesc::output_index`]
    /// in range: this is the check to validate a raw descriptor with.
    pub fn checked_lens(&self) -> Option<(usize, usize, usize)> {
        let prod = |dims: [usize; 4]| dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let oc = self.checked_out_channels()?;
        let input = prod(self.input_shape())?;
        let weight = prod([oc, 1, self.kernel_h, self.kernel_w])?;
        let output = prod(self.checked_output_shape()?)?;
        Some((input, weight, output))
    }

    /// Input element index of `(n, c, y, x)` in the desc's layout.
    #[inline]
    pub fn input_index(&self, n: usize, c: usize, y: usize, x: usize) -> usize {
        match self.layout {
            Layout::Nchw => ((n * self.channels + c) * self.height + y) * self.width + x,
            Layout::Nhwc => ((n * self.height + y) * self.width + x) * self.channels + c,
        }
    }

    /// Output element index of `(n, oc, y, x)` in the desc's layout. Needs a valid desc.
    #[inline]
    pub fn output_index(&self, n: usize, oc: usize, y: usize, x: usize) -> usize {
        let (oh, ow, occ) = (self.out_h().unwrap_or(0), self.out_w().unwrap_or(0), self.out_channels());
        match self.layout {
            Layout::Nchw => ((n * occ + oc) * oh + y) * ow + x,
            Layout::Nhwc => ((n * oh + y) * ow + x) * occ + oc,
        }
    }

    /// Input shape in the desc's layout.
    pub fn input_shape(&self) -> [usize; 4] {
        match self.layout {
            Layout::Nchw => [self.batch, self.channels, self.height, self.width],
            Layout::Nhwc => [self.batch, self.height, self.width, self.channels],
        }
    }

    /// Output shape in the desc's layout (zeros where the output is empty).
    pub fn output_shape(&self) -> [usize; 4] {
        let (oh, ow) = (self.out_h().unwrap_or(0), self.out_w().unwrap_or(0));
        match self.layout {
            Layout::Nchw => [self.batch, self.out_channels(), oh, ow],
            Layout::Nhwc => [self.batch, oh, ow, self.out_channels()],
        }
    }

    /// Weight shape `[C·m, 1, kh, kw]`.
    pub fn weight_shape(&self) -> [usize; 4] {
        [self.out_channels(), 1, self.kernel_h, self.kernel_w]
    }

    /// Floating-point operations (2 per tap per output).
    pub fn flops(&self) -> f64 {
        let [n, c, h, w] = match self.layout {
            Layout::Nchw => self.output_shape(),
            Layout::Nhwc => {
                let [n, h, w, c] = self.output_shape();
                [n, c, h, w]
            }
        };
        // In f64: a raw descriptor's counts may not fit `usize`, and this must not panic.
        2.0 * n as f64 * c as f64 * h as f64 * w as f64 * self.kernel_h as f64 * self.kernel_w as f64
    }
}

fn out_extent(len: usize, pad0: usize, pad1: usize, k: usize, dilation: usize, stride: usize) -> Option<usize> {
    if k == 0 || dilation == 0 || stride == 0 {
        return None;
    }
    let padded = len.checked_add(pad0)?.checked_add(pad1)?;
    let span = (k - 1).checked_mul(dilation)?.checked_add(1)?;
    if padded < span {
        return None;
    }
    Some((padded - span) / stride + 1)
}

/// Elementwise `out[i] = act(x[i] + bias[i mod bias_len])`: the bias (if any) is broadcast
/// along the last dimension, whose length is `bias_len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ActivationDesc {
    /// Number of elements.
    pub len: usize,
    /// Length of the bias (the last dimension), or `None` for no bias.
    pub bias_len: Option<usize>,
    /// The activation.
    pub activation: Activation,
}

impl MatrixView {
    /// A view with its three fields: the element offset of the first element of batch 0, the
    /// leading dimension and the batch stride.
    pub const fn new(offset: usize, ld: usize, batch_stride: usize) -> MatrixView {
        MatrixView { offset, ld, batch_stride }
    }
}

crate::field_setters!(MatrixView { offset: usize, ld: usize, batch_stride: usize });

crate::field_setters!(MatmulDesc {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
    a: MatrixView,
    b: MatrixView,
    c: Option<MatrixView>,
    bias_offset: Option<usize>,
    out: MatrixView,
    alpha: f32,
    beta: f32,
    activation: Activation,
    precision: Precision,
});

impl Conv2dDesc {
    /// A `kh × kw` depthwise convolution of a dense `[batch, channels, height, width]` input
    /// (given in that order whatever the layout) with multiplier 1, stride 1, no padding,
    /// dilation 1, no bias and no activation; the setters change the rest.
    pub const fn new(
        layout: Layout,
        [batch, channels, height, width]: [usize; 4],
        [kernel_h, kernel_w]: [usize; 2],
    ) -> Conv2dDesc {
        Conv2dDesc {
            batch,
            channels,
            height,
            width,
            multiplier: 1,
            kernel_h,
            kernel_w,
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

    /// Sets both strides: `[vertical, horizontal]`.
    #[must_use]
    pub const fn stride(mut self, [h, w]: [usize; 2]) -> Conv2dDesc {
        self.stride_h = h;
        self.stride_w = w;
        self
    }

    /// Sets the padding: `[top, bottom, left, right]`.
    #[must_use]
    pub const fn padding(mut self, [top, bottom, left, right]: [usize; 4]) -> Conv2dDesc {
        self.pad_top = top;
        self.pad_bottom = bottom;
        self.pad_left = left;
        self.pad_right = right;
        self
    }

    /// Sets both dilations: `[vertical, horizontal]`.
    #[must_use]
    pub const fn dilation(mut self, [h, w]: [usize; 2]) -> Conv2dDesc {
        self.dilation_h = h;
        self.dilation_w = w;
        self
    }
}

crate::field_setters!(Conv2dDesc {
    batch: usize,
    channels: usize,
    height: usize,
    width: usize,
    multiplier: usize,
    kernel_h: usize,
    kernel_w: usize,
    stride_h: usize,
    stride_w: usize,
    pad_top: usize,
    pad_bottom: usize,
    pad_left: usize,
    pad_right: usize,
    dilation_h: usize,
    dilation_w: usize,
    layout: Layout,
    has_bias: bool,
    activation: Activation,
});

impl ActivationDesc {
    /// `len` elements, a bias of `bias_len` elements (or none) broadcast along the last
    /// dimension, then `activation`.
    pub const fn new(len: usize, bias_len: Option<usize>, activation: Activation) -> ActivationDesc {
        ActivationDesc { len, bias_len, activation }
    }
}

crate::field_setters!(ActivationDesc { len: usize, bias_len: Option<usize>, activation: Activation });
#[cfg(test)]
mod tests {
    use super::*;

    /// The canonical view reads the same elements as the original wherever the original is
    /// readable, and its unread fields are plain.
    #[test]
    fn canonical_views_read_the_same_elements() {
        let fields = [0, 1, 3, 7, usize::MAX / 2, usize::MAX];
        for &offset in &fields[..4] {
            for &ld in &fields {
                for &bs in &fields {
                    let v = MatrixView::new(offset, ld, bs);
                    for (batch, rows, cols) in
                        [(1, 1, 1), (1, 1, 5), (2, 1, 3), (1, 3, 1), (3, 2, 2), (0, 4, 4), (2, 0, 3), (2, 3, 0)]
                    {
                        let c = v.canonical(batch, rows, cols);
                        if batch == 0 || rows == 0 || cols == 0 {
                            assert_eq!(c, MatrixView::new(0, cols, 0));
                            continue;
                        }
                        if rows == 1 {
                            assert_eq!(c.ld, cols);
                        }
                        if batch == 1 {
                            assert_eq!(c.batch_stride, 0);
                        }
                        if v.required_len(batch, rows, cols).is_none() {
                            continue; // Validation rejects it; nothing is indexed.
                        }
                        assert!(c.required_len(batch, rows, cols).is_some());
                        for b in 0..batch {
                            for r in 0..rows {
                                for col in 0..cols {
                                    assert_eq!(c.index(b, r, col), v.index(b, r, col), "{v:?} {batch} {rows} {cols}");
                                }
                            }
                        }
                    }
                }
            }
        }
        // K = 0: both operand views become plain, the output keeps its own.
        let d = MatmulDesc::new(2, 3, 0).a(MatrixView::new(usize::MAX, 9, 9)).out(MatrixView::new(4, 5, 0));
        let c = d.canonical();
        assert_eq!((c.a, c.b, c.out), (MatrixView::new(0, 0, 0), MatrixView::new(0, 3, 0), MatrixView::new(4, 5, 0)));
    }

    #[test]
    fn conv_output_extent() {
        // 3×3, pad 1, stride 1 keeps the size; stride 2 halves it (rounded up).
        assert_eq!(out_extent(112, 1, 1, 3, 1, 1), Some(112));
        assert_eq!(out_extent(112, 0, 1, 3, 1, 2), Some(56));
        // Dilation 2 widens a 3-tap filter to 5.
        assert_eq!(out_extent(5, 0, 0, 3, 2, 1), Some(1));
        assert_eq!(out_extent(4, 0, 0, 3, 2, 1), None);
        assert_eq!(out_extent(4, 0, 0, 3, 1, 0), None);
    }

    /// Descriptor arithmetic on sizes past `usize` gives `None` from the checked forms and
    /// never panics (these tests run with overflow checks on).
    #[test]
    fn conv_arithmetic_is_checked() {
        let mut d = Conv2dDesc::mobilenet_v2_block(1, usize::MAX / 2, 4, 1, Layout::Nhwc);
        d.multiplier = 3;
        assert_eq!(d.checked_out_channels(), None);
        assert_eq!(d.checked_output_shape(), None);
        assert_eq!(d.checked_lens(), None);
        assert_eq!(d.out_channels(), usize::MAX);
        assert_eq!(d.weight_shape()[0], usize::MAX);
        assert!(d.flops() > 1e19);
        // Channels fit, the element counts do not.
        let big = Conv2dDesc::mobilenet_v2_block(1 << 20, 1 << 20, 1 << 12, 1, Layout::Nchw);
        assert_eq!(big.checked_out_channels(), Some(1 << 20));
        assert_eq!(big.checked_lens(), None);
        let ok = Conv2dDesc::mobilenet_v2_block(2, 8, 5, 2, Layout::Nchw);
        assert_eq!(ok.checked_output_shape(), Some(ok.output_shape()));
        assert_eq!(ok.checked_lens(), Some((2 * 8 * 25, 8 * 9, 2 * 8 * 9)));
        // An empty output.
        let mut empty = ok;
        empty.stride_h = 0;
        assert_eq!(empty.checked_lens(), None);
        assert_eq!(MatrixView::dense(usize::MAX, 2).batch_stride, usize::MAX);
        assert_eq!(MatmulDesc::new(usize::MAX, usize::MAX, 3).flops(), 2.0 * 3.0 * (usize::MAX as f64).powi(2));
    }

    #[test]
    fn view_length_handles_broadcast_and_overflow() {
        let v = MatrixView { offset: 3, ld: 10, batch_stride: 0 };
        assert_eq!(v.required_len(4, 2, 5), Some(3 + 10 + 5));
        let big = MatrixView { offset: 0, ld: usize::MAX, batch_stride: 0 };
        assert_eq!(big.required_len(1, 3, 1), None);
        assert_eq!(big.required_len(1, 0, 1), Some(0));
    }
}
