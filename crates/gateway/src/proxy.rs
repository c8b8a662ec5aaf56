//! The enforcing forward proxy: the sandbox's only way out.
//!
//! Per client connection: read one request head strictly ([`crate::h1`]); a `CONNECT`
//! becomes a tunnel — opaque (after checking the TLS server name against the CONNECT host)
//! or intercepted with a leaf minted for that host when a rule or a credential needs to see
//! the requests; an absolute-form request is forwarded. Every connection and every request
//! is decided by the policy, every address is vetted by the address guard (and only the
//! vetted address is dialled), credentials are brokered, requests are re-serialized (never
//! forwarded as raw bytes), and every decision goes to the audit log.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use capgate_policy::audit::{AuditEvent, AuditWriter};
use capgate_policy::{
    Decision, HttpRequest, Matcher, Method, Phase, Protocol, Query, Reason, Target, Verdict,
};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::timeout;

use crate::addr::{AddressGuard, Refusal as AddrRefusal, Resolve};
use crate::broker::Broker;
use crate::cleartext::Relayed;
use crate::h1::{self, Framing, Header, Parsed, RequestHead, ResponseHead};
use crate::mask::{Mask, MaskStream, RELEASE_AFTER, WsMasker, masked_text};
use crate::respond;
use crate::stall::{self, Stall};
use crate::tls::{CertificateAuthority, MAX_PEEK_LEN, SniPeek, peek_sni, sni_matches_authority};

/// The grant phase the gateway enforces; the runner switches it from install to runtime
/// before the workload starts. Long-lived relays watch it (see `Gateway::until_revoked`).
#[derive(Debug)]
pub struct PhaseSwitch {
    /// The phase for the hot path (read several times per request, never locked).
    install: AtomicBool,
    changes: watch::Sender<Phase>,
}

impl PhaseSwitch {
    pub fn new(phase: Phase) -> PhaseSwitch {
        PhaseSwitch {
            install: AtomicBool::new(phase == Phase::Install),
            changes: watch::Sender::new(phase),
        }
    }

    pub fn get(&self) -> Phase {
        if self.install.load(Ordering::Acquire) {
            Phase::Install
        } else {
            Phase::Runtime
        }
    }

    pub fn set(&self, phase: Phase) {
        self.install
            .store(phase == Phase::Install, Ordering::Release);
        self.changes.send_if_modified(|current| {
            let changed = *current != phase;
            *current = phase;
            changed
        });
    }

    fn changes(&self) -> watch::Receiver<Phase> {
        self.changes.subscribe()
    }
}

/// The compiled rules in force; replaced as a whole when the store changes.
#[derive(Debug)]
pub struct PolicyView {
    matcher: RwLock<Arc<Matcher>>,
    /// Counts replacements, for the relays that re-decide on every change.
    replaced: watch::Sender<u64>,
}

impl PolicyView {
    pub fn new(matcher: Matcher) -> PolicyView {
        PolicyView {
            matcher: RwLock::new(Arc::new(matcher)),
            replaced: watch::Sender::new(0),
        }
    }

    pub fn current(&self) -> Option<Arc<Matcher>> {
        self.matcher.read().ok().map(|m| Arc::clone(&m))
    }

    pub fn replace(&self, matcher: Matcher) {
        if let Ok(mut m) = self.matcher.write() {
            *m = Arc::new(matcher);
        }
        self.replaced.send_modify(|n| *n += 1);
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.replaced.subscribe()
    }
}

/// Bounds on what one sandbox may cost the gateway.
#[derive(Debug, Clone)]
pub struct Limits {
    pub h1: h1::Limits,
    /// Time to receive a complete request head (slowloris).
    pub head_timeout: Duration,
    /// Time a kept-alive connection may sit idle between requests.
    pub idle_timeout: Duration,
    /// Time to connect to an upstream, and to receive its response head.
    pub upstream_timeout: Duration,
    /// Connections open at once for the sandbox.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            h1: h1::Limits::default(),
            head_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            upstream_timeout: Duration::from_secs(30),
            max_connections: 1024,
        }
    }
}

/// Descriptors kept free for what is not a connection (listeners, the audit store, the
/// resolver, files), beside [`DESCRIPTORS_PER_CONNECTION`] per connection.
const DESCRIPTOR_RESERVE: u64 = 64;
/// What one connection may hold: the client, the upstream, and a pipe for splicing.
const DESCRIPTORS_PER_CONNECTION: u64 = 4;

impl Limits {
    /// Raises this process's soft descriptor limit (`ulimit -n`) to its hard one, and
    /// bounds `max_connections` by what the limit holds, so that the limit on connections
    /// answers (503) before the process runs out of descriptors. Returns the connections
    /// the descriptor limit cut off, if any (the caller may say so).
    pub fn fit_descriptors(&mut self) -> Option<(usize, u64)> {
        use rustix::process::{Resource, getrlimit, setrlimit};
        let mut limit = getrlimit(Resource::Nofile);
        if limit.current < limit.maximum {
            let raised = rustix::process::Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            };
            if setrlimit(Resource::Nofile, raised).is_ok() {
                limit = raised;
            }
        }
        let available = limit.current?;
        let fits = available.saturating_sub(DESCRIPTOR_RESERVE) / DESCRIPTORS_PER_CONNECTION;
        let fits = usize::try_from(fits).unwrap_or(usize::MAX).max(1);
        if fits < self.max_connections {
            let wanted = self.max_connections;
            self.max_connections = fits;
            return Some((wanted, available));
        }
        None
    }
}

/// Everything one sandbox's gateway needs.
pub struct GatewayConfig {
    pub sandbox: String,
    pub policy: Arc<PolicyView>,
    pub phase: Arc<PhaseSwitch>,
    pub guard: AddressGuard,
    pub resolver: Arc<dyn Resolve + Send + Sync>,
    /// The local CA that mints leaves for intercepted hosts; without it, hosts that need
    /// inspection are refused.
    pub ca: Option<CertificateAuthority>,
    pub upstream_tls: Arc<rustls::ClientConfig>,
    pub broker: Broker,
    pub audit: Option<Arc<AuditWriter>>,
    pub limits: Limits,
    /// The sandbox's determinism tier is `read-only` (`dev.capgate/determinism@1`): in the
    /// runtime phase only `GET`, `HEAD` and `OPTIONS` requests without a body leave, and no
    /// protocol switch, whatever the rules allow (they cannot name extension methods).
    pub read_only: bool,
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("sandbox", &self.sandbox)
            .field("phase", &self.phase.get())
            .field("intercepts", &self.ca.is_some())
            .field("broker", &self.broker)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A running gateway for one sandbox. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: GatewayConfig,
    connections: Semaphore,
    /// SOCKS connections beyond `connections` whose request is still read (to refuse it
    /// with an answer); beyond these, a connection is closed at once.
    overflow: Semaphore,
    /// Whether a failed `accept` was said on stderr (once per gateway).
    accept_failure_said: AtomicBool,
    /// `cfg.upstream_tls` offering `h2` before `http/1.1`: for a tunnel whose client
    /// offered `h2` (see [`crate::http2`]).
    upstream_tls_h2: Arc<rustls::ClientConfig>,
}

/// Something a connection can be served over.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {
    /// The socket itself when this is plain TCP (no TLS layer): bodies between two such
    /// sockets move through a pipe with splice(2) instead of through user space.
    fn plain_tcp(&mut self) -> Option<&mut TcpStream> {
        None
    }
}
impl Io for TcpStream {
    fn plain_tcp(&mut self) -> Option<&mut TcpStream> {
        Some(self)
    }
}
/// An intercepted client connection.
impl Io for tokio_rustls::server::TlsStream<Rewind<'_, TcpStream>> {}
/// A TLS connection to an upstream.
impl Io for tokio_rustls::client::TlsStream<TcpStream> {}

/// Serving stopped on an I/O error (the client was answered where it could be).
type Served = std::io::Result<()>;

/// Connections over the sandbox's limit whose request is still read, to answer it.
const OVERFLOW: usize = 64;
/// How long the accept loop waits after a failed `accept` before trying again.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

impl Gateway {
    pub fn new(cfg: GatewayConfig) -> Gateway {
        let max = cfg.limits.max_connections;
        let mut h2 = (*cfg.upstream_tls).clone();
        h2.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Gateway {
            inner: Arc::new(Inner {
                cfg,
                connections: Semaphore::new(max),
                overflow: Semaphore::new(OVERFLOW),
                accept_failure_said: AtomicBool::new(false),
                upstream_tls_h2: Arc::new(h2),
            }),
        }
    }

    pub fn phase(&self) -> &PhaseSwitch {
        &self.inner.cfg.phase
    }

    /// Accepts HTTP proxy connections (CONNECT and absolute-form) for as long as it runs.
    pub async fn serve_http(&self, listener: TcpListener) -> std::io::Result<()> {
        loop {
            let Some(stream) = self.accept(&listener).await else {
                continue;
            };
            let gw = self.clone();
            tokio::spawn(async move {
                gw.client(stream).await;
            });
        }
    }

