//! Bounds on what a conversion will take from an image, so that a hostile
//! image is refused with one line instead of filling memory or disk.

/// Conversion limits. Each is checked while the layers are read, and the
/// first one exceeded stops the conversion with `Error::Limit`; nothing is
/// left in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Tar entries in all layers together (every header, whiteouts
    /// included). Memory for the in-memory tree grows with this: about
    /// 200 bytes an entry, so the default bounds it near 400 MiB.
    pub max_entries: u64,
    /// Apparent size of one regular file (holes count).
    pub max_file_bytes: u64,
    /// Apparent size of all regular files of the flattened root together.
    pub max_total_bytes: u64,
    /// Uncompressed bytes of one layer's tar stream: bounds the time a
    /// decompression bomb can take, since every layer is read twice.
    pub max_layer_bytes: u64,
    /// Layers in the image.
    pub max_layers: usize,
}

impl Default for Limits {
    /// 2,000,000 entries; 16 GiB a file; 64 GiB all files; 32 GiB a layer
    /// stream; 128 layers (Docker's own limit is 127 for overlayfs).
    fn default() -> Self {
        Limits {
            max_entries: 2_000_000,
            max_file_bytes: 16 << 30,
            max_total_bytes: 64 << 30,
            max_layer_bytes: 32 << 30,
            max_layers: 128,
        }
    }
}
