//! Round-trip, strictness and robustness tests of the wire format.

use super::*;
use frame::encode_frame;
use proptest::prelude::*;
use std::io::Cursor;
use std::time::Duration;

fn item_error() -> impl Strategy<Value = ItemError> {
    prop_oneof![
        Just(ItemError::Unsupported),
        Just(ItemError::Rejected),
        Just(ItemError::TimedOut),
        Just(ItemError::Busy),
        Just(ItemError::NoSuchSocket),
        any::<i32>().prop_map(|errno| ItemError::Io { errno }),
        Just(ItemError::DeadlineExceeded),
    ]
}

fn readings<T: std::fmt::Debug + Clone>(
    value: impl Strategy<Value = T> + Clone,
) -> impl Strategy<Value = Readings<T>> {
    prop_oneof![
        Just(Readings::NotRequested),
        Just(Readings::Unavailable(Unavailable::NoDevice)),
        Just(Readings::Unavailable(Unavailable::Unsupported)),
        prop::collection::vec(prop::result::maybe_ok(value, item_error()), 0..40)
            .prop_map(Readings::Values),
    ]
}

fn energy_source() -> impl Strategy<Value = Option<EnergySource>> {
    prop_oneof![
        Just(None),
        Just(Some(EnergySource::Hsmp)),
        Just(Some(EnergySource::Msr)),
        Just(Some(EnergySource::Perf))
    ]
}

fn device_status() -> impl Strategy<Value = DeviceStatus> {
    prop_oneof![
        any::<u32>().prop_map(|protocol_version| DeviceStatus::Ready { protocol_version }),
        Just(DeviceStatus::Absent),
        Just(DeviceStatus::PermissionDenied),
        item_error().prop_map(DeviceStatus::Failed),
    ]
}

fn families() -> impl Strategy<Value = Families> {
    prop::collection::vec(any::<bool>(), Family::COUNT).prop_map(|on| {
        let mut families = Families::default();
        for (family, on) in Family::ALL.into_iter().zip(on) {
            families.set(family, on);
        }
        families
    })
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        any::<u32>().prop_map(|protocol_version| Request::Hello { protocol_version }),
        Just(Request::Topology),
        (families(), any::<u32>())
            .prop_map(|(what, deadline_ms)| Request::Sample { what, deadline_ms }),
    ]
}

fn core() -> impl Strategy<Value = Core> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        prop::collection::vec(any::<u32>(), 0..4),
    )
        .prop_map(|(socket, core, cpu, apic_id, threads)| Core {
            socket,
            core,
            cpu,
            apic_id,
            threads,
        })
}

/// A value of any kind: a sample's values need not be of their family's kind on the wire.
fn value() -> impl Strategy<Value = Value> + Clone {
    prop_oneof![
        (any::<u64>(), 0u8..64).prop_map(|(counter, esu)| Value::Energy(Energy { counter, esu })),
        any::<u32>().prop_map(Value::Mhz),
        any::<bool>().prop_map(Value::Asserted),
        (any::<u16>(), any::<u16>())
            .prop_map(|(mhz, reasons)| Value::FrequencyLimit(FrequencyLimit { mhz, reasons })),
    ]
}

