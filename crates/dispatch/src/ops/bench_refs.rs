//! Reference kernels for the bench: a copy (the bandwidth roof, also a real op) and, behind the
//! non-default `bench-refs` feature, a naive matmul that only `cargo xtask bench` (and the
//! CUDA device bundle) time; it is not part of the op set and not in what users build.

use super::{check_alias, check_device, check_dtype, storage};
use crate::backend::{BackendOps, with_backend};
use crate::{Device, Error, Result, Tensor};
#[cfg(feature = "bench-refs")]
use tilekit_kernels::MatmulDesc;

impl Device {
    /// Copies all of `src` into `dst` (same dtype and length, separate buffers) with the
    /// backend's own copy kernel. The bench uses it as the memory-bandwidth roof.
    pub fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        const OP: &str = "copy";
        check_device(OP, self, "src", src)?;
        check_device(OP, self, "dst", dst)?;
        check_dtype(OP, src.dtype(), "dst", dst)?;
        check_alias(OP, dst, "src", src)?;
        if src.len() != dst.len() {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "dst",
                expected: src.shape().to_vec(),
                actual: dst.shape().to_vec(),
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        self.profiled(
            || crate::profile::OpInfo::copy(src.len(), src.dtype()),
            || with_backend!(self, be => copy(be, src, dst)),
        )
    }

    /// (Feature `bench-refs`.) A deliberately naive dense `[M, K] · [K, N]` matmul (no tiling, no epilogue), or
    /// `Ok(None)` on backends without one. A reference point for the bench, not an op.
    #[cfg(feature = "bench-refs")]
    pub fn naive_matmul(&self, a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
        const OP: &str = "naive_matmul";
        check_device(OP, self, "a", a)?;
        check_device(OP, self, "b", b)?;
        check_dtype(OP, a.dtype(), "b", b)?;
        let (&[m, k], &[kb, n]) = (a.shape(), b.shape()) else {
            return Err(Error::WrongRank {
                op: OP,
                tensor: "a or b",
                expected: "2",
                actual: a.shape().len().max(b.shape().len()),
            });
        };
        if k != kb {
            return Err(Error::ShapeMismatch { op: OP, tensor: "b", expected: vec![k, n], actual: b.shape().to_vec() });
        }
        let desc = MatmulDesc::new(m, n, k);
        let out = self.zeros(&[m, n], a.dtype())?;
        let mut ran = false;
        self.profiled(
            || crate::profile::OpInfo::matmul(OP, &desc, a.dtype()),
            || {
                ran = with_backend!(self, be => naive(be, &desc, a, b, &out))?;
                Ok(())
            },
        )?;
        Ok(ran.then_some(out))
    }

    /// (Feature `bench-refs`.) Makes every depthwise convolution on wgpu devices in this process
    /// run the general kernel the tiled one replaced (`on`), or the usual choice again; returns
    /// whether this device has such a previous kernel (wgpu only). A reference point for the
    /// bench, not an option.
    #[cfg(feature = "bench-refs")]
    pub fn set_previous_depthwise(&self, on: bool) -> bool {
        #[cfg(feature = "wgpu")]
        if self.wgpu_backend().is_some() {
            crate::backend::wgpu::depthwise::GENERAL_ONLY.store(on, std::sync::atomic::Ordering::Relaxed);
            return true;
        }
        let _ = on;
        false
    }

    /// (Feature `bench-refs`.) `a · b` (`b` stored `[K, N]`) or `a · bᵀ` (`b` stored `[N, K]`,
    /// `trans_b`) with the skinny-M kernel the backend used before its GEMV kernel (wgpu: the
    /// small-M kernel for M <= 4, the 16-row tiles for M <= 16; CUDA, `b` stored `[K, N]`
    /// with 5 to 32 rows: the register-tile GEMV and the SIMT skinny kernel), or `Ok(None)`
    /// where the backend has none. A reference point for the bench, not an op.
    #[cfg(feature = "bench-refs")]
    pub fn previous_skinny_matmul(&self, a: &Tensor, b: &Tensor, trans_b: bool) -> Result<Option<Tensor>> {
        const OP: &str = "previous_skinny_matmul";
        check_device(OP, self, "a", a)?;
        check_device(OP, self, "b", b)?;
        check_dtype(OP, a.dtype(), "b", b)?;
        let (&[m, k], &[r, c]) = (a.shape(), b.shape()) else {
            return Err(Error::WrongRank {
                op: OP,
                tensor: "a or b",
                expected: "2",
                actual: a.shape().len().max(b.shape().len()),
            });
        };
        let (kb, n) = if trans_b { (c, r) } else { (r, c) };
        if k != kb {
            let expected = if trans_b { vec![n, k] } else { vec![k, n] };
            return Err(Error::ShapeMismatch { op: OP, tensor: "b", expected, actual: b.shape().to_vec() });
        }
        let mut desc = MatmulDesc::new(m, n, k);
        desc.trans_b = trans_b;
        desc.b = tilekit_kernels::MatrixView::dense(r, c);
        let out = self.zeros(&[m, n], a.dtype())?;
        let mut ran = false;
        self.profiled(
            || crate::profile::OpInfo::matmul(OP, &desc, a.dtype()),
            || {
                ran = with_backend!(self, be => previous_skinny(be, &desc, a, b, &out))?;
                Ok(())
            },
        )?;
        Ok(ran.then_some(out))
    }
}

fn copy<B: BackendOps>(be: &B, src: &Tensor, dst: &Tensor) -> Result<()> {
    be.copy(src.dtype(), storage::<B>("copy", "src", src)?, storage::<B>("copy", "dst", dst)?, src.len())
}

#[cfg(feature = "bench-refs")]
fn previous_skinny<B: BackendOps>(be: &B, desc: &MatmulDesc, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<bool> {
    const OP: &str = "previous_skinny_matmul";
    be.previous_skinny_matmul(
        desc,
        a.dtype(),
        storage::<B>(OP, "a", a)?,
        storage::<B>(OP, "b", b)?,
        storage::<B>(OP, "out", out)?,
    )
}

#[cfg(feature = "bench-refs")]
fn naive<B: BackendOps>(be: &B, desc: &MatmulDesc, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<bool> {
    const OP: &str = "naive_matmul";
    be.naive_matmul(
        desc,
        a.dtype(),
        storage::<B>(OP, "a", a)?,
        storage::<B>(OP, "b", b)?,
        storage::<B>(OP, "out", out)?,
    )
}
