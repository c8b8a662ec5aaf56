//! A kit composition's network grants as per-sandbox rules (`kit:NAME`), the way sbx
//! provisions them: visible to the user, not editable, replaced as a whole when the sandbox
//! is created again.

use capgate_spec::caps::network::{HostEntry, Method, NetworkPolicy, PhaseRules};
use capgate_spec::caps::pack::{Egress, EgressProtocol, Tier};

use crate::rule::{Decision, Phase, Protocol};
use crate::store::NewRule;

/// The methods a `read-only` workload may send: they read, never change (RFC 9110 §9.2.1).
pub const READ_ONLY_METHODS: [Method; 3] = [Method::Get, Method::Head, Method::Options];

/// The methods refused to a `read-only` workload on every host, whatever else allows them.
const CHANGING_METHODS: [Method; 5] = [
    Method::Post,
    Method::Put,
    Method::Patch,
    Method::Delete,
    Method::Trace,
];

/// The rules a sandbox's merged network policy provisions, in a stable order: per phase,
/// the unbounded allow (`kit:NAME`), the unbounded deny (`kit:NAME:deny`), then one rule per
/// bounded entry (`kit:NAME:http`, `kit:NAME:http:deny`); install-phase names carry
/// `:install` (`kit:NAME:install`, …). Unbounded entries grant any protocol; bounded ones
/// speak only about HTTP requests.
///
/// A `read-only` tier (`dev.capgate/determinism@1`) holds the workload to reading: its
/// runtime allows are bounded to [`READ_ONLY_METHODS`] (an allow that names none of them
/// grants nothing), and one more rule, `kit:NAME:read-only`, refuses the changing methods
/// on every host, so that no other rule (a preset, a user's allow) lets one through. Being
/// bounded on every host, it also makes the gateway inspect all runtime traffic: opaque
/// tunnels and SOCKS are refused (`inspection_required`). Install hooks are set-up, not the
/// workload's behaviour, and keep their grants.
pub fn kit_rules(
    sandbox: &str,
    policy: Option<&NetworkPolicy>,
    tier: Option<Tier>,
) -> Vec<NewRule> {
    let mut out = Vec::new();
    let read_only = tier == Some(Tier::ReadOnly);
    if let Some(policy) = policy {
        for phase in [Phase::Runtime, Phase::Install] {
            match policy.phase(phase) {
                Some(rules) if read_only && phase == Phase::Runtime => {
                    phase_rules(sandbox, phase, &reading_only(rules), &mut out);
                }
                Some(rules) => phase_rules(sandbox, phase, rules, &mut out),
                None => {}
            }
        }
    }
    if read_only {
        let mut rule = NewRule::provisioned(
            format!("kit:{sandbox}:read-only"),
            sandbox,
            Decision::Deny,
            vec!["**".to_owned()],
            Protocol::Tcp,
        );
        rule.methods = Some(CHANGING_METHODS.to_vec());
        rule.phase = Some(Phase::Runtime);
        out.push(rule);
    }
    out
}

/// The rules a pack's egress triples (`dev.capgate/egress@1`) provision: one runtime allow
/// per protocol, `kit:NAME:egress:https` (rule protocol `https`: a TLS tunnel naming the
/// host, or requests inside an intercepted one), `…:http` (cleartext requests) and
/// `…:tcp` (any TCP stream), each naming its `host:port`s.
///
/// Under a `read-only` tier each is bounded to [`READ_ONLY_METHODS`], like the kit's other
/// runtime allows.
pub fn egress_rules(sandbox: &str, triples: &[&Egress], tier: Option<Tier>) -> Vec<NewRule> {
    EgressProtocol::ALL
        .into_iter()
        .filter_map(|protocol| {
            let hosts: Vec<String> = triples
                .iter()
                .filter(|t| t.protocol == protocol)
                .map(|t| t.host_port())
                .collect();
            if hosts.is_empty() {
                return None;
            }
            let mut rule = NewRule::provisioned(
                format!("kit:{sandbox}:egress:{protocol}"),
                sandbox,
                Decision::Allow,
                dedup(hosts),
                match protocol {
                    EgressProtocol::Https => Protocol::Https,
                    EgressProtocol::Http => Protocol::Http,
                    EgressProtocol::Tcp => Protocol::Tcp,
                },
            );
            rule.phase = Some(Phase::Runtime);
            if tier == Some(Tier::ReadOnly) {
                rule.methods = Some(READ_ONLY_METHODS.to_vec());
            }
            Some(rule)
        })
        .collect()
}

