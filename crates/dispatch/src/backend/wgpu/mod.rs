//! The wgpu backend (stub: being written). Probing works; ops are not there yet.

use super::BackendOps;
use crate::{BackendKind, Error, Result, WgpuOptions};
use tilekit_kernels::{ActivationDesc, Conv2dDesc, DType, MatmulDesc};

/// One adapter the probe saw.
#[derive(Debug, Clone)]
pub(crate) struct AdapterSummary {
    pub(crate) name: String,
    pub(crate) backend: String,
    pub(crate) software: bool,
}

/// Lists the adapters wgpu can see. Never panics.
pub(crate) fn probe_adapters() -> std::result::Result<Vec<AdapterSummary>, String> {
    Err("the wgpu backend is not built yet".into())
}

#[derive(Debug)]
pub(crate) struct WgpuBackend {}

#[derive(Debug)]
pub(crate) struct WgpuStorage {}

impl WgpuBackend {
    pub(crate) fn new(_opts: &WgpuOptions) -> Result<WgpuBackend> {
        Err(Error::BackendUnavailable { backend: BackendKind::Wgpu, reason: "not built yet".into() })
    }

    pub(crate) fn from_raw(_device: wgpu::Device, _queue: wgpu::Queue) -> Result<WgpuBackend> {
        Err(Error::BackendUnavailable { backend: BackendKind::Wgpu, reason: "not built yet".into() })
    }

    pub(crate) fn description(&self) -> String {
        String::new()
    }

    pub(crate) fn is_software(&self) -> bool {
        false
    }
}

fn todo_err() -> Error {
    Error::BackendUnavailable { backend: BackendKind::Wgpu, reason: "not built yet".into() }
}

impl BackendOps for WgpuBackend {
    type Storage = WgpuStorage;

    fn storage_of(storage: &super::Storage) -> Option<&Self::Storage> {
        match storage {
            super::Storage::Wgpu(s) => Some(s),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
    fn check_dtype(&self, _op: &'static str, _dtype: DType) -> Result<()> {
        Err(todo_err())
    }
    fn alloc_zeroed(&self, _dtype: DType, _len: usize) -> Result<WgpuStorage> {
        Err(todo_err())
    }
    fn upload(&self, _dtype: DType, _bytes: &[u8]) -> Result<WgpuStorage> {
        Err(todo_err())
    }
    fn download(&self, _s: &WgpuStorage, _dtype: DType) -> Result<Vec<u8>> {
        Err(todo_err())
    }
    fn matmul(
        &self,
        _desc: &MatmulDesc,
        _dtype: DType,
        _a: &WgpuStorage,
        _b: &WgpuStorage,
        _bias: Option<&WgpuStorage>,
        _c: Option<&WgpuStorage>,
        _out: &WgpuStorage,
    ) -> Result<()> {
        Err(todo_err())
    }
    fn depthwise_conv2d(
        &self,
        _desc: &Conv2dDesc,
        _dtype: DType,
        _input: &WgpuStorage,
        _weight: &WgpuStorage,
        _bias: Option<&WgpuStorage>,
        _out: &WgpuStorage,
    ) -> Result<()> {
        Err(todo_err())
    }
    fn activation(
        &self,
        _desc: &ActivationDesc,
        _dtype: DType,
        _x: &WgpuStorage,
        _bias: Option<&WgpuStorage>,
        _out: &WgpuStorage,
    ) -> Result<()> {
        Err(todo_err())
    }
    fn copy(&self, _dtype: DType, _src: &WgpuStorage, _dst: &WgpuStorage, _len: usize) -> Result<()> {
        Err(todo_err())
    }
    fn synchronize(&self) -> Result<()> {
        Err(todo_err())
    }
}
