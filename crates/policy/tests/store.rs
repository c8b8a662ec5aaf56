#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]
//! The policy store on a real SQLite file.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use capgate_policy::presets::Preset;
use capgate_policy::store::{
    NewRule, NotEditableReason, RuleFilter, RuleProblem, SandboxGrants, SandboxRecord,
    SandboxState, StoreError,
};
use capgate_policy::{CreatedVia, Decision, Method, Phase, Protocol, Rule, Scope, Source, Store};
use tempfile::TempDir;

fn store() -> (TempDir, PathBuf, Store) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("home/policy.db");
    let store = Store::open(&path).unwrap();
    (dir, path, store)
}

fn user(host: &str, decision: Decision) -> NewRule {
    NewRule::user(
        format!("local:{host}"),
        Scope::Global,
        decision,
        vec![host.to_owned()],
        Protocol::Tcp,
    )
}

fn user_in(sandbox: &str, host: &str) -> NewRule {
    NewRule::user(
        format!("local:{sandbox}:{host}"),
        Scope::Sandbox(sandbox.to_owned()),
        Decision::Allow,
        vec![host.to_owned()],
        Protocol::Tcp,
    )
}

fn kit(sandbox: &str, hosts: &[&str]) -> NewRule {
    NewRule::provisioned(
        format!("kit:{sandbox}"),
        sandbox,
        Decision::Allow,
        hosts.iter().map(|h| (*h).to_owned()).collect(),
        Protocol::Tcp,
    )
}

fn sandbox(store: &mut Store, name: &str) {
    let record = SandboxRecord::new(
        name,
        vec!["./agent".into()],
        SandboxGrants::LockDigest("sha256:00".into()),
    );
    store.create_sandbox(record).unwrap();
}

fn names(rules: &[Rule]) -> Vec<&str> {
    rules.iter().map(|r| r.name.as_str()).collect()
}

fn resources(rules: &[Rule]) -> Vec<&str> {
    rules
        .iter()
        .flat_map(|r| r.resources.iter().map(String::as_str))
        .collect()
}

