//! `cargo xtask image [--reproducible]`: the OCI image with the daemons and amd-hsmp-check, written by this code as
//! an OCI archive (`target/image/amd-hsmp-exporter.oci.tar`, `podman load -i` reads it), with no
//! base image: nothing but the binaries, static (glibc `+crt-static`), in `/usr/bin`.
//!
//! Reproducible: the binaries are built by `cargo auditable build` (their dependency list is
//! embedded, for `cargo audit bin` and image scanners) with `SOURCE_DATE_EPOCH` and the revision
//! of the commit, no build path in them (checked), and the archive is a function of the binaries'
//! bytes, the epoch and the revision alone: sorted entries, owner 0:0, fixed modes, every mtime
//! the commit's time, gzip with a fixed header. `--reproducible` builds the same sources again
//! from a copy at another path and requires the same digest.
//!
//! Why static: the dynamic binaries load `libc.so.6`, `libm.so.6`, `libgcc_s.so.1` and the
//! loader (`ldd`; `cargo xtask packaging` pins that list), which the image would have to copy
//! from the build host. Static, the image holds two files and the C library is the one the
//! binaries were linked against. What a static glibc cannot do is load NSS modules, which only
//! `--allow-user`/`--allow-group` use: the image has no `/etc/passwd` anyway, and the chart passes
//! the numeric `--allow-uid 65534` (a name fails at start-up with "no such user").

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The image's name; the tag is the workspace version.
pub const NAME: &str = "amd-hsmp-exporter";
/// The image's repository once loaded into podman (the chart's default is the published one).
pub fn local_repository() -> String {
    format!("localhost/{NAME}")
}
/// The image's reference once loaded into podman.
pub fn reference() -> String {
    format!("{}:{}", local_repository(), env!("CARGO_PKG_VERSION"))
}
/// The binaries, installed in `/usr/bin`: the two daemons and `amd-hsmp-check`, which an operator
/// runs in the broker's container (`kubectl exec`).
pub const BINARIES: [&str; 3] = ["amd-hsmp-broker", "amd-hsmp-exporter", "amd-hsmp-check"];
/// The packages that build [`BINARIES`] (`--bins`): `amd-hsmp-check` is the broker's.
pub const PACKAGES: [&str; 2] = ["amd-hsmp-broker", "amd-hsmp-exporter"];
/// The simulating broker: built with the binaries (static, the same flags) but not put in the
/// image, which holds what a node runs; `cargo xtask kube-test` mounts it into its simulator pod.
pub const SIM_BROKER: &str = "amd-hsmp-sim-broker";
/// The user the image runs as: nobody, by number, so that the kubelet can check `runAsNonRoot`.
pub const USER: &str = "65534";
/// The flag that links glibc into the binaries, as the image and the release build them.
pub(crate) const CRT_STATIC: &str = "-Ctarget-feature=+crt-static";
/// The target the binaries are built for (explicit, so that `+crt-static` does not reach build
/// scripts and proc macros).
pub(crate) const TARGET: &str = "x86_64-unknown-linux-gnu";
/// `org.opencontainers.image.source`: the workspace's `repository`.
const SOURCE: &str = "https://github.com/amd-hsmp-exporter/amd-hsmp-exporter";
/// `org.opencontainers.image.licenses`: the workspace's `license`.
const LICENSES: &str = "Apache-2.0";
/// `org.opencontainers.image.url`: where to read about the image (the project's home).
const URL: &str = SOURCE;
/// `org.opencontainers.image.documentation`: how to run the image, in Kubernetes or podman.
const DOCUMENTATION: &str =
    "https://github.com/amd-hsmp-exporter/amd-hsmp-exporter/blob/main/docs/kubernetes.md";
/// The cargo tool the image's build needs (of `deps::CARGO_TOOLS`): the image installs it
/// alone, not the packaging and licence checks' tools.
pub(crate) const CARGO_TOOL: &str = "cargo-auditable";

/// What the archive is made of: nothing else goes into it.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// `SOURCE_DATE_EPOCH`: every mtime and the `created` fields.
    pub epoch: u64,
    /// The commit (`-dirty` appended when the sources differ from it).
    pub revision: String,
    /// The workspace version: the tag and `org.opencontainers.image.version`.
    pub version: String,
    /// `(path in the image, file on the host)`; only the file's bytes are used.
    pub files: Vec<(String, PathBuf)>,
}

