//! The address guard: the gateway never connects to a private, loopback, link-local, metadata
//! or otherwise blocked address, however the name or the address is spelled.
//!
//! # The contract (smokescreen's order of checks)
//!
//! 1. The policy ACL decides on the *name* first; a denied name is never resolved.
//! 2. [`AddressGuard::vet`] turns the host into one address to dial:
//!    - an IP literal, in any spelling a client library or `inet_aton` accepts
//!      ([`parse_ip_literal`]: `0x7f.1`, `2130706433`, `[::ffff:127.0.0.1]`,
//!      `fe80::1%eth0`, …), is classified as it is;
//!    - a host that looks numeric but is not a valid literal (`127.0.0.1.1`, `0x7g.1`) is
//!      refused, never handed to a resolver ([`looks_numeric`]);
//!    - any other name is resolved **once**, **every** answer is classified, and the name is
//!      refused if **any** answer is blocked (stricter than smokescreen, which dials the first
//!      answer that passes). No answer is a refusal too.
//! 3. **The caller dials exactly the [`SocketAddr`] that `vet` returned, and nothing else.**
//!    It must never resolve the name again, never pass the name to a connect helper
//!    (`TcpStream::connect((host, port))`, an HTTP client's own resolver, a SOCKS
//!    `CONNECT name`), and never fall back to another address it did not vet. A second
//!    lookup reopens DNS rebinding: the name can answer a public address to the check and
//!    127.0.0.1 to the connect.
//!
//! # What counts as blocked
//!
//! The reviewed table `data/blocked-ranges.txt` (embedded, parsed at first use) lists every
//! blocked range with the reason. IPv6 addresses that carry an IPv4 address (mapped,
//! compatible, translated, NAT64, 6to4, Teredo) are blocked by default even when the embedded
//! address is public; the embedded address is reported, and classified as well when the
//! embedding range has been opened. Only a CIDR the user names explicitly opens a blocked
//! range, and only when it lies inside that range (see [`AddressGuard::new`]).

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::str::FromStr;
use std::sync::OnceLock;

use capgate_policy::Reason;
use ipnet::IpNet;

/// The reviewed table of blocked ranges, as written (`data/blocked-ranges.txt`).
pub const BLOCKED_RANGES_SOURCE: &str = include_str!("../data/blocked-ranges.txt");

/// The longest host name a resolver accepts (RFC 1035, without the trailing dot).
const MAX_NAME_LEN: usize = 253;
/// The longest DNS label (RFC 1035).
const MAX_LABEL_LEN: usize = 63;
/// How much of a hostile host name a message quotes.
const MAX_SHOWN_LEN: usize = 200;

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

/// One entry of the blocked-range table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedRange {
    /// The range, with no host bits set.
    pub net: IpNet,
    /// What the range is, completing "…, which is `<why>` (`<net>`)".
    pub why: &'static str,
    /// The line of `data/blocked-ranges.txt` it comes from (1-based).
    pub line: usize,
}

/// A malformed line in the blocked-range table. Any of these fails the tests and makes
/// [`AddressGuard::new`] fail: a range is never silently dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("blocked-ranges.txt:{line}: `{cidr}` has no label; write `{cidr}  # what it is`")]
    MissingLabel { line: usize, cidr: String },
    #[error("blocked-ranges.txt:{line}: `{text}` is not a CIDR (address/prefix-length)")]
    InvalidCidr {
        line: usize,
        text: String,
        #[source]
        source: ipnet::AddrParseError,
    },
    #[error("blocked-ranges.txt:{line}: `{cidr}` has host bits set; write `{network}`")]
    HostBitsSet {
        line: usize,
        cidr: IpNet,
        network: IpNet,
    },
    #[error("blocked-ranges.txt:{line}: `{cidr}` is already listed on line {first}")]
    Duplicate {
        line: usize,
        cidr: IpNet,
        first: usize,
    },
    #[error("blocked-ranges.txt: the table lists no range")]
    Empty,
}

