#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]
//! Decisions per second of the compiled matcher against rule sets of 10, 1k, 10k and 100k
//! rules, and of a naive linear scan over the same (pre-parsed) rules in the same run, so
//! that the ratio is visible. Rules mix exact names, `*.`/`**.` wildcards, ported names,
//! networks and bounded HTTP rules, global and per sandbox; queries mix hits and misses,
//! connections and requests.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use capgate_policy::path::{PathGlob, normalize_path};
use capgate_policy::pattern::HostPattern;
use capgate_policy::{
    CreatedVia, Decision, DenyKind, HttpRequest, Matcher, Method, Phase, Protocol, Query, Reason,
    ResourceType, Rule, RuleRef, Scope, Source, Target, Verdict,
};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

/// A small deterministic generator (SplitMix64), so runs compare.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap()
    }
}

const SANDBOXES: usize = 16;
const TLDS: &[&str] = &["com", "org", "net", "io", "dev"];

/// The shape of rule `i`: what it names, so queries can hit it.
#[derive(Clone, Copy)]
enum Shape {
    Exact,
    Ported,
    OneLabel,
    AnyDepth,
    Bounded,
    Network,
}

fn shape(i: usize) -> Shape {
    match i % 10 {
        0..=2 => Shape::Exact,
        3 => Shape::Ported,
        4 => Shape::OneLabel,
        5 => Shape::AnyDepth,
        6..=8 => Shape::Bounded,
        _ => Shape::Network,
    }
}

fn domain(i: usize) -> String {
    format!("d{i}.{}", TLDS[i % TLDS.len()])
}

fn network(i: usize) -> Ipv4Addr {
    let i = u32::try_from(i).unwrap();
    Ipv4Addr::from(0x0A00_0000 | (i << 8))
}

fn rules(n: usize) -> Vec<Rule> {
    let mut random = Random(0x5EED ^ n as u64);
    (0..n)
        .map(|i| {
            let d = domain(i);
            let (resource, methods, paths) = match shape(i) {
                Shape::Exact => (format!("api.{d}"), None, None),
                Shape::Ported => (format!("git.{d}:22"), None, None),
                Shape::OneLabel => (format!("*.{d}"), None, None),
                Shape::AnyDepth => (format!("**.{d}"), None, None),
                Shape::Bounded => (
                    format!("rest.{d}"),
                    Some(vec![Method::Get, Method::Head]),
                    Some(vec!["/repos/*/issues/**".to_owned(), "/user".to_owned()]),
                ),
                Shape::Network => (format!("{}/24", network(i)), None, None),
            };
            let deny = random.below(10) == 0;
            let scope = if random.below(5) == 0 {
                Scope::Sandbox(format!("sb{}", random.below(SANDBOXES)))
            } else {
                Scope::Global
            };
            Rule {
                id: format!("r{i}"),
                name: format!("rule-{i}"),
                scope,
                resource_type: ResourceType::Network,
                decision: if deny {
                    Decision::Deny
                } else {
                    Decision::Allow
                },
                resources: vec![resource],
                methods,
                paths,
                protocol: if random.below(8) == 0 {
                    Protocol::Tcp
                } else {
                    Protocol::Any
                },
                phase: if random.below(8) == 0 {
                    Some(Phase::Install)
                } else {
                    None
                },
                source: if random.below(2) == 0 {
                    Source::Kit
                } else {
                    Source::User
                },
                created_via: CreatedVia::Added,
                editable: true,
                active: true,
                created_at: "2026-01-01T00:00:00Z".to_owned(),
            }
        })
        .collect()
}

