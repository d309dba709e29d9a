//! The virtio-mmio transport's register sequence, with the block device
//! behind it: any program of register writes and reads (any width, any
//! offset, config space included), resets, queue setups, descriptors,
//! avail-ring entries and notifications, as a hostile guest kernel would
//! write them. Findings: a panic, a hang, a runaway allocation, or a byte
//! of the read-only disk changed.

#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use mvm_devices::virtio::block;
use mvm_fuzz::disk;
use mvm_fuzz::driver::{guest_memory, queue_events, Driver, Op};

/// The most steps one input runs (each a handful of register accesses).
const MAX_OPS: usize = 512;

#[derive(Arbitrary, Debug)]
struct Input {
    /// Sectors of zeros the device advertises past the file's end.
    extra_sectors: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let file = disk::patterned();
    let check = file.try_clone().expect("dup the fuzz disk");
    let (evts, clones) = queue_events(block::defs::QUEUE_COUNT);
    let sectors = disk::SECTORS + u64::from(input.extra_sectors);
    let (device, handler) =
        block::new_with_capacity(file, "fuzz", evts, sectors).expect("the block device");
    let mut driver = Driver::new(guest_memory(), device, handler, clones);
    for op in input.ops.iter().take(MAX_OPS) {
        driver.apply(op);
    }
    driver.run();
    disk::assert_unchanged(&check);
});
