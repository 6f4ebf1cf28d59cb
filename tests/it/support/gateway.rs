//! The gateway under test: `tollgate::serve` on a real listener, in this process.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub struct Gateway {
    pub addr: SocketAddr,
    /// The admin listener, when started with one.
    pub admin: Option<SocketAddr>,
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

    async fn launch(backend: &str, vars: &[(&str, &str)], with_admin: bool) -> Gateway {
        let mut all = vec![("BACKEND_URL", backend)];
        all.extend_from_slice(vars);
        let config = tollgate::Config::from_vars(all.iter().copied()).expect("test config is valid");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let admin = match with_admin {
            true => Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
            false => None,
        };
        let admin_addr = admin.as_ref().map(|admin| admin.local_addr().unwrap());
        let (shutdown, stop) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let stop = async {
                let _ = stop.await;
            };
            match admin {
                Some(admin) => tollgate::serve_with_admin(listener, admin, config, stop).await,
                None => tollgate::serve(listener, config, stop).await,
            }
            .expect("serve failed");
        });
        Gateway {
            addr,
            admin: admin_addr,
            shutdown: Some(shutdown),
            task,
        }
    }

    /// `GET path` on the admin listener.
    pub async fn admin_get(&self, path: &str) -> super::Reply {
        super::get(self.admin.expect("started without an admin listener"), path).await
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
