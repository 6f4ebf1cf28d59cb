//! The listener's settings: `TLS_CERT_FILE`, `TLS_KEY_FILE`, `TLS_RELOAD_INTERVAL_MS` and
//! `PROXY_PROTOCOL`, into [`ListenerConfig`]. The files are read when serving starts (and
//! whenever they change), not here: parsing stays a function of strings.

use crate::variables as vars;
use std::path::PathBuf;

use ipnet::IpNet;

use super::ConfigError;
use super::env::Env;
use crate::server::listener::ListenerConfig;
use crate::server::tls::TlsSettings;

/// Parse the listener's variables; `trusted_proxies` is `TRUSTED_PROXIES`, which
/// `PROXY_PROTOCOL=true` needs.
pub(crate) fn parse(env: &Env, trusted_proxies: &[IpNet]) -> Result<ListenerConfig, ConfigError> {
    let tls = match (env.get(vars::TLS_CERT_FILE), env.get(vars::TLS_KEY_FILE)) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some(TlsSettings {
            cert_file: PathBuf::from(cert),
            key_file: PathBuf::from(key),
            // Read only with TLS on: set without it, it is warned about as changing nothing.
            reload_interval: env.millis(vars::TLS_RELOAD_INTERVAL_MS)?,
        }),
        (Some(_), None) => {
            return Err(ConfigError::Conflict(
                "TLS_CERT_FILE is set but TLS_KEY_FILE is not: HTTPS needs both (the certificate \
                 chain and its private key, PEM)"
                    .into(),
            ));
        }
        (None, Some(_)) => {
            return Err(ConfigError::Conflict(
                "TLS_KEY_FILE is set but TLS_CERT_FILE is not: HTTPS needs both (the certificate \
                 chain and its private key, PEM)"
                    .into(),
            ));
        }
    };
    let proxy_protocol = env.flag(vars::PROXY_PROTOCOL)?;
    if proxy_protocol && trusted_proxies.is_empty() {
        return Err(ConfigError::Conflict(
            "PROXY_PROTOCOL=true needs TRUSTED_PROXIES: only the load balancers listed there may \
             connect, and each connection must begin with their PROXY header"
                .into(),
        ));
    }
    Ok(ListenerConfig { tls, proxy_protocol })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parse_vars(vars: &[(&str, &str)], trusted: &[&str]) -> Result<ListenerConfig, ConfigError> {
        let trusted: Vec<IpNet> = trusted.iter().map(|net| net.parse().unwrap()).collect();
        parse(&Env::new(vars.iter().copied()), &trusted)
    }

    #[test]
    fn plain_http_by_default() {
        assert_eq!(parse_vars(&[], &[]), Ok(ListenerConfig::default()));
    }

    #[test]
    fn tls_needs_both_files() {
        let config = parse_vars(&[("TLS_CERT_FILE", "/c.pem"), ("TLS_KEY_FILE", "/k.pem")], &[]).unwrap();
        assert_eq!(
            config.tls,
            Some(TlsSettings {
                cert_file: "/c.pem".into(),
                key_file: "/k.pem".into(),
                reload_interval: Duration::from_secs(5),
            })
        );
        for one in ["TLS_CERT_FILE", "TLS_KEY_FILE"] {
            let error = parse_vars(&[(one, "/x.pem")], &[]).unwrap_err().to_string();
            assert!(error.starts_with(one), "{error}");
        }
        let error = parse_vars(
            &[
                ("TLS_CERT_FILE", "/c.pem"),
                ("TLS_KEY_FILE", "/k.pem"),
                ("TLS_RELOAD_INTERVAL_MS", "0"),
            ],
            &[],
        )
        .unwrap_err();
        assert!(error.to_string().contains("TLS_RELOAD_INTERVAL_MS"), "{error}");
    }

    #[test]
    fn the_proxy_protocol_needs_trusted_proxies() {
        let error = parse_vars(&[("PROXY_PROTOCOL", "true")], &[])
            .unwrap_err()
            .to_string();
        assert!(error.contains("TRUSTED_PROXIES"), "{error}");
        assert!(
            parse_vars(&[("PROXY_PROTOCOL", "true")], &["10.0.0.0/8"])
                .unwrap()
                .proxy_protocol
        );
        let error = parse_vars(&[("PROXY_PROTOCOL", "yes")], &["10.0.0.0/8"]).unwrap_err();
        assert!(error.to_string().contains("PROXY_PROTOCOL"), "{error}");
    }
}
