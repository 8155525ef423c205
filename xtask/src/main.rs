//! tilekit's task runner (`cargo xtask ...`; the alias lives in `.cargo/config.toml`).
//!
//! One module per subcommand: `testing` (`cargo xtask test`), `bench`, `run`, `ptx` (with its SASS audit, `sass`, and the host models of the fast GELU (erf and tanh forms) and SiLU, `fast_gelu_erf`, `fast_gelu` and `fast_silu`),
//! `device_check` and `tune`. Errors reach `main` as `anyhow` chains and leave as one line on stderr with
//! a non-zero exit status.

mod bench;
mod device_check;
mod fast_gelu;
mod fast_gelu_erf;
mod fast_silu;
mod npy;
mod ptx;
mod run;
mod sass;
#[cfg(test)]
mod sfu;
mod testing;
mod tune;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "cargo xtask", about = "tilekit's tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs the whole test suite and reports which backends it exercised (the README's test command).
    Test(testing::Args),
    /// Times every op against references measured in the same run (the README's main job).
    Bench(bench::Args),
    /// Runs one op on .npy files (a stable command line for scripts).
    Run(run::Args),
    /// Compiles shaders/cuda/*.cu to PTX with NVRTC (`--check`: verify the committed PTX).
    Ptx(ptx::Args),
    /// Builds the folder a GPU machine needs: test and bench binaries plus a runner script.
    DeviceCheck(device_check::Args),
    /// Times the wgpu tile configurations on the bench shapes and writes the tune cache.
    Tune(tune::Args),
}

fn main() {
    util::ensure_xdg_runtime_dir();
    let result = match Cli::parse().command {
        Command::Test(args) => testing::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Run(args) => run::run(args),
        Command::Ptx(args) => ptx::run(args),
        Command::DeviceCheck(args) => device_check::run(args),
        Command::Tune(args) => tune::run(args),
    };
    if let Err(e) = result {
        // `{:#}` joins the context chain into one line: "reading --a: cannot read a.npy: No such file".
        eprintln!("error: {}", util::one_line(&format!("{e:#}")));
        std::process::exit(1);
    }
}
