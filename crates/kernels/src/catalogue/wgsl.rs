//! The WGSL kernels: sources from `shaders/wgsl/`, how each module is composed for a storage
//! dtype, its entry point, `override` tile constants, launch shape and `#[repr(C)]` parameter
//! block.
//!
//! # How a module is put together
//! WGSL has no `#include` and no generics, so [`module`] composes each module's text:
//! 1. `enable f16;` when the module stores f16 natively ([`ElementStorage::F16`]);
//! 2. the kernel file from `shaders/wgsl/`, which declares its parameter block, workgroup
//!    arrays and entry point and works on f32 values only;
//! 3. a generated block ([`generated_block`]): `common.wgsl` (the activations, exactly
//!    [`crate::Activation::apply_f32`]; the round-to-nearest-even f16/bf16 conversions in bit
//!    operations; the grid folding helper), then a *storage prelude*: one storage binding per
//!    tensor argument with accessors `ld_X(i) -> f32`, `ld4_X(v) -> vec4<f32>` (elements
//!    `4v..4v+4`) and, for the output, `st_X(i, f32)` and `st4_X(v, vec4<f32>)`. The prelude
//!    alone decides how elements are stored.
//!
//! Each kernel file already ends with its f32 generated block, so the file is valid WGSL as it
//! stands; the catalogue swaps that block for the one of the variant it builds.
//!
//! # Kernels and launch shapes
//! | kernel | workgroup | work per invocation |
//! |---|---|---|
//! | [`Kernel::Matmul`] | `WG_X × WG_Y` ([`MatmulTile`]: 16 × 16, or 32 × 2 for M ≤ 16) in 8 × 4 warp tiles | 8 × 8 outputs; BK-deep slabs of A and B staged in workgroup memory without bank conflicts ([`layout`]), software-pipelined |
//! | [`Kernel::MatmulF16x2`] | as [`Kernel::Matmul`] | 8 × 8 outputs; f16 slabs (`vec4<f16>`, half the bytes), 32 `vec2<f16>` FMAs per k step, f16 partials added to f32 accumulators every 8 steps ([`f16x2`]); f16 storage only |
//! | [`Kernel::MatmulSmallM`] | [`SMALL_M_WG`] = 64 (tunable: [`WG_CANDIDATES`]) | M × [`SMALL_M_COLS`] outputs (M ≤ 4), no workgroup memory |
//! | [`Kernel::Gemv`], [`Kernel::GemvSubgroup`] | [`gemv::GEMV_WG`] = 64 (tunable: [`gemv::GEMV_WG_CANDIDATES`]) | M ≤ 16 rows × 4 columns per workgroup, K split across the invocations, partials reduced through workgroup memory or subgroup operations ([`gemv`]) |
//! | [`Kernel::QuantGemv`], [`Kernel::QuantGemvSubgroup`] | [`qmatmul::QGEMV_WG`] = 64 | quantized weights, M ≤ 16 rows × 4 columns per workgroup, K split 32 weights at a time, dequantized in registers, reduced as the GEMV ([`qmatmul`]) |
//! | [`Kernel::QuantMatmul`] | 16 × 16 | 4 × 4 outputs of a 64 × 64 block; 32-deep slabs of op(A) and dequantized weights staged in workgroup memory (16 KiB) |
//! | [`Kernel::MatmulCoop`] | 4 subgroups (`WG` = 4 × the fixed subgroup size) | a 32 × 32 quadrant of a 64 × 64 block (16 × 16 tiles; 16 × 16 of 32 × 32 with 8 × 8 tiles) as 2 × 2 cooperative f32 accumulators; f16 slabs in workgroup memory, the epilogue from an f32 patch ([`coopmat`]; compiled and validated, not yet run) |
//! | [`Kernel::MatmulNaive`] | 16 × 16 | 1 output (bench reference) |
//! | [`Kernel::DepthwiseConv2d`] | [`WG_1D`] = 64 (tunable: [`WG_CANDIDATES`]) | 4 outputs along W (NCHW) or C (NHWC) |
//! | [`Kernel::DepthwiseTiled`] | 64, grid (column tiles, row tiles, images × channel blocks) | NCHW: 4 outputs of an 8 × 32 tile of one channel; NHWC: 4 channels of the pixels of a `tile_h` × 8 × 16-channel tile; patch and taps in workgroup memory (16 KiB, [`DwTiledPlan`]) |
//! | [`Kernel::Activation`] | 64 | 4 elements (vec4) |
//! | [`Kernel::Copy`] | 64 | 16 bytes (`vec4<u32>`) |
//! | [`Kernel::Glu`] | 64 | 4 outputs (vec4 when F is a multiple of 4) |
//! | [`Kernel::InvertedResidual`] | 256, grid (tiles, C'/160, N) | 1 pixel × up to 20 output channels (`ACC`) of an 8 × 4 tile; hidden channels in chunks of 8 in workgroup memory (11,040 bytes); the expand stage runs once per tile for C' ≤ 160 |
//!
//! The shape constants of a pipeline are its [`Spec`]; 1-D launches fold into a 2-D grid. The
//! matmul kernels are also specialised to the product's switches ([`MatmulSwitches`]:
//! transposes, bias, C, activation), passed as `override` constants, so the branches on them
//! fold away when the pipeline is built.
//! The autotuner (`tilekit::tune`) picks a spec per device and shape class among
//! [`matmul_candidates`] and [`conv_candidates`] (the first candidate is always the default
//! the backends use untuned), and keys its results by [`source_hash`].
//!
//! # Storage variants
//! - [`ElementStorage::F32`]: `array<vec4<f32>>`; scalar accesses index a vector component, so
//!   one binding serves both the vec4 fast paths and the scalar edges (naga lowers a component
//!   store to a 4-byte store in SPIR-V, HLSL and MSL, so neighbouring invocations writing
//!   different components of one vec4 do not race).
//! - [`ElementStorage::F16`]: `array<vec4<f16>>` under `enable f16` (`SHADER_F16`); loads widen
//!   in hardware (a device may quiet a signalling NaN there: lavapipe turns 0x7c01 into
//!   0x7e00); stores round with the bit-exact `f16_bits_from_f32` first, so the final `f16()`
//!   conversion is exact.
//! - [`ElementStorage::F16Packed`] and [`ElementStorage::Bf16Packed`]: two elements per `u32`,
//!   inputs read as `array<vec2<u32>>` (4 elements per vector load), converted with bit
//!   operations. The output is `array<atomic<u32>>`: a single-element store clears its half
//!   with `atomicAnd` and sets it with `atomicOr`, each touching only its own 16 bits, so two
//!   invocations writing the two halves of one word (odd offsets, odd leading dimensions, odd
//!   lengths) cannot lose each other's element; vector stores own both words and use
//!   `atomicStore`.

use crate::{DType, MatmulDesc};

pub mod coopmat;
pub mod f16x2;
pub mod gemv;
pub mod layout;
pub mod qmatmul;

pub use coopmat::CoopSize;
pub use qmatmul::QuantFormat;

const COMMON: &str = include_str!("../../../../shaders/wgsl/common.wgsl");
const MATMUL: &str = include_str!("../../../../shaders/wgsl/matmul.wgsl");
const MATMUL_F16X2: &str = include_str!("../../../../shaders/wgsl/matmul_f16x2.wgsl");
const MATMUL_NAIVE: &str = include_str!("../../../../shaders/wgsl/matmul_naive.wgsl");
const DEPTHWISE_CONV2D: &str = include_str!("../../../../shaders/wgsl/depthwise_conv2d.wgsl");
const ACTIVATION: &str = include_str!("../../../../shaders/wgsl/activation.wgsl");
const COPY: &str = include_str!("../../../../shaders/wgsl/copy.wgsl");
const GEMV: &str = include_str!("../../../../shaders/wgsl/gemv.wgsl");
const GLU: &str = include_str!("../../../../shaders/wgsl/glu.wgsl");
const INVERTED_RESIDUAL: &str = include_str!("../../../../shaders/wgsl/inverted_residual.wgsl");
const QMATMUL: &str = include_str!("../../../../shaders/wgsl/qmatmul.wgsl");
const MATMUL_COOPMAT: &str = include_str!("../../../../shaders/wgsl/matmul_coopmat.wgsl");

/// How elements of a dtype are stored in a WGSL module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElementStorage {
    /// f32 as `vec4<f32>` arrays.
    F32,
    /// f16 as `vec4<f16>` arrays (needs `SHADER_F16`).
    F16,
    /// f16 packed two per `u32` (core WGSL; for devices without `SHADER_F16`).
    F16Packed,
    /// bf16 packed two per `u32` (WGSL has no bf16 type).
    Bf16Packed,
}

impl ElementStorage {
    /// Every variant, in a fixed order.
    pub const ALL: [ElementStorage; 4] =
        [ElementStorage::F32, ElementStorage::F16, ElementStorage::F16Packed, ElementStorage::Bf16Packed];

