//! Runs the built `mobilenet_v2` example (as CI does, at a reduced 32×40 input) on the CPU and
//! on wgpu (lavapipe in CI) against the f64 reference forward pass, and checks its one-line
//! errors and non-zero exit status. `cargo test -p tilekit` builds the example first; with a
//! narrower target selection build it with `cargo build -p tilekit --example mobilenet_v2`.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tilekit::{DType, Device, WgpuOptions};
use tilekit_models::{Weights, npy, reference, synthetic};

/// `target/<profile>/examples/mobilenet_v2`, next to this test's `deps/` folder.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let path = dir.join("examples").join(format!("mobilenet_v2{}", std::env::consts::EXE_SUFFIX));
    assert!(path.exists(), "{} is not built: run `cargo build -p tilekit --example mobilenet_v2`", path.display());
    path
}

fn run(args: &[&str]) -> Output {
    Command::new(example()).args(args).output().unwrap()
}

struct Files {
    dir: PathBuf,
    weights: PathBuf,
    input: PathBuf,
}

fn files(tag: &str, entries: &[synthetic::Entry]) -> Files {
    let dir = std::env::temp_dir().join(format!("tilekit-mnet-example-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let weights = dir.join("w.safetensors");
    std::fs::write(&weights, synthetic::to_safetensors(entries).unwrap()).unwrap();
    let input = dir.join("x.npy");
    npy::write(&input, &[2, 3, 32, 40], &synthetic::input(3, 2, 32, 40)).unwrap();
    Files { dir, weights, input }
}

#[test]
fn the_example_matches_the_reference_on_cpu_and_wgpu() {
    let dict = synthetic::state_dict(21);
    let f = files("ok", &dict);
    let weights = Weights::load(&f.weights).unwrap();
    let want = reference::forward(&weights, DType::F32, [2, 3, 32, 40], &synthetic::input(3, 2, 32, 40));
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let mut backends = vec!["cpu"];
    match Device::wgpu(&WgpuOptions::allow_software()) {
        Ok(_) => backends.push("wgpu"),
        Err(e) => {
            // A visible skip, counted by `cargo xtask test` through its skip log.
            let line = format!("SKIP wgpu (mobilenet_v2 example): {e}");
            eprintln!("{line}");
            if let Some(log) = std::env::var_os("TILEKIT_SKIP_LOG") {
                use std::io::Write as _;
                let f = std::fs::OpenOptions::new().create(true).append(true).open(log);
                f.and_then(|mut f| writeln!(f, "{line}")).unwrap();
            }
        }
    }
    for backend in backends {
        for layout in ["nchw", "nhwc"] {
            let out = f.dir.join(format!("logits-{backend}-{layout}.npy"));
            let mut argv = vec![
                "--weights",
                f.weights.to_str().unwrap(),
                "--input",
                f.input.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--backend",
                backend,
                "--layout",
                layout,
                "--top",
                "3",
            ];
            // NCHW runs the fused blocks (the default), NHWC the three-op chain.
            if layout == "nhwc" {
                argv.push("--unfused");
            }
            let o = run(&argv);
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "{backend} {layout}: {stderr}");
            let stdout = String::from_utf8_lossy(&o.stdout);
            assert_eq!(stdout.lines().count(), 2, "{stdout}");
            assert!(stdout.starts_with("image 0: "), "{stdout}");
            let (shape, got) = npy::read(&out).unwrap();
            assert_eq!(shape, [2, 1000]);
            let err = got.iter().zip(&want).fold(0.0f64, |m, (g, r)| m.max((*g as f64 - r).abs())) / scale;
            assert!(err <= 1e-5, "{backend} {layout}: relative logit error {err:e}");
        }
    }
    std::fs::remove_dir_all(&f.dir).ok();
}

#[test]
fn the_example_fails_with_one_line_naming_the_tensor() {
    let dict = synthetic::state_dict(22);
    let missing: Vec<_> = dict.iter().filter(|e| e.0 != "features.7.conv.2.weight").cloned().collect();
    let f = files("missing", &missing);
    let out = f.dir.join("logits.npy");
    let args = |w: &Path, x: &Path| {
        vec![
            "--weights".to_string(),
            w.display().to_string(),
            "--input".into(),
            x.display().to_string(),
            "--out".into(),
            out.display().to_string(),
            "--backend".into(),
            "cpu".into(),
        ]
    };
    let check = |args: Vec<String>, needle: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = run(&args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(needle), "{stderr} lacks {needle}");
    };
    check(args(&f.weights, &f.input), "missing tensor features.7.conv.2.weight (expected shape [64, 192, 1, 1])");
    check(args(&f.input, &f.input), "not a safetensors file");
    let mut bad_flag = args(&f.weights, &f.input);
    bad_flag.push("--dtype".into());
    bad_flag.push("f64".into());
    check(bad_flag, "--dtype f64");
    let small = f.dir.join("small.npy");
    npy::write(&small, &[1, 3, 16, 16], &[0.0; 768]).unwrap();
    let good = f.dir.join("good.safetensors");
    std::fs::write(&good, synthetic::to_safetensors(&dict).unwrap()).unwrap();
    check(args(&good, &small), "H, W >= 32");
    assert!(!out.exists());
    std::fs::remove_dir_all(&f.dir).ok();
}
