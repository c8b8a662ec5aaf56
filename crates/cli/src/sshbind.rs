//! Logins under ssh-agent@1 `authenticate` bounds (kitspec §2.4): a login signature is
//! made only for a session the client bound to a server's host key with
//! `session-bind@openssh.com` on the same agent connection, where the binding's signature
//! verifies, the host key is one the host user's `known_hosts` gives for a granted server
//! (read outside the sandbox), the user is the granted one when an entry names one, and,
//! for `publickey-hostbound-v00@openssh.com`, the signed host key is the binding's.
//! Forwarded bindings never count.

use std::path::Path;

use aws_lc_rs::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use base64::Engine as _;

/// A server an `authenticate` entry grants: `host`, or `user@host`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub user: Option<String>,
    pub host: String,
}

impl Server {
    pub fn parse(entry: &str) -> Server {
        match entry.split_once('@') {
            Some((user, host)) => Server {
                user: Some(user.to_owned()),
                host: host.to_owned(),
            },
            None => Server {
                user: None,
                host: entry.to_owned(),
            },
        }
    }
}

/// A verified `session-bind@openssh.com` on one agent connection.
#[derive(Debug, Clone)]
pub struct Binding {
    pub hostkey: Vec<u8>,
    pub session_id: Vec<u8>,
    /// A binding made for a forwarded agent: never used to allow a login.
    pub forwarded: bool,
}

/// Reads an SSH `string` at the start of `b`: its bytes and the rest.
pub fn string(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_be_bytes(b.get(..4)?.try_into().ok()?) as usize;
    let rest = b.get(4..)?;
    Some((rest.get(..len)?, rest.get(len..)?))
}

/// The body of a `session-bind@openssh.com` extension (after its name), verified: the
/// host key's signature over the session identifier holds. `None` when it is malformed or
/// does not verify.
pub fn session_bind(body: &[u8]) -> Option<Binding> {
    let (hostkey, rest) = string(body)?;
    let (session_id, rest) = string(rest)?;
    let (sig, rest) = string(rest)?;
    let (&forwarding, rest) = rest.split_first()?;
    // A session id is an exchange hash: at most 64 bytes (SHA-512).
    if !rest.is_empty() || forwarding > 1 || session_id.is_empty() || session_id.len() > 64 {
        return None;
    }
    verify(hostkey, session_id, sig).then(|| Binding {
        hostkey: hostkey.to_vec(),
        session_id: session_id.to_vec(),
        forwarded: forwarding == 1,
    })
}

/// Whether `sig` (an SSH signature: algorithm name, then blob) by the SSH public key
/// `key` verifies over `message`. Ed25519, ECDSA (P-256, P-384, P-521) and RSA with
/// SHA-2 (`rsa-sha2-256`, `rsa-sha2-512`); anything else (SHA-1 `ssh-rsa`, DSA,
/// certificates) does not verify.
pub fn verify(key: &[u8], message: &[u8], sig: &[u8]) -> bool {
    let Some((key_type, key_rest)) = string(key) else {
        return false;
    };
    let Some((sig_alg, sig_rest)) = string(sig) else {
        return false;
    };
    let Some((blob, tail)) = string(sig_rest) else {
        return false;
    };
    if !tail.is_empty() {
        return false;
    }
    match (key_type, sig_alg) {
        (b"ssh-ed25519", b"ssh-ed25519") => {
            let Some((pk, [])) = string(key_rest) else {
                return false;
            };
            UnparsedPublicKey::new(&signature::ED25519, pk)
                .verify(message, blob)
                .is_ok()
        }
        (b"ecdsa-sha2-nistp256", b"ecdsa-sha2-nistp256") => ecdsa(
            key_rest,
            b"nistp256",
            32,
            &signature::ECDSA_P256_SHA256_FIXED,
            message,
            blob,
        ),
        (b"ecdsa-sha2-nistp384", b"ecdsa-sha2-nistp384") => ecdsa(
            key_rest,
            b"nistp384",
            48,
            &signature::ECDSA_P384_SHA384_FIXED,
            message,
            blob,
        ),
        (b"ecdsa-sha2-nistp521", b"ecdsa-sha2-nistp521") => ecdsa(
            key_rest,
            b"nistp521",
            66,
            &signature::ECDSA_P521_SHA512_FIXED,
            message,
            blob,
        ),
        (b"ssh-rsa", b"rsa-sha2-256" | b"rsa-sha2-512") => {
            let Some((e, rest)) = string(key_rest) else {
                return false;
            };
            let Some((n, [])) = string(rest) else {
                return false;
            };
            let params = if sig_alg == b"rsa-sha2-256" {
                &signature::RSA_PKCS1_2048_8192_SHA256
            } else {
                &signature::RSA_PKCS1_2048_8192_SHA512
            };
            // A signature may come shorter than the modulus (OpenSSH pads it on the left;
            // the verifier wants the exact length).
            let n = strip_zeros(n);
            let Some(pad) = n.len().checked_sub(blob.len()) else {
                return false;
            };
            let mut sig = vec![0u8; pad];
            sig.extend_from_slice(blob);
            RsaPublicKeyComponents {
                n,
                e: strip_zeros(e),
            }
            .verify(params, message, &sig)
            .is_ok()
        }
        _ => false,
    }
}

