//! `matmul_packed`: the matmul with a weight `B` packed once, at load, into the layout the
//! device's kernels stream best ([`PackedMatmul`]).

use super::matmul::{dense_view, dims, epilogue_view};
use super::{check_alias, check_device, check_dtype, check_finite, check_fits, check_precision, storage};
use crate::backend::{BackendOps, with_backend};
use crate::{BackendKind, Device, Error, MatmulOptions, Result, Tensor};
use tilekit_kernels::{DType, MatmulDesc, MatrixView};

const OP: &str = "matmul_packed";
const PACK_OP: &str = "pack_matmul_weights";

/// Columns per strip of the CPU's packed layout (one 16-column register tile).
pub(crate) const STRIP: usize = 16;

/// A matmul weight `B` (`K × N`) packed once for the device's kernels, made by
/// [`Device::pack_matmul_weights`] and used by [`Device::matmul_packed`], the way an engine
/// treats a layer's weights: pack at load, multiply at every step.
///
/// - On the CPU, `B` is stored in strips of 16 columns, each strip its `K` rows of 16 back to
///   back (`[⌈N/16⌉, K, 16]`, the last strip zero-padded). A product streams each strip from
///   memory once, in storage order, straight into the register tiles, with no per-call copy
///   of `B` into panels and no software prefetch (what a weight stored `[K, N]` needs, whose
///   rows of one strip are `N` elements apart). For `M ≤ 16` the result is bit for bit
///   [`Device::matmul`]'s with `B` stored `[K, N]`; for larger `M` it is within the same f32
///   accumulation bound (the sums run in `K` order, one fused multiply-add per step, where
///   `gemm`'s kernels split them).
/// - On the wgpu and CUDA backends the GPU kernels read `B` as stored, so the packed weight is
///   the weight itself (the same buffer, not a copy) with its layout, and
///   [`Device::matmul_packed`] is [`Device::matmul`] with that layout: the same bits.
#[derive(Clone, Debug)]
pub struct PackedMatmul {
    tensor: Tensor,
    k: usize,
    n: usize,
    form: Form,
}

/// How a [`PackedMatmul`] holds `B`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// `[⌈N/16⌉, K, 16]` (the CPU).
    Strips,
    /// As given: `[K, N]`, or `[N, K]` with `trans_b`.
    Stored { trans_b: bool },
}

impl PackedMatmul {
    /// The tensor holding the packed weight: `[⌈N/16⌉, K, 16]` on the CPU, the weight as given
    /// elsewhere.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// `K`, the rows of `B` (the columns of `A`).
    pub fn k(&self) -> usize {
        self.k
    }

    /// `N`, the columns of `B` (and of the product).
    pub fn n(&self) -> usize {
        self.n
    }

    /// The dtype of the weight.
    pub fn dtype(&self) -> DType {
        self.tensor.dtype()
    }

    /// Whether the weight was reordered into strips (the CPU), rather than kept as given.
    pub fn is_strips(&self) -> bool {
        self.form == Form::Strips
    }
}

/// `[K, N]` (or `[N, K]`, `trans_b`) elements of `size` bytes into `[⌈N/16⌉, K, 16]`, the
/// padding columns zero.
fn pack_strips(bytes: &[u8], size: usize, k: usize, n: usize, trans_b: bool) -> Vec<u8> {
    let strips = n.div_ceil(STRIP);
    let mut out = vec![0u8; strips * k * STRIP * size];
    for s in 0..strips {
        for q in 0..k {
            for c in 0..STRIP.min(n - s * STRIP) {
                let j = s * STRIP + c;
                let src = if trans_b { j * k + q } else { q * n + j };
                let dst = (s * k + q) * STRIP + c;
                out[dst * size..][..size].copy_from_slice(&bytes[src * size..][..size]);
            }
        }
    }
    out
}

