//! The decision function. [`Matcher::compile`] turns a rule set into maps once;
//! [`Matcher::decide`] answers a query with a few lookups, never a scan over the rules.
//!
//! Layout: rules are partitioned by scope (the global rules, then one index per sandbox).
//! In each index, host names are keys of one map whose value lists the rules naming that
//! name exactly, as `*.name` and as `**.name`; a query for `a.b.example.com` looks up the
//! host itself (exact), its parent `b.example.com` (one label below, any depth) and every
//! further suffix (any depth). Addresses and networks are keyed by (prefix length, masked
//! address), looked up once per prefix length present. `*` and `**` sit in a short list
//! every query reads. Port, phase and protocol are checked on the few candidates found.
//!
//! Semantics (deny always wins, across every scope and source; see `decide`):
//! - a rule applies when its scope applies to the query's sandbox, its phase is unset or
//!   the query's, and its protocol covers the query's (`any` covers all, `tcp` covers
//!   `http` and `https`; a deny rule also applies where the traffic may be of its protocol:
//!   to a query for `any`, and an `http` or `https` deny to a query for `tcp`);
//! - an *unbounded* rule (no methods, no paths) speaks about the whole connection; a
//!   *bounded* rule only about the HTTP requests it matches;
//! - among several matching rules of the category that decides, the first in the order
//!   given to `compile` is the deciding rule.

use std::borrow::Cow;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::decision::{DenyKind, HttpRequest, Query, Reason, RuleRef, Target, Verdict};
use crate::path::{GlobError, PathError, PathGlob, normalize_path};
use crate::pattern::{
    HostForm, HostPattern, PatternError, PortSpec, is_canonical_host, normalize_host,
};
use crate::rule::{Decision, Method, Phase, Protocol, ResourceType, Rule, Scope, Source};

/// Why (part of) a rule could not be compiled. An allow rule with any problem is left out
/// entirely; a deny rule keeps every resource that parsed, and a method or path list it
/// cannot read is read as every method or every path (a malformed rule never allows, and
/// a malformed deny never denies less than what it clearly names).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("resource `{resource}` is malformed")]
    Resource {
        resource: String,
        #[source]
        source: PatternError,
    },
    #[error("path `{path}` is malformed")]
    Path {
        path: String,
        #[source]
        source: GlobError,
    },
    #[error("the rule names no resources")]
    NoResources,
    #[error("the rule states an empty method list")]
    EmptyMethods,
    #[error("the rule states an empty path list")]
    EmptyPaths,
    #[error("the rule set holds more rules than one matcher can index")]
    TooManyRules,
}

/// The hash of the matcher's maps: a folded multiply (as in `foldhash`) keyed by a random
/// seed per matcher. Several times faster than SipHash on short host names; the seed keeps
/// rule authors from choosing colliding names ahead of time.
#[derive(Debug, Clone, Copy)]
struct Seeded {
    seed: u64,
}

impl Seeded {
    fn new() -> Seeded {
        Seeded {
            seed: RandomState::new().build_hasher().finish() | 1,
        }
    }
}

impl Default for Seeded {
    fn default() -> Seeded {
        Seeded::new()
    }
}

impl BuildHasher for Seeded {
    type Hasher = FoldHasher;

    fn build_hasher(&self) -> FoldHasher {
        FoldHasher {
            acc: self.seed,
            seed: self.seed,
        }
    }
}

#[derive(Debug)]
struct FoldHasher {
    acc: u64,
    seed: u64,
}

const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

fn folded_multiply(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

impl Hasher for FoldHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.acc = folded_multiply(self.acc ^ u64::from_le_bytes(word), MULTIPLIER);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.acc = folded_multiply(
                self.acc ^ u64::from_le_bytes(word),
                MULTIPLIER ^ rest.len() as u64,
            );
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.acc = folded_multiply(self.acc ^ i, MULTIPLIER);
    }

    fn write_u128(&mut self, i: u128) {
        self.write_u64(i as u64);
        self.write_u64((i >> 64) as u64);
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }

    fn finish(&self) -> u64 {
        folded_multiply(self.acc, self.seed)
    }
}

type Map<K, V> = HashMap<K, V, Seeded>;

/// A method set as bits, in the order of [`Method::ALL`]; `ANY` sets every bit.
type MethodSet = u16;
const EVERY_METHOD: MethodSet = (1 << Method::ALL.len()) - 1;

fn method_bit(method: Method) -> MethodSet {
    let index = match method {
        Method::Get => 0,
        Method::Head => 1,
        Method::Post => 2,
        Method::Put => 3,
        Method::Patch => 4,
        Method::Delete => 5,
        Method::Options => 6,
        Method::Trace => 7,
        Method::Connect => 8,
        Method::Any => 9,
    };
    1 << index
}

