//! CUDA kernels: the PTX compiled from `shaders/cuda/` (by `cargo xtask ptx`), which entry
//! point serves which op and dtype, their launch shapes and `#[repr(C)]` parameter blocks.
//!
//! # The PTX and the driver it needs
//! The PTX is written by NVRTC 12.4 for `compute_80`: PTX ISA 8.4, which the driver
//! JIT-compiles for the GPU at hand. That needs
//! - an NVIDIA driver of the R550 branch or newer ([`MIN_DRIVER`]; the driver API reports
//!   CUDA 12.4, [`MIN_DRIVER_API`]), and
//! - a GPU of compute capability 8.0 or newer (Ampere, Ada, Hopper, Blackwell): the kernels use
//!   `cp.async`, `ldmatrix` and bf16 `mma.sync`.
//!
//! # Entry points
//! Named `<op>_<dtype>[_variant]`:
//! - `matmul_f32` — SIMT, f32 storage and products (`shaders/cuda/matmul_simt.cu`); its
//!   3-stage ring is dynamic shared memory ([`Kernel::dynamic_smem_bytes`], [`simt`]);
//! - `matmul_<storage>_<compute>_<ta><tb>` — tensor cores, `mma.sync.m16n8k16` with f32
//!   accumulation (`matmul_mma.cu`); `<compute>` is `f16` or `bf16`, `<ta><tb>` the transposes;
//!   they take [`splitk::SplitKParams`], and under one wave of blocks K is split across blocks
//!   with `matmul_splitk_reduce_<storage>` applying the epilogue ([`splitk`]); the f32-input
//!   ones' 3-stage ring is dynamic shared memory ([`mma`]);
//! - `gemv_<storage>[_bf16]_<nk|kn>_m{4,16}`, `gemv_<storage>[_bf16]_kn_s{16,32}` and
//!   `gemv_finalize_<storage>` — M ≤ 16 with B stored N × K, M ≤ 32 with B stored K × N
//!   (`gemv.cu`): 16-byte loads (through a `cp.async` ring for 4 < M ≤ 32 with B K × N), K split
//!   across warps and across blocks where that fills the kernel's waves better ([`gemv`]); `_kn_m16` is kept
//!   as the bench's reference for what the ring replaced;
//! - `matmul_skinny_<storage>[_bf16]_m{8,32}` — SIMT, M ≤ 32 with B stored K × N
//!   (`matmul_simt.cu`): a block per 32 columns, K split across warps; what 16 < M ≤ 32 took
//!   before the GEMV ring, kept as the bench's reference;
//! - `qgemv_<fmt>_<storage>_m{4,16}` and `qmatmul_<fmt>_<storage>` — a quantized weight
//!   (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) as B, dequantized in registers (M ≤ 16) or into shared
//!   memory tiles (`qmatmul.cu`, [`quant`]);
//! - `inverted_residual_<dtype>` — the fused MobileNetV2 block, expanded tensor in shared memory
//!   (`inverted_residual.cu`, [`block`]);
//! - `naive_matmul_<dtype>` — the bench's naive reference;
//! - `depthwise_conv2d_<dtype>_<layout>` (`depthwise.cu`);
//! - `activation_<dtype>_<act>`, `glu_<dtype>`, `copy_bytes` (`elementwise.cu`).
//!
//! Every kernel takes one parameter block by value, mirrored in `shaders/cuda/common.cuh`, and
//! runs 256-thread blocks; all but `matmul_f32` and `matmul_f32_bf16_*` use static shared
//! memory only.

use crate::{Activation, DType, Layout, Precision};

pub mod block;
pub mod gemv;
pub mod mma;
pub mod quant;
pub mod simt;
pub mod splitk;

