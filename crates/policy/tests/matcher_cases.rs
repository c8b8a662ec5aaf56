#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]
//! The decision function, case by case: rules + query → decision, deny kind, reason code,
//! deciding rule and `inspect`. Then properties (monotonicity, agreement with a naive
//! linear reference) on random rule sets.

use std::net::IpAddr;

use capgate_policy::path::{PathError, PathGlob, normalize_path};
use capgate_policy::pattern::{HostPattern, normalize_host, parse_target};
use capgate_policy::{
    CreatedVia, Decision, DenyKind, HttpRequest, Matcher, Method, Phase, Protocol, Query, Reason,
    ResourceType, Rule, Scope, Source, Target, Verdict,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Builders.

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

fn allow(id: &str, resources: &[&str]) -> Rule {
    rule(id, Decision::Allow, resources)
}

fn deny(id: &str, resources: &[&str]) -> Rule {
    rule(id, Decision::Deny, resources)
}

trait RuleExt {
    fn methods(self, methods: &[Method]) -> Rule;
    fn paths(self, paths: &[&str]) -> Rule;
    fn sandbox(self, name: &str) -> Rule;
    fn phase(self, phase: Phase) -> Rule;
    fn protocol(self, protocol: Protocol) -> Rule;
    fn source(self, source: Source) -> Rule;
    fn inactive(self) -> Rule;
}

impl RuleExt for Rule {
    fn methods(mut self, methods: &[Method]) -> Rule {
        self.methods = Some(methods.to_vec());
        self
    }
    fn paths(mut self, paths: &[&str]) -> Rule {
        self.paths = Some(paths.iter().map(|s| (*s).to_owned()).collect());
        self
    }
    fn sandbox(mut self, name: &str) -> Rule {
        self.scope = Scope::Sandbox(name.to_owned());
        self
    }
    fn phase(mut self, phase: Phase) -> Rule {
        self.phase = Some(phase);
        self
    }
    fn protocol(mut self, protocol: Protocol) -> Rule {
        self.protocol = protocol;
        self
    }
    fn source(mut self, source: Source) -> Rule {
        self.source = source;
        self.created_via = match source {
            Source::Kit => CreatedVia::Provisioned,
            Source::User => CreatedVia::Added,
            Source::Default => CreatedVia::Default,
        };
        self
    }
    fn inactive(mut self) -> Rule {
        self.active = false;
        self
    }
}

/// A connection query; `target` as `capgate policy check` reads it (port 443 by default).
fn conn(target: &str) -> Query {
    let (target, port) = parse_target(target).unwrap();
    Query {
        sandbox: None,
        phase: Phase::Runtime,
        target,
        port,
        protocol: Protocol::Tcp,
        http: None,
    }
}

/// A connection query whose host is passed as is, not normalized first.
fn raw(host: &str, port: u16) -> Query {
    Query {
        target: Target::Host(host.to_owned()),
        port,
        ..conn("placeholder.example")
    }
}

fn ip(addr: &str, port: u16) -> Query {
    Query {
        target: Target::Ip(addr.parse().unwrap()),
        port,
        ..conn("placeholder.example")
    }
}

fn req(target: &str, method: Method, path: &str) -> Query {
    Query {
        http: Some(HttpRequest {
            method,
            path: path.to_owned(),
        }),
        ..conn(target)
    }
}

fn get(target: &str, path: &str) -> Query {
    req(target, Method::Get, path)
}

trait QueryExt {
    fn sandbox(self, name: &str) -> Query;
    fn phase(self, phase: Phase) -> Query;
    fn protocol(self, protocol: Protocol) -> Query;
}

impl QueryExt for Query {
    fn sandbox(mut self, name: &str) -> Query {
        self.sandbox = Some(name.to_owned());
        self
    }
    fn phase(mut self, phase: Phase) -> Query {
        self.phase = phase;
        self
    }
    fn protocol(mut self, protocol: Protocol) -> Query {
        self.protocol = protocol;
        self
    }
}

/// What a case expects.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Allowed by this rule, not inspected.
    Allow(&'static str),
    /// Allowed by this rule; requests must be inspected.
    AllowInspect(&'static str),
    /// Denied by this deny rule (explicit, `denied_by_rule`).
    Deny(&'static str),
    /// Refused with no rule behind it (implicit).
    Refused(Reason),
    /// Refused (implicit) naming this rule.
    RefusedBy(Reason, &'static str),
}
use Expect::{Allow, AllowInspect, Deny, Refused, RefusedBy};

const DEFAULT_DENY: Expect = Refused(Reason::NoMatchingAllow);

struct Case {
    name: &'static str,
    rules: Vec<Rule>,
    query: Query,
    expect: Expect,
}

fn case(name: &'static str, rules: Vec<Rule>, query: Query, expect: Expect) -> Case {
    Case {
        name,
        rules,
        query,
        expect,
    }
}

/// (decision, deny kind, reason, deciding rule id, inspect): a verdict without its text.
type Outcome = (Decision, Option<DenyKind>, Reason, Option<String>, bool);

fn outcome(v: &Verdict) -> Outcome {
    (
        v.decision,
        v.deny_kind,
        v.reason,
        v.rule.as_ref().map(|r| r.id.clone()),
        v.inspect,
    )
}

fn expected(e: Expect) -> Outcome {
    match e {
        Allow(id) => (
            Decision::Allow,
            None,
            Reason::AllowedByRule,
            Some(id.to_owned()),
            false,
        ),
        AllowInspect(id) => (
            Decision::Allow,
            None,
            Reason::AllowedByRule,
            Some(id.to_owned()),
            true,
        ),
        Deny(id) => (
            Decision::Deny,
            Some(DenyKind::Explicit),
            Reason::DeniedByRule,
            Some(id.to_owned()),
            false,
        ),
        Refused(reason) => (
            Decision::Deny,
            Some(DenyKind::Implicit),
            reason,
            None,
            false,
        ),
        RefusedBy(reason, id) => (
            Decision::Deny,
            Some(DenyKind::Implicit),
            reason,
            Some(id.to_owned()),
            false,
        ),
    }
}

/// Runs every case against the compiled matcher and the linear reference; reports every
/// failure at once.
fn run(cases: Vec<Case>) -> usize {
    let count = cases.len();
    let mut failures = Vec::new();
    for c in cases {
        let want = expected(c.expect);
        let got = outcome(&Matcher::compile(&c.rules).decide(&c.query));
        if got != want {
            failures.push(format!("{}: got {got:?}, want {want:?}", c.name));
        }
        let naive = reference(&c.rules, &c.query);
        if naive != want {
            failures.push(format!(
                "{} (reference): got {naive:?}, want {want:?}",
                c.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing:\n{}",
        failures.len(),
        failures.join("\n")
    );
    count
}

// ---------------------------------------------------------------------------------------
// Cases.

fn names() -> Vec<Case> {
    vec![
        case(
            "rule folded to lowercase",
            vec![allow("r", &["API.Example.COM"])],
            conn("api.example.com"),
            Allow("r"),
        ),
        case(
            "target folded to lowercase",
            vec![allow("r", &["api.example.com"])],
            raw("API.EXAMPLE.com", 443),
            Allow("r"),
        ),
        case(
            "trailing dot on target",
            vec![allow("r", &["api.example.com"])],
            raw("api.example.com.", 443),
            Allow("r"),
        ),
        case(
            "trailing dot on rule",
            vec![allow("r", &["api.example.com."])],
            conn("api.example.com"),
            Allow("r"),
        ),
        case(
            "two trailing dots are invalid",
            vec![allow("r", &["**"])],
            raw("api.example.com..", 443),
            Refused(Reason::InvalidTarget),
        ),
        case(
            "unicode rule, punycode target",
            vec![allow("r", &["bücher.example"])],
            raw("xn--bcher-kva.example", 443),
            Allow("r"),
        ),
        case(
            "punycode rule, unicode target",
            vec![allow("r", &["xn--bcher-kva.example"])],
            raw("bücher.example", 443),
            Allow("r"),
        ),
        case(
            "uppercase unicode rule",
            vec![allow("r", &["BÜCHER.example"])],
            raw("Bücher.Example", 443),
            Allow("r"),
        ),
        case(
            "unicode wildcard suffix",
            vec![allow("r", &["*.bücher.example"])],
            raw("www.xn--bcher-kva.example", 443),
            Allow("r"),
        ),
        case(
            "space in target is invalid",
            vec![allow("r", &["**"])],
            raw("exa mple.com", 443),
            Refused(Reason::InvalidTarget),
        ),
        case(
            "numeric last label is invalid",
            vec![allow("r", &["**"])],
            raw("127.1", 443),
            Refused(Reason::InvalidTarget),
        ),
        case(
            "address given as host is an address",
            vec![allow("r", &["10.0.0.0/8"])],
            raw("10.1.2.3", 443),
            Allow("r"),
        ),
        case(
            "exact does not cover longer name",
            vec![allow("r", &["example.com"])],
            conn("example.com.evil"),
            DEFAULT_DENY,
        ),
        case(
            "exact does not cover subdomain",
            vec![allow("r", &["example.com"])],
            conn("sub.example.com"),
            DEFAULT_DENY,
        ),
        case(
            "exact does not cover suffix match",
            vec![allow("r", &["example.com"])],
            conn("notexample.com"),
            DEFAULT_DENY,
        ),
        case(
            "underscore label",
            vec![allow("r", &["_acme.example.com"])],
            conn("_acme.example.com"),
            Allow("r"),
        ),
        case(
            "deny folded like allow",
            vec![allow("a", &["**"]), deny("d", &["EVIL.example."])],
            conn("evil.example"),
            Deny("d"),
        ),
    ]
}

fn wildcards() -> Vec<Case> {
    vec![
        case(
            "*. one label below",
            vec![allow("r", &["*.x.com"])],
            conn("a.x.com"),
            Allow("r"),
        ),
        case(
            "*. not two labels below",
            vec![allow("r", &["*.x.com"])],
            conn("a.b.x.com"),
            DEFAULT_DENY,
        ),
        case(
            "*. not the suffix itself",
            vec![allow("r", &["*.x.com"])],
            conn("x.com"),
            DEFAULT_DENY,
        ),
        case(
            "**. one label below",
            vec![allow("r", &["**.x.com"])],
            conn("a.x.com"),
            Allow("r"),
        ),
        case(
            "**. three labels below",
            vec![allow("r", &["**.x.com"])],
            conn("a.b.c.x.com"),
            Allow("r"),
        ),
        case(
            "**. not the suffix itself",
            vec![allow("r", &["**.x.com"])],
            conn("x.com"),
            DEFAULT_DENY,
        ),
        case(
            "**. not a name ending alike",
            vec![allow("r", &["**.x.com"])],
            conn("ax.com"),
            DEFAULT_DENY,
        ),
        case(
            "*. not a name ending alike",
            vec![allow("r", &["*.x.com"])],
            conn("ax.com"),
            DEFAULT_DENY,
        ),
        case(
            "exact and *. are distinct",
            vec![allow("w", &["*.x.com"]), allow("e", &["x.com"])],
            conn("x.com"),
            Allow("e"),
        ),
        case(
            "* covers any host",
            vec![allow("r", &["*"])],
            conn("anything.example"),
            Allow("r"),
        ),
        case(
            "** covers IPv4",
            vec![allow("r", &["**"])],
            ip("192.0.2.1", 443),
            Allow("r"),
        ),
        case(
            "* covers IPv6",
            vec![allow("r", &["*"])],
            ip("2001:db8::1", 443),
            Allow("r"),
        ),
        case(
            "*:443 not port 80",
            vec![allow("r", &["*:443"])],
            conn("a.example:80"),
            DEFAULT_DENY,
        ),
        case(
            "**:443 on 443",
            vec![allow("r", &["**:443"])],
            conn("a.example:443"),
            Allow("r"),
        ),
        case(
            "** deny beats exact allow",
            vec![allow("a", &["a.example"]), deny("d", &["**"])],
            conn("a.example"),
            Deny("d"),
        ),
        case(
            "*.com covers one label",
            vec![allow("r", &["*.com"])],
            conn("example.com"),
            Allow("r"),
        ),
        case(
            "*.com not two labels",
            vec![allow("r", &["*.com"])],
            conn("a.example.com"),
            DEFAULT_DENY,
        ),
        case(
            "**.com covers two labels",
            vec![allow("r", &["**.com"])],
            conn("a.example.com"),
            Allow("r"),
        ),
        case(
            "**. deny beats exact allow",
            vec![allow("a", &["api.x.com"]), deny("d", &["**.x.com"])],
            conn("api.x.com"),
            Deny("d"),
        ),
        case(
            "*. deny does not reach depth two",
            vec![allow("a", &["**.x.com"]), deny("d", &["*.x.com"])],
            conn("a.b.x.com"),
            Allow("a"),
        ),
        case(
            "*. deny reaches depth one",
            vec![allow("a", &["**.x.com"]), deny("d", &["*.x.com"])],
            conn("b.x.com"),
            Deny("d"),
        ),
        case(
            "misplaced wildcard never allows",
            vec![allow("r", &["a*.x.com"])],
            conn("ab.x.com"),
            DEFAULT_DENY,
        ),
        case(
            "inner wildcard never allows",
            vec![allow("r", &["a.*.x.com"])],
            conn("a.b.x.com"),
            DEFAULT_DENY,
        ),
        case(
            "wildcard names do not cover addresses",
            vec![allow("r", &["**.x.com"])],
            ip("10.0.0.1", 443),
            DEFAULT_DENY,
        ),
        case(
            "first of several wildcards decides",
            vec![allow("a", &["**.x.com"]), allow("b", &["*.x.com"])],
            conn("a.x.com"),
            Allow("a"),
        ),
        case(
            "deeper suffix in order",
            vec![allow("a", &["**.b.x.com"]), allow("b", &["**.x.com"])],
            conn("a.b.x.com"),
            Allow("a"),
        ),
    ]
}

fn ports() -> Vec<Case> {
    vec![
        case(
            "host:443 on 443",
            vec![allow("r", &["h.example:443"])],
            conn("h.example:443"),
            Allow("r"),
        ),
        case(
            "host:443 not 80",
            vec![allow("r", &["h.example:443"])],
            conn("h.example:80"),
            DEFAULT_DENY,
        ),
        case(
            "bare host any port",
            vec![allow("r", &["h.example"])],
            conn("h.example:22"),
            Allow("r"),
        ),
        case(
            "host:* any port",
            vec![allow("r", &["h.example:*"])],
            conn("h.example:8080"),
            Allow("r"),
        ),
        case(
            "deny on one port",
            vec![allow("a", &["h.example"]), deny("d", &["h.example:22"])],
            conn("h.example:22"),
            Deny("d"),
        ),
        case(
            "deny on one port leaves others",
            vec![allow("a", &["h.example"]), deny("d", &["h.example:22"])],
            conn("h.example:443"),
            Allow("a"),
        ),
        case(
            "*. with port",
            vec![allow("r", &["*.x.com:8443"])],
            conn("a.x.com:8443"),
            Allow("r"),
        ),
        case(
            "*. with port, other port",
            vec![allow("r", &["*.x.com:8443"])],
            conn("a.x.com:443"),
            DEFAULT_DENY,
        ),
        case(
            "**. deny on port",
            vec![allow("a", &["**"]), deny("d", &["**.x.com:443"])],
            conn("a.b.x.com:443"),
            Deny("d"),
        ),
        case(
            "**. deny on port, other port",
            vec![allow("a", &["**"]), deny("d", &["**.x.com:443"])],
            conn("a.b.x.com:80"),
            Allow("a"),
        ),
        case(
            "port 0 is malformed",
            vec![allow("r", &["h.example:0"])],
            conn("h.example:1"),
            DEFAULT_DENY,
        ),
        case(
            "port 65536 is malformed",
            vec![allow("r", &["h.example:65536"])],
            conn("h.example:1"),
            DEFAULT_DENY,
        ),
        case(
            "second resource any port",
            vec![allow("r", &["a.example:80", "b.example"])],
            conn("b.example:22"),
            Allow("r"),
        ),
        case(
            "first resource its port only",
            vec![allow("r", &["a.example:80", "b.example"])],
            conn("a.example:22"),
            DEFAULT_DENY,
        ),
        case(
            "http URL is port 80",
            vec![allow("r", &["h.example:80"])],
            conn("http://h.example/x"),
            Allow("r"),
        ),
        case(
            "default port is 443",
            vec![allow("r", &["h.example:443"])],
            conn("h.example"),
            Allow("r"),
        ),
    ]
}

fn addresses() -> Vec<Case> {
    vec![
        case(
            "IPv4 literal",
            vec![allow("r", &["10.0.0.1"])],
            ip("10.0.0.1", 443),
            Allow("r"),
        ),
        case(
            "IPv4 with port",
            vec![allow("r", &["10.0.0.1:22"])],
            ip("10.0.0.1", 22),
            Allow("r"),
        ),
        case(
            "IPv4 with port, other port",
            vec![allow("r", &["10.0.0.1:22"])],
            ip("10.0.0.1", 23),
            DEFAULT_DENY,
        ),
        case(
            "IPv4 CIDR inside",
            vec![allow("r", &["10.0.0.0/8"])],
            ip("10.255.1.1", 443),
            Allow("r"),
        ),
        case(
            "IPv4 CIDR outside",
            vec![allow("r", &["10.0.0.0/8"])],
            ip("11.0.0.1", 443),
            DEFAULT_DENY,
        ),
        case(
            "wide deny beats narrow allow",
            vec![allow("a", &["10.1.0.0/16"]), deny("d", &["10.0.0.0/8"])],
            ip("10.1.2.3", 443),
            Deny("d"),
        ),
        case(
            "narrow deny inside wide allow",
            vec![allow("a", &["10.0.0.0/8"]), deny("d", &["10.1.2.3"])],
            ip("10.1.2.3", 443),
            Deny("d"),
        ),
        case(
            "narrow deny leaves neighbours",
            vec![allow("a", &["10.0.0.0/8"]), deny("d", &["10.1.2.3"])],
            ip("10.1.2.4", 443),
            Allow("a"),
        ),
        case(
            "bracketed IPv6 with port",
            vec![allow("r", &["[2001:db8::1]:443"])],
            ip("2001:db8::1", 443),
            Allow("r"),
        ),
        case(
            "bracketed IPv6, other port",
            vec![allow("r", &["[2001:db8::1]:443"])],
            ip("2001:db8::1", 80),
            DEFAULT_DENY,
        ),
        case(
            "bare IPv6 any port",
            vec![allow("r", &["2001:db8::1"])],
            ip("2001:db8::1", 80),
            Allow("r"),
        ),
        case(
            "IPv6 CIDR inside",
            vec![allow("r", &["2001:db8::/32"])],
            ip("2001:db8:ffff::1", 443),
            Allow("r"),
        ),
        case(
            "IPv6 CIDR outside",
            vec![allow("r", &["2001:db8::/32"])],
            ip("2001:db9::1", 443),
            DEFAULT_DENY,
        ),
        case(
            "bracketed IPv6 CIDR with port",
            vec![allow("r", &["[2001:db8::/32]:443"])],
            ip("2001:db8::9", 443),
            Allow("r"),
        ),
        case(
            "v4-mapped target meets IPv4 rule",
            vec![allow("r", &["10.0.0.0/8"])],
            ip("::ffff:10.0.0.1", 443),
            Allow("r"),
        ),
        case(
            "v4-mapped rule meets IPv4 target",
            vec![deny("d", &["[::ffff:10.0.0.1]"]), allow("a", &["**"])],
            ip("10.0.0.1", 443),
            Deny("d"),
        ),
        case(
            "name rule does not cover address",
            vec![allow("r", &["example.com"])],
            ip("10.0.0.1", 443),
            DEFAULT_DENY,
        ),
        case(
            "address rule does not cover name",
            vec![allow("r", &["10.0.0.0/8"])],
            conn("ten.example"),
            DEFAULT_DENY,
        ),
        case(
            "0.0.0.0/0 covers IPv4",
            vec![allow("r", &["0.0.0.0/0"])],
            ip("203.0.113.9", 443),
            Allow("r"),
        ),
        case(
            "0.0.0.0/0 not IPv6",
            vec![allow("r", &["0.0.0.0/0"])],
            ip("2001:db8::1", 443),
            DEFAULT_DENY,
        ),
        case(
            "::/0 covers IPv6",
            vec![allow("r", &["::/0"])],
            ip("2001:db8::1", 443),
            Allow("r"),
        ),
        case(
            "address deny under **",
            vec![allow("a", &["*"]), deny("d", &["0.0.0.0/0"])],
            ip("198.51.100.1", 443),
            Deny("d"),
        ),
        case(
            "address deny does not cover names",
            vec![allow("a", &["*"]), deny("d", &["0.0.0.0/0"])],
            conn("name.example"),
            Allow("a"),
        ),
        case(
            "CIDR host bits are dropped",
            vec![allow("r", &["10.1.2.3/8"])],
            ip("10.9.9.9", 443),
            Allow("r"),
        ),
        case(
            "IPv4 CIDR with port",
            vec![allow("r", &["10.0.0.0/8:22"])],
            ip("10.0.0.5", 22),
            Allow("r"),
        ),
        case(
            "IPv4 CIDR with port, other port",
            vec![allow("r", &["10.0.0.0/8:22"])],
            ip("10.0.0.5", 80),
            DEFAULT_DENY,
        ),
        case(
            "prefix over 32 is malformed",
            vec![allow("r", &["10.0.0.0/33"])],
            ip("10.0.0.1", 443),
            DEFAULT_DENY,
        ),
        case(
            "bare IPv6 never has a port",
            vec![allow("r", &["2001:db8::1:443"])],
            ip("2001:db8::1:443", 80),
            Allow("r"),
        ),
        case(
            "IPv6 /128 only itself",
            vec![allow("r", &["2001:db8::1/128"])],
            ip("2001:db8::2", 443),
            DEFAULT_DENY,
        ),
        case(
            "first matching network decides",
            vec![allow("w", &["10.0.0.0/8"]), allow("n", &["10.0.0.0/24"])],
            ip("10.0.0.1", 443),
            Allow("w"),
        ),
    ]
}

const API: &str = "api.example.com";

fn methods() -> Vec<Case> {
    vec![
        case(
            "GET rule, GET",
            vec![allow("r", &[API]).methods(&[Method::Get])],
            get(API, "/x"),
            Allow("r"),
        ),
        case(
            "GET rule, POST",
            vec![allow("r", &[API]).methods(&[Method::Get])],
            req(API, Method::Post, "/x"),
            Refused(Reason::HttpNotAllowed),
        ),
        case(
            "ANY rule, DELETE",
            vec![allow("r", &[API]).methods(&[Method::Any])],
            req(API, Method::Delete, "/x"),
            Allow("r"),
        ),
        case(
            "GET+POST rule, POST",
            vec![allow("r", &[API]).methods(&[Method::Get, Method::Post])],
            req(API, Method::Post, "/"),
            Allow("r"),
        ),
        case(
            "GET+POST rule, PUT",
            vec![allow("r", &[API]).methods(&[Method::Get, Method::Post])],
            req(API, Method::Put, "/"),
            Refused(Reason::HttpNotAllowed),
        ),
        case(
            "extension method, GET rule",
            vec![allow("r", &[API]).methods(&[Method::Get])],
            req(API, Method::Any, "/"),
            Refused(Reason::HttpNotAllowed),
        ),
        case(
            "extension method, ANY rule",
            vec![allow("r", &[API]).methods(&[Method::Any])],
            req(API, Method::Any, "/"),
            Allow("r"),
        ),
        case(
            "bounded deny POST under unbounded allow",
            vec![
                allow("a", &[API]),
                deny("d", &[API]).methods(&[Method::Post]),
            ],
            req(API, Method::Post, "/x"),
            Deny("d"),
        ),
        case(
            "bounded deny POST leaves GET",
            vec![
                allow("a", &[API]),
                deny("d", &[API]).methods(&[Method::Post]),
            ],
            get(API, "/x"),
            Allow("a"),
        ),
        case(
            "bounded deny ANY",
            vec![
                allow("a", &[API]),
                deny("d", &[API]).methods(&[Method::Any]),
            ],
            get(API, "/"),
            Deny("d"),
        ),
        case(
            "methods without paths: every path",
            vec![allow("r", &[API]).methods(&[Method::Get])],
            get(API, "/a/b/c"),
            Allow("r"),
        ),
        case(
            "paths without methods: every method",
            vec![allow("r", &[API]).paths(&["/repos/**"])],
            req(API, Method::Delete, "/repos/x"),
            Allow("r"),
        ),
        case(
            "HEAD is not GET",
            vec![allow("r", &[API]).methods(&[Method::Get])],
            req(API, Method::Head, "/"),
            Refused(Reason::HttpNotAllowed),
        ),
        case(
            "first matching bounded allow decides",
            vec![
                allow("p", &[API]).methods(&[Method::Post]),
                allow("g", &[API]).methods(&[Method::Get]),
                allow("g2", &[API]).methods(&[Method::Any]),
            ],
            get(API, "/"),
            Allow("g"),
        ),
    ]
}

fn paths() -> Vec<Case> {
    let repos = || {
        vec![
            allow("r", &[API])
                .methods(&[Method::Get])
                .paths(&["/repos/**"]),
        ]
    };
    vec![
        case(
            "/repos/** matches /repos",
            repos(),
            get(API, "/repos"),
            Allow("r"),
        ),
        case(
            "/repos/** matches /repos/",
            repos(),
            get(API, "/repos/"),
            Allow("r"),
        ),
        case(
            "/repos/** matches /repos/a/b",
            repos(),
            get(API, "/repos/a/b"),
            Allow("r"),
        ),
        case(
            "/repos/** not /repository",
            repos(),
            get(API, "/repository"),
            Refused(Reason::HttpNotAllowed),
        ),
        case(
            "/repos/** not /",
            repos(),
            get(API, "/"),
            Refused(Reason::HttpNotAllowed),
        ),
        case(
            "* within one segment",
            vec![allow("r", &[API]).paths(&["/repos/*/issues"])],
            get(API, "/repos/x/issues"),
            Allow("r"),
        ),
        case(
            "* not across segments",
            vec![allow("r", &[API]).paths(&["/repos/*/issues"])],
            get(API, "/repos/x/y/issues"),
            Refused(Reason::HttpNotAllowed),
        ),
        case(
            "*.txt matches a.txt",
            vec![allow("r", &[API]).paths(&["/files/*.txt"])],
            get(API, "/files/a.txt"),
            Allow("r"),
        ),
        case(
            "*.txt not a.txt.exe",
            vec![allow("r", &[API]).paths(&["/files/*.txt"])],
            get(API, "/files/a.txt.exe"),
            Refused(Reason::HttpNotAllowed),
        ),
        case(
            "dot segments leave the allowed tree",
            vec![allow("r", &[API]).paths(&["/public/**"])],
            get(API, "/public/../admin"),
            Refused(Reason::HttpNotAllowed),
        ),
        case(
            "single dot removed",
            vec![allow("r", &[API]).paths(&["/public/**"])],
            get(API, "/public/./a"),
            Allow("r"),
        ),
        case(
            "dot segments enter the denied tree",
            vec![allow("a", &[API]), deny("d", &[API]).paths(&["/admin/**"])],
            get(API, "/public/../admin/x"),
            Deny("d"),
        ),
        case(
            "%7E is ~",
            vec![allow("r", &[API]).paths(&["/~user/**"])],
            get(API, "/%7Euser/x"),
            Allow("r"),
        ),
        case(
            "%7e is ~",
            vec![allow("r", &[API]).paths(&["/~user/**"])],
            get(API, "/%7euser/x"),
            Allow("r"),
        ),
        case(
            "%41 is A",
            vec![allow("r", &[API]).paths(&["/A"])],
            get(API, "/%41"),
            Allow("r"),
        ),
        case(
            "%2F is ambiguous",
            vec![allow("r", &[API]).paths(&["/a/**"])],
            get(API, "/a%2Fb"),
            Refused(Reason::AmbiguousPath),
        ),
        case(
            "%2f is ambiguous",
            vec![allow("r", &[API]).paths(&["/a/**"])],
            get(API, "/a/x%2fy"),
            Refused(Reason::AmbiguousPath),
        ),
        case(
            "%2e%2e segment is ambiguous",
            vec![allow("r", &[API]).paths(&["/a/**"])],
            get(API, "/a/%2e%2e/b"),
            Refused(Reason::AmbiguousPath),
        ),
        case(
            ".%2E segment is ambiguous",
            vec![allow("r", &[API]).paths(&["/a/**"])],
            get(API, "/a/.%2E/b"),
            Refused(Reason::AmbiguousPath),
        ),
        case(
            "%2E segment is ambiguous",
            vec![allow("r", &[API]).paths(&["/a/**"])],
            get(API, "/a/%2E/b"),
            Refused(Reason::AmbiguousPath),
        ),
        case(
            "%2e%2e inside a name is fine",
            vec![allow("r", &[API]).paths(&["/a/*"])],
            get(API, "/a/%2e%2ehidden"),
            Allow("r"),
        ),
        case(
            "// collapses",
            vec![allow("r", &[API]).paths(&["/a/b"])],
            get(API, "//a//b"),
            Allow("r"),
        ),
        case(
            "// does not dodge a deny",
            vec![allow("a", &[API]), deny("d", &[API]).paths(&["/admin/**"])],
            get(API, "//admin"),
            Deny("d"),
        ),
        case(
            "// with .. is ambiguous",
            vec![allow("r", &[API]).paths(&["/**"])],
            get(API, "/a//../b"),
            Refused(Reason::AmbiguousPath),
        ),
        case(
            "backslash is ambiguous",
            vec![allow("r", &[API]).paths(&["/**"])],
            get(API, "/a\\b"),
            Refused(Reason::AmbiguousPath),
        ),
        case(
            "%5C is ambiguous",
            vec![allow("r", &[API]).paths(&["/**"])],
            get(API, "/a%5Cb"),
            Refused(Reason::AmbiguousPath),
        ),
        case(
            "ambiguous path, unbounded allow only",
            vec![allow("a", &[API])],
            get(API, "/a%2Fb"),
            Allow("a"),
        ),
        case(
            "ambiguous path, bounded deny judges it",
            vec![allow("a", &[API]), deny("d", &[API]).paths(&["/admin/**"])],
            get(API, "/a%2Fb"),
            Refused(Reason::AmbiguousPath),
        ),
        case(
            "ambiguous path, bounded allow under unbounded allow",
            vec![allow("a", &[API]), allow("b", &[API]).paths(&["/x"])],
            get(API, "/a%2Fb"),
            Allow("a"),
        ),
        case(
            "unbounded deny before ambiguity",
            vec![deny("d", &[API]), allow("b", &[API]).paths(&["/x"])],
            get(API, "/a%2Fb"),
            Deny("d"),
        ),
        case(
            "ambiguous path on another host",
            vec![allow("b", &["other.example"]).paths(&["/**"])],
            get(API, "/a%2Fb"),
            DEFAULT_DENY,
        ),
        case(
            "asterisk form is malformed",
            vec![allow("r", &[API]).paths(&["/**"])],
            req(API, Method::Options, "*"),
            Refused(Reason::MalformedRequest),
        ),
        case(
            "bad escape is malformed",
            vec![allow("r", &[API]).paths(&["/**"])],
            get(API, "/a%zz"),
            Refused(Reason::MalformedRequest),
        ),
        case(
            "query in path is malformed",
            vec![allow("r", &[API]).paths(&["/**"])],
            get(API, "/a?b=1"),
            Refused(Reason::MalformedRequest),
        ),
        case(
            "trailing slash is literal",
            vec![allow("r", &[API]).paths(&["/repos"])],
            get(API, "/repos/"),
            Refused(Reason::HttpNotAllowed),
        ),
        case(
            "escapes normalized both sides",
            vec![allow("r", &[API]).paths(&["/a%3ab"])],
            get(API, "/a%3Ab"),
            Allow("r"),
        ),
        case(
            "/** matches the root",
            vec![allow("r", &[API]).paths(&["/**"])],
            get(API, "/"),
            Allow("r"),
        ),
        case(
            "/**/x at any depth",
            vec![allow("r", &[API]).paths(&["/**/x"])],
            get(API, "/a/b/x"),
            Allow("r"),
        ),
        case(
            "second glob of a rule",
            vec![allow("r", &[API]).paths(&["/a", "/b/**"])],
            get(API, "/b/c"),
            Allow("r"),
        ),
    ]
}

fn scopes() -> Vec<Case> {
    vec![
        case(
            "global rule, sandbox query",
            vec![allow("g", &["h.example"])],
            conn("h.example").sandbox("a"),
            Allow("g"),
        ),
        case(
            "global rule, no sandbox",
            vec![allow("g", &["h.example"])],
            conn("h.example"),
            Allow("g"),
        ),
        case(
            "sandbox:a rule, sandbox a",
            vec![allow("s", &["h.example"]).sandbox("a")],
            conn("h.example").sandbox("a"),
            Allow("s"),
        ),
        case(
            "sandbox:a rule, sandbox b",
            vec![allow("s", &["h.example"]).sandbox("a")],
            conn("h.example").sandbox("b"),
            DEFAULT_DENY,
        ),
        case(
            "sandbox:a rule, no sandbox",
            vec![allow("s", &["h.example"]).sandbox("a")],
            conn("h.example"),
            DEFAULT_DENY,
        ),
        case(
            "sandbox deny beats global allow",
            vec![
                allow("g", &["h.example"]),
                deny("s", &["h.example"]).sandbox("a"),
            ],
            conn("h.example").sandbox("a"),
            Deny("s"),
        ),
        case(
            "sandbox deny stays in its sandbox",
            vec![
                allow("g", &["h.example"]),
                deny("s", &["h.example"]).sandbox("a"),
            ],
            conn("h.example").sandbox("b"),
            Allow("g"),
        ),
        case(
            "global deny beats sandbox allow",
            vec![
                allow("s", &["h.example"]).sandbox("a"),
                deny("g", &["h.example"]),
            ],
            conn("h.example").sandbox("a"),
            Deny("g"),
        ),
        case(
            "other sandbox's deny ignored",
            vec![allow("g", &["**"]), deny("b", &["h.example"]).sandbox("b")],
            conn("h.example").sandbox("a"),
            Allow("g"),
        ),
        case(
            "first deny across scopes decides",
            vec![
                deny("s", &["h.example"]).sandbox("a"),
                deny("g", &["h.example"]),
            ],
            conn("h.example").sandbox("a"),
            Deny("s"),
        ),
        case(
            "sandbox bounded allow, request",
            vec![allow("s", &[API]).sandbox("a").methods(&[Method::Get])],
            get(API, "/").sandbox("a"),
            Allow("s"),
        ),
        case(
            "sandbox bounded allow, other sandbox",
            vec![allow("s", &[API]).sandbox("a").methods(&[Method::Get])],
            get(API, "/").sandbox("b"),
            DEFAULT_DENY,
        ),
    ]
}

fn phases() -> Vec<Case> {
    vec![
        case(
            "install rule, runtime query",
            vec![allow("i", &["h.example"]).phase(Phase::Install)],
            conn("h.example"),
            DEFAULT_DENY,
        ),
        case(
            "install rule, install query",
            vec![allow("i", &["h.example"]).phase(Phase::Install)],
            conn("h.example").phase(Phase::Install),
            Allow("i"),
        ),
        case(
            "no phase covers install",
            vec![allow("r", &["h.example"])],
            conn("h.example").phase(Phase::Install),
            Allow("r"),
        ),
        case(
            "runtime deny, install query",
            vec![
                allow("a", &["h.example"]),
                deny("d", &["h.example"]).phase(Phase::Runtime),
            ],
            conn("h.example").phase(Phase::Install),
            Allow("a"),
        ),
        case(
            "runtime deny, runtime query",
            vec![
                allow("a", &["h.example"]),
                deny("d", &["h.example"]).phase(Phase::Runtime),
            ],
            conn("h.example"),
            Deny("d"),
        ),
        case(
            "install-only bounded allow at runtime",
            vec![
                allow("i", &[API])
                    .methods(&[Method::Get])
                    .phase(Phase::Install),
            ],
            get(API, "/"),
            DEFAULT_DENY,
        ),
    ]
}

fn protocols() -> Vec<Case> {
    vec![
        case(
            "tcp rule, udp query",
            vec![allow("t", &["h.example"]).protocol(Protocol::Tcp)],
            conn("h.example").protocol(Protocol::Udp),
            DEFAULT_DENY,
        ),
        case(
            "udp rule, udp query",
            vec![allow("u", &["h.example"]).protocol(Protocol::Udp)],
            conn("h.example").protocol(Protocol::Udp),
            Allow("u"),
        ),
        case(
            "udp rule, tcp query",
            vec![allow("u", &["h.example"]).protocol(Protocol::Udp)],
            conn("h.example"),
            DEFAULT_DENY,
        ),
        case(
            "any rule, udp query",
            vec![allow("r", &["h.example"])],
            conn("h.example").protocol(Protocol::Udp),
            Allow("r"),
        ),
        case(
            "tcp deny leaves udp",
            vec![
                allow("a", &["h.example"]),
                deny("d", &["h.example"]).protocol(Protocol::Tcp),
            ],
            conn("h.example").protocol(Protocol::Udp),
            Allow("a"),
        ),
        case(
            "tcp deny on tcp",
            vec![
                allow("a", &["h.example"]),
                deny("d", &["h.example"]).protocol(Protocol::Tcp),
            ],
            conn("h.example"),
            Deny("d"),
        ),
        case(
            "udp allow does not grant any",
            vec![allow("u", &["h.example"]).protocol(Protocol::Udp)],
            conn("h.example").protocol(Protocol::Any),
            DEFAULT_DENY,
        ),
        case(
            "tcp deny denies a query for any",
            vec![
                allow("a", &["h.example"]),
                deny("d", &["h.example"]).protocol(Protocol::Tcp),
            ],
            conn("h.example").protocol(Protocol::Any),
            Deny("d"),
        ),
        case(
            "bounded-only host over udp",
            vec![allow("b", &[API]).methods(&[Method::Get])],
            conn(API).protocol(Protocol::Udp),
            RefusedBy(Reason::InspectionRequired, "b"),
        ),
        case(
            "bounded deny makes udp uninspectable",
            vec![
                allow("a", &[API]),
                deny("d", &[API]).methods(&[Method::Post]),
            ],
            conn(API).protocol(Protocol::Udp),
            RefusedBy(Reason::InspectionRequired, "d"),
        ),
        case(
            "bounded allow under unbounded allow, udp",
            vec![
                allow("a", &[API]),
                allow("b", &[API]).methods(&[Method::Get]),
            ],
            conn(API).protocol(Protocol::Udp),
            Allow("a"),
        ),
        case(
            "tcp-only bounded deny leaves udp",
            vec![
                allow("a", &[API]),
                deny("d", &[API])
                    .methods(&[Method::Post])
                    .protocol(Protocol::Tcp),
            ],
            conn(API).protocol(Protocol::Udp),
            Allow("a"),
        ),
    ]
}

fn sources() -> Vec<Case> {
    vec![
        case(
            "user deny beats kit allow",
            vec![
                allow("kit", &["h.example"]).source(Source::Kit),
                deny("user", &["h.example"]),
            ],
            conn("h.example"),
            Deny("user"),
        ),
        case(
            "kit deny beats user allow",
            vec![
                allow("user", &["h.example"]),
                deny("kit", &["h.example"]).source(Source::Kit).sandbox("a"),
            ],
            conn("h.example").sandbox("a"),
            Deny("kit"),
        ),
        case(
            "kit deny beats preset allow",
            vec![
                allow("preset", &["**"]).source(Source::Default),
                deny("kit", &["h.example"]).source(Source::Kit),
            ],
            conn("h.example"),
            Deny("kit"),
        ),
        case(
            "deny given last still wins",
            vec![
                allow("a1", &["h.example"]),
                allow("a2", &["**"]),
                deny("d", &["*.example"]),
            ],
            conn("h.example"),
            Deny("d"),
        ),
        case(
            "first of two allows decides",
            vec![allow("a1", &["**"]), allow("a2", &["h.example"])],
            conn("h.example"),
            Allow("a1"),
        ),
        case(
            "first of two denies decides",
            vec![deny("d1", &["h.example"]), deny("d2", &["**"])],
            conn("h.example"),
            Deny("d1"),
        ),
        case(
            "user bounded deny beats kit unbounded allow",
            vec![
                allow("kit", &[API]).source(Source::Kit),
                deny("user", &[API]).methods(&[Method::Delete]),
            ],
            req(API, Method::Delete, "/repos/x"),
            Deny("user"),
        ),
        case(
            "kit bounded deny beats user bounded allow",
            vec![
                allow("user", &[API]).paths(&["/**"]),
                deny("kit", &[API])
                    .source(Source::Kit)
                    .paths(&["/admin/**"]),
            ],
            get(API, "/admin/users"),
            Deny("kit"),
        ),
        case(
            "unbounded deny before an earlier bounded deny",
            vec![deny("b", &[API]).methods(&[Method::Get]), deny("u", &[API])],
            get(API, "/"),
            Deny("u"),
        ),
    ]
}

fn activity_and_malformed() -> Vec<Case> {
    vec![
        case(
            "inactive allow ignored",
            vec![allow("a", &["h.example"]).inactive()],
            conn("h.example"),
            DEFAULT_DENY,
        ),
        case(
            "inactive deny ignored",
            vec![
                allow("a", &["h.example"]),
                deny("d", &["h.example"]).inactive(),
            ],
            conn("h.example"),
            Allow("a"),
        ),
        case(
            "malformed allow: good resource does not allow",
            vec![allow("a", &["good.example", "bad host"])],
            conn("good.example"),
            DEFAULT_DENY,
        ),
        case(
            "malformed allow: bad path glob",
            vec![allow("a", &[API]).paths(&["/a//b"])],
            get(API, "/a/b"),
            DEFAULT_DENY,
        ),
        case(
            "malformed allow: empty methods",
            vec![allow("a", &[API]).methods(&[])],
            get(API, "/"),
            DEFAULT_DENY,
        ),
        case(
            "malformed allow: empty paths",
            vec![allow("a", &[API]).paths(&[])],
            get(API, "/"),
            DEFAULT_DENY,
        ),
        case(
            "malformed allow: no resources",
            vec![allow("a", &[])],
            conn("h.example"),
            DEFAULT_DENY,
        ),
        case(
            "malformed deny keeps its good resource",
            vec![allow("a", &["**"]), deny("d", &["bad host", "h.example"])],
            conn("h.example"),
            Deny("d"),
        ),
        case(
            "malformed deny path reads as every path",
            vec![
                allow("a", &[API]),
                deny("d", &[API])
                    .methods(&[Method::Get])
                    .paths(&["relative"]),
            ],
            get(API, "/anything"),
            Deny("d"),
        ),
        case(
            "malformed deny path keeps its methods",
            vec![
                allow("a", &[API]),
                deny("d", &[API])
                    .methods(&[Method::Get])
                    .paths(&["relative"]),
            ],
            req(API, Method::Post, "/anything"),
            Allow("a"),
        ),
        case(
            "malformed deny empty methods reads as every method",
            vec![allow("a", &[API]), deny("d", &[API]).methods(&[])],
            req(API, Method::Patch, "/x"),
            Deny("d"),
        ),
        case(
            "IP in bounded allow still works",
            vec![allow("a", &["10.0.0.1"]).methods(&[Method::Get])],
            Query {
                http: get(API, "/").http,
                ..ip("10.0.0.1", 443)
            },
            Allow("a"),
        ),
    ]
}

fn bounded_connections() -> Vec<Case> {
    vec![
        case(
            "bounded-only host: connection inspected",
            vec![allow("b", &[API]).methods(&[Method::Get])],
            conn(API),
            AllowInspect("b"),
        ),
        case(
            "bounded allow on another port",
            vec![allow("b", &["api.example.com:8443"]).methods(&[Method::Get])],
            conn(API),
            DEFAULT_DENY,
        ),
        case(
            "bounded deny makes an allowed host inspected",
            vec![allow("a", &[API]), deny("d", &[API]).paths(&["/admin/**"])],
            conn(API),
            AllowInspect("a"),
        ),
        case(
            "unbounded allow alone: not inspected",
            vec![allow("a", &[API])],
            conn(API),
            Allow("a"),
        ),
        case(
            "bounded allow under unbounded allow: not inspected",
            vec![
                allow("a", &[API]),
                allow("b", &[API]).methods(&[Method::Get]),
            ],
            conn(API),
            Allow("a"),
        ),
        case(
            "bounded deny alone grants nothing",
            vec![deny("d", &[API]).methods(&[Method::Post])],
            conn(API),
            DEFAULT_DENY,
        ),
        case(
            "bounded deny and bounded allow: inspected",
            vec![
                allow("b", &[API]).methods(&[Method::Any]),
                deny("d", &[API]).methods(&[Method::Delete]),
            ],
            conn(API),
            AllowInspect("b"),
        ),
        case(
            "bounded deny and bounded allow: request denied",
            vec![
                allow("b", &[API]).methods(&[Method::Any]),
                deny("d", &[API]).methods(&[Method::Delete]),
            ],
            req(API, Method::Delete, "/"),
            Deny("d"),
        ),
        case(
            "unbounded allow: any request",
            vec![allow("a", &[API])],
            req(API, Method::Trace, "/x"),
            Allow("a"),
        ),
        case(
            "bounded-only host: other request",
            vec![
                allow("b", &[API])
                    .methods(&[Method::Get])
                    .paths(&["/repos/**"]),
            ],
            req(API, Method::Post, "/repos/x"),
            Refused(Reason::HttpNotAllowed),
        ),
        case(
            "request to a host without rules",
            vec![allow("a", &["other.example"])],
            get(API, "/"),
            DEFAULT_DENY,
        ),
        case(
            "bounded allow elsewhere, wildcard allow here",
            vec![
                allow("b", &["a.example"]).methods(&[Method::Get]),
                allow("w", &["*.b.example"]),
            ],
            req("x.b.example", Method::Post, "/"),
            Allow("w"),
        ),
        case(
            "** deny refuses requests",
            vec![allow("a", &[API]), deny("d", &["**"])],
            get(API, "/"),
            Deny("d"),
        ),
        case(
            "first bounded allow on the host decides the connection",
            vec![
                allow("b1", &[API]).methods(&[Method::Post]),
                allow("b2", &[API]).methods(&[Method::Get]),
            ],
            conn(API),
            AllowInspect("b1"),
        ),
        case(
            "unbounded deny beats bounded allow on connection",
            vec![
                allow("b", &[API]).methods(&[Method::Get]),
                deny("d", &["*.example.com"]),
            ],
            conn(API),
            Deny("d"),
        ),
    ]
}

#[test]
fn table() {
    let groups: Vec<(&str, Vec<Case>)> = vec![
        ("names", names()),
        ("wildcards", wildcards()),
        ("ports", ports()),
        ("addresses", addresses()),
        ("methods", methods()),
        ("paths", paths()),
        ("scopes", scopes()),
        ("phases", phases()),
        ("protocols", protocols()),
        ("sources", sources()),
        ("activity and malformed", activity_and_malformed()),
        ("bounded connections", bounded_connections()),
    ];
    let mut total = 0;
    for (group, cases) in groups {
        let n = run(cases);
        eprintln!("{group}: {n} cases");
        total += n;
    }
    eprintln!("total: {total} cases");
    assert!(total >= 150, "only {total} cases");
}

#[test]
fn messages_say_what_decided() {
    let rules = vec![
        deny("kit:m1:deny", &[API]).source(Source::Kit),
        allow("local:1", &["**.example.org"]),
        allow("kit:m1", &["bounded.example"])
            .source(Source::Kit)
            .methods(&[Method::Get]),
    ];
    let m = Matcher::compile(&rules);
    let text = |q: &Query| m.decide(q).message;
    assert_eq!(
        text(&conn(API)),
        "`api.example.com:443` is denied by rule `kit:m1:deny` (kit)"
    );
    assert_eq!(
        text(&conn("evil.example.com")),
        "no rule allows `evil.example.com:443` (default deny)"
    );
    assert_eq!(
        text(&conn("a.example.org:80")),
        "`a.example.org:80` is allowed by rule `local:1` (user)"
    );
    assert_eq!(
        text(&req("bounded.example", Method::Post, "/repos/x")),
        "`POST /repos/x` on `bounded.example` is not among the requests its rules allow"
    );
    assert_eq!(
        text(&conn("bounded.example")),
        "`bounded.example:443` is allowed for some HTTP requests by rule `kit:m1` (kit); its requests are inspected"
    );
    assert_eq!(
        text(&get("bounded.example", "/a/%2e%2e/b")),
        "`GET /a/%2e%2e/b` on `bounded.example` is refused: `/a/%2e%2e/b` is ambiguous: an encoded `.` forms a dot segment"
    );
    assert_eq!(
        text(&ip("2001:db8::1", 443)),
        "no rule allows `[2001:db8::1]:443` (default deny)"
    );
    let bad = m.decide(&raw("a b", 443));
    assert_eq!(bad.reason, Reason::InvalidTarget);
    assert!(bad.message.contains("`a b`"), "{}", bad.message);
    let v = m.decide(&conn(API));
    assert_eq!(v.rule.unwrap().name, "kit:m1:deny");
}

#[test]
fn compile_report_names_rules_and_problems() {
    let rules = vec![
        allow("ok", &["a.example"]),
        allow("bad-resource", &["a b"]),
        deny("bad-path", &[API]).paths(&["/a/../b"]),
        allow("no-resources", &[]),
        allow("empty-methods", &[API]).methods(&[]),
        allow("inactive-bad", &["a b"]).inactive(),
    ];
    let (m, problems) = Matcher::compile_report(&rules);
    let ids: Vec<&str> = problems.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        ["bad-resource", "bad-path", "no-resources", "empty-methods"]
    );
    assert_eq!(problems[0].1.to_string(), "resource `a b` is malformed");
    let source = std::error::Error::source(&problems[0].1)
        .unwrap()
        .to_string();
    assert!(source.contains("`a b`"), "{source}");
    // The malformed allows are left out; the malformed deny is kept.
    assert_eq!(m.rule_count(), 2);
}

// ---------------------------------------------------------------------------------------
// The naive reference: a linear scan over the rules, written from the semantics.

/// A rule as the reference reads it.
struct Read<'a> {
    rule: &'a Rule,
    patterns: Vec<HostPattern>,
    /// `None` for every method.
    methods: Option<Vec<Method>>,
    /// `None` for every path.
    globs: Option<Vec<PathGlob>>,
}

fn read(rule: &Rule) -> Option<Read<'_>> {
    if !rule.active {
        return None;
    }
    let mut malformed = rule.resources.is_empty();
    let mut patterns = Vec::new();
    for r in &rule.resources {
        match HostPattern::parse(r) {
            Ok(p) => patterns.push(p),
            Err(_) => malformed = true,
        }
    }
    let mut methods = rule.methods.clone();
    let methods_empty = methods.as_ref().is_some_and(Vec::is_empty);
    malformed |= methods_empty;
    let mut globs_bad = false;
    let mut globs = rule.paths.as_ref().map(|list| {
        globs_bad |= list.is_empty();
        list.iter()
            .filter_map(|p| {
                let g = PathGlob::compile(p);
                globs_bad |= g.is_err();
                g.ok()
            })
            .collect::<Vec<_>>()
    });
    malformed |= globs_bad;
    if malformed {
        if rule.decision == Decision::Allow {
            return None;
        }
        if methods_empty {
            methods = None;
        }
        if globs_bad {
            globs = None;
        }
    }
    Some(Read {
        rule,
        patterns,
        methods,
        globs,
    })
}

fn reference(rules: &[Rule], q: &Query) -> Outcome {
    let refused = |reason| {
        (
            Decision::Deny,
            Some(DenyKind::Implicit),
            reason,
            None,
            false,
        )
    };
    let target = match &q.target {
        Target::Ip(ip) => Target::Ip(ip.to_canonical()),
        Target::Host(h) => match h.parse::<IpAddr>() {
            Ok(ip) => Target::Ip(ip.to_canonical()),
            Err(_) => match normalize_host(h) {
                Ok(n) => Target::Host(n),
                Err(_) => return refused(Reason::InvalidTarget),
            },
        },
    };
    let path = q.http.as_ref().map(|r| normalize_path(&r.path));
    let read: Vec<Read<'_>> = rules.iter().filter_map(read).collect();
    let applies = |r: &Read<'_>| {
        r.rule.scope.applies_to(q.sandbox.as_deref())
            && r.rule.phase.is_none_or(|p| p == q.phase)
            && (r.rule.protocol == Protocol::Any
                || r.rule.protocol == q.protocol
                || (r.rule.decision == Decision::Deny && q.protocol == Protocol::Any))
            && r.patterns.iter().any(|p| p.matches(&target, q.port))
    };
    let request_matches = |r: &Read<'_>| {
        let (Some(req), Some(Ok(path))) = (&q.http, &path) else {
            return false;
        };
        let method_ok = r
            .methods
            .as_ref()
            .is_none_or(|m| m.contains(&Method::Any) || m.contains(&req.method));
        let path_ok = r
            .globs
            .as_ref()
            .is_none_or(|g| g.iter().any(|g| g.matches(path)));
        method_ok && path_ok
    };
    let first = |f: &dyn Fn(&Read<'_>) -> bool| {
        read.iter()
            .find(|r| applies(r) && f(r))
            .map(|r| r.rule.id.clone())
    };
    let bounded = |r: &Read<'_>| r.rule.is_bounded();
    let is = |d: Decision| move |r: &Read<'_>| r.rule.decision == d;
    let unbounded_deny = first(&|r| !bounded(r) && is(Decision::Deny)(r));
    let unbounded_allow = first(&|r| !bounded(r) && is(Decision::Allow)(r));
    let bounded_deny = first(&|r| bounded(r) && is(Decision::Deny)(r));
    let bounded_allow = first(&|r| bounded(r) && is(Decision::Allow)(r));
    let explicit = |id: String| {
        (
            Decision::Deny,
            Some(DenyKind::Explicit),
            Reason::DeniedByRule,
            Some(id),
            false,
        )
    };
    let allowed = |id: String, inspect| {
        (
            Decision::Allow,
            None,
            Reason::AllowedByRule,
            Some(id),
            inspect,
        )
    };

    if let Some(id) = unbounded_deny {
        return explicit(id);
    }
    match &q.http {
        None => {
            // The first bounded rule that needs the traffic inspected.
            let inspected_for = read
                .iter()
                .find(|r| {
                    applies(r)
                        && bounded(r)
                        && (r.rule.decision == Decision::Deny || unbounded_allow.is_none())
                })
                .map(|r| r.rule.id.clone());
            if let Some(id) = &inspected_for
                && q.protocol != Protocol::Tcp
            {
                return (
                    Decision::Deny,
                    Some(DenyKind::Implicit),
                    Reason::InspectionRequired,
                    Some(id.clone()),
                    false,
                );
            }
            if let Some(id) = unbounded_allow {
                return allowed(id, inspected_for.is_some());
            }
            if let Some(id) = bounded_allow {
                return allowed(id, true);
            }
            refused(Reason::NoMatchingAllow)
        }
        Some(_) => {
            let judged =
                bounded_deny.is_some() || (unbounded_allow.is_none() && bounded_allow.is_some());
            if judged && let Some(Err(e)) = &path {
                return refused(match e {
                    PathError::Ambiguous { .. } => Reason::AmbiguousPath,
                    _ => Reason::MalformedRequest,
                });
            }
            if let Some(id) = first(&|r| bounded(r) && is(Decision::Deny)(r) && request_matches(r))
            {
                return explicit(id);
            }
            if let Some(id) = unbounded_allow {
                return allowed(id, false);
            }
            if let Some(id) = first(&|r| bounded(r) && is(Decision::Allow)(r) && request_matches(r))
            {
                return allowed(id, false);
            }
            if bounded_allow.is_some() {
                return refused(Reason::HttpNotAllowed);
            }
            refused(Reason::NoMatchingAllow)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Properties.

const HOSTS: &[&str] = &[
    "a.com",
    "b.a.com",
    "c.b.a.com",
    "x.org",
    "b.x.org",
    "xn--bcher-kva.example",
];
const SUFFIXES: &[&str] = &["a.com", "b.a.com", "com", "x.org", "org", "example"];
const ADDRESSES: &[&str] = &[
    "10.0.0.1",
    "10.1.1.1",
    "11.0.0.1",
    "::1",
    "2001:db8::5",
    "::ffff:10.0.0.1",
];
const NETWORKS: &[&str] = &[
    "10.0.0.1",
    "10.0.0.0/8",
    "10.1.0.0/16",
    "[::1]",
    "2001:db8::/32",
    "0.0.0.0/0",
];
const PORTS: &[u16] = &[443, 80, 22];
const GLOBS: &[&str] = &["/**", "/a/**", "/a/*", "/b", "/a/*/c", "/**/c", "/a//bad"];
const REQUEST_PATHS: &[&str] = &[
    "/",
    "/a",
    "/a/b",
    "/a/b/c",
    "/b",
    "/a/%2e%2e/b",
    "/a%2Fb",
    "/a/./b",
    "//a/b",
    "/x/../a/b",
    "*",
];

fn resource() -> impl Strategy<Value = String> {
    let host = prop_oneof![
        prop::sample::select(HOSTS).prop_map(str::to_owned),
        prop::sample::select(SUFFIXES).prop_map(|s| format!("*.{s}")),
        prop::sample::select(SUFFIXES).prop_map(|s| format!("**.{s}")),
        Just("*".to_owned()),
        Just("**".to_owned()),
        Just("B\u{fc}cher.example".to_owned()),
    ];
    let port = prop::sample::select(&["", ":443", ":80", ":*"][..]);
    prop_oneof![
        6 => (host, port).prop_map(|(h, p)| format!("{h}{p}")),
        2 => prop::sample::select(NETWORKS).prop_map(str::to_owned),
        1 => prop::sample::select(&["bad host", "a*.com", "x.org:0", "10.0.0.0/40"][..]).prop_map(str::to_owned),
    ]
}

fn method() -> impl Strategy<Value = Method> {
    prop::sample::select(&[Method::Get, Method::Post, Method::Delete, Method::Any][..])
}

fn rule_strategy() -> impl Strategy<Value = Rule> {
    (
        any::<bool>(),
        prop_oneof![1 => Just(Vec::new()), 9 => prop::collection::vec(resource(), 1..3)],
        prop_oneof![
            3 => Just(None),
            2 => prop::collection::vec(method(), 0..3).prop_map(Some),
        ],
        prop_oneof![
            3 => Just(None),
            2 => prop::collection::vec(prop::sample::select(GLOBS).prop_map(str::to_owned), 0..3).prop_map(Some),
        ],
        prop::sample::select(&[Protocol::Any, Protocol::Any, Protocol::Any, Protocol::Tcp, Protocol::Udp][..]),
        prop::sample::select(&[None, None, None, Some(Phase::Install), Some(Phase::Runtime)][..]),
        prop::sample::select(&[None, None, None, Some("a"), Some("b")][..]),
        prop::bool::weighted(0.9),
    )
        .prop_map(|(is_allow, resources, methods, paths, protocol, phase, sandbox, active)| {
            let mut r = rule("", if is_allow { Decision::Allow } else { Decision::Deny }, &[]);
            r.resources = resources;
            r.methods = methods;
            r.paths = paths;
            r.protocol = protocol;
            r.phase = phase;
            if let Some(s) = sandbox {
                r.scope = Scope::Sandbox(s.to_owned());
            }
            r.active = active;
            r
        })
}

fn rules_strategy() -> impl Strategy<Value = Vec<Rule>> {
    prop::collection::vec(rule_strategy(), 0..24).prop_map(number)
}

/// Gives rules distinct ids in order (`r0`, `r1`, …).
fn number(mut rules: Vec<Rule>) -> Vec<Rule> {
    for (i, r) in rules.iter_mut().enumerate() {
        r.id = format!("r{i}");
        r.name = r.id.clone();
    }
    rules
}

fn query_strategy() -> impl Strategy<Value = Query> {
    let target = prop_oneof![
        3 => prop::sample::select(HOSTS).prop_map(|h| Target::Host(h.to_owned())),
        1 => prop::sample::select(&["Bücher.Example.", "A.COM", "B.x.org.", "bad host", "10.0.0.1"][..]).prop_map(|h| Target::Host(h.to_owned())),
        2 => prop::sample::select(ADDRESSES).prop_map(|a| Target::Ip(a.parse().unwrap())),
    ];
    let http = prop_oneof![
        1 => Just(None),
        1 => (method(), prop::sample::select(REQUEST_PATHS))
            .prop_map(|(method, path)| Some(HttpRequest { method, path: path.to_owned() })),
    ];
    (
        target,
        prop::sample::select(PORTS),
        prop::sample::select(&[Protocol::Tcp, Protocol::Tcp, Protocol::Udp, Protocol::Any][..]),
        prop::sample::select(&[Phase::Runtime, Phase::Install][..]),
        prop::sample::select(&[None, Some("a"), Some("b")][..]),
        http,
    )
        .prop_map(|(target, port, protocol, phase, sandbox, http)| Query {
            sandbox: sandbox.map(str::to_owned),
            phase,
            target,
            port,
            protocol,
            http,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn compiled_agrees_with_reference(rules in rules_strategy(), queries in prop::collection::vec(query_strategy(), 1..8)) {
        let m = Matcher::compile(&rules);
        for q in &queries {
            prop_assert_eq!(outcome(&m.decide(q)), reference(&rules, q), "query {:?}", q);
        }
    }

    #[test]
    fn adding_an_allow_never_denies(rules in rules_strategy(), extra in rule_strategy(), at in any::<prop::sample::Index>(), q in query_strategy()) {
        let before = Matcher::compile(&rules).decide(&q);
        let mut more = rules.clone();
        let mut extra = extra;
        extra.decision = Decision::Allow;
        extra.id = "extra".to_owned();
        more.insert(at.index(rules.len() + 1), extra);
        let after = Matcher::compile(&more).decide(&q);
        prop_assert!(!before.is_allowed() || after.is_allowed(), "{:?} became {:?}", before, after);
    }

    #[test]
    fn adding_a_deny_never_allows(rules in rules_strategy(), extra in rule_strategy(), at in any::<prop::sample::Index>(), q in query_strategy()) {
        let before = Matcher::compile(&rules).decide(&q);
        let mut more = rules.clone();
        let mut extra = extra;
        extra.decision = Decision::Deny;
        extra.id = "extra".to_owned();
        more.insert(at.index(rules.len() + 1), extra);
        let after = Matcher::compile(&more).decide(&q);
        prop_assert!(before.is_allowed() || !after.is_allowed(), "{:?} became {:?}", before, after);
    }

    #[test]
    fn a_matching_unbounded_deny_always_wins(rules in rules_strategy(), q in query_strategy()) {
        let mut more = rules.clone();
        more.push(deny("deny-all", &["**"]));
        let v = Matcher::compile(&more).decide(&q);
        prop_assert!(!v.is_allowed());
        if v.reason != Reason::InvalidTarget {
            prop_assert_eq!(v.deny_kind, Some(DenyKind::Explicit));
        }
    }

    #[test]
    fn normalized_hosts_are_fixed_points(host in "[a-zA-Z0-9._-]{1,30}") {
        if let Ok(n) = normalize_host(&host) {
            prop_assert_eq!(normalize_host(&n), Ok(n.clone()));
        }
    }

    #[test]
    fn normalized_paths_are_fixed_points(path in "/[a-z./%0-9A-F~]{0,20}") {
        if let Ok(n) = normalize_path(&path) {
            let again = normalize_path(&n).map(std::borrow::Cow::into_owned);
            prop_assert_eq!(again, Ok(n.into_owned()));
        }
    }
}