#[test]
fn added_rules_come_back_whole_in_creation_order() {
    let (_dir, path, mut store) = store();
    let mut bounded = user("api.github.com", Decision::Allow);
    bounded.methods = Some(vec![Method::Get, Method::Head]);
    bounded.paths = Some(vec!["/repos/**".into()]);
    bounded.phase = Some(Phase::Install);
    bounded.protocol = Protocol::Any;
    let first = store.add_rule(bounded).unwrap();
    let second = store.add_rule(user("example.com", Decision::Deny)).unwrap();

    assert!(
        first.id.starts_with("r-") && first.id.len() == 14,
        "{}",
        first.id
    );
    assert!(
        first.id[2..]
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    assert_ne!(first.id, second.id);
    assert!(first.created_at.ends_with('Z'));

    // Read back through a fresh connection: everything was committed and decodes the same.
    drop(store);
    let store = Store::open(&path).unwrap();
    let rules = store.rules(&RuleFilter::default()).unwrap();
    assert_eq!(rules, vec![first.clone(), second]);
    assert_eq!(store.rule(&first.id).unwrap(), Some(first));
    assert_eq!(store.rule("r-000000000000").unwrap(), None);
}

#[test]
fn filters_select_scope_source_and_decision() {
    let (_dir, _path, mut store) = store();
    sandbox(&mut store, "a");
    sandbox(&mut store, "b");
    store.add_rule(user("global.com", Decision::Allow)).unwrap();
    store.add_rule(user("denied.com", Decision::Deny)).unwrap();
    store.add_rule(user_in("a", "a-only.com")).unwrap();
    store.add_rule(user_in("b", "b-only.com")).unwrap();
    store
        .replace_provisioned("a", vec![kit("a", &["kit-a.com"])])
        .unwrap();
    store.apply_preset(Preset::AllowAll).unwrap();

    let all = store.rules(&RuleFilter::default()).unwrap();
    assert_eq!(all.len(), 6);

    let for_a = store
        .rules(&RuleFilter {
            sandbox: Some("a".into()),
            ..RuleFilter::default()
        })
        .unwrap();
    assert_eq!(
        resources(&for_a),
        ["global.com", "denied.com", "a-only.com", "kit-a.com", "**"]
    );

    let kit_rules = store
        .rules(&RuleFilter {
            source: Some(Source::Kit),
            ..RuleFilter::default()
        })
        .unwrap();
    assert_eq!(names(&kit_rules), ["kit:a"]);

    let denies = store
        .rules(&RuleFilter {
            decision: Some(Decision::Deny),
            ..RuleFilter::default()
        })
        .unwrap();
    assert_eq!(resources(&denies), ["denied.com"]);

    let b_users = store
        .rules(&RuleFilter {
            sandbox: Some("b".into()),
            source: Some(Source::User),
            decision: Some(Decision::Allow),
        })
        .unwrap();
    assert_eq!(resources(&b_users), ["global.com", "b-only.com"]);

    // A sandbox whose name extends another's sees nothing of the other's rules.
    sandbox(&mut store, "ab");
    store
        .replace_provisioned("ab", vec![kit("ab", &["kit-ab.com"])])
        .unwrap();
    let a_kit = store.rules(&RuleFilter {
        sandbox: Some("a".into()),
        source: Some(Source::Kit),
        ..Default::default()
    });
    assert_eq!(resources(&a_kit.unwrap()), ["kit-a.com"]);
}

#[test]
fn user_rules_are_removed_by_id_and_by_resource() {
    let (_dir, _path, mut store) = store();
    let a = store.add_rule(user("a.com", Decision::Allow)).unwrap();
    let b = store.add_rule(user("b.com", Decision::Allow)).unwrap();
    let b_in_x = store.add_rule(user_in("x", "b.com")).unwrap();

    // The scope must match when one is given.
    let err = store
        .remove_rule_by_id(&a.id, Some(&Scope::Sandbox("x".into())))
        .unwrap_err();
    assert!(matches!(err, StoreError::NoSuchRule { .. }));
    assert_eq!(
        err.to_string(),
        format!("no rule `{}` in scope `sandbox:x`", a.id)
    );
    assert_eq!(
        store
            .remove_rule_by_id(&a.id, Some(&Scope::Global))
            .unwrap(),
        a
    );
    assert!(matches!(
        store.remove_rule_by_id(&a.id, None),
        Err(StoreError::NoSuchRule { .. })
    ));

    // By resource, in one scope, then in every scope.
    assert_eq!(
        store
            .remove_rules_by_resource("b.com", Some(&Scope::Global))
            .unwrap(),
        vec![b]
    );
    assert_eq!(
        store.rules(&RuleFilter::default()).unwrap(),
        vec![b_in_x.clone()]
    );
    assert!(
        store
            .remove_rules_by_resource("nothing.com", None)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.remove_rules_by_resource("b.com", None).unwrap(),
        vec![b_in_x]
    );
    assert!(store.rules(&RuleFilter::default()).unwrap().is_empty());
}

#[test]
fn provisioned_and_preset_rules_cannot_be_removed_by_hand() {
    let (_dir, _path, mut store) = store();
    sandbox(&mut store, "dev");
    let provisioned = store
        .replace_provisioned("dev", vec![kit("dev", &["pkg.example.com"])])
        .unwrap();
    let kit_rule = &provisioned[0];
    assert_eq!(
        (kit_rule.editable, kit_rule.created_via),
        (false, CreatedVia::Provisioned)
    );
    let mine = store.add_rule(user_in("dev", "pkg.example.com")).unwrap();

    let err = store.remove_rule_by_id(&kit_rule.id, None).unwrap_err();
    match &err {
        StoreError::NotEditable { id, name, reason } => {
            assert_eq!(id, &kit_rule.id);
            assert_eq!(name, "kit:dev");
            assert_eq!(
                reason,
                &NotEditableReason::Provisioned {
                    sandbox: "dev".into()
                }
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!(
            "rule `{}` (`kit:dev`) cannot be changed: provisioned from kit for sandbox `dev`; \
             remove the sandbox or change its kits",
            kit_rule.id
        )
    );

    // By resource: all or nothing, so the user's own rule stays too.
    let err = store
        .remove_rules_by_resource("pkg.example.com", None)
        .unwrap_err();
    assert!(matches!(err, StoreError::NotEditable { .. }), "{err}");
    assert_eq!(
        store.rules(&RuleFilter::default()).unwrap(),
        vec![kit_rule.clone(), mine.clone()]
    );
    // Narrowed to what the user may remove, it works.
    let removed = store
        .remove_rule_by_id(&mine.id, Some(&Scope::Sandbox("dev".into())))
        .unwrap();
    assert_eq!(removed, mine);

    let preset = store.apply_preset(Preset::Balanced).unwrap();
    let err = store.remove_rule_by_id(&preset[0].id, None).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NotEditable {
                reason: NotEditableReason::Preset,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("part of the preset"), "{err}");
    let err = store
        .remove_rules_by_resource("api.anthropic.com:443", Some(&Scope::Global))
        .unwrap_err();
    assert!(matches!(err, StoreError::NotEditable { .. }), "{err}");
}

#[test]
fn inconsistent_rules_are_refused() {
    let (_dir, _path, mut store) = store();
    let mut editable_kit = kit("dev", &["a.com"]);
    editable_kit.editable = true;
    let err = store.add_rule(editable_kit).unwrap_err();
    assert!(matches!(
        err,
        StoreError::InvalidRule {
            problem: RuleProblem::ProvisionedEditable,
            ..
        }
    ));

    let mut mixed = user("a.com", Decision::Allow);
    mixed.source = Source::Kit;
    assert!(matches!(
        store.add_rule(mixed),
        Err(StoreError::InvalidRule { .. })
    ));
    let mut empty = user("a.com", Decision::Allow);
    empty.resources.clear();
    assert!(matches!(
        store.add_rule(empty),
        Err(StoreError::InvalidRule {
            problem: RuleProblem::NoResources,
            ..
        })
    ));
    let mut no_methods = user("a.com", Decision::Allow);
    no_methods.methods = Some(vec![]);
    assert!(store.add_rule(no_methods).is_err());

    // replace_provisioned takes only the sandbox's own provisioned rules, and a known sandbox.
    sandbox(&mut store, "dev");
    let err = store
        .replace_provisioned("dev", vec![kit("other", &["a.com"])])
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::InvalidRule {
                problem: RuleProblem::OtherScope { .. },
                ..
            }
        ),
        "{err}"
    );
    let err = store
        .replace_provisioned("dev", vec![user_in("dev", "a.com")])
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::InvalidRule {
                problem: RuleProblem::NotProvisioned,
                ..
            }
        ),
        "{err}"
    );
    let err = store
        .replace_provisioned("ghost", vec![kit("ghost", &["a.com"])])
        .unwrap_err();
    assert!(matches!(err, StoreError::NoSuchSandbox { .. }), "{err}");
    assert!(store.rules(&RuleFilter::default()).unwrap().is_empty());
}

