//! tilekit: GPU compute kernels for ML inference.
//!
//! One [`Device`] per backend — CUDA, wgpu (Vulkan, Metal, DX12, GL) or the native CPU —
//! chosen at run time by [`Device::auto`], and three fused ops on [`Tensor`]s stored in f32,
//! f16 or bf16 with f32 accumulation:
//!
//! - [`Device::matmul`]: `act(alpha · op(A) · op(B) + bias + beta · C)`, batched, with
//!   transposes; [`Device::matmul_into`] for strided views inside larger buffers.
//! - [`Device::depthwise_conv2d`]: stride, padding, dilation, channel multiplier, NCHW/NHWC,
//!   fused bias and activation.
//! - [`Device::activation`]: `act(x + bias)`, in place or not.
//! - [`Device::matmul_quant`]: the matmul with `B` a quantized weight [`QTensor`] `[N, K]`
//!   (GGUF's Q8_0, Q4_0, Q4_1, Q4_K, Q6_K blocks, dequantized inside the kernel).
//!
//! Built on those kernels, the layers a convolutional network needs besides them:
//! [`Device::pointwise_conv2d`] (1×1 conv with bias, residual and activation, NCHW/NHWC),
//! [`Device::global_avg_pool`] (mean over H×W) and [`Device::im2col`] (patches as channels,
//! for a dense conv as im2col + pointwise).
//!
//! ```
//! use tilekit::{Activation, DType, Device, MatmulOptions};
//!
//! let dev = Device::cpu();
//! let a = dev.tensor_from_f32(&[2, 3], DType::F32, &[1., 2., 3., 4., 5., 6.])?;
//! let b = dev.tensor_from_f32(&[3, 1], DType::F32, &[1., 0., -1.])?;
//! let y = dev.matmul(&a, &b, &MatmulOptions::default().activation(Activation::Relu))?;
//! assert_eq!(y.to_f32_vec()?, vec![0.0, 0.0]);
//! # Ok::<(), tilekit::Error>(())
//! ```
//!
//! Every call validates its arguments first and returns a typed [`Error`]; nothing a caller
//! passes makes tilekit panic.
//!
//! Two tools around the ops:
//! - [`profile`]: [`Device::profile_begin`] / [`Device::profile_end`] (or [`Device::profile`])
//!   record each kernel launch (name and tile config, launch shape, bytes, FLOPs, device time
//!   from GPU timestamps on wgpu) and [`Profile::to_chrome_trace`] exports them for Perfetto.
//! - [`tune`]: the wgpu matmul and depthwise convolution pick their tile configuration per
//!   device and shape class from a persistent cache (`TILEKIT_TUNE=off|cached|on`,
//!   `TILEKIT_TUNE_CACHE`), built by `cargo xtask tune` or [`Device::tune_matmul`].

mod backend;
mod device;
mod error;
mod ops;
pub mod profile;
mod quant_tensor;
#[cfg(feature = "wgpu")]
mod record;
mod tensor;
mod tensor_import;
pub mod tune;

pub use device::{BackendKind, Device, ProbeEntry, ProbeReport, WgpuOptions};
pub use error::{Error, Result, SharedGgufError};
pub use ops::{
    BlockOptions, BlockWeights, Conv2dOptions, Im2colOptions, MatmulOptions, PackedBlock, PackedDepthwise,
    PackedMatmul, PointwiseOptions,
};
pub use profile::{KernelRecord, Profile, Timing};
pub use quant_tensor::QTensor;
pub use tensor::{Element, Tensor};
pub use tilekit_kernels::{
    Activation, ActivationDesc, Conv2dDesc, DType, GluDesc, InvertedResidualDesc, Layout, MatmulDesc, MatrixView,
    Precision,
};
pub use tune::{TuneMode, TuneReport};
/// The wgpu tilekit is built against. An engine's `wgpu` must be this exact major version
/// (wgpu's types do not cross versions); depending on `tilekit::wgpu` guarantees it.
#[cfg(feature = "wgpu")]
pub use wgpu;

/// The kernel catalogue, descriptors and activation formulas of `tilekit-kernels`, re-exported
/// for engines. Its CPU reference (`tilekit_kernels::reference`) is deliberately not here: it
/// asserts its arguments and panics on a bad descriptor, which the promise above rules out for
/// what `tilekit` exports; tests and benches depend on `tilekit-kernels` for it.
pub mod kernels {
    pub use tilekit_kernels::{
        Activation, ActivationDesc, Conv2dDesc, DType, GluDesc, Layout, MatmulDesc, MatrixView, Precision, activation,
        catalogue, desc, dtype, tolerance,
    };
}
/// The cudarc this build of tilekit links (driver API, dynamic loading): an engine that hands
/// tilekit its context, stream and slices ([`Device::from_cuda`]) must use these very types.
#[cfg(feature = "cuda")]
pub use cudarc;
/// GGUF quantized block formats (host dequantize / quantize) and the GGUF file reader.
pub use tilekit_kernels::{gguf, quant};
