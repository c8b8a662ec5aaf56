//! `capgate run --copy-back`: the workload's changes to a copy-mode workspace reach the host
//! directory after the run, except changes to files the host runs (hooks, runner
//! configuration) and symbolic links, which are diverted: onto the branch
//! `capgate/<sandbox>` when the workspace is a git work tree (committed with git's plumbing,
//! the working tree and the current branch untouched, hooks off), else into a folder of the
//! data directory. Changes beneath `.git` never leave the sandbox. The sandbox crate's
//! `copyback` module reads the changes and writes them safely; this module decides, diverts
//! and reports.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};
use capgate_sandbox::copyback::{self, Change, ChangeKind, Limits, Refusal};
use capgate_spec::text::printable;

/// Where the diverted changes went.
#[derive(Debug)]
enum Diverted {
    Nothing,
    Branch { branch: String, commit: String },
    Folder(PathBuf),
}

/// What the composition is read from, as host paths: files (descriptors, bodies, the lock)
/// and the directories of kits given as directories, where any descriptor-like file
/// (`*.yaml`, `*.yml`, `*.dockerfile`) could become the descriptor read.
#[derive(Debug, Default)]
pub struct KitFiles {
    pub files: Vec<PathBuf>,
    pub dirs: Vec<PathBuf>,
}

/// What a copy-back left undone.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Everything was applied or diverted: the upper directory may be emptied.
    Complete,
    /// Something was refused: the upper directory should be kept for the user.
    Refusals,
}

/// Runs copy-back from the overlay upper directory `upper` into the host directory
/// `workspace`, and says what it did on stderr. An error means nothing was applied (a
/// change that cannot be applied alone is refused and named, the others applied).
pub fn copy_back(
    upper: &Path,
    workspace: &Path,
    sandbox: &str,
    data: &Path,
    kit: &KitFiles,
) -> Result<Outcome> {
    let found = copyback::scan(upper, &Limits::default()).with_context(|| {
        format!(
            "cannot read the workload's changes in `{}`",
            upper.display()
        )
    })?;
    let root = std::fs::canonicalize(workspace)?;
    let also = host_runners(&root, &kit.files)?;
    let kit_dirs: Vec<PathBuf> = kit
        .dirs
        .iter()
        .filter_map(|d| d.strip_prefix(&root).ok().map(Path::to_path_buf))
        .collect();
    // A descriptor-like file in a kit directory could be read instead of the kit's own.
    let descriptor_like = |path: &Path| {
        path.parent()
            .is_some_and(|p| kit_dirs.iter().any(|d| d == p))
            && path
                .extension()
                .is_some_and(|x| x == "yaml" || x == "yml" || x == "dockerfile")
    };
    let mut apply = Vec::new();
    let mut divert: Vec<(Change, &str)> = Vec::new();
    let mut metadata = 0usize;
    for change in found.changes {
        match copyback::divert_reason(&change, &also) {
            None if descriptor_like(&change.path) => divert.push((change, KIT_FILE_REASON)),
            None => apply.push(change),
            Some(_) if is_git_metadata(&change.path) => metadata += 1,
            // A directory is carried by the files diverted beneath it.
            Some(_) if matches!(change.kind, ChangeKind::Dir { opaque: false }) => {}
            Some(reason) => divert.push((change, reason)),
        }
    }
    // Diverted first: when that fails, nothing has been applied.
    let diverted = if divert.is_empty() {
        Diverted::Nothing
    } else {
        let files = copyback::Upper::open(upper)?;
        divert_changes(&files, workspace, sandbox, data, &divert)?
    };
    let applied = copyback::apply(upper, workspace, &apply)
        .with_context(|| format!("cannot copy back into `{}`", workspace.display()))?;

    let say = |s: String| say!("capgate: copy-back: {s}");
    let shown = |p: &Path| printable(&p.to_string_lossy()).into_owned();
    say(format!(
        "{} written, {} made, {} removed in {}",
        count(applied.written.len(), "file"),
        count(applied.made.len(), "directory"),
        count(applied.removed.len(), "entry"),
        shown(workspace)
    ));
    // What reached the host tree, by name (the first few): a file written where git does
    // not look (an ignored folder) shows here and nowhere else.
    let touched: Vec<&PathBuf> = applied.written.iter().chain(&applied.removed).collect();
    for path in touched.iter().take(SHOWN) {
        let what = if applied.removed.contains(path) {
            "removed"
        } else {
            "written"
        };
        say!("  {what} {}", shown(path));
    }
    if touched.len() > SHOWN {
        say!("  … and {} more", touched.len() - SHOWN);
    }
    match &diverted {
        Diverted::Nothing => {}
        Diverted::Branch { branch, commit } => say(format!(
            "{} NOT applied (files the host runs, this sandbox's kits and lock, or links); committed on branch {branch} ({}), review with: git diff HEAD {branch}",
            count(divert.len(), "change"),
            &commit[..commit.len().min(12)]
        )),
        Diverted::Folder(dir) => say(format!(
            "{} NOT applied (files the host runs, this sandbox's kits and lock, or links); saved in {} for review",
            count(divert.len(), "change"),
            dir.display()
        )),
    }
    for (change, reason) in &divert {
        say!("  {}: {reason}", shown(&change.path));
    }
    // Kept with the refusals: the workload's own commits live there.
    let mut refusals = metadata;
    if metadata > 0 {
        say(format!(
            "{} beneath .git (the repository's metadata) NOT copied back",
            count(metadata, "change")
        ));
    }
    for Refusal { path, reason } in found.skipped.iter().chain(&applied.refused) {
        refusals += 1;
        say(format!("refused {}: {}", shown(path), printable(reason)));
    }
    Ok(if refusals == 0 {
        Outcome::Complete
    } else {
        Outcome::Refusals
    })
}

