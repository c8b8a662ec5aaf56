//! The address guard: no spelling of a blocked address, and no name resolving to one, gets an
//! address to dial. Every case is classified or resolved through `StaticResolver`; no test
//! opens a connection or asks a real resolver.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use capgate_gateway::addr::{
    AddressGuard, BLOCKED_RANGES_SOURCE, Class, DangerousMapping, MappingError, Refusal, Resolve,
    ResolveError, StaticResolver, blocked_ranges, looks_numeric, parse_ip_literal,
};
use capgate_policy::Reason;
use ipnet::IpNet;
use proptest::prelude::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn guard() -> AddressGuard {
    AddressGuard::new(Vec::new()).unwrap()
}

fn guard_opening(openings: &[&str]) -> AddressGuard {
    AddressGuard::new(openings.iter().map(|o| net(o)).collect()).unwrap()
}

/// A resolver that counts its calls, answering from a `StaticResolver`.
struct Counting {
    inner: StaticResolver,
    calls: Cell<usize>,
}

impl Counting {
    fn new(inner: StaticResolver) -> Self {
        Counting {
            inner,
            calls: Cell::new(0),
        }
    }
}

impl Resolve for Counting {
    fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
        self.calls.set(self.calls.get() + 1);
        self.inner.resolve(host)
    }
}

