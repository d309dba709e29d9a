//! TLS for interception (docs/network.md, "Secrets"): a CA made in memory
//! for this run (its key never leaves this process), a certificate from
//! it for each host a secret is bound to, and the client side that checks
//! the real server against the host's trust store (plus `--upstream-ca`).
//! All of it is made before confinement.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose,
    NameConstraints,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// The protocols offered on both sides.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

pub struct Tls {
    /// The CA's certificate (PEM), for the guest's trust store.
    pub ca_pem: String,
    /// A server configuration per bound host name.
    servers: HashMap<String, Arc<ServerConfig>>,
    pub client: Arc<ClientConfig>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// `hosts`: the bound host names. `upstream_cas`: PEM files of extra
    /// roots for the real servers.
    pub fn new(hosts: &[String], upstream_cas: &[PathBuf]) -> Result<Tls, String> {
        let err = |e: rcgen::Error| format!("cannot make the run's CA: {e}");
        let ca_key = KeyPair::generate().map_err(err)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca.distinguished_name
            .push(DnType::CommonName, "mvm per-run interception CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        // Even a client that trusts it takes it for the bound hosts only.
        ca.name_constraints = Some(NameConstraints {
            permitted_subtrees: hosts
                .iter()
                .filter(|h| h.parse::<std::net::IpAddr>().is_err())
                .map(|h| GeneralSubtree::DnsName(h.clone()))
                .collect(),
            excluded_subtrees: Vec::new(),
        });
        let ca_cert = ca.self_signed(&ca_key).map_err(err)?;

        let mut servers = HashMap::new();
        for host in hosts {
            let key = KeyPair::generate().map_err(err)?;
            let mut leaf = CertificateParams::new(vec![host.clone()]).map_err(err)?;
            leaf.distinguished_name
                .push(DnType::CommonName, host.as_str());
            let cert = leaf.signed_by(&key, &ca_cert, &ca_key).map_err(err)?;
            let mut config = ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_no_client_auth()
                .with_single_cert(
                    vec![cert.der().clone(), ca_cert.der().clone()],
                    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
                )
                .map_err(|e| format!("cannot use the certificate for {host}: {e}"))?;
            config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
            servers.insert(host.clone(), Arc::new(config));
        }

        let mut roots = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for cert in native.certs {
            let _ = roots.add(cert);
        }
        for path in upstream_cas {
            let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<Result<_, _>>())
                .map_err(|e| format!("--upstream-ca {}: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!(
                    "--upstream-ca {}: no certificate in it",
                    path.display()
                ));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("--upstream-ca {}: {e}", path.display()))?;
            }
        }
        if roots.is_empty() {
            return Err(
                "no trust roots for the real servers: the host has no CA bundle (install ca-certificates) and no --upstream-ca was given".into(),
            );
        }
        let mut client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();

        Ok(Tls {
            ca_pem: ca_cert.pem(),
            servers,
            client: Arc::new(client),
        })
    }

    /// The guest-facing configuration for `host`, if it is bound.
    pub fn server(&self, host: &str) -> Option<Arc<ServerConfig>> {
        self.servers.get(host).cloned()
    }
}