impl Device {
    /// Packs a matmul weight `B` (`[K, N]`, or `[N, K]` with `trans_b`, as `nn.Linear` and
    /// GGUF store it) into a [`PackedMatmul`] for [`Device::matmul_packed`]. A one-time
    /// transform: on the CPU it reorders the weight into strips (a new tensor of the same
    /// dtype, `⌈N/16⌉·16·K` elements); on the GPU backends it keeps the weight as it is (no
    /// copy). Errors: a weight from another device, not of rank 2 (a batched `B` is not a
    /// weight), or of a dtype the device does not hold.
    pub fn pack_matmul_weights(&self, b: &Tensor, trans_b: bool) -> Result<PackedMatmul> {
        check_device(PACK_OP, self, "b", b)?;
        self.check_dtype(b.dtype())?;
        let [rows, cols] = match *b.shape() {
            [r, c] => [r, c],
            _ => return Err(Error::WrongRank { op: PACK_OP, tensor: "b", expected: "2", actual: b.shape().len() }),
        };
        let (k, n) = if trans_b { (cols, rows) } else { (rows, cols) };
        if self.kind() != BackendKind::Cpu {
            return Ok(PackedMatmul { tensor: b.clone(), k, n, form: Form::Stored { trans_b } });
        }
        let size = b.dtype().size_bytes();
        let len = n
            .div_ceil(STRIP)
            .checked_mul(k)
            .and_then(|x| x.checked_mul(STRIP))
            .ok_or_else(|| Error::Overflow { op: PACK_OP, what: "the packed weight".into() })?;
        let bytes = b.to_bytes()?;
        let need = b.len() * size;
        if bytes.len() < need {
            return Err(Error::Overflow { op: PACK_OP, what: "the weight's buffer".into() });
        }
        let packed = pack_strips(&bytes[..need], size, k, n, trans_b);
        let shape = [n.div_ceil(STRIP), k, STRIP];
        let storage = self.upload_storage(b.dtype(), &packed)?;
        let tensor = self.wrap(b.dtype(), len, storage, &shape);
        Ok(PackedMatmul { tensor, k, n, form: Form::Strips })
    }

    /// [`Device::matmul`] with `B` a weight packed by [`Device::pack_matmul_weights`]:
    /// `act(alpha · op(A) · B + bias + beta · C)`, `A` `[M, K]` or `[batch, M, K]` (transposed
    /// with `trans_a`), `B` shared by every batch; the result is `[batch, M, N]` when `A` has a
    /// batch dimension, else `[M, N]`, in `A`'s dtype. The options are [`Device::matmul`]'s;
    /// the layout of `B` is the packed weight's own, so `trans_b` must be false. The result is
    /// [`Device::matmul`]'s with the weight as it was given: bit for bit on the GPU backends
    /// and on the CPU for `M ≤ 16` from a `[K, N]` weight, within the f32-accumulation bound
    /// otherwise (see [`PackedMatmul`]). Errors as [`Device::matmul`]'s, with `b` the packed
    /// weight (its `K` against `A`'s, its dtype against `A`'s).
    pub fn matmul_packed(&self, a: &Tensor, b: &PackedMatmul, opts: &MatmulOptions<'_>) -> Result<Tensor> {
        let (desc, shape) = self.packed_matmul_desc(a, b, opts)?;
        let out = self.output_tensor(&shape, a.dtype())?;
        self.run_packed(&desc, a, b, opts, &out)?;
        Ok(out)
    }

    /// [`Device::matmul_packed`] into an existing output tensor (of the shape and dtype
    /// `matmul_packed` would return, not sharing a buffer with an input), for engines that
    /// own their buffers: nothing is allocated per call.
    pub fn matmul_packed_into(
        &self,
        a: &Tensor,
        b: &PackedMatmul,
        opts: &MatmulOptions<'_>,
        out: &Tensor,
    ) -> Result<()> {
        let (desc, shape) = self.packed_matmul_desc(a, b, opts)?;
        check_device(OP, self, "out", out)?;
        check_dtype(OP, a.dtype(), "out", out)?;
        if out.shape() != shape {
            return Err(Error::ShapeMismatch { op: OP, tensor: "out", expected: shape, actual: out.shape().to_vec() });
        }
        self.run_packed(&desc, a, b, opts, out)
    }

