//! Every real kit we know must read cleanly: the published example kits of the kit
//! specification (an external corpus no one here wrote) and capgate's own examples. Their
//! published JSON form must read back to an equal descriptor, and their effective form
//! (create-phase args at their defaults) must pass the strict checks.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use capgate_spec::caps::{Capability, KnownType};
use capgate_spec::{Item, Kind, Options, Profile, load};

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/corpus/sandbox-kit-spec/examples"
);
const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/kits");

fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let d = entry.unwrap().path();
        for f in std::fs::read_dir(&d).unwrap() {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|e| e == "yaml") {
                out.push(f);
            }
        }
    }
    out.sort();
    out
}

fn all_kits() -> Vec<PathBuf> {
    let mut kits = yaml_files(CORPUS);
    assert_eq!(kits.len(), 20, "the external corpus has 20 kits");
    let examples = yaml_files(EXAMPLES);
    assert!(examples.len() >= 8, "at least 8 example kits");
    kits.extend(examples);
    kits
}

fn report(path: &Path, loaded: &capgate_spec::Loaded) -> String {
    loaded
        .diagnostics
        .iter()
        .map(|d| format!("{}:{d}", path.display()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_kit_validates_with_no_errors() {
    let mut failures = Vec::new();
    for path in all_kits() {
        let loaded = load(&std::fs::read(&path).unwrap(), &Options::default());
        if !loaded.is_valid() {
            failures.push(report(&path, &loaded));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn published_json_form_round_trips() {
    for path in all_kits() {
        let loaded = load(&std::fs::read(&path).unwrap(), &Options::default());
        let descriptor = loaded.descriptor.as_ref().unwrap();
        let json = serde_json::to_vec(descriptor).unwrap();
        let again = load(&json, &Options::default());
        assert!(again.is_valid(), "{}", report(&path, &again));
        assert_eq!(
            again.descriptor.as_ref(),
            Some(descriptor),
            "{}",
            path.display()
        );
        // And the JSON of the re-read is byte-identical: serialization is stable.
        assert_eq!(
            serde_json::to_vec(again.descriptor.as_ref().unwrap()).unwrap(),
            json
        );
    }
}

#[test]
fn effective_forms_with_default_args_are_strictly_valid() {
    let mut failures = Vec::new();
    for path in all_kits() {
        let loaded = load(&std::fs::read(&path).unwrap(), &Options::default());
        if loaded.descriptor.as_ref().unwrap().kind == Kind::Set {
            continue; // a set is merged at publish; it has no effective form of its own
        }
        let effective =
            capgate_spec::args::effective(&loaded, &BTreeMap::new(), &BTreeMap::new(), true);
        match effective {
            Ok(e) if e.is_valid() => {
                // No entry is parameterized any more, so every well-known one is typed.
                for (p, entry) in e.descriptor.as_ref().unwrap().declared_entries() {
                    assert!(!entry.parameterized, "{} {p}", path.display());
                    if entry.known.is_some() {
                        assert!(
                            entry.capability.is_some(),
                            "{} {p} not typed",
                            path.display()
                        );
                    }
                }
            }
            Ok(e) => failures.push(report(&path, &e)),
            Err(errs) => failures.push(format!("{}: {errs:?}", path.display())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn load_text(text: &str) -> capgate_spec::Loaded {
    load(text.as_bytes(), &Options::default())
}

#[test]
fn gh_mixin_reads_as_the_spec_describes() {
    let loaded = load(
        &std::fs::read(format!("{EXAMPLES}/gh/kit.yaml")).unwrap(),
        &Options::default(),
    );
    let d = loaded.valid().unwrap();
    assert!(loaded.diagnostics.is_empty(), "no warnings either");
    assert_eq!(d.kind, Kind::Mixin);
    assert_eq!(
        d.capability_types(),
        "com.docker.sandbox/agent-context@1,com.docker.sandbox/credential@1,com.docker.sandbox/network-policy@1"
    );
    let Some(Item::Entry(cred)) = d.capabilities.get(1) else {
        panic!("credential entry")
    };
    assert!(cred.optional, "the credential is not required");
    let Some(Capability::Credential(c)) = &cred.capability else {
        panic!("typed credential")
    };
    assert_eq!(c.service, "github");
    assert_eq!(c.api_key.as_ref().unwrap().inject.len(), 3);
    assert_eq!(c.api_key.as_ref().unwrap().env_name(), Some("GH_TOKEN"));
}

#[test]
fn parameterized_entries_are_lenient_now_and_strict_after_expansion() {
    let text = std::fs::read_to_string(format!("{EXAMPLES}/builder/kit.yaml")).unwrap();
    let loaded = load_text(&text);
    let d = loaded.valid().unwrap();
    let port = d
        .declared_entries()
        .into_iter()
        .find(|(_, e)| e.known == Some(KnownType::Port))
        .unwrap()
        .1;
    assert!(port.parameterized && port.capability.is_none());

    // Defaults: the whole-value reference becomes the integer 3330, the size stays text.
    let e =
        capgate_spec::args::effective(&loaded, &BTreeMap::new(), &BTreeMap::new(), false).unwrap();
    assert!(e.is_valid(), "{:?}", e.diagnostics);
    let ed = e.descriptor.as_ref().unwrap();
    let typed: Vec<_> = ed
        .declared_entries()
        .into_iter()
        .filter_map(|(_, e)| e.capability.clone())
        .collect();
    assert!(
        typed
            .iter()
            .any(|c| matches!(c, Capability::Port(p) if p.container == 3330))
    );
    assert!(
        typed
            .iter()
            .any(|c| matches!(c, Capability::Volume(v) if v.size == "20g"))
    );

    // A value the pattern admits but the type does not: judged strictly after expansion.
    let args: BTreeMap<String, String> = [("buildkitPort".to_owned(), "99999".to_owned())].into();
    let e = capgate_spec::args::effective(&loaded, &args, &BTreeMap::new(), false).unwrap();
    assert!(!e.is_valid());
    assert!(
        e.diagnostics
            .contains("capabilities[3].config.container", "out of range"),
        "{:?}",
        e.diagnostics
    );

    // A value the arg's own pattern refuses never reaches expansion.
    let args: BTreeMap<String, String> = [("buildkitPort".to_owned(), "http".to_owned())].into();
    let errs = capgate_spec::args::effective(&loaded, &args, &BTreeMap::new(), false).unwrap_err();
    assert!(
        errs.iter().any(|e| e.to_string().contains("pattern")),
        "{errs:?}"
    );
}

#[test]
fn effective_form_refuses_leftover_references() {
    let loaded = load_text(
        "schemaVersion: \"3\"\nkind: mixin\ncapabilities:\n  - type: com.docker.sandbox/port@1\n    config: {container: \"${{ kit.args.p }}\"}\nargs:\n  p: {default: \"8080\"}\n",
    );
    assert!(loaded.is_valid());
    let strict = load(
        &serde_json::to_vec(loaded.descriptor.as_ref().unwrap()).unwrap(),
        &Options {
            profile: Profile::Effective,
            ..Options::default()
        },
    );
    assert!(
        strict.diagnostics.contains(
            "capabilities[0].config.container",
            "still references kit args"
        ),
        "{:?}",
        strict.diagnostics
    );
}

#[test]
fn errors_carry_paths_and_source_lines() {
    // The spec's positions case: the port error on line 5, the pattern error on line 8.
    let text = "schemaVersion: \"3\"\nkind: mixin\ncapabilities:\n  - type: com.docker.sandbox/port@1\n    config: {container: 99999}\nargs:\n  version:\n    pattern: \"[\"\n";
    let loaded = load_text(text);
    let errors: Vec<_> = loaded.diagnostics.errors().collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(errors[0].path.as_str(), "capabilities[0].config.container");
    assert_eq!(errors[0].pos.line, 5);
    assert_eq!(errors[1].path.as_str(), "args.version.pattern");
    assert_eq!(errors[1].pos.line, 8);
}

#[test]
fn every_problem_in_a_file_is_reported() {
    let text = "schemaVersion: \"3\"\nkind: mixin\nname: nope\niconUrl: http://x.example/i.svg\ncapabilities:\n  - type: com.docker.sandbox/volume@1\n    config: {path: /a, sizee: 1g}\n  - type: com.docker.sandbox/port@1\n    optionl: true\n    config: {container: 0}\n  - type: com.docker.sandbox/sbx@1\n";
    let loaded = load_text(text);
    for (path, fragment) in [
        ("name", "unknown field `name`"),
        ("iconUrl", "absolute https URL"),
        ("capabilities[0].config.sizee", "unknown field `sizee`"),
        ("capabilities[1].optionl", "unknown field `optionl`"),
        ("capabilities[1].config.container", "out of range"),
        ("capabilities[2].type", "workload-only"),
    ] {
        assert!(
            loaded.diagnostics.contains(path, fragment),
            "{path}: {fragment} in {:?}",
            loaded.diagnostics
        );
    }
    assert_eq!(loaded.diagnostics.errors().count(), 6);
}