/// An archive written by [`write_archive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive {
    /// The `.oci.tar` file.
    pub path: PathBuf,
    /// `sha256:…` of the manifest: the image digest a registry reports after a push.
    pub manifest_digest: String,
    /// `sha256:…` of the config: the image id podman reports.
    pub config_digest: String,
    /// Size of the archive, bytes.
    pub size: u64,
    /// Size of the compressed layer (what a node pulls), bytes.
    pub layer_size: u64,
}

/// `cargo xtask image [--reproducible]`.
pub fn run(args: &[String]) -> Result<()> {
    let reproducible = match args {
        [] => false,
        [flag] if flag == "--reproducible" => true,
        _ => bail!("usage: cargo xtask image [--reproducible]"),
    };
    let archive = build(&crate::workspace::root())?;
    if reproducible {
        check_reproducible(&crate::workspace::root(), &archive)?;
    }
    Ok(())
}

/// Where the image's cargo build puts its output: apart from `target/release`, since the flags
/// differ (a static target build, the dependency list embedded).
pub fn cargo_target_dir(root: &Path) -> PathBuf {
    crate::workspace::target_dir(root).join("image/cargo")
}

/// The static [`SIM_BROKER`] of the last [`build`] of the sources at `root`.
pub fn sim_broker(root: &Path) -> PathBuf {
    cargo_target_dir(root).join(TARGET).join("release").join(SIM_BROKER)
}

/// The archive's path for the sources at `root`.
pub fn archive_path(root: &Path) -> PathBuf {
    crate::workspace::target_dir(root).join("image").join(format!("{NAME}.oci.tar"))
}

/// Builds the binaries and the archive from the sources at `root`; prints the digest.
pub fn build(root: &Path) -> Result<Archive> {
    let meta = Meta::of(root)?;
    if meta.revision.ends_with("-dirty") {
        eprintln!("image: the working tree has changes: the image is of no commit (-dirty)");
    }
    let archive = build_from(root, &meta, &cargo_target_dir(root), &archive_path(root), &[root])?;
    // It reads back: the index names the manifest, every blob is stored under its digest.
    let (index, blobs) = read_archive(&archive.path)?;
    ensure!(
        index["manifests"][0]["digest"] == archive.manifest_digest.as_str()
            && blobs.iter().all(|(name, bytes)| digest(bytes) == *name),
        "{} does not read back as written",
        archive.path.display()
    );
    println!(
        "image: {} ({} bytes, layer {} bytes gzip), manifest {}, config (image id) {}",
        archive.path.display(),
        archive.size,
        archive.layer_size,
        archive.manifest_digest,
        archive.config_digest
    );
    Ok(archive)
}

/// Builds the same sources again from a copy at another path, sharing the cargo target
/// directory (so only the workspace's own crates are compiled again), and requires the same
/// archive, byte for byte.
pub fn check_reproducible(root: &Path, first: &Archive) -> Result<()> {
    let meta = Meta::of(root)?;
    let dir = tempfile::Builder::new().prefix("amd-hsmp-image-").tempdir()?;
    let copy = dir.path().join("elsewhere/amd-hsmp-exporter");
    copy_sources(root, &copy)?;
    let out = dir.path().join(format!("{NAME}.oci.tar"));
    let second = build_from(&copy, &meta, &cargo_target_dir(root), &out, &[root, &copy])?;
    ensure!(
        first.manifest_digest == second.manifest_digest
            && fs::read(&first.path)? == fs::read(&second.path)?,
        "not reproducible: {} gives {} and the copy at {} gives {}",
        root.display(),
        first.manifest_digest,
        copy.display(),
        second.manifest_digest
    );
    println!(
        "image: reproducible: the copy at {} gives the same archive, {}",
        copy.display(),
        second.manifest_digest
    );
    Ok(())
}

/// What the build takes from the commit.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    pub(crate) epoch: u64,
    pub(crate) revision: String,
}

