//! The bench's workloads: suites named after real models, and the sizes `--quick` keeps.

use tilekit::{Activation, Conv2dDesc, DType, Layout, MatmulDesc};

/// One op at one shape (the dtype and backend come from the run).
#[derive(Debug, Clone, PartialEq)]
pub enum Case {
    /// `act(A·B + bias)`, row-major; B stored `[K, N]`, or `[N, K]` (`trans_b`: nn.Linear and
    /// GGUF weights, `A·Bᵀ`); `packed`: B packed once by `Device::pack_matmul_weights` and
    /// multiplied by `Device::matmul_packed_into` (as an engine does with a layer's weights).
    Matmul { m: usize, n: usize, k: usize, bias: bool, activation: Activation, trans_b: bool, packed: bool },
    /// A 3×3 depthwise convolution with padding 1, bias and ReLU6 (MobileNetV2's block).
    Conv { batch: usize, channels: usize, size: usize, stride: usize, layout: Layout },
    /// A dense 3×3 convolution (one group) with padding 1, bias and ReLU6, weight
    /// `[out_channels, in_channels, 3, 3]` (PyTorch's layout in both layouts), run by
    /// `Device::conv2d_into`: MobileNetV2's stem (3 → 32 channels, stride 2, on 224²).
    Conv2d { batch: usize, in_channels: usize, out_channels: usize, size: usize, stride: usize, layout: Layout },
    /// `act(x + bias)` on `[rows, cols]`.
    Activation { rows: usize, cols: usize, bias: bool, activation: Activation },
}

/// A case and the suite it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub suite: &'static str,
    pub case: Case,
}

/// Where the suites run: the sizes a software adapter or a 2-core CPU can take in a few
/// minutes (`--quick`), or the full set (with the large sizes only on a real GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    pub quick: bool,
    pub gpu: bool,
}

/// The suites' names, in the order they run.
pub const SUITES: [&str; 4] = ["square", "decode", "mobilenet", "transformer"];

