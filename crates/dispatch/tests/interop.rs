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
    let y = dev.matmul(&a, &b, &MatmulOptions::default().activation(Activation::Gelu).alpha(-1.0)).unwrap();
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

// ---- Tensors over an engine's own buffers (`Tensor::from_wgpu_buffer`) ----

use half::{bf16, f16};
use tilekit::{Conv2dOptions, Error, Layout, MatmulDesc, MatrixView, Tensor};

fn wgpu_device() -> Option<Device> {
    match Device::wgpu(&WgpuOptions::allow_software()) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIP wgpu: {e}");
            None
        }
    }
}

/// `values` encoded in `dtype`, little-endian.
fn encode(dtype: DType, values: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => bytemuck::cast_slice(values).to_vec(),
        DType::F16 => values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
        DType::Bf16 => values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
        other => unimplemented!("{other:?}"),
    }
}

/// An engine buffer: guard elements around views, read back whole by the engine itself.
struct EngineBuffer {
    buffer: wgpu::Buffer,
    dtype: DType,
    /// The whole buffer's elements as written (guards and views).
    image: Vec<f32>,
    /// Element ranges tilekit may write.
    writable: Vec<std::ops::Range<usize>>,
}

const GUARD: f32 = -77.0;

impl EngineBuffer {
    /// `elements` guard values (rounded up to 16 bytes), `STORAGE | COPY_SRC | COPY_DST`.
    fn new(dev: &Device, dtype: DType, elements: usize) -> EngineBuffer {
        let (device, queue) = dev.wgpu_device().unwrap();
        let bytes = (elements * dtype.size_bytes()).div_ceil(16) * 16;
        let elements = bytes / dtype.size_bytes();
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("engine buffer"),
            size: bytes as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let image = vec![GUARD; elements];
        queue.write_buffer(&buffer, 0, &encode(dtype, &image));
        EngineBuffer { buffer, dtype, image, writable: Vec::new() }
    }

    /// A view of `shape` at element `offset` holding `data`; `written` if ops may write it.
    fn view(&mut self, dev: &Device, offset: usize, shape: &[usize], data: &[f32], written: bool) -> Tensor {
        let (_, queue) = dev.wgpu_device().unwrap();
        let size = self.dtype.size_bytes();
        assert_eq!(data.len(), shape.iter().product::<usize>());
        self.image[offset..offset + data.len()].copy_from_slice(data);
        // write_buffer needs whole words: rewrite the words around the view from the image.
        let lo = offset * size / 4 * 4;
        let hi = ((offset + data.len()) * size).div_ceil(4) * 4;
        let all = encode(self.dtype, &self.image);
        queue.write_buffer(&self.buffer, lo as u64, &all[lo..hi]);
        if written {
            self.writable.push(offset..offset + data.len());
        }
        Tensor::from_wgpu_buffer(dev, self.buffer.clone(), (offset * size) as u64, shape, self.dtype).unwrap()
    }

    /// The whole buffer, read back by the engine's own copy.
    fn read(&self, dev: &Device) -> Vec<f32> {
        dev.flush().unwrap();
        let (device, queue) = dev.wgpu_device().unwrap();
        let readback = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("engine readback"),
            size: self.buffer.size(),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        encoder.copy_buffer_to_buffer(&self.buffer, 0, &readback, 0, self.buffer.size());
        queue.submit([encoder.finish()]);
        readback.slice(..).map_async(wgpu::MapMode::Read, |r| r.unwrap());
        device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
        let bytes = readback.slice(..).get_mapped_range().unwrap().to_vec();
        decode(self.dtype, &bytes)
    }

    /// Every element outside the writable views still holds what was written there.
    fn check_guards(&self, dev: &Device, what: &str) {
        let now = self.read(dev);
        for (i, (&got, &was)) in now.iter().zip(&self.image).enumerate() {
            if !self.writable.iter().any(|r| r.contains(&i)) {
                assert_eq!(got.to_bits(), was.to_bits(), "{what}: element {i} outside the views changed");
            }
        }
    }
}

fn decode(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F32 => bytemuck::pod_collect_to_vec(bytes),
        DType::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        DType::Bf16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        other => unimplemented!("{other:?}"),
    }
}

/// Small integers: every product and sum below is exact in f32, f16 and bf16.
fn ints(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + seed * 3) % 5) as f32 - 2.0).collect()
}

