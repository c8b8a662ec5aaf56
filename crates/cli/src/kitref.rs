//! Finding the descriptor file a kit reference names.
//!
//! A `KIT` argument is a descriptor file, or a kit directory holding `kit.yaml`, or a
//! `<stem>.yaml` beside a `<stem>.dockerfile`, or a `<directory-name>.yaml`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The directory of the kit at `reference`: the kit directory itself, or the directory
/// its descriptor file lies in.
pub fn kit_dir(reference: &Path) -> PathBuf {
    if reference.is_dir() {
        return reference.to_path_buf();
    }
    reference
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The descriptor file for `reference`.
pub fn descriptor_path(reference: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(reference)
        .with_context(|| format!("cannot read `{}`", reference.display()))?;
    if meta.is_file() {
        return Ok(reference.to_path_buf());
    }
    if !meta.is_dir() {
        bail!(
            "`{}` is neither a file nor a kit directory",
            reference.display()
        );
    }
    let kit_yaml = reference.join("kit.yaml");
    if kit_yaml.is_file() {
        return Ok(kit_yaml);
    }
    let mut yamls: Vec<PathBuf> = std::fs::read_dir(reference)
        .with_context(|| format!("cannot list `{}`", reference.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    yamls.sort();
    let companion: Vec<&PathBuf> = yamls
        .iter()
        .filter(|p| p.with_extension("dockerfile").is_file())
        .collect();
    if let [one] = companion.as_slice() {
        return Ok((*one).clone());
    }
    if let Some(name) = reference.file_name().and_then(|n| n.to_str()) {
        for ext in ["yaml", "yml"] {
            let candidate = reference.join(format!("{name}.{ext}"));
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    if let [one] = yamls.as_slice() {
        return Ok(one.clone());
    }
    bail!(
        "`{}` holds no kit descriptor: expected `kit.yaml`, a `<stem>.yaml` beside `<stem>.dockerfile`, or `{}.yaml`",
        reference.display(),
        reference
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("<dir>")
    )
}