    /// The next connection of `listener`, or `None` after a failed `accept` (out of
    /// descriptors, say: a client holding many connections must not stop the gateway).
    /// A failure is recorded, said once on stderr, and followed by a short pause, so that
    /// the pending connections wait in the backlog until descriptors are free.
    pub(crate) async fn accept(&self, listener: &TcpListener) -> Option<TcpStream> {
        match listener.accept().await {
            Ok((stream, _)) => Some(stream),
            Err(e) => {
                if !self.inner.accept_failure_said.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "capgate: gateway of sandbox `{}`: cannot accept a connection ({e}); new connections wait until it can",
                        self.sandbox()
                    );
                }
                self.audit_simple("(connection)", 0, Decision::Deny, Reason::LimitExceeded);
                tokio::time::sleep(ACCEPT_PAUSE).await;
                None
            }
        }
    }

    async fn client(&self, mut stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let Some(_permit) = self.connection_permit() else {
            let body = format!(
                "capgate refused the connection: sandbox `{}` has {} connections open, the limit\n",
                self.cfg().sandbox,
                self.cfg().limits.max_connections
            );
            let _ = self
                .send(
                    &mut stream,
                    &respond::plain(503, Reason::LimitExceeded, &body, true),
                )
                .await;
            self.audit_simple("(connection)", 0, Decision::Deny, Reason::LimitExceeded);
            return;
        };
        let _ = self.serve_plain(&mut stream).await;
        let _ = stream.shutdown().await;
    }

    /// One of the sandbox's `max_connections` slots (HTTP and SOCKS share them), held
    /// while the connection lives; `None` when all are taken.
    pub(crate) fn connection_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.inner.connections.try_acquire().ok()
    }

    /// Waits, at most `patience`, until no connection holds one of the sandbox's slots.
    /// For the end of a run: once the sandbox has stopped its connections are closing,
    /// and some record their decision only as they end (a tunnel, a large answer, a
    /// client's alert); a runtime shut down before that would lose the record.
    pub async fn settled(&self, patience: Duration) {
        let all = u32::try_from(self.cfg().limits.max_connections).unwrap_or(u32::MAX);
        let _ = tokio::time::timeout(patience, self.inner.connections.acquire_many(all)).await;
    }

    /// A slot for reading the request of a connection over the limit, to refuse it with
    /// an answer; `None` when [`OVERFLOW`] such connections are already waiting.
    pub(crate) fn overflow_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.inner.overflow.try_acquire().ok()
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.cfg().limits
    }

    pub(crate) fn sandbox(&self) -> &str {
        &self.cfg().sandbox
    }

    /// Writes all of `bytes` to a client within the idle timeout: a client that reads
    /// nothing cannot hold its connection (and its slot) forever.
    async fn send<C: AsyncWrite + Unpin + ?Sized>(
        &self,
        client: &mut C,
        bytes: &[u8],
    ) -> std::io::Result<()> {
        stall::writing(self.cfg().limits.idle_timeout, client.write_all(bytes)).await
    }

    pub(crate) fn cfg(&self) -> &GatewayConfig {
        &self.inner.cfg
    }

    pub(crate) fn head_timeout(&self) -> Duration {
        self.cfg().limits.head_timeout
    }

    /// The connection-level decision for `target:port` in the current phase.
    /// Decides a connection carrying `carried` (SOCKS: `tcp`; a CONNECT tunnel: `https`
    /// until its first bytes show it is not TLS).
    pub(crate) fn decide_connection(
        &self,
        target: &Target,
        port: u16,
        carried: Protocol,
    ) -> Verdict {
        self.decide(target, port, carried, None)
    }

    /// Every port the rules in force name in an allow (see `Matcher::allowed_ports`).
    pub(crate) fn policy_ports(&self) -> Vec<u16> {
        self.cfg()
            .policy
            .current()
            .map(|m| m.allowed_ports().to_vec())
            .unwrap_or_default()
    }

    pub(crate) async fn vet_address(
        &self,
        host: &str,
        port: u16,
    ) -> Result<SocketAddr, AddrRefusal> {
        self.vet(host, port).await
    }

    pub(crate) fn record(&self, host: &str, port: u16, verdict: &Verdict, bytes: (u64, u64)) {
        self.audit_verdict(host, port, verdict, None, bytes);
    }

    fn decide(
        &self,
        target: &Target,
        port: u16,
        carried: Protocol,
        http: Option<HttpRequest>,
    ) -> Verdict {
        let query = Query {
            sandbox: Some(self.cfg().sandbox.clone()),
            phase: self.cfg().phase.get(),
            target: target.clone(),
            port,
            protocol: carried,
            http,
        };
        match self.cfg().policy.current() {
            Some(m) => m.decide(&query),
            None => Verdict::refused(Reason::InternalError, "the policy could not be read"),
        }
    }

    /// A read-only sandbox's refusal of a request that could change something: any method
    /// but `GET`, `HEAD` and `OPTIONS` (extension methods included), a body, a protocol
    /// switch. `None` when the request only reads, or the sandbox is not read-only, or its
    /// install hooks are running (set-up keeps its grants).
    pub(crate) fn read_only_refusal(
        &self,
        method: &str,
        has_body: bool,
        upgrade: bool,
    ) -> Option<Verdict> {
        if !self.cfg().read_only || self.cfg().phase.get() != Phase::Runtime {
            return None;
        }
        let why = if !matches!(method, "GET" | "HEAD" | "OPTIONS") {
            format!(
                "`{}` may change something",
                capgate_spec::text::printable(method)
            )
        } else if has_body {
            format!("a `{method}` with a body may change something")
        } else if upgrade {
            "a protocol switch would carry anything past the request".to_owned()
        } else {
            return None;
        };
        Some(Verdict::refused(
            Reason::HttpNotAllowed,
            format!(
                "{why}, and the sandbox's determinism tier is read-only: only GET, HEAD and OPTIONS requests without a body leave"
            ),
        ))
    }

    /// Decides one HTTP request (`method`, normalized `path`) to `host` (normalized from
    /// `target`) and lets the broker
    /// judge and rewrite its headers: the policy's verdict, or the broker's refusal of a
    /// sentinel sent where its credential is not injected; with an allowed request that
    /// now carries a secret, the mask its response must go through. `tls_upstream`: the
    /// request leaves over TLS (a secret is never written into a cleartext request).
    #[expect(
        clippy::too_many_arguments,
        reason = "one request, as the codecs hand it over"
    )]
    pub(crate) fn judge(
        &self,
        target: &Target,
        host: &str,
        port: u16,
        (method, path): (&str, &str),
        path_and_query: &str,
        headers: &mut Vec<Header>,
        tls_upstream: bool,
    ) -> (Verdict, Option<Arc<Mask>>) {
        if Method::parse(method).is_none() && Method::parse(&method.to_ascii_uppercase()).is_some()
        {
            // Methods are case-sensitive, so `delete` is an extension method that no
            // `DELETE` rule matches; servers that upper-case the method would run it as one.
            return (
                Verdict::refused(
                    Reason::MalformedRequest,
                    format!(
                        "the method `{method}` is `{}` in another letter case; it has no single reading",
                        method.to_ascii_uppercase()
                    ),
                ),
                None,
            );
        }
        if let Some(h) = headers.iter().find(|h| {
            METHOD_OVERRIDES.iter().any(|name| h.is(name))
                && !h.value.eq_ignore_ascii_case(method.as_bytes())
        }) {
            // Frameworks that honour the header run its method, not the one judged.
            return (
                Verdict::refused(
                    Reason::MalformedRequest,
                    format!(
                        "the request is `{method}` but its `{}` header names another method; it has no single reading",
                        h.name
                    ),
                ),
                None,
            );
        }
        if let Some(other) = query_methods(path_and_query)
            .into_iter()
            .find(|m| !m.eq_ignore_ascii_case(method.as_bytes()))
        {
            // Laravel, Symfony and Express' method-override (with a query getter) read it.
            return (
                Verdict::refused(
                    Reason::MalformedRequest,
                    format!(
                        "the request is `{method}` but its query's `_method` names `{}`; it has no single reading",
                        String::from_utf8_lossy(&other).escape_default()
                    ),
                ),
                None,
            );
        }
        let request = http_request(method, path);
        let verdict = self.decide(target, port, carried_http(tls_upstream), Some(request));
        let phase = self.cfg().phase.get();
        if !verdict.is_allowed() {
            // Refused either way; one that carries a sentinel is recorded as what it is.
            if let Some(refused) = self.sentinel_in_host(host) {
                return (refused, None);
            }
            if self.cfg().broker.has_sentinels()
                && let Err(exfil) = self.cfg().broker.check(
                    (host, port),
                    phase,
                    method,
                    path_and_query,
                    headers,
                    tls_upstream,
                )
            {
                return (exfiltration(exfil.message(host)), None);
            }
            return (verdict, None);
        }
        if let Some(refused) = self.sentinel_in_host(host) {
            return (refused, None);
        }
        match self.cfg().broker.apply(
            (host, port),
            phase,
            method,
            path_and_query,
            headers,
            tls_upstream,
        ) {
            Ok(injected) => (verdict, injected.mask),
            Err(exfil) => (exfiltration(exfil.message(host)), None),
        }
    }

    /// Records how a SOCKS relay (`cleartext::relay`) ended: as `verdict`; when the client
    /// sent a sentinel in clear, as the exfiltration it is; when its first bytes were
    /// refused, as that refusal.
    pub(crate) fn record_watched(
        &self,
        host: &str,
        port: u16,
        verdict: &Verdict,
        relayed: std::io::Result<Relayed>,
    ) {
        match relayed {
            Ok(Relayed::Sentinel { service, up, down }) => {
                let exfil = crate::broker::Exfiltration {
                    service,
                    place: "a stream that is not TLS (the connection was closed)".to_owned(),
                    echo: false,
                };
                let v = exfiltration(exfil.message(&format!("{host}:{port}")));
                self.audit_verdict(host, port, &v, None, (up, down));
            }
            Ok(Relayed::Done { up, down }) => {
                self.audit_verdict(host, port, verdict, None, (up, down))
            }
            Ok(Relayed::Refused {
                reason,
                message,
                down,
            }) => {
                let v = Verdict::refused(reason, message);
                self.audit_verdict(host, port, &v, None, (0, down));
            }
            Err(_) => self.audit_verdict(host, port, verdict, None, (0, 0)),
        }
    }

    /// The refusal of a host name that carries a credential sentinel (`SENTINEL.example.com`
    /// would leak it through DNS, SNI or the upstream's logs), whatever the rules say.
    pub(crate) fn sentinel_in_host(&self, host: &str) -> Option<Verdict> {
        let service = self.cfg().broker.sentinel_in(host.as_bytes())?;
        let exfil = crate::broker::Exfiltration {
            service: service.to_owned(),
            place: "the host name".to_owned(),
            echo: false,
        };
        Some(exfiltration(exfil.message(host)))
    }

    /// Resolves, with the new verdict, once the grant that let a long-lived relay start
    /// (an opaque tunnel, a SOCKS connection, a WebSocket) no longer holds: the decision is
    /// taken again at every phase switch and every rule change. An opaque relay (`http`
    /// is `None`) is also revoked when its host now needs inspection. So a connection
    /// opened under install grants does not carry on into the runtime phase. `began` is
    /// the phase its grant was decided in, read by the caller before deciding: a switch
    /// between that decision and this call (the upstream's connect, the 101 already sent)
    /// is caught by the first decision here, and a read-only sandbox's cut by `began`.
    pub(crate) async fn until_revoked(
        &self,
        (target, port, carried): (&Target, u16, Protocol),
        http: Option<HttpRequest>,
        began: Phase,
    ) -> Verdict {
        let mut phase = self.cfg().phase.changes();
        let mut rules = self.cfg().policy.changes();
        // The grant was decided before these subscriptions: a change in between is caught
        // by deciding once more now, before the first wait.
        let mut first = true;
        loop {
            if !first {
                // The senders live as long as the gateway, which outlives its relays.
                tokio::select! {
                    Ok(()) = phase.changed() => {}
                    Ok(()) = rules.changed() => {}
                    else => std::future::pending::<()>().await,
                }
            }
            first = false;
            if let Some(v) = self.revocation((target, port, carried), http.as_ref(), began) {
                return v;
            }
        }
    }

    /// Why the grant of a connection (`http`: of the request it carries; `None`: opaque),
    /// decided in phase `began`, no longer holds, if it does not: [`Gateway::until_revoked`]'s
    /// judgement, once.
    pub(crate) fn revocation(
        &self,
        (target, port, carried): (&Target, u16, Protocol),
        http: Option<&HttpRequest>,
        began: Phase,
    ) -> Option<Verdict> {
        let v = self.decide(target, port, carried, http.cloned());
        if !v.is_allowed() {
            return Some(v);
        }
        if http.is_none() && v.inspect {
            return Some(Verdict::refused(
                Reason::InspectionRequired,
                "the host's rules changed: only some requests are granted now, and this connection cannot be inspected",
            ));
        }
        // A read-only workload is judged request by request: nothing an install hook
        // opened (a WebSocket, a body still streaming) carries on into its runtime.
        if self.cfg().read_only
            && began == Phase::Install
            && self.cfg().phase.get() == Phase::Runtime
        {
            return Some(Verdict::refused(
                Reason::HttpNotAllowed,
                "this connection was opened by an install hook, and the sandbox's determinism tier is read-only: the runtime gets none carried over",
            ));
        }
        None
    }

    /// `work` (a body's relay), unless the grant of `request` to `target:port`, decided in
    /// phase `began`, stops holding first: then `work` is dropped unfinished and the new
    /// verdict returned.
    pub(crate) async fn unless_revoked<T>(
        &self,
        (target, port, carried): (&Target, u16, Protocol),
        (request, began): (HttpRequest, Phase),
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, Verdict> {
        tokio::select! {
            biased;
            revoked = self.until_revoked((target, port, carried), Some(request), began) => Err(revoked),
            done = work => Ok(done),
        }
    }

    fn audit(&self, event: AuditEvent) {
        if let Some(a) = &self.cfg().audit {
            a.record(event);
        }
    }

    pub(crate) fn audit_simple(&self, host: &str, port: u16, decision: Decision, reason: Reason) {
        let mut e = AuditEvent::new(self.cfg().sandbox.clone(), host, port, decision, reason);
        e.phase = Some(self.cfg().phase.get());
        self.audit(e);
    }

    pub(crate) fn audit_verdict(
        &self,
        host: &str,
        port: u16,
        verdict: &Verdict,
        http: Option<(&str, &str)>,
        bytes: (u64, u64),
    ) {
        let mut e = AuditEvent::new(
            self.cfg().sandbox.clone(),
            host,
            port,
            verdict.decision,
            verdict.reason,
        );
        e.phase = Some(self.cfg().phase.get());
        e.rule_id = verdict.rule.as_ref().map(|r| r.id.clone());
        if let Some((m, p)) = http {
            e.method = Some(m.to_owned());
            e.path = Some(p.to_owned());
        }
        e.bytes_up = bytes.0;
        e.bytes_down = bytes.1;
        self.audit(e);
    }

    /// Serves a plain client connection: absolute-form requests until one is a CONNECT.
    async fn serve_plain(&self, stream: &mut TcpStream) -> Served {
        let mut buf = Vec::with_capacity(8 * 1024);
        let mut upstream: Option<Upstream> = None;
        let mut first = true;
        loop {
            let Some(head) = self.next_request(stream, &mut buf, &mut first).await? else {
                return Ok(());
            };
            if head.method == "CONNECT" {
                let h1::Target::Authority { host, port } = &head.target else {
                    return Ok(());
                };
                let leftover = std::mem::take(&mut buf);
                return self.connect(stream, host, *port, leftover).await;
            }
            let (host, port, path) = match &head.target {
                h1::Target::Absolute {
                    scheme,
                    authority,
                    path_and_query,
                } if scheme == "http" => match split_authority(authority, 80) {
                    Some((h, p)) => (h, p, path_and_query.clone()),
                    None => {
                        self.malformed(stream, 400, "the request's authority is not `host[:port]`")
                            .await?;
                        return Ok(());
                    }
                },
                h1::Target::Absolute { scheme, .. } => {
                    let msg = format!(
                        "capgate forwards `http` requests; send `{scheme}` through CONNECT"
                    );
                    self.malformed(stream, 400, &msg).await?;
                    return Ok(());
                }
                _ => {
                    self.malformed(stream, 400, "capgate is a forward proxy: send absolute-form requests (`GET http://host/path`) or CONNECT").await?;
                    return Ok(());
                }
            };
            let keep = self
                .exchange(
                    stream,
                    &mut buf,
                    head,
                    &host,
                    port,
                    &path,
                    (&mut upstream, &mut None),
                    None,
                )
                .await?;
            if !keep {
                return Ok(());
            }
        }
    }

    /// The next request of a kept-alive connection: the first within the head timeout,
    /// later ones within the idle timeout.
    async fn next_request<C: Io>(
        &self,
        client: &mut C,
        buf: &mut Vec<u8>,
        first: &mut bool,
    ) -> std::io::Result<Option<RequestHead>> {
        let limits = &self.cfg().limits;
        let wait = if *first {
            limits.head_timeout
        } else {
            limits.idle_timeout
        };
        *first = false;
        self.read_request(client, buf, wait).await
    }

    /// Reads one request head; `None` on a clean close or idle timeout before any byte.
    async fn read_request<C: Io>(
        &self,
        client: &mut C,
        buf: &mut Vec<u8>,
        wait: Duration,
    ) -> std::io::Result<Option<RequestHead>> {
        let limits = &self.cfg().limits.h1;
        // One deadline for the whole head: a head trickled a byte at a time gets no more
        // time than one sent at once.
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if !buf.is_empty() {
                match h1::parse_request_head(buf, limits) {
                    Ok(Parsed::Complete { head, consumed }) => {
                        buf.drain(..consumed);
                        return Ok(Some(head));
                    }
                    Ok(Parsed::Partial) => {}
                    Err(e) => {
                        let reason = if e.status() == 431 || e.status() == 414 {
                            Reason::LimitExceeded
                        } else {
                            Reason::MalformedRequest
                        };
                        let body = format!(
                            "capgate refused a malformed request: {e}\nreason: {}\n",
                            reason.code()
                        );
                        self.audit_simple("(malformed request)", 0, Decision::Deny, reason);
                        self.send(client, &respond::plain(e.status(), reason, &body, true))
                            .await?;
                        return Ok(None);
                    }
                }
            }
            let read = tokio::time::timeout_at(deadline, read_more(client, buf)).await;
            match read {
                Ok(Ok(0)) if buf.is_empty() => return Ok(None),
                Ok(Ok(0)) => return Ok(None),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) if buf.is_empty() => return Ok(None),
                Err(_) => {
                    let body = "capgate closed the connection: the request head did not arrive in time\nreason: limit_exceeded\n";
                    self.audit_simple("(slow request)", 0, Decision::Deny, Reason::LimitExceeded);
                    self.send(
                        client,
                        &respond::plain(408, Reason::LimitExceeded, body, true),
                    )
                    .await?;
                    return Ok(None);
                }
            }
        }
    }

    async fn malformed<C: Io>(&self, client: &mut C, status: u16, message: &str) -> Served {
        let body = format!("{message}\nreason: malformed_request\n");
        self.audit_simple(
            "(malformed request)",
            0,
            Decision::Deny,
            Reason::MalformedRequest,
        );
        self.send(
            client,
            &respond::plain(status, Reason::MalformedRequest, &body, true),
        )
        .await?;
        Ok(())
    }

    /// Vets `host:port` with the address guard (off the async workers: resolution blocks).
    async fn vet(&self, host: &str, port: u16) -> Result<SocketAddr, AddrRefusal> {
        let gw = self.clone();
        let h = host.to_owned();
        // The openings the user's rules hold now, in this phase: a rule's opening ends with
        // the rule, and an install-only one opens nothing at runtime.
        let openings = self
            .cfg()
            .policy
            .current()
            .map(|m| m.openings(&self.cfg().sandbox, self.cfg().phase.get()))
            .unwrap_or_default();
        match tokio::task::spawn_blocking(move || {
            gw.cfg()
                .guard
                .vet_with(&h, port, gw.cfg().resolver.as_ref(), &openings)
        })
        .await
        {
            Ok(r) => r,
            Err(_) => Err(AddrRefusal::NoAddress {
                host: host.to_owned(),
            }),
        }
    }

    /// The answer for an address the guard refused (403) or could not resolve (502).
    fn address_refusal(&self, refusal: &AddrRefusal, host: &str, port: u16) -> (Vec<u8>, Verdict) {
        match refusal.reason() {
            Some(reason) => {
                let verdict = Verdict::refused(reason, refusal.message());
                (
                    respond::refusal(
                        &verdict,
                        &self.cfg().sandbox,
                        &format!("{host}:{port}"),
                        true,
                    ),
                    verdict,
                )
            }
            None => {
                let verdict = Verdict::refused(Reason::InvalidTarget, refusal.message());
                let body = format!(
                    "capgate could not reach {host}:{port}: {}\n",
                    refusal.message()
                );
                (
                    respond::plain(502, Reason::InvalidTarget, &body, true),
                    verdict,
                )
            }
        }
    }

    /// `CONNECT host:port`: decide, vet, then tunnel opaquely or intercept.
    async fn connect(
        &self,
        client: &mut TcpStream,
        raw_host: &str,
        port: u16,
        leftover: Vec<u8>,
    ) -> Served {
        let Some(target) = target_of(raw_host) else {
            let verdict = Verdict::refused(
                Reason::InvalidTarget,
                format!("`{raw_host}` is not a host capgate can judge"),
            );
            self.audit_verdict(raw_host, port, &verdict, None, (0, 0));
            self.send(
                client,
                &respond::refusal(
                    &verdict,
                    &self.cfg().sandbox,
                    &format!("CONNECT {raw_host}:{port}"),
                    true,
                ),
            )
            .await?;
            return Ok(());
        };
        let host = target_name(&target);
        // The phase the grant is decided in, read first: a connection decided under
        // install grants is judged as one, however late its relay starts watching.
        let began = self.cfg().phase.get();
        let verdict = self
            .sentinel_in_host(&host)
            .unwrap_or_else(|| self.decide(&target, port, Protocol::Https, None));
        if !verdict.is_allowed() {
            self.audit_verdict(&host, port, &verdict, None, (0, 0));
            self.send(
                client,
                &respond::refusal(
                    &verdict,
                    &self.cfg().sandbox,
                    &format!("CONNECT {host}:{port}"),
                    true,
                ),
            )
            .await?;
            return Ok(());
        }
        let phase = self.cfg().phase.get();
        // A sandbox holding credential sentinels has all its TLS inspected, so that a
        // sentinel sent to any host is seen (and refused); without sentinels, hosts granted
        // outright are tunnelled opaquely.
        let broker = &self.cfg().broker;
        // A read-only sandbox's runtime traffic is all inspected, whatever rules are in
        // force: its requests are held to reading one by one.
        let read_only = self.cfg().read_only && phase == Phase::Runtime;
        let intercept = verdict.inspect
            || read_only
            || broker.intercepts((&host, port), phase)
            || broker.has_sentinels();
        if intercept && self.cfg().ca.is_none() {
            let v = Verdict::refused(
                Reason::InspectionRequired,
                format!(
                    "only some requests to `{host}` are granted and this gateway cannot inspect TLS"
                ),
            );
            self.audit_verdict(&host, port, &v, None, (0, 0));
            self.send(
                client,
                &respond::refusal(
                    &v,
                    &self.cfg().sandbox,
                    &format!("CONNECT {host}:{port}"),
                    true,
                ),
            )
            .await?;
            return Ok(());
        }
        let vetted = match self.vet(&host, port).await {
            Ok(a) => a,
            Err(refusal) => {
                let (response, v) = self.address_refusal(&refusal, &host, port);
                self.audit_verdict(&host, port, &v, None, (0, 0));
                self.send(client, &response).await?;
                return Ok(());
            }
        };
        self.send(client, b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        if intercept {
            self.intercept(client, (&target, &host), port, vetted, leftover)
                .await
        } else {
            self.tunnel(
                client,
                (&target, &host),
                port,
                vetted,
                leftover,
                (&verdict, began),
            )
            .await
        }
    }

    /// An opaque tunnel: only after the TLS server name (if TLS) names the CONNECT host.
    async fn tunnel(
        &self,
        client: &mut TcpStream,
        (target, host): (&Target, &str),
        port: u16,
        vetted: SocketAddr,
        mut peeked: Vec<u8>,
        (verdict, began): (&Verdict, Phase),
    ) -> Served {
        // The client speaks first (a CONNECT tunnel carries TLS or another client-first
        // protocol; server-first protocols go through SOCKS5). Its first bytes are read
        // until they are known not to be TLS, or hold a whole ClientHello whose server
        // name is checked. A hello cut short (end of stream or timeout) is refused, never
        // forwarded unchecked: its rest would otherwise pass the check.
        let deadline = tokio::time::Instant::now() + self.cfg().limits.head_timeout;
        // The CONNECT was granted as TLS; a tunnel that turns out not to be needs a grant
        // of its own (a `tcp` rule, not an `https` one).
        let mut carried = Protocol::Https;
        let mut plain_verdict = None;
        loop {
            match peek_sni(&peeked) {
                Ok(SniPeek::NotTls) => {
                    carried = Protocol::Tcp;
                    let v = self.decide(target, port, carried, None);
                    if v.is_allowed() && v.inspect {
                        // Granted for some HTTP requests only: an opaque stream cannot be
                        // judged request by request.
                        let v = Verdict::refused(
                            Reason::InspectionRequired,
                            format!(
                                "this tunnel to `{host}:{port}` is not TLS, and the host is granted for some HTTP requests only, which an opaque tunnel cannot be judged by"
                            ),
                        );
                        self.audit_verdict(host, port, &v, None, (0, 0));
                        return Ok(());
                    }
                    if !v.is_allowed() {
                        let v = if v.reason == Reason::NoMatchingAllow {
                            Verdict::refused(
                                Reason::NoMatchingAllow,
                                format!(
                                    "`{host}:{port}` is granted for TLS only, and this tunnel's first bytes are not TLS"
                                ),
                            )
                        } else {
                            v
                        };
                        self.audit_verdict(host, port, &v, None, (0, 0));
                        return Ok(());
                    }
                    plain_verdict = Some(v);
                    break;
                }
                Ok(SniPeek::Hello { sni, .. }) => {
                    if !sni_matches_authority(sni.as_deref(), host) {
                        let v = Verdict::refused(
                            Reason::InvalidTarget,
                            format!(
                                "the TLS server name `{}` is not the CONNECT host `{host}`",
                                sni.as_deref().unwrap_or("(none)")
                            ),
                        );
                        self.audit_verdict(host, port, &v, None, (0, 0));
                        return Ok(());
                    }
                    break;
                }
                Ok(SniPeek::NeedMore) if peeked.len() < MAX_PEEK_LEN => {
                    match tokio::time::timeout_at(deadline, read_more(client, &mut peeked)).await {
                        Ok(Ok(0)) | Err(_) if peeked.is_empty() => return Ok(()),
                        Ok(Ok(0)) | Err(_) => {
                            let v = Verdict::refused(
                                Reason::MalformedRequest,
                                "the tunnel's TLS ClientHello stopped before it was complete",
                            );
                            self.audit_verdict(host, port, &v, None, (0, 0));
                            return Ok(());
                        }
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return Err(e),
                    }
                }
                Ok(SniPeek::NeedMore) | Err(_) => {
                    let v = Verdict::refused(
                        Reason::MalformedRequest,
                        "the tunnel's TLS ClientHello is malformed or oversized",
                    );
                    self.audit_verdict(host, port, &v, None, (0, 0));
                    return Ok(());
                }
            }
        }
        let mut up = match timeout(
            self.cfg().limits.upstream_timeout,
            TcpStream::connect(vetted),
        )
        .await
        {
            Ok(Ok(s)) => s,
            _ => {
                let v = Verdict::refused(
                    Reason::InvalidTarget,
                    format!("cannot connect to `{host}:{port}`"),
                );
                self.audit_verdict(host, port, &v, None, (0, 0));
                return Ok(());
            }
        };
        let _ = up.set_nodelay(true);
        // The first bytes may have come after a phase switch or a rule change: judged again
        // before any of them leaves.
        if let Some(revoked) = self.revocation((target, port, carried), None, began) {
            self.audit_verdict(host, port, &revoked, None, (0, 0));
            return Ok(());
        }
        stall::writing(self.cfg().limits.idle_timeout, up.write_all(&peeked)).await?;
        // (No sentinel can be in these bytes: a sandbox with sentinels has every tunnel
        // intercepted, and one that is not TLS refused.)
        let relay = tokio::io::copy_bidirectional_with_sizes(client, &mut up, 64 * 1024, 64 * 1024);
        let verdict = plain_verdict.as_ref().unwrap_or(verdict);
        // The revocation first: its first judgement comes before the relay moves a byte.
        tokio::select! {
            biased;
            revoked = self.until_revoked((target, port, carried), None, began) => {
                self.audit_verdict(host, port, &revoked, None, (peeked.len() as u64, 0));
            }
            relayed = relay => {
                let (a, b) = relayed.unwrap_or((0, 0));
                self.audit_verdict(host, port, verdict, None, (a + peeked.len() as u64, b));
            }
        }
        Ok(())
    }

    /// TLS interception: a leaf minted for the CONNECT host, then each request judged.
    async fn intercept(
        &self,
        client: &mut TcpStream,
        (target, host): (&Target, &str),
        port: u16,
        vetted: SocketAddr,
        leftover: Vec<u8>,
    ) -> Served {
        let Some(ca) = &self.cfg().ca else {
            return Ok(());
        };
        let io = Rewind::new(leftover, client);
        let acceptor =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
        let start = match timeout(self.cfg().limits.head_timeout, acceptor).await {
            Ok(Ok(s)) => s,
            // Bytes that are not a TLS handshake, to a host whose traffic must be read:
            // nothing of them is forwarded.
            Ok(Err(e)) if e.kind() != std::io::ErrorKind::UnexpectedEof => {
                let v = Verdict::refused(
                    Reason::InspectionRequired,
                    format!(
                        "this tunnel to `{host}:{port}` must be inspected, and its first bytes are not a TLS handshake capgate can read"
                    ),
                );
                self.audit_verdict(host, port, &v, None, (0, 0));
                return Ok(());
            }
            _ => return Ok(()),
        };
        let sni = start.client_hello().server_name().map(str::to_owned);
        if let Some(name) = &sni
            && !sni_matches_authority(Some(name), host)
        {
            let v = Verdict::refused(
                Reason::InvalidTarget,
                format!("the TLS server name `{name}` is not the CONNECT host `{host}`"),
            );
            self.audit_verdict(host, port, &v, None, (0, 0));
            return Ok(());
        }
        let config = match ca.server_config_for(host) {
            Ok(c) => c,
            Err(_) => {
                let v = Verdict::refused(
                    Reason::InternalError,
                    format!("cannot mint a certificate for `{host}`"),
                );
                self.audit_verdict(host, port, &v, None, (0, 0));
                return Ok(());
            }
        };
        // HTTP/2 where it is clean: the client offered it and the upstream chose it. The
        // upstream is then dialled before the client's handshake ends, to learn its choice;
        // an HTTP/1.1 connection made that way serves the first request. A failed dial is
        // kept for the first request: judged as usual and, if allowed, answered with that
        // failure (never a second dial, which would make the client wait twice).
        let offers_h2 = start
            .client_hello()
            .alpn()
            .is_some_and(|mut offered| offered.any(|p| p == b"h2"));
        let mut h2_upstream = None;
        let mut early = None;
        let mut failed_dial = None;
        if offers_h2 {
            let config = Arc::clone(&self.inner.upstream_tls_h2);
            match self.dial_tls(host, vetted, config).await {
                Ok(up) if up.get_ref().1.alpn_protocol() == Some(b"h2") => {
                    let wait = self.cfg().limits.upstream_timeout;
                    h2_upstream = crate::http2::connect_upstream(up, wait).await.ok();
                }
                Ok(up) => early = Some(up),
                Err(message) => failed_dial = Some(message),
            }
        }
        let config = if h2_upstream.is_some() {
            let mut h2 = (*config).clone();
            h2.alpn_protocols = vec![b"h2".to_vec()];
            Arc::new(h2)
        } else {
            config
        };
        let mut tls = match timeout(self.cfg().limits.head_timeout, start.into_stream(config)).await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                // A client that says why it ends the handshake is told of: one that does not
                // trust capgate's CA otherwise fails with nothing in the log to explain it.
                if let Some(alert) = certificate_refusal(&e) {
                    let v = Verdict::refused(
                        Reason::CaNotTrusted,
                        format!(
                            "the client ended the TLS handshake on capgate's certificate for `{host}` (alert {alert}): most likely it does not trust capgate's CA"
                        ),
                    );
                    self.audit_verdict(host, port, &v, None, (0, 0));
                }
                return Ok(());
            }
            Err(_) => return Ok(()),
        };
        if let Some(sender) = h2_upstream {
            crate::http2::serve(self, tls, (target, host), port, sender).await;
            return Ok(());
        }
        let mut buf = Vec::with_capacity(8 * 1024);
        let mut upstream: Option<Upstream> = early.map(|up| Upstream {
            key: (host.to_owned(), port, true),
            stream: Box::new(up),
            buf: Vec::with_capacity(4 * 1024),
            pipe: None,
        });
        let mut first = true;
        loop {
            let Some(head) = self.next_request(&mut tls, &mut buf, &mut first).await? else {
                break;
            };
            let path = match &head.target {
                h1::Target::Origin(p) => p.clone(),
                h1::Target::Absolute {
                    authority,
                    path_and_query,
                    ..
                } if split_authority(authority, port)
                    .is_some_and(|(h, p)| p == port && target_of(&h).as_ref() == Some(target)) =>
                {
                    path_and_query.clone()
                }
                _ => {
                    self.malformed(
                        &mut tls,
                        400,
                        "inside a tunnel, requests go to the CONNECT host in origin form",
                    )
                    .await?;
                    break;
                }
            };
            let keep = self
                .exchange(
                    &mut tls,
                    &mut buf,
                    head,
                    host,
                    port,
                    &path,
                    (&mut upstream, &mut failed_dial),
                    Some(vetted),
                )
                .await?;
            // The early failure answers the first request only: one refused by the policy
            // leaves it unused, and a later request dials afresh.
            failed_dial = None;
            if !keep {
                break;
            }
        }
        // Bounded: rustls may still hold records a client that stopped reading never takes.
        let _ = stall::writing(self.cfg().limits.idle_timeout, tls.shutdown()).await;
        Ok(())
    }

    /// One request/response exchange. `tls_to` is the vetted address of an intercepted
    /// host (the upstream leg is TLS); `None` for plain absolute-form forwarding. The
    /// upstream is the connection's open one, if any, and the failure of a dial already
    /// made for it (answered instead of dialling). Returns whether the client connection
    /// may carry another request.
    #[expect(
        clippy::too_many_arguments,
        reason = "one exchange needs its connection state"
    )]
    async fn exchange<C: Io>(
        &self,
        client: &mut C,
        buf: &mut Vec<u8>,
        mut head: RequestHead,
        raw_host: &str,
        port: u16,
        path_and_query: &str,
        (upstream, failed_dial): (&mut Option<Upstream>, &mut Option<String>),
        tls_to: Option<SocketAddr>,
    ) -> std::io::Result<bool> {
        let path = path_and_query.split('?').next().unwrap_or("/").to_owned();
        let Some(target) = target_of(raw_host) else {
            self.malformed(
                client,
                400,
                "the request's host is not a name capgate can judge",
            )
            .await?;
            return Ok(false);
        };
        let host = target_name(&target);
        let what = format!("{} {host}{path}", head.method);
        let tls_upstream = tls_to.is_some();
        let carried = carried_http(tls_upstream);
        // Read before the judgement: see `until_revoked`.
        let began = self.cfg().phase.get();
        let (mut verdict, mask) = self.judge(
            &target,
            &host,
            port,
            (&head.method, &path),
            path_and_query,
            &mut head.headers,
            tls_upstream,
        );
        // What the rules let through, a read-only tier may still hold back.
        if verdict.is_allowed()
            && let Some(refused) = self.read_only_refusal(
                &head.method,
                // `Content-Length: 0` is no body (Python's requests sends it on OPTIONS).
                !matches!(head.framing, Framing::None | Framing::Length(0)),
                h1::is_websocket_upgrade(&head),
            )
        {
            verdict = refused;
        }
        if !verdict.is_allowed() {
            // A request that tried to carry a sentinel away ends its connection; after any
            // other refusal the connection goes on when no body is left unread.
            let close =
                head.framing != Framing::None || verdict.reason == Reason::CredentialExfiltration;
            self.audit_verdict(&host, port, &verdict, Some((&head.method, &path)), (0, 0));
            self.send(
                client,
                &respond::refusal(&verdict, &self.cfg().sandbox, &what, close),
            )
            .await?;
            return Ok(!close && head.keep_alive);
        }
        // The upstream: reused while the host stays the same.
        let key = (host.clone(), port, tls_upstream);
        if upstream.as_ref().is_none_or(|u| u.key != key) {
            *upstream = None;
            let addr = match tls_to {
                Some(a) => a,
                None => match self.vet(&host, port).await {
                    Ok(a) => a,
                    Err(refusal) => {
                        let (response, v) = self.address_refusal(&refusal, &host, port);
                        self.audit_verdict(&host, port, &v, Some((&head.method, &path)), (0, 0));
                        self.send(client, &response).await?;
                        return Ok(false);
                    }
                },
            };
            let dialled = match failed_dial.take() {
                Some(message) => Err(message),
                None => self.dial(&host, addr, tls_upstream).await,
            };
            match dialled {
                Ok(stream) => {
                    *upstream = Some(Upstream {
                        key,
                        stream,
                        // Small: what the response head's read takes beyond the head is
                        // copied through user space even when the rest is spliced.
                        buf: Vec::with_capacity(4 * 1024),
                        pipe: None,
                    })
                }
                Err(message) => {
                    let body = format!("capgate could not reach {host}:{port}: {message}\n");
                    self.audit_verdict(
                        &host,
                        port,
                        &Verdict::refused(Reason::InvalidTarget, message),
                        Some((&head.method, &path)),
                        (0, 0),
                    );
                    self.send(
                        client,
                        &respond::plain(502, Reason::InvalidTarget, &body, true),
                    )
                    .await?;
                    return Ok(false);
                }
            }
        }
        let Some(up) = upstream.as_mut() else {
            return Ok(false);
        };

        // The request, re-serialized.
        let websocket = h1::is_websocket_upgrade(&head);
        h1::strip_hop_by_hop(&mut head.headers);
        head.headers
            .retain(|h| !h.is("host") && !h.name.to_ascii_lowercase().starts_with("proxy-"));
        let authority = authority_of(raw_host, port, if tls_upstream { 443 } else { 80 });
        let mut headers = Vec::with_capacity(head.headers.len() + 2);
        headers.push(Header::new("Host", authority.into_bytes()));
        headers.append(&mut head.headers);
        if head.framing == Framing::Chunked {
            headers.push(Header::new("Transfer-Encoding", b"chunked".to_vec()));
        }
        if websocket {
            headers.push(Header::new("Connection", b"Upgrade".to_vec()));
            headers.push(Header::new("Upgrade", b"websocket".to_vec()));
        }
        let mut out = Vec::with_capacity(1024);
        if h1::write_request_head(&head.method, path_and_query, &headers, &mut out).is_err() {
            self.malformed(client, 400, "the request cannot be forwarded as written")
                .await?;
            return Ok(false);
        }
        let idle = self.cfg().limits.idle_timeout;
        let relay = async {
            stall::writing(idle, up.stream.write_all(&out)).await?;
            relay_body(
                head.framing,
                client,
                buf,
                &mut up.stream,
                (&self.cfg().limits.h1, idle),
                None,
            )
            .await
        };
        // A body keeps the request open for as long as the client sends it, so, like a
        // tunnel, it is cut when the grant that let it start stops holding (a phase switch,
        // a rule change): an upload begun by an install hook does not go on under runtime.
        let sent = if head.framing == Framing::None {
            relay.await
        } else {
            match self
                .unless_revoked(
                    (&target, port, carried),
                    (http_request(&head.method, &path), began),
                    relay,
                )
                .await
            {
                Ok(sent) => sent,
                Err(revoked) => {
                    *upstream = None;
                    self.audit_verdict(
                        &host,
                        port,
                        &revoked,
                        Some((&head.method, &path)),
                        (out.len() as u64, 0),
                    );
                    let _ = self
                        .send(
                            client,
                            &respond::refusal(&revoked, &self.cfg().sandbox, &what, true),
                        )
                        .await;
                    return Ok(false);
                }
            }
        };
        let bytes_up = match sent {
            Ok(n) => n + out.len() as u64,
            Err(e) => {
                *upstream = None;
                let (status, reason, body) = match Stall::of(&e) {
                    Some(Stall::Source) => (
                        408,
                        Reason::LimitExceeded,
                        format!(
                            "capgate closed the connection: the request body stopped arriving for {} s\nreason: limit_exceeded\n",
                            idle.as_secs()
                        ),
                    ),
                    Some(Stall::Sink) => (
                        504,
                        Reason::LimitExceeded,
                        format!(
                            "capgate closed the connection: {host}:{port} took none of the request body for {} s\nreason: limit_exceeded\n",
                            idle.as_secs()
                        ),
                    ),
                    // Only the client's body can be malformed or end early (the decoder
                    // and the reads are on its side).
                    None if matches!(
                        e.kind(),
                        std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
                    ) =>
                    {
                        (
                            400,
                            Reason::MalformedRequest,
                            format!(
                                "capgate refused the request: its body is malformed or ended early ({e})\nreason: malformed_request\n"
                            ),
                        )
                    }
                    None => (
                        502,
                        Reason::InvalidTarget,
                        format!(
                            "capgate lost the connection to {host}:{port} while sending the request\n"
                        ),
                    ),
                };
                let v = Verdict::refused(reason, e.to_string());
                self.audit_verdict(
                    &host,
                    port,
                    &v,
                    Some((&head.method, &path)),
                    (out.len() as u64, 0),
                );
                let _ = self
                    .send(client, &respond::plain(status, reason, &body, true))
                    .await;
                return Ok(false);
            }
        };

        // The response (after any 1xx), re-serialized.
        let response = loop {
            match self.read_response(up, &head.method).await {
                Ok(r) if (100..200).contains(&r.status) && r.status != 101 => {
                    let mut interim = Vec::new();
                    let mut reason = r.reason.clone();
                    if let Some(mask) = &mask {
                        mask_head(mask, &mut reason, &mut Vec::new());
                    }
                    let _ = h1::write_response_head(r.status, &reason, &[], &mut interim);
                    self.send(client, &interim).await?;
                }
                Ok(r) => break r,
                Err(message) => {
                    *upstream = None;
                    // The parser's message may quote the answer (a header's name).
                    let message = match mask.as_deref() {
                        Some(mask) => masked_text(mask, message),
                        None => message,
                    };
                    let v = Verdict::refused(
                        Reason::InvalidTarget,
                        format!("no usable response: {message}"),
                    );
                    self.audit_verdict(&host, port, &v, Some((&head.method, &path)), (bytes_up, 0));
                    let body =
                        format!("capgate got no usable response from {host}:{port}: {message}\n");
                    self.send(
                        client,
                        &respond::plain(502, Reason::InvalidTarget, &body, true),
                    )
                    .await?;
                    return Ok(false);
                }
            }
        };
        if response.status == 101 {
            return self
                .switch_to_websocket(
                    client,
                    buf,
                    upstream,
                    (&response, mask.as_deref()),
                    websocket,
                    (&target, &host, port, &path, carried, began),
                )
                .await
                .map(|switched| {
                    let (v, bytes) = match switched {
                        // The relay failed after the upgrade: recorded as allowed, as it was.
                        Switched::Failed => (verdict, (bytes_up, 0)),
                        Switched::Relayed((up, down)) => (verdict, (bytes_up + up, down)),
                        Switched::Revoked(v, (up, down)) => (v, (bytes_up + up, down)),
                        Switched::Refused(why) => {
                            (Verdict::refused(Reason::InvalidTarget, why), (bytes_up, 0))
                        }
                    };
                    self.audit_verdict(&host, port, &v, Some((&head.method, &path)), bytes);
                    false
                });
        }
        // A body masking cannot read is not relayed unread.
        if let Some(mask) = mask.as_deref()
            && !matches!(response.framing, Framing::None | Framing::Length(0))
            && let Some(message) = crate::mask::unreadable(
                mask,
                response
                    .headers
                    .iter()
                    .map(|h| (h.name.as_str(), h.value.as_slice())),
            )
        {
            *upstream = None;
            let v = Verdict::refused(Reason::InvalidTarget, message.clone());
            self.audit_verdict(&host, port, &v, Some((&head.method, &path)), (bytes_up, 0));
            let body = format!("capgate refused the answer of {host}:{port}: {message}\n");
            self.send(
                client,
                &respond::plain(502, Reason::InvalidTarget, &body, true),
            )
            .await?;
            return Ok(false);
        }
        let mut resp_headers = response.headers.clone();
        let mut reason = response.reason.clone();
        if let Some(mask) = &mask {
            mask_head(mask, &mut reason, &mut resp_headers);
        }
        h1::strip_hop_by_hop(&mut resp_headers);
        let client_keep = head.keep_alive && response.framing != Framing::CloseDelimited;
        if response.framing == Framing::Chunked {
            resp_headers.push(Header::new("Transfer-Encoding", b"chunked".to_vec()));
        }
        if !client_keep {
            resp_headers.push(Header::new("Connection", b"close".to_vec()));
        }
        let mut out = Vec::with_capacity(1024);
        if h1::write_response_head(response.status, &reason, &resp_headers, &mut out).is_err() {
            *upstream = None;
            self.send(client, &respond::unrelayable()).await?;
            return Ok(false);
        }
        // A body already read with the head goes out with it: one write, one packet.
        if let Framing::Length(n) = response.framing {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n <= up.buf.len() && n <= 64 * 1024 {
                let body_at = out.len();
                out.extend_from_slice(&up.buf[..n]);
                up.buf.drain(..n);
                if let Some(mask) = &mask {
                    mask.apply(&mut out[body_at..]);
                }
                if !response.keep_alive {
                    *upstream = None;
                }
                self.audit_verdict(
                    &host,
                    port,
                    &verdict,
                    Some((&head.method, &path)),
                    (bytes_up, out.len() as u64),
                );
                self.send(client, &out).await?;
                return Ok(client_keep);
            }
        }
        let streaming = !matches!(response.framing, Framing::Length(n) if n <= SPLICE_MIN);
        let relay = async {
            match response.framing {
                // A masked body goes through user space (it has a secret only over TLS,
                // which is never spliced anyway).
                Framing::Length(n) if n > SPLICE_MIN && mask.is_none() => {
                    relay_length(n, &mut out, up, client, &self.cfg().limits.h1, idle).await
                }
                framing => match self.send(client, &out).await {
                    Ok(()) => {
                        relay_body(
                            framing,
                            &mut up.stream,
                            &mut up.buf,
                            client,
                            (&self.cfg().limits.h1, idle),
                            mask.as_deref(),
                        )
                        .await
                    }
                    Err(e) => Err(e),
                },
            }
        };
        // A long or open-ended response (a download, a stream of events) is cut, like the
        // request body above, when its grant stops holding; the head is out, so that is a
        // close.
        let down = if streaming {
            match self
                .unless_revoked(
                    (&target, port, carried),
                    (http_request(&head.method, &path), began),
                    relay,
                )
                .await
            {
                Ok(down) => down,
                Err(revoked) => {
                    *upstream = None;
                    self.audit_verdict(
                        &host,
                        port,
                        &revoked,
                        Some((&head.method, &path)),
                        (bytes_up, 0),
                    );
                    return Ok(false);
                }
            }
        } else {
            relay.await
        };
        let bytes_down = match down {
            Ok(n) => n + out.len() as u64,
            Err(e) => {
                // The head is out: the only answer left is closing. A stall is recorded
                // as the limit it hit; any other failure under the request's verdict.
                *upstream = None;
                let v = match Stall::of(&e) {
                    Some(stall) => Verdict::refused(
                        Reason::LimitExceeded,
                        format!("response body from {host}:{port}: {stall}"),
                    ),
                    None => verdict,
                };
                self.audit_verdict(
                    &host,
                    port,
                    &v,
                    Some((&head.method, &path)),
                    (bytes_up, out.len() as u64),
                );
                return Ok(false);
            }
        };
        if !response.keep_alive {
            *upstream = None;
        }
        self.audit_verdict(
            &host,
            port,
            &verdict,
            Some((&head.method, &path)),
            (bytes_up, bytes_down),
        );
        Ok(client_keep)
    }

    /// After a `101`: when the request asked for WebSocket and the upstream accepted it,
    /// answers the client with the upgrade and relays the connection's bytes both ways
    /// until either side closes (the frames are not HTTP requests: the upgrade request
    /// was judged, and the connection ends with the WebSocket). Any other switch is a 502.
    /// Returns how it ended, with the bytes relayed up and down after the heads.
    async fn switch_to_websocket<C: Io>(
        &self,
        client: &mut C,
        early: &mut Vec<u8>,
        upstream: &mut Option<Upstream>,
        (response, mask): (&ResponseHead, Option<&Mask>),
        asked: bool,
        (target, host, port, path, carried, began): (&Target, &str, u16, &str, Protocol, Phase),
    ) -> std::io::Result<Switched> {
        const NOT_ASKED: &str =
            "the upstream switched protocols without a WebSocket upgrade asked and accepted";
        let Some(mut up) = upstream.take() else {
            return Ok(Switched::Refused(NOT_ASKED));
        };
        // With a mask, frames must be plain RFC 6455 to be read: the extension offer was
        // withheld, and an upstream that names one anyway is not followed.
        let extension = mask.is_some()
            && response
                .headers
                .iter()
                .any(|h| h.is("sec-websocket-extensions"));
        if !asked || !h1::is_websocket_accept(response) || extension {
            let why = if extension {
                "the upstream answered the WebSocket upgrade with an extension capgate did not offer (where a secret is injected, frames must be plain to be masked)"
            } else {
                NOT_ASKED
            };
            let body = format!("capgate refused {host}:{port}'s answer: {why}\n");
            self.send(
                client,
                &respond::plain(502, Reason::InvalidTarget, &body, true),
            )
            .await
            .ok();
            return Ok(Switched::Refused(why));
        }
        let mut headers = response.headers.clone();
        let mut reason = response.reason.clone();
        if let Some(mask) = mask {
            mask_head(mask, &mut reason, &mut headers);
        }
        h1::strip_hop_by_hop(&mut headers);
        headers.push(Header::new("Connection", b"Upgrade".to_vec()));
        headers.push(Header::new("Upgrade", b"websocket".to_vec()));
        let mut out = Vec::with_capacity(512 + up.buf.len());
        if h1::write_response_head(101, &reason, &headers, &mut out).is_err() {
            self.send(client, &respond::unrelayable()).await.ok();
            return Ok(Switched::Refused(
                "the upstream's 101 cannot be relayed as written",
            ));
        }
        // Bytes that came with the heads go first, each to the other side.
        let down_early = up.buf.len() as u64;
        let mut masking = mask.map(WsMasker::new);
        match &mut masking {
            Some(ws) => {
                if ws.feed(&up.buf, &mut out).is_err() {
                    self.send(client, &respond::unrelayable()).await.ok();
                    return Ok(Switched::Refused(
                        "the upstream's first WebSocket frames are not plain RFC 6455",
                    ));
                }
                up.buf.clear();
            }
            None => out.append(&mut up.buf),
        }
        let up_early = early.len() as u64;
        let idle = self.cfg().limits.idle_timeout;
        if self.send(client, &out).await.is_err()
            || stall::writing(idle, up.stream.write_all(early))
                .await
                .is_err()
        {
            return Ok(Switched::Failed);
        }
        early.clear();
        let relay = async {
            match masking {
                Some(ws) => relay_masked(client, &mut up.stream, ws).await,
                None => tokio::io::copy_bidirectional(client, &mut up.stream).await,
            }
        };
        let request = HttpRequest {
            method: Method::Get,
            path: path.to_owned(),
        };
        Ok(tokio::select! {
            biased;
            revoked = self.until_revoked((target, port, carried), Some(request), began) => {
                Switched::Revoked(revoked, (up_early, down_early))
            }
            relayed = relay => {
                let (a, b) = relayed.unwrap_or((0, 0));
                Switched::Relayed((up_early + a, down_early + b))
            }
        })
    }

    async fn read_response(&self, up: &mut Upstream, method: &str) -> Result<ResponseHead, String> {
        let limits = &self.cfg().limits.h1;
        loop {
            if !up.buf.is_empty() {
                match h1::parse_response_head(&up.buf, limits, method) {
                    Ok(Parsed::Complete { head, consumed }) => {
                        up.buf.drain(..consumed);
                        return Ok(head);
                    }
                    Ok(Parsed::Partial) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
            match timeout(
                self.cfg().limits.upstream_timeout,
                read_more(&mut up.stream, &mut up.buf),
            )
            .await
            {
                Ok(Ok(0)) => return Err("the upstream closed the connection".to_owned()),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => return Err("the upstream did not answer in time".to_owned()),
            }
        }
    }

    /// Connects to the vetted address (never the name again), over TLS when asked.
    async fn dial(&self, host: &str, addr: SocketAddr, tls: bool) -> Result<Box<dyn Io>, String> {
        if tls {
            let config = Arc::clone(&self.cfg().upstream_tls);
            return Ok(Box::new(self.dial_tls(host, addr, config).await?));
        }
        Ok(Box::new(self.dial_tcp(addr).await?))
    }

    async fn dial_tcp(&self, addr: SocketAddr) -> Result<TcpStream, String> {
        let tcp = match timeout(self.cfg().limits.upstream_timeout, TcpStream::connect(addr)).await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("connecting timed out".to_owned()),
        };
        let _ = tcp.set_nodelay(true);
        Ok(tcp)
    }

    /// TLS to the vetted address, the certificate verified for `host`.
    async fn dial_tls(
        &self,
        host: &str,
        addr: SocketAddr,
        config: Arc<rustls::ClientConfig>,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
        let tcp = self.dial_tcp(addr).await?;
        let name = ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
        let connector = tokio_rustls::TlsConnector::from(config);
        match timeout(
            self.cfg().limits.upstream_timeout,
            connector.connect(name, tcp),
        )
        .await
        {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(format!("TLS with the upstream failed: {e}")),
            Err(_) => Err("the TLS handshake timed out".to_owned()),
        }
    }
}

