//! Adapter choice and the probe: enumerating adapters, ranking them, creating the device
//! (or wrapping an engine's), and describing it.

use super::*;

/// One adapter the probe saw.
#[derive(Debug, Clone)]
pub(crate) struct AdapterSummary {
    pub(crate) name: String,
    pub(crate) backend: String,
    pub(crate) software: bool,
}

pub(super) fn new_instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    // WGPU_BACKEND and the other wgpu variables still override.
    wgpu::Instance::new(desc.with_env())
}

pub(super) fn enumerate() -> std::result::Result<Vec<wgpu::Adapter>, String> {
    // wgpu panics only when no backend is compiled in; the catch keeps the probe's promise
    // never to panic even on such a build.
    std::panic::catch_unwind(|| {
        // The primary backends (Vulkan, Metal, DX12) first; GL only where none of them has an
        // adapter: its compute support is the narrowest, and initialising EGL on a headless
        // machine prints errors.
        let primary = new_instance(wgpu::Backends::PRIMARY);
        let adapters = pollster::block_on(primary.enumerate_adapters(wgpu::Backends::all()));
        if adapters.is_empty() {
            let secondary = new_instance(wgpu::Backends::SECONDARY);
            pollster::block_on(secondary.enumerate_adapters(wgpu::Backends::all()))
        } else {
            adapters
        }
    })
    .map_err(|_| "wgpu failed to enumerate adapters".to_string())
}

pub(super) fn is_software(info: &wgpu::AdapterInfo) -> bool {
    info.device_type == wgpu::DeviceType::Cpu
}

/// Lists the adapters wgpu can see. Never panics.
pub(crate) fn probe_adapters() -> std::result::Result<Vec<AdapterSummary>, String> {
    Ok(enumerate()?
        .iter()
        .map(|a| {
            let info = a.get_info();
            AdapterSummary { software: is_software(&info), name: info.name, backend: format!("{:?}", info.backend) }
        })
        .collect())
}

