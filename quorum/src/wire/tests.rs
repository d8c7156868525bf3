use super::*;
use proptest::prelude::*;

fn lsn() -> impl Strategy<Value = Lsn> {
    any::<u64>().prop_map(|v| Lsn(v >> 1))
}

fn history() -> impl Strategy<Value = TermHistory> {
    proptest::collection::vec((1u64..1000, 0u64..1 << 20), 0..5).prop_map(|v| {
        let (mut term, mut lsn) = (0, 0);
        TermHistory(
            v.into_iter()
                .map(|(dt, dl)| {
                    term += dt;
                    lsn += dl;
                    TermSwitch { term, lsn: Lsn(lsn) }
                })
                .collect(),
        )
    })
}

fn data() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..300).prop_map(Bytes::from)
}

fn to_acceptor() -> impl Strategy<Value = ToAcceptor> {
    prop_oneof![
        any::<u64>().prop_map(|round| ToAcceptor::Greeting { round }),
        (1u64..u64::MAX, any::<u64>()).prop_map(|(term, proposer)| ToAcceptor::VoteRequest { term, proposer }),
        (history(), 1u64..1000, lsn(), any::<u64>(), any::<u64>()).prop_map(|(mut h, dt, start, b, proposer)| {
            let term = h.last_term() + dt;
            let start = Lsn(start.0.max(h.0.last().map_or(0, |e| e.lsn.0)));
            h.0.push(TermSwitch { term, lsn: start });
            ToAcceptor::Elected { term, history: h, start_lsn: start, log_begin: Lsn(b % (start.0 + 1)), proposer }
        }),
        (any::<u64>(), lsn(), 0u64..1000).prop_map(|(term, from, n)| ToAcceptor::FetchWal { term, from, to: Lsn(from.0 + n) }),
        (any::<u64>(), lsn(), data(), any::<u64>(), lsn(), any::<u64>(), lsn()).prop_map(
            |(term, begin_lsn, data, b, commit_lsn, h, remote_consistent_lsn)| {
                let end = begin_lsn.0 + data.len() as u64;
                ToAcceptor::Append {
                    term,
                    begin_lsn,
                    data,
                    boundary_lsn: Lsn(b % (end + 1)),
                    commit_lsn,
                    peer_horizon_lsn: Lsn(h % (commit_lsn.0 + 1)),
                    remote_consistent_lsn,
                }
            }
        ),
    ]
}