/// `count` queries against a rule set of `n` rules: about 60% aimed at a rule (some of
/// which still miss on port, method or path), the rest at names and addresses no rule
/// names.
fn queries(n: usize, count: usize) -> Vec<Query> {
    let mut random = Random(0xC0FFEE ^ n as u64);
    (0..count)
        .map(|_| {
            let i = random.below(n);
            let d = domain(i);
            let mut port = 443;
            let mut http = None;
            let target = if random.below(10) < 6 {
                match shape(i) {
                    Shape::Exact => Target::Host(format!("api.{d}")),
                    Shape::Ported => {
                        port = if random.below(2) == 0 { 22 } else { 443 };
                        Target::Host(format!("git.{d}"))
                    }
                    Shape::OneLabel => Target::Host(format!("x{}.{d}", random.below(100))),
                    Shape::AnyDepth => Target::Host(format!("a.b{}.c.{d}", random.below(100))),
                    Shape::Bounded => {
                        if random.below(3) != 0 {
                            let path = match random.below(4) {
                                0 => "/repos/capgate/issues/12".to_owned(),
                                1 => "/user".to_owned(),
                                2 => "/repos/capgate/pulls".to_owned(),
                                _ => "/repos/x/../../admin".to_owned(),
                            };
                            let method = if random.below(4) == 0 {
                                Method::Post
                            } else {
                                Method::Get
                            };
                            http = Some(HttpRequest { method, path });
                        }
                        Target::Host(format!("rest.{d}"))
                    }
                    Shape::Network => {
                        let base = u32::from(network(i));
                        Target::Ip(IpAddr::V4(Ipv4Addr::from(
                            base | u32::try_from(random.below(256)).unwrap(),
                        )))
                    }
                }
            } else if random.below(4) == 0 {
                Target::Ip(IpAddr::V4(Ipv4Addr::from(
                    0xC000_0200 | u32::try_from(random.below(256)).unwrap(),
                )))
            } else {
                Target::Host(format!(
                    "www.miss{}.nowhere.{}",
                    random.below(1_000_000),
                    TLDS[random.below(TLDS.len())]
                ))
            };
            Query {
                sandbox: (random.below(2) == 0).then(|| format!("sb{}", random.below(SANDBOXES))),
                phase: if random.below(10) == 0 {
                    Phase::Install
                } else {
                    Phase::Runtime
                },
                target,
                port,
                protocol: Protocol::Tcp,
                http,
            }
        })
        .collect()
}

/// The naive peer: the same semantics by a scan over every rule per query (rules parsed
/// once beforehand, so only the scan is compared).
struct Naive {
    rules: Vec<NaiveRule>,
}

struct NaiveRule {
    rule: Rule,
    patterns: Vec<HostPattern>,
    globs: Option<Vec<PathGlob>>,
}

/// What the naive scan decides: allowed, and the deciding rule.
type NaiveVerdict = (bool, Option<usize>);

fn source_label(source: Source) -> &'static str {
    match source {
        Source::Kit => "kit",
        Source::User => "user",
        Source::Default => "default",
    }
}

impl Naive {
    fn new(rules: &[Rule]) -> Naive {
        Naive {
            rules: rules
                .iter()
                .filter(|r| r.active)
                .map(|r| NaiveRule {
                    rule: r.clone(),
                    patterns: r
                        .resources
                        .iter()
                        .filter_map(|s| HostPattern::parse(s).ok())
                        .collect(),
                    globs: r
                        .paths
                        .as_ref()
                        .map(|p| p.iter().filter_map(|g| PathGlob::compile(g).ok()).collect()),
                })
                .collect(),
        }
    }

    /// A full verdict, built as the compiled matcher builds it (rule reference and
    /// message), so that only the way of finding the rule differs.
    fn verdict(&self, q: &Query) -> Verdict {
        let (allowed, rule) = self.decide(q);
        let target = match &q.target {
            Target::Host(h) => format!("{h}:{}", q.port),
            Target::Ip(ip) => format!("{ip}:{}", q.port),
        };
        let rule = rule.and_then(|i| self.rules.get(i)).map(|r| &r.rule);
        let message = match (allowed, rule) {
            (true, Some(r)) => format!(
                "`{target}` is allowed by rule `{}` ({})",
                r.name,
                source_label(r.source)
            ),
            (false, Some(r)) => format!(
                "`{target}` is denied by rule `{}` ({})",
                r.name,
                source_label(r.source)
            ),
            (_, None) => format!("no rule allows `{target}` (default deny)"),
        };
        Verdict {
            decision: if allowed {
                Decision::Allow
            } else {
                Decision::Deny
            },
            deny_kind: match (allowed, rule) {
                (true, _) => None,
                (false, Some(_)) => Some(DenyKind::Explicit),
                (false, None) => Some(DenyKind::Implicit),
            },
            reason: match (allowed, rule) {
                (true, _) => Reason::AllowedByRule,
                (false, Some(_)) => Reason::DeniedByRule,
                (false, None) => Reason::NoMatchingAllow,
            },
            rule: rule.map(|r| RuleRef {
                id: r.id.clone(),
                name: r.name.clone(),
                source: r.source,
            }),
            message,
            inspect: false,
        }
    }

