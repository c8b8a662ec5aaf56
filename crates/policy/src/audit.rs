//! The audit log: one row per gateway decision, in the `audit` table of the policy store.
//!
//! The log is **append-only**. No code path in capgate updates or deletes an audit row: the
//! only statement this module writes is `INSERT`, and the schema backs that with triggers
//! that abort any `UPDATE` or `DELETE` on the table.
//!
//! The gateway records through an [`AuditWriter`]: a thread with its own connection, fed
//! through a bounded channel, that sleeps through a 50 ms interval and then writes what
//! arrived in short transactions of up to 64 events, yielding the core between them, at the
//! lowest priority: it never wakes per event and never holds a core long enough to delay
//! the relaying threads (measured: p99 +0.35 ms instead of +2.5 ms at one connection).
//! Recording never waits for the disk; when the channel
//! is full the event is counted, and the count is written later as a synthetic
//! `limit_exceeded` event (host [`DROPPED_EVENTS_HOST`]) so no loss goes unrecorded.
//!
//! Paths are stored without their query string or fragment (which may carry secrets), and
//! every text field is cut to a bounded length: the workload chooses what it sends.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SendError, Sender, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, Row, TransactionBehavior, params};
use serde::Serialize;

use crate::decision::Reason;
use crate::rule::{Decision, Phase};
use crate::store::{
    AUDIT_NO_DELETE_TRIGGER, Store, StoreError, corrupt, decision_text, parse_decision, read_err,
    write_err,
};

/// The host of the synthetic event that counts events dropped because the writer's channel
/// was full. It cannot be a real host name.
pub const DROPPED_EVENTS_HOST: &str = "(dropped audit events)";

/// Longest stored host, in bytes.
pub const MAX_HOST: usize = 255;
/// Longest stored method, in bytes.
pub const MAX_METHOD: usize = 32;
/// Longest stored path, in bytes (longer paths are cut and end with `…`).
pub const MAX_PATH: usize = 2048;
/// Longest stored rule id, in bytes.
pub const MAX_RULE_ID: usize = 64;
/// At most this many (method, path) pairs per [`HostSummary`], the most frequent first.
pub const MAX_METHODS_PATHS: usize = 20;

/// A point in time with millisecond precision, shown as RFC 3339 UTC
/// (`2026-11-30T12:34:56.789Z`). The text form sorts as the times do, which the audit
/// queries rely on; years are kept within 0000–9999 for that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Milliseconds since 1970-01-01T00:00:00Z.
    millis: i64,
}

impl Timestamp {
    /// 0000-01-01T00:00:00.000Z.
    const MIN_MILLIS: i64 = -62_167_219_200_000;
    /// 9999-12-31T23:59:59.999Z.
    const MAX_MILLIS: i64 = 253_402_300_799_999;