fn to_proposer() -> impl Strategy<Value = ToProposer> {
    prop_oneof![
        (any::<u64>(), any::<u64>(), any::<u64>(), lsn(), any::<bool>()).prop_map(|(round, term, l, boundary_lsn, learner)| {
            ToProposer::GreetingReply { round, term, last_log_term: l % term.saturating_add(1).max(1), boundary_lsn, learner }
        }),
        (any::<u64>(), any::<bool>(), any::<u64>(), history(), lsn(), any::<u64>(), any::<u64>()).prop_map(
            |(term, granted, acceptor_term, history, boundary_lsn, c, h)| {
                let commit_lsn = Lsn(c % (boundary_lsn.0 + 1));
                ToProposer::Vote {
                    term,
                    granted,
                    acceptor_term,
                    history,
                    boundary_lsn,
                    commit_lsn,
                    peer_horizon_lsn: Lsn(h % (commit_lsn.0 + 1)),
                }
            }
        ),
        (any::<u64>(), lsn(), any::<u64>()).prop_map(|(term, flush_lsn, b)| ToProposer::ElectedAck {
            term,
            flush_lsn,
            boundary_lsn: Lsn(b % (flush_lsn.0 + 1))
        }),
        (any::<u64>(), lsn(), data()).prop_map(|(term, from, data)| ToProposer::Wal { term, from, data }),
        (any::<u64>(), lsn(), any::<u64>(), any::<u64>()).prop_map(|(term, flush_lsn, b, c)| {
            let boundary_lsn = Lsn(b % (flush_lsn.0 + 1));
            ToProposer::AppendAck { term, flush_lsn, boundary_lsn, commit_lsn: Lsn(c % (boundary_lsn.0 + 1)) }
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(term, acceptor_term)| ToProposer::Rejected { term, acceptor_term }),
    ]
}

fn hello() -> ProposerMessage {
    ProposerMessage::Hello {
        protocol_version: PROTOCOL_VERSION,
        tenant: TenantId::from_bytes([1; 16]),
        timeline: TimelineId::from_bytes([2; 16]),
        system_id: 7,
        wal_segment_size: 16 << 20,
        name: "walproposer pid 1".into(),
        auth_token: String::new(),
    }
}

/// A `Hello` of this version with any name and token: none, a JWT-shaped one of any length
/// up to the bound, or any Unicode.
fn hello_any() -> impl Strategy<Value = ProposerMessage> {
    let token = prop_oneof![
        Just(String::new()),
        proptest::collection::vec(proptest::sample::select(b"ABCXYZabcxyz0189-_.".to_vec()), 1..=TOKEN_BYTES_MAX)
            .prop_map(|v| String::from_utf8(v).unwrap()),
        ".{0,64}",
    ];
    (any::<[u8; 16]>(), any::<[u8; 16]>(), any::<u64>(), 20u32..=30, ".{0,32}", token).prop_map(
        |(t, tl, system_id, shift, name, auth_token)| ProposerMessage::Hello {
            protocol_version: PROTOCOL_VERSION,
            tenant: TenantId::from_bytes(t),
            timeline: TimelineId::from_bytes(tl),
            system_id,
            wal_segment_size: 1 << shift,
            name,
            auth_token,
        },
    )
}

proptest! {
    #[test]
    fn proposer_messages_round_trip(hello in hello_any(), msgs in proptest::collection::vec(to_acceptor(), 1..5), split in any::<usize>()) {
        let mut msgs: Vec<ProposerMessage> = msgs.into_iter().map(ProposerMessage::Consensus).collect();
        msgs.insert(0, hello);
        let mut all = BytesMut::new();
        for m in &msgs {
            m.encode(&mut all);
        }
        // Arriving in two pieces at any point decodes the same.
        let split = split % (all.len() + 1);
        let mut buf = BytesMut::from(&all[..split]);
        let mut got = Vec::new();
        while let Some(m) = ProposerMessage::decode(&mut buf).unwrap() { got.push(m); }
        buf.extend_from_slice(&all[split..]);
        while let Some(m) = ProposerMessage::decode(&mut buf).unwrap() { got.push(m); }
        prop_assert_eq!(got, msgs);
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn acceptor_messages_round_trip(m in to_proposer(), f in (lsn(), lsn(), lsn(), lsn())) {
        let (write_lsn, flush_lsn, apply_lsn, remote_consistent_lsn) = f;
        let msgs = vec![
            AcceptorMessage::HelloOk { protocol_version: 1, node_id: 3 },
            AcceptorMessage::Consensus(m),
            AcceptorMessage::Feedback(PageserverFeedback { write_lsn, flush_lsn, apply_lsn, remote_consistent_lsn }),
            AcceptorMessage::Error { message: "no".into() },
            AcceptorMessage::Standbys(vec![]),
            AcceptorMessage::Standbys(vec![StandbyReport {
                name: "replica-1".into(),
                flush_lsn: write_lsn,
                apply_lsn: flush_lsn,
                xmin: apply_lsn.0,
                catalog_xmin: remote_consistent_lsn.0,
                age_ms: 17,
            }]),
        ];
        let mut buf = BytesMut::new();
        for m in &msgs { m.encode(&mut buf); }
        let mut got = Vec::new();
        while let Some(m) = AcceptorMessage::decode(&mut buf).unwrap() { got.push(m); }
        prop_assert_eq!(got, msgs);
    }

    /// Arbitrary bytes never panic the decoders.
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(_)) = ProposerMessage::decode(&mut buf) {}
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(_)) = AcceptorMessage::decode(&mut buf) {}
    }
}

fn raw(tag: u8, payload: &[u8]) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_u8(tag);
    b.put_u32(payload.len() as u32);
    b.put_slice(payload);
    b
}

