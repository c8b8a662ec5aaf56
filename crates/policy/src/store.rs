//! The policy store: rules, sandbox records, the active preset and the audit log, in one
//! SQLite file (`policy.db` in the data directory).
//!
//! The gateway and the CLI use the store at the same time, each with its own connection:
//! the file is in write-ahead-log mode, every connection waits up to [`BUSY_TIMEOUT`] for
//! the write lock, and every change takes the write lock when its transaction begins
//! (`BEGIN IMMEDIATE`), so a reader never has to upgrade to a writer half way (the one case
//! a busy timeout cannot help). Every change is one transaction: a killed process leaves
//! the rule set as it was before the change or after it, never in between.
//!
//! The schema is versioned with `PRAGMA user_version` and grown by [`MIGRATIONS`]. A file
//! written by a newer capgate is refused before anything in it is changed.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{
    Connection, OpenFlags, OptionalExtension, Params, Row, TransactionBehavior, params,
};
use serde::Serialize;

use crate::audit::Timestamp;
use crate::presets::{Preset, PresetError};
use crate::rule::{
    CreatedVia, Decision, Method, Phase, Protocol, ResourceType, Rule, Scope, Source,
};

/// How long a connection waits for another one to release the write lock.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The store's file name inside the data directory.
pub const FILE_NAME: &str = "policy.db";

/// Schema migrations, applied in order, each in its own transaction; `PRAGMA user_version`
/// counts the ones applied. A released entry is never edited: append a new one.
pub const MIGRATIONS: &[&str] = &[MIGRATION_1, MIGRATION_2, MIGRATION_3];

/// The trigger that keeps rows from being deleted, as version 1 creates it. Only
/// [`crate::audit::prune`] lifts it, inside its own transaction.
pub(crate) const AUDIT_NO_DELETE_TRIGGER: &str =
    "CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END";

/// Version 3: kit versions flagged after capability violations (see [`crate::flags`]).
const MIGRATION_3: &str = r"
CREATE TABLE kit_flags (
    digest       TEXT PRIMARY KEY CHECK (substr(digest, 1, 7) = 'sha256:'),
    kit          TEXT NOT NULL,
    version      TEXT,
    runs         INTEGER NOT NULL CHECK (runs > 0),
    refusals     INTEGER NOT NULL CHECK (refusals > 0),
    first_at     TEXT NOT NULL,
    last_at      TEXT NOT NULL,
    last_sandbox TEXT NOT NULL
) STRICT;
";

/// Version 2: rules may name the protocols `http` and `https` (the egress triples of
/// packs). SQLite cannot change a CHECK, so the table is rebuilt with its rows, ids and
/// creation order kept.
const MIGRATION_2: &str = r"
CREATE TABLE rules_v2 (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,  -- creation order
    id            TEXT NOT NULL UNIQUE CHECK (id <> ''),
    name          TEXT NOT NULL CHECK (name <> ''),
    scope         TEXT NOT NULL
                  CHECK (scope = 'global' OR (substr(scope, 1, 8) = 'sandbox:' AND length(scope) > 8)),
    resource_type TEXT NOT NULL CHECK (resource_type IN ('network')),
    decision      TEXT NOT NULL CHECK (decision IN ('allow', 'deny')),
    resources     TEXT NOT NULL CHECK (json_valid(resources) AND json_type(resources) = 'array'
                                       AND json_array_length(resources) > 0),
    methods       TEXT CHECK (methods IS NULL OR (json_valid(methods) AND json_type(methods) = 'array')),
    paths         TEXT CHECK (paths IS NULL OR (json_valid(paths) AND json_type(paths) = 'array')),
    protocol      TEXT NOT NULL CHECK (protocol IN ('tcp', 'udp', 'any', 'http', 'https')),
    phase         TEXT CHECK (phase IS NULL OR phase IN ('install', 'runtime')),
    source        TEXT NOT NULL CHECK (source IN ('kit', 'user', 'default')),
    created_via   TEXT NOT NULL CHECK (created_via IN ('provisioned', 'added', 'default')),
    editable      INTEGER NOT NULL CHECK (editable IN (0, 1)),
    active        INTEGER NOT NULL CHECK (active IN (0, 1)),
    created_at    TEXT NOT NULL,
    CHECK (created_via <> 'provisioned' OR (editable = 0 AND scope <> 'global'))
) STRICT;
INSERT INTO rules_v2 SELECT * FROM rules;
-- The creation counter goes on where it was (rules removed last keep their seq unused).
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'rules_v2', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'rules_v2');
UPDATE sqlite_sequence
   SET seq = max(seq, coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'rules'), 0))
 WHERE name = 'rules_v2';
DROP TABLE rules;
ALTER TABLE rules_v2 RENAME TO rules;
CREATE INDEX rules_by_scope ON rules (scope);
";

/// Version 1: rules, sandboxes, settings, and the append-only audit log.
const MIGRATION_1: &str = r"
CREATE TABLE rules (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,  -- creation order
    id            TEXT NOT NULL UNIQUE CHECK (id <> ''),
    name          TEXT NOT NULL CHECK (name <> ''),
    scope         TEXT NOT NULL
                  CHECK (scope = 'global' OR (substr(scope, 1, 8) = 'sandbox:' AND length(scope) > 8)),
    resource_type TEXT NOT NULL CHECK (resource_type IN ('network')),
    decision      TEXT NOT NULL CHECK (decision IN ('allow', 'deny')),
    resources     TEXT NOT NULL CHECK (json_valid(resources) AND json_type(resources) = 'array'
                                       AND json_array_length(resources) > 0),
    methods       TEXT CHECK (methods IS NULL OR (json_valid(methods) AND json_type(methods) = 'array')),
    paths         TEXT CHECK (paths IS NULL OR (json_valid(paths) AND json_type(paths) = 'array')),
    protocol      TEXT NOT NULL CHECK (protocol IN ('tcp', 'udp', 'any')),
    phase         TEXT CHECK (phase IS NULL OR phase IN ('install', 'runtime')),
    source        TEXT NOT NULL CHECK (source IN ('kit', 'user', 'default')),
    created_via   TEXT NOT NULL CHECK (created_via IN ('provisioned', 'added', 'default')),
    editable      INTEGER NOT NULL CHECK (editable IN (0, 1)),
    active        INTEGER NOT NULL CHECK (active IN (0, 1)),
    created_at    TEXT NOT NULL,
    CHECK (created_via <> 'provisioned' OR (editable = 0 AND scope <> 'global'))
) STRICT;
CREATE INDEX rules_by_scope ON rules (scope);

