package deploytest

import (
	"encoding/xml"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// xnode is any XML element, for reading ClickHouse configuration files.
type xnode struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Text    string     `xml:",chardata"`
	Nodes   []xnode    `xml:",any"`
}

// child returns the first child element named name (a zero node if none).
func (n xnode) child(name string) xnode {
	for _, c := range n.Nodes {
		if c.XMLName.Local == name {
			return c
		}
	}
	return xnode{}
}

// path follows child names.
func (n xnode) path(names ...string) xnode {
	for _, name := range names {
		n = n.child(name)
	}
	return n
}

func (n xnode) text() string { return strings.TrimSpace(n.Text) }

func (n xnode) attr(name string) string {
	for _, a := range n.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func parseXML(t *testing.T, what, s string) xnode {
	t.Helper()
	var n xnode
	if err := xml.Unmarshal([]byte(s), &n); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return n
}

// TestKubernetesClickHouseCluster checks that deploy/k8s/clickhouse.yaml
// agrees with itself, with deploy/clickhouse/cluster.sql and with the
// gateway's Secret: the remote_servers of the cluster the macros name list
// exactly the pods of the shard StatefulSets (through their headless
// Service), each server's shard and replica macros come from its
// StatefulSet and pod name, the ZooKeeper nodes are the Keeper pods and the
// Keeper raft ids follow their ordinals, the rollgate user has the profile
// settings cluster.sql asks for, and the gateways' DSN names a Service over
// the ClickHouse pods, the rollgate user and the database cluster.sql creates.
func TestKubernetesClickHouseCluster(t *testing.T) {
	const ns = "rollgate.svc.cluster.local"
	objs := map[string]map[string]any{}
	for _, d := range yamlDocs(t, filepath.Join(deployDir(t), "k8s", "clickhouse.yaml")) {
		objs[d["kind"].(string)+"/"+dig(d, "metadata", "name").(string)] = d
	}
	for _, d := range yamlDocs(t, filepath.Join(deployDir(t), "k8s", "secret.example.yaml")) {
		objs[d["kind"].(string)+"/"+dig(d, "metadata", "name").(string)] = d
	}
	get := func(key string) map[string]any {
		t.Helper()
		o := objs[key]
		if o == nil {
			t.Fatalf("deploy/k8s/clickhouse.yaml lacks %s", key)
		}
		return o
	}
	str := func(v any) string { s, _ := v.(string); return s }
	selects := func(sel, labels any) bool {
		s, _ := sel.(map[string]any)
		l, _ := labels.(map[string]any)
		for k, v := range s {
			if l[k] != v {
				return false
			}
		}
		return len(s) > 0
	}
	// podDNS lists the DNS names of a StatefulSet's pods through its headless Service.
	podDNS := func(sts map[string]any) []string {
		t.Helper()
		name := str(dig(sts, "metadata", "name"))
		svcName := str(dig(sts, "spec", "serviceName"))
		svc := get("Service/" + svcName)
		if dig(svc, "spec", "clusterIP") != "None" {
			t.Errorf("StatefulSet %s: Service %s is not headless", name, svcName)
		}
		labels := dig(sts, "spec", "template", "metadata", "labels")
		if !selects(dig(svc, "spec", "selector"), labels) || !selects(dig(sts, "spec", "selector", "matchLabels"), labels) {
			t.Errorf("StatefulSet %s: selectors do not match its pod labels %v", name, labels)
		}
		n, _ := dig(sts, "spec", "replicas").(int)
		var out []string
		for i := 0; i < n; i++ {
			out = append(out, fmt.Sprintf("%s-%d.%s.%s", name, i, svcName, ns))
		}
		return out
	}
	container := func(sts map[string]any) map[string]any {
		return dig(sts, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
	}
	env := func(c map[string]any, name string) map[string]any {
		for _, e := range dig(c, "env").([]any) {
			if e.(map[string]any)["name"] == name {
				return e.(map[string]any)
			}
		}
		t.Errorf("container %s has no env %s", c["name"], name)
		return map[string]any{}
	}

	cm := get("ConfigMap/clickhouse-config")
	server := parseXML(t, "cluster.xml", str(dig(cm, "data", "cluster.xml")))
	users := parseXML(t, "rollgate-user.xml", str(dig(cm, "data", "rollgate-user.xml")))
	keeperConf := parseXML(t, "keeper.xml", str(dig(get("ConfigMap/clickhouse-keeper-config"), "data", "keeper.xml")))

	// The macros cluster.sql uses exist; the cluster they name is defined.
	sqlBytes, err := os.ReadFile(filepath.Join(deployDir(t), "clickhouse", "cluster.sql"))
	if err != nil {
		t.Fatal(err)
	}
	macros := server.child("macros")
	for _, m := range []string{"cluster", "shard", "replica"} {
		if !strings.Contains(string(sqlBytes), "{"+m+"}") {
			t.Errorf("cluster.sql does not use the {%s} macro", m)
		}
		if macros.child(m).XMLName.Local == "" {
			t.Errorf("cluster.xml defines no %s macro", m)
		}
	}
	if a, b := macros.child("shard").attr("from_env"), macros.child("replica").attr("from_env"); a != "SHARD" || b != "REPLICA" {
		t.Errorf("shard and replica macros come from %q and %q, want SHARD and REPLICA", a, b)
	}
	cluster := server.path("remote_servers", macros.child("cluster").text())
	if cluster.XMLName.Local == "" {
		t.Fatalf("remote_servers has no cluster %q (the cluster macro)", macros.child("cluster").text())
	}

	// remote_servers shard k = the pods of the StatefulSet with SHARD k.
	var shardSets []map[string]any
	for key, o := range objs {
		if strings.HasPrefix(key, "StatefulSet/clickhouse-shard") {
			shardSets = append(shardSets, o)
		}
	}
	slices.SortFunc(shardSets, func(a, b map[string]any) int {
		return strings.Compare(str(env(container(a), "SHARD")["value"]), str(env(container(b), "SHARD")["value"]))
	})
	var shards []xnode
	for _, c := range cluster.Nodes {
		if c.XMLName.Local == "shard" {
			shards = append(shards, c)
		}
	}
	if len(shards) != len(shardSets) || len(shards) < 2 {
		t.Fatalf("remote_servers has %d shards, there are %d shard StatefulSets; want the same, at least 2", len(shards), len(shardSets))
	}
	for i, sts := range shardSets {
		c := container(sts)
		name := str(dig(sts, "metadata", "name"))
		if got, want := str(env(c, "SHARD")["value"]), fmt.Sprintf("%02d", i+1); got != want {
			t.Errorf("%s: SHARD %q, want %q", name, got, want)
		}
		if fp := dig(env(c, "REPLICA"), "valueFrom", "fieldRef", "fieldPath"); fp != "metadata.name" {
			t.Errorf("%s: REPLICA from %v, want the pod name", name, fp)
		}
		if shards[i].child("internal_replication").text() != "true" {
			t.Errorf("shard %d: internal_replication is not true", i+1)
		}
		var hosts []string
		for _, r := range shards[i].Nodes {
			if r.XMLName.Local == "replica" {
				hosts = append(hosts, r.child("host").text()+":"+r.child("port").text())
			}
		}
		var want []string
		for _, h := range podDNS(sts) {
			want = append(want, h+":9000")
		}
		if !slices.Equal(hosts, want) {
			t.Errorf("remote_servers shard %d lists %v; StatefulSet %s has pods %v", i+1, hosts, name, want)
		}
		pdb := get("PodDisruptionBudget/" + name)
		if !selects(dig(pdb, "spec", "selector", "matchLabels"), dig(sts, "spec", "template", "metadata", "labels")) {
			t.Errorf("PodDisruptionBudget %s does not select its shard's pods", name)
		}
	}

	// ZooKeeper nodes = the Keeper pods; raft ids = ordinal + 1.
	keeper := get("StatefulSet/clickhouse-keeper")
	keeperPods := podDNS(keeper)
	if len(keeperPods) < 3 || len(keeperPods)%2 == 0 {
		t.Errorf("%d Keeper replicas, want an odd number >= 3", len(keeperPods))
	}
	var zk []string
	for _, n := range server.child("zookeeper").Nodes {
		zk = append(zk, n.child("host").text()+":"+n.child("port").text())
	}
	ks := keeperConf.child("keeper_server")
	var wantZK, raft, wantRaft []string
	for i, h := range keeperPods {
		wantZK = append(wantZK, h+":"+ks.child("tcp_port").text())
		wantRaft = append(wantRaft, fmt.Sprintf("%d %s", i+1, h))
	}
	for _, s := range ks.child("raft_configuration").Nodes {
		raft = append(raft, s.child("id").text()+" "+s.child("hostname").text())
	}
	if !slices.Equal(zk, wantZK) {
		t.Errorf("cluster.xml zookeeper nodes %v, want the Keeper pods %v", zk, wantZK)
	}
	if !slices.Equal(raft, wantRaft) {
		t.Errorf("keeper raft_configuration %v, want %v", raft, wantRaft)
	}
	if ks.child("server_id").attr("from_env") != "KEEPER_ID" ||
		!strings.Contains(fmt.Sprint(container(keeper)["command"]), "KEEPER_ID=$(( ${HOSTNAME##*-} + 1 ))") {
		t.Errorf("Keeper server_id does not come from the pod ordinal + 1")
	}

	// The rollgate user's profile has the settings cluster.sql asks for.
	profile := users.path("profiles", "rollgate")
	if profile.child("insert_distributed_sync").text() != "1" || profile.child("load_balancing").text() != "in_order" {
		t.Errorf("profile rollgate: insert_distributed_sync %q, load_balancing %q; want 1 and in_order",
			profile.child("insert_distributed_sync").text(), profile.child("load_balancing").text())
	}
	for _, want := range []string{"insert_distributed_sync", "load_balancing"} {
		if !strings.Contains(string(sqlBytes), want) {
			t.Errorf("cluster.sql no longer mentions %s", want)
		}
	}
	user := users.path("users", "rollgate")
	if user.child("profile").text() != "rollgate" || user.child("password").attr("from_env") != "ROLLGATE_PASSWORD" {
		t.Errorf("user rollgate: profile %q, password from %q", user.child("profile").text(), user.child("password").attr("from_env"))
	}
	for _, sts := range shardSets {
		if ref := dig(env(container(sts), "ROLLGATE_PASSWORD"), "valueFrom", "secretKeyRef", "name"); ref == nil {
			t.Errorf("%s: ROLLGATE_PASSWORD not from a Secret", dig(sts, "metadata", "name"))
		}
	}

	// The gateways' DSN: the Service over the ClickHouse pods, user rollgate,
	// the database of cluster.sql.
	dsn, err := url.Parse(str(dig(get("Secret/rollgate-secrets"), "stringData", "ROLLGATE_CLICKHOUSE")))
	if err != nil {
		t.Fatal(err)
	}
	svcName, _, _ := strings.Cut(dsn.Hostname(), ".")
	svc := get("Service/" + svcName)
	if dsn.Hostname() != svcName+"."+ns {
		t.Errorf("DSN host %s is not a Service in namespace rollgate", dsn.Hostname())
	}
	if !selects(dig(svc, "spec", "selector"), dig(shardSets[0], "spec", "template", "metadata", "labels")) {
		t.Errorf("Service %s does not select the ClickHouse pods", svcName)
	}
	ports := fmt.Sprint(dig(svc, "spec", "ports"))
	if !strings.Contains(ports, "port:"+dsn.Port()) {
		t.Errorf("Service %s ports %s lack the DSN's %s", svcName, ports, dsn.Port())
	}
	if dsn.User.Username() != "rollgate" || dsn.Path != "/rollgate" || !strings.Contains(string(sqlBytes), "CREATE DATABASE IF NOT EXISTS rollgate ") {
		t.Errorf("DSN user %q database %q; want user rollgate and the database cluster.sql creates", dsn.User.Username(), dsn.Path)
	}
}
