//! The `launch` suite (`cargo xtask bench --backend wgpu --suite launch`): what tilekit costs
//! the host per op, against the floor of a raw wgpu loop.
//!
//! Two chains of 1,000 small ops on each wgpu device: a ReLU on 4,096 f32 elements in place
//! (`Device::activation_in_place`) and a 64³ f32 matmul into a preallocated output
//! (`Device::matmul_into`). For each, the host time to issue the chain (µs per op, best of
//! three rounds, each after a warm-up and a `synchronize`, not counting the final wait), and
//! the same for the floor: the same WGSL module from the kernel catalogue, compiled once,
//! dispatched by a plain loop with a bind group and a parameter block built once — one compute
//! pass per op in a shared encoder, submitted every 64 ops as tilekit does. tilekit is timed
//! twice in the same run: as it runs (a uniform ring with dynamic offsets, cached bind
//! groups, one shared encoder per batch and no error scopes per op) and with that reuse turned
//! off (a parameter buffer, a bind group, a command buffer and three error scopes per op, as
//! before; `Device::bench_set_launch_reuse`). The ratio columns are each
//! over the floor, all measured in this run; the target is ≤ 1.5×. The "+wait" columns add
//! the final `synchronize` (the device time of the chain).

use anyhow::{Context, Result};
use std::time::{Duration, Instant};
use tilekit::wgpu;
use tilekit::{Activation, BackendKind, DType, Device, MatmulDesc};
use tilekit_kernels::catalogue::wgsl::{
    self as cat, ActivationParams, ElementStorage, Kernel, MatmulParams, Spec, matmul_flags,
};

/// Ops per chain.
const CHAIN: usize = 1000;
/// Ops per submission in the floor loop (tilekit's `MAX_PENDING_OPS`).
const PER_SUBMIT: usize = 64;
/// Rounds; each side keeps its best.
const ROUNDS: usize = 3;

/// One timed chain: host time to issue it and time including the wait.
#[derive(Clone, Copy, Debug)]
struct Timed {
    issue: Duration,
    total: Duration,
}

impl Timed {
    fn best(a: Option<Timed>, b: Timed) -> Timed {
        match a {
            Some(a) if a.issue <= b.issue => a,
            _ => b,
        }
    }
}

/// Runs the suite on every wgpu device among `devices` (a visible skip where there is none).
pub fn run(devices: &[Device], quick: bool) -> Result<()> {
    let chain = if quick { CHAIN / 4 } else { CHAIN };
    println!(
        "\n== launch: host cost per op, chains of {chain} ops (best of {ROUNDS}); floor = raw wgpu loop, same pipeline, bind groups built once"
    );
    let wgpu_devices: Vec<&Device> = devices.iter().filter(|d| d.kind() == BackendKind::Wgpu).collect();
    if wgpu_devices.is_empty() {
        println!("   SKIP launch: no wgpu device among the benched backends (pass --backend wgpu)");
        return Ok(());
    }
    for dev in wgpu_devices {
        println!("   {}", dev.description());
        println!(
            "   {:<26} {:>12} {:>12} {:>12} {:>9} {:>9} {:>12} {:>12}",
            "case", "tilekit µs", "no-reuse µs", "floor µs", "ratio", "no-reuse", "tk+wait µs", "floor+wait"
        );
        let cases: [(&str, Case); 2] =
            [("activation relu 4096 f32", Case::Activation), ("matmul 64x64x64 f32", Case::Matmul)];
        for (name, case) in cases {
            let [tk, old, floor] = measure(dev, case, chain).with_context(|| format!("launch case {name}"))?;
            let per = |d: Duration| d.as_secs_f64() * 1e6 / chain as f64;
            println!(
                "   {:<26} {:>12.2} {:>12.2} {:>12.2} {:>8.2}x {:>8.2}x {:>12.2} {:>12.2}",
                name,
                per(tk.issue),
                per(old.issue),
                per(floor.issue),
                per(tk.issue) / per(floor.issue),
                per(old.issue) / per(floor.issue),
                per(tk.total),
                per(floor.total)
            );
        }
    }
    Ok(())
}

/// What the floor loop dispatches: kernel, spec, parameter block, grid, bound buffers.
type FloorSetup<'a> = (Kernel, Spec, Vec<u8>, [u32; 3], Vec<(u32, &'a wgpu::Buffer)>);

#[derive(Clone, Copy)]
enum Case {
    Activation,
    Matmul,
}

