//! The capgate local CA and the leaves it mints for intercepted hosts.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration as StdDuration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, DnsName, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::{Duration, OffsetDateTime};

use super::{ALPN_HTTP_1_1, TlsError, provider};

/// File name of the CA certificate inside the CA directory (mode 0644).
const CA_CERT_FILE: &str = "ca.pem";
/// File name of the CA private key inside the CA directory (mode 0600).
const CA_KEY_FILE: &str = "ca-key.pem";
/// Common name of the CA certificate.
const CA_COMMON_NAME: &str = "capgate local CA";
/// Mode of the CA directory.
const CA_DIR_MODE: u32 = 0o700;
/// Mode of the CA certificate: anyone may read it, it goes into trust bundles.
const CA_CERT_MODE: u32 = 0o644;
/// Mode of the CA key: the owner only.
const CA_KEY_MODE: u32 = 0o600;
/// Largest CA file accepted when loading; capgate writes files under 1 KiB.
const MAX_CA_FILE_LEN: u64 = 64 * 1024;
/// The CA is valid for about ten years.
const CA_VALIDITY: Duration = Duration::days(3650);
/// The CA's NotBefore is backdated a day, for clocks that run behind (sandbox or upstream).
const CA_BACKDATE: Duration = Duration::days(1);
/// A leaf is valid for a day.
const LEAF_VALIDITY: Duration = Duration::hours(24);
/// A leaf's NotBefore is backdated an hour, for clients whose clock runs behind.
const LEAF_BACKDATE: Duration = Duration::hours(1);
/// A cached leaf is minted again after this long, well before it expires.
const LEAF_REFRESH_AFTER: StdDuration = StdDuration::from_secs(12 * 60 * 60);
/// X.509 upper bound on the length of a common name; longer hosts go only in the SAN.
const MAX_COMMON_NAME_LEN: usize = 64;
/// Length of the random certificate serial numbers, in bytes (RFC 5280 allows up to 20).
const SERIAL_LEN: usize = 16;

/// How many per-host server configurations [`LeafCache`] keeps by default.
pub const DEFAULT_LEAF_CACHE_CAPACITY: usize = 10_000;