impl Meta {
    /// `SOURCE_DATE_EPOCH` if set, else the commit's time; the commit, `-dirty` when the tree
    /// differs from it.
    pub(crate) fn of(root: &Path) -> Result<Meta> {
        let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
            Ok(v) if !v.trim().is_empty() => v.trim().to_owned(),
            _ => git(root, &["log", "-1", "--format=%ct"])?,
        };
        let epoch = epoch.parse().with_context(|| format!("SOURCE_DATE_EPOCH {epoch:?}"))?;
        let mut revision = git(root, &["rev-parse", "HEAD"])?;
        if !git(root, &["status", "--porcelain", "--untracked-files=no"])?.is_empty() {
            revision.push_str("-dirty");
        }
        Ok(Meta { epoch, revision })
    }
}

pub(crate) fn git(root: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(root)
        .output()
        .with_context(|| format!("cannot run git {args:?}"))?;
    ensure!(out.status.success(), "git {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// `cargo auditable build` of the binaries from the sources at `src`, then the archive at `out`.
/// `private` are paths no binary may contain (the checkout, cargo's home, the target directory).
fn build_from(
    src: &Path,
    meta: &Meta,
    target_dir: &Path,
    out: &Path,
    private: &[&Path],
) -> Result<Archive> {
    crate::deps::install_cargo_tool(CARGO_TOOL)?;
    let cargo_home = cargo_home()?;
    // Workspace sources are compiled by relative path; the registry's and the build scripts'
    // output would carry cargo's home and the target directory. Identical flags in every
    // checkout, so the copy of `--reproducible` reuses the compiled dependencies.
    let rustflags = [
        CRT_STATIC.to_owned(),
        format!("--remap-path-prefix={}=/cargo", cargo_home.display()),
        format!("--remap-path-prefix={}=/target", target_dir.display()),
    ]
    .join("\x1f");
    let short = meta.revision.get(..12).unwrap_or(&meta.revision);
    let short = match meta.revision.strip_suffix("-dirty") {
        Some(_) => format!("{short}-dirty"),
        None => short.to_owned(),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    crate::workspace::run_cmd(
        Command::new(cargo)
            .args(["auditable", "build", "--release", "--locked", "--target", TARGET])
            .args(PACKAGES.iter().chain(&[SIM_BROKER]).flat_map(|b| ["--package", b]))
            .arg("--bins")
            .current_dir(src)
            .env("CARGO_TARGET_DIR", target_dir)
            .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
            .env_remove("RUSTFLAGS")
            .env("SOURCE_DATE_EPOCH", meta.epoch.to_string())
            .env("AMD_HSMP_REVISION", short)
            // A branch names a checkout, not a commit: two checkouts of one commit must agree.
            .env("AMD_HSMP_BRANCH", "unknown")
            .env("AMD_HSMP_BUILD_USER", "unknown"),
    )?;
    let bin_dir = target_dir.join(TARGET).join("release");
    let mut private: Vec<PathBuf> = private.iter().map(|p| p.to_path_buf()).collect();
    private.extend([cargo_home, target_dir.to_path_buf()]);
    let mut files = Vec::new();
    for bin in BINARIES {
        let path = bin_dir.join(bin);
        check_binary(&path, &private)?;
        files.push((format!("usr/bin/{bin}"), path));
    }
    let inputs = Inputs {
        epoch: meta.epoch,
        revision: meta.revision.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        files,
    };
    write_archive(&inputs, out)
}

pub(crate) fn cargo_home() -> Result<PathBuf> {
    match std::env::var_os("CARGO_HOME") {
        Some(home) => Ok(PathBuf::from(home)),
        None => {
            Ok(PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cargo"))
        }
    }
}

/// A binary of the image is static, carries its dependency list, and names none of `private`.
pub(crate) fn check_binary(path: &Path, private: &[PathBuf]) -> Result<()> {
    let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let ldd = Command::new("ldd").arg(path).output().context("cannot run ldd")?;
    let said =
        String::from_utf8_lossy(&ldd.stdout).into_owned() + &String::from_utf8_lossy(&ldd.stderr);
    ensure!(
        said.contains("statically linked") || said.contains("not a dynamic executable"),
        "{} is not static; ldd says: {said}",
        path.display()
    );
    // cargo-auditable's section: the dependency list, zlib-compressed JSON.
    ensure!(
        contains(&bytes, b".dep-v0"),
        "{} has no .dep-v0 section (cargo auditable did not run)",
        path.display()
    );
    for p in private {
        let p = p.to_string_lossy();
        ensure!(!contains(&bytes, p.as_bytes()), "{} contains the build path {p}", path.display());
    }
    Ok(())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Copies the files git knows or would add (tracked and untracked, not ignored) from `root` to
/// `dest`: the sources as they are, changes included, without `target/`.
pub(crate) fn copy_sources(root: &Path, dest: &Path) -> Result<()> {
    let out = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output()
        .context("cannot run git ls-files")?;
    ensure!(out.status.success(), "git ls-files failed");
    for name in out.stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = Path::new(std::str::from_utf8(name)?);
        let from = root.join(name);
        let to = dest.join(name);
        let Ok(meta) = fs::symlink_metadata(&from) else { continue }; // deleted, not committed
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent)?;
        }
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&from)?, &to)?;
        } else {
            fs::copy(&from, &to).with_context(|| format!("cannot copy {}", from.display()))?;
        }
    }
    Ok(())
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// RFC 3339 of `epoch`, UTC, seconds.
pub(crate) fn rfc3339(epoch: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(epoch);
    humantime::format_rfc3339_seconds(time).to_string()
}