#[test]
fn imported_views_at_odd_offsets_run_every_op_and_leave_the_rest_of_the_buffer_alone() {
    let Some(dev) = wgpu_device() else { return };
    let cpu = Device::cpu();
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        for base in [0usize, 1, 3, 67] {
            let what = format!("{dtype} at element offset {base}");
            let (m, n, k) = (5, 7, 6);
            let mut eb = EngineBuffer::new(&dev, dtype, 1024);
            let (ad, bd, biasd) = (ints(m * k, 1), ints(k * n, 2), ints(n, 3));
            // Views at odd places, a guard element or more between them.
            let a = eb.view(&dev, base, &[m, k], &ad, false);
            let b = eb.view(&dev, base + 41, &[k, n], &bd, false);
            let bias = eb.view(&dev, base + 90, &[n], &biasd, false);
            let mut ob = EngineBuffer::new(&dev, dtype, 512);
            let out = ob.view(&dev, base + 5, &[m, n], &vec![0.0; m * n], true);
            assert_eq!(out.wgpu_byte_offset(), Some(((base + 5) * dtype.size_bytes()) as u64));

            // Dense matmul with bias and ReLU into the imported output.
            let opts = MatmulOptions::default().activation(Activation::Relu);
            let ca = cpu.tensor_from_f32(&[m, k], dtype, &ad).unwrap();
            let cb = cpu.tensor_from_f32(&[k, n], dtype, &bd).unwrap();
            let cbias = cpu.tensor_from_f32(&[n], dtype, &biasd).unwrap();
            let mut desc = MatmulDesc::new(m, n, k);
            desc.bias_offset = Some(0);
            desc.activation = Activation::Relu;
            dev.matmul_into(&desc, &a, &b, Some(&bias), None, &out).unwrap();
            let expected = cpu.matmul_bias(&ca, &cb, &cbias, &opts);
            assert_eq!(out.to_f32_vec().unwrap(), expected, "{what}: matmul");
            // A new output on tilekit's own buffer reads the same from imported inputs.
            let y = dev.matmul(&a, &b, &MatmulOptions::default()).unwrap();
            assert_eq!(
                y.to_f32_vec().unwrap(),
                cpu.matmul(&ca, &cb, &MatmulOptions::default()).unwrap().to_f32_vec().unwrap(),
                "{what}: matmul into a new tensor"
            );

            // Strided: the top-left 3 x 4 block of A times B's first 4 rows, into the
            // bottom-right 3 x 5 block of out (offsets count from each view's first element).
            let mut sd = MatmulDesc::new(3, 5, 4);
            sd.a = MatrixView::new(k + 1, k, 0);
            sd.b = MatrixView::new(1, n, 0);
            sd.out = MatrixView::new(2 * n + 2, n, 0);
            dev.matmul_into(&sd, &a, &b, None, None, &out).unwrap();
            let got = out.to_f32_vec().unwrap();
            let mut want = expected.clone();
            for i in 0..3 {
                for j in 0..5 {
                    let s: f32 = (0..4).map(|p| ad[(i + 1) * k + 1 + p] * bd[p * n + 1 + j]).sum();
                    want[(i + 2) * n + 2 + j] = s;
                }
            }
            assert_eq!(got, want, "{what}: strided matmul");

            // Activation with a bias: into the imported output, then in place.
            let x = eb.view(&dev, base + 101, &[m, n], &ints(m * n, 4), true);
            dev.activation_into(&x, Some(&bias), Activation::Relu, &out).unwrap();
            let want: Vec<f32> = ints(m * n, 4).iter().enumerate().map(|(i, &v)| (v + biasd[i % n]).max(0.0)).collect();
            assert_eq!(out.to_f32_vec().unwrap(), want, "{what}: activation");
            dev.activation_in_place(&x, None, Activation::Relu6).unwrap();
            let want: Vec<f32> = ints(m * n, 4).iter().map(|&v| v.clamp(0.0, 6.0)).collect();
            assert_eq!(x.to_f32_vec().unwrap(), want, "{what}: activation in place");
            let z = dev.activation(&x, None, Activation::None).unwrap();
            assert_eq!(z.to_f32_vec().unwrap(), want, "{what}: activation into a new tensor");

            // Depthwise convolution, both layouts: 2 channels, 5 x 5, 3 x 3 taps, padding 1.
            for layout in [Layout::Nchw, Layout::Nhwc] {
                let (c, h, w) = (2, 5, 5);
                let shape = match layout {
                    Layout::Nchw => [1, c, h, w],
                    _ => [1, h, w, c],
                };
                let id = ints(c * h * w, 5);
                let wd = ints(c * 9, 6);
                let input = eb.view(&dev, base + 150, &shape, &id, false);
                let weight = eb.view(&dev, base + 203, &[c, 1, 3, 3], &wd, false);
                let cbias2 = eb.view(&dev, base + 223, &[c], &[1.0, -1.0], false);
                let copts = Conv2dOptions::default().padding([1; 4]).layout(layout);
                let co = ob.view(&dev, base + 101, &shape, &vec![0.0; c * h * w], true);
                dev.depthwise_conv2d_into(&input, &weight, Some(&cbias2), &copts, &co).unwrap();
                let ci = cpu.tensor_from_f32(&shape, dtype, &id).unwrap();
                let cw = cpu.tensor_from_f32(&[c, 1, 3, 3], dtype, &wd).unwrap();
                let cbb = cpu.tensor_from_f32(&[c], dtype, &[1.0, -1.0]).unwrap();
                let want = cpu.depthwise_conv2d(&ci, &cw, Some(&cbb), &copts).unwrap().to_f32_vec().unwrap();
                assert_eq!(co.to_f32_vec().unwrap(), want, "{what}: depthwise {layout:?}");
            }
            // The gated op (SwiGLU's second half), ReLU-gated so integers stay exact: F = 4
            // takes the vector path at offsets that are multiples of 4, the scalar one elsewhere.
            let (rows, f) = (3, 4);
            let hd = ints(rows * 2 * f, 7);
            let h = eb.view(&dev, base + 260, &[rows, 2 * f], &hd, false);
            let go = ob.view(&dev, base + 300, &[rows, f], &vec![0.0; rows * f], true);
            dev.glu_into(&h, Activation::Relu, &go).unwrap();
            let want: Vec<f32> =
                (0..rows * f).map(|i| hd[(i / f) * 2 * f + i % f].max(0.0) * hd[(i / f) * 2 * f + f + i % f]).collect();
            assert_eq!(go.to_f32_vec().unwrap(), want, "{what}: glu");
            eb.check_guards(&dev, &what);
            ob.check_guards(&dev, &what);
        }
    }
}

