//! The SASS audit behind `cargo xtask ptx --check`: what the machine code of every CUDA kernel
//! does, read from `nvdisasm -c` output, and the rules CI enforces on it.
//!
//! `ptxas -v` alone misses the costly cases: a dynamically indexed register array becomes a
//! *stack frame* (local memory, `STL`/`LDL`), which ptxas does not count as a spill, and it says
//! nothing about how wide the global loads are. So each PTX file is assembled for sm_80 and
//! sm_90 and disassembled, and per kernel this module counts a static instruction mix and finds
//! the loops (backward branches).
//!
//! # Rules
//! - **No local memory** in any kernel: stack frame 0 bytes (from ptxas) and no `LDL`/`STL`.
//! - **Wide loads in the main loop** for the matmul, conv, activation and copy kernels: some loop
//!   of the kernel holds a 128-bit global load (`LDG….128`) or a 128-bit `LDGSTS`. The kernels
//!   whose operands cannot be read 16 bytes at a time by design are listed in [`exemption`] with
//!   the reason, and the table shows the exemption.
//! - **HMMA in every tensor-core kernel** (the kernels of `matmul_mma.cu` but its split-K
//!   reduction, which is a streaming kernel).
//! - **No atomics** in any kernel (`ATOM`, `ATOMS`, `ATOMG`, `RED`, `REDG`, `REDAS`): a sum
//!   that threads add in the order they arrive changes in its last bits from run to run, and
//!   tilekit promises the same bits for the same call (`tests/tests/load.rs`,
//!   `concurrency.rs`). Partial sums meet in an order fixed by the launch instead: split-K
//!   workspace planes added in split order, warps adding into shared memory one after another.

use std::collections::BTreeMap;

/// A global load width in bits, as the index into [`Mix::ldg`]: 0 → ≤ 32, 1 → 64, 2 → 128.
const WIDTHS: [u32; 3] = [32, 64, 128];

/// The static instruction mix of one kernel (each instruction counted once, loops or not).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mix {
    /// All instructions (`NOP` padding excluded).
    pub total: u32,
    /// `FFMA` (f32 fused multiply-adds on the CUDA cores).
    pub ffma: u32,
    /// `HMMA` (tensor-core matrix multiply-accumulates).
    pub hmma: u32,
    /// Shared-memory loads: `LDS` (any width) and `LDSM` (`ldmatrix`).
    pub lds: u32,
    pub ldsm: u32,
    /// Global loads (`LDG`) by width: ≤ 32, 64, 128 bits.
    pub ldg: [u32; 3],
    /// Asynchronous global → shared copies (`LDGSTS`), all widths, and the 128-bit ones.
    pub ldgsts: u32,
    pub ldgsts128: u32,
    /// Local-memory loads and stores.
    pub ldl: u32,
    pub stl: u32,
    /// Atomic read-modify-writes on global or shared memory: `ATOM`, `ATOMS`, `ATOMG`, `RED`,
    /// `REDG` (sm_90's global reduction), `REDAS`.
    pub atomics: u32,
    /// Integer arithmetic, logic, address, predicate and branch instructions (the overhead
    /// around the math): `I*`, `LOP3`, `SHF`, `LEA`, `SEL`, `PLOP3`, `MOV`, their uniform `U*`
    /// twins, `BRA`, `BSSY`, `BSYNC`.
    pub int_branch: u32,
    /// `MUFU` (special-function unit: `ex2`, `rcp`, ...).
    pub mufu: u32,
    /// Some loop (a backward branch's range) holds a 128-bit `LDG` or `LDGSTS`.
    pub wide_load_in_loop: bool,
    /// The loops that hold a 128-bit `LDG` or `LDGSTS`, in address order.
    pub wide_loops: Vec<Loop>,
}

