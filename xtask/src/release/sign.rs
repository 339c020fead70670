//! `SHA256SUMS` of a release's files, signed with minisign and verified: the signature with the
//! public key, and every file against its line.

use anyhow::{Context, Result, ensure};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The checksum file, its signature, and the public key that verifies it.
pub const SUMS: &str = "SHA256SUMS";
pub const SIGNATURE: &str = "SHA256SUMS.minisig";
pub const PUBLIC_KEY: &str = "minisign.pub";

/// The hex SHA-256 of a file.
pub fn sha256_file(path: &Path) -> Result<String> {
    let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(crate::image::digest(&bytes).trim_start_matches("sha256:").to_owned())
}

/// `sha256sum`'s format: one `HEX  NAME` line per file, in the order given (sorted by name).
pub fn checksums(dir: &Path, files: &[String]) -> Result<String> {
    let mut text = String::new();
    for name in files {
        text.push_str(&format!("{}  {name}\n", sha256_file(&dir.join(name))?));
    }
    Ok(text)
}

/// Every line of `sums` names a file of `dir` with that SHA-256, and every file is named.
pub fn verify_sums(dir: &Path, sums: &str, files: &[String]) -> Result<()> {
    let mut named = Vec::new();
    for line in sums.lines() {
        let (hex, name) = line.split_once("  ").with_context(|| format!("{SUMS}: {line:?}"))?;
        let actual = sha256_file(&dir.join(name))?;
        ensure!(actual == hex, "{name}: SHA-256 {actual}, {SUMS} says {hex}");
        named.push(name.to_owned());
    }
    ensure!(named == files, "{SUMS} names {named:?}, the release holds {files:?}");
    Ok(())
}

/// Writes [`SUMS`] of `files` in `dir`, signs it with the key at `key` (a throwaway key made
/// here when `None`), writes the public key as [`PUBLIC_KEY`], and verifies both. Returns what
/// it did, for the summary line.
pub fn sign_and_verify(
    dir: &Path,
    files: &[String],
    key: Option<&Path>,
    version: &str,
    revision: &str,
) -> Result<String> {
    let sums = checksums(dir, files)?;
    fs::write(dir.join(SUMS), &sums)?;
    let keys = tempfile::tempdir()?;
    let (secret, kind) = match key {
        Some(key) => (key.to_path_buf(), "the release key"),
        None => (throwaway_key(keys.path())?, "a throwaway key"),
    };
    let public = dir.join(PUBLIC_KEY);
    // The public key, recomputed from the secret one.
    minisign(Command::new("minisign").arg("-R").arg("-s").arg(&secret).arg("-p").arg(&public))?;
    minisign(
        Command::new("minisign")
            .args(["-S", "-s"])
            .arg(&secret)
            .arg("-m")
            .arg(dir.join(SUMS))
            .arg("-x")
            .arg(dir.join(SIGNATURE))
            .args(["-t", &format!("amd-hsmp-exporter {version} ({revision})")]),
    )?;
    minisign(
        Command::new("minisign")
            .args(["-V", "-q", "-p"])
            .arg(&public)
            .arg("-m")
            .arg(dir.join(SUMS))
            .arg("-x")
            .arg(dir.join(SIGNATURE)),
    )
    .context("the signature does not verify")?;
    verify_sums(dir, &fs::read_to_string(dir.join(SUMS))?, files)?;
    Ok(format!("{SUMS} signed with {kind} and verified, every file against it"))
}

/// A key pair without a password in `dir`; returns the secret key's path.
fn throwaway_key(dir: &Path) -> Result<PathBuf> {
    let secret = dir.join("throwaway.key");
    minisign(
        Command::new("minisign")
            .args(["-G", "-W", "-p"])
            .arg(dir.join("throwaway.pub"))
            .arg("-s")
            .arg(&secret),
    )?;
    Ok(secret)
}

fn minisign(cmd: &mut Command) -> Result<()> {
    crate::workspace::output(cmd.stdin(std::process::Stdio::null())).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_changed_after_its_checksum_fails_the_verification() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), "one").unwrap();
        fs::write(dir.path().join("b"), "two").unwrap();
        let files = ["a".to_owned(), "b".to_owned()];
        let sums = checksums(dir.path(), &files).unwrap();
        assert!(
            sums.starts_with(
                "7692c3ad3540bb803c020b3aee66cd8887123234ea0c6e7143c0add73ff431ed  a\n"
            )
        );
        verify_sums(dir.path(), &sums, &files).unwrap();
        fs::write(dir.path().join("b"), "three").unwrap();
        assert!(verify_sums(dir.path(), &sums, &files).unwrap_err().to_string().contains("b:"));
        assert!(verify_sums(dir.path(), &sums, &files[..1]).is_err());
    }

    #[test]
    #[ignore = "needs minisign"]
    fn sums_changed_after_signing_do_not_verify() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), "one").unwrap();
        let files = ["a".to_owned()];
        let said = sign_and_verify(dir.path(), &files, None, "9.9.9", "abc").unwrap();
        assert!(said.contains("throwaway key"), "{said}");
        let public = dir.path().join(PUBLIC_KEY);
        let verify = || {
            Command::new("minisign")
                .args(["-V", "-q", "-p"])
                .arg(&public)
                .arg("-m")
                .arg(dir.path().join(SUMS))
                .status()
                .unwrap()
                .success()
        };
        assert!(verify());
        let sums = fs::read_to_string(dir.path().join(SUMS)).unwrap();
        fs::write(dir.path().join(SUMS), sums.replace("  a", "  b")).unwrap();
        assert!(!verify());
    }
}
