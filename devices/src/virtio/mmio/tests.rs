use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EFD_NONBLOCK;

use super::*;
use crate::virtio::device::Error as DeviceError;
use crate::virtio::state::VirtioDeviceSnapshot;

const DEVICE_TYPE: u32 = 42;
/// VERSION_1 plus one device-specific bit in each half.
const FEATURES: u64 = (1 << VIRTIO_F_VERSION_1) | (1 << 33) | 1;
const ACK_DRIVER: u32 = 1 | VIRTIO_CONFIG_S_DRIVER;

#[derive(Default)]
struct Dummy {
    activated: Vec<Vec<virtio_queue::QueueState>>,
    acked: u64,
    resets: usize,
    refuse: bool,
}

impl VirtioDevice for Dummy {
    fn device_type(&self) -> u32 {
        DEVICE_TYPE
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[16, 8]
    }
    fn features(&self) -> u64 {
        FEATURES
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = offset as u8 + i as u8 + 1;
        }
    }
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    fn activate(&mut self, a: Activation) -> Result<(), DeviceError> {
        if self.refuse {
            return Err(DeviceError::BadQueue(0));
        }
        self.acked = a.acked_features;
        self.activated
            .push(a.queues.iter().map(|q| q.state()).collect());
        Ok(())
    }
    fn reset(&mut self) {
        self.resets += 1;
    }
    fn save(&self) -> Result<VirtioDeviceSnapshot, SaveError> {
        Ok(VirtioDeviceSnapshot::Vsock { cid: 7 })
    }
    fn active_queues(&self) -> Option<Vec<virtio_queue::QueueState>> {
        // As a running device would: it has moved past two buffers.
        self.activated.last().map(|qs| {
            qs.iter()
                .map(|q| virtio_queue::QueueState {
                    next_avail: 2,
                    next_used: 2,
                    ..*q
                })
                .collect()
        })
    }
    fn check_snapshot(&self, saved: &VirtioDeviceSnapshot) -> Result<(), RestoreError> {
        match saved {
            VirtioDeviceSnapshot::Vsock { cid: 7 } => Ok(()),
            _ => Err(RestoreError::Mismatch {
                device: "dummy",
                why: "not cid 7".into(),
            }),
        }
    }
}

fn restore_into_fresh(saved: &TransportSnapshot) -> Result<Setup, RestoreError> {
    setup_with(|dev, mem, interrupt, evts| MmioTransport::restore(dev, mem, interrupt, evts, saved))
}

#[test]
fn a_running_transport_saves_and_restores_with_the_device_ring_positions() {
    let mut s = running();
    s.interrupt.signal_used_queue().unwrap();
    w(&mut s.t, QUEUE_SEL, 1);
    let saved = s.t.save().unwrap();
    assert_eq!(
        saved.queues[0].next_avail, 2,
        "taken from the running device"
    );
    assert_eq!(saved.interrupt_status, VIRTIO_MMIO_INT_VRING);
    let json = serde_json::to_string(&saved).unwrap();
    let saved: TransportSnapshot = serde_json::from_str(&json).unwrap();

    let mut back = restore_into_fresh(&saved).unwrap();
    assert_eq!(back.t.save().unwrap(), saved, "save(restore(x)) == x");
    assert_eq!(r(&mut back.t, STATUS), r(&mut s.t, STATUS));
    assert_eq!(r(&mut back.t, QUEUE_NUM_MAX), 8, "queue 1 still selected");
    assert_eq!(r(&mut back.t, INTERRUPT_STATUS), VIRTIO_MMIO_INT_VRING);
    // The device was started again, at the saved positions.
    let restarted = &back.t.device().activated;
    assert_eq!(restarted.len(), 1);
    assert_eq!(restarted[0][0].next_avail, 2);
    assert_eq!(restarted[0][1].size, 8);
    assert_eq!(back.t.device().acked, 1 << VIRTIO_F_VERSION_1);
    // Queue setup is frozen after DRIVER_OK, as before the save.
    w(&mut back.t, QUEUE_SEL, 0);
    w(&mut back.t, QUEUE_NUM, 4);
    assert_eq!(back.t.save().unwrap().queues[0].size, 16);
    let _ = back.evts;
}