/// Parses a blocked-range table: `CIDR  # label` per entry; blank lines and lines starting
/// with `#` are comments. Every other line must be a valid entry.
pub fn parse_blocked_ranges(text: &'static str) -> Result<Vec<BlockedRange>, TableError> {
    let mut ranges: Vec<BlockedRange> = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (cidr_text, why) = match trimmed.split_once('#') {
            Some((cidr, why)) if !why.trim().is_empty() => (cidr.trim(), why.trim()),
            Some((cidr, _)) => (cidr.trim(), ""),
            None => (trimmed, ""),
        };
        if why.is_empty() {
            return Err(TableError::MissingLabel {
                line,
                cidr: cidr_text.to_owned(),
            });
        }
        let net = IpNet::from_str(cidr_text).map_err(|source| TableError::InvalidCidr {
            line,
            text: cidr_text.to_owned(),
            source,
        })?;
        if net.trunc() != net {
            return Err(TableError::HostBitsSet {
                line,
                cidr: net,
                network: net.trunc(),
            });
        }
        if let Some(first) = ranges.iter().find(|r| r.net == net) {
            return Err(TableError::Duplicate {
                line,
                cidr: net,
                first: first.line,
            });
        }
        ranges.push(BlockedRange { net, why, line });
    }
    if ranges.is_empty() {
        return Err(TableError::Empty);
    }
    Ok(ranges)
}

/// The embedded table, parsed once at first use.
pub fn blocked_ranges() -> Result<&'static [BlockedRange], TableError> {
    static TABLE: OnceLock<Result<Vec<BlockedRange>, TableError>> = OnceLock::new();
    match TABLE.get_or_init(|| parse_blocked_ranges(BLOCKED_RANGES_SOURCE)) {
        Ok(ranges) => Ok(ranges),
        Err(error) => Err(error.clone()),
    }
}

// ---------------------------------------------------------------------------------------------
// IPv4 embedded in IPv6
// ---------------------------------------------------------------------------------------------

/// An IPv6 form that carries an IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Embedding {
    /// `::ffff:a.b.c.d` (RFC 4291).
    Mapped,
    /// `::a.b.c.d` (RFC 4291, deprecated).
    Compatible,
    /// `::ffff:0:a.b.c.d` (RFC 2765, SIIT).
    Translated,
    /// `64:ff9b::a.b.c.d` (RFC 6052 well-known prefix).
    Nat64,
    /// `2002:aabb:ccdd::/48` (RFC 3056).
    SixToFour,
    /// `2001:0:server:flags:port:client` with the client address inverted (RFC 4380).
    Teredo,
}

impl Embedding {
    /// The form as a noun phrase: "a NAT64 address".
    pub fn noun(self) -> &'static str {
        match self {
            Embedding::Mapped => "an IPv4-mapped address",
            Embedding::Compatible => "an IPv4-compatible address",
            Embedding::Translated => "an IPv4-translated address",
            Embedding::Nat64 => "a NAT64 address",
            Embedding::SixToFour => "a 6to4 address",
            Embedding::Teredo => "a Teredo address",
        }
    }
}

/// The IPv4 address an IPv6 address carries, and in which form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Embedded {
    pub form: Embedding,
    pub ipv4: Ipv4Addr,
}

/// Extracts the IPv4 address embedded in an IPv6 address, if it has one of the known forms.
/// `::` and `::1` are not IPv4-compatible addresses (they are unspecified and loopback). The
/// local-use NAT64 prefix `64:ff9b:1::/48` places the IPv4 address where the operator chose,
/// so it is not extracted (the prefix is blocked as a whole).
pub fn embedded_ipv4(addr: Ipv6Addr) -> Option<Embedded> {
    let s = addr.segments();
    let last32 = Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7]));
    let embedded = |form, ipv4| Some(Embedded { form, ipv4 });
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => embedded(Embedding::Mapped, last32),
        [0, 0, 0, 0, 0xffff, 0, _, _] => embedded(Embedding::Translated, last32),
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, _, _] => embedded(Embedding::Compatible, last32),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => embedded(Embedding::Nat64, last32),
        [0x2002, hi, lo, ..] => embedded(
            Embedding::SixToFour,
            Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)),
        ),
        [0x2001, 0, ..] => embedded(Embedding::Teredo, Ipv4Addr::from(!u32::from(last32))),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Classification
// ---------------------------------------------------------------------------------------------

/// Why an address may not be dialled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    /// The address that was classified.
    pub addr: IpAddr,
    /// The most specific blocked range that was not opened. For an IPv6 address whose
    /// embedding range was opened, this is the range of the embedded IPv4 address.
    pub range: IpNet,
    /// What the range is (from the table).
    pub why: &'static str,
    /// The IPv4 address the IPv6 address carries, if any.
    pub embedded: Option<Embedded>,
}

