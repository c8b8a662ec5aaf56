//! A kit composition's network grants as per-sandbox rules (`kit:NAME`), the way sbx
//! provisions them: visible to the user, not editable, replaced as a whole when the sandbox
//! is created again.

use capgate_spec::caps::network::{HostEntry, NetworkPolicy, PhaseRules};

use crate::rule::{Decision, Phase, Protocol};
use crate::store::NewRule;

/// The rules a sandbox's merged network policy provisions, in a stable order: per phase,
/// the unbounded allow (`kit:NAME`), the unbounded deny (`kit:NAME:deny`), then one rule per
/// bounded entry (`kit:NAME:http`, `kit:NAME:http:deny`); install-phase names carry
/// `:install` (`kit:NAME:install`, …). Unbounded entries grant any protocol; bounded ones
/// speak only about HTTP requests.
pub fn kit_rules(sandbox: &str, policy: Option<&NetworkPolicy>) -> Vec<NewRule> {
    let Some(policy) = policy else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for phase in [Phase::Runtime, Phase::Install] {
        if let Some(rules) = policy.phase(phase) {
            phase_rules(sandbox, phase, rules, &mut out);
        }
    }
    out
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
        let rules = kit_rules("s", Some(&p));
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
}