CREATE TABLE sandboxes (
    name        TEXT PRIMARY KEY CHECK (name <> ''),
    created_at  TEXT NOT NULL,
    kits        TEXT NOT NULL CHECK (json_valid(kits) AND json_type(kits) = 'array'),
    lock_digest TEXT,
    surface     TEXT CHECK (surface IS NULL OR json_valid(surface)),
    state       TEXT NOT NULL CHECK (state IN ('created', 'running', 'stopped')),
    CHECK ((lock_digest IS NULL) <> (surface IS NULL))
) STRICT;

CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

CREATE TABLE audit (
    seq        INTEGER PRIMARY KEY,
    time       TEXT NOT NULL,
    sandbox    TEXT NOT NULL,
    phase      TEXT CHECK (phase IS NULL OR phase IN ('install', 'runtime')),
    host       TEXT NOT NULL,
    port       INTEGER NOT NULL CHECK (port BETWEEN 0 AND 65535),
    method     TEXT,
    path       TEXT CHECK (path IS NULL OR (instr(path, '?') = 0 AND instr(path, '#') = 0)),
    decision   TEXT NOT NULL CHECK (decision IN ('allow', 'deny')),
    reason     TEXT NOT NULL,
    rule_id    TEXT,
    bytes_up   INTEGER NOT NULL CHECK (bytes_up >= 0),
    bytes_down INTEGER NOT NULL CHECK (bytes_down >= 0),
    dropped    INTEGER NOT NULL DEFAULT 0 CHECK (dropped >= 0)
) STRICT;
CREATE INDEX audit_by_time ON audit (time);
CREATE INDEX audit_by_sandbox ON audit (sandbox, time);
CREATE INDEX audit_by_group ON audit (sandbox, host, port, decision);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
";

/// The data directory: `$CAPGATE_HOME`, else `$XDG_DATA_HOME/capgate`, else
/// `~/.local/share/capgate`.
pub fn data_dir() -> Result<PathBuf, StoreError> {
    data_dir_from(|name| std::env::var_os(name))
}

/// [`data_dir`] with the environment passed in. Empty variables count as unset, and so does
/// a relative `XDG_DATA_HOME` (the XDG base directory specification says to ignore it).
pub fn data_dir_from(
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<PathBuf, StoreError> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(home) = set("CAPGATE_HOME") {
        // Relative, every command would use another store depending on where it runs.
        if !home.is_absolute() {
            return Err(StoreError::RelativeDataDir(home));
        }
        return Ok(home);
    }
    if let Some(xdg) = set("XDG_DATA_HOME").filter(|p| p.is_absolute()) {
        return Ok(xdg.join("capgate"));
    }
    match set("HOME") {
        Some(home) => Ok(home.join(".local/share/capgate")),
        None => Err(StoreError::NoDataDir),
    }
}

/// A rule before the store has given it an id and a creation time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRule {
    pub name: String,
    pub scope: Scope,
    pub resource_type: ResourceType,
    pub decision: Decision,
    pub resources: Vec<String>,
    pub methods: Option<Vec<Method>>,
    pub paths: Option<Vec<String>>,
    pub protocol: Protocol,
    pub phase: Option<Phase>,
    pub source: Source,
    pub created_via: CreatedVia,
    pub editable: bool,
    pub active: bool,
}

impl NewRule {
    /// A rule the user adds (`capgate policy allow|deny`): editable, active, both phases.
    pub fn user(
        name: impl Into<String>,
        scope: Scope,
        decision: Decision,
        resources: Vec<String>,
        protocol: Protocol,
    ) -> NewRule {
        NewRule {
            name: name.into(),
            scope,
            resource_type: ResourceType::Network,
            decision,
            resources,
            methods: None,
            paths: None,
            protocol,
            phase: None,
            source: Source::User,
            created_via: CreatedVia::Added,
            editable: true,
            active: true,
        }
    }

    /// A rule provisioned from a kit's grants for `sandbox`: not editable.
    pub fn provisioned(
        name: impl Into<String>,
        sandbox: &str,
        decision: Decision,
        resources: Vec<String>,
        protocol: Protocol,
    ) -> NewRule {
        NewRule {
            name: name.into(),
            scope: Scope::Sandbox(sandbox.to_owned()),
            resource_type: ResourceType::Network,
            decision,
            resources,
            methods: None,
            paths: None,
            protocol,
            phase: None,
            source: Source::Kit,
            created_via: CreatedVia::Provisioned,
            editable: false,
            active: true,
        }
    }

    /// Whether the store would take this rule: the error it would refuse it with. For
    /// callers that must know before they write anything else.
    pub fn validate(&self) -> Result<(), StoreError> {
        check_rule(self)
    }

    /// The consistency the store keeps for every rule it holds.
    fn check(&self) -> Result<(), RuleProblem> {
        if self.name.is_empty() {
            return Err(RuleProblem::EmptyName);
        }
        if matches!(&self.scope, Scope::Sandbox(n) if n.is_empty()) {
            return Err(RuleProblem::EmptySandboxName);
        }
        if self.resources.is_empty() {
            return Err(RuleProblem::NoResources);
        }
        if self
            .resources
            .iter()
            .any(|r| r.trim().is_empty() || r.trim() != r)
        {
            return Err(RuleProblem::BlankResource);
        }
        // A resource the matcher cannot read would be dropped when rules are compiled: for a
        // deny, a refusal silently not in force. Refused here, where it is written.
        for resource in &self.resources {
            if let Err(e) = crate::pattern::HostPattern::parse(resource) {
                return Err(RuleProblem::UnreadableResource {
                    resource: resource.clone(),
                    message: e.to_string(),
                });
            }
        }
        if self.methods.as_ref().is_some_and(Vec::is_empty) {
            return Err(RuleProblem::EmptyMethods);
        }
        if self.paths.as_ref().is_some_and(Vec::is_empty) {
            return Err(RuleProblem::EmptyPaths);
        }
        // A path glob the matcher cannot compile would make the rule match nothing: an
        // allow silently dead, a deny silently not in force. Refused here too.
        for path in self.paths.iter().flatten() {
            if let Err(e) = crate::path::PathGlob::compile(path) {
                return Err(RuleProblem::UnreadablePath {
                    path: path.clone(),
                    message: e.to_string(),
                });
            }
        }
        let paired = matches!(
            (self.source, self.created_via),
            (Source::Kit, CreatedVia::Provisioned)
                | (Source::User, CreatedVia::Added)
                | (Source::Default, CreatedVia::Default)
        );
        if !paired {
            return Err(RuleProblem::SourceMismatch {
                source: self.source,
                created_via: self.created_via,
            });
        }
        if self.created_via == CreatedVia::Provisioned {
            if self.editable {
                return Err(RuleProblem::ProvisionedEditable);
            }
            if self.scope == Scope::Global {
                return Err(RuleProblem::ProvisionedGlobal);
            }
        }
        if self.created_via == CreatedVia::Default && self.scope != Scope::Global {
            return Err(RuleProblem::DefaultNotGlobal);
        }
        Ok(())
    }
}

