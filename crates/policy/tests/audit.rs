#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]
//! The audit log: the writer thread, its flush and drop semantics, and the queries.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use capgate_policy::audit::{
    self, AuditEvent, AuditOptions, AuditWriter, DROPPED_EVENTS_HOST, LogQuery, MethodPath,
    Timestamp,
};
use capgate_policy::store::{NewRule, RuleFilter};
use capgate_policy::{Decision, Phase, Protocol, Reason, Scope, Store};
use tempfile::TempDir;

fn setup() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.db");
    (dir, path)
}

fn event(sandbox: &str, host: &str, n: usize) -> AuditEvent {
    AuditEvent {
        bytes_up: n as u64,
        ..AuditEvent::new(sandbox, host, 443, Decision::Deny, Reason::NoMatchingAllow)
    }
}

fn at(time: &str, mut event: AuditEvent) -> AuditEvent {
    event.time = Timestamp::parse(time).unwrap();
    event
}

fn http(method: &str, path: &str, mut event: AuditEvent) -> AuditEvent {
    event.method = Some(method.into());
    event.path = Some(path.into());
    event
}

fn all_events(path: &Path) -> Vec<AuditEvent> {
    audit::events(&Store::open(path).unwrap(), &LogQuery::default()).unwrap()
}

/// Decisions the rows stand for: one each, or the count of a dropped-events summary.
fn weight(events: &[AuditEvent]) -> u64 {
    events.iter().map(|e| e.dropped.max(1)).sum()
}

#[test]
fn the_writer_and_the_store_work_at_once_without_lock_errors() {
    const EVENTS: usize = 20_000;
    let (_dir, path) = setup();
    let mut store = Store::open(&path).unwrap();
    // Room for every event: this test is about two connections writing at once, so the
    // writer must be busy for as long as the main thread works (drops are tested below).
    let options = AuditOptions {
        capacity: EVENTS,
        ..AuditOptions::default()
    };
    let writer = AuditWriter::spawn_with(&path, options).unwrap();
    let written = AtomicBool::new(false);

    let rounds = std::thread::scope(|s| {
        s.spawn(|| {
            for n in 0..EVENTS {
                writer.record(event("dev", &format!("h{}.example.com", n % 50), n));
            }
            writer.flush().unwrap();
            written.store(true, Ordering::SeqCst);
        });
        let mut rounds = 0usize;
        while !written.load(Ordering::SeqCst) || rounds < 20 {
            let rule = NewRule::user(
                format!("local:{rounds}"),
                Scope::Global,
                Decision::Allow,
                vec![format!("r{rounds}.example.com")],
                Protocol::Tcp,
            );
            let added = store.add_rule(rule).unwrap();
            let rules = store.rules(&RuleFilter::default()).unwrap();
            assert_eq!(rules.last(), Some(&added));
            audit::log(
                &store,
                &LogQuery {
                    limit: Some(5),
                    ..LogQuery::default()
                },
            )
            .unwrap();
            rounds += 1;
        }
        rounds
    });

    assert_eq!(store.rules(&RuleFilter::default()).unwrap().len(), rounds);
    assert_eq!(writer.dropped(), 0);
    let events = all_events(&path);
    assert_eq!(events.len(), EVENTS);
    assert_eq!(weight(&events), EVENTS as u64);
}

#[test]
fn flush_waits_until_everything_recorded_is_written() {
    let (_dir, path) = setup();
    let writer = AuditWriter::spawn(&path).unwrap();
    writer.flush().unwrap(); // nothing pending
    let reader = Store::open(&path).unwrap();
    for round in 1..=3 {
        for n in 0..700 {
            writer.record(event("dev", "a.example.com", n));
        }
        writer.flush().unwrap();
        let events = audit::events(&reader, &LogQuery::default()).unwrap();
        assert_eq!(events.len(), round * 700);
    }
    assert_eq!(writer.dropped(), 0);
}