/// One loop (the range from a backward branch's target to the branch): the static counts of
/// one trip through it, when every instruction of the range issues once (a loop without
/// branches inside, such as the activation kernels' vector loops).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loop {
    /// Instructions (`NOP` excluded).
    pub insns: u32,
    /// `MUFU` instructions.
    pub mufu: u32,
    /// Global loads by width, as [`Mix::ldg`].
    pub ldg: [u32; 3],
    /// 128-bit global stores.
    pub stg128: u32,
    /// Backward branches inside the range other than the loop's own (nested loops). With none,
    /// a trip issues each instruction at most once, so the static count bounds its work.
    pub inner_loops: u32,
}

/// One instruction: its address and opcode with modifiers (`LDG.E.128`), predicate stripped.
struct Insn<'a> {
    addr: u32,
    op: &'a str,
    /// The label a branch goes to.
    target: Option<&'a str>,
}

/// Splits `nvdisasm -c` output into kernels (`.text.<name>` sections), in order.
pub fn split_kernels(sass: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in sass.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("//--------------------- .text.") {
            if let Some((k, body)) = current.take() {
                out.insert(k, body);
            }
            let name = rest.split_whitespace().next().unwrap_or_default().to_string();
            current = Some((name, String::new()));
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some((k, body)) = current {
        out.insert(k, body);
    }
    out
}

fn parse(body: &str) -> (Vec<Insn<'_>>, BTreeMap<&str, u32>) {
    let mut insns = Vec::new();
    let mut pending_labels = Vec::new();
    let mut labels = BTreeMap::new();
    for line in body.lines() {
        let t = line.trim();
        if let Some(label) = t.strip_suffix(':').filter(|l| l.starts_with(".L")) {
            pending_labels.push(label);
            continue;
        }
        // "/*0100*/   @P0 EXIT ;"
        let Some(rest) = t.strip_prefix("/*") else { continue };
        let Some((addr, rest)) = rest.split_once("*/") else { continue };
        let Ok(addr) = u32::from_str_radix(addr, 16) else { continue };
        let mut words = rest.split_whitespace();
        let mut op = words.next().unwrap_or_default();
        if op.starts_with('@') {
            op = words.next().unwrap_or_default();
        }
        let op = op.trim_end_matches(';');
        if op.is_empty() {
            continue;
        }
        for l in pending_labels.drain(..) {
            labels.insert(l, addr);
        }
        let target = rest.split("`(").nth(1).and_then(|s| s.split(')').next());
        insns.push(Insn { addr, op, target });
    }
    (insns, labels)
}

/// The width in bits of a load's modifiers (`LDG.E.128` → 128, `LDG.E.U16` → 32).
fn width_index(op: &str) -> usize {
    let mods: Vec<&str> = op.split('.').skip(1).collect();
    if mods.contains(&"128") {
        2
    } else if mods.contains(&"64") {
        1
    } else {
        0
    }
}

fn is_int_or_branch(base: &str) -> bool {
    let base = base.strip_prefix('U').filter(|b| !b.is_empty() && *b != "LDC").unwrap_or(base);
    base.starts_with('I') && base != "IDP"
        || matches!(base, "LOP3" | "LOP" | "SHF" | "LEA" | "SEL" | "PLOP3" | "MOV" | "BRA" | "BSSY" | "BSYNC" | "BMOV")
}

/// Counts the instruction mix of one kernel's disassembly.
pub fn mix(body: &str) -> Mix {
    let (insns, labels) = parse(body);
    let mut m = Mix::default();
    for i in &insns {
        let base = i.op.split('.').next().unwrap_or_default();
        if base == "NOP" {
            continue;
        }
        m.total += 1;
        match base {
            "FFMA" => m.ffma += 1,
            "HMMA" => m.hmma += 1,
            "LDS" => m.lds += 1,
            "LDSM" => m.ldsm += 1,
            "LDG" => m.ldg[width_index(i.op)] += 1,
            "LDGSTS" => {
                m.ldgsts += 1;
                if width_index(i.op) == 2 {
                    m.ldgsts128 += 1;
                }
            }
            "LDL" => m.ldl += 1,
            "MUFU" => m.mufu += 1,
            "STL" => m.stl += 1,
            "ATOM" | "ATOMS" | "ATOMG" | "RED" | "REDG" | "REDAS" => m.atomics += 1,
            _ if is_int_or_branch(base) => m.int_branch += 1,
            _ => {}
        }
    }
    // A loop is the range from a backward branch's target to the branch (the `BRA` to itself
    // after the last `EXIT` is the trap every kernel ends with, not a loop).
    let wide = |op: &str| (op.starts_with("LDG.") || op.starts_with("LDGSTS.")) && width_index(op) == 2;
    for b in &insns {
        let Some(&to) = b.target.and_then(|t| labels.get(t)) else { continue };
        if to >= b.addr {
            continue;
        }
        let body: Vec<&Insn<'_>> =
            insns.iter().filter(|i| i.addr >= to && i.addr <= b.addr && !i.op.starts_with("NOP")).collect();
        if !body.iter().any(|i| wide(i.op)) {
            continue;
        }
        let mut l = Loop { insns: body.len() as u32, ..Loop::default() };
        for i in &body {
            let base = i.op.split('.').next().unwrap_or_default();
            match base {
                "MUFU" => l.mufu += 1,
                "LDG" => l.ldg[width_index(i.op)] += 1,
                "STG" if width_index(i.op) == 2 => l.stg128 += 1,
                _ => {}
            }
            let back = i.target.and_then(|t| labels.get(t)).is_some_and(|&t| t < i.addr);
            if back && i.addr != b.addr {
                l.inner_loops += 1;
            }
        }
        m.wide_loops.push(l);
    }
    m.wide_load_in_loop = !m.wide_loops.is_empty();
    m
}

/// What a kernel is, for the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Tensor-core matmul (`matmul_mma.cu`): HMMA and 128-bit loads required.
    TensorCore,
    /// Matmul, conv, activation or copy: 128-bit loads in the main loop required.
    Streaming,
    /// Exempt from the load-width rule, for the reason given.
    Exempt(&'static str),
}

/// The kernels whose operands are not read 16 bytes at a time, and why.
pub fn exemption(kernel: &str) -> Option<&'static str> {
    if kernel.starts_with("naive_matmul_") {
        // The bench's naive reference: one scalar load per operand and step by design.
        Some("naive reference")
    } else if kernel.starts_with("matmul_skinny_") {
        // One output column per lane: 32-bit (f32) or 16-bit loads of B, coalesced across the
        // warp. Not vectorised yet.
        Some("skinny, one column per lane")
    } else if kernel.starts_with("gemv_finalize_") {
        // The split-K epilogue of the GEMV kernels: one output per thread, its f32 from each
        // split's workspace plane in turn (a short loop of scalar loads, coalesced across the
        // warp; the GEMV kernels themselves are audited as streaming kernels).
        Some("split-K epilogue, one output per thread")
    } else {
        None
    }
}