/// The cases of every suite at `scale`.
pub fn entries(scale: Scale) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut push = |suite, case| out.push(Entry { suite, case });
    let plain =
        |m, n, k| Case::Matmul { m, n, k, bias: false, activation: Activation::None, trans_b: false, packed: false };

    // square: the classic GEMM sweep. 64–256 fit lavapipe in --quick; 2048 and 4096 only make
    // sense on a real GPU (4096³ takes ~2 s per run with the gemm crate on two cores).
    let squares: &[usize] = match (scale.quick, scale.gpu) {
        (true, _) => &[64, 128, 256],
        (false, false) => &[64, 128, 256, 512, 1024],
        (false, true) => &[256, 512, 1024, 2048, 4096],
    };
    for &s in squares {
        push("square", plain(s, s, s));
    }
    // The fused epilogue of a transformer MLP (bias + GELU) at one mid size.
    push(
        "square",
        Case::Matmul {
            m: 256,
            n: 256,
            k: 256,
            bias: true,
            activation: Activation::Gelu,
            trans_b: false,
            packed: false,
        },
    );

    // decode: one token (or 16) against a weight matrix: memory-bound, the LLM decode step.
    // Full sizes are LLaMA-7B's projections, N × K = 4096×4096 (attention), 11008×4096 (gate
    // and up) and 4096×11008 (down), each with B stored [K, N] and [N, K] (nn.Linear / GGUF).
    let dense: &[(usize, usize)] = if scale.quick {
        &[(1024, 1024), (2752, 1024), (1024, 2752)]
    } else {
        &[(4096, 4096), (11008, 4096), (4096, 11008)]
    };
    // Then the same products with the weight packed once, at load (`PackedMatmul`): the
    // layout of the stored weight no longer matters, so one row per shape. ONNX Runtime packs
    // a constant weight the same way at session creation, in both layouts.
    for m in [1, 16] {
        for &(n, k) in dense {
            for trans_b in [false, true] {
                push(
                    "decode",
                    Case::Matmul { m, n, k, bias: false, activation: Activation::None, trans_b, packed: false },
                );
            }
            push(
                "decode",
                Case::Matmul { m, n, k, bias: false, activation: Activation::None, trans_b: false, packed: true },
            );
        }
    }
    if !scale.quick {
        // A prefill chunk of 64 tokens against the attention projection, the weight stored
        // both ways: the mid-sized products between the decode rows and the square ones (on
        // the CPU, `B` stored [N, K] is transposed into panels from 17 rows).
        for trans_b in [false, true] {
            push(
                "decode",
                Case::Matmul {
                    m: 64,
                    n: 4096,
                    k: 4096,
                    bias: false,
                    activation: Activation::None,
                    trans_b,
                    packed: false,
                },
            );
        }
    }
    if scale.gpu && !scale.quick {
        // Between the decode rows: the GEMV kernels' row tiles (CUDA: 4 rows in registers,
        // 16 and 32 through the shared-memory ring), up to where the tiled kernel takes over.
        for m in [4, 8, 24, 32] {
            push("decode", plain(m, 4096, 4096));
        }
    }

    // mobilenet: MobileNetV2's stem, the dense 3×3 convolution from the RGB image (3 → 32
    // channels, stride 2, 224² → 112²), in both layouts (NHWC only in --quick, as the
    // depthwise rows below).
    let stem_layouts: &[Layout] = if scale.quick { &[Layout::Nhwc] } else { &[Layout::Nchw, Layout::Nhwc] };
    for &layout in stem_layouts {
        push("mobilenet", Case::Conv2d { batch: 1, in_channels: 3, out_channels: 32, size: 224, stride: 2, layout });
    }
    // Then its depthwise 3×3 layers (size², channels, stride).
    let layers: &[(usize, usize, usize)] = if scale.quick {
        &[(56, 144, 1), (28, 192, 2), (14, 576, 1), (7, 960, 1)]
    } else {
        &[(112, 32, 1), (112, 96, 2), (56, 144, 1), (56, 144, 2), (28, 192, 1), (14, 384, 1), (14, 576, 1), (7, 960, 1)]
    };
    let batches: &[usize] = if scale.gpu && !scale.quick { &[1, 32] } else { &[1] };
    let layouts: &[Layout] = if scale.quick { &[Layout::Nhwc] } else { &[Layout::Nchw, Layout::Nhwc] };
    for &batch in batches {
        for &layout in layouts {
            for &(size, channels, stride) in layers {
                push("mobilenet", Case::Conv { batch, channels, size, stride, layout });
            }
        }
    }
    if scale.quick {
        // One NCHW layer so both layouts are seen even in --quick.
        push("mobilenet", Case::Conv { batch: 1, channels: 144, size: 56, stride: 1, layout: Layout::Nchw });
    }

    // transformer: GELU on the MLP activations of GPT-2/BERT-base (hidden 768, MLP 3072) and
    // BERT-large (1024, 4096), with and without the bias of the preceding linear layer.
    let acts: &[(usize, usize)] =
        if scale.quick { &[(128, 768), (128, 3072)] } else { &[(512, 768), (512, 3072), (512, 4096)] };
    for &(rows, cols) in acts {
        push("transformer", Case::Activation { rows, cols, bias: false, activation: Activation::Gelu });
        push("transformer", Case::Activation { rows, cols, bias: true, activation: Activation::Gelu });
    }
    let (rows, cols) = acts[acts.len() - 1];
    push("transformer", Case::Activation { rows, cols, bias: true, activation: Activation::GeluTanh });
    // SiLU, the gate activation of Llama-style MLPs (SwiGLU), on the same shape.
    push("transformer", Case::Activation { rows, cols, bias: false, activation: Activation::Silu });
    out
}

