//! A case's data on the host and on a device, and the op call the bench times.

use super::cases::{Case, DenseConv, conv_desc, matmul_desc};
use anyhow::{Context, Result};
use tilekit::{Conv2dDesc, Conv2dOptions, DType, Device, MatmulOptions, PackedMatmul, Tensor};

/// A deterministic generator (64-bit LCG, Knuth's constants): the bench needs reproducible
/// inputs, not good randomness, and this keeps a dependency out.
#[derive(Debug)]
struct Lcg(u64);

impl Lcg {
    /// A uniform integer in `[-max, max]`.
    fn int(&mut self, max: u32) -> i32 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % (2 * u64::from(max) + 1)) as i32 - max as i32
    }

    /// Uniform in `[-scale, scale)`.
    fn next(&mut self, scale: f32) -> f32 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let unit = (self.0 >> 40) as f32 / (1u64 << 24) as f32; // [0, 1), 24 random bits
        (2.0 * unit - 1.0) * scale
    }
}

/// The host copy of a case's inputs, already rounded to the storage dtype (so the references
/// see exactly the values the kernels read).
#[derive(Debug, Clone)]
pub struct Host {
    /// `(shape, data)` per input: matmul `[a, b, bias?]`, conv (depthwise or dense) `[input,
    /// weight, bias]`, activation `[x, bias?]`.
    pub inputs: Vec<(Vec<usize>, Vec<f32>)>,
    /// The output's shape.
    pub out_shape: Vec<usize>,
}

impl Host {
    pub fn new(case: &Case, dtype: DType) -> Host {
        let mut rng = Lcg(0x7111_e41d);
        let mut random = |shape: Vec<usize>, scale: f32| {
            let n = shape.iter().product();
            let data = (0..n).map(|_| dtype.round_f32(rng.next(scale))).collect();
            (shape, data)
        };
        match *case {
            Case::Matmul { m, n, k, bias, trans_b, .. } => {
                let b_shape = if trans_b { vec![n, k] } else { vec![k, n] };
                let mut inputs = vec![random(vec![m, k], 1.0), random(b_shape, 1.0)];
                if bias {
                    inputs.push(random(vec![n], 1.0));
                }
                Host { inputs, out_shape: vec![m, n] }
            }
            Case::Conv { batch, channels, size, stride, layout } => {
                let d = conv_desc(batch, channels, size, stride, layout);
                let inputs = vec![
                    random(d.input_shape().to_vec(), 1.0),
                    random(d.weight_shape().to_vec(), 1.0),
                    random(vec![d.out_channels()], 1.0),
                ];
                Host { inputs, out_shape: d.output_shape().to_vec() }
            }
            Case::Conv2d { batch, in_channels, out_channels, size, stride, layout } => {
                let d = DenseConv::new(batch, in_channels, out_channels, size, stride, layout);
                let inputs = vec![
                    random(d.input_shape().to_vec(), 1.0),
                    random(d.weight_shape().to_vec(), 1.0),
                    random(vec![out_channels], 1.0),
                ];
                Host { inputs, out_shape: d.output_shape().to_vec() }
            }
            Case::Activation { rows, cols, bias, .. } => {
                // [-5, 5] reaches GELU's tails, where the formulas differ most.
                let mut inputs = vec![random(vec![rows, cols], 5.0)];
                if bias {
                    inputs.push(random(vec![cols], 1.0));
                }
                Host { inputs, out_shape: vec![rows, cols] }
            }
        }
    }
}

/// Grid of the exact inputs' products (and of the biases added to them): `2⁻⁶`.
pub const EXACT_GRID: f64 = 1.0 / 64.0;

