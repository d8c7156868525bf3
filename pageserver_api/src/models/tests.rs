//! The management API's models: wire names, round trips, and what each refuses.

use super::*;
use proptest::prelude::*;

#[test]
fn absent_options_are_left_out_of_requests() {
    assert_eq!(serde_json::to_string(&TenantCreateRequest::default()).unwrap(), "{}");
    assert_eq!(serde_json::to_string(&TimelineCreateRequest::default()).unwrap(), "{}");
    let branch = TimelineCreateRequest { ancestor_timeline_id: Some(TimelineId([1; 16])), ..Default::default() };
    assert_eq!(serde_json::to_string(&branch).unwrap(), format!(r#"{{"ancestor_timeline_id":"{}"}}"#, "01".repeat(16)));
}

#[test]
fn requests_refuse_unknown_fields_and_bad_values() {
    let err = serde_json::from_str::<TenantCreateRequest>(r#"{"tenant": "x"}"#).unwrap_err().to_string();
    assert!(err.starts_with("unknown field `tenant`, expected `tenant_id`"), "{err}");
    let err = serde_json::from_str::<TimelineCreateRequest>(r#"{"ancestor_lsn": "0/1", "lsn": "0/2"}"#).unwrap_err().to_string();
    assert!(err.starts_with("unknown field `lsn`, expected one of `timeline_id`, `ancestor_timeline_id`, `ancestor_lsn`"), "{err}");
    let err = serde_json::from_str::<TimelineCreateRequest>(r#"{"ancestor_lsn": "0-1"}"#).unwrap_err().to_string();
    assert!(err.starts_with("invalid LSN: \"0-1\""), "{err}");
    let err = serde_json::from_str::<ImportRequest>("{}").unwrap_err().to_string();
    assert!(err.starts_with("missing field `pgdata`"), "{err}");
    let err = serde_json::from_str::<WalSourceList>(r#"{"sources": [], "mode": "x"}"#).unwrap_err().to_string();
    assert!(err.starts_with("unknown field `mode`"), "{err}");
}

#[test]
fn responses_ignore_fields_they_do_not_know() {
    let status: StatusResponse = serde_json::from_str(r#"{"status": "ok", "version": "1", "uptime": 3}"#).unwrap();
    assert_eq!(status.status, "ok");
}

#[test]
fn wal_receiver_requests_have_two_shapes() {
    let one = WalSource { host: "127.0.0.1".into(), port: 5432, user: "fjord".into(), plaintext: false };
    let single = WalReceiverRequest::Single(one.clone());
    assert_eq!(serde_json::to_string(&single).unwrap(), r#"{"host":"127.0.0.1","port":5432,"user":"fjord"}"#);
    let list =
        WalReceiverRequest::Sources(WalSourceList { sources: vec![one.clone(), WalSource { host: "::1".into(), ..one }], token: None });
    let text = serde_json::to_string(&list).unwrap();
    assert_eq!(text, r#"{"sources":[{"host":"127.0.0.1","port":5432,"user":"fjord"},{"host":"::1","port":5432,"user":"fjord"}]}"#);
    assert_eq!(serde_json::from_str::<WalReceiverRequest>(&text).unwrap(), list);
    assert_eq!(serde_json::from_str::<WalReceiverRequest>(r#"{"host":"127.0.0.1","port":5432,"user":"fjord"}"#).unwrap(), single);
    if let WalReceiverRequest::Sources(l) = &list {
        assert_eq!(l.sources[1].to_string(), "[::1]:5432");
    }
}

#[test]
fn basebackup_queries() {
    let at = BasebackupQuery { lsn: Some(Lsn(0x16B3748)), standby: false };
    assert_eq!(at.to_query_string(), "?lsn=0/16B3748");
    assert_eq!(BasebackupQuery::default().to_query_string(), "");
    assert_eq!(BasebackupQuery::parse("lsn=0/16B3748").unwrap(), at);
    assert_eq!(BasebackupQuery::parse("lsn=0%2F16B3748").unwrap(), at);
    assert_eq!(BasebackupQuery::parse("lsn=0%2f1&&lsn=0/16B3748").unwrap(), at);
    assert_eq!(BasebackupQuery::parse("").unwrap(), BasebackupQuery::default());
    assert_eq!(
        BasebackupQuery::parse("lsn=x&at=1").unwrap_err().to_string(),
        "unknown query parameter \"at=1\"; expected lsn=X/X or standby=true|false"
    );
    let standby = BasebackupQuery { lsn: Some(Lsn(0x16B3748)), standby: true };
    assert_eq!(standby.to_query_string(), "?lsn=0/16B3748&standby=true");
    assert_eq!(BasebackupQuery::parse("standby=true&lsn=0/16B3748").unwrap(), standby);
    assert_eq!(BasebackupQuery { lsn: None, standby: true }.to_query_string(), "?standby=true");
    assert_eq!(BasebackupQuery::parse("standby=yes").unwrap_err().to_string(), "invalid standby=\"yes\": expected true or false");
    assert_eq!(
        BasebackupQuery::parse("lsn=x").unwrap_err().to_string(),
        "invalid LSN: invalid LSN: \"x\" (expected two hexadecimal numbers such as 16/B374D848)"
    );
}

#[test]
fn maintenance_bodies() {
    assert_eq!(serde_json::to_string(&CompactRequest::default()).unwrap(), "{}");
    let force = CompactRequest { force_image_layers: true, ..Default::default() };
    assert_eq!(serde_json::to_string(&force).unwrap(), r#"{"force_image_layers":true}"#);
    assert!(serde_json::from_str::<CompactRequest>(r#"{"force_l0": true}"#).unwrap().force_l0);
    let err = serde_json::from_str::<CompactRequest>(r#"{"force": true}"#).unwrap_err().to_string();
    assert!(err.starts_with("unknown field `force`, expected `force_l0` or `force_image_layers`"), "{err}");
    let gc: GcRequest = serde_json::from_str(r#"{"pitr_window": "1s"}"#).unwrap();
    assert_eq!(gc.pitr_window, Some(HumanDuration(std::time::Duration::from_secs(1))));
    let err = serde_json::from_str::<GcRequest>(r#"{"pitr_window": "1 week"}"#).unwrap_err().to_string();
    assert!(err.starts_with("invalid duration \"1 week\""), "{err}");
    let err = serde_json::from_str::<TenantConfig>(r#"{"pitr": "1s"}"#).unwrap_err().to_string();
    assert!(err.starts_with("unknown field `pitr`, expected `pitr_window`"), "{err}");
    assert_eq!(serde_json::to_string(&TenantConfig::default()).unwrap(), "{}");
    let answer = LsnByTimestampResponse { kind: LsnKind::NoData, lsn: Lsn(0x16B3748) };
    assert_eq!(serde_json::to_string(&answer).unwrap(), r#"{"kind":"nodata","lsn":"0/16B3748"}"#);
    for (kind, name) in [(LsnKind::Present, "present"), (LsnKind::Future, "future"), (LsnKind::Past, "past")] {
        assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{name}\""));
    }
}

#[test]
fn lsn_by_timestamp_queries() {
    use std::time::{Duration, UNIX_EPOCH};
    let at = LsnByTimestampQuery { timestamp: UNIX_EPOCH + Duration::from_micros(1_795_478_400_250_000) };
    assert_eq!(at.to_query_string(), "?timestamp=2026-11-24T00%3A00%3A00.250000Z");
    assert_eq!(LsnByTimestampQuery::parse(&at.to_query_string()[1..]).unwrap(), at);
    assert_eq!(LsnByTimestampQuery::parse("timestamp=2026-11-24T01:00:00.25+01:00").unwrap(), at);
    assert_eq!(LsnByTimestampQuery::parse("timestamp=2026-11-24T01%3A00%3A00.25%2B01%3A00").unwrap(), at);
    assert_eq!(LsnByTimestampQuery::parse("").unwrap_err().to_string(), "missing query parameter timestamp=<RFC 3339>");
    assert_eq!(
        LsnByTimestampQuery::parse("lsn=0/1").unwrap_err().to_string(),
        "unknown query parameter \"lsn=0/1\"; the only one is timestamp=<RFC 3339>"
    );
    assert!(LsnByTimestampQuery::parse("timestamp=yesterday%").unwrap_err().to_string().starts_with("invalid timestamp \"yesterday%\""));
}

#[test]
fn changed_blocks_queries() {
    let q = ChangedBlocksQuery { from: Lsn(0x100), to: Lsn(0x16B3748), limit: None };
    assert_eq!(q.to_query_string(), "?from=0/100&to=0/16B3748");
    assert_eq!(ChangedBlocksQuery::parse("from=0/100&to=0%2F16B3748").unwrap(), q);
    let limited = ChangedBlocksQuery { limit: Some(7), ..q };
    assert_eq!(limited.to_query_string(), "?from=0/100&to=0/16B3748&limit=7");
    assert_eq!(ChangedBlocksQuery::parse(&limited.to_query_string()[1..]).unwrap(), limited);
    let err = |query: &str| ChangedBlocksQuery::parse(query).unwrap_err().to_string();
    assert_eq!(err("to=0/1"), "missing query parameter from=X/X");
    assert_eq!(err("from=0/1"), "missing query parameter to=X/X");
    assert_eq!(err("from=0/1&to=0/2&lsn=0/3"), "unknown query parameter \"lsn=0/3\"; the parameters are from=X/X, to=X/X and limit=N");
    assert_eq!(err("from=x&to=0/2"), "query parameter from: invalid LSN: \"x\" (expected two hexadecimal numbers such as 16/B374D848)");
    assert_eq!(err("from=0/1&to=0/2&limit=-1"), "invalid limit \"-1\": expected a number of keys from 0 to 1000000");
    assert_eq!(err("from=0/1&to=0/2&limit=1000001"), "invalid limit \"1000001\": expected a number of keys from 0 to 1000000");
    assert_eq!(ChangedBlocksQuery::parse("from=0/1&to=0/2&limit=1000000").unwrap().limit, Some(CHANGED_BLOCKS_LIMIT_MAX));
}

#[test]
fn changed_blocks_answers_are_arrays() {
    let rel = RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::VisibilityMap };
    let answer = ChangedBlocksResponse {
        from: Lsn(0x100),
        to: Lsn(0x200),
        blocks: vec![ChangedBlock { rel, blkno: BlockNumber(3), lsn: Lsn(0x180) }],
        relations: vec![
            ChangedRelation { rel, nblocks: Some(4), lsn: Lsn(0x190) },
            ChangedRelation { rel: RelTag { relnode: 16390, ..rel }, nblocks: None, lsn: Lsn(0x1A0) },
        ],
        databases: vec![DroppedDatabase { spcnode: 1663, dbnode: 6, lsn: Lsn(0x1B0) }],
    };
    let text = r#"{"from":"0/100","to":"0/200","blocks":[[1663,5,16384,2,3,"0/180"]],"relations":[[1663,5,16384,2,4,"0/190"],[1663,5,16390,2,null,"0/1A0"]],"databases":[[1663,6,"0/1B0"]]}"#;
    assert_eq!(serde_json::to_string(&answer).unwrap(), text);
    assert_eq!(serde_json::from_str::<ChangedBlocksResponse>(text).unwrap(), answer);
    let err = serde_json::from_str::<ChangedBlock>(r#"[1663,5,16384,7,3,"0/180"]"#).unwrap_err().to_string();
    assert!(err.starts_with("unknown fork number 7"), "{err}");
    assert!(serde_json::from_str::<ChangedBlock>(r#"[1663,5,16384,0,3]"#).is_err(), "an element short");
    assert!(serde_json::from_str::<DroppedDatabase>(r#"[1663,5,"x"]"#).is_err(), "a bad LSN");
}

#[test]
fn decimal_text_refuses_numbers_and_garbage() {
    assert!(serde_json::from_str::<ImportResponse>(r#"{"checkpoint_lsn":"0/1","databases":1,"import_lsn":"0/2","system_identifier":7}"#)
        .is_err());
    let err =
        serde_json::from_str::<ImportResponse>(r#"{"checkpoint_lsn":"0/1","databases":1,"import_lsn":"0/2","system_identifier":"7x"}"#)
            .unwrap_err()
            .to_string();
    assert!(err.contains("invalid decimal number \"7x\""), "{err}");
}

fn arb_lsn() -> impl Strategy<Value = Lsn> {
    any::<u64>().prop_map(Lsn)
}

fn arb_source_status() -> impl Strategy<Value = WalSourceStatus> {
    ("[a-z0-9.:]{1,12}", any::<u16>(), "[a-z]{1,8}", proptest::option::of(arb_lsn()), proptest::option::of(".{0,20}"))
        .prop_map(|(host, port, user, end_lsn, last_error)| WalSourceStatus { host, port, user, end_lsn, last_error })
}

fn arb_state() -> impl Strategy<Value = WalReceiverState> {
    prop_oneof![
        Just(WalReceiverState::Starting),
        Just(WalReceiverState::Streaming),
        Just(WalReceiverState::Reconnecting),
        Just(WalReceiverState::Waiting),
        Just(WalReceiverState::Switching),
        Just(WalReceiverState::Failed),
        Just(WalReceiverState::Stopped),
    ]
}

#[test]
fn receiver_state_names_are_the_wire_names() {
    let states = [
        WalReceiverState::Starting,
        WalReceiverState::Streaming,
        WalReceiverState::Reconnecting,
        WalReceiverState::Waiting,
        WalReceiverState::Switching,
        WalReceiverState::Failed,
        WalReceiverState::Stopped,
    ];
    for state in states {
        assert_eq!(serde_json::to_string(&state).unwrap(), format!("\"{}\"", state.as_str()));
    }
}

fn arb_receiver() -> impl Strategy<Value = WalReceiverStatus> {
    (
        arb_state(),
        any::<bool>(),
        proptest::option::of(arb_lsn()),
        proptest::option::of(arb_lsn()),
        any::<u64>(),
        proptest::option::of(arb_lsn()),
        proptest::option::of(".{0,20}"),
        proptest::collection::vec(arb_source_status(), 0..4),
        proptest::option::of(0usize..4),
        any::<u64>(),
    )
        .prop_map(
            |(
                state,
                connected,
                last_received_lsn,
                server_wal_end_lsn,
                records_ingested,
                durable_lsn,
                last_error,
                sources,
                current,
                lag,
            )| {
                WalReceiverStatus {
                    state,
                    connected,
                    last_received_lsn,
                    server_wal_end_lsn,
                    records_ingested,
                    durable_lsn,
                    last_error,
                    current_source_address: current.and_then(|i| sources.get(i)).map(|s| format!("{}:{}", s.host, s.port)),
                    sources,
                    current_source: current,
                    lag_switches: lag,
                }
            },
        )
}

fn arb_timeline() -> impl Strategy<Value = TimelineInfo> {
    (
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        proptest::option::of((any::<[u8; 16]>(), arb_lsn())),
        (arb_lsn(), arb_lsn(), arb_lsn()),
        any::<u64>(),
        proptest::option::of(arb_receiver()),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(tenant, timeline, ancestor, (last, disk, gc), layers, wal_receiver, system_id)| TimelineInfo {
            remote_storage: None,
            tenant_id: TenantId(tenant),
            timeline_id: TimelineId(timeline),
            ancestor_timeline_id: ancestor.map(|(id, _)| TimelineId(id)),
            ancestor_lsn: ancestor.map(|(_, lsn)| lsn),
            last_record_lsn: last,
            disk_consistent_lsn: disk,
            gc_cutoff_lsn: gc,
            layers,
            wal_receiver,
            system_id,
        })
}

/// Encoding then decoding gives the value back, and re-encoding the decoded value gives
/// the same bytes (so nothing is lost or reordered on either side).
fn round_trip<T: Serialize + serde::de::DeserializeOwned + PartialEq + fmt::Debug>(value: &T) -> Result<(), TestCaseError> {
    let text = serde_json::to_string(value).unwrap();
    let back: T = serde_json::from_str(&text).unwrap();
    prop_assert_eq!(&back, value);
    prop_assert_eq!(serde_json::to_string(&back).unwrap(), text);
    Ok(())
}

proptest! {
    #[test]
    fn timelines_round_trip(t in arb_timeline()) {
        round_trip(&t)?;
        round_trip(&vec![t])?;
    }

    #[test]
    fn requests_round_trip(
        tenant in proptest::option::of(any::<[u8; 16]>()),
        timeline in proptest::option::of(any::<[u8; 16]>()),
        ancestor in proptest::option::of(any::<[u8; 16]>()),
        lsn in proptest::option::of(arb_lsn()),
        pgdata in "/[a-z/]{0,20}",
        sources in proptest::collection::vec(("[a-z0-9.:]{1,12}", any::<u16>(), "[a-z]{1,8}"), 1..4),
    ) {
        round_trip(&TenantCreateRequest { tenant_id: tenant.map(TenantId) })?;
        round_trip(&TimelineCreateRequest {
            timeline_id: timeline.map(TimelineId),
            ancestor_timeline_id: ancestor.map(TimelineId),
            ancestor_lsn: lsn,
        })?;
        round_trip(&ImportRequest { pgdata: pgdata.into() })?;
        let sources: Vec<WalSource> = sources.into_iter().map(|(host, port, user)| WalSource { host, port, user, plaintext: false }).collect();
        round_trip(&WalReceiverRequest::Single(sources[0].clone()))?;
        round_trip(&WalReceiverRequest::Sources(WalSourceList { sources, token: None }))?;
        let query = BasebackupQuery { lsn, standby: lsn.is_some_and(|l| l.0 % 2 == 1) };
        prop_assert_eq!(BasebackupQuery::parse(query.to_query_string().trim_start_matches('?')).unwrap(), query);
    }

    #[test]
    fn changed_blocks_round_trip(
        lsns in (arb_lsn(), arb_lsn()),
        limit in proptest::option::of(0..=CHANGED_BLOCKS_LIMIT_MAX),
        blocks in proptest::collection::vec((any::<[u32; 4]>(), 0u8..4, arb_lsn()), 0..4),
        nblocks in proptest::collection::vec(proptest::option::of(any::<u32>()), 0..4),
    ) {
        let query = ChangedBlocksQuery { from: lsns.0, to: lsns.1, limit };
        prop_assert_eq!(ChangedBlocksQuery::parse(&query.to_query_string()[1..]).unwrap(), query);
        let rel = |[spcnode, dbnode, relnode, _]: [u32; 4], fork: u8| RelTag {
            spcnode, dbnode, relnode, forknum: ForkNumber::from_u8(fork).unwrap(),
        };
        round_trip(&ChangedBlocksResponse {
            from: lsns.0,
            to: lsns.1,
            blocks: blocks.iter().map(|&(ids, fork, lsn)| ChangedBlock { rel: rel(ids, fork), blkno: BlockNumber(ids[3]), lsn }).collect(),
            relations: blocks.iter().zip(&nblocks).map(|(&(ids, fork, lsn), &n)| ChangedRelation { rel: rel(ids, fork), nblocks: n, lsn }).collect(),
            databases: blocks.iter().map(|&(ids, _, lsn)| DroppedDatabase { spcnode: ids[0], dbnode: ids[1], lsn }).collect(),
        })?;
    }

    #[test]
    fn other_responses_round_trip(
        tenant in any::<[u8; 16]>(),
        lsns in (arb_lsn(), arb_lsn()),
        databases in any::<u64>(),
        system_identifier in any::<u64>(),
        text in ".{0,40}",
    ) {
        round_trip(&TenantCreateResponse { tenant_id: TenantId(tenant) })?;
        round_trip(&vec![TenantId(tenant)])?;
        round_trip(&ImportResponse { checkpoint_lsn: lsns.0, databases, import_lsn: lsns.1, system_identifier })?;
        round_trip(&StatusResponse { status: "ok".into(), version: text.clone(), features: vec![text.clone()] })?;
        round_trip(&ErrorResponse { error: text })?;
    }
}