#[test]
fn a_transport_before_driver_ok_restores_without_starting_the_device() {
    let mut s = setup();
    negotiate(&mut s.t);
    let saved = s.t.save().unwrap();
    let back = restore_into_fresh(&saved).unwrap();
    assert!(back.t.device().activated.is_empty());
    assert_eq!(back.t.save().unwrap(), saved);
}

#[test]
fn a_snapshot_that_does_not_fit_is_refused() {
    let s = running();
    let good = s.t.save().unwrap();

    let mut other_type = good.clone();
    other_type.device_type = 1;
    assert!(matches!(
        restore_into_fresh(&other_type),
        Err(RestoreError::Mismatch { .. })
    ));
    let mut other_device = good.clone();
    other_device.device = VirtioDeviceSnapshot::Vsock { cid: 8 };
    assert!(restore_into_fresh(&other_device).is_err());
    let mut one_queue = good.clone();
    one_queue.queues.pop();
    assert!(restore_into_fresh(&one_queue).is_err());
    let mut bad_size = good.clone();
    bad_size.queues[0].size = 3;
    assert!(matches!(
        restore_into_fresh(&bad_size),
        Err(RestoreError::Invalid { .. })
    ));
    let mut outside = good.clone();
    outside.queues[0].desc_table = 1 << 40;
    assert!(matches!(
        restore_into_fresh(&outside),
        Err(RestoreError::Invalid { .. })
    ));
    let mut unoffered = good;
    unoffered.acked_features |= 1 << 20;
    assert!(restore_into_fresh(&unoffered).is_err());
}

struct Setup {
    t: MmioTransport<Dummy>,
    evts: Vec<EventFd>,
    interrupt: Arc<Interrupt>,
}

/// A transport made by `make` over fresh memory, eventfds and interrupt.
fn setup_with<E>(
    make: impl FnOnce(
        Dummy,
        GuestMemoryMmap,
        Arc<Interrupt>,
        Vec<EventFd>,
    ) -> Result<MmioTransport<Dummy>, E>,
) -> Result<Setup, E> {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
    let evts: Vec<EventFd> = (0..2)
        .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
        .collect();
    let interrupt = Arc::new(Interrupt::new(EventFd::new(EFD_NONBLOCK).unwrap()));
    let clones = evts.iter().map(|e| e.try_clone().unwrap()).collect();
    let t = make(Dummy::default(), mem, interrupt.clone(), clones)?;
    Ok(Setup { t, evts, interrupt })
}

fn setup() -> Setup {
    setup_with(MmioTransport::new).unwrap()
}

/// A transport whose driver has negotiated, set up both queues and
/// set DRIVER_OK.
fn running() -> Setup {
    let mut s = setup();
    negotiate(&mut s.t);
    setup_queues(&mut s.t);
    w(
        &mut s.t,
        STATUS,
        ACK_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK,
    );
    s
}

fn r(t: &mut MmioTransport<Dummy>, offset: u64) -> u32 {
    let mut data = [0xffu8; 4];
    t.read(offset, &mut data);
    u32::from_le_bytes(data)
}

fn w(t: &mut MmioTransport<Dummy>, offset: u64, value: u32) {
    t.write(offset, &value.to_le_bytes());
}

/// ACKNOWLEDGE, DRIVER, features (VERSION_1 only), FEATURES_OK.
fn negotiate(t: &mut MmioTransport<Dummy>) {
    w(t, STATUS, ACK_DRIVER);
    w(t, DRIVER_FEATURES_SEL, 1);
    w(t, DRIVER_FEATURES, 1);
    w(t, DRIVER_FEATURES_SEL, 0);
    w(t, DRIVER_FEATURES, 0);
    w(t, STATUS, ACK_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK);
}

/// Queue 0 at size 16, queue 1 at size 8, ready, rings in memory.
fn setup_queues(t: &mut MmioTransport<Dummy>) {
    for (sel, size, base) in [(0, 16, 0x1000), (1, 8, 0x3000)] {
        w(t, QUEUE_SEL, sel);
        w(t, QUEUE_NUM, size);
        w(t, QUEUE_DESC_LOW, base);
        w(t, QUEUE_DESC_HIGH, 0);
        w(t, QUEUE_DRIVER_LOW, base + 0x400);
        w(t, QUEUE_DEVICE_LOW, base + 0x800);
        w(t, QUEUE_READY, 1);
    }
}