/// Which rules [`Store::rules`] lists. The default lists every rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleFilter {
    /// The rules that apply to this sandbox: the global ones and its own.
    pub sandbox: Option<String>,
    pub source: Option<Source>,
    pub decision: Option<Decision>,
}

/// What a sandbox was created from: the digest of the lock file it was gated on, or the
/// permission surface itself when there was no lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxGrants {
    LockDigest(String),
    Surface(serde_json::Value),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Created,
    Running,
    Stopped,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Created => "created",
            SandboxState::Running => "running",
            SandboxState::Stopped => "stopped",
        }
    }

    pub fn parse(s: &str) -> Option<SandboxState> {
        match s {
            "created" => Some(SandboxState::Created),
            "running" => Some(SandboxState::Running),
            "stopped" => Some(SandboxState::Stopped),
            _ => None,
        }
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A sandbox as recorded when it is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxRecord {
    pub name: String,
    pub created_at: Timestamp,
    /// The kit references it was created with, workload first.
    pub kits: Vec<String>,
    pub grants: SandboxGrants,
    pub state: SandboxState,
}

impl SandboxRecord {
    /// A record created now, in state `created`.
    pub fn new(name: impl Into<String>, kits: Vec<String>, grants: SandboxGrants) -> SandboxRecord {
        SandboxRecord {
            name: name.into(),
            created_at: Timestamp::now(),
            kits,
            grants,
            state: SandboxState::Created,
        }
    }
}

/// What [`Store::remove_sandbox`] removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RemovedSandbox {
    pub record: SandboxRecord,
    /// Its provisioned rules and the user rules scoped to it.
    pub rules: Vec<Rule>,
}

/// Why a rule cannot be removed or replaced by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotEditableReason {
    /// Written from the kits of a sandbox; rewritten whenever the sandbox is provisioned.
    Provisioned { sandbox: String },
    /// Part of the preset.
    Preset,
    /// Marked read-only when it was added.
    ReadOnly,
}

impl fmt::Display for NotEditableReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotEditableReason::Provisioned { sandbox } => write!(
                f,
                "provisioned from kit for sandbox `{sandbox}`; remove the sandbox or change its kits"
            ),
            NotEditableReason::Preset => f.write_str(
                "part of the preset; choose another with `capgate policy init allow-all|balanced|deny-all`, \
                 or add a deny rule to override it",
            ),
            NotEditableReason::ReadOnly => f.write_str("it was added as read-only"),
        }
    }
}

/// Why a rule was refused before it was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleProblem {
    EmptyName,
    EmptySandboxName,
    NoResources,
    BlankResource,
    /// A resource the matcher cannot read (a port 0, a path, …).
    UnreadableResource {
        resource: String,
        message: String,
    },
    UnreadablePath {
        path: String,
        message: String,
    },
    EmptyMethods,
    EmptyPaths,
    SourceMismatch {
        source: Source,
        created_via: CreatedVia,
    },
    ProvisionedEditable,
    ProvisionedGlobal,
    DefaultNotGlobal,
    /// Given to [`Store::replace_provisioned`] but not a provisioned rule.
    NotProvisioned,
    /// Given to [`Store::replace_provisioned`] for another sandbox's scope.
    OtherScope {
        expected: Scope,
        found: Scope,
    },
}

impl fmt::Display for RuleProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleProblem::EmptyName => f.write_str("the name is empty"),
            RuleProblem::EmptySandboxName => f.write_str("the sandbox name of its scope is empty"),
            RuleProblem::NoResources => f.write_str("it names no resource"),
            RuleProblem::UnreadableResource { resource, message } => {
                write!(f, "resource `{resource}` cannot be matched: {message}")
            }
            RuleProblem::UnreadablePath { path, message } => {
                write!(f, "path `{path}` cannot be matched: {message}")
            }
            RuleProblem::BlankResource => {
                f.write_str("a resource is empty or has surrounding spaces")
            }
            RuleProblem::EmptyMethods => f.write_str("it states an empty list of methods"),
            RuleProblem::EmptyPaths => f.write_str("it states an empty list of paths"),
            RuleProblem::SourceMismatch {
                source,
                created_via,
            } => write!(
                f,
                "source `{}` does not go with created_via `{}`",
                source_text(*source),
                created_via_text(*created_via)
            ),
            RuleProblem::ProvisionedEditable => {
                f.write_str("a provisioned rule cannot be editable")
            }
            RuleProblem::ProvisionedGlobal => {
                f.write_str("a provisioned rule must be scoped to its sandbox")
            }
            RuleProblem::DefaultNotGlobal => f.write_str("a preset rule must be global"),
            RuleProblem::NotProvisioned => f.write_str("it is not a provisioned rule"),
            RuleProblem::OtherScope { expected, found } => {
                write!(f, "its scope is `{found}`, not `{expected}`")
            }
        }
    }
}