impl fmt::Display for Blocked {
    /// `127.0.0.1, which is loopback (127.0.0.0/8)`;
    /// `64:ff9b::808:808 (a NAT64 address embedding 8.8.8.8), which is the NAT64 …`;
    /// `64:ff9b::a00:1, a NAT64 address embedding 10.0.0.1, which is private (…)` when the
    /// embedded address is what is blocked.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Blocked {
            addr,
            range,
            why,
            embedded,
        } = self;
        match embedded {
            Some(e) if range.contains(addr) => write!(
                f,
                "{addr} ({} embedding {}), which is {why} ({range})",
                e.form.noun(),
                e.ipv4
            ),
            Some(e) => write!(
                f,
                "{addr}, {} embedding {}, which is {why} ({range})",
                e.form.noun(),
                e.ipv4
            ),
            None => write!(f, "{addr}, which is {why} ({range})"),
        }
    }
}

/// The class of one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// In no blocked range.
    Public,
    /// In a blocked range that an explicit user CIDR opened (worth an audit line).
    Opened {
        /// The most specific blocked range the address is in.
        range: IpNet,
        why: &'static str,
        /// The user's CIDR that opened it.
        by: IpNet,
    },
    /// Blocked: never dialled.
    Blocked(Blocked),
}

impl Class {
    /// Whether the gateway may dial the address.
    pub fn is_dialable(&self) -> bool {
        !matches!(self, Class::Blocked(_))
    }
}

// ---------------------------------------------------------------------------------------------
// Literals and numeric-looking names
// ---------------------------------------------------------------------------------------------

/// Parses every spelling of an IP address that a client library, a WHATWG URL parser or
/// `inet_aton` would read as one, so that none of them slips through as a "name":
///
/// - IPv4 with 1 to 4 parts (`127.1`, `127.0.1`, `2130706433`), each part decimal, octal
///   (leading `0`: `0177`) or hex (`0x7f`, `0X7F`, and a bare `0x` is 0), the last part
///   filling the remaining bytes; one trailing dot (`127.0.0.1.`) is allowed;
/// - IPv6, bracketed or not, with an optional zone id (`fe80::1%eth0`, `[fe80::1%25eth0]`;
///   the zone is dropped), including the IPv4-in-IPv6 text forms (`::ffff:127.0.0.1`).
///
/// Returns `None` for anything else; [`looks_numeric`] then says whether to refuse it.
pub fn parse_ip_literal(s: &str) -> Option<IpAddr> {
    if let Some(inner) = s.strip_prefix('[') {
        return parse_ipv6_with_zone(inner.strip_suffix(']')?).map(IpAddr::V6);
    }
    if s.contains(':') {
        return parse_ipv6_with_zone(s).map(IpAddr::V6);
    }
    parse_ipv4_lenient(s).map(IpAddr::V4)
}

fn parse_ipv6_with_zone(s: &str) -> Option<Ipv6Addr> {
    let addr = match s.split_once('%') {
        Some((addr, zone)) => {
            let zone_ok = !zone.is_empty()
                && zone
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b));
            if !zone_ok {
                return None;
            }
            addr
        }
        None => s,
    };
    Ipv6Addr::from_str(addr).ok()
}

/// The WHATWG URL Standard's IPv4 parser (which agrees with `inet_aton` wherever both accept
/// an input), without its validation warnings.
fn parse_ipv4_lenient(s: &str) -> Option<Ipv4Addr> {
    let s = s.strip_suffix('.').unwrap_or(s);
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let numbers = parts
        .iter()
        .map(|part| parse_ipv4_number(part))
        .collect::<Option<Vec<u32>>>()?;
    let (&last, init) = numbers.split_last()?;
    if init.iter().any(|&n| n > 0xff) {
        return None;
    }
    // The last part fills the bytes the others left: 8 bits for a.b.c.d, 32 for a single
    // number.
    let last_bits = 8 * (5 - numbers.len());
    if last_bits < 32 && last >> last_bits != 0 {
        return None;
    }
    let mut value = last;
    for (i, &n) in init.iter().enumerate() {
        value |= n << (24 - 8 * i);
    }
    Some(Ipv4Addr::from(value))
}

