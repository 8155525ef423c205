//! cuBLAS through cudarc, on its own stream of the device's primary context: the baseline the
//! CUDA matmul figures are timed against.

use anyhow::{Context, Result, bail};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys};
use cudarc::driver::{CudaContext, CudaStream};
use half::{bf16, f16};
use std::sync::Arc;
use std::time::Instant;
use tilekit::DType;

/// Which of the two handles a call goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `CUBLAS_DEFAULT_MATH`: cuBLAS picks its fastest algorithms (tensor cores where the
    /// precision allows; no TF32 for f32, which needs an explicit opt-in). The timed baseline.
    Default,
    /// `CUBLAS_PEDANTIC_MATH`: the requested precision everywhere (f32 accumulation, also in
    /// split-K reductions), for the agreement check.
    Pedantic,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Default => "CUBLAS_DEFAULT_MATH",
            Mode::Pedantic => "CUBLAS_PEDANTIC_MATH",
        }
    }
}

pub struct Blas {
    stream: Arc<CudaStream>,
    /// In `CUBLAS_DEFAULT_MATH`: what the figures are timed against.
    default: CudaBlas,
    /// In `CUBLAS_PEDANTIC_MATH`.
    pedantic: CudaBlas,
}

impl Blas {
    pub fn new() -> Result<Blas> {
        // SAFETY: only tries to open the library.
        if !unsafe { sys::is_culib_present() } {
            bail!("libcublas could not be loaded (add its folder to LD_LIBRARY_PATH)");
        }
        let ctx = CudaContext::new(0).context("CUDA context")?;
        let stream = ctx.new_stream().context("CUDA stream")?;
        let handle = |mode: sys::cublasMath_t| -> Result<CudaBlas> {
            let blas = CudaBlas::new(stream.clone()).context("cublasCreate")?;
            // SAFETY: the handle is live; the call only sets a mode on it.
            unsafe { sys::cublasSetMathMode(*blas.handle(), mode) }.result().context("cublasSetMathMode")?;
            Ok(blas)
        };
        let default = handle(sys::cublasMath_t::CUBLAS_DEFAULT_MATH)?;
        let pedantic = handle(sys::cublasMath_t::CUBLAS_PEDANTIC_MATH)?;
        Ok(Blas { stream, default, pedantic })
    }

    /// The math mode of the timed calls.
    pub fn math_mode(&self) -> &'static str {
        Mode::Default.name()
    }

    /// Row-major `[m, k] · [k, n]` through the default-mode handle, as `Cᵀ = Bᵀ·Aᵀ` in cuBLAS's
    /// column-major terms, timed. Returns the result and the seconds per call.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        m: usize,
        n: usize,
        k: usize,
        dtype: DType,
        a: &[f32],
        b: &[f32],
        reps: usize,
    ) -> Result<(Vec<f32>, f64)> {
        self.dispatch(Mode::Default, m, n, k, dtype, a, b, reps.max(1))
    }

    /// One untimed call through the pedantic handle.
    pub fn gemm_pedantic(&self, m: usize, n: usize, k: usize, dtype: DType, a: &[f32], b: &[f32]) -> Result<Vec<f32>> {
        Ok(self.dispatch(Mode::Pedantic, m, n, k, dtype, a, b, 0)?.0)
    }

    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        mode: Mode,
        m: usize,
        n: usize,
        k: usize,
        dtype: DType,
        a: &[f32],
        b: &[f32],
        reps: usize,
    ) -> Result<(Vec<f32>, f64)> {
        match dtype {
            DType::F32 => self.run::<f32>(mode, m, n, k, a, b, reps, |x| x, |x| x),
            DType::F16 => self.run::<f16>(mode, m, n, k, a, b, reps, f16::from_f32, f16::to_f32),
            DType::Bf16 => self.run::<bf16>(mode, m, n, k, a, b, reps, bf16::from_f32, bf16::to_f32),
            other => unimplemented!("{other:?}"),
        }
    }

    /// One call, then (for `reps > 0`) 2 warm-up calls and the median of 3 batches of `reps`.
    #[allow(clippy::too_many_arguments)]
    fn run<T>(
        &self,
        mode: Mode,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        reps: usize,
        from: fn(f32) -> T,
        to: fn(T) -> f32,
    ) -> Result<(Vec<f32>, f64)>
    where
        T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Copy + Default,
        CudaBlas: Gemm<T>,
    {
        let blas = match mode {
            Mode::Default => &self.default,
            Mode::Pedantic => &self.pedantic,
        };
        let ah: Vec<T> = a.iter().map(|&x| from(x)).collect();
        let bh: Vec<T> = b.iter().map(|&x| from(x)).collect();
        let ad = self.stream.clone_htod(&ah)?;
        let bd = self.stream.clone_htod(&bh)?;
        let mut cd = self.stream.alloc_zeros::<T>(m * n)?;
        let cfg = GemmConfig {
            transa: sys::cublasOperation_t::CUBLAS_OP_N,
            transb: sys::cublasOperation_t::CUBLAS_OP_N,
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: from(1.0),
            lda: n as i32,
            ldb: k as i32,
            beta: from(0.0),
            ldc: n as i32,
        };
        let call = |cd: &mut cudarc::driver::CudaSlice<T>| -> Result<()> {
            // SAFETY: the buffers hold n·k, k·m and n·m elements as the config says.
            unsafe { blas.gemm(cfg, &bd, &ad, cd) }.context("cublas gemm")?;
            Ok(())
        };
        call(&mut cd)?;
        self.stream.synchronize()?;
        let mut secs = f64::NAN;
        if reps > 0 {
            for _ in 0..2 {
                call(&mut cd)?;
            }
            self.stream.synchronize()?;
            let mut times = Vec::new();
            for _ in 0..3 {
                let t = Instant::now();
                for _ in 0..reps {
                    call(&mut cd)?;
                }
                self.stream.synchronize()?;
                times.push(t.elapsed().as_secs_f64() / reps as f64);
            }
            times.sort_by(f64::total_cmp);
            secs = times[1];
        }
        let c: Vec<T> = self.stream.clone_dtoh(&cd)?;
        Ok((c.into_iter().map(to).collect(), secs))
    }
}
