//! Engine interop on wgpu: an engine reads tilekit's output buffer with its own commands on
//! tilekit's own queue, after `Device::flush`, without going through `Tensor::to_vec`.

#![allow(clippy::unwrap_used)]

use tilekit::{Activation, DType, Device, MatmulOptions, WgpuOptions};

#[test]
fn an_engine_reads_the_output_buffer_with_its_own_commands() {
    let dev = match Device::wgpu(&WgpuOptions::allow_software()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIP wgpu: {e}");
            return;
        }
    };
    let a = dev.tensor_from_f32(&[2, 3], DType::F32, &[1., 2., 3., 4., 5., 6.]).unwrap();
    let b = dev.tensor_from_f32(&[3, 2], DType::F32, &[1., 0., 0., 1., -1., -1.]).unwrap();
    let y =
        dev.matmul(&a, &b, &MatmulOptions { activation: Activation::Gelu, alpha: -1.0, ..Default::default() }).unwrap();
    // The op is recorded, not necessarily submitted: flush hands it to the queue.
    dev.flush().unwrap();

    let (device, queue) = dev.wgpu_device().unwrap();
    let src = y.wgpu_buffer().unwrap();
    let bytes = (y.len() * DType::F32.size_bytes()) as u64;
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("engine readback"),
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("engine") });
    encoder.copy_buffer_to_buffer(src, 0, &readback, 0, bytes);
    queue.submit([encoder.finish()]);
    readback.slice(..).map_async(wgpu::MapMode::Read, |r| r.unwrap());
    device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&readback.slice(..).get_mapped_range().unwrap());
    // -([1 2 3; 4 5 6] · [1 0; 0 1; -1 -1]) = [2 1; 2 1], then gelu: nonzero, so a read that
    // raced ahead of the op (zeros) cannot pass.
    let expected: Vec<f32> = [2.0f32, 1.0, 2.0, 1.0].iter().map(|&x| Activation::Gelu.apply_f32(x)).collect();
    for (g, e) in got.iter().zip(&expected) {
        assert!((g - e).abs() <= 1e-6, "{got:?} vs {expected:?}");
    }
    assert_eq!(y.to_f32_vec().unwrap(), got);
    // Other backends have no wgpu handles.
    assert!(Device::cpu().wgpu_device().is_none());
    assert!(Device::cpu().flush().is_ok());
}
