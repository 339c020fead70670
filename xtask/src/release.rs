//! `cargo xtask release [--dry-run] [--out DIR]`: every artifact of a release, built twice from
//! the same sources and compared byte for byte, then their checksums signed and verified.
//!
//! The artifacts ([`tree::build`], names in docs/releasing.md): the static binaries in a
//! tarball, the `.deb`, the source RPM, the OCI image, the Helm chart as a `.tgz` and as an OCI
//! artifact, and a CycloneDX SBOM of each binary and of the image. Every timestamp in them is
//! the commit's (`SOURCE_DATE_EPOCH`).
//!
//! Twice: the sources (the files git tracks or would add) and the crates of Cargo.lock, vendored
//! once by `cargo vendor`, are copied into two trees at different paths. The first tree is built
//! as root with umask 022, the second as uid 65534 with umask 077 (its files' modes cut by that
//! umask too), in another time zone and locale. Each is built by this program run again on its
//! tree (`release --tree`), offline, with a cargo home and a target directory of its own. Every
//! file of the two outputs must have the same SHA-256, or the release fails naming the files.
//!
//! Then `SHA256SUMS` is written and signed with minisign, and both are verified. With
//! `--dry-run` the key is a throwaway one made for the run; without it, the release is of a
//! tagged, clean commit (`v` and the workspace version) and the key is the file
//! `AMD_HSMP_RELEASE_MINISIGN_KEY` names. Publishing (the registry, cosign, the chart
//! repository) is `.github/workflows/release.yml`, which runs this command and pushes its files.

mod chart;
mod sign;
mod tree;

use crate::as_user::Search;
use crate::image::{self, Meta};
use crate::workspace::{root, stdout_of, target_dir};
use anyhow::{Context, Result, bail, ensure};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const USAGE: &str = "usage: cargo xtask release [--dry-run] [--out DIR]";
/// The uid (and gid) of the second build: nobody.
const OTHER_UID: u32 = 65_534;
/// The variable naming the minisign secret key of a real release.
pub const KEY_VARIABLE: &str = "AMD_HSMP_RELEASE_MINISIGN_KEY";
/// The variable that passes the revision to the builds of the trees, which have no git history.
const REVISION_VARIABLE: &str = "AMD_HSMP_RELEASE_REVISION";

/// The names of a release's files, V the workspace version and CV the chart's: the builds
/// write these, [`run`] requires exactly [`artifacts`], and the workflow's check reads them.
pub mod names {
    use super::tree::NAME;

    pub fn tarball(v: &str) -> String {
        format!("{NAME}-{v}-x86_64-linux.tar.gz")
    }
    /// cargo-deb's name.
    pub fn deb(v: &str) -> String {
        format!("{NAME}_{v}-1_amd64.deb")
    }
    /// rpmbuild's name (`Release: 1%{?dist}`, EL9).
    pub fn srpm(v: &str) -> String {
        format!("{NAME}-{v}-1.el9.src.rpm")
    }
    pub fn image(v: &str) -> String {
        format!("{NAME}-{v}.oci.tar")
    }
    pub fn chart_tgz(cv: &str) -> String {
        format!("{NAME}-{cv}.tgz")
    }
    pub fn chart_oci(cv: &str) -> String {
        format!("{NAME}-chart-{cv}.oci.tar")
    }
    pub fn sbom(binary: &str, v: &str) -> String {
        format!("{binary}-{v}.cdx.json")
    }
    pub fn image_sbom(v: &str) -> String {
        format!("{NAME}-{v}.oci.cdx.json")
    }
}

/// Every file of a release, sorted by name.
pub fn artifacts(v: &str, cv: &str) -> Vec<String> {
    let mut all = vec![
        names::tarball(v),
        names::deb(v),
        names::srpm(v),
        names::image(v),
        names::chart_tgz(cv),
        names::chart_oci(cv),
        names::image_sbom(v),
        sign::SUMS.to_owned(),
        sign::SIGNATURE.to_owned(),
        sign::PUBLIC_KEY.to_owned(),
    ];
    all.extend(image::BINARIES.iter().map(|b| names::sbom(b, v)));
    all.sort();
    all
}