    /// The variant for `dtype`: f16 is stored natively where the device has `SHADER_F16`
    /// (`native_f16`), packed otherwise.
    pub fn for_dtype(dtype: DType, native_f16: bool) -> ElementStorage {
        match dtype {
            DType::F32 => ElementStorage::F32,
            DType::F16 if native_f16 => ElementStorage::F16,
            DType::F16 => ElementStorage::F16Packed,
            DType::Bf16 => ElementStorage::Bf16Packed,
        }
    }

    /// The suffix used in module names.
    pub const fn name(self) -> &'static str {
        match self {
            ElementStorage::F32 => "f32",
            ElementStorage::F16 => "f16",
            ElementStorage::F16Packed => "f16_packed",
            ElementStorage::Bf16Packed => "bf16_packed",
        }
    }

    /// Whether modules in this variant need `enable f16` (the `SHADER_F16` feature).
    pub const fn needs_f16(self) -> bool {
        matches!(self, ElementStorage::F16)
    }
}

/// The WGSL kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kernel {
    /// Tiled matmul with the fused epilogue (`matmul.wgsl`, entry `matmul`).
    Matmul,
    /// Matmul for M <= [`SMALL_M_ROWS`] without workgroup memory (`matmul.wgsl`, entry
    /// `matmul_small_m`), same parameters and epilogue.
    MatmulSmallM,
    /// One output per invocation, no tiling, no epilogue (`matmul_naive.wgsl`, for the bench).
    MatmulNaive,
    /// Depthwise 2-D convolution with bias and activation (`depthwise_conv2d.wgsl`, entry
    /// `depthwise_conv2d`): the general kernel, no workgroup memory.
    DepthwiseConv2d,
    /// The tiled depthwise convolution (`depthwise_conv2d.wgsl`, entry `depthwise_tiled`): an
    /// input tile plus halo and the block's taps staged in workgroup memory, a 3-D grid
    /// ([`DwTiledPlan`]); same parameters as [`Kernel::DepthwiseConv2d`].
    DepthwiseTiled,
    /// Elementwise activation with broadcast bias, out of place (`activation.wgsl`).
    Activation,
    /// The same kernel with `x` read from `out` (in place).
    ActivationInPlace,
    /// Raw word copy, independent of the dtype (`copy.wgsl`).
    Copy,
    /// GEMV / skinny GEMM for M <= [`gemv::GEMV_ROWS`], K split across a workgroup, reduced
    /// through workgroup memory (`gemv.wgsl`, entry `gemv`); same parameters and epilogue as
    /// [`Kernel::Matmul`].
    Gemv,
    /// The same kernel reduced with subgroup operations (entry `gemv_subgroup`, needs
    /// `wgpu::Features::SUBGROUP`).
    GemvSubgroup,
    /// Gated linear unit `act(gate) · up` over the two halves of each row (`glu.wgsl`).
    Glu,
    /// The fused inverted-residual block (`inverted_residual.wgsl`, parameters
    /// [`BlockParams`]).
    InvertedResidual,
    /// Quantized-weight GEMV for M <= [`qmatmul::QGEMV_ROWS`], reduced through workgroup
    /// memory (`qmatmul.wgsl`, entry `qgemv`; [`qmatmul`]).
    QuantGemv(QuantFormat),
    /// The same kernel reduced with subgroup operations (entry `qgemv_subgroup`).
    QuantGemvSubgroup(QuantFormat),
    /// Quantized-weight tiled matmul, weights dequantized into workgroup memory (entry
    /// `qmatmul`).
    QuantMatmul(QuantFormat),
    /// Matmul on cooperative matrices, f16 tiles and f32 accumulators, the epilogue applied
    /// after a store to workgroup memory (`matmul_coopmat.wgsl`, entry `matmul_coopmat`; needs
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX`, `SHADER_F16` and `SUBGROUP`; [`coopmat`]). Same
    /// parameters, bindings and switches as [`Kernel::Matmul`].
    MatmulCoop(CoopSize),
    /// The tiled matmul of [`crate::Precision::F16`] for f16 storage only: products and
    /// partial sums of up to 8 products in `vec2<f16>`, added to f32 accumulators
    /// (`matmul_f16x2.wgsl`, [`f16x2`]); same tiles, switches, parameters and epilogue as
    /// [`Kernel::Matmul`].
    MatmulF16x2,
}

impl Kernel {
    /// Every kernel, in a fixed order.
    pub const ALL: [Kernel; 30] = {
        use QuantFormat as F;
        [
            Kernel::Matmul,
            Kernel::MatmulSmallM,
            Kernel::MatmulNaive,
            Kernel::DepthwiseConv2d,
            Kernel::DepthwiseTiled,
            Kernel::Activation,
            Kernel::ActivationInPlace,
            Kernel::Copy,
            Kernel::Gemv,
            Kernel::GemvSubgroup,
            Kernel::Glu,
            Kernel::InvertedResidual,
            Kernel::QuantGemv(F::Q8_0),
            Kernel::QuantGemv(F::Q4_0),
            Kernel::QuantGemv(F::Q4_1),
            Kernel::QuantGemv(F::Q4K),
            Kernel::QuantGemv(F::Q6K),
            Kernel::QuantGemvSubgroup(F::Q8_0),
            Kernel::QuantGemvSubgroup(F::Q4_0),
            Kernel::QuantGemvSubgroup(F::Q4_1),
            Kernel::QuantGemvSubgroup(F::Q4K),
            Kernel::QuantGemvSubgroup(F::Q6K),
            Kernel::QuantMatmul(F::Q8_0),
            Kernel::QuantMatmul(F::Q4_0),
            Kernel::QuantMatmul(F::Q4_1),
            Kernel::QuantMatmul(F::Q4K),
            Kernel::QuantMatmul(F::Q6K),
            Kernel::MatmulCoop(CoopSize::S16),
            Kernel::MatmulCoop(CoopSize::S8),
            Kernel::MatmulF16x2,
        ]
    };

    /// The module name stem.
    pub const fn name(self) -> &'static str {
        match self {
            Kernel::Matmul => "matmul",
            Kernel::MatmulSmallM => "matmul_small_m",
            Kernel::MatmulNaive => "matmul_naive",
            Kernel::DepthwiseConv2d => "depthwise_conv2d",
            Kernel::DepthwiseTiled => "depthwise_tiled",
            Kernel::Activation => "activation",
            Kernel::ActivationInPlace => "activation_in_place",
            Kernel::Copy => "copy",
            Kernel::Gemv => "gemv",
            Kernel::GemvSubgroup => "gemv_subgroup",
            Kernel::Glu => "glu",
            Kernel::InvertedResidual => "inverted_residual",
            Kernel::MatmulF16x2 => "matmul_f16x2",
            Kernel::QuantGemv(_) | Kernel::QuantGemvSubgroup(_) | Kernel::QuantMatmul(_) => qmatmul::name(self),
            Kernel::MatmulCoop(CoopSize::S16) => "matmul_coopmat16",
            Kernel::MatmulCoop(CoopSize::S8) => "matmul_coopmat8",
        }
    }

    /// Whether the module needs `enable subgroups` (the `SUBGROUP` feature).
    pub const fn needs_subgroups(self) -> bool {
        matches!(self, Kernel::GemvSubgroup | Kernel::QuantGemvSubgroup(_) | Kernel::MatmulCoop(_))
    }

    /// Whether the module needs `enable wgpu_cooperative_matrix` (the
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX` feature).
    pub const fn needs_cooperative_matrix(self) -> bool {
        matches!(self, Kernel::MatmulCoop(_))
    }

    /// The storage variants the kernel is built in: [`Kernel::MatmulCoop`] and
    /// [`Kernel::MatmulF16x2`] only in native f16 (their staged tiles are f16), the others in
    /// all of [`ElementStorage::ALL`].
    pub fn storages(self) -> &'static [ElementStorage] {
        match self {
            Kernel::MatmulCoop(_) | Kernel::MatmulF16x2 => &[ElementStorage::F16],
            _ => &ElementStorage::ALL,
        }
    }

    /// The one storage variant the kernel is built for, where it has one
    /// ([`Kernel::MatmulF16x2`]: native f16); [`module_with`] builds that variant whatever
    /// storage it is asked for.
    pub const fn only_storage(self) -> Option<ElementStorage> {
        match self {
            Kernel::MatmulF16x2 => Some(ElementStorage::F16),
            _ => None,
        }
    }

    /// Whether the kernel takes a matmul's parameter block and bindings.
    pub const fn is_matmul(self) -> bool {
        matches!(
            self,
            Kernel::Matmul
                | Kernel::MatmulF16x2
                | Kernel::MatmulSmallM
                | Kernel::Gemv
                | Kernel::GemvSubgroup
                | Kernel::QuantGemv(_)
                | Kernel::QuantGemvSubgroup(_)
                | Kernel::QuantMatmul(_)
                | Kernel::MatmulCoop(_)
        )
    }

    /// Whether the module depends on the element storage (the copy moves raw words).
    pub const fn is_typed(self) -> bool {
        !matches!(self, Kernel::Copy)
    }
}

