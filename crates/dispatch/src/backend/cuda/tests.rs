//! Host-side checks of the CUDA backend that need no GPU.

use super::driver::{map_err, probe};
use super::launch::stride_blocks;
use super::*;
use cudarc::driver::{DriverError, sys};

/// On a machine without a CUDA driver (CI) the probe and the constructor must say why,
/// without panicking; on a machine with one they must agree with each other.
#[test]
fn probe_reports_instead_of_panicking() {
    match probe() {
        Err(reason) => {
            assert!(!reason.is_empty());
            match CudaBackend::new(0) {
                Err(Error::BackendUnavailable { backend: BackendKind::Cuda, reason: r }) => assert_eq!(r, reason),
                other => panic!("expected BackendUnavailable, got {other:?}"),
            }
            println!("cuda: not available: {reason}");
        }
        Ok(found) => println!("cuda: {found}"),
    }
}

#[test]
fn sticky_errors_are_device_lost() {
    let e = map_err("launch", DriverError(sys::cudaError_enum::CUDA_ERROR_ILLEGAL_ADDRESS));
    assert!(matches!(e, Error::DeviceLost { backend: BackendKind::Cuda, .. }), "{e:?}");
    let e = map_err("load", DriverError(sys::cudaError_enum::CUDA_ERROR_UNSUPPORTED_PTX_VERSION));
    match e {
        Error::BackendUnavailable { reason, .. } => assert!(reason.contains(cat::MIN_DRIVER), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn grid_stride_blocks_are_capped() {
    assert_eq!(stride_blocks(0, 132), 1);
    assert_eq!(stride_blocks(256, 132), 1);
    assert_eq!(stride_blocks(257, 132), 2);
    assert_eq!(stride_blocks(u64::MAX, 132), 132 * 32);
}

/// The kernel and grid of each quantized-matmul shape: decode kernels up to M = 16 (the 4-row
/// tile up to 4), K split only where it makes fewer or fuller waves of resident blocks, the tiled
/// kernel above with 64 × 64 tiles, and a typed error where the grid cannot cover M.
#[test]
fn quantized_matmul_launches() {
    use super::quant::quant_launch;
    use tilekit_kernels::DType;
    use tilekit_kernels::quant::GgmlType;
    let l = quant_launch(GgmlType::Q4K, DType::F32, 1, 11008, 4096, 1, |_| Ok(1056)).expect("a launch");
    assert_eq!((l.kernel.entry, l.grid, l.splits), ("qgemv_q4k_f32_m4", (688, 1, 1), 1));
    assert_eq!(l.kb_chunk, 16);
    let l = quant_launch(GgmlType::Q8_0, DType::F16, 16, 40, 8192, 3, |_| Ok(1056)).expect("a launch");
    assert_eq!((l.kernel.entry, l.grid.0, l.grid.2), ("qgemv_q8_0_f16_m16", 3, 3));
    assert!(l.splits > 1 && l.grid.1 as usize == l.splits, "{l:?}");
    assert!(l.splits * l.kb_chunk >= 8192 / 32 && (l.splits - 1) * l.kb_chunk < 8192 / 32, "{l:?}");
    let l = quant_launch(GgmlType::Q6K, DType::Bf16, 17, 100, 512, 2, |_| Ok(1056)).expect("a launch");
    assert_eq!((l.kernel.entry, l.grid, l.splits), ("qmatmul_q6k_bf16", (2, 1, 2), 1));
    let l = quant_launch(GgmlType::Q4_1, DType::F32, 70, 64, 0, 1, |_| Ok(1056)).expect("a launch");
    assert_eq!((l.kernel.entry, l.grid, l.splits), ("qmatmul_q4_1_f32", (1, 2, 1), 1));
    // K = 0 on the decode path: one split, whose kernel writes the epilogue of zero sums.
    let l = quant_launch(GgmlType::Q4_0, DType::F32, 2, 5, 0, 1, |_| Ok(1056)).expect("a launch");
    assert_eq!((l.grid, l.splits), ((1, 1, 1), 1));
    assert!(matches!(
        quant_launch(GgmlType::Q4_0, DType::F32, 64 * 65536, 8, 32, 1, |_| Ok(1056)),
        Err(Error::Overflow { op: "matmul_quant", .. })
    ));
    assert!(matches!(
        quant_launch(GgmlType::F16, DType::F32, 1, 8, 32, 1, |_| Ok(1056)),
        Err(Error::UnsupportedQuantType { op: "matmul_quant", .. })
    ));
}

/// The fused block's grid and flags: 8 × 8 output tiles, 64 output channels per block, the
/// residual only at stride 1 with C = C', the 16-byte vector paths only where whole rows are
/// vectors, and typed errors where the kernel's i32 arithmetic or the grid would not hold.
#[test]
fn fused_block_geometry() {
    use super::block::{BlockOperands, block_geometry};
    use tilekit_kernels::catalogue::cuda::block::block_flags as f;
    use tilekit_kernels::{DType, InvertedResidualDesc, Layout};
    // Built by assignment from a catalogue block (the descriptor may gain fields).
    let desc = |c: usize, hidden: usize, co: usize, hw: usize, stride: usize, layout: Layout| {
        let mut d: InvertedResidualDesc = InvertedResidualDesc::mobilenet_v2_blocks(1, 224, layout)[1];
        d.channels = c;
        d.height = hw;
        d.width = hw;
        d.hidden = hidden;
        d.out_channels = co;
        d.stride = stride;
        d.expand = hidden != c;
        d
    };
    let all = BlockOperands { expand: true, expand_bias: true, dw_bias: true, project_bias: true };
    // MobileNetV2's second block: 112² × 16 → 96 → 24, stride 2: 56² outputs in 7 × 7 tiles.
    let (p, grid) = block_geometry(&desc(16, 96, 24, 112, 2, Layout::Nchw), DType::F32, all).expect("fits");
    assert_eq!(grid, (49, 1));
    assert_eq!((p.out_h, p.out_w, p.tiles_w), (56, 56, 7));
    let want = f::EXPAND | f::EXPAND_BIAS | f::DW_BIAS | f::PROJECT_BIAS | f::WE_VEC | f::WP_VEC;
    assert_eq!(p.flags, want);
    // Stride 1, C = C', NHWC, f16 (8 elements per vector): residual and the NHWC vector path.
    let (p, grid) = block_geometry(&desc(24, 144, 24, 9, 1, Layout::Nhwc), DType::F16, all).expect("fits");
    assert_eq!(grid, (4, 1));
    assert_eq!(
        p.flags & (f::RESIDUAL | f::NHWC | f::X_VEC | f::WE_VEC | f::WP_VEC),
        f::RESIDUAL | f::NHWC | f::X_VEC | f::WE_VEC | f::WP_VEC
    );
    // Channel counts off the vector: scalar paths; 160 output channels: 3 channel blocks.
    let (p, grid) = block_geometry(&desc(3, 18, 160, 5, 1, Layout::Nhwc), DType::F32, all).expect("fits");
    assert_eq!(grid, (1, 3));
    assert_eq!(p.flags & (f::WE_VEC | f::WP_VEC | f::X_VEC | f::RESIDUAL), 0);
    // No expand operand: no expand flags, whatever the desc's channel counts.
    let none = BlockOperands { dw_bias: true, ..BlockOperands::default() };
    let (p, _) = block_geometry(&desc(32, 32, 16, 7, 1, Layout::Nchw), DType::Bf16, none).expect("fits");
    assert_eq!(p.flags, f::DW_BIAS | f::WP_VEC);
    // Past the grid's y limit or i32 coordinates: typed overflow errors.
    assert!(matches!(
        block_geometry(&desc(8, 48, 64 * 65536, 5, 1, Layout::Nchw), DType::F32, all),
        Err(Error::Overflow { op: "inverted_residual", .. })
    ));
    assert!(matches!(
        block_geometry(&desc(8, 48, 8, i32::MAX as usize, 1, Layout::Nchw), DType::F32, all),
        Err(Error::Overflow { op: "inverted_residual", .. })
    ));
}