    fn decide(&self, q: &Query) -> NaiveVerdict {
        let mut first = [None::<usize>; 6]; // unbounded deny/allow, bounded deny/allow (host), bounded deny/allow (request)
        let path = q.http.as_ref().map(|r| normalize_path(&r.path));
        for (i, r) in self.rules.iter().enumerate() {
            let rule = &r.rule;
            let applies = rule.scope.applies_to(q.sandbox.as_deref())
                && rule.phase.is_none_or(|p| p == q.phase)
                && (rule.protocol == Protocol::Any || rule.protocol == q.protocol)
                && r.patterns.iter().any(|p| p.matches(&q.target, q.port));
            if !applies {
                continue;
            }
            let deny = usize::from(rule.decision == Decision::Allow);
            if !rule.is_bounded() {
                first[deny].get_or_insert(i);
                continue;
            }
            first[2 + deny].get_or_insert(i);
            if let (Some(req), Some(Ok(path))) = (&q.http, &path) {
                let method_ok = rule
                    .methods
                    .as_ref()
                    .is_none_or(|m| m.contains(&Method::Any) || m.contains(&req.method));
                if method_ok
                    && r.globs
                        .as_ref()
                        .is_none_or(|g| g.iter().any(|g| g.matches(path)))
                {
                    first[4 + deny].get_or_insert(i);
                }
            }
        }
        let [
            unbounded_deny,
            unbounded_allow,
            bounded_deny,
            bounded_allow,
            deny_request,
            allow_request,
        ] = first;
        if unbounded_deny.is_some() {
            return (false, unbounded_deny);
        }
        match &q.http {
            None => match unbounded_allow.or(bounded_allow) {
                Some(i) => (true, Some(i)),
                None => (false, None),
            },
            Some(_) => {
                let judged = bounded_deny.is_some()
                    || (unbounded_allow.is_none() && bounded_allow.is_some());
                if judged && matches!(path, Some(Err(_))) {
                    return (false, None);
                }
                if deny_request.is_some() {
                    return (false, deny_request);
                }
                match unbounded_allow.or(allow_request) {
                    Some(i) => (true, Some(i)),
                    None => (false, None),
                }
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    for n in [10, 1_000, 10_000, 100_000] {
        let rules = rules(n);
        let matcher = Matcher::compile(&rules);
        let naive = Naive::new(&rules);
        let batch = queries(n, 4096);
        // The naive scan is slow on large sets: fewer queries per iteration keep a sample
        // short; throughput is per decision either way.
        let naive_batch = &batch[..(4096 * 1_000 / n.max(1_000)).max(64)];

        // Both sides agree on the decision (the tests compare everything else).
        for q in naive_batch {
            assert_eq!(matcher.decide(q).is_allowed(), naive.decide(q).0, "{q:?}");
        }
        let allowed = batch
            .iter()
            .filter(|q| matcher.decide(q).is_allowed())
            .count();
        eprintln!("{n} rules: {allowed} of {} queries allowed", batch.len());

        let mut group = c.benchmark_group(format!("decide/{n}"));
        if n >= 1_000 {
            group.sample_size(10);
        }
        group.throughput(Throughput::Elements(batch.len() as u64));
        group.bench_function(BenchmarkId::new("compiled", n), |b| {
            b.iter(|| {
                batch
                    .iter()
                    .filter(|q| matcher.decide(black_box(q)).is_allowed())
                    .count()
            });
        });
        group.throughput(Throughput::Elements(naive_batch.len() as u64));
        group.bench_function(BenchmarkId::new("naive", n), |b| {
            b.iter(|| {
                naive_batch
                    .iter()
                    .filter(|q| naive.verdict(black_box(q)).is_allowed())
                    .count()
            });
        });
        group.finish();
    }

    let mut group = c.benchmark_group("compile");
    group.sample_size(10);
    for n in [1_000, 100_000] {
        let rules = rules(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| Matcher::compile(black_box(&rules)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