/// Keys of git's configuration whose whole value is a path (which may hold spaces, and
/// need not hold a `/`). Every other value counts by its words that hold a `/`.
fn is_path_key(key: &str) -> bool {
    matches!(
        key,
        "core.hookspath" | "core.attributesfile" | "core.worktree" | "init.templatedir"
    ) || (key.starts_with("include") && key.ends_with(".path"))
}

/// Most entries of the host tree looked at (for runner-named links and nested
/// repositories); a larger tree cannot be checked, and copy-back refuses it.
const TREE_WALK_LIMIT: usize = 1_000_000;

/// Why a change to a kit file is diverted (see [`host_runners`]).
const KIT_FILE_REASON: &str = "a kit or the lock of this sandbox: applied, the next run would approve the workload's own grants and hooks";

/// Host paths inside the workspace (`root`, canonical) that are runners by the host's own
/// doing, beyond [`copyback::RUNNERS`], as workspace-relative paths:
/// - `kit_files`, the files the composition is read from (its kits' descriptors and
///   bodies, its lock);
/// - for the repository around the workspace and every repository nested in it: each
///   configuration file git reads (all scopes), every path its values name (a path key's
///   whole value; other values' words that hold a `/`: programs of filters, drivers,
///   helpers, aliases, pagers, ssh commands, …), relative to the top of the work tree,
///   to the file that names it and to the workspace, whether it exists or not; the hooks
///   directory and the links in it;
/// - where a host link named like a runner points (`app/.vscode -> ../editor`).
///
/// Each path counts as written, as its longest existing prefix resolves, with every host
/// link on its way and where the links lead, and, for a directory, with the targets of
/// the links in it. Fails (and copy-back applies nothing) when git cannot read a
/// repository that is there, or the tree is larger than [`TREE_WALK_LIMIT`].
fn host_runners(root: &Path, kit_files: &[PathBuf]) -> Result<Vec<(PathBuf, &'static str)>> {
    let root = root.to_path_buf();
    let mut named: Vec<(PathBuf, &'static str)> = kit_files
        .iter()
        .map(|p| (normalize(p), KIT_FILE_REASON))
        .collect();
    let mut repos = vec![root.clone()];
    let mut budget = TREE_WALK_LIMIT;
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            budget = budget.checked_sub(1).with_context(|| {
                format!(
                    "`{}` holds more than {TREE_WALK_LIMIT} entries: copy-back cannot check it for links to files the host runs",
                    printable(&root.to_string_lossy())
                )
            })?;
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let rel = path.strip_prefix(&root).unwrap_or(&path);
            if entry.file_name() == ".git" {
                repos.push(dir.clone());
            } else if kind.is_file() {
                for program in yarn_programs(&path) {
                    named.push((normalize(&dir.join(program)), YARN_REASON));
                }
            } else if kind.is_symlink() && copyback::runner_reason(rel).is_some() {
                if let Ok(target) = std::fs::read_link(&path) {
                    named.push((
                        normalize(&dir.join(target)),
                        "the host links a file it runs (a runner) here",
                    ));
                }
            } else if kind.is_dir() {
                stack.push(path);
            }
        }
    }
    repos.dedup();
    for repo in &repos {
        git_runners(&root, repo, &mut named)?;
    }
    let mut out: Vec<(PathBuf, &'static str)> = Vec::new();
    let mut add = |rel: PathBuf, reason: &'static str| {
        // The workspace itself is no runner path (`git add .` in an alias).
        if !rel.as_os_str().is_empty() && !out.iter().any(|(p, _)| *p == rel) {
            out.push((rel, reason));
        }
    };
    for (path, reason) in named {
        let mut forms = with_links(&root, &path);
        forms.extend(with_links(&root, &resolved_prefix(&path)));
        for rel in forms {
            // A directory's links lead to runners too (a hook that links elsewhere).
            for entry in std::fs::read_dir(root.join(&rel))
                .into_iter()
                .flatten()
                .flatten()
            {
                if let Ok(target) = std::fs::read_link(entry.path()) {
                    for linked in with_links(&root, &normalize(&root.join(&rel).join(target))) {
                        add(linked, reason);
                    }
                }
            }
            add(rel, reason);
        }
    }
    Ok(out)
}

