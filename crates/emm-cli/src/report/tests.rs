//! The table's cells and the sentences under it.

use super::*;

fn manager(stopped_by: &'static str, passes: u64) -> ManagerReport {
    ManagerReport {
        manager: "pool".into(),
        requests: 10 * passes,
        peak_live_bytes: 1000,
        peak_reserved_bytes: 1200,
        reserved_over_live: Some(1.2),
        upstream_allocs: 3,
        driver: DriverReport::priced(
            emm::trace::DriverCalls::default(),
            &emm::trace::DriverCosts::IDLE_H100,
        ),
        seconds: 1.0,
        failed: false,
        failures: 0,
        first_failure: None,
        curve: Vec::new(),
        at_peak: None,
        peak_slack: None,
        map: None,
        passes: Vec::new(),
        first_pass_peak_live_bytes: 1000,
        first_pass_peak_reserved_bytes: 1050,
        first_pass_reserved_over_live: Some(1.05),
        steady_passes: passes,
        steady_reached: stopped_by == "steady",
        stopped_by,
        steady_from_pass: passes,
        abandoned_events: 0,
    }
}

fn report(m: ManagerReport, steady: bool) -> Report {
    Report {
        schema_version: 1,
        emm_version: String::new(),
        command: String::new(),
        backend: "host",
        backend_detail: String::new(),
        steady_rule: steady.then_some(SteadyRuleReport {
            quiet_passes: 10,
            max_passes: 100,
            max_seconds: 60.0,
        }),
        device_memory_bytes: None,
        pytorch_cap: "device",
        overhead_bytes: 0,
        device_lag_requests: 0,
        ranks: 1,
        failed: false,
        errors: Vec::new(),
        traces: vec![TraceReport {
            trace: "t.csv".into(),
            format: "emm-csv",
            events: 20,
            requests: 10,
            streams: 1,
            peak_live_bytes: 1000,
            malformed_lines: 0,
            reused_live_ids: 0,
            pytorch: None,
            managers: vec![m],
            skipped: Vec::new(),
            left_out: Vec::new(),
            fit: Vec::new(),
            initial_size: None,
            source: None,
        }],
        pool_without_home: false,
    }
}

/// A replay stopped by a bound of the steady rule is marked in the passes
/// column and explained; one that settled, or ran a fixed number of passes,
/// is not.
#[test]
fn a_replay_stopped_by_a_bound_is_marked_and_explained() {
    let rule = SteadyRuleReport {
        quiet_passes: 10,
        max_passes: 100,
        max_seconds: 60.0,
    };
    for (stopped_by, passes, cell, why) in [
        ("steady", 13, "13", None),
        (
            "max_passes",
            100,
            "100 (cap)",
            Some("at the cap of 100 passes"),
        ),
        (
            "max_time",
            37,
            "37 (time)",
            Some("by the time bound (60 s)"),
        ),
        ("passes", 3, "3", None),
    ] {
        let r = report(manager(stopped_by, passes), stopped_by != "passes");
        let row = &rows(&r)[0];
        assert_eq!(row[4], "1.050x");
        assert_eq!(row[5], "1.200x");
        assert_eq!(row[6], cell);
        let said = unsettled(&r.traces[0].managers[0], &rule);
        match why {
            Some(w) => assert!(said.is_some_and(|s| s.contains(w)), "{stopped_by}"),
            None => assert_eq!(said, None),
        }
    }
    assert_eq!(last_label(&report(manager("steady", 13), true)), "steady");
    assert_eq!(last_label(&report(manager("passes", 3), false)), "pass 3");
    // A pass the time bound stopped part way is named with its events.
    let mut m = manager("max_time", 37);
    m.abandoned_events = 4096;
    let said = unsettled(&m, &rule).unwrap();
    assert!(
        said.contains("after 37 passes and 4096 events of pass 38"),
        "{said}"
    );
}

/// The pool without virtual memory and without a home, looser than the
/// smallest homes were, names `--initial-size`; not with a home or the
/// expandable segment, not once `--initial-size` answered, not for a tight
/// footprint or another manager.
#[test]
fn a_loose_pool_without_virtual_memory_names_the_initial_size() {
    let mut r = report(manager("passes", 3), false);
    assert_eq!(home_hint_line(&r, &r.traces[0]), None);
    r.pool_without_home = true;
    let line = home_hint_line(&r, &r.traces[0]).expect("1.2x is loose");
    assert!(
        line.starts_with("t.csv: ") && line.contains("1.200x") && line.contains("--initial-size"),
        "{line}"
    );
    r.traces[0].managers[0].reserved_over_live = Some(1.08);
    assert_eq!(home_hint_line(&r, &r.traces[0]), None);
    r.traces[0].managers[0].reserved_over_live = Some(1.2);
    r.traces[0].managers[0].manager = "default".into();
    assert_eq!(home_hint_line(&r, &r.traces[0]), None);
    r.traces[0].managers[0].manager = "pool".into();
    r.traces[0].initial_size = Some(HomeReport {
        bytes: Some(1100),
        over_live: Some(1.1),
        larger_failed_bytes: None,
        passes: 3,
        runs: 9,
        within_bytes: 0,
        stopped_for_time: false,
    });
    assert_eq!(home_hint_line(&r, &r.traces[0]), None);
}

/// Where no home held the trace, the line says how far the search looked.
#[test]
fn the_home_line_says_how_far_the_search_looked_when_nothing_held() {
    let mut r = report(manager("passes", 3), false);
    r.traces[0].initial_size = Some(HomeReport {
        bytes: None,
        over_live: None,
        larger_failed_bytes: None,
        passes: 3,
        runs: 4,
        within_bytes: 0,
        stopped_for_time: false,
    });
    let line = home_line(&r.traces[0]).expect("a line");
    assert!(
        line.contains("no home segment up to 16 times the peak"),
        "{line}"
    );
}

/// A search stopped for time says so, how many replays it made and how close
/// its answer is; one that ran nothing says it did not answer, not that the
/// trace does not fit.
#[test]
fn a_search_stopped_for_time_says_how_close_it_got() {
    let mut r = report(manager("passes", 3), false);
    r.traces[0].initial_size = Some(HomeReport {
        bytes: Some(1 << 30),
        over_live: Some(1.2),
        larger_failed_bytes: None,
        passes: 3,
        runs: 5,
        within_bytes: 64 << 20,
        stopped_for_time: true,
    });
    let line = home_line(&r.traces[0]).expect("a line");
    assert!(
        line.contains(
            "stopped at its 120 s bound after 5 replays: at most 64.0 MiB above the smallest"
        ),
        "{line}"
    );
    r.traces[0].initial_size = Some(HomeReport {
        bytes: None,
        over_live: None,
        larger_failed_bytes: None,
        passes: 3,
        runs: 1,
        within_bytes: 0,
        stopped_for_time: true,
    });
    let line = home_line(&r.traces[0]).expect("a line");
    assert!(
        line.contains("no home segment tried held it") && !line.contains("16 times"),
        "{line}"
    );
}
