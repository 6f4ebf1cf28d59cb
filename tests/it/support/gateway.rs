//! The gateway under test: `tollgate::serve_on` on real listeners, in this process.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub struct Gateway {
    pub addr: SocketAddr,
    /// The admin listener, when started with one.
    pub admin: Option<SocketAddr>,
    /// The decision listener (`DECIDE_PORT`), when started with one.
    pub decide: Option<SocketAddr>,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Gateway {
    /// Serve with `BACKEND_URL=backend` plus `vars`.
    pub async fn start(backend: &str, vars: &[(&str, &str)]) -> Gateway {
        Self::launch(backend, vars, false).await
    }

    /// The same, with the admin listener on a port of its own.
    pub async fn start_with_admin(backend: &str, vars: &[(&str, &str)]) -> Gateway {
        Self::launch(backend, vars, true).await
    }

    /// The decision endpoints on a port of their own (`DECIDE_PORT`), with `BACKEND_URL` only
    /// if `backend` is given (`None`: a decision service alone, no proxy listener).
    pub async fn start_decide(backend: Option<&str>, vars: &[(&str, &str)]) -> Gateway {
        // The listener is bound here; the configured port only has to be valid.
        let mut all = vec![("DECIDE_PORT", "1")];
        all.extend_from_slice(vars);
        Self::launch_with(backend, &all, false, true).await
    }

    /// The decision endpoints and the admin listener, each on a port of its own, no proxy.
    pub async fn start_decide_with_admin(vars: &[(&str, &str)]) -> Gateway {
        let mut all = vec![("DECIDE_PORT", "1")];
        all.extend_from_slice(vars);
        Self::launch_with(None, &all, true, true).await
    }

    async fn launch(backend: &str, vars: &[(&str, &str)], with_admin: bool) -> Gateway {
        Self::launch_with(Some(backend), vars, with_admin, false).await
    }

    async fn launch_with(
        backend: Option<&str>,
        vars: &[(&str, &str)],
        with_admin: bool,
        with_decide: bool,
    ) -> Gateway {
        let mut all: Vec<(&str, &str)> = backend
            .map(|backend| ("BACKEND_URL", backend))
            .into_iter()
            .collect();
        all.extend_from_slice(vars);
        let config = tollgate::Config::from_vars(all.iter().copied()).expect("test config is valid");
        let bind = || async { TcpListener::bind("127.0.0.1:0").await.unwrap() };
        let proxy = match backend {
            Some(_) => Some(bind().await),
            None => None,
        };
        let admin = match with_admin {
            true => Some(bind().await),
            false => None,
        };
        let decide = match with_decide {
            true => Some(bind().await),
            false => None,
        };
        let address = |listener: &Option<TcpListener>| listener.as_ref().map(|l| l.local_addr().unwrap());
        let (addr, admin_addr, decide_addr) = (address(&proxy), address(&admin), address(&decide));
        let (shutdown, stop) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let stop = async {
                let _ = stop.await;
            };
            let listeners = tollgate::Listeners {
                proxy,
                admin,
                decide,
                hangup: None,
            };
            tollgate::serve_on(listeners, config, stop)
                .await
                .expect("serve failed");
        });
        Gateway {
            // A decision service alone has no proxy address: its decision address stands in.
            addr: addr.or(decide_addr).unwrap(),
            admin: admin_addr,
            decide: decide_addr,
            shutdown: Some(shutdown),
            task,
        }
    }

    /// `GET path` on the admin listener.
    pub async fn admin_get(&self, path: &str) -> super::Reply {
        super::get(self.admin.expect("started without an admin listener"), path).await
    }

    /// One series of `/metrics` on the admin listener, e.g. `tollgate_breaker_open` or
    /// `tollgate_requests_total{rule="general",decision="limited"}`.
    pub async fn metric(&self, series: &str) -> f64 {
        let reply = self.admin_get("/metrics").await;
        assert_eq!(reply.status, http::StatusCode::OK);
        reply
            .text()
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no series {series} in /metrics"))
            .parse()
            .unwrap()
    }

    /// `method path` on the admin listener, with `Authorization: Bearer token` if given.
    pub async fn admin(&self, method: http::Method, path: &str, token: Option<&str>) -> super::Reply {
        let bearer = token.map(|token| format!("Bearer {token}"));
        let headers: Vec<(&str, &str)> = bearer
            .as_deref()
            .map(|bearer| ("authorization", bearer))
            .into_iter()
            .collect();
        let admin = self.admin.expect("started without an admin listener");
        super::request(
            admin,
            [127, 0, 0, 1].into(),
            method,
            path,
            &headers,
            bytes::Bytes::new(),
        )
        .await
    }

    /// Stop accepting and wait for the drain to finish.
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        (&mut self.task).await.unwrap();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}
