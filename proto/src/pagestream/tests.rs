//! Round trips, validation and "never panics" for the page service codec.

use super::*;
use proptest::prelude::*;

fn lsns() -> impl Strategy<Value = ReadLsns> {
    (1u64..u64::MAX, any::<u64>()).prop_map(|(req, nms)| ReadLsns { request_lsn: Lsn(req), not_modified_since: Lsn(nms % (req + 1)) })
}

fn rel() -> impl Strategy<Value = RelTag> {
    (any::<u32>(), any::<u32>(), any::<u32>(), 0u8..4).prop_map(|(spcnode, dbnode, relnode, f)| RelTag {
        spcnode,
        dbnode,
        relnode,
        forknum: ForkNumber::from_u8(f).unwrap(),
    })
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (any::<u16>(), any::<[u8; 16]>(), any::<[u8; 16]>(), ".{0,64}").prop_map(|(v, t, l, auth_token)| Request::Hello {
            protocol_version: v,
            tenant: TenantId(t),
            timeline: TimelineId(l),
            auth_token,
        }),
        (1u64.., lsns(), rel(), any::<u32>()).prop_map(|(id, lsns, rel, b)| Request::GetPage { id, lsns, rel, blkno: BlockNumber(b) }),
        (1u64.., lsns(), rel()).prop_map(|(id, lsns, rel)| Request::Nblocks { id, lsns, rel }),
        (1u64.., lsns(), rel()).prop_map(|(id, lsns, rel)| Request::Exists { id, lsns, rel }),
        (1u64.., lsns(), any::<u32>(), any::<u32>()).prop_map(|(id, lsns, spcnode, dbnode)| Request::DbSize { id, lsns, spcnode, dbnode }),
        (1u64.., lsns(), 0u32..3, any::<u32>()).prop_map(|(id, lsns, k, segno)| Request::GetSlruSegment {
            id,
            lsns,
            kind: SlruKind::from_u32(k).unwrap(),
            segno
        }),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        any::<u16>().prop_map(|v| Response::HelloOk { protocol_version: v }),
        (any::<u64>(), any::<u8>()).prop_map(|(id, fill)| Response::Page { id, page: vec![fill; PAGE_SIZE_BYTES] }),
        (any::<u64>(), any::<u32>()).prop_map(|(id, nblocks)| Response::Nblocks { id, nblocks }),
        (any::<u64>(), any::<bool>()).prop_map(|(id, exists)| Response::Exists { id, exists }),
        (any::<u64>(), any::<u64>()).prop_map(|(id, size_bytes)| Response::DbSize { id, size_bytes }),
        (any::<u64>(), 0usize..=32).prop_map(|(id, n)| Response::SlruSegment { id, data: vec![7; n * PAGE_SIZE_BYTES] }),
        (any::<u64>(), 1u16..=6, ".{0,64}").prop_map(|(id, c, message)| Response::Error {
            id,
            code: ErrorCode::from_u16(c).unwrap(),
            message
        }),
    ]
}

proptest! {
    #[test]
    fn requests_round_trip(reqs in proptest::collection::vec(request(), 1..6)) {
        let mut buf = Vec::new();
        for r in &reqs {
            r.encode(&mut buf);
        }
        let mut at = 0;
        for r in &reqs {
            prop_assert_eq!(frame_len(&buf[at..]).unwrap(), Request::decode(&buf[at..]).unwrap().1);
            let (got, used) = Request::decode(&buf[at..]).unwrap();
            prop_assert_eq!(&got, r);
            at += used;
        }
        prop_assert_eq!(at, buf.len());
    }

    #[test]
    fn responses_round_trip(resps in proptest::collection::vec(response(), 1..4)) {
        let mut buf = Vec::new();
        for r in &resps {
            r.encode(&mut buf);
        }
        let mut at = 0;
        for r in &resps {
            let (got, used) = Response::decode(&buf[at..]).unwrap();
            prop_assert_eq!(&got, r);
            at += used;
        }
    }

    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = Request::decode(&bytes);
        let _ = Response::decode(&bytes);
    }

    #[test]
    fn truncated_messages_are_incomplete(req in request(), cut in 0usize..40) {
        let mut buf = Vec::new();
        req.encode(&mut buf);
        let cut = cut.min(buf.len() - 1);
        let is_incomplete = matches!(Request::decode(&buf[..cut]), Err(PagestreamError::Incomplete { .. }));
        prop_assert!(is_incomplete);
    }
}

