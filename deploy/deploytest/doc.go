// Package deploytest verifies the files under deploy/ with the real tools
// they are written for: promtool checks and unit-tests the Prometheus rules,
// and a real Prometheus scraping a real gateway under load evaluates every
// Grafana panel query and every alert and recording rule.
//
// The tests need the Debian "prometheus" package (prometheus and promtool on
// PATH): apt-get install -y --no-install-recommends prometheus
package deploytest
