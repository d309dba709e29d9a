//! The containment battery (issue 5): attack the sandbox from inside and
//! check on the host that every boundary held. One test per attack, each
//! with a positive control that would fail if the protection were gone;
//! each writes a report row (`battery::Check`: what was tried, where its
//! evidence comes from, its control, what was observed) before its
//! verdict, and `make battery` turns the rows into
//! target/containment/report.md (`make battery-doc`: docs/containment.md).
//!
//! Like the end-to-end tests these go through `tests/testhost/mvm` and
//! need `make`; they are `#[ignore]`d, and this target is left out of a
//! plain `cargo test` (`test = false`): `make battery` runs it with
//! `cargo test --test containment -- --ignored`.
//!
//! | check | module |
//! | --- | --- |
//! | 1 secrets, 2 writes, 7 `--write` control, 8 unsafe-mount contrast | `files` |
//! | 3 network and vsock | `network` |
//! | 3b egress as guest root | `egress` |
//! | 3c-a to 3c-e secrets as guest root | `secrets` |
//! | 4 fork bomb, 5 memory bomb, 10 floods, stdin, SIGTERM | `resources` |
//! | 6 root, capabilities, setuid | `privilege` |
//! | 9 a separate kernel: identity, panic, reboot, the status port | `kernel` |
//! | 11 bad frames to the host | `protocol` |
//!
//! `via` makes each check's VM with `mvm run` or, with
//! `MVM_BATTERY_VIA=sandbox`, in a named sandbox with `mvm exec`.

mod battery;
mod egress;
mod files;
mod kernel;
mod network;
mod privilege;
mod protocol;
mod resources;
mod secrets;
mod via;