/// Every spelling of a blocked address: (as written, the address it means, the range
/// reported).
const BLOCKED_LITERALS: &[(&str, &str, &str)] = &[
    // 127.0.0.1
    ("127.0.0.1", "127.0.0.1", "127.0.0.0/8"),
    ("127.0.0.1.", "127.0.0.1", "127.0.0.0/8"),
    ("127.1", "127.0.0.1", "127.0.0.0/8"),
    ("127.0.1", "127.0.0.1", "127.0.0.0/8"),
    ("2130706433", "127.0.0.1", "127.0.0.0/8"),
    ("0x7f000001", "127.0.0.1", "127.0.0.0/8"),
    ("0X7F000001", "127.0.0.1", "127.0.0.0/8"),
    ("0x7f.1", "127.0.0.1", "127.0.0.0/8"),
    ("0x7F.0.0.1", "127.0.0.1", "127.0.0.0/8"),
    ("0177.0.0.1", "127.0.0.1", "127.0.0.0/8"),
    ("0177.0.0.01", "127.0.0.1", "127.0.0.0/8"),
    ("017700000001", "127.0.0.1", "127.0.0.0/8"),
    ("127.000.000.001", "127.0.0.1", "127.0.0.0/8"),
    ("0x7f.0.0.01", "127.0.0.1", "127.0.0.0/8"),
    ("0x7f.0x0.0x0.0x1", "127.0.0.1", "127.0.0.0/8"),
    ("00000000177.0.0.1", "127.0.0.1", "127.0.0.0/8"),
    ("0x00000000007f.1", "127.0.0.1", "127.0.0.0/8"),
    ("0177.1.", "127.0.0.1", "127.0.0.0/8"),
    ("127.255.255.255", "127.255.255.255", "127.0.0.0/8"),
    ("127.16777215", "127.255.255.255", "127.0.0.0/8"),
    ("0x7f.0xffffff", "127.255.255.255", "127.0.0.0/8"),
    // 10.0.0.1
    ("10.0.0.1", "10.0.0.1", "10.0.0.0/8"),
    ("10.1", "10.0.0.1", "10.0.0.0/8"),
    ("10.0.1", "10.0.0.1", "10.0.0.0/8"),
    ("167772161", "10.0.0.1", "10.0.0.0/8"),
    ("0xa000001", "10.0.0.1", "10.0.0.0/8"),
    ("012.0.0.1", "10.0.0.1", "10.0.0.0/8"),
    ("012.1", "10.0.0.1", "10.0.0.0/8"),
    ("0xa.0.0.1", "10.0.0.1", "10.0.0.0/8"),
    ("0x0a.0x00.0x00.0x01", "10.0.0.1", "10.0.0.0/8"),
    ("01200000001", "10.0.0.1", "10.0.0.0/8"),
    // 169.254.169.254, the metadata service (reported as such, not as link-local)
    ("169.254.169.254", "169.254.169.254", "169.254.169.254/32"),
    ("2852039166", "169.254.169.254", "169.254.169.254/32"),
    ("0xa9fea9fe", "169.254.169.254", "169.254.169.254/32"),
    ("0xA9FEA9FE", "169.254.169.254", "169.254.169.254/32"),
    (
        "0251.0376.0251.0376",
        "169.254.169.254",
        "169.254.169.254/32",
    ),
    (
        "0xa9.0xfe.0xa9.0xfe",
        "169.254.169.254",
        "169.254.169.254/32",
    ),
    ("169.254.43518", "169.254.169.254", "169.254.169.254/32"),
    ("169.16689662", "169.254.169.254", "169.254.169.254/32"),
    ("0251.0xfe.43518", "169.254.169.254", "169.254.169.254/32"),
    ("169.254.169.254.", "169.254.169.254", "169.254.169.254/32"),
    ("169.254.170.2", "169.254.170.2", "169.254.170.2/32"),
    ("169.254.0.1", "169.254.0.1", "169.254.0.0/16"),
    // 0.0.0.0 (reaches local listeners)
    ("0", "0.0.0.0", "0.0.0.0/8"),
    ("0.0.0.0", "0.0.0.0", "0.0.0.0/8"),
    ("0x0", "0.0.0.0", "0.0.0.0/8"),
    ("0x", "0.0.0.0", "0.0.0.0/8"),
    ("00", "0.0.0.0", "0.0.0.0/8"),
    ("0.0", "0.0.0.0", "0.0.0.0/8"),
    ("0.", "0.0.0.0", "0.0.0.0/8"),
    ("000.000.000.000", "0.0.0.0", "0.0.0.0/8"),
    ("0.1.2.3", "0.1.2.3", "0.0.0.0/8"),
    // 192.168.1.1
    ("192.168.1.1", "192.168.1.1", "192.168.0.0/16"),
    ("3232235777", "192.168.1.1", "192.168.0.0/16"),
    ("0xc0a80101", "192.168.1.1", "192.168.0.0/16"),
    ("0300.0250.1.1", "192.168.1.1", "192.168.0.0/16"),
    ("192.168.257", "192.168.1.1", "192.168.0.0/16"),
    ("192.11010305", "192.168.1.1", "192.168.0.0/16"),
    ("0xc0.0xa8.0x01.0x01", "192.168.1.1", "192.168.0.0/16"),
    // the rest of the IPv4 table
    ("172.16.0.1", "172.16.0.1", "172.16.0.0/12"),
    ("172.31.255.255", "172.31.255.255", "172.16.0.0/12"),
    ("100.64.0.1", "100.64.0.1", "100.64.0.0/10"),
    ("100.127.255.254", "100.127.255.254", "100.64.0.0/10"),
    ("100.100.100.200", "100.100.100.200", "100.100.100.200/32"),
    ("168.63.129.16", "168.63.129.16", "168.63.129.16/32"),
    ("192.0.0.1", "192.0.0.1", "192.0.0.0/24"),
    ("192.0.0.192", "192.0.0.192", "192.0.0.192/32"),
    ("192.0.2.1", "192.0.2.1", "192.0.2.0/24"),
    ("192.88.99.1", "192.88.99.1", "192.88.99.0/24"),
    ("198.18.0.1", "198.18.0.1", "198.18.0.0/15"),
    ("198.19.255.255", "198.19.255.255", "198.18.0.0/15"),
    ("198.51.100.7", "198.51.100.7", "198.51.100.0/24"),
    ("203.0.113.9", "203.0.113.9", "203.0.113.0/24"),
    ("224.0.0.1", "224.0.0.1", "224.0.0.0/4"),
    ("239.255.255.250", "239.255.255.250", "224.0.0.0/4"),
    ("240.0.0.1", "240.0.0.1", "240.0.0.0/4"),
    ("255.255.255.255", "255.255.255.255", "255.255.255.255/32"),
    ("4294967295", "255.255.255.255", "255.255.255.255/32"),
    ("0xffffffff", "255.255.255.255", "255.255.255.255/32"),
    // IPv6 loopback and unspecified
    ("::1", "::1", "::1/128"),
    ("0:0:0:0:0:0:0:1", "::1", "::1/128"),
    ("0000:0000:0000:0000:0000:0000:0000:0001", "::1", "::1/128"),
    ("[::1]", "::1", "::1/128"),
    ("[0:0::1]", "::1", "::1/128"),
    ("::", "::", "::/128"),
    ("[::]", "::", "::/128"),
    ("0::0", "::", "::/128"),
    // IPv4 inside IPv6 text forms
    ("::ffff:127.0.0.1", "::ffff:7f00:1", "::ffff:0:0/96"),
    ("::ffff:7f00:1", "::ffff:7f00:1", "::ffff:0:0/96"),
    ("::FFFF:7F00:1", "::ffff:7f00:1", "::ffff:0:0/96"),
    ("[::ffff:127.0.0.1]", "::ffff:7f00:1", "::ffff:0:0/96"),
    ("0:0:0:0:0:ffff:127.0.0.1", "::ffff:7f00:1", "::ffff:0:0/96"),
    (
        "::ffff:169.254.169.254",
        "::ffff:a9fe:a9fe",
        "::ffff:0:0/96",
    ),
    ("::ffff:8.8.8.8", "::ffff:808:808", "::ffff:0:0/96"),
    ("::127.0.0.1", "::7f00:1", "::/96"),
    ("::7f00:1", "::7f00:1", "::/96"),
    ("[::10.0.0.1]", "::a00:1", "::/96"),
    ("::ffff:0:127.0.0.1", "::ffff:0:7f00:1", "::ffff:0:0:0/96"),
    // unique local, link-local (with zones), site-local, multicast
    ("fc00::1", "fc00::1", "fc00::/7"),
    ("fd12:3456:789a::1", "fd12:3456:789a::1", "fc00::/7"),
    ("[fd00::1]", "fd00::1", "fc00::/7"),
    ("FD00::ABCD", "fd00::abcd", "fc00::/7"),
    ("fe80::1", "fe80::1", "fe80::/10"),
    ("fe80::1%eth0", "fe80::1", "fe80::/10"),
    ("[fe80::1%eth0]", "fe80::1", "fe80::/10"),
    ("[fe80::1%25eth0]", "fe80::1", "fe80::/10"),
    ("FE80::1%lo", "fe80::1", "fe80::/10"),
    ("febf:ffff::1", "febf:ffff::1", "fe80::/10"),
    ("fec0::1", "fec0::1", "fec0::/10"),
    ("ff02::1", "ff02::1", "ff00::/8"),
    ("ff02::2", "ff02::2", "ff00::/8"),
    ("ff05::1:3", "ff05::1:3", "ff00::/8"),
    // NAT64, 6to4 and Teredo, even when they embed a public address
    ("64:ff9b::a00:1", "64:ff9b::a00:1", "64:ff9b::/96"),
    ("64:ff9b::10.0.0.1", "64:ff9b::a00:1", "64:ff9b::/96"),
    ("64:ff9b::808:808", "64:ff9b::808:808", "64:ff9b::/96"),
    ("64:ff9b::7f00:1", "64:ff9b::7f00:1", "64:ff9b::/96"),
    ("64:ff9b:1::a00:1", "64:ff9b:1::a00:1", "64:ff9b:1::/48"),
    ("2002:a00:1::1", "2002:a00:1::1", "2002::/16"),
    ("2002:7f00:1::", "2002:7f00:1::", "2002::/16"),
    ("2002:808:808::1", "2002:808:808::1", "2002::/16"),
    (
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        "2001::/32",
    ),
    ("2001::1", "2001::1", "2001::/32"),
    // metadata over IPv6, documentation, discard, benchmarking
    ("fd00:ec2::254", "fd00:ec2::254", "fd00:ec2::254/128"),
    ("[fd00:ec2::254]", "fd00:ec2::254", "fd00:ec2::254/128"),
    (
        "fd00:0ec2:0:0:0:0:0:0254",
        "fd00:ec2::254",
        "fd00:ec2::254/128",
    ),
    ("fd20:ce::254", "fd20:ce::254", "fd20:ce::254/128"),
    ("2001:db8::1", "2001:db8::1", "2001:db8::/32"),
    ("3fff::1", "3fff::1", "3fff::/20"),
    ("100::1", "100::1", "100::/64"),
    ("2001:2::1", "2001:2::1", "2001:2::/48"),
];

