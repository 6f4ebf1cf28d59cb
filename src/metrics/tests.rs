//! The exposition formats, the negotiation between them, and the counters the request path
//! feeds, read back from the text a scraper gets.

use http::HeaderValue;

use super::*;
use crate::Config;

/// The server's slots, as the metrics read them.
struct Slots {
    connections: crate::server::limits::ConnectionSlots,
    requests: crate::server::limits::ConnectionSlots,
}

fn metrics(vars: &[(&str, &str)]) -> (Metrics, Slots) {
    let mut all = vec![("BACKEND_URL", "http://127.0.0.1:9")];
    all.extend_from_slice(vars);
    let config = Config::from_vars(all).unwrap();
    let limiter = crate::app::limiter(&config).unwrap();
    let slots = Slots {
        connections: crate::server::limits::ConnectionSlots::new(7),
        requests: crate::server::limits::ConnectionSlots::new(7),
    };
    let load = Load {
        connections: Arc::new(slots.connections.clone()),
        requests: Arc::new(slots.requests.clone()),
    };
    let metrics = Metrics::new(limiter, load);
    // As the gate does: the table's series exist (at zero) from the first scrape.
    let _series = metrics.series(&config.gate.rules);
    (metrics, slots)
}

/// The rule table of `vars` (beside a backend).
fn table(vars: &[(&str, &str)]) -> crate::rules::RuleTable {
    let mut all = vec![("BACKEND_URL", "http://127.0.0.1:9")];
    all.extend_from_slice(vars);
    Config::from_vars(all).unwrap().gate.rules
}

#[test]
fn a_reloaded_table_counts_on_into_the_series_of_the_same_rule_names() {
    let (metrics, _) = metrics(&[]);
    let before = metrics.series(&table(&[("ROUTES", "/api/*=token_bucket:5:1,name=api")]));
    let after = metrics.series(&table(&[(
        "ROUTES",
        "/new/*=token_bucket:5:1,name=new;/api/*=token_bucket:9:1,name=api",
    )]));
    let (api_before, api_after) = (before.rule(0).unwrap(), after.rule(1).unwrap());
    api_before.request(Outcome::Allowed);
    api_after.request(Outcome::Allowed);
    metrics.response(Some(api_before), 200);
    metrics.response(Some(api_after), 200);
    after.rule(0).unwrap().request(Outcome::Allowed);
    let text = metrics.encode(Format::Prometheus).unwrap();
    let allowed = |rule: &str| {
        sample(
            &text,
            &format!(r#"tollgate_requests_total{{rule="{rule}",decision="allowed"}}"#),
        )
    };
    assert_eq!(allowed("api"), Some(2.0), "one series per rule name:\n{text}");
    assert_eq!(allowed("new"), Some(1.0));
    assert_eq!(
        sample(&text, r#"tollgate_responses_total{rule="api",code="200"}"#),
        Some(2.0)
    );
}

/// The value of the sample `series` (`name{labels}`) in `text`, if it is there.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `(name, type)` of every `# TYPE` line.
fn families(text: &str) -> Vec<(&str, &str)> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.split_once(' '))
        .collect()
}

#[test]
fn metric_names_are_exactly_what_is_exported() {
    let (metrics, _) = metrics(&[]);
    metrics.response(None, 200);
    // A family with no series is not written: one descriptor counted.
    metrics.descriptors().count("d", "d.k", Outcome::Allowed);
    let text = metrics.encode(Format::Prometheus).unwrap();
    let mut exported: Vec<&str> = families(&text).into_iter().map(|(name, _)| name).collect();
    exported.sort_unstable();
    let mut expected = METRIC_NAMES.to_vec();
    expected.sort_unstable();
    assert_eq!(exported, expected);
    // And every sample belongs to one of them.
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or(line);
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
        assert!(METRIC_NAMES.contains(&family), "{line}");
    }
}

#[test]
fn the_registry_holds_only_what_the_prometheus_format_is_translated_for() {
    let (metrics, _) = metrics(&[]);
    let text = metrics.encode(Format::OpenMetrics).unwrap();
    for (name, kind) in families(&text) {
        assert!(
            ["counter", "gauge", "histogram"].contains(&kind),
            "{name} is a {kind}"
        );
    }
    for line in text.lines().filter(|line| line.starts_with('#')) {
        assert!(
            !line.starts_with("# UNIT") && !line.contains('\\') && !line.contains(" # {"),
            "no units, escapes or exemplars: {line}"
        );
        if line.starts_with("# HELP") {
            assert!(!line.contains('"'), "a help text is written unescaped: {line}");
        }
    }
}

