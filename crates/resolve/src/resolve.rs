//! Resolution (spec §4.1): is this closed set of kits one coherent composition, and in
//! what order do they layer? Every problem is collected and reported together.

use std::collections::{BTreeMap, BTreeSet};

use capgate_spec::caps::Capability;
use capgate_spec::names::{self, CapabilityName, Provide, Require};
use capgate_spec::{Descriptor, Kind};

use crate::problem::Refusal;

/// One kit of a composition, as the runtime holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    /// The consumption reference, as requested (identity for the lock).
    pub reference: String,
    /// `sha256:<hex>` of the descriptor bytes.
    pub digest: String,
    /// The kit's effective descriptor: create-phase args expanded.
    pub descriptor: Descriptor,
    /// The resolved create-arg values.
    pub args: BTreeMap<String, String>,
}

/// A coherent composition and its two orders.
#[derive(Debug, Clone)]
pub struct Resolution {
    pub units: Vec<Unit>,
    /// Indices into `units` in dependency order (providers first): hook and merge order.
    pub topological: Vec<usize>,
    /// Indices into `units`: the workload first, then mixins in dependency order.
    pub layers: Vec<usize>,
    /// Each unit's provides with their effective versions.
    pub provides: Vec<Vec<Provide>>,
}

/// The effective version of a kit's unversioned provides: a version-shaped consumption
/// reference beats the descriptor's `version`.
pub fn effective_version(reference: &str, descriptor: &Descriptor) -> Option<String> {
    capgate_spec::reference::version_from_reference(reference).or_else(|| {
        descriptor
            .version
            .as_deref()
            .map(str::trim)
            .filter(|v| names::is_version(v))
            .map(str::to_owned)
    })
}

