//! The CPU's compute roof: its f32 multiply-add peak, measured in the run on the threads the
//! CPU backend uses (rayon's pool), for the roofline chart and the results file.
//!
//! Each thread runs independent chains of vector fused multiply-adds on registers only (enough
//! chains to cover the instruction's latency on every port), in the widest instruction set the
//! CPU has: AVX-512F (16 lanes), AVX2 + FMA (8), NEON (4); elsewhere plain `a·b + c` in f32, which
//! the compiler vectorises as it can (2 FLOPs counted per multiply-add all the same). The peak is
//! the best of a few timed rounds. It is what the matmul kernels' inner loops can reach at best:
//! no loads, no stores, no reduction.

use std::hint::black_box;
use std::time::Instant;

/// One measured compute roof.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Peak {
    /// f32 GFLOP/s (a fused multiply-add is 2 FLOPs) over all threads.
    pub gflops: f64,
    /// How it was measured, e.g. `AVX2 FMA, 8 lanes, 2 threads`.
    pub how: String,
}

/// Chains of multiply-adds per thread with 32 vector registers (AVX-512, NEON, and the
/// portable loop): at least latency × ports (4 × 2 on current x86 cores).
const CHAINS: usize = 16;

/// Chains with AVX2's 16 registers (two more hold the constants).
const CHAINS_AVX2: usize = 12;

/// Multiply-adds per chain per call of a kernel.
const STEPS: usize = 1 << 16;

/// The CPU's f32 multiply-add peak over rayon's threads; `quick` times fewer rounds.
pub fn cpu(quick: bool) -> Peak {
    let threads = rayon::current_num_threads();
    let (lanes, chains, isa, kernel) = pick();
    let calls = if quick { 8 } else { 40 };
    let rounds = if quick { 2 } else { 5 };
    // One untimed round wakes the threads and raises the clocks.
    rayon::broadcast(|_| black_box(kernel(calls)));
    let best = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            rayon::broadcast(|_| black_box(kernel(calls)));
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    let flops = (2 * lanes * chains * STEPS * calls * threads) as f64;
    Peak { gflops: flops / best / 1e9, how: format!("{isa}, {lanes} lanes, {threads} threads") }
}

/// The widest kernel this CPU runs: (lanes, chains, name, kernel).
fn pick() -> (usize, usize, &'static str, fn(usize) -> f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return (16, CHAINS, "AVX-512 FMA", |n| {
                // SAFETY: the CPU reported AVX-512F.
                unsafe { x86::avx512(n) }
            });
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return (8, CHAINS_AVX2, "AVX2 FMA", |n| {
                // SAFETY: the CPU reported AVX2 and FMA.
                unsafe { x86::avx2(n) }
            });
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        return (4, CHAINS, "NEON FMA", neon);
    }
    #[allow(unreachable_code)]
    (1, CHAINS, "scalar multiply-add", portable)
}

/// `v·0.999 + 1e-3` keeps every chain finite and normal (it tends to 1).
const MUL: f32 = 0.999;
const ADD: f32 = 1e-3;

/// Chain `i`'s first value. Distinct and opaque (`black_box`), so the compiler can neither
/// merge equal chains nor fold them into constants: with equal starts, the first version
/// reported 13 TFLOP/s on two cores.
fn start(i: usize) -> f32 {
    1.0 + i as f32 / 64.0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ADD, CHAINS, CHAINS_AVX2, MUL, STEPS, start};
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// `calls × STEPS` multiply-adds on each of [`CHAINS_AVX2`] 8-lane registers.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2(calls: usize) -> f32 {
        let (m, a) = (_mm256_set1_ps(black_box(MUL)), _mm256_set1_ps(black_box(ADD)));
        let mut v: [__m256; CHAINS_AVX2] = std::array::from_fn(|i| _mm256_set1_ps(black_box(start(i))));
        for _ in 0..calls * STEPS {
            for x in v.iter_mut() {
                *x = _mm256_fmadd_ps(*x, m, a);
            }
        }
        let s = v.iter().fold(_mm256_setzero_ps(), |s, x| _mm256_add_ps(s, *x));
        _mm256_cvtss_f32(s)
    }

    /// As [`avx2`], on 16-lane registers.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512(calls: usize) -> f32 {
        let (m, a) = (_mm512_set1_ps(black_box(MUL)), _mm512_set1_ps(black_box(ADD)));
        let mut v: [__m512; CHAINS] = std::array::from_fn(|i| _mm512_set1_ps(black_box(start(i))));
        for _ in 0..calls * STEPS {
            for x in v.iter_mut() {
                *x = _mm512_fmadd_ps(*x, m, a);
            }
        }
        _mm512_reduce_add_ps(v.iter().fold(_mm512_setzero_ps(), |s, x| _mm512_add_ps(s, *x)))
    }
}

#[cfg(target_arch = "aarch64")]
fn neon(calls: usize) -> f32 {
    use std::arch::aarch64::*;
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe {
        let (m, a) = (vdupq_n_f32(black_box(MUL)), vdupq_n_f32(black_box(ADD)));
        let mut v: [float32x4_t; CHAINS] = std::array::from_fn(|i| vdupq_n_f32(black_box(start(i))));
        for _ in 0..calls * STEPS {
            for x in v.iter_mut() {
                *x = vfmaq_f32(a, *x, m);
            }
        }
        vaddvq_f32(v.iter().fold(vdupq_n_f32(0.0), |s, x| vaddq_f32(s, *x)))
    }
}

fn portable(calls: usize) -> f32 {
    let (m, a) = (black_box(MUL), black_box(ADD));
    let mut v: [f32; CHAINS] = std::array::from_fn(|i| black_box(start(i)));
    for _ in 0..calls * STEPS {
        for x in v.iter_mut() {
            *x = *x * m + a;
        }
    }
    v.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_positive_physical_and_names_its_kernel() {
        let p = cpu(true);
        assert!(p.gflops.is_finite() && p.gflops > 0.0, "{p:?}");
        assert!(p.how.contains("lanes") && p.how.contains("threads"), "{p:?}");
        // No core retires more than four vector multiply-adds a cycle or runs above 6 GHz: a
        // rate past that means the compiler removed work from the loop.
        let (lanes, ..) = pick();
        let bound = rayon::current_num_threads() as f64 * 4.0 * 2.0 * lanes as f64 * 6.0;
        assert!(p.gflops < bound, "{p:?} is above {bound} GFLOP/s");
    }

    #[test]
    fn the_chains_stay_finite() {
        let (_, _, _, kernel) = pick();
        let s = kernel(1);
        assert!(s.is_finite() && s > 0.0, "{s}");
        assert_eq!(portable(1), portable(1));
    }
}
