//! The gateway end to end with a real client: `curl` through the proxy to local HTTP and
//! HTTPS upstreams on loopback (names mapped onto 127.0.0.1, a test CA for the upstreams).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};

use capgate_gateway::addr::{AddressGuard, DangerousMapping, StaticResolver};
use capgate_gateway::broker::Broker;
use capgate_gateway::proxy::{Gateway, GatewayConfig, Limits, PhaseSwitch, PolicyView};
use capgate_gateway::secrets::Secret;
use capgate_gateway::tls::{CertificateAuthority, install_crypto_provider, upstream_client_config};
use capgate_policy::audit::{AuditEvent, AuditWriter, LogQuery};
use capgate_policy::store::{NewRule, Store};
use capgate_policy::{Decision, Matcher, Method, Phase, Protocol, Reason, Rule, Scope};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SENTINEL: &str = "capgate-sentinel-github-0123456789abcdef0123456789abcdef";

/// What an upstream saw.
#[derive(Debug, Clone, Default)]
struct Seen {
    requests: Vec<String>,
    /// HTTP/2 streams begun (counted before their bodies are read).
    streams_begun: usize,
}

/// A tiny HTTP/1.1 server: answers every request `200 hello from <name>` and records the
/// request heads it got.
async fn upstream(
    name: &'static str,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s2 = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let seen = Arc::clone(&s2);
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    Some(cfg) => {
                        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
                        if let Ok(s) = acceptor.accept(tcp).await {
                            if s.get_ref().1.alpn_protocol() == Some(b"h2") {
                                serve_h2(s, name, seen).await;
                            } else {
                                serve(s, name, seen).await;
                            }
                        }
                    }
                    None => serve(tcp, name, seen).await,
                }
            });
        }
    });
    (addr, seen)
}

async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    name: &str,
    seen: Arc<Mutex<Seen>>,
) {
    let mut buf = Vec::new();
    loop {
        let mut tmp = [0u8; 4096];
        let n = match s.read(&mut tmp).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&tmp[..n]);
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            // `GET /big/N` answers N bytes of `big_body(N)`; anything else says hello.
            let big = head
                .split(' ')
                .nth(1)
                .and_then(|target| target.rsplit_once("/big/"))
                .and_then(|(_, n)| n.parse::<usize>().ok());
            // `GET /stall/N` announces N bytes, sends 10 and then nothing.
            let stall = head
                .split(' ')
                .nth(1)
                .and_then(|target| target.rsplit_once("/stall/"))
                .and_then(|(_, n)| n.parse::<usize>().ok());
            let target = head.split(' ').nth(1).unwrap_or("").to_owned();
            let upgrade = head.to_ascii_lowercase().contains("\r\nupgrade: websocket");
            seen.lock().unwrap().requests.push(head.clone());
            // `/ws` with a WebSocket upgrade (RFC 6455's example key): 101, then echo
            // masked text frames back unmasked. `/switch`: a 101 nobody asked for.
            // `/ws-auth`: the same, but the first echo comes after a frame with the
            // request's Authorization (so that frame cannot come with the 101);
            // `/ws-split`: after that Authorization cut across two frames of a message.
            // `/ws-bad`: a whole frame, then one no server may send (a reserved opcode).
            let ws_route = ["/ws", "/ws-auth", "/ws-split", "/ws-bad"]
                .iter()
                .any(|r| target.ends_with(r));
            if ws_route && upgrade {
                let resp = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
                if s.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
                let mut first = Vec::new();
                let auth = authorization(&head);
                if target.ends_with("/ws-auth") {
                    first.extend_from_slice(&[0x81, auth.len() as u8]);
                    first.extend_from_slice(auth.as_bytes());
                }
                if target.ends_with("/ws-bad") {
                    first.extend_from_slice(b"\x81\x03bye\x83\x00");
                }
                if target.ends_with("/ws-split") {
                    let (a, b) = auth.split_at(auth.len() / 2);
                    first.extend_from_slice(&[0x01, a.len() as u8]);
                    first.extend_from_slice(a.as_bytes());
                    first.extend_from_slice(&[0x80, b.len() as u8]);
                    first.extend_from_slice(b.as_bytes());
                }
                echo_frames(&mut s, std::mem::take(&mut buf), first).await;
                return;
            }
            // `/interim`: a 103 whose reason phrase is the request's Authorization, then
            // `ok`. `/pause`: a chunked body whose first chunk is `status g`, then
            // nothing until the client goes.
            if target.ends_with("/interim") {
                let resp = format!(
                    "HTTP/1.1 103 {}\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                    authorization(&head)
                );
                if s.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
                continue;
            }
            // `/gzip`: a body said to be gzip-compressed; `/ce-echo`: said to be encoded
            // as `x-` and the request's Authorization.
            if target.ends_with("/gzip") || target.ends_with("/ce-echo") {
                let encoding = if target.ends_with("/gzip") {
                    "gzip".to_owned()
                } else {
                    format!("x-{}", authorization(&head))
                };
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Encoding: {encoding}\r\nContent-Length: 4\r\n\r\nzzzz"
                );
                if s.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
                continue;
            }
            // `/bad-header`: a header named after the request's token, with a value no
            // parser takes.
            if target.ends_with("/bad-header") {
                let auth = authorization(&head);
                let token = auth.strip_prefix("Bearer ").unwrap_or(&auth);
                let resp =
                    format!("HTTP/1.1 200 OK\r\n{token}: a\x01b\r\nContent-Length: 0\r\n\r\n");
                let _ = s.write_all(resp.as_bytes()).await;
                return;
            }
            if target.ends_with("/pause") {
                let resp = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8\r\nstatus g\r\n";
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.read(&mut [0u8; 1]).await;
                return;
            }
            // `/echo`: the request head back, its Authorization also in the reason phrase
            // and a header; `/echo-chunked`: the head back in chunks of 5 bytes.
            if target.ends_with("/echo") || target.ends_with("/echo-chunked") {
                let auth = authorization(&head);
                let echo = head.clone();
                let resp = if target.ends_with("/echo") {
                    format!(
                        "HTTP/1.1 200 Echo {auth}\r\nX-Echo: {auth}\r\nContent-Length: {}\r\n\r\n{echo}",
                        echo.len()
                    )
                } else {
                    let mut r = format!(
                        "HTTP/1.1 200 OK\r\nX-Echo: {auth}\r\nTransfer-Encoding: chunked\r\n\r\n"
                    );
                    for piece in echo.as_bytes().chunks(5) {
                        r.push_str(&format!(
                            "{:x}\r\n{}\r\n",
                            piece.len(),
                            String::from_utf8_lossy(piece)
                        ));
                    }
                    r.push_str("0\r\n\r\n");
                    r
                };
                if s.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
                continue;
            }
            if target.ends_with("/switch") {
                let resp = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\nPRI * HTTP/2.0";
                let _ = s.write_all(resp.as_bytes()).await;
                return;
            }
            if let Some(n) = stall {
                let resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n0123456789");
                let _ = s.write_all(resp.as_bytes()).await;
                std::future::pending::<()>().await;
            }
            let body = match big {
                Some(n) => big_body(n),
                None => format!("hello from {name}\n"),
            };
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if s.write_all(resp.as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

/// The value of a request head's `Authorization` header ("" without one).
fn authorization(head: &str) -> String {
    head.split("\r\n")
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("authorization")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default()
}

/// The same server over HTTP/2 (for upstreams whose TLS offers `h2`). It records each
/// request as `METHOD TARGET HTTP/2` followed by `:authority` and the header lines.
async fn serve_h2<S>(s: S, name: &'static str, seen: Arc<Mutex<Seen>>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let Ok(mut conn) = h2::server::handshake(s).await else {
        return;
    };
    while let Some(Ok((request, mut respond))) = conn.accept().await {
        // `h2once.test` serves one stream per connection, then says GOAWAY (as nginx does
        // at its keepalive_requests).
        if name == "h2once.test" {
            conn.graceful_shutdown();
        }
        seen.lock().unwrap().streams_begun += 1;
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            let (parts, mut body) = request.into_parts();
            let mut received = 0;
            while let Some(Ok(chunk)) = body.data().await {
                received += chunk.len();
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let mut head = format!("{} {target} HTTP/2", parts.method);
            head.push_str(&format!(
                "\r\n:authority: {}",
                parts.uri.authority().map_or("", |a| a.as_str())
            ));
            for (n, v) in &parts.headers {
                head.push_str(&format!(
                    "\r\n{n}: {}",
                    String::from_utf8_lossy(v.as_bytes())
                ));
            }
            head.push_str(&format!("\r\n(body {received} bytes)"));
            seen.lock().unwrap().requests.push(head.clone());
            let big = target
                .rsplit_once("/big/")
                .and_then(|(_, n)| n.parse::<usize>().ok());
            // `/echo`: the request back, its Authorization also in a header.
            let echo = target.ends_with("/echo");
            let body = match big {
                Some(n) => big_body(n),
                None if echo => head.clone(),
                None => format!("hello from {name}\n"),
            };
            let mut response = http::Response::builder()
                .status(200)
                .header("content-length", body.len());
            if echo {
                response = response.header("x-echo", authorization(&head));
            }
            // `/gzip`: the body said to be gzip-compressed; `/ce-echo`: encoded as `x-`
            // and the request's Authorization.
            if target.ends_with("/gzip") {
                response = response.header("content-encoding", "gzip");
            }
            if target.ends_with("/ce-echo") {
                response =
                    response.header("content-encoding", format!("x-{}", authorization(&head)));
            }
            let response = response.body(()).unwrap();
            // `/pause`: `status g`, and the stream stays open.
            if target.ends_with("/pause") {
                let response = http::Response::builder().status(200).body(()).unwrap();
                if let Ok(mut send) = respond.send_response(response, false) {
                    let _ = send.send_data(bytes::Bytes::from_static(b"status g"), false);
                    std::future::pending::<()>().await;
                }
                return;
            }
            if let Ok(mut send) = respond.send_response(response, false) {
                let _ = send.send_data(bytes::Bytes::from(body), true);
            }
        });
    }
}

