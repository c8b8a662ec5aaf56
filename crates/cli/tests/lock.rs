//! `capgate resolve` and `capgate lock` through the real binary: the lock is written, an
//! update that stays inside it applies silently, and one that widens it stops.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_capgate");
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// `capgate ARGS` in `dir`, its data directory `dir/.capgate` (where what the user
/// approved is recorded).
fn capgate(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("CAPGATE_HOME", dir.join(".capgate"))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Writes `yaml` as the kit `name` (its directory's `kit.yaml`) beneath `dir`.
fn write_kit(dir: &Path, name: &str, yaml: &str) {
    std::fs::create_dir_all(dir.join(name)).unwrap();
    std::fs::write(dir.join(name).join("kit.yaml"), yaml).unwrap();
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const WORKLOAD: &str = r#"schemaVersion: "3"
kind: workload
version: "1.0.0"
provides: [base]
capabilities:
  - type: com.docker.sandbox/network-policy@1
    config:
      runtime:
        allow: [deb.debian.org]
"#;

const MIXIN_V1: &str = r#"schemaVersion: "3"
kind: mixin
provides: ["tool@1.0.0"]
requires: [base]
capabilities:
  - type: com.docker.sandbox/network-policy@1
    config:
      runtime:
        allow: [api.tool.example]
        deny: [telemetry.tool.example]
"#;

/// v2 adds a runtime allow, removes the deny and adds a credential.
const MIXIN_V2: &str = r#"schemaVersion: "3"
kind: mixin
provides: ["tool@2.0.0"]
requires: [base]
capabilities:
  - type: com.docker.sandbox/network-policy@1
    config:
      runtime:
        allow: [api.tool.example, uploads.tool.example]
  - type: com.docker.sandbox/credential@1
    config:
      service: tool
      phase: runtime
      apiKey: {name: TOOL_TOKEN, proxyManaged: true, inject: [{domain: api.tool.example}]}
"#;

/// v3 narrows: drops the upload host again.
const MIXIN_V3: &str = r#"schemaVersion: "3"
kind: mixin
provides: ["tool@3.0.0"]
requires: [base]
capabilities:
  - type: com.docker.sandbox/network-policy@1
    config:
      runtime:
        allow: [api.tool.example]
  - type: com.docker.sandbox/credential@1
    config:
      service: tool
      phase: runtime
      apiKey: {name: TOOL_TOKEN, proxyManaged: true, inject: [{domain: api.tool.example}]}
"#;

fn setup() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("base")).unwrap();
    std::fs::create_dir_all(tmp.path().join("tool")).unwrap();
    std::fs::write(tmp.path().join("base/kit.yaml"), WORKLOAD).unwrap();
    std::fs::write(tmp.path().join("tool/kit.yaml"), MIXIN_V1).unwrap();
    tmp
}

#[test]
fn widening_update_stops_until_approved() {
    let tmp = setup();
    let dir = tmp.path();
    let lock = dir.join("base/capgate.lock");

    // No lock yet: written.
    let out = capgate(dir, &["lock", "base", "tool"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let first = std::fs::read_to_string(&lock).unwrap();
    assert!(
        first.contains("\"reference\": \".\""),
        "references are relative to the lock: {first}"
    );
    assert!(first.contains("\"reference\": \"../tool\""), "{first}");
    assert!(first.contains("telemetry.tool.example"));

    // The update widens in exactly four ways: exit 4, lock untouched.
    std::fs::write(dir.join("tool/kit.yaml"), MIXIN_V2).unwrap();
    let out = capgate(dir, &["lock", "base", "tool", "--json"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let widenings = listed(&report);
    let expected = [
        ("../tool", "network.runtime.allow", "uploads.tool.example"),
        (
            "../tool",
            "network.runtime.deny-removed",
            "telemetry.tool.example",
        ),
        ("../tool", "credentials.runtime", "tool"),
        (
            "../tool",
            "credentials.inject",
            "runtime tool api.tool.example Authorization: Bearer %s",
        ),
    ];
    let expected: Vec<(String, String, String)> = expected
        .iter()
        .map(|(a, b, c)| ((*a).to_owned(), (*b).to_owned(), (*c).to_owned()))
        .collect();
    assert_eq!(widenings, expected);
    assert_eq!(report["written"], false);
    assert_eq!(
        std::fs::read_to_string(&lock).unwrap(),
        first,
        "a refused update changes nothing"
    );

    // Human form, without a terminal: the same lines, exit 4.
    let out = capgate(dir, &["lock", "base", "tool"]);
    assert_eq!(out.status.code(), Some(4));
    let t = text(&out);
    for line in [
        "  + network.runtime.allow: uploads.tool.example\n",
        "  + network.runtime.deny-removed: telemetry.tool.example\n",
        "  + credentials.runtime: tool\n",
        "  + credentials.inject: runtime tool api.tool.example Authorization: Bearer %s\n",
    ] {
        assert!(t.contains(line), "{line:?} in {t}");
    }
    assert_eq!(t.matches("  + ").count(), 4, "{t}");
    let out = capgate(dir, &["lock", "base", "tool", "--check"]);
    assert_eq!(out.status.code(), Some(4));

    // Approved: written, exit 0; then a third run is silent and exits 0.
    let out = capgate(dir, &["lock", "base", "tool", "--approve"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let approved = std::fs::read_to_string(&lock).unwrap();
    assert_ne!(approved, first);
    let out = capgate(dir, &["lock", "base", "tool"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out),
        "",
        "a composition inside the lock applies silently"
    );
    let out = capgate(dir, &["lock", "base", "tool", "--check"]);
    assert_eq!(out.status.code(), Some(0));

    // A narrowing update applies silently too, and rewrites the lock.
    std::fs::write(dir.join("tool/kit.yaml"), MIXIN_V3).unwrap();
    let out = capgate(dir, &["lock", "base", "tool"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(text(&out), "");
    assert!(
        !std::fs::read_to_string(&lock)
            .unwrap()
            .contains("uploads.tool.example")
    );

    // The same lock matches the kits from another working directory.
    let out = capgate(&dir.join("tool"), &["lock", "../base", ".", "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn a_broken_or_unknown_lock_is_never_replaced() {
    let tmp = setup();
    let dir = tmp.path();
    let lock = dir.join("base/capgate.lock");
    std::fs::write(&lock, "{\"version\": 1, \"kits\": [").unwrap();
    let out = capgate(dir, &["lock", "base", "tool", "--approve"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("the lock is not valid"),
        "{}",
        text(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&lock).unwrap(),
        "{\"version\": 1, \"kits\": ["
    );

    std::fs::write(&lock, "{\"version\": 7, \"kits\": []}").unwrap();
    let out = capgate(dir, &["lock", "base", "tool"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("capgate lock version 7 is not supported (this reader reads 1)"),
        "{}",
        text(&out)
    );
}

#[test]
fn lock_path_can_be_given() {
    let tmp = setup();
    let dir = tmp.path();
    let out = capgate(dir, &["lock", "base", "tool", "--lock", "elsewhere.lock"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let lock = std::fs::read_to_string(dir.join("elsewhere.lock")).unwrap();
    assert!(lock.contains("\"reference\": \"base\""), "{lock}");
    assert!(!dir.join("base/capgate.lock").exists());
}

#[test]
fn refused_compositions_exit_2_with_every_reason() {
    let tmp = setup();
    let dir = tmp.path();
    write_kit(
        dir,
        "other",
        &WORKLOAD.replace("provides: [base]", "provides: [base]\nrequires: [missing]"),
    );
    let out = capgate(dir, &["resolve", "base", "other", "tool"]);
    assert_eq!(out.status.code(), Some(2));
    let t = text(&out);
    assert!(t.contains("more than one workload"), "{t}");
    assert!(t.contains("`base` is provided by more than one kit"), "{t}");
    assert!(
        t.contains("other requires[0]: requires `missing`, but nothing in the set provides it"),
        "{t}"
    );
    let out = capgate(dir, &["lock", "base", "other", "tool"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn invalid_input_exits_1_and_unknown_args_are_named() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(
        dir.join("tool/kit.yaml"),
        "schemaVersion: \"3\"\nkind: mixin\nnope: 1\n",
    )
    .unwrap();
    let out = capgate(dir, &["resolve", "base", "tool"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("tool/kit.yaml:3:1: nope: unknown field `nope`"),
        "{}",
        text(&out)
    );
    std::fs::write(dir.join("tool/kit.yaml"), MIXIN_V1).unwrap();
    let out = capgate(dir, &["resolve", "base", "tool", "--arg", "color=blue"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("no kit of the composition declares an arg `color`"),
        "{}",
        text(&out)
    );
}

#[test]
fn resolve_json_has_surface_order_skipped_descriptor() {
    let out = capgate(
        Path::new(ROOT),
        &[
            "resolve",
            "examples/kits/gh",
            "examples/kits/shell",
            "examples/kits/pip-cache",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["order"],
        serde_json::json!([
            "examples/kits/shell",
            "examples/kits/gh",
            "examples/kits/pip-cache"
        ])
    );
    assert_eq!(
        v["surface"]["credentialsRuntime"],
        serde_json::json!(["github"])
    );
    assert_eq!(
        v["surface"]["hostMountPaths"],
        serde_json::json!(["/home/agent/.cache/pip"])
    );
    assert_eq!(v["descriptor"]["kind"], "workload");
    assert!(v["skipped"].as_array().unwrap().is_empty());
    // The human form names the same grants.
    let out = capgate(
        Path::new(ROOT),
        &["resolve", "examples/kits/gh", "examples/kits/shell"],
    );
    let t = text(&out);
    assert!(t.contains("Credentials:\n  runtime      github\n"), "{t}");
    assert!(t.contains("  1. examples/kits/shell"), "{t}");
}

#[test]
fn optional_unsupported_entries_are_skipped_and_listed() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(
        dir.join("tool/kit.yaml"),
        format!("{MIXIN_V1}  - type: com.docker.sandbox/usb-device@1\n    optional: true\n    config: {{class: \"03\"}}\n  - type: com.example.host/gpu@2\n    optional: true\n"),
    )
    .unwrap();
    let out = capgate(dir, &["resolve", "base", "tool", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let skipped = v["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 2);
    assert_eq!(skipped[0]["path"], "capabilities[1]");
    assert!(
        skipped[0]["reason"]
            .as_str()
            .unwrap()
            .contains("usb-device@1")
    );
    assert!(
        v["surface"].get("usb").is_none(),
        "a skipped entry grants nothing"
    );
    // …but the lock records what the kit asks for, so an approval covers it.
    let out = capgate(dir, &["lock", "base", "tool"]);
    assert_eq!(out.status.code(), Some(0));
    let lock = std::fs::read_to_string(dir.join("base/capgate.lock")).unwrap();
    assert!(lock.contains("class:03"), "{lock}");
    assert!(lock.contains("com.example.host/gpu@2"), "{lock}");
}

/// A deny moved into an optional group this runtime skips is no longer enforced: the gate
/// says so (it compares the denies in force, not the ones merely written).
#[test]
fn a_deny_moved_into_a_skipped_optional_group_is_a_removed_deny() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("w")).unwrap();
    let v1 = r#"schemaVersion: "3"
kind: workload
capabilities:
  - type: com.docker.sandbox/network-policy@2
    config: {runtime: {allow: ["*.example.com"], deny: [telemetry.example.com]}}
  - type: com.example/optional-extra@1
    optional: true
"#;
    let v2 = r#"schemaVersion: "3"
kind: workload
capabilities:
  - type: com.docker.sandbox/network-policy@2
    config: {runtime: {allow: ["*.example.com"]}}
  - group:
      optional: true
      capabilities:
        - type: com.docker.sandbox/network-policy@2
          config: {runtime: {deny: [telemetry.example.com]}}
        - type: com.example/optional-extra@1
"#;
    std::fs::write(dir.join("w/kit.yaml"), v1).unwrap();
    let out = capgate(dir, &["lock", "w"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Re-locking the same kit changes nothing.
    let out = capgate(dir, &["lock", "w", "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    std::fs::write(dir.join("w/kit.yaml"), v2).unwrap();
    let out = capgate(dir, &["lock", "w", "--check", "--json"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let widenings = report["widenings"].as_array().unwrap();
    assert!(
        widenings
            .iter()
            .any(|w| w["category"] == "network.runtime.deny-removed"
                && w["detail"] == "telemetry.example.com"),
        "{report}"
    );
    // Once approved, the lock records the deny as not in force, and stays quiet after.
    let out = capgate(dir, &["lock", "w", "--approve"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = capgate(dir, &["lock", "w", "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A credential's real value going somewhere new is a widening even when the host was
/// already allowed: a new inject domain, or a new header on the same one.
#[test]
fn a_new_inject_destination_for_a_credential_is_a_widening() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("w")).unwrap();
    let kit = |inject: &str| {
        format!(
            r#"schemaVersion: "3"
kind: workload
capabilities:
  - type: com.docker.sandbox/network-policy@1
    config: {{runtime: {{allow: [api.github.com, paste.example.net]}}}}
  - type: com.docker.sandbox/credential@1
    config:
      service: github
      phase: runtime
      apiKey: {{name: GH_TOKEN, inject: [{inject}]}}
"#
        )
    };
    let v1 = kit("{domain: api.github.com}");
    std::fs::write(dir.join("w/kit.yaml"), &v1).unwrap();
    let out = capgate(dir, &["lock", "w"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // The same destination with its defaults written out is no change.
    std::fs::write(
        dir.join("w/kit.yaml"),
        kit("{domain: api.github.com, header: Authorization, format: \"Bearer %s\"}"),
    )
    .unwrap();
    let out = capgate(dir, &["lock", "w", "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    for (inject, detail) in [
        (
            "{domain: api.github.com}, {domain: paste.example.net, header: X-Leak, format: \"%s\"}",
            "runtime github paste.example.net X-Leak: %s",
        ),
        (
            "{domain: api.github.com, header: X-Other}",
            "runtime github api.github.com X-Other: Bearer %s",
        ),
        // A scheme other than basic changes nothing: header and format still say where
        // the key goes.
        (
            "{domain: api.github.com, scheme: token, header: X-Echo-Me, format: \"%s\"}",
            "runtime github api.github.com X-Echo-Me: %s",
        ),
        (
            "{domain: api.github.com, scheme: Basic, username: bot}",
            "runtime github api.github.com Authorization: basic bot",
        ),
    ] {
        std::fs::write(dir.join("w/kit.yaml"), kit(inject)).unwrap();
        let out = capgate(dir, &["lock", "w", "--check", "--json"]);
        assert_eq!(out.status.code(), Some(4), "{inject}: {}", text(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let found: Vec<(&str, &str)> = report["widenings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                (
                    w["category"].as_str().unwrap(),
                    w["detail"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(found, [("credentials.inject", detail)], "{inject}");
    }

    // A domain held to one port, widened to every port of its host.
    std::fs::write(
        dir.join("w/kit.yaml"),
        kit("{domain: \"api.github.com:443\"}"),
    )
    .unwrap();
    let out = capgate(dir, &["lock", "w", "--approve"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    std::fs::write(dir.join("w/kit.yaml"), &v1).unwrap();
    let out = capgate(dir, &["lock", "w", "--check", "--json"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("runtime github api.github.com Authorization: Bearer %s"),
        "{}",
        text(&out)
    );
}

/// Dropping a mixin drops its denies: a removed deny, attributed to the mixin, that stops
/// for approval like any other. Dropping one that only granted is silent.
#[test]
fn dropping_a_mixin_that_denies_is_a_removed_deny() {
    let tmp = setup();
    let dir = tmp.path();
    let out = capgate(dir, &["lock", "base", "tool"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = capgate(dir, &["lock", "base", "--check", "--json"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let found: Vec<(&str, &str, &str)> = report["widenings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["kit"].as_str().unwrap(),
                w["category"].as_str().unwrap(),
                w["detail"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [(
            "../tool",
            "network.runtime.deny-removed",
            "telemetry.tool.example"
        )]
    );

    // A mixin with allows only: dropping it narrows, and the lock is rewritten silently.
    std::fs::write(
        dir.join("tool/kit.yaml"),
        MIXIN_V1.replace("        deny: [telemetry.tool.example]\n", ""),
    )
    .unwrap();
    let out = capgate(dir, &["lock", "base", "tool", "--approve"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = capgate(dir, &["lock", "base"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A kit value holding terminal controls (here a decoy volume path in an optional group
/// whose unsupported member makes it skipped at run time, so the kit still works) is shown
/// spelled out: it cannot move the cursor up and erase the real widening printed above it.
/// Its twin, a plain decoy, prints as written.
#[test]
fn the_approval_prompt_shows_kit_text_spelled_out() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("w");
    std::fs::create_dir_all(&dir).unwrap();
    let kit = |decoy: &str, extra: &str| {
        format!(
            r#"schemaVersion: "3"
kind: workload
capabilities:
  - type: com.docker.sandbox/network-policy@2
    config:
      runtime:
        allow: [registry.npmjs.org{extra}]
  - group:
      optional: true
      capabilities:
        - type: com.docker.sandbox/volume@1
          config: {{path: "{decoy}"}}
        - type: com.docker.sandbox/usb-device@1
          config: {{class: "03"}}
"#
        )
    };
    std::fs::write(dir.join("kit.yaml"), kit("/cache", "")).unwrap();
    let out = capgate(tmp.path(), &["lock", "w"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    let hostile = r"/x\r\e[2K\e[1A\e[2K\r  + storage: /home/agent/.cache";
    std::fs::write(dir.join("kit.yaml"), kit(hostile, ", exfil.evil.example")).unwrap();
    let out = capgate(tmp.path(), &["lock", "w"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !shown.bytes().any(|b| b == 0x1b || b == b'\r'),
        "raw controls reached the terminal: {shown:?}"
    );
    assert!(
        shown.contains("+ network.runtime.allow: exfil.evil.example"),
        "{shown}"
    );
    assert!(
        shown.contains(r"/x\u{d}\u{1b}[2K\u{1b}[1A\u{1b}[2K\u{d}  + storage"),
        "{shown}"
    );
    // `capgate resolve` shows the same value the same way.
    let out = capgate(tmp.path(), &["resolve", "w"]);
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !listed.bytes().any(|b| b == 0x1b || b == b'\r'),
        "{listed:?}"
    );

    // The twin: a plain new path prints as it is.
    std::fs::write(dir.join("kit.yaml"), kit("/data", "")).unwrap();
    let out = capgate(tmp.path(), &["lock", "w"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("+ storage: /data"),
        "{}",
        text(&out)
    );
}

/// A determinism tier is a promise the lock keeps: trading `read-only` for a less trusting
/// tier (or dropping it) stops for approval; trading it for a more trusting one does not.
#[test]
fn a_less_trusting_determinism_tier_stops_for_approval() {
    let dir = tempfile::tempdir().unwrap();
    let kit = |tier: Option<&str>| {
        let tier = tier.map_or(String::new(), |t| {
            format!("  - type: dev.capgate/determinism@1\n    config: {{tier: {t}}}\n")
        });
        std::fs::write(dir.path().join("kit.yaml"), format!("{WORKLOAD}{tier}")).unwrap();
    };
    kit(Some("side-effect"));
    let o = capgate(dir.path(), &["lock", "."]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let lock = std::fs::read_to_string(dir.path().join("capgate.lock")).unwrap();
    assert!(lock.contains(r#""determinism": "side-effect""#), "{lock}");

    for (tier, shown) in [
        (Some("unrestricted"), "unrestricted"),
        (None, "unrestricted"),
    ] {
        kit(tier);
        let o = capgate(dir.path(), &["lock", "."]);
        assert_eq!(o.status.code(), Some(4), "{}", text(&o));
        assert!(
            text(&o).contains(&format!(
                "+ determinism: tier `{shown}` (was `side-effect`)"
            )),
            "{}",
            text(&o)
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("capgate.lock")).unwrap(),
            lock,
            "an unapproved widening leaves the lock as it was"
        );
    }
    // Narrowing to read-only goes through without asking.
    kit(Some("read-only"));
    let o = capgate(dir.path(), &["lock", "."]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let lock = std::fs::read_to_string(dir.path().join("capgate.lock")).unwrap();
    assert!(lock.contains(r#""determinism": "read-only""#), "{lock}");
}

/// An egress triple is a grant the lock records: a new triple, or a wider protocol on the
/// same host and port, stops for approval; narrowing `tcp` to `https` does not.
#[test]
fn a_new_or_wider_egress_triple_stops_for_approval() {
    let dir = tempfile::tempdir().unwrap();
    let kit = |triples: &[(&str, u16, &str)]| {
        let mut text = WORKLOAD.to_owned();
        for (host, port, protocol) in triples {
            text.push_str(&format!(
                "  - type: dev.capgate/egress@1\n    config: {{host: {host}, port: {port}, protocol: {protocol}}}\n"
            ));
        }
        std::fs::write(dir.path().join("kit.yaml"), text).unwrap();
    };
    kit(&[("api.example.com", 443, "https")]);
    let o = capgate(dir.path(), &["lock", "."]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    kit(&[("api.example.com", 443, "tcp")]);
    let o = capgate(dir.path(), &["lock", "."]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(
        text(&o).contains("+ egress: api.example.com:443/tcp"),
        "{}",
        text(&o)
    );
    let o = capgate(dir.path(), &["lock", ".", "--approve"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    kit(&[("api.example.com", 443, "https")]);
    let o = capgate(dir.path(), &["lock", "."]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "narrowing asks nothing: {}",
        text(&o)
    );
    kit(&[
        ("api.example.com", 443, "https"),
        ("db.example.com", 5432, "tcp"),
    ]);
    let o = capgate(dir.path(), &["lock", "."]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(
        text(&o).contains("+ egress: db.example.com:5432/tcp"),
        "{}",
        text(&o)
    );
}

/// Lists `capgate lock ARGS --check --json` reports as widenings: (kit, category, detail).
fn widenings_of(dir: &Path, args: &[&str]) -> (Option<i32>, Vec<(String, String, String)>) {
    let mut all = vec!["lock"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--check", "--json"]);
    let out = capgate(dir, &all);
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    (out.status.code(), listed(&report))
}

/// A `--json` report's widenings as (kit, category, detail).
fn listed(report: &serde_json::Value) -> Vec<(String, String, String)> {
    report["widenings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["kit"].as_str().unwrap().to_owned(),
                w["category"].as_str().unwrap().to_owned(),
                w["detail"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

const PACK_WORKLOAD: &str = r#"schemaVersion: "3"
kind: workload
provides: [base]
capabilities:
  - type: dev.capgate/filesystem@1
    config: {write: [/home/agent/workspace/out], read: [/home/agent/workspace/src]}
  - type: dev.capgate/exec@1
    config: {allow: [/usr/bin/python3]}
"#;

/// Write places, read lists and programs bind the composition, not each kit: a mixin that
/// starts stating them (or a new mixin that does) widens what the whole is held to even
/// though no kit's own list widens, and the gate says so. The twin: a mixin stating places
/// inside what was granted changes nothing.
#[test]
fn a_mixin_that_adds_places_or_programs_widens_the_composition() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for k in ["w", "m", "n"] {
        std::fs::create_dir_all(dir.join(k)).unwrap();
    }
    std::fs::write(dir.join("w/kit.yaml"), PACK_WORKLOAD).unwrap();
    let mixin = "schemaVersion: \"3\"\nkind: mixin\nrequires: [base]\ncapabilities:\n  - type: com.docker.sandbox/network-policy@2\n    config: {runtime: {allow: [svc.example.com]}}\n";
    std::fs::write(dir.join("m/kit.yaml"), mixin).unwrap();
    let out = capgate(dir, &["lock", "w", "m"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // The twin: places inside the granted ones, the same read list.
    let inside = format!(
        "{mixin}  - type: dev.capgate/filesystem@1\n    config: {{write: [/home/agent/workspace/out/sub], read: [/home/agent/workspace/src]}}\n  - type: dev.capgate/exec@1\n    config: {{allow: [/usr/bin/python3]}}\n"
    );
    std::fs::write(dir.join("m/kit.yaml"), &inside).unwrap();
    let (code, list) = widenings_of(dir, &["w", "m"]);
    assert_eq!((code, list.clone()), (Some(0), vec![]), "{list:?}");

    // The attack: the mixin states wider places, no read list, more programs.
    let wider = format!(
        "{mixin}  - type: dev.capgate/filesystem@1\n    config: {{write: [/home/agent, /tmp]}}\n  - type: dev.capgate/exec@1\n    config: {{allow: [/bin, /usr/bin]}}\n"
    );
    std::fs::write(dir.join("m/kit.yaml"), &wider).unwrap();
    let (code, list) = widenings_of(dir, &["w", "m"]);
    assert_eq!(code, Some(4), "{list:?}");
    let whole = "(the composition: its kits together)";
    for (category, detail) in [
        ("filesystem.write", "/home/agent"),
        ("filesystem.write", "/tmp"),
        ("filesystem.read", "the whole workspace (no list)"),
        ("exec.allow", "/bin"),
        ("exec.allow", "/usr/bin"),
    ] {
        assert!(
            list.contains(&(whole.to_owned(), category.to_owned(), detail.to_owned())),
            "{category} {detail}: {list:?}"
        );
    }
    // The same from a new mixin.
    std::fs::write(dir.join("m/kit.yaml"), mixin).unwrap();
    std::fs::write(
        dir.join("n/kit.yaml"),
        "schemaVersion: \"3\"\nkind: mixin\nrequires: [base]\ncapabilities:\n  - type: dev.capgate/exec@1\n    config: {allow: [/bin]}\n",
    )
    .unwrap();
    let (code, list) = widenings_of(dir, &["w", "m", "n"]);
    assert_eq!(code, Some(4), "{list:?}");
    assert!(
        list.contains(&(whole.to_owned(), "exec.allow".to_owned(), "/bin".to_owned())),
        "{list:?}"
    );
}

/// A second filesystem@1 entry that states no `read` (allowed in a group: one entry per
/// type holds per list) shows the workload the whole workspace, as composition merges the
/// two; the gate counts it so. Found by a red-team pass: the lock kept the first entry's
/// read list and passed the update. The twin, a second entry with the same read list, is
/// no widening.
#[test]
fn a_second_filesystem_entry_without_a_read_list_is_a_widening() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("w")).unwrap();
    std::fs::write(dir.join("w/kit.yaml"), PACK_WORKLOAD).unwrap();
    let out = capgate(dir, &["lock", "w"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let second = |config: &str| {
        format!(
            "{PACK_WORKLOAD}  - group:\n      capabilities:\n        - type: dev.capgate/filesystem@1\n          config: {config}\n"
        )
    };
    std::fs::write(
        dir.join("w/kit.yaml"),
        second("{write: [/home/agent/workspace/out], read: [/home/agent/workspace/src]}"),
    )
    .unwrap();
    let (code, list) = widenings_of(dir, &["w"]);
    assert_eq!((code, list.clone()), (Some(0), vec![]), "{list:?}");
    std::fs::write(
        dir.join("w/kit.yaml"),
        second("{write: [/home/agent/workspace/out]}"),
    )
    .unwrap();
    let (code, list) = widenings_of(dir, &["w"]);
    assert_eq!(code, Some(4), "{list:?}");
    assert!(
        list.iter()
            .any(|(_, category, detail)| category == "filesystem.read"
                && detail == "the whole workspace (no list)"),
        "{list:?}"
    );
}

/// Restrictions moved into an optional group this runtime skips are no longer enforced
/// (the tier, the write places, the read list, the programs): the gate compares the ones
/// in force, so it stops the update.
#[test]
fn restrictions_moved_into_a_skipped_optional_group_are_widenings() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("w")).unwrap();
    let restrictions = r#"  - type: dev.capgate/determinism@1
    config: {tier: read-only}
  - type: dev.capgate/filesystem@1
    config: {write: [/home/agent/workspace/out], read: [/home/agent/workspace/src]}
  - type: dev.capgate/exec@1
    config: {allow: [/usr/bin/python3]}
"#;
    let head = "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@2\n    config: {runtime: {allow: [svc.example.com]}}\n";
    let v1 = format!("{head}{restrictions}  - type: com.example/telemetry@1\n    optional: true\n");
    std::fs::write(dir.join("w/kit.yaml"), &v1).unwrap();
    let out = capgate(dir, &["lock", "w"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let grouped = restrictions
        .lines()
        .map(|l| format!("      {l}"))
        .collect::<Vec<_>>()
        .join("\n");
    let v2 = format!(
        "{head}  - group:\n      optional: true\n      capabilities:\n{grouped}\n        - type: com.example/telemetry@1\n"
    );
    std::fs::write(dir.join("w/kit.yaml"), &v2).unwrap();
    let (code, list) = widenings_of(dir, &["w"]);
    assert_eq!(code, Some(4), "{list:?}");
    let categories: Vec<&str> = list.iter().map(|(_, c, _)| c.as_str()).collect();
    for category in [
        "determinism",
        "filesystem.write",
        "filesystem.read",
        "exec.allow",
    ] {
        assert!(categories.contains(&category), "{category}: {list:?}");
    }
}

/// Which kit is the workload decides where the default lock is: a composition whose kits
/// swap kinds would find no lock at the new place, and a first run writes one without
/// asking. With a lock beside another of its kits, that is a widening of everything
/// instead, and the run stops for approval; the twin, a composition with no lock
/// anywhere, is a first run and writes one.
#[test]
fn a_lock_beside_another_kit_is_not_silently_replaced_by_a_new_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for k in ["agent", "tools"] {
        std::fs::create_dir_all(dir.join(k)).unwrap();
    }
    let kit = |kind: &str, allow: &str| {
        format!(
            "schemaVersion: \"3\"\nkind: {kind}\ncapabilities:\n  - type: com.docker.sandbox/network-policy@2\n    config: {{runtime: {{allow: [{allow}]}}}}\n"
        )
    };
    std::fs::write(
        dir.join("agent/kit.yaml"),
        kit("workload", "svc.example.com"),
    )
    .unwrap();
    std::fs::write(dir.join("tools/kit.yaml"), kit("mixin", "svc.example.com")).unwrap();
    let out = capgate(dir, &["lock", "agent", "tools"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(dir.join("agent/capgate.lock").exists());

    std::fs::write(dir.join("agent/kit.yaml"), kit("mixin", "\"**\"")).unwrap();
    std::fs::write(
        dir.join("tools/kit.yaml"),
        kit("workload", "svc.example.com"),
    )
    .unwrap();
    let out = capgate(dir, &["lock", "agent", "tools"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert!(!dir.join("tools/capgate.lock").exists(), "{said}");
    assert!(said.contains("agent/capgate.lock"), "{said}");
    assert!(said.contains("+ network.runtime.allow: **"), "{said}");

    // The old lock removed: what this user approved there still holds the swap.
    std::fs::remove_file(dir.join("agent/capgate.lock")).unwrap();
    let out = capgate(dir, &["lock", "agent", "tools"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    // Nor does a lock shipped beside the new workload (its publisher wrote it with a data
    // directory of their own) approve it.
    let shipped = tempfile::tempdir().unwrap();
    let o = Command::new(BIN)
        .args(["lock", "agent", "tools"])
        .current_dir(dir)
        .env("CAPGATE_HOME", shipped.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(dir.join("tools/capgate.lock").exists());
    let out = capgate(dir, &["lock", "agent", "tools"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("+ network.runtime.allow: **"),
        "{}",
        text(&out)
    );

    // The twin: nothing locked, nothing approved anywhere yet (a fresh data directory).
    std::fs::remove_file(dir.join("tools/capgate.lock")).unwrap();
    std::fs::remove_dir_all(dir.join(".capgate")).unwrap();
    let out = capgate(dir, &["lock", "agent", "tools"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(dir.join("tools/capgate.lock").exists());
}

/// A new kit directory inside a folder whose own kit was approved is a first use, however
/// it is spelled: its parent's lock belongs to another composition.
#[test]
fn a_new_kit_beside_an_approved_one_is_a_first_use() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let workload = "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@1\n    config: {runtime: {allow: [api.example.com]}}\n";
    std::fs::write(dir.join("kit.yaml"), workload).unwrap();
    write_kit(dir, "tools", workload);
    let out = capgate(dir, &["lock", "."]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = capgate(dir, &["lock", "tools"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(dir.join("tools/capgate.lock").exists());
    // The same composition from inside, as `.`: approved already.
    let out = Command::new(BIN)
        .args(["lock", "--check", "."])
        .current_dir(dir.join("tools"))
        .env("CAPGATE_HOME", dir.join(".capgate"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A kit directory that becomes a descriptor file of the same name moves the default lock
/// (into the directory beside it): what the user approved at the old place holds it, and
/// the update stops for approval; its twin, the same file with nothing approved before,
/// is a first run.
#[test]
fn a_kit_directory_turned_file_does_not_escape_its_approval() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_kit(
        dir,
        "w",
        "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@1\n    config: {runtime: {allow: [api.example.com], deny: [t.example.com]}}\n",
    );
    let out = capgate(dir, &["lock", "w"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    std::fs::remove_dir_all(dir.join("w")).unwrap();
    std::fs::write(
        dir.join("w"),
        "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@1\n    config: {runtime: {allow: [\"**\"]}}\n",
    )
    .unwrap();
    let out = capgate(dir, &["lock", "w"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert!(said.contains("+ network.runtime.allow: **"), "{said}");
    assert!(!dir.join("capgate.lock").exists(), "{said}");
    // The twin: a fresh data directory, nothing approved before.
    std::fs::remove_dir_all(dir.join(".capgate")).unwrap();
    let out = capgate(dir, &["lock", "w"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(dir.join("capgate.lock").exists());
}

/// The lock sits in the kit's directory, which a third party may ship: a FIFO or a device
/// in its place is refused at once (not waited on, not read), like any lock capgate
/// cannot use; the twin, a regular lock, gates as ever.
#[test]
fn a_lock_that_is_no_regular_file_is_refused_without_reading_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_kit(dir, "w", "schemaVersion: \"3\"\nkind: workload\n");
    let lock = dir.join("w/capgate.lock");
    std::os::unix::fs::symlink("/dev/zero", &lock).unwrap();
    let bounded = |args: &[&str]| {
        Command::new("timeout")
            .arg("20")
            .arg(BIN)
            .args(args)
            .current_dir(dir)
            .env("CAPGATE_HOME", dir.join(".capgate"))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = bounded(&["lock", "w"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("not a regular file"), "{}", text(&out));
    std::fs::remove_file(&lock).unwrap();
    let made = Command::new("mkfifo").arg(&lock).status().unwrap();
    assert!(made.success());
    let out = bounded(&["lock", "w"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("not a regular file"), "{}", text(&out));
    std::fs::remove_file(&lock).unwrap();
    let out = bounded(&["lock", "w"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = bounded(&["lock", "w", "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// Kit text reaches the terminal spelled out, wherever it is printed: a path that would
/// redraw the screen is refused by validation (and named without its escapes), a host
/// the policy refuses is named so in the error, a lock's unknown key in the lock's
/// error, and a kit file's name in validation's findings. No raw ESC byte is printed.
#[test]
fn hostile_kit_text_never_reaches_the_terminal_raw() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let no_escape = |out: &Output| {
        let all = [&out.stdout[..], &out.stderr[..]].concat();
        assert!(!all.contains(&0x1b), "{}", text(out));
        assert!(text(out).contains("\\u{1b}"), "{}", text(out));
    };
    write_kit(
        dir,
        "paths",
        "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: dev.capgate/filesystem@1\n    config:\n      write: [\"/tmp\\r\\e[4A\\e[J\\nNo grants\"]\n",
    );
    let out = capgate(dir, &["validate", "paths"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    no_escape(&out);

    write_kit(
        dir,
        "host",
        "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@2\n    config: {runtime: {allow: [\"a\\e[31mb.example.com\"]}}\n",
    );
    let out = Command::new(BIN)
        .args(["create", "h", "--kit", "host"])
        .current_dir(dir)
        .env("CAPGATE_HOME", dir.join(".capgate"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    no_escape(&out);

    write_kit(dir, "locked", "schemaVersion: \"3\"\nkind: workload\n");
    std::fs::write(
        dir.join("locked/capgate.lock"),
        "{\"version\": 1, \"kits\": [], \"\\u001b[2K\\rlock OK\": 1}",
    )
    .unwrap();
    let out = capgate(dir, &["lock", "locked"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    no_escape(&out);

    std::fs::create_dir_all(dir.join("named")).unwrap();
    std::fs::write(
        dir.join("named/x\u{1b}[2K\rall kits OK.yaml"),
        "schemaVersion: \"3\"\nkind: workload\nbogus: 1\n",
    )
    .unwrap();
    let out = capgate(dir, &["validate", "named"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    no_escape(&out);
    // --json output: the same value, with C1 controls and bidirectional overrides (which
    // JSON writers leave as they are) escaped.
    write_kit(
        dir,
        "described",
        "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/port@1\n    config: {container: 8000, name: \"ok\\x9b2J\\u202eevil\"}\n",
    );
    let out = capgate(dir, &["resolve", "described", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let json = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(
        !json.contains('\u{9b}') && !json.contains('\u{202e}'),
        "{json}"
    );
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        value["descriptor"]["capabilities"][0]["config"]["name"], "ok\u{9b}2J\u{202e}evil",
        "{json}"
    );
    // The same name on a valid kit, named in an arg problem found after reading it.
    std::fs::create_dir_all(dir.join("shipped")).unwrap();
    std::fs::write(
        dir.join("shipped/x\u{1b}]0;PWNED\u{7}\u{1b}[2J.yaml"),
        "schemaVersion: \"3\"\nkind: workload\nargs:\n  version: {pattern: '[0-9]+'}\n",
    )
    .unwrap();
    let out = capgate(dir, &["resolve", "shipped", "--arg", "version=x"]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    no_escape(&out);
}

/// The lock lies beside the kits, where whoever ships them can replace it: an update that
/// brings a kit and a lock approving it is still held to what this user approved, and
/// stops for approval; so is one that removes the lock. The twin: a lock the user
/// approves with capgate is taken as it is.
#[test]
fn a_lock_replaced_with_the_kits_is_held_to_what_the_user_approved() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for k in ["upd", "atk"] {
        std::fs::create_dir_all(dir.join(k)).unwrap();
    }
    let kit = |allow: &str| {
        format!(
            "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@2\n    config: {{runtime: {{allow: [{allow}]}}}}\n"
        )
    };
    std::fs::write(dir.join("upd/kit.yaml"), kit("svc.example.com")).unwrap();
    let out = capgate(dir, &["lock", "upd"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // The attacker's update, with a lock approving it made elsewhere (by capgate, with
    // another data directory), both copied over the user's.
    std::fs::write(dir.join("atk/kit.yaml"), kit("\"**\"")).unwrap();
    let made = Command::new(BIN)
        .args(["lock", "atk", "--approve"])
        .current_dir(dir)
        .env("CAPGATE_HOME", dir.join(".attacker"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(made.status.code(), Some(0), "{}", text(&made));
    for f in ["kit.yaml", "capgate.lock"] {
        std::fs::copy(dir.join("atk").join(f), dir.join("upd").join(f)).unwrap();
    }
    let out = capgate(dir, &["lock", "upd"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert!(said.contains("is not the lock you last approved"), "{said}");
    assert!(said.contains("+ network.runtime.allow: **"), "{said}");
    // Removed: the same.
    std::fs::remove_file(dir.join("upd/capgate.lock")).unwrap();
    let out = capgate(dir, &["lock", "upd"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(!dir.join("upd/capgate.lock").exists());
    // The kit directory replaced by a link to one holding both files (a new path once
    // resolved): held to the same approval.
    std::fs::rename(dir.join("upd"), dir.join("upd.old")).unwrap();
    std::fs::create_dir_all(dir.join("upd.v2")).unwrap();
    for f in ["kit.yaml", "capgate.lock"] {
        std::fs::copy(dir.join("atk").join(f), dir.join("upd.v2").join(f)).unwrap();
    }
    std::os::unix::fs::symlink("upd.v2", dir.join("upd")).unwrap();
    let out = capgate(dir, &["lock", "upd"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    std::fs::remove_file(dir.join("upd")).unwrap();
    std::fs::remove_dir_all(dir.join("upd.v2")).unwrap();
    std::fs::rename(dir.join("upd.old"), dir.join("upd")).unwrap();
    // The twin: approved with capgate, the new lock is the user's, and quiet after.
    let out = capgate(dir, &["lock", "upd", "--approve"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = capgate(dir, &["lock", "upd", "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A kit that lists thousands of places is gated (places are looked up, not scanned, so
/// this takes a moment, not minutes), and the prompt shows 20 per category and counts the
/// rest, so a widening of another category stays on the screen.
#[test]
fn thousands_of_widenings_are_gated_fast_and_counted_in_the_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("w")).unwrap();
    let kit = |prefix: &str, extra: &str| {
        let places: Vec<String> = (0..20_000).map(|i| format!("/t/{prefix}{i}")).collect();
        format!(
            "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: dev.capgate/filesystem@1\n    config: {{write: [{}]}}\n{extra}",
            places.join(", ")
        )
    };
    std::fs::write(dir.join("w/kit.yaml"), kit("a", "")).unwrap();
    let out = capgate(dir, &["lock", "w"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    std::fs::write(
        dir.join("w/kit.yaml"),
        kit(
            "b",
            "  - type: com.docker.sandbox/network-policy@2\n    config: {runtime: {allow: [evil.example.com]}}\n",
        ),
    )
    .unwrap();
    let out = capgate(dir, &["lock", "w"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert_eq!(
        said.matches("+ filesystem.write: /t/b").count(),
        20,
        "{said}"
    );
    assert!(
        said.contains("+ filesystem.write: … and 19980 more (capgate lock --json lists them all)"),
        "{said}"
    );
    assert!(
        said.contains("+ network.runtime.allow: evil.example.com"),
        "{said}"
    );
}

/// The lock keeps references relative to itself, but `create` and `ls` name where each kit
/// lies: `.` and `../tool` would say nothing to the reader.
#[test]
fn create_and_ls_name_the_kits_by_where_they_lie() {
    let tmp = setup();
    let dir = tmp.path();
    let out = capgate(
        dir,
        &["create", "box", "--kit", "base", "--kit", "tool", "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let real = std::fs::canonicalize(dir).unwrap();
    let expected = [
        real.join("base").display().to_string(),
        real.join("tool").display().to_string(),
    ];
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(created["kits"], serde_json::json!(expected), "{created}");
    let out = capgate(dir, &["ls", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        listed["sandboxes"][0]["kits"],
        serde_json::json!(expected),
        "{listed}"
    );
    let lock = std::fs::read_to_string(dir.join("base/capgate.lock")).unwrap();
    assert!(lock.contains("\"reference\": \"../tool\""), "{lock}");
}
