//! The one error type of the TLS module.

use std::io;
use std::path::PathBuf;

/// What failed while handling the CA, minting a leaf, peeking at a ClientHello or building a
/// TLS configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The CA directory could not be created.
    #[error("cannot create the CA directory `{path}`: {source}")]
    CreateCaDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A CA file could not be written (or moved into place).
    #[error("cannot write `{path}`: {source}")]
    WriteCaFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A CA file could not be read.
    #[error("cannot read `{path}`: {source}")]
    ReadCaFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A CA file is larger than any certificate or key capgate writes.
    #[error("`{path}` is larger than {max} bytes; it is not a capgate CA file")]
    CaFileTooLarge { path: PathBuf, max: u64 },

    /// The CA key file can be read or written by group or others (`mode` is its mode).
    #[error("`{path}` is readable by others; fix its mode or remove it")]
    CaKeyReadableByOthers { path: PathBuf, mode: u32 },

    /// Only one of the two CA files exists.
    #[error(
        "`{present}` exists but `{missing}` does not; restore it, or remove both to create a new CA"
    )]
    IncompleteCa { present: PathBuf, missing: PathBuf },

    /// The CA certificate file holds no PEM certificate.
    #[error("`{path}` holds no PEM certificate: {source}")]
    CaCertificatePem {
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },

    /// The CA certificate is not valid DER X.509.
    #[error("`{path}` is not a valid X.509 certificate: {source}")]
    CaCertificateDer {
        path: PathBuf,
        #[source]
        source: x509_parser::nom::Err<x509_parser::error::X509Error>,
    },

    /// The CA certificate is not a CA certificate.
    #[error("`{path}` is not a CA certificate (no basic constraints with CA set)")]
    NotACa { path: PathBuf },

    /// The CA certificate is outside its validity period.
    #[error(
        "the CA certificate `{path}` is not valid now (valid {not_before} to {not_after}); remove both CA files to create a new CA"
    )]
    CaNotValidNow {
        path: PathBuf,
        not_before: String,
        not_after: String,
    },

    /// The CA key file holds no usable private key.
    #[error("`{path}` holds no usable private key: {source}")]
    CaKey {
        path: PathBuf,
        #[source]
        source: rcgen::Error,
    },

    /// The CA key file holds no PEM private key.
    #[error("`{path}` holds no PEM private key: {source}")]
    CaKeyPem {
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },

    /// The CA certificate and key are not a pair.
    #[error("the CA certificate `{cert}` does not match the key `{key}`")]
    CaKeyMismatch { cert: PathBuf, key: PathBuf },

    /// A key pair could not be generated.
    #[error("cannot generate a key pair: {source}")]
    GenerateKey {
        #[source]
        source: rcgen::Error,
    },

    /// The system random number generator failed.
    #[error("cannot draw random bytes for a certificate serial number")]
    Random,

    /// The CA certificate could not be created.
    #[error("cannot create the CA certificate: {source}")]
    CreateCaCertificate {
        #[source]
        source: rcgen::Error,
    },

    /// The loaded CA could not be turned into an issuer.
    #[error("cannot use `{path}` as an issuer: {source}")]
    CaIssuer {
        path: PathBuf,
        #[source]
        source: rcgen::Error,
    },

    /// A leaf was asked for a host that is neither a DNS name nor an IP address.
    #[error("`{host}` is neither a DNS name nor an IP address")]
    InvalidHost { host: String },

    /// The leaf certificate for a host could not be signed.
    #[error("cannot sign a leaf certificate for `{host}`: {source}")]
    SignLeaf {
        host: String,
        #[source]
        source: rcgen::Error,
    },

    /// The server configuration for a host could not be built.
    #[error("cannot build the TLS server configuration for `{host}`: {source}")]
    ServerConfig {
        host: String,
        #[source]
        source: rustls::Error,
    },

    /// The extra upstream roots are not PEM certificates.
    #[error("the extra upstream CA certificates are not valid PEM: {source}")]
    UpstreamRootsPem {
        #[source]
        source: rustls_pki_types::pem::Error,
    },

    /// The extra upstream roots hold no certificate.
    #[error("the extra upstream CA file holds no certificate")]
    NoUpstreamRoots,

    /// An extra upstream root could not be added to the trust store.
    #[error("cannot trust an extra upstream CA certificate: {source}")]
    UpstreamRoot {
        #[source]
        source: rustls::Error,
    },

    /// The upstream client configuration could not be built.
    #[error("cannot build the upstream TLS client configuration: {source}")]
    ClientConfig {
        #[source]
        source: rustls::Error,
    },

    /// The bytes start like TLS but are not a well-formed ClientHello.
    #[error("malformed TLS ClientHello: {reason}")]
    MalformedClientHello { reason: &'static str },

    /// The ClientHello is larger than the gateway is willing to buffer.
    #[error("the TLS ClientHello needs {needed} bytes, more than the {max} the gateway reads")]
    ClientHelloTooLarge { needed: usize, max: usize },
}