/// A tar in which every entry has owner 0:0, no owner names, `mtime` = `epoch`, directories
/// 0755 and the given modes: entries in the order given (callers sort them).
pub(crate) struct Tar {
    builder: tar::Builder<Vec<u8>>,
    epoch: u64,
}

impl Tar {
    pub(crate) fn new(epoch: u64) -> Tar {
        Tar { builder: tar::Builder::new(Vec::new()), epoch }
    }

    fn header(
        &self,
        path: &str,
        kind: tar::EntryType,
        mode: u32,
        size: u64,
    ) -> Result<tar::Header> {
        let mut h = tar::Header::new_ustar();
        h.set_path(path).with_context(|| format!("tar path {path}"))?;
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(self.epoch);
        h.set_size(size);
        h.set_cksum();
        Ok(h)
    }

    fn dir(&mut self, path: &str) -> Result<()> {
        let h = self.header(path, tar::EntryType::Directory, 0o755, 0)?;
        Ok(self.builder.append(&h, std::io::empty())?)
    }

    fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<()> {
        let h = self.header(path, tar::EntryType::Regular, mode, data.len() as u64)?;
        Ok(self.builder.append(&h, data)?)
    }

    /// Every directory above each file, then the files, all in byte order of their paths.
    pub(crate) fn tree(mut self, files: &[(String, Vec<u8>, u32)]) -> Result<Vec<u8>> {
        // (path, None for a directory or the file's bytes and mode)
        type Entry<'a> = (String, Option<(&'a [u8], u32)>);
        let mut entries: Vec<Entry<'_>> = Vec::new();
        let mut dirs = std::collections::BTreeSet::new();
        for (path, data, mode) in files {
            let mut dir = String::new();
            for part in path.split('/').collect::<Vec<_>>().split_last().map_or(&[][..], |s| s.1) {
                dir.push_str(part);
                dir.push('/');
                if dirs.insert(dir.clone()) {
                    entries.push((dir.clone(), None));
                }
            }
            entries.push((path.clone(), Some((data.as_slice(), *mode))));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (path, entry) in entries {
            match entry {
                None => self.dir(&path)?,
                Some((data, mode)) => self.file(&path, mode, data)?,
            }
        }
        Ok(self.builder.into_inner()?)
    }
}

/// gzip with a fixed header (no name, mtime 0, OS "unknown") at the best level.
pub(crate) fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut enc = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::best());
    enc.write_all(bytes)?;
    Ok(enc.finish()?)
}