fn reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        (any::<u32>(), "[0-9a-z.+-]{0,20}", any::<u64>(), prop::option::of("[a-z0-9-]{1,12}"))
            .prop_map(|(protocol_version, broker_version, instance, simulated)| Reply::Hello {
                protocol_version,
                broker_version,
                instance,
                simulated,
            }),
        (
            any::<u32>(),
            any::<u32>(),
            prop::collection::vec(any::<u32>(), 0..4),
            prop::collection::vec(core(), 0..50)
        )
            .prop_map(|(cpu_family, cpu_model, sockets, cores)| Reply::Topology(
                Topology { cpu_family, cpu_model, sockets, cores }
            )),
        (
            device_status(),
            energy_source(),
            prop::collection::vec(readings(value()), Family::COUNT),
            (any::<u64>(), any::<u32>(), any::<u32>()),
            prop::collection::vec(prop::collection::vec(any::<Option<u64>>(), 0..8), Family::COUNT),
        )
            .prop_map(|(hsmp, energy_source, readings, freshness, read_at)| {
                let (energy_resets, max_age_ms, oldest_read_us) = freshness;
                let mut readings = readings.into_iter();
                let mut read_at = read_at.into_iter();
                Reply::Sample(Sample {
                    hsmp,
                    energy_source,
                    readings: PerFamily::from_fn(|_| readings.next().unwrap()),
                    energy_resets,
                    max_age_ms,
                    oldest_read_us,
                    read_at_us: PerFamily::from_fn(|_| read_at.next().unwrap()),
                })
            }),
        (any::<u32>(), any::<u32>()).prop_map(|(broker, peer)| Reply::Error(
            RequestError::VersionMismatch { broker, peer }
        )),
        Just(Reply::Error(RequestError::HelloRequired)),
        any::<u32>().prop_map(|limit| Reply::Refused { reason: Refusal::PerUidLimit { limit } }),
        Just(Reply::Refused { reason: Refusal::NoSlot }),
    ]
}

proptest! {
    #[test]
    fn every_request_round_trips(req in request()) {
        let frame = req.to_frame().unwrap();
        prop_assert_eq!(Request::read(&mut Cursor::new(&frame)).unwrap(), req);
    }

    #[test]
    fn every_reply_round_trips(rep in reply()) {
        let mut frame = Vec::new();
        rep.write(&mut frame).unwrap();
        prop_assert_eq!(Reply::read(&mut Cursor::new(&frame)).unwrap(), rep);
    }

    #[test]
    fn every_truncation_is_an_error(rep in reply(), cut in any::<prop::sample::Index>()) {
        let frame = rep.to_frame().unwrap();
        let cut = cut.index(frame.len());
        let truncated = &frame[..cut];
        match Reply::read(&mut Cursor::new(truncated)) {
            Err(FrameError::Closed) => prop_assert_eq!(cut, 0),
            Err(FrameError::Truncated) => prop_assert!(cut > 0),
            other => prop_assert!(false, "expected an error, got {:?}", other),
        }
        // Decoding a shortened payload (with a correct prefix) must fail, not panic.
        let payload = &frame[4..];
        if cut >= 4 && cut < frame.len() {
            prop_assert!(Reply::decode(&payload[..cut - 4]).is_err());
        }
    }

    #[test]
    fn trailing_bytes_are_rejected(req in request(), extra in prop::collection::vec(any::<u8>(), 1..8)) {
        let frame = req.to_frame().unwrap();
        let mut payload = frame[4..].to_vec();
        payload.extend_from_slice(&extra);
        prop_assert!(matches!(Request::decode(&payload), Err(FrameError::TrailingBytes(n)) if n == extra.len()));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = Request::decode(&bytes);
        let _ = Reply::decode(&bytes);
        let _ = Request::read(&mut Cursor::new(&bytes));
        let _ = Reply::read(&mut Cursor::new(&bytes));
    }

    #[test]
    fn corrupted_frames_never_panic(rep in reply(), pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut frame = rep.to_frame().unwrap();
        let i = pos.index(frame.len());
        frame[i] = byte;
        let _ = Reply::read(&mut Cursor::new(&frame));
    }
}