/// Tile shape of the tiled matmul (`matmul.wgsl`). Each invocation owns a `TM × TN = 8 × 8`
/// register tile, fixed in the shader; the workgroup and slab depth are `override` constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulTile {
    /// Invocations along N (`WG_X`).
    pub wg_x: u32,
    /// Invocations along M (`WG_Y`).
    pub wg_y: u32,
    /// Depth of a K slab (`BK`), a multiple of 4.
    pub bk: u32,
}

impl MatmulTile {
    /// The default: 16 × 16 invocations (256, the WebGPU default limit) with 8 × 8 outputs
    /// each give a 128 × 128 block (siboehm's SGEMM kernel 6 shape); BK = 8 keeps the two
    /// staged slabs at 8 KiB, half the 16 KiB WebGPU minimum of workgroup storage, and
    /// each invocation stages one vec4 of A and one of B per slab.
    pub const DEFAULT: MatmulTile = MatmulTile { wg_x: 16, wg_y: 16, bk: 8 };
    /// For 4 < M <= 16: a 16 × 256 block (32 × 2 invocations), so a short M does not leave
    /// most of a 128-row block idle; BK = 8 (8.5 KiB of workgroup storage, 8 staged vec4s of
    /// B per invocation).
    pub const SHORT: MatmulTile = MatmulTile { wg_x: 32, wg_y: 2, bk: 8 };
    /// The tile the backends use for a product with `m` rows.
    /// (Products with M <= [`SMALL_M_ROWS`] take [`Kernel::MatmulSmallM`] instead.)
    pub const fn for_rows(m: usize) -> MatmulTile {
        if m <= 16 { MatmulTile::SHORT } else { MatmulTile::DEFAULT }
    }

    /// Invocations per workgroup.
    pub const fn invocations(self) -> u32 {
        self.wg_x * self.wg_y
    }

    /// The most vec4s of one operand an invocation stages per slab; `matmul.wgsl` keeps them
    /// in registers of `MAX_LOADS` = 8.
    pub const fn loads_per_invocation(self) -> u32 {
        let a = (self.bm() * self.bk / 4).div_ceil(self.invocations());
        let b = (self.bn() * self.bk / 4).div_ceil(self.invocations());
        if a > b { a } else { b }
    }
    /// Outputs per invocation along M.
    pub const TM: u32 = 8;
    /// Outputs per invocation along N.
    pub const TN: u32 = 8;
    /// Invocations in a warp tile: one 32-wide subgroup on most GPUs.
    pub const WARP: u32 = 32;

    /// Rows of the output block of one workgroup.
    pub const fn bm(self) -> u32 {
        self.wg_y * Self::TM
    }

    /// Columns of the output block of one workgroup.
    pub const fn bn(self) -> u32 {
        self.wg_x * Self::TN
    }

    /// The warp tile (`WARP_X × WARP_Y` invocations along N and M): 8 × 4, narrowed to the
    /// workgroup where it is smaller (8 × 2 for the 2-row short tiles, 4 × 8 for a 4-wide one).
    pub const fn warp(self) -> (u32, u32) {
        let x = if self.wg_x < 8 { self.wg_x } else { 8 };
        let y = Self::WARP / x;
        (x, if self.wg_y < y { self.wg_y } else { y })
    }

    /// Row length of the staged slab of A in vec4s (`ROW_A4`): BM / 4, unpadded (the
    /// staging order avoids bank conflicts instead, see [`layout`]).
    pub const fn row_a4(self) -> u32 {
        self.bm() / 4
    }

    /// Row length of the staged slab of B in vec4s (`ROW_B4`): BN / 4.
    pub const fn row_b4(self) -> u32 {
        self.bn() / 4
    }

    /// Workgroup storage of the two staged slabs, bytes.
    pub const fn workgroup_bytes(self) -> u32 {
        16 * self.bk * (self.row_a4() + self.row_b4())
    }

    /// Whether `matmul.wgsl` can run this tile within the WebGPU minimum limits: at most 256
    /// invocations and 16 KiB of workgroup storage, BK a multiple of 4, at most `MAX_LOADS`
    /// staged vec4s per operand and invocation, and a warp tile that divides the workgroup.
    pub const fn is_valid(self) -> bool {
        let (wx, wy) = self.warp();
        self.wg_x > 0
            && self.wg_y > 0
            && self.bk >= 4
            && self.bk.is_multiple_of(4)
            && self.invocations() <= 256
            && self.workgroup_bytes() <= 16 * 1024
            && self.loads_per_invocation() <= 8
            && self.wg_x.is_multiple_of(wx)
            && self.wg_y.is_multiple_of(wy)
    }
}

/// The switches a matmul pipeline is specialised to (`override` constants of `matmul.wgsl`):
/// each distinct set is its own pipeline, so the kernel carries no branches on them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MatmulSwitches {
    /// A is stored transposed (`TRANS_A`).
    pub trans_a: bool,
    /// B is stored transposed (`TRANS_B`).
    pub trans_b: bool,
    /// A bias row is added (`HAS_BIAS`).
    pub bias: bool,
    /// `beta · C` is added (`HAS_C`).
    pub c: bool,
    /// The activation code (`ACT`, [`crate::Activation::code`]).
    pub act: u32,
}

impl MatmulSwitches {
    /// The switches of `desc`.
    pub fn of(desc: &MatmulDesc) -> MatmulSwitches {
        MatmulSwitches {
            trans_a: desc.trans_a,
            trans_b: desc.trans_b,
            bias: desc.bias_offset.is_some(),
            c: desc.c.is_some(),
            act: desc.activation.code(),
        }
    }

