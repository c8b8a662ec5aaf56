//! Host-side secrets and per-sandbox sentinels.
//!
//! Real secrets live in one file in the data directory (mode 0600), keyed by the credential
//! `service`. A sandbox never sees them: its environment holds a *sentinel*, a random value
//! minted per sandbox and service, which the gateway replaces with the real secret only on
//! requests the credential's inject rules cover. Secrets never appear in `Debug`, logs,
//! errors or the audit log.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SecretError {
    #[error("cannot read `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write `{path}`")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Where only: serde's message would quote the value, which may be a secret.
    #[error(
        "`{path}` is not a valid secrets file (line {line}, column {column}: not a JSON object of service names to strings)"
    )]
    Malformed {
        path: PathBuf,
        line: usize,
        column: usize,
    },
    #[error(
        "`{path}` is readable by others (mode {mode:o}); fix its mode (chmod 600) or remove it"
    )]
    Exposed { path: PathBuf, mode: u32 },
    #[error("service name `{0}` must match [a-z0-9]([a-z0-9-]{{0,62}}[a-z0-9])?")]
    BadService(String),
    #[error("the secret for `{0}` is empty")]
    Empty(String),
    #[error(
        "the secret for `{0}` holds a control character (a line break inside it, say); it could never be sent in a header"
    )]
    ControlCharacter(String),
    #[error("no random source")]
    Random,
}

/// A secret value. `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Secret(value)
    }

    /// The value, for the one place that needs it: writing the upstream request.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The secrets file: `{ "service": "value", … }`, mode 0600.
#[derive(Debug, Clone)]
pub struct SecretStore {
    path: PathBuf,
}

/// `^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$`, the credential service grammar.
pub fn is_service_name(s: &str) -> bool {
    let b = s.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match b {
        [] => false,
        [one] => ok(one),
        [first, mid @ .., last] => {
            b.len() <= 64 && ok(first) && ok(last) && mid.iter().all(|c| ok(c) || *c == b'-')
        }
    }
}

impl SecretStore {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SecretStore { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn load(&self) -> Result<BTreeMap<String, String>, SecretError> {
        let meta = match fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(source) => {
                return Err(SecretError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretError::Exposed {
                path: self.path.clone(),
                mode,
            });
        }
        let bytes = fs::read(&self.path).map_err(|source| SecretError::Read {
            path: self.path.clone(),
            source,
        })?;
        // serde's message quotes the value it stumbled on, which may be a secret: only
        // where and what kind of fault is kept.
        serde_json::from_slice(&bytes).map_err(|e| SecretError::Malformed {
            path: self.path.clone(),
            line: e.line(),
            column: e.column(),
        })
    }

    fn save(&self, map: &BTreeMap<String, String>) -> Result<(), SecretError> {
        let write_err = |source| SecretError::Write {
            path: self.path.clone(),
            source,
        };
        if let Some(dir) = self.path.parent() {
            // Owner only, whatever the umask: the data directory holds the CA key too.
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(write_err)?;
        }
        let text = serde_json::to_vec_pretty(map).map_err(|e| SecretError::Malformed {
            path: self.path.clone(),
            line: e.line(),
            column: e.column(),
        })?;
        // Written to a new 0600 temporary file of an unguessable name (O_EXCL: never a file
        // or link someone else put there), then renamed over the old one.
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|_| SecretError::Random)?;
        let tmp = self
            .path
            .with_extension(format!("tmp-{:016x}", u64::from_le_bytes(nonce)));
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(write_err)?;
        f.write_all(&text).map_err(write_err)?;
        f.sync_all().map_err(write_err)?;
        fs::rename(&tmp, &self.path).map_err(write_err)
    }

    pub fn set(&self, service: &str, value: &str) -> Result<(), SecretError> {
        if !is_service_name(service) {
            return Err(SecretError::BadService(service.to_owned()));
        }
        let value = value.trim_end_matches(['\n', '\r']);
        if value.is_empty() {
            return Err(SecretError::Empty(service.to_owned()));
        }
        // A control character could never be sent in a header (every request to the
        // inject domain would then be refused), and a line break is a header injection.
        if value.chars().any(char::is_control) {
            return Err(SecretError::ControlCharacter(service.to_owned()));
        }
        let mut map = self.load()?;
        map.insert(service.to_owned(), value.to_owned());
        self.save(&map)
    }

