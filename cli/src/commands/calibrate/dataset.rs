//! `memwall calibrate dataset` (being written).

/// Arguments of `memwall calibrate dataset`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs the command.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("calibrate dataset is not built yet")
}