    fn overrides(self) -> [(&'static str, f64); 5] {
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        [
            ("TRANS_A", flag(self.trans_a)),
            ("TRANS_B", flag(self.trans_b)),
            ("HAS_BIAS", flag(self.bias)),
            ("HAS_C", flag(self.c)),
            ("ACT", f64::from(self.act)),
        ]
    }
}

/// Invocations per workgroup of the 1-D kernels (conv, activation, copy): 64, two 32-wide
/// subgroups on most GPUs; these kernels are memory-bound, larger groups buy nothing.
pub const WG_1D: u32 = 64;
/// Elements (conv: outputs; copy: 32-bit words) one invocation of a 1-D kernel handles.
pub const ITEMS_PER_INVOCATION: u32 = 4;
/// Products with at most this many rows take [`Kernel::MatmulSmallM`]: one 4-row register
/// tile covers them, so workgroup-memory staging has nothing to share.
pub const SMALL_M_ROWS: usize = 4;
/// Columns one invocation of [`Kernel::MatmulSmallM`] computes (one vec4).
pub const SMALL_M_COLS: u32 = 4;
/// Invocations per workgroup of [`Kernel::MatmulSmallM`] (`WG_N`): 64, two 32-wide subgroups;
/// each owns 4 columns, so a workgroup covers 256 columns.
pub const SMALL_M_WG: u32 = 64;
/// Invocations per workgroup of the naive matmul along x and y.
pub const NAIVE_WG: u32 = 16;

/// One composed WGSL module.
#[derive(Clone, Debug, PartialEq)]
pub struct WgslModule {
    /// `<kernel>_<storage>` (or `copy`).
    pub name: String,
    /// The kernel.
    pub kernel: Kernel,
    /// The storage variant (`None` for the dtype-free copy).
    pub storage: Option<ElementStorage>,
    /// The full source text as compiled.
    pub source: String,
    /// Whether it needs `enable f16` (the `SHADER_F16` feature).
    pub needs_f16: bool,
    /// The entry point.
    pub entry_point: &'static str,
    /// Values of the `override` constants (part of the pipeline-cache key).
    pub overrides: Vec<(&'static str, f64)>,
    /// Workgroup storage the module uses, bytes (checked against the device limit).
    pub workgroup_bytes: u32,
    /// The workgroup size the overrides give (checked against the device limits).
    pub workgroup_size: [u32; 3],
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    ReadWrite,
}

/// A tensor binding of a module: name, binding slot, access; `alias` names the binding that
/// really holds it (in place: `x` is read from `out`).
struct Binding {
    name: &'static str,
    slot: u32,
    access: Access,
    alias: Option<&'static str>,
}

const fn read(name: &'static str, slot: u32) -> Binding {
    Binding { name, slot, access: Access::Read, alias: None }
}

const fn write(name: &'static str, slot: u32) -> Binding {
    Binding { name, slot, access: Access::ReadWrite, alias: None }
}

fn bindings(kernel: Kernel) -> Vec<Binding> {
    match kernel {
        Kernel::Matmul
        | Kernel::MatmulF16x2
        | Kernel::MatmulSmallM
        | Kernel::Gemv
        | Kernel::GemvSubgroup
        | Kernel::MatmulCoop(_) => {
            vec![read("a", 0), read("b", 1), read("bias", 2), read("c", 3), write("out", 4)]
        }
        // The weight planes are declared in `qmatmul.wgsl` itself (raw words, any dtype).
        Kernel::QuantGemv(_) | Kernel::QuantGemvSubgroup(_) | Kernel::QuantMatmul(_) => {
            vec![read("a", 0), read("bias", 2), read("c", 3), write("out", 4)]
        }
        Kernel::MatmulNaive => vec![read("a", 0), read("b", 1), write("out", 2)],
        Kernel::DepthwiseConv2d | Kernel::DepthwiseTiled => {
            vec![read("input", 0), read("weight", 1), read("bias", 2), write("out", 3)]
        }
        Kernel::Activation => vec![read("x", 0), read("bias", 1), write("out", 2)],
        Kernel::ActivationInPlace => vec![
            Binding { name: "x", slot: 0, access: Access::Read, alias: Some("out") },
            read("bias", 1),
            write("out", 2),
        ],
        Kernel::Copy => Vec::new(),
        Kernel::Glu => vec![read("h", 0), write("out", 1)],
        Kernel::InvertedResidual => vec![
            read("x", 0),
            read("we", 1),
            read("be", 2),
            read("wd", 3),
            read("bd", 4),
            read("wp", 5),
            read("bp", 6),
            write("out", 7),
        ],
    }
}

/// The storage prelude of `kernel` in `storage`: bindings and accessors (see the module
/// documentation).
fn prelude(kernel: Kernel, storage: ElementStorage) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let (to_f32, from_f32) = match storage {
        ElementStorage::Bf16Packed => ("f32_from_bf16_bits", "bf16_bits_from_f32"),
        _ => ("f32_from_f16_bits", "f16_bits_from_f32"),
    };
    let _ = writeln!(s, "// Storage prelude: {} elements.", storage.name());
    for b in bindings(kernel) {
        let n = b.name;
        if let Some(target) = b.alias {
            let _ = writeln!(s, "fn ld_{n}(i: u32) -> f32 {{ return ld_{target}(i); }}");
            let _ = writeln!(s, "fn ld4_{n}(v: u32) -> vec4<f32> {{ return ld4_{target}(v); }}");
            continue;
        }
        let slot = b.slot;
        let rw = b.access == Access::ReadWrite;
        let mode = if rw { "read_write" } else { "read" };
        match storage {
            ElementStorage::F32 | ElementStorage::F16 => {
                let (elem, widen, widen4) =
                    if storage == ElementStorage::F32 { ("f32", "", "") } else { ("f16", "f32", "vec4<f32>") };
                let _ = writeln!(s, "@group(0) @binding({slot}) var<storage, {mode}> {n}: array<vec4<{elem}>>;");
                let _ = writeln!(s, "fn ld_{n}(i: u32) -> f32 {{ return {widen}({n}[i >> 2u][i & 3u]); }}");
                let _ = writeln!(s, "fn ld4_{n}(v: u32) -> vec4<f32> {{ return {widen4}({n}[v]); }}");
                if rw {
                    if storage == ElementStorage::F32 {
                        let _ = writeln!(s, "fn st_{n}(i: u32, x: f32) {{ {n}[i >> 2u][i & 3u] = x; }}");
                        let _ = writeln!(s, "fn st4_{n}(v: u32, x: vec4<f32>) {{ {n}[v] = x; }}");
                    } else {
                        // Rounded to nearest even by the bit-exact conversion first, so the
                        // final f16() conversion is exact whatever rounding the device uses
                        // (WGSL lets it pick either neighbour).
                        let _ = writeln!(
                            s,
                            "fn st_{n}(i: u32, x: f32) {{ {n}[i >> 2u][i & 3u] = f16(f32_from_f16_bits(f16_bits_from_f32(x))); }}"
                        );
                        let _ = writeln!(
                            s,
                            "fn st4_{n}(v: u32, x: vec4<f32>) {{\n    let r = vec4<f32>(f32_from_f16_bits(f16_bits_from_f32(x.x)), f32_from_f16_bits(f16_bits_from_f32(x.y)),\n        f32_from_f16_bits(f16_bits_from_f32(x.z)), f32_from_f16_bits(f16_bits_from_f32(x.w)));\n    {n}[v] = vec4<f16>(r);\n}}"
                        );
                    }
                }
            }
            ElementStorage::F16Packed | ElementStorage::Bf16Packed => {
                if rw {
                    let _ = writeln!(s, "@group(0) @binding({slot}) var<storage, read_write> {n}: array<atomic<u32>>;");
                    let _ = writeln!(
                        s,
                        "fn ld_{n}(i: u32) -> f32 {{ return {to_f32}((atomicLoad(&{n}[i >> 1u]) >> ((i & 1u) * 16u)) & 0xffffu); }}"
                    );
                    let _ = writeln!(
                        s,
                        "fn ld4_{n}(v: u32) -> vec4<f32> {{\n    let w0 = atomicLoad(&{n}[2u * v]);\n    let w1 = atomicLoad(&{n}[2u * v + 1u]);\n    return vec4<f32>({to_f32}(w0 & 0xffffu), {to_f32}(w0 >> 16u), {to_f32}(w1 & 0xffffu), {to_f32}(w1 >> 16u));\n}}"
                    );
                    let _ = writeln!(
                        s,
                        "fn st_{n}(i: u32, x: f32) {{\n    let sh = (i & 1u) * 16u;\n    atomicAnd(&{n}[i >> 1u], ~(0xffffu << sh));\n    atomicOr(&{n}[i >> 1u], {from_f32}(x) << sh);\n}}"
                    );
                    let _ = writeln!(
                        s,
                        "fn st4_{n}(v: u32, x: vec4<f32>) {{\n    atomicStore(&{n}[2u * v], {from_f32}(x.x) | ({from_f32}(x.y) << 16u));\n    atomicStore(&{n}[2u * v + 1u], {from_f32}(x.z) | ({from_f32}(x.w) << 16u));\n}}"
                    );
                } else {
                    let _ = writeln!(s, "@group(0) @binding({slot}) var<storage, read> {n}: array<vec2<u32>>;");
                    let _ = writeln!(
                        s,
                        "fn ld_{n}(i: u32) -> f32 {{ return {to_f32}(({n}[i >> 2u][(i >> 1u) & 1u] >> ((i & 1u) * 16u)) & 0xffffu); }}"
                    );
                    let _ = writeln!(
                        s,
                        "fn ld4_{n}(v: u32) -> vec4<f32> {{\n    let w = {n}[v];\n    return vec4<f32>({to_f32}(w.x & 0xffffu), {to_f32}(w.x >> 16u), {to_f32}(w.y & 0xffffu), {to_f32}(w.y >> 16u));\n}}"
                    );
                }
            }
        }
    }
    s
}

/// First line of the generated block at the end of each kernel file.
const GENERATED_BEGIN: &str = "// ---- BEGIN GENERATED";
/// Last line of the generated block.
const GENERATED_END: &str = "// ---- END GENERATED ----";

/// Splits a kernel file into the hand-written kernel and its generated block (empty when the
/// file has none).
fn split_generated(file: &str) -> (&str, &str) {
    match file.find(GENERATED_BEGIN) {
        Some(start) => (&file[..start], &file[start..]),
        None => (file, ""),
    }
}

/// The generated block of `kernel` in `storage`: `common.wgsl` and the storage prelude, framed
/// by the marker lines. Each kernel file ends with its f32 block so that it is valid WGSL as it
/// stands (editors and naga can check it); [`module`] replaces that block with the one of the
/// variant it builds. A test keeps the files' blocks in sync with this function
/// (`TILEKIT_BLESS=1 cargo test -p tilekit-kernels` rewrites them).
pub fn generated_block(kernel: Kernel, storage: ElementStorage) -> String {
    let mut s = String::new();
    s.push_str(GENERATED_BEGIN);
    s.push_str(": common.wgsl and the storage prelude (crates/kernels/src/catalogue/wgsl.rs) ----\n");
    s.push_str("// Do not edit: the catalogue replaces this block with the one of the dtype variant it builds;\n");
    s.push_str("// here it holds the f32 variant so that this file is valid WGSL on its own.\n\n");
    s.push_str(COMMON);
    if kernel.is_typed() {
        s.push('\n');
        s.push_str(&prelude(kernel, storage));
    }
    s.push_str(GENERATED_END);
    s
}

/// The launch specialisation of a module: the values of its shape `override` constants. The
/// WGSL text does not depend on it, only the overrides (and so the pipeline) do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Spec {
    /// Tile of [`Kernel::Matmul`] (`WG_X`, `WG_Y`, `BK`).
    pub tile: MatmulTile,
    /// Rows of [`Kernel::MatmulSmallM`] (`SM_ROWS`, 1 to 4): the register tile covers exactly
    /// M rows, so a matrix-vector product does no wasted FMAs.
    pub rows: u32,
    /// Invocations per workgroup of [`Kernel::MatmulSmallM`] (`WG_N`) and of
    /// [`Kernel::DepthwiseConv2d`] (`WG`); the other kernels keep [`WG_1D`].
    pub wg: u32,
    /// The switches of both matmul kernels (the backends set them per product with
    /// [`Spec::with_switches`]; the tuner's candidates carry the defaults).
    pub switches: MatmulSwitches,
}