fn strip_zeros(mut b: &[u8]) -> &[u8] {
    while let [0, rest @ ..] = b {
        b = rest;
    }
    b
}

/// An ECDSA key (`string curve, string point`) and signature (`mpint r, mpint s`).
fn ecdsa(
    key: &[u8],
    curve: &[u8],
    size: usize,
    alg: &'static signature::EcdsaVerificationAlgorithm,
    message: &[u8],
    blob: &[u8],
) -> bool {
    let Some((named, rest)) = string(key) else {
        return false;
    };
    let Some((point, [])) = string(rest) else {
        return false;
    };
    let Some((r, rest)) = string(blob) else {
        return false;
    };
    let Some((s, [])) = string(rest) else {
        return false;
    };
    if named != curve {
        return false;
    }
    let mut fixed = Vec::with_capacity(2 * size);
    for part in [r, s] {
        let part = strip_zeros(part);
        if part.len() > size {
            return false;
        }
        fixed.resize(fixed.len() + size - part.len(), 0);
        fixed.extend_from_slice(part);
    }
    UnparsedPublicKey::new(alg, point)
        .verify(message, &fixed)
        .is_ok()
}

/// The fields of a login's signed data (`SSH_MSG_USERAUTH_REQUEST`, RFC 4252 §7, and
/// OpenSSH's `publickey-hostbound-v00@openssh.com`) that bounds judge.
#[derive(Debug, PartialEq, Eq)]
pub struct Login<'a> {
    pub session_id: &'a [u8],
    pub user: &'a [u8],
    /// The server host key a hostbound login signs.
    pub hostkey: Option<&'a [u8]>,
}

/// Parses a login's signed data strictly; `None` for anything else.
pub fn login(data: &[u8]) -> Option<Login<'_>> {
    let (session_id, rest) = string(data)?;
    let (&50, rest) = rest.split_first()? else {
        return None;
    };
    let (user, rest) = string(rest)?;
    let (service, rest) = string(rest)?;
    let (method, rest) = string(rest)?;
    let (&1, rest) = rest.split_first()? else {
        return None;
    };
    let (_alg, rest) = string(rest)?;
    let (_key, rest) = string(rest)?;
    if service != b"ssh-connection" {
        return None;
    }
    let (hostkey, rest) = match method {
        b"publickey" => (None, rest),
        b"publickey-hostbound-v00@openssh.com" => {
            let (hostkey, rest) = string(rest)?;
            (Some(hostkey), rest)
        }
        _ => return None,
    };
    rest.is_empty().then_some(Login {
        session_id,
        user,
        hostkey,
    })
}

/// The host keys of the host user's `known_hosts` files, read outside the sandbox.
#[derive(Debug, Default)]
pub struct KnownHosts {
    lines: Vec<KnownHost>,
}

#[derive(Debug)]
struct KnownHost {
    revoked: bool,
    patterns: String,
    key: Vec<u8>,
}

impl KnownHosts {
    /// `~/.ssh/known_hosts` of `home`, and `/etc/ssh/ssh_known_hosts`; missing files hold
    /// nothing.
    pub fn load(home: Option<&Path>) -> KnownHosts {
        let mut text = String::new();
        if let Some(home) = home {
            text.push_str(
                &std::fs::read_to_string(home.join(".ssh/known_hosts")).unwrap_or_default(),
            );
            text.push('\n');
        }
        text.push_str(&std::fs::read_to_string("/etc/ssh/ssh_known_hosts").unwrap_or_default());
        KnownHosts::parse(&text)
    }

