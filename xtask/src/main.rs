//! tilekit's task runner (`cargo xtask ...`; the alias lives in `.cargo/config.toml`).

mod device_check;
mod ptx;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "cargo xtask", about = "tilekit's tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Compiles shaders/cuda/*.cu to PTX with NVRTC (`--check`: verify the committed PTX).
    Ptx(ptx::Args),
    /// Builds the folder a GPU machine needs: test and bench binaries plus a runner script.
    DeviceCheck(device_check::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Ptx(args) => ptx::run(args),
        Command::DeviceCheck(args) => device_check::run(args),
    }
}
