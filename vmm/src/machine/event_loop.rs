//! The VMM's event loop thread: one epoll loop (event-manager) that waits
//! for the VM to stop and feeds host input to the guest console. vCPU
//! threads never block on it; it never touches vCPU state.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use vmm_sys_util::eventfd::EventFd;

use mvm_devices::legacy::{GuestReport, BOOT_MARKER_INIT_READY};

use super::attach::SerialConsole;
use super::stop::StopHandle;

/// While console input waits for room in the UART FIFO, the loop wakes this
/// often to offer it again (the UART has no "FIFO drained" event).
const INPUT_RETRY: Duration = Duration::from_millis(20);
/// Console input taken from a regular file (not pollable) is read up front;
/// a console is for typing, so a bound this size is never a limit in use.
const MAX_FILE_INPUT: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create the event loop: {0}")]
    Create(event_manager::Error),
    #[error("the event loop failed: {0}")]
    Run(event_manager::Error),
    #[error("cannot watch the guest's boot markers: {0} (out of file descriptors or memory? raise `ulimit -n` or free memory)")]
    MarkerEvent(io::Error),
}

/// Marks the stop seen when the stop handle's eventfd fires.
struct StopWatcher {
    stop: StopHandle,
}

impl MutEventSubscriber for StopWatcher {
    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        let _ = self.stop.event().read();
        self.stop.mark_seen();
    }

    fn init(&mut self, ops: &mut EventOps) {
        // Registration can only fail if the fd is already registered, which
        // cannot happen for a fresh subscriber; without it the VM would never
        // be seen to stop, so say so loudly.
        if let Err(e) = ops.add(Events::new(self.stop.event(), EventSet::IN)) {
            eprintln!("mvm: cannot watch the VM's stop event: {e}");
        }
    }
}

/// Drains the eventfd the status port writes on each new boot marker: its
/// only job is to wake the loop, whose caller then looks at the markers.
struct MarkerWatcher {
    wake: EventFd,
    /// Set once the eventfd is in the epoll set: without it a wait for a
    /// marker would sleep past the marker.
    watching: Arc<AtomicBool>,
}

impl MutEventSubscriber for MarkerWatcher {
    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        let _ = self.wake.read();
    }

    fn init(&mut self, ops: &mut EventOps) {
        let added = ops.add(Events::new(&self.wake, EventSet::IN)).is_ok();
        self.watching.store(added, Ordering::SeqCst);
    }
}

/// Reads host stdin into the queue the loop offers to the guest's UART.
struct ConsoleInput {
    fd: RawFd,
    pending: Arc<Mutex<Vec<u8>>>,
    /// The guest has left [`MAX_PENDING_INPUT`] untaken and input was
    /// dropped (said once).
    dropped: bool,
}

/// Console input the guest has not taken yet is kept up to this much; a
/// guest that never reads its console cannot make the VMM buffer stdin
/// without end. A console is for typing: the bound is never reached in use.
const MAX_PENDING_INPUT: usize = 1 << 20;

impl ConsoleInput {
    fn queue(&mut self, data: &[u8]) {
        let Ok(mut p) = self.pending.lock() else {
            return;
        };
        let room = MAX_PENDING_INPUT.saturating_sub(p.len());
        p.extend_from_slice(&data[..data.len().min(room)]);
        if data.len() > room && !self.dropped {
            self.dropped = true;
            eprintln!(
                "mvm: the guest is not reading its console: input beyond {} KiB is dropped",
                MAX_PENDING_INPUT >> 10
            );
        }
    }
}

