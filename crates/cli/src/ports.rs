//! Published ports (port@1): the host side of each port a kit asks to publish.
//!
//! Each port gets a listener on the host's loopback, on a port the kernel picks (a kit
//! cannot pin the host side; kitspec §2.7). A TCP connection to it is relayed to the port
//! inside; a UDP peer's datagrams are relayed to the port inside and the answers back. The
//! inside end is a socket the sandbox's init makes in its network namespace
//! ([`capgate_sandbox::Dialer`]) and this process connects: Landlock and seccomp bind the
//! sandbox's processes, not the caller, so any port that listens inside can be published,
//! while nothing inside can use the dialer to reach out.
//!
//! Only the user who runs the sandbox (and root) may reach a published port: the owner of
//! each connecting socket is asked of the kernel ([`crate::peer`]) before anything is
//! relayed, and a connection or datagram of another local user is dropped and said.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use capgate_resolve::plan::Plan;
use capgate_sandbox::{Dialer, ListenerKind, ListenerSpec};
use capgate_spec::caps::Capability;
use capgate_spec::caps::storage::{Port, Transport};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};
use tokio::sync::mpsc;

/// How long a connection inside may take to be accepted.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A UDP peer that sent nothing this long is forgotten, with its socket inside.
const UDP_IDLE: Duration = Duration::from_secs(60);
/// At most this many UDP peers at once per port; datagrams of further peers are dropped.
const UDP_PEERS: usize = 128;
/// Datagrams queued per UDP peer; more are dropped (bounds memory at peers × queue × size).
const UDP_QUEUE: usize = 8;
/// At most this many TCP connections at once per published port; more wait to be accepted.
const TCP_CONNECTIONS: usize = 256;
/// Largest datagram relayed.
const UDP_MAX: usize = 65_535;
/// Refused peers said on stderr per port; further refusals are counted, not said.
const REFUSALS_SAID: usize = 8;

/// A port published for this run.
#[derive(Debug, Clone)]
pub struct Published {
    /// The kit's entry (container port, transport, label).
    pub port: Port,
    /// Where the host reaches it.
    pub host: SocketAddr,
}

impl Published {
    /// `port 8000/tcp (web) is published at 127.0.0.1:41234`, for the user.
    pub fn describe(&self) -> String {
        let label = if self.port.name.is_empty() {
            String::new()
        } else {
            format!(" ({})", capgate_spec::text::printable(&self.port.name))
        };
        format!(
            "port {}{label} is published at {}",
            self.port.key(),
            self.host
        )
    }
}

