//! Round-trip, strictness and robustness tests of the wire format.

use super::*;
use proptest::prelude::*;
use std::io::Cursor;

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
    let source =
        prop_oneof![Just(None), Just(Some(EnergySource::Hsmp)), Just(Some(EnergySource::Msr))];
    prop_oneof![
        Just(Readings::NotRequested),
        Just(Readings::Unavailable(Unavailable::NoDevice)),
        Just(Readings::Unavailable(Unavailable::Unsupported)),
        (source, prop::collection::vec(prop::result::maybe_ok(value, item_error()), 0..40))
            .prop_map(|(source, values)| Readings::Values { source, values }),
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
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(core_energy, boost_limit, prochot)| {
        Families { core_energy, boost_limit, prochot }
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
    (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>())
        .prop_map(|(socket, core, cpu, apic_id)| Core { socket, core, cpu, apic_id })
}

fn reply() -> impl Strategy<Value = Reply> {
    let energy = (any::<u64>(), 0u8..32).prop_map(|(counter, esu)| Energy { counter, esu });
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
        (device_status(), readings(energy), readings(any::<u32>()), readings(any::<bool>()))
            .prop_map(|(hsmp, energy, boost_limit, prochot)| Reply::Sample(Sample {
                hsmp,
                energy,
                boost_limit,
                prochot
            })),
        (any::<u32>(), any::<u32>()).prop_map(|(broker, peer)| Reply::Error(
            RequestError::VersionMismatch { broker, peer }
        )),
        Just(Reply::Error(RequestError::HelloRequired)),
    ]
}

proptest! {
    #[test]
    fn every_request_round_trips(req in request()) {
        let frame = encode_frame(&req, MAX_REQUEST_FRAME).unwrap();
        let payload = read_frame(&mut Cursor::new(&frame), MAX_REQUEST_FRAME).unwrap();
        prop_assert_eq!(decode::<Request>(&payload).unwrap(), req);
    }

    #[test]
    fn every_reply_round_trips(rep in reply()) {
        let frame = encode_frame(&rep, MAX_REPLY_FRAME).unwrap();
        let payload = read_frame(&mut Cursor::new(&frame), MAX_REPLY_FRAME).unwrap();
        prop_assert_eq!(decode::<Reply>(&payload).unwrap(), rep);
    }

    #[test]
    fn every_truncation_is_an_error(rep in reply(), cut in any::<prop::sample::Index>()) {
        let frame = encode_frame(&rep, MAX_REPLY_FRAME).unwrap();
        let cut = cut.index(frame.len());
        let truncated = &frame[..cut];
        match read_frame(&mut Cursor::new(truncated), MAX_REPLY_FRAME) {
            Err(FrameError::Closed) => prop_assert_eq!(cut, 0),
            Err(FrameError::Truncated) => prop_assert!(cut > 0),
            other => prop_assert!(false, "expected an error, got {:?}", other),
        }
        // Decoding a shortened payload (with a correct prefix) must fail, not panic.
        let payload = &frame[4..];
        if cut >= 4 && cut < frame.len() {
            prop_assert!(decode::<Reply>(&payload[..cut - 4]).is_err());
        }
    }

    #[test]
    fn trailing_bytes_are_rejected(req in request(), extra in prop::collection::vec(any::<u8>(), 1..8)) {
        let frame = encode_frame(&req, MAX_REQUEST_FRAME).unwrap();
        let mut payload = frame[4..].to_vec();
        payload.extend_from_slice(&extra);
        prop_assert!(matches!(decode::<Request>(&payload), Err(FrameError::TrailingBytes(n)) if n == extra.len()));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode::<Request>(&bytes);
        let _ = decode::<Reply>(&bytes);
        let _ = read_frame(&mut Cursor::new(&bytes), MAX_REQUEST_FRAME).map(|p| decode::<Request>(&p));
    }

    #[test]
    fn corrupted_frames_never_panic(rep in reply(), pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut frame = encode_frame(&rep, MAX_REPLY_FRAME).unwrap();
        let i = pos.index(frame.len());
        frame[i] = byte;
        if let Ok(payload) = read_frame(&mut Cursor::new(&frame), MAX_REPLY_FRAME) {
            let _ = decode::<Reply>(&payload);
        }
    }
}

#[test]
fn oversized_length_is_refused_before_allocation() {
    // 0xFFFF_FFFF announced; if the reader allocated first this would abort the test process.
    let frame = [0xFF, 0xFF, 0xFF, 0xFF, 1, 2, 3];
    match read_frame(&mut Cursor::new(&frame[..]), MAX_REQUEST_FRAME) {
        Err(FrameError::TooLarge { len, max }) => {
            assert_eq!(len, u32::MAX);
            assert_eq!(max, MAX_REQUEST_FRAME);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

#[test]
fn encoding_refuses_payloads_above_the_maximum() {
    let big = Reply::Topology(Topology {
        cpu_family: 0x1A,
        cpu_model: 0x11,
        sockets: vec![0],
        cores: vec![Core { socket: 0, core: 0, cpu: 0, apic_id: 0 }; 100],
    });
    assert!(matches!(encode_frame(&big, 16), Err(FrameError::TooLarge { max: 16, .. })));
}

/// The handshake's encoding is frozen: a peer of any version must be able to read it.
#[test]
fn hello_wire_format_is_stable() {
    let frame = encode_frame(&Request::Hello { protocol_version: 1 }, MAX_REQUEST_FRAME).unwrap();
    assert_eq!(frame, [2, 0, 0, 0, 0, 1]);
    let reply = Reply::Hello {
        protocol_version: 1,
        broker_version: "0.1".into(),
        instance: 5,
        simulated: None,
    };
    let frame = encode_frame(&reply, MAX_REPLY_FRAME).unwrap();
    assert_eq!(&frame[4..], [0, 1, 3, b'0', b'.', b'1', 5, 0]);
}

#[test]
fn energy_converts_with_its_unit() {
    assert_eq!(Energy { counter: 65536, esu: 16 }.joules(), 1.0);
    assert_eq!(Energy { counter: 3 << 14, esu: 14 }.joules(), 3.0);
    assert_eq!(Energy { counter: 0, esu: 16 }.joules(), 0.0);
}

#[tokio::test]
async fn async_helpers_match_the_blocking_ones() {
    let req = Request::Sample { what: Families::ALL, deadline_ms: 1500 };
    let mut buf = Vec::new();
    write_frame_async(&mut buf, &req, MAX_REQUEST_FRAME).await.unwrap();
    assert_eq!(buf, encode_frame(&req, MAX_REQUEST_FRAME).unwrap());
    let payload = read_frame_async(&mut &buf[..], MAX_REQUEST_FRAME).await.unwrap();
    assert_eq!(decode::<Request>(&payload).unwrap(), req);
    let short = &buf[..buf.len() - 1];
    assert!(matches!(
        read_frame_async(&mut &short[..], MAX_REQUEST_FRAME).await,
        Err(FrameError::Truncated)
    ));
}