/// `None` (not about methods) and any list holding `ANY` cover every method, extension
/// methods included (a query's `ANY` stands for an extension method).
fn method_set(methods: Option<&[Method]>) -> MethodSet {
    match methods {
        None => EVERY_METHOD,
        Some(list) if list.contains(&Method::Any) => EVERY_METHOD,
        Some(list) => list.iter().fold(0, |set, m| set | method_bit(*m)),
    }
}

/// What a compiled rule keeps beyond its index entries.
#[derive(Debug)]
struct CompiledRule {
    rule: RuleRef,
    /// "rule `NAME` (SOURCE)", as messages name it.
    label: Box<str>,
    methods: MethodSet,
    /// `None` for every path.
    paths: Option<Box<[PathGlob]>>,
}

impl CompiledRule {
    fn matches_request(&self, method: MethodSet, path: &str) -> bool {
        self.methods & method != 0
            && self
                .paths
                .as_deref()
                .is_none_or(|globs| globs.iter().any(|g| g.matches(path)))
    }
}

/// One (rule, resource) pair in an index, with what is needed to filter it without
/// touching the rule.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Position among the compiled rules (the order rules were given).
    rule: u32,
    port: PortSpec,
    phase: Option<Phase>,
    protocol: Protocol,
    decision: Decision,
    bounded: bool,
}

impl Entry {
    fn applies(&self, query: &Query) -> bool {
        self.port.matches(query.port)
            && self.phase.is_none_or(|p| p == query.phase)
            && (self.protocol.covers(query.protocol)
                // A deny also applies where the traffic may be of its protocol: a query for
                // `any`, or for `tcp` (which may carry HTTP or TLS) under an http/https deny.
                || (self.decision == Decision::Deny
                    && (query.protocol == Protocol::Any || query.protocol.covers(self.protocol))))
    }
}

/// The rules naming one host name, by how they name it.
#[derive(Debug, Default)]
struct NameEntries {
    exact: Vec<Entry>,
    one_label_below: Vec<Entry>,
    any_depth_below: Vec<Entry>,
}

/// Addresses and networks of one family, keyed by (prefix length, masked address).
#[derive(Debug, Default)]
struct NetworkIndex {
    /// The distinct prefix lengths present, ascending.
    prefixes: Vec<u8>,
    nets: Map<(u8, u128), Vec<Entry>>,
}

impl NetworkIndex {
    fn insert(&mut self, bits: u8, addr: u128, prefix: u8, entry: Entry) {
        if let Err(at) = self.prefixes.binary_search(&prefix) {
            self.prefixes.insert(at, prefix);
        }
        self.nets
            .entry((prefix, mask(addr, bits, prefix)))
            .or_default()
            .push(entry);
    }

    fn visit(&self, bits: u8, addr: u128, f: &mut impl FnMut(&Entry)) {
        for &prefix in &self.prefixes {
            if let Some(entries) = self.nets.get(&(prefix, mask(addr, bits, prefix))) {
                entries.iter().for_each(&mut *f);
            }
        }
    }
}

/// Keeps the top `prefix` bits of an address `bits` wide (stored in the low bits).
fn mask(addr: u128, bits: u8, prefix: u8) -> u128 {
    let width = u32::from(bits);
    let keep = u32::from(prefix.min(bits));
    let all = u128::MAX.checked_shr(128 - width).unwrap_or(0);
    let host_bits = all.checked_shr(keep).unwrap_or(0);
    addr & all & !host_bits
}

/// The rules of one scope.
#[derive(Debug, Default)]
struct Index {
    names: Map<Box<str>, NameEntries>,
    /// `*` and `**`.
    everything: Vec<Entry>,
    v4: NetworkIndex,
    v6: NetworkIndex,
}