impl Spec {
    /// The default tiles.
    pub const DEFAULT: Spec = Spec {
        tile: MatmulTile::DEFAULT,
        rows: SMALL_M_ROWS as u32,
        wg: WG_1D,
        switches: MatmulSwitches { trans_a: false, trans_b: false, bias: false, c: false, act: 0 },
    };

    /// This spec specialised to the switches of `desc` (transposes, bias, C, activation).
    pub fn with_switches(self, desc: &MatmulDesc) -> Spec {
        Spec { switches: MatmulSwitches::of(desc), ..self }
    }

    /// This spec with the fields `kernel` does not use reset to the default, so equal modules
    /// have equal specs (the pipeline-cache key).
    pub fn normalised(self, kernel: Kernel) -> Spec {
        match kernel {
            Kernel::Matmul | Kernel::MatmulF16x2 => Spec { rows: Spec::DEFAULT.rows, wg: Spec::DEFAULT.wg, ..self },
            Kernel::MatmulSmallM => Spec { tile: MatmulTile::DEFAULT, rows: self.rows.clamp(1, 4), ..self },
            Kernel::Gemv | Kernel::GemvSubgroup => {
                Spec { tile: MatmulTile::DEFAULT, rows: self.rows.clamp(1, gemv::GEMV_ROWS as u32), ..self }
            }
            // The quantized kernels read their switches from the parameter block.
            Kernel::QuantGemv(_) | Kernel::QuantGemvSubgroup(_) => {
                Spec { rows: self.rows.clamp(1, qmatmul::QGEMV_ROWS as u32), wg: self.wg, ..Spec::DEFAULT }
            }
            Kernel::DepthwiseConv2d => Spec { wg: self.wg, ..Spec::DEFAULT },
            Kernel::InvertedResidual => Spec { wg: self.wg.clamp(1, BLOCK_MAX_ACC), ..Spec::DEFAULT },
            // The workgroup (4 subgroups) and the switches.
            Kernel::MatmulCoop(_) => Spec { wg: self.wg, switches: self.switches, ..Spec::DEFAULT },
            _ => Spec::DEFAULT,
        }
    }

    /// A short label for tables and traces (`128x128/bk8 (16x16 inv)`, `wg128`); the switches
    /// are not part of it (every product of a tuning key has the same ones).
    pub fn label(self, kernel: Kernel) -> String {
        match kernel {
            Kernel::Matmul | Kernel::MatmulF16x2 => format!(
                "{}x{}/bk{} ({}x{} inv)",
                self.tile.bm(),
                self.tile.bn(),
                self.tile.bk,
                self.tile.wg_x,
                self.tile.wg_y
            ),
            Kernel::MatmulSmallM => format!("small-m wg{}", self.wg),
            Kernel::Gemv | Kernel::GemvSubgroup => format!("gemv wg{}", self.wg),
            Kernel::DepthwiseConv2d if self.wg == DW_TILED => "tiled".to_string(),
            Kernel::QuantGemv(_) | Kernel::QuantGemvSubgroup(_) => format!("qgemv wg{}", self.wg),
            Kernel::QuantMatmul(_) => "64x64/bk32 (16x16 inv)".to_string(),
            Kernel::MatmulCoop(s) => format!("coop {0}x{0}, {1}x{1} blocks, wg{2}", s.edge(), s.block(), self.wg),
            Kernel::DepthwiseConv2d => format!("wg{}", self.wg),
            _ => "default".to_string(),
        }
    }
}

/// Tiles the autotuner tries for [`Kernel::Matmul`] with more than 16 rows; the first is the
/// default. All keep 8 × 8 register tiles and pass [`MatmulTile::is_valid`]: blocks of
/// 64 to 256 rows and columns, 64 to 256 invocations, BK 4 to 16.
pub const MATMUL_TILE_CANDIDATES: [MatmulTile; 8] = [
    MatmulTile::DEFAULT,
    MatmulTile { wg_x: 16, wg_y: 16, bk: 16 },
    MatmulTile { wg_x: 8, wg_y: 8, bk: 16 },
    MatmulTile { wg_x: 8, wg_y: 8, bk: 8 },
    MatmulTile { wg_x: 16, wg_y: 8, bk: 16 },
    MatmulTile { wg_x: 8, wg_y: 16, bk: 16 },
    MatmulTile { wg_x: 32, wg_y: 8, bk: 8 },
    MatmulTile { wg_x: 8, wg_y: 32, bk: 8 },
];
/// Tiles the autotuner tries for 4 < M <= 16 (16-row blocks of 128 to 512 columns); the first
/// is the default.
pub const MATMUL_SHORT_TILE_CANDIDATES: [MatmulTile; 4] = [
    MatmulTile::SHORT,
    MatmulTile { wg_x: 16, wg_y: 2, bk: 8 },
    MatmulTile { wg_x: 32, wg_y: 2, bk: 4 },
    MatmulTile { wg_x: 64, wg_y: 2, bk: 4 },
];
/// Workgroup sizes the autotuner tries for [`Kernel::MatmulSmallM`] and
/// [`Kernel::DepthwiseConv2d`]; the first is the default.
pub const WG_CANDIDATES: [u32; 3] = [64, 128, 256];

/// The kernel and the candidate specs (default first) for a matmul with `m` rows: the GEMV
/// kernel with each workgroup size for M <= [`gemv::GEMV_ROWS`] (the backends take
/// [`Kernel::GemvSubgroup`] where the device has subgroups), else the tiled kernel with each
/// tile. The previous small-M choices stay reachable through [`skinny_candidates`].
pub fn matmul_candidates(m: usize) -> (Kernel, Vec<Spec>) {
    if m <= gemv::GEMV_ROWS { (Kernel::Gemv, gemv::candidates(m)) } else { skinny_candidates(m) }
}

/// What [`matmul_candidates`] chose before the GEMV kernel: the small-M kernel for
/// M <= [`SMALL_M_ROWS`], the 16-row tiles for M <= 16, else the tiled kernel (kept for the
/// bench's comparison with the GEMV kernel).
pub fn skinny_candidates(m: usize) -> (Kernel, Vec<Spec>) {
    if m <= SMALL_M_ROWS {
        let rows = m.clamp(1, SMALL_M_ROWS) as u32;
        (Kernel::MatmulSmallM, WG_CANDIDATES.iter().map(|&wg| Spec { rows, wg, ..Spec::DEFAULT }).collect())
    } else {
        let tiles: &[MatmulTile] = if m <= 16 { &MATMUL_SHORT_TILE_CANDIDATES } else { &MATMUL_TILE_CANDIDATES };
        (Kernel::Matmul, tiles.iter().map(|&tile| Spec { tile, ..Spec::DEFAULT }).collect())
    }
}

/// The [`Spec::wg`] that stands for [`Kernel::DepthwiseTiled`] among the depthwise candidates
/// (the tuner times the tiled kernel against the general one at each workgroup size).
pub const DW_TILED: u32 = 0;

/// The candidate specs of the depthwise convolution: the tiled kernel ([`DW_TILED`]) and the
/// general one at each of [`WG_CANDIDATES`] (NHWC's order, see [`conv_candidates_for`]).
pub fn conv_candidates() -> Vec<Spec> {
    conv_candidates_for(true, crate::Layout::Nhwc)
}

/// The depthwise candidates for a convolution in `layout`, the tiled kernel only where it
/// applies (`tiled`: a [`DwTiledPlan`] covers it); the first is the untuned default. NHWC
/// defaults to the tiled kernel and NCHW to the general one at 64 invocations: on lavapipe
/// (the one device measured so far, `cargo xtask bench --suite mobilenet`) the tiled kernel
/// ran MobileNetV2's NHWC layers 1.1–3.4× faster than the general one in two runs, while its
/// NCHW layers came out at 0.23–1.33× — no better than the 0.28–1.25× spread of the general
/// kernel against itself in one run — and its 8 × 32 tile leaves most invocations idle on the
/// 7² and 14² planes. The tuner times both wherever it runs.
pub fn conv_candidates_for(tiled: bool, layout: crate::Layout) -> Vec<Spec> {
    let tiled = tiled.then_some(Spec { wg: DW_TILED, ..Spec::DEFAULT });
    let general = WG_CANDIDATES.iter().map(|&wg| Spec { wg, ..Spec::DEFAULT });
    match layout {
        crate::Layout::Nhwc => tiled.into_iter().chain(general).collect(),
        crate::Layout::Nchw => general.chain(tiled).collect(),
    }
}