/// The chart of the sources at `root` as the release packages it (`.tgz` and OCI artifact),
/// into `out`, stamped with the commit's time: for kube-test, which loads it in Helm.
pub fn package_chart(root: &Path, out: &Path) -> Result<()> {
    chart::package(root, out, Meta::of(root)?.epoch)
}

/// What `release` was asked.
#[derive(Debug, PartialEq, Eq)]
struct Options {
    dry_run: bool,
    out: Option<PathBuf>,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options> {
        let mut options = Options { dry_run: false, out: None };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--dry-run" => options.dry_run = true,
                "--out" => options.out = Some(args.next().context(USAGE)?.into()),
                other => bail!("unknown argument {other:?}\n{USAGE}"),
            }
        }
        Ok(options)
    }
}

/// One of the two builds: who builds, with which umask, where.
struct Builder {
    name: &'static str,
    /// `None`: as the caller (root).
    uid: Option<u32>,
    umask: u32,
    tz: &'static str,
    lang: &'static str,
    /// The tree's parent: its home, the tree and its output.
    dir: PathBuf,
}

impl Builder {
    fn home(&self) -> PathBuf {
        self.dir.join("home")
    }
    fn out(&self) -> PathBuf {
        self.dir.join("out")
    }
}

/// `cargo xtask release ...`.
pub fn run(args: &[String]) -> Result<()> {
    if let [flag, tree, out_flag, out] = args
        && flag == "--tree"
        && out_flag == "--out"
    {
        return tree::build(Path::new(tree), Path::new(out));
    }
    let options = Options::parse(args)?;
    let started = Instant::now();
    let root = root();
    let meta = Meta::of(&root)?;
    let version = crate::packaging::workspace_version(&root)?;
    let key = match options.dry_run {
        true => None,
        false => Some(release_key(&root, &version, &meta)?),
    };
    crate::deps::require_release_tools()?;
    let out = options.out.clone().unwrap_or_else(|| target_dir(&root).join("dist"));

    let work = target_dir(&root).join("release-work");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("cannot empty {}", work.display()))?;
    }
    // The second tree lives under another directory of another depth, so that a path of either
    // that reaches an artifact makes the two differ.
    let elsewhere = tempfile::Builder::new().prefix("amd-hsmp-release-").tempdir_in("/var/tmp")?;
    let builders = [
        Builder {
            name: "root, umask 022",
            uid: None,
            umask: 0o022,
            tz: "UTC",
            lang: "C.UTF-8",
            dir: work.join("a"),
        },
        Builder {
            name: "uid 65534, umask 077",
            uid: Some(OTHER_UID),
            umask: 0o077,
            tz: "Pacific/Chatham",
            lang: "C",
            dir: elsewhere.path().join("another/place"),
        },
    ];
    let first_tree = builders[0].dir.join("amd-hsmp-exporter");
    image::copy_sources(&root, &first_tree)?;
    vendor(&first_tree)?;
    let second_tree = builders[1].dir.join("src");
    copy_tree(&first_tree, &second_tree, builders[1].umask)?;
    let toolchain = toolchain_bin()?;
    let tools_bin = which_dir("cargo-deb")?;
    let exe = std::env::current_exe().context("cannot find this program")?;
    // The other user reaches this program, the toolchain, the cargo tools and its own directory.
    let _search = Search::grant(&[
        exe.clone(),
        toolchain.clone(),
        tools_bin.clone(),
        builders[1].dir.clone(),
    ])?;
    let trees = [first_tree, second_tree];
    for (builder, tree) in builders.iter().zip(&trees) {
        let begun = Instant::now();
        prepare_home(builder, tree)?;
        let mut cmd = build_command(builder, tree, &exe, &[&toolchain, &tools_bin], &meta);
        crate::workspace::run_cmd(&mut cmd)
            .with_context(|| format!("the build as {} failed", builder.name))?;
        println!(
            "release: built {} as {} in {:.0} s",
            tree.display(),
            builder.name,
            begun.elapsed().as_secs_f64()
        );
    }
    let files = same_outputs(&builders[0].out(), &builders[1].out())?;
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("cannot empty {}", out.display()))?;
    }
    fs::create_dir_all(&out)?;
    for name in &files {
        fs::copy(builders[0].out().join(name), out.join(name))?;
    }
    let signed = sign::sign_and_verify(&out, &files, key.as_deref(), &version, &meta.revision)?;
    let chart_yaml = fs::read_to_string(root.join(crate::workspace::CHART).join("Chart.yaml"))?;
    let expected = artifacts(&version, crate::workspace::chart_field(&chart_yaml, "version")?);
    let mut written: Vec<String> = fs::read_dir(&out)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    written.sort();
    ensure!(written == expected, "the release wrote {written:?}, not {expected:?}");
    println!(
        "release: {} artifacts built twice, identical; {signed}; in {} ({:.0} s)",
        files.len(),
        out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A real release: a clean tree at the commit tagged `v{version}`, and the signing key.
fn release_key(root: &Path, version: &str, meta: &Meta) -> Result<PathBuf> {
    ensure!(
        !meta.revision.ends_with("-dirty"),
        "the working tree has changes: a release is of a commit (or use --dry-run)"
    );
    let tags = image::git(root, &["tag", "--points-at", "HEAD"])?;
    let tag = format!("v{version}");
    ensure!(
        tags.lines().any(|t| t == tag),
        "HEAD is not tagged {tag} (tags here: [{}]); tag the release commit, or use --dry-run",
        tags.lines().collect::<Vec<_>>().join(" ")
    );
    let key = std::env::var_os(KEY_VARIABLE)
        .with_context(|| format!("{KEY_VARIABLE} names no minisign secret key"))?;
    Ok(PathBuf::from(key))
}

/// `cargo vendor` of Cargo.lock's crates into `tree/vendor` (the source RPM's Source1 and the
/// builds' only registry).
fn vendor(tree: &Path) -> Result<()> {
    crate::workspace::run_cmd(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["vendor", "--locked", "--versioned-dirs", "--quiet", "vendor"])
            .current_dir(tree)
            .stdout(std::process::Stdio::null()),
    )
}

