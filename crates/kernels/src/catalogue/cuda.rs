//! CUDA kernels. Filled in with the CUDA backend.