/// A stable 64-bit FNV-1a hash of the source of `kernel` in `storage` (the text does not
/// depend on the spec). The autotuner stores it with each result, so a result tuned for other
/// kernel sources is never reused.
pub fn source_hash(kernel: Kernel, storage: ElementStorage) -> u64 {
    let m = module(kernel, storage);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in m.source.bytes().chain(m.entry_point.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The module of `kernel` in `storage` (ignored for [`Kernel::Copy`]) with the default tiles.
pub fn module(kernel: Kernel, storage: ElementStorage) -> WgslModule {
    module_with(kernel, storage, Spec::DEFAULT)
}

/// The module of `kernel` in `storage` specialised by `spec` (see [`Spec`]).
pub fn module_with(kernel: Kernel, storage: ElementStorage, spec: Spec) -> WgslModule {
    let spec = spec.normalised(kernel);
    let storage = kernel.only_storage().unwrap_or(storage);
    let tile = spec.tile;
    let (body, entry_point, overrides, workgroup_bytes): (&str, &'static str, Vec<(&'static str, f64)>, u32) =
        match kernel {
            Kernel::Matmul => {
                let (warp_x, warp_y) = tile.warp();
                let mut o = vec![
                    ("WG_X", f64::from(tile.wg_x)),
                    ("WG_Y", f64::from(tile.wg_y)),
                    ("BK", f64::from(tile.bk)),
                    ("WARP_X", f64::from(warp_x)),
                    ("WARP_Y", f64::from(warp_y)),
                ];
                o.extend(spec.switches.overrides());
                (MATMUL, "matmul", o, tile.workgroup_bytes())
            }
            Kernel::MatmulF16x2 => {
                let mut o = f16x2::tile_overrides(tile);
                o.extend(spec.switches.overrides());
                (MATMUL_F16X2, "matmul_f16x2", o, f16x2::workgroup_bytes(tile))
            }
            Kernel::MatmulSmallM => {
                let mut o = vec![("WG_N", f64::from(spec.wg)), ("SM_ROWS", f64::from(spec.rows))];
                o.extend(spec.switches.overrides());
                (MATMUL, "matmul_small_m", o, 0)
            }
            Kernel::MatmulNaive => {
                (MATMUL_NAIVE, "matmul_naive", vec![("WG_X", NAIVE_WG as f64), ("WG_Y", NAIVE_WG as f64)], 0)
            }
            Kernel::DepthwiseConv2d => (DEPTHWISE_CONV2D, "depthwise_conv2d", vec![("WG", spec.wg as f64)], 0),
            Kernel::DepthwiseTiled => (DEPTHWISE_CONV2D, "depthwise_tiled", Vec::new(), DW_TILED_WORKGROUP_BYTES),
            Kernel::Activation | Kernel::ActivationInPlace => (ACTIVATION, "activation", vec![("WG", WG_1D as f64)], 0),
            Kernel::Copy => (COPY, "copy", vec![("WG", WG_1D as f64)], 0),
            Kernel::Gemv | Kernel::GemvSubgroup => {
                let mut o = gemv::overrides(spec);
                o.extend(spec.switches.overrides());
                let entry = if kernel == Kernel::Gemv { "gemv" } else { "gemv_subgroup" };
                (GEMV, entry, o, gemv::workgroup_bytes(spec.wg))
            }
            Kernel::Glu => (GLU, "glu", vec![("WG", WG_1D as f64)], 0),
            Kernel::InvertedResidual => (
                INVERTED_RESIDUAL,
                "inverted_residual",
                vec![("ACC", f64::from(spec.wg.clamp(1, BLOCK_MAX_ACC)))],
                BLOCK_WORKGROUP_BYTES,
            ),
            Kernel::QuantGemv(_) | Kernel::QuantGemvSubgroup(_) => {
                let entry = if matches!(kernel, Kernel::QuantGemv(_)) { "qgemv" } else { "qgemv_subgroup" };
                (QMATMUL, entry, qmatmul::overrides(kernel, spec), gemv::workgroup_bytes(spec.wg))
            }
            Kernel::QuantMatmul(_) => {
                (QMATMUL, "qmatmul", qmatmul::overrides(kernel, spec), qmatmul::QMATMUL_WORKGROUP_BYTES)
            }
            Kernel::MatmulCoop(size) => {
                (MATMUL_COOPMAT, "matmul_coopmat", coopmat::overrides(spec), size.workgroup_bytes())
            }
        };
    let typed = kernel.is_typed();
    // The cooperative kernel's file starts with its own `enable f16;` (its tiles are f16).
    let needs_f16 = typed && (storage.needs_f16() || kernel.needs_cooperative_matrix());
    let (kernel_text, _) = split_generated(body);
    let mut source = String::new();
    if needs_f16 && !kernel.needs_cooperative_matrix() {
        source.push_str("enable f16;\n\n");
    }
    match kernel {
        Kernel::Gemv | Kernel::GemvSubgroup => source.push_str(&gemv::text(kernel, kernel_text)),
        Kernel::QuantGemv(_) | Kernel::QuantGemvSubgroup(_) | Kernel::QuantMatmul(_) => {
            source.push_str(&qmatmul::text(kernel, kernel_text));
        }
        Kernel::MatmulCoop(size) => source.push_str(&coopmat::text(size, kernel_text)),
        Kernel::MatmulF16x2 => source.push_str(f16x2::text(kernel_text)),
        _ => source.push_str(kernel_text),
    }
    source.push_str(&generated_block(kernel, storage));
    source.push('\n');
    let name = if typed { format!("{}_{}", kernel.name(), storage.name()) } else { kernel.name().to_string() };
    let workgroup_size = match kernel {
        Kernel::Matmul | Kernel::MatmulF16x2 => [tile.wg_x, tile.wg_y, 1],
        Kernel::MatmulSmallM
        | Kernel::DepthwiseConv2d
        | Kernel::Gemv
        | Kernel::GemvSubgroup
        | Kernel::QuantGemv(_)
        | Kernel::QuantGemvSubgroup(_)
        | Kernel::MatmulCoop(_) => [spec.wg, 1, 1],
        Kernel::QuantMatmul(_) => qmatmul::QMATMUL_WG,
        Kernel::MatmulNaive => [NAIVE_WG, NAIVE_WG, 1],
        Kernel::InvertedResidual => [BLOCK_WG, 1, 1],
        _ => [WG_1D, 1, 1],
    };
    WgslModule {
        name,
        kernel,
        storage: typed.then_some(storage),
        source,
        needs_f16,
        entry_point,
        overrides,
        workgroup_bytes,
        workgroup_size,
    }
}

/// Every module the catalogue can build (each typed kernel in each of its storage variants,
/// [`Kernel::storages`], and the copy once), for validation with naga.
pub fn all_modules() -> Vec<WgslModule> {
    let mut v = Vec::new();
    for kernel in Kernel::ALL {
        if kernel.is_typed() {
            v.extend(kernel.storages().iter().map(|&s| module(kernel, s)));
        } else {
            v.push(module(kernel, ElementStorage::F32));
        }
    }
    v
}

/// Flags of [`MatmulParams::flags`] (`matmul.wgsl`).
pub mod matmul_flags {
    /// A's view is 16-byte aligned (offset, batch stride, ld multiples of 4): vec4 loads.
    pub const A_VEC: u32 = 1;
    /// B's view is 16-byte aligned.
    pub const B_VEC: u32 = 2;
    /// The output view is 16-byte aligned: vec4 stores.
    pub const O_VEC: u32 = 4;
    /// Round A and B to bf16 before multiplying (`Precision::Bf16`).
    pub const PREC_BF16: u32 = 8;
    /// A bias is added.
    pub const HAS_BIAS: u32 = 16;
    /// `beta · C` is added.
    pub const HAS_C: u32 = 32;
}

/// The parameter block of `matmul.wgsl` and `matmul_naive.wgsl` (a uniform; 96 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[allow(missing_docs)] // The fields mirror `MatmulDesc` field for field.
pub struct MatmulParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub flags: u32,
    pub a_off: u32,
    pub a_ld: u32,
    pub a_bs: u32,
    pub trans_a: u32,
    pub b_off: u32,
    pub b_ld: u32,
    pub b_bs: u32,
    pub trans_b: u32,
    pub c_off: u32,
    pub c_ld: u32,
    pub c_bs: u32,
    pub bias_off: u32,
    pub o_off: u32,
    pub o_ld: u32,
    pub o_bs: u32,
    pub act: u32,
    pub alpha: f32,
    pub beta: f32,
    /// First batch of this launch (batches are split over launches of at most 65535).
    pub batch_base: u32,
    pub _pad: u32,
}

/// Flags of [`ConvParams::flags`] (`depthwise_conv2d.wgsl`).
pub mod conv_flags {
    /// A bias is added.
    pub const HAS_BIAS: u32 = 1;
    /// NHWC with multiplier 1 and C a multiple of 4: vec4 input loads.
    pub const IN_VEC: u32 = 2;
    /// The 4 outputs of an invocation are one aligned vec4 (OW or C·m a multiple of 4).
    pub const OUT_VEC: u32 = 4;
    /// Tiled NHWC with pre-packed weights (`w_ch` = 1), C·m and the weight offset multiples
    /// of 4: the taps of 4 channels are one vec4 load.
    pub const W_VEC: u32 = 8;
}