/// PTX ISA version of the shipped PTX (set by the pinned NVRTC, 12.4).
pub const PTX_ISA: &str = "8.4";
/// The oldest NVIDIA driver that loads the shipped PTX.
pub const MIN_DRIVER: &str = "R550 (550.54 on Linux, the CUDA 12.4 driver)";
/// `cuDriverGetVersion` of the oldest driver that loads the shipped PTX (CUDA 12.4).
pub const MIN_DRIVER_API: i32 = 12040;
/// The oldest compute capability the kernels run on.
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);
/// Threads per block of every kernel here.
pub const THREADS: u32 = 256;

/// One PTX file (one CUDA source file), loaded as one driver module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Module {
    /// `matmul_simt.cu`: `matmul_f32` and the naive matmuls.
    MatmulSimt,
    /// `matmul_mma.cu`: the tensor-core matmuls.
    MatmulMma,
    /// `depthwise.cu`.
    Depthwise,
    /// `elementwise.cu`: activation and copy.
    Elementwise,
    /// `gemv.cu`: GEMV / skinny GEMM for M <= 16 (B `[N, K]`) or 32 (B `[K, N]`).
    Gemv,
    /// `qmatmul.cu`: matmuls with a quantized (GGUF block) weight ([`quant`]).
    Qmatmul,
    /// `inverted_residual.cu`: the fused inverted-residual block ([`block`]).
    InvertedResidual,
}

impl Module {
    /// Every module, in a fixed order ([`Module::index`]).
    pub const ALL: [Module; 7] = [
        Module::MatmulSimt,
        Module::MatmulMma,
        Module::Depthwise,
        Module::Elementwise,
        Module::Gemv,
        Module::Qmatmul,
        Module::InvertedResidual,
    ];

    /// The module's position in [`Module::ALL`] (for per-module caches).
    pub const fn index(self) -> usize {
        match self {
            Module::MatmulSimt => 0,
            Module::MatmulMma => 1,
            Module::Depthwise => 2,
            Module::Elementwise => 3,
            Module::Gemv => 4,
            Module::Qmatmul => 5,
            Module::InvertedResidual => 6,
        }
    }

    /// The source file's stem.
    pub const fn name(self) -> &'static str {
        match self {
            Module::MatmulSimt => "matmul_simt",
            Module::MatmulMma => "matmul_mma",
            Module::Depthwise => "depthwise",
            Module::Elementwise => "elementwise",
            Module::Gemv => "gemv",
            Module::Qmatmul => "qmatmul",
            Module::InvertedResidual => "inverted_residual",
        }
    }

    /// The PTX text.
    pub const fn ptx(self) -> &'static str {
        match self {
            Module::MatmulSimt => include_str!("../../../../shaders/ptx/matmul_simt.ptx"),
            Module::MatmulMma => include_str!("../../../../shaders/ptx/matmul_mma.ptx"),
            Module::Depthwise => include_str!("../../../../shaders/ptx/depthwise.ptx"),
            Module::Elementwise => include_str!("../../../../shaders/ptx/elementwise.ptx"),
            Module::Gemv => include_str!("../../../../shaders/ptx/gemv.ptx"),
            Module::Qmatmul => include_str!("../../../../shaders/ptx/qmatmul.ptx"),
            Module::InvertedResidual => include_str!("../../../../shaders/ptx/inverted_residual.ptx"),
        }
    }
}

/// One entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// The module holding it.
    pub module: Module,
    /// The `extern "C"` name.
    pub entry: &'static str,
}

impl Kernel {
    /// Bytes of dynamic shared memory a launch of this kernel passes (0 for all but
    /// `matmul_f32` and `matmul_f32_bf16_*`, whose rings are over the 48 KiB static limit: see
    /// [`simt`] and [`mma`]). Above
    /// [`simt::DEFAULT_SMEM_LIMIT`] the function's limit must be raised before its first launch.
    pub fn dynamic_smem_bytes(self) -> u32 {
        entry_dynamic_smem_bytes(self.entry)
    }
}

/// [`Kernel::dynamic_smem_bytes`] by entry-point name (entry points are unique across modules).
pub fn entry_dynamic_smem_bytes(entry: &str) -> u32 {
    if entry == simt::MATMUL_F32.entry {
        simt::SMEM_BYTES
    } else if entry.starts_with(mma::F32_ENTRY_PREFIX) {
        mma::F32_SMEM_BYTES
    } else {
        0
    }
}