/// Everything that can fail in the store and the audit log.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot find the data directory: set `CAPGATE_HOME`, `XDG_DATA_HOME` or `HOME`")]
    NoDataDir,
    #[error("`CAPGATE_HOME` is `{}`, a relative path: give an absolute one", .0.display())]
    RelativeDataDir(PathBuf),
    #[error("{}: cannot create the directory", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot create the policy store", path.display())]
    CreateFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot restrict the policy store to its owner", path.display())]
    Permissions {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot open the policy store", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{}: cannot configure the policy store ({setting})", path.display())]
    Configure {
        path: PathBuf,
        setting: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{}: the file system does not support write-ahead logging (journal mode `{mode}`)", path.display())]
    NoWal { path: PathBuf, mode: String },
    #[error(
        "{}: the policy store has schema version {found}, newer than the {supported} this capgate knows; \
         upgrade capgate (the file was not changed)",
        path.display()
    )]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: usize,
    },
    #[error("{}: cannot migrate the policy store to schema version {version}", path.display())]
    Migrate {
        path: PathBuf,
        version: usize,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{}: cannot {action}", path.display())]
    Read {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{}: cannot {action}", path.display())]
    Write {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{}: cannot encode `{field}` of `{key}`", path.display())]
    Encode {
        path: PathBuf,
        key: String,
        field: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: {table} `{key}` has an unreadable `{column}`: `{value}`", path.display())]
    Corrupt {
        path: PathBuf,
        table: &'static str,
        key: String,
        column: &'static str,
        value: String,
    },
    #[error("rule `{name}` is refused: {problem}")]
    InvalidRule { name: String, problem: RuleProblem },
    #[error("{}", no_such_rule(id, scope.as_ref()))]
    NoSuchRule { id: String, scope: Option<Scope> },
    #[error("rule `{id}` (`{name}`) cannot be changed: {reason}")]
    NotEditable {
        id: String,
        name: String,
        reason: NotEditableReason,
    },
    #[error("no sandbox `{name}`")]
    NoSuchSandbox { name: String },
    #[error("sandbox `{name}` already exists")]
    SandboxExists { name: String },
    #[error("the built-in preset is invalid")]
    Preset {
        #[source]
        source: PresetError,
    },
    #[error("{}: cannot start the audit writer", path.display())]
    SpawnAuditWriter {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: the audit writer has stopped", path.display())]
    AuditWriterStopped { path: PathBuf },
    #[error("{}: {lost} audit events could not be written", path.display())]
    AuditLost {
        path: PathBuf,
        lost: u64,
        #[source]
        source: rusqlite::Error,
    },
}

impl StoreError {
    /// Whether the file system failed under the store (SQLite's `SQLITE_FULL` or an I/O
    /// error, ENOSPC and EDQUOT among the causes): a full disk is the usual one, which the
    /// caller can tell by looking.
    pub fn is_storage_failure(&self) -> bool {
        use std::error::Error as _;
        let mut cause = self.source();
        while let Some(e) = cause {
            if let Some(rusqlite::Error::SqliteFailure(f, _)) = e.downcast_ref::<rusqlite::Error>()
                && matches!(
                    f.code,
                    rusqlite::ErrorCode::DiskFull | rusqlite::ErrorCode::SystemIoFailure
                )
            {
                return true;
            }
            if let Some(io) = e.downcast_ref::<io::Error>()
                && matches!(
                    io.kind(),
                    io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
                )
            {
                return true;
            }
            cause = e.source();
        }
        false
    }
}

fn no_such_rule(id: &str, scope: Option<&Scope>) -> String {
    match scope {
        Some(scope) => format!("no rule `{id}` in scope `{scope}`"),
        None => format!("no rule `{id}`"),
    }
}

/// An open policy store (one SQLite connection).
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

impl Store {
    /// Opens `data_dir()/policy.db`, creating it.
    pub fn open_default() -> Result<Store, StoreError> {
        Store::open(&data_dir()?.join(FILE_NAME))
    }

    /// Opens the store at `path`, creating it (missing directories mode 0700, the file mode
    /// 0600) and bringing its schema up to date. A store written by a newer capgate is
    /// refused untouched.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|source| StoreError::CreateDir {
                    path: parent.to_owned(),
                    source,
                })?;
        }
        // Create the file ourselves so that it is never readable by others, whatever the
        // umask; SQLite gives the `-wal` and `-shm` files the mode of the database file.
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(StoreError::CreateFile {
                    path: path.to_owned(),
                    source,
                });
            }
        }
        let open_err = |source| StoreError::Open {
            path: path.to_owned(),
            source,
        };
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(open_err)?;
        let configure = |setting| {
            move |source| StoreError::Configure {
                path: path.to_owned(),
                setting,
                source,
            }
        };
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(configure("busy timeout"))?;

        // Nothing may be written before the version is known to be ours.
        let version = user_version(&conn).map_err(open_err)?;
        check_version(path, version)?;

        restrict_mode(path)?;
        let mode = wal_mode(&conn).map_err(configure("journal_mode"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::NoWal {
                path: path.to_owned(),
                mode,
            });
        }
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(configure("synchronous"))?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(configure("foreign_keys"))?;

        let mut store = Store {
            conn,
            path: path.to_owned(),
        };
        if usize::try_from(version).is_ok_and(|v| v < MIGRATIONS.len()) {
            store.migrate()?;
        }
        Ok(store)
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        for (index, sql) in MIGRATIONS.iter().enumerate() {
            let version = index + 1;
            let err = |source| StoreError::Migrate {
                path: self.path.clone(),
                version,
                source,
            };
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(err)?;
            // Another process may have migrated while this one waited for the lock.
            let current = user_version(&tx).map_err(err)?;
            check_version(&self.path, current)?;
            if usize::try_from(current).is_ok_and(|c| c >= version) {
                continue;
            }
            tx.execute_batch(sql).map_err(err)?;
            tx.pragma_update(
                None,
                "user_version",
                i64::try_from(version).unwrap_or(i64::MAX),
            )
            .map_err(err)?;
            tx.commit().map_err(err)?;
        }
        Ok(())
    }

    /// The file this store was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.conn
    }

    pub(crate) fn connection_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    // ---------------------------------------------------------------------------------
    // Rules.

    /// Stores a rule and returns it with its new id (`r-` and 12 hex digits) and creation
    /// time.
    pub fn add_rule(&mut self, rule: NewRule) -> Result<Rule, StoreError> {
        check_rule(&rule)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(write_err(&self.path, "add a rule"))?;
        let added = insert_rule(&tx, &self.path, rule)?;
        tx.commit().map_err(write_err(&self.path, "add a rule"))?;
        Ok(added)
    }

    /// The rule with this id.
    pub fn rule(&self, id: &str) -> Result<Option<Rule>, StoreError> {
        let rules = select_rules(&self.conn, &self.path, "WHERE id = ?1", [id])?;
        Ok(rules.into_iter().next())
    }

    /// The rules the filter selects, in the order they were created.
    pub fn rules(&self, filter: &RuleFilter) -> Result<Vec<Rule>, StoreError> {
        select_rules(
            &self.conn,
            &self.path,
            "WHERE (?1 IS NULL OR scope = 'global' OR scope = 'sandbox:' || ?1)
               AND (?2 IS NULL OR source = ?2)
               AND (?3 IS NULL OR decision = ?3)",
            params![
                filter.sandbox,
                filter.source.map(source_text),
                filter.decision.map(decision_text)
            ],
        )
    }

    /// Removes the rule `id` (which must be in `scope` when one is given) and returns it.
    /// A rule that is not editable is refused with the reason.
    pub fn remove_rule_by_id(
        &mut self,
        id: &str,
        scope: Option<&Scope>,
    ) -> Result<Rule, StoreError> {
        const ACTION: &str = "remove a rule";
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(write_err(&self.path, ACTION))?;
        let scope_text = scope.map(Scope::to_string);
        let found = select_rules(
            &tx,
            &self.path,
            "WHERE id = ?1 AND (?2 IS NULL OR scope = ?2)",
            params![id, scope_text],
        )?;
        let Some(rule) = found.into_iter().next() else {
            return Err(StoreError::NoSuchRule {
                id: id.to_owned(),
                scope: scope.cloned(),
            });
        };
        refuse_locked(&rule)?;
        tx.execute("DELETE FROM rules WHERE id = ?1", [id])
            .map_err(write_err(&self.path, ACTION))?;
        tx.commit().map_err(write_err(&self.path, ACTION))?;
        Ok(rule)
    }

    /// Removes every rule (in `scope` when one is given) whose resources include `resource`
    /// exactly, whole, and returns them (none when no rule lists it). If any of them is not
    /// editable, nothing is removed and the first such rule is named in the refusal: the
    /// user would otherwise believe a host gone that a kit or the preset still allows.
    pub fn remove_rules_by_resource(
        &mut self,
        resource: &str,
        scope: Option<&Scope>,
    ) -> Result<Vec<Rule>, StoreError> {
        const ACTION: &str = "remove rules";
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(write_err(&self.path, ACTION))?;
        let scope_text = scope.map(Scope::to_string);
        let found = select_rules(
            &tx,
            &self.path,
            "WHERE EXISTS (SELECT 1 FROM json_each(rules.resources) WHERE json_each.value = ?1)
               AND (?2 IS NULL OR scope = ?2)",
            params![resource, scope_text],
        )?;
        for rule in &found {
            refuse_locked(rule)?;
        }
        for rule in &found {
            tx.execute("DELETE FROM rules WHERE id = ?1", [&rule.id])
                .map_err(write_err(&self.path, ACTION))?;
        }
        tx.commit().map_err(write_err(&self.path, ACTION))?;
        Ok(found)
    }

    /// Replaces every provisioned rule of `sandbox` with `rules`, atomically: readers see
    /// the old set or the new one. Each rule must be provisioned and scoped to `sandbox`,
    /// and the sandbox must exist. Returns the stored rules.
    pub fn replace_provisioned(
        &mut self,
        sandbox: &str,
        rules: Vec<NewRule>,
    ) -> Result<Vec<Rule>, StoreError> {
        const ACTION: &str = "replace provisioned rules";
        let scope = Scope::Sandbox(sandbox.to_owned());
        for rule in &rules {
            check_rule(rule)?;
            let problem = if rule.created_via != CreatedVia::Provisioned {
                Some(RuleProblem::NotProvisioned)
            } else if rule.scope != scope {
                Some(RuleProblem::OtherScope {
                    expected: scope.clone(),
                    found: rule.scope.clone(),
                })
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(StoreError::InvalidRule {
                    name: rule.name.clone(),
                    problem,
                });
            }
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(write_err(&self.path, ACTION))?;
        if !sandbox_exists(&tx, &self.path, sandbox)? {
            return Err(StoreError::NoSuchSandbox {
                name: sandbox.to_owned(),
            });
        }
        tx.execute(
            "DELETE FROM rules WHERE scope = ?1 AND created_via = 'provisioned'",
            [scope.to_string()],
        )
        .map_err(write_err(&self.path, ACTION))?;
        let stored = rules
            .into_iter()
            .map(|r| insert_rule(&tx, &self.path, r))
            .collect::<Result<Vec<_>, _>>()?;
        tx.commit().map_err(write_err(&self.path, ACTION))?;
        Ok(stored)
    }

    /// Records a sandbox (or updates the record of an existing one, keeping its creation
    /// time) and replaces its provisioned rules with `rules`, in one transaction: a
    /// recreated sandbox never has the old grants beside the new ones, and a killed process
    /// leaves the old state whole.
    pub fn provision_sandbox(
        &mut self,
        record: SandboxRecord,
        rules: Vec<NewRule>,
    ) -> Result<Vec<Rule>, StoreError> {
        const ACTION: &str = "provision the sandbox";
        let scope = Scope::Sandbox(record.name.clone());
        for rule in &rules {
            check_rule(rule)?;
            if rule.created_via != CreatedVia::Provisioned || rule.scope != scope {
                return Err(StoreError::InvalidRule {
                    name: rule.name.clone(),
                    problem: RuleProblem::OtherScope {
                        expected: scope.clone(),
                        found: rule.scope.clone(),
                    },
                });
            }
        }
        let (kits, lock_digest, surface) = self.encode_record(&record)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(write_err(&self.path, ACTION))?;
        tx.execute(
            "INSERT INTO sandboxes (name, created_at, kits, lock_digest, surface, state)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(name) DO UPDATE SET kits = excluded.kits,
                 lock_digest = excluded.lock_digest, surface = excluded.surface,
                 state = excluded.state",
            params![
                record.name,
                record.created_at.to_string(),
                kits,
                lock_digest,
                surface,
                record.state.as_str()
            ],
        )
        .map_err(write_err(&self.path, ACTION))?;
        tx.execute(
            "DELETE FROM rules WHERE scope = ?1 AND created_via = 'provisioned'",
            [scope.to_string()],
        )
        .map_err(write_err(&self.path, ACTION))?;
        let stored = rules
            .into_iter()
            .map(|r| insert_rule(&tx, &self.path, r))
            .collect::<Result<Vec<_>, _>>()?;
        tx.commit().map_err(write_err(&self.path, ACTION))?;
        Ok(stored)
    }

    /// Replaces every preset rule (`source = default`) with the rules of `preset`, and
    /// records it as the active preset. Returns the stored rules.
    ///
    /// Kit allows apply on top of any preset; only a deny rule beats them. `deny-all`
    /// stores no rule at all: it is not a deny rule.
    pub fn apply_preset(&mut self, preset: Preset) -> Result<Vec<Rule>, StoreError> {
        const ACTION: &str = "apply the preset";
        let rules = preset
            .rules()
            .map_err(|source| StoreError::Preset { source })?;
        for rule in &rules {
            check_rule(rule)?;
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(write_err(&self.path, ACTION))?;
        tx.execute("DELETE FROM rules WHERE source = 'default'", [])
            .map_err(write_err(&self.path, ACTION))?;
        let stored = rules
            .into_iter()
            .map(|r| insert_rule(&tx, &self.path, r))
            .collect::<Result<Vec<_>, _>>()?;
        tx.execute(
            "INSERT INTO settings (key, value) VALUES ('preset', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [preset.as_str()],
        )
        .map_err(write_err(&self.path, ACTION))?;
        tx.commit().map_err(write_err(&self.path, ACTION))?;
        Ok(stored)
    }

    /// The preset last applied, if any.
    pub fn preset(&self) -> Result<Option<Preset>, StoreError> {
        let value: Option<String> = self
            .conn
            .query_row("SELECT value FROM settings WHERE key = 'preset'", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(read_err(&self.path, "read the preset"))?;
        value
            .map(|v| {
                Preset::parse(&v)
                    .ok_or_else(|| corrupt(&self.path, "setting", "preset", "value", &v))
            })
            .transpose()
    }

    // ---------------------------------------------------------------------------------
    // Sandboxes.

    /// The stored columns of a record: kits as JSON, and the lock digest or the surface.
    fn encode_record(
        &self,
        record: &SandboxRecord,
    ) -> Result<(String, Option<String>, Option<String>), StoreError> {
        let kits = serde_json::to_string(&record.kits).map_err(|source| StoreError::Encode {
            path: self.path.clone(),
            key: record.name.clone(),
            field: "kits",
            source,
        })?;
        Ok(match &record.grants {
            SandboxGrants::LockDigest(d) => (kits, Some(d.clone()), None),
            SandboxGrants::Surface(s) => (kits, None, Some(s.to_string())),
        })
    }

    pub fn create_sandbox(&mut self, record: SandboxRecord) -> Result<(), StoreError> {
        const ACTION: &str = "record the sandbox";
        let (kits, lock_digest, surface) = self.encode_record(&record)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(write_err(&self.path, ACTION))?;
        if sandbox_exists(&tx, &self.path, &record.name)? {
            return Err(StoreError::SandboxExists { name: record.name });
        }
        tx.execute(
            "INSERT INTO sandboxes (name, created_at, kits, lock_digest, surface, state)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                record.name,
                record.created_at.to_string(),
                kits,
                lock_digest,
                surface,
                record.state.as_str()
            ],
        )
        .map_err(write_err(&self.path, ACTION))?;
        tx.commit().map_err(write_err(&self.path, ACTION))
    }

    pub fn sandbox(&self, name: &str) -> Result<Option<SandboxRecord>, StoreError> {
        Ok(
            select_sandboxes(&self.conn, &self.path, "WHERE name = ?1", [name])?
                .into_iter()
                .next(),
        )
    }

    /// Every sandbox, in the order they were created.
    pub fn sandboxes(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        select_sandboxes(&self.conn, &self.path, "", [])
    }

    pub fn set_sandbox_state(&mut self, name: &str, state: SandboxState) -> Result<(), StoreError> {
        let changed = self
            .conn
            .execute(
                "UPDATE sandboxes SET state = ?2 WHERE name = ?1",
                params![name, state.as_str()],
            )
            .map_err(write_err(&self.path, "change the sandbox state"))?;
        if changed == 0 {
            return Err(StoreError::NoSuchSandbox {
                name: name.to_owned(),
            });
        }
        Ok(())
    }

    /// Removes a sandbox with its provisioned rules and the user rules scoped to it, in one
    /// transaction. Its audit events stay.
    pub fn remove_sandbox(&mut self, name: &str) -> Result<RemovedSandbox, StoreError> {
        const ACTION: &str = "remove the sandbox";
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(write_err(&self.path, ACTION))?;
        let Some(record) = select_sandboxes(&tx, &self.path, "WHERE name = ?1", [name])?
            .into_iter()
            .next()
        else {
            return Err(StoreError::NoSuchSandbox {
                name: name.to_owned(),
            });
        };
        let scope = Scope::Sandbox(name.to_owned()).to_string();
        let rules = select_rules(&tx, &self.path, "WHERE scope = ?1", [&scope])?;
        tx.execute("DELETE FROM rules WHERE scope = ?1", [&scope])
            .map_err(write_err(&self.path, ACTION))?;
        tx.execute("DELETE FROM sandboxes WHERE name = ?1", [name])
            .map_err(write_err(&self.path, ACTION))?;
        tx.commit().map_err(write_err(&self.path, ACTION))?;
        Ok(RemovedSandbox { record, rules })
    }
}

/// Puts the file in write-ahead-log mode (once per file; later opens find it so) and
/// returns the mode it is in. The switch takes the file exclusively, and SQLite answers a
/// switch that finds another connection in the file with "busy" at once, without its
/// busy handler: processes opening a new store together (the workers of `capgate warm`,
/// parallel runs) wait for each other here, for up to [`BUSY_TIMEOUT`].
fn wal_mode(conn: &Connection) -> rusqlite::Result<String> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        let current: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
        if current.eq_ignore_ascii_case("wal") {
            return Ok(current);
        }
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
}

