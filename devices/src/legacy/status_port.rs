//! mvm's status port: how guest-init tells the VMM what happened, without
//! parsing console text.
//!
//! Offset 0, byte write: a boot-progress marker; the VMM timestamps the
//! first write of each value (benchmarks use [`BOOT_MARKER_INIT_STARTED`]).
//! Offset 4, 32-bit write: the guest command's exit status (0-255, or
//! 128 + signal), written just before guest-init reboots the VM.
//! Offsets 8 and 12, 32-bit writes, each kept from its first and taken only
//! before the ready marker: where the guest kernel's DMA bounce pool lies
//! (first page frame, pages), saved with a template (docs/snapshots.md).
//! Ports, offsets and marker values are the boot contract
//! (`mvm_protocol::boot`), which guest-init uses too; docs/protocol.md
//! describes it.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use mvm_protocol::boot;
use serde::{Deserialize, Serialize};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;
use crate::state::{DeviceState, Persist, SaveError};

/// Length of the port range the device claims.
pub const STATUS_PORT_LEN: u64 = boot::STATUS_PORT_LEN as u64;
/// Marker written by guest-init as its first act in userspace.
pub const BOOT_MARKER_INIT_STARTED: u8 = boot::MARKER_INIT_STARTED;
/// Marker written by guest-init once it is set up (its readiness line is
/// on the console) and the command starts next.
pub const BOOT_MARKER_INIT_READY: u8 = boot::MARKER_INIT_READY;

const MARKER_OFFSET: u64 = boot::MARKER_OFFSET as u64;
const STATUS_OFFSET: u64 = boot::EXIT_STATUS_OFFSET as u64;
const POOL_PFN_OFFSET: u64 = boot::BOUNCE_POOL_PFN_OFFSET as u64;
const POOL_PAGES_OFFSET: u64 = boot::BOUNCE_POOL_PAGES_OFFSET as u64;
const PAGE: u64 = 4096;

/// What the guest has reported so far: the markers (without their host
/// timestamps, which mean nothing in another process) and the status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusPortSnapshot {
    pub markers: Vec<u8>,
    pub exit_status: Option<u32>,
    #[serde(default)]
    pub bounce_pool: BouncePool,
}

/// Where the guest said its DMA bounce pool lies: the first page frame
/// and the number of pages, each as first written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BouncePool {
    pub pfn: Option<u32>,
    pub pages: Option<u32>,
}

impl BouncePool {
    /// The pool's guest-physical bytes, once both registers are written
    /// and the pool is not empty. Only what the guest said: whoever uses
    /// it checks it against guest memory.
    pub fn range(&self) -> Option<std::ops::Range<u64>> {
        let start = u64::from(self.pfn?) * PAGE;
        let pages = u64::from(self.pages?);
        (pages > 0).then(|| start..start + pages * PAGE)
    }
}

/// What the guest reported; shared between the device and the VMM.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub exit_status: Option<u32>,
    pub markers: Vec<(u8, Instant)>,
    pub bounce_pool: BouncePool,
}

#[derive(Debug, Default, Clone)]
pub struct GuestReport(Arc<Mutex<Report>>, Arc<OnceLock<EventFd>>);

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

    /// Has `wake` written on each new marker, so that a loop waiting for
    /// one sleeps until it comes instead of polling (the first `wake`
    /// given stays).
    pub fn wake_on_marker(&self, wake: EventFd) {
        let _ = self.1.set(wake);
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

    /// A status port that has already seen what `saved` holds; restored
    /// markers are timestamped now.
    pub fn from_snapshot(report: GuestReport, saved: &StatusPortSnapshot) -> Self {
        let now = Instant::now();
        report.update(|r| {
            r.exit_status = saved.exit_status;
            r.bounce_pool = saved.bounce_pool;
            r.markers = saved.markers.iter().map(|m| (*m, now)).collect();
        });
        Self { report }
    }

    pub fn save(&self) -> StatusPortSnapshot {
        let report = self.report.snapshot();
        StatusPortSnapshot {
            markers: report.markers.iter().map(|(m, _)| *m).collect(),
            exit_status: report.exit_status,
            bounce_pool: report.bounce_pool,
        }
    }
}

impl Persist for StatusPort {
    fn save(&self) -> Result<DeviceState, SaveError> {
        Ok(DeviceState::StatusPort(StatusPort::save(self)))
    }
}

