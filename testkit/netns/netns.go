//go:build linux

// Package netns builds hosts for tests on one Linux machine: each host is a
// network namespace with its own address, joined to a bridge by a veth pair,
// and runs real processes (Host.Command). The links between hosts can be
// cut silently (packets dropped, no reset), made lossy, and healed; that is
// done by nftables rules in the bridge family on the test's bridge (in the
// forward path between hosts, and on the input and output of the test
// process's own address), so neither end's network stack is told anything:
// a connection across a cut link stays open, its packets vanish.
//
// It needs root (CI runs as root): New fails the test with that message
// otherwise, never skips. Everything it makes is named with the prefix
// "rgn" and the test process's id, removed at the test's end (t.Cleanup),
// and removed by the next New when that process no longer runs (a crashed
// or killed run). The kernel needs network namespaces, veth, bridges and
// nf_tables (bridge family, numgen); iproute2's ip must be on PATH. No
// traffic control (tc netem) is needed: latency comes from a Relay, a TCP
// relay on a host of its own that delays each chunk it forwards (the test
// kernels have no sch_netem). Host.Listen, ListenPacket and Dial make
// sockets in a host's namespace from the test process itself.
package netns

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Prefix starts the name of every namespace, link and nftables table this
// package makes.
const Prefix = "rgn"

// Net is a bridge and the hosts on it. Its methods are safe for concurrent
// use.
type Net struct {
	t      testing.TB
	id     string // Prefix + the process id
	bridge string
	subnet [3]byte // 10.a.b.0/24
	root   *Host   // the test process's own address on the bridge

	mu     sync.Mutex
	hosts  []*Host
	faults map[[2]int]int // (lower host index, higher) → loss percent (100: cut)
	nft    *nftables.Conn
	table  *nftables.Table
	chains []*nftables.Chain
}

// Host is one network namespace on the Net (or the test process's own
// namespace: Net.Root).
type Host struct {
	n    *Net
	idx  int
	Name string // as given to Net.Host
	NS   string // the namespace's name ("" for Root)
	IP   net.IP
}

// New builds an empty Net (the bridge, the test process's address on it,
// the nftables table) and removes what crashed earlier runs left. It fails
// the test when not root or when the kernel lacks what it needs.
func New(t testing.TB) *Net {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("netns: building hosts in network namespaces needs root (CI runs as root): run the test as root, e.g. sudo -E go test ...")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("netns: iproute2's ip not found on PATH (apt-get install iproute2): %v", err)
	}
	removeLeftovers(t)
	pid := os.Getpid()
	n := &Net{t: t, id: Prefix + strconv.Itoa(pid), faults: map[[2]int]int{}}
	n.bridge = n.id + "b"
	n.subnet = [3]byte{10, byte(100 + pid%100), byte(pid / 100 % 250)}
	t.Cleanup(n.Close)
	n.ip("link", "add", n.bridge, "type", "bridge")
	n.ip("addr", "add", n.addr(1)+"/24", "dev", n.bridge)
	n.ip("link", "set", n.bridge, "up")
	n.root = &Host{n: n, idx: 1, Name: "root", IP: net.ParseIP(n.addr(1)).To4()}
	nft, err := nftables.New()
	if err != nil {
		t.Fatalf("netns: opening nftables: %v", err)
	}
	n.nft = nft
	n.table = nft.AddTable(&nftables.Table{Family: nftables.TableFamilyBridge, Name: n.id})
	for _, hook := range []*nftables.ChainHook{nftables.ChainHookForward, nftables.ChainHookInput, nftables.ChainHookOutput} {
		n.chains = append(n.chains, nft.AddChain(&nftables.Chain{Name: fmt.Sprintf("h%d", *hook), Table: n.table,
			Type: nftables.ChainTypeFilter, Hooknum: hook, Priority: nftables.ChainPriorityFilter}))
	}
	if err := nft.Flush(); err != nil {
		t.Fatalf("netns: creating the nftables table %s (the kernel needs nf_tables with the bridge family): %v", n.id, err)
	}
	return n
}

// addr is the address of host number i (1 is the test process).
func (n *Net) addr(i int) string {
	return fmt.Sprintf("%d.%d.%d.%d", n.subnet[0], n.subnet[1], n.subnet[2], i)
}