impl MutEventSubscriber for ConsoleInput {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let mut buf = [0u8; 256];
        // SAFETY: `fd` is the process's stdin, open for the process's life;
        // the ManuallyDrop keeps the File from closing it.
        let mut stdin = std::mem::ManuallyDrop::new(unsafe {
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(self.fd)
        });
        match stdin.read(&mut buf) {
            Ok(n) if n > 0 => self.queue(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // EOF or a broken stdin: stop watching it, the guest keeps going.
            _ => {
                let _ = ops.remove(events);
            }
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        if ops.add(Events::new_raw(self.fd, EventSet::IN)).is_ok() {
            return;
        }
        // epoll refuses regular files (and /dev/null): they never block, so
        // their content is queued now, up to a bound, and offered as the
        // guest drains its FIFO.
        // SAFETY: as in `process`: stdin stays open, ManuallyDrop keeps it so.
        let stdin = std::mem::ManuallyDrop::new(unsafe {
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(self.fd)
        });
        let mut data = Vec::new();
        if (&*stdin)
            .take(MAX_FILE_INPUT)
            .read_to_end(&mut data)
            .is_ok()
        {
            self.queue(&data);
        }
    }
}

/// Console input waiting for the guest, and whether the guest can take it
/// yet: bytes sent while the kernel boots are flushed by its UART driver,
/// and bytes echoed while guest-init prints would garble its lines, so
/// input is held until guest-init's "ready" marker.
struct ConsoleFeed {
    serial: SerialConsole,
    pending: Arc<Mutex<Vec<u8>>>,
    guest: GuestReport,
}

impl ConsoleFeed {
    fn waiting(&self) -> bool {
        self.pending.lock().map(|p| !p.is_empty()).unwrap_or(false)
    }

    fn offer(&self) {
        if !self.guest.has_marker(BOOT_MARKER_INIT_READY) {
            return;
        }
        let (Ok(mut serial), Ok(mut pending)) = (self.serial.lock(), self.pending.lock()) else {
            return;
        };
        if !pending.is_empty() {
            let taken = serial.enqueue_input(&pending);
            pending.drain(..taken);
        }
    }
}

pub struct EventLoop {
    manager: EventManager<Box<dyn MutEventSubscriber + Send>>,
    stop: StopHandle,
    input: Option<ConsoleFeed>,
}

/// How a wait for the VM ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Wait {
    Stopped,
    /// The deadline passed with the VM still running.
    Deadline,
    /// What the caller waited for happened ([`EventLoop::run_until`]).
    Done,
}

impl EventLoop {
    /// The loop ends when `stop` fires.
    pub fn new(stop: StopHandle) -> Result<Self, Error> {
        let mut manager = EventManager::new().map_err(Error::Create)?;
        let watcher: Box<dyn MutEventSubscriber + Send> =
            Box::new(StopWatcher { stop: stop.clone() });
        manager.add_subscriber(watcher);
        Ok(Self {
            manager,
            stop,
            input: None,
        })
    }

    /// Wakes the loop on each new boot marker `report` records, so that
    /// [`EventLoop::run_until`] can wait for one without polling.
    pub fn watch_markers(&mut self, report: &GuestReport) -> Result<(), Error> {
        let wake = EventFd::new(libc::EFD_NONBLOCK).map_err(Error::MarkerEvent)?;
        report.wake_on_marker(wake.try_clone().map_err(Error::MarkerEvent)?);
        let watching = Arc::new(AtomicBool::new(false));
        self.manager.add_subscriber(Box::new(MarkerWatcher {
            wake,
            watching: watching.clone(),
        }));
        // add_subscriber runs the subscriber's init, which adds the fd.
        match watching.load(Ordering::SeqCst) {
            true => Ok(()),
            false => Err(Error::MarkerEvent(io::Error::other(
                "epoll refused its eventfd",
            ))),
        }
    }

    /// Adds device work (ioeventfds, backend sockets) to the loop.
    pub fn add_subscriber(&mut self, subscriber: Box<dyn MutEventSubscriber + Send>) {
        self.manager.add_subscriber(subscriber);
    }