/// The parameter block of `depthwise_conv2d.wgsl` (a uniform; 128 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[allow(missing_docs)] // The fields mirror `Conv2dDesc`.
pub struct ConvParams {
    pub batch: u32,
    pub channels: u32,
    pub height: u32,
    pub width: u32,
    pub mult: u32,
    pub kh: u32,
    pub kw: u32,
    pub stride_h: u32,
    pub stride_w: u32,
    pub dil_h: u32,
    pub dil_w: u32,
    pub pad_top: u32,
    pub pad_left: u32,
    pub out_h: u32,
    pub out_w: u32,
    pub out_c: u32,
    /// 0 for NCHW, 1 for NHWC.
    pub nhwc: u32,
    pub flags: u32,
    pub act: u32,
    /// Invocations that do work (groups of 4 outputs).
    pub items: u32,
    /// Element offsets inside the bindings of input, weight, bias and output (0 unless a
    /// split convolution binds windows of its buffers).
    pub in_off: u32,
    pub w_off: u32,
    pub b_off: u32,
    pub o_off: u32,
    /// Weight strides: element (oc, tap) is at `w_off + oc·w_ch + tap·w_tap` (`[C·m, 1, kh, kw]`:
    /// w_ch = kh·kw, w_tap = 1; pre-packed `[kh, kw, C·m]`: w_ch = 1, w_tap = C·m).
    pub w_tap: u32,
    pub w_ch: u32,
    /// [`Kernel::DepthwiseTiled`] only ([`DwTiledPlan`]): output rows per tile, the staged
    /// patch's rows and width (NCHW: vec4s; NHWC: pixels), the first z of the launch and the
    /// 16-channel blocks per image (NHWC).
    pub tile_h: u32,
    pub patch_h: u32,
    pub patch_w: u32,
    pub z_base: u32,
    pub c_blocks: u32,
    pub _pad: u32,
}

/// Workgroup storage of [`Kernel::DepthwiseTiled`]: the patch (768 vec4<f32>) and the taps
/// (256 vec4<f32>), 16 KiB, the WebGPU minimum.
pub const DW_TILED_WORKGROUP_BYTES: u32 = (DW_PATCH_VEC4 + 256) * 16;
/// Capacity of the tiled kernel's patch in vec4<f32> (`PATCH_VEC4` in `depthwise_conv2d.wgsl`).
pub const DW_PATCH_VEC4: u32 = 768;

/// How [`Kernel::DepthwiseTiled`] covers a convolution: tile and patch sizes and the grid, or
/// `None` from [`DwTiledPlan::new`] where it does not apply (the general kernel runs then).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DwTiledPlan {
    /// Output rows per tile.
    pub tile_h: u32,
    /// Staged patch rows.
    pub patch_h: u32,
    /// Staged patch width: vec4s of columns (NCHW) or pixels (NHWC).
    pub patch_w: u32,
    /// Channel blocks of 16 per image (NHWC; 1 in NCHW).
    pub c_blocks: u32,
    /// Workgroups along x (column tiles) and y (row tiles).
    pub grid_xy: [u32; 2],
    /// Workgroups along z in all: images × output channels (NCHW) or × channel blocks (NHWC);
    /// split over launches of at most the z limit.
    pub z: u64,
}

impl DwTiledPlan {
    /// Output columns of an NCHW tile (8 vec4s).
    pub const NCHW_TILE_W: usize = 32;
    /// Output rows of an NCHW tile.
    pub const NCHW_TILE_H: usize = 8;
    /// Output columns of an NHWC tile.
    pub const NHWC_TILE_W: usize = 8;
    /// Channels of an NHWC tile.
    pub const NHWC_TILE_C: usize = 16;

    /// The plan for `desc`, or `None` where the tiled kernel does not apply: NHWC with a
    /// multiplier above 1, more taps than the staged taps hold (256 NCHW, 64 NHWC), a patch
    /// over [`DW_PATCH_VEC4`] even with 1-row tiles (NHWC) or 8-row tiles (NCHW), padded
    /// extents past `i32`, or tile counts over `max_xy` workgroups per dimension.
    pub fn new(desc: &crate::Conv2dDesc, max_xy: u32) -> Option<DwTiledPlan> {
        let (oh, ow) = (desc.out_h()?, desc.out_w()?);
        let taps = desc.kernel_h.checked_mul(desc.kernel_w)?;
        let i31 = |v: usize| v <= i32::MAX as usize;
        let padded_h = desc.height.checked_add(desc.pad_top)?.checked_add(desc.pad_bottom)?;
        let padded_w = desc.width.checked_add(desc.pad_left)?.checked_add(desc.pad_right)?;
        if !i31(padded_h) || !i31(padded_w) {
            return None;
        }
        let span = |tile: usize, stride: usize, k: usize, dil: usize| -> Option<usize> {
            (tile - 1).checked_mul(stride)?.checked_add((k - 1).checked_mul(dil)?)?.checked_add(1)
        };
        let cap = DW_PATCH_VEC4 as usize;
        let (tile_h, patch_h, patch_w, c_blocks, tile_w) = match desc.layout {
            crate::Layout::Nchw => {
                if taps > 256 {
                    return None;
                }
                let th = Self::NCHW_TILE_H;
                let ph = span(th, desc.stride_h, desc.kernel_h, desc.dilation_h)?;
                // Up to 3 columns before the first one the tile reaches (alignment).
                let pw4 =
                    span(Self::NCHW_TILE_W, desc.stride_w, desc.kernel_w, desc.dilation_w)?.checked_add(3)?.div_ceil(4);
                if ph.checked_mul(pw4)? > cap {
                    return None;
                }
                (th, ph, pw4, 1, Self::NCHW_TILE_W)
            }
            crate::Layout::Nhwc => {
                if desc.multiplier != 1 || taps > 64 {
                    return None;
                }
                let pw = span(Self::NHWC_TILE_W, desc.stride_w, desc.kernel_w, desc.dilation_w)?;
                let th = [8usize, 4, 2, 1].into_iter().find(|&th| {
                    span(th, desc.stride_h, desc.kernel_h, desc.dilation_h)
                        .and_then(|ph| ph.checked_mul(pw)?.checked_mul(4))
                        .is_some_and(|v| v <= cap)
                })?;
                let ph = span(th, desc.stride_h, desc.kernel_h, desc.dilation_h)?;
                (th, ph, pw, desc.channels.div_ceil(Self::NHWC_TILE_C), Self::NHWC_TILE_W)
            }
        };
        let gx = ow.div_ceil(tile_w);
        let gy = oh.div_ceil(tile_h);
        if gx > max_xy as usize || gy > max_xy as usize {
            return None;
        }
        let per_image = match desc.layout {
            crate::Layout::Nchw => desc.out_channels(),
            crate::Layout::Nhwc => c_blocks,
        };
        Some(DwTiledPlan {
            tile_h: tile_h as u32,
            patch_h: u32::try_from(patch_h).ok()?,
            patch_w: u32::try_from(patch_w).ok()?,
            c_blocks: u32::try_from(c_blocks).ok()?,
            grid_xy: [gx as u32, gy as u32],
            z: (desc.batch as u64).checked_mul(per_image as u64)?,
        })
    }
}

/// Workgroup storage of [`Kernel::InvertedResidual`]: the expanded chunk over the largest
/// footprint (153 pixels × 8 channels), the filtered chunk (32 × 8) and the chunk's
/// projection weights (160 × 8), f32: 11,040 bytes.
pub const BLOCK_WORKGROUP_BYTES: u32 = (153 * 8 + 32 * 8 + 160 * 8) * 4;
/// Invocations per workgroup of [`Kernel::InvertedResidual`]: 8 per pixel of the 32-pixel tile.
pub const BLOCK_WG: u32 = 256;
/// The most accumulators an invocation of [`Kernel::InvertedResidual`] keeps (`MAX_ACC`); the
/// pipeline's `ACC` override (carried in [`Spec::wg`]) is `ceil(min(C', 160) / 8)`.
pub const BLOCK_MAX_ACC: u32 = 20;
/// Output tile of [`Kernel::InvertedResidual`]: `BLOCK_TILE_W × BLOCK_TILE_H` pixels.
pub const BLOCK_TILE_W: u32 = 8;
/// See [`BLOCK_TILE_W`].
pub const BLOCK_TILE_H: u32 = 4;
/// Output channels per workgroup of [`Kernel::InvertedResidual`] (the grid's y): 8 lanes ×
/// [`BLOCK_MAX_ACC`], at least the C' of 16 of MobileNetV2's 17 blocks, whose tiles are
/// expanded once (the last, C' = 320, twice).
pub const BLOCK_OUT_CHANNELS: u32 = 160;