    /// The descriptor of a packed product (its `B` view the packed tensor's: the weight as
    /// stored, or the strips) and its output shape, after the checks of the shapes and
    /// options.
    fn packed_matmul_desc(
        &self,
        a: &Tensor,
        b: &PackedMatmul,
        opts: &MatmulOptions<'_>,
    ) -> Result<(MatmulDesc, Vec<usize>)> {
        if opts.trans_b {
            return Err(Error::InvalidParameter {
                op: OP,
                param: "trans_b",
                reason: "a packed weight carries its own layout: leave trans_b false".into(),
            });
        }
        let (ab, ar, ac) = dims("a", a)?;
        let (m, k) = if opts.trans_a { (ac, ar) } else { (ar, ac) };
        let n = b.n;
        if b.k != k {
            return Err(Error::ShapeMismatch { op: OP, tensor: "b", expected: vec![k, n], actual: vec![b.k, n] });
        }
        let batch = ab.unwrap_or(1);
        let c_view = epilogue_view(OP, opts, ab.is_some(), batch, m, n)?;
        let (trans_b, b_view) = match b.form {
            Form::Strips => (false, MatrixView::new(0, STRIP, 0)),
            Form::Stored { trans_b } => (trans_b, MatrixView::new(0, if trans_b { k } else { n }, 0)),
        };
        let desc = MatmulDesc::new(m, n, k)
            .batch(batch)
            .trans_a(opts.trans_a)
            .trans_b(trans_b)
            .a(dense_view(ab, ar, ac))
            .b(b_view)
            .c(c_view)
            .bias_offset(opts.bias.map(|_| 0))
            .out(MatrixView::dense(m, n))
            .alpha(opts.alpha)
            .beta(opts.beta)
            .activation(opts.activation)
            .precision(opts.precision);
        let shape = if ab.is_some() { vec![batch, m, n] } else { vec![m, n] };
        Ok((desc, shape))
    }

    /// Runs a checked packed product into `out` (of the right shape, on this device).
    fn run_packed(
        &self,
        desc: &MatmulDesc,
        a: &Tensor,
        b: &PackedMatmul,
        opts: &MatmulOptions<'_>,
        out: &Tensor,
    ) -> Result<()> {
        if let Form::Stored { .. } = b.form {
            // The weight as given: `matmul_into` on the same descriptor `matmul` builds.
            return self.matmul_into(desc, a, &b.tensor, opts.bias, opts.c, out);
        }
        let dtype = a.dtype();
        let named = [("a", Some(a)), ("b", Some(&b.tensor)), ("bias", opts.bias), ("c", opts.c)];
        for (name, t) in named {
            if let Some(t) = t {
                check_device(OP, self, name, t)?;
                check_dtype(OP, dtype, name, t)?;
                check_alias(OP, out, name, t)?;
            }
        }
        check_finite(OP, "alpha", desc.alpha)?;
        check_finite(OP, "beta", desc.beta)?;
        check_precision(OP, desc.precision, dtype)?;
        self.check_dtype(dtype)?;
        let (batch, m, n, k) = (desc.batch, desc.m, desc.n, desc.k);
        let (ar, ac) = desc.a_stored();
        check_fits(OP, "a", desc.a.required_len(batch, ar, ac), a)?;
        check_fits(OP, "b", n.div_ceil(STRIP).checked_mul(k * STRIP), &b.tensor)?;
        if let (Some(v), Some(c)) = (desc.c, opts.c) {
            check_fits(OP, "c", v.required_len(batch, m, n), c)?;
        }
        if batch == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        self.profiled(
            || crate::profile::OpInfo::matmul(OP, desc, dtype),
            || with_backend!(self, be => run(be, desc, a, &b.tensor, opts.bias, opts.c, out)),
        )
    }
}

fn run<B: BackendOps>(
    be: &B,
    desc: &MatmulDesc,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    c: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    be.matmul_strips(
        desc,
        a.dtype(),
        storage::<B>(OP, "a", a)?,
        storage::<B>(OP, "b", b)?,
        bias.map(|t| storage::<B>(OP, "bias", t)).transpose()?,
        c.map(|t| storage::<B>(OP, "c", t)).transpose()?,
        storage::<B>(OP, "out", out)?,
    )
}

#[cfg(test)]
mod tests {
    use super::pack_strips;

    #[test]
    fn strips_hold_each_column_in_k_order_with_zero_padding() {
        // B = [[0, 1, ..., 17], [18, ..., 35]] (K = 2, N = 18): two strips, the second 2 wide.
        let (k, n) = (2, 18);
        let b: Vec<u8> = (0..(k * n) as u8).collect();
        let kn = pack_strips(&b, 1, k, n, false);
        assert_eq!(kn.len(), 2 * k * 16);
        assert_eq!(&kn[..16], &b[..16]);
        assert_eq!(&kn[16..32], &b[18..34]);
        assert_eq!(&kn[32..34], &[16, 17]);
        assert_eq!(&kn[34..48], &[0; 14]);
        assert_eq!(&kn[48..50], &[34, 35]);
        // The same B stored [N, K]: the same strips.
        let nk: Vec<u8> = (0..n).flat_map(|j| (0..k).map(move |q| (q * n + j) as u8)).collect();
        assert_eq!(pack_strips(&nk, 1, k, n, true), kn);
    }
}