fn check_version(path: &Path, version: i64) -> Result<(), StoreError> {
    if usize::try_from(version).is_ok_and(|v| v <= MIGRATIONS.len()) {
        Ok(())
    } else {
        Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found: version,
            supported: MIGRATIONS.len(),
        })
    }
}

/// Takes group and other permissions away from the store, if it has any.
fn restrict_mode(path: &Path) -> Result<(), StoreError> {
    let err = |source| StoreError::Permissions {
        path: path.to_owned(),
        source,
    };
    let mode = fs::metadata(path).map_err(err)?.permissions().mode();
    if mode & 0o077 != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o700)).map_err(err)?;
    }
    Ok(())
}

pub(crate) fn read_err(
    path: &Path,
    action: &'static str,
) -> impl FnOnce(rusqlite::Error) -> StoreError + use<> {
    let path = path.to_owned();
    move |source| StoreError::Read {
        path,
        action,
        source,
    }
}

pub(crate) fn write_err(
    path: &Path,
    action: &'static str,
) -> impl FnOnce(rusqlite::Error) -> StoreError + use<> {
    let path = path.to_owned();
    move |source| StoreError::Write {
        path,
        action,
        source,
    }
}

pub(crate) fn corrupt(
    path: &Path,
    table: &'static str,
    key: &str,
    column: &'static str,
    value: &str,
) -> StoreError {
    StoreError::Corrupt {
        path: path.to_owned(),
        table,
        key: key.to_owned(),
        column,
        value: value.to_owned(),
    }
}