/// One IPv4 part: `0x`/`0X` hex (a bare `0x` is 0), leading-`0` octal, or decimal.
fn parse_ipv4_number(part: &str) -> Option<u32> {
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16)
        } else if part.len() > 1 {
            match part.strip_prefix('0') {
                Some(octal) => (octal, 8),
                None => (part, 10),
            }
        } else if part.is_empty() {
            return None;
        } else {
            (part, 10)
        };
    digits.chars().try_fold(0u32, |value, c| {
        value.checked_mul(radix)?.checked_add(c.to_digit(radix)?)
    })
}

/// Whether a client could read the host as an address rather than a name: it contains `:`,
/// `%`, `[` or `]`, or its last label (after one trailing dot) is a number (all digits, or
/// `0x` followed by hex digits), which is the URL Standard's "ends in a number". True for
/// every valid literal too; a host that looks numeric but is not a valid literal
/// (`127.0.0.1.1`, `0x7g.1`, `1.2.3.4.5`) must be refused, never resolved.
pub fn looks_numeric(host: &str) -> bool {
    if host.bytes().any(|b| matches!(b, b':' | b'%' | b'[' | b']')) {
        return true;
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    let last = host.rsplit('.').next().unwrap_or(host);
    if let Some(hex) = last.strip_prefix("0x").or_else(|| last.strip_prefix("0X")) {
        return hex.bytes().all(|b| b.is_ascii_hexdigit());
    }
    !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `host` is a syntactically valid DNS name (ASCII letters, digits, `-` and `_`,
/// labels of 1 to 63 bytes, at most 253 bytes, one optional trailing dot). Internationalised
/// names must arrive in `xn--` form.
fn is_valid_name(host: &str) -> bool {
    let name = host.strip_suffix('.').unwrap_or(host);
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= MAX_LABEL_LEN
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// The form names are compared in: ASCII lowercase, without a trailing dot.
fn normalize_name(host: &str) -> String {
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

// ---------------------------------------------------------------------------------------------
// Resolution
// ---------------------------------------------------------------------------------------------

/// A name resolver. The guard calls it at most once per [`AddressGuard::vet`].
pub trait Resolve {
    /// Every address the name has, in the resolver's order.
    fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError>;
}

/// Why a name could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("`{}` is not a known name", Shown(.host))]
    NotFound { host: String },
    #[error("looking up `{}` failed", Shown(.host))]
    Lookup {
        host: String,
        #[source]
        source: io::Error,
    },
}

/// A fixed name → addresses table: for tests, and the base of `--dangerously-resolve`.
/// Names are compared case-insensitively and without a trailing dot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaticResolver(HashMap<String, Vec<IpAddr>>);

impl StaticResolver {
    pub fn new() -> Self {
        StaticResolver::default()
    }

    /// Adds `ips` to the answers for `host`.
    pub fn insert(&mut self, host: &str, ips: impl IntoIterator<Item = IpAddr>) {
        self.0.entry(normalize_name(host)).or_default().extend(ips);
    }

    /// Builder form of [`StaticResolver::insert`].
    pub fn with(mut self, host: &str, ips: impl IntoIterator<Item = IpAddr>) -> Self {
        self.insert(host, ips);
        self
    }

    fn lookup(&self, host: &str) -> Option<&[IpAddr]> {
        self.0.get(&normalize_name(host)).map(Vec::as_slice)
    }
}

impl From<HashMap<String, Vec<IpAddr>>> for StaticResolver {
    fn from(map: HashMap<String, Vec<IpAddr>>) -> Self {
        map.into_iter().collect()
    }
}

impl<S: AsRef<str>> FromIterator<(S, Vec<IpAddr>)> for StaticResolver {
    fn from_iter<T: IntoIterator<Item = (S, Vec<IpAddr>)>>(iter: T) -> Self {
        let mut resolver = StaticResolver::new();
        for (host, ips) in iter {
            resolver.insert(host.as_ref(), ips);
        }
        resolver
    }
}

impl Resolve for StaticResolver {
    fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
        self.lookup(host)
            .map(<[IpAddr]>::to_vec)
            .ok_or_else(|| ResolveError::NotFound {
                host: host.to_owned(),
            })
    }
}

/// The system resolver (`getaddrinfo` through [`ToSocketAddrs`]). Blocking.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
        let answers = (host, 0)
            .to_socket_addrs()
            .map_err(|source| ResolveError::Lookup {
                host: host.to_owned(),
                source,
            })?;
        let mut ips: Vec<IpAddr> = Vec::new();
        for answer in answers {
            if !ips.contains(&answer.ip()) {
                ips.push(answer.ip());
            }
        }
        Ok(ips)
    }
}

// ---------------------------------------------------------------------------------------------
// `--dangerously-resolve HOST=IP`
// ---------------------------------------------------------------------------------------------

/// A `--dangerously-resolve HOST=IP` mapping: the name resolves to that address, and the
/// address is dialled even when it is blocked (mapping a name onto 127.0.0.1 is the point:
/// tests and local development). The opening is scoped to the name: the same address written
/// as a literal, or reached through any other name, stays blocked. The caller logs every
/// mapping loudly at start-up ([`AddressGuard::dangerous_mappings`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DangerousMapping {
    host: String,
    ip: IpAddr,
}

