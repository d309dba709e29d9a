//! mvm's status port: how guest-init tells the VMM what happened, without
//! parsing console text.
//!
//! Offset 0, byte write: a boot-progress marker; the VMM timestamps the
//! first write of each value (benchmarks use [`BOOT_MARKER_INIT_STARTED`]).
//! Offset 4, 32-bit write: the guest command's exit status (0-255, or
//! 128 + signal), written just before guest-init reboots the VM.
//! The port numbers live in the VMM's layout module and in
//! guest-init/src/vmm_port.rs; docs/protocol.md describes both.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::bus::BusDevice;

/// Length of the port range the device claims.
pub const STATUS_PORT_LEN: u64 = 8;
/// Marker written by guest-init as its first act in userspace.
pub const BOOT_MARKER_INIT_STARTED: u8 = 1;
/// Marker written by guest-init once it is set up (its readiness line is
/// on the console) and the command starts next.
pub const BOOT_MARKER_INIT_READY: u8 = 2;

const MARKER_OFFSET: u64 = 0;
const STATUS_OFFSET: u64 = 4;

/// What the guest reported; shared between the device and the VMM.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub exit_status: Option<u32>,
    pub markers: Vec<(u8, Instant)>,
}

#[derive(Debug, Default, Clone)]
pub struct GuestReport(Arc<Mutex<Report>>);

impl GuestReport {
    pub fn snapshot(&self) -> Report {
        self.0.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Whether the guest has written `marker` yet.
    pub fn has_marker(&self, marker: u8) -> bool {
        self.0
            .lock()
            .map(|r| r.markers.iter().any(|(m, _)| *m == marker))
            .unwrap_or(false)
    }

    fn update(&self, f: impl FnOnce(&mut Report)) {
        if let Ok(mut report) = self.0.lock() {
            f(&mut report);
        }
    }
}

pub struct StatusPort {
    report: GuestReport,
}

impl StatusPort {
    pub fn new(report: GuestReport) -> Self {
        Self { report }
    }
}

impl BusDevice for StatusPort {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let now = Instant::now();
        match (offset, data) {
            (MARKER_OFFSET, [marker]) => self.report.update(|r| {
                if !r.markers.iter().any(|(m, _)| m == marker) {
                    r.markers.push((*marker, now));
                }
            }),
            (STATUS_OFFSET, [a, b, c, d]) => self.report.update(|r| {
                r.exit_status = Some(u32::from_le_bytes([*a, *b, *c, *d]));
            }),
            // Any other width or offset is a guest bug; ignoring it keeps a
            // misbehaving guest from faking a status with a partial write.
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_status_and_first_marker() {
        let report = GuestReport::default();
        let mut port = StatusPort::new(report.clone());
        assert_eq!(report.snapshot().exit_status, None);
        port.write(0, &[BOOT_MARKER_INIT_STARTED]);
        port.write(0, &[BOOT_MARKER_INIT_STARTED]);
        port.write(4, &7u32.to_le_bytes());
        let r = report.snapshot();
        assert!(report.has_marker(BOOT_MARKER_INIT_STARTED));
        assert!(!report.has_marker(2));
        assert_eq!(r.exit_status, Some(7));
        assert_eq!(r.markers.len(), 1);
        assert_eq!(r.markers[0].0, BOOT_MARKER_INIT_STARTED);
    }

    #[test]
    fn ignores_partial_or_misplaced_writes() {
        let report = GuestReport::default();
        let mut port = StatusPort::new(report.clone());
        port.write(4, &[3]);
        port.write(5, &3u32.to_le_bytes());
        port.write(0, &[1, 2]);
        assert_eq!(report.snapshot(), Report::default());
    }
}