/// Public addresses, including the boundaries just outside blocked ranges. They are only
/// classified, never contacted.
const PUBLIC_LITERALS: &[(&str, &str)] = &[
    ("100.63.255.254", "100.63.255.254"),
    ("100.128.0.1", "100.128.0.1"),
    ("8.8.8.8", "8.8.8.8"),
    ("134744072", "8.8.8.8"),
    ("0x8.0x8.0x8.0x8", "8.8.8.8"),
    // Octal: 010 is 8, so this is 8.8.8.8, not 10.10.10.10.
    ("010.010.010.010", "8.8.8.8"),
    ("010.0.0.1", "8.0.0.1"),
    ("1.1.1.1", "1.1.1.1"),
    ("1.1", "1.0.0.1"),
    ("9.255.255.255", "9.255.255.255"),
    ("11.0.0.1", "11.0.0.1"),
    ("126.255.255.255", "126.255.255.255"),
    ("128.0.0.1", "128.0.0.1"),
    ("169.253.255.255", "169.253.255.255"),
    ("169.255.0.1", "169.255.0.1"),
    ("172.15.255.255", "172.15.255.255"),
    ("172.32.0.1", "172.32.0.1"),
    ("192.167.255.255", "192.167.255.255"),
    ("192.169.0.1", "192.169.0.1"),
    ("198.17.255.255", "198.17.255.255"),
    ("198.20.0.1", "198.20.0.1"),
    ("223.255.255.255", "223.255.255.255"),
    ("64:ff9c::1", "64:ff9c::1"),
    ("64:ff9b:0:0:0:1::1", "64:ff9b::1:0:1"),
    ("2001:4860:4860::8888", "2001:4860:4860::8888"),
    ("[2001:4860:4860::8888]", "2001:4860:4860::8888"),
    ("2606:4700:4700::1111", "2606:4700:4700::1111"),
    ("2606:4700:4700:0:0:0:0:1111", "2606:4700:4700::1111"),
    ("2001:1::1", "2001:1::1"),
    ("2003::1", "2003::1"),
];