/// Echoes masked WebSocket text frames (payload < 126 bytes) as unmasked ones; `first`
/// goes out just before the first echo.
async fn echo_frames<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    mut buf: Vec<u8>,
    mut first: Vec<u8>,
) {
    loop {
        if buf.len() >= 6 {
            let len = usize::from(buf[1] & 0x7f);
            if buf.len() >= 6 + len {
                let mask = [buf[2], buf[3], buf[4], buf[5]];
                let payload: Vec<u8> = buf[6..6 + len]
                    .iter()
                    .enumerate()
                    .map(|(i, b)| b ^ mask[i % 4])
                    .collect();
                buf.drain(..6 + len);
                let mut frame = std::mem::take(&mut first);
                frame.extend_from_slice(&[0x81, payload.len() as u8]);
                frame.extend_from_slice(&payload);
                if s.write_all(&frame).await.is_err() {
                    return;
                }
                continue;
            }
        }
        let mut tmp = [0u8; 1024];
        match s.read(&mut tmp).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
}

/// A body that shows any lost, repeated or reordered stretch.
fn big_body(len: usize) -> String {
    (0..len)
        .map(|i| char::from(b'a' + ((i / 7 + i) % 26) as u8))
        .collect()
}

struct Harness {
    _dir: tempfile::TempDir,
    policy: Arc<PolicyView>,
    gw: Gateway,
    audit: Arc<AuditWriter>,
    store: std::path::PathBuf,
    proxy: SocketAddr,
    socks: SocketAddr,
    ca_pem: std::path::PathBuf,
    ports: BTreeMap<&'static str, u16>,
    seen: BTreeMap<&'static str, Arc<Mutex<Seen>>>,
    /// Connections `mute.test` accepted (it holds them open and never says a byte).
    mute_accepted: Arc<std::sync::atomic::AtomicUsize>,
}

fn rule(
    id: &str,
    decision: Decision,
    resources: &[&str],
    methods: Option<Vec<Method>>,
    paths: Option<Vec<&str>>,
) -> Rule {
    let mut n = NewRule::provisioned(
        format!("kit:t:{id}"),
        "t",
        decision,
        resources.iter().map(|s| (*s).to_owned()).collect(),
        Protocol::Any,
    );
    n.methods = methods;
    n.paths = paths.map(|p| p.into_iter().map(str::to_owned).collect());
    stored(id, n)
}

/// Upstreams: `plain.test` (HTTP), `api.test`, `other.test`, `secure.test` (HTTPS), and
/// `h2.test`, `h2open.test` (HTTPS offering HTTP/2). Rules: plain.test, secure.test and
/// h2open.test allowed; api.test and h2.test only `GET /repos/**`; `denied.test` allowed
/// but also denied; other.test allowed; `install.test` (HTTP) allowed in the install phase
/// only. The credential is injected on api.test and h2.test.
async fn harness(with_credential: bool) -> Harness {
    harness_with(with_credential, false, Limits::default()).await
}

/// `allow_everything` adds a `**` allow, to show what the address guard refuses on its own.
async fn harness_with(with_credential: bool, allow_everything: bool, limits: Limits) -> Harness {
    harness_full(with_credential, allow_everything, limits, Vec::new()).await
}

async fn harness_full(
    with_credential: bool,
    allow_everything: bool,
    limits: Limits,
    extra: Vec<Rule>,
) -> Harness {
    harness_tiered(with_credential, allow_everything, limits, extra, false).await
}

/// `read_only`: the sandbox's determinism tier is read-only.
async fn harness_tiered(
    with_credential: bool,
    allow_everything: bool,
    limits: Limits,
    extra: Vec<Rule>,
    read_only: bool,
) -> Harness {
    install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    // The upstreams' own CA, which only the gateway trusts.
    let up_ca = CertificateAuthority::load_or_create(&dir.path().join("upstream-ca")).unwrap();
    let mut ports = BTreeMap::new();
    let mut seen = BTreeMap::new();
    for (name, tls) in [
        ("plain.test", false),
        ("api.test", true),
        ("other.test", true),
        ("secure.test", true),
        ("denied.test", true),
        ("sink.test", false),
        ("h2.test", true),
        ("h2open.test", true),
        ("install.test", false),
        ("h2once.test", true),
    ] {
        let cfg = tls.then(|| {
            let cfg = up_ca.server_config_for(name).unwrap();
            if name.starts_with("h2") {
                let mut cfg = (*cfg).clone();
                cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
                Arc::new(cfg)
            } else {
                cfg
            }
        });
        let (addr, s) = upstream(name, cfg).await;
        ports.insert(name, addr.port());
        seen.insert(name, s);
    }
    let mute_accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let mute = TcpListener::bind("127.0.0.1:0").await.unwrap();
        ports.insert("mute.test", mute.local_addr().unwrap().port());
        let accepted = Arc::clone(&mute_accepted);
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = mute.accept().await {
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(s);
            }
        });
    }
    let rules = vec![
        rule(
            "r1",
            Decision::Allow,
            &[
                "mute.test",
                "plain.test",
                "secure.test",
                "other.test",
                "denied.test",
                "sink.test",
                "h2open.test",
                "h2once.test",
            ],
            None,
            None,
        ),
        rule(
            "r2",
            Decision::Allow,
            &["api.test", "h2.test"],
            Some(vec![Method::Get]),
            Some(vec!["/repos/**"]),
        ),
        rule("r3", Decision::Deny, &["denied.test"], None, None),
        Rule {
            phase: Some(Phase::Install),
            ..rule("r4", Decision::Allow, &["install.test"], None, None)
        },
    ];
    let mut rules = rules;
    if allow_everything {
        rules.push(rule("all", Decision::Allow, &["**"], None, None));
    }
    rules.extend(extra);
    let mappings: Vec<DangerousMapping> = ports
        .keys()
        .map(|n| DangerousMapping::new(n, "127.0.0.1".parse().unwrap()).unwrap())
        .collect();
    let guard = AddressGuard::new(vec![])
        .unwrap()
        .with_dangerous_mappings(mappings);
    let cred_yaml = "schemaVersion: \"3\"\nkind: mixin\ncapabilities:\n  - type: com.docker.sandbox/credential@1\n    config: {service: github, phase: runtime, apiKey: {name: GH_TOKEN, inject: [{domain: api.test}, {domain: h2.test}]}}\n";
    let loaded = capgate_spec::load(
        cred_yaml.as_bytes(),
        &capgate_spec::Options {
            declarations_only: true,
            ..Default::default()
        },
    );
    let cred = match &loaded.descriptor.unwrap().declared_entries()[0]
        .1
        .capability
    {
        Some(capgate_spec::caps::Capability::Credential(c)) => c.clone(),
        _ => panic!(),
    };
    let broker = if with_credential {
        Broker::new(
            &[cred],
            &[("github".to_owned(), SENTINEL.to_owned())].into(),
            [(
                "github".to_owned(),
                Secret::new("ghp_the_real_secret".into()),
            )]
            .into(),
        )
    } else {
        Broker::default()
    };
    let store = dir.path().join("policy.db");
    let audit = Arc::new(AuditWriter::spawn(&store).unwrap());
    let policy = Arc::new(PolicyView::new(Matcher::compile(&rules)));
    let cfg = GatewayConfig {
        sandbox: "t".into(),
        policy: Arc::clone(&policy),
        phase: Arc::new(PhaseSwitch::new(Phase::Runtime)),
        guard,
        resolver: Arc::new(StaticResolver::new()),
        ca: Some(CertificateAuthority::load_or_create(&dir.path().join("ca")).unwrap()),
        upstream_tls: upstream_client_config(Some(up_ca.cert_pem().as_bytes())).unwrap(),
        broker,
        audit: Some(Arc::clone(&audit)),
        limits,
        read_only,
    };
    // What curl trusts: the capgate CA (intercepted hosts) and the upstreams' CA (hosts
    // tunnelled opaquely), as a sandbox trusts capgate's CA beside the public roots.
    let ca_pem = dir.path().join("bundle.pem");
    let capgate_ca = std::fs::read_to_string(dir.path().join("ca/ca.pem")).unwrap();
    std::fs::write(&ca_pem, format!("{capgate_ca}{}", up_ca.cert_pem())).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = listener.local_addr().unwrap();
    let socks_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let socks = socks_listener.local_addr().unwrap();
    let gw = Gateway::new(cfg);
    let (gw1, gw2) = (gw.clone(), gw.clone());
    tokio::spawn(async move { gw1.serve_http(listener).await });
    tokio::spawn(async move { gw2.serve_socks(socks_listener).await });
    Harness {
        _dir: dir,
        policy,
        gw,
        audit,
        store,
        proxy,
        socks,
        ca_pem,
        ports,
        seen,
        mute_accepted,
    }
}

/// Runs a prepared curl; returns its exit code and stdout followed by stderr.
async fn output(mut cmd: Command) -> (i32, String) {
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("curl must be installed"))
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Runs curl through the proxy; returns (exit code, http code, body+headers).
async fn curl(h: &Harness, args: &[&str]) -> (i32, String) {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "10",
        "-x",
        &format!("http://{}", h.proxy),
        "--cacert",
    ])
    .arg(&h.ca_pem)
    .args(["-w", "\n%{http_code} %{http_connect}\n"])
    .args(args);
    output(cmd).await
}