/// The capgate local CA: an ECDSA P-256 certificate authority that signs the leaves the
/// gateway presents when it intercepts TLS.
///
/// Its key lives in `ca-key.pem` (mode 0600) next to `ca.pem`, on the host only. The value
/// also owns the [`LeafCache`] of minted leaves.
pub struct CertificateAuthority {
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    cert_path: PathBuf,
    key_path: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    provider: Arc<CryptoProvider>,
    leaves: LeafCache,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .field("key", &"[elided]")
            .field("leaves", &self.leaves)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// Loads the CA from `dir/ca.pem` and `dir/ca-key.pem`, or creates both (and `dir`, mode
    /// 0700) when neither exists. An existing `dir` keeps its mode: the key file's own mode
    /// (0600, checked on every load) is what protects the key.
    ///
    /// Refuses a key file that group or others can access, a certificate that is not a CA or
    /// not valid now, a certificate and key that are not a pair, and a directory holding only
    /// one of the two files.
    ///
    /// Two processes creating the same CA at the same moment can leave a mismatched pair,
    /// which the next load refuses; capgate creates the CA from one process.
    pub fn load_or_create(dir: &Path) -> Result<Self, TlsError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        match (exists(&cert_path)?, exists(&key_path)?) {
            (true, true) => Self::load(cert_path, key_path),
            (false, false) => Self::create(dir, cert_path, key_path),
            (true, false) => Err(TlsError::IncompleteCa {
                present: cert_path,
                missing: key_path,
            }),
            (false, true) => Err(TlsError::IncompleteCa {
                present: key_path,
                missing: cert_path,
            }),
        }
    }

    /// The CA certificate, PEM-encoded, as stored in `ca.pem`.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER-encoded.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Path of `ca.pem`, the file to add to the sandbox's trust bundle.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// Replaces the leaf cache with an empty one holding at most `capacity` hosts.
    #[must_use]
    pub fn with_leaf_cache_capacity(mut self, capacity: usize) -> Self {
        self.leaves = LeafCache::new(capacity);
        self
    }

    /// The leaf cache.
    pub fn leaf_cache(&self) -> &LeafCache {
        &self.leaves
    }

    /// The TLS server configuration presenting a leaf for `host`, from the cache or freshly
    /// minted.
    ///
    /// `host` must be the CONNECT authority's host (never the client's SNI): a DNS name, or
    /// an IP literal (IPv6 with or without brackets). It is compared without case and without
    /// a trailing dot. The configuration offers ALPN `http/1.1` only.
    pub fn server_config_for(&self, host: &str) -> Result<Arc<ServerConfig>, TlsError> {
        let subject = LeafSubject::parse(host)?;
        let key = subject.cache_key();
        if let Some(config) = self.leaves.get(&key) {
            return Ok(config);
        }
        // Mint outside the lock; if another task minted meanwhile, keep the first one so
        // every caller sees the same configuration.
        let config = Arc::new(self.mint(&subject)?);
        Ok(self.leaves.insert(key, config))
    }

    /// Mints a leaf for `subject` and wraps it in a server configuration.
    fn mint(&self, subject: &LeafSubject) -> Result<ServerConfig, TlsError> {
        let host = subject.cache_key();
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        if host.len() <= MAX_COMMON_NAME_LEN {
            name.push(DnType::CommonName, host.clone());
        }
        params.distinguished_name = name;
        params.subject_alt_names = vec![match subject {
            LeafSubject::Dns(dns) => {
                let ia5 = dns
                    .clone()
                    .try_into()
                    .map_err(|source| TlsError::SignLeaf {
                        host: host.clone(),
                        source,
                    })?;
                SanType::DnsName(ia5)
            }
            LeafSubject::Ip(ip) => SanType::IpAddress(*ip),
        }];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - LEAF_BACKDATE;
        params.not_after = now + LEAF_VALIDITY;
        params.serial_number = Some(random_serial(&self.provider)?);

        let leaf_key = KeyPair::generate().map_err(|source| TlsError::GenerateKey { source })?;
        let leaf = params
            .signed_by(&leaf_key, &self.issuer)
            .map_err(|source| TlsError::SignLeaf {
                host: host.clone(),
                source,
            })?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key));

        let mut config = ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()
            .and_then(|builder| {
                builder
                    .with_no_client_auth()
                    .with_single_cert(vec![leaf.der().clone()], key_der)
            })
            .map_err(|source| TlsError::ServerConfig { host, source })?;
        config.alpn_protocols = vec![ALPN_HTTP_1_1.to_vec()];
        Ok(config)
    }

    fn load(cert_path: PathBuf, key_path: PathBuf) -> Result<Self, TlsError> {
        // Check the key's mode on the open file, so the check and the read see the same file.
        let key_bytes = read_limited(&key_path, |file| {
            let mode = file
                .metadata()
                .map_err(|source| TlsError::ReadCaFile {
                    path: key_path.clone(),
                    source,
                })?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                return Err(TlsError::CaKeyReadableByOthers {
                    path: key_path.clone(),
                    mode: mode & 0o7777,
                });
            }
            Ok(())
        })?;
        let cert_bytes = read_limited(&cert_path, |_| Ok(()))?;

        let cert_der = CertificateDer::from_pem_slice(&cert_bytes).map_err(|source| {
            TlsError::CaCertificatePem {
                path: cert_path.clone(),
                source,
            }
        })?;
        let cert_spki = check_ca_certificate(&cert_der, &cert_path)?;

        let key_der =
            PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|source| TlsError::CaKeyPem {
                path: key_path.clone(),
                source,
            })?;
        let key = KeyPair::try_from(&key_der).map_err(|source| TlsError::CaKey {
            path: key_path.clone(),
            source,
        })?;
        if key.subject_public_key_info() != cert_spki {
            return Err(TlsError::CaKeyMismatch {
                cert: cert_path,
                key: key_path,
            });
        }

        let issuer =
            Issuer::from_ca_cert_der(&cert_der, key).map_err(|source| TlsError::CaIssuer {
                path: cert_path.clone(),
                source,
            })?;
        let cert_pem = String::from_utf8_lossy(&cert_bytes).into_owned();
        Ok(Self {
            cert_der,
            cert_pem,
            cert_path,
            key_path,
            issuer,
            provider: provider(),
            leaves: LeafCache::new(DEFAULT_LEAF_CACHE_CAPACITY),
        })
    }

    fn create(dir: &Path, cert_path: PathBuf, key_path: PathBuf) -> Result<Self, TlsError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(CA_DIR_MODE)
            .create(dir)
            .map_err(|source| TlsError::CreateCaDir {
                path: dir.to_path_buf(),
                source,
            })?;

        let provider = provider();
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, CA_COMMON_NAME);
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = now - CA_BACKDATE;
        params.not_after = now + CA_VALIDITY;
        params.serial_number = Some(random_serial(&provider)?);

        let key = KeyPair::generate().map_err(|source| TlsError::GenerateKey { source })?;
        let cert = params
            .self_signed(&key)
            .map_err(|source| TlsError::CreateCaCertificate { source })?;
        let cert_pem = cert.pem();
        let key_pem = key.serialize_pem();

        // The key goes in first: a crash in between leaves `ca-key.pem` alone, which the next
        // load reports instead of silently creating a second CA.
        write_new_file(&key_path, key_pem.as_bytes(), CA_KEY_MODE)?;
        write_new_file(&cert_path, cert_pem.as_bytes(), CA_CERT_MODE)?;

        // Build the issuer from the certificate as written, exactly as a later load will.
        let cert_der = cert.der().clone();
        let issuer =
            Issuer::from_ca_cert_der(&cert_der, key).map_err(|source| TlsError::CaIssuer {
                path: cert_path.clone(),
                source,
            })?;
        Ok(Self {
            cert_der,
            cert_pem,
            cert_path,
            key_path,
            issuer,
            provider,
            leaves: LeafCache::new(DEFAULT_LEAF_CACHE_CAPACITY),
        })
    }
}