#[test]
fn replacing_provisioned_rules_twice_leaves_exactly_the_new_set() {
    let (_dir, _path, mut store) = store();
    sandbox(&mut store, "dev");
    sandbox(&mut store, "other");
    let other = store
        .replace_provisioned("other", vec![kit("other", &["o.com"])])
        .unwrap();
    let mine = store.add_rule(user_in("dev", "mine.com")).unwrap();

    store
        .replace_provisioned(
            "dev",
            vec![kit("dev", &["one.com"]), kit("dev", &["two.com"])],
        )
        .unwrap();
    let second = store
        .replace_provisioned("dev", vec![kit("dev", &["three.com"])])
        .unwrap();

    let dev_kit = store.rules(&RuleFilter {
        sandbox: Some("dev".into()),
        source: Some(Source::Kit),
        ..Default::default()
    });
    assert_eq!(dev_kit.unwrap(), second);
    // The user's rule for the sandbox and the other sandbox's rules are untouched.
    assert_eq!(
        store.rules(&RuleFilter::default()).unwrap(),
        [other, vec![mine], second].concat()
    );

    // Replacing with nothing removes them.
    assert!(store.replace_provisioned("dev", vec![]).unwrap().is_empty());
    assert_eq!(
        resources(&store.rules(&RuleFilter::default()).unwrap()),
        ["o.com", "mine.com"]
    );
}

#[test]
fn a_failing_replacement_leaves_the_old_set() {
    let (_dir, path, mut store) = store();
    sandbox(&mut store, "dev");
    let old = store
        .replace_provisioned("dev", vec![kit("dev", &["old.com"])])
        .unwrap();

    // Another connection makes the second insert of the replacement fail, after the delete
    // and the first insert have run.
    let saboteur = rusqlite::Connection::open(&path).unwrap();
    saboteur
        .execute_batch(
            "CREATE TRIGGER poison BEFORE INSERT ON rules WHEN NEW.name = 'kit:poison'
             BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
        )
        .unwrap();
    let mut poisoned = kit("dev", &["two.com"]);
    poisoned.name = "kit:poison".into();
    let err = store
        .replace_provisioned("dev", vec![kit("dev", &["one.com"]), poisoned])
        .unwrap_err();
    assert!(matches!(err, StoreError::Write { .. }), "{err}");
    assert_eq!(store.rules(&RuleFilter::default()).unwrap(), old);

    // The store stays usable afterwards.
    saboteur.execute_batch("DROP TRIGGER poison").unwrap();
    let after = store
        .replace_provisioned("dev", vec![kit("dev", &["new.com"])])
        .unwrap();
    assert_eq!(store.rules(&RuleFilter::default()).unwrap(), after);
}