#[test]
fn dropping_the_writer_writes_what_was_recorded() {
    let (_dir, path) = setup();
    let writer = AuditWriter::spawn(&path).unwrap();
    for n in 0..300 {
        writer.record(event("dev", "a.example.com", n));
    }
    drop(writer);
    assert_eq!(all_events(&path).len(), 300);
}

#[test]
fn events_that_do_not_fit_are_counted_and_recorded_as_a_summary() {
    let (_dir, path) = setup();
    let options = AuditOptions {
        capacity: 4,
        batch_max: 1,
        batch_interval: Duration::from_millis(50),
    };
    let writer = AuditWriter::spawn_with(&path, options).unwrap();

    // Hold the write lock so the writer stalls on its first batch and the queue fills up.
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    for n in 0..100 {
        writer.record(event(
            if n % 2 == 0 { "even" } else { "odd" },
            "a.example.com",
            n,
        ));
    }
    let dropped = writer.dropped();
    assert!(dropped >= 90, "{dropped}");
    holder.execute_batch("ROLLBACK").unwrap();
    writer.flush().unwrap();

    let events = all_events(&path);
    assert_eq!(weight(&events), 100);
    let summaries: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.host == DROPPED_EVENTS_HOST)
        .collect();
    assert!(!summaries.is_empty() && summaries.len() <= 2 * 2);
    for s in &summaries {
        assert_eq!(
            (s.decision, s.reason),
            (Decision::Deny, Reason::LimitExceeded)
        );
        assert!(s.sandbox == "even" || s.sandbox == "odd");
    }
    assert_eq!(summaries.iter().map(|s| s.dropped).sum::<u64>(), dropped);

    // The log counts the dropped events under the summary host.
    let store = Store::open(&path).unwrap();
    let log = audit::log(&store, &LogQuery::default()).unwrap();
    let dropped_rows: u64 = log
        .iter()
        .filter(|h| h.host == DROPPED_EVENTS_HOST)
        .map(|h| h.count)
        .sum();
    assert_eq!(dropped_rows, dropped);
}

#[test]
fn query_strings_are_never_stored() {
    let (_dir, path) = setup();
    let writer = AuditWriter::spawn(&path).unwrap();
    let base = AuditEvent::new(
        "dev",
        "api.example.com",
        443,
        Decision::Allow,
        Reason::AllowedByRule,
    );
    writer.record(http("GET", "/login?token=hunter2-secret&x=1", base.clone()));
    writer.record(http("GET", "/search#hunter2-fragment", base.clone()));
    writer.record(http("POST", "/plain", base));
    drop(writer);

    let mut paths: Vec<String> = all_events(&path)
        .into_iter()
        .filter_map(|e| e.path)
        .collect();
    paths.sort();
    assert_eq!(paths, ["/login", "/plain", "/search"]);

    // Not in the database file, nor in its write-ahead log.
    for file in [
        path.clone(),
        PathBuf::from(format!("{}-wal", path.display())),
    ] {
        if let Ok(bytes) = std::fs::read(&file) {
            assert!(
                !bytes.windows(7).any(|w| w == b"hunter2"),
                "{}",
                file.display()
            );
        }
    }

    // The schema refuses a query string even from a connection that bypasses the writer.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let raw = conn.execute(
        "INSERT INTO audit (time, sandbox, host, port, path, decision, reason, bytes_up, bytes_down)
         VALUES ('2026-01-01T00:00:00.000Z', 'dev', 'a.com', 443, '/x?y', 'allow', 'allowed_by_rule', 0, 0)",
        [],
    );
    assert!(raw.is_err());
}

