//! mvm-pull: the registry client in a process of its own, and what it
//! tells mvm.
//!
//! The client (the OCI distribution API over HTTP/1 and HTTP/2, TLS, an
//! async runtime) is the larger part of this crate's code. In a binary of
//! its own it is not mapped into every `mvm run` (each runs a VMM that a
//! hostile guest attacks, and whose memory counts against each VM), only
//! into the process that pulls (docs/images.md, "Who pulls").
//!
//! mvm runs `mvm-pull [--insecure-registry HOST[:PORT]]... -- REF` with
//! its own environment (the store's root, `MVM_INSECURE_REGISTRIES`,
//! `MVM_REGISTRY_TIMEOUT`, the auth files) and its own stderr, where the
//! progress line goes. mvm-pull prints one [`Answer`] as a line of JSON on
//! stdout, its last, and exits 0 if it pulled, 1 if not; the store is
//! unchanged when it did not (the store's own rule). The client itself is
//! the `registry` feature, which mvm-pull needs and mvm leaves out.

use serde::{Deserialize, Serialize};

use crate::Image;
#[cfg(feature = "registry")]
use crate::{Error, PullOptions, Store, TerminalProgress};

/// The helper's name: beside mvm at `../libexec/mvm/mvm-pull`.
pub const BINARY: &str = "mvm-pull";

/// What mvm-pull answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// The image, now in the store, with what the pull copied.
    Pulled(Box<Image>),
    /// Why not: the one line mvm prints.
    Failed(String),
}

impl Answer {
    /// The line mvm-pull prints.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("an Answer is plain data")
    }

    /// The answer in mvm-pull's stdout, if there is one: its last line
    /// (mvm-pull prints the answer last, after anything a library it uses
    /// might print).
    pub fn from_output(stdout: &[u8]) -> Option<Answer> {
        let line = stdout
            .split(|b| *b == b'\n')
            .rfind(|l| !l.trim_ascii().is_empty())?;
        serde_json::from_slice(line).ok()
    }

    /// mvm-pull's exit status.
    pub fn exit_code(&self) -> i32 {
        match self {
            Answer::Pulled(_) => 0,
            Answer::Failed(_) => 1,
        }
    }
}

/// What mvm-pull does: REF pulled into the store the environment names.
#[cfg(feature = "registry")]
pub fn pull(reference: &str, insecure: &[String]) -> Answer {
    let pulled = || -> Result<Image, Error> {
        let mut opts = PullOptions::from_env()?;
        opts.insecure.extend(insecure.iter().cloned());
        let store = Store::open(&Store::default_root()?)?;
        store.pull(reference, &opts, &mut TerminalProgress::new())
    };
    match pulled() {
        Ok(image) => Answer::Pulled(Box::new(image)),
        Err(e) => Answer::Failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ImageConfig, ImportStats, LayerInfo};

    #[test]
    fn answers_survive_the_line_between_the_processes() {
        let image = Image {
            name: Some("registry.example:5000/app:1".into()),
            manifest_digest: format!("sha256:{}", "a".repeat(64)),
            config_digest: format!("sha256:{}", "b".repeat(64)),
            config: ImageConfig {
                env: vec!["PATH=/bin".into()],
                working_dir: Some("/srv".into()),
                entrypoint: vec!["/entry".into()],
                cmd: vec!["serve".into(), "a\nb".into()],
                user: Some("1000:1000".into()),
            },
            layers: vec![LayerInfo {
                digest: format!("sha256:{}", "c".repeat(64)),
                media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
                size: 1234,
            }],
            created: None,
            imported: ImportStats {
                blobs_copied: 3,
                bytes_copied: 5678,
            },
        };
        for answer in [
            Answer::Pulled(Box::new(image)),
            Answer::Failed("registry 127.0.0.1:5000: no answer within 30 s".into()),
        ] {
            let line = answer.to_line();
            assert!(!line.contains('\n'), "{line}");
            let mut stdout = b"anything printed before the answer\n".to_vec();
            stdout.extend_from_slice(line.as_bytes());
            stdout.extend_from_slice(b"\n\n");
            assert_eq!(Answer::from_output(&stdout), Some(answer));
        }
    }

    #[test]
    fn no_answer_is_none() {
        assert_eq!(Answer::from_output(b""), None);
        assert_eq!(Answer::from_output(b"thread 'main' panicked\n"), None);
        assert_eq!(Answer::from_output(b"{\"pulled\":{}}\n"), None);
        let answer_then_more = format!("{}\nmore\n", Answer::Failed("x".into()).to_line());
        assert_eq!(Answer::from_output(answer_then_more.as_bytes()), None);
    }
}
