//! `inverted_residual`: MobileNetV2's block (expand 1×1 + ReLU6, depthwise 3×3 + ReLU6,
//! linear projection 1×1, residual) as one op, fused or as the three-op chain.
//!
//! The fused path is one backend kernel (`BackendOps::inverted_residual`) that tiles output
//! pixels and keeps the expanded activations of a tile and its halo on chip, so the expanded
//! tensor never reaches memory. The unfused path runs the chain through the public ops
//! ([`Device::pointwise_conv2d_into`], then [`Device::depthwise_conv2d`], then
//! [`Device::pointwise_conv2d_into`] with the residual fused); it is what the fused
//! kernels are checked and benchmarked against.

use super::{check_alias, check_device, check_dtype, storage};
use crate::backend::{BackendOps, BlockArgs, with_backend};
use crate::{Activation, Conv2dOptions, Device, Error, PointwiseOptions, Result, Tensor};
use tilekit_kernels::{DType, InvertedResidualDesc, Layout};

const OP: &str = "inverted_residual";

/// The weights of one inverted-residual block, in PyTorch's layout (whatever the activations'
/// layout): `expand` `[hidden, C, 1, 1]` (absent in MobileNetV2's first block, where
/// `hidden = C`), `depthwise` `[hidden, 1, 3, 3]`, `project` `[C', hidden, 1, 1]`; each bias,
/// if given, has one element per output channel of its convolution. BatchNorm is expected to
/// be folded into weights and biases already.
#[derive(Clone, Copy, Debug)]
pub struct BlockWeights<'a> {
    /// Expand 1×1 weight `[hidden, C, 1, 1]`, or `None` for no expand.
    pub expand: Option<&'a Tensor>,
    /// Expand bias `[hidden]` (ignored without `expand`; then it must be `None`).
    pub expand_bias: Option<&'a Tensor>,
    /// Depthwise 3×3 weight `[hidden, 1, 3, 3]`.
    pub depthwise: &'a Tensor,
    /// Depthwise bias `[hidden]`.
    pub depthwise_bias: Option<&'a Tensor>,
    /// Projection 1×1 weight `[C', hidden, 1, 1]`.
    pub project: &'a Tensor,
    /// Projection bias `[C']`.
    pub project_bias: Option<&'a Tensor>,
}

/// The options of [`Device::inverted_residual`]. `Default`: stride 1, NCHW, fused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockOptions {
    /// Depthwise stride, 1 or 2 (both directions). The block adds its input when the stride is
    /// 1 and `C = C'`.
    pub stride: usize,
    /// Layout of input and output.
    pub layout: Layout,
    /// `true`: the fused kernel; `false`: the three-op chain.
    pub fused: bool,
}

impl Default for BlockOptions {
    fn default() -> Self {
        BlockOptions { stride: 1, layout: Layout::Nchw, fused: true }
    }
}

/// A block's weights prepared once ([`Device::pack_block_weights`]) for
/// [`Device::inverted_residual_packed`]: the tensors themselves (clones of the handles, not
/// copies) and, on the CPU, the two 1 × 1 weights transposed in f32.
#[derive(Clone, Debug)]
pub struct PackedBlock {
    expand: Option<Tensor>,
    expand_bias: Option<Tensor>,
    depthwise: Tensor,
    depthwise_bias: Option<Tensor>,
    project: Tensor,
    project_bias: Option<Tensor>,
    /// `[C, hidden]` and `[hidden, C']`, f32 (the CPU).
    expand_t: Option<Tensor>,
    project_t: Option<Tensor>,
}

impl PackedBlock {
    /// The weights as given to [`Device::pack_block_weights`].
    pub fn weights(&self) -> BlockWeights<'_> {
        BlockWeights {
            expand: self.expand.as_ref(),
            expand_bias: self.expand_bias.as_ref(),
            depthwise: &self.depthwise,
            depthwise_bias: self.depthwise_bias.as_ref(),
            project: &self.project,
            project_bias: self.project_bias.as_ref(),
        }
    }

    /// Whether the 1 × 1 weights are also held transposed (the CPU).
    pub fn is_transposed(&self) -> bool {
        self.project_t.is_some()
    }

    fn transposed(&self) -> Transposed<'_> {
        (self.expand_t.as_ref(), self.project_t.as_ref())
    }
}

