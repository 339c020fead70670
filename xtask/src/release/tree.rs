//! One build of a release from one tree (`cargo xtask release --tree TREE --out OUT`), run by
//! [`super::run`] as each builder: every artifact into `OUT`, from the tree's files alone.

use super::{chart, epoch, names, revision, tree_files};
use crate::image::{self, BINARIES, Inputs, PACKAGES, TARGET, Tar, gzip};
use crate::workspace::run_cmd;
use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The project's name: the packages', the tarball's and the image's.
pub const NAME: &str = image::NAME;

/// Every artifact of the tree at `tree`, into `out`.
pub fn build(tree: &Path, out: &Path) -> Result<()> {
    let epoch = epoch()?;
    let revision = revision()?;
    let version = crate::packaging::workspace_version(tree)?;
    fs::create_dir_all(out)?;
    let bins = binaries(tree, &revision)?;
    tarball(tree, out, &version, epoch, &bins)?;
    deb(tree, out)?;
    srpm(tree, out, &version, epoch, &revision)?;
    let image = out.join(names::image(&version));
    let files = BINARIES.iter().zip(&bins).map(|(b, p)| (format!("usr/bin/{b}"), p.clone()));
    let archive = image::write_archive(
        &Inputs {
            epoch,
            revision: revision.clone(),
            version: version.clone(),
            files: files.collect(),
        },
        &image,
    )?;
    chart::package(tree, out, epoch)?;
    sboms(out, &version, &bins, &archive)?;
    Ok(())
}

/// `cargo auditable build` of the binaries, static, offline from the vendored crates; no path
/// of the tree or of the builder's home in them. Returns their paths, in [`BINARIES`]' order.
fn binaries(tree: &Path, revision: &str) -> Result<Vec<PathBuf>> {
    let target_dir = tree.join("target");
    let home = PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?);
    // Vendored crates and build scripts' output are under the tree; cargo's home holds nothing
    // compiled but is remapped too, should a path of it reach a binary.
    let rustflags = [
        crate::image::CRT_STATIC.to_owned(),
        format!("--remap-path-prefix={}=/build", tree.display()),
        format!("--remap-path-prefix={}=/home", home.display()),
    ]
    .join("\x1f");
    let short = revision.get(..12).unwrap_or(revision);
    let short = match revision.ends_with("-dirty") {
        true => format!("{short}-dirty"),
        false => short.to_owned(),
    };
    run_cmd(
        Command::new("cargo")
            .args(["auditable", "build", "--release", "--locked", "--offline", "--quiet"])
            .args(["--target", TARGET])
            .args(PACKAGES.iter().flat_map(|b| ["--package", b]))
            .arg("--bins")
            .current_dir(tree)
            .env("CARGO_TARGET_DIR", &target_dir)
            .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
            .env("AMD_HSMP_REVISION", short)
            .env("AMD_HSMP_BRANCH", "unknown")
            .env("AMD_HSMP_BUILD_USER", "unknown"),
    )?;
    let dir = target_dir.join(TARGET).join("release");
    let private = [tree.to_path_buf(), home];
    BINARIES
        .iter()
        .map(|bin| {
            let path = dir.join(bin);
            image::check_binary(&path, &private)?;
            Ok(path)
        })
        .collect()
}

/// `NAME-VERSION-x86_64-linux.tar.gz`: the binaries, the licence, the README and the man pages
/// (every page of `packaging/man/`, which `cargo xtask man` keeps to one per program) under
/// `NAME-VERSION/`.
fn tarball(tree: &Path, out: &Path, version: &str, epoch: u64, bins: &[PathBuf]) -> Result<()> {
    let top = format!("{NAME}-{version}");
    let mut files = Vec::new();
    for (bin, path) in BINARIES.iter().zip(bins) {
        files.push((format!("{top}/{bin}"), fs::read(path)?, 0o755));
    }
    let mut pages: Vec<PathBuf> = fs::read_dir(tree.join("packaging/man"))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    pages.sort();
    for doc in [tree.join("LICENSE"), tree.join("README.md")].into_iter().chain(pages) {
        let name = doc.file_name().context("a file name")?.to_string_lossy();
        files.push((format!("{top}/{name}"), fs::read(&doc)?, 0o644));
    }
    let name = names::tarball(version);
    fs::write(out.join(name), gzip(&Tar::new(epoch).tree(&files)?)?)?;
    Ok(())
}

