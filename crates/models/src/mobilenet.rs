//! MobileNetV2 on a tilekit device: the folded weights uploaded once, then a forward pass of
//! device ops only (a dense 3×3 stride-2 conv stem, 17 blocks, 1×1 head, mean pool, classifier; each
//! block's weights packed at load, [`Device::pack_block_weights`], and the head's and the
//! classifier's, [`Device::pack_matmul_weights`]).

use crate::arch::{self, BlockSpec, HEAD_CHANNELS, NUM_CLASSES, STEM_CHANNELS};
use crate::{ModelError, Weights};
use tilekit::{
    Activation, BlockOptions, Conv2dOptions, DType, Device, Layout, MatmulOptions, PackedBlock, PackedMatmul,
    PointwiseOptions, Tensor,
};

/// A conv's weight and bias on the device.
#[derive(Debug)]
struct Conv {
    weight: Tensor,
    bias: Tensor,
}

/// One inverted-residual block's parameters on the device.
#[derive(Debug)]
pub struct BlockWeights {
    /// The block's geometry.
    pub spec: BlockSpec,
    expand: Option<Conv>,
    depthwise: Conv,
    project: Conv,
    /// The same weights prepared once for the fused op ([`Device::pack_block_weights`]).
    packed: PackedBlock,
}

impl BlockWeights {
    /// The block's weights as prepared for [`Device::inverted_residual_packed`].
    pub fn packed(&self) -> &PackedBlock {
        &self.packed
    }
}

/// One inverted-residual block, unfused: expand (1×1 + ReLU6, if the block has it), depthwise
/// (3×3, stride 1 or 2, padding 1, + ReLU6), project (1×1, linear, plus the input when the
/// block is residual). The one place a block runs, so it can be routed to a fused kernel.
pub fn block(dev: &Device, x: &Tensor, w: &BlockWeights, layout: Layout) -> Result<Tensor, tilekit::Error> {
    let expanded;
    let hidden = match &w.expand {
        Some(e) => {
            let opts = PointwiseOptions::default().layout(layout).activation(Activation::Relu6).residual(None);
            expanded = dev.pointwise_conv2d(x, &e.weight, Some(&e.bias), &opts)?;
            &expanded
        }
        None => x,
    };
    let s = w.spec.stride;
    let conv = Conv2dOptions::default().stride([s, s]).padding([1; 4]).layout(layout).activation(Activation::Relu6);
    let filtered = dev.depthwise_conv2d(hidden, &w.depthwise.weight, Some(&w.depthwise.bias), &conv)?;
    let opts = PointwiseOptions::default()
        .layout(layout)
        .activation(Activation::None)
        .residual(w.spec.residual().then_some(x));
    dev.pointwise_conv2d(&filtered, &w.project.weight, Some(&w.project.bias), &opts)
}

/// One inverted-residual block as one fused op ([`Device::inverted_residual_packed`], on the
/// weights packed at load: the expanded tensor stays on chip). Where the backend has no fused kernel (`Error::Backend`)
/// or refuses the tensors, the unfused chain ([`block`]) runs instead.
pub fn fused_block(dev: &Device, x: &Tensor, w: &BlockWeights, layout: Layout) -> Result<Tensor, tilekit::Error> {
    let opts = BlockOptions::default().stride(w.spec.stride).layout(layout).fused(true);
    match dev.inverted_residual_packed(x, &w.packed, &opts) {
        Err(tilekit::Error::Backend { .. }) => block(dev, x, w, layout),
        r => r,
    }
}

/// MobileNetV2 with its weights on one device, in one dtype and layout.
#[derive(Debug)]
pub struct MobileNetV2 {
    device: Device,
    dtype: DType,
    layout: Layout,
    /// The stem, a dense 3×3 stride-2 conv (`Device::conv2d`): `[32, 3, 3, 3]`.
    stem: Conv,
    blocks: Vec<BlockWeights>,
    /// The head 1×1 conv's weight `[1280, 320]` packed once ([`Device::pack_matmul_weights`]),
    /// and its bias.
    head: PackedMatmul,
    head_bias: Tensor,
    /// The classifier's weight `[1000, 1280]`, packed once, and its bias.
    fc_weight: PackedMatmul,
    fc_bias: Tensor,
    /// Blocks through [`fused_block`] (the default) or [`block`].
    fused: bool,
}

