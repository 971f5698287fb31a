package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreePort returns a loopback TCP port that was free a moment ago, for a
// server a test starts as a process (which binds it itself). It is chosen
// below the kernel's ephemeral range (net.ipv4.ip_local_port_range), so the
// outgoing connections and ":0" listeners of tests running in parallel can
// never be given it between this check and the server's bind: a port from
// ":0" could (a cluster member then failed with "Address already in use").
func FreePort() (int, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 12000 {
				low = v
			}
		}
	}
	const first = 10000
	for range 200 {
		p := first + rand.IntN(low-first)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue // taken: try another
		}
		l.Close()
		return p, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0") // every try taken: fall back to the kernel's choice
	if err != nil {
		return 0, fmt.Errorf("test server: no free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
