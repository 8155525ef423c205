//! The pipeline cache: modules from the kernel catalogue, checked against the device's
//! limits, built once per (kernel, storage variant, spec).

use super::*;

/// A cached pipeline.
#[derive(Debug)]
pub(super) struct Pipeline {
    pub(super) pipeline: wgpu::ComputePipeline,
    pub(super) layout: wgpu::BindGroupLayout,
    /// Module name and spec label, for profiles.
    pub(super) name: String,
    /// Workgroup size, for profiles.
    pub(super) workgroup: [u32; 3],
}

/// A pipeline's cache key: kernel, storage variant and shape constants (the module's text and
/// override values follow from them).
pub(super) type PipelineKey = (Kernel, ElementStorage, Spec);

impl WgpuBackend {
    /// The cached pipeline of `kernel` in `storage` specialised by `spec`, built on first use.
    pub(super) fn pipeline(
        &self,
        op: &'static str,
        kernel: Kernel,
        storage: ElementStorage,
        spec: Spec,
    ) -> Result<Arc<Pipeline>> {
        // The copy is dtype-free and each kernel uses only its own part of the spec: normalise
        // the key so each distinct pipeline is built once.
        let storage = if kernel.is_typed() { storage } else { ElementStorage::F32 };
        let spec = spec.normalised(kernel);
        let key = (kernel, storage, spec);
        if let Some(p) = self.pipelines.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(p);
        }
        let module = cat::module_with(kernel, storage, spec);
        if module.needs_f16 && !self.device.features().contains(wgpu::Features::SHADER_F16) {
            return Err(Error::UnsupportedDType {
                op,
                dtype: DType::F16,
                backend: KIND,
                reason: "the device lacks SHADER_F16".into(),
            });
        }
        // Checked before the module is made: a device without the feature never compiles it.
        if kernel.needs_cooperative_matrix()
            && !self.device.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        {
            return Err(Error::Backend {
                backend: KIND,
                message: format!(
                    "{} needs cooperative matrices, the device lacks EXPERIMENTAL_COOPERATIVE_MATRIX",
                    module.name
                ),
            });
        }
        if kernel.needs_subgroups() && !self.subgroups {
            return Err(Error::Backend {
                backend: KIND,
                message: format!("{} needs subgroup operations, the device lacks SUBGROUP", module.name),
            });
        }
        // wgpu does not check workgroup storage against the limit (gfx-rs/wgpu #8946): do it here.
        let l = &self.limits;
        if module.workgroup_bytes > l.max_compute_workgroup_storage_size {
            return Err(Error::Backend {
                backend: KIND,
                message: format!(
                    "{} needs {} bytes of workgroup storage, the device has {}",
                    module.name, module.workgroup_bytes, l.max_compute_workgroup_storage_size
                ),
            });
        }
        let [x, y, z] = module.workgroup_size;
        if x * y * z > l.max_compute_invocations_per_workgroup
            || x > l.max_compute_workgroup_size_x
            || y > l.max_compute_workgroup_size_y
            || z > l.max_compute_workgroup_size_z
        {
            return Err(Error::Backend {
                backend: KIND,
                message: format!(
                    "{} needs a {x} x {y} x {z} workgroup, the device allows {} invocations ({} x {} x {})",
                    module.name,
                    l.max_compute_invocations_per_workgroup,
                    l.max_compute_workgroup_size_x,
                    l.max_compute_workgroup_size_y,
                    l.max_compute_workgroup_size_z
                ),
            });
        }
        let pipeline = self.scoped(0, || {
            let shader = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&module.name),
                source: wgpu::ShaderSource::Wgsl(module.source.as_str().into()),
            });
            // An explicit layout: the parameter block is bound with a dynamic offset into
            // the uniform ring (`queue.rs`), so one bind group serves every launch on the
            // same buffers.
            let layout = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(&module.name),
                entries: &binding_entries(&module.source),
            });
            let pipeline_layout = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(&module.name),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&module.name),
                layout: Some(&pipeline_layout),
                module: &shader,
                entry_point: Some(module.entry_point),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &module.overrides,
                    // Every kernel writes its workgroup arrays before reading them.
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
            (pipeline, layout)
        })?;
        let (pipeline, layout) = pipeline;
        let name = match kernel {
            Kernel::Matmul
            | Kernel::MatmulF16x2
            | Kernel::MatmulSmallM
            | Kernel::Gemv
            | Kernel::GemvSubgroup
            | Kernel::DepthwiseConv2d
            | Kernel::QuantGemv(_)
            | Kernel::QuantGemvSubgroup(_)
            | Kernel::QuantMatmul(_)
            | Kernel::MatmulCoop(_) => {
                format!("{} [{}]", module.name, spec.label(kernel))
            }
            _ => module.name.clone(),
        };
        let p = Arc::new(Pipeline { pipeline, layout, name, workgroup: module.workgroup_size });
        if let Ok(mut cache) = self.pipelines.lock() {
            cache.insert(key, p.clone());
        }
        Ok(p)
    }
}

/// The bind-group layout entries of a composed module, read from its `@group(0) @binding(n)`
/// declarations: storage buffers read-only or read-write as declared, the parameter block a
/// uniform with a dynamic offset.
pub(super) fn binding_entries(source: &str) -> Vec<wgpu::BindGroupLayoutEntry> {
    let mut entries: Vec<wgpu::BindGroupLayoutEntry> = Vec::new();
    for line in source.lines().map(str::trim_start).filter(|l| l.starts_with("@group(0) @binding(")) {
        let rest = &line["@group(0) @binding(".len()..];
        let Some(slot) = rest.split(')').next().and_then(|n| n.trim().parse::<u32>().ok()) else { continue };
        let ty = if line.contains("var<uniform>") {
            wgpu::BufferBindingType::Uniform
        } else if line.contains("read_write") {
            wgpu::BufferBindingType::Storage { read_only: false }
        } else {
            wgpu::BufferBindingType::Storage { read_only: true }
        };
        if entries.iter().any(|e| e.binding == slot) {
            continue;
        }
        entries.push(wgpu::BindGroupLayoutEntry {
            binding: slot,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: ty == wgpu::BufferBindingType::Uniform,
                min_binding_size: None,
            },
            count: None,
        });
    }
    entries.sort_by_key(|e| e.binding);
    entries
}
