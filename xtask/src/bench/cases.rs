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
    if scale.gpu && !scale.quick {
        // Between the decode rows: the GEMV kernels' row tiles (CUDA: 4 rows in registers,
        // 16 and 32 through the shared-memory ring), up to where the tiled kernel takes over.
        for m in [4, 8, 24, 32] {
            push("decode", plain(m, 4096, 4096));
        }
    }

    // mobilenet: MobileNetV2's depthwise 3×3 layers (size², channels, stride).
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
                let layout = match layout {
                    Layout::Nchw => "nchw",
                    Layout::Nhwc => "nhwc",
                    other => unimplemented!("{other:?}"),
                };
                format!("{batch}x{channels}x{size}² s{stride} {layout}")
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

    /// Floating-point operations, for the compute-bound ops.
    pub fn flops(&self) -> Option<f64> {
        match self {
            Case::Matmul { .. } => self.matmul_desc().map(|d| d.flops()),
            Case::Conv { .. } => self.conv_desc().map(|d| d.flops()),
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
}
