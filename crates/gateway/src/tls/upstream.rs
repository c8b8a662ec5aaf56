//! The TLS client configuration the gateway uses towards upstreams.

use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::{ALPN_HTTP_1_1, TlsError, provider};

/// The client configuration for connections to upstreams: the Mozilla roots compiled into
/// webpki-roots (never the host's `/etc/ssl`), plus the PEM certificates in
/// `extra_roots_pem` (`--upstream-ca FILE`: a corporate proxy's CA, or a test's own CA).
///
/// Offers ALPN `http/1.1` only. Extra roots that hold no certificate, or one rustls cannot
/// use as a trust anchor, are an error rather than silently ignored.
pub fn upstream_client_config(
    extra_roots_pem: Option<&[u8]>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(pem) = extra_roots_pem {
        let mut added = 0usize;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|source| TlsError::UpstreamRootsPem { source })?;
            roots
                .add(cert)
                .map_err(|source| TlsError::UpstreamRoot { source })?;
            added += 1;
        }
        if added == 0 {
            return Err(TlsError::NoUpstreamRoots);
        }
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::ClientConfig { source })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_HTTP_1_1.to_vec()];
    Ok(Arc::new(config))
}