trait MatmulBias {
    fn matmul_bias(&self, a: &Tensor, b: &Tensor, bias: &Tensor, opts: &MatmulOptions) -> Vec<f32>;
}

impl MatmulBias for Device {
    fn matmul_bias(&self, a: &Tensor, b: &Tensor, bias: &Tensor, opts: &MatmulOptions) -> Vec<f32> {
        let (m, n) = (a.shape()[0], b.shape()[1]);
        let out = self.zeros(&[m, n], a.dtype()).unwrap();
        let mut desc = MatmulDesc::new(m, n, a.shape()[1]);
        desc.bias_offset = Some(0);
        desc.activation = opts.activation;
        self.matmul_into(&desc, a, b, Some(bias), None, &out).unwrap();
        out.to_f32_vec().unwrap()
    }
}

#[test]
fn importing_a_buffer_checks_usage_alignment_bounds_and_device() {
    let Some(dev) = wgpu_device() else { return };
    let (device, _) = dev.wgpu_device().unwrap();
    let make = |size: u64, usage: wgpu::BufferUsages| {
        device.create_buffer(&wgpu::BufferDescriptor { label: None, size, usage, mapped_at_creation: false })
    };
    let storage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
    let op = "from_wgpu_buffer";
    assert_eq!(
        Tensor::from_wgpu_buffer(&dev, make(64, wgpu::BufferUsages::COPY_SRC), 0, &[4], DType::F32).unwrap_err(),
        Error::BufferUsage { op, usage: "STORAGE" }
    );
    assert_eq!(
        Tensor::from_wgpu_buffer(&dev, make(64, storage), 2, &[4], DType::F32).unwrap_err(),
        Error::MisalignedOffset { op, offset: 2, align: 4 }
    );
    assert_eq!(
        Tensor::from_wgpu_buffer(&dev, make(64, storage), 1, &[4], DType::Bf16).unwrap_err(),
        Error::MisalignedOffset { op, offset: 1, align: 2 }
    );
    assert_eq!(
        Tensor::from_wgpu_buffer(&dev, make(64, storage), 8, &[15], DType::F32).unwrap_err(),
        Error::ViewOutOfBounds { op, tensor: "buffer", needed: 17, len: 16 }
    );
    // Inside the buffer but short of the 16-byte boundary the kernels read to.
    assert!(matches!(
        Tensor::from_wgpu_buffer(&dev, make(20, storage), 0, &[5], DType::F32).unwrap_err(),
        Error::InvalidParameter { param: "buffer", .. }
    ));
    // A buffer of another wgpu device (of another instance, too).
    if let Some(other) = wgpu_device() {
        let (od, _) = other.wgpu_device().unwrap();
        let foreign = od.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 64,
            usage: storage,
            mapped_at_creation: false,
        });
        assert_eq!(
            Tensor::from_wgpu_buffer(&dev, foreign, 0, &[4], DType::F32).unwrap_err(),
            Error::DeviceMismatch { op, tensor: "buffer" }
        );
    }
    // Not a wgpu device.
    assert!(matches!(
        Tensor::from_wgpu_buffer(&Device::cpu(), make(64, storage), 0, &[4], DType::F32).unwrap_err(),
        Error::BackendUnavailable { .. }
    ));
    // Reading back needs COPY_SRC.
    let t = Tensor::from_wgpu_buffer(&dev, make(64, wgpu::BufferUsages::STORAGE), 0, &[4], DType::F32).unwrap();
    assert_eq!(t.to_f32_vec().unwrap_err(), Error::BufferUsage { op: "download", usage: "COPY_SRC" });
    // Two imports of one buffer: writing one while reading the other is refused, in place is fine.
    let shared = make(256, storage);
    let x = Tensor::from_wgpu_buffer(&dev, shared.clone(), 0, &[8], DType::F32).unwrap();
    let y = Tensor::from_wgpu_buffer(&dev, shared.clone(), 64, &[8], DType::F32).unwrap();
    let x2 = Tensor::from_wgpu_buffer(&dev, shared, 0, &[8], DType::F32).unwrap();
    assert!(matches!(
        dev.activation_into(&x, None, Activation::Relu, &y).unwrap_err(),
        Error::Aliasing { op: "activation", .. }
    ));
    dev.activation_into(&x, None, Activation::Relu, &x2).unwrap();
    dev.synchronize().unwrap();
}

