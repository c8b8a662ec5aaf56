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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use capgate_policy::{HttpRequest, Method, Reason, Target, Verdict};
use h2::client::SendRequest;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::timeout;

use crate::h1::Header;
use crate::proxy::{Gateway, split_authority, target_name, target_of};
use crate::respond;

/// Streams one client connection may have open at once.
const MAX_STREAMS: u32 = 128;
/// Flow-control windows, per stream and per connection: large enough that one stream can
/// keep a fast link busy, small enough to bound what is buffered.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 4 << 20;

/// Fields that belong to one HTTP/1.1 connection and never travel in HTTP/2 (RFC 9113
/// §8.2.2), and the proxy's own fields.
fn dropped(name: &str) -> bool {
    matches!(
        name,
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade" | "host"
    ) || name.starts_with("proxy-")
}

/// Opens HTTP/2 to the upstream over `io` (TLS that negotiated `h2`) and drives the
/// connection in the background; the handle sends the requests.
pub(crate) async fn connect_upstream<U>(io: U) -> Result<SendRequest<Bytes>, h2::Error>
where
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_STREAMS)
        .handshake::<_, Bytes>(io)
        .await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// What every stream of one tunnel shares.
struct Tunnel {
    gw: Gateway,
    /// The CONNECT host as written, and its port.
    host: String,
    port: u16,
    upstream: SendRequest<Bytes>,
}