/// The class of kernel `kernel` in the PTX file `file` (its stem).
pub fn class(file: &str, kernel: &str) -> Class {
    if let Some(why) = exemption(kernel) {
        Class::Exempt(why)
    } else if file == "matmul_mma" && !kernel.starts_with("matmul_splitk_reduce_") {
        // The split-K reduction in the same file sums f32 workspace planes: no MMA.
        Class::TensorCore
    } else {
        Class::Streaming
    }
}

/// The rule violations of one kernel (empty when it passes).
pub fn violations(class: Class, stack_frame: u32, m: &Mix) -> Vec<String> {
    let mut v = Vec::new();
    if stack_frame > 0 || m.ldl > 0 || m.stl > 0 {
        v.push(format!("local memory: {stack_frame}-byte stack frame, {} LDL, {} STL", m.ldl, m.stl));
    }
    if !matches!(class, Class::Exempt(_)) && !m.wide_load_in_loop {
        v.push("no 128-bit global load (LDG.128 or LDGSTS.128) in any loop".to_string());
    }
    if class == Class::TensorCore && m.hmma == 0 {
        v.push("tensor-core kernel without HMMA".to_string());
    }
    if m.atomics > 0 {
        v.push(format!("{} atomic instruction(s): sums in arrival order are not reproducible", m.atomics));
    }
    v
}