/// How a `101` ended.
enum Switched {
    /// Not a WebSocket upgrade asked and accepted, or not one capgate can relay: answered
    /// 502, for this reason.
    Refused(&'static str),
    /// Accepted, but a write of the heads or the early bytes failed.
    Failed,
    /// Relayed until a side closed; the bytes up and down.
    Relayed((u64, u64)),
    /// Cut when the grant stopped holding (phase switch or rule change): the new verdict.
    Revoked(Verdict, (u64, u64)),
}

/// The upstream connection of a client connection, kept while requests go to one host.
struct Upstream {
    key: (String, u16, bool),
    stream: Box<dyn Io>,
    buf: Vec<u8>,
    /// The pipe large bodies are spliced through, made by the first one.
    pipe: Option<crate::splice::Pipe>,
}

/// Bodies above this size between two plain TCP sockets are spliced; below it the
/// pipe's set-up costs more than the copy it saves.
const SPLICE_MIN: u64 = 64 * 1024;

/// Sends the response head `head` and relays a body of exactly `n` bytes from the upstream
/// to the client: through the upstream's pipe when both ends are plain TCP sockets (the
/// bytes read with the upstream's head leave with the response head), through user space
/// otherwise. Returns the body bytes relayed.
async fn relay_length<C: Io>(
    n: u64,
    head: &mut Vec<u8>,
    up: &mut Upstream,
    client: &mut C,
    limits: &h1::Limits,
    idle: Duration,
) -> std::io::Result<u64> {
    let (Some(src), Some(dst)) = (up.stream.plain_tcp(), client.plain_tcp()) else {
        stall::writing(idle, client.write_all(head)).await?;
        return relay_body(
            Framing::Length(n),
            &mut up.stream,
            &mut up.buf,
            client,
            (limits, idle),
            None,
        )
        .await;
    };
    let take = usize::try_from(n).unwrap_or(usize::MAX).min(up.buf.len());
    head.extend(up.buf.drain(..take));
    let pipe = match &mut up.pipe {
        Some(pipe) => pipe,
        empty => empty.insert(crate::splice::Pipe::new()?),
    };
    pipe.tcp_to_tcp(src, dst, head, n - take as u64, idle)
        .await?;
    head.truncate(head.len() - take);
    Ok(n)
}

/// Reads more bytes into `buf`, growing it.
async fn read_more<R: AsyncRead + Unpin + ?Sized>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(16 * 1024);
    }
    r.read_buf(buf).await
}

