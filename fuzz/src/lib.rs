//! What mvm's fuzz targets share: the hostile guest driver (`driver`) and
//! the disk the block targets serve. The targets are in `fuzz_targets/`;
//! scripts/fuzz.sh builds and runs them (docs/testing.md).

pub mod disk;
pub mod driver;
