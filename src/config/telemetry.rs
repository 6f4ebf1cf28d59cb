//! The log's settings (`LOG_FORMAT`), into [`LogSettings`]. `RUST_LOG` is the log filter's own
//! (see [`crate::telemetry`]). The traces' (`OTEL_*`, OpenTelemetry's own names and
//! meanings), into [`TraceSettings`].

use super::ConfigError;
use super::env::Env;
use crate::telemetry::trace::{OtlpProtocol, RootSampler, TraceSampler, TraceSettings};
use crate::telemetry::{LogFormat, LogSettings};
use crate::variables::{self as vars, Var};

/// The log's settings.
pub(crate) fn parse(env: &Env) -> Result<LogSettings, ConfigError> {
    let format = env.parse(vars::LOG_FORMAT, "text or json", |s| match s {
        "text" => Some(LogFormat::Text),
        "json" => Some(LogFormat::Json),
        _ => None,
    })?;
    Ok(LogSettings { format })
}

/// The traces' settings (`OTEL_*`): `None` when no endpoint is set, so nothing is exported.
/// Every variable is checked whether or not an endpoint is set, so a bad value is found the
/// day it is written, not the day traces are turned on.
pub(crate) fn parse_traces(env: &Env) -> Result<Option<TraceSettings>, ConfigError> {
    let protocol = env.parse(
        vars::OTEL_EXPORTER_OTLP_PROTOCOL,
        "http/protobuf or grpc (http/json is not supported)",
        |s| match s {
            "http/protobuf" => Some(OtlpProtocol::HttpProtobuf),
            "grpc" => Some(OtlpProtocol::Grpc),
            _ => None,
        },
    )?;
    let sampler = sampler(env)?;
    let mut resource = resource_attributes(env)?;
    let named = resource
        .iter()
        .position(|(key, _)| key == "service.name")
        .map(|at| resource.remove(at).1);
    let service_name = env
        .get(vars::OTEL_SERVICE_NAME)
        .map(str::to_owned)
        .or(named)
        .unwrap_or_else(|| "tollgate".to_owned());
    // The signal's own variable is the URL as is; the general one is a base that the signal's
    // path is appended to, for http/protobuf (OTLP exporter specification, "Endpoint URLs for
    // OTLP/HTTP"); gRPC takes either as the collector's address.
    let endpoint = match (
        env.get(vars::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
        env.get(vars::OTEL_EXPORTER_OTLP_ENDPOINT),
    ) {
        (Some(url), _) => endpoint(vars::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, url)?.to_owned(),
        (None, Some(base)) => {
            let base = endpoint(vars::OTEL_EXPORTER_OTLP_ENDPOINT, base)?;
            match protocol {
                OtlpProtocol::HttpProtobuf => format!("{}/v1/traces", base.trim_end_matches('/')),
                OtlpProtocol::Grpc => base.to_owned(),
            }
        }
        (None, None) => return Ok(None),
    };
    Ok(Some(TraceSettings {
        endpoint,
        protocol,
        service_name,
        resource,
        sampler,
    }))
}

/// An endpoint: an `http://` URL with a host (the exporter speaks neither TLS nor Unix
/// sockets here: a collector beside the gateway, or its sidecar, is reached in plain HTTP).
fn endpoint(var: Var, value: &str) -> Result<&str, ConfigError> {
    let expected = "an http:// URL of the OTLP collector, such as http://127.0.0.1:4318 (https is not supported: \
                    send to a collector beside the gateway)";
    let uri: http::Uri = value
        .parse()
        .map_err(|_| ConfigError::invalid(var.name, value, expected))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http"), Some(host)) if !host.is_empty() => Ok(value),
        _ => Err(ConfigError::invalid(var.name, value, expected)),
    }
}

/// `OTEL_TRACES_SAMPLER` and its argument.
fn sampler(env: &Env) -> Result<TraceSampler, ConfigError> {
    let (parent_based, root) = env.parse(
        vars::OTEL_TRACES_SAMPLER,
        "always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or \
         parentbased_traceidratio",
        |s| {
            let (parent_based, root) = match s.strip_prefix("parentbased_") {
                Some(root) => (true, root),
                None => (false, s),
            };
            match root {
                "always_on" => Some((parent_based, Some(RootSampler::AlwaysOn))),
                "always_off" => Some((parent_based, Some(RootSampler::AlwaysOff))),
                // The ratio is read next.
                "traceidratio" => Some((parent_based, None)),
                _ => None,
            }
        },
    )?;
    let arg = vars::OTEL_TRACES_SAMPLER_ARG;
    let root = match root {
        Some(root) => root,
        None => RootSampler::Ratio(
            env.parse_or(arg, "1.0", "a ratio from 0 to 1, such as 0.01", |s| {
                s.parse::<f64>().ok().filter(|ratio| (0.0..=1.0).contains(ratio))
            })?,
        ),
    };
    // Read by the ratio samplers only: set with another, it is still checked.
    if let (RootSampler::AlwaysOn | RootSampler::AlwaysOff, Some(value)) = (root, env.get(arg))
        && !value
            .parse::<f64>()
            .is_ok_and(|ratio| (0.0..=1.0).contains(&ratio))
    {
        return Err(ConfigError::invalid(
            arg.name,
            value,
            "a ratio from 0 to 1, such as 0.01",
        ));
    }
    Ok(TraceSampler { parent_based, root })
}