impl Case {
    /// The op's name in reports.
    pub fn op(&self) -> &'static str {
        match self {
            Case::Matmul { .. } => "matmul",
            Case::Conv { .. } => "dwconv3x3",
            Case::Conv2d { .. } => "conv2d3x3",
            Case::Activation { .. } => "activation",
        }
    }

    /// The shape and options, readable.
    pub fn shape(&self) -> String {
        match *self {
            Case::Matmul { m, n, k, bias, activation, trans_b, packed } => {
                let layout = match (packed, trans_b) {
                    (true, _) => " packed",
                    (false, true) => " B[N,K]",
                    (false, false) => "",
                };
                let epi = match (bias, activation) {
                    (false, Activation::None) => String::new(),
                    (true, Activation::None) => " +bias".into(),
                    (false, a) => format!(" {}", a.name()),
                    (true, a) => format!(" +bias {}", a.name()),
                };
                format!("{m}x{n}x{k}{layout}{epi}")
            }
            Case::Conv { batch, channels, size, stride, layout } => {
                format!("{batch}x{channels}x{size}² s{stride} {}", layout.name())
            }
            Case::Conv2d { batch, in_channels, out_channels, size, stride, layout } => {
                format!("{batch}x{in_channels}x{size}²→{out_channels} s{stride} {}", layout.name())
            }
            Case::Activation { rows, cols, bias, activation } => {
                format!("{rows}x{cols} {}{}", if bias { "bias+" } else { "" }, activation.name())
            }
        }
    }

    /// The matmul descriptor of a matmul case.
    pub fn matmul_desc(&self) -> Option<MatmulDesc> {
        let Case::Matmul { m, n, k, bias, activation, trans_b, .. } = *self else { return None };
        Some(matmul_desc(m, n, k, bias, activation, trans_b))
    }

    /// The conv descriptor of a conv case.
    pub fn conv_desc(&self) -> Option<Conv2dDesc> {
        let Case::Conv { batch, channels, size, stride, layout } = *self else { return None };
        Some(conv_desc(batch, channels, size, stride, layout))
    }

    /// The geometry of a dense conv case.
    pub fn dense_conv(&self) -> Option<DenseConv> {
        let Case::Conv2d { batch, in_channels, out_channels, size, stride, layout } = *self else { return None };
        Some(DenseConv::new(batch, in_channels, out_channels, size, stride, layout))
    }

    /// Floating-point operations, for the compute-bound ops.
    pub fn flops(&self) -> Option<f64> {
        match self {
            Case::Matmul { .. } => self.matmul_desc().map(|d| d.flops()),
            Case::Conv { .. } => self.conv_desc().map(|d| d.flops()),
            Case::Conv2d { .. } => self.dense_conv().map(|d| d.flops()),
            Case::Activation { .. } => None,
        }
    }

    /// The least memory traffic the op must make in `dtype`: every input read once and the
    /// output written once.
    pub fn bytes(&self, dtype: DType) -> f64 {
        let elems = match *self {
            Case::Matmul { m, n, k, bias, .. } => m * k + k * n + m * n + if bias { n } else { 0 },
            Case::Conv { .. } => self.conv_desc().map_or(0, |d| {
                let [a, b, c, e] = d.input_shape();
                let [f, g, h, i] = d.output_shape();
                a * b * c * e + f * g * h * i + d.out_channels() * 10
            }),
            // Input, weight `[Cout, Cin, 3, 3]`, bias and output.
            Case::Conv2d { .. } => self.dense_conv().map_or(0, |d| {
                let elems = |s: [usize; 4]| s.iter().product::<usize>();
                elems(d.input_shape()) + elems(d.weight_shape()) + d.out_channels + elems(d.output_shape())
            }),
            Case::Activation { rows, cols, bias, .. } => 2 * rows * cols + if bias { cols } else { 0 },
        };
        (elems * dtype.size_bytes()) as f64
    }

    /// The work of the naive f64 CPU reference (multiply-adds), to decide whether timing it
    /// or checking every output against it is affordable.
    pub fn reference_work(&self) -> f64 {
        match self {
            Case::Activation { rows, cols, .. } => (rows * cols) as f64,
            _ => self.flops().unwrap_or(0.0) / 2.0,
        }
    }

    /// The plain product that `Device::naive_matmul` can compare against.
    pub fn plain_matmul(&self) -> Option<(usize, usize, usize)> {
        match *self {
            Case::Matmul { m, n, k, bias: false, activation: Activation::None, trans_b: false, packed: false } => {
                Some((m, n, k))
            }
            _ => None,
        }
    }
}