impl Host {
    /// Inputs on which the op's arithmetic is exact in `f32`, for the correctness check: small
    /// integers scaled by powers of two. Matmul and conv operands are `i/8` with `|i| <= 8`
    /// (exact in f32, f16 and bf16), so every product is a multiple of 2⁻⁶ of magnitude at
    /// most 1, and biases are `i/64` with `|i| <= 64`. Every partial sum is then a multiple of
    /// 2⁻⁶ below `K + 1` in magnitude, which `f32` holds exactly while `K < 2¹⁸` (every bench
    /// case; see [`Host::exact_is_exact`]), whatever the summation order. The results stay
    /// within f16's range (|result| <= K + 1 <= 65504). Activation inputs are `i/64` in [-5, 5]
    /// with biases `i/64` in [-1, 1] (rounded to the storage dtype, still multiples of 2⁻⁶), so
    /// `x + bias` is exact too. The only rounding left is the activation's own and the one
    /// rounding to the storage dtype. (Dense conv operands are on a coarser grid; see the
    /// case below.)
    pub fn exact(case: &Case, dtype: DType) -> Host {
        let mut rng = Lcg(0xe8ac_7c4e);
        let mut ints = |shape: Vec<usize>, max: u32, scale: f32| {
            let n = shape.iter().product();
            let data = (0..n).map(|_| dtype.round_f32(rng.int(max) as f32 * scale)).collect();
            (shape, data)
        };
        match *case {
            Case::Matmul { m, n, k, bias, trans_b, .. } => {
                let b_shape = if trans_b { vec![n, k] } else { vec![k, n] };
                let mut inputs = vec![ints(vec![m, k], 8, 0.125), ints(b_shape, 8, 0.125)];
                if bias {
                    inputs.push(ints(vec![n], 64, 1.0 / 64.0));
                }
                Host { inputs, out_shape: vec![m, n] }
            }
            Case::Conv { batch, channels, size, stride, layout } => {
                let d = conv_desc(batch, channels, size, stride, layout);
                let inputs = vec![
                    ints(d.input_shape().to_vec(), 8, 0.125),
                    ints(d.weight_shape().to_vec(), 8, 0.125),
                    ints(vec![d.out_channels()], 64, 1.0 / 64.0),
                ];
                Host { inputs, out_shape: d.output_shape().to_vec() }
            }
            Case::Conv2d { batch, in_channels, out_channels, size, stride, layout } => {
                // A coarser grid for the operands, `i/2` with `|i| <= 2`: where a backend has no
                // kernel of its own the op is im2col + the pointwise conv, whose NCHW form
                // stores the sum before it adds the bias, so that sum must be exact in the
                // storage dtype too. Its products are multiples of 2⁻² of magnitude at most 1,
                // and the sums (27 terms for the stem) need 7 significant bits: exact in bf16.
                let d = DenseConv::new(batch, in_channels, out_channels, size, stride, layout);
                let inputs = vec![
                    ints(d.input_shape().to_vec(), 2, 0.5),
                    ints(d.weight_shape().to_vec(), 2, 0.5),
                    ints(vec![out_channels], 64, 1.0 / 64.0),
                ];
                Host { inputs, out_shape: d.output_shape().to_vec() }
            }
            Case::Activation { rows, cols, bias, .. } => {
                let mut inputs = vec![ints(vec![rows, cols], 320, 1.0 / 64.0)];
                if bias {
                    inputs.push(ints(vec![cols], 64, 1.0 / 64.0));
                }
                Host { inputs, out_shape: vec![rows, cols] }
            }
        }
    }

    /// Whether [`Host::exact`]'s inputs make every partial sum of `case` exact in `f32`: the
    /// sums are multiples of 2⁻⁶ of magnitude at most `K + 1` (taps + 1 for a conv), which
    /// need `log2(K + 1) + 6` of f32's 24 significant bits. A dense conv's sums before the
    /// bias (multiples of 2⁻² of magnitude at most `Cin·kh·kw`) must also fit bf16's 8.
    pub fn exact_is_exact(case: &Case) -> bool {
        let terms = match *case {
            Case::Matmul { k, .. } => k,
            Case::Conv { .. } => 9,
            Case::Conv2d { .. } => case.dense_conv().map_or(0, |d| d.reduction()),
            Case::Activation { .. } => 1,
        };
        let stored_sums_exact = case.dense_conv().is_none_or(|d| d.reduction() * 4 <= 1 << 8);
        stored_sums_exact && ((terms as f64 + 1.0) / EXACT_GRID) < f64::from(1u32 << 24)
    }
}

