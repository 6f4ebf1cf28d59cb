//! The gateway under test: `tollgate::serve` on a real listener, in this process.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub struct Gateway {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Gateway {
    /// Serve with `BACKEND_URL=backend` plus `vars`.
    pub async fn start(backend: &str, vars: &[(&str, &str)]) -> Gateway {
        let mut all = vec![("BACKEND_URL", backend)];
        all.extend_from_slice(vars);
        let config = tollgate::Config::from_vars(all.iter().copied()).expect("test config is valid");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (shutdown, stop) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            tollgate::serve(listener, config, async {
                let _ = stop.await;
            })
            .await
            .expect("serve failed");
        });
        Gateway {
            addr,
            shutdown: Some(shutdown),
            task,
        }
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
