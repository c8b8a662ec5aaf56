//! `capgate run --copy-back`: the workload's changes to a copy-mode workspace reach the host
//! directory after the run, except changes to files the host runs (hooks, runner
//! configuration) and symbolic links, which are diverted: onto the branch
//! `capgate/<sandbox>` when the workspace is a git work tree (committed with git's plumbing,
//! the working tree and the current branch untouched, hooks off), else into a folder of the
//! data directory. Changes beneath `.git` never leave the sandbox. The sandbox crate's
//! `copyback` module reads the changes and writes them safely; this module decides, diverts
//! and reports.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};
use capgate_sandbox::copyback::{self, Change, ChangeKind, Limits, Refusal};

/// Where the diverted changes went.
#[derive(Debug)]
enum Diverted {
    Nothing,
    Branch { branch: String, commit: String },
    Folder(PathBuf),
}

/// Runs copy-back from the overlay upper directory `upper` into the host directory
/// `workspace`, and says what it did on stderr. An error means nothing was applied (a
/// change that cannot be applied alone is refused and named, the others applied).
pub fn copy_back(upper: &Path, workspace: &Path, sandbox: &str, data: &Path) -> Result<()> {
    let found = copyback::scan(upper, &Limits::default()).with_context(|| {
        format!(
            "cannot read the workload's changes in `{}`",
            upper.display()
        )
    })?;
    let mut apply = Vec::new();
    let mut divert: Vec<(Change, &'static str)> = Vec::new();
    let mut metadata = 0usize;
    for change in found.changes {
        match copyback::divert_reason(&change) {
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
        divert_changes(upper, workspace, sandbox, data, &divert)?
    };
    let applied = copyback::apply(upper, workspace, &apply)
        .with_context(|| format!("cannot copy back into `{}`", workspace.display()))?;

    let say = |s: String| eprintln!("capgate: copy-back: {s}");
    say(format!(
        "{} written, {} made, {} removed in {}",
        count(applied.written.len(), "file"),
        count(applied.made.len(), "directory"),
        count(applied.removed.len(), "entry"),
        workspace.display()
    ));
    match &diverted {
        Diverted::Nothing => {}
        Diverted::Branch { branch, commit } => say(format!(
            "{} NOT applied (files the host runs, or links); committed on branch {branch} ({}), review with: git diff HEAD {branch}",
            count(divert.len(), "change"),
            &commit[..commit.len().min(12)]
        )),
        Diverted::Folder(dir) => say(format!(
            "{} NOT applied (files the host runs, or links); saved in {} for review",
            count(divert.len(), "change"),
            dir.display()
        )),
    }
    for (change, reason) in &divert {
        eprintln!("  {}: {reason}", change.path.display());
    }
    if metadata > 0 {
        say(format!(
            "{} beneath .git (the repository's metadata) NOT copied back",
            count(metadata, "change")
        ));
    }
    for Refusal { path, reason } in found.skipped.iter().chain(&applied.refused) {
        say(format!("refused {}: {reason}", path.display()));
    }
    Ok(())
}

fn count(n: usize, what: &str) -> String {
    match (n, what) {
        (1, _) => format!("1 {what}"),
        (_, "directory") => format!("{n} directories"),
        (_, "entry") => format!("{n} entries"),
        _ => format!("{n} {what}s"),
    }
}

fn is_git_metadata(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == ".git")
}

fn divert_changes(
    upper: &Path,
    workspace: &Path,
    sandbox: &str,
    data: &Path,
    divert: &[(Change, &'static str)],
) -> Result<Diverted> {
    let changes: Vec<&Change> = divert.iter().map(|(c, _)| c).collect();
    if workspace.join(".git").exists() {
        let branch = format!("capgate/{sandbox}");
        match commit_on_branch(upper, workspace, &branch, &changes, data) {
            Ok(commit) => return Ok(Diverted::Branch { branch, commit }),
            Err(e) => eprintln!(
                "capgate: copy-back: the diverted changes could not be committed on {branch} ({e:#}); saving them in the data directory instead"
            ),
        }
    }
    let dir = data.join("copyback").join(sandbox);
    save_in_folder(upper, &dir, &changes)?;
    Ok(Diverted::Folder(dir))
}

/// One host git command in `workspace` on the temporary index `index`, its hooks and file
/// system monitor off (the repository's config is the user's own: `.git` is never copied
/// back), with a fixed identity.
fn git(workspace: &Path, index: &Path, args: &[&str], input: Option<&[u8]>) -> Result<String> {
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
    if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(bytes)?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "git {}: {}",
            args.first().copied().unwrap_or(""),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
}

/// Commits `changes` on top of HEAD (or as a first commit) on the new branch `branch`, and
/// returns the commit. Nothing but the object store and that branch changes: the index is
/// a temporary one, the working tree is not read.
fn commit_on_branch(
    upper: &Path,
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
        if git(&["rev-parse", "--verify", "-q", &reference], None).is_ok() {
            bail!("the branch {branch} exists already");
        }
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
        let mut info: Vec<u8> = Vec::new();
        for change in changes {
            let path = change.path.as_os_str().as_encoded_bytes();
            let mut entry = |mode: &str, oid: &str| {
                info.extend_from_slice(format!("{mode} {oid}\t").as_bytes());
                info.extend_from_slice(path);
                info.push(0);
            };
            match &change.kind {
                ChangeKind::File { executable, .. } => {
                    let mut bytes = Vec::new();
                    copyback::open_changed_file(upper, &change.path)?.read_to_end(&mut bytes)?;
                    let oid = git(&["hash-object", "-w", "--stdin"], Some(&bytes))?;
                    entry(if *executable { "100755" } else { "100644" }, &oid);
                }
                ChangeKind::Symlink(target) => {
                    let oid = git(
                        &["hash-object", "-w", "--stdin"],
                        Some(target.as_os_str().as_encoded_bytes()),
                    )?;
                    entry("120000", &oid);
                }
                ChangeKind::Delete | ChangeKind::Dir { opaque: true } => {
                    // Everything the index has at or beneath it.
                    let listed = git(
                        &["ls-files", "-z", "--", &change.path.to_string_lossy()],
                        None,
                    )?;
                    for name in listed.split('\0').filter(|n| !n.is_empty()) {
                        info.extend_from_slice(format!("0 {zero}\t{name}").as_bytes());
                        info.push(0);
                    }
                }
                ChangeKind::Dir { opaque: false } => {}
            }
        }
        git(&["update-index", "-z", "--index-info"], Some(&info))?;
        let tree = git(&["write-tree"], None)?;
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
fn save_in_folder(upper: &Path, dir: &Path, changes: &[&Change]) -> Result<()> {
    crate::state::private_dir(dir.parent().unwrap_or(dir))?;
    std::fs::create_dir(dir).with_context(|| format!("cannot create `{}`", dir.display()))?;
    let mut links = String::new();
    let mut removed = String::new();
    for change in changes {
        let to = dir.join("files").join(&change.path);
        match &change.kind {
            ChangeKind::File { .. } => {
                if let Some(parent) = to.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                let mut from = copyback::open_changed_file(upper, &change.path)?;
                let mut file = std::fs::File::create_new(&to)
                    .with_context(|| format!("cannot create `{}`", to.display()))?;
                std::io::copy(&mut from, &mut file)?;
            }
            ChangeKind::Symlink(target) => links.push_str(&format!(
                "{} -> {}\n",
                change.path.display(),
                target.display()
            )),
            ChangeKind::Delete | ChangeKind::Dir { opaque: true } => {
                removed.push_str(&format!("{}\n", change.path.display()));
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