/// Hosts that look numeric but are no valid address: refused, never resolved.
const AMBIGUOUS_NUMERIC: &[&str] = &[
    "127.0.0.1.1",
    "0x7g.1",
    "1.2.3.4.5",
    "127.0.0.256",
    "256.0.0.1",
    "08.0.0.1",
    "0x7f.0.0.0.1",
    "4294967296",
    "0x100000000",
    "1.2.3.08",
    "999999999999",
    "127.65536.1",
    "a.b.c.1",
    "example.123",
    "evil.0x7f",
    "1.2.3.4.0x",
    "127..1",
    ".127.0.0.1",
    "[127.0.0.1]",
    "[::1",
    "::1]",
    "[evil.example]",
    "::ffff:127.0.0.1.1",
    "::ffff:127.1",
    "::ffff:0177.0.0.1",
    "fe80::1%",
    "fe80::1%eth 0",
    ":::1",
    "1:2:3:4:5:6:7:8:9",
    "127.0.0.1%eth0",
    "[::1]:80",
    "127.0.0.1:80",
    "evil.example:443",
    "%31%32%37.0.0.1",
    "::1.",
    " 127.0.0.1",
    "\u{ff11}\u{ff12}\u{ff17}.0.0.1",
];

/// Neither an address nor a valid DNS name: refused, never resolved.
const INVALID_HOSTS: &[&str] = &[
    "",
    ".",
    "..",
    "evil..example",
    "ev il.example",
    "evil.example\n",
    "127.0.0.1 ",
    "127.0.0.1..",
    "\u{e9}vil.example",
    // IDNA would map the ideographic full stop to `.`; names must arrive as ASCII.
    "127\u{3002}0\u{3002}0\u{3002}1",
    "a/b.example",
    "user@evil.example",
    "evil.example\\",
    "evil.example..",
];

#[test]
fn every_spelling_of_a_blocked_address_is_blocked_and_never_resolved() {
    let guard = guard();
    let resolver = Counting::new(StaticResolver::new());
    for &(spelling, canonical, range) in BLOCKED_LITERALS {
        assert_eq!(
            parse_ip_literal(spelling),
            Some(ip(canonical)),
            "{spelling}"
        );
        assert!(looks_numeric(spelling), "{spelling}");
        match guard.classify(ip(canonical)) {
            Class::Blocked(blocked) => {
                assert_eq!(blocked.range, net(range), "{spelling}");
                assert_eq!(blocked.addr, ip(canonical), "{spelling}");
            }
            other => panic!("{spelling} classified as {other:?}"),
        }
        match guard.vet(spelling, 443, &resolver) {
            Err(refusal @ Refusal::BlockedLiteral { .. }) => {
                assert_eq!(refusal.reason(), Some(Reason::BlockedAddress));
                assert_eq!(refusal.blocked().map(|b| b.addr), Some(ip(canonical)));
                assert_eq!(refusal.host(), spelling);
            }
            other => panic!("{spelling}: {other:?}"),
        }
    }
    assert_eq!(resolver.calls.get(), 0);
}

#[test]
fn public_literals_are_dialled_as_written() {
    let guard = guard();
    let resolver = Counting::new(StaticResolver::new());
    for &(spelling, canonical) in PUBLIC_LITERALS {
        assert_eq!(
            parse_ip_literal(spelling),
            Some(ip(canonical)),
            "{spelling}"
        );
        assert_eq!(guard.classify(ip(canonical)), Class::Public, "{spelling}");
        let addr = guard.vet(spelling, 443, &resolver).unwrap();
        assert_eq!(addr, SocketAddr::new(ip(canonical), 443), "{spelling}");
    }
    assert_eq!(resolver.calls.get(), 0);
}

#[test]
fn numeric_looking_hosts_that_are_no_address_are_refused_unresolved() {
    let guard = guard();
    // Even if some resolver would answer them with a public address.
    let mut answers = StaticResolver::new();
    for host in AMBIGUOUS_NUMERIC {
        answers.insert(host, [ip("8.8.8.8")]);
    }
    let resolver = Counting::new(answers);
    for &host in AMBIGUOUS_NUMERIC {
        assert_eq!(parse_ip_literal(host), None, "{host}");
        assert!(looks_numeric(host), "{host}");
        match guard.vet(host, 443, &resolver) {
            Err(refusal @ Refusal::AmbiguousNumeric { .. }) => {
                assert_eq!(refusal.reason(), Some(Reason::InvalidTarget));
            }
            other => panic!("{host:?}: {other:?}"),
        }
    }
    assert_eq!(resolver.calls.get(), 0);
}

