//! SOCKS5 `CONNECT` (RFC 1928, no authentication) for non-HTTP protocols that an unbounded
//! grant allows (SSH to a code host, a database driver, …). The same decision and address
//! guard as the HTTP proxy; a host granted only for some HTTP requests is refused here,
//! because its traffic would not be inspected, and TLS whose server name is not the host
//! asked for is refused by the relay (`cleartext`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use capgate_policy::{Decision, Protocol, Reason, Verdict};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

use crate::proxy::Gateway;

const VERSION: u8 = 5;
const NO_AUTH: u8 = 0;
const NO_ACCEPTABLE: u8 = 0xff;
const CMD_CONNECT: u8 = 1;
const REP_OK: u8 = 0;
const REP_FAILURE: u8 = 1;
const REP_NOT_ALLOWED: u8 = 2;
const REP_HOST_UNREACHABLE: u8 = 4;
const REP_CMD_UNSUPPORTED: u8 = 7;
const REP_ATYP_UNSUPPORTED: u8 = 8;
/// The host a refusal of a request's shape is recorded under (it named none, or none
/// capgate could read).
const SHAPE_HOST: &str = "(socks)";

impl Gateway {
    /// Accepts SOCKS5 connections for as long as it runs.
    pub async fn serve_socks(&self, listener: TcpListener) -> std::io::Result<()> {
        loop {
            let Some(stream) = self.accept(&listener).await else {
                continue;
            };
            let gw = self.clone();
            tokio::spawn(async move {
                let _ = gw.socks_client(stream).await;
            });
        }
    }

    async fn socks_client(&self, mut client: TcpStream) -> std::io::Result<()> {
        let _ = client.set_nodelay(true);
        // The connection counts against the sandbox's limit from the start, like an HTTP
        // one; over the limit, the request is still read so that the refusal is an answer,
        // for a few connections at a time: the others are closed at once.
        let permit = self.connection_permit();
        let _overflow = match permit {
            Some(_) => None,
            None => match self.overflow_permit() {
                Some(slot) => Some(slot),
                None => {
                    self.audit_simple("(connection)", 0, Decision::Deny, Reason::LimitExceeded);
                    return Ok(());
                }
            },
        };
        let wait = self.head_timeout();
        // A request that does not come in time, or that asks what capgate does not do
        // (BIND, UDP ASSOCIATE, SOCKS4, only password authentication), is refused and
        // recorded, under the host `(socks)`: no host was asked for.
        let Ok(request) = timeout(wait, read_request(&mut client)).await else {
            self.audit_simple(SHAPE_HOST, 0, Decision::Deny, Reason::LimitExceeded);
            return Ok(());
        };
        let (host, port) = match request? {
            Ok(hp) => hp,
            Err(code) => {
                self.audit_simple(SHAPE_HOST, 0, Decision::Deny, Reason::MalformedRequest);
                return reply(&mut client, code).await;
            }
        };
        let Some(_permit) = permit else {
            let v = Verdict::refused(
                Reason::LimitExceeded,
                format!(
                    "sandbox `{}` has {} connections open, the limit",
                    self.cfg().sandbox,
                    self.limits().max_connections
                ),
            );
            self.record(&shown(&host), port, &v, (0, 0));
            return reply(&mut client, REP_FAILURE).await;
        };
        let Some(target) = crate::proxy::target_of(&host) else {
            // Recorded spelled out: the name is whatever bytes the workload sent.
            let v = Verdict::refused(
                Reason::InvalidTarget,
                format!("`{}` is not a host capgate can judge", shown(&host)),
            );
            self.record(&shown(&host), port, &v, (0, 0));
            return reply(&mut client, REP_NOT_ALLOWED).await;
        };
        let name = crate::proxy::target_name(&target);
        // Read before the decision: see `Gateway::until_revoked`.
        let began = self.phase().get();
        let verdict = self
            .sentinel_in_host(&name)
            .unwrap_or_else(|| self.decide_connection(&target, port, Protocol::Tcp));
        if !verdict.is_allowed() {
            self.record(&name, port, &verdict, (0, 0));
            return reply(&mut client, REP_NOT_ALLOWED).await;
        }
        if verdict.inspect {
            let v = Verdict::refused(
                Reason::InspectionRequired,
                format!(
                    "only some HTTP requests to `{name}` are granted; SOCKS traffic cannot be inspected"
                ),
            );
            self.record(&name, port, &v, (0, 0));
            return reply(&mut client, REP_NOT_ALLOWED).await;
        }
        let addr = match self.vet_address(&name, port).await {
            Ok(a) => a,
            Err(refusal) => {
                let code = if refusal.reason().is_some() {
                    REP_NOT_ALLOWED
                } else {
                    REP_HOST_UNREACHABLE
                };
                let v = Verdict::refused(
                    refusal.reason().unwrap_or(Reason::InvalidTarget),
                    refusal.message(),
                );
                self.record(&name, port, &v, (0, 0));
                return reply(&mut client, code).await;
            }
        };
        let mut upstream = match timeout(wait, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            _ => {
                let v = Verdict::refused(
                    Reason::InvalidTarget,
                    format!("cannot connect to `{name}:{port}`"),
                );
                self.record(&name, port, &v, (0, 0));
                return reply(&mut client, REP_HOST_UNREACHABLE).await;
            }
        };
        let _ = upstream.set_nodelay(true);
        // The client's first bytes are judged, and with sentinels in the sandbox all its
        // bytes are watched for them (see `cleartext`); a stream that cannot be watched is
        // refused.
        let broker = &self.cfg().broker;
        if broker.has_sentinels() && broker.sentinel_scan().is_none() {
            let v = Verdict::refused(
                Reason::InternalError,
                "this stream cannot be watched for the sandbox's credential sentinels",
            );
            self.record(&name, port, &v, (0, 0));
            return reply(&mut client, REP_FAILURE).await;
        }
        reply(&mut client, REP_OK).await?;
        let relay =
            crate::cleartext::relay(&mut client, &mut upstream, &name, broker.sentinel_scan());
        tokio::select! {
            biased;
            // A connection opened under install grants ends when they stop holding; judged
            // first, before the relay moves a byte.
            revoked = self.until_revoked((&target, port, Protocol::Tcp), None, began) => {
                self.record(&name, port, &revoked, (0, 0));
            }
            relayed = relay => self.record_watched(&name, port, &verdict, relayed),
        }
        Ok(())
    }
}

