//! CPU reference implementations: the oracle.
//!
//! Naive loops, `f64` accumulation, no blocking, no threads, no cleverness: each function is
//! meant to be read next to the descriptor's documentation and be obviously right. Inputs are
//! the stored values widened to `f64` (so the reference sees exactly what a kernel reads);
//! outputs are `f64` and only the elements the descriptor names are written, so a caller can
//! surround them with guard values.

use crate::{ActivationDesc, Conv2dDesc, DType, MatmulDesc, Precision};

/// `out = act(alpha · op(A) · op(B) + bias + beta · C)`; see [`MatmulDesc`].
///
/// # Panics
/// If a slice is shorter than the descriptor's view of it (the caller validates).
pub fn matmul(desc: &MatmulDesc, a: &[f64], b: &[f64], bias: Option<&[f64]>, c: Option<&[f64]>, out: &mut [f64]) {
    if desc.batch == 0 || desc.m == 0 || desc.n == 0 {
        return; // An empty product: nothing to write (and nothing to loop over).
    }
    let round = |x: f64| match desc.precision {
        // The f16 policy takes f16 storage only, whose values are already f16: the oracle is
        // the exact product of the stored values (the policy's looser bound is the tolerance's).
        Precision::Highest | Precision::F16 => x,
        Precision::Bf16 => DType::Bf16.round_f32(x as f32) as f64,
    };
    for bt in 0..desc.batch {
        for i in 0..desc.m {
            for j in 0..desc.n {
                let mut acc = 0.0f64;
                for p in 0..desc.k {
                    acc += round(a[desc.a_index(bt, i, p)]) * round(b[desc.b_index(bt, p, j)]);
                }
                let mut v = desc.alpha as f64 * acc;
                if let (Some(off), Some(bias)) = (desc.bias_offset, bias) {
                    v += bias[off + j];
                }
                if let (Some(cv), Some(c)) = (desc.c, c) {
                    v += desc.beta as f64 * c[cv.index(bt, i, j)];
                }
                out[desc.out.index(bt, i, j)] = desc.activation.apply_f64(v);
            }
        }
    }
}

/// The input pixel `(iy, ix)` that tap `(ky, kx)` of output pixel `(oy, ox)` reads, or `None`
/// where the tap falls in the padding (which reads zero).
fn tap(desc: &Conv2dDesc, oy: usize, ox: usize, ky: usize, kx: usize) -> Option<(usize, usize)> {
    // Position in the padded input.
    let py = oy * desc.stride_h + ky * desc.dilation_h;
    let px = ox * desc.stride_w + kx * desc.dilation_w;
    let (iy, ix) = (py.checked_sub(desc.pad_top)?, px.checked_sub(desc.pad_left)?);
    (iy < desc.height && ix < desc.width).then_some((iy, ix))
}

/// Depthwise 2-D convolution with bias and activation; see [`Conv2dDesc`].
///
/// # Panics
/// If the descriptor has an empty output or a slice is too short (the caller validates).
pub fn depthwise_conv2d(desc: &Conv2dDesc, input: &[f64], weight: &[f64], bias: Option<&[f64]>, out: &mut [f64]) {
    let oh = desc.out_h().expect("validated conv desc");
    let ow = desc.out_w().expect("validated conv desc");
    for n in 0..desc.batch {
        for oc in 0..desc.out_channels() {
            let ic = oc / desc.multiplier;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = 0.0f64;
                    for ky in 0..desc.kernel_h {
                        for kx in 0..desc.kernel_w {
                            let Some((iy, ix)) = tap(desc, oy, ox, ky, kx) else { continue };
                            let w = weight[(oc * desc.kernel_h + ky) * desc.kernel_w + kx];
                            acc += input[desc.input_index(n, ic, iy, ix)] * w;
                        }
                    }
                    if let Some(bias) = bias {
                        acc += bias[oc];
                    }
                    out[desc.output_index(n, oc, oy, ox)] = desc.activation.apply_f64(acc);
                }
            }
        }
    }
}

