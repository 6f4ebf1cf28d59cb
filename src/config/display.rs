//! The effective configuration, as `--check-config` prints it and startup logs it: one
//! section per component.

use std::fmt;

use super::{Config, StoreConfig};
use crate::proxy::cors::Cors;
use crate::server::limits::PerClientCap;

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_listeners(f)?;
        self.fmt_rules(f)?;
        self.fmt_entry(f)?;
        self.fmt_answers(f)?;
        self.fmt_connections(f)?;
        self.fmt_store(f)
    }
}

impl Config {
    /// The listeners, and where allowed requests go.
    fn fmt_listeners(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.proxy {
            Some(_) => writeln!(
                f,
                "listen:           {} (admin {})",
                self.server.listen, self.admin.address
            )?,
            None => writeln!(f, "listen:           no proxy (admin {})", self.admin.address)?,
        }
        if let Some(decide) = &self.decide {
            writeln!(
                f,
                "decisions:        {} (/v1/forward-auth, /v1/check{})",
                decide.listen,
                if decide.token.is_some() {
                    " with DECIDE_TOKEN"
                } else {
                    ""
                }
            )?;
        }
        if let Some(proxy) = &self.proxy {
            writeln!(
                f,
                "backend:          {} (timeout {} ms)",
                proxy.backend,
                proxy.backend_timeout.as_millis()
            )?;
            if let Some(tls) = &proxy.backend.tls {
                writeln!(f, "backend TLS:      {tls}")?;
            }
        }
        if let Some(traces) = &self.traces {
            writeln!(
                f,
                "traces:           {} ({}, sampler {}, service {})",
                traces.endpoint,
                traces.protocol.as_str(),
                traces.sampler,
                traces.service_name
            )?;
        }
        Ok(())
    }

    /// The rule table, where it is reloaded from, and whom it trusts.
    fn fmt_rules(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.reload {
            writeln!(
                f,
                "rules file:       {} (reloaded on SIGHUP{}; table digest {:08x})",
                file.files(),
                file.interval.map_or_else(String::new, |every| format!(
                    " and when it changes, read every {} ms",
                    every.as_millis()
                )),
                self.gate.rules.digest()
            )?;
        }
        writeln!(f, "general rule:     {}", self.gate.rules.general().limits)?;
        if let Some(auth) = self.gate.rules.rule("auth") {
            writeln!(f, "auth rule:        {}", auth.limits)?;
        }
        writeln!(f, "auth paths:       {}", self.gate.rules.paths_of("auth"))?;
        writeln!(f, "{}", self.gate.rules)?;
        let proxies: Vec<String> = self
            .gate
            .trusted_proxies
            .iter()
            .map(ToString::to_string)
            .collect();
        writeln!(
            f,
            "trusted proxies:  {}",
            if proxies.is_empty() {
                "none".into()
            } else {
                proxies.join(",")
            }
        )?;
        Ok(())
    }