    /// Forwards this process's stdin to the guest console once guest-init
    /// runs (see `ConsoleFeed`).
    pub fn forward_stdin(&mut self, serial: SerialConsole, guest: GuestReport) {
        let pending = Arc::new(Mutex::new(Vec::new()));
        let input: Box<dyn MutEventSubscriber + Send> = Box::new(ConsoleInput {
            fd: io::stdin().as_raw_fd(),
            pending: pending.clone(),
            dropped: false,
        });
        self.manager.add_subscriber(input);
        self.input = Some(ConsoleFeed {
            serial,
            pending,
            guest,
        });
    }

    /// Runs until the VM stops or `deadline` passes.
    pub fn run_until_stopped(&mut self, deadline: Option<Instant>) -> Result<Wait, Error> {
        self.run_until(deadline, &|| false)
    }

    /// Runs until `done` says so (asked before each wait and after each
    /// wake-up), the VM stops or `deadline` passes.
    pub fn run_until(
        &mut self,
        deadline: Option<Instant>,
        done: &dyn Fn() -> bool,
    ) -> Result<Wait, Error> {
        while !self.stop.is_stopped() {
            if done() {
                return Ok(Wait::Done);
            }
            let input_waiting = self.input.as_ref().is_some_and(ConsoleFeed::waiting);
            let mut timeout = input_waiting.then_some(INPUT_RETRY);
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Wait::Deadline);
                }
                timeout = Some(timeout.map_or(left, |t| t.min(left)));
            }
            let ms = timeout.map_or(-1, |t| t.as_millis().clamp(1, i32::MAX as u128) as i32);
            self.manager.run_with_timeout(ms).map_err(Error::Run)?;
            if let Some(feed) = &self.input {
                feed.offer();
            }
        }
        Ok(Wait::Stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mvm_devices::bus::BusDevice;
    use mvm_devices::legacy::{StatusPort, BOOT_MARKER_INIT_STARTED};

    /// A loop waiting for a marker sleeps until the status port records
    /// it (no polling: the deadline is far), and a marker it does not
    /// wait for wakes it without ending the wait.
    #[test]
    fn a_wait_for_a_marker_ends_when_the_guest_writes_it() {
        let stop = StopHandle::new().unwrap();
        let mut lp = EventLoop::new(stop).unwrap();
        let report = GuestReport::default();
        lp.watch_markers(&report).unwrap();
        let mut port = StatusPort::new(report.clone());
        let guest = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            port.write(0, &[BOOT_MARKER_INIT_STARTED]);
            std::thread::sleep(Duration::from_millis(50));
            port.write(0, &[BOOT_MARKER_INIT_READY]);
        });
        let far = Instant::now() + Duration::from_secs(5);
        let wakes = std::cell::Cell::new(0);
        let seen = lp
            .run_until(Some(far), &|| {
                wakes.set(wakes.get() + 1);
                report.has_marker(BOOT_MARKER_INIT_READY)
            })
            .unwrap();
        let woke = Instant::now();
        guest.join().unwrap();
        assert_eq!(seen, Wait::Done);
        // The marker ended it, not the deadline (a loop that nothing
        // woke would have slept until then).
        assert!(woke < far, "woken only by the deadline");
        // Asked before the first wait and after each marker's wake-up;
        // a poll every few milliseconds would have asked dozens of times.
        assert!(wakes.get() <= 4, "asked {} times", wakes.get());
        // Without the marker, the deadline ends the wait.
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(lp.run_until(Some(soon), &|| false).unwrap(), Wait::Deadline);
    }

    #[test]
    fn console_input_the_guest_does_not_take_is_bounded() {
        let pending = Arc::new(Mutex::new(Vec::new()));
        let mut input = ConsoleInput {
            fd: -1,
            pending: pending.clone(),
            dropped: false,
        };
        for _ in 0..(4 * MAX_PENDING_INPUT / 256) {
            input.queue(&[b'x'; 256]);
        }
        assert_eq!(pending.lock().unwrap().len(), MAX_PENDING_INPUT);
        assert!(input.dropped);
        pending.lock().unwrap().clear();
        input.queue(b"typed");
        assert_eq!(
            &pending.lock().unwrap()[..],
            b"typed",
            "room again once taken"
        );
    }
}