const fn k(module: Module, entry: &'static str) -> Kernel {
    Kernel { module, entry }
}

/// Block tile of every fast matmul kernel: the grid is `ceil(N / 128) × ceil(M / 128) × batch`.
pub const MATMUL_TILE_M: usize = 128;
/// See [`MATMUL_TILE_M`].
pub const MATMUL_TILE_N: usize = 128;
/// Block of the naive matmul: 16 × 16 outputs.
pub const NAIVE_TILE: usize = 16;
/// The grid's `z` (batch) limit; larger batches are split into several launches.
pub const MAX_GRID_Z: usize = 65535;
/// The grid's `y` limit.
pub const MAX_GRID_Y: usize = 65535;

/// The matmul kernel for a storage dtype, precision policy and transposes. The tensor-core ones
/// (module [`Module::MatmulMma`]) take [`splitk::SplitKParams`], the SIMT one [`MatmulParams`].
/// [`Precision::F16`] takes the `Highest` kernels: CUDA has no f16-compute kernel, and the f32 path
/// is inside that policy's bound.
pub fn matmul_kernel(dtype: DType, precision: Precision, trans_a: bool, trans_b: bool) -> Kernel {
    use Module::MatmulMma as M;
    let t = (trans_a as usize) * 2 + trans_b as usize;
    let pick = |names: [&'static str; 4]| k(M, names[t]);
    match (dtype, precision) {
        (DType::F32, Precision::Highest | Precision::F16) => simt::MATMUL_F32,
        (DType::F32, _) => {
            pick(["matmul_f32_bf16_nn", "matmul_f32_bf16_nt", "matmul_f32_bf16_tn", "matmul_f32_bf16_tt"])
        }
        (DType::F16, Precision::Highest | Precision::F16) => {
            pick(["matmul_f16_f16_nn", "matmul_f16_f16_nt", "matmul_f16_f16_tn", "matmul_f16_f16_tt"])
        }
        (DType::F16, _) => {
            pick(["matmul_f16_bf16_nn", "matmul_f16_bf16_nt", "matmul_f16_bf16_tn", "matmul_f16_bf16_tt"])
        }
        (DType::Bf16, _) => {
            pick(["matmul_bf16_bf16_nn", "matmul_bf16_bf16_nt", "matmul_bf16_bf16_tn", "matmul_bf16_bf16_tt"])
        }
    }
}

/// Largest M the skinny kernels take.
pub const SKINNY_MAX_M: usize = 32;
/// Output columns per block of the skinny kernels: the grid is `ceil(N / 32) × 1 × batch`.
pub const SKINNY_COLS: usize = 32;

/// The SIMT skinny matmul for `M ≤ 32` rows and B stored `K × N` (not transposed): what
/// 16 < M ≤ 32 ran before the GEMV kernels' shared-memory ring, now the bench's reference for it
/// (`Device::previous_skinny_matmul`); `None` for other shapes.
pub fn skinny_matmul_kernel(dtype: DType, precision: Precision, m: usize, trans_b: bool) -> Option<Kernel> {
    if m == 0 || m > SKINNY_MAX_M || trans_b {
        return None;
    }
    let small = m <= 8;
    let pick = |m8: &'static str, m32: &'static str| Some(k(Module::MatmulSimt, if small { m8 } else { m32 }));
    match (dtype, precision) {
        (DType::F32, Precision::Highest | Precision::F16) => pick("matmul_skinny_f32_m8", "matmul_skinny_f32_m32"),
        (DType::F32, _) => pick("matmul_skinny_f32_bf16_m8", "matmul_skinny_f32_bf16_m32"),
        (DType::F16, Precision::Highest | Precision::F16) => pick("matmul_skinny_f16_m8", "matmul_skinny_f16_m32"),
        (DType::F16, _) => pick("matmul_skinny_f16_bf16_m8", "matmul_skinny_f16_bf16_m32"),
        (DType::Bf16, _) => pick("matmul_skinny_bf16_m8", "matmul_skinny_bf16_m32"),
    }
}

/// The naive matmul (bench reference).
pub fn naive_matmul_kernel(dtype: DType) -> Kernel {
    match dtype {
        DType::F32 => k(Module::MatmulSimt, "naive_matmul_f32"),
        DType::F16 => k(Module::MatmulSimt, "naive_matmul_f16"),
        DType::Bf16 => k(Module::MatmulSimt, "naive_matmul_bf16"),
    }
}

/// Elements per thread of the depthwise kernels along their vector dimension: output columns
/// (NCHW) or channels (NHWC), one 16-byte vector (`DwVec<T>::V` in `depthwise.cu`): 4 for f32,
/// 8 for f16 and bf16.
pub const fn dw_vec(dtype: DType) -> usize {
    16 / dtype.size_bytes()
}
/// Outputs along x per thread of the NHWC depthwise kernel (`DW_NHWC_X`).
pub const DW_NHWC_X: usize = 2;

/// The depthwise convolution kernel.
pub fn depthwise_kernel(dtype: DType, layout: Layout) -> Kernel {
    use Module::Depthwise as D;
    match (dtype, layout) {
        (DType::F32, Layout::Nchw) => k(D, "depthwise_conv2d_f32_nchw"),
        (DType::F32, Layout::Nhwc) => k(D, "depthwise_conv2d_f32_nhwc"),
        (DType::F16, Layout::Nchw) => k(D, "depthwise_conv2d_f16_nchw"),
        (DType::F16, Layout::Nhwc) => k(D, "depthwise_conv2d_f16_nhwc"),
        (DType::Bf16, Layout::Nchw) => k(D, "depthwise_conv2d_bf16_nchw"),
        (DType::Bf16, Layout::Nhwc) => k(D, "depthwise_conv2d_bf16_nhwc"),
    }
}

/// The tiled depthwise kernel (`depthwise_tiled_<dtype>_<layout>`, parameters
/// [`DwTiledParams`], launch [`DwTiledPlan`]).
pub fn depthwise_tiled_kernel(dtype: DType, layout: Layout) -> Kernel {
    use Module::Depthwise as D;
    match (dtype, layout) {
        (DType::F32, Layout::Nchw) => k(D, "depthwise_tiled_f32_nchw"),
        (DType::F32, Layout::Nhwc) => k(D, "depthwise_tiled_f32_nhwc"),
        (DType::F16, Layout::Nchw) => k(D, "depthwise_tiled_f16_nchw"),
        (DType::F16, Layout::Nhwc) => k(D, "depthwise_tiled_f16_nhwc"),
        (DType::Bf16, Layout::Nchw) => k(D, "depthwise_tiled_bf16_nchw"),
        (DType::Bf16, Layout::Nhwc) => k(D, "depthwise_tiled_bf16_nhwc"),
    }
}

/// Threads per block of the tiled depthwise kernels (`DWT_THREADS`).
pub const DWT_THREADS: u32 = 256;
/// Shared patch capacity of the tiled depthwise kernels, bytes (`DWT_PATCH_BYTES`).
pub const DWT_PATCH_BYTES: usize = 40960;
/// Staged taps of the tiled depthwise kernels, f32 (`DWT_W_FLOATS`): NHWC stages 8 vectors of
/// channels per tap, so at most `DWT_W_FLOATS / (8 · dw_vec)` taps (25 for f16/bf16, 50 for
/// f32); NCHW one per tap.
pub const DWT_W_FLOATS: usize = 1600;

/// Flags of [`DwTiledParams::flags`].
pub mod dwt_flags {
    /// A bias is added.
    pub const BIAS: u32 = 1;
    /// 16-byte input loads: NCHW with W a multiple of the vector, NHWC with C one; aligned input.
    pub const IN_VEC: u32 = 2;
    /// 16-byte output stores: NCHW with OW a multiple of the vector, NHWC with C one; aligned
    /// output.
    pub const OUT_VEC: u32 = 4;
}

/// The parameter block of the tiled depthwise kernels (`DwTiledParams` in `depthwise.cu`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[allow(missing_docs)]
pub struct DwTiledParams {
    pub input: u64,
    pub weight: u64,
    pub bias: u64,
    pub out: u64,
    /// Steps along z in all: images × output channels (NCHW) or × channel blocks (NHWC).
    pub z_total: i64,
    pub channels: i32,
    pub height: i32,
    pub width: i32,
    pub multiplier: i32,
    pub kh: i32,
    pub kw: i32,
    pub sh: i32,
    pub sw: i32,
    pub pt: i32,
    pub pl: i32,
    pub dh: i32,
    pub dw: i32,
    pub oh: i32,
    pub ow: i32,
    pub tile_h: i32,
    pub patch_h: i32,
    /// NCHW: 16-byte vectors; NHWC: pixels.
    pub patch_w: i32,
    pub c_blocks: i32,
    /// Weight element (oc, tap) is at `oc·w_ch + tap·w_tap`.
    pub w_tap: i32,
    pub w_ch: i32,
    pub act: u32,
    pub flags: u32,
}

/// How the tiled depthwise kernels cover a convolution, or `None` from [`DwTiledPlan::new`]
/// where they do not apply (the kernels of [`depthwise_kernel`] run then).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DwTiledPlan {
    /// Output rows per tile.
    pub tile_h: usize,
    /// Patch rows.
    pub patch_h: usize,
    /// Patch width: 16-byte vectors (NCHW) or pixels (NHWC).
    pub patch_w: usize,
    /// Channel blocks of `8 · dw_vec` per image (NHWC; 1 in NCHW).
    pub c_blocks: usize,
    /// Blocks along x and y.
    pub grid_xy: [u32; 2],
    /// Steps along z in all (the grid's z is capped at 65535, the kernels stride over the rest).
    pub z_total: usize,
}