#[test]
fn malformed_messages_are_named_errors() {
    assert_eq!(ProposerMessage::decode(&mut raw(b'Z', &[])), Err(WireError::UnknownTag(b'Z')));
    assert_eq!(ProposerMessage::decode(&mut raw(b'V', &[0, 1])), Err(WireError::Truncated { tag: 'V' }));
    assert_eq!(ProposerMessage::decode(&mut raw(b'G', &[0; 9])), Err(WireError::Trailing { tag: 'G', extra: 1 }));
    let mut too_long = BytesMut::new();
    too_long.put_u8(b'A');
    too_long.put_u32(u32::MAX);
    assert_eq!(ProposerMessage::decode(&mut too_long), Err(WireError::TooLong(u32::MAX as usize)));
    // A fetch range that goes backwards.
    let mut p = Vec::new();
    p.extend_from_slice(&1u64.to_be_bytes());
    p.extend_from_slice(&10u64.to_be_bytes());
    p.extend_from_slice(&5u64.to_be_bytes());
    assert!(matches!(ProposerMessage::decode(&mut raw(b'F', &p)), Err(WireError::Invalid { tag: 'F', .. })));
    // A history whose terms go down.
    let mut p = Vec::new();
    p.extend_from_slice(&5u64.to_be_bytes());
    p.extend_from_slice(&0u64.to_be_bytes());
    p.extend_from_slice(&0u64.to_be_bytes());
    p.extend_from_slice(&0u64.to_be_bytes());
    p.extend_from_slice(&2u32.to_be_bytes());
    for (t, l) in [(5u64, 0u64), (3, 0)] {
        p.extend_from_slice(&t.to_be_bytes());
        p.extend_from_slice(&l.to_be_bytes());
    }
    let e = ProposerMessage::decode(&mut raw(b'E', &p)).unwrap_err();
    assert_eq!(e.to_string(), "message 'E': term history is not increasing");
    // An incomplete frame is not an error.
    let mut partial = BytesMut::from(&[b'G', 0, 0][..]);
    assert_eq!(ProposerMessage::decode(&mut partial), Ok(None));
    assert_eq!(partial.len(), 3);
}

/// Version 3's fields: a greeting's round, its reply's log and learner flag, a vote's peer
/// horizon, an election's log beginning; each checked.
#[test]
fn version_3_fields_are_checked() {
    let be = |v: &[u64]| v.iter().flat_map(|x| x.to_be_bytes()).collect::<Vec<u8>>();
    // Greeting: its round. Reply: round, term, last log term, boundary LSN, learner.
    let m = ProposerMessage::decode(&mut raw(b'G', &be(&[9]))).unwrap().unwrap();
    assert_eq!(m, ProposerMessage::Consensus(ToAcceptor::Greeting { round: 9 }));
    let mut p = be(&[9, 3, 2, 500]);
    p.push(1);
    let m = AcceptorMessage::decode(&mut raw(b'g', &p)).unwrap().unwrap();
    let reply = ToProposer::GreetingReply { round: 9, term: 3, last_log_term: 2, boundary_lsn: Lsn(500), learner: true };
    assert_eq!(m, AcceptorMessage::Consensus(reply));
    let mut p = be(&[9, 3, 4, 500]);
    p.push(0);
    let e = AcceptorMessage::decode(&mut raw(b'g', &p)).unwrap_err();
    assert_eq!(e.to_string(), "message 'g': last log term 4 above the term 3");
    let mut p = be(&[9, 3, 2, 500]);
    p.push(2);
    assert!(matches!(AcceptorMessage::decode(&mut raw(b'g', &p)), Err(WireError::Invalid { tag: 'g', .. })));
    // Elected: term, start, log begin, proposer, history; a log beginning beyond the start
    // is refused.
    let mut p = be(&[5, 100, 200, 9]);
    p.extend_from_slice(&1u32.to_be_bytes());
    p.extend_from_slice(&be(&[5, 100]));
    let e = ProposerMessage::decode(&mut raw(b'E', &p)).unwrap_err();
    assert_eq!(e.to_string(), "message 'E': log begin 0/C8 beyond the start LSN 0/64");
}

/// Version 2's fields: an `Append` and a `Feedback` laid out as version 1 had them are
/// refused (which is why the versions must match at `Hello`), and a peer horizon a proposer
/// cannot have computed is refused with its values named.
#[test]
fn version_2_fields_are_checked() {
    let be = |v: &[u64]| v.iter().flat_map(|x| x.to_be_bytes()).collect::<Vec<u8>>();
    // Version 1's empty Append: term, begin, commit.
    assert_eq!(ProposerMessage::decode(&mut raw(b'A', &be(&[1, 100, 50]))), Err(WireError::Truncated { tag: 'A' }));
    assert_eq!(ProposerMessage::decode(&mut raw(b'A', &be(&[1, 100, 50, 40]))), Err(WireError::Truncated { tag: 'A' }));
    // term, begin, boundary (version 6), commit, peer horizon, remote-consistent LSN, then
    // WAL bytes.
    let mut p = be(&[1, 100, 102, 50, 40, 30]);
    p.extend_from_slice(b"wal");
    let m = ProposerMessage::decode(&mut raw(b'A', &p)).unwrap().unwrap();
    assert_eq!(
        m,
        ProposerMessage::Consensus(ToAcceptor::Append {
            term: 1,
            begin_lsn: Lsn(100),
            data: Bytes::from_static(b"wal"),
            boundary_lsn: Lsn(102),
            commit_lsn: Lsn(50),
            peer_horizon_lsn: Lsn(40),
            remote_consistent_lsn: Lsn(30),
        })
    );
    // A horizon above the commit LSN.
    let e = ProposerMessage::decode(&mut raw(b'A', &be(&[1, 100, 0, 50, 51, 0]))).unwrap_err();
    assert_eq!(e.to_string(), "message 'A': peer horizon 0/33 beyond the commit LSN 0/32");
    // Version 1's Feedback: write, flush, apply.
    assert_eq!(AcceptorMessage::decode(&mut raw(b'f', &be(&[3, 2, 1]))), Err(WireError::Truncated { tag: 'f' }));
    assert_eq!(AcceptorMessage::decode(&mut raw(b'f', &be(&[3, 2, 1, 9, 9]))), Err(WireError::Trailing { tag: 'f', extra: 8 }));
    let f = AcceptorMessage::decode(&mut raw(b'f', &be(&[3, 2, 1, 9]))).unwrap().unwrap();
    let want = PageserverFeedback { write_lsn: Lsn(3), flush_lsn: Lsn(2), apply_lsn: Lsn(1), remote_consistent_lsn: Lsn(9) };
    assert_eq!(f, AcceptorMessage::Feedback(want));
}