impl WgpuBackend {
    /// A device on the first adapter `opts` accepts: hardware adapters first (discrete, then
    /// integrated, virtual, other), software ones only with `allow_software`.
    pub(crate) fn new(opts: &WgpuOptions) -> Result<WgpuBackend> {
        let unavailable = |reason: String| Error::BackendUnavailable { backend: KIND, reason };
        let mut adapters: Vec<(wgpu::Adapter, wgpu::AdapterInfo)> = enumerate()
            .map_err(unavailable)?
            .into_iter()
            .map(|a| {
                let info = a.get_info();
                (a, info)
            })
            .collect();
        if adapters.is_empty() {
            return Err(unavailable("no adapter found (no Vulkan, Metal, DX12 or GL driver)".into()));
        }
        let seen: Vec<String> = adapters.iter().map(|(_, i)| format!("{} ({:?})", i.name, i.backend)).collect();
        if let Some(filter) = &opts.adapter_name {
            let f = filter.to_lowercase();
            adapters.retain(|(_, i)| i.name.to_lowercase().contains(&f));
        }
        if !opts.allow_software {
            adapters.retain(|(_, i)| !is_software(i));
        }
        let rank = |i: &wgpu::AdapterInfo| {
            let ty = match i.device_type {
                wgpu::DeviceType::DiscreteGpu => 0,
                wgpu::DeviceType::IntegratedGpu => 1,
                wgpu::DeviceType::VirtualGpu => 2,
                wgpu::DeviceType::Other => 3,
                wgpu::DeviceType::Cpu => 4,
            };
            // GL comes last: its compute support is the narrowest.
            (ty, i.backend == wgpu::Backend::Gl)
        };
        adapters.sort_by_key(|(_, i)| rank(i));
        if adapters.is_empty() {
            return Err(unavailable(format!(
                "no adapter matches (software {}, name filter {:?}); found: {}",
                if opts.allow_software { "allowed" } else { "not allowed" },
                opts.adapter_name,
                seen.join(", ")
            )));
        }
        let mut failures = Vec::new();
        for (adapter, info) in adapters {
            let mut features = wgpu::Features::empty();
            if adapter.features().contains(wgpu::Features::SHADER_F16) {
                features |= wgpu::Features::SHADER_F16;
            }
            // Profiles read device time from timestamps written at the start and end of
            // each compute pass; asked for only where the adapter has it.
            if adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
                features |= wgpu::Features::TIMESTAMP_QUERY;
            }
            // The GEMV kernel reduces its partial sums with subgroup operations where it can.
            if adapter.features().contains(wgpu::Features::SUBGROUP) && !opts.no_subgroups {
                features |= wgpu::Features::SUBGROUP;
            }
            // Cooperative matrices only where the caller opted in (`coop.rs`).
            let coop = coop::wanted(&adapter, opts);
            let mut coop_configs = Vec::new();
            let mut experimental_features = wgpu::ExperimentalFeatures::disabled();
            if coop {
                features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
                coop_configs = coop::configs(&adapter.cooperative_matrix_properties());
                // SAFETY: the caller accepted wgpu's contract for experimental features by
                // calling the unsafe `WgpuOptions::with_experimental_cooperative_matrix`.
                experimental_features = unsafe { wgpu::ExperimentalFeatures::enabled() };
            }
            let desc = wgpu::DeviceDescriptor {
                label: Some("tilekit"),
                required_features: features,
                // The adapter's own limits: the largest bindings and workgroup storage it has.
                required_limits: adapter.limits(),
                experimental_features,
                ..Default::default()
            };
            match pollster::block_on(adapter.request_device(&desc)) {
                Ok((device, queue)) => {
                    let errors = Arc::new(ErrorLog { own_handler: true, ..ErrorLog::default() });
                    let log = errors.clone();
                    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                        log.count.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut slot) = log.unreported.lock() {
                            slot.get_or_insert(e);
                        }
                    }));
                    let native = features.contains(wgpu::Features::SHADER_F16) && !opts.force_packed_f16;
                    return Ok(WgpuBackend::assemble(device, queue, info, native, errors, coop_configs));
                }
                Err(e) => failures.push(format!("{}: {e}", info.name)),
            }
        }
        Err(unavailable(format!("device creation failed: {}", failures.join("; "))))
    }

    /// Wraps an engine's own device and queue. The engine's uncaptured-error handler is left
    /// alone: tilekit's calls run inside error scopes and report their errors themselves.
    pub(crate) fn from_raw(device: wgpu::Device, queue: wgpu::Queue) -> Result<WgpuBackend> {
        let info = device.adapter_info();
        let native = device.features().contains(wgpu::Features::SHADER_F16);
        let coop_configs = coop::engine_configs(&device, &info);
        Ok(WgpuBackend::assemble(device, queue, info, native, Arc::new(ErrorLog::default()), coop_configs))
    }

    pub(super) fn assemble(
        device: wgpu::Device,
        queue: wgpu::Queue,
        info: wgpu::AdapterInfo,
        native_f16: bool,
        errors: Arc<ErrorLog>,
        coop_configs: Vec<cat::coopmat::CoopConfig>,
    ) -> WgpuBackend {
        let log = errors.clone();
        device.set_device_lost_callback(move |reason, message| {
            if let Ok(mut lost) = log.lost.lock() {
                lost.get_or_insert(format!("{reason:?}: {message}"));
            }
        });
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tilekit dummy binding"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let limits = device.limits();
        // Slots of the uniform ring: the largest parameter block, at the offset alignment.
        let largest = [
            size_of::<MatmulParams>(),
            size_of::<ConvParams>(),
            size_of::<ActivationParams>(),
            size_of::<CopyParams>(),
        ]
        .into_iter()
        .max()
        .unwrap_or(256) as u64;
        let ring_stride = largest.div_ceil(16) * 16;
        let ring_stride = ring_stride.div_ceil(u64::from(limits.min_uniform_buffer_offset_alignment.max(1)))
            * u64::from(limits.min_uniform_buffer_offset_alignment.max(1));
        let ring = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tilekit uniform ring"),
            size: ring_stride * queue::RING_SLOTS as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let timestamps = device.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let subgroups = device.features().contains(wgpu::Features::SUBGROUP);
        let coop = coop::coop_device(&device, &info, &limits, native_f16, subgroups, coop_configs);
        let fingerprint = format!(
            "{} ({:?}, {:04x}:{:04x}, {} {})",
            info.name, info.backend, info.vendor, info.device, info.driver, info.driver_info
        );
        WgpuBackend(Box::new(State {
            fingerprint,
            timestamps,
            subgroups,
            coop,
            prof: ProfState::default(),
            tuner: Tuner::from_env(),
            forcing: Mutex::new(()),
            ring,
            ring_stride,
            bind_groups: Mutex::new(Default::default()),
            reuse: AtomicBool::new(true),
            graveyard: Default::default(),
            capture: Mutex::new(None),
            #[cfg(test)]
            force_spec: Mutex::new(None),
            device,
            queue,
            info,
            limits,
            native_f16,
            pipelines: Mutex::new(HashMap::new()),
            pending: Mutex::new(Pending::default()),
            errors,
            dummy,
            submissions: AtomicU64::new(0),
        }))
    }

    /// Adapter name, backend, driver and the active f16 path.
    pub(super) fn describe(&self) -> String {
        let i = &self.info;
        let driver = match (i.driver.is_empty(), i.driver_info.is_empty()) {
            (true, _) => String::new(),
            (false, true) => format!(", driver {}", i.driver),
            (false, false) => format!(", driver {} {}", i.driver, i.driver_info),
        };
        let f16 = if self.native_f16 { "f16 native (shader-f16)" } else { "f16 packed in u32" };
        let coop = match self.coop_size() {
            Some(s) => format!("; f16 matmul on {0}x{0} cooperative matrices", s.edge()),
            None => String::new(),
        };
        format!(
            "{} ({:?}{}{}); {f16}, bf16 packed in u32{coop}",
            i.name,
            i.backend,
            if is_software(i) { ", software" } else { "" },
            driver
        )
    }
}
