//! The permission surface (spec §5.2) and the widening gate (spec §5.3), driven by golden
//! fixtures and checked by properties.
//!
//! - `fixtures/surface/<NN-slug>/`: `kit.yaml` and `expected.json`, the exact
//!   `serde_json::to_string` of its surface.
//! - `fixtures/widen/<NN-slug>/`: `granted.yaml`, `candidate.yaml` and `expected.json`, the
//!   widenings of the candidate's surface over the granted one, in order.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use capgate_resolve::widen::{Category, Widening, diff_widenings};
use capgate_resolve::{Surface, surface_of};
use capgate_spec::Descriptor;
use capgate_spec::caps::pack::Tier;
use proptest::prelude::*;

/// Deleting case folders must fail the suite.
const MIN_SURFACE_CASES: usize = 22;
const MIN_WIDEN_CASES: usize = 28;

fn fixture_root(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(kind)
}

fn case_dirs(kind: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(fixture_root(kind))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn case_name(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

/// Reads and validates a kit; `Err` carries every diagnostic.
fn load_kit(path: &Path) -> Result<Descriptor, String> {
    let bytes = fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let loaded = capgate_spec::load(&bytes, &capgate_spec::Options::default());
    match loaded.valid() {
        Some(d) => Ok(d.clone()),
        None => Err(format!(
            "{} is not a valid kit: {:?}",
            path.display(),
            loaded.diagnostics
        )),
    }
}

fn read_text(path: &Path) -> Result<String, String> {
    fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn surface_case(dir: &Path) -> Result<(), String> {
    let kit = load_kit(&dir.join("kit.yaml"))?;
    let surface = surface_of(&kit);
    let actual = serde_json::to_string(&surface).map_err(|e| e.to_string())?;
    let expected = read_text(&dir.join("expected.json"))?;
    let expected = expected.trim_end_matches('\n');
    if actual != expected {
        return Err(format!("expected {expected}\n    actual   {actual}"));
    }
    if surface.is_empty() != (actual == "{}") {
        return Err(format!("is_empty() is {} for {actual}", surface.is_empty()));
    }
    let back: Surface = serde_json::from_str(&actual).map_err(|e| e.to_string())?;
    if back != surface {
        return Err("the surface does not read back to itself".to_owned());
    }
    Ok(())
}

fn widen_case(dir: &Path) -> Result<(), String> {
    let granted = surface_of(&load_kit(&dir.join("granted.yaml"))?);
    let candidate = surface_of(&load_kit(&dir.join("candidate.yaml"))?);
    let actual = diff_widenings(&granted, &candidate);
    let expected_text = read_text(&dir.join("expected.json"))?;
    let expected: Vec<Widening> = serde_json::from_str(&expected_text)
        .map_err(|e| format!("expected.json does not read: {e}"))?;
    if actual != expected {
        return Err(format!(
            "expected {}\n    actual   {}",
            serde_json::to_string(&expected).map_err(|e| e.to_string())?,
            serde_json::to_string(&actual).map_err(|e| e.to_string())?
        ));
    }
    Ok(())
}

fn run_cases(kind: &str, min: usize, case: fn(&Path) -> Result<(), String>) {
    let dirs = case_dirs(kind);
    let mut failures = String::new();
    for dir in &dirs {
        if let Err(e) = case(dir) {
            let _ = writeln!(failures, "  {}: {e}", case_name(dir));
        }
    }
    assert!(
        failures.is_empty(),
        "{kind} fixture mismatches:\n{failures}"
    );
    assert!(
        dirs.len() >= min,
        "only {} {kind} cases found; at least {min} expected",
        dirs.len()
    );
}

#[test]
fn surface_fixtures() {
    run_cases("surface", MIN_SURFACE_CASES, surface_case);
}

#[test]
fn widen_fixtures() {
    run_cases("widen", MIN_WIDEN_CASES, widen_case);
}

// ---------------------------------------------------------------------------------------
// Properties, over surfaces generated directly.

/// A new item, never drawn by the base strategies below (so nothing granted covers it).
const NEW: &str = "zz-new.example.net";

fn pick(options: &'static [&'static str]) -> impl Strategy<Value = Vec<String>> {
    proptest::sample::subsequence(options, 0..=options.len())
        .prop_map(|v| v.into_iter().map(str::to_owned).collect())
}

const HOSTS: &[&str] = &[
    "a.example.com",
    "b.example.com",
    "b.example.com:8443",
    "c.example.com:9000",
];
const HTTP: &[&str] = &[
    "ANY a.example.com/**",
    "GET a.example.com/x",
    "GET b.example.com/repos/**",
    "HEAD b.example.com:8443/repos/**",
    "POST c.example.com:9000/upload",
    "DELETE d.example.com/**",
    "ANY e.example.com/",
];
const SERVICES: &[&str] = &["github", "npm", "anthropic"];
const PROGRAMS: &[&str] = &["/usr/bin/python3", "/opt/pack/bin", "/bin/sh"];
const WRITE_PLACES: &[&str] = &["/home/agent/workspace/out", "/tmp", "/data/cache"];
const EGRESS: &[&str] = &[
    "api.openai.com:443/https",
    "api.openai.com:443/tcp",
    "hooks.slack.com:443/https",
    "db.example.com:5432/tcp",
    "[2001:db8::1]:80/http",
];
const SSH: &[&str] = &[
    "install",
    "runtime sign git",
    "runtime authenticate github.com",
    "runtime authenticate git@gitlab.com",
];
const PATHS: &[&str] = &["/data", "/var/lib/docker", "/home/agent/.cache"];
const PORTS: &[&str] = &["8080/tcp", "53/udp", "53/tcp"];
const USB: &[&str] = &["1d6b:0002", "class:0e"];
const TYPES: &[&str] = &[
    "com.docker.sandbox/git-identity@1",
    "com.docker.sandbox/kit-registry@1",
    "com.example/thing@1+0123456789ab",
];

fn any_surface() -> impl Strategy<Value = Surface> {
    (
        (
            pick(HOSTS),
            pick(HOSTS),
            pick(HOSTS),
            pick(HOSTS),
            pick(HTTP),
            pick(HTTP),
            pick(HTTP),
            pick(HTTP),
            pick(EGRESS),
            proptest::option::of(pick(WRITE_PLACES)),
            proptest::option::of(pick(PROGRAMS)),
            proptest::option::of(pick(WRITE_PLACES)),
        ),
        (
            pick(SERVICES),
            pick(SERVICES),
            pick(SSH),
            pick(PATHS),
            pick(PATHS),
            pick(PATHS),
            pick(PORTS),
            pick(USB),
            any::<bool>(),
            pick(TYPES),
            pick(PATHS),
            proptest::option::of(proptest::sample::select(Tier::ALL.to_vec())),
        ),
    )
        .prop_map(|(n, o)| {
            let mut s = Surface {
                network_install_allow: n.0,
                network_install_deny: n.1,
                network_runtime_allow: n.2,
                network_runtime_deny: n.3,
                network_install_http_allow: n.4,
                network_install_http_deny: n.5,
                network_runtime_http_allow: n.6,
                network_runtime_http_deny: n.7,
                egress: n.8,
                filesystem_write: n.9,
                exec_allow: n.10,
                filesystem_read: n.11,
                credentials_install: o.0,
                credentials_runtime: o.1,
                ssh_agent: o.2,
                storage_paths: o.3,
                skills_paths: o.4,
                skills_write_paths: o.5,
                ports: o.6,
                usb: o.7,
                privileged: o.8,
                services: o.9,
                host_mount_paths: o.10,
                determinism: o.11,
            };
            s.normalize();
            s
        })
}

/// Every string list of a surface, by the category that reports growth in it (or, for
/// deny lists, shrinkage), mutable.
fn allow_lists(s: &mut Surface) -> Vec<(Category, &mut Vec<String>)> {
    vec![
        (Category::NetworkInstallAllow, &mut s.network_install_allow),
        (Category::NetworkRuntimeAllow, &mut s.network_runtime_allow),
        (
            Category::NetworkInstallHttpAllow,
            &mut s.network_install_http_allow,
        ),
        (
            Category::NetworkRuntimeHttpAllow,
            &mut s.network_runtime_http_allow,
        ),
        (Category::CredentialsInstall, &mut s.credentials_install),
        (Category::CredentialsRuntime, &mut s.credentials_runtime),
        (Category::SshAgent, &mut s.ssh_agent),
        (Category::Storage, &mut s.storage_paths),
        (Category::HostMount, &mut s.host_mount_paths),
        (Category::Skills, &mut s.skills_paths),
        (Category::SkillsWrite, &mut s.skills_write_paths),
        (Category::Ports, &mut s.ports),
        (Category::Usb, &mut s.usb),
        (Category::Services, &mut s.services),
        (Category::Egress, &mut s.egress),
    ]
}

fn deny_lists(s: &mut Surface) -> Vec<(Category, &mut Vec<String>)> {
    vec![
        (
            Category::NetworkInstallDenyRemoved,
            &mut s.network_install_deny,
        ),
        (
            Category::NetworkRuntimeDenyRemoved,
            &mut s.network_runtime_deny,
        ),
        (
            Category::NetworkInstallHttpDenyRemoved,
            &mut s.network_install_http_deny,
        ),
        (
            Category::NetworkRuntimeHttpDenyRemoved,
            &mut s.network_runtime_http_deny,
        ),
    ]
}

/// The new item a category's list would gain: shaped as that list's entries.
fn new_item(category: Category) -> String {
    match category {
        Category::NetworkInstallHttpAllow
        | Category::NetworkRuntimeHttpAllow
        | Category::NetworkInstallHttpDenyRemoved
        | Category::NetworkRuntimeHttpDenyRemoved => format!("PATCH {NEW}/only"),
        Category::SshAgent => format!("runtime authenticate {NEW}"),
        Category::Egress => format!("{NEW}:443/https"),
        _ => NEW.to_owned(),
    }
}

fn names(widenings: &[Widening], category: Category, detail: &str) -> bool {
    widenings
        .iter()
        .any(|w| w.category == category && w.detail == detail)
}

/// Keeps the elements of `list` whose bit in `mask` is set (cycling the mask).
fn keep(list: &mut Vec<String>, mask: &[bool]) {
    let mut i = 0;
    list.retain(|_| {
        let k = mask.get(i % mask.len().max(1)).copied().unwrap_or(true);
        i += 1;
        k
    });
}

/// Adds the elements of `extra` to `list` whose bit in `mask` is set.
fn add_some(list: &mut Vec<String>, extra: &[&str], mask: &[bool]) {
    for (i, e) in extra.iter().enumerate() {
        if mask.get(i % mask.len().max(1)).copied().unwrap_or(false) {
            list.push((*e).to_owned());
        }
    }
    list.sort();
    list.dedup();
}

proptest! {
    #[test]
    fn a_surface_never_widens_itself(s in any_surface()) {
        prop_assert_eq!(diff_widenings(&s, &s), Vec::<Widening>::new());
    }

    #[test]
    fn adding_a_grant_is_reported(s in any_surface(), which in 0usize..15) {
        let mut candidate = s.clone();
        let (category, item) = {
            let mut lists = allow_lists(&mut candidate);
            let (category, list) = &mut lists[which];
            let item = new_item(*category);
            list.push(item.clone());
            list.sort();
            (*category, item)
        };
        let w = diff_widenings(&s, &candidate);
        prop_assert!(names(&w, category, &item), "{category} {item} not in {w:?}");
    }

    #[test]
    fn privileged_is_reported(mut s in any_surface()) {
        s.privileged = false;
        let mut candidate = s.clone();
        candidate.privileged = true;
        let w = diff_widenings(&s, &candidate);
        prop_assert!(names(&w, Category::Privileged, "requests privileged execution"));
    }

    #[test]
    fn removing_a_deny_is_reported(s in any_surface(), which in 0usize..4) {
        // The granted surface states one refusal more than the candidate, on a host no
        // other entry names, so nothing the candidate keeps covers it.
        let mut granted = s.clone();
        let (category, item) = {
            let mut lists = deny_lists(&mut granted);
            let (category, list) = &mut lists[which];
            let item = new_item(*category);
            list.push(item.clone());
            list.sort();
            (*category, item)
        };
        let w = diff_widenings(&granted, &s);
        prop_assert!(names(&w, category, &item), "{category} {item} not in {w:?}");
    }

    #[test]
    fn removing_an_existing_deny_host_is_reported(s in any_surface(), runtime in any::<bool>()) {
        let mut candidate = s.clone();
        let (category, list) = if runtime {
            (Category::NetworkRuntimeDenyRemoved, &mut candidate.network_runtime_deny)
        } else {
            (Category::NetworkInstallDenyRemoved, &mut candidate.network_install_deny)
        };
        if let Some(removed) = list.pop() {
            let w = diff_widenings(&s, &candidate);
            prop_assert!(names(&w, category, &removed), "{category} {removed} not in {w:?}");
        }
    }

    #[test]
    fn narrowing_is_never_reported(
        s in any_surface(),
        mask in proptest::collection::vec(any::<bool>(), 1..8),
        drop_privileged in any::<bool>(),
    ) {
        let mut candidate = s.clone();
        for (_, list) in allow_lists(&mut candidate) {
            keep(list, &mask);
        }
        // More refusals narrow too.
        add_some(&mut candidate.network_install_deny, HOSTS, &mask);
        add_some(&mut candidate.network_runtime_deny, HOSTS, &mask);
        add_some(&mut candidate.network_install_http_deny, HTTP, &mask);
        add_some(&mut candidate.network_runtime_http_deny, HTTP, &mask);
        if drop_privileged {
            candidate.privileged = false;
        }
        prop_assert_eq!(diff_widenings(&s, &candidate), Vec::<Widening>::new());
    }

    #[test]
    fn widenings_come_in_category_order(a in any_surface(), b in any_surface()) {
        let w = diff_widenings(&a, &b);
        let order: Vec<Category> = w.iter().map(|w| w.category).collect();
        let mut sorted = order.clone();
        sorted.sort();
        prop_assert_eq!(order, sorted);
        // Every detail names something the candidate states, or a refusal it dropped.
        let stated: BTreeSet<String> = serde_json::to_value(&b)
            .unwrap()
            .as_object()
            .unwrap()
            .values()
            .filter_map(|v| v.as_array())
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        for x in &w {
            let removed = matches!(
                x.category,
                Category::NetworkInstallDenyRemoved
                    | Category::NetworkRuntimeDenyRemoved
                    | Category::NetworkInstallHttpDenyRemoved
                    | Category::NetworkRuntimeHttpDenyRemoved
                    | Category::Privileged
            );
            if x.category == Category::FilesystemRead && b.filesystem_read.is_none() {
                prop_assert!(x.detail.starts_with("the whole workspace"), "{x}");
                continue;
            }
            if x.category == Category::ExecAllow && b.exec_allow.is_none() {
                prop_assert!(x.detail.starts_with("any program"), "{x}");
                continue;
            }
            if x.category == Category::FilesystemWrite && b.filesystem_write.is_none() {
                prop_assert!(x.detail.starts_with("anywhere"), "{x}");
                continue;
            }
            if x.category == Category::Determinism {
                let tier = b.determinism.unwrap_or(Tier::Unrestricted);
                prop_assert!(x.detail.starts_with(&format!("tier `{tier}`")), "{x}");
                continue;
            }
            prop_assert!(removed || stated.contains(&x.detail), "{x}");
        }
    }

    /// A `tcp` triple covers `https` and `http` on its host and port; nothing else covers.
    #[test]
    fn egress_coverage(s in any_surface()) {
        let mut granted = s.clone();
        granted.egress = vec!["a.example:443/tcp".into(), "b.example:443/https".into()];
        let mut candidate = s;
        candidate.egress = vec![
            "a.example:443/https".into(),
            "a.example:443/http".into(),
            "a.example:8443/https".into(),
            "b.example:443/tcp".into(),
            "b.example:443/http".into(),
            "b.example:443/https".into(),
        ];
        let w: Vec<String> = diff_widenings(&granted, &candidate)
            .into_iter()
            .filter(|w| w.category == Category::Egress)
            .map(|w| w.detail)
            .collect();
        prop_assert_eq!(w, ["a.example:8443/https", "b.example:443/tcp", "b.example:443/http"]);
    }

    /// A write list narrows: dropping it, or a place beneath none of the granted ones,
    /// widens; a place beneath a granted one, or a shorter list, does not.
    #[test]
    fn write_places_widen_only_beyond_the_granted_ones(s in any_surface()) {
        let with = |places: Option<&[&str]>| {
            let mut x = s.clone();
            x.filesystem_write = places.map(|p| p.iter().map(|p| (*p).to_owned()).collect());
            x
        };
        let writes = |g: Option<&[&str]>, c: Option<&[&str]>| -> Vec<String> {
            diff_widenings(&with(g), &with(c))
                .into_iter()
                .filter(|w| w.category == Category::FilesystemWrite)
                .map(|w| w.detail)
                .collect()
        };
        let granted: &[&str] = &["/home/agent/workspace/out", "/tmp"];
        prop_assert!(writes(Some(granted), Some(&["/home/agent/workspace/out/sub"])).is_empty());
        prop_assert!(writes(Some(granted), Some(&[])).is_empty());
        prop_assert!(writes(None, Some(granted)).is_empty());
        prop_assert!(writes(None, None).is_empty());
        prop_assert_eq!(
            writes(Some(granted), Some(&["/home/agent/workspace", "/tmp/x"])),
            ["/home/agent/workspace"]
        );
        prop_assert_eq!(
            writes(Some(granted), None),
            ["anywhere the sandbox lets a workload write (no list)"]
        );
    }

    /// An exec allowlist narrows by exact paths: a program not granted as such (even one
    /// beneath a granted directory, which brings its own interpreter), or dropping the
    /// list, widens.
    #[test]
    fn programs_widen_only_beyond_the_granted_ones(s in any_surface()) {
        let with = |programs: Option<&[&str]>| {
            let mut x = s.clone();
            x.exec_allow = programs.map(|p| p.iter().map(|p| (*p).to_owned()).collect());
            x
        };
        let widened = |g: Option<&[&str]>, c: Option<&[&str]>| -> Vec<String> {
            diff_widenings(&with(g), &with(c))
                .into_iter()
                .filter(|w| w.category == Category::ExecAllow)
                .map(|w| w.detail)
                .collect()
        };
        let granted: &[&str] = &["/usr/bin/python3", "/opt/pack/bin"];
        prop_assert!(widened(Some(granted), Some(&["/opt/pack/bin"])).is_empty());
        prop_assert_eq!(
            widened(Some(granted), Some(&["/opt/pack/bin/tool"])),
            ["/opt/pack/bin/tool"]
        );
        prop_assert!(widened(None, Some(granted)).is_empty());
        prop_assert_eq!(widened(Some(granted), Some(&["/bin/sh"])), ["/bin/sh"]);
        prop_assert_eq!(widened(Some(granted), None), ["any program (no list)"]);
    }

    /// Trading a tier for a less trusting one (or for none) takes a promise back and asks;
    /// trading it for a more trusting one never does.
    #[test]
    fn a_less_trusting_tier_is_a_widening(
        s in any_surface(),
        from in proptest::option::of(proptest::sample::select(Tier::ALL.to_vec())),
        to in proptest::option::of(proptest::sample::select(Tier::ALL.to_vec())),
    ) {
        let (mut granted, mut candidate) = (s.clone(), s);
        granted.determinism = from;
        candidate.determinism = to;
        let binding = |t: Option<Tier>| t.unwrap_or(Tier::Unrestricted);
        let w = diff_widenings(&granted, &candidate);
        let reported = w.iter().any(|x| x.category == Category::Determinism);
        prop_assert_eq!(reported, binding(to) > binding(from), "{:?} -> {:?}: {:?}", from, to, w);
    }
}