impl Spec {
    /// The spec of [`Kernel::InvertedResidual`] for `out_channels` outputs: `ACC` (in `wg`) =
    /// the accumulators an invocation needs.
    pub fn block(out_channels: usize) -> Spec {
        let acc = out_channels.clamp(1, BLOCK_OUT_CHANNELS as usize).div_ceil(8) as u32;
        Spec { wg: acc, ..Spec::DEFAULT }
    }
}

/// `BlockParams::flags` bits (`inverted_residual.wgsl`).
#[allow(missing_docs)]
pub mod block_flags {
    pub const EXPAND: u32 = 1;
    pub const EXPAND_BIAS: u32 = 2;
    pub const DW_BIAS: u32 = 4;
    pub const PROJECT_BIAS: u32 = 8;
    pub const RESIDUAL: u32 = 16;
    pub const NHWC: u32 = 32;
}

/// The parameter block of [`Kernel::InvertedResidual`] (uniform at binding 8).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[allow(missing_docs)] // The fields mirror `InvertedResidualDesc`.
pub struct BlockParams {
    pub channels: u32,
    pub height: u32,
    pub width: u32,
    pub hidden: u32,
    pub out_c: u32,
    pub stride: u32,
    pub out_h: u32,
    pub out_w: u32,
    pub tiles_w: u32,
    pub flags: u32,
    pub _pad: [u32; 2],
}

/// Flags of [`ActivationParams::flags`] (`activation.wgsl`).
pub mod activation_flags {
    /// A bias is added.
    pub const HAS_BIAS: u32 = 1;
    /// The bias length is a multiple of 4: vec4 bias loads.
    pub const BIAS_VEC: u32 = 2;
}

/// The parameter block of `activation.wgsl` (a uniform; 48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[allow(missing_docs)]
pub struct ActivationParams {
    pub len: u32,
    pub bias_len: u32,
    pub act: u32,
    pub flags: u32,
    /// Invocations that do work: `ceil(len / 4)`.
    pub items: u32,
    /// Position in the bias row of element 0 (a chunk of a larger tensor starts mid-row).
    pub bias_phase: u32,
    /// Element offset of x in its binding (0 takes the vec4 path; nonzero, element by element).
    pub x_off: u32,
    /// Element offset of out in its binding (as `x_off`).
    pub o_off: u32,
    /// Element offset of the bias in its binding (`BIAS_VEC` only where a multiple of 4).
    pub b_off: u32,
    pub _pad: [u32; 3],
}

/// Flags of [`GluParams::flags`] (`glu.wgsl`).
pub mod glu_flags {
    /// The half width F is a multiple of 4: vec4 loads and stores.
    pub const VEC: u32 = 1;
}

/// The parameter block of `glu.wgsl` (a uniform; 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GluParams {
    /// Output elements, `rows · F`.
    pub len: u32,
    /// The width F of each half of a row of `h`.
    pub f: u32,
    /// The activation code of the gate ([`crate::Activation::code`]).
    pub act: u32,
    /// [`glu_flags`].
    pub flags: u32,
    /// Invocations that do work: `ceil(len / 4)`.
    pub items: u32,
    /// Element offset of `h` in its binding (a tensor's base; [`glu_flags::VEC`] needs it a
    /// multiple of 4).
    pub h_off: u32,
    /// Element offset of `out` in its binding (likewise).
    pub o_off: u32,
    /// Padding to 32 bytes.
    pub _pad: u32,
}

/// The parameter block of `copy.wgsl` (a uniform; 16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CopyParams {
    /// Whole 32-bit words to copy.
    pub words: u32,
    /// 1 when a 16-bit element follows the whole words.
    pub tail_half: u32,
    /// Invocations that do work: `ceil((words + tail_half) / 4)`.
    pub items: u32,
    /// Padding to 16 bytes.
    pub _pad: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_is_composed_once() {
        let all = all_modules();
        // 26 kernels in every storage, the two cooperative ones and the f16x2 one in native f16,
        // the copy.
        assert_eq!(all.len(), 26 * 4 + 3 + 1);
        let mut names: Vec<&str> = all.iter().map(|m| m.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        for m in &all {
            assert_eq!(m.needs_f16, m.source.starts_with("enable f16;"), "{}", m.name);
            assert!(m.source.contains(&format!("fn {}(", m.entry_point)), "{}", m.name);
        }
    }

    /// Each kernel file ends with its f32 generated block (f16 for the cooperative kernel), up to date (`TILEKIT_BLESS=1`
    /// rewrites the blocks).
    #[test]
    fn kernel_files_carry_their_current_generated_block() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shaders/wgsl");
        let files = [
            ("matmul.wgsl", Kernel::Matmul, MATMUL),
            ("matmul_naive.wgsl", Kernel::MatmulNaive, MATMUL_NAIVE),
            ("depthwise_conv2d.wgsl", Kernel::DepthwiseConv2d, DEPTHWISE_CONV2D),
            ("activation.wgsl", Kernel::Activation, ACTIVATION),
            ("copy.wgsl", Kernel::Copy, COPY),
            ("gemv.wgsl", Kernel::GemvSubgroup, GEMV),
            ("glu.wgsl", Kernel::Glu, GLU),
            ("inverted_residual.wgsl", Kernel::InvertedResidual, INVERTED_RESIDUAL),
            ("qmatmul.wgsl", Kernel::QuantGemvSubgroup(QuantFormat::Q8_0), QMATMUL),
            ("matmul_coopmat.wgsl", Kernel::MatmulCoop(CoopSize::S16), MATMUL_COOPMAT),
        ];
        let bless = std::env::var_os("TILEKIT_BLESS").is_some();
        for (file, kernel, text) in files {
            let (body, block) = split_generated(text);
            // The cooperative kernel exists in native f16 only: its file carries that block.
            let want = format!("{}\n", generated_block(kernel, kernel.storages()[0]));
            if block != want {
                if bless {
                    std::fs::write(dir.join(file), format!("{body}{want}")).expect("rewrite the shader file");
                } else {
                    panic!("shaders/wgsl/{file}: the generated block is stale; rerun with TILEKIT_BLESS=1");
                }
            }
        }
    }

    #[test]
    fn parameter_blocks_are_uniform_sized() {
        for size in [
            size_of::<MatmulParams>(),
            size_of::<ConvParams>(),
            size_of::<ActivationParams>(),
            size_of::<CopyParams>(),
            size_of::<GluParams>(),
        ] {
            assert_eq!(size % 16, 0);
        }
        // Every preset fits the WebGPU minimums: 16 KiB of workgroup storage, 256 invocations,
        // BK a multiple of 4; and what `matmul.wgsl` needs (MAX_LOADS, whole warp tiles).
        for t in MATMUL_TILE_CANDIDATES.iter().chain(&MATMUL_SHORT_TILE_CANDIDATES).copied() {
            assert!(t.is_valid(), "{t:?}");
            assert!(t.workgroup_bytes() <= 16 * 1024, "{t:?}");
            assert!(t.invocations() <= 256, "{t:?}");
            assert_eq!(t.bk % 4, 0, "{t:?}");
            assert!(t.loads_per_invocation() <= 8, "{t:?}");
        }
        for t in MATMUL_SHORT_TILE_CANDIDATES {
            assert_eq!(t.bm(), 16, "{t:?}");
        }
        // The checks can fail: too deep a slab, too many loads, a warp tile that does not fit.
        assert!(!MatmulTile { wg_x: 16, wg_y: 16, bk: 32 }.is_valid());
        assert!(!MatmulTile { wg_x: 16, wg_y: 2, bk: 16 }.is_valid());
        assert!(!MatmulTile { wg_x: 8, wg_y: 6, bk: 8 }.is_valid());
        assert_eq!(MATMUL_TILE_CANDIDATES[0], MatmulTile::DEFAULT);
        assert_eq!(MATMUL_SHORT_TILE_CANDIDATES[0], MatmulTile::SHORT);
        assert_eq!(conv_candidates()[0].wg, DW_TILED);
        assert_eq!(conv_candidates_for(false, crate::Layout::Nhwc)[0], Spec::DEFAULT);
        assert_eq!(conv_candidates_for(true, crate::Layout::Nchw)[0], Spec::DEFAULT);
        assert_eq!(conv_candidates_for(true, crate::Layout::Nchw).len(), conv_candidates().len());
        assert_eq!(skinny_candidates(2).1[0].wg, SMALL_M_WG);
        assert_eq!(matmul_candidates(16).0, Kernel::Gemv);
        assert_eq!(matmul_candidates(17).0, Kernel::Matmul);
    }

    #[test]
    fn source_hash_is_stable_and_distinguishes_variants() {
        let a = source_hash(Kernel::Matmul, ElementStorage::F32);
        assert_eq!(a, source_hash(Kernel::Matmul, ElementStorage::F32));
        assert_ne!(a, source_hash(Kernel::Matmul, ElementStorage::Bf16Packed));
        assert_ne!(a, source_hash(Kernel::MatmulSmallM, ElementStorage::F32));
    }
}
