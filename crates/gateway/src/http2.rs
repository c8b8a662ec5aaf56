//! HTTP/2 inside an intercepted tunnel, where it is clean: only when the client offered
//! `h2` and the upstream chose it, so every stream goes h2 to h2 and nothing is translated
//! between protocol versions (no downgrade, so the h2-to-h1 smuggling forms cannot arise).
//! Otherwise the tunnel speaks HTTP/1.1 ([`crate::proxy`]).
//!
//! Each stream is judged like an HTTP/1.1 request in the tunnel: its `:authority` (and any
//! `host` header) must name the CONNECT host, the policy decides its method and path, the
//! broker swaps or refuses sentinels in its target and headers, and a refusal is a 403 on
//! that stream with the `x-capgate-reason` header and the same text body as over HTTP/1.1.
//! The h2 crate enforces the framing (header validity, pseudo-headers, Content-Length
//! against DATA, flow control). Bodies move within the peers' flow-control windows.
//! Request trailers are dropped, as over HTTP/1.1 (a trailer could carry a sentinel past
//! the broker); response trailers are relayed (gRPC's status travels in them).

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use capgate_policy::{Protocol, Reason, Target, Verdict};
use h2::client::SendRequest;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::timeout;

use crate::h1::Header;
use crate::mask::{Mask, RELEASE_AFTER};
use crate::proxy::{Gateway, authority_of, http_request, split_authority, target_of};
use crate::respond;
use crate::stall::Stall;

/// Streams one client connection may have open at once (advertised; the gateway's own
/// count of running stream tasks allows twice that, see `serve`).
const MAX_STREAMS: u32 = 64;
/// Flow-control windows, per stream and per connection, and what h2 may buffer for one
/// stream on its way out: large enough that one stream can keep a fast link busy, small
/// enough that a connection holds a few MiB at most (two connection windows and the send
/// buffers of its streams).
const STREAM_WINDOW: u32 = 512 << 10;
const CONNECTION_WINDOW: u32 = 1 << 20;
const SEND_BUFFER: usize = 32 << 10;

/// Fields that belong to one HTTP/1.1 connection and never travel in HTTP/2 (RFC 9113
/// §8.2.2), and the proxy's own fields.
fn dropped(name: &str) -> bool {
    matches!(
        name,
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade" | "host"
    ) || name.starts_with("proxy-")
}

/// An HTTP/2 connection to an upstream, driven by a background task that ends with it.
pub(crate) struct Upstream {
    sender: SendRequest<Bytes>,
    /// Resolves when the connection has ended (closed, failed, or GOAWAY completed).
    ended: tokio::task::JoinHandle<()>,
}

/// Opens HTTP/2 to the upstream over `io` (TLS that negotiated `h2`) within `wait`.
pub(crate) async fn connect_upstream<U>(io: U, wait: Duration) -> Result<Upstream, String>
where
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handshake = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_send_buffer_size(SEND_BUFFER)
        .enable_push(false)
        .handshake::<_, Bytes>(io);
    let (sender, connection) = match timeout(wait, handshake).await {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err("the HTTP/2 handshake timed out".to_owned()),
    };
    let ended = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Upstream { sender, ended })
}

/// What every stream of one tunnel shares.
struct Tunnel {
    gw: Gateway,
    /// The CONNECT target, its normalized name (an IPv6 literal without brackets), and its
    /// port.
    target: Target,
    host: String,
    port: u16,
    upstream: SendRequest<Bytes>,
    /// Told when a stream finds the upstream connection going away.
    upstream_gone: Notify,
}

