//! Where capgate keeps things: the data directory, the policy store, and per-sandbox state
//! (the composition it was created with and its credential sentinels).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use capgate_policy::Store;
use capgate_spec::Descriptor;

/// `$CAPGATE_HOME`, else `$XDG_DATA_HOME/capgate`, else `~/.local/share/capgate`.
pub fn data_dir() -> Result<PathBuf> {
    let dir = capgate_policy::store::data_dir()?;
    if let Some(problem) = foreign_data_dir(&dir) {
        bail!("{problem}");
    }
    Ok(dir)
}

/// Why an existing data directory cannot be trusted: it holds the secrets, the CA key and
/// the policy, so one that another user owns, or may write (a shared `CAPGATE_HOME` made
/// by someone else first), could have its files swapped to send the secrets elsewhere.
fn foreign_data_dir(dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = fs::metadata(dir).ok()?; // made later, by this user, 0700
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Some(format!(
            "the data directory `{}` belongs to uid {}, not to this user (uid {me}): it holds capgate's secrets, CA key and policy, which its owner could replace; use a directory of your own (set CAPGATE_HOME)",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Some(format!(
            "the data directory `{}` may be written by other users (mode {:o}): it holds capgate's secrets, CA key and policy; make it private (chmod 700) or use another (CAPGATE_HOME)",
            dir.display(),
            meta.mode() & 0o7777
        ));
    }
    None
}

/// The policy store in the data directory. Its errors name the file.
pub fn open_store() -> Result<Store> {
    Ok(Store::open(&data_dir()?.join("policy.db"))?)
}

/// What to say beside an error that came from a full file system under the data directory
/// (SQLite reports it as a bare `disk I/O error`), if that is what happened.
pub fn full_disk_hint(error: &anyhow::Error) -> Option<String> {
    let storage = error.chain().any(|e| {
        e.downcast_ref::<capgate_policy::store::StoreError>()
            .is_some_and(capgate_policy::store::StoreError::is_storage_failure)
            || e.downcast_ref::<std::io::Error>().is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
                )
            })
    });
    if !storage {
        return None;
    }
    let dir = data_dir().ok()?;
    let fs = rustix::fs::statvfs(&dir).ok()?;
    // Less than 1 MiB free for the user: SQLite cannot even map its shared memory file.
    let free = fs.f_bavail.saturating_mul(fs.f_frsize);
    (free < 1 << 20).then(|| {
        format!(
            "the file system holding capgate's data directory `{}` is full ({free} bytes free): free space there, then try again (`capgate log --prune-before 30d` removes older audit events)",
            dir.display()
        )
    })
}

/// `[a-z0-9][a-z0-9_.-]{0,62}`: a sandbox name is also a hostname and a directory name.
pub fn check_sandbox_name(name: &str) -> Result<()> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_.-".contains(c));
    if !ok {
        bail!(
            "sandbox name `{name}` must be 1 to 63 of a-z, 0-9, `_`, `.`, `-`, starting with a letter or digit"
        );
    }
    Ok(())
}

/// A sandbox's own directory: `<data>/sandboxes/<name>/`, mode 0700.
#[derive(Debug, Clone)]
pub struct SandboxDir {
    pub dir: PathBuf,
}

impl SandboxDir {
    pub fn of(name: &str) -> Result<SandboxDir> {
        check_sandbox_name(name)?;
        Ok(SandboxDir {
            dir: data_dir()?.join("sandboxes").join(name),
        })
    }

