//! The CUDA fused inverted-residual kernel (`shaders/cuda/inverted_residual.cu`, module
//! [`Module::InvertedResidual`]): expand 1×1 + ReLU6, depthwise 3×3 + ReLU6, projection 1×1 and
//! residual in one launch, the expanded tensor kept in shared memory.

use super::{Kernel, Module, k};
use crate::DType;

/// Output pixels per block along x.
pub const BLOCK_TILE_W: usize = 8;
/// Output pixels per block along y.
pub const BLOCK_TILE_H: usize = 8;
/// Output channels per block (`gridDim.y` = `ceil(C' / 64)`).
pub const BLOCK_OUT_CHANNELS: usize = 64;

/// `BlockParams::flags` bits (`BK_*` in `inverted_residual.cu`).
pub mod block_flags {
    /// The expand 1×1 convolution is present.
    pub const EXPAND: u32 = 1;
    /// It has a bias.
    pub const EXPAND_BIAS: u32 = 2;
    /// The depthwise convolution has a bias.
    pub const DW_BIAS: u32 = 4;
    /// The projection has a bias.
    pub const PROJECT_BIAS: u32 = 8;
    /// The input is added to the projection.
    pub const RESIDUAL: u32 = 16;
    /// Input and output are NHWC.
    pub const NHWC: u32 = 32;
    /// `C` is a multiple of the 16-byte vector: expand weight rows are read 16 bytes at a time.
    pub const WE_VEC: u32 = 64;
    /// `hidden` is a multiple of the vector: projection weight rows are read 16 bytes at a time.
    pub const WP_VEC: u32 = 128;
    /// NHWC with `C` a multiple of the vector: a pixel's channels are read 16 bytes at a time.
    pub const X_VEC: u32 = 256;
}

/// The parameter block (`BlockParams` in `inverted_residual.cu`). Pointers are device addresses
/// of whole tensors (0 when absent); `n0` is the launch's first image.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[allow(missing_docs)]
pub struct BlockParams {
    pub x: u64,
    pub we: u64,
    pub be: u64,
    pub wd: u64,
    pub bd: u64,
    pub wp: u64,
    pub bp: u64,
    pub out: u64,
    pub n0: i32,
    pub channels: i32,
    pub height: i32,
    pub width: i32,
    pub hidden: i32,
    pub out_c: i32,
    pub stride: i32,
    pub out_h: i32,
    pub out_w: i32,
    pub tiles_w: i32,
    pub flags: u32,
    pub pad0: u32,
}

/// The fused block kernel for a storage dtype.
pub fn inverted_residual_kernel(dtype: DType) -> Kernel {
    match dtype {
        DType::F32 => k(Module::InvertedResidual, "inverted_residual_f32"),
        DType::F16 => k(Module::InvertedResidual, "inverted_residual_f16"),
        DType::Bf16 => k(Module::InvertedResidual, "inverted_residual_bf16"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::ptx_param_size;
    use super::*;

    #[test]
    fn block_entries_take_the_block_parameters() {
        assert_eq!(size_of::<BlockParams>(), 112);
        for dt in DType::ALL {
            let kern = inverted_residual_kernel(dt);
            assert_eq!(ptx_param_size(kern), Some(size_of::<BlockParams>()), "{}", kern.entry);
        }
    }
}