#[test]
fn sandboxes_are_recorded_and_removed_with_their_rules_only() {
    let (_dir, _path, mut store) = store();
    let surface = serde_json::json!({"network": {"allow": ["a.com"]}});
    let record = SandboxRecord::new(
        "dev",
        vec!["./agent".into(), "./mixin".into()],
        SandboxGrants::Surface(surface),
    );
    store.create_sandbox(record.clone()).unwrap();
    sandbox(&mut store, "keep");
    let err = store.create_sandbox(record.clone()).unwrap_err();
    assert!(matches!(err, StoreError::SandboxExists { .. }));
    assert_eq!(err.to_string(), "sandbox `dev` already exists");

    assert_eq!(store.sandbox("dev").unwrap(), Some(record.clone()));
    assert_eq!(store.sandbox("nope").unwrap(), None);
    let listed: Vec<String> = store
        .sandboxes()
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(listed, ["dev", "keep"]);
    store
        .set_sandbox_state("dev", SandboxState::Running)
        .unwrap();
    assert_eq!(
        store.sandbox("dev").unwrap().unwrap().state,
        SandboxState::Running
    );
    assert!(matches!(
        store.set_sandbox_state("nope", SandboxState::Stopped),
        Err(StoreError::NoSuchSandbox { .. })
    ));

    let global = store.add_rule(user("global.com", Decision::Allow)).unwrap();
    let kept_kit = store
        .replace_provisioned("keep", vec![kit("keep", &["k.com"])])
        .unwrap();
    let kept_user = store.add_rule(user_in("keep", "ku.com")).unwrap();
    let dev_kit = store
        .replace_provisioned("dev", vec![kit("dev", &["d.com"])])
        .unwrap();
    let dev_user = store.add_rule(user_in("dev", "du.com")).unwrap();

    let removed = store.remove_sandbox("dev").unwrap();
    assert_eq!(removed.record.name, "dev");
    assert_eq!(removed.record.state, SandboxState::Running);
    assert_eq!(removed.rules, [dev_kit, vec![dev_user]].concat());
    assert_eq!(
        store.rules(&RuleFilter::default()).unwrap(),
        [vec![global], kept_kit, vec![kept_user]].concat()
    );
    assert_eq!(store.sandbox("dev").unwrap(), None);
    assert!(matches!(
        store.remove_sandbox("dev"),
        Err(StoreError::NoSuchSandbox { .. })
    ));
}

#[test]
fn presets_replace_only_default_rules() {
    let (_dir, _path, mut store) = store();
    sandbox(&mut store, "dev");
    let mine = store.add_rule(user("mine.com", Decision::Deny)).unwrap();
    let kit_rules = store
        .replace_provisioned("dev", vec![kit("dev", &["k.com"])])
        .unwrap();
    assert_eq!(store.preset().unwrap(), None);

    let balanced = store.apply_preset(Preset::Balanced).unwrap();
    assert!(balanced.len() >= 3);
    for rule in &balanced {
        assert!(rule.name.starts_with("default-"));
        assert_eq!(
            (rule.source, rule.created_via, rule.editable),
            (Source::Default, CreatedVia::Default, false)
        );
        assert_eq!(
            (&rule.scope, rule.phase, rule.decision),
            (&Scope::Global, None, Decision::Allow)
        );
    }
    assert!(names(&balanced).contains(&"default-ai-services"));
    assert_eq!(store.preset().unwrap(), Some(Preset::Balanced));

    let allow_all = store.apply_preset(Preset::AllowAll).unwrap();
    assert_eq!(resources(&allow_all), ["**"]);
    let defaults = store
        .rules(&RuleFilter {
            source: Some(Source::Default),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(defaults, allow_all);

    assert!(store.apply_preset(Preset::DenyAll).unwrap().is_empty());
    assert_eq!(store.preset().unwrap(), Some(Preset::DenyAll));
    // deny-all stores no deny rule: the kit's allow and the user's rule remain the whole set.
    assert_eq!(
        store.rules(&RuleFilter::default()).unwrap(),
        [vec![mine], kit_rules].concat()
    );
}

#[test]
fn files_are_private() {
    let (dir, path, store) = store();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&dir.path().join("home")), 0o700);
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    assert_eq!(mode(&wal), 0o600);
    drop(store);

    // An existing store readable by others is restricted when opened.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let _store = Store::open(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
}