    /// Parses `known_hosts` lines: `[@revoked] patterns keytype base64 [comment]`. CA lines
    /// (`@cert-authority`) and lines that do not parse are skipped.
    pub fn parse(text: &str) -> KnownHosts {
        let mut lines = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_whitespace();
            let Some(mut first) = fields.next() else {
                continue;
            };
            let mut revoked = false;
            if first.starts_with('@') {
                if first != "@revoked" {
                    continue;
                }
                revoked = true;
                let Some(next) = fields.next() else {
                    continue;
                };
                first = next;
            }
            let (Some(_key_type), Some(key)) = (fields.next(), fields.next()) else {
                continue;
            };
            let Ok(key) = base64::engine::general_purpose::STANDARD.decode(key) else {
                continue;
            };
            lines.push(KnownHost {
                revoked,
                patterns: first.to_owned(),
                key,
            });
        }
        KnownHosts { lines }
    }

    /// Whether `key` is a known, unrevoked host key of `host` (port 22).
    pub fn holds(&self, host: &str, key: &[u8]) -> bool {
        if self.lines.iter().any(|l| l.revoked && l.key == key) {
            return false;
        }
        self.lines
            .iter()
            .any(|l| !l.revoked && l.key == key && patterns_match(&l.patterns, host))
    }
}

/// A `known_hosts` host field: comma-separated patterns (`*`, `?`, `!` negation) or one
/// hashed name (`|1|salt|hash`, HMAC-SHA1 of the name).
fn patterns_match(field: &str, host: &str) -> bool {
    if let Some(hashed) = field.strip_prefix("|1|") {
        let Some((salt, hash)) = hashed.split_once('|') else {
            return false;
        };
        let b64 = base64::engine::general_purpose::STANDARD;
        let (Ok(salt), Ok(hash)) = (b64.decode(salt), b64.decode(hash)) else {
            return false;
        };
        let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, &salt);
        return aws_lc_rs::hmac::verify(&key, host.as_bytes(), &hash).is_ok();
    }
    let host = host.to_ascii_lowercase();
    let mut matched = false;
    for pattern in field.split(',') {
        let (negated, pattern) = match pattern.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, pattern),
        };
        if glob(&pattern.to_ascii_lowercase(), &host) {
            if negated {
                return false;
            }
            matched = true;
        }
    }
    matched
}