impl Index {
    fn insert(&mut self, pattern: &HostPattern, entry: Entry) {
        fn at<'a>(names: &'a mut Map<Box<str>, NameEntries>, name: &str) -> &'a mut NameEntries {
            names.entry(name.into()).or_default()
        }
        match &pattern.host {
            HostForm::Exact(h) => at(&mut self.names, h).exact.push(entry),
            HostForm::OneLabelBelow(s) => at(&mut self.names, s).one_label_below.push(entry),
            HostForm::AnyDepthBelow(s) => at(&mut self.names, s).any_depth_below.push(entry),
            HostForm::Everything => self.everything.push(entry),
            HostForm::Network(IpNet::V4(n)) => {
                self.v4.insert(
                    32,
                    u128::from(u32::from(n.network())),
                    n.prefix_len(),
                    entry,
                );
            }
            HostForm::Network(IpNet::V6(n)) => {
                self.v6
                    .insert(128, u128::from(n.network()), n.prefix_len(), entry);
            }
        }
    }

    /// Calls `f` on every entry whose host part covers `target` (port, phase and protocol
    /// are the caller's to check).
    fn visit(&self, target: &CanonicalTarget<'_>, f: &mut impl FnMut(&Entry)) {
        match target {
            CanonicalTarget::Host(host) => {
                let host: &str = host;
                if let Some(n) = self.names.get(host) {
                    n.exact.iter().for_each(&mut *f);
                }
                let mut rest = host;
                let mut parent = true;
                while let Some(dot) = rest.bytes().position(|b| b == b'.') {
                    rest = rest.get(dot + 1..).unwrap_or_default();
                    if let Some(n) = self.names.get(rest) {
                        if parent {
                            n.one_label_below.iter().for_each(&mut *f);
                        }
                        n.any_depth_below.iter().for_each(&mut *f);
                    }
                    parent = false;
                }
            }
            CanonicalTarget::Ip(IpAddr::V4(v4)) => self.v4.visit(32, u128::from(u32::from(*v4)), f),
            CanonicalTarget::Ip(IpAddr::V6(v6)) => self.v6.visit(128, u128::from(*v6), f),
        }
        self.everything.iter().for_each(f);
    }

    fn shrink(&mut self) {
        self.names.shrink_to_fit();
        for n in self.names.values_mut() {
            n.exact.shrink_to_fit();
            n.one_label_below.shrink_to_fit();
            n.any_depth_below.shrink_to_fit();
        }
        self.everything.shrink_to_fit();
        self.v4.nets.shrink_to_fit();
        self.v6.nets.shrink_to_fit();
    }
}

/// The target in the form rules are indexed by.
#[derive(Debug)]
enum CanonicalTarget<'a> {
    Host(Cow<'a, str>),
    Ip(IpAddr),
}

impl CanonicalTarget<'_> {
    fn from_target(target: &Target) -> Result<CanonicalTarget<'_>, PatternError> {
        match target {
            Target::Ip(ip) => Ok(CanonicalTarget::Ip(ip.to_canonical())),
            Target::Host(h) if is_canonical_host(h) => Ok(CanonicalTarget::Host(Cow::Borrowed(h))),
            Target::Host(h) => match h.parse::<IpAddr>() {
                Ok(ip) => Ok(CanonicalTarget::Ip(ip.to_canonical())),
                Err(_) => normalize_host(h).map(|n| CanonicalTarget::Host(Cow::Owned(n))),
            },
        }
    }

    /// Appends `host`, `10.0.0.1` or `2001:db8::1`, or with a port `host:443`,
    /// `10.0.0.1:22` or `[2001:db8::1]:443`.
    fn push_to(&self, out: &mut String, port: Option<u16>) {
        // Writing to a `String` cannot fail.
        let _ = match (self, port) {
            (CanonicalTarget::Host(h), _) => {
                out.push_str(h);
                Ok(())
            }
            (CanonicalTarget::Ip(IpAddr::V6(v6)), Some(_)) => write!(out, "[{v6}]"),
            (CanonicalTarget::Ip(ip), _) => write!(out, "{ip}"),
        };
        if let Some(port) = port {
            out.push(':');
            push_decimal(out, port);
        }
    }
}

fn push_decimal(out: &mut String, n: u16) {
    let mut digits = [0u8; 5];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    digits[i..].iter().for_each(|d| out.push(char::from(*d)));
}

/// For each category of matching rule, the first (lowest position) found.
#[derive(Debug, Default)]
struct Tally {
    unbounded_deny: Option<u32>,
    unbounded_allow: Option<u32>,
    /// Bounded rules whose resources match the target (whatever the request).
    bounded_deny_host: Option<u32>,
    bounded_allow_host: Option<u32>,
    /// Bounded rules that also match the request's method and path.
    bounded_deny_request: Option<u32>,
    bounded_allow_request: Option<u32>,
}

fn keep_first(slot: &mut Option<u32>, rule: u32) {
    if slot.is_none_or(|s| rule < s) {
        *slot = Some(rule);
    }
}

fn first_of(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn source_label(source: Source) -> &'static str {
    match source {
        Source::Kit => "kit",
        Source::User => "user",
        Source::Default => "default",
    }
}

/// A rule set compiled for deciding. Cheap to share between threads (`Send + Sync`, no
/// interior mutability); rebuild it when the rules change.
#[derive(Debug)]
pub struct Matcher {
    rules: Vec<CompiledRule>,
    global: Index,
    sandboxes: Map<Box<str>, Index>,
    /// Address ranges user allow rules name explicitly (see [`Matcher::openings`]).
    openings: Vec<Opening>,
    /// The ports allow rules name (`host:PORT`), sorted (see [`Matcher::allowed_ports`]).
    allow_ports: Vec<u16>,
}

/// An IP or CIDR an active user allow rule names: the one way past the gateway's guard
/// against private, loopback and metadata addresses, for as long as the rule holds.
#[derive(Debug, Clone)]
struct Opening {
    net: ipnet::IpNet,
    sandbox: Option<Box<str>>,
    phase: Option<Phase>,
    protocol: Protocol,
}