/// `act(A·B + bias)` on dense row-major `[m, k]` and `[k, n]` (or `[n, k]` with `trans_b`).
pub fn matmul_desc(m: usize, n: usize, k: usize, bias: bool, activation: Activation, trans_b: bool) -> MatmulDesc {
    let mut d = MatmulDesc::new(m, n, k);
    if trans_b {
        d.trans_b = true;
        d.b = tilekit::MatrixView::dense(n, k);
    }
    d.bias_offset = bias.then_some(0);
    d.activation = activation;
    d
}

/// MobileNetV2's depthwise block: 3×3, padding 1, bias, ReLU6.
pub fn conv_desc(batch: usize, channels: usize, size: usize, stride: usize, layout: Layout) -> Conv2dDesc {
    Conv2dDesc::mobilenet_v2_block(batch, channels, size, stride, layout)
}

/// The geometry of a [`Case::Conv2d`]: the input's as a depthwise descriptor of multiplier 1
/// (the same 3×3 filter, padding 1, bias and ReLU6 as [`conv_desc`], on `Cin` channels), and
/// the output channels. `Device::conv2d` describes its own geometry the same way.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DenseConv {
    /// The input's geometry, the filter, stride, padding and activation (`channels` = `Cin`).
    pub desc: Conv2dDesc,
    /// `Cout`.
    pub out_channels: usize,
}

impl DenseConv {
    pub fn new(
        batch: usize,
        in_channels: usize,
        out_channels: usize,
        size: usize,
        stride: usize,
        layout: Layout,
    ) -> DenseConv {
        DenseConv { desc: conv_desc(batch, in_channels, size, stride, layout), out_channels }
    }

    /// The output's geometry: the input's with `Cout` channels. A depthwise descriptor of
    /// multiplier 1 has the dense convolution's output shape and element order.
    pub fn out_desc(&self) -> Conv2dDesc {
        let mut d = self.desc;
        d.channels = self.out_channels;
        d
    }

    /// The input's shape in its layout.
    pub fn input_shape(&self) -> [usize; 4] {
        self.desc.input_shape()
    }

    /// `[Cout, Cin, kh, kw]`, whatever the layout.
    pub fn weight_shape(&self) -> [usize; 4] {
        [self.out_channels, self.desc.channels, self.desc.kernel_h, self.desc.kernel_w]
    }

    /// The output's shape in its layout.
    pub fn output_shape(&self) -> [usize; 4] {
        self.out_desc().output_shape()
    }

    /// Terms per output sum: `Cin·kh·kw`.
    pub fn reduction(&self) -> usize {
        self.desc.channels * self.desc.kernel_h * self.desc.kernel_w
    }

