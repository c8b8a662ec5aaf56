//! `capgate lint`: coherence checks beyond validity, driven through the real binary.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_capgate");
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn capgate(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(ROOT)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A pack in the manner of seed 002: read-only, yet it posts to Slack and reaches any host.
const PACK: &str = "schemaVersion: \"3\"
kind: workload
capabilities:
  - type: dev.capgate/determinism@1
    config: {tier: read-only}
  - type: com.docker.sandbox/network-policy@2
    config:
      runtime:
        allow:
          - api.example.com
          - {hosts: [hooks.slack.com], methods: [POST]}
          - \"*.example.org\"
";

fn pack(dir: &Path, text: &str) -> String {
    let p = dir.join("pack.yaml");
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn findings_name_file_line_check_and_fail_only_on_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = pack(dir.path(), PACK);
    let out = capgate(&["lint", &file]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "{file}:11:13: error[tier-mismatch]: capabilities[1].config.runtime.allow[1]: a read-only workload may only read, so POST to `hooks.slack.com` is refused at run time"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("{file}:12:13: warning[wildcard-host]:")),
        "{text}"
    );
    assert!(text.ends_with("1 error · 1 warning\n"), "{text}");

    // Its harmless twin: the same grants under the side-effect tier pass (the wildcard
    // stays a warning), and fail again under --strict.
    let file = pack(dir.path(), &PACK.replace("read-only", "side-effect"));
    let out = capgate(&["lint", &file]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).ends_with("0 errors · 1 warning\n"));
    let out = capgate(&["lint", "--strict", &file]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("error[wildcard-host]"));
}

#[test]
fn json_lists_every_finding_with_its_check() {
    let dir = tempfile::tempdir().unwrap();
    let file = pack(dir.path(), PACK);
    let out = capgate(&["lint", "--json", "--strict", &file]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["strict"], true);
    assert_eq!(v["errors"], 2);
    let checks: Vec<(&str, &str, u64)> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["check"].as_str().unwrap(),
                f["severity"].as_str().unwrap(),
                f["line"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        checks,
        [
            ("tier-mismatch", "error", 11),
            ("wildcard-host", "error", 12)
        ]
    );
}

#[test]
fn an_invalid_kit_reports_its_problems_not_lint_findings() {
    let dir = tempfile::tempdir().unwrap();
    let file = pack(dir.path(), &PACK.replace("read-only", "readonly"));
    let out = capgate(&["lint", &file]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "{file}:5:20: error[invalid]: capabilities[0].config.tier: tier `readonly` is not one of"
        )),
        "{text}"
    );
    assert!(!text.contains("wildcard-host"), "{text}");
    let out = capgate(&["lint", "no/such/kit"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("error[invalid]"));
}

/// Every bundled example lints without an error, and so does every published kit of the
/// corpus but for one thing: the copy holds only the descriptors, so each `contentFile`
/// (agent-context@1) it declares is named as missing, and nothing else is an error. The
/// corpus's wildcard hosts are named as warnings.
#[test]
fn the_corpus_and_the_examples_lint_clean_but_for_the_context_files_the_copy_lacks() {
    let corpus = "crates/spec/tests/corpus/sandbox-kit-spec/examples";
    let kits = |base: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(Path::new(ROOT).join(base))
            .unwrap()
            .map(|d| format!("{base}/{}", d.unwrap().file_name().to_string_lossy()))
            .collect();
        v.sort();
        v
    };
    let examples = kits("examples/kits");
    let out = capgate(
        &std::iter::once("lint")
            .chain(examples.iter().map(String::as_str))
            .collect::<Vec<_>>(),
    );
    let text = stdout(&out);
    assert!(examples.len() >= 5, "{examples:?}");
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains("error["), "{text}");

    let published = kits(corpus);
    assert!(published.len() >= 20, "{published:?}");
    let out = capgate(
        &std::iter::once("lint")
            .chain(published.iter().map(String::as_str))
            .collect::<Vec<_>>(),
    );
    let text = stdout(&out);
    assert!(text.contains("warning[wildcard-host]"), "{text}");
    let mut declared = 0;
    for kit in &published {
        let name = kit.rsplit('/').next().unwrap();
        let yaml = std::fs::read_to_string(Path::new(ROOT).join(kit).join(format!("{name}.yaml")))
            .unwrap();
        let Some(line) = yaml
            .lines()
            .find(|l| l.trim_start().starts_with("contentFile:"))
        else {
            continue;
        };
        declared += 1;
        let file = line.trim_start().trim_start_matches("contentFile:").trim();
        assert!(
            !Path::new(ROOT).join(kit).join(file).exists(),
            "{kit}/{file}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("{kit}/{name}.yaml:"))
                    && l.contains("error[content-file]")
                    && l.contains(&format!("`contentFile: {file}`"))
                    && l.contains("No such file")),
            "{kit}: {text}"
        );
    }
    let errors = text.lines().filter(|l| l.contains("error[")).count();
    assert!(declared >= 10, "{declared}");
    assert_eq!(errors, declared, "{text}");
    assert!(
        text.lines()
            .filter(|l| l.contains("error["))
            .all(|l| l.contains("error[content-file]")),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
}