#[test]
fn invalid_host_names_are_refused_unresolved() {
    let guard = guard();
    let resolver = Counting::new(StaticResolver::new());
    let long_label = format!("{}.example", "a".repeat(64));
    let long_name = format!("{}example", "a.".repeat(127));
    let hosts = INVALID_HOSTS
        .iter()
        .copied()
        .chain([long_label.as_str(), long_name.as_str()]);
    for host in hosts {
        assert_eq!(parse_ip_literal(host), None, "{host:?}");
        match guard.vet(host, 443, &resolver) {
            Err(refusal @ Refusal::InvalidHost { .. }) => {
                assert_eq!(refusal.reason(), Some(Reason::InvalidTarget));
            }
            other => panic!("{host:?}: {other:?}"),
        }
    }
    assert_eq!(resolver.calls.get(), 0);
}

#[test]
fn names_that_are_not_numeric() {
    for host in [
        "example.com",
        "bad.cafe",
        "dead.beef",
        "1password.com",
        "127.0.0.1.nip.io",
        "0x7f.example",
        "127.0.0.0x1g",
        "7f000001",
        "1e3",
        "xn--bcher-kva.example.",
        "localhost",
    ] {
        assert!(!looks_numeric(host), "{host}");
        assert_eq!(parse_ip_literal(host), None, "{host}");
    }
}

/// How a name must fare: (name, its answers, the blocked answer reported, or None if the
/// first answer is dialled).
const RESOLVED_NAMES: &[(&str, &[&str], Option<&str>)] = &[
    ("evil.example", &["127.0.0.1"], Some("127.0.0.1")),
    ("localhost", &["127.0.0.1", "::1"], Some("127.0.0.1")),
    ("ip6-localhost", &["::1"], Some("::1")),
    ("127.0.0.1.nip.io", &["127.0.0.1"], Some("127.0.0.1")),
    (
        "metadata.google.internal",
        &["169.254.169.254"],
        Some("169.254.169.254"),
    ),
    (
        "instance-data.ec2.internal",
        &["fd00:ec2::254"],
        Some("fd00:ec2::254"),
    ),
    (
        "aliyun.example",
        &["100.100.100.200"],
        Some("100.100.100.200"),
    ),
    ("lan.example", &["192.168.1.10"], Some("192.168.1.10")),
    ("cgnat.example", &["100.64.0.1"], Some("100.64.0.1")),
    ("zero.example", &["0.0.0.0"], Some("0.0.0.0")),
    ("any6.example", &["::"], Some("::")),
    (
        "mapped.example",
        &["::ffff:127.0.0.1"],
        Some("::ffff:127.0.0.1"),
    ),
    (
        "nat64.example",
        &["64:ff9b::808:808"],
        Some("64:ff9b::808:808"),
    ),
    (
        "sixtofour.example",
        &["2002:a00:1::1"],
        Some("2002:a00:1::1"),
    ),
    (
        "teredo.example",
        &["2001:0:4136:e378:8000:63bf:3fff:fdd2"],
        Some("2001:0:4136:e378:8000:63bf:3fff:fdd2"),
    ),
    ("ula.example", &["fd12::1"], Some("fd12::1")),
    ("linklocal.example", &["fe80::1"], Some("fe80::1")),
    ("multicast.example", &["ff02::1"], Some("ff02::1")),
    // A mix of public and blocked answers is refused, whatever the order.
    ("rebind.example", &["8.8.8.8", "10.0.0.1"], Some("10.0.0.1")),
    (
        "rebind2.example",
        &["10.0.0.1", "8.8.8.8"],
        Some("10.0.0.1"),
    ),
    (
        "rebind6.example",
        &["2606:4700:4700::1111", "1.1.1.1", "fd00::1"],
        Some("fd00::1"),
    ),
    (
        "many.example",
        &["1.1.1.1", "8.8.8.8", "172.16.5.4", "127.0.0.1"],
        Some("172.16.5.4"),
    ),
    // Public names get their first answer.
    ("public.example", &["8.8.8.8", "2001:4860:4860::8888"], None),
    (
        "PUBLIC6.Example.",
        &["2606:4700:4700::1111", "1.1.1.1"],
        None,
    ),
    ("edge.example", &["100.63.255.254", "100.128.0.1"], None),
    ("near-nat64.example", &["64:ff9c::1"], None),
];

#[test]
fn names_are_resolved_once_and_every_answer_is_classified() {
    let guard = guard();
    for &(name, answers, blocked) in RESOLVED_NAMES {
        let answers: Vec<IpAddr> = answers.iter().map(|a| ip(a)).collect();
        let resolver = Counting::new(StaticResolver::new().with(name, answers.clone()));
        let outcome = guard.vet(name, 443, &resolver);
        assert_eq!(resolver.calls.get(), 1, "{name} resolved more than once");
        match (blocked, outcome) {
            (None, Ok(addr)) => assert_eq!(addr, SocketAddr::new(answers[0], 443), "{name}"),
            (Some(expected), Err(refusal)) => {
                assert_eq!(refusal.reason(), Some(Reason::BlockedAddress), "{name}");
                assert_eq!(
                    refusal.blocked().map(|b| b.addr),
                    Some(ip(expected)),
                    "{name}"
                );
                match refusal {
                    Refusal::BlockedAnswer { answers: all, .. } => assert_eq!(all, answers),
                    other => panic!("{name}: {other:?}"),
                }
            }
            (expected, outcome) => panic!("{name}: expected {expected:?}, got {outcome:?}"),
        }
    }
}

