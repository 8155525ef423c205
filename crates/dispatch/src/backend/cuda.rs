//! The CUDA backend. Not built yet: the probe says so, and no value of these types exists.

use super::BackendOps;
use crate::{BackendKind, Result};
use std::convert::Infallible;
use tilekit_kernels::{ActivationDesc, Conv2dDesc, DType, MatmulDesc};

/// Why the CUDA backend cannot be used in this build.
pub(crate) fn probe() -> std::result::Result<String, String> {
    Err("the CUDA backend is not part of this build yet".to_string())
}

#[derive(Debug)]
pub(crate) struct CudaBackend {
    never: Infallible,
}

#[derive(Debug)]
pub(crate) struct CudaStorage {
    never: Infallible,
}

impl CudaBackend {
    pub(crate) fn new(_ordinal: usize) -> Result<CudaBackend> {
        Err(crate::Error::BackendUnavailable { backend: BackendKind::Cuda, reason: probe().err().unwrap_or_default() })
    }

    pub(crate) fn description(&self) -> String {
        match self.never {}
    }
}

impl BackendOps for CudaBackend {
    type Storage = CudaStorage;

    fn storage_of(storage: &super::Storage) -> Option<&Self::Storage> {
        match storage {
            super::Storage::Cuda(s) => Some(s),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
    fn check_dtype(&self, _op: &'static str, _dtype: DType) -> Result<()> {
        match self.never {}
    }
    fn alloc_zeroed(&self, _dtype: DType, _len: usize) -> Result<CudaStorage> {
        match self.never {}
    }
    fn upload(&self, _dtype: DType, _bytes: &[u8]) -> Result<CudaStorage> {
        match self.never {}
    }
    fn download(&self, s: &CudaStorage, _dtype: DType) -> Result<Vec<u8>> {
        match s.never {}
    }
    fn matmul(
        &self,
        _desc: &MatmulDesc,
        _dtype: DType,
        _a: &CudaStorage,
        _b: &CudaStorage,
        _bias: Option<&CudaStorage>,
        _c: Option<&CudaStorage>,
        _out: &CudaStorage,
    ) -> Result<()> {
        match self.never {}
    }
    fn depthwise_conv2d(
        &self,
        _desc: &Conv2dDesc,
        _dtype: DType,
        _input: &CudaStorage,
        _weight: &CudaStorage,
        _bias: Option<&CudaStorage>,
        _out: &CudaStorage,
    ) -> Result<()> {
        match self.never {}
    }
    fn activation(
        &self,
        _desc: &ActivationDesc,
        _dtype: DType,
        _x: &CudaStorage,
        _bias: Option<&CudaStorage>,
        _out: &CudaStorage,
    ) -> Result<()> {
        match self.never {}
    }
    fn copy(&self, _dtype: DType, _src: &CudaStorage, _dst: &CudaStorage, _len: usize) -> Result<()> {
        match self.never {}
    }
    fn synchronize(&self) -> Result<()> {
        match self.never {}
    }
}
