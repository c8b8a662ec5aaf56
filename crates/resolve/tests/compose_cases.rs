#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]
//! Composition (spec §4.3): the Merge/Compose acceptance cases of §6.5, the volume
//! equivalence pairs of §6.4, host-mount ownership, agent-skills widest mode, and the
//! round trip of every merged descriptor through effective validation.

use capgate_resolve::Refusal;
use capgate_resolve::compose::{Composed, ContextSource, Contribution, compose};
use capgate_spec::caps::Capability;
use capgate_spec::caps::agent::AgentSessions;
use capgate_spec::node::Node;
use capgate_spec::{Descriptor, Entry, Kind, Loaded, Options, Profile, load};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------
// Building kits and running compositions.

const NS: &str = "com.docker.sandbox";

/// A capability entry as a YAML flow mapping: `{type: com.docker.sandbox/<ty>, config: …}`.
fn cap(ty: &str, config: &str) -> String {
    format!("{{type: {NS}/{ty}, config: {config}}}")
}

/// A config-less capability entry.
fn bare(ty: &str) -> String {
    format!("{{type: {NS}/{ty}}}")
}

fn load_valid(text: &str, opts: &Options) -> Descriptor {
    let loaded = load(text.as_bytes(), opts);
    let errors: Vec<String> = loaded
        .diagnostics
        .errors()
        .map(ToString::to_string)
        .collect();
    assert!(loaded.is_valid(), "fixture is invalid: {errors:#?}\n{text}");
    loaded.descriptor.unwrap()
}

fn text_of(kind: &str, head: &str, entries: &[String]) -> String {
    let mut text = format!("schemaVersion: \"3\"\nkind: {kind}\n{head}");
    if !entries.is_empty() {
        text.push_str("capabilities:\n");
        for e in entries {
            text.push_str("  - ");
            text.push_str(e);
            text.push('\n');
        }
    }
    text
}

/// A kit read with the default (authored) options; it must be valid.
fn kit(kind: &str, head: &str, entries: &[String]) -> Descriptor {
    load_valid(&text_of(kind, head, entries), &Options::default())
}

fn workload(entries: &[String]) -> Descriptor {
    kit("workload", "", entries)
}

fn mixin(entries: &[String]) -> Descriptor {
    kit("mixin", "", entries)
}

