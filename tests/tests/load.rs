//! A long-lived server issues ops for days: a loop of 10,000 small ops (every op kind,
//! allocating and in-place) must keep the process's memory flat on every backend present,
//! and still give the same answer at the end as at the start. Two measures: the host's resident
//! memory, and tilekit's own count of live device buffers (`Device::live_buffer_bytes`), which
//! must return exactly to its baseline.

use tilekit::{Activation, Conv2dOptions, DType, Device, Layout, MatmulDesc, MatmulOptions, Tensor};
use tilekit_tests::{Rng, backends};

/// Ops in the measured loop, per backend.
const OPS: usize = 10_000;
/// Ops before the first measurement: pipelines built, pools and caches filled.
const WARM_UP: usize = 500;
/// The growth allowed over the loop. Generous: allocators and drivers keep free lists, and
/// the point is to catch a leak per op (10,000 leaked uniform buffers or tensors would be
/// tens to hundreds of MiB), not to measure.
const MAX_GROWTH: u64 = 48 << 20;

fn ok<T>(what: &str, r: tilekit::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Resident set size of this process in bytes, where `/proc` has it.
fn rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

struct Work {
    a: Tensor,
    b: Tensor,
    bias: Tensor,
    out: Tensor,
    img: Tensor,
    w: Tensor,
    conv_bias: Tensor,
    conv_out: Tensor,
    x: Tensor,
    y: Tensor,
}

impl Work {
    fn new(dev: &Device, dtype: DType) -> Work {
        let mut rng = Rng::new(11);
        let mut t = |shape: &[usize]| {
            let v: Vec<f32> = (0..shape.iter().product::<usize>()).map(|_| rng.uniform(-1.0, 1.0)).collect();
            ok("upload", dev.tensor_from_f32(shape, dtype, &v))
        };
        Work {
            a: t(&[4, 8]),
            b: t(&[8, 4]),
            bias: t(&[4]),
            out: t(&[4, 4]),
            img: t(&[1, 2, 5, 5]),
            w: t(&[2, 1, 3, 3]),
            conv_bias: t(&[2]),
            conv_out: t(&[1, 2, 5, 5]),
            x: t(&[64]),
            y: t(&[64]),
        }
    }

    /// Op number `i` of the loop: six in turn (matmul, conv, activation, copy), two of them
    /// allocating their output.
    fn op(&self, dev: &Device, i: usize) {
        let conv = Conv2dOptions::default().layout(Layout::Nchw).padding([1; 4]);
        match i % 6 {
            0 => {
                let mut d = MatmulDesc::new(4, 4, 8);
                d.bias_offset = Some(0);
                d.activation = Activation::Gelu;
                ok("matmul_into", dev.matmul_into(&d, &self.a, &self.b, Some(&self.bias), None, &self.out));
            }
            1 => drop(ok("matmul", dev.matmul(&self.a, &self.b, &MatmulOptions::default()))),
            2 => ok("conv", dev.depthwise_conv2d_into(&self.img, &self.w, None, &conv, &self.conv_out)),
            3 => drop(ok("conv", dev.depthwise_conv2d(&self.img, &self.w, Some(&self.conv_bias), &conv))),
            4 => ok("activation", dev.activation_into(&self.x, None, Activation::GeluTanh, &self.y)),
            _ => ok("copy", dev.copy(&self.x, &self.y)),
        }
    }

    fn results(&self) -> Vec<Vec<u8>> {
        [&self.out, &self.conv_out, &self.y].iter().map(|t| ok("download", t.to_bytes())).collect()
    }
}

#[test]
fn ten_thousand_ops_keep_memory_flat() {
    for be in backends() {
        // The packed-f16 device runs the 16-bit path; the others f32.
        let dtype = if be.label == "wgpu-packed-f16" { DType::F16 } else { DType::F32 };
        let dev = &be.device;
        let live_at_start = dev.live_buffer_bytes();
        let work = Work::new(dev, dtype);
        for i in 0..WARM_UP {
            work.op(dev, i);
        }
        ok("synchronize", dev.synchronize());
        let first = work.results();
        // tilekit's own device memory: the work tensors, nothing left over from the warm-up.
        let live_before = dev.live_buffer_bytes();
        assert!(live_before > live_at_start, "{}: the work tensors are counted", be.label);
        let Some(before) = rss() else {
            tilekit_tests::skip("load test", "no /proc/self/statm to read memory from");
            return;
        };
        for i in 0..OPS {
            work.op(dev, i);
            // Waits now and then, as a server does when it reads results.
            if i % 500 == 499 {
                ok("synchronize", dev.synchronize());
            }
        }
        ok("synchronize", dev.synchronize());
        let after = rss().unwrap_or(before);
        let growth = after.saturating_sub(before);
        eprintln!(
            "{}: {OPS} ops, resident memory {} KiB -> {} KiB (+{} KiB)",
            be.label,
            before >> 10,
            after >> 10,
            growth >> 10
        );
        assert!(growth <= MAX_GROWTH, "{}: memory grew by {} KiB over {OPS} ops", be.label, growth >> 10);
        assert!(work.results() == first, "{}: the results changed over the loop", be.label);
        let live_after = dev.live_buffer_bytes();
        eprintln!("{}: live tensor buffers {live_before} B -> {live_after} B", be.label);
        assert_eq!(live_after, live_before, "{}: tensor buffers leaked over {OPS} ops", be.label);
        drop(work);
        assert_eq!(dev.live_buffer_bytes(), live_at_start, "{}: dropping the tensors frees them", be.label);
    }
}
