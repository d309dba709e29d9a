//! OCI images to read-only EROFS root filesystems for mvm guests.
//!
//! [`Store`] keeps imported images content-addressed on disk and converts
//! an image's layers, on first use, into one EROFS image that the guest
//! kernel mounts as its root. Everything is done as an unprivileged user
//! straight from the layer tarballs: nothing is unpacked to the host's disk,
//! so owners, device nodes and file capabilities come from the image, not
//! from the host.
//!
//! # Store layout
//!
//! Under the store's root (mode 0700, see [`Store::default_root`]):
//!
//! ```text
//! lock                      flock'ed by every change (import, remove, conversion)
//! names.json                {"images":[{"name":"alpine:3.20","manifest":"sha256:…"}]}
//!                           rewritten whole (temp file, fsync, rename) under the lock
//! blobs/sha256/HEX          manifests, configs and layers by digest, each verified
//!                           while copied (temp file in tmp/, then rename)
//! rootfs/HEX.erofs          a converted root, HEX being the manifest's digest
//! tmp/                      files being written; each is flock'ed by its writer, and
//!                           Store::open deletes the ones whose writer has died
//! ```
//!
//! An image in the store is its manifest (an OCI image manifest, or a
//! Docker v2 schema2 one; a Docker archive's images get an OCI manifest
//! written at import) with the config and layers it lists. Names are
//! NAME:TAG (`foo` means `foo:latest`; names are kept as given, no
//! registry prefix added or dropped); an image imported without any name is found
//! by its digest.

mod convert;
mod digest;
mod erofs;
mod error;
mod flatten;
mod limits;
mod manifest;
mod progress;
pub mod pull_helper;
mod registry;
mod source;
mod store;

pub use error::Error;
pub use limits::Limits;
pub use progress::{NoProgress, Progress, TerminalProgress};
pub use registry::{names_a_registry, PullOptions, CONNECT_TIMEOUT, READ_TIMEOUT};
pub use source::ImageSource;
pub use store::Store;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// An image in the store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Image {
    /// NAME:TAG, or None for an image known only by its digest.
    pub name: Option<String>,
    /// "sha256:HEX" of the manifest: the image's identity.
    pub manifest_digest: String,
    pub config_digest: String,
    pub config: ImageConfig,
    /// Bottom layer first.
    pub layers: Vec<LayerInfo>,
    /// The config's creation time (RFC 3339), if it has one.
    pub created: Option<String>,
    /// What the import that returned this image did; zero for images from
    /// `find` or `list`.
    pub imported: ImportStats,
}

/// What one import copied into the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportStats {
    /// Blobs (manifest, config, layers) new to the store; 0 when the image
    /// was already there.
    pub blobs_copied: usize,
    pub bytes_copied: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerInfo {
    pub digest: String,
    pub media_type: String,
    /// Bytes of the blob as stored (compressed, if the layer is).
    pub size: u64,
}

/// The parts of an image's config that say how to run it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub user: Option<String>,
}

/// A converted root filesystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rootfs {
    /// rootfs/HEX.erofs in the store.
    pub path: PathBuf,
    /// False when it came from the cache (an earlier conversion).
    pub converted: bool,
    /// Bytes on disk (holes take none).
    pub bytes: u64,
    /// Inodes in the image (hard links count once).
    pub entries: u64,
}