/// Serves the client's HTTP/2 connection `io` (the intercepted TLS stream) until it ends,
/// each stream judged and relayed on its own task to the upstream behind `upstream`.
pub(crate) async fn serve<C>(
    gw: &Gateway,
    io: C,
    host: &str,
    port: u16,
    upstream: SendRequest<Bytes>,
) where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let limits = gw.limits();
    let max_header_list = u32::try_from(limits.h1.max_head_bytes).unwrap_or(u32::MAX);
    let handshake = h2::server::Builder::new()
        .max_concurrent_streams(MAX_STREAMS)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_header_list_size(max_header_list)
        .handshake::<_, Bytes>(io);
    let Ok(Ok(mut connection)) = timeout(limits.head_timeout, handshake).await else {
        return;
    };
    let tunnel = Arc::new(Tunnel {
        gw: gw.clone(),
        host: host.to_owned(),
        port,
        upstream,
    });
    let open = Arc::new(AtomicUsize::new(0));
    loop {
        // `accept` also drives the connection for the streams already open, so it is
        // polled again after an idle interval while any of them is still running.
        let (request, respond) = match timeout(limits.idle_timeout, connection.accept()).await {
            Ok(Some(Ok(next))) => next,
            Ok(Some(Err(_)) | None) => break,
            Err(_) if open.load(Ordering::Acquire) > 0 => continue,
            Err(_) => break,
        };
        open.fetch_add(1, Ordering::AcqRel);
        let tunnel = Arc::clone(&tunnel);
        let open = Arc::clone(&open);
        tokio::spawn(async move {
            tunnel.stream(request, respond).await;
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

impl Tunnel {
    /// One stream: judged, then relayed, or answered here with the reason.
    async fn stream(&self, request: Request<RecvStream>, mut respond: SendResponse<Bytes>) {
        let (parts, body) = request.into_parts();
        let method = parts.method.as_str().to_owned();
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let path = path_and_query.split('?').next().unwrap_or("/").to_owned();
        let Some(target) = target_of(&self.host) else {
            return;
        };
        let host = target_name(&target);
        let request = HttpRequest {
            method: Method::parse(&method).unwrap_or(Method::Any),
            path: path.clone(),
        };
        let what = Some((method.as_str(), path.as_str()));
        match self.prepare(parts, &target, &host, request, &path_and_query) {
            Ok((forward, verdict)) => {
                let bytes = match self.relay(forward, body, &mut respond).await {
                    Ok(bytes) => bytes,
                    Err(message) => {
                        let text = format!(
                            "capgate lost {}:{} during the request: {message}\n",
                            self.host, self.port
                        );
                        answer(&mut respond, 502, Reason::InvalidTarget, &text);
                        (0, 0)
                    }
                };
                self.gw
                    .audit_verdict(&host, self.port, &verdict, what, bytes);
            }
            Err((status, verdict, text)) => {
                answer(&mut respond, status, verdict.reason, &text);
                self.gw
                    .audit_verdict(&host, self.port, &verdict, what, (0, 0));
                // A request body still on its way is read and dropped, so the stream
                // ends cleanly instead of being reset under the client's answer.
                drain(body, self.gw.limits().idle_timeout).await;
            }
        }
    }

    /// Judges a stream and builds the request to forward with the verdict that allowed it,
    /// or the refusal: its status, verdict and text.
    fn prepare(
        &self,
        parts: http::request::Parts,
        target: &Target,
        host: &str,
        request: HttpRequest,
        path_and_query: &str,
    ) -> Result<(Request<()>, Verdict), (u16, Verdict, String)> {
        let names_tunnel_host = |authority: &str| {
            split_authority(authority, self.port)
                .is_some_and(|(h, p)| h.eq_ignore_ascii_case(&self.host) && p == self.port)
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
        let mut headers: Vec<Header> = parts
            .headers
            .iter()
            .filter(|(name, value)| {
                !dropped(name.as_str())
                    && (name.as_str() != "te" || value.as_bytes().eq_ignore_ascii_case(b"trailers"))
            })
            .map(|(name, value)| Header::new(name.as_str(), value.as_bytes()))
            .collect();
        let what = format!("{} {host}{}", parts.method, request.path);
        let verdict = self.gw.judge(
            target,
            host,
            self.port,
            request,
            path_and_query,
            &mut headers,
            true,
        );
        if !verdict.is_allowed() {
            let text = respond::refusal_body(&verdict, self.gw.sandbox(), &what);
            return Err((403, verdict, text));
        }
        let authority = if self.port == 443 {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let mut forward = Request::builder()
            .method(parts.method)
            .uri(format!("https://{authority}{path_and_query}"))
            .version(http::Version::HTTP_2);
        let built = match forward.headers_mut() {
            Some(map) => fill(map, &headers).and_then(|()| forward.body(()).map_err(drop)),
            None => Err(()),
        };
        built.map(|forward| (forward, verdict)).map_err(|()| {
            let message = "the request cannot be forwarded as written";
            (
                400,
                Verdict::refused(Reason::MalformedRequest, message),
                format!("capgate: {message}\nreason: malformed_request\n"),
            )
        })
    }

    /// Sends the request upstream and the response back; returns the body bytes each way.
    /// An error before the response head went back is answered by the caller (502); after
    /// it, the stream is reset.
    async fn relay(
        &self,
        forward: Request<()>,
        body: RecvStream,
        respond: &mut SendResponse<Bytes>,
    ) -> Result<(u64, u64), String> {
        let idle = self.gw.limits().idle_timeout;
        let mut upstream = self
            .upstream
            .clone()
            .ready()
            .await
            .map_err(|e| e.to_string())?;
        let end_of_request = body.is_end_stream();
        let (response, send) = upstream
            .send_request(forward, end_of_request)
            .map_err(|e| e.to_string())?;
        let upload = (!end_of_request).then(|| tokio::spawn(pipe_body(body, send, false, idle)));
        let response = response.await.map_err(|e| e.to_string())?;
        let (parts, down) = response.into_parts();
        let mut head = Response::builder().status(parts.status);
        if let Some(map) = head.headers_mut() {
            for (name, value) in &parts.headers {
                if !dropped(name.as_str()) {
                    map.append(name, value.clone());
                }
            }
        }
        let head = head.body(()).map_err(|e| e.to_string())?;
        let end_of_response = down.is_end_stream();
        let send = respond
            .send_response(head, end_of_response)
            .map_err(|e| e.to_string())?;
        let bytes_down = if end_of_response {
            0
        } else {
            // The head is out: a failure now can only reset the stream, which dropping
            // `send` unfinished does.
            pipe_body(down, send, true, idle).await.unwrap_or(0)
        };
        let bytes_up = match upload {
            Some(task) => task.await.ok().and_then(Result::ok).unwrap_or(0),
            None => 0,
        };
        Ok((bytes_up, bytes_down))
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

/// Moves a body from one stream to another within the receiver's flow-control window,
/// releasing the sender's window only as bytes leave (so a slow reader slows the writer,
/// and nothing piles up here). Trailers are relayed when `trailers` is set, else dropped.
/// A side that moves nothing for `idle` cancels the stream (slowloris on bodies). Returns
/// the body bytes moved.
async fn pipe_body(
    mut from: RecvStream,
    mut to: SendStream<Bytes>,
    trailers: bool,
    idle: Duration,
) -> Result<u64, h2::Error> {
    let stalled = || h2::Error::from(h2::Reason::CANCEL);
    let mut total = 0u64;
    while let Some(chunk) = timeout(idle, from.data()).await.map_err(|_| stalled())? {
        let mut chunk = chunk?;
        let len = chunk.len();
        while !chunk.is_empty() {
            to.reserve_capacity(chunk.len());
            let granted = match timeout(idle, poll_fn(|cx| to.poll_capacity(cx)))
                .await
                .map_err(|_| stalled())?
            {
                Some(granted) => granted?,
                None => return Err(h2::Error::from(h2::Reason::CANCEL)),
            };
            let part = chunk.split_to(granted.min(chunk.len()));
            if !part.is_empty() {
                to.send_data(part, false)?;
            }
        }
        from.flow_control().release_capacity(len)?;
        total += len as u64;
    }
    match timeout(idle, from.trailers())
        .await
        .map_err(|_| stalled())??
    {
        Some(fields) if trailers => to.send_trailers(fields)?,
        _ => to.send_data(Bytes::new(), true)?,
    }
    Ok(total)
}

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