/// The host a leaf is minted for, normalized.
enum LeafSubject {
    /// A DNS name, lowercase, without a trailing dot.
    Dns(String),
    /// An IP address.
    Ip(IpAddr),
}

impl LeafSubject {
    fn parse(host: &str) -> Result<Self, TlsError> {
        let invalid = || TlsError::InvalidHost {
            host: host.to_owned(),
        };
        let unbracketed = host
            .strip_prefix('[')
            .and_then(|rest| rest.strip_suffix(']'));
        if let Some(inner) = unbracketed {
            return inner
                .parse::<std::net::Ipv6Addr>()
                .map(|ip| Self::Ip(IpAddr::V6(ip)))
                .map_err(|_| invalid());
        }
        let bare = host.strip_suffix('.').unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Self::Ip(ip));
        }
        let name = bare.to_ascii_lowercase();
        if name.is_empty() || DnsName::try_from(name.as_str()).is_err() {
            return Err(invalid());
        }
        Ok(Self::Dns(name))
    }

    fn cache_key(&self) -> String {
        match self {
            Self::Dns(name) => name.clone(),
            Self::Ip(ip) => ip.to_string(),
        }
    }
}

/// Per-host TLS server configurations, minted once and shared.
///
/// Bounded: when full, the host cached longest ago is dropped (first in, first out). An entry
/// is minted again once it is half-way through its leaf's validity, so a long-running gateway
/// never presents an expired leaf.
pub struct LeafCache {
    capacity: usize,
    inner: Mutex<LeafCacheInner>,
}

struct LeafCacheInner {
    entries: HashMap<String, CachedLeaf>,
    order: VecDeque<String>,
}

struct CachedLeaf {
    config: Arc<ServerConfig>,
    minted_at: Instant,
}

impl fmt::Debug for LeafCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeafCache")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .finish()
    }
}