/// `OTEL_RESOURCE_ATTRIBUTES`: `key=value` pairs separated by commas, values percent-encoded
/// (W3C Baggage's format, as the SDK specification says).
fn resource_attributes(env: &Env) -> Result<Vec<(String, String)>, ConfigError> {
    let var = vars::OTEL_RESOURCE_ATTRIBUTES;
    let Some(value) = env.get(var) else {
        return Ok(Vec::new());
    };
    let mut attributes = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|entry| !entry.is_empty()) {
        let invalid = |problem: &str| ConfigError::Entry {
            var: var.name,
            entry: entry.to_owned(),
            problem: problem.to_owned(),
        };
        let Some((key, raw)) = entry.split_once('=') else {
            return Err(invalid("expected key=value"));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(invalid("the key is empty (expected key=value)"));
        }
        let value = percent_encoding::percent_decode_str(raw.trim())
            .decode_utf8()
            .map_err(|_| invalid("the value is not UTF-8 once percent-decoded"))?;
        attributes.push((key.to_owned(), value.into_owned()));
    }
    Ok(attributes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traces(vars: &[(&str, &str)]) -> Result<Option<TraceSettings>, ConfigError> {
        parse_traces(&Env::new(vars.iter().copied()))
    }

    #[test]
    fn no_endpoint_is_no_traces() {
        assert_eq!(traces(&[]).unwrap(), None);
        assert_eq!(traces(&[("OTEL_SERVICE_NAME", "edge")]).unwrap(), None);
    }

    #[test]
    fn the_http_endpoint_gets_the_signal_path_and_the_traces_endpoint_is_as_is() {
        let settings = traces(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")])
            .unwrap()
            .unwrap();
        assert_eq!(settings.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(settings.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(settings.service_name, "tollgate");
        assert_eq!(
            settings.sampler,
            TraceSampler {
                parent_based: true,
                root: RootSampler::AlwaysOn
            }
        );
        let settings = traces(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://other:9999/traces"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(settings.endpoint, "http://other:9999/traces");
        let settings = traces(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(settings.endpoint, "http://collector:4317");
        assert_eq!(settings.protocol, OtlpProtocol::Grpc);
    }

    #[test]
    fn samplers_and_their_ratio() {
        let sampler = |vars: &[(&str, &str)]| {
            let mut all = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
            all.extend_from_slice(vars);
            traces(&all).map(|settings| settings.unwrap().sampler.to_string())
        };
        assert_eq!(
            sampler(&[("OTEL_TRACES_SAMPLER", "always_off")]).unwrap(),
            "always_off"
        );
        assert_eq!(
            sampler(&[("OTEL_TRACES_SAMPLER", "traceidratio")]).unwrap(),
            "traceidratio:1"
        );
        assert_eq!(
            sampler(&[
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.01")
            ])
            .unwrap(),
            "parentbased_traceidratio:0.01"
        );
        for (vars, named) in [
            (
                vec![("OTEL_TRACES_SAMPLER", "sometimes")],
                "OTEL_TRACES_SAMPLER=\"sometimes\"",
            ),
            (
                vec![
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "2"),
                ],
                "OTEL_TRACES_SAMPLER_ARG=\"2\"",
            ),
            (
                vec![("OTEL_TRACES_SAMPLER_ARG", "NaN")],
                "OTEL_TRACES_SAMPLER_ARG=\"NaN\"",
            ),
        ] {
            let error = sampler(&vars).unwrap_err().to_string();
            assert!(error.starts_with(named), "{error}");
        }
    }

    #[test]
    fn bad_values_are_refused_naming_the_variable_even_without_an_endpoint() {
        for (vars, named) in [
            (
                vec![("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
                "OTEL_EXPORTER_OTLP_PROTOCOL=\"http/json\" is invalid",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT=\"collector:4318\" is invalid",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c/v1/traces")],
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=\"https://c/v1/traces\" is invalid",
            ),
            (
                vec![("OTEL_RESOURCE_ATTRIBUTES", "a=1,b")],
                "OTEL_RESOURCE_ATTRIBUTES entry \"b\" is invalid",
            ),
            (
                vec![("OTEL_RESOURCE_ATTRIBUTES", "=1")],
                "OTEL_RESOURCE_ATTRIBUTES entry \"=1\" is invalid",
            ),
            (
                vec![("OTEL_TRACES_SAMPLER", "on")],
                "OTEL_TRACES_SAMPLER=\"on\" is invalid",
            ),
        ] {
            let error = traces(&vars).unwrap_err().to_string();
            assert!(error.starts_with(named), "{error}");
        }
    }

    #[test]
    fn resource_attributes_are_decoded_and_name_the_service() {
        let settings = traces(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=edge, deployment.environment=prod%20eu,,",
            ),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(settings.service_name, "edge");
        assert_eq!(
            settings.resource,
            [("deployment.environment".to_owned(), "prod eu".to_owned())]
        );
        let settings = traces(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=edge"),
            ("OTEL_SERVICE_NAME", "gate"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(settings.service_name, "gate");
    }
}
