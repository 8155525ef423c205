//! `cargo xtask device-check`: the folder a GPU machine runs (being written).

/// Arguments of `cargo xtask device-check`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("cargo xtask device-check is not written yet")
}