    /// Floating-point operations: `2·N·Cout·OH·OW·Cin·kh·kw` (taps in the padding counted, as
    /// for the depthwise rows).
    pub fn flops(&self) -> f64 {
        let (oh, ow) = (self.desc.out_h().unwrap_or(0), self.desc.out_w().unwrap_or(0));
        2.0 * (self.desc.batch * self.out_channels * oh * ow) as f64 * self.reduction() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_suite_has_cases_at_every_scale() {
        for quick in [true, false] {
            for gpu in [true, false] {
                let e = entries(Scale { quick, gpu });
                for s in SUITES {
                    assert!(e.iter().any(|x| x.suite == s), "{s} empty at quick={quick} gpu={gpu}");
                }
            }
        }
    }

    #[test]
    fn traffic_and_flops() {
        let c =
            Case::Matmul { m: 2, n: 3, k: 4, bias: true, activation: Activation::None, trans_b: true, packed: false };
        assert_eq!(c.flops(), Some(48.0));
        assert_eq!(c.bytes(DType::F32), ((8 + 12 + 6 + 3) * 4) as f64);
        let a = Case::Activation { rows: 2, cols: 8, bias: false, activation: Activation::Gelu };
        assert_eq!(a.bytes(DType::Bf16), 64.0);
    }

    /// MobileNetV2's stem: 3×224² → 32×112², 27 terms per output.
    #[test]
    fn stem_conv_traffic_flops_and_shape() {
        for (layout, name) in [(Layout::Nchw, "nchw"), (Layout::Nhwc, "nhwc")] {
            let c = Case::Conv2d { batch: 1, in_channels: 3, out_channels: 32, size: 224, stride: 2, layout };
            assert_eq!(c.op(), "conv2d3x3");
            assert_eq!(c.shape(), format!("1x3x224²→32 s2 {name}"));
            assert_eq!(c.flops(), Some(2.0 * 32.0 * 112.0 * 112.0 * 27.0));
            assert_eq!(c.reference_work(), 32.0 * 112.0 * 112.0 * 27.0);
            // Input, weight, bias and output.
            let elems = 3 * 224 * 224 + 32 * 3 * 3 * 3 + 32 + 32 * 112 * 112;
            assert_eq!(c.bytes(DType::F32), (elems * 4) as f64);
            assert_eq!(c.bytes(DType::F16), (elems * 2) as f64);
            let d = c.dense_conv().expect("a dense conv case");
            assert_eq!(d.weight_shape(), [32, 3, 3, 3]);
            let (input, output) = match layout {
                Layout::Nchw => ([1, 3, 224, 224], [1, 32, 112, 112]),
                _ => ([1, 224, 224, 3], [1, 112, 112, 32]),
            };
            assert_eq!((d.input_shape(), d.output_shape()), (input, output));
            assert_eq!(c.conv_desc(), None);
            assert_eq!(c.plain_matmul(), None);
        }
        // A batch of two, stride 1: 2·N·Cout·OH·OW·Cin·9.
        let c = Case::Conv2d { batch: 2, in_channels: 4, out_channels: 5, size: 6, stride: 1, layout: Layout::Nchw };
        assert_eq!(c.flops(), Some(2.0 * 2.0 * 5.0 * 36.0 * 36.0));
        assert_eq!(c.bytes(DType::Bf16), ((2 * 4 * 36 + 5 * 36 + 5 + 2 * 5 * 36) * 2) as f64);
        assert_eq!(c.shape(), "2x4x6²→5 s1 nchw");
    }

    /// The mobilenet suite has the stem in both layouts, NHWC only in --quick (as the
    /// depthwise layers).
    #[test]
    fn mobilenet_has_the_stem_conv() {
        for quick in [true, false] {
            for gpu in [true, false] {
                let layouts: Vec<Layout> = entries(Scale { quick, gpu })
                    .into_iter()
                    .filter_map(|e| match e.case {
                        Case::Conv2d { batch: 1, in_channels: 3, out_channels: 32, size: 224, stride: 2, layout } => {
                            assert_eq!(e.suite, "mobilenet");
                            Some(layout)
                        }
                        _ => None,
                    })
                    .collect();
                let want = if quick { vec![Layout::Nhwc] } else { vec![Layout::Nchw, Layout::Nhwc] };
                assert_eq!(layouts, want, "quick={quick} gpu={gpu}");
            }
        }
    }
}