/// Serves the client's HTTP/2 connection `io` (the intercepted TLS stream) until it ends,
/// each stream judged and relayed on its own task to `upstream`. Nothing outlives it: the
/// streams' tasks are aborted and the upstream connection is closed when it returns. When
/// the upstream connection ends first, the client is sent GOAWAY, so it opens a new
/// connection instead of getting a 502 for every later stream.
pub(crate) async fn serve<C>(
    gw: &Gateway,
    io: C,
    (target, host): (&Target, &str),
    port: u16,
    upstream: Upstream,
) where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let Upstream { sender, mut ended } = upstream;
    let limits = gw.limits();
    let max_header_list = u32::try_from(limits.h1.max_head_bytes).unwrap_or(u32::MAX);
    let handshake = h2::server::Builder::new()
        .max_concurrent_streams(MAX_STREAMS)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_send_buffer_size(SEND_BUFFER)
        .max_header_list_size(max_header_list)
        .handshake::<_, Bytes>(io);
    let Ok(Ok(mut connection)) = timeout(limits.head_timeout, handshake).await else {
        ended.abort();
        return;
    };
    let tunnel = Arc::new(Tunnel {
        gw: gw.clone(),
        target: target.clone(),
        host: host.to_owned(),
        port,
        upstream: sender,
        upstream_gone: Notify::new(),
    });
    // Twice what h2 advertises: h2 stops counting a stream when it is reset, a moment
    // before its task ends, and a client at the limit must not be refused for that.
    let running = Arc::new(Semaphore::new(2 * MAX_STREAMS as usize));
    let mut tasks = JoinSet::new();
    let mut upstream_open = true;
    loop {
        // `accept` also drives the connection for the streams already running, so it is
        // polled again after an idle interval while any of them is.
        tokio::select! {
            next = timeout(limits.idle_timeout, connection.accept()) => {
                let (request, mut respond) = match next {
                    Ok(Some(Ok(next))) => next,
                    Ok(Some(Err(e))) => {
                        // A connection h2 closed for the client's misbehaviour (a protocol
                        // error, a flood of resets) is recorded; one the client closed is not.
                        if let Some(v) = connection_refusal(&e) {
                            gw.audit_verdict(host, port, &v, None, (0, 0));
                        }
                        break;
                    }
                    Ok(None) => break,
                    Err(_) if !tasks.is_empty() => continue,
                    Err(_) => break,
                };
                let Ok(permit) = Arc::clone(&running).try_acquire_owned() else {
                    // Streams the client reset are no longer counted by h2, but their
                    // tasks still run: a client cannot pile them up.
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                    gw.audit_verdict(
                        host,
                        port,
                        &Verdict::refused(
                            Reason::LimitExceeded,
                            format!("more than {MAX_STREAMS} HTTP/2 streams running on one connection"),
                        ),
                        None,
                        (0, 0),
                    );
                    continue;
                };
                let tunnel = Arc::clone(&tunnel);
                tasks.spawn(async move {
                    tunnel.stream(request, respond).await;
                    drop(permit);
                });
            }
            _ = &mut ended, if upstream_open => {
                upstream_open = false;
                connection.graceful_shutdown();
            }
            () = tunnel.upstream_gone.notified(), if upstream_open => {
                upstream_open = false;
                connection.graceful_shutdown();
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    tasks.abort_all();
    ended.abort();
}

/// The refusal to record for an HTTP/2 connection that ended with `e`, if capgate's side
/// ended it for the client's misbehaviour (a GOAWAY it sent with an error code).
fn connection_refusal(e: &h2::Error) -> Option<Verdict> {
    if e.is_remote() || e.is_io() {
        return None;
    }
    let reason = e.reason().filter(|r| *r != h2::Reason::NO_ERROR)?;
    let why = if reason == h2::Reason::ENHANCE_YOUR_CALM {
        Reason::LimitExceeded
    } else {
        Reason::MalformedRequest
    };
    Some(Verdict::refused(
        why,
        format!("the HTTP/2 connection was closed by capgate: {e}"),
    ))
}

impl Tunnel {
    /// One stream: judged, then relayed, or answered here with the reason. Every stream
    /// is recorded once, with the verdict that decided it or the limit or failure that
    /// ended it.
    async fn stream(&self, request: Request<RecvStream>, mut respond: SendResponse<Bytes>) {
        let (parts, body) = request.into_parts();
        let method = parts.method.as_str().to_owned();
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let path = path_and_query.split('?').next().unwrap_or("/").to_owned();
        let what = Some((method.as_str(), path.as_str()));
        let host = self.host.as_str();
        // Read before the judgement: see `Gateway::until_revoked`.
        let began = self.gw.phase().get();
        // What the rules let through, a read-only tier may still hold back.
        let prepared = self.prepare(parts, &path, &path_and_query).and_then(|ok| {
            match self
                .gw
                .read_only_refusal(&method, !body.is_end_stream(), false)
            {
                Some(v) => {
                    let what = format!("{method} {host}{path}");
                    let text = respond::refusal_body(&v, self.gw.sandbox(), &what);
                    Err((403, v, text))
                }
                None => Ok(ok),
            }
        });
        match prepared {
            Ok((forward, verdict, mask)) => {
                // Aborted with its connection, the stream is still recorded.
                let mut unfinished = Unfinished {
                    gw: &self.gw,
                    host,
                    port: self.port,
                    what: (method.as_str(), path.as_str()),
                    armed: true,
                };
                // A stream lives as long as its bodies flow: like a tunnel, it is cut
                // (reset) when its grant stops holding, at a phase switch or rule change.
                let relayed = match self
                    .gw
                    .unless_revoked(
                        (&self.target, self.port, Protocol::Https),
                        (http_request(&method, &path), began),
                        self.relay(forward, body, &mut respond, mask.as_deref()),
                    )
                    .await
                {
                    Ok(relayed) => relayed,
                    Err(revoked) => Err(Failure {
                        verdict: revoked,
                        bytes: (0, 0),
                        answer: Answer::Reset,
                    }),
                };
                unfinished.armed = false;
                // Recorded before the failure's answer goes out: a client that reads the
                // log once it has its answer finds the event there.
                match relayed {
                    Ok(bytes) => self
                        .gw
                        .audit_verdict(host, self.port, &verdict, what, bytes),
                    Err(failure) => {
                        self.gw.audit_verdict(
                            host,
                            self.port,
                            &failure.verdict,
                            what,
                            failure.bytes,
                        );
                        match &failure.answer {
                            Answer::Status(status, text) => {
                                answer(&mut respond, *status, failure.verdict.reason, text);
                            }
                            Answer::Refused => respond.send_reset(h2::Reason::REFUSED_STREAM),
                            Answer::Reset => respond.send_reset(h2::Reason::CANCEL),
                        }
                    }
                }
            }
            Err((status, verdict, text)) => {
                self.gw
                    .audit_verdict(host, self.port, &verdict, what, (0, 0));
                answer(&mut respond, status, verdict.reason, &text);
                // A request body still on its way is read and dropped, so the stream
                // ends cleanly instead of being reset under the client's answer.
                drain(body, self.gw.limits().idle_timeout).await;
            }
        }
    }

    /// Judges a stream and builds the request to forward with the verdict that allowed it
    /// (and the mask its response goes through when it carries a secret), or the refusal:
    /// its status, verdict and text.
    fn prepare(
        &self,
        parts: http::request::Parts,
        path: &str,
        path_and_query: &str,
    ) -> Result<Prepared, (u16, Verdict, String)> {
        let (target, host) = (&self.target, self.host.as_str());
        let names_tunnel_host = |authority: &str| {
            split_authority(authority, self.port)
                .is_some_and(|(h, p)| p == self.port && target_of(&h).as_ref() == Some(target))
        };
        let authority_ok = parts
            .uri
            .authority()
            .is_some_and(|a| names_tunnel_host(a.as_str()));
        let host_ok = parts
            .headers
            .get_all(http::header::HOST)
            .iter()
            .all(|v| v.to_str().is_ok_and(names_tunnel_host));
        if parts.method == http::Method::CONNECT || !authority_ok || !host_ok {
            let message = "inside a tunnel, every stream goes to the CONNECT host (its :authority and Host name it)";
            return Err((
                400,
                Verdict::refused(Reason::MalformedRequest, message),
                format!("capgate: {message}\nreason: malformed_request\n"),
            ));
        }
        // The `:path` as an HTTP/1.1 origin-form target (or `*` for OPTIONS) would be read:
        // `//repos/x` is judged as `/repos/x` but routed as `/x` by WHATWG URL parsers.
        if !matches!(
            crate::h1::parse_target(parts.method.as_str(), path_and_query.as_bytes()),
            Ok(crate::h1::Target::Origin(_) | crate::h1::Target::Asterisk)
        ) {
            let message = format!(
                "the :path `{}` is not a request target with a single reading (origin form, not starting with `//`)",
                path_and_query.escape_default()
            );
            return Err((
                400,
                Verdict::refused(Reason::MalformedRequest, message.clone()),
                format!("capgate: {message}\nreason: malformed_request\n"),
            ));
        }
        let mut headers: Vec<Header> = parts
            .headers
            .iter()
            .filter(|(name, value)| {
                !dropped(name.as_str())
                    && (name.as_str() != "te" || value.as_bytes().eq_ignore_ascii_case(b"trailers"))
            })
            .map(|(name, value)| Header::new(name.as_str(), value.as_bytes()))
            .collect();
        let what = format!("{} {host}{path}", parts.method);
        let (verdict, mask) = self.gw.judge(
            target,
            host,
            self.port,
            (parts.method.as_str(), path),
            path_and_query,
            &mut headers,
            true,
        );
        if !verdict.is_allowed() {
            let text = respond::refusal_body(&verdict, self.gw.sandbox(), &what);
            return Err((403, verdict, text));
        }
        let authority = authority_of(&self.host, self.port, 443);
        let mut forward = Request::builder()
            .method(parts.method)
            .uri(format!("https://{authority}{path_and_query}"))
            .version(http::Version::HTTP_2);
        let built = match forward.headers_mut() {
            Some(map) => fill(map, &headers).and_then(|()| forward.body(()).map_err(drop)),
            None => Err(()),
        };
        built.map(|forward| (forward, verdict, mask)).map_err(|()| {
            let message = "the request cannot be forwarded as written";
            (
                400,
                Verdict::refused(Reason::MalformedRequest, message),
                format!("capgate: {message}\nreason: malformed_request\n"),
            )
        })
    }

    /// Sends the request upstream and the response back; returns the body bytes each way.
    /// An upload is bounded by the idle timeout; the wait for the response head, once the
    /// request is sent, by the upstream timeout; a stream the client resets is cancelled
    /// upstream at once.
    async fn relay(
        &self,
        forward: Request<()>,
        body: RecvStream,
        respond: &mut SendResponse<Bytes>,
        mask: Option<&Mask>,
    ) -> Result<(u64, u64), Failure> {
        let limits = self.gw.limits();
        let (idle, wait) = (limits.idle_timeout, limits.upstream_timeout);
        let lost = |message: String| Failure::lost(&self.host, self.port, message);
        // An upstream connection that is going away: the client retries the stream on a
        // new connection (REFUSED_STREAM is safe to retry) and is sent GOAWAY itself.
        let gone = |e: h2::Error| {
            self.upstream_gone.notify_one();
            Failure::refused_stream(e.to_string())
        };
        let mut upstream = match timeout(wait, self.upstream.clone().ready()).await {
            Ok(Ok(ready)) => ready,
            Ok(Err(e)) => return Err(gone(e)),
            Err(_) => return Err(lost("no stream could be opened in time".to_owned())),
        };
        let end_of_request = body.is_end_stream();
        let (response, send) = match upstream.send_request(forward, end_of_request) {
            Ok(pair) => pair,
            Err(e) => return Err(gone(e)),
        };
        let mut upload = Upload(
            (!end_of_request).then(|| tokio::spawn(pipe_body(body, send, false, idle, None))),
        );
        let mut uploaded: Option<Result<u64, PipeError>> = None;
        // Until the response head: the upstream's answer, the client's reset, the upload's
        // end, or the time limit, which starts once the request is sent (an upload is
        // bounded by the idle limit instead). Dropping the response future and the upload
        // (with its send half) resets the upstream stream.
        let mut deadline = upload
            .0
            .is_none()
            .then(|| tokio::time::Instant::now() + wait);
        tokio::pin!(response);
        let response = loop {
            tokio::select! {
                r = &mut response => break Ok(r),
                () = sleep_until(deadline) => break Err(()),
                _ = poll_fn(|cx| respond.poll_reset(cx)) => {
                    return Err(Failure::after_head(
                        Verdict::refused(Reason::InvalidTarget, "the client cancelled the stream"),
                        (0, 0),
                    ));
                }
                done = upload.finished(), if upload.0.is_some() => {
                    if let Err(PipeError::Stalled(stall)) = done {
                        return Err(Failure::stalled_upload(stall, idle));
                    }
                    uploaded = Some(done);
                    deadline = Some(tokio::time::Instant::now() + wait);
                }
            }
        };
        let response = match response {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                // A stalled upload resets the upstream stream, which fails the response:
                // the stall is the better account (the upload ends at once then).
                if upload.0.is_some()
                    && let Ok(Err(PipeError::Stalled(stall))) =
                        timeout(Duration::from_millis(200), upload.finished()).await
                {
                    return Err(Failure::stalled_upload(stall, idle));
                }
                if e.is_go_away() {
                    return Err(gone(e));
                }
                return Err(lost(e.to_string()));
            }
            Err(()) => return Err(lost("the upstream did not answer in time".to_owned())),
        };
        let (parts, down) = response.into_parts();
        // A body masking cannot read is not relayed unread.
        if let Some(mask) = mask
            && !down.is_end_stream()
            && let Some(message) = crate::mask::unreadable(
                mask,
                parts
                    .headers
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_bytes())),
            )
        {
            let text = format!(
                "capgate refused the answer of {}:{}: {message}\n",
                self.host, self.port
            );
            return Err(Failure {
                verdict: Verdict::refused(Reason::InvalidTarget, message),
                bytes: (0, 0),
                answer: Answer::Status(502, text),
            });
        }
        let mut head = Response::builder().status(parts.status);
        if let Some(map) = head.headers_mut() {
            for (name, value) in &parts.headers {
                if dropped(name.as_str()) {
                    continue;
                }
                if let Some(value) = masked_field(mask, name, value) {
                    map.append(name, value);
                }
            }
        }
        let head = head.body(()).map_err(|e| lost(e.to_string()))?;
        let end_of_response = down.is_end_stream();
        let send = respond.send_response(head, end_of_response).map_err(|e| {
            Failure::after_head(
                Verdict::refused(Reason::InvalidTarget, e.to_string()),
                (0, 0),
            )
        })?;
        let down = if end_of_response {
            Ok(0)
        } else {
            pipe_body(down, send, true, idle, mask).await
        };
        // Once the response is complete, an upload that did not finish is no failure: an
        // upstream may answer early and then stop the upload (RFC 9113 §8.1).
        let up = match uploaded {
            Some(result) => result,
            None if down.is_ok() && upload.0.is_some() => Ok(0),
            None => upload.finished().await,
        };
        match (up, down) {
            (up, Ok(down)) => Ok((up.unwrap_or(0), down)),
            (_, Err(PipeError::Stalled(stall))) => Err(Failure::after_head(
                Verdict::refused(
                    Reason::LimitExceeded,
                    format!("the response of {}:{}: {stall}", self.host, self.port),
                ),
                (0, 0),
            )),
            (up, Err(PipeError::H2(e))) => Err(Failure::after_head(
                Verdict::refused(
                    Reason::InvalidTarget,
                    format!("the response of {}:{} broke off: {e}", self.host, self.port),
                ),
                (up.unwrap_or(0), 0),
            )),
        }
    }
}