#[test]
fn the_audit_table_is_append_only() {
    let (_dir, path) = setup();
    let writer = AuditWriter::spawn(&path).unwrap();
    writer.record(event("dev", "a.example.com", 1));
    drop(writer);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let update = conn
        .execute("UPDATE audit SET host = 'b.example.com'", [])
        .unwrap_err();
    assert!(update.to_string().contains("append-only"), "{update}");
    let delete = conn.execute("DELETE FROM audit", []).unwrap_err();
    assert!(delete.to_string().contains("append-only"), "{delete}");
    assert_eq!(all_events(&path).len(), 1);

    // And no code path of the crate updates it; one deletes from it: `audit::prune`, the
    // explicit, recorded exception (see `after_a_prune_the_log_is_append_only_again`).
    let (audit_rs, store_rs) = (
        include_str!("../src/audit.rs").to_uppercase(),
        include_str!("../src/store.rs").to_uppercase(),
    );
    for upper in [&audit_rs, &store_rs] {
        assert!(!upper.contains("UPDATE AUDIT"));
    }
    assert!(!store_rs.contains("DELETE FROM AUDIT"));
    assert_eq!(audit_rs.matches("DELETE FROM AUDIT").count(), 1);
    assert_eq!(audit_rs.matches("DROP TRIGGER").count(), 1);
}

#[test]
fn the_log_groups_per_host_and_decision_newest_first() {
    let (_dir, path) = setup();
    let writer = AuditWriter::spawn(&path).unwrap();
    let allow = |t: &str| {
        let mut e = AuditEvent::new(
            "dev",
            "api.github.com",
            443,
            Decision::Allow,
            Reason::AllowedByRule,
        );
        e.rule_id = Some("r-aaaaaaaaaaaa".into());
        e.phase = Some(Phase::Runtime);
        at(t, e)
    };
    let refused = |t: &str| {
        at(
            t,
            http(
                "DELETE",
                "/repos/x",
                AuditEvent::new(
                    "dev",
                    "api.github.com",
                    443,
                    Decision::Deny,
                    Reason::HttpNotAllowed,
                ),
            ),
        )
    };
    writer.record(http(
        "GET",
        "/repos/a?page=2",
        allow("2026-11-30T10:00:00.000Z"),
    ));
    writer.record(http("GET", "/repos/a", allow("2026-11-30T10:00:01.000Z")));
    writer.record(http(
        "POST",
        "/repos/a/issues",
        allow("2026-11-30T10:00:02.000Z"),
    ));
    writer.record(allow("2026-11-30T10:00:03.000Z"));
    writer.record(at(
        "2026-11-30T10:00:04.000Z",
        event("dev", "evil.example", 1),
    ));
    writer.record(at(
        "2026-11-30T10:00:05.000Z",
        event("dev", "evil.example", 2),
    ));
    writer.record(refused("2026-11-30T09:00:00.000Z"));
    writer.record(at(
        "2026-11-30T11:00:00.000Z",
        event("ci", "other.example", 1),
    ));
    writer.flush().unwrap();
    let store = Store::open(&path).unwrap();

    let dev = LogQuery {
        sandbox: Some("dev".into()),
        ..LogQuery::default()
    };
    let log = audit::log(&store, &dev).unwrap();
    let keys: Vec<(&str, Decision, u64)> = log
        .iter()
        .map(|h| (h.host.as_str(), h.decision, h.count))
        .collect();
    assert_eq!(
        keys,
        [
            ("evil.example", Decision::Deny, 2),
            ("api.github.com", Decision::Allow, 4),
            ("api.github.com", Decision::Deny, 1)
        ]
    );

    let github = &log[1];
    assert_eq!((github.sandbox.as_str(), github.port), ("dev", 443));
    assert_eq!(
        (github.reason, github.rule_id.as_deref()),
        (Reason::AllowedByRule, Some("r-aaaaaaaaaaaa"))
    );
    assert_eq!(github.first_seen.to_string(), "2026-11-30T10:00:00.000Z");
    assert_eq!(github.last_seen.to_string(), "2026-11-30T10:00:03.000Z");
    let mp = |m: &str, p: &str, count| MethodPath {
        method: m.into(),
        path: p.into(),
        count,
    };
    assert_eq!(
        github.methods_paths,
        [mp("GET", "/repos/a", 2), mp("POST", "/repos/a/issues", 1)]
    );
    assert_eq!(log[0].methods_paths, []);
    assert_eq!(
        (log[0].reason, log[0].rule_id.as_deref()),
        (Reason::NoMatchingAllow, None)
    );
    assert_eq!(log[2].methods_paths, [mp("DELETE", "/repos/x", 1)]);

    // Every sandbox, limited, since a time.
    let everything = audit::log(&store, &LogQuery::default()).unwrap();
    assert_eq!(everything[0].sandbox, "ci");
    assert_eq!(everything.len(), 4);
    let limited = audit::log(
        &store,
        &LogQuery {
            limit: Some(1),
            ..dev.clone()
        },
    )
    .unwrap();
    assert_eq!(limited, log[..1]);
    let since = LogQuery {
        since: Timestamp::parse("2026-11-30T10:00:02Z"),
        ..dev.clone()
    };
    let recent = audit::log(&store, &since).unwrap();
    let recent: Vec<(&str, u64)> = recent.iter().map(|h| (h.host.as_str(), h.count)).collect();
    assert_eq!(recent, [("evil.example", 2), ("api.github.com", 2)]);

    // Raw events: newest first, with everything recorded.
    let raw = audit::events(
        &store,
        &LogQuery {
            limit: Some(3),
            ..dev
        },
    )
    .unwrap();
    let times: Vec<String> = raw.iter().map(|e| e.time.to_string()).collect();
    assert_eq!(
        times,
        [
            "2026-11-30T10:00:05.000Z",
            "2026-11-30T10:00:04.000Z",
            "2026-11-30T10:00:03.000Z"
        ]
    );
    assert_eq!(raw[0].bytes_up, 2);
    assert_eq!(raw[2].phase, Some(Phase::Runtime));
    assert_eq!(raw[2].rule_id.as_deref(), Some("r-aaaaaaaaaaaa"));
    assert_eq!(raw[2].method, None);
}