/// `rules` with every allow bounded to the reading methods; denies are kept as written.
fn reading_only(rules: &PhaseRules) -> PhaseRules {
    let allow = rules
        .allow
        .iter()
        .filter_map(|entry| {
            let methods: Vec<Method> = match entry.methods_or_any().as_slice() {
                [Method::Any] => READ_ONLY_METHODS.to_vec(),
                asked => READ_ONLY_METHODS
                    .into_iter()
                    .filter(|m| asked.contains(m))
                    .collect(),
            };
            (!methods.is_empty()).then(|| HostEntry {
                hosts: entry.hosts.clone(),
                methods: Some(methods),
                paths: entry.paths.clone(),
            })
        })
        .collect();
    PhaseRules {
        allow,
        deny: rules.deny.clone(),
    }
}

fn phase_rules(sandbox: &str, phase: Phase, rules: &PhaseRules, out: &mut Vec<NewRule>) {
    let base = match phase {
        Phase::Runtime => format!("kit:{sandbox}"),
        Phase::Install => format!("kit:{sandbox}:install"),
    };
    for (decision, entries, suffix) in [
        (Decision::Allow, &rules.allow, ""),
        (Decision::Deny, &rules.deny, ":deny"),
    ] {
        let hosts: Vec<String> = entries
            .iter()
            .filter(|e| !e.is_bounded())
            .flat_map(|e| e.hosts.iter().cloned())
            .collect();
        if !hosts.is_empty() {
            let mut rule = NewRule::provisioned(
                format!("{base}{suffix}"),
                sandbox,
                decision,
                dedup(hosts),
                Protocol::Any,
            );
            rule.phase = Some(phase);
            out.push(rule);
        }
    }
    for (decision, entries, suffix) in [
        (Decision::Allow, &rules.allow, ":http"),
        (Decision::Deny, &rules.deny, ":http:deny"),
    ] {
        for entry in entries.iter().filter(|e| e.is_bounded()) {
            out.push(bounded(
                sandbox,
                &format!("{base}{suffix}"),
                decision,
                phase,
                entry,
            ));
        }
    }
}