/// Copies a message body from `src` (whose already-read bytes are in `pending`) to `dst`,
/// re-chunking chunked bodies, through `mask` when it has one (a response to a request
/// that carried a secret). Returns the payload bytes relayed. A read or a write that
/// makes no progress for `idle` fails with a [`Stall`] naming the side that stalled.
async fn relay_body<R, W>(
    framing: Framing,
    src: &mut R,
    pending: &mut Vec<u8>,
    dst: &mut W,
    (limits, idle): (&h1::Limits, Duration),
    mask: Option<&Mask>,
) -> std::io::Result<u64>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let mut out = BodyOut::new(mask, framing == Framing::Chunked);
    match framing {
        Framing::None => Ok(0),
        Framing::Length(n) => {
            let mut left = n;
            let take = usize::try_from(left)
                .unwrap_or(usize::MAX)
                .min(pending.len());
            if take > 0 {
                out.write(&pending[..take], dst, idle).await?;
                pending.drain(..take);
                left -= take as u64;
            }
            // Only a body larger than what was read with the head needs a buffer.
            let mut chunk = if left > 0 {
                vec![0u8; 256 * 1024]
            } else {
                Vec::new()
            };
            while left > 0 {
                let want = usize::try_from(left).unwrap_or(usize::MAX).min(chunk.len());
                let got = out.read(dst, idle, src.read(&mut chunk[..want])).await?;
                if got == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "body ended early",
                    ));
                }
                out.write(&chunk[..got], dst, idle).await?;
                left -= got as u64;
            }
            out.finish(dst, idle).await?;
            Ok(n)
        }
        Framing::Chunked => {
            let mut decoder = h1::ChunkedDecoder::new(limits);
            let mut payload = Vec::with_capacity(16 * 1024);
            let mut total = 0u64;
            loop {
                payload.clear();
                let (consumed, finished) = decoder.decode(pending, &mut payload).map_err(|e| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
                })?;
                pending.drain(..consumed);
                if !payload.is_empty() {
                    out.write(&payload, dst, idle).await?;
                    total += payload.len() as u64;
                }
                if finished {
                    out.finish(dst, idle).await?;
                    return Ok(total);
                }
                if consumed == 0 && out.read(dst, idle, read_more(src, pending)).await? == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "chunked body ended early",
                    ));
                }
            }
        }
        Framing::CloseDelimited => {
            let mut total = pending.len() as u64;
            out.write(pending, dst, idle).await?;
            pending.clear();
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let got = out.read(dst, idle, src.read(&mut chunk)).await?;
                if got == 0 {
                    out.finish(dst, idle).await?;
                    return Ok(total);
                }
                out.write(&chunk[..got], dst, idle).await?;
                total += got as u64;
            }
        }
    }
}