/// Copies the tree `from` to `to`, every mode cut by `umask` as a checkout by a user with that
/// umask has them; the parent of `to` becomes the other builder's.
fn copy_tree(from: &Path, to: &Path, umask: u32) -> Result<()> {
    for entry in walkdir(from)? {
        let rel = entry.strip_prefix(from)?;
        let dest = to.join(rel);
        let meta = fs::symlink_metadata(&entry)?;
        if meta.is_dir() {
            fs::create_dir_all(&dest)?;
        } else if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&entry)?, &dest)?;
            continue;
        } else {
            fs::copy(&entry, &dest)?;
        }
        fs::set_permissions(&dest, fs::Permissions::from_mode(meta.mode() & 0o777 & !umask))?;
    }
    Ok(())
}

/// Every path under `dir` (itself first), parents before children.
fn walkdir(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let path = out[i].clone();
        if fs::symlink_metadata(&path)?.is_dir() {
            let mut children: Vec<PathBuf> =
                fs::read_dir(&path)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
            children.sort();
            out.extend(children);
        }
        i += 1;
    }
    Ok(out)
}

/// The builder's home with a cargo configuration that takes every crate from the tree's
/// `vendor/`, offline; everything under the builder's directory becomes the builder's.
fn prepare_home(builder: &Builder, tree: &Path) -> Result<()> {
    let cargo_home = builder.home().join(".cargo");
    fs::create_dir_all(&cargo_home)?;
    fs::write(
        cargo_home.join("config.toml"),
        format!(
            "[source.crates-io]\nreplace-with = \"vendored-sources\"\n\n\
             [source.vendored-sources]\ndirectory = \"{}\"\n\n[net]\noffline = true\n",
            tree.join("vendor").display()
        ),
    )?;
    fs::create_dir_all(builder.out())?;
    if let Some(uid) = builder.uid {
        let owner = Some(rustix::fs::Uid::from_raw(uid));
        let group = Some(rustix::fs::Gid::from_raw(uid));
        for path in walkdir(&builder.dir)? {
            rustix::fs::chownat(
                rustix::fs::CWD,
                &path,
                owner,
                group,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .with_context(|| format!("cannot give {} to uid {uid}", path.display()))?;
        }
    }
    Ok(())
}

/// This program, run on `tree` as the builder, with a plain environment of its own.
fn build_command(
    builder: &Builder,
    tree: &Path,
    exe: &Path,
    bins: &[&Path],
    meta: &Meta,
) -> Command {
    let switch = match builder.uid {
        Some(uid) => format!(
            "exec setpriv --reuid={uid} --regid={uid} --clear-groups --inh-caps=-all \
             --bounding-set=-all -- \"$@\""
        ),
        None => "exec \"$@\"".to_owned(),
    };
    let mut path: Vec<String> = bins.iter().map(|b| b.display().to_string()).collect();
    path.push("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    let mut cmd = Command::new("sh");
    cmd.arg("-ec")
        .arg(format!("umask {:03o}\n{switch}", builder.umask))
        .arg("sh")
        .arg(exe)
        .args(["release", "--tree"])
        .arg(tree)
        .arg("--out")
        .arg(builder.out())
        .current_dir(tree)
        .env_clear()
        .env("PATH", path.join(":"))
        .env("HOME", builder.home())
        .env("TMPDIR", builder.home())
        .env("CARGO_HOME", builder.home().join(".cargo"))
        .env("TZ", builder.tz)
        .env("LANG", builder.lang)
        .env("SOURCE_DATE_EPOCH", meta.epoch.to_string())
        .env(REVISION_VARIABLE, &meta.revision);
    cmd
}

/// The directory of the toolchain's own `cargo` and `rustc` (not rustup's proxies, which the
/// other user cannot run).
fn toolchain_bin() -> Result<PathBuf> {
    let sysroot = stdout_of(Command::new("rustc").args(["--print", "sysroot"]))?;
    let bin = PathBuf::from(sysroot.trim()).join("bin");
    ensure!(bin.join("cargo").is_file(), "no cargo in {}", bin.display());
    Ok(bin)
}

/// The directory holding the command `name` on `PATH`.
fn which_dir(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .find(|dir| dir.join(name).is_file())
        .with_context(|| format!("{name} is not on PATH; run `cargo xtask deps`"))
}

/// The files under `dir` that `keep` keeps (by their path relative to `dir`), as tar entries
/// under `prefix`: executable ones 0755, others 0644, whatever the builder's umask made them.
fn tree_files(
    dir: &Path,
    prefix: &str,
    keep: impl Fn(&Path) -> bool,
) -> Result<Vec<(String, Vec<u8>, u32)>> {
    let mut files = Vec::new();
    for path in walkdir(dir)? {
        let rel = path.strip_prefix(dir)?;
        let meta = fs::symlink_metadata(&path)?;
        if rel.as_os_str().is_empty() || meta.is_dir() || !keep(rel) {
            continue;
        }
        ensure!(meta.is_file(), "{} is not a file: a release tarball holds files", path.display());
        let mode = if meta.mode() & 0o100 != 0 { 0o755 } else { 0o644 };
        let name = format!("{prefix}/{}", rel.to_str().context("a path that is not UTF-8")?);
        files.push((name, fs::read(&path)?, mode));
    }
    Ok(files)
}

/// The two outputs hold the same files with the same bytes; returns their names, sorted.
fn same_outputs(first: &Path, second: &Path) -> Result<Vec<String>> {
    let names = |dir: &Path| -> Result<Vec<String>> {
        let mut names: Vec<String> = fs::read_dir(dir)?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_>>()?;
        names.sort();
        Ok(names)
    };
    let (a, b) = (names(first)?, names(second)?);
    ensure!(a == b, "the two builds made different files: {a:?} and {b:?}");
    let mut differ = Vec::new();
    for name in &a {
        let (x, y) =
            (sign::sha256_file(&first.join(name))?, sign::sha256_file(&second.join(name))?);
        println!("release: {x}  {name}");
        if x != y {
            differ.push(format!("{name}: {x} and {y}"));
        }
    }
    ensure!(
        differ.is_empty(),
        "not reproducible: the builds in {} and {} differ in\n  {}\n(diffoscope FILE FILE shows how)",
        first.display(),
        second.display(),
        differ.join("\n  ")
    );
    Ok(a)
}

/// The revision the tree is of: passed by [`REVISION_VARIABLE`].
fn revision() -> Result<String> {
    std::env::var(REVISION_VARIABLE).with_context(|| format!("{REVISION_VARIABLE} is not set"))
}

/// `SOURCE_DATE_EPOCH`, which the caller sets.
fn epoch() -> Result<u64> {
    let v = std::env::var("SOURCE_DATE_EPOCH").context("SOURCE_DATE_EPOCH is not set")?;
    v.parse().with_context(|| format!("SOURCE_DATE_EPOCH {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_options_are_a_dry_run_and_an_output_directory() {
        assert_eq!(
            Options::parse(&args(&["--dry-run", "--out", "d"])).unwrap(),
            Options { dry_run: true, out: Some("d".into()) }
        );
        assert_eq!(Options::parse(&[]).unwrap(), Options { dry_run: false, out: None });
        assert!(Options::parse(&args(&["--out"])).is_err());
        assert!(Options::parse(&args(&["--sign"])).unwrap_err().to_string().contains("--sign"));
    }

    #[test]
    fn a_release_is_of_a_clean_commit_tagged_with_the_version_and_needs_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| image::git(dir.path(), args).unwrap();
        git(&["init", "-q"]);
        fs::write(dir.path().join("f"), "1").unwrap();
        git(&["add", "f"]);
        git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"]);
        let meta = |dirty: bool| Meta {
            epoch: 1,
            revision: format!(
                "{}{}",
                git(&["rev-parse", "HEAD"]),
                if dirty { "-dirty" } else { "" }
            ),
        };
        let refused =
            |dirty| release_key(dir.path(), "1.2.3", &meta(dirty)).unwrap_err().to_string();
        assert!(refused(true).contains("changes"), "{}", refused(true));
        assert!(refused(false).contains("not tagged v1.2.3"), "{}", refused(false));
        git(&["tag", "v1.2.4"]);
        assert!(refused(false).contains("[v1.2.4]"), "{}", refused(false));
        git(&["tag", "v1.2.3"]);
        // Tagged: what is left is the key, which this test's environment does not name.
        if std::env::var_os(KEY_VARIABLE).is_none() {
            assert!(refused(false).contains(KEY_VARIABLE), "{}", refused(false));
        }
    }

    #[test]
    fn a_copy_for_another_user_has_its_modes_cut_by_that_users_umask() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("a");
        fs::create_dir_all(from.join("sub")).unwrap();
        fs::write(from.join("sub/script"), "x").unwrap();
        fs::set_permissions(from.join("sub/script"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(from.join("file"), "y").unwrap();
        fs::set_permissions(from.join("file"), fs::Permissions::from_mode(0o644)).unwrap();
        let to = dir.path().join("b/c");
        copy_tree(&from, &to, 0o077).unwrap();
        let mode = |p: &str| fs::metadata(to.join(p)).unwrap().mode() & 0o777;
        assert_eq!((mode("sub/script"), mode("file"), mode("sub")), (0o700, 0o600, 0o700));
        assert_eq!(fs::read_to_string(to.join("sub/script")).unwrap(), "x");
    }

    #[test]
    fn outputs_that_differ_in_one_byte_are_not_reproducible_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        for d in [&a, &b] {
            fs::create_dir_all(d).unwrap();
            fs::write(d.join("same.tar.gz"), "same").unwrap();
        }
        fs::write(a.join("x.deb"), "one").unwrap();
        fs::write(b.join("x.deb"), "two").unwrap();
        let e = same_outputs(&a, &b).unwrap_err().to_string();
        assert!(e.contains("x.deb") && !e.contains("same.tar.gz"), "{e}");
        fs::write(b.join("x.deb"), "one").unwrap();
        assert_eq!(same_outputs(&a, &b).unwrap(), ["same.tar.gz", "x.deb"]);
        fs::write(b.join("extra"), "").unwrap();
        assert!(same_outputs(&a, &b).unwrap_err().to_string().contains("different files"));
    }
}
