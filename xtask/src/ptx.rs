//! `cargo xtask ptx`: CUDA sources to PTX (being written).

/// Arguments of `cargo xtask ptx`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Regenerate into a temporary folder and fail if the committed PTX differs.
    #[arg(long)]
    pub check: bool,
}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("cargo xtask ptx is not written yet")
}
