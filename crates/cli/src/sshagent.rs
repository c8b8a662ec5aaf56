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
//! `ssh-agent`. A `session-bind@openssh.com` extension is relayed once its host-key
//! signature verifies, and remembered for the connection; under `authenticate` bounds a
//! login signature is made only for a session so bound to a granted server
//! ([`crate::sshbind`]).

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

use crate::sshbind::{Binding, KnownHosts, Server, string};

/// Where the workload finds the agent (`SSH_AUTH_SOCK`).
pub const SOCKET_IN_SANDBOX: &str = "/tmp/capgate-ssh-agent/agent.sock";
/// The directory bound there.
pub const DIR_IN_SANDBOX: &str = "/tmp/capgate-ssh-agent";

/// The host of the audit events about agent requests (port 0; the message as the method,
/// what was refused about it as the path).
pub const AUDIT_HOST: &str = "ssh-agent";

/// Largest reply of the host agent relayed (OpenSSH's own limit is 256 KiB).
const MAX_MESSAGE: usize = 256 * 1024;
/// Largest request from inside: a signing request (with a certificate, an RSA-8192 key or
/// a session binding) stays well below this.
const MAX_REQUEST: usize = 32 * 1024;
/// At most this many connections to the relay at once (each may hold one to the host
/// agent); more wait to be accepted. They harm only the sandbox's own use of the agent.
const MAX_CONNECTIONS: usize = 32;
/// A message whose length has arrived must arrive whole within this.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Session bindings one connection may hold (OpenSSH's agent allows 16).
const MAX_BINDINGS: usize = 16;

// Agent protocol message numbers (draft-miller-ssh-agent).
const FAILURE: u8 = 5;
const REQUEST_IDENTITIES: u8 = 11;
const IDENTITIES_ANSWER: u8 = 12;
const SIGN_RESPONSE: u8 = 14;
const SIGN_REQUEST: u8 = 13;
const EXTENSION: u8 = 27;

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
    /// The host user's known host keys, read before the sandbox started.
    pub known_hosts: KnownHosts,
}

/// Serves the sandbox's agent socket until the runtime shuts down.
pub async fn serve(listener: std::os::unix::net::UnixListener, relay: Relay) {
    let Ok(listener) = UnixListener::from_std(listener) else {
        return;
    };
    let relay = Arc::new(relay);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let relay = Arc::clone(&relay);
        tokio::spawn(async move {
            let _slot = slot;
            let _ = relay.connection(client).await;
        });
    }
}

