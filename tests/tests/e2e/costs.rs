//! What a scrape costs the HSMP mailbox: the rule (`Families::messages`, one message per item of
//! each family asked for, and `MachineSpec::answers`, which families the firmware answers)
//! counted on every fixture machine, and the figures the documents state, generated from it.
//!
//! `UPDATE_GOLDEN=1 cargo test -p amd-hsmp-e2e costs` rewrites the figures; otherwise the test
//! fails with the stale lines.

use crate::scenarios::{rig, scrape_traffic};
use amd_hsmp_device::Message;
use amd_hsmp_e2e::{fixtures, golden};
use amd_hsmp_exporter::collectors::Collectors;
use amd_hsmp_proto::{Families, Family};
use amd_hsmp_sim::{MachineSpec, Profile};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The command that regenerates the figures this file checks.
const REFRESH: &str = "UPDATE_GOLDEN=1 cargo test -p amd-hsmp-e2e costs";

/// On every fixture machine, a scrape after the first sends one message per item of each
/// default family the firmware answers, the count `MachineSpec::messages_per_sample` gives and
/// the documents state (docs/metrics.md, "Cost per scrape"); the first may also ask a family the
/// firmware refuses, once per socket.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_steady_scrape_costs_one_message_per_item_of_each_default_family_the_firmware_answers() {
    let defaults = Collectors::default().families();
    for (machine, spec) in fixtures::machines() {
        let mut rig = rig(&format!("description = \"\"\nmachine = \"{machine}\"\n[[scrapes]]\n"));
        let (cores, sockets) = {
            let t = rig.machine().topology();
            (t.cores.len(), t.sockets.len())
        };
        let steady = spec.messages_per_sample(defaults);
        let scrapes = scrape_traffic(&mut rig, 3);
        for (i, traffic) in scrapes.iter().enumerate() {
            let by_id: BTreeMap<u32, usize> =
                Message::ALL.iter().map(|m| (m.id(), traffic.count(m.id()))).collect();
            let answered: Vec<_> = traffic.messages.iter().filter(|m| m.result.is_ok()).collect();
            assert_eq!(answered.len(), steady, "{machine} scrape {}: {by_id:?}", i + 1);
            for family in Family::ALL {
                let sent = traffic.count(MachineSpec::message(family).id());
                let what = format!("{machine} scrape {}: {family}: {by_id:?}", i + 1);
                if !defaults.contains(family) {
                    assert_eq!(sent, 0, "{what}");
                } else if spec.answers(family) {
                    assert_eq!(sent, family.items(cores, sockets), "{what}");
                } else {
                    // Refused (ENOMSG), at most once per socket, and then asked no more.
                    let most = if i == 0 { sockets } else { 0 };
                    assert!(sent <= most, "{what}");
                }
            }
            if i > 0 {
                assert_eq!(traffic.messages.len(), steady, "{machine} scrape {}", i + 1);
            }
        }
    }
}

/// The messages `family` costs in a steady sample of `spec`: one per item where the firmware
/// answers it, none otherwise.
fn family_cost(spec: &MachineSpec, family: Family) -> usize {
    spec.messages_per_sample(Families::of(&[family]))
}

/// docs/metrics.md's table of what a steady scrape costs on each simulated machine.
fn render_cost(profiles: &[(String, MachineSpec)]) -> String {
    let defaults = Collectors::default().families();
    let mut out = String::from("| machine | cores | sockets |");
    let mut rule = String::from("|---|---|---|");
    for family in Family::ALL {
        let off = if defaults.contains(family) { "" } else { " (off by default)" };
        let _ = write!(out, " `{family}`{off} |");
        rule.push_str("---|");
    }
    out.push_str(" **a default scrape** |\n");
    rule.push_str("---|\n");
    out.push_str(&rule);
    for (name, spec) in profiles {
        let topology = spec.topology();
        let _ = write!(out, "| {name} | {} | {} |", topology.cores.len(), topology.sockets.len());
        for family in Family::ALL {
            let _ = write!(out, " {} |", golden::thousands(family_cost(spec, family) as u64));
        }
        let total = spec.messages_per_sample(defaults) as u64;
        let _ = writeln!(out, " **{}** |", golden::thousands(total));
    }
    out
}

/// The sentence after the table: the default scrape of the largest machine, by the rule.
fn render_largest(profiles: &[(String, MachineSpec)]) -> String {
    let defaults = Collectors::default().families();
    let (name, spec) =
        profiles.iter().max_by_key(|(_, s)| s.messages_per_sample(defaults)).expect("profiles");
    let mut with_core_limits = defaults;
    with_core_limits.set(Family::CoreFrequencyLimit, true);
    format!(
        "A default scrape of a {name} costs {} messages; with `--collector.core-frequency-limit`, \
         {}.\n",
        golden::thousands(spec.messages_per_sample(defaults) as u64),
        golden::thousands(spec.messages_per_sample(with_core_limits) as u64),
    )
}

/// The begin and end markers of generated block `name`.
fn markers(name: &str) -> (String, String) {
    (
        format!("<!-- {name}:begin: generated from the cost rule; {REFRESH} -->"),
        format!("<!-- {name}:end -->"),
    )
}

/// The simulator's profiles, by the name the documents use, in their order.
fn profiles() -> Vec<(String, MachineSpec)> {
    Profile::ALL.into_iter().map(|p| (golden::machine_name(p.name()), p.spec())).collect()
}

/// The cost figures in docs/metrics.md are those the rule gives.
#[test]
fn the_documents_state_the_messages_a_scrape_costs_as_the_rule_gives_them() {
    let file = "docs/metrics.md";
    let doc = std::fs::read_to_string(golden::workspace_root().join(file)).unwrap();
    let profiles = profiles();
    let (begin, end) = markers("cost");
    let (begin_l, end_l) = markers("cost-largest");
    let want = golden::replace_block(&doc, &begin, &end, &render_cost(&profiles))
        .and_then(|d| golden::replace_block(&d, &begin_l, &end_l, &render_largest(&profiles)));
    let failure = want.and_then(|want| golden::check_document(file, &want, REFRESH));
    assert!(failure.is_ok(), "{}", failure.unwrap_err());
}
