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