// ---- Recording into an engine's encoder (`Device::record`) ----

#[test]
fn one_engine_encoder_holds_an_engine_copy_a_tilekit_matmul_and_activation_and_an_engine_read() {
    let Some(dev) = wgpu_device() else { return };
    let (device, queue) = dev.wgpu_device().unwrap();
    let (m, n, k) = (4, 6, 5);
    // The engine's A starts as zeros; its first pass in the encoder fills it.
    let mut ea = EngineBuffer::new(&dev, DType::F32, 64);
    let a = ea.view(&dev, 3, &[m, k], &vec![0.0; m * k], true);
    let ad = ints(m * k, 7);
    let upload = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("engine upload"),
        size: 256,
        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut image = ea.image.clone();
    image[3..3 + m * k].copy_from_slice(&ad);
    queue.write_buffer(&upload, 0, &encode(DType::F32, &image));
    let bd = ints(k * n, 8);
    let b = dev.tensor_from_f32(&[k, n], DType::F32, &bd).unwrap();
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("engine readback"),
        size: (m * n * 4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });

    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("engine") });
    encoder.copy_buffer_to_buffer(&upload, 0, &ea.buffer, 0, ea.buffer.size());
    let z = dev
        .record(&mut encoder, |dev| {
            let y = dev.matmul(&a, &b, &MatmulOptions::default().alpha(-1.0))?;
            // Reading back inside the recording is refused, not answered with stale data.
            assert!(matches!(y.to_f32_vec(), Err(Error::InvalidParameter { .. })));
            let z = dev.activation(&y, None, Activation::Relu)?;
            Ok(z)
        })
        .unwrap();
    encoder.copy_buffer_to_buffer(z.wgpu_buffer().unwrap(), 0, &readback, 0, (m * n * 4) as u64);
    // One submit runs the engine copy, tilekit's ops and the engine read, in that order: A
    // held zeros until the engine's copy, so a product that ran before it reads back zeros.
    queue.submit([encoder.finish()]);
    readback.slice(..).map_async(wgpu::MapMode::Read, |r| r.unwrap());
    device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&readback.slice(..).get_mapped_range().unwrap());
    let mut want = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f32 = (0..k).map(|p| ad[i * k + p] * bd[p * n + j]).sum();
            want[i * n + j] = (-s).max(0.0);
        }
    }
    assert!(want.iter().any(|&v| v > 0.0), "the check must see nonzero values");
    assert_eq!(got, want);
    // After the engine's submit the tensor reads back as usual, and tilekit works as before.
    assert_eq!(z.to_f32_vec().unwrap(), want);
    // Another device kind cannot record; a nested recording is refused.
    let mut enc2 = device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
    assert!(matches!(Device::cpu().record(&mut enc2, |_| Ok(())), Err(Error::BackendUnavailable { .. })));
    let nested = dev.record(&mut enc2, |d| {
        let mut enc3 = device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        d.record(&mut enc3, |_| Ok(()))
    });
    assert!(matches!(nested, Err(Error::InvalidParameter { op: "record", .. })));
    queue.submit([enc2.finish()]);
}