/// The ports a composition publishes (port@1, one per container port and transport).
pub fn requested(plan: &Plan) -> Vec<Port> {
    crate::sandbox::capabilities(plan)
        .filter_map(|c| match c {
            Capability::Port(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

/// Binds a host listener for each port and relays what reaches it into the sandbox, on
/// `runtime`, until the runtime shuts down. A port of the sandbox's own gateway listeners
/// (`reserved`: its proxy, SOCKS and DNS) is never published: the host's users would
/// reach the sandbox's grants and credentials through it. Returns what was published and
/// a note for each port that was not.
pub fn publish(
    runtime: &tokio::runtime::Runtime,
    dialer: Dialer,
    ports: &[Port],
    reserved: &[ListenerSpec],
) -> io::Result<(Vec<Published>, Vec<String>)> {
    let _guard = runtime.enter();
    let dialer = Arc::new(dialer);
    let mut published = Vec::with_capacity(ports.len());
    let mut notes = Vec::new();
    for port in ports {
        let transport = port.transport.unwrap_or(Transport::Tcp);
        let gateway = reserved.iter().any(|l| {
            l.addr.port() == port.container
                && matches!(
                    (l.kind, transport),
                    (ListenerKind::Tcp, Transport::Tcp) | (ListenerKind::Udp, Transport::Udp)
                )
        });
        if gateway {
            notes.push(format!(
                "port {} is not published: inside, it is the sandbox's gateway, which the host's users must not reach",
                port.key()
            ));
            continue;
        }
        let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let host = match transport {
            Transport::Tcp => {
                let listener = std::net::TcpListener::bind(loopback)?;
                listener.set_nonblocking(true)?;
                let listener = TcpListener::from_std(listener)?;
                let host = listener.local_addr()?;
                runtime.spawn(serve_tcp(
                    listener,
                    Arc::clone(&dialer),
                    port.container,
                    port.key(),
                ));
                host
            }
            Transport::Udp => {
                let socket = std::net::UdpSocket::bind(loopback)?;
                socket.set_nonblocking(true)?;
                let socket = UdpSocket::from_std(socket)?;
                let host = socket.local_addr()?;
                runtime.spawn(serve_udp(
                    Arc::new(socket),
                    Arc::clone(&dialer),
                    port.container,
                    port.key(),
                ));
                host
            }
        };
        published.push(Published {
            port: port.clone(),
            host,
        });
    }
    Ok((published, notes))
}

/// A socket of the sandbox's network namespace (made by its init; the call blocks briefly).
async fn inside_socket(
    dialer: &Arc<Dialer>,
    v6: bool,
    kind: ListenerKind,
) -> io::Result<std::os::fd::OwnedFd> {
    let dialer = Arc::clone(dialer);
    tokio::task::spawn_blocking(move || dialer.socket(v6, kind))
        .await
        .map_err(io::Error::other)?
}

/// A connection to `port` inside: on 127.0.0.1, else on ::1.
async fn connect_inside(dialer: &Arc<Dialer>, port: u16) -> io::Result<TcpStream> {
    let mut refused = None;
    for v6 in [false, true] {
        let sock = std::net::TcpStream::from(inside_socket(dialer, v6, ListenerKind::Tcp).await?);
        sock.set_nonblocking(true)?;
        let addr = if v6 {
            SocketAddr::from((Ipv6Addr::LOCALHOST, port))
        } else {
            SocketAddr::from((Ipv4Addr::LOCALHOST, port))
        };
        let connect = TcpSocket::from_std_stream(sock).connect(addr);
        match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => refused = Some(e),
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        }
    }
    Err(refused.unwrap_or_else(|| io::ErrorKind::ConnectionRefused.into()))
}

/// Why the host peer `from` may not reach the published port at `local`, if it may not:
/// its socket belongs to another user, or its owner cannot be told (fail closed). The
/// first [`REFUSALS_SAID`] refusals of a port are said on stderr.
fn refused(
    transport: Transport,
    from: SocketAddr,
    local: SocketAddr,
    key: &str,
    refusals: &AtomicUsize,
) -> bool {
    let why = match (from, local, transport) {
        (SocketAddr::V4(from), SocketAddr::V4(local), Transport::Tcp) => {
            match crate::peer::tcp_owner(from, local) {
                Ok(Some(uid)) if crate::peer::may_reach(uid) => return false,
                Ok(Some(uid)) => format!("its socket belongs to uid {uid}"),
                Ok(None) => "the kernel knows no owner of its socket".to_owned(),
                Err(e) => format!("its owner could not be asked ({e})"),
            }
        }
        // Every socket that could have sent it must be allowed: sockets of several users
        // can share a UDP port (SO_REUSEADDR).
        (SocketAddr::V4(from), SocketAddr::V4(_), Transport::Udp) => {
            match crate::peer::udp_owners(from) {
                Ok(owners) if owners.is_empty() || owners.contains(&None) => {
                    "the kernel knows no owner of its socket".to_owned()
                }
                Ok(owners) => match owners
                    .iter()
                    .flatten()
                    .find(|uid| !crate::peer::may_reach(**uid))
                {
                    None => return false,
                    Some(uid) => format!("its socket belongs to uid {uid}"),
                },
                Err(e) => format!("its owner could not be asked ({e})"),
            }
        }
        _ => "it is not on IPv4 loopback".to_owned(),
    };
    let n = refusals.fetch_add(1, Ordering::Relaxed);
    if n < REFUSALS_SAID {
        let more = if n + 1 == REFUSALS_SAID {
            " (further refusals of this port are not said)"
        } else {
            ""
        };
        let who = match rustix::process::geteuid().as_raw() {
            0 => "root (who runs this sandbox)".to_owned(),
            uid => format!("uid {uid} (who runs this sandbox) and root"),
        };
        say!("capgate: published port {key}: refused {from}: {why}; only {who} may reach it{more}");
    }
    true
}

async fn serve_tcp(listener: TcpListener, dialer: Arc<Dialer>, port: u16, key: String) {
    // Said once per port: why connections to it are closed at once.
    let said = Arc::new(AtomicBool::new(false));
    let refusals = AtomicUsize::new(0);
    let slots = Arc::new(tokio::sync::Semaphore::new(TCP_CONNECTIONS));
    loop {
        // A connection is accepted only with a slot free (the rest wait in the backlog).
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Ok((mut client, from)) = listener.accept().await else {
            // Out of descriptors, say: let it pass rather than spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(local) = client.local_addr() else {
            continue;
        };
        if refused(Transport::Tcp, from, local, &key, &refusals) {
            continue;
        }
        let dialer = Arc::clone(&dialer);
        let said = Arc::clone(&said);
        let key = key.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match connect_inside(&dialer, port).await {
                Ok(mut inside) => {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut inside).await;
                }
                Err(e) => {
                    if !said.swap(true, Ordering::Relaxed) {
                        say!(
                            "capgate: published port {key}: a connection from the host was closed: nothing inside accepted it on 127.0.0.1 or ::1 port {port} ({e})"
                        );
                    }
                }
            }
        });
    }
}