#[test]
fn rejects_bad_requests_with_clear_errors() {
    let l = ReadLsns { request_lsn: Lsn(100), not_modified_since: Lsn(50) };
    let r = RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main };
    let mut buf = Vec::new();
    Request::GetPage { id: 1, lsns: l, rel: r, blkno: BlockNumber(0) }.encode(&mut buf);

    let mut bad = buf.clone();
    bad[0] = b'z';
    assert_eq!(Request::decode(&bad).unwrap_err().to_string(), "unrecognized page service message tag: 122");

    let mut bad = buf.clone();
    bad[5 + 8 + 16 + 12] = 7; // fork
    assert_eq!(Request::decode(&bad).unwrap_err(), PagestreamError::BadFork(7));

    let mut bad = buf.clone();
    bad[5 + 8 + 8..5 + 8 + 16].copy_from_slice(&200u64.to_be_bytes()); // nms > request
    assert_eq!(Request::decode(&bad).unwrap_err().to_string(), "not_modified_since 0/C8 is above request_lsn 0/64");

    let mut bad = buf.clone();
    bad[5 + 8..5 + 16].copy_from_slice(&0u64.to_be_bytes());
    bad[5 + 16..5 + 24].copy_from_slice(&0u64.to_be_bytes());
    assert_eq!(Request::decode(&bad).unwrap_err(), PagestreamError::InvalidLsn);

    let mut bad = buf.clone();
    bad[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(Request::decode(&bad), Err(PagestreamError::TooLong(_))));

    let mut zero = Vec::new();
    Request::Nblocks { id: 0, lsns: l, rel: r }.encode(&mut zero);
    assert_eq!(Request::decode(&zero).unwrap_err().to_string(), "request id 0 is reserved for connection-level errors");

    // A response read as a request fails on its tag.
    let mut resp = Vec::new();
    Response::Nblocks { id: 1, nblocks: 3 }.encode(&mut resp);
    assert_eq!(Request::decode(&resp).unwrap_err(), PagestreamError::UnknownTag(b'N'));
}

#[test]
fn long_error_messages_are_cut_at_a_character_boundary() {
    let message = "é".repeat(ERROR_MESSAGE_BYTES_MAX);
    let mut buf = Vec::new();
    Response::Error { id: 9, code: ErrorCode::Internal, message }.encode(&mut buf);
    let (got, _) = Response::decode(&buf).unwrap();
    match got {
        Response::Error { message, .. } => assert_eq!(message.len(), ERROR_MESSAGE_BYTES_MAX),
        other => panic!("unexpected {other:?}"),
    }
}

/// An answer is checked against its request: kind, id, a whole page.
#[test]
fn answers_are_checked_against_their_request() {
    let lsns = ReadLsns { request_lsn: Lsn(0x100), not_modified_since: Lsn(0x100) };
    let rel = RelTag { spcnode: 1663, dbnode: 5, relnode: 1259, forknum: ForkNumber::Main };
    let get = Request::GetPage { id: 7, lsns, rel, blkno: BlockNumber(3) };
    let page = |id, n| Response::Page { id, page: vec![0u8; n] };
    assert_eq!(get.check_answer(&page(7, PAGE_SIZE_BYTES)), Ok(()));
    let err = Response::Error { id: 7, code: ErrorCode::NotFound, message: "no".into() };
    assert_eq!(get.check_answer(&err), Ok(()));
    assert_eq!(get.check_answer(&page(6, PAGE_SIZE_BYTES)).unwrap_err(), "the answer to request 7 carries request id 6");
    assert_eq!(get.check_answer(&page(7, 100)).unwrap_err(), "the page for request 7 is 100 bytes, not 8192");
    assert_eq!(
        get.check_answer(&Response::Nblocks { id: 7, nblocks: 1 }).unwrap_err(),
        "the answer to request 7 is of the wrong kind: Nblocks"
    );
    let nblocks = Request::Nblocks { id: 8, lsns, rel };
    assert_eq!(nblocks.check_answer(&Response::Nblocks { id: 8, nblocks: 4 }), Ok(()));
    assert!(nblocks.check_answer(&page(8, PAGE_SIZE_BYTES)).is_err());
    let hello = Request::Hello {
        protocol_version: PROTOCOL_VERSION,
        tenant: TenantId([1; 16]),
        timeline: TimelineId([2; 16]),
        auth_token: String::new(),
    };
    assert_eq!(hello.check_answer(&Response::HelloOk { protocol_version: PROTOCOL_VERSION }), Ok(()));
}

#[test]
fn a_hello_token_is_bounded_and_utf8() {
    let hello = |auth_token: String| Request::Hello {
        protocol_version: PROTOCOL_VERSION,
        tenant: TenantId([1; 16]),
        timeline: TimelineId([2; 16]),
        auth_token,
    };
    let mut buf = Vec::new();
    let longest = hello("t".repeat(TOKEN_BYTES_MAX));
    longest.encode(&mut buf);
    assert_eq!(Request::decode(&buf), Ok((longest, buf.len())));

    buf.clear();
    hello("t".repeat(TOKEN_BYTES_MAX + 1)).encode(&mut buf);
    assert!(matches!(Request::decode(&buf), Err(PagestreamError::BadLength { tag: 'h', .. })), "{:?}", Request::decode(&buf));

    buf.clear();
    hello("ab".into()).encode(&mut buf);
    let last = buf.len() - 1;
    buf[last] = 0xff;
    assert_eq!(Request::decode(&buf), Err(PagestreamError::BadUtf8("token")));
}