/// What is decided about one request.
#[derive(Debug)]
enum Verdict {
    Forward,
    /// A verified host binding: remembered for the connection, and relayed.
    Bind(Binding),
    /// Refused: the message's name and what about it was refused.
    Refuse(&'static str, String),
}

impl Relay {
    async fn connection(&self, mut client: UnixStream) -> io::Result<()> {
        // The host agent, connected at the first request relayed.
        let mut agent: Option<UnixStream> = None;
        let mut bindings: Vec<Binding> = Vec::new();
        while let Some(message) = read_message(&mut client, MAX_REQUEST).await? {
            let phase = self.phase.get();
            let verdict = match self.grants.phases.get(&phase) {
                Some(grant) => judge(grant, &message, &bindings, &self.known_hosts),
                None => Verdict::Refuse(name(&message), format!("no grant in the {phase} phase")),
            };
            if let Verdict::Bind(b) = &verdict {
                bindings.push(b.clone());
            }
            match verdict {
                Verdict::Forward | Verdict::Bind(_) => {
                    let agent = match &mut agent {
                        Some(a) => a,
                        empty => empty.insert(UnixStream::connect(&self.backing).await?),
                    };
                    write_message(agent, &message).await?;
                    let Some(reply) = read_message(agent, MAX_MESSAGE).await? else {
                        return Ok(());
                    };
                    let reply = match message.first() {
                        // Key comments name host files and users: the keys alone go in.
                        Some(&REQUEST_IDENTITIES) => {
                            without_comments(&reply).unwrap_or_else(|| vec![FAILURE])
                        }
                        Some(&SIGN_REQUEST) => {
                            if reply.first() == Some(&SIGN_RESPONSE) {
                                self.record_signature(phase, &message);
                            }
                            reply
                        }
                        _ => reply,
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

    /// The signature log: each signature made, with what it signs.
    fn record_signature(&self, phase: Phase, message: &[u8]) {
        let data = sign_request_data(message).unwrap_or_default();
        let what = if let Some(ns) = sshsig_namespace(data) {
            format!(
                "SSHSIG namespace `{}`",
                capgate_spec::text::printable(&String::from_utf8_lossy(ns))
            )
        } else if let Some(l) = crate::sshbind::login(data) {
            format!(
                "login as `{}`",
                capgate_spec::text::printable(&String::from_utf8_lossy(l.user))
            )
        } else {
            "other data".to_owned()
        };
        self.audit_event(phase, Decision::Allow, "SIGN_REQUEST", &what);
    }

    /// A refused request, in the audit log.
    fn record(&self, phase: Phase, what: &str, why: &str) {
        self.audit_event(phase, Decision::Deny, what, why);
    }

    /// An event about the agent: host [`AUDIT_HOST`], port 0, the message as the method.
    fn audit_event(&self, phase: Phase, decision: Decision, what: &str, detail: &str) {
        let Some(audit) = &self.audit else {
            return;
        };
        let reason = match decision {
            Decision::Allow => Reason::AllowedByRule,
            Decision::Deny => Reason::NoMatchingAllow,
        };
        let mut event = AuditEvent::new(self.sandbox.clone(), AUDIT_HOST, 0, decision, reason);
        event.phase = Some(phase);
        event.method = Some(what.to_owned());
        event.path = Some(detail.to_owned());
        audit.record(event);
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

/// Judges one request (its type byte and contents) under a phase's grant, given the host
/// bindings verified on its connection so far.
fn judge(grant: &Grant, message: &[u8], bindings: &[Binding], known: &KnownHosts) -> Verdict {
    let printable =
        |b: &[u8]| capgate_spec::text::printable(&String::from_utf8_lossy(b)).into_owned();
    match message.first() {
        Some(&REQUEST_IDENTITIES) if message.len() == 1 => Verdict::Forward,
        Some(&EXTENSION) => match message.get(1..).and_then(string) {
            Some((b"session-bind@openssh.com", body)) => match crate::sshbind::session_bind(body) {
                // As OpenSSH's agent: a connection bound for a login takes no further
                // binding, and holds at most MAX_BINDINGS.
                Some(_) if bindings.iter().any(|b| !b.forwarded) => Verdict::Refuse(
                    "EXTENSION",
                    "a session-bind@openssh.com on a connection already bound for a login".into(),
                ),
                Some(_) if bindings.len() >= MAX_BINDINGS => Verdict::Refuse(
                    "EXTENSION",
                    format!("more than {MAX_BINDINGS} session-bind@openssh.com on one connection"),
                ),
                Some(binding) => Verdict::Bind(binding),
                None => Verdict::Refuse(
                    "EXTENSION",
                    "a session-bind@openssh.com that is malformed or whose host-key signature does not verify".into(),
                ),
            },
            Some((other, _)) => {
                Verdict::Refuse("EXTENSION", format!("`{}` not relayed", printable(other)))
            }
            None => Verdict::Refuse("EXTENSION", "malformed".into()),
        },
        Some(&SIGN_REQUEST) if grant.unrestricted => match sign_request_data(message) {
            Some(_) => Verdict::Forward,
            None => Verdict::Refuse("SIGN_REQUEST", "malformed".into()),
        },
        Some(&SIGN_REQUEST) => {
            let Some(data) = sign_request_data(message) else {
                return Verdict::Refuse("SIGN_REQUEST", "malformed".into());
            };
            if let Some(ns) = sshsig_namespace(data) {
                return if grant.sign.iter().any(|s| s.as_bytes() == ns) {
                    Verdict::Forward
                } else {
                    Verdict::Refuse(
                        "SIGN_REQUEST",
                        format!("namespace `{}` is not granted", printable(ns)),
                    )
                };
            }
            match crate::sshbind::login(data) {
                Some(l) => judge_login(grant, &l, bindings, known),
                None => Verdict::Refuse(
                    "SIGN_REQUEST",
                    "neither an SSHSIG signature nor a login".into(),
                ),
            }
        }
        _ => Verdict::Refuse(name(message), "not relayed".into()),
    }
}

/// A login signature under bounds: for a session bound (not forwarded) on this connection
/// to a host key that `known_hosts` gives for a granted server, as a granted user.
fn judge_login(
    grant: &Grant,
    login: &crate::sshbind::Login<'_>,
    bindings: &[Binding],
    known: &KnownHosts,
) -> Verdict {
    let refuse = |why: String| Verdict::Refuse("SIGN_REQUEST", format!("login: {why}"));
    // A connection that came through a forwarded agent (any forwarded binding) makes no
    // login under bounds: the host it was forwarded to would be logging in, not the
    // sandbox. Otherwise the login is for the session bound last.
    if bindings.iter().any(|b| b.forwarded) {
        return refuse("the agent connection was forwarded through another host".into());
    }
    let Some(binding) = bindings.last().filter(|b| b.session_id == login.session_id) else {
        return refuse(
            "no verified session-bind@openssh.com for this session on this connection".into(),
        );
    };
    if login
        .hostkey
        .is_some_and(|k| k != binding.hostkey.as_slice())
    {
        return refuse("the signed host key is not the bound one".into());
    }
    let servers: Vec<Server> = grant
        .authenticate
        .iter()
        .map(|a| Server::parse(a))
        .collect();
    let known_server: Vec<&Server> = servers
        .iter()
        .filter(|s| known.holds(&s.host, &binding.hostkey))
        .collect();
    if known_server.is_empty() {
        return refuse(format!(
            "the server's host key is not a known_hosts key of {}",
            grant.authenticate.join(", ")
        ));
    }
    if known_server
        .iter()
        .any(|s| s.user.as_deref().is_none_or(|u| u.as_bytes() == login.user))
    {
        Verdict::Forward
    } else {
        refuse(format!(
            "user `{}` is not granted on that server",
            capgate_spec::text::printable(&String::from_utf8_lossy(login.user))
        ))
    }
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

/// An IDENTITIES_ANSWER with every comment emptied; `None` if it does not parse.
fn without_comments(reply: &[u8]) -> Option<Vec<u8>> {
    let (&IDENTITIES_ANSWER, rest) = reply.split_first()? else {
        return None;
    };
    let count = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?);
    let mut rest = rest.get(4..)?;
    let mut out = vec![IDENTITIES_ANSWER];
    out.extend_from_slice(&count.to_be_bytes());
    for _ in 0..count {
        let (key, after) = string(rest)?;
        let (_comment, after) = string(after)?;
        out.extend_from_slice(&u32::try_from(key.len()).ok()?.to_be_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(&0u32.to_be_bytes());
        rest = after;
    }
    rest.is_empty().then_some(out)
}

/// One framed message (without its length) of at most `max` bytes, `None` at a clean end
/// of stream.
async fn read_message(s: &mut UnixStream, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match s.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("an agent message of {len} bytes"),
        ));
    }
    let mut body = vec![0u8; len];
    match tokio::time::timeout(BODY_TIMEOUT, s.read_exact(&mut body)).await {
        Ok(read) => read?,
        Err(_) => return Err(io::ErrorKind::TimedOut.into()),
    };
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
    use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};

    fn s(b: &[u8]) -> Vec<u8> {
        let mut v = (b.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(b);
        v
    }

    fn sign_request(data: &[u8]) -> Vec<u8> {
        [
            vec![SIGN_REQUEST],
            s(b"key-blob"),
            s(data),
            0u32.to_be_bytes().to_vec(),
        ]
        .concat()
    }

    fn sshsig(namespace: &[u8]) -> Vec<u8> {
        let mut d = b"SSHSIG".to_vec();
        for part in [namespace, b"", b"sha512", &[7u8; 64]] {
            d.extend(s(part));
        }
        d
    }

    /// A login's signed data for `session` as `user` (hostbound to `hostkey` if given).
    fn login(session: &[u8], user: &[u8], hostkey: Option<&[u8]>) -> Vec<u8> {
        let method: &[u8] = if hostkey.is_some() {
            b"publickey-hostbound-v00@openssh.com"
        } else {
            b"publickey"
        };
        [
            s(session),
            vec![50],
            s(user),
            s(b"ssh-connection"),
            s(method),
            vec![1],
            s(b"ssh-ed25519"),
            s(b"key-blob"),
            hostkey.map(s).unwrap_or_default(),
        ]
        .concat()
    }

    /// A server host key, and the session-bind extension message it signs for `session`.
    fn server() -> (Vec<u8>, Ed25519KeyPair) {
        let pair = Ed25519KeyPair::generate().unwrap();
        (
            [s(b"ssh-ed25519"), s(pair.public_key().as_ref())].concat(),
            pair,
        )
    }

    fn bind(hostkey: &[u8], pair: &Ed25519KeyPair, session: &[u8], forwarded: bool) -> Vec<u8> {
        let sig = [s(b"ssh-ed25519"), s(pair.sign(session).as_ref())].concat();
        [
            vec![EXTENSION],
            s(b"session-bind@openssh.com"),
            s(hostkey),
            s(session),
            s(&sig),
            vec![u8::from(forwarded)],
        ]
        .concat()
    }

    fn bounded(sign: &[&str], authenticate: &[&str]) -> Grant {
        Grant {
            unrestricted: false,
            sign: sign.iter().map(|s| (*s).to_owned()).collect(),
            authenticate: authenticate.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Runs `messages` through `judge` as one connection does: the refusals' details, or
    /// `ok` for each relayed one.
    fn connection(grant: &Grant, known: &KnownHosts, messages: &[Vec<u8>]) -> Vec<String> {
        let mut bindings = Vec::new();
        messages
            .iter()
            .map(|m| match judge(grant, m, &bindings, known) {
                Verdict::Forward => "ok".to_owned(),
                Verdict::Bind(b) => {
                    bindings.push(b);
                    "bound".to_owned()
                }
                Verdict::Refuse(what, why) => format!("{what}: {why}"),
            })
            .collect()
    }

    #[test]
    fn bounds_sign_only_granted_sshsig_namespaces() {
        let g = bounded(&["git"], &[]);
        let known = KnownHosts::default();
        let got = connection(
            &g,
            &known,
            &[
                vec![REQUEST_IDENTITIES],
                sign_request(&sshsig(b"git")),
                // The attacks: another namespace, a prefix of the granted one, a blob with
                // trailing bytes, an empty namespace, a truncated request.
                sign_request(&sshsig(b"file")),
                sign_request(&sshsig(b"gi")),
                sign_request(&[sshsig(b"git"), vec![0]].concat()),
                sign_request(&sshsig(b"")),
                sign_request(&sshsig(b"git"))[..20].to_vec(),
            ],
        );
        assert_eq!(
            got,
            [
                "ok",
                "ok",
                "SIGN_REQUEST: namespace `file` is not granted",
                "SIGN_REQUEST: namespace `gi` is not granted",
                "SIGN_REQUEST: neither an SSHSIG signature nor a login",
                "SIGN_REQUEST: neither an SSHSIG signature nor a login",
                "SIGN_REQUEST: malformed",
            ]
        );
    }

    /// Under `authenticate` bounds, a login is signed only for the session bound last on
    /// the same connection, by a verified signature, to a host key known_hosts gives for a
    /// granted server, as the granted user; the hostbound key must be the bound one; a
    /// connection forwarded through another host signs no login.
    #[test]
    fn logins_need_a_verified_binding_to_a_known_granted_server() {
        let (key, pair) = server();
        let (other_key, other_pair) = server();
        let b64 = |k: &[u8]| {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(k)
        };
        let known = KnownHosts::parse(&format!(
            "github.test ssh-ed25519 {}\nother.test ssh-ed25519 {}\n",
            b64(&key),
            b64(&other_key)
        ));
        let g = bounded(&[], &["git@github.test"]);
        let (sid, sid2, sid3) = ([1u8; 32], [2u8; 32], [3u8; 32]);
        let no_binding = "SIGN_REQUEST: login: no verified session-bind@openssh.com for this session on this connection";
        let got = connection(
            &g,
            &known,
            &[
                // No binding yet: refused.
                sign_request(&login(&sid, b"git", None)),
                bind(&key, &pair, &sid, false),
                sign_request(&login(&sid, b"git", None)),
                sign_request(&login(&sid, b"git", Some(&key))),
                // Another user, another session, the hostbound key swapped.
                sign_request(&login(&sid, b"root", None)),
                sign_request(&login(&sid2, b"git", None)),
                sign_request(&login(&sid, b"git", Some(&other_key))),
                // Bound for a login: no further binding.
                bind(&key, &pair, &sid2, false),
            ],
        );
        assert_eq!(
            got,
            [
                no_binding,
                "bound",
                "ok",
                "ok",
                "SIGN_REQUEST: login: user `root` is not granted on that server",
                no_binding,
                "SIGN_REQUEST: login: the signed host key is not the bound one",
                "EXTENSION: a session-bind@openssh.com on a connection already bound for a login",
            ]
        );
        // A binding whose signature is by another key than it names; a session id longer
        // than any exchange hash.
        let unverified = "EXTENSION: a session-bind@openssh.com that is malformed or whose host-key signature does not verify";
        let forged = bind(&key, &other_pair, &sid, false);
        let got = connection(&g, &known, &[forged, bind(&key, &pair, &[7u8; 65], false)]);
        assert_eq!(got, [unverified, unverified]);
        // A known server that is not granted.
        let got = connection(
            &g,
            &known,
            &[
                bind(&other_key, &other_pair, &sid2, false),
                sign_request(&login(&sid2, b"git", None)),
            ],
        );
        assert_eq!(
            got,
            [
                "bound",
                "SIGN_REQUEST: login: the server's host key is not a known_hosts key of git@github.test",
            ]
        );
        // Forwarded through another host, then bound to the granted one: no login.
        let got = connection(
            &g,
            &known,
            &[
                bind(&other_key, &other_pair, &sid3, true),
                bind(&key, &pair, &sid, false),
                sign_request(&login(&sid, b"git", None)),
            ],
        );
        assert_eq!(
            got,
            [
                "bound",
                "bound",
                "SIGN_REQUEST: login: the agent connection was forwarded through another host",
            ]
        );
        // At most 16 bindings on a connection.
        let many: Vec<Vec<u8>> = (0..17u8)
            .map(|i| bind(&key, &pair, &[i; 32], true))
            .collect();
        let got = connection(&g, &known, &many);
        assert_eq!(got[15], "bound");
        assert_eq!(
            got[16],
            "EXTENSION: more than 16 session-bind@openssh.com on one connection"
        );
        // Without a user, any user logs in to the granted host.
        let any = bounded(&[], &["github.test"]);
        let got = connection(
            &any,
            &known,
            &[
                bind(&key, &pair, &sid, false),
                sign_request(&login(&sid, b"root", None)),
            ],
        );
        assert_eq!(got, ["bound", "ok"]);
    }

    #[test]
    fn identity_answers_lose_their_comments_and_nothing_else() {
        let answer = [
            vec![IDENTITIES_ANSWER],
            2u32.to_be_bytes().to_vec(),
            s(b"key-one"),
            s(b"/home/ada/.ssh/id_ed25519"),
            s(b"key-two"),
            s(b"ada@laptop"),
        ]
        .concat();
        let expected = [
            vec![IDENTITIES_ANSWER],
            2u32.to_be_bytes().to_vec(),
            s(b"key-one"),
            s(b""),
            s(b"key-two"),
            s(b""),
        ]
        .concat();
        assert_eq!(without_comments(&answer).unwrap(), expected);
        // Malformed (a key missing, trailing bytes, another message): not relayed.
        assert!(without_comments(&answer[..answer.len() - 3]).is_none());
        assert!(without_comments(&[answer.clone(), vec![0]].concat()).is_none());
        assert!(without_comments(&[FAILURE]).is_none());
    }

    #[test]
    fn only_listing_signing_and_verified_bindings_are_ever_relayed() {
        let open = Grant {
            unrestricted: true,
            sign: vec![],
            authenticate: vec![],
        };
        let known = KnownHosts::default();
        let (key, pair) = server();
        let got = connection(
            &open,
            &known,
            &[
                sign_request(&login(&[1u8; 32], b"git", None)),
                sign_request(&sshsig(b"any")),
                bind(&key, &pair, &[1u8; 32], false),
                vec![17u8, 0, 0, 0, 0],
                vec![18u8],
                vec![19u8],
                vec![22u8],
                [vec![EXTENSION], s(b"restrict-destination-v00@openssh.com")].concat(),
                vec![REQUEST_IDENTITIES, 0],
                vec![200u8],
            ],
        );
        assert_eq!(
            got,
            [
                "ok",
                "ok",
                "bound",
                "ADD_IDENTITY: not relayed",
                "REMOVE_IDENTITY: not relayed",
                "REMOVE_ALL_IDENTITIES: not relayed",
                "LOCK: not relayed",
                "EXTENSION: `restrict-destination-v00@openssh.com` not relayed",
                "REQUEST_IDENTITIES: not relayed",
                "UNKNOWN: not relayed",
            ]
        );
    }
}
