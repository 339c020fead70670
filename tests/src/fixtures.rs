//! Fixture machines: the procfs/sysfs trees under `tests/fixtures/<machine>/{proc,sys}` that the
//! broker's topology discovery reads, written by `gen-fixtures` from the simulator's machine
//! specs so that the tree the broker reads and the firmware the fake device serves describe the
//! same machine.

use amd_hsmp_sim::{MachineSpec, Profile};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Every fixture machine, by name: the simulator's profiles plus variants with SMT off and
/// with an offline CPU.
pub fn machines() -> BTreeMap<&'static str, MachineSpec> {
    let mut machines: BTreeMap<&'static str, MachineSpec> =
        Profile::ALL.into_iter().map(|p| (p.name(), p.spec())).collect();

    // SMT disabled in the firmware set-up: one thread per core, CPU numbers run socket by
    // socket while APIC ids keep the socket in their high bits.
    let mut smt_off = Profile::Genoa2p.spec();
    smt_off.smt = false;
    machines.insert("genoa-2p-smt-off", smt_off);

    // CPU 1 (thread 0 of socket 0, core 1) taken offline: the core is read through its
    // sibling, CPU 65, whose APIC id is the odd one.
    let mut offline = Profile::Genoa2p.spec();
    offline.offline_cpus = vec![1];
    machines.insert("genoa-2p-cpu-offline", offline);

    machines
}

/// The spec of fixture machine `name`.
pub fn machine(name: &str) -> Option<MachineSpec> {
    machines().remove(name)
}

/// `tests/fixtures` in the source tree.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// The tree of machine `name` under `dir`: pass `<tree>/proc` and `<tree>/sys` to the broker.
pub fn tree(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// Writes every fixture machine's tree under `dir`, replacing what was there.
pub fn write_all(dir: &Path) -> io::Result<()> {
    for (name, spec) in machines() {
        let tree = tree(dir, name);
        match std::fs::remove_dir_all(&tree) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        spec.write_fixture(&tree)?;
    }
    Ok(())
}

/// Every regular file under `root`, by path relative to it, with its content.
pub fn read_tree(root: &Path) -> io::Result<BTreeMap<PathBuf, Vec<u8>>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
                files.insert(rel, std::fs::read(&path)?);
            }
        }
    }
    Ok(files)
}