#[test]
fn oversized_length_is_refused_before_allocation() {
    // 0xFFFF_FFFF announced; if the reader allocated first this would abort the test process.
    let frame = [0xFF, 0xFF, 0xFF, 0xFF, 1, 2, 3];
    match Request::read(&mut Cursor::new(&frame[..])) {
        Err(FrameError::TooLarge { len, max }) => {
            assert_eq!(len, u32::MAX);
            assert_eq!(max, Request::MAX_FRAME);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

#[test]
fn overlong_varint_is_refused_so_each_value_has_one_encoding() {
    // Found by the frame_request fuzz target: [0x96, 0x00] is an overlong varint for 22, which
    // postcard accepts; a Sample's deadline_ms decoded from it re-encoded as [22].
    // The variant's index, then one flag a family (every family asked for), then the deadline.
    let request = |deadline: &[u8]| {
        let mut bytes = vec![2];
        bytes.extend([1; Family::COUNT]);
        bytes.extend(deadline);
        bytes
    };
    assert!(Request::decode(&request(&[22])).is_ok());
    let overlong = request(&[0x96, 0x00]);
    assert!(matches!(Request::decode(&overlong), Err(FrameError::NotCanonical)));
    let mut frame = u32::try_from(overlong.len()).unwrap().to_le_bytes().to_vec();
    frame.extend(&overlong);
    assert!(matches!(Request::read(&mut Cursor::new(&frame[..])), Err(FrameError::NotCanonical)));
}

#[test]
fn encoding_refuses_payloads_above_the_maximum() {
    let big = Reply::Topology(Topology {
        cpu_family: 0x1A,
        cpu_model: 0x11,
        sockets: vec![0],
        cores: vec![Core { socket: 0, core: 0, cpu: 0, apic_id: 0, threads: vec![0, 1] }; 100],
    });
    assert!(matches!(encode_frame(&big, 16), Err(FrameError::TooLarge { max: 16, .. })));
}

/// The handshake's encoding is frozen: a peer of any version must be able to read it.
#[test]
fn hello_wire_format_is_stable() {
    let frame = Request::Hello { protocol_version: 1 }.to_frame().unwrap();
    assert_eq!(frame, [2, 0, 0, 0, 0, 1]);
    let reply = Reply::Hello {
        protocol_version: 1,
        broker_version: "0.1".into(),
        instance: 5,
        simulated: None,
    };
    let frame = reply.to_frame().unwrap();
    assert_eq!(&frame[4..], [0, 1, 3, b'0', b'.', b'1', 5, 0]);
}

/// `Refused` was appended: the older replies keep their discriminants (0 to 3) and it takes the
/// next one.
#[test]
fn refused_is_appended_after_every_older_reply() {
    let frame = Reply::Refused { reason: Refusal::PerUidLimit { limit: 2 } }.to_frame().unwrap();
    assert_eq!(&frame[4..], [4, 0, 2]);
    let frame = Reply::Refused { reason: Refusal::NoSlot }.to_frame().unwrap();
    assert_eq!(&frame[4..], [4, 1]);
    let frame = Reply::Error(RequestError::HelloRequired).to_frame().unwrap();
    assert_eq!(&frame[4..], [3, 1]);
}

#[test]
fn energy_converts_with_its_unit() {
    assert_eq!(Energy { counter: 65536, esu: 16 }.joules(), 1.0);
    assert_eq!(Energy { counter: 3 << 14, esu: 14 }.joules(), 3.0);
    assert_eq!(Energy { counter: 0, esu: 16 }.joules(), 0.0);
}

#[test]
fn a_perf_count_of_two_to_the_minus_32_joules_converts_exactly() {
    // The kernel's power_core counts in 2^-32 J: an ESU the 32-bit shift of V3 clamped to 31,
    // doubling every joule.
    assert_eq!(Energy { counter: 5 << 32, esu: 32 }.joules(), 5.0);
    assert_eq!(Energy { counter: 3 << 31, esu: 32 }.joules(), 1.5);
    assert_eq!(Energy { counter: 1 << 63, esu: 63 }.joules(), 1.0);
}

#[test]
fn a_frequency_limit_is_in_hertz_and_each_bit_is_one_reason() {
    assert_eq!(FrequencyLimit { mhz: 3700, reasons: 0 }.hertz(), 3.7e9);
    for (bit, reason) in LimitReason::ALL.into_iter().take(8).enumerate() {
        let limit = FrequencyLimit { mhz: 1, reasons: 1 << bit };
        assert_eq!(limit.limiters().collect::<Vec<_>>(), [reason], "bit {bit}");
    }
    for bit in 8..16 {
        let limit = FrequencyLimit { mhz: 1, reasons: 1 << bit };
        assert_eq!(limit.limiters().collect::<Vec<_>>(), [LimitReason::Other], "bit {bit}");
    }
    let both = FrequencyLimit { mhz: 1, reasons: 0x0A };
    assert_eq!(both.limiters().collect::<Vec<_>>(), [LimitReason::Prochot, LimitReason::Ppt]);
}

#[test]
fn each_direction_has_its_own_bound() {
    // A reply-sized frame announced where a request is expected is refused before allocation.
    let prefix = (Request::MAX_FRAME + 1).to_le_bytes();
    assert!(matches!(Request::parse_len(prefix), Err(FrameError::TooLarge { .. })));
    assert_eq!(Reply::parse_len(prefix).unwrap(), Request::MAX_FRAME as usize + 1);
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn async_helpers_match_the_blocking_ones() {
    let req = Request::Sample { what: Families::ALL, deadline_ms: 1500 };
    let mut buf = Vec::new();
    req.write_async(&mut buf).await.unwrap();
    assert_eq!(buf, req.to_frame().unwrap());
    assert_eq!(Request::read_async(&mut &buf[..]).await.unwrap(), req);
    let short = &buf[..buf.len() - 1];
    assert!(matches!(Request::read_async(&mut &short[..]).await, Err(FrameError::Truncated)));
    assert!(matches!(Request::read_async(&mut &[][..]).await, Err(FrameError::Closed)));
}

#[test]
fn every_family_is_listed_once_in_all_in_variant_order() {
    // The match is exhaustive: a new variant does not compile until it has a position here,
    // and then this test fails until `Family::ALL` lists it at that position.
    let position = |family: Family| match family {
        Family::CoreEnergy => 0,
        Family::BoostLimit => 1,
        Family::Prochot => 2,
        Family::FrequencyLimit => 3,
        Family::CoreFrequencyLimit => 4,
        Family::PackageEnergy => 5,
    };
    let positions: Vec<usize> = Family::ALL.iter().map(|&family| position(family)).collect();
    assert_eq!(positions, (0..Family::COUNT).collect::<Vec<_>>());
    for family in Family::ALL {
        assert_eq!(family as usize, position(family), "{family}: ALL is not in variant order");
    }
}

#[test]
fn a_family_is_found_by_its_collector_name_and_names_are_unique() {
    for family in Family::ALL {
        assert_eq!(Family::from_name(family.name()), Some(family));
    }
    assert_eq!(Family::from_name("core_energy"), None);
    let mut names: Vec<&str> = Family::ALL.iter().map(|family| family.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), Family::COUNT);
}

#[test]
fn families_ask_for_exactly_the_families_set_in_them() {
    assert_eq!(Families::of(&Family::ALL), Families::ALL);
    assert_eq!(Families::of(&[]), Families::default());
    for family in Family::ALL {
        let one = Families::of(&[family]);
        assert_eq!(one.iter().collect::<Vec<_>>(), vec![family]);
        let mut all_but = Families::ALL;
        all_but.set(family, false);
        assert!(!all_but.contains(family));
        assert_eq!(all_but.iter().count(), Family::COUNT - 1);
    }
}

#[test]
fn a_sample_costs_one_message_per_core_of_a_core_family_and_per_socket_of_a_socket_family() {
    // Distinct counts, so that a core taken for a socket shows.
    let (cores, sockets) = (7, 2);
    for family in Family::ALL {
        let want = match family.scope() {
            Scope::Core => cores,
            Scope::Socket => sockets,
        };
        assert_eq!(Families::of(&[family]).messages(cores, sockets), want, "{family}");
    }
    assert_eq!(Families::default().messages(cores, sockets), 0);
    let per_core = Family::ALL.iter().filter(|f| f.scope() == Scope::Core).count();
    let per_socket = Family::COUNT - per_core;
    assert_eq!(Families::ALL.messages(cores, sockets), per_core * cores + per_socket * sockets);
}

#[test]
fn the_intersection_of_families_asks_for_those_in_both() {
    let a = Families::of(&[Family::CoreEnergy, Family::Prochot, Family::PackageEnergy]);
    let b = Families::of(&[Family::Prochot, Family::PackageEnergy, Family::BoostLimit]);
    assert_eq!(a.intersection(&b), Families::of(&[Family::Prochot, Family::PackageEnergy]));
    assert_eq!(a.intersection(&Families::default()), Families::default());
    assert_eq!(a.intersection(&Families::ALL), a);
}

#[test]
fn a_per_family_table_is_indexed_by_family() {
    let mut table = PerFamily::from_fn(Family::name);
    assert_eq!(table[Family::BoostLimit], "boost-limit");
    table[Family::Prochot] = "changed";
    let entries: Vec<(Family, &str)> = table.iter().map(|(family, &name)| (family, name)).collect();
    let want: Vec<(Family, &str)> = Family::ALL
        .into_iter()
        .map(|family| (family, if family == Family::Prochot { "changed" } else { family.name() }))
        .collect();
    assert_eq!(entries, want, "every family once, in Family::ALL order");
}

#[test]
fn wire_units_convert_to_durations_and_back() {
    let request = Request::sample(Families::ALL, Duration::from_micros(2_500_999));
    assert_eq!(request, Request::Sample { what: Families::ALL, deadline_ms: 2500 });
    assert_eq!(request.deadline(), Some(Duration::from_millis(2500)));
    let zero = Request::sample(Families::ALL, Duration::ZERO);
    assert_eq!(zero.deadline(), Some(Duration::from_millis(1)), "a deadline of 0 reads nothing");
    let most = Request::Sample { what: Families::ALL, deadline_ms: u32::MAX };
    assert_eq!(Request::sample(Families::ALL, Duration::MAX), most, "saturating");
    assert_eq!(Request::Topology.deadline(), None);

    let mut sample = Sample::healthy(&testing::topology(1, 1), Families::ALL);
    sample.set_freshness(Duration::from_micros(500_900), Duration::from_nanos(1_001));
    assert_eq!((sample.max_age_ms, sample.oldest_read_us), (500, 2), "the age rounds up");
    assert_eq!(sample.max_age(), Duration::from_millis(500));
    assert_eq!(sample.oldest_read(), Duration::from_micros(2));
    sample.set_freshness(Duration::MAX, Duration::MAX);
    assert_eq!((sample.max_age_ms, sample.oldest_read_us), (u32::MAX, u32::MAX));
}

#[test]
fn families_are_one_flag_a_family_in_family_order_on_the_wire() {
    let what = Families::of(&[Family::CoreEnergy, Family::Prochot, Family::PackageEnergy]);
    let bytes = postcard::to_allocvec(&what).unwrap();
    let want: Vec<u8> = Family::ALL.iter().map(|&f| u8::from(what.contains(f))).collect();
    assert_eq!(bytes, want);
    assert_eq!(want, [1, 0, 1, 0, 0, 1]);
    assert_eq!(
        Families::ALL.without(Family::Prochot),
        Families::of(&[
            Family::CoreEnergy,
            Family::BoostLimit,
            Family::FrequencyLimit,
            Family::CoreFrequencyLimit,
            Family::PackageEnergy
        ])
    );
}

#[test]
fn a_value_converts_to_its_kinds_type_only() {
    let energy = Energy { counter: 7, esu: 16 };
    assert_eq!(Energy::try_from(Value::from(energy)), Ok(energy));
    assert_eq!(u32::try_from(Value::Energy(energy)), Err(Value::Energy(energy)));
    assert_eq!(bool::try_from(Value::Asserted(true)), Ok(true));
    assert_eq!(u32::try_from(Value::Mhz(3700)), Ok(3700));
    for value in [Value::Energy(energy), Value::Mhz(1), Value::Asserted(false)] {
        assert_eq!(FrequencyLimit::try_from(value), Err(value), "{value:?}");
    }
}

#[test]
fn a_healthy_sample_holds_values_of_each_familys_kind() {
    let topology = testing::topology(2, 3);
    let sample = Sample::healthy(&topology, Families::ALL);
    for (family, readings) in sample.readings.iter() {
        let Readings::Values(values) = readings else { panic!("{family} not read") };
        assert_eq!(values.len(), family.items(6, 2), "{family}");
        assert!(values.iter().all(|v| v.unwrap().kind() == family.kind()), "{family}");
    }
    let none = Sample::healthy(&topology, Families::default());
    assert!(none.readings.iter().all(|(_, r)| *r == Readings::NotRequested));
    assert!(none.read_at_us.iter().all(|(_, at)| at.is_empty()));
}