/// Dense 2-D convolution (one group) with bias and activation: `desc` is the geometry with
/// `channels` the input channels (its multiplier is not read), `weight` PyTorch's
/// `[out_channels, channels, kh, kw]`, the output `out_channels` channels in `desc`'s layout.
/// Each sum starts at the bias and takes the taps in the weight's order; taps in the padding
/// read zero.
///
/// # Panics
/// If the descriptor has an empty output or a slice is too short (the caller validates).
pub fn dense_conv2d(
    desc: &Conv2dDesc,
    out_channels: usize,
    input: &[f64],
    weight: &[f64],
    bias: Option<&[f64]>,
    out: &mut [f64],
) {
    let oh = desc.out_h().expect("validated conv desc");
    let ow = desc.out_w().expect("validated conv desc");
    let (cin, kh, kw) = (desc.channels, desc.kernel_h, desc.kernel_w);
    // The output's geometry: the input's with `out_channels` channels.
    let o = Conv2dDesc { channels: out_channels, multiplier: 1, ..*desc };
    for n in 0..desc.batch {
        for oc in 0..out_channels {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = bias.map_or(0.0, |b| b[oc]);
                    for ic in 0..cin {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let Some((iy, ix)) = tap(desc, oy, ox, ky, kx) else { continue };
                                let w = weight[((oc * cin + ic) * kh + ky) * kw + kx];
                                acc += input[desc.input_index(n, ic, iy, ix)] * w;
                            }
                        }
                    }
                    out[o.output_index(n, oc, oy, ox)] = desc.activation.apply_f64(acc);
                }
            }
        }
    }
}

/// `out[i] = act(x[i] + bias[i mod bias_len])`; see [`ActivationDesc`].
pub fn activation(desc: &ActivationDesc, x: &[f64], bias: Option<&[f64]>, out: &mut [f64]) {
    for i in 0..desc.len {
        let mut v = x[i];
        if let (Some(len), Some(bias)) = (desc.bias_len, bias) {
            v += bias[i % len];
        }
        out[i] = desc.activation.apply_f64(v);
    }
}

/// `out[r, c] = act(h[r, c]) · h[r, F + c]` (see [`crate::activation::GluDesc`]).
pub fn glu(desc: &crate::activation::GluDesc, h: &[f64], out: &mut [f64]) {
    let f = desc.f;
    for r in 0..desc.rows {
        for c in 0..f {
            out[r * f + c] = desc.activation.apply_f64(h[r * 2 * f + c]) * h[r * 2 * f + f + c];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Activation, Layout, MatrixView};

    #[test]
    fn matmul_two_by_two() {
        let mut d = MatmulDesc::new(2, 2, 2);
        d.bias_offset = Some(0);
        d.c = Some(MatrixView::dense(2, 2));
        d.beta = 2.0;
        let (a, b) = ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]);
        let mut out = [0.0; 4];
        matmul(&d, &a, &b, Some(&[1.0, -1.0]), Some(&[1.0; 4]), &mut out);
        assert_eq!(out, [19.0 + 3.0, 22.0 + 1.0, 43.0 + 3.0, 50.0 + 1.0]);
    }

    #[test]
    fn transposed_operands_read_the_same_matrix() {
        let mut d = MatmulDesc::new(2, 1, 3);
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // 2×3
        let b = [1.0, 1.0, 1.0];
        let mut plain = [0.0; 2];
        matmul(&d, &a, &b, None, None, &mut plain);
        d.trans_a = true;
        d.a = MatrixView::dense(3, 2);
        let at = [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]; // the same matrix stored 3×2
        let mut t = [0.0; 2];
        matmul(&d, &at, &b, None, None, &mut t);
        assert_eq!(plain, [6.0, 15.0]);
        assert_eq!(plain, t);
    }

    #[test]
    fn depthwise_identity_filter_with_multiplier() {
        let d = Conv2dDesc {
            batch: 1,
            channels: 1,
            height: 2,
            width: 2,
            multiplier: 2,
            kernel_h: 1,
            kernel_w: 1,
            stride_h: 1,
            stride_w: 1,
            pad_top: 0,
            pad_bottom: 0,
            pad_left: 0,
            pad_right: 0,
            dilation_h: 1,
            dilation_w: 1,
            layout: Layout::Nchw,
            has_bias: true,
            activation: Activation::Relu,
        };
        let mut out = [0.0; 8];
        depthwise_conv2d(&d, &[1.0, -2.0, 3.0, 4.0], &[1.0, 2.0], Some(&[0.0, 1.0]), &mut out);
        assert_eq!(out, [1.0, 0.0, 3.0, 4.0, 3.0, 0.0, 7.0, 9.0]);
    }
}