/// The differences between two trees, one line per file missing, extra or different.
pub fn diff_trees(want: &Path, have: &Path) -> io::Result<Vec<String>> {
    let (want, have) = (read_tree(want)?, read_tree(have)?);
    let mut diffs = Vec::new();
    for (path, content) in &want {
        match have.get(path) {
            None => diffs.push(format!("missing: {}", path.display())),
            Some(c) if c != content => diffs.push(format!("differs: {}", path.display())),
            Some(_) => {}
        }
    }
    for path in have.keys().filter(|p| !want.contains_key(*p)) {
        diffs.push(format!("not generated: {}", path.display()));
    }
    Ok(diffs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use amd_hsmp_broker::discover_topology as discover;
    use amd_hsmp_proto::Topology;

    fn discover_fixture(spec: &MachineSpec) -> (tempfile::TempDir, Topology) {
        let dir = tempfile::tempdir().unwrap();
        spec.write_fixture(dir.path()).unwrap();
        let topo = discover(&dir.path().join("proc"), &dir.path().join("sys")).unwrap();
        (dir, topo)
    }

    #[test]
    fn every_profile_discovers_as_its_spec_says() {
        for profile in Profile::ALL {
            let spec = profile.spec();
            let (_dir, topo) = discover_fixture(&spec);
            assert_eq!(topo, spec.topology(), "{profile}");
            assert_eq!(topo.cores.len(), spec.sockets as usize * spec.core_ids.len(), "{profile}");
        }
    }

    #[test]
    fn the_venice_like_tree_has_one_acpi_hsmp_device_per_socket_and_hsmp_acpi() {
        let (dir, topo) = discover_fixture(&Profile::Venice2p.spec());
        for socket in ["00", "01"] {
            let hid = dir.path().join(format!("sys/bus/acpi/devices/AMDI0097:{socket}/hid"));
            assert_eq!(std::fs::read_to_string(hid).unwrap(), "AMDI0097\n");
        }
        assert!(dir.path().join("sys/module/hsmp_acpi").is_dir());
        assert!(topo.cores.iter().any(|c| c.apic_id > 255));
        let turin = discover_fixture(&Profile::Turin2p.spec()).0;
        assert!(!turin.path().join("sys/bus/acpi").exists());
    }

    #[test]
    fn smt_off_machine() {
        let mut spec = Profile::Milan1p.spec();
        spec.smt = false;
        spec.sockets = 2;
        let (_dir, topo) = discover_fixture(&spec);
        assert_eq!(topo, spec.topology());
        assert_eq!(spec.cpu_count(), 128);
        // Without SMT the APIC id is the core slot.
        assert_eq!(topo.cores[5].apic_id, 5);
        assert_eq!(topo.cores[64].apic_id, 1 << spec.apic_socket_shift());
    }

    #[test]
    fn offline_cpu_is_absent_from_the_fixture_and_its_core_reads_through_the_sibling() {
        let mut spec = Profile::Genoa2p.spec();
        // CPU 1 is thread 0 of socket 0 core 1; CPU 65 is its sibling.
        spec.offline_cpus = vec![1];
        let (dir, topo) = discover_fixture(&spec);
        assert_eq!(topo, spec.topology());
        let core = &topo.cores[1];
        assert_eq!((core.socket, core.core, core.cpu), (0, 1, 65));
        assert_eq!(core.threads, vec![65], "the offline thread is not the core's");
        assert_eq!(topo.cores[0].threads, vec![0, 64]);
        assert_eq!(core.apic_id, spec.apic_id(0, 1, 1));

        let cpu_dir = dir.path().join("sys/devices/system/cpu");
        let online = std::fs::read_to_string(cpu_dir.join("online")).unwrap();
        assert_eq!(online, "0,2-127\n");
        assert!(!cpu_dir.join("cpu1/topology").exists());
        assert_eq!(std::fs::read_to_string(cpu_dir.join("cpu1/online")).unwrap(), "0\n");
        let cpuinfo = std::fs::read_to_string(dir.path().join("proc/cpuinfo")).unwrap();
        assert!(!cpuinfo.contains("processor\t: 1\n"));
        assert!(cpuinfo.contains("processor\t: 2\n"));
        let siblings =
            std::fs::read_to_string(cpu_dir.join("cpu65/topology/thread_siblings_list")).unwrap();
        assert_eq!(siblings, "65\n");
    }

    #[test]
    fn sibling_lists_match_the_numbering() {
        let spec = Profile::Genoa2p.spec();
        let dir = tempfile::tempdir().unwrap();
        spec.write_fixture(dir.path()).unwrap();
        let topo = dir.path().join("sys/devices/system/cpu/cpu33/topology");
        let threads = std::fs::read_to_string(topo.join("thread_siblings_list")).unwrap();
        assert_eq!(threads.trim(), "33,97");
        let package = std::fs::read_to_string(topo.join("core_siblings_list")).unwrap();
        assert_eq!(package.trim(), "32-63,96-127");
    }

    #[test]
    fn every_machine_required_by_the_suite_exists() {
        let names: Vec<&str> = machines().into_keys().collect();
        for name in [
            "milan-1p",
            "genoa-2p",
            "bergamo-1p",
            "siena-1p",
            "turin-2p",
            "rome-1p",
            "genoa-2p-smt-off",
            "genoa-2p-cpu-offline",
        ] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
    }

    #[test]
    fn the_variants_are_what_their_names_say() {
        let smt_off = machine("genoa-2p-smt-off").unwrap().topology();
        assert_eq!(smt_off.cores.len(), 64);
        // CPU 32 is socket 1's first core; its APIC id carries the socket bit instead.
        assert_eq!((smt_off.cores[32].socket, smt_off.cores[32].cpu), (1, 32));
        assert_ne!(smt_off.cores[32].apic_id, 32);

        let offline = machine("genoa-2p-cpu-offline").unwrap().topology();
        assert_eq!((offline.cores[1].core, offline.cores[1].cpu), (1, 65));
        assert_eq!(offline.cores[1].apic_id % 2, 1, "read through thread 1");
    }

    #[test]
    fn in_multi_socket_smt_trees_apic_ids_are_not_cpu_numbers() {
        for name in ["genoa-2p", "turin-2p", "genoa-2p-cpu-offline"] {
            let topo = machine(name).unwrap().topology();
            let socket1 = topo.cores.iter().filter(|c| c.socket == 1);
            assert!(socket1.clone().all(|c| c.apic_id != c.cpu), "{name}");
            // Thread-0 siblings come first: the first core of socket 1 follows the last
            // core of socket 0 in CPU numbers.
            let first = socket1.clone().next().unwrap();
            assert_eq!(first.cpu as usize, topo.cores.iter().filter(|c| c.socket == 0).count());
        }
    }

    #[test]
    fn committed_fixtures_are_what_the_generator_writes() {
        let fresh = tempfile::tempdir().unwrap();
        write_all(fresh.path()).unwrap();
        let diffs = diff_trees(fresh.path(), &fixtures_dir()).unwrap();
        assert!(
            diffs.is_empty(),
            "tests/fixtures is stale; run `cargo run -p amd-hsmp-e2e --bin gen-fixtures` and \
             commit the result:\n{}",
            diffs.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
        );
    }

    #[test]
    fn committed_fixtures_discover_as_their_spec() {
        for (name, spec) in machines() {
            let tree = tree(&fixtures_dir(), name);
            let topo = discover(&tree.join("proc"), &tree.join("sys")).unwrap();
            assert_eq!(topo, spec.topology(), "{name}");
        }
    }
}