impl DwTiledPlan {
    /// The plan for `desc` in `dtype`, or `None`: NHWC with a multiplier above 1, more taps than
    /// [`DWT_W_FLOATS`] holds, a patch over [`DWT_PATCH_BYTES`] even with 1-row tiles (NHWC) or
    /// 8-row tiles (NCHW), dimensions past `i32`, or more than 65535 row tiles.
    pub fn new(desc: &crate::Conv2dDesc, dtype: DType) -> Option<DwTiledPlan> {
        let v = dw_vec(dtype);
        let (oh, ow) = (desc.out_h()?, desc.out_w()?);
        let taps = desc.kernel_h.checked_mul(desc.kernel_w)?;
        let i31 = |x: usize| x <= i32::MAX as usize;
        let padded_h = desc.height.checked_add(desc.pad_top)?.checked_add(desc.pad_bottom)?;
        let padded_w = desc.width.checked_add(desc.pad_left)?.checked_add(desc.pad_right)?;
        if !i31(padded_h) || !i31(padded_w) || !i31(desc.out_channels()) {
            return None;
        }
        let span = |tile: usize, stride: usize, k: usize, dil: usize| -> Option<usize> {
            (tile - 1).checked_mul(stride)?.checked_add((k - 1).checked_mul(dil)?)?.checked_add(1)
        };
        let (tile_h, patch_h, patch_w, c_blocks, tile_w) = match desc.layout {
            Layout::Nchw => {
                if taps > DWT_W_FLOATS {
                    return None;
                }
                let tw = 32 * v;
                let ph = span(8, desc.stride_h, desc.kernel_h, desc.dilation_h)?;
                let pw = span(tw, desc.stride_w, desc.kernel_w, desc.dilation_w)?.checked_add(v - 1)?.div_ceil(v);
                if ph.checked_mul(pw)?.checked_mul(16)? > DWT_PATCH_BYTES {
                    return None;
                }
                (8, ph, pw, 1, tw)
            }
            Layout::Nhwc => {
                if desc.multiplier != 1 || taps.checked_mul(8 * v)? > DWT_W_FLOATS {
                    return None;
                }
                let pw = span(8, desc.stride_w, desc.kernel_w, desc.dilation_w)?;
                let fits = |th: usize| {
                    span(th, desc.stride_h, desc.kernel_h, desc.dilation_h)
                        .and_then(|ph| ph.checked_mul(pw)?.checked_mul(8 * 16))
                        .is_some_and(|b| b <= DWT_PATCH_BYTES)
                };
                let th = [8usize, 4, 2, 1].into_iter().find(|&th| fits(th))?;
                let ph = span(th, desc.stride_h, desc.kernel_h, desc.dilation_h)?;
                (th, ph, pw, desc.channels.div_ceil(8 * v), 8)
            }
        };
        let gx = u32::try_from(ow.div_ceil(tile_w)).ok().filter(|&g| g <= i32::MAX as u32)?;
        let gy = u32::try_from(oh.div_ceil(tile_h)).ok().filter(|&g| g <= 65535)?;
        let per_image = if desc.layout == Layout::Nchw { desc.out_channels() } else { c_blocks };
        Some(DwTiledPlan {
            tile_h,
            patch_h,
            patch_w,
            c_blocks,
            grid_xy: [gx, gy],
            z_total: desc.batch.checked_mul(per_image)?,
        })
    }
}