#[test]
fn a_name_with_no_answer_or_no_record_is_refused() {
    let guard = guard();
    let resolver = StaticResolver::new().with("empty.example", []);
    let refusal = guard.vet("empty.example", 443, &resolver).unwrap_err();
    assert!(matches!(refusal, Refusal::NoAddress { .. }), "{refusal:?}");
    assert_eq!(refusal.reason(), None);
    assert_eq!(refusal.message(), "`empty.example` resolves to no address");

    let refusal = guard.vet("unknown.example", 443, &resolver).unwrap_err();
    assert!(
        matches!(refusal, Refusal::Unresolvable { .. }),
        "{refusal:?}"
    );
    assert_eq!(refusal.message(), "could not resolve `unknown.example`");
}

#[test]
fn refusals_say_which_address_and_why() {
    let guard = guard();
    let resolver = StaticResolver::new()
        .with("evil.example", [ip("8.8.8.8"), ip("127.0.0.1")])
        .with("meta.example", [ip("169.254.169.254")]);
    let cases = [
        (
            "evil.example",
            "`evil.example` resolves to 127.0.0.1, which is loopback (127.0.0.0/8)",
        ),
        (
            "meta.example",
            "`meta.example` resolves to 169.254.169.254, which is the cloud instance metadata \
             service (169.254.169.254/32)",
        ),
        (
            "0x7f.1",
            "`0x7f.1` is 127.0.0.1, which is loopback (127.0.0.0/8)",
        ),
        (
            "64:ff9b::a00:1",
            "`64:ff9b::a00:1` is 64:ff9b::a00:1 (a NAT64 address embedding 10.0.0.1), which \
             is the NAT64 well-known prefix (64:ff9b::/96)",
        ),
        (
            "[::ffff:127.0.0.1]",
            "`[::ffff:127.0.0.1]` is ::ffff:127.0.0.1 (an IPv4-mapped address embedding \
             127.0.0.1), which is an IPv4-mapped address (::ffff:0.0.0.0/96)",
        ),
        (
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "`2001:0:4136:e378:8000:63bf:3fff:fdd2` is 2001:0:4136:e378:8000:63bf:3fff:fdd2 \
             (a Teredo address embedding 192.0.2.45), which is a Teredo tunnel address \
             (2001::/32)",
        ),
        (
            "127.0.0.1.1",
            "`127.0.0.1.1` looks like an IP address but is not a valid one, so it is not \
             resolved",
        ),
        (
            "evil.example\n",
            "`evil.example\\n` is not a valid host name",
        ),
    ];
    for (host, message) in cases {
        assert_eq!(
            guard.vet(host, 443, &resolver).unwrap_err().message(),
            message
        );
    }
}

#[test]
fn an_explicit_cidr_opens_its_range_and_not_the_neighbour() {
    let cases: &[(&[&str], &str, bool)] = &[
        (&["10.1.0.0/16"], "10.1.2.3", true),
        (&["10.1.0.0/16"], "10.1.255.255", true),
        (&["10.1.0.0/16"], "10.2.0.1", false),
        (&["10.1.0.0/16"], "10.0.255.255", false),
        (&["192.168.1.0/24"], "192.168.1.1", true),
        (&["192.168.1.0/24"], "192.168.2.1", false),
        (&["127.0.0.1/32"], "127.0.0.1", true),
        (&["127.0.0.1/32"], "127.0.0.2", false),
        // A host-bits CIDR opens its network.
        (&["172.16.5.9/24"], "172.16.5.1", true),
        (&["172.16.5.9/24"], "172.16.6.1", false),
        // Nested ranges: link-local and CGNAT do not open the metadata inside them.
        (&["169.254.0.0/16"], "169.254.1.1", true),
        (&["169.254.0.0/16"], "169.254.169.254", false),
        (&["169.254.169.254/32"], "169.254.169.254", true),
        (&["100.64.0.0/10"], "100.64.0.1", true),
        (&["100.64.0.0/10"], "100.100.100.200", false),
        (&["fc00::/7"], "fd12::1", true),
        (&["fc00::/7"], "fd00:ec2::254", false),
        (&["fd00:ec2::254/128"], "fd00:ec2::254", true),
        // A CIDR wider than a blocked range opens nothing.
        (&["0.0.0.0/0", "::/0"], "127.0.0.1", false),
        (&["0.0.0.0/0", "::/0"], "::1", false),
        (&["8.0.0.0/6"], "10.0.0.1", false),
        // An IPv4 opening does not open its IPv6 spellings; the IPv6 range must be named.
        (&["10.0.0.0/8"], "::ffff:10.0.0.1", false),
        (&["10.0.0.0/8"], "64:ff9b::a00:1", false),
        (&["::ffff:0:0/96"], "::ffff:8.8.8.8", true),
        // With the IPv6 range opened, the embedded IPv4 address is still classified.
        (&["::ffff:0:0/96"], "::ffff:127.0.0.1", false),
        (&["64:ff9b::/96"], "64:ff9b::808:808", true),
        (&["64:ff9b::/96"], "64:ff9b::a00:1", false),
        (&["64:ff9b::/96", "10.0.0.0/8"], "64:ff9b::a00:1", true),
        (&["2002::/16"], "2002:a00:1::1", false),
        (&["2002::/16"], "2002:808:808::1", true),
    ];
    for &(openings, addr, open) in cases {
        let guard = guard_opening(openings);
        let class = guard.classify(ip(addr));
        assert_eq!(class.is_dialable(), open, "{openings:?} {addr}: {class:?}");
        if open {
            assert!(matches!(class, Class::Opened { .. }), "{class:?}");
        }
    }
}

