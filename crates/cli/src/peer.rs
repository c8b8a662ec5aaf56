//! Who is on the other end of a loopback connection: the owner (uid) of the peer's socket,
//! asked of the kernel with sock_diag (`NETLINK_SOCK_DIAG`, as `ss` asks): for TCP by the
//! connection's exact addresses (one round trip however many sockets the host has), for
//! UDP every socket on the sender's port.
//!
//! Published ports (port@1) serve only the user who runs the sandbox (and root): another
//! local user reaching a service inside would act with the sandbox's grants, and through
//! its gateway with the user's credentials.

use std::io;
use std::net::SocketAddrV4;

use rustix::net::netlink::{SOCK_DIAG, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// `SOCK_DIAG_BY_FAMILY` (linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
/// `NLM_F_ROOT | NLM_F_MATCH`: every socket of the family and protocol.
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_DONE: u16 = 3;
const NLMSG_ERROR: u16 = 2;
/// `TCP_TIME_WAIT`: a socket its process has let go; the kernel reports uid 0 for it.
const TCP_TIME_WAIT: u8 = 6;
/// `INET_DIAG_NOCOOKIE`: match by addresses only.
const NO_COOKIE: u32 = u32::MAX;
/// Where `idiag_uid` stands in a reply: after the 16-byte netlink header, four bytes of
/// family/state/timer/retrans, the 48-byte socket id and expires/rqueue/wqueue.
const UID_AT: usize = 16 + 4 + 48 + 12;
/// Where `idiag_inode` stands: right after the uid.
const INODE_AT: usize = UID_AT + 4;
const STATE_AT: usize = 16 + 1;

/// The uid owning the TCP connection from `peer` to `local` (this end: the published
/// port). `None` when the kernel knows no such socket, or one no process holds any more.
pub fn tcp_owner(peer: SocketAddrV4, local: SocketAddrV4) -> io::Result<Option<u32>> {
    exact_owner(request(ip_proto::TCP, NLM_F_REQUEST, AF_INET, peer, local))
}

/// The uid of the one socket an exact-match `request` names (see [`parse`]).
fn exact_owner(request: Vec<u8>) -> io::Result<Option<u32>> {
    let fd = diag_socket()?;
    to_kernel(&fd, &request)?;
    let mut reply = [0u8; 512];
    let (got, _) = rustix::net::recv(&fd, &mut reply, RecvFlags::empty())?;
    parse(&reply[..got.min(reply.len())])
}

/// A sock_diag netlink socket.
fn diag_socket() -> io::Result<rustix::fd::OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        Some(SOCK_DIAG),
    )?)
}

/// Sends `request` to the kernel on `fd`.
fn to_kernel(fd: &rustix::fd::OwnedFd, request: &[u8]) -> io::Result<()> {
    rustix::net::sendto(
        fd,
        request,
        SendFlags::empty(),
        &SocketAddrNetlink::new(0, 0),
    )?;
    Ok(())
}

/// Every UDP socket that could have sent from `peer`: bound to its port on a loopback or
/// wildcard address, IPv4 or IPv6 (several sockets of different users may share a port
/// with SO_REUSEADDR, and the kernel's best match for `peer` need not be the sender). The
/// uid of each, `None` for one no process holds.
pub fn udp_owners(peer: SocketAddrV4) -> io::Result<Vec<Option<u32>>> {
    let fd = diag_socket()?;
    let mut owners = Vec::new();
    for family in [AF_INET, AF_INET6] {
        // A dump of the family's UDP sockets whose own port is the peer's (in a dump, a
        // non-zero port of the id filters; the address is judged below).
        let any = SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0);
        let flags = NLM_F_REQUEST | NLM_F_DUMP;
        to_kernel(&fd, &request(ip_proto::UDP, flags, family, peer, any))?;
        let mut buf = vec![0u8; 64 * 1024];
        'dump: loop {
            let (got, _) = rustix::net::recv(&fd, &mut buf, RecvFlags::empty())?;
            let mut at = 0;
            while let Some(header) = buf.get(at..at + 16).filter(|_| at < got) {
                let len = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
                let kind = u16::from_ne_bytes([header[4], header[5]]);
                let message = buf.get(at..at + len).filter(|_| len >= 16);
                match (kind, message) {
                    (NLMSG_DONE, _) => break 'dump,
                    (NLMSG_ERROR, _) | (_, None) => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "sock_diag refused the dump",
                        ));
                    }
                    (_, Some(m)) => {
                        if let Some(owner) = udp_candidate(m, peer) {
                            owners.push(owner);
                        }
                    }
                }
                // Messages are aligned to 4 bytes.
                at += (len + 3) & !3;
            }
        }
    }
    Ok(owners)
}