/// Records a stream whose relay was dropped before it ended (its connection closed).
struct Unfinished<'a> {
    gw: &'a Gateway,
    host: &'a str,
    port: u16,
    what: (&'a str, &'a str),
    armed: bool,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if self.armed {
            let verdict = Verdict::refused(
                Reason::InvalidTarget,
                "the client connection ended before the stream completed",
            );
            self.gw
                .audit_verdict(self.host, self.port, &verdict, Some(self.what), (0, 0));
        }
    }
}

/// A request body on its way up, on its own task; aborted if dropped unfinished.
struct Upload(Option<tokio::task::JoinHandle<Result<u64, PipeError>>>);

impl Upload {
    /// The upload's result (then there is none running).
    async fn finished(&mut self) -> Result<u64, PipeError> {
        match self.0.as_mut() {
            Some(task) => {
                let result = task.await;
                self.0 = None;
                result.unwrap_or(Ok(0))
            }
            None => Ok(0),
        }
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why a stream that was allowed did not complete: the verdict recorded for it, the bytes
/// moved, and how the client is answered.
struct Failure {
    verdict: Verdict,
    bytes: (u64, u64),
    answer: Answer,
}

/// How a failed stream is answered.
enum Answer {
    /// A response (its head had not gone out yet).
    Status(u16, String),
    /// `REFUSED_STREAM`: nothing was processed upstream; the client may retry it.
    Refused,
    /// A reset: the response head had gone out, or the client cancelled.
    Reset,
}

impl Failure {
    /// The upstream failed before answering: 502.
    fn lost(host: &str, port: u16, message: String) -> Failure {
        let text = format!("capgate lost {host}:{port} during the request: {message}\n");
        Failure {
            verdict: Verdict::refused(Reason::InvalidTarget, message),
            bytes: (0, 0),
            answer: Answer::Status(502, text),
        }
    }

    /// The upstream connection is going away and did not take the stream.
    fn refused_stream(message: String) -> Failure {
        Failure {
            verdict: Verdict::refused(
                Reason::InvalidTarget,
                format!("the upstream connection is going away: {message}"),
            ),
            bytes: (0, 0),
            answer: Answer::Refused,
        }
    }

    /// The request body stopped (408) or the upstream stopped taking it (504).
    fn stalled_upload(stall: Stall, idle: Duration) -> Failure {
        let (status, text) = match stall {
            Stall::Source => (
                408,
                format!(
                    "capgate cancelled the stream: its request body stopped arriving for {} s\nreason: limit_exceeded\n",
                    idle.as_secs()
                ),
            ),
            Stall::Sink => (
                504,
                format!(
                    "capgate cancelled the stream: the upstream took none of its request body for {} s\nreason: limit_exceeded\n",
                    idle.as_secs()
                ),
            ),
        };
        Failure {
            verdict: Verdict::refused(Reason::LimitExceeded, format!("request body: {stall}")),
            bytes: (0, 0),
            answer: Answer::Status(status, text),
        }
    }

    /// After the response head went out (or the client cancelled) only a reset is left.
    fn after_head(verdict: Verdict, bytes: (u64, u64)) -> Failure {
        Failure {
            verdict,
            bytes,
            answer: Answer::Reset,
        }
    }
}

/// Copies `from`'s headers into `map`; fails on a name or value HTTP/2 cannot carry.
fn fill(map: &mut HeaderMap, from: &[Header]) -> Result<(), ()> {
    for h in from {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(drop)?;
        let value = HeaderValue::from_bytes(&h.value).map_err(drop)?;
        map.append(name, value);
    }
    Ok(())
}

/// Why [`pipe_body`] stopped early.
#[derive(Debug)]
enum PipeError {
    /// One side moved nothing for the idle timeout; the receiving stream was reset.
    Stalled(Stall),
    H2(h2::Error),
}

impl From<h2::Error> for PipeError {
    fn from(e: h2::Error) -> Self {
        PipeError::H2(e)
    }
}

/// Moves a body from one stream to another within the receiver's flow-control window,
/// releasing the sender's window only as bytes leave (so a slow reader slows the writer,
/// and nothing piles up here). Trailers are relayed when `trailers` is set, else dropped.
/// A side that moves nothing for `idle` ends it: the receiving stream is reset and the
/// sending one is dropped (so it is reset too). Returns the body bytes moved.
async fn pipe_body(
    mut from: RecvStream,
    mut to: SendStream<Bytes>,
    trailers: bool,
    idle: Duration,
    mask: Option<&Mask>,
) -> Result<u64, PipeError> {
    let mut total = 0u64;
    let mut masking = mask.map(|m| (m.stream(), Vec::new()));
    let stalled = |to: &mut SendStream<Bytes>, stall: Stall| {
        to.send_reset(h2::Reason::CANCEL);
        PipeError::Stalled(stall)
    };
    loop {
        // The receiver may reset the stream while the sender is quiet (a long poll, an
        // event stream): that ends the relay at once, not at the idle limit. A mask that
        // holds bytes it may let go writes them after a quiet spell (see `crate::mask`).
        let releasable = masking.as_ref().is_some_and(|(s, _)| s.releasable());
        let next = tokio::select! {
            next = timeout(idle, from.data()) => next,
            reset = poll_fn(|cx| to.poll_reset(cx)) => {
                return Err(PipeError::H2(reset.map_or_else(|e| e, h2::Error::from)));
            }
            () = tokio::time::sleep(RELEASE_AFTER), if releasable => {
                if let Some((stream, _)) = &mut masking {
                    send_data(&mut to, Bytes::from(stream.release()), idle).await?;
                }
                continue;
            }
        };
        let chunk = match next {
            Ok(Some(chunk)) => chunk?,
            Ok(None) => break,
            Err(_) => return Err(stalled(&mut to, Stall::Source)),
        };
        let len = chunk.len();
        let chunk = match &mut masking {
            Some((stream, masked)) => {
                stream.feed(&chunk, masked);
                Bytes::copy_from_slice(masked)
            }
            None => chunk,
        };
        send_data(&mut to, chunk, idle).await?;
        from.flow_control().release_capacity(len)?;
        total += len as u64;
    }
    let fields = match timeout(idle, from.trailers()).await {
        Ok(fields) => fields?,
        Err(_) => return Err(stalled(&mut to, Stall::Source)),
    };
    if let Some((stream, _)) = &mut masking {
        // What was held back in case it began a secret.
        send_data(&mut to, Bytes::from(stream.finish()), idle).await?;
    }
    match fields {
        Some(fields) if trailers => {
            let fields = match mask {
                Some(_) => fields
                    .iter()
                    .filter_map(|(name, value)| {
                        Some((name.clone(), masked_field(mask, name, value)?))
                    })
                    .collect(),
                None => fields,
            };
            to.send_trailers(fields)?
        }
        _ => to.send_data(Bytes::new(), true)?,
    }
    Ok(total)
}

/// Sends `chunk` as the receiver's flow control lets it through; a receiver that grants
/// nothing for `idle` has its stream reset.
async fn send_data(
    to: &mut SendStream<Bytes>,
    mut chunk: Bytes,
    idle: Duration,
) -> Result<(), PipeError> {
    while !chunk.is_empty() {
        to.reserve_capacity(chunk.len());
        let granted = match timeout(idle, poll_fn(|cx| to.poll_capacity(cx))).await {
            Ok(Some(granted)) => granted?,
            Ok(None) => return Err(PipeError::H2(h2::Error::from(h2::Reason::CANCEL))),
            Err(_) => {
                to.send_reset(h2::Reason::CANCEL);
                return Err(PipeError::Stalled(Stall::Sink));
            }
        };
        let part = chunk.split_to(granted.min(chunk.len()));
        if !part.is_empty() {
            to.send_data(part, false)?;
        }
    }
    Ok(())
}

/// A field of an answer as it may reach the client: its value with the secrets of `mask`
/// overwritten; `None` (the field is dropped) when its name holds one (the marker is no
/// token) or, impossibly, the result is no header value. `Content-Length` is a number
/// capgate's codec checked, no reflection, and stays as it is.
fn masked_field(
    mask: Option<&Mask>,
    name: &HeaderName,
    value: &HeaderValue,
) -> Option<HeaderValue> {
    let Some(mask) = mask.filter(|_| name != http::header::CONTENT_LENGTH) else {
        return Some(value.clone());
    };
    if mask.finds(name.as_str().as_bytes()) {
        return None;
    }
    let mut bytes = value.as_bytes().to_vec();
    if mask.apply(&mut bytes) == 0 {
        return Some(value.clone());
    }
    HeaderValue::from_bytes(&bytes).ok()
}

/// The request a stream is forwarded as, the verdict that allowed it, and the mask its
/// response goes through when it carries a secret.
type Prepared = (Request<()>, Verdict, Option<Arc<Mask>>);

/// Reads and drops what is left of a refused request's body: at most 1 MiB, each part
/// within `idle`. A larger or slower body is left to the stream's reset.
async fn drain(mut body: RecvStream, idle: Duration) {
    let mut left = 1usize << 20;
    while left > 0 {
        match timeout(idle, body.data()).await {
            Ok(Some(Ok(chunk))) => {
                left = left.saturating_sub(chunk.len());
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            _ => return,
        }
    }
}

/// Answers a stream here: `status`, the reason header, and a text body.
fn answer(respond: &mut SendResponse<Bytes>, status: u16, reason: Reason, body: &str) {
    let Ok(head) = Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header(respond::REASON_HEADER.to_ascii_lowercase(), reason.code())
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(())
    else {
        return;
    };
    if let Ok(mut send) = respond.send_response(head, false) {
        let _ = send.send_data(Bytes::copy_from_slice(body.as_bytes()), true);
    }
}