    pub fn now() -> Timestamp {
        let millis = match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            Err(e) => i64::try_from(e.duration().as_millis()).map_or(i64::MIN, |m| -m),
        };
        Timestamp::from_unix_millis(millis)
    }

    /// Clamped to years 0000–9999.
    pub fn from_unix_millis(millis: i64) -> Timestamp {
        Timestamp {
            millis: millis.clamp(Self::MIN_MILLIS, Self::MAX_MILLIS),
        }
    }

    pub fn unix_millis(self) -> i64 {
        self.millis
    }

    /// RFC 3339 in UTC: `YYYY-MM-DDTHH:MM:SS[.fraction]Z` (`T`/`Z` in either case; the
    /// fraction is cut to milliseconds). Offsets other than `Z` are refused.
    pub fn parse(s: &str) -> Option<Timestamp> {
        let b = s.as_bytes();
        let num = |range: std::ops::Range<usize>| -> Option<i64> {
            let digits = b.get(range)?;
            digits.iter().try_fold(0i64, |n, &c| {
                c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0'))
            })
        };
        let sep = |i: usize, c: u8| b.get(i).is_some_and(|x| x.eq_ignore_ascii_case(&c));
        if !(sep(4, b'-') && sep(7, b'-') && sep(10, b'T') && sep(13, b':') && sep(16, b':')) {
            return None;
        }
        let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
        let rest = b.get(19..)?;
        let (fraction, zone) = match rest.split_first() {
            Some((b'.', tail)) => {
                let digits = tail.iter().take_while(|c| c.is_ascii_digit()).count();
                if digits == 0 {
                    return None;
                }
                let ms = tail
                    .iter()
                    .take(digits.min(3))
                    .try_fold((0i64, 0u32), |(n, k), &c| {
                        c.is_ascii_digit()
                            .then(|| (n * 10 + i64::from(c - b'0'), k + 1))
                    })?;
                let ms = ms.0 * 10i64.pow(3 - ms.1);
                (ms, tail.get(digits..)?)
            }
            _ => (0, rest),
        };
        if !matches!(zone, [z] if z.eq_ignore_ascii_case(&b'Z')) {
            return None;
        }
        let valid = (1..=12).contains(&month)
            && (1..=days_in_month(year, month)).contains(&day)
            && hour < 24
            && minute < 60
            && second < 60;
        if !valid {
            return None;
        }
        let days = days_from_civil(year, month, day);
        let millis = ((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + fraction;
        Some(Timestamp::from_unix_millis(millis))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let days = self.millis.div_euclid(86_400_000);
        let ms_of_day = self.millis.rem_euclid(86_400_000);
        let (year, month, day) = civil_from_days(days);
        let (hour, minute) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60);
        let (second, ms) = (ms_of_day / 1000 % 60, ms_of_day % 1000);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{ms:03}Z"
        )
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (inverse of [`days_from_civil`]).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// One decision of the gateway, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEvent {
    pub time: Timestamp,
    pub sandbox: String,
    /// The grant phase the request was made in, when known.
    pub phase: Option<Phase>,
    pub host: String,
    pub port: u16,
    /// The HTTP method, for a decision about one request.
    pub method: Option<String>,
    /// The HTTP path, for a decision about one request. Stored without its query string.
    pub path: Option<String>,
    pub decision: Decision,
    pub reason: Reason,
    /// The rule that decided, if one did.
    pub rule_id: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// For the synthetic [`DROPPED_EVENTS_HOST`] event only: how many events were dropped
    /// because the writer's channel was full. 0 for every real event.
    pub dropped: u64,
}

impl AuditEvent {
    /// An event about a connection, now, with no rule, method, path or bytes.
    pub fn new(
        sandbox: impl Into<String>,
        host: impl Into<String>,
        port: u16,
        decision: Decision,
        reason: Reason,
    ) -> AuditEvent {
        AuditEvent {
            time: Timestamp::now(),
            sandbox: sandbox.into(),
            phase: None,
            host: host.into(),
            port,
            method: None,
            path: None,
            decision,
            reason,
            rule_id: None,
            bytes_up: 0,
            bytes_down: 0,
            dropped: 0,
        }
    }

    fn dropped_summary(sandbox: String, dropped: u64) -> AuditEvent {
        AuditEvent {
            dropped,
            ..AuditEvent::new(
                sandbox,
                DROPPED_EVENTS_HOST,
                0,
                Decision::Deny,
                Reason::LimitExceeded,
            )
        }
    }