/// The activation kernel, specialised to its activation (`activation_<dtype>_<act>`). It handles
/// 16 bytes per thread step; its bias indices are 32-bit, so `bias_len` must stay below
/// [`ACTIVATION_MAX_BIAS`].
pub fn activation_kernel(dtype: DType, activation: Activation) -> Kernel {
    const NAMES: [[&str; 6]; 3] = [
        [
            "activation_f32_none",
            "activation_f32_relu",
            "activation_f32_relu6",
            "activation_f32_gelu",
            "activation_f32_gelu_tanh",
            "activation_f32_silu",
        ],
        [
            "activation_f16_none",
            "activation_f16_relu",
            "activation_f16_relu6",
            "activation_f16_gelu",
            "activation_f16_gelu_tanh",
            "activation_f16_silu",
        ],
        [
            "activation_bf16_none",
            "activation_bf16_relu",
            "activation_bf16_relu6",
            "activation_bf16_gelu",
            "activation_bf16_gelu_tanh",
            "activation_bf16_silu",
        ],
    ];
    let d = match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Bf16 => 2,
    };
    // `Activation::code` is the index of the activation in `Activation::ALL` (0..=5).
    k(Module::Elementwise, NAMES[d][activation.code() as usize])
}

/// The activation kernels keep bias indices in 32 bits: `bias_len` must be below 2^31.
pub const ACTIVATION_MAX_BIAS: usize = 1 << 31;