/// Every declared entry (group members included) is the selection.
fn contributions<'a>(kits: &'a [(&'static str, Descriptor)]) -> Vec<Contribution<'a>> {
    kits.iter()
        .map(|(reference, d)| Contribution {
            reference,
            descriptor: d,
            entries: d.declared_entries(),
        })
        .collect()
}

fn render(problems: &[Refusal]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Composes and checks that the merged descriptor is a valid effective descriptor.
fn composed(kits: &[(&'static str, Descriptor)]) -> Composed {
    let c = compose(&contributions(kits))
        .unwrap_or_else(|p| panic!("composition refused:\n{}", render(&p)));
    let loaded = effective(&c);
    let errors: Vec<String> = loaded
        .diagnostics
        .errors()
        .map(ToString::to_string)
        .collect();
    assert!(
        loaded.is_valid(),
        "merged descriptor is not a valid effective descriptor: {errors:#?}\n{}",
        serde_json::to_string_pretty(&c.descriptor()).unwrap()
    );
    c
}

/// Composes expecting a refusal; the refusals rendered one a line.
fn refused(kits: &[(&'static str, Descriptor)]) -> String {
    match compose(&contributions(kits)) {
        Ok(c) => panic!("composition was not refused: {:#?}", c.entries),
        Err(problems) => {
            assert!(!problems.is_empty());
            render(&problems)
        }
    }
}

/// The merged descriptor's JSON read back as an effective descriptor.
fn effective(c: &Composed) -> Loaded {
    let bytes = serde_json::to_vec(&c.descriptor()).unwrap();
    load(
        &bytes,
        &Options {
            profile: Profile::Effective,
            ..Default::default()
        },
    )
}

fn short_types(c: &Composed) -> Vec<&str> {
    c.entries
        .iter()
        .map(|e| {
            e.type_name
                .strip_prefix("com.docker.sandbox/")
                .unwrap_or(&e.type_name)
        })
        .collect()
}

fn of_type<'c>(c: &'c Composed, ty: &str) -> Vec<&'c Entry> {
    let full = format!("{NS}/{ty}");
    c.entries.iter().filter(|e| e.type_name == full).collect()
}

fn one<'c>(c: &'c Composed, ty: &str) -> &'c Entry {
    let found = of_type(c, ty);
    assert_eq!(found.len(), 1, "expected one {ty}: {:#?}", c.entries);
    found[0]
}

fn config(e: &Entry) -> Value {
    e.config.as_ref().map_or(Value::Null, Node::to_json)
}

fn assert_has(haystack: &str, needles: &[&str]) {
    for n in needles {
        assert!(haystack.contains(n), "`{n}` missing from:\n{haystack}");
    }
}

// ---------------------------------------------------------------------------------------
// Kind.

#[test]
fn kind_is_derived_from_the_contributions() {
    let c = composed(&[("shell", workload(&[])), ("gh", mixin(&[]))]);
    assert_eq!(c.kind, Kind::Workload);
    let c = composed(&[("a", mixin(&[])), ("b", mixin(&[]))]);
    assert_eq!(c.kind, Kind::Mixin);
}

#[test]
fn two_workloads_are_refused() {
    let msg = refused(&[("first", workload(&[])), ("second", workload(&[]))]);
    assert_has(&msg, &["both workload kits", "first", "second"]);
}

#[test]
fn a_set_contribution_is_refused() {
    let set = kit(
        "set",
        "kits:\n  - ref: docker.io/example/shell:1.0.0\n",
        &[],
    );
    let msg = refused(&[("shell", workload(&[])), ("bundle", set)]);
    assert_has(
        &msg,
        &["bundle", "has to be merged before it can contribute"],
    );
}

#[test]
fn no_contribution_is_refused() {
    assert!(compose(&[]).is_err());
}

// ---------------------------------------------------------------------------------------
// Relations.

#[test]
fn relations_union_and_drop_what_the_composition_answers() {
    let shell = kit(
        "workload",
        "version: \"1.0.0\"\nprovides: [shell]\nconflicts: [podman]\n",
        &[],
    );
    let claude = kit(
        "mixin",
        "version: \"2.1.6\"\nprovides: [claude@2.1.6]\nrequires: [shell]\nintegrates: [\"docker-engine >= 25.0.0\"]\n",
        &[],
    );
    let acp = kit(
        "mixin",
        "version: \"0.5.0\"\nprovides: [claude-acp]\nrequires: [\"claude >= 2.0.0\"]\n",
        &[],
    );
    let c = composed(&[
        ("shell", shell.clone()),
        ("claude-mixin", claude.clone()),
        ("claude-acp", acp),
    ]);
    assert_eq!(
        c.provides,
        ["shell@1.0.0", "claude@2.1.6", "claude-acp@0.5.0"]
    );
    assert!(c.requires.is_empty(), "{:?}", c.requires);
    assert_eq!(c.integrates, ["docker-engine >= 25.0.0"]);
    assert_eq!(c.conflicts, ["podman"]);

    let greedy = kit(
        "mixin",
        "version: \"0.5.0\"\nprovides: [claude-acp]\nrequires: [\"claude >= 99.0.0\"]\n",
        &[],
    );
    let c = composed(&[
        ("shell", shell),
        ("claude-mixin", claude),
        ("claude-acp", greedy),
    ]);
    assert_eq!(c.requires, ["claude >= 99.0.0"]);
}

#[test]
fn bare_provides_take_their_contributors_version() {
    let base = kit("workload", "version: \"1.4.2\"\nprovides: [base]\n", &[]);
    let tool = kit(
        "mixin",
        "version: \"2.0.0\"\nprovides: [tool]\nrequires: [\"base >= 1.0.0\"]\n",
        &[],
    );
    let c = composed(&[("base", base.clone()), ("tool", tool)]);
    assert_eq!(c.provides, ["base@1.4.2", "tool@2.0.0"]);
    assert!(c.requires.is_empty());

    let too_new = kit(
        "mixin",
        "version: \"2.0.0\"\nprovides: [tool]\nrequires: [\"base >= 9.0.0\"]\n",
        &[],
    );
    let c = composed(&[("base", base), ("tool", too_new)]);
    assert_eq!(c.requires, ["base >= 9.0.0"]);
}

#[test]
fn a_padded_bare_provide_is_trimmed_before_its_version() {
    let shell = kit(
        "workload",
        "version: \"1.0.0\"\nprovides: [\"shell \"]\n",
        &[],
    );
    let c = composed(&[("shell", shell)]);
    assert_eq!(c.provides, ["shell@1.0.0"]);
}

#[test]
fn every_version_one_owner_offers_is_kept() {
    let foo = kit(
        "workload",
        "provides: [foo@1.0.0, foo@2.0.0, com.docker.kit/foo@2.0.0]\n",
        &[],
    );
    let user = kit(
        "mixin",
        "version: \"1.0.0\"\nprovides: [user]\nrequires: [\"foo >= 2.0.0\"]\n",
        &[],
    );
    let c = composed(&[("foo", foo), ("user", user)]);
    assert_eq!(c.provides, ["foo@1.0.0", "foo@2.0.0", "user@1.0.0"]);
    assert!(c.requires.is_empty());
}

#[test]
fn a_contributions_own_provide_never_satisfies_its_own_require() {
    let selfish = kit(
        "workload",
        "version: \"1.0.0\"\nprovides: [shell]\nrequires: [shell]\nintegrates: [shell]\n",
        &[],
    );
    let c = compose(&contributions(&[("selfish", selfish)])).unwrap();
    assert_eq!(c.requires, ["shell"]);
    assert_eq!(c.integrates, ["shell"]);
}

#[test]
fn licenses_union_sorted() {
    let a = kit("workload", "licenses: [Apache-2.0]\n", &[]);
    let b = kit("mixin", "licenses: [MIT, Apache-2.0]\n", &[]);
    let c = composed(&[("a", a), ("b", b)]);
    assert_eq!(c.licenses, ["Apache-2.0", "MIT"]);
}

// ---------------------------------------------------------------------------------------
// Network policy.

#[test]
fn network_union_per_phase_stays_at_v1() {
    let a = workload(&[cap(
        "network-policy@1",
        "{install: {allow: [deb.debian.org]}, runtime: {allow: [github.com], deny: [evil.example.com]}}",
    )]);
    let b = mixin(&[cap(
        "network-policy@1",
        "{runtime: {allow: [api.anthropic.com, github.com]}}",
    )]);
    let c = composed(&[("a", a), ("b", b)]);
    let np = one(&c, "network-policy@1");
    assert_eq!(
        config(np),
        json!({
            "install": {"allow": ["deb.debian.org"]},
            "runtime": {"allow": ["github.com", "api.anthropic.com"], "deny": ["evil.example.com"]}
        })
    );
}

#[test]
fn one_v2_contributor_lifts_the_union_to_v2() {
    let a = workload(&[cap("network-policy@1", "{runtime: {allow: [github.com]}}")]);
    let b = mixin(&[cap(
        "network-policy@2",
        "{runtime: {allow: [{hosts: [api.example.com], methods: [GET]}]}}",
    )]);
    let c = composed(&[("a", a), ("b", b)]);
    assert!(of_type(&c, "network-policy@1").is_empty());
    let np = one(&c, "network-policy@2");
    assert_eq!(
        config(np),
        json!({"runtime": {"allow": ["github.com", {"hosts": ["api.example.com"], "methods": ["GET"]}]}})
    );
}

#[test]
fn a_bounded_allow_granted_unbounded_elsewhere_is_dropped() {
    let a = workload(&[cap(
        "network-policy@2",
        "{runtime: {allow: [{hosts: [api.github.com], methods: [GET]}, {hosts: [api.other.com], methods: [POST]}]}}",
    )]);
    let b = mixin(&[cap(
        "network-policy@1",
        "{runtime: {allow: [api.github.com]}}",
    )]);
    let c = composed(&[("a", a), ("b", b)]);
    assert_eq!(
        config(one(&c, "network-policy@2")),
        json!({"runtime": {"allow": [{"hosts": ["api.other.com"], "methods": ["POST"]}, "api.github.com"]}})
    );
}

#[test]
fn a_bounded_allow_keeps_the_hosts_nobody_grants_unbounded() {
    let a = workload(&[cap(
        "network-policy@2",
        "{runtime: {allow: [{hosts: [a.example.com, b.example.com], methods: [GET]}], deny: [{hosts: [a.example.com], methods: [DELETE]}]}}",
    )]);
    let b = mixin(&[cap(
        "network-policy@2",
        "{runtime: {allow: [a.example.com], deny: [{hosts: [a.example.com], methods: [DELETE]}]}}",
    )]);
    let c = composed(&[("a", a), ("b", b)]);
    assert_eq!(
        config(one(&c, "network-policy@2")),
        json!({"runtime": {
            "allow": [{"hosts": ["b.example.com"], "methods": ["GET"]}, "a.example.com"],
            "deny": [{"hosts": ["a.example.com"], "methods": ["DELETE"]}]
        }})
    );
}

#[test]
fn network_entries_dedupe_on_whole_lists() {
    let a = workload(&[cap(
        "network-policy@2",
        "{runtime: {allow: [{hosts: [api.example.com], methods: [GET], paths: [\"/a,/b\"]}]}}",
    )]);
    let b = mixin(&[cap(
        "network-policy@2",
        "{runtime: {allow: [{hosts: [api.example.com], methods: [GET], paths: [/a, /b]}, {hosts: [api.example.com], methods: [GET], paths: [\"/a,/b\"]}]}}",
    )]);
    let c = composed(&[("a", a), ("b", b)]);
    assert_eq!(
        config(one(&c, "network-policy@2")),
        json!({"runtime": {"allow": [
            {"hosts": ["api.example.com"], "methods": ["GET"], "paths": ["/a,/b"]},
            {"hosts": ["api.example.com"], "methods": ["GET"], "paths": ["/a", "/b"]}
        ]}})
    );
}

#[test]
fn the_network_entry_is_required_if_any_ask_is() {
    let a = workload(&[format!(
        "{{type: {NS}/network-policy@1, optional: true, config: {{runtime: {{allow: [a.example.com]}}}}}}"
    )]);
    let b = mixin(&[format!(
        "{{type: {NS}/network-policy@1, name: egress, config: {{runtime: {{allow: [b.example.com]}}}}}}"
    )]);
    let c = composed(&[("a", a.clone()), ("b", b)]);
    let np = one(&c, "network-policy@1");
    assert!(!np.optional);
    assert_eq!(np.name.as_deref(), Some("egress"));
    let optional = mixin(&[format!(
        "{{type: {NS}/network-policy@1, optional: true, config: {{runtime: {{allow: [b.example.com]}}}}}}"
    )]);
    let c = composed(&[("a", a), ("b", optional)]);
    assert!(one(&c, "network-policy@1").optional);
}

// ---------------------------------------------------------------------------------------
// Lifecycle.

#[test]
fn lifecycle_concatenates_in_contribution_order() {
    let a = workload(&[cap(
        "lifecycle@1",
        "{install: [{command: [a-install]}], startup: [{command: a-start}], interactive: [--tui]}",
    )]);
    let b = mixin(&[cap(
        "lifecycle@1",
        "{install: [{command: [b-install]}, {command: [a-install]}], files: [{path: /etc/b.conf, content: b}]}",
    )]);
    let c = composed(&[("a", a), ("b", b)]);
    assert_eq!(
        config(one(&c, "lifecycle@1")),
        json!({
            "install": [{"command": ["a-install"]}, {"command": ["b-install"]}, {"command": ["a-install"]}],
            "startup": [{"command": ["sh", "-c", "a-start"]}],
            "files": [{"path": "/etc/b.conf", "content": "b"}],
            "interactive": ["--tui"]
        })
    );
}

#[test]
fn two_interactive_tails_are_refused() {
    let a = workload(&[cap("lifecycle@1", "{interactive: [--tui]}")]);
    let b = mixin(&[cap(
        "lifecycle@1",
        "{startup: [{command: [x]}], interactive: []}",
    )]);
    let msg = refused(&[("a", a), ("b", b)]);
    assert_has(
        &msg,
        &[
            "interactive tail",
            "`a capabilities[0]`",
            "`b capabilities[0]`",
        ],
    );
}

#[test]
fn one_file_has_one_author() {
    let a = workload(&[cap(
        "lifecycle@1",
        "{files: [{path: /home/agent/.config, content: a}]}",
    )]);
    let b = mixin(&[cap(
        "lifecycle@1",
        "{files: [{path: /home/agent/.config, content: b}]}",
    )]);
    let msg = refused(&[("a", a), ("b", b)]);
    assert_has(
        &msg,
        &[
            "written by two contributions",
            "a capabilities[0]",
            "b capabilities[0]",
        ],
    );

    let a = workload(&[cap(
        "lifecycle@1",
        "{files: [{path: /etc/tool.conf, content: a}]}",
    )]);
    let b = mixin(&[cap(
        "lifecycle@1",
        "{files: [{path: /etc/./tool.conf, content: b}]}",
    )]);
    let msg = refused(&[("a", a), ("b", b)]);
    assert_has(&msg, &["/etc/tool.conf is written by two contributions"]);
}

#[test]
fn a_file_path_still_holding_an_arg_resolves_at_create() {
    let a = kit(
        "workload",
        "args:\n  target:\n    default: /etc/x\n",
        &[cap(
            "lifecycle@1",
            "{files: [{path: \"${{ kit.args.target }}\", content: a}]}",
        )],
    );
    let msg = refused(&[("a", a)]);
    assert_has(&msg, &["resolves at create", "a capabilities[0]"]);
}

#[test]
fn a_stated_empty_interactive_tail_survives() {
    let a = workload(&[cap(
        "lifecycle@1",
        "{startup: [{command: [\"true\"]}], interactive: []}",
    )]);
    let c = composed(&[("a", a), ("b", mixin(&[]))]);
    let lc = one(&c, "lifecycle@1");
    assert_eq!(
        serde_json::to_string(lc.config.as_ref().unwrap()).unwrap(),
        r#"{"startup":[{"command":["true"]}],"interactive":[]}"#
    );
    let Some(Capability::Lifecycle(l)) = &lc.capability else {
        panic!("untyped lifecycle");
    };
    assert_eq!(l.interactive, Some(Vec::new()));
}

// ---------------------------------------------------------------------------------------
// Keyed instances.

#[test]
fn volumes_at_different_paths_are_kept() {
    let a = workload(&[cap("volume@1", "{path: /home/agent/.cache, size: 1g}")]);
    let b = mixin(&[cap("volume@1", "{path: /home/agent/.state}")]);
    let c = composed(&[("a", a), ("b", b)]);
    assert_eq!(of_type(&c, "volume@1").len(), 2);
}

#[test]
fn ports_collapse_on_container_and_transport() {
    let port = |cfg: &str| mixin(&[cap("port@1", cfg)]);
    let c = composed(&[
        ("a", port("{container: 8080}")),
        ("b", port("{container: 8080}")),
    ]);
    assert_eq!(of_type(&c, "port@1").len(), 1);
    let c = composed(&[
        ("a", port("{container: 8080}")),
        ("b", port("{container: 8080, transport: tcp}")),
    ]);
    assert_eq!(of_type(&c, "port@1").len(), 1);
    let c = composed(&[
        ("a", port("{name: api, container: 8080}")),
        ("b", port("{name: http, container: 8080}")),
    ]);
    assert_eq!(config(one(&c, "port@1"))["name"], "api");
    let c = composed(&[
        ("a", port("{container: 8080}")),
        ("b", port("{container: 9090}")),
    ]);
    assert_eq!(of_type(&c, "port@1").len(), 2);
    let c = composed(&[
        ("a", port("{container: 8080}")),
        ("b", port("{container: 8080, transport: udp}")),
    ]);
    assert_eq!(of_type(&c, "port@1").len(), 2);
}

fn github(extra: &str) -> String {
    cap(
        "credential@1",
        &format!("{{service: github, phase: runtime, apiKey: {{name: GH_TOKEN{extra}}}}}"),
    )
}

#[test]
fn one_credential_has_one_owner() {
    let msg = refused(&[("a", workload(&[github("")])), ("b", mixin(&[github("")]))]);
    assert_has(
        &msg,
        &[
            "one credential has one owner",
            "a capabilities[0]",
            "b capabilities[0]",
            "github",
        ],
    );
    let msg = refused(&[
        ("a", workload(&[github("")])),
        ("b", mixin(&[github(", proxyManaged: true")])),
    ]);
    assert_has(&msg, &["one credential has one owner"]);
}

#[test]
fn distinct_credentials_are_kept_and_split_per_phase() {
    let gitlab = cap(
        "credential@1",
        "{service: gitlab, phase: [install, runtime], apiKey: {name: GL_TOKEN}}",
    );
    let c = composed(&[("a", workload(&[github("")])), ("b", mixin(&[gitlab]))]);
    let creds = of_type(&c, "credential@1");
    assert_eq!(creds.len(), 3);
    assert_eq!(config(creds[1])["phase"], "install");
    assert_eq!(config(creds[2])["phase"], "runtime");
    assert_eq!(config(creds[2])["service"], "gitlab");

    // A service in another phase is another credential.
    let install = cap(
        "credential@1",
        "{service: github, phase: install, apiKey: {name: GH_TOKEN}}",
    );
    let c = composed(&[("a", workload(&[github("")])), ("b", mixin(&[install]))]);
    assert_eq!(of_type(&c, "credential@1").len(), 2);
}

#[test]
fn a_kit_restating_its_credential_in_a_selected_group_is_one_owner() {
    let text = format!(
        "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - {}\n  - group:\n      optional: true\n      capabilities:\n        - {}\n",
        github(""),
        github("")
    );
    let kit = load_valid(&text, &Options::default());
    let c = composed(&[("a", kit)]);
    assert_eq!(of_type(&c, "credential@1").len(), 1);
}

#[test]
fn privileged_is_required_if_any_ask_is() {
    let optional = mixin(&[format!("{{type: {NS}/privileged@1, optional: true}}")]);
    let required = workload(&[bare("privileged@1")]);
    let c = composed(&[("a", required), ("b", optional.clone())]);
    assert!(!one(&c, "privileged@1").optional);
    let c = composed(&[("a", optional.clone()), ("b", optional)]);
    assert!(one(&c, "privileged@1").optional);
}

#[test]
fn an_empty_config_and_no_config_are_one_request() {
    let plain = workload(&[bare("privileged@1")]);
    // `config: {}` on a config-less type does not validate, so it is built by hand.
    let mut braced = mixin(&[bare("privileged@1")]);
    if let capgate_spec::Item::Entry(e) = &mut braced.capabilities[0] {
        e.config = Some(Node::from_json(&json!({})));
    }
    let c = compose(&contributions(&[("a", plain), ("b", braced)])).unwrap();
    assert_eq!(short_types(&c), ["privileged@1"]);
}

#[test]
fn config_less_types_union_by_presence() {
    let a = workload(&[
        bare("git-identity@1"),
        bare("kit-registry@1"),
        bare("long-running@1"),
    ]);
    let b = mixin(&[bare("kit-registry@1"), bare("git-identity@1")]);
    let c = composed(&[("a", a), ("b", b)]);
    assert_eq!(
        short_types(&c),
        ["git-identity@1", "kit-registry@1", "long-running@1"]
    );
}

#[test]
fn usb_devices_collapse_only_when_identical() {
    let a = workload(&[cap(
        "usb-device@1",
        "{vendorId: \"1050\", productId: \"0407\"}",
    )]);
    let b = mixin(&[
        cap("usb-device@1", "{productId: \"0407\", vendorId: \"1050\"}"),
        cap("usb-device@1", "{class: \"03\"}"),
    ]);
    let c = composed(&[("a", a), ("b", b)]);
    assert_eq!(of_type(&c, "usb-device@1").len(), 2);
}

#[test]
fn unknown_types_key_on_type_and_config() {
    let gpu = |codec: &str| {
        format!(
            "{{type: com.example.host/gpu-transcoder@2, optional: true, config: {{codec: {codec}}}}}"
        )
    };
    let c = composed(&[
        ("a", workload(&[gpu("av1")])),
        ("b", mixin(&[gpu("av1"), gpu("h264")])),
    ]);
    let found: Vec<&Entry> = c
        .entries
        .iter()
        .filter(|e| e.type_name == "com.example.host/gpu-transcoder@2")
        .collect();
    assert_eq!(found.len(), 2);
    assert!(found[0].known.is_none() && found[0].capability.is_none());
    assert_eq!(config(found[0]), json!({"codec": "av1"}));
    assert!(found.iter().all(|e| e.optional));
}

#[test]
fn ssh_agent_bounds_union_per_phase() {
    let a = workload(&[cap(
        "ssh-agent@1",
        "{phase: [install, runtime], unrestricted: false, sign: [git], authenticate: [github.com]}",
    )]);
    let b = mixin(&[cap(
        "ssh-agent@1",
        "{phase: runtime, unrestricted: false, sign: [file, git], authenticate: [git@gitlab.com]}",
    )]);
    let c = composed(&[("a", a.clone()), ("b", b)]);
    let agents = of_type(&c, "ssh-agent@1");
    assert_eq!(agents.len(), 2);
    assert_eq!(
        config(agents[0]),
        json!({"phase": "install", "unrestricted": false, "sign": ["git"], "authenticate": ["github.com"]})
    );
    assert_eq!(
        config(agents[1]),
        json!({"phase": "runtime", "unrestricted": false, "sign": ["file", "git"], "authenticate": ["git@gitlab.com", "github.com"]})
    );

    let open = mixin(&[cap("ssh-agent@1", "{phase: runtime}")]);
    let c = composed(&[("a", a), ("b", open)]);
    let agents = of_type(&c, "ssh-agent@1");
    assert_eq!(config(agents[1]), json!({"phase": "runtime"}));
}

#[test]
fn acp_collapses_on_its_identity() {
    let a = workload(&[cap(
        "acp@1",
        "{agent: claude, command: \"claude-acp --stdio\"}",
    )]);
    let b = mixin(&[cap(
        "acp@1",
        "{agent: com.docker.kit/claude, command: [sh, -c, \"claude-acp --stdio\"], protocolVersion: 1}",
    )]);
    let c = composed(&[("a", a.clone()), ("b", b)]);
    assert_eq!(of_type(&c, "acp@1").len(), 1);

    let other = mixin(&[cap("acp@1", "{agent: claude, command: [claude-acp]}")]);
    let msg = refused(&[("a", a), ("b", other)]);
    assert_has(
        &msg,
        &[
            "but ask for different things",
            "acp@1",
            "a capabilities[0]",
            "b capabilities[0]",
        ],
    );
}

#[test]
fn agent_skills_collapse_to_the_widest_mode() {
    let skills = mixin(&[format!(
        "{{type: {NS}/agent-skills@1, optional: true, config: {{path: /home/agent/.kit-tck/skills}}}}"
    )]);
    let shared = mixin(&[cap(
        "agent-skills@1",
        "{path: /home/agent/.kit-tck/skills, mode: readwrite}",
    )]);
    let c = composed(&[
        ("workload", workload(&[])),
        ("skills", skills.clone()),
        ("skills-shared", shared.clone()),
    ]);
    let merged = one(&c, "agent-skills@1");
    assert_eq!(
        config(merged),
        json!({"path": "/home/agent/.kit-tck/skills", "mode": "readwrite"})
    );
    assert!(!merged.optional, "required wins");

    // Order does not matter.
    let c = composed(&[("skills-shared", shared), ("skills", skills.clone())]);
    assert_eq!(config(one(&c, "agent-skills@1"))["mode"], "readwrite");

    // Identical asks collapse, and stay read-only.
    let c = composed(&[("skills", skills.clone()), ("again", skills)]);
    let merged = one(&c, "agent-skills@1");
    assert_eq!(
        config(merged),
        json!({"path": "/home/agent/.kit-tck/skills"})
    );
    assert!(merged.optional);
}

#[test]
fn agent_skill_names_have_one_source() {
    let a = workload(&[cap("agent-skill@1", "{path: /opt/skills/review}")]);
    let same = mixin(&[cap(
        "agent-skill@1",
        "{path: /opt/skills/review, name: review}",
    )]);
    let c = composed(&[("a", a.clone()), ("b", same)]);
    assert_eq!(of_type(&c, "agent-skill@1").len(), 1);

    let other = mixin(&[format!(
        "{{type: {NS}/agent-skill@1, optional: true, config: {{path: /usr/share/review}}}}"
    )]);
    let msg = refused(&[("a", a), ("b", other)]);
    assert_has(&msg, &["but ask for different things", "`review`"]);
}

// ---------------------------------------------------------------------------------------
// Volumes (§6.4 `matching-requests-merge` / `no-silent-merge`) and host mounts.

fn volume(cfg: &str) -> Descriptor {
    mixin(&[cap("volume@1", cfg)])
}

const STATE: &str = "{path: /data/cache, size: 1g, mode: \"0755\"}";

#[test]
fn equivalent_volume_requests_merge() {
    for (first, second) in [
        (
            STATE,
            "{path: /data/cache/, size: 1024m, mode: \"755\", tmpfs: false}",
        ),
        (
            STATE,
            "{path: /data/./cache, size: \"1073741824\", mode: \"755\"}",
        ),
        (
            STATE,
            "{path: /data/other/../cache, size: 1024mib, mode: \"0755\"}",
        ),
        (
            "{path: /data/cache}",
            "{path: /data/cache, size: \"\", mode: \"\"}",
        ),
        (
            "{path: /data/cache, size: 1536m}",
            "{path: /data/cache, size: 1.5g}",
        ),
        (
            "{path: /data/cache, size: 1k}",
            "{path: /data/cache, size: 001.0k}",
        ),
    ] {
        let c = composed(&[
            ("workload", workload(&[])),
            ("first-kit", volume(first)),
            ("second-kit", volume(second)),
        ]);
        let v = one(&c, "volume@1");
        assert_eq!(config(v), first_ask_config(first));
    }
}

/// The typed config of a `volume(..)` kit in its written form: what the merge keeps of
/// the first ask.
fn first_ask_config(cfg: &str) -> Value {
    let d = volume(cfg);
    let (_, e) = d.declared_entries()[0];
    let Some(Capability::Volume(v)) = &e.capability else {
        panic!("untyped volume")
    };
    serde_json::to_value(v).unwrap()
}

#[test]
fn equivalent_volumes_merge_labels_and_optionality() {
    let first = mixin(&[format!(
        "{{type: {NS}/volume@1, optional: true, config: {STATE}}}"
    )]);
    let second = mixin(&[format!(
        "{{type: {NS}/volume@1, name: state, optional: true, config: {{path: /data/cache/, size: 1024m, mode: \"755\"}}}}"
    )]);
    let c = composed(&[("first-kit", first.clone()), ("second-kit", second)]);
    let v = one(&c, "volume@1");
    assert!(v.optional);
    assert_eq!(v.name.as_deref(), Some("state"));
    let c = composed(&[("first-kit", first), ("second-kit", volume(STATE))]);
    assert!(!one(&c, "volume@1").optional);
}

#[test]
fn different_volume_requests_are_refused() {
    for (first, second) in [
        (STATE, "{path: /data/cache, size: 2g, mode: \"0755\"}"),
        (STATE, "{path: /data/cache, size: 1g, mode: \"0700\"}"),
        (STATE, "{path: /data/cache}"),
        (
            STATE,
            "{path: /data/cache, size: 1g, mode: \"0755\", tmpfs: true}",
        ),
        (STATE, "{path: /data/cache, mode: \"0755\"}"),
        (STATE, "{path: /data/cache, size: 1g}"),
        (
            STATE,
            "{path: /data/cache/, size: \"1073741825\", mode: \"0755\"}",
        ),
        ("{path: /data/cache}", "{path: /data/cache, size: \"0\"}"),
        ("{path: /data/cache}", "{path: /data/cache, mode: \"0000\"}"),
    ] {
        let msg = refused(&[
            ("workload", workload(&[])),
            ("first-kit", volume(first)),
            ("second-kit", volume(second)),
        ]);
        assert_has(
            &msg,
            &[
                "first-kit capabilities[0]",
                "second-kit capabilities[0]",
                "com.docker.sandbox/volume@1",
                "/data/cache",
                "but ask for different things",
            ],
        );
    }
}

#[test]
fn a_host_mount_has_one_owner() {
    let mount = |cfg: &str| mixin(&[cap("host-mount@1", cfg)]);
    let msg = refused(&[
        ("host-mount", mount("{path: /home/agent/shared}")),
        ("host-mount-other", mount("{path: /home/agent/shared}")),
    ]);
    assert_has(
        &msg,
        &[
            "a host mount has one owner",
            "host-mount capabilities[0]",
            "host-mount-other capabilities[0]",
            "/home/agent/shared",
        ],
    );
    let msg = refused(&[
        (
            "host-mount",
            mount("{path: /home/agent/shared, mode: \"0700\"}"),
        ),
        ("volume", volume("{path: /home/agent/shared/}")),
    ]);
    assert_has(
        &msg,
        &["a host mount has one owner", "host-mount@1", "volume@1"],
    );
    let msg = refused(&[
        ("volume", volume("{path: /home/agent/./shared}")),
        ("host-mount", mount("{path: /home/agent/shared}")),
    ]);
    assert_has(&msg, &["a host mount has one owner"]);

    let c = composed(&[
        ("a", mount("{path: /home/agent/a}")),
        ("b", mount("{path: /home/agent/b}")),
    ]);
    assert_eq!(of_type(&c, "host-mount@1").len(), 2);
}

// ---------------------------------------------------------------------------------------
// Sole authors.

#[test]
fn resources_have_one_author() {
    let r = |cpu: &str| mixin(&[cap("resources@1", &format!("{{cpu: {cpu}}}"))]);
    let msg = refused(&[("a", r("2")), ("b", r("4"))]);
    assert_has(
        &msg,
        &["one author", "a capabilities[0]", "b capabilities[0]"],
    );
    let c = composed(&[("a", r("2")), ("b", r("2.0"))]);
    assert_eq!(of_type(&c, "resources@1").len(), 1);
}

#[test]
fn interactive_sessions_have_one_author_and_keep_empty_verbs() {
    let tui = cap(
        "agent-interactive-sessions@1",
        "{newSession: [], continue: [--continue]}",
    );
    let c = composed(&[
        ("agent", workload(std::slice::from_ref(&tui))),
        ("limits", mixin(&[cap("resources@1", "{memory: 2g}")])),
    ]);
    let s = one(&c, "agent-interactive-sessions@1");
    assert_eq!(
        config(s),
        json!({"continue": ["--continue"], "newSession": []})
    );

    let c = composed(&[
        ("agent", workload(std::slice::from_ref(&tui))),
        ("again", mixin(std::slice::from_ref(&tui))),
    ]);
    assert_eq!(of_type(&c, "agent-interactive-sessions@1").len(), 1);

    let other = cap("agent-interactive-sessions@1", "{newSession: [--new]}");
    let msg = refused(&[("agent", workload(&[tui])), ("other", mixin(&[other]))]);
    assert_has(
        &msg,
        &[
            "one author",
            "agent capabilities[0]",
            "other capabilities[0]",
        ],
    );
}

#[test]
fn agent_sessions_have_one_author() {
    let s = |flag: &str| {
        mixin(&[cap(
            "agent-sessions@1",
            &format!("{{prompt: [{flag}, \"{{{{.Prompt}}}}\"]}}"),
        )])
    };
    let c = composed(&[("a", s("-p")), ("b", s("-p"))]);
    assert_eq!(of_type(&c, "agent-sessions@1").len(), 1);
    let msg = refused(&[("a", s("-p")), ("b", s("--print"))]);
    assert_has(&msg, &["one author"]);
}

// ---------------------------------------------------------------------------------------
// Cross-kit agreement.

fn new_session(tail: &str) -> Descriptor {
    workload(&[cap(
        "agent-interactive-sessions@1",
        &format!("{{newSession: {tail}}}"),
    )])
}

fn interactive_tail(tail: &str) -> Descriptor {
    mixin(&[cap(
        "lifecycle@1",
        &format!("{{startup: [{{command: [\"true\"]}}], interactive: {tail}}}"),
    )])
}

#[test]
fn new_session_agrees_with_the_lifecycle_interactive_tail() {
    for (ns, tail) in [("[--tui]", "[--tui]"), ("[]", "[]")] {
        let c = composed(&[("agent", new_session(ns)), ("tui", interactive_tail(tail))]);
        assert_eq!(of_type(&c, "lifecycle@1").len(), 1);
    }
    for (ns, tail) in [
        ("[--tui]", "[--other]"),
        ("[]", "[--tui]"),
        ("[--tui]", "[]"),
    ] {
        let msg = refused(&[("agent", new_session(ns)), ("tui", interactive_tail(tail))]);
        assert_has(
            &msg,
            &[
                "disagrees with lifecycle interactive",
                "agent capabilities[0]",
                "tui capabilities[0]",
            ],
        );
    }
    let no_tail = mixin(&[cap("lifecycle@1", "{startup: [{command: [\"true\"]}]}")]);
    composed(&[("agent", new_session("[--tui]")), ("tui", no_tail)]);
}

#[test]
fn a_selected_group_lifecycle_tail_is_checked_too() {
    let grouped = |tail: &str| {
        let text = format!(
            "schemaVersion: \"3\"\nkind: mixin\ncapabilities:\n  - group:\n      name: tui\n      capabilities:\n        - {}\n",
            cap("lifecycle@1", &format!("{{interactive: {tail}}}"))
        );
        load_valid(&text, &Options::default())
    };
    composed(&[
        ("agent", new_session("[--tui]")),
        ("tui", grouped("[--tui]")),
    ]);
    let msg = refused(&[
        ("agent", new_session("[--tui]")),
        ("tui", grouped("[--other]")),
    ]);
    assert_has(
        &msg,
        &[
            "disagrees with lifecycle interactive",
            "tui capabilities[0].group.capabilities[0]",
        ],
    );
}

fn headless(list: &str) -> Descriptor {
    mixin(&[cap(
        "agent-sessions@1",
        &format!("{{prompt: [-p, \"{{{{.Prompt}}}}\"], list: {list}}}"),
    )])
}

fn tui_list(list: &str) -> Descriptor {
    workload(&[cap(
        "agent-interactive-sessions@1",
        &format!("{{continue: [], list: {list}}}"),
    )])
}

#[test]
fn session_lists_agree_across_kits() {
    composed(&[
        ("tui", tui_list("[ls, ids]")),
        ("headless", headless("[ls, ids]")),
    ]);
    composed(&[
        ("tui", tui_list("\"a b\"")),
        ("headless", headless("[sh, -c, \"a b\"]")),
    ]);
    let msg = refused(&[
        ("tui", tui_list("[ls, ids]")),
        ("headless", headless("[ls, all]")),
    ]);
    assert_has(
        &msg,
        &[
            "differs from agent-interactive-sessions list",
            "headless capabilities[0]",
            "tui capabilities[0]",
        ],
    );
    // One side only.
    let only_prompt = mixin(&[cap("agent-sessions@1", "{prompt: [-p, \"{{.Prompt}}\"]}")]);
    composed(&[("tui", tui_list("[ls, ids]")), ("headless", only_prompt)]);
}

#[test]
fn lists_differing_only_in_unresolved_references_are_not_judged() {
    // References never reach a composition through `load` (such entries are parameterized
    // and refused); a typed entry carrying one is built by hand to exercise the rule.
    let mut sessions = headless("[ls, ids]");
    if let capgate_spec::Item::Entry(e) = &mut sessions.capabilities[0] {
        e.capability = Some(Capability::AgentSessions(AgentSessions {
            prompt: Some(vec!["-p".to_owned(), "{{.Prompt}}".to_owned()]),
            list: Some(vec!["ls".to_owned(), "${{ kit.args.flag }}".to_owned()]),
            ..AgentSessions::default()
        }));
    }
    let c = compose(&contributions(&[
        ("tui", tui_list("[ls, ids]")),
        ("headless", sessions),
    ]));
    assert!(c.is_ok(), "{:?}", c.err());
}

// ---------------------------------------------------------------------------------------
// Agent context.

#[test]
fn agent_context_keeps_the_legacy_filename_and_collects_every_body() {
    let shell = workload(&[cap(
        "agent-context@1",
        "{filename: AGENTS.md, contentFile: /usr/share/sandbox/kit/shell/context.md}",
    )]);
    let gh = mixin(&[cap("agent-context@1", "{content: \"gh is available\"}")]);
    let c = composed(&[("shell", shell.clone()), ("gh", gh)]);
    let ctx = one(&c, "agent-context@1");
    assert_eq!(config(ctx)["filename"], "AGENTS.md");
    assert_eq!(
        c.context_sources,
        [
            ContextSource {
                reference: "shell".to_owned(),
                path: Some("/usr/share/sandbox/kit/shell/context.md".to_owned()),
                content: None,
            },
            ContextSource {
                reference: "gh".to_owned(),
                path: None,
                content: Some("gh is available".to_owned()),
            },
        ]
    );

    // Only a workload states a legacy filename, so a second one comes with a second
    // workload; both problems are reported.
    let claude = workload(&[cap("agent-context@1", "{filename: CLAUDE.md}")]);
    let msg = refused(&[("shell", shell), ("claude", claude)]);
    assert_has(
        &msg,
        &[
            "both workload kits",
            "agent-context filename",
            "shell capabilities[0]",
            "claude capabilities[0]",
        ],
    );
}

#[test]
fn every_distinct_explicit_profile_is_kept_before_the_legacy_one() {
    let shell = workload(&[cap(
        "agent-context@1",
        "{filename: AGENTS.md, content: shell}",
    )]);
    let claude = mixin(&[cap(
        "agent-context@1",
        "{directory: /home/agent/.claude, filename: CLAUDE.md, content: claude}",
    )]);
    let gemini = mixin(&[
        cap(
            "agent-context@1",
            "{directory: /home/agent/.gemini, filename: GEMINI.md}",
        ),
        cap(
            "agent-context@1",
            "{directory: /home/agent/.claude, filename: CLAUDE.md}",
        ),
    ]);
    let c = composed(&[("shell", shell), ("claude", claude), ("gemini", gemini)]);
    let profiles = of_type(&c, "agent-context@1");
    assert_eq!(profiles.len(), 2);
    assert_eq!(
        config(profiles[0]),
        json!({"filename": "CLAUDE.md", "directory": "/home/agent/.claude", "content": "shell"})
    );
    assert_eq!(
        config(profiles[1]),
        json!({"filename": "GEMINI.md", "directory": "/home/agent/.gemini"})
    );
    assert_eq!(c.context_sources.len(), 2);
}

#[test]
fn bodies_without_a_profile_still_make_an_entry() {
    let a = mixin(&[cap("agent-context@1", "{content: a}")]);
    let b = mixin(&[cap("agent-context@1", "{content: b}")]);
    let c = composed(&[("a", a), ("b", b)]);
    assert_eq!(config(one(&c, "agent-context@1")), json!({"content": "a"}));
    assert_eq!(c.context_sources.len(), 2);
}

// ---------------------------------------------------------------------------------------
// Finish order, provenance, optionality, attribution.

#[test]
fn entries_come_out_in_finish_order() {
    let a = workload(&[
        cap("agent-context@1", "{filename: AGENTS.md}"),
        cap("lifecycle@1", "{install: [{command: [a]}]}"),
        cap("agent-interactive-sessions@1", "{continue: []}"),
        cap("agent-sessions@1", "{continue: [--continue]}"),
        cap("resources@1", "{cpu: 2}"),
        cap("port@1", "{container: 8080}"),
        cap("network-policy@1", "{runtime: {allow: [github.com]}}"),
        bare("privileged@1"),
    ]);
    let b = mixin(&[
        cap("volume@1", "{path: /data}"),
        cap("port@1", "{container: 8080}"),
    ]);
    let c = composed(&[("a", a), ("b", b)]);
    assert_eq!(
        short_types(&c),
        [
            "network-policy@1",
            "port@1",
            "privileged@1",
            "volume@1",
            "resources@1",
            "agent-sessions@1",
            "agent-interactive-sessions@1",
            "lifecycle@1",
            "agent-context@1",
        ]
    );
}

#[test]
fn merged_entries_drop_source_and_keep_the_first_label() {
    let a = workload(&[format!(
        "{{type: {NS}/port@1, description: web, source: {{kit: docker.io/x/y, path: kit.yaml}}, config: {{container: 8080}}}}"
    )]);
    let b = mixin(&[format!(
        "{{type: {NS}/port@1, name: web, config: {{container: 8080}}}}"
    )]);
    let c = composed(&[("a", a), ("b", b)]);
    let p = one(&c, "port@1");
    assert!(p.source.is_none());
    assert_eq!(p.name.as_deref(), Some("web"));
    assert_eq!(p.description.as_deref(), Some("web"));
}

#[test]
fn parameterized_entries_are_refused() {
    let a = kit(
        "workload",
        "args:\n  port:\n    default: \"8080\"\n",
        &[cap("port@1", "{container: \"${{ kit.args.port }}\"}")],
    );
    let msg = refused(&[("a", a)]);
    assert_has(
        &msg,
        &[
            "still parameterized where the merge has to read it",
            "a capabilities[0]",
        ],
    );
}

#[test]
fn every_problem_is_reported() {
    let a = workload(&[
        github(""),
        cap("resources@1", "{cpu: 2}"),
        cap("volume@1", "{path: /data, size: 1g}"),
    ]);
    let b = workload(&[
        github(""),
        cap("resources@1", "{cpu: 4}"),
        cap("volume@1", "{path: /data, size: 2g}"),
    ]);
    let problems = compose(&contributions(&[("a", a), ("b", b)])).unwrap_err();
    let msg = render(&problems);
    assert_eq!(problems.len(), 4, "{msg}");
    assert_has(
        &msg,
        &[
            "both workload kits",
            "one credential has one owner",
            "one author",
            "ask for different things",
        ],
    );
}

// ---------------------------------------------------------------------------------------
// Round trip: the merged descriptor is a valid descriptor.

#[test]
fn the_merged_descriptor_publishes_with_a_version() {
    let shell = kit(
        "workload",
        "version: \"1.0.0\"\nprovides: [shell]\n",
        &[github("")],
    );
    let tool = kit(
        "mixin",
        "version: \"2.0.0\"\nprovides: [tool]\nrequires: [\"shell >= 1.0.0\"]\n",
        &[],
    );
    let c = composed(&[("shell", shell), ("tool", tool)]);
    let mut d = c.descriptor();
    d.version = Some("1.0.0".to_owned());
    let loaded = load(
        &serde_json::to_vec(&d).unwrap(),
        &Options {
            profile: Profile::Published,
            ..Default::default()
        },
    );
    assert!(loaded.is_valid(), "{:?}", loaded.diagnostics);
    assert_eq!(
        loaded.descriptor.unwrap().provides,
        ["shell@1.0.0", "tool@2.0.0"]
    );
}

/// A mixin whose credential injects into `api.example.com` and which states no policy of
/// its own: valid only as declarations (published form), judged on the composition.
fn injecting_mixin() -> Descriptor {
    let text = text_of(
        "mixin",
        "",
        &[cap(
            "credential@1",
            "{service: api, phase: runtime, apiKey: {inject: [{domain: api.example.com}]}}",
        )],
    );
    let alone = load(text.as_bytes(), &Options::default());
    assert!(alone.diagnostics.contains(
        "capabilities[0].config.apiKey.inject[0].domain",
        "runtime allow list"
    ));
    load_valid(
        &text,
        &Options {
            declarations_only: true,
            ..Default::default()
        },
    )
}

#[test]
fn an_inject_domain_allowed_by_another_kits_policy_passes() {
    let host = workload(&[cap(
        "network-policy@2",
        "{runtime: {allow: [{hosts: [api.example.com], methods: [GET, POST]}]}}",
    )]);
    let c = composed(&[("host", host), ("api", injecting_mixin())]);
    assert_eq!(short_types(&c), ["network-policy@2", "credential@1"]);
}

#[test]
fn an_inject_domain_no_kit_allows_fails_the_effective_check() {
    let host = workload(&[cap("network-policy@1", "{runtime: {allow: [github.com]}}")]);
    let c = compose(&contributions(&[
        ("host", host),
        ("api", injecting_mixin()),
    ]))
    .unwrap();
    let loaded = effective(&c);
    assert!(!loaded.is_valid());
    assert!(
        loaded
            .diagnostics
            .errors()
            .any(|d| d.to_string().contains("runtime allow list")),
        "{:?}",
        loaded.diagnostics
    );
}

#[test]
fn a_rich_composition_round_trips() {
    let shell = kit(
        "workload",
        "version: \"1.0.0\"\nprovides: [shell]\nlicenses: [MIT]\n",
        &[
            cap(
                "network-policy@1",
                "{install: {allow: [deb.debian.org]}, runtime: {allow: [github.com]}}",
            ),
            github(""),
            cap("volume@1", "{path: /home/agent/.cache, size: 1g}"),
            cap(
                "lifecycle@1",
                "{install: [{command: \"apt-get install -y git\"}], interactive: []}",
            ),
            cap(
                "agent-context@1",
                "{filename: AGENTS.md, contentFile: /usr/share/sandbox/kit/shell/context.md}",
            ),
            cap(
                "agent-interactive-sessions@1",
                "{newSession: [], list: [ls, ids]}",
            ),
            bare("sbx@1"),
        ],
    );
    let claude = kit(
        "mixin",
        "version: \"2.1.6\"\nprovides: [claude]\nrequires: [shell]\nlicenses: [Apache-2.0]\n",
        &[
            cap(
                "network-policy@2",
                "{runtime: {allow: [{hosts: [api.anthropic.com], methods: [POST], paths: [/v1/**]}]}}",
            ),
            cap(
                "credential@1",
                "{service: anthropic, phase: runtime, apiKey: {name: ANTHROPIC_API_KEY, proxyManaged: true, inject: [{domain: api.anthropic.com, header: x-api-key, format: \"%s\"}]}}",
            ),
            cap("volume@1", "{path: /home/agent/.cache/, size: 1024m}"),
            cap("agent-skills@1", "{path: /home/agent/.claude/skills}"),
            cap(
                "agent-skill@1",
                "{path: /usr/share/sandbox/kit/claude/skills/review}",
            ),
            cap("acp@1", "{agent: claude, command: [claude-acp]}"),
            cap(
                "agent-sessions@1",
                "{prompt: [-p, \"{{.Prompt}}\"], list: [ls, ids]}",
            ),
            cap(
                "lifecycle@1",
                "{files: [{path: /home/agent/.claude/settings.json, content: \"{}\", mode: \"0600\"}]}",
            ),
            cap(
                "agent-context@1",
                "{directory: /home/agent/.claude, filename: CLAUDE.md, content: \"use gh\"}",
            ),
            cap(
                "ssh-agent@1",
                "{phase: runtime, unrestricted: false, sign: [git]}",
            ),
            cap("port@1", "{name: ui, container: 3000}"),
            cap("usb-device@1", "{class: \"03\"}"),
            cap("resources@1", "{cpu: 2, memory: 4g}"),
            bare("git-identity@1"),
            "{type: com.example.host/gpu-transcoder@2, optional: true, config: {codec: av1}}"
                .to_owned(),
        ],
    );
    let c = composed(&[("shell", shell), ("claude", claude)]);
    assert_eq!(c.kind, Kind::Workload);
    assert_eq!(c.provides, ["shell@1.0.0", "claude@2.1.6"]);
    assert!(c.requires.is_empty());
    assert_eq!(c.licenses, ["Apache-2.0", "MIT"]);
    assert_eq!(of_type(&c, "volume@1").len(), 1);
    assert_eq!(of_type(&c, "credential@1").len(), 2);

    // What the merged descriptor says reads back the same.
    let loaded = effective(&c);
    let back = loaded.descriptor.unwrap();
    let original = c.descriptor();
    assert_eq!(
        serde_json::to_value(&back).unwrap(),
        serde_json::to_value(&original).unwrap()
    );
}

// ---------------------------------------------------------------------------------------
// capgate's determinism tier (dev.capgate/determinism@1).

fn tier(t: &str) -> String {
    format!("{{type: dev.capgate/determinism@1, config: {{tier: {t}}}}}")
}

#[test]
fn one_determinism_tier_per_workload() {
    // The same tier twice collapses into one entry.
    let c = composed(&[
        ("pack", workload(&[tier("read-only")])),
        ("helper", mixin(&[tier("read-only")])),
    ]);
    let tiers: Vec<&Entry> = c
        .entries
        .iter()
        .filter(|e| e.type_name == "dev.capgate/determinism@1")
        .collect();
    assert_eq!(tiers.len(), 1, "{:#?}", c.entries);
    assert_eq!(config(tiers[0]), json!({"tier": "read-only"}));

    // A mixin that would make a read-only workload side-effecting is refused, naming both.
    let problems = refused(&[
        ("pack", workload(&[tier("read-only")])),
        ("poster", mixin(&[tier("side-effect")])),
    ]);
    assert_has(
        &problems,
        &["pack", "poster", "`read-only`", "`side-effect`", "one tier"],
    );
}

#[test]
fn a_read_only_tier_refuses_a_host_mount_from_any_kit() {
    let problems = refused(&[
        ("pack", workload(&[tier("read-only")])),
        ("data", mixin(&[cap("host-mount@1", "{path: /data}")])),
    ]);
    assert_has(&problems, &["data", "host mount `/data`", "read-only"]);
    // Its twin: the same mount beside a side-effect tier composes.
    let c = composed(&[
        ("pack", workload(&[tier("side-effect")])),
        ("data", mixin(&[cap("host-mount@1", "{path: /data}")])),
    ]);
    assert_eq!(of_type(&c, "host-mount@1").len(), 1);
}

#[test]
fn write_places_of_several_kits_union_into_one_list() {
    let places =
        |list: &str| format!("{{type: dev.capgate/filesystem@1, config: {{write: {list}}}}}");
    let c = composed(&[
        (
            "pack",
            workload(&[places("[/home/agent/workspace/out, /tmp]")]),
        ),
        ("cache", mixin(&[places("[/tmp, /home/agent/.cache]")])),
    ]);
    let merged: Vec<&Entry> = c
        .entries
        .iter()
        .filter(|e| e.type_name == "dev.capgate/filesystem@1")
        .collect();
    assert_eq!(merged.len(), 1, "{:#?}", c.entries);
    assert_eq!(
        config(merged[0]),
        json!({"write": ["/home/agent/workspace/out", "/tmp", "/home/agent/.cache"]})
    );
}
