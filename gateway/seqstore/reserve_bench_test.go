package seqstore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// processCPU is this process's user and system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkReserveNewAttempts: the first reservation of new attempts from
// 32 callers at once on a SQLite file (as 32 agents starting rollouts),
// each rollout id a random UUID, so every reservation writes a new row at a
// random place of the key. ROLLGATE_BENCH_PREFILL=N first fills the table
// with N attempts (a gateway that has run a while). Reports the process's
// CPU per reservation (most of it SQLite's commit and its fsync) beside the
// wall time.
//
//	ROLLGATE_BENCH_PREFILL=200000 go test -run XXX -bench BenchmarkReserveNewAttempts -benchtime 20000x ./gateway/seqstore/
func BenchmarkReserveNewAttempts(b *testing.B) {
	ctx := context.Background()
	s, err := OpenSQLite(ctx, filepath.Join(b.TempDir(), "seq.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	uuid := func(i int) string {
		h := uint64(i)*0x9e3779b97f4a7c15 ^ 0xd1b54a32d192ed03
		h ^= h >> 29
		h *= 0xbf58476d1ce4e5b9
		return fmt.Sprintf("%08x-%04x-4%03x-a%03x-%012x", uint32(h>>32), uint16(h>>16), uint16(h)&0xfff, uint16(h>>20)&0xfff, h&0xffffffffffff)
	}
	if n, _ := strconv.Atoi(os.Getenv("ROLLGATE_BENCH_PREFILL")); n > 0 {
		var wg sync.WaitGroup
		var next atomic.Int64
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1)); i <= n; i = int(next.Add(1)) {
					if _, err := s.Reserve(ctx, uuid(-i), "a1"); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	const callers = 32
	var next atomic.Int64
	var wg sync.WaitGroup
	cpu0 := processCPU(b)
	b.ResetTimer()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)); i <= b.N; i = int(next.Add(1)) {
				if _, err := s.Reserve(ctx, uuid(i), "a1"); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}
