//! One image on a registry, read through the OCI distribution API as a
//! `Blobs` source, so that a pull goes through the same verified copy and
//! commit as an import.
//!
//! The client is async; everything else in mvm is not, and the VMM later
//! confines each of its threads with seccomp. So a `Remote` owns a
//! current-thread tokio runtime of its own, each network step is one
//! `block_on` on it, and dropping the `Remote` (at the end of the pull)
//! drops the runtime: no tokio thread outlives the pull. The only threads
//! it may start are the blocking pool's, for name lookups, and the
//! runtime's drop waits for them.

use std::io::{self, Read};

use futures_util::stream::{BoxStream, StreamExt as _};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{DigestError, OciDistributionError};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::fail::Context;
use super::{Credentials, PullOptions, RegistryRef};
use crate::digest::sha256_hex;
use crate::error::short;
use crate::manifest::{
    is_index, parse_index, pick_amd64, DOCKER_LIST, DOCKER_MANIFEST, MAX_JSON, OCI_INDEX,
    OCI_MANIFEST,
};
use crate::source::Blobs;
use crate::Error;

const ACCEPT: &[&str] = &[OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST];

pub(crate) struct Remote {
    rt: tokio::runtime::Runtime,
    client: Client,
    auth: RegistryAuth,
    creds: Credentials,
    r: RegistryRef,
    opts: PullOptions,
    what: String,
    reference: Reference,
}

impl Remote {
    /// The client for `r` with the credentials the auth files give its
    /// host. Opens no connection yet.
    pub(crate) fn new(r: &RegistryRef, opts: &PullOptions) -> Result<Remote, Error> {
        let creds = Credentials::for_host(&r.host)?;
        let auth = match &creds {
            Credentials::Basic { user, password, .. } => {
                RegistryAuth::Basic(user.clone(), password.clone())
            }
            Credentials::Anonymous { .. } => RegistryAuth::Anonymous,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| Error::Io {
                what: "starting the registry client".into(),
                source: e,
            })?;
        // ring, not the default aws-lc: no cmake, a smaller static binary.
        // Fails only if a provider is already installed, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(opts.insecure.clone()),
            connect_timeout: Some(opts.connect_timeout),
            read_timeout: Some(opts.read_timeout),
            // Indexes are resolved here, with the crate's platform rule.
            platform_resolver: None,
            ..ClientConfig::default()
        };
        let client = {
            let _in_runtime = rt.enter();
            Client::try_from(config).map_err(|e| Error::Registry {
                host: r.host.clone(),
                why: format!("cannot set up the client: {e}"),
            })?
        };
        let reference = match (&r.digest, &r.tag) {
            (Some(d), _) => Reference::with_digest(r.host.clone(), r.repository.clone(), d.clone()),
            (None, t) => Reference::with_tag(
                r.host.clone(),
                r.repository.clone(),
                t.clone().unwrap_or_else(|| "latest".into()),
            ),
        };
        Ok(Remote {
            rt,
            client,
            auth,
            creds,
            r: r.clone(),
            opts: opts.clone(),
            what: r.describe(),
            reference,
        })
    }

    fn cx(&self) -> Context<'_> {
        Context {
            host: &self.r.host,
            what: &self.what,
            creds: &self.creds,
            opts: &self.opts,
        }
    }

    /// A manifest or index by reference, checked against the digest the
    /// reference pins (if any); (bytes, sha256 digest).
    fn fetch_manifest(&self, reference: &Reference) -> Result<(Vec<u8>, String), Error> {
        let (body, _) = self
            .rt
            .block_on(self.client.pull_manifest_raw(reference, &self.auth, ACCEPT))
            .map_err(|e| self.cx().error(&e))?;
        let digest = format!("sha256:{}", sha256_hex(&body));
        if body.len() as u64 > MAX_JSON {
            return Err(Error::BadImage {
                digest: short(&digest),
                why: "the registry's manifest is over 4 MiB".into(),
            });
        }
        if let Some(pinned) = reference.digest() {
            if pinned != digest {
                return Err(Error::DigestMismatch {
                    what: format!("the manifest of {}", self.what),
                    digest: short(pinned),
                });
            }
        }
        Ok((body.to_vec(), digest))
    }
}

impl Blobs for Remote {
    fn manifest(&self) -> Result<(Vec<u8>, String, Option<String>), Error> {
        // The token (or the Basic credentials) first, on its own: the
        // client would otherwise fetch it inside each request and drop its
        // errors, so a hanging registry would cost a timeout per attempt
        // and a refused login would read as a bare 401.
        self.rt
            .block_on(self.client.auth(
                &self.reference,
                &self.auth,
                oci_client::RegistryOperation::Pull,
            ))
            .map_err(|e| self.cx().error(&e))?;
        let mut reference = self.reference.clone();
        // Nested indexes are legal but rare; 4 levels is plenty.
        for _ in 0..4 {
            let (bytes, digest) = self.fetch_manifest(&reference)?;
            let media_type = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("mediaType")?.as_str().map(String::from))
                .unwrap_or_default();
            if !is_index(&media_type, &bytes) {
                return Ok((bytes, digest, self.r.store_name()));
            }
            let index = parse_index(&bytes, &digest)?;
            let entry = pick_amd64(index.manifests(), &self.what)?;
            reference = reference.clone_with_digest(entry.digest().to_string());
        }
        Err(Error::BadSource {
            source_desc: self.what.clone(),
            why: "indexes nested more than 4 deep".into(),
        })
    }

    fn open(&self, digest: &str) -> Result<Option<Box<dyn Read + '_>>, Error> {
        let got = self
            .rt
            .block_on(self.client.pull_blob_stream(&self.reference, digest));
        match got {
            Ok(s) => Ok(Some(Box::new(BlobReader {
                remote: self,
                stream: s.stream,
                chunk: bytes::Bytes::new(),
            }))),
            // Said as "missing from HOST/NAME" by the caller.
            Err(OciDistributionError::RegistryError { envelope, .. })
                if envelope.errors.first().is_some_and(|x| {
                    matches!(x.code, oci_client::errors::OciErrorCode::BlobUnknown)
                }) =>
            {
                Ok(None)
            }
            Err(OciDistributionError::ServerError { code: 404, .. }) => Ok(None),
            Err(e) => Err(self.cx().error(&e)),
        }
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}

/// A blob's body as a `Read`: each chunk is one `block_on`.
struct BlobReader<'a> {
    remote: &'a Remote,
    stream: BoxStream<'static, Result<bytes::Bytes, io::Error>>,
    chunk: bytes::Bytes,
}

impl Read for BlobReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.chunk.is_empty() {
            match self.remote.rt.block_on(self.stream.next()) {
                None => return Ok(0),
                Some(Ok(b)) => self.chunk = b,
                // The client's own digest check at the end: the store
                // checks the same bytes itself and says it in its words.
                Some(Err(e)) if e.get_ref().is_some_and(|i| i.is::<DigestError>()) => return Ok(0),
                Some(Err(e)) => {
                    let line = self.remote.cx().error(&OciDistributionError::IoError(e));
                    return Err(io::Error::other(line.to_string()));
                }
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk[..n]);
        let _ = self.chunk.split_to(n);
        Ok(n)
    }
}