/// A host the gateway cannot judge is named with its line, where `create` would only fail.
#[test]
fn a_host_the_gateway_cannot_judge_is_an_error_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = pack(
        dir.path(),
        "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@2\n    config:\n      runtime:\n        allow: [api.example.com, \"foo..com\"]\n",
    );
    // validate accepts it (the kit spec asks only for a non-empty host)…
    let out = capgate(&["validate", &file]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    // …lint names it.
    let out = capgate(&["lint", &file]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "{file}:7:34: error[invalid-host]: capabilities[0].config.runtime.allow[1]: `foo..com` is not a valid host name: it has an empty label; the gateway cannot judge it"
        )),
        "{text}"
    );
}

/// The example pack lints clean under --strict, and `resolve` shows its pack grants: the
/// egress triple, the write places, the tier and what the tier holds it to.
#[test]
fn the_example_pack_is_clean_and_resolve_shows_its_pack_grants() {
    let out = capgate(&["lint", "--strict", "examples/kits/reader"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let out = capgate(&["resolve", "examples/kits/reader"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for line in [
        "Egress (runtime):",
        "allow        pypi.org:443/https",
        "Writes only beneath: /home/agent/workspace/summaries, /tmp",
        "Determinism: read-only",
        "only GET, HEAD and OPTIONS requests without a body leave",
    ] {
        assert!(text.contains(line), "`{line}` missing:\n{text}");
    }
}

/// A host written in another script can pass for a familiar one: lint names its DNS form
/// (a warning, an error under --strict), and the approval prompt shows it beside the
/// widening. The twin: the same host in ASCII says nothing.
#[test]
fn a_host_in_another_script_is_named_with_its_dns_form() {
    let dir = tempfile::tempdir().unwrap();
    let kit = |host: &str| {
        format!(
            "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@2\n    config: {{runtime: {{allow: [\"{host}\"]}}}}\n"
        )
    };
    // `і` is CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I.
    let file = pack(dir.path(), &kit("api.g\u{456}thub.com:443"));
    let out = capgate(&["lint", &file]);
    let said = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("warning[non-ascii-host]")
            && said.contains("`api.xn--gthub-n2e.com:443` in DNS"),
        "{said}"
    );
    let out = capgate(&["lint", "--strict", &file]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let file = pack(dir.path(), &kit("api.github.com:443"));
    let out = capgate(&["lint", "--strict", &file]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(!stdout(&out).contains("non-ascii-host"));

    // The approval prompt.
    let work = dir.path().join("w");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("kit.yaml"), kit("api.github.com:443")).unwrap();
    let lock = |approve: bool| {
        let mut c = Command::new(BIN);
        c.args(["lock", "w"])
            .current_dir(dir.path())
            .env("CAPGATE_HOME", dir.path().join(".capgate"))
            .stdin(std::process::Stdio::null());
        if approve {
            c.arg("--approve");
        }
        c.output().unwrap()
    };
    assert_eq!(lock(false).status.code(), Some(0));
    std::fs::write(work.join("kit.yaml"), kit("api.g\u{456}thub.com:443")).unwrap();
    let out = lock(false);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert!(
        said.contains(
            "+ network.runtime.allow: api.g\u{456}thub.com:443 (in DNS: api.xn--gthub-n2e.com:443)"
        ),
        "{said}"
    );
}

/// An exec list entry that lets every system program run is named (a warning, an error
/// under `--strict`), one the run would refuse is an error, and so is an inject domain the
/// broker cannot use; the twin, the pack's own interpreter, passes even under `--strict`.
#[test]
fn exec_lists_and_inject_domains_are_named_with_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let text = "schemaVersion: \"3\"
kind: workload
capabilities:
  - type: dev.capgate/exec@1
    config:
      allow: [/usr/bin/python3, /usr/bin, /home/agent/bin/tool]
  - type: com.docker.sandbox/network-policy@1
    config: {runtime: {allow: [api.example.com]}}
  - type: com.docker.sandbox/credential@1
    config: {service: gh, phase: runtime, apiKey: {inject: [{domain: \"api.example.com:https\"}]}}
";
    let file = pack(dir.path(), text);
    let out = capgate(&["lint", &file]);
    let said = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "{file}:6:33: warning[broad-exec]: capabilities[0].config.allow[1]: `/usr/bin` lets every program"
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "{file}:6:43: error[exec-in-writable-place]: capabilities[0].config.allow[2]:"
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "{file}:10:70: error[unusable-inject-domain]: capabilities[2].config.apiKey.inject[0].domain: `api.example.com:https`: `https` is not a port"
        )),
        "{said}"
    );
    let out = capgate(&["lint", "--strict", &file]);
    assert!(
        stdout(&out).ends_with("3 errors · 0 warnings\n"),
        "{}",
        stdout(&out)
    );
    let file = pack(
        dir.path(),
        &text
            .replace(", /usr/bin, /home/agent/bin/tool", "")
            .replace("api.example.com:https", "api.example.com:443"),
    );
    let out = capgate(&["lint", "--strict", &file]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}
