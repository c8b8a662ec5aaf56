//! ssh-agent@1: the host's SSH agent, relayed into the sandbox through a filter
//! (kitspec §2.4).
//!
//! The sandbox sees a socket of capgate's (`SOCKET_IN_SANDBOX`, bound read-only from the
//! sandbox's directory on the host), never the host agent's own. Each request is judged in
//! the phase current when it arrives: listing identities and signing are relayed to the
//! host agent when the phase is granted; signing under bounds only for an SSHSIG signature
//! in a granted namespace (`ssh-keygen -Y sign -n NAMESPACE`, git's signing). Everything
//! else (adding, removing or exporting keys, locking, extensions) is answered with
//! `SSH_AGENT_FAILURE` and never forwarded; every refusal goes to the audit log as host
//! `ssh-agent`. Login signatures under `authenticate` bounds would need the server's host
//! key verified through a `session-bind@openssh.com` binding; capgate does not verify that
//! yet, so under bounds it refuses every login signature (fails closed) and says so.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use capgate_gateway::proxy::PhaseSwitch;
use capgate_policy::audit::{AuditEvent, AuditWriter};
use capgate_policy::{Decision, Phase, Reason};
use capgate_resolve::plan::Plan;
use capgate_spec::caps::Capability;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// Where the workload finds the agent (`SSH_AUTH_SOCK`).
pub const SOCKET_IN_SANDBOX: &str = "/tmp/capgate-ssh-agent/agent.sock";
/// The directory bound there.
pub const DIR_IN_SANDBOX: &str = "/tmp/capgate-ssh-agent";

/// The host of the audit events about agent requests (port 0; the message as the method,
/// what was refused about it as the path).
pub const AUDIT_HOST: &str = "ssh-agent";

/// Largest agent message relayed either way (OpenSSH's own limit is 256 KiB).
const MAX_MESSAGE: usize = 256 * 1024;

// Agent protocol message numbers (draft-miller-ssh-agent).
const FAILURE: u8 = 5;
const REQUEST_IDENTITIES: u8 = 11;
const SIGN_REQUEST: u8 = 13;

/// What one phase's grant allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Sign anything.
    pub unrestricted: bool,
    /// SSHSIG namespaces it may sign for, under bounds.
    pub sign: Vec<String>,
    /// Servers it may log in to, under bounds (not verified yet: refused).
    pub authenticate: Vec<String>,
}

/// The composition's ssh-agent@1 grants by phase, and whether any is required.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    pub phases: BTreeMap<Phase, Grant>,
    pub required: bool,
}

impl Grants {
    pub fn of(plan: &Plan) -> Grants {
        let mut grants = Grants::default();
        for e in &plan.composed.entries {
            let Some(Capability::SshAgent(a)) = &e.capability else {
                continue;
            };
            grants.required |= !e.optional;
            for &phase in &a.phases {
                grants.phases.insert(
                    phase,
                    Grant {
                        unrestricted: a.unrestricted,
                        sign: a.sign.clone(),
                        authenticate: a.authenticate.clone(),
                    },
                );
            }
        }
        grants
    }

    pub fn granted(&self, phase: Phase) -> bool {
        self.phases.contains_key(&phase)
    }

    /// What the user is told about bounds capgate holds more tightly than the kit asks.
    pub fn notes(&self) -> Vec<String> {
        self.phases
            .iter()
            .filter(|(_, g)| !g.unrestricted && !g.authenticate.is_empty())
            .map(|(phase, g)| {
                format!(
                    "ssh-agent@1 ({phase}): logging in to {} is refused: capgate does not verify the server's host key binding yet, so it signs no login under bounds (SSHSIG signatures for the `sign` namespaces work)",
                    g.authenticate.join(", ")
                )
            })
            .collect()
    }
}

/// The host agent's socket, if it answers: `SSH_AUTH_SOCK` of capgate's environment.
pub fn backing_agent() -> Result<PathBuf, String> {
    let Some(path) = std::env::var_os("SSH_AUTH_SOCK").filter(|p| !p.is_empty()) else {
        return Err("no SSH agent runs on the host (SSH_AUTH_SOCK is not set)".into());
    };
    let path = PathBuf::from(path);
    std::os::unix::net::UnixStream::connect(&path)
        .map(|_| path.clone())
        .map_err(|e| {
            format!(
                "the host's SSH agent at `{}` does not answer ({e})",
                path.display()
            )
        })
}

/// Makes `dir` (on the host; bound at [`DIR_IN_SANDBOX`]) hold a fresh listening socket.
/// The directory may be traversed and the socket connected to by anyone inside (the agent
/// and root inside, for install hooks); on the host both live in capgate's private data
/// directory.
pub fn listen(dir: &Path) -> io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    let path = dir.join("agent.sock");
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = std::os::unix::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Everything a relay needs.
pub struct Relay {
    pub grants: Grants,
    pub backing: PathBuf,
    pub phase: Arc<PhaseSwitch>,
    pub audit: Option<Arc<AuditWriter>>,
    pub sandbox: String,
}