#[test]
fn identifies_as_a_modern_virtio_mmio_device() {
    let mut s = setup();
    assert_eq!(r(&mut s.t, MAGIC), 0x7472_6976);
    assert_eq!(r(&mut s.t, VERSION), 2);
    assert_eq!(r(&mut s.t, DEVICE_ID), DEVICE_TYPE);
    assert_eq!(r(&mut s.t, VENDOR), VENDOR_ID);
    assert_eq!(r(&mut s.t, SHM_LEN_LOW), u32::MAX);
    // Registers are 32-bit only: other widths and misaligned reads give 0.
    let mut byte = [0xffu8; 1];
    s.t.read(MAGIC, &mut byte);
    assert_eq!(byte, [0]);
    let mut wide = [0xffu8; 8];
    s.t.read(MAGIC, &mut wide);
    assert_eq!(wide, [0; 8]);
    assert_eq!(r(&mut s.t, MAGIC + 2), 0);
}

#[test]
fn device_features_are_read_through_the_selector() {
    let mut s = setup();
    assert_eq!(r(&mut s.t, DEVICE_FEATURES), FEATURES as u32);
    w(&mut s.t, DEVICE_FEATURES_SEL, 1);
    assert_eq!(r(&mut s.t, DEVICE_FEATURES), (FEATURES >> 32) as u32);
    w(&mut s.t, DEVICE_FEATURES_SEL, 2);
    assert_eq!(r(&mut s.t, DEVICE_FEATURES), 0);
}

#[test]
fn negotiation_keeps_features_ok_only_for_acceptable_features() {
    let mut s = setup();
    // Before DRIVER the feature window is closed.
    w(&mut s.t, DRIVER_FEATURES_SEL, 1);
    w(&mut s.t, DRIVER_FEATURES, 1);
    w(&mut s.t, STATUS, ACK_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK);
    assert_eq!(r(&mut s.t, STATUS), ACK_DRIVER, "no VERSION_1 acked yet");

    // An unoffered feature (bit 34) is refused.
    w(&mut s.t, DRIVER_FEATURES, 0b101);
    w(&mut s.t, STATUS, ACK_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK);
    assert_eq!(r(&mut s.t, STATUS), ACK_DRIVER);

    // VERSION_1 and bit 33 through the high window, bit 0 through the low.
    w(&mut s.t, DRIVER_FEATURES, 0b11);
    w(&mut s.t, DRIVER_FEATURES_SEL, 0);
    w(&mut s.t, DRIVER_FEATURES, 1);
    w(&mut s.t, STATUS, ACK_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK);
    assert_eq!(
        r(&mut s.t, STATUS),
        ACK_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK
    );
    // Once FEATURES_OK is set the features are frozen.
    w(&mut s.t, DRIVER_FEATURES, 0);
    setup_queues(&mut s.t);
    w(
        &mut s.t,
        STATUS,
        ACK_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK,
    );
    assert_eq!(s.t.device().acked, FEATURES);
}

#[test]
fn queues_are_configured_per_selector_and_handed_over_at_driver_ok() {
    let mut s = setup();
    negotiate(&mut s.t);
    assert_eq!(r(&mut s.t, QUEUE_NUM_MAX), 16);
    w(&mut s.t, QUEUE_SEL, 1);
    assert_eq!(r(&mut s.t, QUEUE_NUM_MAX), 8);
    w(&mut s.t, QUEUE_SEL, 2);
    assert_eq!(r(&mut s.t, QUEUE_NUM_MAX), 0, "no queue 2");
    assert_eq!(r(&mut s.t, QUEUE_READY), 0);
    setup_queues(&mut s.t);
    // Not a power of two, or above the maximum: refused, size unchanged.
    w(&mut s.t, QUEUE_SEL, 0);
    assert_eq!(r(&mut s.t, QUEUE_READY), 1);
    w(&mut s.t, QUEUE_READY, 0);
    w(&mut s.t, QUEUE_NUM, 12);
    w(&mut s.t, QUEUE_NUM, 32);
    w(&mut s.t, QUEUE_DESC_HIGH, 1);
    w(&mut s.t, QUEUE_READY, 1);
    // A ready queue's addresses no longer change.
    w(&mut s.t, QUEUE_DESC_LOW, 0x8000);

    w(
        &mut s.t,
        STATUS,
        ACK_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK,
    );
    let activated = &s.t.device().activated;
    assert_eq!(activated.len(), 1);
    let q = activated[0][0];
    assert_eq!((q.size, q.ready), (16, true));
    assert_eq!(q.desc_table, 0x1_0000_1000);
    assert_eq!((q.avail_ring, q.used_ring), (0x1400, 0x1800));
    let q = activated[0][1];
    assert_eq!((q.size, q.desc_table), (8, 0x3000));

    // After DRIVER_OK queue setup is ignored.
    w(&mut s.t, QUEUE_SEL, 1);
    w(&mut s.t, QUEUE_READY, 0);
    assert_eq!(r(&mut s.t, QUEUE_READY), 1);
}