impl Device {
    /// One inverted-residual block: `y = W_p · relu6(dw3x3(relu6(W_e · x + b_e)) + b_d) + b_p`
    /// plus `x` when the stride is 1 and `C = C'` (see [`tilekit_kernels::block`]). `x` is
    /// `[N, C, H, W]` (NCHW) or `[N, H, W, C]` (NHWC); the output is `[N, C', ⌈H/s⌉, ⌈W/s⌉]` in
    /// the same layout and dtype. f32 accumulation throughout; the fused path keeps the
    /// expanded activations in f32 on chip, the unfused one stores them in the dtype.
    pub fn inverted_residual(&self, x: &Tensor, weights: &BlockWeights<'_>, opts: &BlockOptions) -> Result<Tensor> {
        let desc = self.block_desc(x, weights, opts)?;
        let out = self.output_tensor(&desc.output_shape(), x.dtype())?;
        self.run_block(&desc, x, weights, NO_TRANSPOSED, opts, &out)?;
        Ok(out)
    }

    /// Prepares a block's weights once for [`Device::inverted_residual_packed`], as an engine
    /// packs a layer's weights at load. The same checks as [`Device::inverted_residual`]'s
    /// (one device, one dtype the device holds, the shapes of [`BlockWeights`]). On the CPU the
    /// two 1 × 1 weights are also stored transposed, in f32 (`[C, hidden]` and
    /// `[hidden, C']`: one more copy of them), so the fused kernel's products read them along
    /// their rows instead of gathering them across per call; the GPU backends read the weights
    /// as stored and keep only the tensors (no copy).
    pub fn pack_block_weights(&self, w: &BlockWeights<'_>) -> Result<PackedBlock> {
        let dtype = w.depthwise.dtype();
        for (name, t) in named_weights(w) {
            if let Some(t) = t {
                check_device(OP, self, name, t)?;
                check_dtype(OP, dtype, name, t)?;
            }
        }
        self.check_dtype(dtype)?;
        // The input channels the weights imply (a wrong rank is reported by `weight_dims`).
        let c = match w.expand {
            Some(we) => we.shape().get(1),
            None => w.depthwise.shape().first(),
        };
        let c = c.copied().unwrap_or(0);
        let (hidden, co) = weight_dims(w, c)?;
        if c == 0 {
            return Err(Error::InvalidParameter { op: OP, param: "weights", reason: "no input channels".into() });
        }
        let transpose = |t: &Tensor, rows: usize, cols: usize| -> Result<Tensor> {
            let v = t.to_f32_vec()?;
            let mut o = vec![0.0f32; v.len()];
            for r in 0..rows {
                for q in 0..cols {
                    o[q * rows + r] = v[r * cols + q];
                }
            }
            self.tensor_from_f32(&[cols, rows], DType::F32, &o)
        };
        let (expand_t, project_t) = if self.kind() == crate::BackendKind::Cpu {
            (w.expand.map(|we| transpose(we, hidden, c)).transpose()?, Some(transpose(w.project, co, hidden)?))
        } else {
            (None, None)
        };
        Ok(PackedBlock {
            expand: w.expand.cloned(),
            expand_bias: w.expand_bias.cloned(),
            depthwise: w.depthwise.clone(),
            depthwise_bias: w.depthwise_bias.cloned(),
            project: w.project.clone(),
            project_bias: w.project_bias.cloned(),
            expand_t,
            project_t,
        })
    }

    /// [`Device::inverted_residual`] with weights prepared by [`Device::pack_block_weights`]:
    /// the same output (on the CPU the products are summed in another order: the same bits
    /// on integer data, within the same f32 accumulation bound otherwise). The unfused chain
    /// (`opts.fused == false`) reads the weights as stored.
    pub fn inverted_residual_packed(&self, x: &Tensor, packed: &PackedBlock, opts: &BlockOptions) -> Result<Tensor> {
        let weights = packed.weights();
        let desc = self.block_desc(x, &weights, opts)?;
        let out = self.output_tensor(&desc.output_shape(), x.dtype())?;
        self.run_block(&desc, x, &weights, packed.transposed(), opts, &out)?;
        Ok(out)
    }

    /// [`Device::inverted_residual_packed`] into an existing output tensor of the right shape.
    pub fn inverted_residual_packed_into(
        &self,
        x: &Tensor,
        packed: &PackedBlock,
        opts: &BlockOptions,
        out: &Tensor,
    ) -> Result<()> {
        let weights = packed.weights();
        let desc = self.block_desc(x, &weights, opts)?;
        self.check_block_out(&desc, x, &weights, out)?;
        self.run_block(&desc, x, &weights, packed.transposed(), opts, out)
    }

    /// [`Device::inverted_residual`] into an existing output tensor of the right shape.
    pub fn inverted_residual_into(
        &self,
        x: &Tensor,
        weights: &BlockWeights<'_>,
        opts: &BlockOptions,
        out: &Tensor,
    ) -> Result<()> {
        let desc = self.block_desc(x, weights, opts)?;
        self.check_block_out(&desc, x, weights, out)?;
        self.run_block(&desc, x, weights, NO_TRANSPOSED, opts, out)
    }