#[test]
fn standbys_are_bounded() {
    let report = |name: &str| StandbyReport { name: name.into(), ..StandbyReport::default() };
    // The encoder keeps within the bounds the decoder enforces.
    let long = "é".repeat(STANDBY_NAME_BYTES_MAX);
    let mut buf = BytesMut::new();
    AcceptorMessage::Standbys(vec![report(&long); STANDBYS_MAX + 3]).encode(&mut buf);
    let Some(AcceptorMessage::Standbys(got)) = AcceptorMessage::decode(&mut buf).unwrap() else { panic!("not Standbys") };
    assert_eq!(got.len(), STANDBYS_MAX);
    assert!(got[0].name.len() <= STANDBY_NAME_BYTES_MAX && long.starts_with(got[0].name.as_str()));

    // A hand-made message over the bounds is refused, naming why.
    let mut buf = BytesMut::new();
    buf.put_u8(b's');
    buf.put_u32(4);
    buf.put_u32(STANDBYS_MAX as u32 + 1);
    let err = AcceptorMessage::decode(&mut buf).unwrap_err();
    assert!(err.to_string().contains("standbys (at most"), "{err}");

    let name = "x".repeat(STANDBY_NAME_BYTES_MAX + 1);
    let mut buf = BytesMut::new();
    buf.put_u8(b's');
    buf.put_u32((4 + 4 + name.len() + 36) as u32);
    buf.put_u32(1);
    buf.put_u32(name.len() as u32);
    buf.put_slice(name.as_bytes());
    buf.put_slice(&[0u8; 36]);
    let err = AcceptorMessage::decode(&mut buf).unwrap_err();
    assert!(err.to_string().contains("standby name of"), "{err}");
}

/// The payload of a `Hello` up to and including its name.
fn hello_head(version: u32) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&version.to_be_bytes());
    p.extend_from_slice(&[1; 16]);
    p.extend_from_slice(&[2; 16]);
    p.extend_from_slice(&7u64.to_be_bytes());
    p.extend_from_slice(&(16u32 << 20).to_be_bytes());
    p.extend_from_slice(&1u32.to_be_bytes());
    p.push(b'n');
    p
}