/// From one dumped `inet_diag_msg`: the owner of a socket bound to `peer`'s port on an
/// address a datagram from `peer` could leave from, else `None` (not a candidate).
fn udp_candidate(m: &[u8], peer: SocketAddrV4) -> Option<Option<u32>> {
    let field = |at: usize, n: usize| m.get(at..at + n);
    let family = *m.get(16)?;
    let sport = u16::from_be_bytes(field(20, 2)?.try_into().ok()?);
    if sport != peer.port() {
        return None;
    }
    let src: [u8; 16] = field(24, 16)?.try_into().ok()?;
    let v4 = |a: [u8; 4]| a == peer.ip().octets() || a == [0; 4] || a[0] == 127;
    let fits = match family {
        AF_INET => v4([src[0], src[1], src[2], src[3]]),
        AF_INET6 => {
            let ip = std::net::Ipv6Addr::from(src);
            ip.is_unspecified()
                || ip.is_loopback()
                || ip.to_ipv4_mapped().is_some_and(|a| v4(a.octets()))
        }
        _ => false,
    };
    if !fits {
        return None;
    }
    let uid = u32::from_ne_bytes(field(UID_AT, 4)?.try_into().ok()?);
    let inode = u32::from_ne_bytes(field(INODE_AT, 4)?.try_into().ok()?);
    Some((inode != 0).then_some(uid))
}

/// An `inet_diag_req_v2` for `protocol` sockets of `family` whose id is `src` → `dst`
/// (an exact match, or with `NLM_F_DUMP` a dump filtered by the non-zero ports).
fn request(protocol: u8, flags: u16, family: u8, src: SocketAddrV4, dst: SocketAddrV4) -> Vec<u8> {
    let mut m = Vec::with_capacity(72);
    m.extend_from_slice(&72u32.to_ne_bytes()); // nlmsg_len
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel
    m.push(family);
    m.push(protocol);
    m.push(0); // no extensions
    m.push(0);
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
    // inet_diag_sockid: ports and addresses in network order.
    m.extend_from_slice(&src.port().to_be_bytes());
    m.extend_from_slice(&dst.port().to_be_bytes());
    m.extend_from_slice(&src.ip().octets());
    m.extend_from_slice(&[0; 12]);
    m.extend_from_slice(&dst.ip().octets());
    m.extend_from_slice(&[0; 12]);
    m.extend_from_slice(&0u32.to_ne_bytes()); // any interface
    m.extend_from_slice(&NO_COOKIE.to_ne_bytes());
    m.extend_from_slice(&NO_COOKIE.to_ne_bytes());
    debug_assert_eq!(m.len(), 72);
    m
}

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// IP protocol numbers.
mod ip_proto {
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
}

