package spool

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"
)

// Environment of the child process TestKilledProcessLosesNothingAcknowledged starts.
const (
	childDirEnv  = "ROLLGATE_SPOOL_TEST_CHILD_DIR"
	childSyncEnv = "ROLLGATE_SPOOL_TEST_CHILD_SYNC"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(childDirEnv); dir != "" {
		os.Exit(runChild(dir, os.Getenv(childSyncEnv)))
	}
	os.Exit(m.Run())
}

// runChild spools batches 0, 1, 2, ... to dir with the sink down and prints
// the index of each batch Write acknowledged, until it is killed.
func runChild(dir, syncInterval string) int {
	every, err := time.ParseDuration(syncInterval)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	sink := newMemSink()
	sink.setDown(true)
	s, err := New(Config{Dir: dir, SyncInterval: every, RetryMin: time.Hour, RetryMax: time.Hour}, sink, "child", nil, quietLog())
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	for i := 0; ; i++ {
		if err := s.Write(context.Background(), batch(i)); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		fmt.Fprintf(os.Stdout, "%d\n", i) // one write(2), unbuffered
	}
}

// A process killed with SIGKILL while spooling loses no batch whose Write
// returned: every acknowledged batch is replayed, in order, after a restart.
func TestKilledProcessLosesNothingAcknowledged(t *testing.T) {
	for _, syncInterval := range []string{"0s", "50ms"} {
		t.Run("sync="+syncInterval, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childDirEnv+"="+dir, childSyncEnv+"="+syncInterval)
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			const killAfter = 150
			acked := 0
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				n, err := strconv.Atoi(sc.Text())
				if err != nil || n != acked {
					t.Fatalf("child printed %q after %d acks", sc.Text(), acked)
				}
				acked++
				if acked == killAfter {
					if err := cmd.Process.Kill(); err != nil {
						t.Fatal(err)
					}
				}
			}
			_ = cmd.Wait()
			if acked < killAfter {
				t.Fatalf("child stopped after %d acks, before the kill", acked)
			}

			sink := newMemSink()
			sink.setDown(true)
			s := open(t, fastConfig(dir), sink)
			st := s.Stats()
			if st.Records < acked || st.Records > acked+1 {
				t.Fatalf("recovered %d records; %d were acknowledged (at most one more may have been written)", st.Records, acked)
			}
			sink.setDown(false)
			drain(t, s)
			got := sink.rows()
			if !slices.Equal(got[:min(len(got), 2*acked)], wantRows(acked)) {
				t.Fatalf("replayed rows do not start with the %d acknowledged batches: %v", acked, got)
			}
			t.Logf("SIGKILL after %d acknowledged batches: %d recovered (%d unacknowledged extra), 0 lost; torn records discarded: %d",
				acked, st.Records, st.Records-acked, st.CorruptRecords)
		})
	}
}
