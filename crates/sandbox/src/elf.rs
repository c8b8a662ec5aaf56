//! What a program needs the kernel to open for it at `execve`: its ELF interpreter (the
//! dynamic loader, `PT_INTERP`), or a script's `#!` interpreter. An exec allowlist grants
//! these beside the programs it names, or nothing named could start.

use std::path::PathBuf;

/// The most of a file looked at: the ELF header, the program headers and the interpreter's
/// name lie in its first pages.
pub(crate) const HEAD_LEN: usize = 64 * 1024;

const PT_INTERP: u32 = 3;

/// The interpreter `head` (a file's first bytes) asks for: the `PT_INTERP` path of a 64-bit
/// little-endian ELF file, or the path after `#!` of a script. `None` for a static program,
/// anything else, or a header that does not hold together.
pub(crate) fn interpreter(head: &[u8]) -> Option<PathBuf> {
    if let Some(rest) = head.strip_prefix(b"#!") {
        let line = rest.split(|&b| b == b'\n').next()?;
        let text = std::str::from_utf8(line).ok()?.trim_start();
        let path = text.split([' ', '\t']).next()?;
        return path.starts_with('/').then(|| PathBuf::from(path));
    }
    // ELF magic, ELFCLASS64, ELFDATA2LSB.
    if head.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let bytes = |at: usize, n: usize| head.get(at..at.checked_add(n)?);
    let u16_at = |at: usize| Some(u16::from_le_bytes(bytes(at, 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(bytes(at, 4)?.try_into().ok()?));
    let u64_at = |at: usize| {
        let v = u64::from_le_bytes(bytes(at, 8)?.try_into().ok()?);
        usize::try_from(v).ok()
    };
    let phoff = u64_at(0x20)?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    if phentsize < 0x38 {
        return None;
    }
    for i in 0..phnum {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(ph)? != PT_INTERP {
            continue;
        }
        let offset = u64_at(ph.checked_add(8)?)?;
        let size = u64_at(ph.checked_add(32)?)?;
        let name = head.get(offset..offset.checked_add(size)?)?;
        let name = name.strip_suffix(b"\0").unwrap_or(name);
        let path = std::str::from_utf8(name).ok()?;
        return path.starts_with('/').then(|| PathBuf::from(path));
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn head_of(path: &str) -> Vec<u8> {
        let mut bytes = std::fs::read(path).unwrap();
        bytes.truncate(HEAD_LEN);
        bytes
    }

    #[test]
    fn a_dynamic_program_names_its_loader() {
        let interp = interpreter(&head_of("/bin/sh")).unwrap();
        let name = interp.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("ld-linux"), "{interp:?}");
        assert!(std::path::Path::new(&interp).exists());
    }

    #[test]
    fn scripts_name_their_interpreter() {
        assert_eq!(
            interpreter(b"#!/usr/bin/python3 -u\nprint(1)\n"),
            Some(PathBuf::from("/usr/bin/python3"))
        );
        assert_eq!(interpreter(b"#! /bin/sh\n"), Some(PathBuf::from("/bin/sh")));
        assert_eq!(interpreter(b"#!python3\n"), None);
    }

    #[test]
    fn anything_else_names_nothing_and_never_panics() {
        assert_eq!(interpreter(b""), None);
        assert_eq!(interpreter(b"plain text"), None);
        let mut elf = head_of("/bin/sh");
        // Program headers pointing past the end, a huge count, a cut file.
        for (at, bytes) in [
            (0x20usize, u64::MAX.to_le_bytes().to_vec()),
            (0x38, vec![0xff, 0xff]),
        ] {
            let mut broken = elf.clone();
            broken[at..at + bytes.len()].copy_from_slice(&bytes);
            let _ = interpreter(&broken);
        }
        elf.truncate(80);
        assert_eq!(interpreter(&elf), None);
    }
}