/// `*` (any run) and `?` (one character) over bytes.
fn glob(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};

    fn s(b: &[u8]) -> Vec<u8> {
        let mut v = (b.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(b);
        v
    }

    /// A new Ed25519 host key: its SSH public blob and the pair.
    fn host_key() -> (Vec<u8>, Ed25519KeyPair) {
        let pair = Ed25519KeyPair::generate().unwrap();
        let blob = [s(b"ssh-ed25519"), s(pair.public_key().as_ref())].concat();
        (blob, pair)
    }

    fn bind_body(hostkey: &[u8], pair: &Ed25519KeyPair, session: &[u8], fwd: u8) -> Vec<u8> {
        let sig = [s(b"ssh-ed25519"), s(pair.sign(session).as_ref())].concat();
        [s(hostkey), s(session), s(&sig), vec![fwd]].concat()
    }

    #[test]
    fn a_binding_verifies_only_with_the_host_keys_signature() {
        let (blob, pair) = host_key();
        let session = [9u8; 32];
        let b = session_bind(&bind_body(&blob, &pair, &session, 0)).unwrap();
        assert_eq!(b.session_id, session);
        assert!(!b.forwarded);
        assert!(
            session_bind(&bind_body(&blob, &pair, &session, 1))
                .unwrap()
                .forwarded
        );
        // The attacks: another key's signature, another session's, a tampered byte,
        // trailing bytes, a SHA-1 RSA or unknown algorithm name.
        let (other_blob, other) = host_key();
        let sig_other = bind_body(&other_blob, &other, &session, 0);
        let (_, rest) = string(&sig_other).unwrap();
        assert!(session_bind(&[s(&blob), rest.to_vec()].concat()).is_none());
        let mut wrong_session = bind_body(&blob, &pair, &[8u8; 32], 0);
        wrong_session[blob.len() + 4 + 4] ^= 1;
        assert!(session_bind(&wrong_session).is_none());
        assert!(session_bind(&[bind_body(&blob, &pair, &session, 0), vec![0]].concat()).is_none());
        assert!(!verify(
            &blob,
            &session,
            &[s(b"ssh-rsa"), s(&[0; 64])].concat()
        ));
    }

    /// RSA host keys verify with SHA-2, also when the signature comes without the leading
    /// zero bytes of its modulus' length; never with SHA-1 (`ssh-rsa`).
    #[test]
    fn rsa_signatures_verify_with_sha2_even_unpadded() {
        use aws_lc_rs::signature::{KeyPair as _, RSA_PKCS1_SHA256, RsaKeyPair};
        let pair = RsaKeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap();
        let mpint = |b: &[u8]| {
            let mut v = b.to_vec();
            if v.first().is_some_and(|&x| x & 0x80 != 0) {
                v.insert(0, 0);
            }
            s(&v)
        };
        let public = pair.public_key();
        let blob = [
            s(b"ssh-rsa"),
            mpint(public.exponent().big_endian_without_leading_zero()),
            mpint(public.modulus().big_endian_without_leading_zero()),
        ]
        .concat();
        let rng = aws_lc_rs::rand::SystemRandom::new();
        // A message whose signature starts with a zero byte (one in 256).
        let (message, sig) = (0u32..)
            .map(|i| {
                let m = i.to_be_bytes().to_vec();
                let mut sig = vec![0u8; pair.public_modulus_len()];
                pair.sign(&RSA_PKCS1_SHA256, &rng, &m, &mut sig).unwrap();
                (m, sig)
            })
            .find(|(_, sig)| sig[0] == 0)
            .unwrap();
        let ssh_sig = |alg: &[u8], raw: &[u8]| [s(alg), s(raw)].concat();
        assert!(verify(&blob, &message, &ssh_sig(b"rsa-sha2-256", &sig)));
        assert!(verify(
            &blob,
            &message,
            &ssh_sig(b"rsa-sha2-256", &sig[1..])
        ));
        assert!(!verify(&blob, &message, &ssh_sig(b"rsa-sha2-512", &sig)));
        assert!(!verify(&blob, &message, &ssh_sig(b"ssh-rsa", &sig)));
        assert!(!verify(&blob, b"another", &ssh_sig(b"rsa-sha2-256", &sig)));
    }

    #[test]
    fn logins_parse_strictly() {
        let base = |method: &[u8], tail: &[u8]| {
            [
                s(&[1u8; 32]),
                vec![50],
                s(b"git"),
                s(b"ssh-connection"),
                s(method),
                vec![1],
                s(b"ssh-ed25519"),
                s(b"KEY"),
                tail.to_vec(),
            ]
            .concat()
        };
        let plain = base(b"publickey", b"");
        let l = login(&plain).unwrap();
        assert_eq!((l.user, l.hostkey), (&b"git"[..], None));
        let hk = s(b"HOSTKEY");
        let hostbound = base(b"publickey-hostbound-v00@openssh.com", &hk);
        let l = login(&hostbound).unwrap();
        assert_eq!(l.hostkey, Some(&b"HOSTKEY"[..]));
        assert!(login(&base(b"publickey", b"x")).is_none());
        assert!(login(&base(b"password", b"")).is_none());
        assert!(login(&base(b"publickey-hostbound-v00@openssh.com", b"")).is_none());
    }

    #[test]
    fn known_hosts_match_names_hashes_and_wildcards_and_honour_revocation() {
        let (key, _) = host_key();
        let (other, _) = host_key();
        let b64 = |k: &[u8]| base64::engine::general_purpose::STANDARD.encode(k);
        // A hashed entry for git.example.test, made as ssh-keygen -H does.
        let salt = [7u8; 20];
        let hkey = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, &salt);
        let tag = aws_lc_rs::hmac::sign(&hkey, b"git.example.test");
        let text = format!(
            "# comment\n|1|{}|{} ssh-ed25519 {}\n*.corp.test,!bad.corp.test ssh-ed25519 {}\n@cert-authority *.ca.test ssh-ed25519 {}\n[port.test]:2222 ssh-ed25519 {}\n",
            b64(&salt),
            b64(tag.as_ref()),
            b64(&key),
            b64(&key),
            b64(&key),
            b64(&key),
        );
        let kh = KnownHosts::parse(&text);
        assert!(kh.holds("git.example.test", &key));
        assert!(kh.holds("a.corp.test", &key));
        assert!(!kh.holds("bad.corp.test", &key), "negated");
        assert!(!kh.holds("git.example.test", &other), "another key");
        assert!(!kh.holds("example.test", &key));
        assert!(
            !kh.holds("x.ca.test", &key),
            "a CA line vouches for no plain key"
        );
        assert!(!kh.holds("port.test", &key), "another port");
        let revoked = format!("{text}@revoked * ssh-ed25519 {}\n", b64(&key));
        assert!(!KnownHosts::parse(&revoked).holds("a.corp.test", &key));
    }

    #[test]
    fn globs() {
        assert!(glob("*.example.com", "a.b.example.com"));
        assert!(glob("h?st", "host"));
        assert!(!glob("h?st", "hoost"));
        assert!(glob("*", ""));
        assert!(!glob("a*b", "ac"));
    }
}