/// The `.deb`, by cargo-deb from the static binaries (`SOURCE_DATE_EPOCH` stamps its files).
fn deb(tree: &Path, out: &Path) -> Result<()> {
    run_cmd(
        Command::new("cargo")
            .args(["deb", "--package", NAME, "--no-build", "--locked", "--offline", "--quiet"])
            .args(["--target", TARGET, "--output"])
            .arg(out)
            .current_dir(tree)
            .env("CARGO_TARGET_DIR", tree.join("target")),
    )
}

/// The source RPM: the sources (Source0, without `target/` and `vendor/`), the vendored crates
/// (Source1) and the sysusers file (Source2), from which an EL9 build root (`mock --rebuild`)
/// builds the binary RPMs with the spec's own `%build`. Its header is stamped with the commit's
/// time and a fixed build host.
fn srpm(tree: &Path, out: &Path, version: &str, epoch: u64, revision: &str) -> Result<()> {
    let top = tree.join("target/srpm");
    let sources = top.join("SOURCES");
    fs::create_dir_all(&sources)?;
    let prefix = format!("{NAME}-{version}");
    let source0 =
        tree_files(tree, &prefix, |rel| !(rel.starts_with("target") || rel.starts_with("vendor")))?;
    fs::write(sources.join(format!("{prefix}.tar.gz")), gzip(&Tar::new(epoch).tree(&source0)?)?)?;
    let vendor = tree_files(&tree.join("vendor"), "vendor", |_| true)?;
    fs::write(
        sources.join(format!("{prefix}-vendor.tar.xz")),
        xz(&Tar::new(epoch).tree(&vendor)?)?,
    )?;
    fs::copy(
        tree.join("packaging/sysusers.d/amd-hsmp-exporter.conf"),
        sources.join(format!("{NAME}.conf")),
    )?;
    // The spec and the stand-in macros beside the sources; every file 0644 whatever the umask:
    // the source RPM records each file's mode.
    let shim = top.join("shim");
    fs::create_dir_all(&shim)?;
    for file in ["amd-hsmp-exporter.spec", "macros.check", "sysusers-compat.awk"] {
        fs::copy(tree.join("packaging/rpm").join(file), shim.join(file))?;
    }
    for dir in [&sources, &shim] {
        for entry in fs::read_dir(dir)? {
            fs::set_permissions(entry?.path(), fs::Permissions::from_mode(0o644))?;
        }
    }
    // The source RPM also records each file's owner by name, and the spec as parsed, with
    // `_topdir` in it: rpmbuild runs where the builder is root of a user namespace (its files
    // are root's) and sees its top directory at one path, /mnt, in a mount namespace of its own.
    let short = revision.get(..12).unwrap_or(revision);
    let script = format!(
        "mount --bind \"$1\" /mnt\ncd /mnt\nexec rpmbuild -bs --nodeps --quiet \
         --load /mnt/shim/macros.check --define '_topdir /mnt' --define 'shim_dir /mnt/shim' \
         --define 'prebuilt_bindir /mnt/none' --define 'revision {short}' \
         --define '_source_payload w9.gzdio' --define 'use_source_date_epoch_as_buildtime 1' \
         --define 'clamp_mtime_to_source_date_epoch 1' --define '_buildhost reproducible' \
         /mnt/shim/amd-hsmp-exporter.spec"
    );
    run_cmd(
        Command::new("unshare")
            .args(["--map-root-user", "--mount", "sh", "-ec", &script, "sh"])
            .arg(&top),
    )?;
    let srpms: Vec<PathBuf> =
        fs::read_dir(top.join("SRPMS"))?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    let [srpm] = &srpms[..] else { bail!("rpmbuild wrote {} source RPMs", srpms.len()) };
    fs::copy(srpm, out.join(srpm.file_name().context("a file name")?))?;
    Ok(())
}

/// xz of `bytes`, single-threaded (a multi-threaded xz cuts blocks by the machine's cores).
fn xz(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut child = Command::new("xz")
        .args(["-6", "-T1", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run xz")?;
    let mut stdin = child.stdin.take().context("xz's stdin")?;
    let input = bytes.to_vec();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &input));
    let output = child.wait_with_output()?;
    writer.join().map_err(|_| anyhow::anyhow!("the writer to xz panicked"))??;
    ensure!(output.status.success(), "xz failed: {}", output.status);
    Ok(output.stdout)
}