/// A `--dangerously-resolve` argument that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    #[error("`{}` is not of the form HOST=IP", Shown(.arg))]
    MissingEquals { arg: String },
    #[error("`{}` is an address, not a name; only names can be mapped", Shown(.host))]
    NumericHost { host: String },
    #[error("`{}` is not a valid host name", Shown(.host))]
    InvalidHost { host: String },
    #[error("`{}` is not an IP address", Shown(.value))]
    InvalidAddress { value: String },
}

impl DangerousMapping {
    pub fn new(host: &str, ip: IpAddr) -> Result<Self, MappingError> {
        if looks_numeric(host) {
            return Err(MappingError::NumericHost {
                host: host.to_owned(),
            });
        }
        if !is_valid_name(host) {
            return Err(MappingError::InvalidHost {
                host: host.to_owned(),
            });
        }
        Ok(DangerousMapping {
            host: normalize_name(host),
            ip,
        })
    }

    /// The mapped name, lowercase and without a trailing dot.
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn ip(&self) -> IpAddr {
        self.ip
    }
}

impl FromStr for DangerousMapping {
    type Err = MappingError;

    /// `HOST=IP`, the IP in any spelling [`parse_ip_literal`] accepts.
    fn from_str(arg: &str) -> Result<Self, MappingError> {
        let (host, value) = arg
            .split_once('=')
            .ok_or_else(|| MappingError::MissingEquals {
                arg: arg.to_owned(),
            })?;
        let ip = parse_ip_literal(value.trim()).ok_or_else(|| MappingError::InvalidAddress {
            value: value.to_owned(),
        })?;
        DangerousMapping::new(host.trim(), ip)
    }
}

impl fmt::Display for DangerousMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.host, self.ip)
    }
}

// ---------------------------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------------------------

/// Why [`AddressGuard::vet`] gives no address to dial. The `Display` text is the 403 (or 502)
/// body.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The host is an IP literal in a blocked range.
    #[error("`{}` is {blocked}", Shown(.host))]
    BlockedLiteral { host: String, blocked: Blocked },
    /// The name resolved to at least one blocked address.
    #[error("`{}` resolves to {blocked}", Shown(.host))]
    BlockedAnswer {
        host: String,
        /// The first blocked answer.
        blocked: Blocked,
        /// Every answer the resolver gave, for the audit log.
        answers: Vec<IpAddr>,
    },
    /// The host looks like a number but is not a valid IP literal.
    #[error(
        "`{}` looks like an IP address but is not a valid one, so it is not resolved",
        Shown(.host)
    )]
    AmbiguousNumeric { host: String },
    /// The host is neither an IP literal nor a valid DNS name.
    #[error("`{}` is not a valid host name", Shown(.host))]
    InvalidHost { host: String },
    /// The resolver answered with no address.
    #[error("`{}` resolves to no address", Shown(.host))]
    NoAddress { host: String },
    /// The resolver failed.
    #[error("could not resolve `{}`", Shown(.host))]
    Unresolvable {
        host: String,
        #[source]
        source: ResolveError,
    },
}

impl Refusal {
    /// The text for the response body.
    pub fn message(&self) -> String {
        self.to_string()
    }

    /// The blocked address, when an address was what got refused.
    pub fn blocked(&self) -> Option<&Blocked> {
        match self {
            Refusal::BlockedLiteral { blocked, .. } | Refusal::BlockedAnswer { blocked, .. } => {
                Some(blocked)
            }
            _ => None,
        }
    }

