//! `matmul`: `out = act(alpha · op(A) · op(B) + bias + beta · C)`.

use super::{check_alias, check_device, check_dtype, check_finite, check_fits, check_precision, storage};
use crate::backend::{BackendOps, with_backend};
use crate::{Device, Error, Result, Tensor};
use tilekit_kernels::{Activation, MatmulDesc, MatrixView, Precision};

const OP: &str = "matmul";

/// The options of [`Device::matmul`]. `Default` is a plain product: no transposes, `alpha`
/// and `beta` 1, no bias, no residual, no activation, full f32 precision.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct MatmulOptions<'a> {
    /// `A` is stored transposed (`[K, M]` or `[batch, K, M]`).
    pub trans_a: bool,
    /// `B` is stored transposed (`[N, K]` or `[batch, N, K]`).
    pub trans_b: bool,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of the residual `C`.
    pub beta: f32,
    /// A bias of `N` elements added to every row.
    pub bias: Option<&'a Tensor>,
    /// A residual `[M, N]` or `[batch, M, N]` (`[1, M, N]` and `[M, N]` broadcast).
    pub c: Option<&'a Tensor>,
    /// Activation applied last.
    pub activation: Activation,
    /// Multiplication precision. [`Precision::F16`] takes f16 tensors only (others are an
    /// `Error::InvalidParameter`).
    pub precision: Precision,
}

impl Default for MatmulOptions<'_> {
    fn default() -> Self {
        MatmulOptions {
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 1.0,
            bias: None,
            c: None,
            activation: Activation::None,
            precision: Precision::Highest,
        }
    }
}

/// `(batch, rows, cols)` of a rank-2 or rank-3 operand.
pub(super) fn dims(name: &'static str, t: &Tensor) -> Result<(Option<usize>, usize, usize)> {
    match *t.shape() {
        [r, c] => Ok((None, r, c)),
        [b, r, c] => Ok((Some(b), r, c)),
        _ => Err(Error::WrongRank { op: OP, tensor: name, expected: "2 or 3", actual: t.shape().len() }),
    }
}

/// The epilogue operands of an `m × n` product over `batch` batches: checks `C` is `[m, n]` or
/// `[batch | 1, m, n]` and `bias` is `[n]` (`batched`: the op's output has a batch dimension),
/// and returns `C`'s view.
pub(super) fn epilogue_view(
    op: &'static str,
    opts: &MatmulOptions<'_>,
    batched: bool,
    batch: usize,
    m: usize,
    n: usize,
) -> Result<Option<MatrixView>> {
    let c_view = match opts.c {
        None => None,
        Some(c) => Some(match *c.shape() {
            [r, cc] if r == m && cc == n => dense_view(None, m, n),
            [bc, r, cc] if r == m && cc == n && (bc == batch || bc == 1) => dense_view(Some(bc), m, n),
            _ => {
                let expected = if batched { vec![batch, m, n] } else { vec![m, n] };
                return Err(Error::ShapeMismatch { op, tensor: "c", expected, actual: c.shape().to_vec() });
            }
        }),
    };
    if let Some(bias) = opts.bias
        && bias.shape() != [n]
    {
        return Err(Error::ShapeMismatch { op, tensor: "bias", expected: vec![n], actual: bias.shape().to_vec() });
    }
    Ok(c_view)
}

/// The view of a dense operand: batch stride 0 broadcasts a rank-2 or batch-1 operand.
pub(super) fn dense_view(batch: Option<usize>, rows: usize, cols: usize) -> MatrixView {
    let bs = match batch {
        Some(b) if b > 1 => rows * cols,
        _ => 0,
    };
    MatrixView::new(0, cols, bs)
}