/// The gated linear unit `act(gate) · up` (`GluParams`). It makes 16 bytes of output per
/// thread step.
pub fn glu_kernel(dtype: DType) -> Kernel {
    match dtype {
        DType::F32 => k(Module::Elementwise, "glu_f32"),
        DType::F16 => k(Module::Elementwise, "glu_f16"),
        DType::Bf16 => k(Module::Elementwise, "glu_bf16"),
    }
}

/// The byte copy (16 bytes per thread step).
pub const COPY: Kernel = k(Module::Elementwise, "copy_bytes");

/// `MatmulParams::flags`: A is stored transposed.
pub const MM_TRANS_A: u32 = 1;
/// B is stored transposed.
pub const MM_TRANS_B: u32 = 2;
/// A bias is added.
pub const MM_HAS_BIAS: u32 = 4;
/// `beta · C` is added.
pub const MM_HAS_C: u32 = 8;
/// A's offset, leading dimension and batch stride are multiples of 16 bytes.
pub const MM_A_VEC: u32 = 16;
/// B's offset, leading dimension and batch stride are multiples of 16 bytes.
pub const MM_B_VEC: u32 = 32;
/// The output's offset, leading dimension and batch stride are multiples of 4 elements.
pub const MM_OUT_VEC: u32 = 64;