/// Times tilekit's chain (with and without reuse) and the floor's, alternating within each
/// round so all three see the same load.
fn measure(dev: &Device, case: Case, chain: usize) -> Result<[Timed; 3]> {
    let (gdev, queue) = dev.wgpu_device().context("a wgpu device")?;
    let n = 64usize;
    let len = 4096usize;
    let data: Vec<f32> = (0..len).map(|i| ((i % 13) as f32 - 6.0) * 0.25).collect();
    // tilekit's operands.
    let x = dev.tensor_from_f32(&[len], DType::F32, &data)?;
    let a = dev.tensor_from_f32(&[n, n], DType::F32, &data[..n * n])?;
    let b = dev.tensor_from_f32(&[n, n], DType::F32, &data[..n * n])?;
    let out = dev.zeros(&[n, n], DType::F32)?;
    let desc = MatmulDesc::new(n, n, n);
    let tilekit_op = || -> tilekit::Result<()> {
        match case {
            Case::Activation => dev.activation_in_place(&x, None, Activation::Relu),
            Case::Matmul => dev.matmul_into(&desc, &a, &b, None, None, &out),
        }
    };
    // The floor: the same module, its bind group and parameter block built once.
    let (kernel, spec, params, grid, buffers): FloorSetup<'_> = match case {
        Case::Activation => {
            let p = ActivationParams {
                len: len as u32,
                act: Activation::Relu.code(),
                items: (len / 4) as u32,
                ..Default::default()
            };
            let groups = (len as u32 / 4).div_ceil(cat::WG_1D);
            let xb = x.wgpu_buffer().context("a wgpu buffer")?;
            (Kernel::ActivationInPlace, Spec::DEFAULT, bytemuck::bytes_of(&p).to_vec(), [groups, 1, 1], vec![(2, xb)])
        }
        Case::Matmul => {
            let (kernel, candidates) = cat::matmul_candidates(n);
            let spec = candidates.first().copied().unwrap_or(Spec::DEFAULT).normalised(kernel).with_switches(&desc);
            let p = MatmulParams {
                m: n as u32,
                n: n as u32,
                k: n as u32,
                a_ld: n as u32,
                b_ld: n as u32,
                o_ld: n as u32,
                alpha: 1.0,
                flags: matmul_flags::A_VEC | matmul_flags::B_VEC | matmul_flags::O_VEC,
                ..Default::default()
            };
            let grid = [(n as u32).div_ceil(spec.tile.bn()), (n as u32).div_ceil(spec.tile.bm()), 1];
            let bufs = vec![
                (0, a.wgpu_buffer().context("a")?),
                (1, b.wgpu_buffer().context("b")?),
                (4, out.wgpu_buffer().context("out")?),
            ];
            (kernel, spec, bytemuck::bytes_of(&p).to_vec(), grid, bufs)
        }
    };
    let module = cat::module_with(kernel, ElementStorage::F32, spec);
    let shader = gdev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("launch floor"),
        source: wgpu::ShaderSource::Wgsl(module.source.as_str().into()),
    });
    let pipeline = gdev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("launch floor"),
        layout: None,
        module: &shader,
        entry_point: Some(module.entry_point),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants: &module.overrides,
            zero_initialize_workgroup_memory: false,
        },
        cache: None,
    });
    let uniform = gdev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("launch floor params"),
        size: params.len() as u64,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    queue.write_buffer(&uniform, 0, &params);
    // Bindings the module declares but the case does not use (bias, C) get a scratch buffer.
    let scratch = gdev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("launch floor scratch"),
        size: 256,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let uniform_slot = match case {
        Case::Activation => 3,
        Case::Matmul => 5,
    };
    let mut entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
        .iter()
        .map(|(slot, buf)| wgpu::BindGroupEntry { binding: *slot, resource: buf.as_entire_binding() })
        .collect();
    let used: Vec<u32> = buffers.iter().map(|(s, _)| *s).collect();
    for slot in 0..uniform_slot {
        let declared = match case {
            Case::Activation => slot == 1,
            Case::Matmul => true,
        };
        if declared && !used.contains(&slot) {
            entries.push(wgpu::BindGroupEntry { binding: slot, resource: scratch.as_entire_binding() });
        }
    }
    entries.push(wgpu::BindGroupEntry { binding: uniform_slot, resource: uniform.as_entire_binding() });
    let bind_group = gdev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("launch floor"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    });
    let floor_op = |count: usize| {
        let mut done = 0;
        while done < count {
            let batch = PER_SUBMIT.min(count - done);
            let mut encoder =
                gdev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("launch floor") });
            for _ in 0..batch {
                let mut pass =
                    encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bind_group, &[]);
                pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
            }
            queue.submit([encoder.finish()]);
            done += batch;
        }
    };
    let floor_wait = || gdev.poll(wgpu::PollType::wait_indefinitely()).map(drop);

    let mut best: [Option<Timed>; 3] = [None; 3];
    for _ in 0..ROUNDS {
        for (which, reuse) in [(0, true), (1, false)] {
            dev.bench_set_launch_reuse(reuse);
            // Warm-up (pipelines, caches), then a quiet device.
            for _ in 0..PER_SUBMIT {
                tilekit_op()?;
            }
            dev.synchronize()?;
            let t = Instant::now();
            for _ in 0..chain {
                tilekit_op()?;
            }
            let issue = t.elapsed();
            dev.synchronize()?;
            best[which] = Some(Timed::best(best[which], Timed { issue, total: t.elapsed() }));
        }
        dev.bench_set_launch_reuse(true);

        floor_op(PER_SUBMIT);
        floor_wait()?;
        let t = Instant::now();
        floor_op(chain);
        let issue = t.elapsed();
        floor_wait()?;
        best[2] = Some(Timed::best(best[2], Timed { issue, total: t.elapsed() }));
    }
    let [a, b, c] = best;
    Ok([a.context("a round")?, b.context("a round")?, c.context("a round")?])
}
