//! Instruction-set dispatch for the CPU kernels.
//!
//! The kernels are plain Rust loops over `f32` slices, written branch-free so LLVM vectorises
//! them; they are compiled several times, each copy inside a `#[target_feature]` function, and
//! [`Isa::detect`] picks one at run time (`std`'s feature detection caches its answer, so the
//! check is an atomic load). On x86-64 the copies are AVX-512 (512-bit vectors, FMA),
//! AVX2 + FMA (256-bit) and the SSE2 baseline (no FMA); on aarch64 NEON and FMA are the
//! baseline, so the portable copy already uses them. The kernels take a `const FMA: bool`
//! parameter: [`madd`] is one fused multiply-add where the copy has the instruction and a
//! multiply then an add where it has not (a software `fma` call would be far slower).

/// Whether the CPU has what [`Isa::Avx2`] promises: AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// The instruction sets the CPU kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// x86-64 with AVX-512F and AVX-512DQ (and AVX2, FMA, F16C): every AVX-512 CPU but the
    /// Xeon Phi has both.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// x86-64 with AVX2 and FMA (and F16C, which every such CPU has: the quantized kernels
    /// convert their f16 scales with it).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Whatever the target's baseline is (SSE2 on x86-64, NEON on aarch64).
    Portable,
}

impl Isa {
    /// The best instruction set this CPU has.
    #[inline]
    pub(crate) fn detect() -> Isa {
        #[cfg(test)]
        if let Some(isa) = FORCED.get() {
            return isa;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && has_avx2()
            {
                return Isa::Avx512;
            }
            if has_avx2() {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Every instruction set this CPU can run (tests run each kernel in each).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Isa> {
        let mut out = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if has_avx2() {
                out.push(Isa::Avx2);
            }
            if Isa::detect() == Isa::Avx512 {
                out.push(Isa::Avx512);
            }
        }
        out
    }
}

#[cfg(test)]
thread_local! {
    /// The instruction set [`Isa::detect`] reports on this thread, where a test has set one.
    static FORCED: std::cell::Cell<Option<Isa>> = const { std::cell::Cell::new(None) };
}

/// Whether the CPU is AMD's (CPUID vendor `AuthenticAMD`). A few of the kernels' limits were
/// measured to fall the other way on Zen 4 than on Intel's AVX-512 cores; each use says which
/// and by how much. Other vendors, and other architectures, take Intel's choices.
#[inline]
pub(crate) fn amd() -> bool {
    #[cfg(test)]
    if let Some(amd) = FORCED_AMD.get() {
        return amd;
    }
    #[cfg(target_arch = "x86_64")]
    {
        static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AMD.get_or_init(|| {
            // Leaf 0 gives the vendor string in EBX, EDX, ECX.
            let id = std::arch::x86_64::__cpuid(0);
            [id.ebx, id.edx, id.ecx]
                == [u32::from_le_bytes(*b"Auth"), u32::from_le_bytes(*b"enti"), u32::from_le_bytes(*b"cAMD")]
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The size of one core's L2 cache in bytes, where the CPU reports it (CPUID leaf
/// `0x8000_0006`, which Intel's and AMD's x86-64 cores both answer); `None` elsewhere.
pub(crate) fn l2_bytes() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        static L2: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
        *L2.get_or_init(|| {
            use std::arch::x86_64::__cpuid;
            // Leaf 0x8000_0000 gives the highest extended leaf; 0x8000_0006's ECX bits 31–16
            // the L2 size in KiB.
            if __cpuid(0x8000_0000).eax < 0x8000_0006 {
                return None;
            }
            let kib = (__cpuid(0x8000_0006).ecx >> 16) as usize;
            (kib > 0).then_some(kib * 1024)
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

#[cfg(test)]
thread_local! {
    /// What [`amd`] reports on this thread, where a test has set it.
    static FORCED_AMD: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with [`amd`] reporting each answer in turn on this thread: for tests of the
/// limits that differ between AMD's cores and the others.
#[cfg(test)]
pub(crate) fn as_each_vendor(mut f: impl FnMut(bool)) {
    for amd in [false, true] {
        FORCED_AMD.set(Some(amd));
        f(amd);
    }
    FORCED_AMD.set(None);
}

/// Runs `f` once in each instruction set this CPU has, with [`Isa::detect`] reporting it on
/// this thread: for tests of operations that detect their instruction set once, on the
/// calling thread, and hand it to their tasks.
#[cfg(test)]
pub(crate) fn in_each_isa(mut f: impl FnMut(Isa)) {
    for isa in Isa::available() {
        FORCED.set(Some(isa));
        f(isa);
    }
    FORCED.set(None);
}

/// Whether the portable copy has a hardware fused multiply-add (aarch64 always does).
pub(crate) const PORTABLE_FMA: bool = cfg!(target_arch = "aarch64");

/// `a·b + c`: fused (one rounding) when `FMA`, else a multiply and an add.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `max(a, b)` as one vector instruction: `b` when either is NaN (callers only use it where
/// that cannot change a result; see each use).
#[inline(always)]
pub(crate) fn fmax(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// `min(a, b)` as one vector instruction: `b` when either is NaN.
#[inline(always)]
pub(crate) fn fmin(a: f32, b: f32) -> f32 {
    if a < b { a } else { b }
}

/// Defines `$vis fn $name(isa: Isa, args…)` that runs `$inner::<FMA>(args…)` compiled for
/// `isa`: one `#[target_feature]` copy per instruction set. `$inner` must be
/// `#[inline(always)]` (and so must everything it calls), so that its whole body is compiled
/// inside the copy with that copy's features.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $inner:ident) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name(isa: $crate::backend::cpu::simd::Isa, $($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $inner::<true>($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $inner::<true>($($arg),*)
                }
                match isa {
                    // SAFETY: `Isa::Avx512` and `Isa::Avx2` are only made by `Isa::detect`
                    // (and `Isa::available`) after the CPU reported these features.
                    $crate::backend::cpu::simd::Isa::Avx512 => unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    $crate::backend::cpu::simd::Isa::Avx2 => unsafe { avx2($($arg),*) },
                    $crate::backend::cpu::simd::Isa::Portable => {
                        $inner::<{ $crate::backend::cpu::simd::PORTABLE_FMA }>($($arg),*)
                    }
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = isa;
                $inner::<{ $crate::backend::cpu::simd::PORTABLE_FMA }>($($arg),*)
            }
        }
    };
}
pub(crate) use multiversion;