/// Where a relayed body's bytes go: to the receiver as they are, or as chunks when the
/// body is re-chunked, and through the body's mask when it has one (a response to a
/// request that carried a secret).
struct BodyOut<'a> {
    masking: Option<(MaskStream<'a>, Vec<u8>)>,
    chunked: bool,
    encoded: Vec<u8>,
}

impl<'a> BodyOut<'a> {
    fn new(mask: Option<&'a Mask>, chunked: bool) -> Self {
        BodyOut {
            masking: mask.map(|m| (m.stream(), Vec::new())),
            chunked,
            encoded: Vec::new(),
        }
    }

    /// Writes `bytes` of the body; the mask may hold back an end that could begin a secret.
    async fn write<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        bytes: &[u8],
        dst: &mut W,
        idle: Duration,
    ) -> std::io::Result<()> {
        let out = match &mut self.masking {
            Some((stream, masked)) => {
                stream.feed(bytes, masked);
                masked.as_slice()
            }
            None => bytes,
        };
        emit(out, self.chunked, &mut self.encoded, dst, idle).await
    }

    /// Awaits `read` (bounded by `idle`, as [`stall::reading`]); while the mask holds
    /// bytes it may let go, a quiet spell of [`RELEASE_AFTER`] writes them first.
    async fn read<T, W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        dst: &mut W,
        idle: Duration,
        read: impl Future<Output = std::io::Result<T>>,
    ) -> std::io::Result<T> {
        let read = stall::reading(idle, read);
        tokio::pin!(read);
        if let Some((stream, _)) = &mut self.masking
            && stream.releasable()
        {
            tokio::select! {
                biased;
                got = &mut read => return got,
                () = tokio::time::sleep(RELEASE_AFTER) => {}
            }
            let released = stream.release();
            emit(&released, self.chunked, &mut self.encoded, dst, idle).await?;
        }
        read.await
    }

    /// The body has ended: writes what the mask held back, and the last chunk.
    async fn finish<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        dst: &mut W,
        idle: Duration,
    ) -> std::io::Result<()> {
        if let Some((stream, _)) = &mut self.masking {
            let rest = stream.finish();
            emit(&rest, self.chunked, &mut self.encoded, dst, idle).await?;
        }
        if self.chunked {
            self.encoded.clear();
            h1::write_last_chunk(&mut self.encoded);
            stall::writing(idle, dst.write_all(&self.encoded)).await?;
        }
        Ok(())
    }
}

