//! The network walls: only `lo` inside; the listeners created inside are the gateway's way in
//! (the harmless twin); nothing reaches the host's loopback services.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]
mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};

use capgate_sandbox::{ListenerKind, ListenerSpec, WorkspaceMode};
use common::*;

#[test]
fn the_gateway_listener_works_and_host_loopback_services_are_unreachable() {
    // Host loopback services the sandbox must never reach: one on the same port as the
    // sandbox's listener, one on another port.
    let same_port = TcpListener::bind("127.0.0.1:0").unwrap();
    let other_port = TcpListener::bind("127.0.0.1:0").unwrap();
    let p = same_port.local_addr().unwrap().port();
    let q = other_port.local_addr().unwrap().port();
    same_port.set_nonblocking(true).unwrap();
    other_port.set_nonblocking(true).unwrap();

    let mut s = setup("net", WorkspaceMode::Copy);
    s.spec.listeners = vec![
        ListenerSpec {
            addr: format!("127.0.0.1:{p}").parse().unwrap(),
            kind: ListenerKind::Tcp,
        },
        ListenerSpec {
            addr: "127.0.0.1:53".parse().unwrap(),
            kind: ListenerKind::Udp,
        },
    ];
    let mut b = start(&s.spec);
    assert_eq!(b.listeners.len(), 2);
    let mut fds = b.listeners.drain(..);
    let gateway = TcpListener::from(fds.next().unwrap());
    let dns = UdpSocket::from(fds.next().unwrap());

    // The host side of the gateway: accept through the passed descriptors.
    let tcp_side = std::thread::spawn(move || {
        let (mut conn, peer) = gateway.accept().unwrap();
        let mut buf = [0u8; 4];
        conn.read_exact(&mut buf).unwrap();
        conn.write_all(b"pong").unwrap();
        (buf, peer.ip().is_loopback())
    });
    let udp_side = std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        let (n, from) = dns.recv_from(&mut buf).unwrap();
        dns.send_to(b"answer", from).unwrap();
        buf[..n].to_vec()
    });

    let lines = py_lines(
        &mut b.sandbox,
        &format!(
            r#"
import socket
s = socket.create_connection(('127.0.0.1', {p}), timeout=5)
s.sendall(b'ping'); print('gateway', s.recv(4).decode()); s.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(5)
u.sendto(b'query', ('127.0.0.1', 53)); print('dns', u.recv(16).decode())
c = socket.socket(); c.settimeout(2)
print('host-other-port', err(lambda: c.connect(('127.0.0.1', {q}))))
c6 = socket.socket(socket.AF_INET6); c6.settimeout(2)
print('host-v6', err(lambda: c6.connect(('::1', {q}))))
print('interfaces', sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]))
print('ipv4-routes', len(open('/proc/net/route').read().splitlines()) - 1)
"#
        ),
    );
    assert_eq!(
        lines,
        [
            "gateway pong",
            "dns answer",
            "host-other-port EACCES",
            "host-v6 EACCES",
            "interfaces ['lo']",
            "ipv4-routes 0",
        ]
    );
    let (got, loopback_peer) = tcp_side.join().unwrap();
    assert_eq!(&got, b"ping");
    assert!(loopback_peer);
    assert_eq!(udp_side.join().unwrap(), b"query");
    // The host's own listeners never saw a connection.
    for l in [&same_port, &other_port] {
        assert_eq!(
            l.accept().unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
    }
    b.sandbox.stop().unwrap();
}