impl Matcher {
    /// Compiles `rules`, leaving out inactive ones; see [`Matcher::compile_report`] for the
    /// rules that could not be read.
    pub fn compile(rules: &[Rule]) -> Matcher {
        Matcher::compile_report(rules).0
    }

    /// Compiles `rules` and reports every problem found, as (rule id, problem). An allow
    /// rule with a problem is left out; a deny rule is kept as wide as it can be read (see
    /// [`RuleError`]).
    pub fn compile_report(rules: &[Rule]) -> (Matcher, Vec<(String, RuleError)>) {
        let mut matcher = Matcher {
            rules: Vec::new(),
            global: Index::default(),
            sandboxes: Map::default(),
            openings: Vec::new(),
            allow_ports: Vec::new(),
        };
        let mut problems = Vec::new();
        for rule in rules {
            if !rule.active {
                continue;
            }
            match rule.resource_type {
                ResourceType::Network => {}
            }
            let Ok(position) = u32::try_from(matcher.rules.len()) else {
                problems.push((rule.id.clone(), RuleError::TooManyRules));
                break;
            };
            let mut errors = Vec::new();
            if rule.resources.is_empty() {
                errors.push(RuleError::NoResources);
            }
            let mut patterns = Vec::with_capacity(rule.resources.len());
            for resource in &rule.resources {
                match HostPattern::parse(resource) {
                    Ok(p) => patterns.push(p),
                    Err(source) => errors.push(RuleError::Resource {
                        resource: resource.clone(),
                        source,
                    }),
                }
            }
            let mut methods = method_set(rule.methods.as_deref());
            if methods == 0 {
                errors.push(RuleError::EmptyMethods);
            }
            let mut paths_readable = true;
            let mut paths = rule.paths.as_ref().map(|list| {
                if list.is_empty() {
                    errors.push(RuleError::EmptyPaths);
                    paths_readable = false;
                }
                let mut globs = Vec::with_capacity(list.len());
                for path in list {
                    match PathGlob::compile(path) {
                        Ok(g) => globs.push(g),
                        Err(source) => {
                            errors.push(RuleError::Path {
                                path: path.clone(),
                                source,
                            });
                            paths_readable = false;
                        }
                    }
                }
                globs.into_boxed_slice()
            });
            if !errors.is_empty() {
                problems.extend(errors.into_iter().map(|e| (rule.id.clone(), e)));
                match rule.decision {
                    Decision::Allow => continue,
                    Decision::Deny => {
                        if methods == 0 {
                            methods = EVERY_METHOD;
                        }
                        if !paths_readable {
                            paths = None;
                        }
                    }
                }
            }
            let entry = Entry {
                rule: position,
                port: PortSpec::Any,
                phase: rule.phase,
                protocol: rule.protocol,
                decision: rule.decision,
                bounded: rule.is_bounded(),
            };
            if rule.decision == Decision::Allow && rule.source == Source::User {
                for pattern in &patterns {
                    if let HostForm::Network(net) = pattern.host {
                        matcher.openings.push(Opening {
                            net: net.trunc(),
                            sandbox: match &rule.scope {
                                Scope::Global => None,
                                Scope::Sandbox(name) => Some(name.as_str().into()),
                            },
                            phase: rule.phase,
                            protocol: rule.protocol,
                        });
                    }
                }
            }
            let index = match &rule.scope {
                Scope::Global => &mut matcher.global,
                Scope::Sandbox(name) => matcher.sandboxes.entry(name.as_str().into()).or_default(),
            };
            for pattern in &patterns {
                if let (Decision::Allow, PortSpec::Exact(port)) = (rule.decision, pattern.port) {
                    matcher.allow_ports.push(port);
                }
                index.insert(
                    pattern,
                    Entry {
                        port: pattern.port,
                        ..entry
                    },
                );
            }
            matcher.rules.push(CompiledRule {
                label: format!("rule `{}` ({})", rule.name, source_label(rule.source)).into(),
                rule: RuleRef {
                    id: rule.id.clone(),
                    name: rule.name.clone(),
                    source: rule.source,
                },
                methods,
                paths,
            });
        }
        matcher.allow_ports.sort_unstable();
        matcher.allow_ports.dedup();
        matcher.global.shrink();
        for index in matcher.sandboxes.values_mut() {
            index.shrink();
        }
        (matcher, problems)
    }

