//! A real three-master Redis Cluster enforces the same exact limits as one Redis.

use crate::redis::{EXACT_25, flood};
use crate::support::{Backend, Gateway, RedisCluster};

#[tokio::test]
async fn a_cluster_enforces_exact_limits_across_replicas() {
    let cluster = RedisCluster::start();
    let backend = Backend::start().await;
    let seeds = cluster.seeds();
    // Several clients, so their keys land in different slots and on different masters.
    let clients: Vec<_> = (2..=4).map(|n| format!("127.0.0.{n}").parse().unwrap()).collect();
    for algorithm in EXACT_25 {
        let mut vars = vec![
            ("REDIS_CLUSTER_NODES", seeds.as_str()),
            ("REDIS_TIMEOUT_MS", "5000"),
        ];
        let prefix = format!("cluster-{}:", algorithm[0].1);
        vars.push(("KEY_PREFIX", &prefix));
        vars.extend_from_slice(algorithm);
        let mut gateways = Vec::new();
        for _ in 0..3 {
            gateways.push(Gateway::start(&backend.url(), &vars).await);
        }
        assert_eq!(flood(&gateways, &clients).await, [25, 25, 25], "{algorithm:?}");
    }
    // The keys really are spread over the masters.
    let holding = cluster.masters_holding_keys();
    assert!(holding >= 2, "keys landed on {holding} of 3 masters");
}