impl Device {
    /// `act(alpha · op(A) · op(B) + bias + beta · C)` on dense tensors.
    ///
    /// `A` is `[M, K]` or `[batch, M, K]` (`[K, M]`/`[batch, K, M]` with `trans_a`), `B` is
    /// `[K, N]` or `[batch, K, N]` (`[N, K]`/`[batch, N, K]` with `trans_b`). A rank-2 or
    /// batch-1 operand is broadcast over the other's batch. The result is `[batch, M, N]` if
    /// either operand has a batch dimension, else `[M, N]`, in the inputs' dtype.
    pub fn matmul(&self, a: &Tensor, b: &Tensor, opts: &MatmulOptions<'_>) -> Result<Tensor> {
        let (ab, ar, ac) = dims("a", a)?;
        let (bb, br, bc) = dims("b", b)?;
        let (m, k) = if opts.trans_a { (ac, ar) } else { (ar, ac) };
        let (kb, n) = if opts.trans_b { (bc, br) } else { (br, bc) };
        if kb != k {
            let expected = if opts.trans_b { vec![n, k] } else { vec![k, n] };
            let expected = match bb {
                Some(x) => [vec![x], expected].concat(),
                None => expected,
            };
            return Err(Error::ShapeMismatch { op: OP, tensor: "b", expected, actual: b.shape().to_vec() });
        }
        let batch = match (ab, bb) {
            (Some(x), Some(y)) if x != y && x != 1 && y != 1 => {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    tensor: "b",
                    expected: vec![x, br, bc],
                    actual: b.shape().to_vec(),
                });
            }
            (Some(x), Some(y)) => x.max(y),
            (Some(x), None) | (None, Some(x)) => x,
            (None, None) => 1,
        };
        let batched = ab.is_some() || bb.is_some();
        let c_view = epilogue_view(OP, opts, batched, batch, m, n)?;
        let desc = MatmulDesc::new(m, n, k)
            .batch(batch)
            .trans_a(opts.trans_a)
            .trans_b(opts.trans_b)
            .a(dense_view(ab, ar, ac))
            .b(dense_view(bb, br, bc))
            .c(c_view)
            .bias_offset(opts.bias.map(|_| 0))
            .out(MatrixView::dense(m, n))
            .alpha(opts.alpha)
            .beta(opts.beta)
            .activation(opts.activation)
            .precision(opts.precision);
        let out_shape = if batched { vec![batch, m, n] } else { vec![m, n] };
        // Validate before allocating, so a bad call costs nothing on the device.
        self.validate_matmul(&desc, a, b, opts.bias, opts.c, None)?;
        let out = self.output_tensor(&out_shape, a.dtype())?;
        self.matmul_into(&desc, a, b, opts.bias, opts.c, &out)?;
        Ok(out)
    }

    /// The strided entry point: runs `desc` over views inside the tensors' buffers (shapes
    /// are ignored; offsets, leading dimensions and batch strides come from `desc`). Writes
    /// only the elements of `desc.out` in `out`. All tensors share one dtype, and `out` may
    /// not share a buffer with an input.
    pub fn matmul_into(
        &self,
        desc: &MatmulDesc,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        c: Option<&Tensor>,
        out: &Tensor,
    ) -> Result<()> {
        self.validate_matmul(desc, a, b, bias, c, Some(out))?;
        if desc.batch == 0 || desc.m == 0 || desc.n == 0 {
            return Ok(()); // An empty result: nothing to launch.
        }
        // Fields no element index reads (the views of an empty A and B when K = 0, a
        // one-row view's ld) pass validation whatever their value; the backends get them
        // plain, so none trips over one in its own index type.
        let desc = &desc.canonical();
        self.profiled(
            || crate::profile::OpInfo::matmul(OP, desc, a.dtype()),
            || with_backend!(self, be => run(be, desc, a, b, bias, c, out)),
        )
    }

    pub(crate) fn validate_matmul(
        &self,
        desc: &MatmulDesc,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        c: Option<&Tensor>,
        out: Option<&Tensor>,
    ) -> Result<()> {
        let dtype = a.dtype();
        let named = [("a", Some(a)), ("b", Some(b)), ("bias", bias), ("c", c), ("out", out)];
        for (name, t) in named {
            if let Some(t) = t {
                check_device(OP, self, name, t)?;
                check_dtype(OP, dtype, name, t)?;
            }
        }
        if let Some(out) = out {
            for (name, t) in named.iter().take(4) {
                if let Some(t) = t {
                    check_alias(OP, out, name, t)?;
                }
            }
        }
        check_finite(OP, "alpha", desc.alpha)?;
        check_finite(OP, "beta", desc.beta)?;
        check_precision(OP, desc.precision, dtype)?;
        if desc.bias_offset.is_some() != bias.is_some() {
            return Err(Error::InvalidParameter {
                op: OP,
                param: "bias",
                reason: "desc.bias_offset and the bias tensor must be given together".into(),
            });
        }
        if desc.c.is_some() != c.is_some() {
            return Err(Error::InvalidParameter {
                op: OP,
                param: "c",
                reason: "desc.c and the c tensor must be given together".into(),
            });
        }
        self.check_dtype(dtype)?;
        let (batch, m, n) = (desc.batch, desc.m, desc.n);
        if batch == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        let (ar, ac) = desc.a_stored();
        let (br, bc) = desc.b_stored();
        let mut views = vec![("a", desc.a, ar, ac, a), ("b", desc.b, br, bc, b)];
        if let (Some(v), Some(c)) = (desc.c, c) {
            views.push(("c", v, m, n, c));
        }
        if let Some(out) = out {
            views.push(("out", desc.out, m, n, out));
        }
        for (name, v, rows, cols, t) in views {
            if rows > 1 && cols > 0 && v.ld < cols {
                return Err(Error::InvalidParameter {
                    op: OP,
                    param: "leading dimension",
                    reason: format!("{name}'s ld {} is below its {cols} columns", v.ld),
                });
            }
            check_fits(OP, name, v.required_len(batch, rows, cols), t)?;
        }
        // Output batches must not overlap: two workgroups would race on the same element.
        if batch > 1 && desc.out.batch_stride < m.saturating_sub(1) * desc.out.ld + n {
            return Err(Error::InvalidParameter {
                op: OP,
                param: "out batch stride",
                reason: format!("{} overlaps consecutive {m}x{n} outputs", desc.out.batch_stride),
            });
        }
        if let (Some(off), Some(bias)) = (desc.bias_offset, bias) {
            check_fits(OP, "bias", off.checked_add(n), bias)?;
        }
        Ok(())
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
    be.matmul(
        desc,
        a.dtype(),
        storage::<B>(OP, "a", a)?,
        storage::<B>(OP, "b", b)?,
        bias.map(|t| storage::<B>(OP, "bias", t)).transpose()?,
        c.map(|t| storage::<B>(OP, "c", t)).transpose()?,
        storage::<B>(OP, "out", out)?,
    )
}

option_setters!(MatmulOptions<'a> {
    trans_a: bool,
    trans_b: bool,
    alpha: f32,
    beta: f32,
    bias: Option<&'a Tensor>,
    c: Option<&'a Tensor>,
    activation: Activation,
    precision: Precision,
});