    /// How many decisions this row stands for.
    fn weight(&self) -> u64 {
        self.dropped.max(1)
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn bounded(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

/// The path as stored: no query string or fragment, at most [`MAX_PATH`] bytes.
pub fn stored_path(path: &str) -> String {
    let path = path
        .find(['?', '#'])
        .map_or(path, |i| path.get(..i).unwrap_or(""));
    if path.len() <= MAX_PATH {
        return path.to_owned();
    }
    let mut cut = bounded(path, MAX_PATH - '…'.len_utf8()).to_owned();
    cut.push('…');
    cut
}

/// Tuning of an [`AuditWriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditOptions {
    /// Events the channel holds before [`AuditWriter::record`] starts dropping.
    pub capacity: usize,
    /// Most events written in one transaction.
    pub batch_max: usize,
    /// Longest an event waits for its batch to be written.
    pub batch_interval: Duration,
}

impl Default for AuditOptions {
    fn default() -> AuditOptions {
        AuditOptions {
            capacity: 8192,
            batch_max: 64,
            batch_interval: Duration::from_millis(50),
        }
    }
}

enum Message {
    Event(AuditEvent),
    Flush(mpsc::Sender<Result<(), StoreError>>),
}

/// The queue's depth and the drops counted by [`AuditWriter::record`], shared with the
/// writer thread. The channel itself is unbounded (a bounded one allocates and touches
/// every slot up front: 8192 events cost ~0.7 ms of page faults at each start); the depth
/// is the bound.
#[derive(Debug, Default)]
struct Drops {
    /// Events sent and not yet taken by the writer.
    queued: AtomicUsize,
    /// Per sandbox, since the writer last took them.
    pending: Mutex<BTreeMap<String, u64>>,
    total: AtomicU64,
}

impl Drops {
    fn count(&self, sandbox: &str) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        *pending.entry(sandbox.to_owned()).or_default() += 1;
    }

    fn take(&self) -> BTreeMap<String, u64> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Writes audit events off the caller's thread. Dropping it writes what was recorded and
/// stops the thread.
#[derive(Debug)]
pub struct AuditWriter {
    sender: Option<Sender<Message>>,
    capacity: usize,
    drops: Arc<Drops>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl AuditWriter {
    /// Opens the store at `path` (creating and migrating it like [`Store::open`]) on the
    /// calling thread, so a store that cannot be opened is an error here, then hands the
    /// connection to a writer thread.
    pub fn spawn(path: &Path) -> Result<AuditWriter, StoreError> {
        AuditWriter::spawn_with(path, AuditOptions::default())
    }

    pub fn spawn_with(path: &Path, options: AuditOptions) -> Result<AuditWriter, StoreError> {
        let store = Store::open(path)?;
        let (sender, receiver) = mpsc::channel();
        let drops = Arc::new(Drops::default());
        let thread_drops = Arc::clone(&drops);
        let thread = std::thread::Builder::new()
            .name("capgate-audit".to_owned())
            .spawn(move || run(store, &receiver, &thread_drops, options))
            .map_err(|source| StoreError::SpawnAuditWriter {
                path: path.to_owned(),
                source,
            })?;
        Ok(AuditWriter {
            sender: Some(sender),
            capacity: options.capacity.max(1),
            drops,
            thread: Some(thread),
            path: path.to_owned(),
        })
    }

    /// Queues an event. Never waits: when the queue is full (or the writer has stopped)
    /// the event is counted as dropped, and the count is written later as a synthetic
    /// `limit_exceeded` event for its sandbox.
    pub fn record(&self, event: AuditEvent) {
        let Some(sender) = &self.sender else {
            self.drops.count(&event.sandbox);
            return;
        };
        if self.drops.queued.fetch_add(1, Ordering::AcqRel) >= self.capacity {
            self.drops.queued.fetch_sub(1, Ordering::AcqRel);
            self.drops.count(&event.sandbox);
            return;
        }
        if let Err(SendError(message)) = sender.send(Message::Event(event)) {
            self.drops.queued.fetch_sub(1, Ordering::AcqRel);
            if let Message::Event(event) = message {
                self.drops.count(&event.sandbox);
            }
        }
    }

    /// Waits until every event recorded before this call (and the count of those dropped)
    /// is written. Fails if events could not be written since the last flush.
    pub fn flush(&self) -> Result<(), StoreError> {
        let stopped = || StoreError::AuditWriterStopped {
            path: self.path.clone(),
        };
        let sender = self.sender.as_ref().ok_or_else(stopped)?;
        let (reply, answer) = mpsc::channel();
        sender.send(Message::Flush(reply)).map_err(|_| stopped())?;
        answer.recv().map_err(|_| stopped())?
    }

    /// Events dropped since the writer started because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.drops.total.load(Ordering::Relaxed)
    }
}

impl Drop for AuditWriter {
    fn drop(&mut self) {
        // Closing the channel makes the thread write everything queued, then return.
        drop(self.sender.take());
        if let Some(thread) = self.thread.take() {
            // A panic in the writer has nothing left to write; there is nothing to do here.
            let _ = thread.join();
        }
    }
}

/// Failure of writes since the last flush.
struct Lost {
    events: u64,
    last_error: rusqlite::Error,
}

fn run(mut store: Store, receiver: &Receiver<Message>, drops: &Drops, options: AuditOptions) {
    // The writer is background work: at the lowest priority it never delays the threads
    // that relay requests (Linux applies a thread id's nice value to that thread only).
    let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19);
    let mut batch: Vec<AuditEvent> = Vec::with_capacity(options.batch_max);
    let mut lost: Option<Lost> = None;
    loop {
        let mut flush = None;
        let mut closing = false;
        match receiver.recv() {
            Ok(Message::Event(event)) => {
                drops.queued.fetch_sub(1, Ordering::AcqRel);
                batch.push(event);
            }
            Ok(Message::Flush(reply)) => flush = Some(reply),
            Err(_) => closing = true,
        }
        if flush.is_none() && !closing {
            // Sleep through the batch interval instead of waking for every event: a thread
            // woken per request competes with the relaying threads (tail latency on small
            // machines), while a sleeping one costs the senders nothing.
            std::thread::sleep(options.batch_interval);
            // Drain everything that arrived, one transaction per `batch_max` events.
            loop {
                match receiver.try_recv() {
                    Ok(Message::Event(event)) => {
                        drops.queued.fetch_sub(1, Ordering::AcqRel);
                        batch.push(event);
                        if batch.len() >= options.batch_max {
                            write_batch(&mut store, &mut batch, drops, &mut lost);
                            // Short slices: give the relaying threads the core back.
                            std::thread::yield_now();
                        }
                    }
                    Ok(Message::Flush(reply)) => {
                        flush = Some(reply);
                        break;
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        closing = true;
                        break;
                    }
                }
            }
        }
        write_batch(&mut store, &mut batch, drops, &mut lost);
        if let Some(reply) = flush {
            let result = match lost.take() {
                None => Ok(()),
                Some(l) => Err(StoreError::AuditLost {
                    path: store.path().to_owned(),
                    lost: l.events,
                    source: l.last_error,
                }),
            };
            // The caller may have stopped waiting; then nobody needs the answer.
            let _ = reply.send(result);
        }
        if closing {
            return;
        }
    }
}

fn write_batch(
    store: &mut Store,
    batch: &mut Vec<AuditEvent>,
    drops: &Drops,
    lost: &mut Option<Lost>,
) {
    batch.extend(
        drops
            .take()
            .into_iter()
            .map(|(sandbox, n)| AuditEvent::dropped_summary(sandbox, n)),
    );
    if batch.is_empty() {
        return;
    }
    let mut result = insert_events(store.connection_mut(), batch);
    if result.is_err() {
        // One retry covers a transient failure beyond the busy timeout.
        std::thread::sleep(Duration::from_millis(100));
        result = insert_events(store.connection_mut(), batch);
    }
    if let Err(error) = result {
        let events: u64 = batch.iter().map(AuditEvent::weight).sum();
        let total = lost.as_ref().map_or(0, |l| l.events) + events;
        *lost = Some(Lost {
            events: total,
            last_error: error,
        });
    }
    batch.clear();
}

/// The only statement that writes to the audit table.
fn insert_events(conn: &mut Connection, batch: &[AuditEvent]) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO audit (time, sandbox, phase, host, port, method, path, decision, reason,
                                rule_id, bytes_up, bytes_down, dropped)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        )?;
        for e in batch {
            insert.execute(params![
                e.time.to_string(),
                e.sandbox,
                e.phase.map(Phase::as_str),
                bounded(&e.host, MAX_HOST),
                e.port,
                e.method.as_deref().map(|m| bounded(m, MAX_METHOD)),
                e.path.as_deref().map(stored_path),
                decision_text(e.decision),
                e.reason.code(),
                e.rule_id.as_deref().map(|r| bounded(r, MAX_RULE_ID)),
                i64::try_from(e.bytes_up).unwrap_or(i64::MAX),
                i64::try_from(e.bytes_down).unwrap_or(i64::MAX),
                i64::try_from(e.dropped).unwrap_or(i64::MAX),
            ])?;
        }
    }
    tx.commit()
}