/// The uid of a `SOCK_DIAG_BY_FAMILY` reply; an `NLMSG_ERROR` of ENOENT is "no such socket".
fn parse(reply: &[u8]) -> io::Result<Option<u32>> {
    let u16_at = |at: usize| {
        reply
            .get(at..at + 2)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        reply
            .get(at..at + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    let truncated = || io::Error::new(io::ErrorKind::InvalidData, "a short sock_diag reply");
    match u16_at(4).ok_or_else(truncated)? {
        NLMSG_ERROR => {
            let errno = i32::from_ne_bytes(u32_at(16).ok_or_else(truncated)?.to_ne_bytes());
            match -errno {
                0 | 2 => Ok(None), // ENOENT: no such socket
                e => Err(io::Error::from_raw_os_error(e)),
            }
        }
        SOCK_DIAG_BY_FAMILY => {
            let state = *reply.get(STATE_AT).ok_or_else(truncated)?;
            if state == TCP_TIME_WAIT {
                return Ok(None);
            }
            // A socket no process holds any more (closed by its client: a time-wait
            // socket in its FIN_WAIT2 substate, or an orphan) has no inode, and the kernel
            // reports uid 0 for it: that is no one, not root.
            if u32_at(INODE_AT).ok_or_else(truncated)? == 0 {
                return Ok(None);
            }
            Ok(Some(u32_at(UID_AT).ok_or_else(truncated)?))
        }
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("an unexpected sock_diag reply (type {other})"),
        )),
    }
}