/// Writes `bytes` of a body to `dst`, as one chunk when `chunked` (nothing when empty: an
/// empty chunk would end the body).
async fn emit<W: AsyncWrite + Unpin + ?Sized>(
    bytes: &[u8],
    chunked: bool,
    encoded: &mut Vec<u8>,
    dst: &mut W,
    idle: Duration,
) -> std::io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    if chunked {
        encoded.clear();
        h1::write_chunk(bytes, encoded);
        return stall::writing(idle, dst.write_all(encoded)).await;
    }
    stall::writing(idle, dst.write_all(bytes)).await
}

/// Relays a WebSocket's bytes both ways until each side has closed its sending half, as
/// `copy_bidirectional` does, the upstream's frames through `ws` (its upgrade request
/// carried a secret). Returns the bytes up and down.
async fn relay_masked<C, U>(
    client: &mut C,
    upstream: &mut U,
    mut ws: WsMasker<'_>,
) -> std::io::Result<(u64, u64)>
where
    C: AsyncRead + AsyncWrite + Unpin + ?Sized,
    U: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let (mut client_in, mut client_out) = tokio::io::split(client);
    let (mut up_in, mut up_out) = tokio::io::split(upstream);
    let up = async {
        let n = tokio::io::copy(&mut client_in, &mut up_out).await?;
        up_out.shutdown().await?;
        Ok::<_, std::io::Error>(n)
    };
    let down = async {
        let (mut buf, mut masked, mut total) = (vec![0u8; 16 * 1024], Vec::new(), 0u64);
        loop {
            let n = up_in.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            masked.clear();
            // The frames read whole before one that cannot be read still leave.
            let fed = ws.feed(&buf[..n], &mut masked);
            client_out.write_all(&masked).await?;
            client_out.flush().await?;
            fed.map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("the upstream sent {e}"),
                )
            })?;
            total += n as u64;
        }
        // A frame cut off by the upstream's close stays unsent: it could not be whole.
        client_out.shutdown().await?;
        Ok(total)
    };
    tokio::try_join!(up, down)
}