// ip runs iproute2's ip and fails the test on an error.
func (n *Net) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("netns: ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// Root is the test process's own namespace, reachable from every host at
// its address on the bridge; links to it can be cut like any other.
func (n *Net) Root() *Host { return n.root }

// Host adds a host: a namespace with loopback up and an address on the
// bridge (10.x.y.N/24).
func (n *Net) Host(name string) *Host {
	n.t.Helper()
	n.mu.Lock()
	i := len(n.hosts) + 2
	n.mu.Unlock()
	if i > 250 {
		n.t.Fatalf("netns: at most 249 hosts")
	}
	h := &Host{n: n, idx: i, Name: name, NS: fmt.Sprintf("%s-%d-%s", n.id, i, name), IP: net.ParseIP(n.addr(i)).To4()}
	veth := fmt.Sprintf("%sv%d", n.id, i)
	n.ip("netns", "add", h.NS)
	n.ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", h.NS)
	n.ip("link", "set", veth, "master", n.bridge, "up")
	n.ip("-n", h.NS, "addr", "add", h.IP.String()+"/24", "dev", "eth0")
	n.ip("-n", h.NS, "link", "set", "eth0", "up")
	n.ip("-n", h.NS, "link", "set", "lo", "up")
	n.mu.Lock()
	n.hosts = append(n.hosts, h)
	n.mu.Unlock()
	return h
}

// Addr is host:port on this host's address.
func (h *Host) Addr(port int) string { return net.JoinHostPort(h.IP.String(), strconv.Itoa(port)) }

// Command is exec.Command running in the host's namespace (ip netns exec),
// killed if the test process dies (Pdeathsig).
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if h.NS == "" {
		cmd = exec.Command(name, args...)
	} else {
		cmd = exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// Cut drops every packet between a and b, both ways, silently: no reset,
// no ICMP error; connections between them stay open and stall.
func (n *Net) Cut(a, b *Host) { n.set(a, b, 100) }

// Loss drops pct percent of the packets between a and b, both ways, at
// random (0 heals).
func (n *Net) Loss(a, b *Host, pct int) { n.set(a, b, pct) }

// Heal restores the link between a and b.
func (n *Net) Heal(a, b *Host) { n.set(a, b, 0) }

// Isolate cuts h from every other host and from the test process (a host
// that vanished from the network: a machine powered off, its kernel sends
// nothing any more).
func (n *Net) Isolate(h *Host) {
	n.mu.Lock()
	others := append([]*Host{n.root}, n.hosts...)
	n.mu.Unlock()
	for _, o := range others {
		if o != h {
			n.Cut(h, o)
		}
	}
}

// HealAll restores every link.
func (n *Net) HealAll() {
	n.mu.Lock()
	clear(n.faults)
	n.mu.Unlock()
	n.apply()
}

func (n *Net) set(a, b *Host, pct int) {
	n.t.Helper()
	if pct < 0 || pct > 100 {
		n.t.Fatalf("netns: loss %d%% out of 0..100", pct)
	}
	k := [2]int{min(a.idx, b.idx), max(a.idx, b.idx)}
	n.mu.Lock()
	if pct == 0 {
		delete(n.faults, k)
	} else {
		n.faults[k] = pct
	}
	n.mu.Unlock()
	n.apply()
}

// apply replaces the rules of every chain by those of the current faults,
// in one nftables transaction.
func (n *Net) apply() {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.chains {
		n.nft.FlushChain(c)
		for k, pct := range n.faults {
			for _, dir := range [][2]int{{k[0], k[1]}, {k[1], k[0]}} {
				n.nft.AddRule(&nftables.Rule{Table: n.table, Chain: c, Exprs: dropRule(net.ParseIP(n.addr(dir[0])).To4(), net.ParseIP(n.addr(dir[1])).To4(), pct)})
			}
		}
	}
	if err := n.nft.Flush(); err != nil {
		n.t.Fatalf("netns: updating the nftables rules: %v", err)
	}
}

// dropRule drops IPv4 packets from src to dst, pct percent of them at
// random (numgen) when below 100.
func dropRule(src, dst net.IP, pct int) []expr.Any {
	e := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x08, 0x00}}, // ETH_P_IP
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: src},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dst},
	}
	if pct < 100 {
		lim := make([]byte, 4)
		binary.NativeEndian.PutUint32(lim, uint32(pct))
		e = append(e,
			&expr.Numgen{Register: 1, Modulus: 100, Type: 1 /* NFT_NG_RANDOM */},
			&expr.Cmp{Op: expr.CmpOpLt, Register: 1, Data: lim})
	}
	return append(e, &expr.Verdict{Kind: expr.VerdictDrop})
}

// Close removes the hosts (killing what still runs in them), the bridge
// and the nftables table. It runs at the test's end.
func (n *Net) Close() {
	n.mu.Lock()
	hosts := n.hosts
	n.hosts = nil
	n.mu.Unlock()
	for _, h := range hosts {
		killIn(h.NS)
		// The host's end of the pair goes with its namespace only once the
		// killed processes have exited (SIGKILL is not waited for): delete
		// the bridge's end, which takes the pair with it at once.
		_ = exec.Command("ip", "link", "del", fmt.Sprintf("%sv%d", n.id, h.idx)).Run()
		_ = exec.Command("ip", "netns", "del", h.NS).Run()
	}
	_ = exec.Command("ip", "link", "del", n.bridge).Run()
	if n.nft != nil {
		n.nft.DelTable(n.table)
		_ = n.nft.Flush()
	}
}

// killIn kills every process in namespace ns (ip netns pids).
func killIn(ns string) {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// removeLeftovers removes the namespaces, links and tables of runs whose
// process no longer runs.
func removeLeftovers(t testing.TB) {
	dead := func(name string) bool {
		rest := strings.TrimPrefix(name, Prefix)
		end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
		if end < 0 {
			end = len(rest)
		}
		pid, err := strconv.Atoi(rest[:end])
		if err != nil || !strings.HasPrefix(name, Prefix) {
			return false
		}
		return syscall.Kill(pid, 0) == syscall.ESRCH
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && dead(f[0]) {
			killIn(f[0])
			if b, err := exec.Command("ip", "netns", "del", f[0]).CombinedOutput(); err != nil {
				t.Logf("netns: removing the leftover namespace %s: %v %s", f[0], err, bytes.TrimSpace(b))
			}
		}
	}
	out, _ = exec.Command("ip", "-o", "link", "show").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if dead(name) {
			_ = exec.Command("ip", "link", "del", name).Run()
		}
	}
	if nft, err := nftables.New(); err == nil {
		if tables, err := nft.ListTablesOfFamily(nftables.TableFamilyBridge); err == nil {
			for _, tb := range tables {
				if dead(tb.Name) {
					nft.DelTable(tb)
				}
			}
			_ = nft.Flush()
		}
	}
}