/// A CycloneDX SBOM of each binary, from the dependency list `cargo auditable` embedded in it
/// (`auditable2cdx`), and one of the image: the image as the described component, holding the
/// binaries, each with its crates.
fn sboms(out: &Path, version: &str, bins: &[PathBuf], image: &image::Archive) -> Result<()> {
    let mut binaries = Vec::new();
    for (bin, path) in BINARIES.iter().zip(bins) {
        let text = crate::workspace::stdout_of(Command::new("auditable2cdx").arg(path))?;
        let mut sbom: Value = serde_json::from_str(&text).context("auditable2cdx's output")?;
        ensure!(sbom["bomFormat"] == "CycloneDX", "auditable2cdx wrote no CycloneDX for {bin}");
        reproducible(&mut sbom);
        fs::write(out.join(names::sbom(bin, version)), pretty(&sbom)?)?;
        binaries.push((bin, sbom));
    }
    let sbom = image_sbom(version, &image.manifest_digest, &binaries);
    fs::write(out.join(names::image_sbom(version)), pretty(&sbom)?)?;
    Ok(())
}

/// The image's SBOM: the image (by its manifest digest) as the described component, holding the
/// binaries' components, each with its crates, and their dependency graphs.
fn image_sbom(version: &str, manifest_digest: &str, binaries: &[(&&str, Value)]) -> Value {
    let components: Vec<Value> = binaries
        .iter()
        .map(|(bin, sbom)| {
            let mut component = sbom["metadata"]["component"].clone();
            component["type"] = json!("application");
            component["name"] = json!(bin);
            component["components"] = sbom["components"].clone();
            // Each binary's document numbers its own references from 0: one document needs them
            // unique.
            prefix_refs(&mut component, bin);
            component
        })
        .collect();
    let mut sbom = json!({
        "bomFormat": "CycloneDX",
        "specVersion": binaries.first().map_or(json!("1.5"), |(_, b)| b["specVersion"].clone()),
        "version": 1,
        "metadata": {
            "component": {
                "type": "container",
                "bom-ref": manifest_digest,
                "name": NAME,
                "version": version,
                "purl": format!("pkg:oci/{NAME}@{}", manifest_digest.replace(':', "%3A")),
            },
            "tools": {"components": [{"type": "application", "name": "cargo xtask release"}]},
        },
        "components": components,
        "dependencies": dependencies(manifest_digest, binaries),
    });
    reproducible(&mut sbom);
    sbom
}

/// The image's dependency graph: the image on each binary, and each binary's own graph with
/// its references prefixed as [`prefix_refs`] does.
fn dependencies(image_ref: &str, binaries: &[(&&str, Value)]) -> Value {
    let mut graph = Vec::new();
    let roots: Vec<Value> = binaries
        .iter()
        .filter_map(|(bin, sbom)| {
            Some(json!(format!("{bin}:{}", sbom["metadata"]["component"]["bom-ref"].as_str()?)))
        })
        .collect();
    graph.push(json!({"ref": image_ref, "dependsOn": roots}));
    for (bin, sbom) in binaries {
        for dep in sbom["dependencies"].as_array().into_iter().flatten() {
            let on: Vec<Value> = dep["dependsOn"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| Some(json!(format!("{bin}:{}", r.as_str()?))))
                .collect();
            if let Some(r) = dep["ref"].as_str() {
                graph.push(json!({"ref": format!("{bin}:{r}"), "dependsOn": on}));
            }
        }
    }
    Value::Array(graph)
}

/// Prefixes the `bom-ref` of `component` and of every component under it with `prefix:`.
fn prefix_refs(component: &mut Value, prefix: &str) {
    if let Some(r) = component["bom-ref"].as_str() {
        component["bom-ref"] = json!(format!("{prefix}:{r}"));
    }
    if let Some(children) = component["components"].as_array_mut() {
        for child in children {
            prefix_refs(child, prefix);
        }
    }
}

/// A CycloneDX document without the fields that differ from run to run (a random serial number
/// and the time of writing), marked as such by the `cdx:reproducible` property.
fn reproducible(sbom: &mut Value) {
    if let Some(doc) = sbom.as_object_mut() {
        doc.remove("serialNumber");
    }
    if let Some(meta) = sbom["metadata"].as_object_mut() {
        meta.remove("timestamp");
        meta.insert("properties".into(), json!([{"name": "cdx:reproducible", "value": "true"}]));
    }
}