    /// The checks of an `_into` call's output: this device, the input's dtype, no input's
    /// buffer, the block's output shape.
    fn check_block_out(
        &self,
        desc: &InvertedResidualDesc,
        x: &Tensor,
        weights: &BlockWeights<'_>,
        out: &Tensor,
    ) -> Result<()> {
        check_device(OP, self, "out", out)?;
        check_dtype(OP, x.dtype(), "out", out)?;
        for (name, t) in named(x, weights) {
            if let Some(t) = t {
                check_alias(OP, out, name, t)?;
            }
        }
        if out.shape() != desc.output_shape() {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "out",
                expected: desc.output_shape().to_vec(),
                actual: out.shape().to_vec(),
            });
        }
        Ok(())
    }

    fn run_block(
        &self,
        desc: &InvertedResidualDesc,
        x: &Tensor,
        w: &BlockWeights<'_>,
        transposed: Transposed<'_>,
        opts: &BlockOptions,
        out: &Tensor,
    ) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        if opts.fused {
            let info = || crate::profile::OpInfo {
                op: OP,
                dtype: x.dtype(),
                shape: format!(
                    "n{} c{} {}x{} hid{} c'{} s{} {}",
                    desc.batch,
                    desc.channels,
                    desc.height,
                    desc.width,
                    desc.hidden,
                    desc.out_channels,
                    desc.stride,
                    desc.layout.name()
                ),
                bytes: desc.fused_dram_bytes(x.dtype()).unwrap_or(0),
                flops: fused_flops(desc),
            };
            return self.profiled(info, || with_backend!(self, be => run(be, desc, x, w, transposed, out)));
        }
        // The unfused chain: expand, depthwise, project (each a public op, validated again).
        let expanded = match w.expand {
            Some(we) => {
                let pw = PointwiseOptions::default().layout(desc.layout).activation(Activation::Relu6);
                self.pointwise_conv2d(x, we, w.expand_bias, &pw)?
            }
            None => x.clone(),
        };
        let dw_opts = Conv2dOptions::default()
            .stride([desc.stride; 2])
            .padding([1; 4])
            .layout(desc.layout)
            .activation(Activation::Relu6);
        let filtered = self.depthwise_conv2d(&expanded, w.depthwise, w.depthwise_bias, &dw_opts)?;
        drop(expanded);
        let pw = PointwiseOptions::default().layout(desc.layout).residual(desc.residual().then_some(x));
        self.pointwise_conv2d_into(&filtered, w.project, w.project_bias, &pw, out)
    }

    /// Validates the call and builds its descriptor.
    fn block_desc(&self, x: &Tensor, w: &BlockWeights<'_>, opts: &BlockOptions) -> Result<InvertedResidualDesc> {
        let dtype = x.dtype();
        for (name, t) in named(x, w) {
            if let Some(t) = t {
                check_device(OP, self, name, t)?;
                check_dtype(OP, dtype, name, t)?;
            }
        }
        self.check_dtype(dtype)?;
        let [n, c, h, wd] = match (x.shape(), opts.layout) {
            (&[n, c, h, w], Layout::Nchw) => [n, c, h, w],
            (&[n, h, w, c], Layout::Nhwc) => [n, c, h, w],
            _ => return Err(Error::WrongRank { op: OP, tensor: "x", expected: "4", actual: x.shape().len() }),
        };
        if !matches!(opts.stride, 1 | 2) {
            return Err(Error::InvalidParameter {
                op: OP,
                param: "stride",
                reason: format!("{} is not 1 or 2", opts.stride),
            });
        }
        if c == 0 {
            return Err(Error::InvalidParameter { op: OP, param: "x", reason: "the input has no channels".into() });
        }
        let (hidden, co) = weight_dims(w, c)?;
        let desc = InvertedResidualDesc::new(opts.layout, [n, c, h, wd], co)
            .hidden(hidden)
            .stride(opts.stride)
            .expand(w.expand.is_some())
            .expand_bias(w.expand_bias.is_some())
            .dw_bias(w.depthwise_bias.is_some())
            .project_bias(w.project_bias.is_some());
        desc.checked_lens().ok_or_else(|| Error::Overflow { op: OP, what: "an element count of the block".into() })?;
        Ok(desc)
    }
}