fn write_all(path: &Path, events: Vec<AuditEvent>) {
    let writer = AuditWriter::spawn(path).unwrap();
    for e in events {
        writer.record(e);
    }
    writer.flush().unwrap();
}

#[test]
fn pruning_removes_only_older_events_and_records_itself() {
    let (_dir, path) = setup();
    write_all(
        &path,
        vec![
            at("2026-01-01T00:00:00Z", event("a", "old.example.com", 1)),
            at("2026-02-01T00:00:00Z", event("b", "old.example.com", 2)),
            at(
                "2026-03-01T00:00:00.000Z",
                event("a", "edge.example.com", 3),
            ),
            at("2026-04-01T00:00:00Z", event("b", "new.example.com", 4)),
        ],
    );
    let mut store = Store::open(&path).unwrap();
    assert_eq!(audit::pruned(&store).unwrap(), None);
    let cut = Timestamp::parse("2026-03-01T00:00:00Z").unwrap();
    assert_eq!(audit::prune(&mut store, cut).unwrap(), 2);
    let hosts: Vec<String> = all_events(&path).into_iter().map(|e| e.host).collect();
    // An event at exactly the cut stays.
    assert_eq!(hosts, ["new.example.com", "edge.example.com"]);
    let p = audit::pruned(&store).unwrap().unwrap();
    assert_eq!((p.before, p.events), (cut, 2));

    // A second prune with an earlier cut removes nothing and keeps the later cut.
    let earlier = Timestamp::parse("2026-02-15T00:00:00Z").unwrap();
    assert_eq!(audit::prune(&mut store, earlier).unwrap(), 0);
    let p = audit::pruned(&store).unwrap().unwrap();
    assert_eq!((p.before, p.events), (cut, 2));
    // A later cut adds to the count.
    let later = Timestamp::parse("2026-03-15T00:00:00Z").unwrap();
    assert_eq!(audit::prune(&mut store, later).unwrap(), 1);
    let p = audit::pruned(&store).unwrap().unwrap();
    assert_eq!((p.before, p.events), (later, 3));
}