/// The matmul parameter block (`MatmulParams` in `common.cuh`). Pointers are device addresses
/// (0 when absent); offsets, leading dimensions and batch strides are in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[allow(missing_docs)]
pub struct MatmulParams {
    pub a: u64,
    pub b: u64,
    pub bias: u64,
    pub c: u64,
    pub out: u64,
    pub a_off: i64,
    pub a_ld: i64,
    pub a_bs: i64,
    pub b_off: i64,
    pub b_ld: i64,
    pub b_bs: i64,
    pub c_off: i64,
    pub c_ld: i64,
    pub c_bs: i64,
    pub o_off: i64,
    pub o_ld: i64,
    pub o_bs: i64,
    pub bias_off: i64,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub batch: i32,
    pub alpha: f32,
    pub beta: f32,
    pub act: u32,
    pub flags: u32,
}

/// The depthwise convolution parameter block (`ConvParams` in `common.cuh`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[allow(missing_docs)]
pub struct ConvParams {
    pub input: u64,
    pub weight: u64,
    pub bias: u64,
    pub out: u64,
    /// Thread work items (see the `DW_*` constants).
    pub work: i64,
    pub batch: i32,
    pub channels: i32,
    pub height: i32,
    pub width: i32,
    pub multiplier: i32,
    pub kh: i32,
    pub kw: i32,
    pub sh: i32,
    pub sw: i32,
    pub pt: i32,
    pub pl: i32,
    pub dh: i32,
    pub dw: i32,
    pub oh: i32,
    pub ow: i32,
    /// Weight element `(oc, tap)` is at `oc·w_ch + tap·w_tap`: `(1, kh·kw)` for
    /// `[C·m, 1, kh, kw]`, `(C·m, 1)` for the packed `[kh, kw, C·m]`.
    pub w_tap: i32,
    pub w_ch: i32,
    pub act: u32,
    pub has_bias: u32,
    /// 16-byte vectors allowed ([`dw_vec`] elements): NHWC with multiplier 1, channels a
    /// multiple of the vector and input and output 16-byte aligned; NCHW with a 3-wide filter,
    /// left pad 1, dilation 1, stride 1 or 2, width a multiple of the vector and the input
    /// 16-byte aligned.
    pub vec: u32,
}

/// The activation parameter block (`ActParams` in `common.cuh`); `bias_len` 0 means no bias.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[allow(missing_docs)]
pub struct ActParams {
    pub x: u64,
    pub bias: u64,
    pub out: u64,
    pub len: i64,
    pub bias_len: i64,
    pub act: u32,
    pub pad0: u32,
}

/// The GLU parameter block (`GluParams` in `common.cuh`): `h` is `[rows, 2f]`, `out` is
/// `[rows, f]`; `vec` is 1 when `f` is a multiple of the 16-byte vector.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[allow(missing_docs)]
pub struct GluParams {
    pub h: u64,
    pub out: u64,
    pub rows: i64,
    pub f: i64,
    pub act: u32,
    pub vec: u32,
}

/// The copy parameter block (`CopyParams` in `common.cuh`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[allow(missing_docs)]
pub struct CopyParams {
    pub src: u64,
    pub dst: u64,
    pub bytes: i64,
}

