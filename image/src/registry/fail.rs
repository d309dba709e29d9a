//! A registry client's errors as the crate's one-line errors, each with
//! what to do: the client's own messages carry URLs, envelopes and nested
//! causes, none of which tells a user the fix.

use std::error::Error as _;

use oci_client::errors::{OciDistributionError as E, OciErrorCode};

use super::{Credentials, PullOptions};
use crate::Error;

/// What a message needs to say which fix applies.
pub(crate) struct Context<'a> {
    pub host: &'a str,
    /// HOST/NAME:TAG (or @DIGEST) being pulled.
    pub what: &'a str,
    pub creds: &'a Credentials,
    pub opts: &'a PullOptions,
}

impl Context<'_> {
    fn line(&self, why: String) -> Error {
        Error::Registry {
            host: self.host.to_string(),
            why: why.replace(['\n', '\r'], " "),
        }
    }

    pub(crate) fn error(&self, e: &E) -> Error {
        match e {
            E::RequestError(re) => self.transport(re),
            E::IoError(io) => match io.get_ref().and_then(|i| i.downcast_ref()) {
                Some(re) => self.transport(re),
                None => self.line(format!("reading the answer failed: {io}")),
            },
            E::RegistryError { envelope, .. } => {
                let code = envelope.errors.first().map(|x| &x.code);
                match code {
                    Some(
                        OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::NotFound
                        | OciErrorCode::BlobUnknown,
                    ) => self.status(404),
                    Some(OciErrorCode::Unauthorized) => self.status(401),
                    Some(OciErrorCode::Denied) => self.status(403),
                    Some(OciErrorCode::Toomanyrequests) => self.status(429),
                    _ => self.line(format!(
                        "refused the request for {} ({envelope}): check the reference",
                        self.what
                    )),
                }
            }
            E::ServerError { code, .. } => self.status(*code),
            E::UnauthorizedError { .. } | E::AuthenticationFailure(_) => self.status(401),
            E::UnsupportedMediaTypeError(t) | E::IncompatibleLayerMediaTypeError(t) => {
                Error::MediaType {
                    what: "manifest".into(),
                    media_type: t.clone(),
                }
            }
            E::DigestError(_) => Error::DigestMismatch {
                what: format!("the manifest of {}", self.what),
                digest: String::new(),
            },
            other => self.line(format!("the pull of {} failed: {other}", self.what)),
        }
    }

    /// An HTTP status that is not success.
    pub(crate) fn status(&self, code: u16) -> Error {
        let what = self.what;
        let files =
            "REGISTRY_AUTH_FILE, $XDG_RUNTIME_DIR/containers/auth.json or ~/.docker/config.json";
        let why = match code {
            401 => match self.creds {
                Credentials::Basic { file, .. } => format!(
                    "refused the credentials from {} for {what} (401 unauthorized): log in again with `docker login {h}` or `podman login {h}`, or fix that file",
                    file.display(),
                    h = self.host
                ),
                Credentials::Anonymous {
                    helper: Some((helper, file)),
                } => format!(
                    "needs credentials for {what} (401 unauthorized); {} names the credential helper '{helper}', which mvm does not run: put an \"auths\" entry for {h} in an auth file ({files})",
                    file.display(),
                    h = self.host
                ),
                Credentials::Anonymous { helper: None } => format!(
                    "needs credentials for {what} (401 unauthorized), or the name does not exist: log in with `docker login {h}` or `podman login {h}`, or check the auth file ({files})",
                    h = self.host
                ),
            },
            403 => format!(
                "denied access to {what} (403 forbidden): check that these credentials may pull it"
            ),
            404 => format!("has no image {what} (404 not found): check the name and the tag"),
            429 => "is rate limiting this client (429 too many requests): try again later".to_string(),
            c if (500..600).contains(&c) => {
                format!("failed to serve {what} (HTTP {c}, a server error): try again later")
            }
            c => format!("answered HTTP {c} for {what}: check the reference and the registry"),
        };
        self.line(why)
    }

    /// No HTTP answer: the connection, TLS or a timeout.
    fn transport(&self, e: &reqwest::Error) -> Error {
        let host = self.host;
        let mut causes = Vec::new();
        let mut src = e.source();
        while let Some(s) = src {
            let t = s.to_string();
            if !causes.iter().any(|c: &String| c.contains(&t)) {
                causes.push(t);
            }
            src = s.source();
        }
        let cause = causes.last().cloned().unwrap_or_else(|| e.to_string());
        let all = causes.join(": ");
        let secs = |d: std::time::Duration| d.as_secs();
        let tls = [
            "certificate",
            "InvalidContentType",
            "corrupt message",
            "tls",
            "TLS",
        ];
        let why = if e.is_timeout() && e.is_connect() {
            format!(
                "did not accept a connection within {} s (the connect timeout; MVM_REGISTRY_TIMEOUT=SECS changes it): check the host and port",
                secs(self.opts.connect_timeout)
            )
        } else if e.is_timeout() || all.contains("timed out") {
            format!(
                "sent nothing for {} s (the read timeout; MVM_REGISTRY_TIMEOUT=SECS changes it): the registry hangs; try again later",
                secs(self.opts.read_timeout)
            )
        } else if tls.iter().any(|t| all.contains(t)) {
            if self.opts.insecure.iter().any(|h| h == host) {
                format!("the TLS connection failed ({cause})")
            } else {
                format!(
                    "the TLS connection failed ({cause}): if {host} serves plain HTTP, pass --insecure-registry {host}"
                )
            }
        } else if e.is_connect() {
            format!(
                "cannot connect ({cause}): check the host and port, and that the registry is up"
            )
        } else {
            format!("the connection failed ({cause}): check the registry and try again")
        };
        self.line(why)
    }
}