/// Why a program a yarn configuration names is diverted.
const YARN_REASON: &str =
    "a yarn configuration on the host names this program: every yarn call runs or loads it";

/// The programs the yarn configuration at `path` (if it is one: `.yarnrc.yml` of yarn 2
/// and later, `.yarnrc` of yarn 1) names: its `yarnPath` or `yarn-path`, and the `path`
/// of each plugin, as written (relative to the file's directory).
fn yarn_programs(path: &Path) -> Vec<String> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase());
    let keys: &[&str] = match name.as_deref() {
        Some(".yarnrc.yml" | ".yarnrc.yaml") => &["yarnPath:", "path:", "- path:"],
        Some(".yarnrc") => &["yarn-path ", "yarn-path\t", "\"yarn-path\""],
        _ => return Vec::new(),
    };
    // A configuration is small; one that is not is read no further than this.
    let mut text = String::new();
    let _ = std::fs::File::open(path).and_then(|f| {
        std::io::Read::read_to_string(&mut std::io::Read::take(f, 1 << 20), &mut text)
    });
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let value = keys.iter().find_map(|k| line.strip_prefix(k))?;
            let value = value.split(" #").next().unwrap_or_default().trim();
            let value = value.trim_matches(|c| c == '"' || c == '\'');
            (!value.is_empty()).then(|| value.to_owned())
        })
        .collect()
}

/// What the repository at `repo` (if it is one) makes a runner: see [`host_runners`].
fn git_runners(root: &Path, repo: &Path, named: &mut Vec<(PathBuf, &'static str)>) -> Result<()> {
    let git_out = |args: &[&str]| -> Option<Vec<u8>> {
        Command::new("git")
            .arg("-C")
            .arg(repo)
            // Reading a repository another user owns runs nothing of it.
            .args(["-c", "safe.directory=*"])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| o.stdout)
    };
    let located = git_out(&[
        "rev-parse",
        "--path-format=absolute",
        "--show-toplevel",
        "--git-common-dir",
    ]);
    let Some(located) = located else {
        if repo.join(".git").exists() {
            bail!(
                "git cannot read the repository at `{}`, so what its configuration runs is unknown",
                printable(&repo.to_string_lossy())
            );
        }
        return Ok(());
    };
    let text = String::from_utf8_lossy(&located).into_owned();
    let mut lines = text.lines();
    let (top, common) = (
        PathBuf::from(lines.next().unwrap_or_default()),
        PathBuf::from(lines.next().unwrap_or_default()),
    );
    named.push((
        common.join("hooks"),
        "the repository's hooks: git runs them",
    ));
    let Some(config) = git_out(&["config", "--list", "--show-origin", "--null"]) else {
        bail!(
            "git cannot read the configuration of the repository at `{}`",
            printable(&repo.to_string_lossy())
        );
    };
    let fields: Vec<String> = config
        .split(|b| *b == 0)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    for pair in fields.chunks_exact(2) {
        let origin = pair[0].strip_prefix("file:").map(|f| repo.join(f));
        if let Some(file) = &origin {
            named.push((normalize(file), "a git configuration file: git obeys it"));
        }
        let (key, value) = pair[1].split_once('\n').unwrap_or((&pair[1], ""));
        let mut bases = vec![top.clone(), root.to_path_buf()];
        bases.extend(
            origin
                .as_deref()
                .and_then(Path::parent)
                .map(Path::to_path_buf),
        );
        let mut paths: Vec<&str> = value
            .split(|c: char| c.is_whitespace() || "\"';&|()=<>`".contains(c))
            .map(|w| w.trim_start_matches('!'))
            .filter(|w| w.contains('/') && !w.contains("://"))
            .collect();
        if is_path_key(key) && !value.trim().is_empty() {
            paths.push(value.trim());
        }
        for path in paths {
            for base in &bases {
                named.push((
                    normalize(&base.join(expand_home(path))),
                    "the repository's git configuration names it: git runs or reads it",
                ));
            }
        }
    }
    Ok(())
}

