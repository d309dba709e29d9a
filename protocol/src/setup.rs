//! What a run asks of the machine before its first command, carried in
//! that command's `Exec` (docs/protocol.md, "Machine setup"): the image
//! root and the shares to mount, the host's wall clock and fresh entropy.
//!
//! It travels over the exec channel, not the kernel command line, because
//! a machine restored from a template (docs/snapshots.md) booted with
//! another run's command line: everything that differs between runs, or
//! must differ between two machines restored from one template, comes
//! this way, after the restore.

use serde::{Deserialize, Serialize};

use crate::boot::{MountParam, MountProblem, RootParam, RootProblem};

/// Bytes of host entropy in a setup: 512 bits, twice what the kernel's
/// CRNG needs to be fully seeded.
pub const SETUP_ENTROPY_BYTES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setup {
    /// The image root as `mvm.root` encodes it (the value after `=`);
    /// absent: the initramfs stays the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// The virtio-fs shares as `mvm.mount` encodes them, in mount order.
    #[serde(default)]
    pub mounts: Vec<String>,
    /// The host's wall clock, nanoseconds since the Unix epoch: a restored
    /// guest's clock stands where the template's stood.
    pub wall_clock_ns: u64,
    /// [`SETUP_ENTROPY_BYTES`] from the host's random source, hex: fed to
    /// the guest kernel's pool, which is then reseeded, so that machines
    /// restored from one template do not share their random numbers.
    pub entropy: String,
    /// Certificates (PEM) the run's programs must trust besides the
    /// image's: the egress proxy's per-run CA, when a secret is bound
    /// (docs/network.md, "Secrets"). guest-init adds them to the root's
    /// CA bundle and writes them alone to [`RUN_CA_PATH`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<String>,
    /// With `root`: the root's writable layer lives on the disk whose id
    /// is [`SANDBOX_DISK_ID`](crate::boot::SANDBOX_DISK_ID) (a named
    /// sandbox's), made an ext2 filesystem on first use, instead of a
    /// tmpfs of the scratch size.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub upper_on_disk: bool,
    /// The guest's hostname for this run (`mvm run --hostname`, an OCI
    /// bundle's `hostname`); absent: [`DEFAULT_HOSTNAME`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// The guest's hostname when a run names none.
pub const DEFAULT_HOSTNAME: &str = "mvm";

/// Why a name cannot be the guest's hostname.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostnameProblem {
    #[error("it is empty or longer than 64 bytes")]
    Length,
    #[error("it may hold only a-z, A-Z, 0-9, '-' and '_' in labels separated by single dots")]
    Label,
}

/// Checks `name` as a hostname: at most the kernel's 64 bytes, labels of
/// letters, digits, '-' and '_' (RFC 1123's, plus the underscore runc and
/// Docker let through), so that what the guest sets is what `hostname`
/// prints and a line of /etc/hosts can name it.
pub fn check_hostname(name: &str) -> Result<(), HostnameProblem> {
    if name.is_empty() || name.len() > 64 {
        return Err(HostnameProblem::Length);
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(HostnameProblem::Label)
    }
}

/// The system CA bundle (Debian's path, which curl, git, Python and
/// OpenSSL read by default), to which a setup's `trust` is appended.
pub const CA_BUNDLE_PATH: &str = "/etc/ssl/certs/ca-certificates.crt";
/// A setup's `trust` alone (for `NODE_EXTRA_CA_CERTS`, which adds to
/// Node's own roots).
pub const RUN_CA_PATH: &str = "/etc/ssl/certs/mvm-run-ca.pem";

/// Why a setup cannot be applied as sent.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    #[error("root {value:?}: {problem}")]
    Root { value: String, problem: RootProblem },
    #[error("mount {value:?}: {problem}")]
    Mount {
        value: String,
        problem: MountProblem,
    },
    #[error("entropy: expected {SETUP_ENTROPY_BYTES} bytes of hex")]
    Entropy,
    #[error("hostname {value:?}: {problem}")]
    Hostname {
        value: String,
        problem: HostnameProblem,
    },
}

impl Setup {
    /// The setup for a root (if any) and shares, with the clock and entropy
    /// given (the host reads them just before sending).
    pub fn new(
        root: Option<&RootParam>,
        mounts: &[MountParam],
        wall_clock_ns: u64,
        entropy: &[u8; SETUP_ENTROPY_BYTES],
    ) -> Setup {
        let value = |param: String| {
            param
                .split_once('=')
                .map(|(_, v)| v.to_string())
                .unwrap_or_default()
        };
        Setup {
            root: root.map(|r| value(r.to_param())),
            mounts: mounts.iter().map(|m| value(m.to_param())).collect(),
            wall_clock_ns,
            entropy: crate::boot::encode_hex(entropy),
            trust: None,
            upper_on_disk: false,
            hostname: None,
        }
    }

    /// The hostname to set, checked: [`DEFAULT_HOSTNAME`] when none is
    /// named.
    pub fn hostname(&self) -> Result<&str, SetupError> {
        match &self.hostname {
            None => Ok(DEFAULT_HOSTNAME),
            Some(name) => check_hostname(name)
                .map(|()| name.as_str())
                .map_err(|problem| SetupError::Hostname {
                    value: name.clone(),
                    problem,
                }),
        }
    }

