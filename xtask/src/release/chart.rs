//! The Helm chart of a release: the `.tgz` Helm's `helm package` makes (the chart's files under
//! its name, without what `.helmignore` leaves out), written by this code so that it is a
//! function of the files and the commit's time alone; and the same `.tgz` as an OCI artifact
//! (Helm's media types), an OCI image layout in a tar, for `oras cp --from-oci-layout`.

use super::tree_files;
use crate::image::{Tar, digest, gzip, rfc3339};
use crate::workspace::{CHART, chart_field};
use anyhow::{Result, bail};
use serde_json::json;
use std::fs;
use std::path::Path;

/// Helm's media types for a chart in an OCI registry (`helm/pkg/registry/constants.go`).
const CONFIG_MEDIA_TYPE: &str = "application/vnd.cncf.helm.config.v1+json";
const CONTENT_MEDIA_TYPE: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";

/// `NAME-VERSION.tgz` and `NAME-chart-VERSION.oci.tar` of the chart in `tree`, into `out`.
pub fn package(tree: &Path, out: &Path, epoch: u64) -> Result<()> {
    let dir = tree.join(CHART);
    let chart_yaml = fs::read_to_string(dir.join("Chart.yaml"))?;
    let name = chart_field(&chart_yaml, "name")?;
    let version = chart_field(&chart_yaml, "version")?;
    let ignored = helmignore(&fs::read_to_string(dir.join(".helmignore")).unwrap_or_default())?;
    let files = tree_files(&dir, name, |rel| {
        let top = rel.iter().next().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
        top != ".helmignore" && !ignored.contains(&top)
    })?;
    let tgz = gzip(&Tar::new(epoch).tree(&files)?)?;
    fs::write(out.join(super::names::chart_tgz(version)), &tgz)?;

    // What `helm push` stores as the config: the chart's metadata, as JSON.
    let mut config = serde_json::Map::new();
    for key in ["apiVersion", "name", "version", "appVersion", "type", "kubeVersion", "home"] {
        config.insert(key.into(), json!(chart_field(&chart_yaml, key)?));
    }
    let config = serde_json::to_vec(&config)?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": digest(&config), "size": config.len()},
        "layers": [{"mediaType": CONTENT_MEDIA_TYPE, "digest": digest(&tgz), "size": tgz.len()}],
        "annotations": {
            "org.opencontainers.image.created": rfc3339(epoch),
            "org.opencontainers.image.title": name,
            "org.opencontainers.image.version": version,
        },
    }))?;
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(&manifest),
            "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": version},
        }],
    });
    let layout = crate::image::layout(&index, &[&tgz, &config, &manifest], epoch)?;
    fs::write(out.join(super::names::chart_oci(version)), layout)?;
    Ok(())
}

/// The top-level names `.helmignore` leaves out: lines `NAME` or `NAME/`; comments and blank
/// lines aside, any other pattern is refused rather than read wrong.
fn helmignore(text: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let name = line.strip_suffix('/').unwrap_or(line);
        if name.is_empty() || name.contains(['*', '?', '[', '!', '/']) {
            bail!(
                ".helmignore's pattern {line:?} is more than a top-level name: extend release/chart.rs"
            );
        }
        names.push(name.to_owned());
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helmignore_names_are_top_level_and_other_patterns_are_refused() {
        assert_eq!(helmignore("# c\nci/\n\nNOTES\n").unwrap(), ["ci", "NOTES"]);
        assert!(helmignore("*.swp\n").unwrap_err().to_string().contains("*.swp"));
        assert!(helmignore("a/b\n").is_err());
    }

    #[test]
    fn the_chart_is_packaged_without_what_helmignore_leaves_out() {
        let root = crate::workspace::root();
        let out = tempfile::tempdir().unwrap();
        package(&root, out.path(), 1_700_000_000).unwrap();
        let chart_yaml = fs::read_to_string(root.join(CHART).join("Chart.yaml")).unwrap();
        let version = chart_field(&chart_yaml, "version").unwrap();
        let tgz = fs::read(out.path().join(format!("amd-hsmp-exporter-{version}.tgz"))).unwrap();
        let mut names = Vec::new();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(tgz.as_slice()));
        for entry in archive.entries().unwrap() {
            names.push(entry.unwrap().path().unwrap().to_string_lossy().into_owned());
        }
        assert!(names.contains(&"amd-hsmp-exporter/Chart.yaml".to_owned()), "{names:?}");
        assert!(names.contains(&"amd-hsmp-exporter/values.yaml".to_owned()), "{names:?}");
        assert!(names.iter().any(|n| n.starts_with("amd-hsmp-exporter/templates/")));
        assert!(!names.iter().any(|n| n.contains("/ci/") || n.ends_with(".helmignore")));
        // The OCI layout's only layer is that .tgz, under Helm's media type.
        let layout =
            fs::read(out.path().join(format!("amd-hsmp-exporter-chart-{version}.oci.tar")))
                .unwrap();
        let (index, blobs) = crate::image::read_archive_bytes(&layout).unwrap();
        assert_eq!(
            index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
            version
        );
        let manifest: serde_json::Value =
            serde_json::from_slice(&blobs[index["manifests"][0]["digest"].as_str().unwrap()])
                .unwrap();
        assert_eq!(manifest["layers"][0]["mediaType"], CONTENT_MEDIA_TYPE);
        assert_eq!(manifest["layers"][0]["digest"], digest(&tgz));
        let config: serde_json::Value =
            serde_json::from_slice(&blobs[manifest["config"]["digest"].as_str().unwrap()]).unwrap();
        assert_eq!(config["version"], version);
        assert_eq!(config["appVersion"], env!("CARGO_PKG_VERSION"));
    }
}
