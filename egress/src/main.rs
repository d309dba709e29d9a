//! mvm-egress: see the library (lib.rs) and docs/network.md.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use mvm_egress::{audit::Audit, cli, confine, proxy::Proxy};

fn main() -> ExitCode {
    let args = cli::Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mvm-egress: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &cli::Args) -> Result<(), String> {
    let setup = cli::setup(args)?;
    // One thread: the proxy waits on sockets, it does not compute; and a
    // single thread is all the seccomp filter has to cover.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the event loop: {e}"))?;
    // mvm's SIGTERM at the end of a run: cut what is open, log it, exit.
    // Registered before confinement (sigaction is not in the filter).
    let mut term = {
        let _context = runtime.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| format!("cannot handle SIGTERM: {e}"))?
    };
    if args.no_landlock {
        eprintln!(
            "mvm-egress: warning: --no-landlock: the proxy keeps its view of the host filesystem"
        );
    } else {
        confine::landlock().map_err(|e| e.to_string())?;
    }
    if args.no_seccomp {
        eprintln!("mvm-egress: warning: --no-seccomp: the proxy runs without a system call filter");
    } else {
        confine::seccomp().map_err(|e| e.to_string())?;
    }
    if let Some(path) = &args.confinement_probe {
        match std::fs::File::open(path) {
            Ok(_) => eprintln!("probe: open {}: ok", path.display()),
            Err(e) => eprintln!("probe: open {}: {e}", path.display()),
        }
        return Ok(());
    }
    let audit = Audit::new(args.run_id.clone(), setup.log, setup.summary);
    let proxy = Arc::new(Proxy::new(
        setup.policy,
        setup.resolver,
        setup.limits,
        audit,
        setup.intercept,
    ));
    runtime.block_on(async {
        let listener = tokio::net::UnixListener::from_std(setup.listener)
            .map_err(|e| format!("cannot use the listening socket: {e}"))?;
        let ender = proxy.clone();
        tokio::spawn(async move {
            if term.recv().await.is_some() {
                ender.end();
            }
        });
        proxy.serve(listener).await;
        Ok(())
    })
}