async fn serve_udp(host: Arc<UdpSocket>, dialer: Arc<Dialer>, port: u16, key: String) {
    let mut peers: HashMap<SocketAddr, mpsc::Sender<Vec<u8>>> = HashMap::new();
    let refusals = AtomicUsize::new(0);
    let Ok(local) = host.local_addr() else {
        return;
    };
    let mut buf = vec![0u8; UDP_MAX];
    loop {
        let Ok((n, peer)) = host.recv_from(&mut buf).await else {
            continue;
        };
        // Every datagram is judged (one netlink round trip): a peer's port may have passed
        // to another user's socket since its last one.
        if refused(Transport::Udp, peer, local, &key, &refusals) {
            continue;
        }
        let datagram = buf[..n].to_vec();
        if let Some(tx) = peers.get(&peer) {
            match tx.try_send(datagram) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => continue,
                // That peer was forgotten (idle): start it afresh below.
                Err(mpsc::error::TrySendError::Closed(d)) => {
                    peers.remove(&peer);
                    if let Some(tx) = udp_peer(&host, &dialer, port, peer, &mut peers).await {
                        let _ = tx.try_send(d);
                    }
                }
            }
        } else if let Some(tx) = udp_peer(&host, &dialer, port, peer, &mut peers).await {
            let _ = tx.try_send(datagram);
        }
    }
}

/// Starts relaying for a new UDP peer: a socket inside connected to `port`, and a task that
/// carries the peer's datagrams in and the answers out until both are idle.
async fn udp_peer(
    host: &Arc<UdpSocket>,
    dialer: &Arc<Dialer>,
    port: u16,
    peer: SocketAddr,
    peers: &mut HashMap<SocketAddr, mpsc::Sender<Vec<u8>>>,
) -> Option<mpsc::Sender<Vec<u8>>> {
    if peers.len() >= UDP_PEERS {
        peers.retain(|_, tx| !tx.is_closed());
        if peers.len() >= UDP_PEERS {
            return None;
        }
    }
    let sock =
        std::net::UdpSocket::from(inside_socket(dialer, false, ListenerKind::Udp).await.ok()?);
    sock.set_nonblocking(true).ok()?;
    sock.connect((Ipv4Addr::LOCALHOST, port)).ok()?;
    let inside = UdpSocket::from_std(sock).ok()?;
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(UDP_QUEUE);
    let host = Arc::clone(host);
    tokio::spawn(async move {
        let mut buf = vec![0u8; UDP_MAX];
        // Only the peer's own datagrams keep the mapping: a workload cannot hold it open
        // (and keep sending to a host port the peer has let go) by answering alone.
        let idle = tokio::time::sleep(UDP_IDLE);
        tokio::pin!(idle);
        loop {
            tokio::select! {
                got = rx.recv() => match got {
                    Some(d) => {
                        idle.as_mut().reset(tokio::time::Instant::now() + UDP_IDLE);
                        let _ = inside.send(&d).await;
                    }
                    None => return,
                },
                got = inside.recv(&mut buf) => {
                    // An error is an ICMP refusal (nothing listens inside): that datagram
                    // is lost, as it would be on a network.
                    if let Ok(n) = got {
                        let _ = host.send_to(&buf[..n], peer).await;
                    }
                }
                () = &mut idle => return,
            }
        }
    });
    peers.insert(peer, tx.clone());
    Some(tx)
}