impl MobileNetV2 {
    /// Uploads `weights` to `device` in `dtype` (rounded to nearest even), for a network run
    /// in `layout`.
    pub fn new(device: &Device, weights: &Weights, dtype: DType, layout: Layout) -> Result<MobileNetV2, ModelError> {
        device.check_dtype(dtype)?;
        let up = |c: &crate::FoldedConv, shape: &[usize]| -> Result<Conv, tilekit::Error> {
            Ok(Conv {
                weight: device.tensor_from_f32(shape, dtype, &c.weight)?,
                bias: device.tensor_from_f32(&[c.shape[0]], dtype, &c.bias)?,
            })
        };
        let mut convs = weights.convs.iter();
        let mut next = || convs.next().ok_or_else(|| ModelError::Input("the weights have too few convs".into()));
        let stem = up(next()?, &[STEM_CHANNELS, 3, 3, 3])?;
        let mut blocks = Vec::new();
        for spec in arch::blocks() {
            let expand = if spec.has_expand() {
                let c = next()?;
                Some(up(c, &c.shape)?)
            } else {
                None
            };
            let c = next()?;
            let depthwise = up(c, &c.shape)?;
            let c = next()?;
            let project = up(c, &c.shape)?;
            let packed = device.pack_block_weights(&tilekit::BlockWeights {
                expand: expand.as_ref().map(|e| &e.weight),
                expand_bias: expand.as_ref().map(|e| &e.bias),
                depthwise: &depthwise.weight,
                depthwise_bias: Some(&depthwise.bias),
                project: &project.weight,
                project_bias: Some(&project.bias),
            })?;
            blocks.push(BlockWeights { spec, expand, depthwise, project, packed });
        }
        let c = next()?;
        let head = up(c, &[c.shape[0], c.shape[1]])?;
        let head_bias = head.bias;
        let head = device.pack_matmul_weights(&head.weight, true)?;
        let fc_weight = device.tensor_from_f32(&[NUM_CLASSES, HEAD_CHANNELS], dtype, &weights.fc_weight)?;
        let fc_weight = device.pack_matmul_weights(&fc_weight, true)?;
        let fc_bias = device.tensor_from_f32(&[NUM_CLASSES], dtype, &weights.fc_bias)?;
        Ok(MobileNetV2 {
            device: device.clone(),
            dtype,
            layout,
            stem,
            blocks,
            head,
            head_bias,
            fc_weight,
            fc_bias,
            fused: true,
        })
    }

    /// Runs the blocks fused (`true`, the default: [`fused_block`]) or as the three-op chain
    /// ([`block`], what `--unfused` selects).
    pub fn set_fused(&mut self, fused: bool) {
        self.fused = fused;
    }

    /// Whether the blocks run fused.
    pub fn fused(&self) -> bool {
        self.fused
    }

    /// The device the network runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The 17 blocks' parameters on the device.
    pub fn blocks(&self) -> &[BlockWeights] {
        &self.blocks
    }

    /// Uploads an NCHW float32 image batch `[N, 3, H, W]` in the network's dtype and layout
    /// (transposed to NHWC on the host, before the network, if it runs in NHWC).
    pub fn upload_input(&self, shape: &[usize], data: &[f32]) -> Result<Tensor, ModelError> {
        let &[n, c, h, w] = shape else {
            return Err(ModelError::Input(format!("shape {shape:?}: expected [N, 3, H, W]")));
        };
        if c != 3 || h < 32 || w < 32 || n == 0 {
            return Err(ModelError::Input(format!(
                "shape {shape:?}: expected [N, 3, H, W] with N >= 1 and H, W >= 32"
            )));
        }
        if data.len() != n * c * h * w {
            return Err(ModelError::Input(format!("{} values for shape {shape:?}", data.len())));
        }
        Ok(match self.layout {
            Layout::Nchw => self.device.tensor_from_f32(shape, self.dtype, data)?,
            Layout::Nhwc => {
                let mut t = vec![0.0f32; data.len()];
                for b in 0..n {
                    for ch in 0..c {
                        for i in 0..h * w {
                            t[(b * h * w + i) * c + ch] = data[(b * c + ch) * h * w + i];
                        }
                    }
                }
                self.device.tensor_from_f32(&[n, h, w, c], self.dtype, &t)?
            }
            other => return Err(ModelError::Input(format!("layout {other:?} is not supported"))),
        })
    }

    /// The forward pass on an uploaded input (see [`MobileNetV2::upload_input`]): logits
    /// `[N, 1000]` in the network's dtype, left on the device.
    pub fn forward(&self, input: &Tensor) -> Result<Tensor, ModelError> {
        let dev = &self.device;
        let layout = self.layout;
        let stem = Conv2dOptions::default().stride([2, 2]).padding([1; 4]).layout(layout).activation(Activation::Relu6);
        let mut x = dev.conv2d(input, &self.stem.weight, Some(&self.stem.bias), &stem)?;
        for b in &self.blocks {
            x = if self.fused { fused_block(dev, &x, b, layout)? } else { block(dev, &x, b, layout)? };
        }
        // The head 1×1 conv as a product with its packed weight, pixel-major whatever the
        // layout (`[N, H·W, 1280]`; NCHW's `[N, 320, H·W]` is `A` transposed), pooled as NHWC.
        let (n, h, w, c, trans_a) = match (layout, x.shape()) {
            (Layout::Nhwc, &[n, h, w, c]) => (n, h, w, c, false),
            (_, &[n, c, h, w]) => (n, h, w, c, true),
            (_, other) => return Err(ModelError::Input(format!("the blocks ended in shape {other:?}"))),
        };
        let a = if trans_a { x.reshape(&[n, c, h * w])? } else { x.reshape(&[n, h * w, c])? };
        let head = MatmulOptions::default().trans_a(trans_a).bias(Some(&self.head_bias)).activation(Activation::Relu6);
        let x = dev.matmul_packed(&a, &self.head, &head)?.reshape(&[n, h, w, HEAD_CHANNELS])?;
        let pooled = dev.global_avg_pool(&x, Layout::Nhwc)?;
        let fc = MatmulOptions::default().bias(Some(&self.fc_bias));
        Ok(dev.matmul_packed(&pooled, &self.fc_weight, &fc)?)
    }

    /// Uploads, runs and reads back: logits `[N, 1000]` as f32, row-major.
    pub fn run(&self, shape: &[usize], data: &[f32]) -> Result<Vec<f32>, ModelError> {
        let x = self.upload_input(shape, data)?;
        Ok(self.forward(&x)?.to_f32_vec()?)
    }
}
