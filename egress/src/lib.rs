//! mvm-egress: the host side of a guest's controlled egress. One process
//! per run, listening on a Unix socket (the VMM forwards each connection
//! the guest opens on the egress vsock port to it); each stream is one
//! client connection speaking the HTTP proxy protocol, checked against an
//! allowlist, logged, and bounded (docs/network.md).

pub mod audit;
pub mod cli;
pub mod confine;
pub mod dns_wire;
pub mod intercept;
pub mod limits;
pub mod net;
pub mod pattern;
pub mod policy;
pub mod proxy;
pub mod request;
pub mod resolve;
pub mod response;
pub mod secrets;
pub mod special;
pub mod tls;
pub mod tunnel;