/// Masks the secrets of `mask` in a response head: the reason phrase and header values
/// are overwritten in place; a header whose name holds one is dropped (the marker is no
/// token).
pub(crate) fn mask_head(mask: &Mask, reason: &mut String, headers: &mut Vec<Header>) {
    let mut bytes = std::mem::take(reason).into_bytes();
    mask.apply(&mut bytes);
    // The marker is ASCII and overwrites whole secrets, so the text stays UTF-8; were it
    // not, the reason (a courtesy) is dropped rather than risked.
    *reason = String::from_utf8(bytes).unwrap_or_default();
    headers.retain(|h| !mask.finds(h.name.as_bytes()));
    // The framing headers are numbers capgate checked, no reflection; a numeric secret
    // equal to one would otherwise break the framing.
    for h in headers
        .iter_mut()
        .filter(|h| !h.is("content-length") && !h.is("transfer-encoding"))
    {
        mask.apply(&mut h.value);
    }
}

/// The alert with which a client refused the certificate capgate made, if that is why the
/// TLS handshake failed (`unknown_ca`, `bad_certificate`, …).
fn certificate_refusal(e: &std::io::Error) -> Option<String> {
    use rustls::AlertDescription as A;
    match e.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::AlertReceived(
            alert @ (A::UnknownCA
            | A::BadCertificate
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateExpired
            | A::CertificateRevoked),
        ) => Some(format!("{alert:?}")),
        _ => None,
    }
}