    /// The root, decoded and checked as the boot contract checks `mvm.root`.
    pub fn root_param(&self) -> Result<Option<RootParam>, SetupError> {
        self.root
            .as_ref()
            .map(|value| {
                RootParam::decode(value).map_err(|problem| SetupError::Root {
                    value: value.clone(),
                    problem,
                })
            })
            .transpose()
    }

    /// The shares, decoded and checked as `mvm.mount` values are.
    pub fn mount_params(&self) -> Result<Vec<MountParam>, SetupError> {
        self.mounts
            .iter()
            .map(|value| {
                MountParam::decode(value).map_err(|problem| SetupError::Mount {
                    value: value.clone(),
                    problem,
                })
            })
            .collect()
    }

    pub fn entropy_bytes(&self) -> Result<[u8; SETUP_ENTROPY_BYTES], SetupError> {
        crate::boot::decode_hex(&self.entropy)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or(SetupError::Entropy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_host_encodes_the_guest_decodes() {
        let root = RootParam {
            lower: crate::boot::RootLower::Share("mvm2".into()),
            scratch_bytes: 256 << 20,
        };
        let mounts = [
            MountParam {
                tag: "mvm0".into(),
                read_only: true,
                path: b"/workspace".to_vec(),
            },
            MountParam {
                tag: "mvm1".into(),
                read_only: false,
                path: b"/data dir".to_vec(),
            },
        ];
        let entropy = [7u8; SETUP_ENTROPY_BYTES];
        let setup = Setup::new(Some(&root), &mounts, 1_700_000_000_123_456_789, &entropy);
        let wire = serde_json::to_string(&setup).unwrap();
        let back: Setup = serde_json::from_str(&wire).unwrap();
        assert_eq!(back.root_param().unwrap(), Some(root));
        assert_eq!(back.mount_params().unwrap(), mounts);
        assert_eq!(back.entropy_bytes().unwrap(), entropy);
        assert_eq!(back.wall_clock_ns, 1_700_000_000_123_456_789);
        let none = Setup::new(None, &[], 1, &entropy);
        assert_eq!(none.root_param().unwrap(), None);
        assert!(!serde_json::to_string(&none).unwrap().contains("root"));
    }

    #[test]
    fn what_the_guest_must_not_apply_is_refused() {
        let mut setup = Setup::new(None, &[], 1, &[0; SETUP_ENTROPY_BYTES]);
        setup.mounts = vec!["mvm0,ro,2f".into()]; // "/"
        assert!(matches!(
            setup.mount_params(),
            Err(SetupError::Mount {
                problem: MountProblem::Root,
                ..
            })
        ));
        setup.root = Some("vdb,erofs,1".into());
        assert!(matches!(setup.root_param(), Err(SetupError::Root { .. })));
        setup.entropy = "00".into();
        assert_eq!(setup.entropy_bytes(), Err(SetupError::Entropy));
        setup.entropy = "zz".repeat(SETUP_ENTROPY_BYTES);
        assert_eq!(setup.entropy_bytes(), Err(SetupError::Entropy));
        setup.hostname = Some("a b".into());
        assert!(matches!(
            setup.hostname(),
            Err(SetupError::Hostname {
                problem: HostnameProblem::Label,
                ..
            })
        ));
    }

    #[test]
    fn a_hostname_is_named_or_the_default_and_travels() {
        let mut setup = Setup::new(None, &[], 1, &[0; SETUP_ENTROPY_BYTES]);
        assert_eq!(setup.hostname(), Ok(DEFAULT_HOSTNAME));
        assert!(!serde_json::to_string(&setup).unwrap().contains("hostname"));
        setup.hostname = Some("ci-runner-7.example".into());
        let back: Setup = serde_json::from_str(&serde_json::to_string(&setup).unwrap()).unwrap();
        assert_eq!(back.hostname(), Ok("ci-runner-7.example"));
    }

    #[test]
    fn hostnames_are_labels_within_the_kernels_length() {
        for good in [
            "mvm",
            "a",
            "web-1",
            "A1.b2.c3",
            &"x".repeat(64),
            "0abc",
            "web_1",
            "-x",
        ] {
            assert_eq!(check_hostname(good), Ok(()), "{good}");
        }
        for (bad, problem) in [
            ("", HostnameProblem::Length),
            (&*"x".repeat(65), HostnameProblem::Length),
            ("a..b", HostnameProblem::Label),
            ("a.", HostnameProblem::Label),
            (".a", HostnameProblem::Label),
            ("sp ace", HostnameProblem::Label),
            ("tab\t", HostnameProblem::Label),
            ("new\nline", HostnameProblem::Label),
            ("hash#", HostnameProblem::Label),
            ("sl/ash", HostnameProblem::Label),
            ("ünï", HostnameProblem::Label),
        ] {
            assert_eq!(check_hostname(bad), Err(problem), "{bad:?}");
        }
    }
}