#[test]
fn an_opened_embedding_range_reports_the_embedded_address() {
    let guard = guard_opening(&["64:ff9b::/96"]);
    let refusal = guard
        .vet("64:ff9b::a00:1", 443, &StaticResolver::new())
        .unwrap_err();
    assert_eq!(
        refusal.message(),
        "`64:ff9b::a00:1` is 64:ff9b::a00:1, a NAT64 address embedding 10.0.0.1, which is \
         private (RFC 1918) (10.0.0.0/8)"
    );
    assert_eq!(refusal.blocked().map(|b| b.range), Some(net("10.0.0.0/8")));
}

#[test]
fn openings_apply_to_resolved_answers_and_every_spelling() {
    let guard = guard_opening(&["192.168.1.0/24", "127.0.0.1/32"]);
    let resolver = StaticResolver::new()
        .with("printer.lan", [ip("192.168.1.5")])
        .with("nas.lan", [ip("192.168.1.6"), ip("192.168.2.6")]);
    assert_eq!(
        guard.vet("printer.lan", 631, &resolver).unwrap(),
        SocketAddr::new(ip("192.168.1.5"), 631)
    );
    assert!(guard.vet("nas.lan", 443, &resolver).is_err());
    assert_eq!(
        guard.vet("0x7f.1", 8080, &resolver).unwrap(),
        SocketAddr::new(ip("127.0.0.1"), 8080)
    );
    assert!(guard.vet("127.2", 8080, &resolver).is_err());
}

#[test]
fn ineffective_openings_are_reported() {
    let guard = guard_opening(&["0.0.0.0/0", "::/0", "8.8.8.0/24", "10.0.0.0/8"]);
    assert_eq!(
        guard.ineffective_openings(),
        vec![net("0.0.0.0/0"), net("::/0"), net("8.8.8.0/24")]
    );
}

#[test]
fn a_dangerous_mapping_resolves_to_a_blocked_address_for_that_name_only() {
    let mappings: Vec<DangerousMapping> = ["api.test=127.0.0.1", "db.test=[::1]", "db.test=0x7f.2"]
        .iter()
        .map(|m| m.parse().unwrap())
        .collect();
    let guard = guard().with_dangerous_mappings(mappings);
    let resolver = Counting::new(
        StaticResolver::new()
            .with("api.test", [ip("8.8.8.8")])
            .with("other.test", [ip("127.0.0.1")]),
    );
    assert_eq!(
        guard.vet("api.test", 8080, &resolver).unwrap(),
        SocketAddr::new(ip("127.0.0.1"), 8080)
    );
    assert_eq!(
        guard.vet("API.Test.", 8080, &resolver).unwrap(),
        SocketAddr::new(ip("127.0.0.1"), 8080)
    );
    assert_eq!(
        guard.vet("db.test", 5432, &resolver).unwrap(),
        SocketAddr::new(ip("::1"), 5432)
    );
    assert_eq!(resolver.calls.get(), 0, "a mapped name is not resolved");
    // The opening is scoped to the mapped name.
    assert!(guard.vet("127.0.0.1", 8080, &resolver).is_err());
    assert!(guard.vet("other.test", 8080, &resolver).is_err());
    assert_eq!(resolver.calls.get(), 1);
    let mut listed: Vec<(String, Vec<IpAddr>)> = guard
        .dangerous_mappings()
        .map(|(host, ips)| (host.to_owned(), ips.to_vec()))
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        vec![
            ("api.test".to_owned(), vec![ip("127.0.0.1")]),
            ("db.test".to_owned(), vec![ip("::1"), ip("127.0.0.2")]),
        ]
    );
}

