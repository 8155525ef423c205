//! Whole networks on tilekit. Today: MobileNetV2 (torchvision's `mobilenet_v2`), loaded from a
//! safetensors file with torchvision's state_dict names, BatchNorm folded at load, run on any
//! tilekit [`Device`](tilekit::Device) in f32/f16/bf16 and NCHW or NHWC with no host round trip
//! between layers.
//!
//! - [`arch`]: the architecture table and the state_dict names and shapes.
//! - [`weights`]: [`Weights::load`] (memory-mapped safetensors, BN folding).
//! - [`mobilenet`]: [`MobileNetV2`] on a device, its [`block`] and forward pass.
//! - [`reference`](mod@reference): the f64 forward pass composed of `tilekit_kernels::reference` ops (the oracle).
//! - [`synthetic`]: random torchvision-named weight files, for tests and benches (no download).
//! - [`npy`]: the `.npy` input and output of the `mobilenet_v2` example.

pub mod arch;
pub mod mobilenet;
pub mod npy;
pub mod reference;
pub mod synthetic;
pub mod weights;

pub use mobilenet::{MobileNetV2, block, fused_block};
pub use weights::{FoldedConv, Weights};

/// What can go wrong loading or running a model. Every message is one line and names the
/// tensor and the shape expected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The file could not be opened or mapped.
    #[error("cannot read {path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// The OS's reason.
        reason: String,
    },
    /// The bytes are not a safetensors file.
    #[error("not a safetensors file: {0}")]
    NotSafetensors(String),
    /// A tensor the network needs is not in the file.
    #[error("missing tensor {name} (expected shape {expected:?})")]
    Missing {
        /// The state_dict name.
        name: String,
        /// Its shape.
        expected: Vec<usize>,
    },
    /// A tensor has the wrong shape.
    #[error("tensor {name} has shape {actual:?}, expected {expected:?}")]
    Shape {
        /// The state_dict name.
        name: String,
        /// The shape the network needs.
        expected: Vec<usize>,
        /// The shape in the file.
        actual: Vec<usize>,
    },
    /// A tensor is not a float tensor.
    #[error("tensor {name} (shape {expected:?}) has dtype {dtype}, expected a float dtype (F32, F16, BF16, F64)")]
    DType {
        /// The state_dict name.
        name: String,
        /// Its shape.
        expected: Vec<usize>,
        /// The dtype in the file.
        dtype: String,
    },
    /// The input is not what the network takes.
    #[error("input: {0}")]
    Input(String),
    /// A tilekit op failed.
    #[error("{0}")]
    Op(#[from] tilekit::Error),
}