/// Serves the sandbox's agent socket until the runtime shuts down.
pub async fn serve(listener: std::os::unix::net::UnixListener, relay: Relay) {
    let Ok(listener) = UnixListener::from_std(listener) else {
        return;
    };
    let relay = Arc::new(relay);
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let relay = Arc::clone(&relay);
        tokio::spawn(async move {
            let _ = relay.connection(client).await;
        });
    }
}

/// What is decided about one request.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Forward,
    /// Refused: the message's name and what about it was refused.
    Refuse(&'static str, String),
}

impl Relay {
    async fn connection(&self, mut client: UnixStream) -> io::Result<()> {
        // The host agent, connected at the first request relayed.
        let mut agent: Option<UnixStream> = None;
        while let Some(message) = read_message(&mut client).await? {
            let phase = self.phase.get();
            let verdict = match self.grants.phases.get(&phase) {
                Some(grant) => judge(grant, &message),
                None => Verdict::Refuse(name(&message), format!("no grant in the {phase} phase")),
            };
            match verdict {
                Verdict::Forward => {
                    let agent = match &mut agent {
                        Some(a) => a,
                        empty => empty.insert(UnixStream::connect(&self.backing).await?),
                    };
                    write_message(agent, &message).await?;
                    let Some(reply) = read_message(agent).await? else {
                        return Ok(());
                    };
                    write_message(&mut client, &reply).await?;
                }
                Verdict::Refuse(what, why) => {
                    self.record(phase, what, &why);
                    write_message(&mut client, &[FAILURE]).await?;
                }
            }
        }
        Ok(())
    }

    fn record(&self, phase: Phase, what: &str, why: &str) {
        if let Some(audit) = &self.audit {
            let mut event = AuditEvent::new(
                self.sandbox.clone(),
                AUDIT_HOST,
                0,
                Decision::Deny,
                Reason::NoMatchingAllow,
            );
            event.phase = Some(phase);
            event.method = Some(what.to_owned());
            event.path = Some(why.to_owned());
            audit.record(event);
        }
    }
}

/// The message's name, for the audit log.
fn name(message: &[u8]) -> &'static str {
    match message.first() {
        Some(1) => "REQUEST_RSA_IDENTITIES (SSH1)",
        Some(9) => "REMOVE_ALL_RSA_IDENTITIES (SSH1)",
        Some(&REQUEST_IDENTITIES) => "REQUEST_IDENTITIES",
        Some(&SIGN_REQUEST) => "SIGN_REQUEST",
        Some(17) => "ADD_IDENTITY",
        Some(18) => "REMOVE_IDENTITY",
        Some(19) => "REMOVE_ALL_IDENTITIES",
        Some(20) => "ADD_SMARTCARD_KEY",
        Some(21) => "REMOVE_SMARTCARD_KEY",
        Some(22) => "LOCK",
        Some(23) => "UNLOCK",
        Some(25) => "ADD_ID_CONSTRAINED",
        Some(26) => "ADD_SMARTCARD_KEY_CONSTRAINED",
        Some(27) => "EXTENSION",
        _ => "UNKNOWN",
    }
}

/// Judges one request (its type byte and contents) under a phase's grant.
fn judge(grant: &Grant, message: &[u8]) -> Verdict {
    match message.first() {
        Some(&REQUEST_IDENTITIES) if message.len() == 1 => Verdict::Forward,
        Some(&SIGN_REQUEST) if grant.unrestricted => match sign_request_data(message) {
            Some(_) => Verdict::Forward,
            None => Verdict::Refuse("SIGN_REQUEST", "malformed".into()),
        },
        Some(&SIGN_REQUEST) => match sign_request_data(message).map(sshsig_namespace) {
            Some(Some(ns)) if grant.sign.iter().any(|s| s.as_bytes() == ns) => Verdict::Forward,
            Some(Some(ns)) => Verdict::Refuse(
                "SIGN_REQUEST",
                format!(
                    "namespace `{}` is not granted",
                    capgate_spec::text::printable(&String::from_utf8_lossy(ns))
                ),
            ),
            Some(None) => Verdict::Refuse(
                "SIGN_REQUEST",
                "a login or other non-SSHSIG signature under bounds".into(),
            ),
            None => Verdict::Refuse("SIGN_REQUEST", "malformed".into()),
        },
        _ => Verdict::Refuse(name(message), "not relayed".into()),
    }
}

/// Reads an SSH `string` (u32 big-endian length, then bytes) at the start of `b`.
fn string(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_be_bytes(b.get(..4)?.try_into().ok()?) as usize;
    let rest = b.get(4..)?;
    Some((rest.get(..len)?, rest.get(len..)?))
}