#[test]
fn a_newer_schema_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = DELETE; CREATE TABLE future (x); PRAGMA user_version = 99;",
        )
        .unwrap();
    }
    let before = std::fs::read(&path).unwrap();

    let err = Store::open(&path).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NewerSchema {
                found: 99,
                supported: 3,
                ..
            }
        ),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("{}: ", path.display())),
        "{message}"
    );
    assert!(
        message.contains("schema version 99") && message.contains("upgrade capgate"),
        "{message}"
    );

    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert!(!PathBuf::from(format!("{}-wal", path.display())).exists());
}

#[test]
fn opening_twice_migrates_once_and_a_non_database_is_an_error() {
    let (dir, path, store) = store();
    drop(store);
    let store = Store::open(&path).unwrap();
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        version,
        i64::try_from(capgate_policy::store::MIGRATIONS.len()).unwrap()
    );
    let mode: String = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(store);

    let junk = dir.path().join("junk.db");
    std::fs::write(
        &junk,
        b"this is not a database, just some bytes long enough to be a header....",
    )
    .unwrap();
    let err = Store::open(&junk).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("{}: ", junk.display())),
        "{err}"
    );
}

/// A store written by version 1 of the schema opens with its rules whole (ids, order,
/// creation times), and then takes rules for the `http` and `https` protocols, which
/// version 1's CHECK refused.
#[test]
fn a_version_1_store_is_migrated_with_its_rules() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(capgate_policy::store::MIGRATIONS[0])
            .unwrap();
        conn.execute_batch("PRAGMA user_version = 1;").unwrap();
    }
    let before = {
        // Rules as version 1 stored them.
        let conn = rusqlite::Connection::open(&path).unwrap();
        for (seq, host) in [(1, "a.example"), (2, "b.example"), (3, "gone.example")] {
            conn.execute(
                "INSERT INTO rules (id, name, scope, resource_type, decision, resources, protocol, source, created_via, editable, active, created_at)
                 VALUES (?1, ?2, 'global', 'network', 'allow', json_array(?3), 'tcp', 'user', 'added', 1, 1, '2026-01-01T00:00:00.000Z')",
                rusqlite::params![format!("r-{seq}"), format!("user:{host}"), host],
            )
            .unwrap();
        }
        // The newest rule was removed: its creation number is not to be handed out again.
        conn.execute("DELETE FROM rules WHERE id = 'r-3'", [])
            .unwrap();
        2
    };
    let mut store = Store::open(&path).unwrap();
    let rules = store.rules(&RuleFilter::default()).unwrap();
    assert_eq!(rules.len(), before);
    assert_eq!(
        rules.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["r-1", "r-2"]
    );
    assert_eq!(resources(&rules), ["a.example", "b.example"]);
    // Refused by version 1's CHECK, taken now; a later rule still sorts after the old ones.
    let https = NewRule::user(
        "user:c.example".to_owned(),
        Scope::Global,
        Decision::Allow,
        vec!["c.example:443".to_owned()],
        Protocol::Https,
    );
    store.add_rule(https).unwrap();
    let rules = store.rules(&RuleFilter::default()).unwrap();
    assert_eq!(rules.last().unwrap().protocol, Protocol::Https);
    assert_eq!(rules.len(), 3);
    drop(store);
    let newest: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT max(seq) FROM rules", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        newest, 4,
        "the creation counter went on from the removed rule's"
    );
    // Reopening applies nothing twice.
    let store = Store::open(&path).unwrap();
    assert_eq!(store.rules(&RuleFilter::default()).unwrap().len(), 3);
}

/// Processes that open a store no one has made yet, together (the workers `capgate warm`
/// starts at once, parallel runs on a new data directory), all get it: the switch to the
/// write-ahead log waits for the others instead of failing with "database is locked".
#[test]
fn a_new_store_opened_by_many_at_once_opens_for_all() {
    for _ in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.db");
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
        let openers: Vec<_> = (0..6)
            .map(|_| {
                let (path, barrier) = (path.clone(), std::sync::Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    Store::open(&path).map(|_| ()).map_err(|e| e.to_string())
                })
            })
            .collect();
        for opener in openers {
            assert_eq!(opener.join().unwrap(), Ok(()));
        }
    }
}
