//! WGSL kernels. Filled in with the wgpu backend.
