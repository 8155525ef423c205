//! Finding the driver and the device, and mapping driver errors into [`Error`] values.

use super::{KIND, unavailable};
use crate::{Error, Result};
use cudarc::driver::{CudaContext, DriverError, result, sys};
use tilekit_kernels::catalogue::cuda as cat;

/// Looks for a usable CUDA driver and device without ever panicking. `Ok` describes what was
/// found; `Err` says why CUDA cannot be used.
pub(crate) fn probe() -> std::result::Result<String, String> {
    // SAFETY: `is_culib_present` only tries to open the driver library by its usual names; it
    // calls nothing inside it.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so.1 / nvcuda.dll) could be loaded".into());
    }
    // From here on the library is loaded, so cudarc's lazily bound driver calls cannot hit its
    // "library not found" panic.
    result::init().map_err(|e| format!("the CUDA driver did not initialise: {}", describe(e)))?;
    let count = result::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {}", describe(e)))?;
    if count <= 0 {
        return Err("the CUDA driver is installed but reports no device".into());
    }
    let api = driver_api_version().map_err(|e| format!("cuDriverGetVersion failed: {}", describe(e)))?;
    Ok(format!("{count} CUDA device(s), driver API {}", version_string(api)))
}

/// `cuDriverGetVersion`: the newest CUDA version the driver supports, as 1000·major + 10·minor.
pub(super) fn driver_api_version() -> std::result::Result<i32, DriverError> {
    let mut v = 0;
    // SAFETY: the driver library is loaded (the caller checked) and `v` is a valid out pointer.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok(v)
}

pub(super) fn version_string(api: i32) -> String {
    format!("{}.{}", api / 1000, (api % 1000) / 10)
}

/// The driver's name and message for an error code.
pub(super) fn describe(e: DriverError) -> String {
    // Asking the driver for the text needs the driver library; without it (an error built by
    // hand, or a machine without CUDA) cudarc would panic, so the number has to do.
    // SAFETY: `is_culib_present` only tries to open the library.
    if !unsafe { sys::is_culib_present() } {
        return format!("CUDA error {}", e.0 as u32);
    }
    match (e.error_name(), e.error_string()) {
        (Ok(n), Ok(s)) => format!("{} ({})", n.to_string_lossy(), s.to_string_lossy()),
        _ => format!("CUDA error {}", e.0 as u32),
    }
}

/// Errors after which the context can run nothing more (CUDA's "sticky" errors).
pub(super) fn is_sticky(e: &DriverError) -> bool {
    use sys::cudaError_enum as E;
    matches!(
        e.0,
        E::CUDA_ERROR_ILLEGAL_ADDRESS
            | E::CUDA_ERROR_LAUNCH_FAILED
            | E::CUDA_ERROR_HARDWARE_STACK_ERROR
            | E::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | E::CUDA_ERROR_MISALIGNED_ADDRESS
            | E::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | E::CUDA_ERROR_INVALID_PC
            | E::CUDA_ERROR_ECC_UNCORRECTABLE
            | E::CUDA_ERROR_LAUNCH_TIMEOUT
            | E::CUDA_ERROR_CONTEXT_IS_DESTROYED
            | E::CUDA_ERROR_DEINITIALIZED
    )
}

/// Maps a driver error met while doing `what` into tilekit's error.
pub(super) fn map_err(what: &str, e: DriverError) -> Error {
    use sys::cudaError_enum as E;
    match e.0 {
        E::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory { backend: KIND, bytes: 0 },
        E::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => Error::BackendUnavailable {
            backend: KIND,
            reason: format!(
                "{what}: the NVIDIA driver is too old for tilekit's PTX (ISA {}); it needs driver {} or newer",
                cat::PTX_ISA,
                cat::MIN_DRIVER
            ),
        },
        E::CUDA_ERROR_NO_BINARY_FOR_GPU | E::CUDA_ERROR_INVALID_PTX => Error::BackendUnavailable {
            backend: KIND,
            reason: format!(
                "{what}: the driver could not compile tilekit's PTX for this GPU ({}); the kernels need compute \
                 capability {}.{}+ and driver {}+",
                describe(e),
                cat::MIN_COMPUTE_CAPABILITY.0,
                cat::MIN_COMPUTE_CAPABILITY.1,
                cat::MIN_DRIVER
            ),
        },
        _ if is_sticky(&e) => Error::DeviceLost {
            backend: KIND,
            reason: format!(
                "{what}: {} (a sticky error: this CUDA context can run nothing more; create a new device)",
                describe(e)
            ),
        },
        _ => Error::Backend { backend: KIND, message: format!("{what}: {}", describe(e)) },
    }
}

/// Lets the device's default memory pool (behind `cuMemAllocAsync`) keep freed memory
/// instead of returning it to the driver at every synchronisation (its default release
/// threshold is 0), so a steady stream of same-sized temporaries is served from the pool.
/// Best effort: on failure the pool simply keeps its default.
pub(super) fn keep_pool_memory(ctx: &CudaContext) {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the driver is loaded and initialised (the context exists); `pool` is a valid out
    // pointer and `cu_device` a device of this driver.
    let got = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
    if got.result().is_err() || pool.is_null() {
        return;
    }
    let mut threshold = u64::MAX;
    // SAFETY: `pool` came from the driver above; the release threshold attribute takes a
    // pointer to a u64, which `threshold` is and which outlives the call.
    let _ = unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    };
}

/// The driver's CUDA API version, refused below what tilekit's PTX needs.
pub(super) fn checked_driver_api() -> Result<i32> {
    let driver_api = driver_api_version().map_err(|e| map_err("cuDriverGetVersion", e))?;
    if driver_api < cat::MIN_DRIVER_API {
        return Err(unavailable(format!(
            "the NVIDIA driver supports CUDA {}, but tilekit's PTX (ISA {}) needs CUDA {}: driver {} or newer",
            version_string(driver_api),
            cat::PTX_ISA,
            version_string(cat::MIN_DRIVER_API),
            cat::MIN_DRIVER
        )));
    }
    Ok(driver_api)
}

/// The context's device name, compute capability (refused below tilekit's minimum) and
/// multiprocessor count.
pub(super) fn device_facts(ctx: &CudaContext) -> Result<(String, (i32, i32), u32)> {
    let cc = ctx.compute_capability().map_err(|e| map_err("cuDeviceGetAttribute", e))?;
    let name = ctx.name().map_err(|e| map_err("cuDeviceGetName", e))?;
    if cc < cat::MIN_COMPUTE_CAPABILITY {
        return Err(unavailable(format!(
            "{name} has compute capability {}.{}; tilekit's CUDA kernels need {}.{} or newer",
            cc.0,
            cc.1,
            cat::MIN_COMPUTE_CAPABILITY.0,
            cat::MIN_COMPUTE_CAPABILITY.1
        )));
    }
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| map_err("cuDeviceGetAttribute", e))?;
    Ok((name, cc, u32::try_from(sms).unwrap_or(1)))
}