    pub fn create(&self) -> Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .with_context(|| format!("cannot create `{}`", self.dir.display()))
    }

    /// Takes the sandbox's lock (creating its directory), held until the file is dropped;
    /// `None` while another process holds it.
    pub fn lock(&self) -> Result<Option<fs::File>> {
        self.create()?;
        let path = self.dir.join("lock");
        let file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot open `{}`", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(Some(file)),
            Err(fs::TryLockError::WouldBlock) => Ok(None),
            Err(fs::TryLockError::Error(e)) => {
                Err(e).with_context(|| format!("cannot lock `{}`", path.display()))
            }
        }
    }

    /// Marks the directory as made for one `capgate run` without `--name` (nor
    /// `--copy-back`: a killed run's changes stay for the user to recover), under its lock:
    /// if that run is killed before it removes its state, a later run or `capgate ls`
    /// reclaims it ([`reclaim_abandoned_runs`]).
    pub fn mark_ephemeral(&self) -> Result<()> {
        let path = self.dir.join(EPHEMERAL_MARKER);
        write_file(&path, b"", 0o600, false)
            .with_context(|| format!("cannot write `{}`", path.display()))
    }

    /// The lock of a directory that exists, without creating either (nor following a
    /// link, nor waiting on a FIFO); `None` when either is missing or another process holds
    /// the lock.
    fn lock_existing(&self) -> Option<fs::File> {
        let file = fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc_flags::NOFOLLOW | libc_flags::NONBLOCK)
            .open(self.dir.join("lock"))
            .ok()?;
        file.try_lock().ok().map(|()| file)
    }

    /// Whether the directory carries the mark of an ephemeral run ([`Self::mark_ephemeral`]).
    fn is_marked_ephemeral(&self) -> bool {
        fs::symlink_metadata(self.dir.join(EPHEMERAL_MARKER)).is_ok()
    }

    /// With the lock held: if the directory is what a killed ephemeral run left, removes
    /// that run's record and everything of it but the lock file, so that a `run --name` or
    /// `create` of the same name starts afresh (and is not reclaimed later as that run).
    pub fn clear_abandoned(&self, name: &str, store: &mut Store) -> Result<()> {
        if !self.is_marked_ephemeral() {
            return Ok(());
        }
        match store.remove_sandbox(name) {
            Ok(_) | Err(capgate_policy::store::StoreError::NoSuchSandbox { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let entries = fs::read_dir(&self.dir)
            .with_context(|| format!("cannot list `{}`", self.dir.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot list `{}`", self.dir.display()))?;
            if entry.file_name() == "lock" {
                continue;
            }
            capgate_sandbox::remove_tree(&entry.path())
                .with_context(|| format!("cannot remove `{}`", entry.path().display()))?;
        }
        Ok(())
    }

    fn made_with_path(&self) -> PathBuf {
        self.dir.join("made-with.json")
    }

    /// Records the lock (an absolute path) and the `--arg` values the sandbox was made
    /// with, so that `run --name` without `--kit` is held to the same lock and args.
    pub fn write_made_with(&self, made: &MadeWith) -> Result<()> {
        let path = self.made_with_path();
        write_file(&path, &serde_json::to_vec_pretty(made)?, 0o600, false)
            .with_context(|| format!("cannot write `{}`", path.display()))
    }

    /// What [`Self::write_made_with`] recorded (`None` for a sandbox made before it was
    /// recorded).
    pub fn made_with(&self) -> Result<Option<MadeWith>> {
        let path = self.made_with_path();
        match fs::read(&path) {
            Ok(b) => {
                Ok(Some(serde_json::from_slice(&b).with_context(|| {
                    format!("`{}` is not valid", path.display())
                })?))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read `{}`", path.display())),
        }
    }

    fn composition_path(&self) -> PathBuf {
        self.dir.join("composition.json")
    }

    fn sentinels_path(&self) -> PathBuf {
        self.dir.join("sentinels.json")
    }

    /// The merged effective descriptor the sandbox was created with; `durable`: synced to
    /// disk before it replaces the old one.
    pub fn write_composition(&self, d: &Descriptor, durable: bool) -> Result<()> {
        let path = self.composition_path();
        let bytes = serde_json::to_vec_pretty(d)?;
        if durable {
            return write_private(&path, &bytes);
        }
        private_dir(&self.dir)?;
        write_file(&path, &bytes, 0o600, false)
            .with_context(|| format!("cannot write `{}`", path.display()))
    }

    pub fn read_composition(&self) -> Result<Descriptor> {
        let path = self.composition_path();
        let bytes = fs::read(&path).with_context(|| {
            format!(
                "cannot read `{}`: was the sandbox created with `capgate create`?",
                path.display()
            )
        })?;
        let loaded = capgate_spec::load(
            &bytes,
            &capgate_spec::Options {
                profile: capgate_spec::Profile::Effective,
                ..capgate_spec::Options::default()
            },
        );
        match loaded.valid() {
            Some(d) => Ok(d.clone()),
            None => bail!(
                "`{}` is not a valid composition: recreate the sandbox",
                path.display()
            ),
        }
    }

    /// The sandbox's sentinels, by credential service (minted once, kept across recreates).
    pub fn sentinels(&self, services: &[String]) -> Result<BTreeMap<String, String>> {
        let path = self.sentinels_path();
        let mut map: BTreeMap<String, String> = match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .with_context(|| format!("`{}` is not valid", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e).with_context(|| format!("cannot read `{}`", path.display())),
        };
        let mut changed = false;
        for s in services {
            if !map.contains_key(s) {
                map.insert(s.clone(), capgate_gateway::secrets::mint_sentinel(s)?);
                changed = true;
            }
        }
        if changed {
            write_private(&path, &serde_json::to_vec_pretty(&map)?)?;
        }
        Ok(map)
    }

    pub fn remove(&self) -> Result<()> {
        // Descriptor by descriptor, following no link: a named sandbox's workload may be
        // swapping links into its volumes while this runs.
        match capgate_sandbox::remove_tree(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("cannot remove `{}`", self.dir.display())),
        }
    }
}

/// The lock and args a sandbox was made with ([`SandboxDir::write_made_with`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MadeWith {
    pub lock: PathBuf,
    pub args: Vec<(String, String)>,
}

/// The file that marks an ephemeral run's sandbox directory.
const EPHEMERAL_MARKER: &str = "ephemeral";

/// Removes the state of `capgate run`s (without `--name`) that ended before they could
/// remove it themselves (SIGKILL, a power cut): a marked directory whose lock no process
/// holds, and its store record. The run removes its directory while holding the lock, so a
/// directory whose marker is still there once the lock is taken was abandoned. Returns the
/// names reclaimed; what cannot be removed is left for the next time, and said.
pub fn reclaim_abandoned_runs(store: &mut Store) -> Vec<String> {
    let Ok(root) = data_dir().map(|d| d.join("sandboxes")) else {
        return Vec::new();
    };
    let Ok(entries) = fs::read_dir(&root) else {
        return Vec::new();
    };
    let mut reclaimed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(dir) = SandboxDir::of(&name) else {
            continue;
        };
        if !dir.is_marked_ephemeral() {
            continue;
        }
        let Some(_lock) = dir.lock_existing() else {
            continue;
        };
        // Taken after the run removed its directory (the file was unlinked under it).
        if !dir.is_marked_ephemeral() {
            continue;
        }
        // Its cgroups first: a run killed together with its helper leaves them (empty once
        // its processes are gone); one still busy keeps the whole run for a later try.
        if let Err(e) = capgate_sandbox::remove_leftover_cgroups(&name) {
            say!("capgate: WARNING: the abandoned run `{name}` is left: {e}");
            continue;
        }
        match store.remove_sandbox(&name) {
            Ok(_) | Err(capgate_policy::store::StoreError::NoSuchSandbox { .. }) => {}
            Err(e) => {
                say!("capgate: WARNING: the abandoned run `{name}` is left: {e}");
                continue;
            }
        }
        match dir.remove() {
            Ok(()) => reclaimed.push(name),
            Err(e) => say!("capgate: WARNING: the abandoned run `{name}` is left: {e:#}"),
        }
    }
    reclaimed
}

/// A kit file's bytes, at most one more than the descriptor reader takes (so it can say
/// the file is too large) however large the file is: a hostile kit of a gigabyte is not
/// read into memory to be refused.
pub fn read_kit_file(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let limit = capgate_spec::yaml::Limits::DEFAULT.max_bytes + 1;
    let mut bytes = Vec::new();
    open_regular(path)?
        .take(u64::try_from(limit).unwrap_or(u64::MAX))
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Reads the regular file at `path`, at most `limit` bytes of it (more is an error): a
/// FIFO or a device put in its place (`/dev/zero`) is refused without blocking or
/// reading it, the open never waiting on it.
pub fn read_regular(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    open_regular(path)?
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(bytes)
}

/// Opens `path` for reading if it is a regular file (without waiting on a FIFO).
fn open_regular(path: &Path) -> std::io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_flags::NONBLOCK | libc_flags::NOCTTY)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Open flags, from rustix (no `libc` dependency here).
mod libc_flags {
    pub const NONBLOCK: i32 = rustix::fs::OFlags::NONBLOCK.bits() as i32;
    pub const NOCTTY: i32 = rustix::fs::OFlags::NOCTTY.bits() as i32;
    pub const NOFOLLOW: i32 = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
}

/// Writes a file readable by its owner only, atomically, its directory made owner-only.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        private_dir(dir)?;
    }
    write_atomically(path, bytes, 0o600)
        .with_context(|| format!("cannot write `{}`", path.display()))
}

/// `mkdir -p` with mode 0700 for what it creates, whatever the umask: everything under
/// the data directory is the invoking user's alone.
pub fn private_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create `{}`", dir.display()))
}

/// Writes a file so that a reader sees the old or the new content, never a torn one: a new
/// temporary file of an unguessable name beside it (`O_CREAT|O_EXCL`, so never through a
/// link someone left there, never truncating someone's file), with `mode` from the start,
/// then renamed over `path`.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write_file(path, bytes, mode, true)
}

/// [`write_atomically`], the new content synced to disk before the rename when `sync`.
fn write_file(path: &Path, bytes: &[u8], mode: u32, sync: bool) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut nonce = [0u8; 8];
    if getrandom::fill(&mut nonce).is_err() {
        nonce = u64::from(std::process::id()).to_le_bytes();
    }
    let tmp = dir.join(format!(
        ".{}.tmp-{:016x}",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("capgate"),
        u64::from_le_bytes(nonce)
    ));
    {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        let written = f
            .write_all(bytes)
            .and_then(|()| if sync { f.sync_all() } else { Ok(()) });
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
    }
    fs::rename(&tmp, path)
}