/// The options of a convolution with `d`'s stride, padding, dilation, layout and activation.
fn conv_options(d: &Conv2dDesc) -> Conv2dOptions {
    Conv2dOptions::default()
        .stride([d.stride_h, d.stride_w])
        .padding([d.pad_top, d.pad_bottom, d.pad_left, d.pad_right])
        .dilation([d.dilation_h, d.dilation_w])
        .layout(d.layout)
        .activation(d.activation)
}

/// A case's tensors on one device, ready to run again and again.
#[derive(Debug)]
pub struct Bound {
    pub device: Device,
    case: Case,
    inputs: Vec<Tensor>,
    /// B packed by `pack_matmul_weights` (a `packed` matmul case).
    packed: Option<PackedMatmul>,
    out: Tensor,
}

impl Bound {
    pub fn new(device: &Device, case: &Case, dtype: DType, host: &Host) -> Result<Bound> {
        let inputs = host
            .inputs
            .iter()
            .map(|(shape, data)| device.tensor_from_f32(shape, dtype, data))
            .collect::<tilekit::Result<Vec<_>>>()
            .context("uploading the inputs")?;
        let out = device.zeros(&host.out_shape, dtype).context("allocating the output")?;
        let packed = match *case {
            Case::Matmul { packed: true, trans_b, .. } => {
                Some(device.pack_matmul_weights(&inputs[1], trans_b).context("packing the weight")?)
            }
            _ => None,
        };
        Ok(Bound { device: device.clone(), case: case.clone(), inputs, packed, out })
    }

    /// Queues the op (into the preallocated output, so nothing is allocated per run).
    pub fn run(&self) -> Result<()> {
        let dev = &self.device;
        match &self.case {
            &Case::Matmul { m, n, k, bias, activation, trans_b, .. } => match &self.packed {
                Some(w) => {
                    let opts = MatmulOptions::new().bias(self.inputs.get(2)).activation(activation);
                    dev.matmul_packed_into(&self.inputs[0], w, &opts, &self.out)?;
                }
                None => {
                    let desc = matmul_desc(m, n, k, bias, activation, trans_b);
                    dev.matmul_into(&desc, &self.inputs[0], &self.inputs[1], self.inputs.get(2), None, &self.out)?;
                }
            },
            &Case::Conv { batch, channels, size, stride, layout } => {
                let opts = conv_options(&conv_desc(batch, channels, size, stride, layout));
                dev.depthwise_conv2d_into(&self.inputs[0], &self.inputs[1], self.inputs.get(2), &opts, &self.out)?;
            }
            &Case::Conv2d { batch, in_channels, out_channels, size, stride, layout } => {
                let d = DenseConv::new(batch, in_channels, out_channels, size, stride, layout);
                let opts = conv_options(&d.desc);
                dev.conv2d_into(&self.inputs[0], &self.inputs[1], self.inputs.get(2), &opts, &self.out)?;
            }
            Case::Activation { activation, .. } => {
                dev.activation_into(&self.inputs[0], self.inputs.get(1), *activation, &self.out)?;
            }
        }
        Ok(())
    }

    /// Runs the op and waits for it: one timed sample.
    pub fn run_synced(&self) -> Result<()> {
        self.run()?;
        self.device.synchronize()?;
        Ok(())
    }

    /// The output, widened to f32.
    pub fn output(&self) -> Result<Vec<f32>> {
        Ok(self.out.to_f32_vec()?)
    }

    /// The bias tensor of a matmul case, if it has one.
    pub fn bias(&self) -> Option<&Tensor> {
        match self.case {
            Case::Matmul { bias: true, .. } => self.inputs.get(2),
            _ => None,
        }
    }

    /// The `A` and `B` tensors of a matmul case (for the naive-kernel reference).
    pub fn matmul_operands(&self) -> Option<(&Tensor, &Tensor)> {
        match self.case {
            Case::Matmul { .. } => Some((&self.inputs[0], &self.inputs[1])),
            _ => None,
        }
    }
}