#[test]
fn on_a_port_landlock_allows_the_network_namespace_alone_refuses_host_loopback() {
    // The same-port case above shows the namespace; here the port is one Landlock allows
    // and nothing listens on it inside, so the refusal comes from the empty namespace.
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port();
    let mut s = setup("net-ns", WorkspaceMode::Copy);
    s.spec.listeners = vec![ListenerSpec {
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        kind: ListenerKind::Tcp,
    }];
    let mut b = start(&s.spec);
    // Close the sandbox's own listener: the port is then allowed by Landlock but unbound inside.
    b.listeners.clear();
    let lines = py_lines(
        &mut b.sandbox,
        &format!(
            "import socket\nc = socket.socket(); c.settimeout(2)\nprint(err(lambda: c.connect(('127.0.0.1', {port}))))"
        ),
    );
    assert_eq!(lines, ["ECONNREFUSED"]);
    assert_eq!(
        host.accept().unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
    b.sandbox.stop().unwrap();
}

/// The dialer's sockets belong to the sandbox's network namespace: connected by the host,
/// they reach a server listening inside (the harmless twin), and never the host's own
/// loopback service on the same port (the attack on the published port's isolation).
#[test]
fn dialer_sockets_reach_ports_inside_and_never_the_hosts_loopback() {
    // A host service on the port the server inside will use, and one on another port.
    let host_same = TcpListener::bind("127.0.0.1:0").unwrap();
    let host_other = TcpListener::bind("127.0.0.1:0").unwrap();
    host_same.set_nonblocking(true).unwrap();
    host_other.set_nonblocking(true).unwrap();
    let p = host_same.local_addr().unwrap().port();
    let q = host_other.local_addr().unwrap().port();

    let mut s = setup("dial", WorkspaceMode::Copy);
    s.spec.dialer = true;
    let mut b = start(&s.spec);
    assert_eq!(b.listeners.len(), 1, "the dialer is not a listener");
    let dialer = b
        .sandbox
        .take_dialer()
        .expect("the spec asked for a dialer");
    assert!(b.sandbox.take_dialer().is_none(), "it is handed out once");

    // A TCP and a UDP echo server inside, on the host service's port, left running.
    let out = sh(
        &mut b.sandbox,
        &format!(
            r#"python3 - <<'PY' >/dev/null 2>&1 &
import socket, threading
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(('127.0.0.1', {p})); t.listen()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(('127.0.0.1', {p}))
def udp():
    while True:
        data, peer = u.recvfrom(64); u.sendto(b'inside-udp:' + data, peer)
threading.Thread(target=udp, daemon=True).start()
while True:
    c, _ = t.accept(); c.sendall(b'inside-tcp:' + c.recv(64)); c.close()
PY"#
        ),
    );
    assert!(out.status.success(), "{out:?}");

    let tcp = |port: u16| -> std::io::Result<String> {
        let sock = dialer.socket(false, ListenerKind::Tcp)?;
        rustix::net::connect(&sock, &std::net::SocketAddr::from(([127, 0, 0, 1], port)))?;
        let mut stream = std::net::TcpStream::from(sock);
        stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
        stream.write_all(b"hello")?;
        let mut got = String::new();
        stream.read_to_string(&mut got)?;
        Ok(got)
    };
    // (Landlock lets nothing inside connect to it: the host side waits for it to listen.)
    assert!(
        eventually(10, || tcp(p).is_ok_and(|got| got == "inside-tcp:hello")),
        "the server inside answers through a dialer socket"
    );
    // Nothing listens inside on the other port: refused, though the host listens there.
    let refused = tcp(q).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    // IPv6 sockets are made inside too; nothing listens on ::1 there.
    let v6 = dialer.socket(true, ListenerKind::Tcp).unwrap();
    let err = rustix::net::connect(
        &v6,
        &std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, p)),
    )
    .unwrap_err();
    assert_eq!(err, rustix::io::Errno::CONNREFUSED);

    let udp = UdpSocket::from(dialer.socket(false, ListenerKind::Udp).unwrap());
    udp.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    udp.connect(("127.0.0.1", p)).unwrap();
    udp.send(b"ping").unwrap();
    let mut buf = [0u8; 64];
    let n = udp.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"inside-udp:ping");

    // The host's services saw nothing.
    for host in [&host_same, &host_other] {
        assert_eq!(
            host.accept().unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
    }
    // Once the sandbox is gone, so is the dialer.
    b.sandbox.stop().unwrap();
    assert!(dialer.socket(false, ListenerKind::Tcp).is_err());
}
