//! The runtime-free half of tilekit: what each kernel is, not how it is launched.
//!
//! This crate holds
//! - the element types ([`DType`]) and the fused activations ([`Activation`]), with the scalar
//!   formulas every backend implements;
//! - the operation descriptors ([`MatmulDesc`], [`Conv2dDesc`], [`ActivationDesc`],
//!   [`InvertedResidualDesc`] in [`block`] with its f64 reference): plain data that says which
//!   elements an op reads and writes;
//! - the kernel catalogue ([`catalogue`]): the WGSL sources and the CUDA sources with their
//!   PTX, embedded from `shaders/`, their entry points, launch shapes and `#[repr(C)]`
//!   parameter blocks;
//! - the CPU reference implementations ([`reference`]): naive loops with `f64` accumulation,
//!   the oracle the tests and the bench compare every backend with;
//! - llama.cpp's quantized block formats ([`quant`]: layouts, dequantization, the reference
//!   quantizers) and a memory-mapped GGUF reader ([`gguf`]).
//! - the tolerance model ([`tolerance`]): how far a correct kernel may be from the reference,
//!   the one rule every comparison uses.
//!
//! It depends on no GPU runtime, so an engine that owns its own device can take the kernel
//! sources and parameter layouts from here and launch them itself.

/// Chainable setters `field(value) -> Self`, one per listed field, for tilekit's
/// `#[non_exhaustive]` descriptor and option structs: callers outside the defining crate
/// build them from a constructor (`MatmulDesc::new(m, n, k).trans_b(true)`) or by assigning the
/// fields of a value, since struct literals are not allowed there. Each setter takes the
/// field's own type. (Used by `tilekit` for its option structs too.)
#[doc(hidden)]
#[macro_export]
macro_rules! field_setters {
    ($name:ident $(<$lt:lifetime>)? { $($field:ident: $ty:ty),* $(,)? }) => {
        impl$(<$lt>)? $name$(<$lt>)? {
            $(
                #[doc = concat!("Sets [`Self::", stringify!($field), "`].")]
                #[must_use]
                pub fn $field(mut self, $field: $ty) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}

pub mod activation;
pub mod block;
pub mod catalogue;
pub mod desc;
pub mod dtype;
pub mod gguf;
pub mod quant;
pub mod reference;
pub mod tolerance;

pub use activation::{Activation, GluDesc};
pub use block::{BlockLens, InvertedResidualDesc};
pub use desc::{ActivationDesc, Conv2dDesc, Layout, MatmulDesc, MatrixView, Precision};
pub use dtype::DType;