// -------------------------------------------------------------------------------------
// Queries for `capgate policy log` and `capgate log`.

/// Which events to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogQuery {
    /// Only this sandbox's events.
    pub sandbox: Option<String>,
    /// At most this many rows (groups for [`log`], events for [`events`]).
    pub limit: Option<usize>,
    /// Only events at or after this time.
    pub since: Option<Timestamp>,
}

impl LogQuery {
    fn limit(&self) -> i64 {
        self.limit
            .map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX))
    }

    fn since(&self) -> Option<String> {
        self.since.map(|t| t.to_string())
    }
}

/// How often one HTTP request line was decided in a [`HostSummary`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MethodPath {
    pub method: String,
    pub path: String,
    pub count: u64,
}

/// The decisions about one host and port in one sandbox with one outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostSummary {
    pub sandbox: String,
    pub host: String,
    pub port: u16,
    pub decision: Decision,
    /// The reason of the latest event in the group.
    pub reason: Reason,
    /// The deciding rule of the latest event in the group.
    pub rule_id: Option<String>,
    /// For HTTP decisions: the most frequent (method, path) pairs, at most
    /// [`MAX_METHODS_PATHS`], the most frequent first.
    pub methods_paths: Vec<MethodPath>,
    /// Decisions in the group (for [`DROPPED_EVENTS_HOST`]: events dropped).
    pub count: u64,
    pub first_seen: Timestamp,
    pub last_seen: Timestamp,
}

