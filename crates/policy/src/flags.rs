//! Kit versions flagged after capability violations (seed 002: "the pack version is
//! flagged; subsequent runs of the same version emit a warning on each invocation until the
//! pack is patched").
//!
//! A flag is keyed by the digest of the workload kit's descriptor, so any change to the kit
//! (a patch) leaves the flag behind; the same bytes run again are warned about every time.

use rusqlite::{OptionalExtension as _, params};
use serde::Serialize;

use crate::audit::Timestamp;
use crate::store::{Store, StoreError, read_err, write_err};

/// What is recorded of a kit version whose runs were refused something.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KitFlag {
    /// `sha256:<hex>` of the kit's descriptor.
    pub digest: String,
    /// The kit reference it was run as.
    pub kit: String,
    pub version: Option<String>,
    /// Runs that ended with at least one refusal.
    pub runs: u64,
    /// Refusals over those runs.
    pub refusals: u64,
    pub first_at: String,
    pub last_at: String,
    /// The sandbox of the last such run (its refusals: `capgate log --sandbox NAME`).
    pub last_sandbox: String,
}

/// One run's violations, to be recorded against its workload kit.
#[derive(Debug, Clone, Copy)]
pub struct Violations<'a> {
    pub digest: &'a str,
    pub kit: &'a str,
    pub version: Option<&'a str>,
    pub refusals: u64,
    pub sandbox: &'a str,
}

impl Store {
    /// Records a run of a kit version that was refused `refusals` times (more than zero).
    pub fn flag_kit(&mut self, v: &Violations<'_>) -> Result<(), StoreError> {
        const ACTION: &str = "flag the kit";
        let now = Timestamp::now().to_string();
        let path = self.path().to_owned();
        self.connection_mut()
            .execute(
                "INSERT INTO kit_flags (digest, kit, version, runs, refusals, first_at, last_at, last_sandbox)
                 VALUES (?1, ?2, ?3, 1, ?4, ?5, ?5, ?6)
                 ON CONFLICT (digest) DO UPDATE SET
                    kit = excluded.kit, version = excluded.version, runs = runs + 1,
                    refusals = refusals + excluded.refusals, last_at = excluded.last_at,
                    last_sandbox = excluded.last_sandbox",
                params![
                    v.digest,
                    v.kit,
                    v.version,
                    i64::try_from(v.refusals).unwrap_or(i64::MAX),
                    now,
                    v.sandbox
                ],
            )
            .map_err(write_err(&path, ACTION))?;
        Ok(())
    }

    /// The flag on the kit version with this digest, if it has one.
    pub fn kit_flag(&self, digest: &str) -> Result<Option<KitFlag>, StoreError> {
        self.connection()
            .query_row(
                "SELECT digest, kit, version, runs, refusals, first_at, last_at, last_sandbox
                 FROM kit_flags WHERE digest = ?1",
                [digest],
                |r| {
                    Ok(KitFlag {
                        digest: r.get(0)?,
                        kit: r.get(1)?,
                        version: r.get(2)?,
                        runs: u64::try_from(r.get::<_, i64>(3)?).unwrap_or(0),
                        refusals: u64::try_from(r.get::<_, i64>(4)?).unwrap_or(0),
                        first_at: r.get(5)?,
                        last_at: r.get(6)?,
                        last_sandbox: r.get(7)?,
                    })
                },
            )
            .optional()
            .map_err(read_err(self.path(), "read the kit's flag"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn flags_count_runs_and_refusals_per_kit_version() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("policy.db")).unwrap();
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(store.kit_flag(&digest).unwrap(), None);
        let run = |refusals, sandbox| Violations {
            digest: &digest,
            kit: "./pack",
            version: Some("1.0.0"),
            refusals,
            sandbox,
        };
        store.flag_kit(&run(3, "run-1")).unwrap();
        store.flag_kit(&run(2, "run-2")).unwrap();
        let flag = store.kit_flag(&digest).unwrap().unwrap();
        assert_eq!((flag.runs, flag.refusals), (2, 5));
        assert_eq!(flag.last_sandbox, "run-2");
        assert_eq!(flag.version.as_deref(), Some("1.0.0"));
        assert!(flag.first_at <= flag.last_at);
        // Another version (other bytes) is not flagged.
        assert_eq!(
            store
                .kit_flag(&format!("sha256:{}", "b".repeat(64)))
                .unwrap(),
            None
        );
        // Zero refusals is not a violation: the store refuses to record it.
        assert!(store.flag_kit(&run(0, "run-3")).is_err());
    }
}
