//! Legacy x86 port-I/O devices: the 8250 console, the i8042 (for its reset
//! line only) and mvm's own status port.

mod i8042;
mod serial;
mod status_port;
mod trigger;

pub use i8042::I8042;
pub use serial::{Serial, SerialSnapshot};
pub use status_port::{
    BouncePool, GuestReport, StatusPort, StatusPortSnapshot, BOOT_MARKER_INIT_READY,
    BOOT_MARKER_INIT_STARTED, STATUS_PORT_LEN,
};
pub use trigger::EventFdTrigger;
