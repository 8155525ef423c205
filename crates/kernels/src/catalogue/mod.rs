//! The kernel catalogue: the one place that knows which source, entry point, launch shape and
//! parameter block belongs to each op and dtype.
//!
//! - [`wgsl`]: WGSL sources from `shaders/wgsl/`, their entry points, `override` tile constants
//!   and `#[repr(C)]` parameter blocks.
//! - [`cuda`]: CUDA sources from `shaders/cuda/` and the PTX compiled from them.

pub mod cuda;
pub mod wgsl;