/// The hidden and output channels of a block's weights for `c` input channels, their shapes
/// checked against each other.
fn weight_dims(w: &BlockWeights<'_>, c: usize) -> Result<(usize, usize)> {
    let rank4 = |name: &'static str, t: &Tensor| match *t.shape() {
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(Error::WrongRank { op: OP, tensor: name, expected: "4", actual: t.shape().len() }),
    };
    let mismatch = |name: &'static str, expected: Vec<usize>, t: &Tensor| Error::ShapeMismatch {
        op: OP,
        tensor: name,
        expected,
        actual: t.shape().to_vec(),
    };
    let hidden = match w.expand {
        Some(we) => {
            let [hid, ci, kh, kw] = rank4("expand", we)?;
            if ci != c || kh != 1 || kw != 1 || hid == 0 {
                return Err(mismatch("expand", vec![hid.max(1), c, 1, 1], we));
            }
            hid
        }
        None => {
            if w.expand_bias.is_some() {
                return Err(Error::InvalidParameter {
                    op: OP,
                    param: "expand_bias",
                    reason: "an expand bias without an expand weight".into(),
                });
            }
            c
        }
    };
    if rank4("depthwise", w.depthwise)? != [hidden, 1, 3, 3] {
        return Err(mismatch("depthwise", vec![hidden, 1, 3, 3], w.depthwise));
    }
    let [co, hid_p, kh, kw] = rank4("project", w.project)?;
    if hid_p != hidden || kh != 1 || kw != 1 {
        return Err(mismatch("project", vec![co, hidden, 1, 1], w.project));
    }
    for (name, bias, len) in [
        ("expand_bias", w.expand_bias, hidden),
        ("depthwise_bias", w.depthwise_bias, hidden),
        ("project_bias", w.project_bias, co),
    ] {
        if let Some(b) = bias
            && b.shape() != [len]
        {
            return Err(mismatch(name, vec![len], b));
        }
    }
    Ok((hidden, co))
}

/// FLOPs of the block without recomputation: 2 per multiply-add of the three stages.
fn fused_flops(d: &InvertedResidualDesc) -> u64 {
    // In f64 (exact for any real size; a float-to-int cast saturates instead of overflowing).
    let f = |v: usize| v as f64;
    let (hw, ohw) = (f(d.height) * f(d.width), f(d.out_h()) * f(d.out_w()));
    let (c, hid, co) = (f(d.channels), f(d.hidden), f(d.out_channels));
    let expand = if d.expand { hw * c * hid } else { 0.0 };
    (2.0 * f(d.batch) * (expand + ohw * hid * 9.0 + ohw * hid * co)) as u64
}

/// A packed block's transposed 1 × 1 weights (expand, projection), where it has them.
type Transposed<'t> = (Option<&'t Tensor>, Option<&'t Tensor>);
const NO_TRANSPOSED: Transposed<'static> = (None, None);

/// The weights and biases with their names.
fn named_weights<'a>(w: &BlockWeights<'a>) -> [(&'static str, Option<&'a Tensor>); 6] {
    let [_, rest @ ..] = named_with(None, w);
    rest
}

/// Every tensor argument with its name.
fn named<'a>(x: &'a Tensor, w: &BlockWeights<'a>) -> [(&'static str, Option<&'a Tensor>); 7] {
    named_with(Some(x), w)
}

fn named_with<'a>(x: Option<&'a Tensor>, w: &BlockWeights<'a>) -> [(&'static str, Option<&'a Tensor>); 7] {
    [
        ("x", x),
        ("expand", w.expand),
        ("expand_bias", w.expand_bias),
        ("depthwise", Some(w.depthwise)),
        ("depthwise_bias", w.depthwise_bias),
        ("project", Some(w.project)),
        ("project_bias", w.project_bias),
    ]
}

fn run<'t, B: BackendOps>(
    be: &B,
    desc: &InvertedResidualDesc,
    x: &'t Tensor,
    w: &BlockWeights<'t>,
    transposed: Transposed<'t>,
    out: &Tensor,
) -> Result<()> {
    fn opt<'t, B: BackendOps>(name: &'static str, t: Option<&'t Tensor>) -> Result<Option<&'t B::Storage>> {
        t.map(|t| storage::<B>(OP, name, t)).transpose()
    }
    let args = BlockArgs {
        x: storage::<B>(OP, "x", x)?,
        expand: opt::<B>("expand", w.expand)?,
        expand_bias: opt::<B>("expand_bias", w.expand_bias)?,
        depthwise: storage::<B>(OP, "depthwise", w.depthwise)?,
        depthwise_bias: opt::<B>("depthwise_bias", w.depthwise_bias)?,
        project: storage::<B>(OP, "project", w.project)?,
        project_bias: opt::<B>("project_bias", w.project_bias)?,
        expand_t: opt::<B>("packed", transposed.0)?,
        project_t: opt::<B>("packed", transposed.1)?,
    };
    be.inverted_residual(desc, x.dtype(), &args, storage::<B>(OP, "out", out)?)
}

option_setters!(BlockOptions { stride: usize, layout: Layout, fused: bool });