#[test]
fn after_a_prune_the_log_is_append_only_again() {
    let (_dir, path) = setup();
    write_all(
        &path,
        vec![
            at("2026-01-01T00:00:00Z", event("a", "old.example.com", 1)),
            at("2026-04-01T00:00:00Z", event("a", "new.example.com", 2)),
        ],
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    let triggers = |c: &rusqlite::Connection| -> Vec<String> {
        c.prepare("SELECT sql FROM sqlite_master WHERE type = 'trigger' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let before = triggers(&conn);
    let mut store = Store::open(&path).unwrap();
    audit::prune(
        &mut store,
        Timestamp::parse("2026-02-01T00:00:00Z").unwrap(),
    )
    .unwrap();
    // The trigger is back, exactly as the schema made it.
    assert_eq!(triggers(&conn), before);
    let err = conn.execute("DELETE FROM audit", []).unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
    assert!(conn.execute("UPDATE audit SET host = 'x'", []).is_err());
    assert_eq!(all_events(&path).len(), 1);
    // New events still go in.
    write_all(&path, vec![event("a", "later.example.com", 3)]);
    assert_eq!(all_events(&path).len(), 2);
}

/// A large prune goes in short transactions, oldest first: between them another writer
/// (a gateway's audit writer) gets the database without waiting, and what is recorded
/// after each step is true. The end result is the one-shot prune's.
#[test]
fn a_prune_goes_in_chunks_that_let_writers_in_and_record_the_truth() {
    let (_dir, path) = setup();
    // Ten events, two per day, 2026-01-01 .. 2026-01-05; the cut keeps the last two days.
    let mut events = Vec::new();
    for day in 1..=5 {
        for hour in ["00", "12"] {
            events.push(at(
                &format!("2026-01-0{day}T{hour}:00:00Z"),
                event("a", &format!("d{day}h{hour}.example.com"), day),
            ));
        }
    }
    write_all(&path, events);
    let cut = Timestamp::parse("2026-01-04T00:00:00Z").unwrap();

    let other = rusqlite::Connection::open(&path).unwrap();
    other.busy_timeout(Duration::ZERO).unwrap();
    let mut steps = Vec::new();
    let mut store = Store::open(&path).unwrap();
    let removed = audit::prune_in_chunks(&mut store, cut, 4, || {
        // The prune holds no lock here: a writer that will not wait at all gets in.
        other
            .execute_batch("BEGIN IMMEDIATE; UPDATE settings SET value = value WHERE 0; COMMIT;")
            .unwrap();
        let p: (String, String) = (
            other
                .query_row(
                    "SELECT value FROM settings WHERE key = 'audit_pruned_before'",
                    [],
                    |r| r.get(0),
                )
                .unwrap(),
            other
                .query_row(
                    "SELECT value FROM settings WHERE key = 'audit_pruned_events'",
                    [],
                    |r| r.get(0),
                )
                .unwrap(),
        );
        steps.push(p);
    })
    .unwrap();
    assert_eq!(removed, 6);
    // Chunks of 4: after the first, every event before the 4th oldest (01-02 12:00) is gone.
    assert_eq!(
        steps,
        [("2026-01-02T12:00:00.000Z".to_string(), "4".to_string())]
    );
    let hosts: Vec<String> = all_events(&path).into_iter().map(|e| e.host).collect();
    assert_eq!(
        hosts,
        [
            "d5h12.example.com",
            "d5h00.example.com",
            "d4h12.example.com",
            "d4h00.example.com"
        ]
    );
    let p = audit::pruned(&store).unwrap().unwrap();
    assert_eq!((p.before, p.events), (cut, 6));
    // And the log is append-only again.
    let err = other.execute("DELETE FROM audit", []).unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
}