fn bounded(
    sandbox: &str,
    name: &str,
    decision: Decision,
    phase: Phase,
    entry: &HostEntry,
) -> NewRule {
    let mut rule =
        NewRule::provisioned(name, sandbox, decision, entry.hosts.clone(), Protocol::Tcp);
    rule.methods = Some(entry.methods_or_any());
    rule.paths = entry.paths.clone();
    rule.phase = Some(phase);
    rule
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    v.retain(|h| seen.insert(h.clone()));
    v
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]
    use super::*;
    use capgate_spec::caps::Capability;

    fn policy(yaml: &str) -> NetworkPolicy {
        let text = format!(
            "schemaVersion: \"3\"\nkind: mixin\ncapabilities:\n  - type: com.docker.sandbox/network-policy@2\n    config:\n{yaml}"
        );
        let loaded = capgate_spec::load(text.as_bytes(), &capgate_spec::Options::default());
        assert!(loaded.is_valid(), "{:?}", loaded.diagnostics);
        let d = loaded.descriptor.unwrap();
        match &d.declared_entries()[0].1.capability {
            Some(Capability::NetworkPolicy(p)) => p.clone(),
            _ => panic!("no policy"),
        }
    }

    #[test]
    fn the_seed_example_provisions_kit_name() {
        let rules = kit_rules(
            "m101-kit",
            Some(&policy("      runtime:\n        allow: [example.com]\n")),
            None,
        );
        assert_eq!(rules.len(), 1);
        let r = &rules[0];
        assert_eq!(r.name, "kit:m101-kit");
        assert_eq!(r.resources, vec!["example.com".to_owned()]);
        assert_eq!(r.decision, Decision::Allow);
        assert!(!r.editable);
        assert_eq!(r.phase, Some(Phase::Runtime));
    }

    #[test]
    fn phases_bounds_and_denies_each_get_a_rule() {
        let p = policy(
            "      install:\n        allow: [registry.npmjs.org]\n      runtime:\n        allow:\n          - api.example.com\n          - {hosts: [git.example.com], methods: [GET], paths: [\"/repos/**\"]}\n        deny:\n          - telemetry.example.com\n          - {hosts: [api.example.com], methods: [DELETE]}\n",
        );
        let rules = kit_rules("s", Some(&p), None);
        let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "kit:s",
                "kit:s:deny",
                "kit:s:http",
                "kit:s:http:deny",
                "kit:s:install"
            ]
        );
        assert_eq!(rules[2].paths, Some(vec!["/repos/**".to_owned()]));
        assert_eq!(rules[3].methods.as_ref().map(Vec::len), Some(1));
        assert_eq!(rules[4].phase, Some(Phase::Install));
    }

    #[test]
    fn a_read_only_tier_bounds_runtime_allows_to_reading_and_refuses_changes_everywhere() {
        let p = policy(
            "      install:\n        allow: [registry.npmjs.org]\n      runtime:\n        allow:\n          - api.example.com\n          - {hosts: [git.example.com], methods: [GET, POST], paths: [\"/repos/**\"]}\n          - {hosts: [hooks.example.com], methods: [POST]}\n        deny: [telemetry.example.com]\n",
        );
        let rules = kit_rules("s", Some(&p), Some(Tier::ReadOnly));
        type Shape = (String, Decision, Option<Vec<Method>>, Option<Phase>);
        let summary: Vec<Shape> = rules
            .iter()
            .map(|r| (r.name.clone(), r.decision, r.methods.clone(), r.phase))
            .collect();
        let reading = Some(READ_ONLY_METHODS.to_vec());
        assert_eq!(
            summary,
            [
                // The unbounded allow is now bounded: it no longer grants opaque traffic.
                (
                    "kit:s:deny".to_owned(),
                    Decision::Deny,
                    None,
                    Some(Phase::Runtime)
                ),
                (
                    "kit:s:http".to_owned(),
                    Decision::Allow,
                    reading,
                    Some(Phase::Runtime)
                ),
                (
                    "kit:s:http".to_owned(),
                    Decision::Allow,
                    Some(vec![Method::Get]),
                    Some(Phase::Runtime)
                ),
                // hooks.example.com asked for POST only: nothing of it is left.
                (
                    "kit:s:install".to_owned(),
                    Decision::Allow,
                    None,
                    Some(Phase::Install)
                ),
                (
                    "kit:s:read-only".to_owned(),
                    Decision::Deny,
                    Some(CHANGING_METHODS.to_vec()),
                    Some(Phase::Runtime)
                ),
            ]
        );
        assert_eq!(rules[2].paths, Some(vec!["/repos/**".to_owned()]));
        assert_eq!(rules[4].resources, vec!["**".to_owned()]);
        for rule in &rules {
            rule.validate().unwrap();
        }
        // Without a network policy the refusal still stands; other tiers add nothing.
        assert_eq!(kit_rules("s", None, Some(Tier::ReadOnly)).len(), 1);
        assert!(kit_rules("s", None, Some(Tier::SideEffect)).is_empty());
        assert_eq!(
            kit_rules("s", Some(&p), Some(Tier::Unrestricted)),
            kit_rules("s", Some(&p), None)
        );
    }

    #[test]
    fn egress_triples_become_one_runtime_allow_per_protocol() {
        let triple = |host: &str, port: u16, protocol| Egress {
            host: host.to_owned(),
            port,
            protocol,
        };
        let triples = [
            triple("api.openai.com", 443, EgressProtocol::Https),
            triple("Hooks.Slack.com", 443, EgressProtocol::Https),
            triple("2001:db8::1", 5432, EgressProtocol::Tcp),
            triple("api.openai.com", 443, EgressProtocol::Https),
        ];
        let triples: Vec<&Egress> = triples.iter().collect();
        let rules = egress_rules("p", &triples, None);
        let shape: Vec<(&str, Vec<&str>, Protocol)> = rules
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.resources.iter().map(String::as_str).collect(),
                    r.protocol,
                )
            })
            .collect();
        assert_eq!(
            shape,
            [
                (
                    "kit:p:egress:https",
                    vec!["api.openai.com:443", "hooks.slack.com:443"],
                    Protocol::Https
                ),
                (
                    "kit:p:egress:tcp",
                    vec!["[2001:db8::1]:5432"],
                    Protocol::Tcp
                ),
            ]
        );
        for r in &rules {
            assert_eq!(r.phase, Some(Phase::Runtime));
            assert_eq!(r.decision, Decision::Allow);
            r.validate().unwrap();
        }
        assert!(egress_rules("p", &[], None).is_empty());
        // A read-only pack reads through its triples too.
        for r in egress_rules("p", &triples, Some(Tier::ReadOnly)) {
            assert_eq!(r.methods, Some(READ_ONLY_METHODS.to_vec()));
        }
    }
}
