//! TLS for the gateway: the local CA that signs interception leaves, the per-host leaf cache,
//! a ClientHello peek for opaque tunnels, and the upstream client configuration.
//!
//! Everything here runs on the host side. The CA private key never leaves this process: the
//! sandbox only receives `ca.pem`, which is added to its trust bundle.
//!
//! All configurations are built with an explicit aws-lc-rs [`CryptoProvider`], so they do not
//! depend on a process-wide default; [`install_crypto_provider`] still installs that provider
//! for code (tokio-rustls users, hyper) that asks rustls for the default.

mod ca;
mod error;
mod sni;
mod upstream;

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

pub use ca::{CertificateAuthority, DEFAULT_LEAF_CACHE_CAPACITY, LeafCache};
pub use error::TlsError;
pub use sni::{MAX_CLIENT_HELLO_LEN, MAX_PEEK_LEN, SniPeek, peek_sni, sni_matches_authority};
pub use upstream::upstream_client_config;

/// The only ALPN protocol the gateway offers and asks for (h2 comes later).
pub const ALPN_HTTP_1_1: &[u8] = b"http/1.1";

/// Installs aws-lc-rs as the process-wide rustls crypto provider.
///
/// Idempotent: a second call, or a call after another provider was installed, does nothing.
/// The binary calls this first thing in `main`.
pub fn install_crypto_provider() {
    if CryptoProvider::get_default().is_none() {
        // Losing a race against another installer is fine: a provider is installed either way.
        let _already_installed = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
}

/// The provider every configuration of this module is built with.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}