/// Writes the OCI archive of `inputs` to `out`: a function of the files' bytes, the epoch, the
/// revision and the version alone.
pub fn write_archive(inputs: &Inputs, out: &Path) -> Result<Archive> {
    let mut files = Vec::new();
    for (path, host) in &inputs.files {
        let data = fs::read(host).with_context(|| format!("cannot read {}", host.display()))?;
        files.push((path.clone(), data, 0o755));
    }
    let layer = Tar::new(inputs.epoch).tree(&files)?;
    let layer_gz = gzip(&layer)?;
    let created = rfc3339(inputs.epoch);
    let labels = json!({
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.documentation": DOCUMENTATION,
        "org.opencontainers.image.description": "AMD EPYC per-core energy, boost limit and PROCHOT for Prometheus: amd-hsmp-broker and amd-hsmp-exporter",
        "org.opencontainers.image.licenses": LICENSES,
        "org.opencontainers.image.revision": inputs.revision,
        "org.opencontainers.image.source": SOURCE,
        "org.opencontainers.image.title": NAME,
        "org.opencontainers.image.url": URL,
        "org.opencontainers.image.version": inputs.version,
    });
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "User": USER,
            "Env": ["PATH=/usr/bin"],
            "Cmd": ["amd-hsmp-exporter"],
            "WorkingDir": "/",
            "ExposedPorts": {"10054/tcp": {}},
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [digest(&layer)]},
        "history": [{"created": created, "created_by": "cargo xtask image"}],
    });
    let config = serde_json::to_vec(&config)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": digest(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": digest(&layer_gz),
            "size": layer_gz.len(),
        }],
        "annotations": labels,
    });
    let manifest = serde_json::to_vec(&manifest)?;
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(&manifest),
            "size": manifest.len(),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                "org.opencontainers.image.ref.name": reference(),
                "io.containerd.image.name": reference(),
            },
        }],
    });
    let archive = layout(&index, &[&layer_gz, &config, &manifest], inputs.epoch)?;
    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    fs::write(out, &archive).with_context(|| format!("cannot write {}", out.display()))?;
    fs::set_permissions(out, fs::Permissions::from_mode(0o644))?;
    Ok(Archive {
        path: out.to_path_buf(),
        manifest_digest: digest(&manifest),
        config_digest: digest(&config),
        size: archive.len() as u64,
        layer_size: layer_gz.len() as u64,
    })
}

