//! Layers to one tree, with OCI layer semantics.

pub(crate) mod apply;
pub(crate) mod entry;
pub(crate) mod paths;
pub(crate) mod stream;
pub(crate) mod tree;