/// Decisions grouped per sandbox, host, port and decision, the group seen last first.
pub fn log(store: &Store, query: &LogQuery) -> Result<Vec<HostSummary>, StoreError> {
    let conn = store.connection();
    let path = store.path();
    struct GroupRow {
        sandbox: String,
        host: String,
        port: u16,
        decision: String,
        count: i64,
        first_seen: String,
        last_seen: String,
        reason: String,
        rule_id: Option<String>,
    }
    let groups = conn
        .prepare_cached(
            "WITH g AS (
                 SELECT sandbox, host, port, decision, SUM(max(dropped, 1)) AS n,
                        MIN(time) AS first_seen, MAX(time) AS last_seen, MAX(seq) AS last_seq
                 FROM audit
                 WHERE (?1 IS NULL OR sandbox = ?1) AND (?2 IS NULL OR time >= ?2)
                 GROUP BY sandbox, host, port, decision)
             SELECT g.sandbox, g.host, g.port, g.decision, g.n, g.first_seen, g.last_seen,
                    a.reason, a.rule_id
             FROM g JOIN audit AS a ON a.seq = g.last_seq
             ORDER BY g.last_seen DESC, g.last_seq DESC
             LIMIT ?3",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![query.sandbox, query.since(), query.limit()], |r| {
                Ok(GroupRow {
                    sandbox: r.get(0)?,
                    host: r.get(1)?,
                    port: r.get(2)?,
                    decision: r.get(3)?,
                    count: r.get(4)?,
                    first_seen: r.get(5)?,
                    last_seen: r.get(6)?,
                    reason: r.get(7)?,
                    rule_id: r.get(8)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(read_err(path, "read the audit log"))?;

    let mut summaries = Vec::with_capacity(groups.len());
    for g in groups {
        let key = format!("{}:{}", g.host, g.port);
        let bad = |column, value: &str| corrupt(path, "audit group", &key, column, value);
        let methods_paths = conn
            .prepare_cached(
                "SELECT method, path, COUNT(*) FROM audit
                 WHERE sandbox = ?1 AND host = ?2 AND port = ?3 AND decision = ?4
                   AND method IS NOT NULL AND (?5 IS NULL OR time >= ?5)
                 GROUP BY method, path
                 ORDER BY COUNT(*) DESC, method, path
                 LIMIT ?6",
            )
            .and_then(|mut stmt| {
                stmt.query_map(
                    params![
                        g.sandbox,
                        g.host,
                        g.port,
                        g.decision,
                        query.since(),
                        i64::try_from(MAX_METHODS_PATHS).unwrap_or(i64::MAX)
                    ],
                    |r| {
                        Ok(MethodPath {
                            method: r.get(0)?,
                            path: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                            count: u64::try_from(r.get::<_, i64>(2)?).unwrap_or(0),
                        })
                    },
                )?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(read_err(path, "read the audit log"))?;
        summaries.push(HostSummary {
            decision: parse_decision(&g.decision).ok_or_else(|| bad("decision", &g.decision))?,
            reason: Reason::parse(&g.reason).ok_or_else(|| bad("reason", &g.reason))?,
            first_seen: Timestamp::parse(&g.first_seen)
                .ok_or_else(|| bad("time", &g.first_seen))?,
            last_seen: Timestamp::parse(&g.last_seen).ok_or_else(|| bad("time", &g.last_seen))?,
            count: u64::try_from(g.count).unwrap_or(0),
            rule_id: g.rule_id,
            methods_paths,
            port: g.port,
            host: g.host,
            sandbox: g.sandbox,
        });
    }
    Ok(summaries)
}

/// What [`prune`] removed, as recorded in the store (the latest prune; counts add up).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pruned {
    /// Events recorded before this time are gone.
    pub before: Timestamp,
    /// When the latest prune ran.
    pub at: Timestamp,
    /// Events removed by every prune so far.
    pub events: u64,
}

/// How many events [`prune`] deletes per transaction. Deleting takes the database's write
/// lock; gateways' audit writers wait for it only up to the busy timeout, so a prune of
/// millions of events in one transaction (seconds) could make them lose events. A chunk
/// takes tens of milliseconds.
pub const PRUNE_CHUNK: usize = 20_000;

/// Removes the events recorded before `before`: the one deliberate exception to the
/// append-only log, for keeping its size bounded. Events go oldest first, in transactions of
/// [`PRUNE_CHUNK`]: in each, the delete trigger is lifted, the rows deleted, the trigger
/// restored, and the prune so far recorded (see [`pruned`]), so that `capgate log` says
/// what is missing even if the prune is interrupted. Freed pages are reused by later
/// events, so the file stops growing without a `VACUUM`. Returns what was removed now.
pub fn prune(store: &mut Store, before: Timestamp) -> Result<u64, StoreError> {
    prune_in_chunks(store, before, PRUNE_CHUNK, || ())
}

/// [`prune`] with `chunk` events per transaction, calling `between` after each transaction
/// that left more to delete (where other writers get their turn).
pub fn prune_in_chunks(
    store: &mut Store,
    before: Timestamp,
    chunk: usize,
    mut between: impl FnMut(),
) -> Result<u64, StoreError> {
    let mut removed = 0u64;
    loop {
        let (now, done) = prune_chunk(store, before, chunk.max(1))?;
        removed = removed.saturating_add(now);
        if done {
            return Ok(removed);
        }
        between();
    }
}

/// One transaction of [`prune_in_chunks`]: deletes the oldest `chunk` events before
/// `before` and records the prune. Returns what it removed and whether nothing is left.
fn prune_chunk(
    store: &mut Store,
    before: Timestamp,
    chunk: usize,
) -> Result<(u64, bool), StoreError> {
    let path = store.path().to_owned();
    let err = write_err(&path, "prune the audit log");
    let tx = store
        .connection_mut()
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(write_err(&path, "prune the audit log"))?;
    let outcome = (|| {
        let cut = before.to_string();
        // The chunk's last event, oldest first; without one, the rest fits in this chunk.
        let last: Option<(String, i64)> = match tx.query_row(
            "SELECT time, seq FROM audit WHERE time < ?1 ORDER BY time, seq LIMIT 1 OFFSET ?2",
            params![cut, i64::try_from(chunk - 1).unwrap_or(i64::MAX)],
            |r| Ok((r.get(0)?, r.get(1)?)),
        ) {
            Ok(row) => Some(row),
            Err(rusqlite::Error::QueryReturnedNoRows) => None,
            Err(e) => return Err(e),
        };
        tx.execute_batch("DROP TRIGGER audit_no_delete")?;
        // Up to and including the chunk's last event; the final chunk, everything before
        // the cut (no sequence number is negative, so none at the cut itself goes).
        let (upto_time, upto_seq) = last.clone().unwrap_or((cut, -1));
        let removed = tx.execute(
            "DELETE FROM audit WHERE time < ?1 OR (time = ?1 AND seq <= ?2)",
            params![upto_time, upto_seq],
        )?;
        tx.execute_batch(AUDIT_NO_DELETE_TRIGGER)?;
        let removed = u64::try_from(removed).unwrap_or(u64::MAX);
        // Truthful at every step: after a partial chunk, every event before the chunk's
        // last one is gone (later ones at the same instant may remain).
        let reached = match &last {
            None => before,
            Some((time, _)) => Timestamp::parse(time).unwrap_or(before).min(before),
        };
        let earlier = read_pruned(&tx).ok().flatten();
        let total = earlier
            .as_ref()
            .map_or(0, |p| p.events)
            .saturating_add(removed);
        // A later prune with an earlier cut does not bring events back: keep the latest cut.
        let cut = earlier
            .map(|p| p.before)
            .filter(|b| *b > reached)
            .unwrap_or(reached);
        if removed > 0 || last.is_none() {
            for (key, value) in [
                ("audit_pruned_before", cut.to_string()),
                ("audit_pruned_at", Timestamp::now().to_string()),
                ("audit_pruned_events", total.to_string()),
            ] {
                tx.execute(
                    "INSERT INTO settings (key, value) VALUES (?1, ?2)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    params![key, value],
                )?;
            }
        }
        Ok((removed, last.is_none()))
    })()
    .map_err(err)?;
    tx.commit()
        .map_err(write_err(&path, "prune the audit log"))?;
    Ok(outcome)
}

/// What earlier prunes removed, if the log was ever pruned.
pub fn pruned(store: &Store) -> Result<Option<Pruned>, StoreError> {
    read_pruned(store.connection()).map_err(read_err(store.path(), "read the audit log"))
}

fn read_pruned(conn: &Connection) -> rusqlite::Result<Option<Pruned>> {
    let value = |key: &str| -> rusqlite::Result<Option<String>> {
        match conn.query_row(
            "SELECT value FROM settings WHERE key = ?1",
            params![key],
            |r| r.get::<_, String>(0),
        ) {
            Ok(v) => Ok(Some(v)),
            Err(rusqlite::Error::QueryReturnedNoRows) => Ok(None),
            Err(e) => Err(e),
        }
    };
    let (Some(before), Some(at), Some(events)) = (
        value("audit_pruned_before")?,
        value("audit_pruned_at")?,
        value("audit_pruned_events")?,
    ) else {
        return Ok(None);
    };
    Ok(Timestamp::parse(&before)
        .zip(Timestamp::parse(&at))
        .zip(events.parse().ok())
        .map(|((before, at), events)| Pruned { before, at, events }))
}

/// Raw events, newest first.
pub fn events(store: &Store, query: &LogQuery) -> Result<Vec<AuditEvent>, StoreError> {
    let path = store.path();
    let rows = store
        .connection()
        .prepare_cached(
            "SELECT seq, time, sandbox, phase, host, port, method, path, decision, reason, rule_id,
                    bytes_up, bytes_down, dropped
             FROM audit
             WHERE (?1 IS NULL OR sandbox = ?1) AND (?2 IS NULL OR time >= ?2)
             ORDER BY time DESC, seq DESC
             LIMIT ?3",
        )
        .and_then(|mut stmt| {
            stmt.query_map(
                params![query.sandbox, query.since(), query.limit()],
                EventRow::read,
            )?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(read_err(path, "read the audit log"))?;
    rows.into_iter().map(|row| row.decode(path)).collect()
}

struct EventRow {
    seq: i64,
    time: String,
    sandbox: String,
    phase: Option<String>,
    host: String,
    port: u16,
    method: Option<String>,
    path: Option<String>,
    decision: String,
    reason: String,
    rule_id: Option<String>,
    bytes_up: i64,
    bytes_down: i64,
    dropped: i64,
}

impl EventRow {
    fn read(r: &Row<'_>) -> rusqlite::Result<EventRow> {
        Ok(EventRow {
            seq: r.get(0)?,
            time: r.get(1)?,
            sandbox: r.get(2)?,
            phase: r.get(3)?,
            host: r.get(4)?,
            port: r.get(5)?,
            method: r.get(6)?,
            path: r.get(7)?,
            decision: r.get(8)?,
            reason: r.get(9)?,
            rule_id: r.get(10)?,
            bytes_up: r.get(11)?,
            bytes_down: r.get(12)?,
            dropped: r.get(13)?,
        })
    }

    fn decode(self, path: &Path) -> Result<AuditEvent, StoreError> {
        let key = self.seq.to_string();
        let bad = |column, value: &str| corrupt(path, "audit event", &key, column, value);
        Ok(AuditEvent {
            time: Timestamp::parse(&self.time).ok_or_else(|| bad("time", &self.time))?,
            phase: self
                .phase
                .as_deref()
                .map(|p| Phase::parse(p).ok_or_else(|| bad("phase", p)))
                .transpose()?,
            decision: parse_decision(&self.decision)
                .ok_or_else(|| bad("decision", &self.decision))?,
            reason: Reason::parse(&self.reason).ok_or_else(|| bad("reason", &self.reason))?,
            bytes_up: u64::try_from(self.bytes_up).unwrap_or(0),
            bytes_down: u64::try_from(self.bytes_down).unwrap_or(0),
            dropped: u64::try_from(self.dropped).unwrap_or(0),
            sandbox: self.sandbox,
            host: self.host,
            port: self.port,
            method: self.method,
            path: self.path,
            rule_id: self.rule_id,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn timestamps_format_and_parse() {
        let t = Timestamp::from_unix_millis(0);
        assert_eq!(t.to_string(), "1970-01-01T00:00:00.000Z");
        let t = Timestamp::parse("2024-02-29T23:59:59.5Z").unwrap();
        assert_eq!(t.to_string(), "2024-02-29T23:59:59.500Z");
        assert_eq!(
            Timestamp::parse("2026-11-30t12:00:00z")
                .unwrap()
                .to_string(),
            "2026-11-30T12:00:00.000Z"
        );
        assert_eq!(
            Timestamp::parse("2026-11-30T12:00:00.123456Z")
                .unwrap()
                .unix_millis()
                % 1000,
            123
        );
        for bad in [
            "2023-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T00:00:00+01:00",
            "2026-01-01T00:00:00.Z",
            "2026-01-01 00:00:00Z",
            "2026-01-01",
            "",
        ] {
            assert_eq!(Timestamp::parse(bad), None, "{bad}");
        }
        assert_eq!(
            Timestamp::from_unix_millis(i64::MAX).to_string(),
            "9999-12-31T23:59:59.999Z"
        );
        assert_eq!(
            Timestamp::from_unix_millis(i64::MIN).to_string(),
            "0000-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn every_day_round_trips() {
        for days in -800_000..800_000i64 {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        let now = Timestamp::now();
        assert_eq!(Timestamp::parse(&now.to_string()), Some(now));
    }

    #[test]
    fn stored_paths_lose_query_and_fragment_and_stay_bounded() {
        assert_eq!(stored_path("/a/b?token=secret"), "/a/b");
        assert_eq!(stored_path("/a#frag"), "/a");
        assert_eq!(stored_path("?x"), "");
        let long = format!("/{}", "é".repeat(MAX_PATH));
        let cut = stored_path(&long);
        assert!(cut.len() <= MAX_PATH);
        assert!(cut.ends_with('…'));
    }
}