/// A name as sent, with anything but printable ASCII escaped (`\u{1b}`, `\n`, …): for
/// the audit log, whose listings reach a terminal.
fn shown(host: &str) -> String {
    host.escape_default().to_string()
}

/// Reads the greeting and the request; `Err(reply code)` for requests refused on shape.
async fn read_request(c: &mut TcpStream) -> std::io::Result<Result<(String, u16), u8>> {
    let mut head = [0u8; 2];
    c.read_exact(&mut head).await?;
    if head[0] != VERSION {
        return Ok(Err(REP_FAILURE));
    }
    let mut methods = vec![0u8; usize::from(head[1])];
    c.read_exact(&mut methods).await?;
    if !methods.contains(&NO_AUTH) {
        c.write_all(&[VERSION, NO_ACCEPTABLE]).await?;
        return Ok(Err(REP_FAILURE));
    }
    c.write_all(&[VERSION, NO_AUTH]).await?;
    let mut req = [0u8; 4];
    c.read_exact(&mut req).await?;
    if req[0] != VERSION {
        return Ok(Err(REP_FAILURE));
    }
    if req[1] != CMD_CONNECT {
        return Ok(Err(REP_CMD_UNSUPPORTED));
    }
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            c.read_exact(&mut a).await?;
            IpAddr::V4(Ipv4Addr::from(a)).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            c.read_exact(&mut a).await?;
            format!("[{}]", Ipv6Addr::from(a))
        }
        3 => {
            let mut len = [0u8; 1];
            c.read_exact(&mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            c.read_exact(&mut name).await?;
            match String::from_utf8(name) {
                Ok(n) => n,
                Err(_) => return Ok(Err(REP_NOT_ALLOWED)),
            }
        }
        _ => return Ok(Err(REP_ATYP_UNSUPPORTED)),
    };
    let mut port = [0u8; 2];
    c.read_exact(&mut port).await?;
    Ok(Ok((host, u16::from_be_bytes(port))))
}

/// Answers the request; any answer but success ends the connection.
async fn reply(c: &mut TcpStream, code: u8) -> std::io::Result<()> {
    c.write_all(&[VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0])
        .await?;
    if code != REP_OK {
        let _ = c.shutdown().await;
    }
    Ok(())
}