/// Version 5's token: bounded, UTF-8, whole; a `Hello` of version 4 still decodes (without
/// one), so that a safekeeper can name the version it refuses.
#[test]
fn hello_token_is_checked() {
    let with_token = |version: u32, token: &[u8]| {
        let mut p = hello_head(version);
        p.extend_from_slice(&(token.len() as u32).to_be_bytes());
        p.extend_from_slice(token);
        raw(b'H', &p)
    };
    let token_of = |m: ProposerMessage| match m {
        ProposerMessage::Hello { auth_token, .. } => auth_token,
        other => panic!("not a Hello: {other:?}"),
    };
    // The longest token there may be, and none at all.
    let longest = "a".repeat(TOKEN_BYTES_MAX);
    assert_eq!(token_of(ProposerMessage::decode(&mut with_token(5, longest.as_bytes())).unwrap().unwrap()), longest);
    assert_eq!(token_of(ProposerMessage::decode(&mut with_token(5, b"")).unwrap().unwrap()), "");
    // One byte over the bound, refused before it is read.
    let e = ProposerMessage::decode(&mut with_token(5, "a".repeat(TOKEN_BYTES_MAX + 1).as_bytes())).unwrap_err();
    assert_eq!(e.to_string(), format!("message 'H': token of {} bytes (at most {TOKEN_BYTES_MAX})", TOKEN_BYTES_MAX + 1));
    let e = ProposerMessage::decode(&mut with_token(5, b"ab\xffcd")).unwrap_err();
    assert_eq!(e.to_string(), "message 'H': token is not UTF-8");
    // A length beyond the message, or no token field at all.
    let mut p = hello_head(5);
    p.extend_from_slice(&10u32.to_be_bytes());
    p.extend_from_slice(b"short");
    assert_eq!(ProposerMessage::decode(&mut raw(b'H', &p)), Err(WireError::Truncated { tag: 'H' }));
    assert_eq!(ProposerMessage::decode(&mut raw(b'H', &hello_head(5))), Err(WireError::Truncated { tag: 'H' }));
    assert_eq!(ProposerMessage::decode(&mut with_token(5, b"tok")).map(|_| ()), Ok(()));

    // Version 4 had no token: its Hello decodes without one, and re-encodes byte for byte.
    let v4 = raw(b'H', &hello_head(4));
    let m = ProposerMessage::decode(&mut v4.clone()).unwrap().unwrap();
    assert!(matches!(&m, ProposerMessage::Hello { protocol_version: 4, auth_token, .. } if auth_token.is_empty()));
    let mut again = BytesMut::new();
    m.encode(&mut again);
    assert_eq!(again, v4);
    // Bytes after a version 4 Hello's name are trailing bytes, as they were.
    assert_eq!(ProposerMessage::decode(&mut with_token(4, b"tok")), Err(WireError::Trailing { tag: 'H', extra: 7 }));
}

/// A token never shows in a message's `Debug` (messages end up in logs).
#[test]
fn hello_debug_hides_the_token() {
    let ProposerMessage::Hello { protocol_version, tenant, timeline, system_id, wal_segment_size, name, .. } = hello() else {
        unreachable!()
    };
    let m = ProposerMessage::Hello {
        protocol_version,
        tenant,
        timeline,
        system_id,
        wal_segment_size,
        name,
        auth_token: "eyJhbGciOiJFZERTQSJ9.secret.sig".into(),
    };
    let text = format!("{m:?}");
    assert!(!text.contains("secret") && text.contains("<redacted>") && text.contains("walproposer pid 1"), "{text}");
    assert!(format!("{:?}", hello()).contains("auth_token: none"));
}

/// Version 6's record boundaries: an `Append` names a boundary its bytes reach, and an
/// acceptor's acknowledgements carry its boundary LSN between the flush and commit LSNs;
/// version 5's layouts are refused, and so is every order a correct peer cannot send.
#[test]
fn version_6_boundaries_are_checked() {
    let be = |v: &[u64]| v.iter().flat_map(|x| x.to_be_bytes()).collect::<Vec<u8>>();
    // An Append whose boundary lies beyond its bytes: 100 + 3 = 103.
    let mut p = be(&[1, 100, 104, 50, 40, 30]);
    p.extend_from_slice(b"wal");
    let e = ProposerMessage::decode(&mut raw(b'A', &p)).unwrap_err();
    assert_eq!(e.to_string(), "message 'A': record boundary 0/68 beyond the end of the WAL sent 0/67");
    // Version 5's ElectedAck (term, flush) and AppendAck (term, flush, commit).
    assert_eq!(AcceptorMessage::decode(&mut raw(b'k', &be(&[1, 100]))), Err(WireError::Truncated { tag: 'k' }));
    assert_eq!(AcceptorMessage::decode(&mut raw(b'a', &be(&[1, 100, 50]))), Err(WireError::Truncated { tag: 'a' }));
    let m = AcceptorMessage::decode(&mut raw(b'a', &be(&[1, 100, 90, 50]))).unwrap().unwrap();
    let ack = ToProposer::AppendAck { term: 1, flush_lsn: Lsn(100), boundary_lsn: Lsn(90), commit_lsn: Lsn(50) };
    assert_eq!(m, AcceptorMessage::Consensus(ack));
    let e = AcceptorMessage::decode(&mut raw(b'a', &be(&[1, 100, 101, 50]))).unwrap_err();
    assert_eq!(e.to_string(), "message 'a': boundary LSN beyond flush LSN");
    let e = AcceptorMessage::decode(&mut raw(b'a', &be(&[1, 100, 90, 95]))).unwrap_err();
    assert_eq!(e.to_string(), "message 'a': commit LSN beyond the boundary LSN");
    let e = AcceptorMessage::decode(&mut raw(b'k', &be(&[1, 100, 101]))).unwrap_err();
    assert_eq!(e.to_string(), "message 'k': boundary LSN beyond flush LSN");
}
