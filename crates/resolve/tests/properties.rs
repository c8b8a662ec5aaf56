//! Invariants of composition over random kits: a composed grant set never grants more than
//! the union of what its kits asked for, and the order kits are given in changes nothing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::collections::BTreeMap;

use capgate_resolve::{Surface, Unit, diff_widenings, plan, surface_of};
use proptest::prelude::*;

const HOSTS: [&str; 6] = [
    "a.example",
    "b.example",
    "c.example:443",
    "*.d.example",
    "e.example",
    "**",
];
const PATHS: [&str; 3] = ["/repos/**", "/user", "/v1/*"];

/// One random mixin (or the workload): network entries in both phases, maybe a credential,
/// a volume and a port, all unique to the kit where the spec requires one owner.
#[derive(Debug, Clone)]
struct KitSpec {
    allow: Vec<(usize, Option<(bool, usize)>)>,
    deny: Vec<usize>,
    install_allow: Vec<usize>,
    credential: bool,
    volume: bool,
    port: bool,
}

fn kit_spec() -> impl Strategy<Value = KitSpec> {
    (
        prop::collection::vec(
            (0..5usize, prop::option::of((any::<bool>(), 0..3usize))),
            0..4,
        ),
        prop::collection::vec(0..6usize, 0..2),
        prop::collection::vec(0..6usize, 0..2),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(allow, deny, install_allow, credential, volume, port)| KitSpec {
                allow,
                deny,
                install_allow,
                credential,
                volume,
                port,
            },
        )
}

fn render(i: usize, spec: &KitSpec) -> String {
    let kind = if i == 0 { "workload" } else { "mixin" };
    let mut t = format!("schemaVersion: \"3\"\nkind: {kind}\ncapabilities:\n");
    t.push_str("  - type: com.docker.sandbox/network-policy@2\n    config:\n      runtime:\n        allow:\n");
    let mut injected = None;
    for (h, bound) in &spec.allow {
        let host = HOSTS[*h];
        match bound {
            // Bounded allow entries must name hosts literally.
            Some((get, p)) if !host.contains('*') => {
                let method = if *get { "GET" } else { "POST" };
                t.push_str(&format!(
                    "          - {{hosts: [\"{host}\"], methods: [{method}], paths: [\"{}\"]}}\n",
                    PATHS[*p]
                ));
            }
            _ => t.push_str(&format!("          - \"{host}\"\n")),
        }
        if !host.contains('*') {
            injected = Some(host.split(':').next().unwrap_or(host).to_owned());
        }
    }
    t.push_str(&format!("          - \"own{i}.example\"\n"));
    if !spec.deny.is_empty() {
        t.push_str("        deny:\n");
        for d in &spec.deny {
            t.push_str(&format!("          - \"deny{d}.example\"\n"));
        }
    }
    if !spec.install_allow.is_empty() {
        t.push_str("      install:\n        allow:\n");
        for h in &spec.install_allow {
            t.push_str(&format!("          - \"{}\"\n", HOSTS[*h]));
        }
    }
    if spec.credential {
        let domain = injected.unwrap_or_else(|| format!("own{i}.example"));
        t.push_str(&format!(
            "  - type: com.docker.sandbox/credential@1\n    config: {{service: svc{i}, phase: runtime, apiKey: {{name: T{i}, inject: [{{domain: \"{domain}\"}}]}}}}\n"
        ));
    }
    if spec.volume {
        t.push_str(&format!(
            "  - type: com.docker.sandbox/volume@1\n    config: {{path: /data/k{i}}}\n"
        ));
    }
    if spec.port {
        t.push_str(&format!(
            "  - type: com.docker.sandbox/port@1\n    config: {{container: {}}}\n",
            8000 + i
        ));
    }
    t
}

fn units(specs: &[KitSpec]) -> Vec<Unit> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let text = render(i, s);
            let loaded = capgate_spec::load(text.as_bytes(), &capgate_spec::Options::default());
            assert!(loaded.is_valid(), "{text}\n{:?}", loaded.diagnostics);
            Unit {
                reference: format!("kit{i}"),
                digest: String::new(),
                descriptor: loaded.descriptor.unwrap(),
                args: BTreeMap::new(),
            }
        })
        .collect()
}

/// The union of surfaces, list by list.
fn union(surfaces: &[Surface]) -> Surface {
    let mut u = Surface::default();
    for s in surfaces {
        macro_rules! extend {
            ($($f:ident),*) => { $( u.$f.extend(s.$f.iter().cloned()); )* };
        }
        extend!(
            network_install_allow,
            network_install_deny,
            network_runtime_allow,
            network_runtime_deny,
            network_install_http_allow,
            network_install_http_deny,
            network_runtime_http_allow,
            network_runtime_http_deny,
            credentials_install,
            credentials_runtime,
            ssh_agent,
            storage_paths,
            skills_paths,
            skills_write_paths,
            ports,
            usb,
            services,
            host_mount_paths
        );
        u.privileged |= s.privileged;
    }
    u.normalize();
    u
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn composition_never_grants_more_than_its_kits_asked(specs in prop::collection::vec(kit_spec(), 1..5)) {
        let us = units(&specs);
        let asked = union(&us.iter().map(|u| surface_of(&u.descriptor)).collect::<Vec<_>>());
        let composed = plan(us).unwrap();
        let wider = diff_widenings(&asked, &composed.surface);
        prop_assert!(wider.is_empty(), "composition widened: {wider:?}");
        // Denies are never lost in composition (deny wins on the merged set).
        for d in &asked.network_runtime_deny {
            prop_assert!(composed.surface.network_runtime_deny.contains(d));
        }
    }

    #[test]
    fn input_order_does_not_matter(specs in prop::collection::vec(kit_spec(), 2..5), rotate in 0..4usize) {
        let us = units(&specs);
        let mut rotated = us.clone();
        let n = rotated.len();
        rotated.rotate_left(rotate % n);
        let a = plan(us).unwrap();
        let b = plan(rotated).unwrap();
        prop_assert_eq!(&a.surface, &b.surface);
        prop_assert_eq!(a.order(), b.order());
        prop_assert_eq!(
            serde_json::to_string(&a.composed.descriptor()).unwrap(),
            serde_json::to_string(&b.composed.descriptor()).unwrap()
        );
    }

    #[test]
    fn a_lock_of_a_plan_admits_that_plan(specs in prop::collection::vec(kit_spec(), 1..4)) {
        let p = plan(units(&specs)).unwrap();
        let lock = capgate_resolve::Lock::from_plan(&p);
        prop_assert!(lock.gate(&p).is_empty());
        let reread = capgate_resolve::Lock::parse(lock.to_json().as_bytes()).unwrap();
        prop_assert!(reread.gate(&p).is_empty());
    }
}
