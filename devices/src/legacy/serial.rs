//! The guest console: a 16550A-compatible UART from vm-superio at a port
//! range, raising its IRQ through an irqfd. The guest's serial driver stops
//! printing once it switches from polling to interrupts if the IRQ never
//! comes, so the trigger is not optional.

use std::io::Write;

use serde::{Deserialize, Serialize};
use vm_superio::serial::{NoEvents, SerialState};

use super::EventFdTrigger;
use crate::bus::BusDevice;
use crate::state::{DeviceState, Persist, RestoreError, SaveError};

/// The UART's registers and receive FIFO (vm-superio's `SerialState`, which
/// has no serde support of its own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SerialSnapshot {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub in_buffer: Vec<u8>,
}

impl From<SerialState> for SerialSnapshot {
    fn from(s: SerialState) -> Self {
        Self {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }
}

impl From<&SerialSnapshot> for SerialState {
    fn from(s: &SerialSnapshot) -> Self {
        Self {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer.clone(),
        }
    }
}

pub struct Serial<W: Write + Send> {
    uart: vm_superio::Serial<EventFdTrigger, NoEvents, W>,
}

impl<W: Write + Send> Serial<W> {
    pub fn new(interrupt: EventFdTrigger, out: W) -> Self {
        Self {
            uart: vm_superio::Serial::new(interrupt, out),
        }
    }

    /// Queues host input for the guest to read; returns how many bytes fit in
    /// the receive FIFO (the rest must be offered again later).
    pub fn enqueue_input(&mut self, input: &[u8]) -> usize {
        let room = self.uart.fifo_capacity();
        let take = input.len().min(room);
        // An error means the interrupt could not be raised; the bytes are
        // offered again later.
        self.uart
            .enqueue_raw_bytes(&input[..take])
            .unwrap_or_default()
    }

    pub fn writer_mut(&mut self) -> &mut W {
        self.uart.writer_mut()
    }

    pub fn save(&self) -> SerialSnapshot {
        self.uart.state().into()
    }

    /// A UART in the saved state, writing to `out`; a receive FIFO longer
    /// than the UART's is refused.
    pub fn from_snapshot(
        saved: &SerialSnapshot,
        interrupt: EventFdTrigger,
        out: W,
    ) -> Result<Self, RestoreError> {
        let uart = vm_superio::Serial::from_state(&saved.into(), interrupt, NoEvents, out)
            .map_err(|e| RestoreError::Invalid {
                device: "serial",
                why: format!("{e:?}"),
            })?;
        Ok(Self { uart })
    }
}

impl<W: Write + Send> Persist for Serial<W> {
    fn save(&self) -> Result<DeviceState, SaveError> {
        Ok(DeviceState::Serial(Serial::save(self)))
    }
}

impl<W: Write + Send> BusDevice for Serial<W> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        // The UART has byte-wide registers; wider accesses see the register
        // in the low byte, as on real hardware behind an 8-bit bus.
        if let (Some(first), Ok(offset)) = (data.first_mut(), u8::try_from(offset)) {
            *first = self.uart.read(offset);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&value), Ok(offset)) = (data.first(), u8::try_from(offset)) {
            // A failed write means the host side of the console is gone
            // (stdout closed); the guest cannot do anything about it, and
            // stopping the VM over console loss would lose the command's
            // exit status, so the byte is dropped.
            let _ = self.uart.write(offset, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    const DATA: u64 = 0; // THR / RBR
    const IER: u64 = 1;
    const IIR: u64 = 2;
    const LSR: u64 = 5;
    const IER_THRE: u8 = 0x02;
    const LSR_DATA_READY: u8 = 0x01;

    fn serial() -> (Serial<Vec<u8>>, EventFd) {
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let dev = Serial::new(EventFdTrigger::new(irq.try_clone().unwrap()), Vec::new());
        (dev, irq)
    }

    #[test]
    fn saved_registers_and_fifo_come_back() {
        let (mut dev, _irq) = serial();
        dev.write(IER, &[IER_THRE]);
        dev.write(7, &[0x5a]); // scratch
        dev.enqueue_input(b"ab");
        let saved = dev.save();
        let json = serde_json::to_string(&saved).unwrap();
        let saved: SerialSnapshot = serde_json::from_str(&json).unwrap();
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut back = Serial::from_snapshot(&saved, EventFdTrigger::new(irq), Vec::new()).unwrap();
        assert_eq!(back.save(), saved);
        let mut byte = [0u8];
        back.read(7, &mut byte);
        assert_eq!(byte[0], 0x5a);
        back.read(LSR, &mut byte);
        assert_ne!(byte[0] & LSR_DATA_READY, 0);
        back.read(DATA, &mut byte);
        assert_eq!(byte[0], b'a');

        let mut too_long = saved;
        too_long.in_buffer = vec![0; 4096];
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        assert!(Serial::from_snapshot(&too_long, EventFdTrigger::new(irq), Vec::new()).is_err());
    }

    #[test]
    fn guest_writes_reach_the_host_writer() {
        let (mut dev, _irq) = serial();
        for b in b"hi\n" {
            dev.write(DATA, &[*b]);
        }
        assert_eq!(dev.writer_mut().as_slice(), b"hi\n");
    }

    #[test]
    fn transmit_raises_the_interrupt_when_enabled() {
        let (mut dev, irq) = serial();
        dev.write(IER, &[IER_THRE]);
        // Enabling THRE interrupts with an empty holding register interrupts.
        assert_eq!(irq.read().unwrap(), 1);
        // The driver acknowledges by reading IIR; the next transmitted byte
        // must interrupt again or the guest's console stalls.
        let mut iir = [0u8];
        dev.read(IIR, &mut iir);
        dev.write(DATA, b"x");
        assert_eq!(irq.read().unwrap(), 1);
    }

    #[test]
    fn host_input_is_readable_by_the_guest() {
        let (mut dev, _irq) = serial();
        assert_eq!(dev.enqueue_input(b"ab"), 2);
        let mut lsr = [0u8];
        dev.read(LSR, &mut lsr);
        assert_ne!(lsr[0] & LSR_DATA_READY, 0);
        let mut byte = [0u8];
        dev.read(DATA, &mut byte);
        assert_eq!(byte, [b'a']);
    }

    #[test]
    fn input_beyond_the_fifo_is_left_for_later() {
        let (mut dev, _irq) = serial();
        let big = vec![b'z'; 1000];
        let took = dev.enqueue_input(&big);
        assert!(took > 0 && took < big.len());
        assert_eq!(dev.enqueue_input(&big), 0);
    }
}