#[test]
fn driver_ok_needs_features_ok_and_a_willing_device() {
    let mut s = setup();
    w(&mut s.t, STATUS, ACK_DRIVER);
    w(&mut s.t, STATUS, ACK_DRIVER | VIRTIO_CONFIG_S_DRIVER_OK);
    assert_eq!(r(&mut s.t, STATUS), ACK_DRIVER);
    assert!(s.t.device().activated.is_empty());

    let mut s = setup();
    s.t.device.refuse = true;
    negotiate(&mut s.t);
    setup_queues(&mut s.t);
    let ok = ACK_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK;
    w(&mut s.t, STATUS, ok);
    assert_eq!(r(&mut s.t, STATUS), ok | VIRTIO_CONFIG_S_NEEDS_RESET);
    assert_eq!(r(&mut s.t, INTERRUPT_STATUS), VIRTIO_MMIO_INT_CONFIG);
    assert_eq!(s.interrupt.irqfd().read().unwrap(), 1);
}

#[test]
fn writing_zero_to_status_resets_everything() {
    let mut s = running();
    s.interrupt.signal_used_queue().unwrap();
    // Clearing bits without a reset is ignored.
    w(&mut s.t, STATUS, 1);
    assert_ne!(r(&mut s.t, STATUS), 1);

    w(&mut s.t, STATUS, 0);
    assert_eq!(r(&mut s.t, STATUS), 0);
    assert_eq!(s.t.device().resets, 1);
    assert_eq!(r(&mut s.t, INTERRUPT_STATUS), 0);
    for sel in 0..2 {
        w(&mut s.t, QUEUE_SEL, sel);
        assert_eq!(r(&mut s.t, QUEUE_READY), 0);
    }
    // The driver starts over: features must be negotiated again.
    w(&mut s.t, STATUS, ACK_DRIVER);
    w(&mut s.t, STATUS, ACK_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK);
    assert_eq!(r(&mut s.t, STATUS), ACK_DRIVER);
}

#[test]
fn queue_notify_on_the_bus_signals_the_queue_eventfd() {
    let mut s = setup();
    w(&mut s.t, QUEUE_NOTIFY, 1);
    assert_eq!(s.evts[1].read().unwrap(), 1);
    assert!(s.evts[0].read().is_err(), "queue 0 was not notified");
    w(&mut s.t, QUEUE_NOTIFY, 7);
    assert!(s.evts.iter().all(|e| e.read().is_err()));
}

#[test]
fn interrupt_ack_clears_only_the_acked_bits() {
    let mut s = setup();
    s.interrupt.signal_used_queue().unwrap();
    s.interrupt.signal_config_change().unwrap();
    assert_eq!(r(&mut s.t, INTERRUPT_STATUS), 3);
    w(&mut s.t, INTERRUPT_ACK, VIRTIO_MMIO_INT_VRING);
    assert_eq!(r(&mut s.t, INTERRUPT_STATUS), VIRTIO_MMIO_INT_CONFIG);
}

#[test]
fn config_space_is_the_devices_at_any_width() {
    let mut s = setup();
    let mut data = [0u8; 8];
    s.t.read(CONFIG_OFFSET + 2, &mut data);
    assert_eq!(data, [3, 4, 5, 6, 7, 8, 9, 10]);
    assert_eq!(r(&mut s.t, CONFIG_GENERATION), 0);
}