/// An OCI image layout as a tar: `oci-layout`, the index and each blob under its digest.
pub(crate) fn layout(index: &Value, blobs: &[&Vec<u8>], epoch: u64) -> Result<Vec<u8>> {
    let mut entries = vec![
        ("oci-layout".to_owned(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(), 0o644),
        ("index.json".to_owned(), serde_json::to_vec(index)?, 0o644),
    ];
    for blob in blobs {
        let name = digest(blob).replacen(':', "/", 1);
        entries.push((format!("blobs/{name}"), blob.to_vec(), 0o644));
    }
    Tar::new(epoch).tree(&entries)
}

/// The blobs of an archive by digest, and its index: for the tests and `kube-test`.
pub fn read_archive(path: &Path) -> Result<(Value, std::collections::BTreeMap<String, Vec<u8>>)> {
    let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    read_archive_bytes(&bytes)
}

/// [`read_archive`] of an archive's bytes.
pub fn read_archive_bytes(
    bytes: &[u8],
) -> Result<(Value, std::collections::BTreeMap<String, Vec<u8>>)> {
    let mut index = None;
    let mut blobs = std::collections::BTreeMap::new();
    let mut archive = tar::Archive::new(bytes);
    for entry in archive.entries()? {
        let mut entry = entry?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let name = entry.path()?.to_string_lossy().into_owned();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data)?;
        if name == "index.json" {
            index = Some(serde_json::from_slice(&data)?);
        } else if let Some(hex) = name.strip_prefix("blobs/sha256/") {
            blobs.insert(format!("sha256:{hex}"), data);
        }
    }
    Ok((index.context("no index.json in the archive")?, blobs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::time::{Duration, SystemTime};

    /// Two "binaries" at `dir`, written with the given mode and mtime.
    fn inputs(dir: &Path, mode: u32, mtime: SystemTime, epoch: u64) -> Inputs {
        let mut files = Vec::new();
        for (name, data) in
            [("amd-hsmp-exporter", &b"exporter\x7fELF"[..]), ("amd-hsmp-broker", b"broker")]
        {
            let path = dir.join(name);
            fs::write(&path, data).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            fs::File::options().write(true).open(&path).unwrap().set_modified(mtime).unwrap();
            files.push((format!("usr/bin/{name}"), path));
        }
        Inputs { epoch, revision: "0123456789abcdef".into(), version: "9.9.9".into(), files }
    }

    fn entries(tar_bytes: &[u8]) -> Vec<(String, u64, u64, u64, u32, String)> {
        let mut archive = tar::Archive::new(tar_bytes);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.uid().unwrap(),
                    h.gid().unwrap(),
                    h.mtime().unwrap(),
                    h.mode().unwrap(),
                    h.username().unwrap().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn the_archive_depends_on_the_bytes_not_on_where_or_when_the_files_were_written() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let b_sub = b.path().join("another/checkout");
        fs::create_dir_all(&b_sub).unwrap();
        let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let one = write_archive(
            &inputs(a.path(), 0o700, SystemTime::now(), 1_796_125_524),
            &a.path().join("x.oci.tar"),
        )
        .unwrap();
        let two =
            write_archive(&inputs(&b_sub, 0o755, old, 1_796_125_524), &b.path().join("y.oci.tar"))
                .unwrap();
        assert_eq!(one.manifest_digest, two.manifest_digest);
        assert_eq!(fs::read(&one.path).unwrap(), fs::read(&two.path).unwrap());
        // Another commit time is another image.
        let three =
            write_archive(&inputs(a.path(), 0o755, old, 1_796_125_525), &a.path().join("z"))
                .unwrap();
        assert_ne!(one.manifest_digest, three.manifest_digest);
    }

    #[test]
    fn every_entry_is_sorted_root_owned_and_stamped_with_the_commit_time() {
        let dir = tempfile::tempdir().unwrap();
        let archive = write_archive(
            &inputs(dir.path(), 0o700, SystemTime::now(), 1234),
            &dir.path().join("i"),
        )
        .unwrap();
        let (index, blobs) = read_archive(&archive.path).unwrap();
        let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap();
        assert_eq!(manifest_digest, archive.manifest_digest);
        let manifest: Value = serde_json::from_slice(&blobs[manifest_digest]).unwrap();
        let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
        let mut layer = Vec::new();
        flate2::read::GzDecoder::new(blobs[layer_digest].as_slice())
            .read_to_end(&mut layer)
            .unwrap();
        let got = entries(&layer);
        let want = [
            ("usr/", 0o755),
            ("usr/bin/", 0o755),
            ("usr/bin/amd-hsmp-broker", 0o755),
            ("usr/bin/amd-hsmp-exporter", 0o755),
        ];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for ((path, uid, gid, mtime, mode, user), (want_path, want_mode)) in got.iter().zip(want) {
            assert_eq!(
                (path.as_str(), *uid, *gid, *mtime, *mode, user.as_str()),
                (want_path, 0, 0, 1234, want_mode, "")
            );
        }
        for (path, uid, gid, mtime, _, _) in entries(&fs::read(&archive.path).unwrap()) {
            assert_eq!((uid, gid, mtime), (0, 0, 1234), "{path}");
        }
        // The config names the uncompressed layer, the numeric user and the labels.
        let config_digest = manifest["config"]["digest"].as_str().unwrap();
        assert_eq!(config_digest, archive.config_digest);
        let config: Value = serde_json::from_slice(&blobs[config_digest]).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], digest(&layer));
        assert_eq!(config["config"]["User"], "65534");
        let labels = &config["config"]["Labels"];
        assert_eq!(labels["org.opencontainers.image.version"], "9.9.9");
        assert_eq!(labels["org.opencontainers.image.revision"], "0123456789abcdef");
        assert_eq!(labels["org.opencontainers.image.licenses"], LICENSES);
        assert_eq!(labels["org.opencontainers.image.source"], SOURCE);
        assert_eq!(labels["org.opencontainers.image.url"], URL);
        assert_eq!(labels["org.opencontainers.image.documentation"], DOCUMENTATION);
        assert_eq!(config["created"], "1970-01-01T00:20:34Z");
        // Every blob is stored under its own digest.
        for (name, bytes) in &blobs {
            assert_eq!(&digest(bytes), name);
        }
    }

    #[test]
    fn the_labels_name_the_workspace_license_and_repository() {
        let root = crate::workspace::root();
        let manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap();
        assert!(manifest.contains(&format!("license = \"{LICENSES}\"")));
        assert!(manifest.contains(&format!("repository = \"{SOURCE}\"")));
        // The documentation label names a page of this tree, on the repository's main branch.
        let page = DOCUMENTATION.strip_prefix(&format!("{SOURCE}/blob/main/")).unwrap();
        assert!(root.join(page).is_file(), "{page}");
    }
}