/// Whether `uid` may reach what this process publishes: its own user, and root.
pub fn may_reach(uid: u32) -> bool {
    uid == 0 || uid == rustix::process::geteuid().as_raw()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]
    use super::*;
    use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};

    fn v4(a: SocketAddr) -> SocketAddrV4 {
        match a {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => panic!("not IPv4"),
        }
    }

    fn me() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    /// The UDP socket the kernel would deliver to from `local` to `peer`: its best match
    /// for the sender, which [`udp_owners`] does not take alone.
    fn best_match(peer: SocketAddrV4, local: SocketAddrV4) -> io::Result<Option<u32>> {
        exact_owner(request(ip_proto::UDP, NLM_F_REQUEST, AF_INET, local, peer))
    }

    /// Waits (at most 5 s) for `done`: a socket closed here shows as closed only once
    /// every process holding it let go, and a process another test forks meanwhile holds
    /// a copy of every descriptor until it execs. The caller asserts afterwards.
    fn settle(mut done: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !done() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn a_tcp_peer_is_owned_by_this_process_user_and_a_stranger_address_by_no_one() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (served, peer) = listener.accept().unwrap();
        let local = v4(served.local_addr().unwrap());
        assert_eq!(v4(peer), v4(client.local_addr().unwrap()));
        assert_eq!(tcp_owner(v4(peer), local).unwrap(), Some(me()));
        // A port nobody is connected from.
        let nobody = SocketAddrV4::new(Ipv4Addr::LOCALHOST, v4(peer).port() ^ 1);
        assert_eq!(tcp_owner(nobody, local).unwrap(), None);
        // Closed by the client while the server holds its end: the client's socket waits
        // in FIN_WAIT2 without a process (reported with uid 0 and no inode): no one.
        drop(client);
        settle(|| tcp_owner(v4(peer), local).unwrap().is_none());
        assert_eq!(tcp_owner(v4(peer), local).unwrap(), None);
        // Closed by both: TIME_WAIT on the client's side, which no one owns either.
        drop(served);
        settle(|| tcp_owner(v4(peer), local).unwrap().is_none());
        assert_eq!(tcp_owner(v4(peer), local).unwrap(), None);
    }

    #[test]
    fn a_udp_peer_is_owned_by_this_process_user_whether_bound_to_loopback_or_any() {
        let served = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let local = v4(served.local_addr().unwrap());
        for bind in [Ipv4Addr::LOCALHOST, Ipv4Addr::UNSPECIFIED] {
            let client = UdpSocket::bind((bind, 0)).unwrap();
            client.send_to(b"x", local).unwrap();
            let mut buf = [0u8; 4];
            let (_, peer) = served.recv_from(&mut buf).unwrap();
            assert_eq!(best_match(v4(peer), local).unwrap(), Some(me()), "{bind}");
            assert_eq!(udp_owners(v4(peer)).unwrap(), vec![Some(me())], "{bind}");
            drop(client);
            settle(|| {
                best_match(v4(peer), local).unwrap().is_none()
                    && udp_owners(v4(peer)).unwrap().is_empty()
            });
            assert_eq!(best_match(v4(peer), local).unwrap(), None, "{bind}");
            assert_eq!(udp_owners(v4(peer)).unwrap(), vec![], "{bind}");
        }
    }

    /// A TCP client of `to` in a process of another user (nobody, 65534), as only root can
    /// make one: its own address, and the process (killed on drop of the child by the test).
    fn stranger_connects(to: SocketAddr) -> Option<(std::process::Child, SocketAddrV4)> {
        if me() != 0 {
            return None;
        }
        let (child, line) = as_nobody(&format!(
            "import socket, sys, time\ns = socket.create_connection(('127.0.0.1', {}))\nprint(s.getsockname()[1], flush=True)\ntime.sleep(30)",
            to.port()
        ));
        let port: u16 = line.trim().parse().unwrap();
        Some((child, SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)))
    }

    /// Runs a Python `script` as nobody (65534; only root can): the process, and the
    /// first line it prints.
    fn as_nobody(script: &str) -> (std::process::Child, String) {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
            ])
            .arg(script)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        (child, line)
    }

    /// As root, the uid read is another user's, not 0 (which a misread field would give).
    #[test]
    fn a_tcp_peer_of_another_user_is_owned_by_that_user() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let Some((mut child, peer)) = stranger_connects(listener.local_addr().unwrap()) else {
            say!("skipped: only root can make a client of another user");
            return;
        };
        let (served, from) = listener.accept().unwrap();
        assert_eq!(v4(from), peer);
        let local = v4(served.local_addr().unwrap());
        let found = tcp_owner(peer, local).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found, Some(65534));
        assert!(!may_reach(65534));
    }

    /// Sockets of two users can share a UDP port (SO_REUSEADDR): the kernel's best match
    /// for the sender's address is root's socket, but the datagram came from nobody's.
    /// Every socket on the port is named, so nobody's is seen.
    #[test]
    fn every_udp_socket_sharing_the_senders_port_is_named() {
        if me() != 0 {
            say!("skipped: only root can make a socket of another user");
            return;
        }
        let served = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let local = v4(served.local_addr().unwrap());
        let ours = rustix::net::socket(
            rustix::net::AddressFamily::INET,
            rustix::net::SocketType::DGRAM,
            None,
        )
        .unwrap();
        rustix::net::sockopt::set_socket_reuseaddr(&ours, true).unwrap();
        rustix::net::bind(&ours, &SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
        let shared = match rustix::net::getsockname(&ours).unwrap().try_into().unwrap() {
            SocketAddr::V4(a) => a.port(),
            SocketAddr::V6(_) => panic!("not IPv4"),
        };
        let (mut child, _) = as_nobody(&format!(
            "import socket, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(('0.0.0.0', {shared}))\ns.sendto(b'x', ('127.0.0.1', {}))\nprint('sent', flush=True)\ntime.sleep(10)",
            local.port()
        ));
        let mut buf = [0u8; 4];
        let (_, peer) = served.recv_from(&mut buf).unwrap();
        let best = best_match(v4(peer), local).unwrap();
        let all = udp_owners(v4(peer)).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(v4(peer).port(), shared);
        assert_eq!(best, Some(0), "the kernel's best match is root's socket");
        assert!(
            all.contains(&Some(65534)) && all.contains(&Some(0)),
            "{all:?}"
        );
        drop(ours);
    }

    #[test]
    fn only_this_user_and_root_may_reach() {
        assert!(may_reach(me()));
        assert!(may_reach(0));
        assert!(!may_reach(me().wrapping_add(1).max(1)));
    }
}