#[test]
fn the_prometheus_format_names_counters_with_their_total_and_has_no_eof() {
    let (metrics, _) = metrics(&[]);
    let text = metrics.encode(Format::Prometheus).unwrap();
    assert!(!text.contains("# EOF"));
    let lines: Vec<&str> = text.lines().collect();
    for (i, (name, kind)) in families(&text).into_iter().enumerate() {
        if kind == "counter" {
            assert!(name.ends_with("_total"), "{name}");
        }
        assert!(
            lines.contains(&&*format!("# HELP {name} {}", help_of(&text, name))),
            "family {i}, {name}, has its help under the same name"
        );
    }
    assert!(text.contains("# HELP tollgate_requests_total Requests by rule and what became of them.\n# TYPE tollgate_requests_total counter\n"));
    assert_eq!(
        sample(
            &text,
            r#"tollgate_requests_total{rule="general",decision="allowed"}"#
        ),
        Some(0.0)
    );

    let open_metrics = metrics.encode(Format::OpenMetrics).unwrap();
    assert!(open_metrics.ends_with("\n# EOF\n"));
    assert!(open_metrics.contains("# TYPE tollgate_requests counter\n"));
    // The samples are the same, line for line.
    let samples = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(samples(&text).len(), samples(&open_metrics).len());
}

fn help_of<'a>(text: &'a str, name: &str) -> &'a str {
    let prefix = format!("# HELP {name} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{name} has no help"))
}

