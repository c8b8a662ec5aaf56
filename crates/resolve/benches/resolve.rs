//! How the cost of resolve + surface + widening diff grows with the number of kits, and
//! what the example composition (a workload and three mixins) costs.
//!
//! `cargo bench -p capgate-resolve --bench resolve`
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "benchmark setup")]

use std::collections::BTreeMap;
use std::hint::black_box;

use capgate_resolve::{Lock, Unit, plan};
use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};

fn unit(reference: String, text: &str) -> Unit {
    let loaded = capgate_spec::load(text.as_bytes(), &capgate_spec::Options::default());
    assert!(loaded.is_valid(), "{reference}: {:?}", loaded.diagnostics);
    let effective =
        capgate_spec::args::effective(&loaded, &BTreeMap::new(), &BTreeMap::new(), true).unwrap();
    assert!(
        effective.is_valid(),
        "{reference}: {:?}",
        effective.diagnostics
    );
    Unit {
        reference,
        digest: capgate_resolve::digest_of(text.as_bytes()),
        descriptor: effective.descriptor.unwrap(),
        args: BTreeMap::new(),
    }
}

/// A workload and `n - 1` mixins, each with its own hosts, credential, volume and port, and
/// each requiring the workload (so the dependency graph is real).
fn synthetic(n: usize) -> Vec<Unit> {
    let mut units = vec![unit(
        "kits/base".into(),
        "schemaVersion: \"3\"\nkind: workload\nversion: \"1.0.0\"\nprovides: [base]\ncapabilities:\n  - type: com.docker.sandbox/network-policy@1\n    config: {runtime: {allow: [deb.debian.org], deny: [telemetry.example.com]}}\n",
    )];
    for i in 1..n {
        let text = format!(
            "schemaVersion: \"3\"\nkind: mixin\nprovides: [\"tool{i}@1.0.{i}\"]\nrequires: [\"base >= 1.0.0\"]\ncapabilities:\n  - type: com.docker.sandbox/network-policy@2\n    config:\n      runtime:\n        allow:\n          - api{i}.example.com\n          - {{hosts: [repo{i}.example.com], methods: [GET, HEAD], paths: [\"/repos/**\"]}}\n        deny:\n          - {{hosts: [repo{i}.example.com], methods: [DELETE]}}\n  - type: com.docker.sandbox/credential@1\n    config: {{service: svc{i}, phase: runtime, apiKey: {{name: TOKEN_{i}, proxyManaged: true, inject: [{{domain: api{i}.example.com}}]}}}}\n  - type: com.docker.sandbox/volume@1\n    config: {{path: /data/tool{i}}}\n  - type: com.docker.sandbox/port@1\n    config: {{container: {}}}\n",
            1000 + i
        );
        units.push(unit(format!("kits/tool{i:04}"), &text));
    }
    units
}

fn examples() -> Vec<Unit> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/kits");
    ["claude", "gh", "http-api", "pip-cache"]
        .iter()
        .map(|k| {
            let text = std::fs::read_to_string(format!("{dir}/{k}/kit.yaml")).unwrap();
            unit(format!("examples/kits/{k}"), &text)
        })
        .collect()
}

fn scaling(c: &mut Criterion) {
    let mut group = c.benchmark_group("resolve+surface+diff");
    for n in [2usize, 10, 100, 1000] {
        let units = synthetic(n);
        let lock = Lock::from_plan(&plan(units.clone()).unwrap());
        group.bench_with_input(BenchmarkId::from_parameter(n), &units, |b, units| {
            // Cloning the input is setup, not resolution: keep it out of the timing.
            b.iter_batched(
                || units.clone(),
                |units| {
                    let p = plan(black_box(units)).unwrap();
                    let widenings = lock.gate(&p);
                    assert!(widenings.is_empty());
                    black_box((p.surface, widenings))
                },
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

fn example_composition(c: &mut Criterion) {
    let units = examples();
    let lock = Lock::from_plan(&plan(units.clone()).unwrap());
    c.bench_function("example workload + 3 mixins", |b| {
        b.iter_batched(
            || units.clone(),
            |units| {
                let p = plan(black_box(units)).unwrap();
                black_box(lock.gate(&p))
            },
            BatchSize::SmallInput,
        );
    });
}

criterion_group!(benches, scaling, example_composition);
criterion_main!(benches);
