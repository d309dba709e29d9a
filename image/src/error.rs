//! The crate's one error type. Every message is one line that says what
//! went wrong and, where there is one, what to do about it: the VMM prints
//! them as they are.

use std::io;
use std::path::{Path, PathBuf};

#[derive(thiserror::Error, Debug)]
pub enum Error {
    #[error("image '{reference}' is not in the store: import it with `mvm image import oci:DIR` (see `mvm image ls`)")]
    NotInStore { reference: String },

    #[error("'{prefix}' matches {count} images in the store: give more hex digits of the digest")]
    Ambiguous { prefix: String, count: usize },

    #[error("'{reference}' is not an image reference: {why}")]
    BadReference { reference: String, why: String },

    #[error("cannot find the image store: set MVM_IMAGES, XDG_DATA_HOME or HOME")]
    NoStoreRoot,

    #[error("{what} does not match its digest (the source is damaged); nothing was stored")]
    DigestMismatch { what: String, digest: String },

    #[error("{what} {digest} is not the {expected} bytes its descriptor says (the source is damaged); nothing was stored")]
    SizeMismatch {
        what: String,
        digest: String,
        expected: u64,
        actual: u64,
    },

    #[error("{what} {digest} is missing from {source_desc}; nothing was stored")]
    MissingBlob {
        what: String,
        digest: String,
        source_desc: String,
    },

    #[error("image is {platform}: mvm runs linux/amd64 images only")]
    Platform { platform: String },

    #[error("unsupported {what} media type '{media_type}': mvm takes OCI and Docker v2 images with tar, tar+gzip or tar+zstd layers")]
    MediaType { what: String, media_type: String },

    #[error("no space left on the store's disk ({}): free space and retry; nothing was stored", dir.display())]
    NoSpace { dir: PathBuf },

    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },

    #[error("{source_desc}: {why}")]
    BadSource { source_desc: String, why: String },

    #[error("image {digest}: {why}")]
    BadImage { digest: String, why: String },

    #[error("layer {layer}: {why}; refusing the image (nothing was stored)")]
    BadLayer { layer: String, why: String },

    #[error("image exceeds a conversion limit: {what} (limit {limit}, Limits::{field}); nothing was stored")]
    Limit {
        what: String,
        limit: u64,
        field: &'static str,
    },

    /// A registry's answer, or its silence, as one line with the fix.
    #[error("registry {host}: {why}")]
    Registry { host: String, why: String },

    /// An auth file that cannot be used (never quotes its contents).
    #[error("{why}")]
    Auth { why: String },

    #[error("image store {}: {why}", dir.display())]
    Store { dir: PathBuf, why: String },
}

impl Error {
    /// An I/O error with what we were doing; a full disk becomes `NoSpace`
    /// so that the one line tells the user the fix.
    pub(crate) fn io(what: impl Into<String>, store: Option<&Path>, e: io::Error) -> Error {
        match (e.raw_os_error(), store) {
            (Some(libc::ENOSPC) | Some(libc::EDQUOT), Some(dir)) => Error::NoSpace {
                dir: dir.to_path_buf(),
            },
            _ => Error::Io {
                what: what.into(),
                source: e,
            },
        }
    }
}

/// A path or name from an image, printable on one line whatever bytes it
/// holds (a hostile layer may put newlines or escapes in names).
pub(crate) fn show(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(s.len());
    for c in s.chars().take(200) {
        out.extend(c.escape_debug());
    }
    if s.chars().count() > 200 {
        out.push_str("...");
    }
    out
}

/// The first 12 hex digits of a digest, enough to name a blob in a message.
pub(crate) fn short(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    format!("sha256:{}", &hex[..hex.len().min(12)])
}