/// The value of `#define NAME <int>` in a CUDA source (the host models' tests check their
/// constants against the kernels' this way).
#[cfg(test)]
pub(crate) fn source_define(src: &str, name: &str) -> usize {
    let line = src
        .lines()
        .find(|l| l.split_whitespace().take(2).eq(["#define", name]))
        .unwrap_or_else(|| panic!("no #define {name}"));
    line.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes the PTX declares for each entry's parameter (`.param .align 8 .b8 x[N]`).
    pub(super) fn ptx_param_size(kernel: Kernel) -> Option<usize> {
        let ptx = kernel.module.ptx();
        let start = ptx.find(&format!(".entry {}(", kernel.entry))?;
        let rest = &ptx[start..];
        let open = rest.find('[')?;
        let close = rest.find(']')?;
        rest[open + 1..close].parse().ok()
    }

    /// Each (dtype, activation) names its own specialised entry point, which the PTX holds.
    #[test]
    fn activation_kernels_are_specialised() {
        for (i, act) in Activation::ALL.into_iter().enumerate() {
            assert_eq!(act.code() as usize, i);
            for dt in DType::ALL {
                let k = activation_kernel(dt, act);
                assert_eq!(k.entry, format!("activation_{}_{}", dt.name(), act.name().replace('-', "_")));
                assert!(k.module.ptx().contains(&format!(".entry {}(", k.entry)), "{} is not in the PTX", k.entry);
            }
        }
    }

    /// The f16-compute policy runs the `Highest` kernels on CUDA (never the bf16 ones).
    #[test]
    fn the_f16_policy_takes_the_highest_kernels() {
        for dt in [DType::F32, DType::F16] {
            for (ta, tb) in [(false, false), (true, true)] {
                let want = matmul_kernel(dt, Precision::Highest, ta, tb);
                assert_eq!(matmul_kernel(dt, Precision::F16, ta, tb), want);
            }
            for m in [1, 9] {
                let want = skinny_matmul_kernel(dt, Precision::Highest, m, false);
                assert_eq!(skinny_matmul_kernel(dt, Precision::F16, m, false), want);
                let want = gemv::gemv_kernel(dt, Precision::Highest, m, true);
                assert_eq!(gemv::gemv_kernel(dt, Precision::F16, m, true), want);
            }
        }
    }

    #[test]
    fn parameter_blocks_match_the_ptx() {
        let mm = size_of::<MatmulParams>();
        for dt in DType::ALL {
            for p in [Precision::Highest, Precision::Bf16] {
                for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                    let kern = matmul_kernel(dt, p, ta, tb);
                    // The tensor-core kernels take the split-K block, the SIMT one the matmul's.
                    let want = if kern.module == Module::MatmulMma { size_of::<splitk::SplitKParams>() } else { mm };
                    assert_eq!(ptx_param_size(kern), Some(want), "{}", kern.entry);
                }
            }
            assert_eq!(ptx_param_size(naive_matmul_kernel(dt)), Some(mm));
            for p in [Precision::Highest, Precision::Bf16] {
                for m in [1, 8, 9, 32] {
                    let kern = skinny_matmul_kernel(dt, p, m, false).expect("a skinny kernel");
                    assert_eq!(ptx_param_size(kern), Some(mm), "{}", kern.entry);
                }
                assert_eq!(skinny_matmul_kernel(dt, p, 33, false), None);
                assert_eq!(skinny_matmul_kernel(dt, p, 4, true), None);
            }
            for l in [Layout::Nchw, Layout::Nhwc] {
                assert_eq!(ptx_param_size(depthwise_kernel(dt, l)), Some(size_of::<ConvParams>()));
                assert_eq!(ptx_param_size(depthwise_tiled_kernel(dt, l)), Some(size_of::<DwTiledParams>()));
            }
            for act in Activation::ALL {
                assert_eq!(ptx_param_size(activation_kernel(dt, act)), Some(size_of::<ActParams>()));
            }
            assert_eq!(ptx_param_size(glu_kernel(dt)), Some(size_of::<GluParams>()));
        }
        assert_eq!(ptx_param_size(COPY), Some(size_of::<CopyParams>()));
    }

    #[test]
    fn ptx_is_the_pinned_isa_for_compute_80() {
        for m in Module::ALL {
            let ptx = m.ptx();
            assert!(ptx.contains(&format!(".version {PTX_ISA}\n")), "{}", m.name());
            assert!(ptx.contains(".target sm_80\n"), "{}", m.name());
            assert_eq!(Module::ALL[m.index()], m);
        }
    }
}