#[test]
fn accept_chooses_the_format() {
    let negotiate = |accept: Option<&str>| {
        Format::negotiate(accept.map(HeaderValue::from_str).transpose().unwrap().as_ref())
    };
    assert_eq!(negotiate(None), Format::Prometheus);
    // What Prometheus 2.x sends.
    assert_eq!(
        negotiate(Some(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )),
        Format::OpenMetrics
    );
    // With `scrape_protocols` naming the text format first.
    assert_eq!(
        negotiate(Some(
            "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.8"
        )),
        Format::Prometheus
    );
    assert_eq!(
        negotiate(Some("application/openmetrics-text")),
        Format::OpenMetrics
    );
    assert_eq!(
        negotiate(Some("Application/OpenMetrics-Text; Version=1.0.0; charset=utf-8")),
        Format::OpenMetrics
    );
    assert_eq!(negotiate(Some("text/plain")), Format::Prometheus);
    assert_eq!(negotiate(Some("*/*")), Format::Prometheus);
    assert_eq!(negotiate(Some("application/json")), Format::Prometheus);
    assert_eq!(
        negotiate(Some("application/openmetrics-text;q=0, text/plain")),
        Format::Prometheus
    );
    assert_eq!(
        negotiate(Some("application/openmetrics-text;q=x")),
        Format::Prometheus
    );
    assert_eq!(
        negotiate(Some("application/openmetrics-text;q=2")),
        Format::Prometheus
    );
    assert_eq!(
        negotiate(Some("*/*;q=0.5, application/openmetrics-text;q=0.5")),
        Format::OpenMetrics,
        "a tie goes to the format named"
    );
    assert_eq!(
        Format::Prometheus.content_type(),
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert_eq!(
        Format::OpenMetrics.content_type(),
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
}

#[test]
fn status_codes_are_exported_as_sent_and_only_those() {
    let (metrics, _) = metrics(&[("ROUTES", "/api/*=token_bucket:5:1,name=api")]);
    let table = table(&[("ROUTES", "/api/*=token_bucket:5:1,name=api")]);
    let series = metrics.series(&table);
    let api = series.rule(table.rule("api").unwrap().id).unwrap();
    metrics.response(Some(api), 200);
    metrics.response(Some(api), 200);
    metrics.response(Some(api), 429);
    metrics.response(Some(api), 599);
    metrics.response(Some(api), 600);
    metrics.response(Some(api), 100);
    metrics.response(None, 400);
    // An id past the table has no series.
    assert!(series.rule(u16::MAX).is_none());
    let text = metrics.encode(Format::Prometheus).unwrap();
    let code = |rule: &str, code: &str| {
        sample(
            &text,
            &format!(r#"tollgate_responses_total{{rule="{rule}",code="{code}"}}"#),
        )
    };
    assert_eq!(code("api", "200"), Some(2.0));
    assert_eq!(code("api", "429"), Some(1.0));
    assert_eq!(code("api", "100"), Some(1.0));
    assert_eq!(code("api", "599"), Some(1.0));
    assert_eq!(code("api", "other"), Some(1.0));
    assert_eq!(code(NO_RULE, "400"), Some(1.0));
    let series = text
        .lines()
        .filter(|line| line.starts_with("tollgate_responses_total"))
        .count();
    assert_eq!(series, 6, "no series for a code never sent:\n{text}");
    assert_eq!(code("general", "200"), None);
}

#[test]
fn latency_histograms_are_by_rule_and_decisions_start_at_5_microseconds() {
    let (metrics, _) = metrics(&[]);
    let series = metrics.series(&table(&[]));
    let first = series.rule(0).unwrap();
    first.decision(Duration::from_micros(3));
    first.decision(Duration::from_micros(30));
    first.backend_response(204, Duration::from_millis(2));
    let text = metrics.encode(Format::Prometheus).unwrap();
    let rule = label_value(
        &Config::from_vars([("BACKEND_URL", "http://127.0.0.1:9")])
            .unwrap()
            .gate
            .rules
            .rules()[0]
            .name,
    );
    let bucket = |name: &str, le: &str| {
        sample(&text, &format!(r#"{name}_bucket{{le="{le}",rule="{rule}"}}"#))
            .or_else(|| sample(&text, &format!(r#"{name}_bucket{{rule="{rule}",le="{le}"}}"#)))
    };
    let first = text
        .lines()
        .find(|line| line.starts_with("tollgate_decision_duration_seconds_bucket"))
        .unwrap();
    assert!(
        first.contains("le=\"0.000005\"") || first.contains("le=\"5e-6\""),
        "{first}"
    );
    let first_le = first.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
    assert_eq!(
        bucket("tollgate_decision_duration_seconds", first_le),
        Some(1.0),
        "3 µs is in the first bucket"
    );
    assert_eq!(bucket("tollgate_decision_duration_seconds", "+Inf"), Some(2.0));
    assert_eq!(
        sample(
            &text,
            &format!(r#"tollgate_backend_duration_seconds_count{{rule="{rule}"}}"#)
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            &format!(r#"tollgate_backend_responses_total{{rule="{rule}",class="2xx"}}"#)
        ),
        Some(1.0)
    );
}

#[test]
fn open_connections_and_requests_in_flight_are_read_at_scrape_time() {
    let (metrics, load) = metrics(&[]);
    let _connection = load.connections.try_acquire().unwrap();
    let _tunnel = load.connections.try_acquire().unwrap();
    let request = load.requests.try_acquire().unwrap();
    let text = metrics.encode(Format::Prometheus).unwrap();
    assert_eq!(sample(&text, "tollgate_client_connections_open"), Some(2.0));
    assert_eq!(sample(&text, "tollgate_client_connections_max"), Some(7.0));
    assert_eq!(sample(&text, "tollgate_requests_in_flight"), Some(1.0));
    drop(request);
    let text = metrics.encode(Format::Prometheus).unwrap();
    assert_eq!(sample(&text, "tollgate_requests_in_flight"), Some(0.0));
}

#[test]
fn label_values_are_escaped_once_at_start() {
    assert_eq!(label_value(r#"/a"b"#), r#"/a\"b"#);
    assert_eq!(label_value(r"a\b"), r"a\\b");
    assert_eq!(label_value("general"), "general");
}

#[test]
fn the_series_of_a_rule_a_reload_removed_are_no_longer_exported() {
    let (metrics, _) = metrics(&[]);
    let series = metrics.series(&table(&[("ROUTES", "/old/*=token_bucket:5:1,name=old")]));
    let old = series.rule(0).unwrap();
    old.request(Outcome::Allowed);
    metrics.response(Some(old), 200);
    let before = metrics.encode(Format::Prometheus).unwrap();
    assert!(before.contains(r#"rule="old""#), "{before}");
    metrics.retire(&["old".to_owned()]);
    let after = metrics.encode(Format::Prometheus).unwrap();
    assert!(!after.contains(r#"rule="old""#), "{after}");
    assert!(after.contains(r#"rule="general""#), "the others stay");
}

/// `tollgate_rls_descriptor_total` keeps `max` descriptors apart; a later one counts under its
/// domain's `(other)` (which is not one of the `max`), one already kept still counts under its
/// own, and a label value is escaped.
#[test]
fn descriptor_series_are_capped_and_the_rest_folded_into_other() {
    let counts = DescriptorCounts::new(2);
    let mut registry = Registry::default();
    registry.register("rls_descriptor", "test", counts.family.clone());
    counts.count("edge", "edge.k_a", Outcome::Allowed);
    counts.count("edge", "edge.k_\"b\"", Outcome::Limited);
    for value in ["c", "d", "e"] {
        counts.count("edge", &format!("edge.k_{value}"), Outcome::Allowed);
    }
    counts.count("edge", "edge.k_a", Outcome::Allowed);
    counts.count("other-domain", "other-domain.k_a", Outcome::Shadow);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let mut samples: Vec<&str> = text.lines().filter(|line| !line.starts_with('#')).collect();
    samples.sort_unstable();
    assert_eq!(
        samples,
        [
            r#"rls_descriptor_total{domain="edge",descriptor="(other)",decision="allowed"} 3"#,
            r#"rls_descriptor_total{domain="edge",descriptor="edge.k_\"b\"",decision="limited"} 1"#,
            r#"rls_descriptor_total{domain="edge",descriptor="edge.k_a",decision="allowed"} 2"#,
            r#"rls_descriptor_total{domain="other-domain",descriptor="(other)",decision="shadow"} 1"#,
        ]
    );
}