fn check_rule(rule: &NewRule) -> Result<(), StoreError> {
    rule.check().map_err(|problem| StoreError::InvalidRule {
        name: rule.name.clone(),
        problem,
    })
}

fn refuse_locked(rule: &Rule) -> Result<(), StoreError> {
    if rule.editable {
        return Ok(());
    }
    let reason = match (&rule.created_via, &rule.scope) {
        (CreatedVia::Provisioned, Scope::Sandbox(sandbox)) => NotEditableReason::Provisioned {
            sandbox: sandbox.clone(),
        },
        (CreatedVia::Default, _) => NotEditableReason::Preset,
        _ => NotEditableReason::ReadOnly,
    };
    Err(StoreError::NotEditable {
        id: rule.id.clone(),
        name: rule.name.clone(),
        reason,
    })
}

fn sandbox_exists(conn: &Connection, path: &Path, name: &str) -> Result<bool, StoreError> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sandboxes WHERE name = ?1)",
        [name],
        |r| r.get(0),
    )
    .map_err(read_err(path, "look up the sandbox"))
}

fn insert_rule(conn: &Connection, path: &Path, rule: NewRule) -> Result<Rule, StoreError> {
    let encode = |field, value: Result<String, serde_json::Error>| {
        value.map_err(|source| StoreError::Encode {
            path: path.to_owned(),
            key: rule.name.clone(),
            field,
            source,
        })
    };
    let resources = encode("resources", serde_json::to_string(&rule.resources))?;
    let methods = rule
        .methods
        .as_ref()
        .map(|m| encode("methods", serde_json::to_string(m)))
        .transpose()?;
    let paths = rule
        .paths
        .as_ref()
        .map(|p| encode("paths", serde_json::to_string(p)))
        .transpose()?;
    let created_at = Timestamp::now().to_string();
    let id: String = conn
        .prepare_cached(
            "INSERT INTO rules (id, name, scope, resource_type, decision, resources, methods, paths,
                                protocol, phase, source, created_via, editable, active, created_at)
             VALUES ('r-' || lower(hex(randomblob(6))), ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
             RETURNING id",
        )
        .and_then(|mut stmt| {
            stmt.query_row(
                params![
                    rule.name,
                    rule.scope.to_string(),
                    resource_type_text(rule.resource_type),
                    decision_text(rule.decision),
                    resources,
                    methods,
                    paths,
                    protocol_text(rule.protocol),
                    rule.phase.map(Phase::as_str),
                    source_text(rule.source),
                    created_via_text(rule.created_via),
                    rule.editable,
                    rule.active,
                    created_at,
                ],
                |r| r.get(0),
            )
        })
        .map_err(write_err(path, "store a rule"))?;
    Ok(Rule {
        id,
        name: rule.name,
        scope: rule.scope,
        resource_type: rule.resource_type,
        decision: rule.decision,
        resources: rule.resources,
        methods: rule.methods,
        paths: rule.paths,
        protocol: rule.protocol,
        phase: rule.phase,
        source: rule.source,
        created_via: rule.created_via,
        editable: rule.editable,
        active: rule.active,
        created_at,
    })
}

