//! `lmi infer` (see the next commit).

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_a: Args) -> anyhow::Result<()> {
    anyhow::bail!("lmi infer is not available in this build")
}