/// `path` with its longest existing prefix resolved (links followed, out of the
/// workspace and back in included) and the rest as written.
fn resolved_prefix(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        if let Ok(real) = std::fs::canonicalize(at) {
            let mut out = real;
            out.extend(rest.iter().rev());
            return out;
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                at = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// `path` without `.` and `..` components, read as written (a link on the way is not
/// followed: [`with_links`] follows them).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The workspace-relative forms of the absolute `path`: as written, each host link on its
/// way, and where those links lead (at most 40 links), those inside `root` only.
fn with_links(root: &Path, path: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = path.to_path_buf();
    for _ in 0..40 {
        let Ok(rel) = pending.strip_prefix(root) else {
            break;
        };
        let rel = rel.to_path_buf();
        out.push(rel.clone());
        let mut here = root.to_path_buf();
        let mut next = None;
        let names: Vec<_> = rel.components().collect();
        for (i, name) in names.iter().enumerate() {
            here.push(name);
            if let Ok(target) = std::fs::read_link(&here) {
                out.push(here.strip_prefix(root).unwrap_or(&here).to_path_buf());
                let mut resolved = here.parent().unwrap_or(root).join(target);
                resolved.extend(&names[i + 1..]);
                next = Some(normalize(&resolved));
                break;
            }
        }
        match next {
            Some(n) => pending = n,
            None => break,
        }
    }
    out
}

/// `~/x` as git reads it in a config value.
fn expand_home(value: &str) -> PathBuf {
    match (value.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(value),
    }
}

/// How many applied paths the summary names.
const SHOWN: usize = 20;

fn count(n: usize, what: &str) -> String {
    match (n, what) {
        (1, _) => format!("1 {what}"),
        (_, "directory") => format!("{n} directories"),
        (_, "entry") => format!("{n} entries"),
        _ => format!("{n} {what}s"),
    }
}

fn is_git_metadata(path: &Path) -> bool {
    // The runner patterns' rule: names compare without regard to ASCII case.
    path.components().any(|c| {
        c.as_os_str()
            .as_encoded_bytes()
            .eq_ignore_ascii_case(b".git")
    })
}

fn divert_changes(
    upper: &copyback::Upper,
    workspace: &Path,
    sandbox: &str,
    data: &Path,
    divert: &[(Change, &str)],
) -> Result<Diverted> {
    let changes: Vec<&Change> = divert.iter().map(|(c, _)| c).collect();
    let repository = workspace.join(".git").exists();
    let unsuitable = repository.then(|| branch_unsuitable(workspace)).flatten();
    if let Some(why) = &unsuitable {
        say!(
            "capgate: copy-back: the diverted changes are not committed in this repository ({why}); saving them in the data directory instead"
        );
    }
    if repository && unsuitable.is_none() {
        // A new branch each time: `capgate/NAME`, else `capgate/NAME-2`, …
        let taken = |b: &str| {
            let reference = format!("refs/heads/{b}");
            Command::new("git")
                .arg("-C")
                .arg(workspace)
                .args(["rev-parse", "--verify", "-q", &reference])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let branch = unused(&format!("capgate/{sandbox}"), taken);
        match commit_on_branch(upper, workspace, &branch, &changes, data) {
            Ok(commit) => return Ok(Diverted::Branch { branch, commit }),
            Err(e) => say!(
                "capgate: copy-back: the diverted changes could not be committed on {branch} ({e:#}); saving them in the data directory instead"
            ),
        }
    }
    let dir = unused_dir(&data.join("copyback"), sandbox);
    save_in_folder(upper, &dir, &changes)?;
    Ok(Diverted::Folder(dir))
}

/// Why the repository of `workspace` must not get a branch, if it must not: git's
/// objects owned by another user (as root in a user's repository, they would be left
/// root's, and the user's own git would fail on them), or a partial clone (writing a tree
/// may fetch missing objects, running the remote's configured programs).
fn branch_unsuitable(workspace: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let out = Command::new("git")
        .arg("-C")
        .arg(workspace)
        // Only reading: which user's it is, is what is asked.
        .args(["-c", "safe.directory=*"])
        .args(["rev-parse", "--path-format=absolute", "--git-common-dir"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success());
    let Some(out) = out else {
        return Some("git cannot read it".into());
    };
    let common = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim_end());
    let euid = rustix::process::geteuid().as_raw();
    for dir in [common.clone(), common.join("objects")] {
        match std::fs::metadata(&dir) {
            Ok(m) if m.uid() == euid => {}
            Ok(m) => return Some(format!("`{}` belongs to uid {}", dir.display(), m.uid())),
            Err(e) => return Some(format!("`{}`: {e}", dir.display())),
        }
    }
    let promisor = Command::new("git")
        .arg("-C")
        .arg(workspace)
        .args([
            "config",
            "--get-regexp",
            r"^(extensions\.partialclone|remote\..*\.promisor)$",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    promisor.then(|| "a partial clone fetches missing objects while writing a tree".into())
}

/// `base`, or `base-2`, `base-3`, …: the first that is not `taken`.
fn unused(base: &str, taken: impl Fn(&str) -> bool) -> String {
    (1..)
        .map(|n| {
            if n == 1 {
                base.to_owned()
            } else {
                format!("{base}-{n}")
            }
        })
        .find(|name| !taken(name))
        .unwrap_or_else(|| base.to_owned())
}

/// A path beneath `parent`, named for `sandbox`, that does not exist yet (nor its
/// `.upper` twin).
pub fn unused_dir(parent: &Path, sandbox: &str) -> PathBuf {
    parent.join(unused(sandbox, |n| {
        std::fs::symlink_metadata(parent.join(n)).is_ok()
            || std::fs::symlink_metadata(parent.join(format!("{n}.upper"))).is_ok()
    }))
}

/// What copy-back kept for `sandbox` beneath `parent` (the data directory's `copyback`):
/// the diverted changes (`NAME`, `NAME-2`, …) and the changes it could not carry
/// (`NAME.upper`, …), as [`unused_dir`] names them; sorted. A name that is also one of
/// `others` (sandboxes that exist: `NAME-2` may be one) is theirs, not this one's.
pub fn kept_for(parent: &Path, sandbox: &str, others: &[String]) -> Vec<PathBuf> {
    let ours = |name: &str| {
        let name = name.strip_suffix(".upper").unwrap_or(name);
        if others.iter().any(|o| o == name) {
            return false;
        }
        name == sandbox
            || name
                .strip_prefix(sandbox)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let mut kept: Vec<PathBuf> = std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(ours))
        .map(|e| e.path())
        .collect();
    kept.sort();
    kept
}

/// One host git command in `workspace` on the temporary index `index`, its hooks and file
/// system monitor off (the repository's config is the user's own: `.git` is never copied
/// back), with a fixed identity.
fn git(workspace: &Path, index: &Path, args: &[&str], input: Option<&[u8]>) -> Result<String> {
    let out = git_bytes(workspace, index, args, input)?;
    Ok(String::from_utf8_lossy(&out).trim_end().to_owned())
}

/// [`git`]'s output as bytes. The input is written by a thread of its own, so a command
/// that answers as it reads (`hash-object --stdin-paths`) never blocks on a full pipe.
fn git_bytes(
    workspace: &Path,
    index: &Path,
    args: &[&str],
    input: Option<&[u8]>,
) -> Result<Vec<u8>> {
    let mut cmd = Command::new("git");
    cmd.arg("-C")
        .arg(workspace)
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
            "--literal-pathspecs",
        ])
        .args(args)
        .env("GIT_INDEX_FILE", index)
        // Never fetch a missing object (git ≥ 2.44; partial clones get no branch anyway).
        .env("GIT_NO_LAZY_FETCH", "1")
        .env("GIT_AUTHOR_NAME", "capgate")
        .env("GIT_AUTHOR_EMAIL", "capgate@localhost")
        .env("GIT_COMMITTER_NAME", "capgate")
        .env("GIT_COMMITTER_EMAIL", "capgate@localhost")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().context("cannot run git")?;
    let out = std::thread::scope(|scope| {
        if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
            // A write error shows as git's own failure below.
            scope.spawn(move || stdin.write_all(bytes));
        }
        child.wait_with_output()
    })?;
    if !out.status.success() {
        bail!(
            "git {}: {}",
            args.first().copied().unwrap_or(""),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// Commits `changes` on top of HEAD (or as a first commit) on the new branch `branch`, and
/// returns the commit. Nothing but the object store and that branch changes: the index is
/// a temporary one, the working tree is not read.
fn commit_on_branch(
    upper: &copyback::Upper,
    workspace: &Path,
    branch: &str,
    changes: &[&Change],
    data: &Path,
) -> Result<String> {
    let reference = format!("refs/heads/{branch}");
    let index = data.join(format!(
        ".copyback-{}-{}.index",
        std::process::id(),
        branch.replace('/', "-")
    ));
    let _ = std::fs::remove_file(&index);
    let result = (|| {
        let git = |args: &[&str], input: Option<&[u8]>| git(workspace, &index, args, input);
        git(&["check-ref-format", &reference], None)?;
        let head = git(&["rev-parse", "--verify", "-q", "HEAD^{commit}"], None).ok();
        match &head {
            Some(h) => git(&["read-tree", h], None)?,
            None => git(&["read-tree", "--empty"], None)?,
        };
        let zero = "0".repeat(
            git(&["rev-parse", "--verify", "-q", "HEAD^{tree}"], None)
                .map(|t| t.len())
                .unwrap_or(40),
        );
        // The blobs: each file's content (read to its scanned size) and each link's
        // target, copied into a private folder and written by one git process.
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| anyhow::anyhow!("no random bytes: {e}"))?;
        let staging = data.join(format!(".copyback-{:016x}", u64::from_le_bytes(nonce)));
        {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new().mode(0o700).create(&staging)?;
        }
        let staged = (|| -> Result<Vec<String>> {
            let mut paths = String::new();
            for (i, change) in changes.iter().enumerate() {
                let blob = staging.join(i.to_string());
                match &change.kind {
                    ChangeKind::File { size, .. } => {
                        let mut from = upper.file(&change.path, *size)?;
                        std::io::copy(&mut from, &mut std::fs::File::create_new(&blob)?)?;
                    }
                    ChangeKind::Symlink(target) => {
                        std::fs::write(&blob, target.as_os_str().as_encoded_bytes())?;
                    }
                    _ => continue,
                }
                paths.push_str(&blob.to_string_lossy());
                paths.push('\n');
            }
            if paths.is_empty() {
                return Ok(Vec::new());
            }
            let oids = git(
                &["hash-object", "-w", "--no-filters", "--stdin-paths"],
                Some(paths.as_bytes()),
            )?;
            Ok(oids.lines().map(str::to_owned).collect())
        })();
        let _ = capgate_sandbox::remove_tree(&staging);
        let mut oids = staged?.into_iter();
        // What the index has, for removals: an entry at a removed path or beneath it.
        let indexed = git_bytes(workspace, &index, &["ls-files", "-z"], None)?;
        let indexed: Vec<&[u8]> = indexed
            .split(|b| *b == 0)
            .filter(|n| !n.is_empty())
            .collect();
        let mut info: Vec<u8> = Vec::new();
        for change in changes {
            let path = change.path.as_os_str().as_encoded_bytes();
            let mut entry = |mode: &str, oid: &[u8], name: &[u8]| {
                info.extend_from_slice(format!("{mode} ").as_bytes());
                info.extend_from_slice(oid);
                info.push(b'\t');
                info.extend_from_slice(name);
                info.push(0);
            };
            match &change.kind {
                ChangeKind::File { executable, .. } => {
                    let oid = oids
                        .next()
                        .context("git hashed fewer files than it was given")?;
                    entry(
                        if *executable { "100755" } else { "100644" },
                        oid.as_bytes(),
                        path,
                    );
                }
                ChangeKind::Symlink(_) => {
                    let oid = oids
                        .next()
                        .context("git hashed fewer files than it was given")?;
                    entry("120000", oid.as_bytes(), path);
                }
                ChangeKind::Delete | ChangeKind::Dir { opaque: true } => {
                    for name in &indexed {
                        let beneath = name.len() > path.len()
                            && name.starts_with(path)
                            && name[path.len()] == b'/';
                        if *name == path || beneath {
                            entry("0", zero.as_bytes(), name);
                        }
                    }
                }
                ChangeKind::Dir { opaque: false } => {}
            }
        }
        git(&["update-index", "-z", "--index-info"], Some(&info))?;
        let tree = git(&["write-tree"], None)?;
        // git skips some paths with a warning only (a `.gitmodules` that is a link): what
        // is said to be on the branch must be there.
        let listed = git(&["ls-tree", "-r", "-z", "--name-only", &tree], None)?;
        let in_tree: std::collections::BTreeSet<&str> = listed.split('\0').collect();
        for change in changes {
            let entry = matches!(
                change.kind,
                ChangeKind::File { .. } | ChangeKind::Symlink(_)
            );
            if entry && !in_tree.contains(change.path.to_string_lossy().as_ref()) {
                bail!(
                    "git left `{}` out of the commit",
                    printable(&change.path.to_string_lossy())
                );
            }
        }
        let message = format!(
            "capgate: changes to hook and runner files from sandbox {}\n\nNot applied to the working tree by `capgate run --copy-back`; review them before merging.",
            branch.trim_start_matches("capgate/")
        );
        let mut args = vec!["commit-tree", tree.as_str(), "-m", message.as_str()];
        if let Some(h) = &head {
            args.extend(["-p", h.as_str()]);
        }
        let commit = git(&args, None)?;
        // Created, never moved: the empty old value makes git refuse an existing branch.
        git(&["update-ref", &reference, &commit, ""], None)?;
        Ok(commit)
    })();
    let _ = std::fs::remove_file(&index);
    result
}

/// Saves `changes` beneath the new directory `dir` (capgate's own): files as files, links
/// listed in `LINKS`, removals in `REMOVED`, one path per line.
fn save_in_folder(upper: &copyback::Upper, dir: &Path, changes: &[&Change]) -> Result<()> {
    crate::state::private_dir(dir.parent().unwrap_or(dir))?;
    std::fs::create_dir(dir).with_context(|| format!("cannot create `{}`", dir.display()))?;
    let mut links = String::new();
    let mut removed = String::new();
    for change in changes {
        let to = dir.join("files").join(&change.path);
        match &change.kind {
            ChangeKind::File { size, .. } => {
                if let Some(parent) = to.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                let mut from = upper.file(&change.path, *size)?;
                let mut file = std::fs::File::create_new(&to)
                    .with_context(|| format!("cannot create `{}`", to.display()))?;
                std::io::copy(&mut from, &mut file)?;
            }
            ChangeKind::Symlink(target) => links.push_str(&format!(
                "{} -> {}\n",
                printable(&change.path.to_string_lossy()),
                printable(&target.to_string_lossy())
            )),
            ChangeKind::Delete | ChangeKind::Dir { opaque: true } => {
                removed.push_str(&format!("{}\n", printable(&change.path.to_string_lossy())));
            }
            ChangeKind::Dir { opaque: false } => {}
        }
    }
    for (name, text) in [("LINKS", links), ("REMOVED", removed)] {
        if !text.is_empty() {
            std::fs::write(dir.join(name), text)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    /// What copy-back kept for a sandbox: its own directories only, not those of a
    /// sandbox whose name begins like its own (`foo-2`, `foo2`), nor one that exists
    /// under a name the numbering could have made (`foo-3`).
    #[test]
    fn kept_for_names_a_sandboxs_own_directories() {
        let tmp = tempfile::tempdir().unwrap();
        for d in [
            "foo",
            "foo-2",
            "foo.upper",
            "foo-3",
            "foo2",
            "foobar.upper",
            "bar",
        ] {
            std::fs::create_dir(tmp.path().join(d)).unwrap();
        }
        let names = |others: &[String]| -> Vec<String> {
            kept_for(tmp.path(), "foo", others)
                .iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(names(&[]), ["foo", "foo-2", "foo-3", "foo.upper"]);
        assert_eq!(names(&["foo-3".to_owned()]), ["foo", "foo-2", "foo.upper"]);
    }
}
