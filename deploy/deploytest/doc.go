// Package deploytest verifies the files under deploy/ with the real tools
// they are written for: promtool checks and unit-tests the Prometheus rules;
// a real Prometheus scraping a real gateway under load evaluates every
// Grafana panel query and every alert and recording rule; the Kubernetes
// manifests pass the Kubernetes OpenAPI schemas (kubernetes-models on
// Node.js) and strict decoding into the k8s.io/api types (k8svalidate, a
// module of its own), and deploy/k8s/clickhouse.yaml agrees with itself and
// with cluster.sql; and deploy/clickhouse/cluster.sql runs on a real
// ClickHouse cluster (ZooKeeper and four servers on loopback) that rollgate's
// store and the real `rollgate serve --clickhouse` then write to and read from.
//
// The tests need Debian's prometheus, clickhouse-server, zookeeper, nodejs
// and npm packages, and `npm ci` in k8svalidate; scripts/test installs them.
package deploytest