/// The width columns' header, `32/64/128`.
pub fn widths_header() -> String {
    WIDTHS.iter().map(u32::to_string).collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel in `nvdisasm -c` form: a grid-stride loop around the given body.
    fn kernel(name: &str, body: &[&str]) -> String {
        let mut s = format!("//--------------------- .text.{name}   --------------------------\n");
        s += &format!("        .global         {name}\n{name}:\n.text.{name}:\n");
        let mut a = 0;
        let mut push = |s: &mut String, t: &str| {
            s.push_str(&format!("        /*{a:04x}*/                   {t} ;\n"));
            a += 0x10;
        };
        push(&mut s, "IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28]");
        s.push_str(".L_x_1:\n");
        for t in body {
            push(&mut s, t);
        }
        push(&mut s, "IADD3 R0, R0, 0x1, RZ");
        push(&mut s, "@P0 BRA `(.L_x_1)");
        push(&mut s, "EXIT");
        s.push_str(".L_x_2:\n");
        push(&mut s, "BRA `(.L_x_2)");
        push(&mut s, "NOP");
        s
    }

    fn audit(file: &str, name: &str, stack: u32, body: &[&str]) -> Vec<String> {
        let text = kernel(name, body);
        let kernels = split_kernels(&text);
        let m = mix(&kernels[name]);
        violations(class(file, name), stack, &m)
    }

    #[test]
    fn counts_the_mix() {
        let text = kernel(
            "k",
            &[
                "LDG.E.128 R4, [R2.64]",
                "LDG.E.64 R8, [R2.64+0x10]",
                "LDG.E.U16 R10, [R2.64+0x20]",
                "LDG.E.LTC128B R11, [R2.64+0x30]",
                "LDGSTS.E.BYPASS.128 [R5], [R2.64]",
                "LDGSTS.E [R5+0x10], [R2.64+0x40]",
                "LDSM.16.M88.4 R12, [R5]",
                "LDS.128 R16, [R5]",
                "HMMA.16816.F32 R20, R12, R16, R20",
                "FFMA R0, R1, R2, R0",
                "STL.128 [R1], R4",
                "LDL R4, [R1]",
                "ULDC UR4, c[0x0][0x0]",
                "UIADD3 UR4, UR4, 0x1, URZ",
            ],
        );
        let m = mix(&split_kernels(&text)["k"]);
        assert_eq!(m.ldg, [2, 1, 1]);
        assert_eq!((m.ldgsts, m.ldgsts128, m.ldsm, m.lds, m.hmma, m.ffma), (2, 1, 1, 1, 1, 1));
        assert_eq!((m.ldl, m.stl), (1, 1));
        // The loop: the 14 body instructions, the IADD3 and the loop's own BRA.
        assert_eq!(m.wide_loops, [Loop { insns: 16, mufu: 0, ldg: [2, 1, 1], stg128: 0, inner_loops: 0 }]);
        // IMAD.MOV, UIADD3, IADD3, two BRA (ULDC is a constant load, not overhead).
        assert_eq!(m.int_branch, 5);
        // 14 body instructions, the IMAD, the IADD3, two BRA and EXIT; NOP not counted.
        assert_eq!(m.total, 19);
        assert!(m.wide_load_in_loop);
    }

    #[test]
    fn a_clean_kernel_passes() {
        assert!(
            audit("elementwise", "activation_f32", 0, &["LDG.E.128 R4, [R2.64]", "STG.E.128 [R6.64], R4"]).is_empty()
        );
        assert!(
            audit(
                "matmul_mma",
                "matmul_f16_f16_nn",
                0,
                &["LDGSTS.E.BYPASS.128 [R5], [R2.64]", "HMMA.16816.F32 R20, R12, R16, R20"]
            )
            .is_empty()
        );
    }

    #[test]
    fn local_memory_fails() {
        // A stack frame alone (ptxas's report) fails, and so do LDL/STL without one.
        let v = audit("elementwise", "copy_bytes", 256, &["LDG.E.128 R4, [R2.64]"]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].starts_with("local memory: 256-byte"));
        let v = audit("matmul_simt", "matmul_f32", 0, &["LDGSTS.E.BYPASS.128 [R5], [R2.64]", "STL.128 [R1], R4"]);
        assert_eq!(v.len(), 1, "{v:?}");
        // Exempt kernels are exempt from the load-width rule only.
        let v = audit("matmul_simt", "naive_matmul_f32", 0, &["LDG.E R4, [R2.64]", "LDL R4, [R1]"]);
        assert_eq!(v.len(), 1, "{v:?}");
    }

    #[test]
    fn narrow_main_loops_fail() {
        let v = audit("depthwise", "depthwise_conv2d_f32_nchw", 0, &["LDG.E R4, [R2.64]", "LDG.E.64 R6, [R2.64]"]);
        assert_eq!(v, ["no 128-bit global load (LDG.128 or LDGSTS.128) in any loop"]);
        // A 128-bit load outside every loop does not count.
        let text = kernel("activation_f16", &["LDG.E.U16 R4, [R2.64]"]).replace("EXIT ;", "LDG.E.128 R8, [R2.64] ;");
        let m = mix(&split_kernels(&text)["activation_f16"]);
        assert_eq!(m.ldg[2], 1);
        assert!(!m.wide_load_in_loop);
        assert_eq!(violations(class("elementwise", "activation_f16"), 0, &m).len(), 1);
        // The naive reference is exempt.
        assert!(audit("matmul_simt", "naive_matmul_f32", 0, &["LDG.E R4, [R2.64]"]).is_empty());
    }

    #[test]
    fn the_split_k_reduction_streams() {
        assert_eq!(class("matmul_mma", "matmul_splitk_reduce_bf16"), Class::Streaming);
        assert_eq!(class("matmul_mma", "matmul_bf16_bf16_nn"), Class::TensorCore);
        assert!(audit("matmul_mma", "matmul_splitk_reduce_f16", 0, &["LDG.E.128 R4, [R2.64]"]).is_empty());
    }

    #[test]
    fn atomics_fail_in_every_class() {
        for (file, name) in
            [("gemv", "gemv_f32_kn_m4"), ("gemv", "gemv_finalize_f32"), ("matmul_mma", "matmul_f16_f16_nn")]
        {
            let body = ["LDG.E.128 R4, [R2.64]", "HMMA.16816.F32 R20, R12, R16, R20", "ATOMS.ADD.F32 RZ, [R3], R4"];
            assert_eq!(
                audit(file, name, 0, &body),
                ["1 atomic instruction(s): sums in arrival order are not reproducible"]
            );
        }
        let m = mix(&split_kernels(&kernel(
            "k",
            &["RED.E.ADD.F32.FTZ.RN.STRONG.GPU [R2.64], R5", "ATOM.E.ADD [R2.64], R5"],
        ))["k"]);
        assert_eq!(m.atomics, 2);
    }

    #[test]
    fn tensor_core_kernels_need_hmma() {
        let v = audit(
            "matmul_mma",
            "matmul_bf16_bf16_tt",
            0,
            &["LDGSTS.E.BYPASS.128 [R5], [R2.64]", "FFMA R0, R1, R2, R0"],
        );
        assert_eq!(v, ["tensor-core kernel without HMMA"]);
    }
}