impl BusDevice for StatusPort {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let now = Instant::now();
        match (offset, data) {
            (MARKER_OFFSET, [marker]) => {
                let mut new = false;
                self.report.update(|r| {
                    if !r.markers.iter().any(|(m, _)| m == marker) {
                        r.markers.push((*marker, now));
                        new = true;
                    }
                });
                if let Some(wake) = self.report.1.get().filter(|_| new) {
                    // A full counter is still a wake-up: nothing is lost.
                    let _ = wake.write(1);
                }
            }
            (STATUS_OFFSET, [a, b, c, d]) => self.report.update(|r| {
                r.exit_status = Some(u32::from_le_bytes([*a, *b, *c, *d]));
            }),
            (POOL_PFN_OFFSET | POOL_PAGES_OFFSET, [a, b, c, d]) => self.report.update(|r| {
                // Only guest-init's, before its ready marker (after it the
                // guest runs commands, which a template never holds).
                if r.markers.iter().any(|(m, _)| *m == BOOT_MARKER_INIT_READY) {
                    return;
                }
                let value = u32::from_le_bytes([*a, *b, *c, *d]);
                let pool = &mut r.bounce_pool;
                match offset {
                    POOL_PFN_OFFSET => pool.pfn.get_or_insert(value),
                    _ => pool.pages.get_or_insert(value),
                };
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
    fn a_new_marker_wakes_whoever_waits_and_a_repeat_does_not() {
        let report = GuestReport::default();
        let wake = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        report.wake_on_marker(wake.try_clone().unwrap());
        let mut port = StatusPort::new(report.clone());
        assert!(wake.read().is_err(), "nothing before a marker");
        port.write(0, &[BOOT_MARKER_INIT_STARTED]);
        assert_eq!(wake.read().unwrap(), 1);
        port.write(0, &[BOOT_MARKER_INIT_STARTED]);
        port.write(4, &7u32.to_le_bytes());
        assert!(wake.read().is_err(), "a repeat or a status wakes nobody");
        port.write(0, &[BOOT_MARKER_INIT_READY]);
        assert_eq!(wake.read().unwrap(), 1);
    }

    #[test]
    fn saved_markers_and_status_come_back() {
        let report = GuestReport::default();
        let mut port = StatusPort::new(report.clone());
        port.write(0, &[BOOT_MARKER_INIT_STARTED]);
        let saved = port.save();
        assert_eq!(saved.markers, [BOOT_MARKER_INIT_STARTED]);
        assert_eq!(saved.exit_status, None);
        let json = serde_json::to_string(&saved).unwrap();
        let other = GuestReport::default();
        let back = StatusPort::from_snapshot(other.clone(), &serde_json::from_str(&json).unwrap());
        assert_eq!(back.save(), saved);
        assert!(other.has_marker(BOOT_MARKER_INIT_STARTED));
        assert_eq!(other.snapshot().exit_status, None);
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

    #[test]
    fn the_bounce_pool_keeps_its_first_values_and_is_saved() {
        let report = GuestReport::default();
        let mut port = StatusPort::new(report.clone());
        assert_eq!(report.snapshot().bounce_pool.range(), None);
        port.write(POOL_PFN_OFFSET, &0x1e000u32.to_le_bytes());
        assert_eq!(report.snapshot().bounce_pool.range(), None, "pages missing");
        port.write(POOL_PAGES_OFFSET, &4096u32.to_le_bytes());
        port.write(POOL_PFN_OFFSET, &0x10u32.to_le_bytes());
        port.write(POOL_PAGES_OFFSET, &[1]);
        let range = Some(0x1e00_0000..0x1f00_0000);
        assert_eq!(report.snapshot().bounce_pool.range(), range);
        // After the ready marker nothing is taken: a second port's first
        // write neither.
        let later = GuestReport::default();
        let mut port2 = StatusPort::new(later.clone());
        port2.write(POOL_PFN_OFFSET, &1u32.to_le_bytes());
        port2.write(MARKER_OFFSET, &[BOOT_MARKER_INIT_READY]);
        port2.write(POOL_PAGES_OFFSET, &1u32.to_le_bytes());
        assert_eq!(later.snapshot().bounce_pool.pages, None);
        assert_eq!(later.snapshot().bounce_pool.pfn, Some(1));
        let json = serde_json::to_string(&port.save()).unwrap();
        let other = GuestReport::default();
        let back = StatusPort::from_snapshot(other.clone(), &serde_json::from_str(&json).unwrap());
        assert_eq!(back.save().bounce_pool.range(), range);
        // A state saved before the registers existed reads as no pool.
        let old: StatusPortSnapshot =
            serde_json::from_str(r#"{"markers":[1,2],"exit_status":null}"#).unwrap();
        assert_eq!(old.bounce_pool.range(), None);
        let empty = BouncePool {
            pfn: Some(1),
            pages: Some(0),
        };
        assert_eq!(empty.range(), None);
    }
}
