//! The engine-interop check: an engine's own CUDA context, stream and slices, a tilekit matmul
//! and activation on them (`Device::from_cuda`, `Tensor::from_cuda_slice`,
//! `Tensor::from_cuda_device_ptr`), and the engine reading the result on its stream.

use crate::checks::{Checker, Rule};
use crate::data::ints;
use anyhow::{Context, Result};
use tilekit::cudarc::driver::{CudaContext, CudaSlice, DevicePtr};
use tilekit::{Activation, DType, Device, MatmulDesc, MatmulOptions, Tensor};

pub fn check_interop(ck: &mut Checker) -> Result<()> {
    // The engine's side: its own context handle, its own (non-default) stream, its own memory.
    let ctx = CudaContext::new(0).context("engine context")?;
    let stream = ctx.new_stream().context("engine stream")?;
    let dev = Device::from_cuda(ctx.clone(), stream.clone())?;
    let (m, n, k) = (67, 45, 33);
    let (a, b) = (ints(m * k, 11), ints(k * n, 12));
    let a_dev: CudaSlice<f32> = stream.clone_htod(&a)?;
    let b_dev: CudaSlice<f32> = stream.clone_htod(&b)?;
    let out_dev: CudaSlice<f32> = stream.alloc_zeros(m * n)?;
    // Handed over by value: tilekit keeps them alive; `out` comes back with `into_cuda_slice`.
    let ta = Tensor::from_cuda_slice(&dev, a_dev, &[m, k])?;
    let tb = Tensor::from_cuda_slice(&dev, b_dev, &[k, n])?;
    let tout = Tensor::from_cuda_slice(&dev, out_dev, &[m, n])?;
    let out_ptr = tout.cuda_device_ptr();
    dev.matmul_into(&MatmulDesc::new(m, n, k), &ta, &tb, None, None, &tout)?;
    // A second engine buffer, borrowed through its raw address, as an activation's output.
    let act_dev: CudaSlice<f32> = stream.alloc_zeros(m * n)?;
    let (act_ptr, _guard) = act_dev.device_ptr(&stream);
    // SAFETY: `act_dev` holds m·n f32 of this context and outlives `tact`, which is dropped
    // (and its work synchronised below) before `act_dev` is freed; nothing else touches it.
    let tact = unsafe { Tensor::from_cuda_device_ptr(&dev, act_ptr, m * n, DType::F32, &[m, n])? };
    dev.activation_into(&tout, None, Activation::Relu, &tact)?;
    drop((ta, tb));
    let out_back: CudaSlice<f32> = tout.into_cuda_slice().map_err(|(e, _)| e)?;
    // The engine reads on its own stream: the copies are ordered after tilekit's launches
    // without any host wait on tilekit's side.
    let got_mm = stream.clone_dtoh(&out_back)?;
    let got_act = stream.clone_dtoh(&act_dev)?;
    stream.synchronize()?;
    drop(tact);
    let same_memory = out_ptr == Some(out_back.device_ptr(&stream).0);
    println!("interop: engine context/stream, tilekit matmul + relu on engine slices; zero-copy: {same_memory}");

    let want_dev = &ck.cpu;
    let ca = want_dev.tensor_from_f32(&[m, k], DType::F32, &a)?;
    let cb = want_dev.tensor_from_f32(&[k, n], DType::F32, &b)?;
    let want = want_dev.matmul(&ca, &cb, &MatmulOptions::default())?;
    let want_act = want_dev.activation(&want, None, Activation::Relu)?;
    let rule = Rule::exact_sums(Activation::None, (k * 4) as f64);
    let same = if same_memory { Ok(()) } else { Err(anyhow::anyhow!("the output came back from other memory")) };
    ck.record(
        "interop matmul on engine slices".into(),
        same.map(|()| got_mm),
        Ok(want.to_f32_vec()?),
        DType::F32,
        rule,
    );
    ck.record(
        "interop relu into an engine pointer".into(),
        Ok(got_act),
        Ok(want_act.to_f32_vec()?),
        DType::F32,
        Rule::exact_sums(Activation::Relu, (k * 4) as f64),
    );
    Ok(())
}
