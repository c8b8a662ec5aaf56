//! `capgate create/ls/rm` and `capgate policy …` through the real binary, against a real
//! SQLite store in a temporary `CAPGATE_HOME`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

use capgate_policy::audit::{AuditEvent, AuditWriter};
use capgate_policy::{Decision, Phase, Reason};

const BIN: &str = env!("CARGO_BIN_EXE_capgate");

struct Home {
    tmp: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("kit")).unwrap();
        Home { tmp }
    }

    /// A home with the example kit and a sandbox `name` created from it.
    fn with_sandbox(name: &str) -> Home {
        let h = Home::new();
        h.kit("kit", EXAMPLE_KIT);
        h.ok(&["create", name, "--kit", "kit"]);
        h
    }

    fn dir(&self) -> &Path {
        self.tmp.path()
    }

    fn kit(&self, name: &str, text: &str) {
        std::fs::create_dir_all(self.dir().join(name)).unwrap();
        std::fs::write(self.dir().join(name).join("kit.yaml"), text).unwrap();
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .current_dir(self.dir())
            .env("CAPGATE_HOME", self.dir().join("home"))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Runs a command that must succeed; its stdout and stderr.
    fn ok(&self, args: &[&str]) -> (String, String) {
        let out = self.run(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn json(&self, args: &[&str]) -> (i32, serde_json::Value) {
        let out = self.run(args);
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{e}: {}{}",
                text(&out),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap(), v)
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const EXAMPLE_KIT: &str = "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@1\n    config: {runtime: {allow: [example.com]}}\n";

#[test]
fn the_seed_example_holds() {
    let h = Home::with_sandbox("m101-kit");

    let (code, v) = h.json(&["policy", "ls", "--source", "kit", "--json"]);
    assert_eq!(code, 0);
    let rules = v["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    let r = &rules[0];
    assert_eq!(r["name"], "kit:m101-kit");
    assert_eq!(r["scope"], "sandbox:m101-kit");
    assert_eq!(r["decision"], "allow");
    assert_eq!(r["resources"], serde_json::json!(["example.com"]));
    assert_eq!(r["editable"], false);
    assert_eq!(r["created_via"], "provisioned");
    assert_eq!(r["resource_type"], "network");

    let (code, v) = h.json(&[
        "policy",
        "check",
        "network",
        "example.com",
        "--sandbox",
        "m101-kit",
        "--json",
    ]);
    assert_eq!(code, 0);
    assert_eq!(v["allowed"], true);
    assert_eq!(v["reason"], "allowed_by_rule");
    assert_eq!(v["rule"]["name"], "kit:m101-kit");
    assert_eq!(v["context"], "sandbox:m101-kit");
    // Another sandbox does not get this kit's grant.
    let (code, v) = h.json(&[
        "policy",
        "check",
        "network",
        "example.com",
        "--sandbox",
        "other",
        "--json",
    ]);
    assert_eq!(code, 2);
    assert_eq!(v["allowed"], false);
    assert_eq!(v["deny_kind"], "implicit");
    assert_eq!(v["reason"], "no_matching_allow");
    assert!(v["rule"].is_null());
}

#[test]
fn deny_wins_across_sources_and_unmatched_is_implicit() {
    let h = Home::new();
    h.kit(
        "kit",
        "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@1\n    config: {runtime: {allow: [example.com], deny: [tracker.example.net]}}\n",
    );
    assert_eq!(
        h.run(&["create", "s1", "--kit", "kit"]).status.code(),
        Some(0)
    );

    // A user deny beats a kit allow…
    assert_eq!(
        h.run(&[
            "policy",
            "deny",
            "network",
            "example.com",
            "--sandbox",
            "s1"
        ])
        .status
        .code(),
        Some(0)
    );
    let (code, v) = h.json(&[
        "policy",
        "check",
        "network",
        "https://example.com/x",
        "--sandbox",
        "s1",
        "--json",
    ]);
    assert_eq!(code, 2);
    assert_eq!(v["deny_kind"], "explicit");
    assert_eq!(v["reason"], "denied_by_rule");
    assert_eq!(v["rule"]["source"], "user");
    // …and a kit deny beats a user allow, even a global one.
    assert_eq!(
        h.run(&["policy", "allow", "network", "tracker.example.net"])
            .status
            .code(),
        Some(0)
    );
    let (code, v) = h.json(&[
        "policy",
        "check",
        "network",
        "tracker.example.net:443",
        "--sandbox",
        "s1",
        "--json",
    ]);
    assert_eq!(code, 2);
    assert_eq!(v["rule"]["source"], "kit");
    assert_eq!(v["rule"]["name"], "kit:s1:deny");
    // The user allow does work where no deny applies.
    let (code, _) = h.json(&[
        "policy",
        "check",
        "network",
        "tracker.example.net",
        "--sandbox",
        "s2",
        "--json",
    ]);
    assert_eq!(code, 0);
    // An unmatched host is an implicit deny.
    let (code, v) = h.json(&[
        "policy",
        "check",
        "network",
        "10.1.2.3",
        "--sandbox",
        "s1",
        "--json",
    ]);
    assert_eq!(code, 2);
    assert_eq!(v["deny_kind"], "implicit");
}

/// Adding a rule that says what a user rule already says adds nothing and names the rule
/// (so `policy ls` does not fill with copies, and one `policy rm --id` removes it); its
/// twins, the same host with other methods, or in another scope, are added. A rule for a
/// sandbox no one has created is kept (it applies once one is made with that name), with a
/// note, since a misspelt name would otherwise apply to nothing in silence.
#[test]
fn a_rule_already_present_is_not_added_twice() {
    let h = Home::with_sandbox("s1");
    let user_rules = || {
        let (code, v) = h.json(&["policy", "ls", "--source", "user", "--json"]);
        assert_eq!(code, 0, "{v}");
        v["rules"].as_array().unwrap().len()
    };
    // `policy allow network RESOURCES --method METHODS [EXTRA…]`.
    let allow = |resources: &str, methods: &str, extra: &[&str]| {
        let mut args = vec!["policy", "allow", "network", resources, "--method", methods];
        args.extend_from_slice(extra);
        h.ok(&args)
    };
    let (first, note) = allow("a.example,b.example", "GET", &[]);
    assert!(first.starts_with("added allow rule r-"), "{first}");
    assert!(note.is_empty(), "{note}");
    // The same resources in another order and spelling of the list: the same rule.
    let (again, _) = allow("b.example, a.example", "get", &[]);
    let id = first.split_whitespace().nth(3).unwrap();
    assert!(
        again.contains(&format!("rule {id} (global) already allows")),
        "{again}"
    );
    assert!(again.contains("nothing added"), "{again}");
    assert_eq!(user_rules(), 1);
    // Twins: other methods, or another scope, add a rule each.
    let (post, _) = allow("a.example,b.example", "GET,POST", &[]);
    assert!(post.starts_with("added allow rule"), "{post}");
    let (scoped, note) = allow("a.example,b.example", "GET", &["--sandbox", "s1"]);
    assert!(scoped.starts_with("added allow rule"), "{scoped}");
    assert!(
        note.is_empty(),
        "a sandbox that exists needs no note: {note}"
    );
    assert_eq!(user_rules(), 3);
    // A sandbox no one has made: added, with a note naming it.
    let (typo, note) = h.ok(&["policy", "deny", "network", "c.example", "--sandbox", "sl"]);
    assert!(typo.starts_with("added deny rule"), "{typo}");
    assert!(note.contains("no sandbox is named `sl` yet"), "{note}");
    assert_eq!(user_rules(), 4);
}

/// `policy rm --resource` without `--sandbox` removes the global rules naming the
/// resource, as `policy allow` without `--sandbox` made them: tidying a global allow must
/// not take a sandbox's deny of the same host with it (that would widen the sandbox).
/// Twin: with `--sandbox` the sandbox's deny goes, and the host is allowed there again.
#[test]
fn removing_a_global_rule_by_resource_keeps_a_sandboxs_deny() {
    let h = Home::new();
    let check_in_s1 = || {
        h.json(&[
            "policy",
            "check",
            "network",
            "evil.example",
            "--sandbox",
            "s1",
            "--json",
        ])
    };
    let ok = |args: &[&str]| {
        let (out, err) = h.ok(args);
        out + &err
    };
    ok(&[
        "policy",
        "deny",
        "network",
        "evil.example",
        "--sandbox",
        "s1",
    ]);
    ok(&["policy", "allow", "network", "evil.example"]);
    let removed = ok(&["policy", "rm", "--resource", "evil.example"]);
    assert_eq!(removed.matches("removed rule").count(), 1, "{removed}");
    let (code, v) = check_in_s1();
    assert_eq!(code, 2, "{v}");
    assert_eq!(v["decision"], "deny", "{v}");
    // Nothing global is left to remove: said, with how to reach the sandbox's rule.
    let out = h.run(&["policy", "rm", "--resource", "evil.example"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("--sandbox NAME"), "{}", text(&out));
    let removed = ok(&[
        "policy",
        "rm",
        "--resource",
        "evil.example",
        "--sandbox",
        "s1",
    ]);
    assert_eq!(removed.matches("removed rule").count(), 1, "{removed}");
    ok(&["policy", "allow", "network", "evil.example"]);
    let (code, v) = check_in_s1();
    assert_eq!(code, 0, "{v}");
}

#[test]
fn provisioned_rules_cannot_be_removed_and_recreate_replaces_them_atomically() {
    let h = Home::with_sandbox("s");
    let out = h.run(&[
        "policy",
        "rm",
        "--resource",
        "example.com",
        "--sandbox",
        "s",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains(
            "provisioned from kit for sandbox `s`; remove the sandbox or change its kits"
        ),
        "{}",
        text(&out)
    );

    // A user rule scoped to the sandbox survives a recreate; the kit rules are replaced.
    assert_eq!(
        h.run(&["policy", "deny", "network", "bad.example", "--sandbox", "s"])
            .status
            .code(),
        Some(0)
    );
    h.kit(
        "kit",
        "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@2\n    config:\n      runtime:\n        allow:\n          - {hosts: [api.example.com], methods: [GET], paths: [\"/repos/**\"]}\n",
    );
    // The new composition widens the lock: refused without approval, nothing changes.
    let out = h.run(&["create", "s", "--kit", "kit"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let (_, v) = h.json(&["policy", "ls", "--sandbox", "s", "--json"]);
    assert!(v.to_string().contains("\"example.com\""));
    let out = h.run(&["create", "s", "--kit", "kit", "--approve"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let (_, v) = h.json(&["policy", "ls", "--sandbox", "s", "--json"]);
    let names: Vec<&str> = v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["user:bad.example", "kit:s:http"]);
    let (code, v) = h.json(&[
        "policy",
        "check",
        "network",
        "api.example.com",
        "--sandbox",
        "s",
        "--method",
        "POST",
        "--path",
        "/repos/x",
        "--json",
    ]);
    assert_eq!(code, 2);
    assert_eq!(v["reason"], "http_not_allowed");
    let (code, _) = h.json(&[
        "policy",
        "check",
        "network",
        "https://api.example.com/repos/x",
        "--sandbox",
        "s",
        "--method",
        "GET",
        "--json",
    ]);
    assert_eq!(code, 0);

    // rm takes the sandbox's rules with it.
    let out = h.run(&["rm", "s"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let (_, v) = h.json(&["policy", "ls", "--json"]);
    assert!(v["rules"].as_array().unwrap().is_empty());
    let (_, v) = h.json(&["ls", "--json"]);
    assert!(v["sandboxes"].as_array().unwrap().is_empty());
}

#[test]
fn presets_are_not_deny_rules() {
    let h = Home::new();
    h.kit("kit", EXAMPLE_KIT);
    let out = h.run(&["policy", "init", "deny-all"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out).contains("only a deny rule beats them"));
    assert_eq!(
        h.run(&["create", "s", "--kit", "kit"]).status.code(),
        Some(0)
    );
    let (code, _) = h.json(&[
        "policy",
        "check",
        "network",
        "example.com",
        "--sandbox",
        "s",
        "--json",
    ]);
    assert_eq!(code, 0, "a kit allow applies under deny-all");
    let out = h.run(&["policy", "init", "balanced"]);
    assert_eq!(out.status.code(), Some(0));
    let (code, v) = h.json(&["policy", "check", "network", "api.anthropic.com", "--json"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["rule"]["source"], "default");
    let (code, _) = h.json(&["policy", "check", "network", "exfil.example", "--json"]);
    assert_eq!(code, 2);
    let out = h.run(&["policy", "init", "sideways"]);
    assert_eq!(out.status.code(), Some(1));
    let out = h.run(&["policy", "allow", "network", "bad host"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("is not a host pattern"),
        "{}",
        text(&out)
    );
}

#[test]
fn policy_log_groups_decisions_per_host_with_methods_and_paths() {
    let h = Home::new();
    let db = h.dir().join("home/policy.db");
    // The store is created by the first command.
    assert_eq!(h.run(&["policy", "ls"]).status.code(), Some(0));
    let writer = AuditWriter::spawn(&db).unwrap();
    let event = |host: &str, method: Option<&str>, path: Option<&str>, decision, reason| {
        let mut e = AuditEvent::new("s1", host, 443, decision, reason);
        e.phase = Some(Phase::Runtime);
        e.method = method.map(str::to_owned);
        e.path = path.map(str::to_owned);
        e
    };
    for _ in 0..3 {
        writer.record(event(
            "api.example.com",
            Some("GET"),
            Some("/repos/x?token=secret"),
            Decision::Allow,
            Reason::AllowedByRule,
        ));
    }
    writer.record(event(
        "api.example.com",
        Some("POST"),
        Some("/repos/x"),
        Decision::Deny,
        Reason::HttpNotAllowed,
    ));
    writer.record(event(
        "evil.example",
        None,
        None,
        Decision::Deny,
        Reason::NoMatchingAllow,
    ));
    writer.flush().unwrap();
    let (code, v) = h.json(&["policy", "log", "--sandbox", "s1", "--json"]);
    assert_eq!(code, 0);
    let hosts = v["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 3, "{v}");
    let allowed = hosts.iter().find(|h| h["decision"] == "allow").unwrap();
    assert_eq!(allowed["count"], 3);
    assert_eq!(
        allowed["methods_paths"][0]["path"], "/repos/x",
        "no query string is ever stored"
    );
    assert!(!v.to_string().contains("secret"));
    let out = h.run(&["policy", "log"]);
    let t = text(&out);
    assert!(
        t.contains("Blocked requests:")
            && t.contains("evil.example:443")
            && t.contains("http_not_allowed"),
        "{t}"
    );
    assert!(t.contains("POST /repos/x"), "{t}");
    // capgate log: the events one by one, newest first.
    let (code, v) = h.json(&["log", "--sandbox", "s1", "--json"]);
    assert_eq!(code, 0);
    let events = v["events"].as_array().unwrap();
    assert_eq!(events.len(), 5);
    assert_eq!(events[0]["host"], "evil.example");
    assert_eq!(events[0]["reason"], "no_matching_allow");
}

#[test]
fn log_prune_before_an_age_removes_older_events_and_later_listings_say_so() {
    let h = Home::new();
    let db = h.dir().join("home/policy.db");
    assert_eq!(h.run(&["policy", "ls"]).status.code(), Some(0));
    let writer = AuditWriter::spawn(&db).unwrap();
    let mut old = AuditEvent::new(
        "s1",
        "old.example",
        443,
        Decision::Deny,
        Reason::NoMatchingAllow,
    );
    old.time = capgate_policy::audit::Timestamp::parse("2020-01-01T00:00:00Z").unwrap();
    writer.record(old);
    writer.record(AuditEvent::new(
        "s1",
        "new.example",
        443,
        Decision::Deny,
        Reason::NoMatchingAllow,
    ));
    writer.flush().unwrap();

    let (code, v) = h.json(&["log", "--prune-before", "30d", "--json"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["pruned"], 1);

    let (code, v) = h.json(&["log", "--json"]);
    assert_eq!(code, 0);
    let hosts: Vec<&str> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, ["new.example"]);
    assert_eq!(v["pruned"]["events"], 1, "{v}");
    let listing = text(&h.run(&["policy", "log"]));
    assert!(listing.contains("were pruned: 1 removed"), "{listing}");

    // A bad age is a usage error that names the value; nothing is removed.
    let out = h.run(&["log", "--prune-before", "30x"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("`30x`"), "{}", text(&out));
    assert_eq!(
        h.json(&["log", "--json"]).1["events"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// A deny the matcher cannot read would be dropped when rules compile, a refusal silently
/// not in force: provisioning refuses the kit instead, naming the resource at its line in
/// the kit. No rule of the kit is left half-provisioned.
#[test]
fn a_kit_deny_the_matcher_cannot_read_is_refused_at_provisioning() {
    let h = Home::new();
    h.kit(
        "kit",
        "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@1\n    config: {runtime: {allow: ['**'], deny: ['telemetry.example.com:0']}}\n",
    );
    let out = h.run(&["create", "bad-deny", "--kit", "kit"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("kit/kit.yaml:5:46: error[invalid-host]: capabilities[0].config.runtime.deny[0]: `telemetry.example.com:0` has an invalid port"),
        "{}",
        text(&out)
    );
    let (code, v) = h.json(&["policy", "ls", "--source", "kit", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(v["rules"].as_array().unwrap().len(), 0, "{v}");
}

/// A path glob the matcher cannot compile (`%2E%2E` is a dot segment) would make its rule
/// match nothing (an allow silently dead, a deny silently not in force): provisioning
/// refuses the kit, naming the path; its twin, a clean glob, is provisioned.
#[test]
fn a_kit_path_the_matcher_cannot_read_is_refused_at_provisioning() {
    let h = Home::new();
    let kit = |path: &str| {
        format!(
            "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@2\n    config: {{runtime: {{allow: [{{hosts: [api.example.com], methods: [GET], paths: [\"{path}\"]}}]}}}}\n"
        )
    };
    h.kit("kit", &kit("/repos/%2E%2E/admin"));
    let out = h.run(&["create", "bad-path", "--kit", "kit"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("kit/kit.yaml:5:83: error[invalid-path]: capabilities[0].config.runtime.allow[0]: path `/repos/%2E%2E/admin` has a dot segment"),
        "{}",
        text(&out)
    );
    let (_, v) = h.json(&["policy", "ls", "--source", "kit", "--json"]);
    assert_eq!(v["rules"].as_array().unwrap().len(), 0, "{v}");
    h.kit("good", &kit("/repos/**"));
    let out = h.run(&["create", "good-path", "--kit", "good"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A recreate whose rules the store refuses changes nothing: not the lock, not the
/// sandbox's composition (whose credential inject domains the gateway follows), not its
/// rules. Before, the refused kit's composition stayed on disk and its inject domain was
/// live. The twin, a valid recreate, changes all three.
#[test]
fn a_refused_recreate_leaves_the_sandbox_as_it_was() {
    let h = Home::new();
    let kit = |allow: &str, inject: &str| {
        format!(
            "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@1\n    config: {{runtime: {{allow: [{allow}]}}}}\n  - type: com.docker.sandbox/credential@1\n    config:\n      service: github\n      phase: runtime\n      apiKey: {{name: GH_TOKEN, proxyManaged: true, inject: [{{domain: {inject}}}]}}\n"
        )
    };
    h.kit("a", &kit("api.github.com", "api.github.com"));
    let out = h.run(&["create", "sb", "--kit", "a"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let composition = h.dir().join("home/sandboxes/sb/composition.json");
    let before = std::fs::read_to_string(&composition).unwrap();

    h.kit("b", &kit("'foo..com', evil.example", "evil.example"));
    let out = h.run(&["create", "sb", "--kit", "b"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("foo..com"), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&composition).unwrap(), before);
    assert!(
        !h.dir().join("b/capgate.lock").exists(),
        "no lock for a refused kit"
    );
    let (_, v) = h.json(&["policy", "ls", "--source", "kit", "--json"]);
    assert!(
        v.to_string().contains("api.github.com") && !v.to_string().contains("evil"),
        "{v}"
    );

    h.kit("c", &kit("api.example.com", "api.example.com"));
    let out = h.run(&["create", "sb", "--kit", "c"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let after = std::fs::read_to_string(&composition).unwrap();
    assert!(
        after.contains("api.example.com") && !after.contains("api.github.com"),
        "{after}"
    );
}

/// `create --json` prints one JSON document: the sandbox created, or, when the lock gate
/// refuses, the gate's report of the widenings (exit 4).
#[test]
fn create_json_is_one_document() {
    let h = Home::new();
    let kit = |host: &str| {
        format!(
            "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@1\n    config: {{runtime: {{allow: [{host}]}}}}\n"
        )
    };
    h.kit("k", &kit("api.example.com"));
    let (code, v) = h.json(&["create", "one", "--kit", "k", "--json"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["name"], "one", "{v}");
    h.kit("k", &kit("other.example.com"));
    let (code, v) = h.json(&["create", "one", "--kit", "k", "--json"]);
    assert_eq!(code, 4, "{v}");
    assert_eq!(v["widenings"][0]["detail"], "other.example.com", "{v}");
}

/// A pack's egress triples are provisioned as protocol rules that `policy ls` shows and
/// `policy check` judges: the https triple answers for https only, by URL scheme or by
/// `--protocol`; a user can write the same rule with `policy allow --protocol https`.
#[test]
fn egress_triples_are_protocol_rules_that_check_judges() {
    let h = Home::new();
    h.kit(
        "pack",
        "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: dev.capgate/egress@1\n    config: {host: api.openai.com, port: 443, protocol: https}\n",
    );
    let o = h.run(&["create", "p", "--kit", "pack"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let (_, ls) = h.json(&["policy", "ls", "--sandbox", "p", "--json"]);
    let rules = ls["rules"].as_array().unwrap();
    let egress = rules
        .iter()
        .find(|r| r["name"] == "kit:p:egress:https")
        .unwrap_or_else(|| panic!("{ls}"));
    assert_eq!(egress["protocol"], "https");
    assert_eq!(
        egress["resources"],
        serde_json::json!(["api.openai.com:443"])
    );
    let table = text(&h.run(&["policy", "ls", "--sandbox", "p"]));
    assert!(
        table.contains("api.openai.com:443 protocol=https"),
        "the table says what the rule is for: {table}"
    );

    let check = |args: &[&str]| {
        let mut all = vec!["policy", "check", "network", "--sandbox", "p"];
        all.extend_from_slice(args);
        h.run(&all).status.code()
    };
    assert_eq!(check(&["https://api.openai.com/v1/models"]), Some(0));
    assert_eq!(
        check(&["api.openai.com:443", "--protocol", "https"]),
        Some(0)
    );
    // The same host and port in cleartext, as any TCP, or on another port: refused.
    assert_eq!(check(&["http://api.openai.com:443/"]), Some(2));
    assert_eq!(check(&["api.openai.com:443"]), Some(2));
    assert_eq!(check(&["https://api.openai.com:8443/"]), Some(2));

    // A user's own https rule, global.
    let o = h.run(&[
        "policy",
        "allow",
        "network",
        "files.example.com:443",
        "--protocol",
        "https",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(check(&["https://files.example.com/x"]), Some(0));
    assert_eq!(check(&["http://files.example.com:443/x"]), Some(2));
}

/// Output that cannot be written never panics: a reader that closed the pipe
/// (`capgate policy ls | head`) ends the command quietly with 0, a full disk with 1 and a
/// message naming standard output. Twin: to `/dev/null` each command succeeds.
#[test]
fn output_that_cannot_be_written_ends_the_command_without_a_panic() {
    let h = Home::new();
    for i in 0..3 {
        let out = h.run(&["policy", "allow", "network", &format!("h{i}.example")]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    let commands: [&[&str]; 6] = [
        &["policy", "ls"],
        &["policy", "ls", "--json"],
        &["ls", "--json"],
        &["log"],
        &["schema"],
        &["doctor", "--json"],
    ];
    let run_to = |args: &[&str], stdout: Stdio| {
        Command::new(BIN)
            .args(args)
            .current_dir(h.dir())
            .env("CAPGATE_HOME", h.dir().join("home"))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::piped())
            .output()
            .unwrap()
    };
    for args in commands {
        // `doctor` exits 1 on a host that lacks something; what matters is that it is not
        // a panic, and that the output's fate does not change its answer.
        let fine = run_to(args, Stdio::null());
        assert_ne!(fine.status.code(), Some(101), "{args:?}: {}", text(&fine));
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let closed = run_to(args, Stdio::from(writer));
        let said = String::from_utf8_lossy(&closed.stderr);
        assert_eq!(closed.status.code(), Some(0), "{args:?}: {said}");
        assert!(!said.contains("panicked"), "{args:?}: {said}");
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let full = run_to(args, Stdio::from(full));
        let said = String::from_utf8_lossy(&full.stderr);
        assert_eq!(full.status.code(), Some(1), "{args:?}: {said}");
        assert!(
            said.contains("capgate: cannot write to standard output: No space left on device"),
            "{args:?}: {said}"
        );
    }
}

/// `log --limit 0` would show nothing and say no events were recorded, which is not true:
/// it is a usage error. Twin: `--limit 1` is taken.
#[test]
fn a_log_limit_of_zero_is_refused() {
    let h = Home::new();
    let out = h.run(&["log", "--limit", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("invalid value '0' for '--limit <N>'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = h.run(&["log", "--limit", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