impl LeafCache {
    /// An empty cache holding at most `capacity` hosts (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new(LeafCacheInner {
                entries: HashMap::new(),
                order: VecDeque::new(),
            }),
        }
    }

    /// How many hosts are cached.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether no host is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most hosts the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LeafCacheInner> {
        // The cache holds no invariant a panicking holder could break half-way that matters
        // more than availability: a poisoned lock still holds usable entries.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, host: &str) -> Option<Arc<ServerConfig>> {
        let inner = self.lock();
        let leaf = inner.entries.get(host)?;
        (leaf.minted_at.elapsed() < LEAF_REFRESH_AFTER).then(|| Arc::clone(&leaf.config))
    }

    /// Stores `config` for `host` unless a fresh one is already there, and returns the one
    /// stored.
    fn insert(&self, host: String, config: Arc<ServerConfig>) -> Arc<ServerConfig> {
        let mut inner = self.lock();
        if let Some(leaf) = inner.entries.get_mut(&host) {
            if leaf.minted_at.elapsed() < LEAF_REFRESH_AFTER {
                return Arc::clone(&leaf.config);
            }
            leaf.config = Arc::clone(&config);
            leaf.minted_at = Instant::now();
            return config;
        }
        while inner.entries.len() >= self.capacity {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            inner.entries.remove(&oldest);
        }
        inner.order.push_back(host.clone());
        inner.entries.insert(
            host,
            CachedLeaf {
                config: Arc::clone(&config),
                minted_at: Instant::now(),
            },
        );
        config
    }
}

/// Checks that `der` is a CA certificate valid now and returns its SubjectPublicKeyInfo.
fn check_ca_certificate(der: &CertificateDer<'_>, path: &Path) -> Result<Vec<u8>, TlsError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|source| TlsError::CaCertificateDer {
            path: path.to_path_buf(),
            source,
        })?;
    let is_ca = matches!(cert.basic_constraints(), Ok(Some(ext)) if ext.value.ca);
    if !is_ca {
        return Err(TlsError::NotACa {
            path: path.to_path_buf(),
        });
    }
    let validity = cert.validity();
    if !validity.is_valid() {
        return Err(TlsError::CaNotValidNow {
            path: path.to_path_buf(),
            not_before: validity.not_before.to_string(),
            not_after: validity.not_after.to_string(),
        });
    }
    Ok(cert.tbs_certificate.subject_pki.raw.to_vec())
}

/// A positive random serial number of [`SERIAL_LEN`] bytes.
fn random_serial(provider: &CryptoProvider) -> Result<SerialNumber, TlsError> {
    let mut bytes = [0u8; SERIAL_LEN];
    provider
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| TlsError::Random)?;
    // Clear the sign bit and keep the top byte non-zero: a positive integer of fixed length.
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

fn exists(path: &Path) -> Result<bool, TlsError> {
    path.try_exists().map_err(|source| TlsError::ReadCaFile {
        path: path.to_path_buf(),
        source,
    })
}

/// Opens `path`, runs `check` on the open file, and reads at most [`MAX_CA_FILE_LEN`] bytes.
fn read_limited(
    path: &Path,
    check: impl FnOnce(&File) -> Result<(), TlsError>,
) -> Result<Vec<u8>, TlsError> {
    let read_error = |source| TlsError::ReadCaFile {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(read_error)?;
    check(&file)?;
    let mut bytes = Vec::new();
    file.take(MAX_CA_FILE_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_CA_FILE_LEN {
        return Err(TlsError::CaFileTooLarge {
            path: path.to_path_buf(),
            max: MAX_CA_FILE_LEN,
        });
    }
    Ok(bytes)
}

/// Writes `contents` to a new file at `path` that has `mode` from the moment it exists.
///
/// The data goes to a temporary file in the same directory, created with `mode` (never
/// wider), which is then renamed over `path`, so `path` never holds a partial file.
fn write_new_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), TlsError> {
    let write_error = |source| TlsError::WriteCaFile {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp_path = PathBuf::from(tmp_name);
    // A temporary file left by a crashed run of this same pid number is stale.
    match fs::remove_file(&tmp_path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(write_error(source)),
    }
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp_path)?;
        // The umask can only narrow the mode given at creation; set it exactly.
        file.set_permissions(Permissions::from_mode(mode))?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&tmp_path, path)
    })();
    if result.is_err() {
        // Best effort: the error that matters is the one returned.
        let _ignored = fs::remove_file(&tmp_path);
    }
    result.map_err(write_error)
}