    /// What comes before HTTP, Envoy's descriptors, and the delay queue.
    fn fmt_entry(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "listener:         {}{}",
            self.server.listener.tls.as_ref().map_or_else(
                || "http".to_owned(),
                |tls| format!(
                    "https ({}, {}, checked every {} ms)",
                    tls.cert_file.display(),
                    tls.key_file.display(),
                    tls.reload_interval.as_millis()
                )
            ),
            if self.server.listener.proxy_protocol {
                ", PROXY protocol from trusted proxies only"
            } else {
                ""
            }
        )?;
        if let Some(rls) = &self.rls {
            writeln!(f, "envoy rls:        {rls}")?;
        }
        if self.gate.rules.rules().iter().any(|rule| rule.delay.is_some()) {
            let bounds = self.gate.delay_bounds;
            writeln!(
                f,
                "delay queue:      at most {} requests waiting ({} per client and rule); past it, refused at once",
                bounds.overall, bounds.per_client
            )?;
        }
        Ok(())
    }

    /// How refusals and the proxy's answers look, and what bodies must do.
    fn fmt_answers(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let refusals = match (&self.proxy, &self.decide) {
            (Some(proxy), _) => Some((&proxy.refusals, proxy.forward_headers)),
            (None, Some(decide)) => Some((&decide.refusals, decide.forward_headers)),
            (None, None) => None,
        };
        if let Some((refusals, forward_headers)) = refusals {
            writeln!(
                f,
                "refusals:         {} {} (unless Accept prefers another of json, problem, text); \
                 RateLimit fields to the backend: {}",
                refusals.status().as_u16(),
                refusals.format().as_str(),
                if forward_headers { "yes" } else { "no" }
            )?;
        }
        if let Some(proxy) = &self.proxy {
            writeln!(f, "headers:          {}", proxy.headers.as_str())?;
            if let Some(header) = &proxy.response_cost_header {
                writeln!(
                    f,
                    "reported costs:   {header} (the difference from the cost charged, charged or refunded after the response)"
                )?;
            }
            writeln!(
                f,
                "request bodies:   cut after {} ms without data, {}",
                proxy.body_idle_timeout.as_millis(),
                proxy
                    .body_min_rate
                    .map_or_else(|| "no minimum rate".to_owned(), |rate| format!("or below {rate}"))
            )?;
        }
        Ok(())
    }

    /// The caps and clocks of connections, requests and upgrades.
    fn fmt_connections(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let share = |cap: PerClientCap| match (cap, self.server.max_connections) {
            (PerClientCap::Off, _) => "no cap".to_owned(),
            (cap, Some(max)) => cap
                .effective(max.get())
                .map_or_else(|| "no cap".to_owned(), |cap| cap.to_string()),
            (PerClientCap::At(cap), None) => cap.to_string(),
            (PerClientCap::Default, None) => "three quarters of that".to_owned(),
        };
        let per_client = share(self.server.max_connections_per_client);
        writeln!(
            f,
            "connections:      at most {} ({per_client} per client), first request within {} ms, \
             closed after {} ms idle or {} ms unread; upgrades per client: {}, tunnel idle \
             timeout: {}",
            self.server.max_connections.map_or_else(
                || "as the file-descriptor limit allows".to_owned(),
                |max| max.to_string()
            ),
            self.server.header_read_timeout.as_millis(),
            self.server.idle_timeout.as_millis(),
            self.server.send_timeout.as_millis(),
            self.gate
                .max_upgrades_per_client
                .map_or_else(|| "unlimited".to_owned(), |max| max.to_string()),
            self.proxy
                .as_ref()
                .and_then(|proxy| proxy.upgrade_idle_timeout)
                .map_or_else(|| "never".to_owned(), |idle| format!("{} ms", idle.as_millis()))
        )?;
        writeln!(
            f,
            "requests:         in flight at most as many ({} per client), {} streams per HTTP/2 \
             connection",
            share(self.server.max_requests_per_client),
            self.server.h2_max_concurrent_streams
        )?;
        if let Some(proxy) = &self.proxy {
            writeln!(
                f,
                "upgrades to:      {}; headers with '_': {}; method overrides: {}; CORS on own answers: {}",
                proxy.upgrade_protocols.describe(),
                proxy.underscore_headers.as_str(),
                proxy.method_override.as_str(),
                proxy
                    .cors
                    .as_ref()
                    .map_or_else(|| "off".to_owned(), Cors::describe)
            )?;
        }
        Ok(())
    }

    /// Where budgets live, and what Redis failing does.
    fn fmt_store(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.store.kind {
            StoreConfig::Memory => {
                write!(
                    f,
                    "store:            memory (at most {} client states per rule)",
                    self.store.max_keys
                )?;
                match &self.store.state_file {
                    Some(state_file) => write!(f, "\nstate file:       {state_file}"),
                    None => write!(f, "\nstate file:       off (budgets start full after a restart)"),
                }
            }
            StoreConfig::Redis(redis) => {
                writeln!(f, "store:            {redis}")?;
                // Each rule's own (FAIL_MODE, AUTH_FAIL_MODE, a route's fail=), in table order;
                // the classified ones: a named rule (RLS_CONFIG's) is listed by its door.
                let modes: Vec<String> = self
                    .gate
                    .rules
                    .classified()
                    .iter()
                    .map(|rule| format!("{} {}", rule.name, rule.fail_mode.as_str()))
                    .collect();
                write!(
                    f,
                    "fail modes:       {} (when Redis cannot decide)",
                    modes.join(", ")
                )
            }
        }
    }
}
