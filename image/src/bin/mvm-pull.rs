//! mvm-pull: one image pulled from a registry into mvm's image store, in
//! a process of its own (mvm_image::pull_helper says why and how mvm
//! reads its answer).

use clap::Parser;
use mvm_image::pull_helper;

/// Pull an image from a registry into mvm's image store and print the
/// result as one line of JSON. mvm runs this for `mvm image pull` and
/// `mvm run --image HOST/NAME:TAG`; use those.
#[derive(Parser, Debug)]
#[command(name = "mvm-pull", version)]
struct Args {
    /// Speak plain HTTP to this registry (HOST[:PORT]); repeatable, and
    /// added to $MVM_INSECURE_REGISTRIES (comma-separated)
    #[arg(long, value_name = "HOST[:PORT]")]
    insecure_registry: Vec<String>,
    /// HOST[:PORT]/NAME[:TAG] or HOST[:PORT]/NAME@sha256:DIGEST
    #[arg(value_name = "REF")]
    reference: String,
}

fn main() {
    let args = Args::parse();
    let answer = pull_helper::pull(&args.reference, &args.insecure_registry);
    println!("{}", answer.to_line());
    std::process::exit(answer.exit_code());
}