    /// Removes a secret; `false` when there was none.
    pub fn remove(&self, service: &str) -> Result<bool, SecretError> {
        let mut map = self.load()?;
        let removed = map.remove(service).is_some();
        if removed {
            self.save(&map)?;
        }
        Ok(removed)
    }

    /// Service names only.
    pub fn services(&self) -> Result<Vec<String>, SecretError> {
        Ok(self.load()?.into_keys().collect())
    }

    pub fn get(&self, service: &str) -> Result<Option<Secret>, SecretError> {
        Ok(self.load()?.remove(service).map(Secret))
    }

    /// Every secret, for the gateway's broker.
    pub fn all(&self) -> Result<BTreeMap<String, Secret>, SecretError> {
        Ok(self
            .load()?
            .into_iter()
            .map(|(k, v)| (k, Secret(v)))
            .collect())
    }
}

/// A fresh sentinel for one sandbox and service: recognisable, unguessable, and useless
/// anywhere but through this sandbox's gateway.
pub fn mint_sentinel(service: &str) -> Result<String, SecretError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|_| SecretError::Random)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("capgate-sentinel-{service}-{hex}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn secrets_round_trip_with_private_mode_and_redacted_debug() {
        let dir = std::env::temp_dir().join(format!("capgate-secrets-{}", std::process::id()));
        let store = SecretStore::new(dir.join("secrets.json"));
        store.set("github", "ghp_realsecret\n").unwrap();
        assert_eq!(store.services().unwrap(), vec!["github".to_owned()]);
        let s = store.get("github").unwrap().unwrap();
        assert_eq!(s.expose(), "ghp_realsecret");
        assert!(!format!("{s:?}").contains("ghp_"));
        let mode = fs::metadata(store.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(store.set("GitHub", "x").is_err());
        assert!(store.set("svc", "").is_err());
        fs::set_permissions(store.path(), fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(store.services(), Err(SecretError::Exposed { .. })));
        fs::set_permissions(store.path(), fs::Permissions::from_mode(0o600)).unwrap();
        assert!(store.remove("github").unwrap());
        assert!(!store.remove("github").unwrap());
        fs::remove_dir_all(dir).unwrap();
    }

    /// A malformed file is named with where it breaks, never with what it holds; a value
    /// with a control character (a header injection) is refused when set.
    #[test]
    fn errors_never_quote_a_secret_and_control_characters_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = SecretStore::new(dir.path().join("secrets.json"));
        for text in [
            "\"REALSECRET-asstring\"",
            "{\"svc\": 1234567890123}",
            "{\"svc\": [\"REALSECRET-inarray\"]}",
        ] {
            fs::write(store.path(), text).unwrap();
            fs::set_permissions(store.path(), fs::Permissions::from_mode(0o600)).unwrap();
            let e = store.services().unwrap_err();
            let shown = format!("{e} {e:?}");
            assert!(
                matches!(e, SecretError::Malformed { line: 1, .. }),
                "{shown}"
            );
            for value in ["REALSECRET", "1234567890123"] {
                assert!(!shown.contains(value), "{shown}");
            }
        }
        fs::remove_file(store.path()).unwrap();
        for value in ["tok\r\nX-Injected: yes", "tok\u{0}en", "tok\u{7f}"] {
            assert!(
                matches!(
                    store.set("svc", value),
                    Err(SecretError::ControlCharacter(_))
                ),
                "{value:?}"
            );
        }
        // The twin: a plain value, with the line break stdin ends it with.
        store.set("svc", "tok-en_1.2\n").unwrap();
        assert_eq!(store.get("svc").unwrap().unwrap().expose(), "tok-en_1.2");
    }

    #[test]
    fn sentinels_are_unique_and_named() {
        let a = mint_sentinel("github").unwrap();
        let b = mint_sentinel("github").unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with("capgate-sentinel-github-") && a.len() == 24 + 32);
    }
}