fn pretty(value: &Value) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tarball_holds_the_binaries_the_licence_the_readme_and_every_man_page() {
        let tree = tempfile::tempdir().unwrap();
        let man = tree.path().join("packaging/man");
        fs::create_dir_all(&man).unwrap();
        for file in ["LICENSE", "README.md", "packaging/man/b.8", "packaging/man/a.1"] {
            fs::write(tree.path().join(file), file).unwrap();
        }
        let bins: Vec<PathBuf> = BINARIES.iter().map(|b| tree.path().join(b)).collect();
        for bin in &bins {
            fs::write(bin, "ELF").unwrap();
        }
        let out = tempfile::tempdir().unwrap();
        tarball(tree.path(), out.path(), "9.9.9", 0, &bins).unwrap();
        let gz = fs::read(out.path().join(names::tarball("9.9.9"))).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&gz[..]));
        let mut names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with('/'))
            .collect();
        names.sort();
        let top = format!("{NAME}-9.9.9");
        let mut expected: Vec<String> = BINARIES
            .iter()
            .copied()
            .chain(["LICENSE", "README.md", "a.1", "b.8"])
            .map(|n| format!("{top}/{n}"))
            .collect();
        expected.sort();
        assert_eq!(names, expected);
    }

    #[test]
    fn an_sbom_loses_its_serial_number_and_time_and_says_it_is_reproducible() {
        let mut sbom = json!({
            "bomFormat": "CycloneDX",
            "serialNumber": "urn:uuid:3e671687-395b-41f5-a30f-a58921a69b79",
            "metadata": {"timestamp": "2026-12-07T06:00:00Z", "component": {"name": "x"}},
        });
        reproducible(&mut sbom);
        assert_eq!(
            sbom,
            json!({
                "bomFormat": "CycloneDX",
                "metadata": {
                    "component": {"name": "x"},
                    "properties": [{"name": "cdx:reproducible", "value": "true"}],
                },
            })
        );
    }

    /// Every `bom-ref` of a document, at any depth.
    fn refs(value: &Value, into: &mut Vec<String>) {
        if let Some(r) = value["bom-ref"].as_str() {
            into.push(r.to_owned());
        }
        for child in value["components"].as_array().into_iter().flatten() {
            refs(child, into);
        }
    }

    #[test]
    fn the_image_sbom_holds_both_binaries_with_unique_references_that_its_graph_resolves() {
        // Two documents as auditable2cdx writes them: references numbered from 0 in each.
        let binary = |name: &str| {
            json!({
                "bomFormat": "CycloneDX", "specVersion": "1.5",
                "metadata": {"component": {"bom-ref": "0", "name": name, "type": "application"}},
                "components": [{"bom-ref": "1", "name": "anyhow"}, {"bom-ref": "2", "name": "libc"}],
                "dependencies": [{"ref": "0", "dependsOn": ["1", "2"]}, {"ref": "1", "dependsOn": []}],
            })
        };
        let (broker, exporter) = (&"amd-hsmp-broker", &"amd-hsmp-exporter");
        let sbom = image_sbom(
            "9.9.9",
            "sha256:ab",
            &[(broker, binary("amd-hsmp-broker")), (exporter, binary("amd-hsmp-exporter"))],
        );
        let mut all = Vec::new();
        refs(&sbom["metadata"]["component"], &mut all);
        for c in sbom["components"].as_array().unwrap() {
            refs(c, &mut all);
        }
        let unique: std::collections::BTreeSet<&String> = all.iter().collect();
        assert_eq!(all.len(), 7, "{all:?}");
        assert_eq!(unique.len(), all.len(), "{all:?}");
        for dep in sbom["dependencies"].as_array().unwrap() {
            for r in std::iter::once(&dep["ref"]).chain(dep["dependsOn"].as_array().unwrap()) {
                assert!(all.contains(&r.as_str().unwrap().to_owned()), "{r} is no component");
            }
        }
        assert_eq!(
            sbom["dependencies"][0]["dependsOn"],
            json!(["amd-hsmp-broker:0", "amd-hsmp-exporter:0"])
        );
        assert_eq!(sbom["metadata"]["component"]["type"], "container");
        assert!(sbom.get("serialNumber").is_none());
    }

    #[test]
    fn tree_files_keep_only_the_executable_bit_of_a_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("target")).unwrap();
        fs::write(dir.path().join("target/skip"), "").unwrap();
        fs::write(dir.path().join("run"), "#!/bin/sh").unwrap();
        fs::set_permissions(dir.path().join("run"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(dir.path().join("doc"), "d").unwrap();
        fs::set_permissions(dir.path().join("doc"), fs::Permissions::from_mode(0o600)).unwrap();
        let files = tree_files(dir.path(), "p", |rel| !rel.starts_with("target")).unwrap();
        let got: Vec<(&str, u32)> = files.iter().map(|(n, _, m)| (n.as_str(), *m)).collect();
        assert_eq!(got, [("p/doc", 0o644), ("p/run", 0o755)]);
    }

    #[test]
    fn xz_of_the_same_bytes_is_the_same_bytes() {
        let data: Vec<u8> = (0..200_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        assert_eq!(xz(&data).unwrap(), xz(&data).unwrap());
        assert!(xz(&data).unwrap().starts_with(b"\xfd7zXZ"));
    }
}