#[test]
fn bad_dangerous_mappings_are_errors() {
    type Expect = fn(&MappingError) -> bool;
    let cases: &[(&str, Expect)] = &[
        ("api.test", |e| {
            matches!(e, MappingError::MissingEquals { .. })
        }),
        ("127.0.0.1=127.0.0.1", |e| {
            matches!(e, MappingError::NumericHost { .. })
        }),
        ("[::1]=127.0.0.1", |e| {
            matches!(e, MappingError::NumericHost { .. })
        }),
        ("api.test=localhost", |e| {
            matches!(e, MappingError::InvalidAddress { .. })
        }),
        ("api.test=", |e| {
            matches!(e, MappingError::InvalidAddress { .. })
        }),
        ("bad host=127.0.0.1", |e| {
            matches!(e, MappingError::InvalidHost { .. })
        }),
        ("=127.0.0.1", |e| {
            matches!(e, MappingError::InvalidHost { .. })
        }),
    ];
    for &(arg, expected) in cases {
        let error = arg.parse::<DangerousMapping>().unwrap_err();
        assert!(expected(&error), "{arg}: {error:?}");
    }
}

#[test]
fn the_table_holds_every_reviewed_range() {
    let ranges = blocked_ranges().unwrap();
    let required = [
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "100.100.100.200/32",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "169.254.169.254/32",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "255.255.255.255/32",
        "::/128",
        "::1/128",
        "::ffff:0:0/96",
        "::/96",
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "100::/64",
        "2001::/32",
        "2001:db8::/32",
        "2002::/16",
        "fc00::/7",
        "fe80::/10",
        "ff00::/8",
        "fd00:ec2::254/128",
    ];
    for cidr in required {
        let range = ranges.iter().find(|r| r.net == net(cidr));
        assert!(range.is_some_and(|r| !r.why.is_empty()), "{cidr} missing");
    }
    let entries = BLOCKED_RANGES_SOURCE
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    assert_eq!(ranges.len(), entries, "a table line was dropped");
}

proptest! {
    /// Every client spelling of every IPv4 address parses to that address.
    #[test]
    fn every_ipv4_spelling_parses_to_its_address(v in any::<u32>()) {
        let addr = Ipv4Addr::from(v);
        let [a, b, c, d] = addr.octets();
        let spellings = [
            format!("{a}.{b}.{c}.{d}"),
            format!("{a}.{b}.{c}.{d}."),
            format!("{v}"),
            format!("{v:#x}"),
            format!("{v:#X}").replace("0X", "0x"),
            format!("0{v:o}"),
            format!("{a}.{}", v & 0x00ff_ffff),
            format!("{a}.{b}.{}", v & 0xffff),
            format!("{a:#x}.{b:#x}.{c:#x}.{d:#x}"),
            format!("0{a:o}.0{b:o}.0{c:o}.0{d:o}"),
            format!("{a:#x}.0{b:o}.{}", v & 0xffff),
            format!("[::ffff:{a}.{b}.{c}.{d}]"),
        ];
        for (i, spelling) in spellings.iter().enumerate() {
            let expected = if i == spellings.len() - 1 {
                IpAddr::V6(addr.to_ipv6_mapped())
            } else {
                IpAddr::V4(addr)
            };
            prop_assert_eq!(parse_ip_literal(spelling), Some(expected), "{}", spelling);
        }
    }

    /// Whatever std parses as an address, the guard reads as the same address.
    #[test]
    fn agrees_with_std_where_std_accepts(s in "[0-9a-fA-F:.x]{1,24}") {
        if let Ok(std) = s.parse::<IpAddr>() {
            prop_assert_eq!(parse_ip_literal(&s), Some(std));
        }
    }

    /// A host is an address, a refused numeric-looking host, or a name that gets resolved;
    /// it never reaches a resolver while a client could read it as an address.
    #[test]
    fn nothing_numeric_reaches_the_resolver(s in "[0-9a-fxX.:\\[\\]%]{1,20}") {
        let guard = guard();
        let resolver = Counting::new(StaticResolver::new());
        let _ = guard.vet(&s, 443, &resolver);
        if parse_ip_literal(&s).is_some() || looks_numeric(&s) {
            prop_assert_eq!(resolver.calls.get(), 0);
        }
    }

    /// With the mapped, NAT64 and 6to4 ranges opened, their addresses are exactly as
    /// dialable as the IPv4 address they embed.
    #[test]
    fn ipv6_forms_follow_their_embedded_ipv4_once_opened(v in any::<u32>()) {
        let guard = guard_opening(&["::ffff:0:0/96", "64:ff9b::/96", "2002::/16"]);
        let v4 = Ipv4Addr::from(v);
        let dialable = guard.classify(IpAddr::V4(v4)).is_dialable();
        let [a, b, c, d] = v4.octets();
        for form in [
            format!("::ffff:{v4}"),
            format!("64:ff9b::{v4}"),
            format!("2002:{:x}:{:x}::1", u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d])),
        ] {
            prop_assert_eq!(guard.classify(ip(&form)).is_dialable(), dialable, "{}", form);
            prop_assert!(!self::guard().classify(ip(&form)).is_dialable(), "{}", form);
        }
    }
}