/// A `rules` row as stored, before its text is decoded.
struct RuleRow {
    id: String,
    name: String,
    scope: String,
    resource_type: String,
    decision: String,
    resources: String,
    methods: Option<String>,
    paths: Option<String>,
    protocol: String,
    phase: Option<String>,
    source: String,
    created_via: String,
    editable: bool,
    active: bool,
    created_at: String,
}

impl RuleRow {
    const COLUMNS: &str = "id, name, scope, resource_type, decision, resources, methods, paths, \
                           protocol, phase, source, created_via, editable, active, created_at";

    fn read(row: &Row<'_>) -> rusqlite::Result<RuleRow> {
        Ok(RuleRow {
            id: row.get(0)?,
            name: row.get(1)?,
            scope: row.get(2)?,
            resource_type: row.get(3)?,
            decision: row.get(4)?,
            resources: row.get(5)?,
            methods: row.get(6)?,
            paths: row.get(7)?,
            protocol: row.get(8)?,
            phase: row.get(9)?,
            source: row.get(10)?,
            created_via: row.get(11)?,
            editable: row.get(12)?,
            active: row.get(13)?,
            created_at: row.get(14)?,
        })
    }

    fn decode(self, path: &Path) -> Result<Rule, StoreError> {
        let id = self.id.as_str();
        let bad = |column, value: &str| corrupt(path, "rule", id, column, value);
        fn json_list<T: serde::de::DeserializeOwned>(
            value: &str,
            bad: impl Fn(&'static str, &str) -> StoreError,
            column: &'static str,
        ) -> Result<T, StoreError> {
            serde_json::from_str(value).map_err(|_| bad(column, value))
        }
        Ok(Rule {
            scope: Scope::parse(&self.scope).ok_or_else(|| bad("scope", &self.scope))?,
            resource_type: parse_resource_type(&self.resource_type)
                .ok_or_else(|| bad("resource_type", &self.resource_type))?,
            decision: parse_decision(&self.decision)
                .ok_or_else(|| bad("decision", &self.decision))?,
            resources: json_list(&self.resources, bad, "resources")?,
            methods: self
                .methods
                .as_deref()
                .map(|m| json_list(m, bad, "methods"))
                .transpose()?,
            paths: self
                .paths
                .as_deref()
                .map(|p| json_list(p, bad, "paths"))
                .transpose()?,
            protocol: parse_protocol(&self.protocol)
                .ok_or_else(|| bad("protocol", &self.protocol))?,
            phase: self
                .phase
                .as_deref()
                .map(|p| Phase::parse(p).ok_or_else(|| bad("phase", p)))
                .transpose()?,
            source: parse_source(&self.source).ok_or_else(|| bad("source", &self.source))?,
            created_via: parse_created_via(&self.created_via)
                .ok_or_else(|| bad("created_via", &self.created_via))?,
            editable: self.editable,
            active: self.active,
            created_at: self.created_at,
            name: self.name,
            id: self.id,
        })
    }
}

fn select_rules(
    conn: &Connection,
    path: &Path,
    filter: &str,
    params: impl Params,
) -> Result<Vec<Rule>, StoreError> {
    let sql = format!(
        "SELECT {} FROM rules {filter} ORDER BY seq",
        RuleRow::COLUMNS
    );
    let rows = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| {
            stmt.query_map(params, RuleRow::read)?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(read_err(path, "read the rules"))?;
    rows.into_iter().map(|row| row.decode(path)).collect()
}

struct SandboxRow {
    name: String,
    created_at: String,
    kits: String,
    lock_digest: Option<String>,
    surface: Option<String>,
    state: String,
}

fn select_sandboxes(
    conn: &Connection,
    path: &Path,
    filter: &str,
    params: impl Params,
) -> Result<Vec<SandboxRecord>, StoreError> {
    let sql = format!(
        "SELECT name, created_at, kits, lock_digest, surface, state FROM sandboxes {filter} ORDER BY rowid"
    );
    let rows = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| {
            stmt.query_map(params, |row| {
                Ok(SandboxRow {
                    name: row.get(0)?,
                    created_at: row.get(1)?,
                    kits: row.get(2)?,
                    lock_digest: row.get(3)?,
                    surface: row.get(4)?,
                    state: row.get(5)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(read_err(path, "read the sandboxes"))?;
    rows.into_iter()
        .map(|row| {
            let bad = |column, value: &str| corrupt(path, "sandbox", &row.name, column, value);
            let grants = match (&row.lock_digest, &row.surface) {
                (Some(digest), None) => SandboxGrants::LockDigest(digest.clone()),
                (None, Some(surface)) => SandboxGrants::Surface(
                    serde_json::from_str(surface).map_err(|_| bad("surface", surface))?,
                ),
                _ => return Err(bad("lock_digest", row.lock_digest.as_deref().unwrap_or(""))),
            };
            Ok(SandboxRecord {
                created_at: Timestamp::parse(&row.created_at)
                    .ok_or_else(|| bad("created_at", &row.created_at))?,
                kits: serde_json::from_str(&row.kits).map_err(|_| bad("kits", &row.kits))?,
                grants,
                state: SandboxState::parse(&row.state).ok_or_else(|| bad("state", &row.state))?,
                name: row.name.clone(),
            })
        })
        .collect()
}

// The text forms of the rule enums, as stored (the same words as their JSON forms).

pub(crate) fn decision_text(d: Decision) -> &'static str {
    match d {
        Decision::Allow => "allow",
        Decision::Deny => "deny",
    }
}

pub(crate) fn parse_decision(s: &str) -> Option<Decision> {
    match s {
        "allow" => Some(Decision::Allow),
        "deny" => Some(Decision::Deny),
        _ => None,
    }
}

fn resource_type_text(r: ResourceType) -> &'static str {
    match r {
        ResourceType::Network => "network",
    }
}

fn parse_resource_type(s: &str) -> Option<ResourceType> {
    (s == "network").then_some(ResourceType::Network)
}

fn protocol_text(p: Protocol) -> &'static str {
    p.as_str()
}

fn parse_protocol(s: &str) -> Option<Protocol> {
    Protocol::parse(s)
}

fn source_text(s: Source) -> &'static str {
    match s {
        Source::Kit => "kit",
        Source::User => "user",
        Source::Default => "default",
    }
}

fn parse_source(s: &str) -> Option<Source> {
    match s {
        "kit" => Some(Source::Kit),
        "user" => Some(Source::User),
        "default" => Some(Source::Default),
        _ => None,
    }
}

fn created_via_text(c: CreatedVia) -> &'static str {
    match c {
        CreatedVia::Provisioned => "provisioned",
        CreatedVia::Added => "added",
        CreatedVia::Default => "default",
    }
}

fn parse_created_via(s: &str) -> Option<CreatedVia> {
    match s {
        "provisioned" => Some(CreatedVia::Provisioned),
        "added" => Some(CreatedVia::Added),
        "default" => Some(CreatedVia::Default),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn data_dir_prefers_capgate_home_then_xdg_then_home() {
        let all = [
            ("CAPGATE_HOME", "/c"),
            ("XDG_DATA_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(data_dir_from(env(&all)).ok(), Some(PathBuf::from("/c")));
        let xdg = [
            ("CAPGATE_HOME", ""),
            ("XDG_DATA_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(
            data_dir_from(env(&xdg)).ok(),
            Some(PathBuf::from("/x/capgate"))
        );
        let relative_xdg = [("XDG_DATA_HOME", "x"), ("HOME", "/h")];
        assert_eq!(
            data_dir_from(env(&relative_xdg)).ok(),
            Some(PathBuf::from("/h/.local/share/capgate"))
        );
        assert!(matches!(
            data_dir_from(env(&[])),
            Err(StoreError::NoDataDir)
        ));
        assert!(matches!(
            data_dir_from(env(&[("CAPGATE_HOME", "../home")])),
            Err(StoreError::RelativeDataDir(_))
        ));
    }

    #[test]
    fn enum_texts_round_trip() {
        for d in [Decision::Allow, Decision::Deny] {
            assert_eq!(parse_decision(decision_text(d)), Some(d));
        }
        for p in Protocol::ALL {
            assert_eq!(parse_protocol(protocol_text(p)), Some(p));
        }
        for s in [Source::Kit, Source::User, Source::Default] {
            assert_eq!(parse_source(source_text(s)), Some(s));
        }
        for c in [
            CreatedVia::Provisioned,
            CreatedVia::Added,
            CreatedVia::Default,
        ] {
            assert_eq!(parse_created_via(created_via_text(c)), Some(c));
        }
    }
}