    /// The address ranges that active user allow rules name explicitly and that hold for
    /// `sandbox` in `phase` over TCP (what the gateway carries): the openings of the
    /// gateway's address guard. A rule's opening lasts as long as the rule, and only in
    /// its phase: an install-only rule opens nothing at runtime.
    pub fn openings(&self, sandbox: &str, phase: Phase) -> Vec<ipnet::IpNet> {
        let mut out: Vec<ipnet::IpNet> = self
            .openings
            .iter()
            .filter(|o| o.sandbox.as_deref().is_none_or(|s| s == sandbox))
            .filter(|o| o.phase.is_none_or(|p| p == phase))
            .filter(|o| o.protocol == Protocol::Any || o.protocol.is_over_tcp())
            .map(|o| o.net)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Every port an allow rule names explicitly (`api.example.com:8443`, an egress
    /// triple's port), of any scope: the ports worth asking about a host that may be
    /// allowed on a port of its own (the DNS responder's question).
    pub fn allowed_ports(&self) -> &[u16] {
        &self.allow_ports
    }

    /// How many rules were compiled (active, and not left out as malformed).
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// Decides one query. Never panics; a failure while deciding is a denial
    /// (`internal_error`), a target that is not a valid host name is `invalid_target`.
    ///
    /// Connection (`http: None`): an unbounded deny matching target and port denies
    /// (explicit); else, when bounded rules need the traffic inspected (a bounded deny
    /// matches, or only bounded allows grant the host) and the protocol is not TCP, it is
    /// refused (`inspection_required`); else an unbounded allow allows, with `inspect` set
    /// when a bounded deny also matches; else a bounded allow allows with `inspect`; else
    /// default deny.
    ///
    /// Request (`http: Some`): unbounded deny; then, when bounded rules judge the path (a
    /// bounded deny matches the host, or no unbounded allow does and a bounded allow
    /// does), an ambiguous path is refused (`ambiguous_path`; `malformed_request` for one
    /// that is not a path at all); bounded deny matching method and path; unbounded allow;
    /// bounded allow matching method and path; `http_not_allowed` when a bounded allow
    /// matched only the host; else default deny.
    pub fn decide(&self, query: &Query) -> Verdict {
        let target = match CanonicalTarget::from_target(&query.target) {
            Ok(t) => t,
            Err(e) => {
                return Verdict::refused(
                    Reason::InvalidTarget,
                    format!("cannot judge the target: {e}"),
                );
            }
        };
        let request = query.http.as_ref();
        let method = request.map_or(0, |r| method_bit(r.method));
        let mut tally = Tally::default();
        let mut path: Option<Result<Cow<'_, str>, PathError>> = None;
        let mut broken = false;
        let mut consider = |entry: &Entry| {
            if !entry.applies(query) {
                return;
            }
            let (host_slot, request_slot) = match (entry.bounded, entry.decision) {
                (false, Decision::Deny) => {
                    return keep_first(&mut tally.unbounded_deny, entry.rule);
                }
                (false, Decision::Allow) => {
                    return keep_first(&mut tally.unbounded_allow, entry.rule);
                }
                (true, Decision::Deny) => (
                    &mut tally.bounded_deny_host,
                    &mut tally.bounded_deny_request,
                ),
                (true, Decision::Allow) => (
                    &mut tally.bounded_allow_host,
                    &mut tally.bounded_allow_request,
                ),
            };
            keep_first(host_slot, entry.rule);
            let Some(request) = request else {
                return;
            };
            let Some(rule) = usize::try_from(entry.rule)
                .ok()
                .and_then(|i| self.rules.get(i))
            else {
                broken = true;
                return;
            };
            if let Ok(p) = path.get_or_insert_with(|| normalize_path(&request.path))
                && rule.matches_request(method, p)
            {
                keep_first(request_slot, entry.rule);
            }
        };
        self.global.visit(&target, &mut consider);
        if let Some(name) = &query.sandbox
            && let Some(index) = self.sandboxes.get(name.as_str())
        {
            index.visit(&target, &mut consider);
        }
        if broken {
            return internal_error("a rule index points past the rules");
        }
        match request {
            None => self.decide_connection(query, &target, &tally),
            Some(request) => self.decide_request(&target, request, &tally, path),
        }
    }

    fn decide_connection(
        &self,
        query: &Query,
        target: &CanonicalTarget<'_>,
        tally: &Tally,
    ) -> Verdict {
        let mut shown = String::with_capacity(64);
        shown.push('`');
        target.push_to(&mut shown, Some(query.port));
        shown.push('`');
        if let Some(rule) = tally.unbounded_deny {
            let prefix = [shown.as_str(), " is denied by "];
            return self.by_rule(
                rule,
                Decision::Deny,
                Reason::DeniedByRule,
                false,
                &prefix,
                "",
            );
        }
        let inspected_for = first_of(
            tally.bounded_deny_host,
            tally
                .unbounded_allow
                .map_or(tally.bounded_allow_host, |_| None),
        );
        if let Some(rule) = inspected_for
            && !query.protocol.is_over_tcp()
        {
            let prefix = [shown.as_str(), " is judged per HTTP request by "];
            let suffix = if query.protocol == Protocol::Udp {
                ", and udp traffic cannot be inspected"
            } else {
                ", and traffic that may not be tcp cannot be inspected"
            };
            return self.by_rule(
                rule,
                Decision::Deny,
                Reason::InspectionRequired,
                false,
                &prefix,
                suffix,
            );
        }
        if let Some(rule) = tally.unbounded_allow {
            let inspect = inspected_for.is_some();
            let prefix = [shown.as_str(), " is allowed by "];
            let suffix = if inspect {
                "; its requests are inspected"
            } else {
                ""
            };
            return self.by_rule(
                rule,
                Decision::Allow,
                Reason::AllowedByRule,
                inspect,
                &prefix,
                suffix,
            );
        }
        if let Some(rule) = tally.bounded_allow_host {
            let prefix = [shown.as_str(), " is allowed for some HTTP requests by "];
            let suffix = "; its requests are inspected";
            return self.by_rule(
                rule,
                Decision::Allow,
                Reason::AllowedByRule,
                true,
                &prefix,
                suffix,
            );
        }
        Verdict::refused(
            Reason::NoMatchingAllow,
            concat(&["no rule allows ", &shown, " (default deny)"]),
        )
    }

    fn decide_request(
        &self,
        target: &CanonicalTarget<'_>,
        request: &HttpRequest,
        tally: &Tally,
        path: Option<Result<Cow<'_, str>, PathError>>,
    ) -> Verdict {
        let mut shown = String::with_capacity(64 + request.path.len());
        shown.push('`');
        shown.push_str(request.method.as_str());
        shown.push(' ');
        shown.push_str(&request.path);
        shown.push_str("` on `");
        target.push_to(&mut shown, None);
        shown.push('`');
        if let Some(rule) = tally.unbounded_deny {
            let prefix = [shown.as_str(), " is denied by "];
            return self.by_rule(
                rule,
                Decision::Deny,
                Reason::DeniedByRule,
                false,
                &prefix,
                "",
            );
        }
        let judged = tally.bounded_deny_host.is_some()
            || (tally.unbounded_allow.is_none() && tally.bounded_allow_host.is_some());
        if judged {
            let path = path.unwrap_or_else(|| normalize_path(&request.path));
            if let Err(e) = path {
                let reason = match e {
                    PathError::Ambiguous { .. } => Reason::AmbiguousPath,
                    PathError::NotAbsolute { .. }
                    | PathError::InvalidEscape { .. }
                    | PathError::ForbiddenCharacter { .. } => Reason::MalformedRequest,
                };
                return Verdict::refused(reason, format!("{shown} is refused: {e}"));
            }
        }
        if let Some(rule) = tally.bounded_deny_request {
            let prefix = [shown.as_str(), " is denied by "];
            return self.by_rule(
                rule,
                Decision::Deny,
                Reason::DeniedByRule,
                false,
                &prefix,
                "",
            );
        }
        if let Some(rule) = tally.unbounded_allow.or(tally.bounded_allow_request) {
            let prefix = [shown.as_str(), " is allowed by "];
            return self.by_rule(
                rule,
                Decision::Allow,
                Reason::AllowedByRule,
                false,
                &prefix,
                "",
            );
        }
        if tally.bounded_allow_host.is_some() {
            return Verdict::refused(
                Reason::HttpNotAllowed,
                concat(&[&shown, " is not among the requests its rules allow"]),
            );
        }
        let mut host = String::with_capacity(64);
        target.push_to(&mut host, None);
        Verdict::refused(
            Reason::NoMatchingAllow,
            concat(&["no rule allows `", &host, "` (default deny)"]),
        )
    }

    /// A verdict decided by the rule at `position`, its message `prefix`, the rule's label
    /// and `suffix` (an explicit denial only when the rule is a deny rule that matched,
    /// `denied_by_rule`).
    fn by_rule(
        &self,
        position: u32,
        decision: Decision,
        reason: Reason,
        inspect: bool,
        prefix: &[&str],
        suffix: &str,
    ) -> Verdict {
        let Some(compiled) = usize::try_from(position)
            .ok()
            .and_then(|i| self.rules.get(i))
        else {
            return internal_error("a rule index points past the rules");
        };
        let mut message = String::with_capacity(
            prefix.iter().map(|p| p.len()).sum::<usize>() + compiled.label.len() + suffix.len(),
        );
        prefix.iter().for_each(|p| message.push_str(p));
        message.push_str(&compiled.label);
        message.push_str(suffix);
        Verdict {
            decision,
            deny_kind: match (decision, reason) {
                (Decision::Allow, _) => None,
                (Decision::Deny, Reason::DeniedByRule) => Some(DenyKind::Explicit),
                (Decision::Deny, _) => Some(DenyKind::Implicit),
            },
            reason,
            rule: Some(compiled.rule.clone()),
            message,
            inspect,
        }
    }
}

fn concat(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    parts.iter().for_each(|p| out.push_str(p));
    out
}

fn internal_error(what: &str) -> Verdict {
    Verdict::refused(
        Reason::InternalError,
        format!("deciding failed ({what}); refusing"),
    )
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
    use crate::rule::CreatedVia;

    fn rule(id: &str, decision: Decision, resources: &[&str]) -> Rule {
        Rule {
            id: id.to_owned(),
            name: id.to_owned(),
            scope: Scope::Global,
            resource_type: ResourceType::Network,
            decision,
            resources: resources.iter().map(|s| (*s).to_owned()).collect(),
            methods: None,
            paths: None,
            protocol: Protocol::Any,
            phase: None,
            source: Source::User,
            created_via: CreatedVia::Added,
            editable: true,
            active: true,
            created_at: "2026-01-01T00:00:00Z".to_owned(),
        }
    }

    #[test]
    fn openings_are_the_named_addresses_of_active_user_allows_in_force() {
        let net = |s: &str| s.parse::<ipnet::IpNet>().unwrap();
        let rules = vec![
            // Held: global, every phase; a host name opens nothing.
            rule("a", Decision::Allow, &["10.1.2.3", "db.internal"]),
            // Held in its sandbox only, in its phase only.
            Rule {
                scope: Scope::Sandbox("box".into()),
                phase: Some(Phase::Install),
                ..rule("b", Decision::Allow, &["192.168.7.0/24"])
            },
            // Never an opening: a deny, a kit's rule, an inactive rule, UDP only.
            rule("c", Decision::Deny, &["10.9.9.9"]),
            Rule {
                source: Source::Kit,
                ..rule("d", Decision::Allow, &["10.8.8.8"])
            },
            Rule {
                active: false,
                ..rule("e", Decision::Allow, &["10.7.7.7"])
            },
            Rule {
                protocol: Protocol::Udp,
                ..rule("f", Decision::Allow, &["10.6.6.6"])
            },
        ];
        let m = Matcher::compile(&rules);
        assert_eq!(m.openings("box", Phase::Runtime), [net("10.1.2.3/32")]);
        assert_eq!(
            m.openings("box", Phase::Install),
            [net("10.1.2.3/32"), net("192.168.7.0/24")]
        );
        assert_eq!(m.openings("other", Phase::Install), [net("10.1.2.3/32")]);
    }

    fn connect(host: &str, port: u16) -> Query {
        Query {
            sandbox: None,
            phase: Phase::Runtime,
            target: Target::Host(host.to_owned()),
            port,
            protocol: Protocol::Tcp,
            http: None,
        }
    }

    fn request(host: &str, method: Method, path: &str) -> Query {
        Query {
            http: Some(HttpRequest {
                method,
                path: path.to_owned(),
            }),
            ..connect(host, 443)
        }
    }

    #[test]
    fn masks_addresses() {
        assert_eq!(mask(0xFFFF_FFFF, 32, 8), 0xFF00_0000);
        assert_eq!(mask(0xFFFF_FFFF, 32, 0), 0);
        assert_eq!(mask(0xFFFF_FFFF, 32, 32), 0xFFFF_FFFF);
        assert_eq!(mask(u128::MAX, 128, 0), 0);
        assert_eq!(mask(u128::MAX, 128, 128), u128::MAX);
        assert_eq!(mask(u128::MAX, 128, 1), 1 << 127);
    }

    #[test]
    fn method_sets() {
        assert_eq!(method_set(None), EVERY_METHOD);
        assert_eq!(method_set(Some(&[Method::Any])), EVERY_METHOD);
        assert_eq!(method_set(Some(&[])), 0);
        let get = method_set(Some(&[Method::Get]));
        assert_ne!(get & method_bit(Method::Get), 0);
        assert_eq!(get & method_bit(Method::Post), 0);
        assert_eq!(get & method_bit(Method::Any), 0);
    }

    #[test]
    fn messages() {
        let mut deny = rule("kit:m1:deny", Decision::Deny, &["api.example.com"]);
        deny.source = Source::Kit;
        let m = Matcher::compile(&[deny]);
        let v = m.decide(&connect("api.example.com", 443));
        assert_eq!(
            v.message,
            "`api.example.com:443` is denied by rule `kit:m1:deny` (kit)"
        );
        let v = m.decide(&connect("evil.example.com", 443));
        assert_eq!(
            v.message,
            "no rule allows `evil.example.com:443` (default deny)"
        );

        let mut bounded = rule("b", Decision::Allow, &["api.example.com"]);
        bounded.methods = Some(vec![Method::Get]);
        let m = Matcher::compile(&[bounded]);
        let v = m.decide(&request("api.example.com", Method::Post, "/repos/x"));
        assert_eq!(
            v.message,
            "`POST /repos/x` on `api.example.com` is not among the requests its rules allow"
        );
        assert_eq!(v.reason, Reason::HttpNotAllowed);
    }

    #[test]
    fn malformed_allow_is_left_out_and_malformed_deny_kept() {
        let allow = rule("a", Decision::Allow, &["good.example", "bad host"]);
        let deny = rule("d", Decision::Deny, &["other.example", "bad host"]);
        let (m, problems) = Matcher::compile_report(&[allow, deny]);
        assert_eq!(problems.len(), 2);
        assert_eq!(problems[0].0, "a");
        assert!(matches!(problems[0].1, RuleError::Resource { .. }));
        assert!(!m.decide(&connect("good.example", 443)).is_allowed());
        let v = m.decide(&connect("other.example", 443));
        assert_eq!(v.reason, Reason::DeniedByRule);
    }

    #[test]
    fn unnormalized_and_invalid_targets() {
        let m = Matcher::compile(&[rule(
            "a",
            Decision::Allow,
            &["bücher.example", "10.0.0.0/8"],
        )]);
        assert!(m.decide(&connect("B\u{fc}cher.Example.", 443)).is_allowed());
        assert!(
            m.decide(&connect("xn--bcher-kva.example", 443))
                .is_allowed()
        );
        assert!(m.decide(&connect("10.1.2.3", 443)).is_allowed());
        let v = m.decide(&connect("bad host", 443));
        assert_eq!(v.reason, Reason::InvalidTarget);
        assert!(!v.is_allowed());
    }

    #[test]
    fn matcher_is_shareable() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Matcher>();
    }

    /// An `https` rule grants TLS and nothing else on its host and port; a `tcp` rule
    /// grants HTTP and HTTPS too; a `tcp` deny refuses them; `http` is cleartext only.
    #[test]
    fn protocols_cover_what_they_name() {
        let carried = |p: Protocol| Query {
            protocol: p,
            ..connect("api.example", 443)
        };
        let with = |p: Protocol, d: Decision| Rule {
            protocol: p,
            ..rule("a", d, &["api.example:443"])
        };
        let allowed =
            |rules: &[Rule], p: Protocol| Matcher::compile(rules).decide(&carried(p)).is_allowed();
        let https = [with(Protocol::Https, Decision::Allow)];
        assert!(allowed(&https, Protocol::Https));
        for p in [Protocol::Tcp, Protocol::Http, Protocol::Udp, Protocol::Any] {
            assert!(!allowed(&https, p), "{p}");
        }
        let http = [with(Protocol::Http, Decision::Allow)];
        assert!(allowed(&http, Protocol::Http));
        assert!(!allowed(&http, Protocol::Https) && !allowed(&http, Protocol::Tcp));
        let tcp = [with(Protocol::Tcp, Decision::Allow)];
        for p in [Protocol::Tcp, Protocol::Http, Protocol::Https] {
            assert!(allowed(&tcp, p), "{p}");
        }
        assert!(!allowed(&tcp, Protocol::Udp));
        // Deny wins whatever protocol carried the traffic its rule covers.
        let denied = [
            with(Protocol::Https, Decision::Allow),
            Rule {
                id: "d".into(),
                ..with(Protocol::Tcp, Decision::Deny)
            },
        ];
        assert_eq!(
            Matcher::compile(&denied)
                .decide(&carried(Protocol::Https))
                .reason,
            Reason::DeniedByRule
        );
        // An http or https deny also refuses a tcp stream (SOCKS, a non-TLS tunnel), which
        // may carry what it denies.
        for denied_protocol in [Protocol::Http, Protocol::Https] {
            let rules = [
                with(Protocol::Tcp, Decision::Allow),
                Rule {
                    id: "d".into(),
                    ..with(denied_protocol, Decision::Deny)
                },
            ];
            assert_eq!(
                Matcher::compile(&rules)
                    .decide(&carried(Protocol::Tcp))
                    .reason,
                Reason::DeniedByRule,
                "{denied_protocol}"
            );
        }
        let https_deny = [
            with(Protocol::Tcp, Decision::Allow),
            Rule {
                id: "d".into(),
                ..with(Protocol::Https, Decision::Deny)
            },
        ];
        // …but not the other protocol it does not name.
        assert!(allowed(&https_deny, Protocol::Http));
        // A bounded rule's traffic can be inspected when it is HTTP or HTTPS.
        let bounded = [Rule {
            methods: Some(vec![Method::Get]),
            ..with(Protocol::Tcp, Decision::Allow)
        }];
        let v = Matcher::compile(&bounded).decide(&carried(Protocol::Https));
        assert!(v.is_allowed() && v.inspect, "{v:?}");
        let bounded_deny = [Rule {
            methods: Some(vec![Method::Delete]),
            ..with(Protocol::Tcp, Decision::Deny)
        }];
        let v = Matcher::compile(&bounded_deny).decide(&carried(Protocol::Any));
        assert_eq!(v.reason, Reason::InspectionRequired);
    }
}