/// The data to be signed of a well-formed SIGN_REQUEST: key blob, data, flags, nothing more.
fn sign_request_data(message: &[u8]) -> Option<&[u8]> {
    let (_key, rest) = string(message.get(1..)?)?;
    let (data, rest) = string(rest)?;
    (rest.len() == 4).then_some(data)
}

/// The namespace of an SSHSIG signed blob (PROTOCOL.sshsig): `SSHSIG`, then the strings
/// namespace, reserved, hash algorithm and hash, and nothing after. `None` for anything
/// else (such as the session-bound data of a login).
fn sshsig_namespace(data: &[u8]) -> Option<&[u8]> {
    let rest = data.strip_prefix(b"SSHSIG")?;
    let (namespace, rest) = string(rest)?;
    let (_reserved, rest) = string(rest)?;
    let (_hash_alg, rest) = string(rest)?;
    let (_hash, rest) = string(rest)?;
    (rest.is_empty() && !namespace.is_empty()).then_some(namespace)
}

/// One framed message (without its length), `None` at a clean end of stream.
async fn read_message(s: &mut UnixStream) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match s.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("an agent message of {len} bytes"),
        ));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await?;
    Ok(Some(body))
}

async fn write_message(s: &mut UnixStream, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("message too long"))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(body);
    s.write_all(&frame).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]
    use super::*;

    fn s(b: &[u8]) -> Vec<u8> {
        let mut v = (b.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(b);
        v
    }

    fn sign_request(data: &[u8]) -> Vec<u8> {
        let mut m = vec![SIGN_REQUEST];
        m.extend(s(b"key-blob"));
        m.extend(s(data));
        m.extend(0u32.to_be_bytes());
        m
    }

    fn sshsig(namespace: &[u8]) -> Vec<u8> {
        let mut d = b"SSHSIG".to_vec();
        for part in [namespace, b"", b"sha512", &[7u8; 64]] {
            d.extend(s(part));
        }
        d
    }

    /// A login's signed data: session id, then SSH_MSG_USERAUTH_REQUEST's fields.
    fn login() -> Vec<u8> {
        let mut d = s(&[1u8; 32]);
        d.push(50);
        for part in [&b"git"[..], b"ssh-connection", b"publickey"] {
            d.extend(s(part));
        }
        d.push(1);
        d.extend(s(b"ssh-ed25519"));
        d.extend(s(b"key-blob"));
        d
    }

    fn bounded(sign: &[&str]) -> Grant {
        Grant {
            unrestricted: false,
            sign: sign.iter().map(|s| (*s).to_owned()).collect(),
            authenticate: vec!["github.com".into()],
        }
    }

    #[test]
    fn bounds_sign_only_granted_sshsig_namespaces_and_no_login() {
        let g = bounded(&["git"]);
        assert_eq!(judge(&g, &sign_request(&sshsig(b"git"))), Verdict::Forward);
        assert_eq!(judge(&g, &[REQUEST_IDENTITIES]), Verdict::Forward);
        // The attacks: another namespace, a prefix of the granted one, a login, a blob
        // that is SSHSIG with trailing bytes, a malformed request.
        for (m, why) in [
            (sign_request(&sshsig(b"file")), "namespace `file`"),
            (sign_request(&sshsig(b"gi")), "namespace `gi`"),
            (sign_request(&login()), "non-SSHSIG"),
            (
                sign_request(&[sshsig(b"git"), vec![0]].concat()),
                "non-SSHSIG",
            ),
            (sign_request(&sshsig(b"")), "non-SSHSIG"),
            (sign_request(&sshsig(b"git"))[..20].to_vec(), "malformed"),
        ] {
            match judge(&g, &m) {
                Verdict::Refuse("SIGN_REQUEST", detail) => {
                    assert!(detail.contains(why), "{detail}")
                }
                other => panic!("{why}: {other:?}"),
            }
        }
    }

    #[test]
    fn only_listing_and_signing_are_ever_relayed() {
        let open = Grant {
            unrestricted: true,
            sign: vec![],
            authenticate: vec![],
        };
        assert_eq!(judge(&open, &sign_request(&login())), Verdict::Forward);
        assert_eq!(
            judge(&open, &sign_request(&sshsig(b"any"))),
            Verdict::Forward
        );
        for (m, what) in [
            (vec![17u8, 0, 0, 0, 0], "ADD_IDENTITY"),
            (vec![18u8], "REMOVE_IDENTITY"),
            (vec![19u8], "REMOVE_ALL_IDENTITIES"),
            (vec![22u8], "LOCK"),
            (
                [vec![27u8], s(b"session-bind@openssh.com")].concat(),
                "EXTENSION",
            ),
            (vec![REQUEST_IDENTITIES, 0], "REQUEST_IDENTITIES"),
            (vec![200u8], "UNKNOWN"),
        ] {
            match judge(&open, &m) {
                Verdict::Refuse(name, _) => assert_eq!(name, what),
                Verdict::Forward => panic!("{what} was relayed"),
            }
        }
    }
}
