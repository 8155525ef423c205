//! One device, many threads: ops issued concurrently neither deadlock nor change results, and
//! the same op repeated gives bit-identical output.
//!
//! The CPU backend takes every lock of an op at once in a global order; this is the test that
//! would hang if it did not: threads run matmuls whose inputs are other threads' outputs, in
//! rotating roles, so a backend that locked in argument order would meet a cycle.

use std::sync::mpsc;
use std::time::Duration;
use tilekit::{Activation, Conv2dOptions, DType, Device, Layout, MatmulDesc, MatmulOptions, Tensor};
use tilekit_tests::{Rng, backends_for};

fn ok<T>(what: &str, r: tilekit::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn random(dev: &Device, shape: &[usize], seed: u64) -> Tensor {
    let mut rng = Rng::new(seed);
    let v: Vec<f32> = (0..shape.iter().product::<usize>()).map(|_| rng.uniform(-1.0, 1.0)).collect();
    ok("upload", dev.tensor_from_f32(shape, DType::F32, &v))
}

/// The checked work one thread does once: a fused matmul, a conv and an activation on shared
/// read-only inputs, returning the results' bytes.
fn checked_work(dev: &Device, x: &Tensor, w: &Tensor, bias: &Tensor) -> Vec<Vec<u8>> {
    let opts = MatmulOptions::default().bias(Some(bias)).activation(Activation::Gelu);
    let y = ok("matmul", dev.matmul(x, x, &opts));
    let img = ok("reshape", x.reshape(&[1, 4, 8, 8]));
    let conv = Conv2dOptions::default().padding([1; 4]).layout(Layout::Nchw);
    let z = ok("conv", dev.depthwise_conv2d(&img, w, None, &conv));
    let a = ok("activation", dev.activation(x, Some(bias), Activation::GeluTanh));
    [y, z, a].iter().map(|t| ok("download", t.to_bytes())).collect()
}

/// Eight threads on one device, mixing checked work with matmuls over a ring of buffers where
/// each thread's output is another thread's input. Every checked result must equal the
/// single-threaded one bit for bit, and everything must finish (a deadlock trips the watchdog).
#[test]
fn threads_share_a_device_without_deadlock_or_wrong_results() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 12;
    for be in backends_for(DType::F32) {
        let dev = be.device.clone();
        let x = random(&dev, &[16, 16], 1);
        let w = random(&dev, &[4, 1, 3, 3], 2);
        let bias = random(&dev, &[16], 3);
        let expected = checked_work(&dev, &x, &w, &bias);
        // The ring: thread t reads ring[t] and ring[t+1] and writes ring[t+2] (mod 3), so every
        // buffer is read by some threads while others write it, in every order.
        let ring: Vec<Tensor> = (0..3).map(|i| random(&dev, &[16, 16], 10 + i)).collect();
        let (done_tx, done_rx) = mpsc::channel();
        for t in 0..THREADS {
            let (dev, x, w, bias, ring, expected) =
                (dev.clone(), x.clone(), w.clone(), bias.clone(), ring.clone(), expected.clone());
            let done = done_tx.clone();
            std::thread::spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let desc = MatmulDesc::new(16, 16, 16);
                    for round in 0..ROUNDS {
                        let (a, b, out) = (&ring[t % 3], &ring[(t + 1) % 3], &ring[(t + 2) % 3]);
                        ok("ring matmul", dev.matmul_into(&desc, a, b, None, None, out));
                        ok("ring activation", dev.activation_in_place(out, None, Activation::Relu6));
                        if (round + t) % 3 == 0 {
                            let got = checked_work(&dev, &x, &w, &bias);
                            assert!(got == expected, "thread {t} round {round}: a result changed under load");
                        }
                    }
                    ok("synchronize", dev.synchronize());
                }));
                let _ = done.send((t, result.is_ok()));
            });
        }
        drop(done_tx);
        let mut finished = 0;
        while finished < THREADS {
            // A hang detector, not a speed check: the whole run takes well under a second here.
            match done_rx.recv_timeout(Duration::from_secs(300)) {
                Ok((t, true)) => {
                    let _ = t;
                    finished += 1;
                }
                Ok((t, false)) => panic!("{}: thread {t} failed (see its panic above)", be.label),
                Err(e) => panic!(
                    "{}: {} of {THREADS} threads still running after 300 s: deadlock? ({e})",
                    be.label,
                    THREADS - finished
                ),
            }
        }
        eprintln!("{}: {THREADS} threads × {ROUNDS} rounds of mixed ops finished", be.label);
    }
}

/// The same op on the same device gives bit-identical output over 10 repeats, every op and
/// dtype.
#[test]
fn repeated_ops_are_bit_identical() {
    for dtype in DType::ALL {
        for be in backends_for(dtype) {
            let dev = &be.device;
            let mut rng = Rng::new(5);
            let mut t = |shape: &[usize]| {
                let v: Vec<f32> = (0..shape.iter().product::<usize>()).map(|_| rng.uniform(-2.0, 2.0)).collect();
                ok("upload", dev.tensor_from_f32(shape, dtype, &v))
            };
            let (a, b, bias, img, w) = (t(&[3, 33, 47]), t(&[47, 65]), t(&[65]), t(&[2, 7, 9, 3]), t(&[6, 1, 3, 3]));
            let (a2, c) = (t(&[33, 47]), t(&[3, 33, 65]));
            let opts = MatmulOptions::default().bias(Some(&bias)).activation(Activation::Gelu);
            let conv = Conv2dOptions::default().layout(Layout::Nhwc).stride([2, 1]).padding([1, 0, 1, 1]);
            let residual = MatmulOptions::default().c(Some(&c)).beta(-0.5).trans_b(true);
            let nchw = Conv2dOptions::default().layout(Layout::Nchw).padding([1; 4]);
            // Every op: the fused matmul (with bias, and with a residual and B transposed), the
            // conv in both layouts, the activation out of and in place, the copy and the naive
            // matmul where the backend has one.
            let run = || -> Vec<Vec<u8>> {
                let y = ok("matmul", dev.matmul(&a, &b, &opts));
                let bt = ok("reshape", b.reshape(&[65, 47]));
                let r = ok("matmul with C", dev.matmul(&a, &bt, &residual));
                let z = ok("conv", dev.depthwise_conv2d(&img, &w, None, &conv));
                let img2 = ok("reshape", img.reshape(&[2, 3, 7, 9]));
                let z2 = ok("conv nchw", dev.depthwise_conv2d(&img2, &w, None, &nchw));
                let g = ok("activation", dev.activation(&a, None, Activation::GeluTanh));
                let ip = ok("copy target", dev.zeros(a.shape(), dtype));
                ok("copy", dev.copy(&a, &ip));
                ok("in place", dev.activation_in_place(&ip, None, Activation::Relu6));
                let mut all = vec![y, r, z, z2, g, ip];
                all.extend(ok("naive matmul", dev.naive_matmul(&a2, &b)));
                all.iter().map(|t| ok("download", t.to_bytes())).collect()
            };
            let first = run();
            for i in 1..10 {
                assert!(run() == first, "{} {dtype}: repeat {i} differs from the first run", be.label);
            }
        }
    }
}