fn url(h: &Harness, scheme: &str, host: &str, path: &str) -> String {
    format!("{scheme}://{host}:{}{path}", h.ports[host])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_hosts_pass_and_unlisted_hosts_get_403_with_reason() {
    let h = harness(false).await;
    let (code, out) = curl(&h, &[&url(&h, "http", "plain.test", "/x")]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("hello from plain.test") && out.contains("\n200 "),
        "{out}"
    );

    let (code, out) = curl(&h, &[&url(&h, "https", "secure.test", "/x")]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hello from secure.test"), "{out}");

    // Unlisted: plain HTTP gets the 403 body; HTTPS gets a 403 to its CONNECT.
    let (_, out) = curl(&h, &["-i", "http://unlisted.test/"]).await;
    assert!(
        out.contains("403 Forbidden") && out.contains("X-Capgate-Reason: no_matching_allow"),
        "{out}"
    );
    assert!(out.contains("nothing allows this host"), "{out}");
    let (code, out) = curl(&h, &["-v", "https://unlisted.test/"]).await;
    assert_ne!(code, 0);
    assert!(
        out.contains("403") && out.contains("no_matching_allow"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_arrive_whole_and_the_next_response_is_intact() {
    let h = harness(false).await;
    // Plain HTTP on both sides: the bodies are spliced, through one pipe per connection.
    // Through TLS: they are copied. A third request follows on the same connections, so a
    // body that took a byte too many or too few, or a pipe that kept a byte of the first
    // body, would corrupt what comes after it.
    for scheme in ["http", "https"] {
        let host = if scheme == "http" {
            "plain.test"
        } else {
            "secure.test"
        };
        let (len, len2) = (3 * 1024 * 1024 + 17, 200 * 1024 + 3);
        let (code, out) = curl(
            &h,
            &[
                &url(&h, scheme, host, &format!("/big/{len}")),
                &url(&h, scheme, host, &format!("/big/{len2}")),
                &url(&h, scheme, host, "/after"),
            ],
        )
        .await;
        assert_eq!(
            code,
            0,
            "{scheme}: {}",
            &out[out.len().saturating_sub(300)..]
        );
        let body = big_body(len);
        assert!(
            out.starts_with(&body),
            "{scheme}: the first large body differs"
        );
        let rest = &out[body.len()..];
        let rest = rest
            .strip_prefix("\n200 ")
            .unwrap_or_else(|| panic!("{scheme}: no status after the first body"));
        let body2 = big_body(len2);
        assert!(
            rest.contains(&body2),
            "{scheme}: the second large body differs"
        );
        let rest = &rest[rest.find(&body2).unwrap() + body2.len()..];
        assert!(
            rest.starts_with("\n200 ") && rest.contains(&format!("hello from {host}\n")),
            "{scheme}: {rest}"
        );
    }
    let plain = h.seen["plain.test"].lock().unwrap().requests.len();
    assert_eq!(plain, 3, "all three requests reached the plain upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_rules_are_judged_per_request_inside_tls() {
    let h = harness(true).await;
    let (code, out) = curl(&h, &[&url(&h, "https", "api.test", "/repos/x")]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("hello from api.test") && out.contains("\n200 200"),
        "{out}"
    );

    let (_, out) = curl(
        &h,
        &[
            "-i",
            "-X",
            "POST",
            &url(&h, "https", "api.test", "/repos/x"),
        ],
    )
    .await;
    assert!(
        out.contains("HTTP/1.1 403") && out.contains("X-Capgate-Reason: http_not_allowed"),
        "{out}"
    );
    let (_, out) = curl(&h, &["-i", &url(&h, "https", "api.test", "/user")]).await;
    assert!(
        out.contains("HTTP/1.1 403") && out.contains("http_not_allowed"),
        "{out}"
    );
    // Encoded dot segments cannot smuggle a path past a bounded rule.
    let (_, out) = curl(
        &h,
        &[
            "-i",
            "--path-as-is",
            &url(&h, "https", "api.test", "/repos/%2e%2e/user"),
        ],
    )
    .await;
    assert!(out.contains("HTTP/1.1 403"), "{out}");
    // Cleartext through a tunnel to a host that must be inspected: refused, and recorded.
    let port = h.ports["api.test"];
    let answer = raw_exchange(
        &h,
        format!(
            "CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test\r\n\r\nPOST /repos/x HTTP/1.1\r\nHost: api.test\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(!answer.contains("hello from"), "{answer}");
    assert!(
        recorded(&h)
            .iter()
            .any(|e| e.host == "api.test" && e.reason == Reason::InspectionRequired),
        "{:?}",
        recorded(&h)
    );
    let seen = h.seen["api.test"].lock().unwrap().requests.clone();
    assert_eq!(
        seen.len(),
        1,
        "only the allowed request reached the upstream: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbounded_deny_beats_any_allow() {
    let h = harness(true).await;
    let (code, out) = curl(&h, &["-v", &url(&h, "https", "denied.test", "/")]).await;
    assert_ne!(code, 0);
    assert!(
        out.contains("403") && out.contains("denied_by_rule"),
        "{out}"
    );
    let (_, out) = curl(&h, &["-i", &url(&h, "http", "denied.test", "/")]).await;
    assert!(
        out.contains("X-Capgate-Reason: denied_by_rule") && out.contains("kit:t:r3"),
        "{out}"
    );
    assert!(h.seen["denied.test"].lock().unwrap().requests.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_different_from_the_connect_host_is_refused() {
    // Both when the tunnel is opaque and when it is intercepted.
    for with_credential in [false, true] {
        let h = harness(with_credential).await;
        // curl --connect-to keeps the URL's host as SNI but CONNECTs to another host:port.
        let target = format!(
            "secure.test:{}:other.test:{}",
            h.ports["secure.test"], h.ports["other.test"]
        );
        let (code, out) = curl(
            &h,
            &[
                "--connect-to",
                &target,
                &url(&h, "https", "secure.test", "/"),
            ],
        )
        .await;
        assert_ne!(code, 0, "{out}");
        assert!(!out.contains("hello from"), "{out}");
        assert!(h.seen["other.test"].lock().unwrap().requests.is_empty());
        assert!(h.seen["secure.test"].lock().unwrap().requests.is_empty());
        // The twin: the same host named consistently passes.
        let (code, out) = curl(&h, &[&url(&h, "https", "other.test", "/")]).await;
        assert_eq!(code, 0, "{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sentinel_becomes_the_secret_only_on_the_inject_domain() {
    let h = harness(true).await;
    let auth = format!("Authorization: Bearer {SENTINEL}");
    let (code, out) = curl(
        &h,
        &["-H", &auth, &url(&h, "https", "api.test", "/repos/x")],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let seen = h.seen["api.test"].lock().unwrap().requests.clone();
    assert!(
        seen[0].contains("Authorization: Bearer ghp_the_real_secret"),
        "{seen:?}"
    );
    assert!(!seen[0].contains(SENTINEL));

    // Anywhere else: refused and recorded, and that upstream sees nothing.
    let (_, out) = curl(
        &h,
        &["-i", "-H", &auth, &url(&h, "https", "other.test", "/")],
    )
    .await;
    assert!(
        out.contains("HTTP/1.1 403") && out.contains("credential_exfiltration"),
        "{out}"
    );
    assert!(!out.contains("ghp_the_real_secret"));
    let (_, out) = curl(
        &h,
        &["-i", "-H", &auth, &url(&h, "http", "plain.test", "/")],
    )
    .await;
    assert!(out.contains("credential_exfiltration"), "{out}");
    assert!(h.seen["other.test"].lock().unwrap().requests.is_empty());
    assert!(h.seen["plain.test"].lock().unwrap().requests.is_empty());
}

/// TRACE is answered with the request as the server received it, so on the inject domain
/// it would hand the real secret back to the workload, which never sent the sentinel:
/// refused there (over HTTP/1.1 and HTTP/2), and that upstream sees nothing. Twins: TRACE
/// to a host where nothing is injected passes, and so does GET on the inject domain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_is_refused_where_a_credential_is_injected() {
    // The rules allow TRACE there: only the broker stands in the way.
    let trace = rule(
        "t1",
        Decision::Allow,
        &["api.test", "h2.test"],
        Some(vec![Method::Trace]),
        Some(vec!["/repos/**"]),
    );
    let h = harness_full(true, false, Limits::default(), vec![trace]).await;
    for (host, version) in [("api.test", "--http1.1"), ("h2.test", "--http2")] {
        let (_, out) = curl(
            &h,
            &[
                "-i",
                version,
                "-X",
                "TRACE",
                &url(&h, "https", host, "/repos/x"),
            ],
        )
        .await;
        assert!(
            out.contains(" 403") && out.contains("credential_exfiltration"),
            "{version}: {out}"
        );
        assert!(
            out.contains(&format!("`TRACE` asks `{host}` to send the request back")),
            "{out}"
        );
        assert!(!out.contains("ghp_the_real_secret"), "{out}");
        assert!(h.seen[host].lock().unwrap().requests.is_empty());
    }
    let (code, out) = curl(&h, &["-X", "TRACE", &url(&h, "https", "other.test", "/")]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(h.seen["other.test"].lock().unwrap().requests.len(), 1);
    let (code, out) = curl(&h, &[&url(&h, "https", "api.test", "/repos/x")]).await;
    assert_eq!(code, 0, "{out}");
    let seen = h.seen["api.test"].lock().unwrap().requests.clone();
    assert!(
        seen[0].contains("Authorization: Bearer ghp_the_real_secret"),
        "{seen:?}"
    );
}

/// Raw bytes to the proxy; returns what it answered.
async fn raw(h: &Harness, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(h.proxy).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_framing_is_400_and_never_forwarded() {
    let h = harness(true).await;
    let port = h.ports["plain.test"];
    let cases: Vec<Vec<u8>> = vec![
        format!("POST http://plain.test:{port}/ HTTP/1.1\r\nHost: plain.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n").into_bytes(),
        format!("POST http://plain.test:{port}/ HTTP/1.1\r\nHost: plain.test\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!").into_bytes(),
        format!("GET http://plain.test:{port}/ HTTP/1.1\nHost: plain.test\n\n").into_bytes(),
        format!("GET http://plain.test:{port}/ HTTP/1.1\r\nHost: plain.test\r\nX-A: a\r\n b\r\n\r\n").into_bytes(),
    ];
    for c in cases {
        let out = raw(&h, &c).await;
        assert!(
            out.starts_with("HTTP/1.1 400") && out.contains("malformed_request"),
            "{out}"
        );
    }
    let big = format!(
        "GET http://plain.test:{port}/ HTTP/1.1\r\nHost: plain.test\r\nX-Big: {}\r\n\r\n",
        "a".repeat(40_000)
    );
    assert!(raw(&h, big.as_bytes()).await.starts_with("HTTP/1.1 431"));
    assert!(h.seen["plain.test"].lock().unwrap().requests.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_addresses_are_never_dialled() {
    // Allowed by a `**` rule, yet every spelling of a blocked address is refused by the
    // address guard; a name mapped onto loopback on purpose (`--dangerously-resolve`) passes.
    let h = harness_with(false, true, Limits::default()).await;
    let port = h.ports["plain.test"];
    for target in [
        "127.0.0.1",
        "2130706433",
        "0x7f.1",
        "0177.0.0.1",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "169.254.169.254",
        "10.0.0.1",
        "[fd00:ec2::254]",
    ] {
        let out = raw(
            &h,
            format!("GET http://{target}:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(
            out.starts_with("HTTP/1.1 403") && out.contains("blocked_address"),
            "{target}: {out}"
        );
    }
    for target in ["127.0.0.1", "[::1]"] {
        let out = raw(
            &h,
            format!("CONNECT {target}:{port} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(
            out.starts_with("HTTP/1.1 403") && out.contains("blocked_address"),
            "{target}: {out}"
        );
    }
    assert!(h.seen["plain.test"].lock().unwrap().requests.is_empty());
    let out = raw(&h, format!("GET http://plain.test:{port}/ HTTP/1.1\r\nHost: plain.test\r\nConnection: close\r\n\r\n").as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

/// curl through the SOCKS5 listener (names resolved by the gateway).
async fn curl_socks(h: &Harness, url: &str) -> (i32, String) {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "10",
        "--socks5-hostname",
        &h.socks.to_string(),
        "--cacert",
    ])
    .arg(&h.ca_pem)
    .arg(url);
    output(cmd).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_carries_unbounded_grants_only() {
    let h = harness(false).await;
    let (code, out) = curl_socks(&h, &url(&h, "http", "plain.test", "/")).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hello from plain.test"));
    let (code, out) = curl_socks(&h, &url(&h, "https", "secure.test", "/")).await;
    assert_eq!(code, 0, "{out}");
    // A host granted only for some HTTP requests cannot be inspected through SOCKS.
    let (code, out) = curl_socks(&h, &url(&h, "https", "api.test", "/repos/x")).await;
    assert_ne!(code, 0, "{out}");
    assert!(h.seen["api.test"].lock().unwrap().requests.is_empty());
    for u in [
        "http://unlisted.test/".to_owned(),
        url(&h, "http", "denied.test", "/"),
        format!("http://127.0.0.1:{}/", h.ports["plain.test"]),
    ] {
        let (code, out) = curl_socks(&h, &u).await;
        assert_ne!(code, 0, "{u}: {out}");
    }
    assert!(h.seen["denied.test"].lock().unwrap().requests.is_empty());
}

/// Through SOCKS as through CONNECT, TLS must name the host the client asked for: a grant
/// for one name must not carry TLS for another name served at the same address (a CDN).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_tls_naming_another_host_is_refused_and_never_forwarded() {
    for with_credential in [false, true] {
        let h = harness(with_credential).await;
        let (port, got) = recording_upstream().await;
        let hello_for = |server: &'static str, tcp: TcpStream| {
            let config = Arc::new(client_tls(&h, &[b"http/1.1"]));
            async move {
                let name = rustls::pki_types::ServerName::try_from(server).unwrap();
                // The recording upstream never answers: the handshake only has to start.
                let _ = tokio::time::timeout(
                    std::time::Duration::from_millis(500),
                    tokio_rustls::TlsConnector::from(config).connect(name, tcp),
                )
                .await;
            }
        };
        // The attack: SOCKS to sink.test (allowed), TLS naming api.test (granted for some
        // requests only, so never carried opaquely).
        let (code, tcp) = socks_connect(&h, b"sink.test", port).await;
        assert_eq!(code, 0);
        hello_for("api.test", tcp).await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(
            got.lock().unwrap().is_empty(),
            "a hello naming another host reached the upstream"
        );
        assert!(
            recorded(&h)
                .iter()
                .any(|e| e.host == "sink.test" && e.reason == Reason::InvalidTarget),
            "the refusal is not recorded"
        );
        // The twin: the hello naming the host asked for is carried.
        let (code, tcp) = socks_connect(&h, b"sink.test", port).await;
        assert_eq!(code, 0);
        hello_for("sink.test", tcp).await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let sent = got.lock().unwrap().clone();
        assert_eq!(
            sent.first(),
            Some(&0x16),
            "the hello did not arrive: {sent:?}"
        );
        // And a server that speaks first is heard before the client says a byte.
        let banner = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let banner_port = banner.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = banner.accept().await.unwrap();
            s.write_all(b"220 ready\r\n").await.unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest).await;
        });
        let (code, mut s) = socks_connect(&h, b"sink.test", banner_port).await;
        assert_eq!(code, 0);
        let heard = read_until(&mut s, "\r\n").await;
        assert_eq!(heard, "220 ready\r\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clienthello_cut_short_is_never_forwarded() {
    let h = harness(false).await;
    // A raw listener that counts every connection it is given (sink.test maps onto
    // 127.0.0.1; the CONNECT names this listener's port).
    let raw = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let raw_port = raw.local_addr().unwrap().port();
    let accepted = Arc::new(Mutex::new(0u32));
    let counter = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((_s, _)) = raw.accept().await {
            *counter.lock().unwrap() += 1;
        }
    });
    // A TLS record header announcing a 512-byte handshake, then a few bytes, then EOF.
    let mut s = TcpStream::connect(h.proxy).await.unwrap();
    s.write_all(
        format!("CONNECT sink.test:{raw_port} HTTP/1.1\r\nHost: sink.test\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = [0u8; 39];
    s.read_exact(&mut answer).await.unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    s.write_all(&[
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ])
    .await
    .unwrap();
    s.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        *accepted.lock().unwrap(),
        0,
        "the cut-short hello reached the upstream"
    );
    // The twin: a client-first protocol that is not TLS is tunnelled.
    let mut s = TcpStream::connect(h.proxy).await.unwrap();
    s.write_all(
        format!("CONNECT sink.test:{raw_port} HTTP/1.1\r\nHost: sink.test\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    s.read_exact(&mut answer).await.unwrap();
    s.write_all(b"PING\r\n").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(*accepted.lock().unwrap(), 1);
}

/// curl over HTTP/2 where it can: returns (exit code, output ending in
/// `<http code> <http version>`).
async fn curl_h2(h: &Harness, args: &[&str]) -> (i32, String) {
    let mut all = vec!["--http2", "-w", "\n%{http_code} %{http_version}\n"];
    all.extend_from_slice(args);
    curl(h, &all).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_is_spoken_where_the_client_offers_it_and_the_upstream_chooses_it() {
    // With a credential every TLS host is intercepted, so both cases below are inspected.
    let h = harness(true).await;
    let (code, out) = curl_h2(&h, &[&url(&h, "https", "h2open.test", "/x")]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("hello from h2open.test") && out.ends_with("\n200 2\n"),
        "{out}"
    );
    let seen = h.seen["h2open.test"].lock().unwrap().requests.clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].starts_with("GET /x HTTP/2"), "{seen:?}");
    // The twin: an upstream that speaks only HTTP/1.1 keeps the client on HTTP/1.1 too,
    // nothing is translated between versions.
    let (code, out) = curl_h2(&h, &[&url(&h, "https", "secure.test", "/x")]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("hello from secure.test") && out.ends_with("\n200 1.1\n"),
        "{out}"
    );
    let seen = h.seen["secure.test"].lock().unwrap().requests.clone();
    assert!(
        seen.len() == 1 && seen[0].starts_with("GET /x HTTP/1.1"),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_rules_are_judged_per_http2_stream() {
    let h = harness(false).await;
    // Three streams on one connection: one allowed, two refused with the reason.
    let (code, out) = curl_h2(
        &h,
        &[
            "-i",
            &url(&h, "https", "h2.test", "/repos/x"),
            &url(&h, "https", "h2.test", "/user"),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hello from h2.test\n\n200 2\n"), "{out}");
    assert!(
        out.contains("HTTP/2 403") && out.contains("x-capgate-reason: http_not_allowed"),
        "{out}"
    );
    assert!(out.contains("capgate refused GET h2.test/user"), "{out}");
    let (_, out) = curl_h2(
        &h,
        &[
            "-i",
            "-X",
            "POST",
            "-d",
            "x=1",
            &url(&h, "https", "h2.test", "/repos/x"),
        ],
    )
    .await;
    assert!(
        out.contains("HTTP/2 403") && out.ends_with("\n403 2\n"),
        "{out}"
    );
    // `//repos/user/keys` is judged as `/repos/user/keys` but routed as `/user/keys` by
    // WHATWG URL parsers: a :path without a single reading is refused, as HTTP/1.1's is.
    let (_, out) = curl_h2(
        &h,
        &[
            "-i",
            "--path-as-is",
            &url(&h, "https", "h2.test", "//repos/user/keys"),
        ],
    )
    .await;
    assert!(
        out.contains("HTTP/2 400") && out.contains("x-capgate-reason: malformed_request"),
        "{out}"
    );
    let seen = h.seen["h2.test"].lock().unwrap().requests.clone();
    assert_eq!(
        seen.len(),
        1,
        "only the allowed stream reached the upstream: {seen:?}"
    );
    assert!(seen[0].starts_with("GET /repos/x HTTP/2"), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_for_another_host_is_refused() {
    // With a credential every TLS host is intercepted.
    let h = harness(true).await;
    // curl sends a Host header as the stream's :authority: a request for another host
    // inside the h2open.test tunnel. The twin without it passes.
    let other = format!("Host: other.test:{}", h.ports["other.test"]);
    let (_, out) = curl_h2(
        &h,
        &["-i", "-H", &other, &url(&h, "https", "h2open.test", "/x")],
    )
    .await;
    assert!(
        out.contains("HTTP/2 400") && out.contains("x-capgate-reason: malformed_request"),
        "{out}"
    );
    assert!(h.seen["other.test"].lock().unwrap().requests.is_empty());
    assert!(h.seen["h2open.test"].lock().unwrap().requests.is_empty());
    let (code, out) = curl_h2(&h, &[&url(&h, "https", "h2open.test", "/x")]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.ends_with("\n200 2\n"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_the_sentinel_is_swapped_only_on_the_inject_domain() {
    let h = harness(true).await;
    let auth = format!("Authorization: Bearer {SENTINEL}");
    let (code, out) = curl_h2(&h, &["-H", &auth, &url(&h, "https", "h2.test", "/repos/x")]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.ends_with("\n200 2\n"), "{out}");
    let seen = h.seen["h2.test"].lock().unwrap().requests.clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].contains("\r\nauthorization: Bearer ghp_the_real_secret"),
        "{seen:?}"
    );
    assert!(!seen[0].contains(SENTINEL), "{seen:?}");

    // The same header to a host without the credential: refused, and that upstream sees
    // nothing. A sentinel in the query string is refused too.
    let (_, out) = curl_h2(
        &h,
        &["-i", "-H", &auth, &url(&h, "https", "h2open.test", "/x")],
    )
    .await;
    assert!(
        out.contains("HTTP/2 403") && out.contains("x-capgate-reason: credential_exfiltration"),
        "{out}"
    );
    let query = format!("/x?token={SENTINEL}");
    let (_, out) = curl_h2(&h, &["-i", &url(&h, "https", "h2open.test", &query)]).await;
    assert!(out.contains("credential_exfiltration"), "{out}");
    assert!(h.seen["h2open.test"].lock().unwrap().requests.is_empty());
    assert!(!out.contains("ghp_the_real_secret"));
}

/// An inject domain that echoes its request (here `/echo`) would hand the real secret to
/// the workload, which is only ever meant to hold the sentinel: the response to a request
/// that carried a secret is masked in its reason phrase, headers and body (with a length
/// and chunked, over HTTP/1.1 and HTTP/2), each secret overwritten by a marker of its
/// length so the framing holds. Twins: the upstream did get the secret (and was asked for
/// an uncompressed answer), and the same echo where nothing is injected is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_the_inject_domain_echoes_reaches_the_workload_masked() {
    let h = harness(true).await;
    let auth = format!("Authorization: Bearer {SENTINEL}");
    let masked = "Bearer [capgate:masked]***";
    for path in ["/repos/echo", "/repos/echo-chunked"] {
        let (code, out) = curl(
            &h,
            &[
                "-i",
                "--compressed",
                "-H",
                &auth,
                &url(&h, "https", "api.test", path),
            ],
        )
        .await;
        assert_eq!(code, 0, "{path}: {out}");
        assert!(!out.contains("ghp_the_real_secret"), "{path}: {out}");
        assert!(out.contains(&format!("\r\nX-Echo: {masked}\r\n")), "{out}");
        assert!(
            out.contains(&format!("\r\nAuthorization: {masked}\r\n")),
            "the echoed head, masked: {out}"
        );
        if path.ends_with("/echo") {
            assert!(
                out.contains(&format!("\nHTTP/1.1 200 Echo {masked}\r\n")),
                "{out}"
            );
        }
        let seen = h.seen["api.test"].lock().unwrap().requests.clone();
        let last = seen.last().unwrap();
        assert!(
            last.contains("Authorization: Bearer ghp_the_real_secret")
                && last.contains("\r\nAccept-Encoding: identity")
                && !last.contains("gzip"),
            "{last}"
        );
    }
    // Over HTTP/2.
    let (code, out) = curl_h2(
        &h,
        &[
            "-i",
            "-H",
            &auth,
            &url(&h, "https", "h2.test", "/repos/echo"),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.ends_with("\n200 2\n"), "{out}");
    assert!(!out.contains("ghp_the_real_secret"), "{out}");
    assert!(
        out.contains(&format!("x-echo: {masked}\r\n"))
            && out.contains(&format!("\r\nauthorization: {masked}\r\n")),
        "{out}"
    );
    assert!(
        h.seen["h2.test"].lock().unwrap().requests[0]
            .contains("authorization: Bearer ghp_the_real_secret")
    );
    // The twins: nothing injected on secure.test, so its echo comes back as it was sent,
    // compression asked for included; and an answer without the secret is untouched.
    let (code, out) = curl(
        &h,
        &[
            "-i",
            "--compressed",
            &url(&h, "https", "secure.test", "/echo"),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("gzip") && !out.contains("capgate:masked"),
        "{out}"
    );
    let (code, out) = curl(&h, &[&url(&h, "https", "api.test", "/repos/x")]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("hello from api.test\n"), "{out}");
}

/// A WebSocket whose upgrade request carried a secret is masked too: the upstream's first
/// frame quotes the Authorization it got. The twin: the echo of the client's own frame
/// after it comes back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_upgraded_with_a_secret_gets_its_frames_masked() {
    let h = harness(true).await;
    let (host, port) = ("api.test", h.ports["api.test"]);
    let mut ws = tls_through(&h, host, &[]).await;
    let request = format!(
        "GET /repos/ws-auth HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {SENTINEL}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n"
    );
    ws.write_all(request.as_bytes()).await.unwrap();
    let head = read_until_tls(&mut ws, "\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | 5];
    frame.extend_from_slice(&mask);
    frame.extend(b"hello".iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    ws.write_all(&frame).await.unwrap();
    let mut got = Vec::new();
    let expected_frame = b"\x81\x1aBearer [capgate:masked]***";
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !got.ends_with(expected_frame) && !got.ends_with(b"ghp_the_real_secret") {
        let mut byte = [0u8; 1];
        match tokio::time::timeout_at(deadline, ws.read(&mut byte)).await {
            Ok(Ok(1)) => got.push(byte[0]),
            _ => break,
        }
    }
    assert_eq!(got, expected_frame, "{}", String::from_utf8_lossy(&got));
    let mut echo = [0u8; 7];
    tokio::time::timeout(std::time::Duration::from_secs(5), ws.read_exact(&mut echo))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echo, b"\x81\x05hello");
    let seen = h.seen[host].lock().unwrap().requests[0].clone();
    // Compressed frames could not be read: the extension offer is withheld.
    assert!(
        seen.contains("Authorization: Bearer ghp_the_real_secret")
            && !seen
                .to_ascii_lowercase()
                .contains("sec-websocket-extensions"),
        "{seen}"
    );

    // A secret cut across two frames of one message: the message is framed anew, masked.
    let mut ws = tls_through(&h, host, &[]).await;
    let request = format!(
        "GET /repos/ws-split HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {SENTINEL}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    ws.write_all(request.as_bytes()).await.unwrap();
    assert!(
        read_until_tls(&mut ws, "\r\n\r\n")
            .await
            .starts_with("HTTP/1.1 101")
    );
    ws.write_all(&frame).await.unwrap();
    let expected = b"\x01\x07Bearer \x80\x13[capgate:masked]***\x81\x05hello";
    let mut got = vec![0u8; expected.len()];
    tokio::time::timeout(std::time::Duration::from_secs(5), ws.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, expected, "{}", String::from_utf8_lossy(&got));
}

/// A client that does not trust capgate's CA ends the handshake with an alert; that is
/// recorded as `ca_not_trusted`, or its failure would have nothing to explain it. The
/// twin: the same request from a client that trusts the CA passes, recording no such thing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_trust_the_ca_is_recorded_as_such() {
    let h = harness(false).await;
    let target = url(&h, "https", "api.test", "/repos/x");
    let mut untrusting = Command::new("curl");
    untrusting
        .args([
            "-sS",
            "--max-time",
            "10",
            "-x",
            &format!("http://{}", h.proxy),
        ])
        .arg(&target);
    let (code, out) = output(untrusting).await;
    assert_ne!(code, 0, "{out}");
    let distrust = |h: &Harness| {
        recorded(h)
            .into_iter()
            .filter(|e| e.reason == Reason::CaNotTrusted)
            .collect::<Vec<_>>()
    };
    // curl may exit before the gateway has read its alert: wait for the record (bounded).
    recorded_once(&h, |e| e.iter().any(|e| e.reason == Reason::CaNotTrusted)).await;
    let events = distrust(&h);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (events[0].host.as_str(), events[0].port),
        ("api.test", h.ports["api.test"])
    );
    let (code, out) = curl(&h, &[&target]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(distrust(&h).len(), 1);
}

/// An answer to a request that carried a secret must be readable to be masked: one the
/// upstream compressed anyway is refused (502), over HTTP/1.1 and HTTP/2. The twins: the
/// same answers where nothing is injected pass as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_answer_to_a_secret_is_refused_not_relayed_unread() {
    let h = harness(true).await;
    for (host, path, twin, h2) in [
        ("api.test", "/repos/gzip", "secure.test", false),
        ("h2.test", "/repos/gzip", "h2open.test", true),
    ] {
        let fetch = |host: &'static str, path: &'static str| {
            let target = url(&h, "https", host, path);
            let h = &h;
            async move {
                if h2 {
                    curl_h2(h, &["-i", &target]).await
                } else {
                    curl(h, &["-i", &target]).await
                }
            }
        };
        let (_, out) = fetch(host, path).await;
        assert!(
            out.contains(" 502")
                && out
                    .to_ascii_lowercase()
                    .contains("it is encoded (`content-encoding: gzip`)"),
            "{out}"
        );
        assert!(
            !out.contains("zzzz") && !out.contains("hello from"),
            "{out}"
        );
        // The refusal quotes the encoding masked: it could hold the secret.
        let (_, out) = fetch(host, "/repos/ce-echo").await;
        assert!(
            out.contains(" 502") && out.contains("x-Bearer [capgate:masked]"),
            "{out}"
        );
        assert!(!out.contains("ghp_the_real_secret"), "{out}");
        let (code, out) = fetch(twin, "/gzip").await;
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains(" 200") && out.to_ascii_lowercase().contains("content-encoding: gzip"),
            "{out}"
        );
    }
}

/// A WebSocket frame no server may send ends the connection, but the frames read whole
/// before it still reach the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_websocket_frame_ends_the_relay_after_what_came_before() {
    let h = harness(true).await;
    let (host, port) = ("api.test", h.ports["api.test"]);
    let mut ws = tls_through(&h, host, &[]).await;
    let request = format!(
        "GET /repos/ws-bad HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    ws.write_all(request.as_bytes()).await.unwrap();
    assert!(
        read_until_tls(&mut ws, "\r\n\r\n")
            .await
            .starts_with("HTTP/1.1 101")
    );
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | 2];
    frame.extend_from_slice(&mask);
    frame.extend(b"hi".iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    ws.write_all(&frame).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), ws.read_to_end(&mut got)).await;
    assert!(got.starts_with(b"\x81\x03bye"), "{got:?}");
    assert!(!got.windows(2).any(|w| w == b"\x83\x00"), "{got:?}");
}

/// An answer capgate cannot parse is refused with the parser's reason, which may quote the
/// answer (here a header named after the secret): masked too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unparsable_answer_is_refused_without_quoting_the_secret() {
    let h = harness(true).await;
    let (_, out) = curl(
        &h,
        &["-i", &url(&h, "https", "api.test", "/repos/bad-header")],
    )
    .await;
    assert!(
        out.contains(" 502")
            && out.contains("invalid character in `[capgate:masked]***` header value"),
        "{out}"
    );
    assert!(!out.contains("ghp_the_real_secret"), "{out}");
}

/// A 1xx interim answer's reason phrase is masked like the final answer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interim_answer_is_masked_too() {
    let h = harness(true).await;
    let (host, port) = ("api.test", h.ports["api.test"]);
    let mut tls = tls_through(&h, host, &[]).await;
    let request = format!(
        "GET /repos/interim HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {SENTINEL}\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let got = read_until_tls(&mut tls, "\r\n\r\nok").await;
    assert!(
        got.starts_with("HTTP/1.1 103 Bearer [capgate:masked]***\r\n") && got.ends_with("ok"),
        "{got}"
    );
    assert!(!got.contains("ghp_the_real_secret"));
}

/// A stream that pauses right after a byte that could begin the secret (`g` of `ghp_…`)
/// gets that byte after a quiet spell, over HTTP/1.1 and HTTP/2: a turn-taking protocol
/// does not wait forever for its message's last byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_after_what_could_begin_a_secret_does_not_hold_the_stream() {
    let h = harness(true).await;
    let (host, port) = ("api.test", h.ports["api.test"]);
    let mut tls = tls_through(&h, host, &[]).await;
    let request = format!("GET /repos/pause HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let got = read_until_tls(&mut tls, "\r\n1\r\ng\r\n").await;
    assert!(got.ends_with("\r\n7\r\nstatus \r\n1\r\ng\r\n"), "{got}");

    let mut sender = h2_client(&h, "h2.test").await;
    let request = http::Request::builder()
        .uri(format!(
            "https://h2.test:{}/repos/pause",
            h.ports["h2.test"]
        ))
        .body(())
        .unwrap();
    let (response, _) = sender.send_request(request, true).unwrap();
    let mut body = response.await.unwrap().into_body();
    let mut got = Vec::new();
    while !got.ends_with(b"status g") {
        match tokio::time::timeout(std::time::Duration::from_secs(5), body.data()).await {
            Ok(Some(Ok(chunk))) => {
                let _ = body.flow_control().release_capacity(chunk.len());
                got.extend_from_slice(&chunk);
            }
            other => panic!(
                "{:?} after {:?}",
                other.map(|o| o.is_some()),
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_http2_bodies_arrive_whole_both_ways() {
    // With a credential every TLS host is intercepted.
    let h = harness(true).await;
    let len = 3 * 1024 * 1024 + 17;
    let upload = h._dir.path().join("upload");
    std::fs::write(&upload, big_body(2 * 1024 * 1024 + 5)).unwrap();
    let data = format!("@{}", upload.display());
    let (code, out) = curl_h2(
        &h,
        &[
            &url(&h, "https", "h2open.test", &format!("/big/{len}")),
            "--data-binary",
            &data,
            &url(&h, "https", "h2open.test", "/after"),
        ],
    )
    .await;
    assert_eq!(code, 0, "{}", &out[out.len().saturating_sub(300)..]);
    let body = big_body(len);
    assert!(out.starts_with(&body), "the large body differs");
    assert!(
        out.ends_with("hello from h2open.test\n\n200 2\n"),
        "{}",
        &out[body.len()..]
    );
    let seen = h.seen["h2open.test"].lock().unwrap().requests.clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen[1].starts_with("POST /after HTTP/2") && seen[1].ends_with("(body 2097157 bytes)"),
        "{seen:?}"
    );
}

/// Limits short enough to hit in a test.
fn short_limits() -> Limits {
    Limits {
        head_timeout: std::time::Duration::from_secs(1),
        idle_timeout: std::time::Duration::from_secs(1),
        max_connections: 3,
        ..Limits::default()
    }
}

/// The audit events recorded so far.
fn recorded(h: &Harness) -> Vec<AuditEvent> {
    h.audit.flush().unwrap();
    let store = Store::open(&h.store).unwrap();
    capgate_policy::audit::events(&store, &LogQuery::default()).unwrap()
}

/// The audit events once `done` holds of them, polled for at most 10 s: for events the
/// gateway can record only after the client has seen the end of the exchange (h2 closes a
/// connection for a protocol error before capgate hears of it; an alert is read after the
/// client gave up). The caller asserts on what it gets.
async fn recorded_once(h: &Harness, done: impl Fn(&[AuditEvent]) -> bool) -> Vec<AuditEvent> {
    let mut events = recorded(h);
    for _ in 0..200 {
        if done(&events) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        events = recorded(h);
    }
    events
}

/// Sends `bytes` to the proxy on a fresh connection and returns everything it answers
/// until it closes (or 10 s pass).
async fn raw_exchange(h: &Harness, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(h.proxy).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut got))
        .await
        .expect("the gateway closes the connection");
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_stops_arriving_is_answered_408_and_recorded() {
    let h = harness_with(false, false, short_limits()).await;
    let port = h.ports["plain.test"];
    // A head that never ends.
    let partial = format!("GET http://plain.test:{port}/a HTTP/1.1\r\nHost: plain.test:{port}\r\n");
    let out = raw_exchange(&h, partial.as_bytes()).await;
    assert!(
        out.starts_with("HTTP/1.1 408") && out.contains("X-Capgate-Reason: limit_exceeded"),
        "{out}"
    );
    // A body that stops after 10 of its 100 bytes: 408, and the upstream connection is
    // dropped (it would otherwise wait for 90 bytes forever).
    let stalled = format!(
        "POST http://plain.test:{port}/upload HTTP/1.1\r\nHost: plain.test:{port}\r\nContent-Length: 100\r\n\r\n0123456789"
    );
    let out = raw_exchange(&h, stalled.as_bytes()).await;
    assert!(
        out.starts_with("HTTP/1.1 408")
            && out.contains("X-Capgate-Reason: limit_exceeded")
            && out.contains("the request body stopped arriving"),
        "{out}"
    );
    // The twin: the whole body, in time.
    let whole = format!(
        "POST http://plain.test:{port}/upload HTTP/1.1\r\nHost: plain.test:{port}\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789"
    );
    let out = raw_exchange(&h, whole.as_bytes()).await;
    assert!(
        out.starts_with("HTTP/1.1 200") && out.contains("hello from plain.test"),
        "{out}"
    );

    let events = recorded(&h);
    let limits: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.reason == Reason::LimitExceeded)
        .collect();
    assert_eq!(limits.len(), 2, "{events:?}");
    assert!(
        limits
            .iter()
            .any(|e| e.method.as_deref() == Some("POST") && e.path.as_deref() == Some("/upload")),
        "{limits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_body_that_stalls_ends_the_exchange_and_is_recorded() {
    let h = harness_with(false, false, short_limits()).await;
    // 100 bytes announced (copied through user space) and 1 MB announced (spliced): 10
    // arrive, then nothing. The client sees the connection close short of the body.
    for n in [100, 1_000_000] {
        let (code, out) = curl(
            &h,
            &[&url(&h, "http", "plain.test", &format!("/stall/{n}"))],
        )
        .await;
        assert_eq!(
            code, 18,
            "curl: transfer closed with outstanding read data: {out}"
        );
        assert!(out.starts_with("0123456789"), "{out}");
    }
    let (code, out) = curl(&h, &[&url(&h, "http", "plain.test", "/x")]).await;
    assert_eq!(code, 0, "{out}");
    let events = recorded(&h);
    let stalls = events
        .iter()
        .filter(|e| {
            e.reason == Reason::LimitExceeded
                && e.path.as_deref().is_some_and(|p| p.starts_with("/stall/"))
        })
        .count();
    assert_eq!(stalls, 2, "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_sandbox_limit_get_503() {
    let h = harness_with(
        false,
        false,
        Limits {
            max_connections: 2,
            ..Limits::default()
        },
    )
    .await;
    let first = TcpStream::connect(h.proxy).await.unwrap();
    let _second = TcpStream::connect(h.proxy).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let out = raw_exchange(&h, b"").await;
    assert!(
        out.starts_with("HTTP/1.1 503") && out.contains("X-Capgate-Reason: limit_exceeded"),
        "{out}"
    );
    // The twin: once a connection closes, a new one is served.
    drop(first);
    let port = h.ports["plain.test"];
    let request = format!(
        "GET http://plain.test:{port}/x HTTP/1.1\r\nHost: plain.test:{port}\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    for _ in 0..50 {
        out = raw_exchange(&h, request.as_bytes()).await;
        if out.starts_with("HTTP/1.1 200") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        recorded(&h)
            .iter()
            .any(|e| e.reason == Reason::LimitExceeded)
    );
}

/// A WebSocket handshake for `/ws` (RFC 6455's example key) through the proxy in absolute
/// form; returns the connection and the response head.
async fn websocket_handshake(h: &Harness, host: &str, port: u16) -> (TcpStream, String) {
    let mut s = TcpStream::connect(h.proxy).await.unwrap();
    let request = format!(
        "GET http://{host}:{port}/ws HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let head = read_until(&mut s, "\r\n\r\n").await;
    (s, head)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrades_are_judged_then_relayed() {
    let h = harness(false).await;
    let (mut ws, head) = websocket_handshake(&h, "plain.test", h.ports["plain.test"]).await;
    assert!(
        head.starts_with("HTTP/1.1 101")
            && head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
            && head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{head}"
    );
    // A masked text frame "hello" goes up; the echo comes back.
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | 5];
    frame.extend_from_slice(&mask);
    frame.extend(b"hello".iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    ws.write_all(&frame).await.unwrap();
    let mut echo = [0u8; 7];
    tokio::time::timeout(std::time::Duration::from_secs(5), ws.read_exact(&mut echo))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echo, b"\x81\x05hello");
    let seen = h.seen["plain.test"].lock().unwrap().requests.clone();
    assert!(
        seen[0].starts_with("GET /ws HTTP/1.1") && seen[0].contains("Upgrade: websocket"),
        "{seen:?}"
    );
    // The twin refused: the upgrade request is judged like any other.
    let (_, head) = websocket_handshake(&h, "unlisted.test", 80).await;
    assert!(
        head.starts_with("HTTP/1.1 403") && head.contains("X-Capgate-Reason: no_matching_allow"),
        "{head}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_other_protocol_switch_passes() {
    let h = harness(false).await;
    // h2c would carry later requests past the per-request policy: the upgrade is dropped.
    let (code, out) = curl(
        &h,
        &[
            "-H",
            "Connection: Upgrade",
            "-H",
            "Upgrade: h2c",
            &url(&h, "http", "plain.test", "/x"),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hello from plain.test"), "{out}");
    let seen = h.seen["plain.test"].lock().unwrap().requests.clone();
    assert!(
        !seen[0].to_ascii_lowercase().contains("upgrade"),
        "{seen:?}"
    );
    // An upstream that switches protocols unasked is not relayed.
    let (_, out) = curl(&h, &["-i", &url(&h, "http", "plain.test", "/switch")]).await;
    assert!(
        out.starts_with("HTTP/1.1 502") && out.contains("X-Capgate-Reason: invalid_target"),
        "{out}"
    );
    assert!(!out.contains("PRI * HTTP/2.0"), "{out}");
}

/// A TLS client trusting what curl trusts in these tests, offering `alpn`.
fn client_tls(h: &Harness, alpn: &[&[u8]]) -> rustls::ClientConfig {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(&h.ca_pem).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// TLS to `host` (offering `alpn`) in a CONNECT tunnel through the proxy, trusting the
/// harness's bundle.
async fn tls_through(
    h: &Harness,
    host: &str,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = connect_through(h, host).await;
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(client_tls(h, alpn)))
        .connect(name, tcp)
        .await
        .unwrap()
}

/// An HTTP/2 client (the h2 crate, as hyper uses it) through the proxy: CONNECT, TLS
/// trusting the harness's bundle with ALPN `h2`, then the HTTP/2 handshake. For what curl
/// cannot do: curl reads an upload's stdin blocking, so it never sees an early answer.
async fn h2_client(h: &Harness, host: &str) -> h2::client::SendRequest<bytes::Bytes> {
    let tls = tls_through(h, host, &[b"h2"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (sender, connection) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_upload_that_stops_is_answered_408_and_recorded() {
    // With a credential every TLS host is intercepted; h2open.test speaks HTTP/2.
    let h = harness_with(true, false, short_limits()).await;
    let sender = h2_client(&h, "h2open.test").await;
    let request = http::Request::builder()
        .method("PUT")
        .uri(format!(
            "https://h2open.test:{}/upload",
            h.ports["h2open.test"]
        ))
        .header("content-length", "100")
        .body(())
        .unwrap();
    // The headers go out, then not one byte of the 100.
    let (response, _body) = sender
        .ready()
        .await
        .unwrap()
        .send_request(request, false)
        .unwrap();
    let response = tokio::time::timeout(std::time::Duration::from_secs(5), response)
        .await
        .expect("an answer within the idle limit")
        .unwrap();
    assert_eq!(response.status(), 408);
    assert_eq!(response.headers()["x-capgate-reason"], "limit_exceeded");
    let mut body = response.into_body();
    let mut text = Vec::new();
    while let Some(chunk) = body.data().await {
        text.extend_from_slice(&chunk.unwrap());
    }
    assert!(String::from_utf8_lossy(&text).contains("request body stopped arriving"));
    let events = recorded(&h);
    assert!(
        events.iter().any(|e| e.reason == Reason::LimitExceeded
            && e.method.as_deref() == Some("PUT")
            && e.path.as_deref() == Some("/upload")),
        "{events:?}"
    );
    // The upstream saw the stream start and end without its body.
    let seen = h.seen["h2open.test"].lock().unwrap().requests.clone();
    assert!(
        seen.iter().all(|r| !r.contains("(body 100 bytes)")),
        "{seen:?}"
    );
}

/// An HTTP/2 client that breaks the protocol (a DATA frame on stream 0) is sent GOAWAY by
/// h2, and capgate records it; a client that merely closes its connection is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_closed_for_a_protocol_error_is_recorded() {
    let h = harness(true).await;
    let refused = |events: &[AuditEvent]| {
        events
            .iter()
            .filter(|e| e.host == "h2open.test" && e.reason == Reason::MalformedRequest)
            .count()
    };
    for broken in [false, true] {
        let tcp = connect_through(&h, "h2open.test").await;
        let name = rustls::pki_types::ServerName::try_from("h2open.test").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client_tls(&h, &[b"h2"])))
            .connect(name, tcp)
            .await
            .unwrap();
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        if broken {
            bytes.extend_from_slice(&[0, 0, 1, 0, 0, 0, 0, 0, 0, b'x']);
        }
        tls.write_all(&bytes).await.unwrap();
        if !broken {
            tls.shutdown().await.unwrap();
        }
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tls.read_to_end(&mut rest),
        )
        .await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let events = recorded_once(&h, |e| refused(e) >= usize::from(broken)).await;
        assert_eq!(refused(&events), usize::from(broken), "{events:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_the_client_resets_stop_at_once() {
    // Default limits: a stalled stream would wait 120 s. 64 streams (the most one
    // connection may run) start uploads and stop; the client resets them all. Their
    // tasks must end at once, or the next 64 streams would be refused for lack of room.
    let h = harness(true).await;
    let sender = h2_client(&h, "h2open.test").await;
    let port = h.ports["h2open.test"];
    let mut stalled = Vec::new();
    for i in 0..64 {
        let request = http::Request::builder()
            .method("PUT")
            .uri(format!("https://h2open.test:{port}/slow/{i}"))
            .body(())
            .unwrap();
        let mut ready = sender.clone().ready().await.unwrap();
        stalled.push(ready.send_request(request, false).unwrap());
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for (_, send) in &mut stalled {
        send.send_reset(h2::Reason::CANCEL);
    }
    drop(stalled);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut answers = Vec::new();
    for i in 0..64 {
        let request = http::Request::builder()
            .uri(format!("https://h2open.test:{port}/after/{i}"))
            .body(())
            .unwrap();
        let mut ready = sender.clone().ready().await.unwrap();
        answers.push(ready.send_request(request, true).unwrap().0);
    }
    for answer in answers {
        let response = tokio::time::timeout(std::time::Duration::from_secs(10), answer)
            .await
            .expect("answered")
            .expect("not refused");
        assert_eq!(response.status(), 200);
    }
}

/// An opaque tunnel to `host` through the proxy, checked with one request through it.
async fn open_tunnel(h: &Harness, host: &str) -> TcpStream {
    let mut s = connect_through(h, host).await;
    assert!(
        tunnel_request(&mut s, host)
            .await
            .contains(&format!("hello from {host}"))
    );
    s
}

/// A CONNECT to `host` through the proxy, answered 200.
async fn connect_through(h: &Harness, host: &str) -> TcpStream {
    let port = h.ports[host];
    let mut s = TcpStream::connect(h.proxy).await.unwrap();
    s.write_all(
        format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let answer = read_until(&mut s, "\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    s
}

/// One request through an open tunnel; the response up to its body's newline.
async fn tunnel_request(s: &mut TcpStream, host: &str) -> String {
    s.write_all(format!("GET /t HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_until(s, &format!("hello from {host}\n")).await
}

/// Reads until `end` (or the end of the stream, or 5 s).
async fn read_until(s: &mut TcpStream, end: &str) -> String {
    read_until_tls(s, end).await
}

/// [`read_until`] for any stream.
async fn read_until_tls<S: tokio::io::AsyncRead + Unpin>(s: &mut S, end: &str) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !got.ends_with(end.as_bytes()) {
        match tokio::time::timeout_at(deadline, s.read(&mut byte)).await {
            Ok(Ok(1)) => got.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_granted_for_install_only_close_when_the_runtime_phase_begins() {
    let h = harness(false).await;
    h.gw.phase().set(Phase::Install);
    let mut install_only = open_tunnel(&h, "install.test").await;
    let mut every_phase = open_tunnel(&h, "plain.test").await;
    h.gw.phase().set(Phase::Runtime);
    // The install-only tunnel is closed (its process could otherwise carry install grants
    // into the workload's phase); the other one still carries requests.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        install_only.read_to_end(&mut rest),
    )
    .await;
    assert!(matches!(closed, Ok(Ok(0))), "{closed:?} {rest:?}");
    assert!(
        tunnel_request(&mut every_phase, "plain.test")
            .await
            .contains("hello from plain.test")
    );
    // A new tunnel to the install-only host is refused now.
    let port = h.ports["install.test"];
    let out = raw_exchange(
        &h,
        format!("CONNECT install.test:{port} HTTP/1.1\r\nHost: install.test:{port}\r\n\r\n")
            .as_bytes(),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    let events = recorded(&h);
    assert!(
        // The cut tunnel (it had carried bytes), not only the refused CONNECT.
        events.iter().any(|e| e.host == "install.test"
            && e.decision == Decision::Deny
            && e.reason == Reason::NoMatchingAllow
            && e.phase == Some(Phase::Runtime)
            && e.bytes_up > 0),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disguised_sentinel_is_refused_too() {
    let h = harness(true).await;
    let encoded: String = SENTINEL.bytes().map(|b| format!("%{b:02X}")).collect();
    let plain = url(&h, "https", "other.test", "/x");
    let header = format!("X-{SENTINEL}: 1");
    let query = url(&h, "https", "other.test", &format!("/x?t={encoded}"));
    for (what, args) in [
        ("as the method", vec!["-X", SENTINEL, plain.as_str()]),
        ("percent-encoded in the query", vec![query.as_str()]),
        (
            "in a header name",
            vec!["-H", header.as_str(), plain.as_str()],
        ),
    ] {
        let mut all = vec!["-i"];
        all.extend(args);
        let (_, out) = curl(&h, &all).await;
        assert!(
            out.contains("403") && out.contains("credential_exfiltration"),
            "{what}: {out}"
        );
    }
    assert!(h.seen["other.test"].lock().unwrap().requests.is_empty());
    // The twin: the same request without the sentinel passes.
    let (code, out) = curl(&h, &[&url(&h, "https", "other.test", "/x?t=plain")]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hello from other.test"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_request_body_is_a_400_and_recorded() {
    let h = harness(false).await;
    let port = h.ports["plain.test"];
    let bad = format!(
        "POST http://plain.test:{port}/up HTTP/1.1\r\nHost: plain.test:{port}\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nxx\r\n0\r\n\r\n"
    );
    let out = raw_exchange(&h, bad.as_bytes()).await;
    assert!(
        out.starts_with("HTTP/1.1 400") && out.contains("X-Capgate-Reason: malformed_request"),
        "{out}"
    );
    // The twin: a well-formed chunked body passes.
    let good = format!(
        "POST http://plain.test:{port}/up HTTP/1.1\r\nHost: plain.test:{port}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\nxx\r\n0\r\n\r\n"
    );
    let out = raw_exchange(&h, good.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let events = recorded(&h);
    assert!(
        events.iter().any(|e| e.reason == Reason::MalformedRequest
            && e.method.as_deref() == Some("POST")
            && e.path.as_deref() == Some("/up")),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_in_a_host_name_is_refused_even_under_a_wildcard_grant() {
    // `**` allows every host: a sentinel as a subdomain would leave through DNS, SNI and
    // the upstream's logs without this check.
    let h = harness_with(true, true, Limits::default()).await;
    let leaky = format!("{}.other.test", SENTINEL.to_ascii_uppercase());
    let (_, out) = curl(&h, &["-v", &format!("https://{leaky}/")]).await;
    assert!(
        out.contains("403") && out.contains("credential_exfiltration"),
        "{out}"
    );
    let (_, out) = curl(&h, &["-i", &format!("http://{leaky}/")]).await;
    assert!(
        out.contains("403") && out.contains("credential_exfiltration"),
        "{out}"
    );
    assert!(
        recorded(&h)
            .iter()
            .any(|e| e.reason == Reason::CredentialExfiltration)
    );
    // The twin: the host without it.
    let (code, out) = curl(&h, &[&url(&h, "https", "other.test", "/x")]).await;
    assert_eq!(code, 0, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_says_goaway_sends_the_client_to_a_new_connection() {
    // h2once.test serves one stream per connection. The client's next stream on the same
    // connection must not get a 502 (clients do not retry those): it is refused
    // (REFUSED_STREAM) or the connection is closed with GOAWAY, and a new connection
    // works.
    let h = harness(true).await;
    let port = h.ports["h2once.test"];
    let get = |i: u32| {
        http::Request::builder()
            .uri(format!("https://h2once.test:{port}/n/{i}"))
            .body(())
            .unwrap()
    };
    let sender = h2_client(&h, "h2once.test").await;
    let (first, _) = sender
        .clone()
        .ready()
        .await
        .unwrap()
        .send_request(get(1), true)
        .unwrap();
    assert_eq!(first.await.unwrap().status(), 200);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let second = match sender.clone().ready().await {
        Ok(mut ready) => match ready.send_request(get(2), true) {
            Ok((answer, _)) => tokio::time::timeout(std::time::Duration::from_secs(5), answer)
                .await
                .expect("an answer"),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match second {
        Ok(response) => panic!("a response on the old connection: {}", response.status()),
        Err(e) => assert!(
            e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM),
            "{e:?}"
        ),
    }
    let fresh = h2_client(&h, "h2once.test").await;
    let (answer, _) = fresh
        .ready()
        .await
        .unwrap()
        .send_request(get(3), true)
        .unwrap();
    assert_eq!(answer.await.unwrap().status(), 200);
}

/// A name allowed only on a port of its own (an egress triple `host:18500/tcp`, a
/// `host:PORT` allow) resolves: a client that resolves before it connects must be able to
/// use that grant. (Red-team finding: only names allowed on 443, 80 or 22 resolved, and the
/// lookup was recorded as a refusal.) The twins: the same name without that rule (allowed
/// in the install phase only) and an unlisted name do not resolve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_allowed_only_on_its_own_port_resolves() {
    for own_port in [true, false] {
        let extra = if own_port {
            vec![rule(
                "own-port",
                Decision::Allow,
                &["install.test:18500"],
                None,
                None,
            )]
        } else {
            Vec::new()
        };
        let h = harness_full(false, false, Limits::default(), extra).await;
        let dns = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let dns_addr = dns.local_addr().unwrap();
        let gw = h.gw.clone();
        tokio::spawn(async move { gw.serve_dns(dns).await });
        let expected = if own_port { 0 } else { 3 };
        assert_eq!(dns_rcode(dns_addr, "install.test").await, expected);
        assert_eq!(dns_rcode(dns_addr, "unlisted.test").await, 3);
    }
}

/// A DNS query for `name` (A, recursion desired); returns the response's RCODE.
async fn dns_rcode(server: SocketAddr, name: &str) -> u8 {
    dns_rcode_of(server, name, 1).await
}

/// The answer's code to a query of type `qtype` for `name`.
async fn dns_rcode_of(server: SocketAddr, name: &str, qtype: u8) -> u8 {
    let mut query = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        query.push(u8::try_from(label.len()).unwrap());
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, qtype, 0, 1]);
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(&query, server).await.unwrap();
    let mut reply = [0u8; 512];
    let (n, _) = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        socket.recv_from(&mut reply),
    )
    .await
    .expect("a DNS answer")
    .unwrap();
    assert!(n >= 12 && reply[..2] == [0x12, 0x34]);
    reply[3] & 0x0f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_in_a_dns_question_or_socks_host_is_refused_and_recorded() {
    // `**` allows every host, so only the sentinel check stands in the way.
    let h = harness_with(true, true, Limits::default()).await;
    let dns = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let dns_addr = dns.local_addr().unwrap();
    let gw = h.gw.clone();
    tokio::spawn(async move { gw.serve_dns(dns).await });
    let leaky = format!("{SENTINEL}.other.test");
    assert_eq!(dns_rcode(dns_addr, &leaky).await, 3, "NXDOMAIN");
    // The twin: a name without it is answered.
    assert_eq!(dns_rcode(dns_addr, "other.test").await, 0);
    // A query of another type (TXT) carries the name out as well: refused and recorded
    // too, where its harmless twin is only not implemented (NOTIMP).
    let txt_leak = format!("{SENTINEL}.txt.test");
    assert_eq!(dns_rcode_of(dns_addr, &txt_leak, 16).await, 3, "NXDOMAIN");
    assert_eq!(dns_rcode_of(dns_addr, "txt.test", 16).await, 4, "NOTIMP");
    let (code, out) = curl_socks(&h, &format!("http://{leaky}/")).await;
    assert_ne!(code, 0, "{out}");
    let exfil: Vec<u16> = recorded(&h)
        .iter()
        .filter(|e| e.reason == Reason::CredentialExfiltration)
        .map(|e| e.port)
        .collect();
    assert!(exfil.contains(&53) && exfil.contains(&80), "{exfil:?}");
    assert!(
        recorded(&h)
            .iter()
            .any(|e| e.reason == Reason::CredentialExfiltration && e.host.contains(".txt.test")),
        "the TXT query is not recorded"
    );
}

/// A client offering HTTP/2 makes the gateway dial an intercepted upstream during the
/// handshake; when that dial fails, the first request gets its failure (502, recorded), and
/// the gateway does not dial a second time (the client would wait out two timeouts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_early_dial_is_answered_without_dialling_again() {
    let limits = Limits {
        upstream_timeout: std::time::Duration::from_millis(500),
        ..Limits::default()
    };
    // With a credential every TLS host is intercepted; mute.test never completes TLS.
    let h = harness_with(true, false, limits).await;
    let tcp = connect_through(&h, "mute.test").await;
    let config = client_tls(&h, &[b"h2", b"http/1.1"]);
    let name = rustls::pki_types::ServerName::try_from("mute.test").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    assert_ne!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let port = h.ports["mute.test"];
    tls.write_all(format!("GET /x HTTP/1.1\r\nHost: mute.test:{port}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tls.read_to_end(&mut answer),
    )
    .await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    assert!(answer.contains("the TLS handshake timed out"), "{answer}");
    assert_eq!(
        h.mute_accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the gateway dialled the upstream again"
    );
    let events = recorded(&h);
    assert!(
        events
            .iter()
            .any(|e| e.host == "mute.test" && e.path.as_deref() == Some("/x")),
        "{events:?}"
    );
}

/// `delete` is not `DELETE` to the rules (methods are case-sensitive), but servers that
/// upper-case the method would run it as one: refused as malformed, never forwarded. The
/// twin in upper case is refused by the deny rule itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_method_in_another_letter_case_is_refused() {
    let deny = rule(
        "d1",
        Decision::Deny,
        &["plain.test"],
        Some(vec![Method::Delete]),
        Some(vec!["/admin/**"]),
    );
    let h = harness_full(false, false, Limits::default(), vec![deny]).await;
    let port = h.ports["plain.test"];
    let send = |method: &str| {
        format!(
            "{method} http://plain.test:{port}/admin/users/1 HTTP/1.1\r\nHost: plain.test\r\nConnection: close\r\n\r\n"
        )
    };
    let out = raw_exchange(&h, send("DELETE").as_bytes()).await;
    assert!(
        out.starts_with("HTTP/1.1 403") && out.contains("X-Capgate-Reason: denied_by_rule"),
        "{out}"
    );
    for spelled in ["delete", "Delete", "dElEtE"] {
        let out = raw_exchange(&h, send(spelled).as_bytes()).await;
        assert!(
            out.starts_with("HTTP/1.1 403") && out.contains("X-Capgate-Reason: malformed_request"),
            "{spelled}: {out}"
        );
    }
    // A method-override header naming another method is a second method: refused. One
    // naming the method itself changes nothing.
    let overridden = |named: &str| {
        format!(
            "POST http://plain.test:{port}/admin/users/1 HTTP/1.1\r\nHost: plain.test\r\nX-HTTP-Method-Override: {named}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
    };
    let out = raw_exchange(&h, overridden("DELETE").as_bytes()).await;
    assert!(
        out.starts_with("HTTP/1.1 403") && out.contains("X-Capgate-Reason: malformed_request"),
        "{out}"
    );
    let out = raw_exchange(&h, overridden("POST").as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    // The same in the query (`_method`, which Laravel, Symfony and Express' method-override
    // read), however it is spelled; the twin names the method itself.
    let in_query = |query: &str| {
        format!(
            "POST http://plain.test:{port}/admin/users/1?{query} HTTP/1.1\r\nHost: plain.test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
    };
    for query in [
        "_method=DELETE",
        "a=1&%5Fmethod=delete",
        "_method=POST&_method=DELETE",
        ".method=DELETE",
        "+method=DELETE",
        "%20method=DELETE",
        "_method[]=DELETE",
        "a=1;_method=DELETE",
    ] {
        let out = raw_exchange(&h, in_query(query).as_bytes()).await;
        assert!(
            out.starts_with("HTTP/1.1 403") && out.contains("X-Capgate-Reason: malformed_request"),
            "{query}: {out}"
        );
    }
    let out = raw_exchange(&h, in_query("_method=post&method=DELETE").as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    // An allowed method in upper case still passes; no refused request reached the upstream.
    let out = raw_exchange(&h, send("GET").as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let seen = h.seen["plain.test"].lock().unwrap().requests.clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen[0].starts_with("POST /admin/users/1 "), "{seen:?}");
    assert!(
        seen[1].starts_with("POST /admin/users/1?_method=post&method=DELETE "),
        "{seen:?}"
    );
    assert!(seen[2].starts_with("GET /admin/users/1"), "{seen:?}");
}

/// `;` starts path parameters on Tomcat, Jetty and Spring, which cut them off before
/// resolving dot segments: `/repos/..;/user` is `/user` there. Under bounded rules such a
/// path is refused as ambiguous, and the credential is never written into it; twins: `..`
/// resolves to `/user` and is refused by the rules, `/repos/x` passes with the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_parameters_are_ambiguous_under_bounded_rules() {
    let deny = rule(
        "d2",
        Decision::Deny,
        &["plain.test"],
        Some(vec![Method::Any]),
        Some(vec!["/admin/**"]),
    );
    let h = harness_full(true, false, Limits::default(), vec![deny]).await;
    let (_, out) = curl(
        &h,
        &[
            "-i",
            "--path-as-is",
            &url(&h, "https", "api.test", "/repos/../user"),
        ],
    )
    .await;
    assert!(out.contains("X-Capgate-Reason: http_not_allowed"), "{out}");
    for path in ["/repos/..;/user", "/repos/x;y", "/repos/%3B/x"] {
        let (_, out) = curl(
            &h,
            &["-i", "--path-as-is", &url(&h, "https", "api.test", path)],
        )
        .await;
        assert!(
            out.contains("HTTP/1.1 403") && out.contains("X-Capgate-Reason: ambiguous_path"),
            "{path}: {out}"
        );
    }
    let (_, out) = curl(&h, &["-i", &url(&h, "https", "api.test", "/repos/x")]).await;
    assert!(out.contains("HTTP/1.1 200"), "{out}");
    let seen = h.seen["api.test"].lock().unwrap().requests.clone();
    assert_eq!(seen.len(), 1, "only the plain path arrives: {seen:?}");

    // The same under a bounded deny: `/admin;x/users` is `/admin/users` to those servers.
    let port = h.ports["plain.test"];
    for path in ["/admin/users", "/admin;x/users"] {
        let out = raw_exchange(
            &h,
            format!(
                "GET http://plain.test:{port}{path} HTTP/1.1\r\nHost: plain.test\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 403"), "{path}: {out}");
    }
    assert!(h.seen["plain.test"].lock().unwrap().requests.is_empty());
}

/// A sentinel sent to a host the rules refuse anyway is recorded as the exfiltration
/// attempt it is, not as an ordinary default deny; the twin without one is a default deny.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_sent_to_a_refused_host_is_recorded_as_exfiltration() {
    let h = harness(true).await;
    let send = |query: &str| {
        format!(
            "GET http://unlisted.test/?k={query} HTTP/1.1\r\nHost: unlisted.test\r\nConnection: close\r\n\r\n"
        )
    };
    let out = raw_exchange(&h, send("plain").as_bytes()).await;
    assert!(out.contains("X-Capgate-Reason: no_matching_allow"), "{out}");
    let out = raw_exchange(&h, send(SENTINEL).as_bytes()).await;
    assert!(
        out.contains("X-Capgate-Reason: credential_exfiltration"),
        "{out}"
    );
    let reasons: Vec<Reason> = recorded(&h).into_iter().map(|e| e.reason).collect();
    assert!(
        reasons.contains(&Reason::CredentialExfiltration)
            && reasons.contains(&Reason::NoMatchingAllow),
        "{reasons:?}"
    );
}

/// A raw upstream on loopback that answers nothing and records every byte it receives.
async fn recording_upstream() -> (u16, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = Arc::clone(&got);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let g = Arc::clone(&g);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    g.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
        }
    });
    (port, got)
}

/// Starts a chunked upload to `host`, sends one chunk, runs `change` (a phase switch or a
/// new rule), waits for the gateway's answer on the upload's connection, then tries to send
/// more: returns that answer and what the upstream received.
async fn upload_across(h: &Harness, host: &str, change: impl FnOnce()) -> (String, String) {
    let (port, got) = recording_upstream().await;
    let mut s = TcpStream::connect(h.proxy).await.unwrap();
    s.write_all(
        format!(
            "POST http://{host}:{port}/upload HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    // The first chunk reaches the upstream: the upload is under way.
    for _ in 0..200 {
        if String::from_utf8_lossy(&got.lock().unwrap()).contains("hello") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(String::from_utf8_lossy(&got.lock().unwrap()).contains("hello"));
    change();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.read_to_end(&mut answer),
    )
    .await
    .expect("the gateway ends the upload");
    // Whatever the client sends now goes nowhere.
    let _ = s.write_all(b"12\r\nafter-the-change!\r\n").await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let received = String::from_utf8_lossy(&got.lock().unwrap()).into_owned();
    (String::from_utf8_lossy(&answer).into_owned(), received)
}

/// A request body keeps its request open for as long as the client sends it: like a
/// tunnel, it ends when its grant stops holding. An upload an install hook began to an
/// install-only host is cut at the switch to runtime, and one to a host the user denies
/// mid-way is cut at the new rule; the refusal says why and is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_ends_when_its_grant_stops_holding() {
    let h = harness(false).await;
    h.gw.phase().set(Phase::Install);
    let (answer, received) =
        upload_across(&h, "install.test", || h.gw.phase().set(Phase::Runtime)).await;
    assert!(
        answer.starts_with("HTTP/1.1 403")
            && answer.contains("X-Capgate-Reason: no_matching_allow"),
        "{answer}"
    );
    assert!(
        received.contains("hello") && !received.contains("after-the-change"),
        "{received:?}"
    );

    let mut rules = vec![rule("r1", Decision::Allow, &["plain.test"], None, None)];
    h.policy.replace(Matcher::compile(&rules));
    let (answer, received) = upload_across(&h, "plain.test", || {
        rules.push(rule("r9", Decision::Deny, &["plain.test"], None, None));
        h.policy.replace(Matcher::compile(&rules));
    })
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 403") && answer.contains("X-Capgate-Reason: denied_by_rule"),
        "{answer}"
    );
    assert!(!received.contains("after-the-change"), "{received:?}");
    let reasons: Vec<Reason> = recorded(&h).into_iter().map(|e| e.reason).collect();
    assert!(
        reasons.contains(&Reason::NoMatchingAllow) && reasons.contains(&Reason::DeniedByRule),
        "{reasons:?}"
    );
}

/// The same over HTTP/2: a stream whose upload is under way is reset when the user denies
/// its host, and the upstream gets nothing sent after that; the denial is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_upload_ends_when_its_grant_stops_holding() {
    let h = harness(true).await;
    let sender = h2_client(&h, "h2open.test").await;
    let request = http::Request::builder()
        .method("PUT")
        .uri(format!(
            "https://h2open.test:{}/upload",
            h.ports["h2open.test"]
        ))
        .body(())
        .unwrap();
    let (response, mut body) = sender
        .ready()
        .await
        .unwrap()
        .send_request(request, false)
        .unwrap();
    body.send_data(bytes::Bytes::from_static(b"hello"), false)
        .unwrap();
    // Once the upstream has the stream, the gateway judged it under the old rules.
    for _ in 0..500 {
        if h.seen["h2open.test"].lock().unwrap().streams_begun > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(h.seen["h2open.test"].lock().unwrap().streams_begun, 1);
    h.policy.replace(Matcher::compile(&[
        rule("r1", Decision::Allow, &["h2open.test"], None, None),
        rule("r9", Decision::Deny, &["h2open.test"], None, None),
    ]));
    let answer = tokio::time::timeout(std::time::Duration::from_secs(10), response)
        .await
        .expect("the gateway ends the stream");
    assert!(answer.is_err(), "the stream is reset: {answer:?}");
    let _ = body.send_data(bytes::Bytes::from_static(b"after-the-change"), true);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let seen = h.seen["h2open.test"].lock().unwrap().requests.clone();
    assert!(
        seen.iter()
            .all(|r| r.contains("(body 0 bytes)") || r.contains("(body 5 bytes)")),
        "{seen:?}"
    );
    let events = recorded(&h);
    assert!(
        events.iter().any(|e| e.reason == Reason::DeniedByRule
            && e.method.as_deref() == Some("PUT")
            && e.path.as_deref() == Some("/upload")),
        "{events:?}"
    );
}

/// Sends a SOCKS5 CONNECT for `name:port` (address type 3, a domain name) and returns
/// the reply code, with the connection (kept open by the caller while it matters).
async fn socks_connect(h: &Harness, name: &[u8], port: u16) -> (u8, TcpStream) {
    let mut s = TcpStream::connect(h.socks).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    let mut greeting = [0u8; 2];
    s.read_exact(&mut greeting).await.unwrap();
    let mut request = vec![5, 1, 0, 3, u8::try_from(name.len()).unwrap()];
    request.extend_from_slice(name);
    request.extend_from_slice(&port.to_be_bytes());
    s.write_all(&request).await.unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).await.unwrap();
    (reply[1], s)
}

/// SOCKS connections count against the sandbox's connection limit as HTTP ones do: with
/// a limit of 3, three relays open and the rest are refused and recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks_connections_count_against_the_connection_limit() {
    let h = harness_with(false, false, short_limits()).await;
    let port = h.ports["mute.test"];
    let mut held = Vec::new();
    let mut codes = Vec::new();
    for _ in 0..6 {
        let (code, s) = socks_connect(&h, b"mute.test", port).await;
        codes.push(code);
        held.push(s);
    }
    assert_eq!(
        codes,
        [0, 0, 0, 1, 1, 1],
        "REP_OK three times, then failures"
    );
    // The upstream's accept loop runs on its own task: wait for it to count the three,
    // then check that no more arrive.
    let accepted = || h.mute_accepted.load(std::sync::atomic::Ordering::SeqCst);
    for _ in 0..500 {
        if accepted() >= 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(accepted(), 3, "only the three relays reached the upstream");
    let limited = recorded(&h)
        .into_iter()
        .filter(|e| e.reason == Reason::LimitExceeded)
        .count();
    assert_eq!(limited, 3);
}

/// A SOCKS name that is no host is recorded spelled out: its bytes (terminal controls
/// here) never reach the audit log, whose listings are printed on terminals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socks_name_that_is_no_host_is_recorded_spelled_out() {
    let h = harness(false).await;
    let (code, _s) = socks_connect(&h, b"\x1b[2J\x1b[Hall allowed\r\n", 443).await;
    assert_eq!(code, 2, "REP_NOT_ALLOWED");
    let hosts: Vec<String> = recorded(&h).into_iter().map(|e| e.host).collect();
    assert_eq!(hosts, [r"\u{1b}[2J\u{1b}[Hall allowed\r\n"]);
}

/// A SOCKS request capgate does not carry (BIND, UDP ASSOCIATE, only password
/// authentication offered) is refused, and recorded: a workload's attempt at another way
/// out is a violation like a refused host. (Red-team finding: nothing was recorded.) The
/// twin: a CONNECT to an allowed host is recorded as allowed, not as malformed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks_requests_of_another_shape_are_refused_and_recorded() {
    let h = harness(false).await;
    let malformed = |h: &Harness| {
        recorded(h)
            .into_iter()
            .filter(|e| e.host == "(socks)" && e.reason == Reason::MalformedRequest)
            .count()
    };
    // BIND (command 2), then UDP ASSOCIATE (command 3).
    for command in [2u8, 3] {
        let mut s = TcpStream::connect(h.socks).await.unwrap();
        s.write_all(&[5, 1, 0]).await.unwrap();
        let mut choice = [0u8; 2];
        s.read_exact(&mut choice).await.unwrap();
        s.write_all(&[5, command, 0, 1, 127, 0, 0, 1, 0, 80])
            .await
            .unwrap();
        let mut answer = [0u8; 10];
        s.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer[1], 7, "command not supported");
    }
    // Only username/password authentication offered: no method is acceptable.
    let mut s = TcpStream::connect(h.socks).await.unwrap();
    s.write_all(&[5, 1, 2]).await.unwrap();
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await.unwrap();
    assert_eq!(choice, [5, 0xff]);
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    assert_eq!(malformed(&h), 3);
    let (code, _s) = socks_connect(&h, b"plain.test", h.ports["plain.test"]).await;
    assert_eq!(code, 0);
    assert_eq!(malformed(&h), 3);
}

/// An IP a user's allow rule names opens the address guard only while that rule holds:
/// in its phase, and until it is removed. Twin: without such a rule, even an allow-all
/// rule does not reach a loopback address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_rule_opens_an_address_only_in_its_phase_and_while_it_lasts() {
    let opening = |phase: Option<Phase>| Rule {
        source: capgate_policy::Source::User,
        phase,
        ..rule("u1", Decision::Allow, &["127.0.0.1"], None, None)
    };
    let everything = rule("all", Decision::Allow, &["**"], None, None);
    let h = harness_full(
        false,
        false,
        Limits::default(),
        vec![everything.clone(), opening(Some(Phase::Install))],
    )
    .await;
    let port = h.ports["plain.test"];
    let get = format!(
        "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    );
    // Runtime: the install-only opening does not hold, so `**` alone cannot reach it.
    let out = raw_exchange(&h, get.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(out.contains("X-Capgate-Reason: blocked_address"), "{out}");
    // Install: it does.
    h.gw.phase().set(Phase::Install);
    let out = raw_exchange(&h, get.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    // A rule for every phase opens it at runtime, until the rule goes.
    h.gw.phase().set(Phase::Runtime);
    h.policy
        .replace(Matcher::compile(&[everything.clone(), opening(None)]));
    let out = raw_exchange(&h, get.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    h.policy.replace(Matcher::compile(&[everything]));
    let out = raw_exchange(&h, get.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
}

/// The rule a provisioned rule becomes in the store, as the gateway's matcher sees it.
fn stored(id: &str, n: NewRule) -> Rule {
    Rule {
        id: id.to_owned(),
        name: n.name,
        scope: Scope::Sandbox("t".into()),
        resource_type: n.resource_type,
        decision: n.decision,
        resources: n.resources,
        methods: n.methods,
        paths: n.paths,
        protocol: n.protocol,
        phase: n.phase,
        source: n.source,
        created_via: n.created_via,
        editable: n.editable,
        active: true,
        created_at: "2026-11-30T00:00:00.000Z".into(),
    }
}

/// A `read-only` determinism tier: what other rules allow is still read (GET, inspected),
/// but no changing request leaves, over HTTP or intercepted HTTPS, and nothing passes
/// uninspected (SOCKS). The twin without the tier posts freely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_tier_lets_reads_out_and_refuses_changes() {
    use capgate_spec::caps::pack::Tier;
    let extra: Vec<Rule> = capgate_policy::provision::kit_rules("t", None, Some(Tier::ReadOnly))
        .into_iter()
        .enumerate()
        .map(|(i, n)| stored(&format!("ro{i}"), n))
        .collect();
    assert_eq!(extra.len(), 1);
    let h = harness_tiered(false, false, Limits::default(), extra, true).await;
    for scheme in ["http", "https"] {
        let host = if scheme == "http" {
            "plain.test"
        } else {
            "secure.test"
        };
        let (code, out) = curl(&h, &[&url(&h, scheme, host, "/read")]).await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains(&format!("hello from {host}")), "{out}");
        for method in ["POST", "PUT", "DELETE"] {
            let (_, out) = curl(
                &h,
                &[
                    "-i",
                    "-X",
                    method,
                    "-d",
                    "x=1",
                    &url(&h, scheme, host, "/write"),
                ],
            )
            .await;
            assert!(
                out.contains("403 Forbidden")
                    && out.contains("X-Capgate-Reason: denied_by_rule")
                    && out.contains("kit:t:read-only"),
                "{scheme} {method}: {out}"
            );
        }
        let requests = h.seen[host].lock().unwrap().requests.join("\n");
        assert!(requests.contains("GET /read"), "{requests}");
        assert!(!requests.contains("/write"), "{requests}");
    }
    // What no rule can name is refused by the tier itself: an extension method, a body on
    // a reading method, a protocol switch; over HTTP/1.1 and HTTP/2 alike.
    for (what, args) in [
        ("extension method", vec!["-X", "PROPPATCH", "-d", "<x/>"]),
        ("GET with a body", vec!["-X", "GET", "-d", "mutation"]),
        (
            "websocket",
            vec![
                "-H",
                "Connection: Upgrade",
                "-H",
                "Upgrade: websocket",
                "-H",
                "Sec-WebSocket-Version: 13",
                "-H",
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            ],
        ),
    ] {
        for target in [
            url(&h, "http", "plain.test", "/tier"),
            url(&h, "https", "secure.test", "/tier"),
        ] {
            let mut full = vec!["-i"];
            full.extend(args.iter().copied());
            full.push(&target);
            let (_, out) = curl(&h, &full).await;
            assert!(
                out.contains("403 Forbidden")
                    && out.contains("X-Capgate-Reason: http_not_allowed")
                    && out.contains("determinism tier is read-only"),
                "{what} to {target}: {out}"
            );
        }
    }
    let (_, out) = curl_h2(
        &h,
        &[
            "-i",
            "-X",
            "PROPPATCH",
            &url(&h, "https", "h2open.test", "/tier"),
        ],
    )
    .await;
    assert!(
        out.contains("403") && out.contains("determinism tier is read-only"),
        "{out}"
    );
    for host in ["plain.test", "secure.test", "h2open.test"] {
        let requests = h.seen[host].lock().unwrap().requests.join("\n");
        assert!(!requests.contains("/tier"), "{host}: {requests}");
    }
    // Opaque traffic cannot be held to reading: SOCKS to an allowed host is refused.
    let (code, out) = curl_socks(&h, &url(&h, "https", "other.test", "/socks")).await;
    assert_ne!(code, 0, "{out}");
    assert!(h.seen["other.test"].lock().unwrap().requests.is_empty());

    // The twin: the same rules without the tier.
    let h = harness(false).await;
    let (code, out) = curl(
        &h,
        &[
            "-X",
            "POST",
            "-d",
            "x=1",
            &url(&h, "https", "secure.test", "/write"),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hello from secure.test"), "{out}");
}

/// Egress triples (`dev.capgate/egress@1`): host, port and protocol must all match. An
/// `https` triple carries TLS naming its host and nothing else of that host (no cleartext
/// request, no non-TLS tunnel, no SOCKS); an `http` triple cleartext requests only; a `tcp`
/// triple any stream, SOCKS included. Each refusal beside the twin that passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_triples_grant_host_port_and_protocol_together() {
    use capgate_spec::caps::pack::{Egress, EgressProtocol};
    let h = harness(false).await;
    let triple = |host: &str, protocol| Egress {
        host: host.to_owned(),
        port: h.ports[host],
        protocol,
    };
    let triples = [
        triple("secure.test", EgressProtocol::Https),
        triple("plain.test", EgressProtocol::Http),
        triple("sink.test", EgressProtocol::Tcp),
        // A cleartext server granted as https: what reaches it would be a non-TLS tunnel.
        triple("install.test", EgressProtocol::Https),
    ];
    // The pack's rules alone, as a sandbox created from it holds them.
    let rules: Vec<Rule> =
        capgate_policy::provision::egress_rules("t", &triples.iter().collect::<Vec<_>>(), None)
            .into_iter()
            .enumerate()
            .map(|(i, n)| stored(&format!("e{i}"), n))
            .collect();
    assert_eq!(rules.len(), 3);
    h.policy.replace(Matcher::compile(&rules));

    // https: TLS naming the host passes (an opaque tunnel); the same host and port in
    // cleartext, or through SOCKS, does not.
    let (code, out) = curl(&h, &[&url(&h, "https", "secure.test", "/tls")]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hello from secure.test"), "{out}");
    let (_, out) = curl(&h, &["-i", &url(&h, "http", "secure.test", "/clear")]).await;
    assert!(
        out.contains("403 Forbidden") && out.contains("X-Capgate-Reason: no_matching_allow"),
        "{out}"
    );
    let (code, out) = curl_socks(&h, &url(&h, "https", "secure.test", "/socks")).await;
    assert_ne!(code, 0, "{out}");
    let seen = h.seen["secure.test"].lock().unwrap().requests.join("\n");
    assert!(seen.contains("/tls"), "{seen}");
    assert!(
        !seen.contains("/clear") && !seen.contains("/socks"),
        "{seen}"
    );
    // A CONNECT tunnel to an https grant that carries no TLS is cut before the upstream.
    let port = h.ports["install.test"];
    let out = raw(
        &h,
        format!("CONNECT install.test:{port} HTTP/1.1\r\nHost: install.test:{port}\r\n\r\nGET /not-tls HTTP/1.1\r\nHost: install.test\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(!out.contains("hello from"), "{out}");
    assert!(h.seen["install.test"].lock().unwrap().requests.is_empty());

    // http: cleartext requests pass; a tunnel (even one carrying TLS elsewhere) does not.
    let (code, out) = curl(&h, &[&url(&h, "http", "plain.test", "/clear")]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hello from plain.test"), "{out}");
    let (_, out) = curl(&h, &["-p", &url(&h, "http", "plain.test", "/tunnelled")]).await;
    assert!(out.contains("\n000 403"), "the tunnel is refused: {out}");
    let (code, out) = curl_socks(&h, &url(&h, "http", "plain.test", "/socks")).await;
    assert_ne!(code, 0, "{out}");
    let seen = h.seen["plain.test"].lock().unwrap().requests.join("\n");
    assert!(
        !seen.contains("/tunnelled") && !seen.contains("/socks"),
        "{seen}"
    );

    // tcp: any stream, SOCKS included, and cleartext HTTP too.
    let (code, out) = curl_socks(&h, &url(&h, "http", "sink.test", "/socks")).await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = curl(&h, &["-p", &url(&h, "http", "sink.test", "/tunnelled")]).await;
    assert_eq!(code, 0, "{out}");
    let seen = h.seen["sink.test"].lock().unwrap().requests.join("\n");
    assert!(
        seen.contains("/socks") && seen.contains("/tunnelled"),
        "{seen}"
    );

    // An https triple beside a GET-only allow of the same host: a non-TLS tunnel is now
    // judged as tcp, which only the bounded allow grants; an opaque stream cannot be held
    // to it, so nothing is forwarded (the first bytes included).
    let mut bounded = NewRule::provisioned(
        "kit:t:http".to_owned(),
        "t",
        Decision::Allow,
        vec!["install.test".to_owned()],
        Protocol::Tcp,
    );
    bounded.methods = Some(vec![Method::Get]);
    let mut with_bounded = rules.clone();
    with_bounded.push(stored("b", bounded));
    h.policy.replace(Matcher::compile(&with_bounded));
    let out = raw(
        &h,
        format!("CONNECT install.test:{port} HTTP/1.1\r\nHost: install.test:{port}\r\n\r\nDELETE /tunnel-delete HTTP/1.1\r\nHost: install.test\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(!out.contains("hello from"), "{out}");
    assert!(h.seen["install.test"].lock().unwrap().requests.is_empty());
    h.policy.replace(Matcher::compile(&rules));

    // Another port of an https host is another grant: none.
    let (_, out) = curl(&h, &["-i", "https://secure.test:1/"]).await;
    assert!(!out.contains("hello from"), "{out}");
}

/// The phase a tunnel's grant was decided in is the phase of its CONNECT, not of the
/// moment its relay starts: a read-only sandbox's install hook that opens a tunnel and
/// sends nothing until the switch gets nothing through under runtime; the twin without
/// the tier does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_opened_before_the_switch_is_judged_as_opened_in_install() {
    /// What the client got, and how many requests reached the upstream.
    async fn through_after_switch(read_only: bool) -> (String, usize) {
        let h = harness_tiered(false, false, Limits::default(), Vec::new(), read_only).await;
        h.gw.phase().set(Phase::Install);
        let port = h.ports["plain.test"];
        let mut s = TcpStream::connect(h.proxy).await.unwrap();
        s.write_all(
            format!("CONNECT plain.test:{port} HTTP/1.1\r\nHost: plain.test:{port}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let head = read_until(&mut s, "\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        h.gw.phase().set(Phase::Runtime);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let _ = s
            .write_all(b"GET /late HTTP/1.1\r\nHost: plain.test\r\nConnection: close\r\n\r\n")
            .await;
        let mut out = Vec::new();
        let _ =
            tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out)).await;
        let reached = h.seen["plain.test"].lock().unwrap().requests.len();
        (String::from_utf8_lossy(&out).into_owned(), reached)
    }
    // The request came after the switch: it never leaves, not even unanswered.
    let (out, reached) = through_after_switch(true).await;
    assert!(!out.contains("hello from"), "{out}");
    assert_eq!(reached, 0, "{out}");
    let (out, reached) = through_after_switch(false).await;
    assert!(out.contains("hello from plain.test"), "{out}");
    assert_eq!(reached, 1, "{out}");
}

/// A read-only sandbox gets nothing its install hooks opened carried into its runtime: a
/// WebSocket opened during install is cut at the switch, beside the twin without the
/// tier, where it goes on. `Content-Length: 0` is no body (Python's requests sends it on
/// OPTIONS), so reads with it pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_runtime_gets_no_connection_from_install() {
    async fn echo_after_switch(read_only: bool) -> bool {
        let h = harness_tiered(false, false, Limits::default(), Vec::new(), read_only).await;
        h.gw.phase().set(Phase::Install);
        let (mut ws, head) = websocket_handshake(&h, "plain.test", h.ports["plain.test"]).await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        h.gw.phase().set(Phase::Runtime);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let mask = [1u8, 2, 3, 4];
        let mut frame = vec![0x81, 0x80 | 5];
        frame.extend_from_slice(&mask);
        frame.extend(b"later".iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        if ws.write_all(&frame).await.is_err() {
            return false;
        }
        let mut echo = [0u8; 7];
        matches!(
            tokio::time::timeout(std::time::Duration::from_secs(3), ws.read_exact(&mut echo)).await,
            Ok(Ok(_)) if &echo == b"\x81\x05later"
        )
    }
    assert!(
        !echo_after_switch(true).await,
        "the read-only runtime got the hook's WebSocket"
    );
    assert!(
        echo_after_switch(false).await,
        "without the tier the WebSocket goes on"
    );

    let h = harness_tiered(false, false, Limits::default(), Vec::new(), true).await;
    for method in ["GET", "OPTIONS"] {
        let (code, out) = curl(
            &h,
            &[
                "-X",
                method,
                "-H",
                "Content-Length: 0",
                &url(&h, "http", "plain.test", "/empty"),
            ],
        )
        .await;
        assert_eq!(code, 0, "{method}: {out}");
        assert!(out.contains("hello from plain.test"), "{method}: {out}");
    }
}

/// A sentinel sent in clear in a SOCKS5 stream is a sentinel sent where its credential is
/// not injected: the piece that completes it never reaches the upstream, the connection is
/// closed, and it is recorded as `credential_exfiltration`, in one piece or upper-cased and
/// cut across writes. The twin on the same stream, without it, is answered. (A CONNECT
/// tunnel in such a sandbox is intercepted, so one that is not TLS is refused outright.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_in_clear_in_a_socks_stream_is_refused_and_recorded() {
    let h = harness(true).await;
    let seen = |h: &Harness| h.seen["plain.test"].lock().unwrap().requests.clone();
    let port = h.ports["plain.test"];
    let leaks = [
        format!("GET /leak HTTP/1.1\r\nHost: plain.test\r\nX-Token: {SENTINEL}\r\n\r\n"),
        format!(
            "GET /leak2 HTTP/1.1\r\nHost: plain.test\r\nX-Token: {}\r\n\r\n",
            SENTINEL.to_uppercase()
        ),
    ];
    for (i, leak) in leaks.iter().enumerate() {
        let (code, mut socks) = socks_connect(&h, b"plain.test", port).await;
        assert_eq!(code, 0);
        assert!(
            tunnel_request(&mut socks, "plain.test")
                .await
                .contains("hello from plain.test")
        );
        let before = seen(&h).len();
        if i == 0 {
            socks.write_all(leak.as_bytes()).await.unwrap();
        } else {
            let (a, b) = leak.split_at(leak.find("SENTINEL").unwrap() + 12);
            socks.write_all(a.as_bytes()).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            socks.write_all(b.as_bytes()).await.unwrap();
        }
        let (ended, rest) = closed_after(&mut socks).await;
        assert!(ended && !rest.contains("hello from"), "{rest}");
        assert_eq!(seen(&h).len(), before, "{:?}", seen(&h));
    }
    let exfil: Vec<AuditEvent> = recorded(&h)
        .into_iter()
        .filter(|e| e.reason == Reason::CredentialExfiltration)
        .collect();
    assert_eq!(exfil.len(), 2, "{exfil:?}");
    // Recorded with what the stream carried: the twin's request and its answer.
    assert!(
        exfil.iter().all(|e| e.host == "plain.test"
            && e.port == port
            && e.bytes_up > 0
            && e.bytes_down > 0),
        "{exfil:?}"
    );
    // The twin: a stream that carries no sentinel, closed by its client, is recorded as
    // allowed, with its bytes.
    let (_, mut socks) = socks_connect(&h, b"plain.test", port).await;
    assert!(
        tunnel_request(&mut socks, "plain.test")
            .await
            .contains("hello from plain.test")
    );
    socks.shutdown().await.unwrap();
    let (ended, _) = closed_after(&mut socks).await;
    assert!(ended);
    let allowed = (0..50).find_map(|_| {
        let found = recorded(&h)
            .into_iter()
            .find(|e| e.host == "plain.test" && e.decision == Decision::Allow && e.bytes_up > 0);
        if found.is_none() {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        found
    });
    assert!(allowed.is_some(), "{:?}", recorded(&h));
}

/// Whether `s` ends (within 5 s), and what came before its end.
async fn closed_after(s: &mut TcpStream) -> (bool, String) {
    let mut rest = Vec::new();
    let end =
        tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    (
        matches!(end, Ok(Ok(_))),
        String::from_utf8_lossy(&rest).into_owned(),
    )
}
