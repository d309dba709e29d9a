//! The version check of the `Hello` exchange. Both sides compare the peer's
//! version with their own `VERSION`; the error says which side is stale.

use crate::VERSION;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// Seen by the host: the guest's initramfs was built by another mvm.
    #[error(
        "guest protocol version {guest}, host speaks {host}: rebuild the initramfs with this mvm"
    )]
    Guest { guest: u32, host: u32 },
    /// Seen by the guest agent, which sends it to the host as `Error`.
    #[error(
        "host protocol version {host}, guest speaks {guest}: rebuild the initramfs with this mvm"
    )]
    Host { host: u32, guest: u32 },
}

/// Host side: checks the version in the guest's `Hello`.
pub fn check_guest_version(guest: u32) -> Result<(), VersionError> {
    if guest == VERSION {
        Ok(())
    } else {
        Err(VersionError::Guest {
            guest,
            host: VERSION,
        })
    }
}

/// Guest side: checks the version in the host's `Hello`.
pub fn check_host_version(host: u32) -> Result<(), VersionError> {
    if host == VERSION {
        Ok(())
    } else {
        Err(VersionError::Host {
            host,
            guest: VERSION,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_version_passes() {
        assert_eq!(check_guest_version(VERSION), Ok(()));
        assert_eq!(check_host_version(VERSION), Ok(()));
    }

    #[test]
    fn mismatch_names_both_versions_and_the_fix() {
        let err = check_guest_version(VERSION + 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "guest protocol version {}, host speaks {VERSION}: rebuild the initramfs with this mvm",
                VERSION + 1
            )
        );
        let err = check_host_version(0).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("host protocol version 0, guest speaks {VERSION}: rebuild the initramfs with this mvm")
        );
    }
}