    /// The host as the client sent it.
    pub fn host(&self) -> &str {
        match self {
            Refusal::BlockedLiteral { host, .. }
            | Refusal::BlockedAnswer { host, .. }
            | Refusal::AmbiguousNumeric { host }
            | Refusal::InvalidHost { host }
            | Refusal::NoAddress { host }
            | Refusal::Unresolvable { host, .. } => host,
        }
    }

    /// The policy reason for a refusal (a 403); `None` when the name simply did not resolve,
    /// which is an upstream failure (a 502), not a policy decision.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            Refusal::BlockedLiteral { .. } | Refusal::BlockedAnswer { .. } => {
                Some(Reason::BlockedAddress)
            }
            Refusal::AmbiguousNumeric { .. } | Refusal::InvalidHost { .. } => {
                Some(Reason::InvalidTarget)
            }
            Refusal::NoAddress { .. } | Refusal::Unresolvable { .. } => None,
        }
    }
}

/// A host name as quoted in a message: control and non-ASCII characters escaped, long names
/// cut.
struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (written, c) in self.0.chars().enumerate() {
            if written >= MAX_SHOWN_LEN {
                return f.write_str("…");
            }
            if c.is_ascii_graphic() {
                write!(f, "{c}")?;
            } else {
                write!(f, "{}", c.escape_default())?;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The guard
// ---------------------------------------------------------------------------------------------

/// Classifies addresses against the blocked ranges and vets hosts into one address to dial.
#[derive(Debug, Clone)]
pub struct AddressGuard {
    table: &'static [BlockedRange],
    openings: Vec<IpNet>,
    mappings: HashMap<String, Vec<IpAddr>>,
}

impl AddressGuard {
    /// A guard over the embedded table. `extra_allowed` are the IPs and CIDRs the user named
    /// explicitly in rules; nothing else opens a blocked range.
    ///
    /// An opening applies to a blocked range only if it lies inside it: `10.1.0.0/16` opens
    /// 10.1.x.x but not 10.2.x.x; `0.0.0.0/0` or `::/0` opens nothing. Where ranges nest
    /// (169.254.169.254/32 inside 169.254.0.0/16), every range that holds the address must be
    /// opened, so opening link-local does not open the metadata service; naming
    /// `169.254.169.254` does. An IPv4-mapped, NAT64, 6to4 or Teredo address needs its IPv6
    /// range opened *and* its embedded IPv4 address to be public or opened.
    pub fn new(extra_allowed: Vec<IpNet>) -> Result<Self, TableError> {
        let mut openings: Vec<IpNet> = extra_allowed.iter().map(IpNet::trunc).collect();
        openings.dedup();
        Ok(AddressGuard {
            table: blocked_ranges()?,
            openings,
            mappings: HashMap::new(),
        })
    }

    /// Adds `--dangerously-resolve` mappings (see [`DangerousMapping`]). The caller must log
    /// each one loudly, as a warning, when the gateway starts.
    pub fn with_dangerous_mappings(
        mut self,
        mappings: impl IntoIterator<Item = DangerousMapping>,
    ) -> Self {
        for mapping in mappings {
            let ips = self.mappings.entry(mapping.host).or_default();
            if !ips.contains(&mapping.ip) {
                ips.push(mapping.ip);
            }
        }
        self
    }

    /// The `--dangerously-resolve` mappings in effect, for the start-up warning.
    pub fn dangerous_mappings(&self) -> impl Iterator<Item = (&str, &[IpAddr])> {
        self.mappings
            .iter()
            .map(|(host, ips)| (host.as_str(), ips.as_slice()))
    }

    /// The blocked-range table in use.
    pub fn table(&self) -> &'static [BlockedRange] {
        self.table
    }

    /// The user's openings, truncated to their networks.
    pub fn openings(&self) -> &[IpNet] {
        &self.openings
    }

    /// Openings that lie inside no blocked range, and so open nothing (a public range needs
    /// no opening; a range wider than a blocked one does not open it). Worth a warning.
    pub fn ineffective_openings(&self) -> Vec<IpNet> {
        self.openings
            .iter()
            .filter(|opening| !self.table.iter().any(|r| r.net.contains(*opening)))
            .copied()
            .collect()
    }

    /// Classifies one address.
    pub fn classify(&self, ip: IpAddr) -> Class {
        self.classify_with(ip, &[])
    }

    /// Classifies one address with `extra` openings besides the guard's own (those that
    /// hold now: see [`AddressGuard::vet_with`]).
    pub fn classify_with(&self, ip: IpAddr, extra: &[IpNet]) -> Class {
        let mut blocked: Option<&BlockedRange> = None;
        let mut opened: Option<(&BlockedRange, IpNet)> = None;
        for range in self.table.iter().filter(|r| r.net.contains(&ip)) {
            let more_specific =
                |other: &BlockedRange| range.net.prefix_len() > other.net.prefix_len();
            match self.opening_for(ip, range.net, extra) {
                Some(by) => {
                    if opened.is_none_or(|(other, _)| more_specific(other)) {
                        opened = Some((range, by));
                    }
                }
                None => {
                    if blocked.is_none_or(more_specific) {
                        blocked = Some(range);
                    }
                }
            }
        }
        let embedded = match ip {
            IpAddr::V6(v6) => embedded_ipv4(v6),
            IpAddr::V4(_) => None,
        };
        if let Some(range) = blocked {
            return Class::Blocked(Blocked {
                addr: ip,
                range: range.net,
                why: range.why,
                embedded,
            });
        }
        if let Some(e) = embedded
            && let Class::Blocked(inner) = self.classify_with(IpAddr::V4(e.ipv4), extra)
        {
            return Class::Blocked(Blocked {
                addr: ip,
                range: inner.range,
                why: inner.why,
                embedded: Some(e),
            });
        }
        match opened {
            Some((range, by)) => Class::Opened {
                range: range.net,
                why: range.why,
                by,
            },
            None => Class::Public,
        }
    }

    /// The user opening that opens `ip` inside `range`, if any.
    fn opening_for(&self, ip: IpAddr, range: IpNet, extra: &[IpNet]) -> Option<IpNet> {
        self.openings
            .iter()
            .chain(extra)
            .map(IpNet::trunc)
            .find(|opening| opening.contains(&ip) && range.contains(opening))
    }

    /// Turns a host (literal or name) and port into the one address to dial.
    ///
    /// **The caller dials the returned address and nothing else: it never resolves `host`
    /// again, never hands `host` to a connect helper or client library, and never tries an
    /// address this function did not return.** Anything else reopens DNS rebinding.
    ///
    /// - An IP literal in any spelling ([`parse_ip_literal`]) is classified as it is.
    /// - A host that [`looks_numeric`] but is no valid literal is refused.
    /// - A `--dangerously-resolve` name answers its mapped address, which is dialled even if
    ///   blocked; the resolver is not asked.
    /// - Any other valid name is resolved exactly once; every answer is classified; one
    ///   blocked answer refuses the name; no answer refuses it; otherwise the first answer is
    ///   returned.
    pub fn vet(
        &self,
        host: &str,
        port: u16,
        resolver: &dyn Resolve,
    ) -> Result<SocketAddr, Refusal> {
        self.vet_with(host, port, resolver, &[])
    }

    /// [`AddressGuard::vet`] with `extra` openings besides the guard's own: the ones the
    /// user's rules hold at this moment (in this phase), which change while the guard
    /// lives.
    pub fn vet_with(
        &self,
        host: &str,
        port: u16,
        resolver: &dyn Resolve,
        extra: &[IpNet],
    ) -> Result<SocketAddr, Refusal> {
        if let Some(ip) = parse_ip_literal(host) {
            return match self.classify_with(ip, extra) {
                Class::Blocked(blocked) => Err(Refusal::BlockedLiteral {
                    host: host.to_owned(),
                    blocked,
                }),
                Class::Public | Class::Opened { .. } => Ok(SocketAddr::new(ip, port)),
            };
        }
        if looks_numeric(host) {
            return Err(Refusal::AmbiguousNumeric {
                host: host.to_owned(),
            });
        }
        if !is_valid_name(host) {
            return Err(Refusal::InvalidHost {
                host: host.to_owned(),
            });
        }
        if let Some(ips) = self.mappings.get(&normalize_name(host)) {
            return match ips.first() {
                Some(&ip) => Ok(SocketAddr::new(ip, port)),
                None => Err(Refusal::NoAddress {
                    host: host.to_owned(),
                }),
            };
        }
        let answers = resolver
            .resolve(host)
            .map_err(|source| Refusal::Unresolvable {
                host: host.to_owned(),
                source,
            })?;
        let first_blocked = answers
            .iter()
            .find_map(|&ip| match self.classify_with(ip, extra) {
                Class::Blocked(blocked) => Some(blocked),
                Class::Public | Class::Opened { .. } => None,
            });
        if let Some(blocked) = first_blocked {
            return Err(Refusal::BlockedAnswer {
                host: host.to_owned(),
                blocked,
                answers,
            });
        }
        match answers.first() {
            Some(&ip) => Ok(SocketAddr::new(ip, port)),
            None => Err(Refusal::NoAddress {
                host: host.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        reason = "tests"
    )]

    use super::*;

    #[test]
    fn the_embedded_table_parses_and_keeps_every_entry_line() {
        let ranges = blocked_ranges().unwrap();
        let entry_lines = BLOCKED_RANGES_SOURCE
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .count();
        assert_eq!(ranges.len(), entry_lines);
    }

    #[test]
    fn malformed_table_lines_are_errors() {
        type Expect = fn(&TableError) -> bool;
        let cases: [(&'static str, Expect); 6] = [
            ("10.0.0.0/8", |e| {
                matches!(e, TableError::MissingLabel { line: 1, .. })
            }),
            ("10.0.0.0/8   #   ", |e| {
                matches!(e, TableError::MissingLabel { .. })
            }),
            ("10.0.0.0 # no prefix", |e| {
                matches!(e, TableError::InvalidCidr { .. })
            }),
            ("10.0.0.0/33 # too long", |e| {
                matches!(e, TableError::InvalidCidr { .. })
            }),
            ("# c\n10.0.0.1/8 # host bits", |e| {
                matches!(e, TableError::HostBitsSet { line: 2, .. })
            }),
            ("10.0.0.0/8 # a\n\n10.0.0.0/8 # b", |e| {
                matches!(
                    e,
                    TableError::Duplicate {
                        line: 3,
                        first: 1,
                        ..
                    }
                )
            }),
        ];
        for (text, expected) in cases {
            let error = parse_blocked_ranges(text).unwrap_err();
            assert!(expected(&error), "{text:?} gave {error:?}");
        }
        assert_eq!(parse_blocked_ranges("# only\n\n"), Err(TableError::Empty));
    }

    #[test]
    fn table_error_messages_name_the_line() {
        let error = parse_blocked_ranges("10.0.0.1/8 # x").unwrap_err();
        assert_eq!(
            error.to_string(),
            "blocked-ranges.txt:1: `10.0.0.1/8` has host bits set; write `10.0.0.0/8`"
        );
    }

    #[test]
    fn ipv4_numbers() {
        assert_eq!(parse_ipv4_number("0x"), Some(0));
        assert_eq!(parse_ipv4_number("0XfF"), Some(255));
        assert_eq!(parse_ipv4_number("0377"), Some(255));
        assert_eq!(parse_ipv4_number("08"), None);
        assert_eq!(parse_ipv4_number("0"), Some(0));
        assert_eq!(parse_ipv4_number(""), None);
        assert_eq!(parse_ipv4_number("4294967295"), Some(u32::MAX));
        assert_eq!(parse_ipv4_number("4294967296"), None);
        assert_eq!(parse_ipv4_number("0x1_0"), None);
        assert_eq!(parse_ipv4_number("+1"), None);
    }

    #[test]
    fn embedded_forms() {
        let cases = [
            ("::ffff:10.0.0.1", Embedding::Mapped, "10.0.0.1"),
            ("::ffff:0:10.0.0.1", Embedding::Translated, "10.0.0.1"),
            ("::10.0.0.1", Embedding::Compatible, "10.0.0.1"),
            ("64:ff9b::a00:1", Embedding::Nat64, "10.0.0.1"),
            ("2002:a00:1::1", Embedding::SixToFour, "10.0.0.1"),
            (
                "2001:0:4136:e378:8000:63bf:3fff:fdd2",
                Embedding::Teredo,
                "192.0.2.45",
            ),
        ];
        for (v6, form, v4) in cases {
            let e = embedded_ipv4(v6.parse().unwrap()).unwrap();
            assert_eq!((e.form, e.ipv4.to_string().as_str()), (form, v4), "{v6}");
        }
        for none in ["::", "::1", "64:ff9c::1", "2001:db8::1", "64:ff9b:1::a00:1"] {
            assert_eq!(embedded_ipv4(none.parse().unwrap()), None, "{none}");
        }
    }

    #[test]
    fn shown_escapes_control_characters() {
        assert_eq!(Shown("a\nb\u{e9}").to_string(), "a\\nb\\u{e9}");
    }
}