/// `host:port` for a Host header or URI, the port left out when it is the scheme's
/// `default`; an IPv6 literal is bracketed.
pub(crate) fn authority_of(host: &str, port: u16, default: u16) -> String {
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    if port == default {
        host
    } else {
        format!("{host}:{port}")
    }
}

/// The verdict for a credential sentinel sent where its credential is not injected.
fn exfiltration(message: String) -> Verdict {
    Verdict {
        decision: Decision::Deny,
        deny_kind: Some(capgate_policy::DenyKind::Explicit),
        reason: Reason::CredentialExfiltration,
        rule: None,
        message,
        inspect: false,
    }
}

/// Headers that web frameworks (Rails, Laravel, Symfony, Express' method-override,
/// Spring's HiddenHttpMethodFilter behind proxies) read as the request's real method.
const METHOD_OVERRIDES: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// The methods the `_method` parameters of a request's query name, which some frameworks
/// run instead of the request's method. Keys are read as the most lenient of them reads
/// them (PHP, under Laravel and Symfony): pairs split on `&` or `;`, `+` a space, percent
/// escapes decoded, a space or `.` in a name read as `_`, and `name[…]` as `name`; so
/// `.method`, `+method` and `_method[]` all count.
fn query_methods(path_and_query: &str) -> Vec<Vec<u8>> {
    let Some((_, query)) = path_and_query.split_once('?') else {
        return Vec::new();
    };
    let decode = |text: &str| crate::broker::percent_decode(text.replace('+', " ").as_bytes());
    query
        .split(['&', ';'])
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let mut key = decode(key);
            if let Some(open) = key.iter().position(|&b| b == b'[') {
                key.truncate(open);
            }
            for b in &mut key {
                if matches!(*b, b' ' | b'.') {
                    *b = b'_';
                }
            }
            (key == b"_method").then(|| decode(value))
        })
        .collect()
}

/// The request a rule judges: the method (an extension method, or one in another letter
/// case, as `ANY`, which only method-less rules match) and the path as sent.
pub(crate) fn http_request(method: &str, path: &str) -> HttpRequest {
    HttpRequest {
        method: Method::parse(method).unwrap_or(Method::Any),
        path: path.to_owned(),
    }
}

/// The policy target for a host as written in a request: an IP literal or a normalized name.
pub(crate) fn target_of(raw: &str) -> Option<Target> {
    let bare = raw
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(raw);
    if let Some(ip) = crate::addr::parse_ip_literal(bare) {
        return Some(Target::Ip(ip));
    }
    if crate::addr::looks_numeric(bare) {
        return None;
    }
    capgate_policy::pattern::normalize_host(bare)
        .ok()
        .map(Target::Host)
}

pub(crate) fn target_name(t: &Target) -> String {
    match t {
        Target::Host(h) => h.clone(),
        Target::Ip(ip) => ip.to_string(),
    }
}

/// `host[:port]` (IPv6 in brackets) with a default port.
pub(crate) fn split_authority(authority: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        return Some((format!("[{host}]"), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_owned(), p.parse().ok()?)),
        None => Some((authority.to_owned(), default_port)),
    }
}

/// A stream that yields `prefix` before reading from `inner` (bytes a client sent right
/// after its CONNECT head, before it saw the answer).
struct Rewind<'a, S> {
    prefix: Vec<u8>,
    at: usize,
    inner: &'a mut S,
}

impl<'a, S> Rewind<'a, S> {
    fn new(prefix: Vec<u8>, inner: &'a mut S) -> Self {
        Rewind {
            prefix,
            at: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = (self.prefix.len() - self.at).min(buf.remaining());
            let start = self.at;
            buf.put_slice(&self.prefix[start..start + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut *self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

/// What an HTTP request is carried as: `https` inside an intercepted TLS connection (whose
/// upstream is TLS too), `http` in the clear.
pub(crate) fn carried_http(tls: bool) -> Protocol {
    if tls { Protocol::Https } else { Protocol::Http }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_are_written_with_brackets_and_without_default_ports() {
        assert_eq!(authority_of("example.com", 443, 443), "example.com");
        assert_eq!(authority_of("example.com", 8443, 443), "example.com:8443");
        assert_eq!(authority_of("::1", 8443, 443), "[::1]:8443");
        assert_eq!(authority_of("[::1]", 80, 80), "[::1]");
        assert_eq!(authority_of("127.0.0.1", 80, 443), "127.0.0.1:80");
    }

    #[test]
    fn authorities_split_with_defaults() {
        assert_eq!(
            split_authority("example.com", 80),
            Some(("example.com".into(), 80))
        );
        assert_eq!(
            split_authority("example.com:8080", 80),
            Some(("example.com".into(), 8080))
        );
        assert_eq!(
            split_authority("[::1]:443", 80),
            Some(("[::1]".into(), 443))
        );
        assert_eq!(split_authority("[::1]", 80), Some(("[::1]".into(), 80)));
        assert_eq!(split_authority("a:b", 80), None);
    }

    #[test]
    fn targets_are_literals_or_normalized_names() {
        assert_eq!(
            target_of("Example.COM."),
            Some(Target::Host("example.com".into()))
        );
        assert!(matches!(target_of("0x7f.1"), Some(Target::Ip(_))));
        assert!(matches!(target_of("[::1]"), Some(Target::Ip(_))));
        assert_eq!(target_of("1.2.3.4.5"), None);
    }
}