/// Resolves a closed set of units; the descriptors get their effective version.
pub fn resolve(mut units: Vec<Unit>) -> Result<Resolution, Vec<Refusal>> {
    let mut problems = Vec::new();
    let workloads: Vec<&Unit> = units
        .iter()
        .filter(|u| u.descriptor.kind == Kind::Workload)
        .collect();
    match workloads.as_slice() {
        [] => problems.push(Refusal::new(
            "no workload kit: a composition needs exactly one workload",
        )),
        [_] => {}
        many => problems.push(Refusal::new(format!(
            "more than one workload: {} (a composition has exactly one)",
            many.iter()
                .map(|u| format!("`{}`", u.reference))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
    for u in &units {
        if u.descriptor.kind == Kind::Set {
            problems.push(Refusal::in_kit(
                &u.reference,
                "a set has to be merged before it can contribute; compose its member kits instead",
            ));
        }
    }
    let mut seen_refs = BTreeSet::new();
    for u in &units {
        if !seen_refs.insert(u.reference.clone()) {
            problems.push(Refusal::in_kit(&u.reference, "kit is listed twice"));
        }
    }

    // Provides, with effective versions.
    let mut provides: Vec<Vec<Provide>> = Vec::with_capacity(units.len());
    for u in &mut units {
        let version = effective_version(&u.reference, &u.descriptor);
        u.descriptor.version.clone_from(&version);
        let mut list = Vec::new();
        for (i, s) in u.descriptor.provides.iter().enumerate() {
            match names::parse_provide(s) {
                Ok(mut p) => {
                    if p.version.is_none() {
                        p.version = version
                            .as_deref()
                            .and_then(|v| names::Version::parse(v).ok());
                    }
                    list.push(p);
                }
                Err(e) => problems.push(Refusal::at(
                    &u.reference,
                    &format!("provides[{i}]"),
                    e.to_string(),
                )),
            }
        }
        provides.push(list);
    }

    // One provider per normalized name.
    let mut providers: BTreeMap<CapabilityName, Vec<usize>> = BTreeMap::new();
    for (i, list) in provides.iter().enumerate() {
        let names: BTreeSet<&CapabilityName> = list.iter().map(|p| &p.name).collect();
        for n in names {
            providers.entry(n.clone()).or_default().push(i);
        }
    }
    for (name, owners) in &providers {
        if owners.len() > 1 {
            problems.push(Refusal::new(format!(
                "`{}` is provided by more than one kit ({}); one name has one provider",
                name.display(),
                owners
                    .iter()
                    .map(|&i| format!("`{}`", units[i].reference))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }

    // One owner per credential (service, phase).
    let mut owners: BTreeMap<(String, &'static str), Vec<usize>> = BTreeMap::new();
    for (i, u) in units.iter().enumerate() {
        let mut mine = BTreeSet::new();
        for (_, e) in u.descriptor.declared_entries() {
            if let Some(Capability::Credential(c)) = &e.capability {
                for p in &c.phases {
                    mine.insert((c.service.clone(), p.as_str()));
                }
            }
        }
        for k in mine {
            owners.entry(k).or_default().push(i);
        }
    }
    for ((service, phase), who) in &owners {
        if who.len() > 1 {
            problems.push(Refusal::new(format!(
                "credential `{service}` for phase {phase} is declared by more than one kit ({}); one credential has one owner",
                who.iter()
                    .map(|&i| format!("`{}`", units[i].reference))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }

    // Relations, and the dependency edges they make.
    let mut edges: BTreeSet<(usize, usize)> = BTreeSet::new();
    let offered = |name: &CapabilityName, except: usize| -> Vec<(usize, &Provide)> {
        provides
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != except)
            .flat_map(|(i, list)| list.iter().filter(|p| &p.name == name).map(move |p| (i, p)))
            .collect()
    };
    for (i, u) in units.iter().enumerate() {
        for (field, list) in [
            ("requires", &u.descriptor.requires),
            ("integrates", &u.descriptor.integrates),
        ] {
            for (j, s) in list.iter().enumerate() {
                let path = format!("{field}[{j}]");
                let req: Require = match names::parse_require(s) {
                    Ok(r) => r,
                    Err(e) => {
                        problems.push(Refusal::at(&u.reference, &path, e.to_string()));
                        continue;
                    }
                };
                let candidates = offered(&req.name, i);
                let satisfying: Vec<usize> = candidates
                    .iter()
                    .filter(|(_, p)| names::satisfies(p, &req))
                    .map(|(k, _)| *k)
                    .collect();
                if let Some(&k) = satisfying.first() {
                    edges.insert((k, i));
                } else if field == "requires" || !candidates.is_empty() {
                    let why = if candidates.is_empty() {
                        "nothing in the set provides it".to_owned()
                    } else {
                        format!(
                            "the set only offers {}",
                            candidates
                                .iter()
                                .map(|(k, p)| format!(
                                    "{} (from `{}`)",
                                    describe(p),
                                    units[*k].reference
                                ))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    };
                    problems.push(Refusal::at(
                        &u.reference,
                        &path,
                        format!("{field} `{s}`, but {why}"),
                    ));
                }
            }
        }
        for (j, s) in u.descriptor.conflicts.iter().enumerate() {
            let Ok(name) = names::parse_conflict(s) else {
                continue;
            };
            for (k, _) in offered(&name, i) {
                problems.push(Refusal::at(
                    &u.reference,
                    &format!("conflicts[{j}]"),
                    format!(
                        "conflicts with `{s}`, which `{}` provides",
                        units[k].reference
                    ),
                ));
            }
        }
    }

    let topological = match topological_order(&units, &edges) {
        Ok(order) => order,
        Err(cycle) => {
            problems.push(Refusal::new(format!(
                "the kits depend on each other in a cycle: {}",
                cycle.join(", ")
            )));
            Vec::new()
        }
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    let mut layers: Vec<usize> = topological
        .iter()
        .copied()
        .filter(|&i| units[i].descriptor.kind == Kind::Workload)
        .collect();
    layers.extend(
        topological
            .iter()
            .copied()
            .filter(|&i| units[i].descriptor.kind != Kind::Workload),
    );
    Ok(Resolution {
        units,
        topological,
        layers,
        provides,
    })
}

fn describe(p: &Provide) -> String {
    match &p.version {
        Some(v) => format!("{}@{}", p.name.display(), v.as_str()),
        None => p.name.display(),
    }
}

/// Kahn's algorithm with ties broken by reference, so the order is the same for any input
/// order. On a cycle, the sorted references of the kits left over.
fn topological_order(
    units: &[Unit],
    edges: &BTreeSet<(usize, usize)>,
) -> Result<Vec<usize>, Vec<String>> {
    let mut indegree = vec![0usize; units.len()];
    for &(_, to) in edges {
        indegree[to] += 1;
    }
    let mut ready: BTreeSet<(&str, usize)> = indegree
        .iter()
        .enumerate()
        .filter(|(_, d)| **d == 0)
        .map(|(i, _)| (units[i].reference.as_str(), i))
        .collect();
    let mut order = Vec::with_capacity(units.len());
    while let Some(&(r, i)) = ready.iter().next() {
        ready.remove(&(r, i));
        order.push(i);
        for &(from, to) in edges.range((i, 0)..(i + 1, 0)) {
            debug_assert_eq!(from, i);
            indegree[to] -= 1;
            if indegree[to] == 0 {
                ready.insert((units[to].reference.as_str(), to));
            }
        }
    }
    if order.len() == units.len() {
        Ok(order)
    } else {
        let mut left: Vec<String> = (0..units.len())
            .filter(|i| !order.contains(i))
            .map(|i| units[i].reference.clone())
            .collect();
        left.sort();
        Err(left)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]
    use super::*;

    fn unit(reference: &str, text: &str) -> Unit {
        let loaded = capgate_spec::load(text.as_bytes(), &capgate_spec::Options::default());
        assert!(loaded.is_valid(), "{reference}: {:?}", loaded.diagnostics);
        Unit {
            reference: reference.to_owned(),
            digest: String::new(),
            descriptor: loaded.descriptor.unwrap(),
            args: BTreeMap::new(),
        }
    }

    fn kit(kind: &str, extra: &str) -> String {
        format!("schemaVersion: \"3\"\nkind: {kind}\n{extra}")
    }

    fn refs(r: &Resolution, order: &[usize]) -> Vec<String> {
        order
            .iter()
            .map(|&i| r.units[i].reference.clone())
            .collect()
    }

    fn problems(units: Vec<Unit>) -> String {
        match resolve(units) {
            Ok(_) => panic!("expected a refusal"),
            Err(p) => p
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    #[test]
    fn order_is_deterministic_for_any_input_order() {
        let make = || {
            vec![
                unit("z-acp", &kit("mixin", "requires: [\"claude >= 2.0.0\"]\n")),
                unit(
                    "b-claude",
                    &kit(
                        "mixin",
                        "version: \"2.1.6\"\nprovides: [claude]\nrequires: [shell]\n",
                    ),
                ),
                unit(
                    "shell",
                    &kit("workload", "version: \"1.0.0\"\nprovides: [shell]\n"),
                ),
                unit("a-free", &kit("mixin", "")),
            ]
        };
        let expected = ["a-free", "shell", "b-claude", "z-acp"];
        let mut units = make();
        for rotation in 0..units.len() {
            units.rotate_left(1);
            let r = resolve(units.clone()).unwrap();
            assert_eq!(refs(&r, &r.topological), expected, "rotation {rotation}");
            assert_eq!(
                refs(&r, &r.layers),
                ["shell", "a-free", "b-claude", "z-acp"]
            );
        }
        let mut reversed = make();
        reversed.reverse();
        let r = resolve(reversed).unwrap();
        assert_eq!(refs(&r, &r.topological), expected);
    }

    #[test]
    fn exactly_one_workload() {
        assert!(problems(vec![unit("m", &kit("mixin", ""))]).contains("no workload kit"));
        let p = problems(vec![
            unit("a", &kit("workload", "")),
            unit("b", &kit("workload", "")),
        ]);
        assert!(p.contains("more than one workload"), "{p}");
    }

    #[test]
    fn one_provider_per_name() {
        let p = problems(vec![
            unit("claude", &kit("workload", "provides: [claude]\n")),
            unit(
                "claude-mixin",
                &kit("mixin", "provides: [\"com.docker.kit/claude@2.0.0\"]\n"),
            ),
        ]);
        assert!(
            p.contains("`claude` is provided by more than one kit"),
            "{p}"
        );
        // One kit repeating a name is fine, and both of its versions satisfy.
        let r = resolve(vec![
            unit(
                "w",
                &kit("workload", "provides: [foo@1.0.0, \"foo@2.0.0\"]\n"),
            ),
            unit("m", &kit("mixin", "requires: [\"foo >= 2.0.0\"]\n")),
        ]);
        assert!(r.is_ok());
    }

    #[test]
    fn one_credential_owner() {
        let cred = "capabilities:\n  - type: com.docker.sandbox/credential@1\n    config: {service: github, phase: [install, runtime], apiKey: {name: T}}\n";
        let p = problems(vec![
            unit("w", &kit("workload", cred)),
            unit("m", &kit("mixin", cred)),
        ]);
        assert!(p.contains("credential `github` for phase install"), "{p}");
        assert!(p.contains("credential `github` for phase runtime"), "{p}");
    }

    #[test]
    fn requires_integrates_conflicts() {
        let p = problems(vec![
            unit(
                "w",
                &kit("workload", "version: \"1.4.2\"\nprovides: [base]\n"),
            ),
            unit(
                "m",
                &kit(
                    "mixin",
                    "requires: [\"base >= 9.0.0\", missing]\nintegrates: [\"base < 1.0.0\", absent]\nconflicts: [base]\n",
                ),
            ),
        ]);
        assert!(p.contains("m requires[0]: requires `base >= 9.0.0`, but the set only offers base@1.4.2 (from `w`)"), "{p}");
        assert!(
            p.contains("m requires[1]: requires `missing`, but nothing in the set provides it"),
            "{p}"
        );
        assert!(p.contains("m integrates[0]"), "{p}");
        assert!(
            !p.contains("integrates[1]"),
            "an absent integration is fine: {p}"
        );
        assert!(p.contains("m conflicts[0]: conflicts with `base`"), "{p}");
        // A kit's own provide never satisfies its own require.
        let p = problems(vec![unit(
            "w",
            &kit("workload", "provides: [x]\nrequires: [x]\n"),
        )]);
        assert!(p.contains("nothing in the set provides it"), "{p}");
    }

    #[test]
    fn reference_tags_version_unversioned_provides() {
        let r = resolve(vec![
            unit(
                "reg.example/base:v2.1.0",
                &kit("workload", "version: \"1.0.0\"\nprovides: [base]\n"),
            ),
            unit("m", &kit("mixin", "requires: [\"base >= 2.0.0\"]\n")),
        ])
        .unwrap();
        assert_eq!(r.units[0].descriptor.version.as_deref(), Some("2.1.0"));
    }

    #[test]
    fn cycles_name_their_kits_sorted() {
        let p = problems(vec![
            unit("w", &kit("workload", "")),
            unit("b", &kit("mixin", "provides: [b]\nrequires: [a]\n")),
            unit("a", &kit("mixin", "provides: [a]\nrequires: [b]\n")),
        ]);
        assert!(p.contains("cycle: a, b"), "{p}");
    }
}
