//! The CPU kernels' SIMD intrinsics, checked in the release binary that times them.
//!
//! An `std::arch` intrinsic (`_mm256_fmadd_ps`, …) is a function carrying its own target
//! features; it becomes one instruction only where it is inlined into code compiled with
//! those features. Code that loses them (a closure called through a generic helper such as
//! `RefCell::with_borrow_mut` does not inherit its caller's `#[target_feature]`) still
//! compiles, but each intrinsic becomes a call: the skinny matmul's panel kernel ran 25×
//! slower that way before it was caught. So `cargo xtask bench` reads the symbol table of
//! its own executable (the release build that times the kernels) and fails when any
//! `core::arch` intrinsic is there as a function of its own.

use anyhow::{Context, Result};
use object::{Object, ObjectSymbol};

/// What the symbol table shows.
pub struct Audit {
    /// Out-of-line copies of `core::arch` SIMD intrinsics (`_mm*`), mangled, sorted.
    pub out_of_line: Vec<String>,
    /// Symbols of tilekit's CPU kernels compiled for AVX2 or AVX-512 (the `multiversion!`
    /// copies): none means the table does not show the kernels (a stripped binary), and the
    /// audit proves nothing.
    pub kernel_copies: usize,
}

/// Audits this executable.
pub fn audit_self() -> Result<Audit> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let data = std::fs::read(&exe).with_context(|| format!("reading {}", exe.display()))?;
    let file = object::File::parse(&*data).with_context(|| format!("parsing {}", exe.display()))?;
    let names: Vec<&str> = file.symbols().filter(|s| s.is_definition()).filter_map(|s| s.name().ok()).collect();
    Ok(audit(names.iter().copied()))
}

/// The audit of a list of (mangled) symbol names.
fn audit<'a>(names: impl Iterator<Item = &'a str>) -> Audit {
    let mut out_of_line = Vec::new();
    let mut kernel_copies = 0;
    for name in names {
        // Legacy and v0 manglings both spell the path's identifiers out: `…4core9core_arch3x86
        // 3avx14_mm256_fmadd_ps…`. (`_xgetbv`, which feature detection calls, is no `_mm`.)
        if name.contains("core_arch") && name.contains("_mm") {
            out_of_line.push(name.to_string());
        }
        if name.contains("tilekit") && name.contains("backend") && (name.contains("avx2") || name.contains("avx512")) {
            kernel_copies += 1;
        }
    }
    out_of_line.sort();
    out_of_line.dedup();
    Audit { out_of_line, kernel_copies }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_out_of_line_intrinsics_in_either_mangling() {
        let names = [
            "_ZN4core9core_arch3x863fma15_mm256_fmadd_ps17h0123456789abcdefE",
            "_RNvNtNtNtCs1234_4core9core_arch3x863avx18_mm256_loadu_ps",
            "_ZN4core9core_arch3x866xsave7_xgetbv17h0123456789abcdefE",
            "_ZN7tilekit7backend3cpu4gemv10rows_block4avx217h0123456789abcdefE",
            "_ZN7tilekit7backend3cpu10activation3map8portable17h0123456789abcdefE",
            "memcpy",
        ];
        let a = audit(names.iter().copied());
        assert_eq!(a.out_of_line.len(), 2, "{:?}", a.out_of_line);
        assert!(a.out_of_line.iter().all(|n| n.contains("_mm256")));
        assert_eq!(a.kernel_copies, 1);
    }
}
