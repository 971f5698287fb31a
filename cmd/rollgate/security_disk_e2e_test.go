package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// lockSQLite holds the write lock of the SQLite store at path, as a long
// transaction of another process would: the gateway's capture writes wait
// (the spool in front of the store spills after its 5 s direct timeout).
// release ends it.
func lockSQLite(t *testing.T, path string) (release func()) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_busy_timeout=10000")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, _ = conn.ExecContext(ctx, "ROLLBACK")
			conn.Close()
			db.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// callMany makes n calls (every other one streamed) with prompts "<tag> call
// <i>: <extra>" from 8 agents, and fails unless every one is answered.
func callMany(t *testing.T, addr, tag string, n int, extra string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan string, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				stream := i%2 == 1
				body := fmt.Sprintf(`{"model":"mock-model","messages":[{"role":"user","content":"%s call %d: %s"}],"stream":%v}`, tag, i, extra, stream)
				req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("x-mock-tokens", "8")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs <- err.Error()
					continue
				}
				var b bytes.Buffer
				_, _ = b.ReadFrom(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || (stream && !strings.Contains(b.String(), "[DONE]")) {
					errs <- fmt.Sprintf("call %d: %d %s", i, resp.StatusCode, truncateForLog(b.String()))
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatalf("%s: %s", tag, e)
	}
}

// kill SIGKILLs the gateway and waits for it to be gone.
func kill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// flipAt xors one byte of the file at path.
func flipAt(t *testing.T, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0x20
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// oneFile is the one file of dir matching pattern.
func oneFile(t *testing.T, dir, pattern string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, pattern))
	if len(m) != 1 {
		all, _ := os.ReadDir(dir)
		t.Fatalf("want one %s in %s, found %v (folder holds %v)", pattern, dir, m, all)
	}
	return m[0]
}

// lockedGateway is a gateway with a spool and a SQLite store whose write
// lock the test holds (release ends it), and how to start it again.
type lockedGateway struct {
	spoolDir, db, addr string
	args               []string
	g                  *exec.Cmd
	release            func()
}

func startLocked(t *testing.T) lockedGateway {
	t.Helper()
	dir := t.TempDir()
	d := lockedGateway{spoolDir: filepath.Join(dir, "spool"), db: filepath.Join(dir, "store", "q.db"), addr: freeAddr(t)}
	d.args = []string{"serve", "--listen", d.addr, "--db", d.db, "--spool-dir", d.spoolDir, "--log-level", "warn"}
	d.g, _ = start(t, d.addr, "/readyz", d.args...)
	d.release = lockSQLite(t, d.db)
	return d
}

// TestWALDamageKeepsTheRest: SIGKILL with calls waiting in the capture WAL
// (the store is locked), one flipped byte in the WAL segment, restart:
// every call but the damaged one is stored, the damage is counted and kept
// in a quarantine file. On main a payload byte at 10 % lost every record
// after it, a magic byte all of them.
func TestWALDamageKeepsTheRest(t *testing.T) {
	f := func(name string, where func(size int64) int64) {
		t.Run(name, func(t *testing.T) {
			d := startLocked(t)
			spoolDir, db, addr, args, g, release := d.spoolDir, d.db, d.addr, d.args, d.g, d.release
			const n = 40
			callMany(t, addr, "wal", n, "hello")
			// Killed before the spool's direct write times out (5 s): every
			// call is in the WAL only.
			_, rb := readyzBody(t, addr)
			if p := rb.Get("wal_pending").Int(); p != n {
				t.Fatalf("wal_pending = %d before the kill, want %d (the calls waiting for the locked store)", p, n)
			}
			kill(t, g)
			release()
			seg := oneFile(t, filepath.Join(spoolDir, "wal"), "*.wal")
			fi, _ := os.Stat(seg)
			flipAt(t, seg, where(fi.Size()))

			_, logs := start(t, addr, "/readyz", args...)
			stored := 0
			waitUntil(t, fmt.Sprintf("at least %d of %d calls stored after the restart", n-1, n), 20*time.Second, func() bool {
				stored = sqlCount(t, db, "SELECT count(*) FROM llm_calls")
				return stored >= n-1
			})
			if c := metricSum(t, addr, "rollgate_capture_wal_corrupt_records_total"); c < 1 {
				t.Errorf("rollgate_capture_wal_corrupt_records_total = %v, want 1+", c)
			}
			q := oneFile(t, filepath.Join(spoolDir, "wal"), "*.quarantine")
			if qi, err := os.Stat(q); err != nil || qi.Mode().Perm() != 0o600 {
				t.Errorf("quarantine file %s: mode %v, %v; want 0600", q, qi.Mode(), err)
			}
			if !strings.Contains(logs.String(), "damaged region set aside") {
				t.Errorf("no log of the damage:\n%s", logs)
			}
		})
	}
	f("payload byte at a tenth", func(size int64) int64 { return size / 10 })
	f("magic byte", func(int64) int64 { return 2 })
}

// TestSpoolDamageKeepsLaterBatches: the store is locked long enough for
// three waves of calls to be spooled, SIGKILL, one flipped byte in the first
// wave's record, restart: the later waves are stored, the damage counted
// (corrupt records, dropped rows) and quarantined. On main the segment was
// truncated at the damaged record (the later batches lost) and
// rollgate_spool_dropped_rows_total stayed 0.
func TestSpoolDamageKeepsLaterBatches(t *testing.T) {
	d := startLocked(t)
	spoolDir, db, addr, args, g, release := d.spoolDir, d.db, d.addr, d.args, d.g, d.release
	const n = 10
	records := int64(0)
	for w := 1; w <= 3; w++ {
		callMany(t, addr, fmt.Sprintf("wave-%d", w), n, "spooled")
		waitUntil(t, fmt.Sprintf("wave %d spooled", w), 30*time.Second, func() bool {
			_, rb := readyzBody(t, addr)
			r := rb.Get("spool_records").Int()
			ok := r > records && rb.Get("wal_pending").Int() == 0
			if ok {
				records = r
			}
			return ok
		})
	}
	kill(t, g)
	release()
	seg := oneFile(t, filepath.Join(spoolDir, "sqlite"), "*.seg")
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, []byte("wave-1 call"))
	if at < 0 {
		t.Fatal("wave 1 not in the spool segment")
	}
	flipAt(t, seg, int64(at)+2)

	start(t, addr, "/readyz", args...)
	waitUntil(t, "waves 2 and 3 stored after the restart", 20*time.Second, func() bool {
		return sqlCount(t, db, "SELECT count(*) FROM llm_calls WHERE request_body LIKE '%wave-2 call%' OR request_body LIKE '%wave-3 call%'") == 2*n
	})
	if c := metricSum(t, addr, "rollgate_spool_corrupt_records_total"); c < 1 {
		t.Errorf("rollgate_spool_corrupt_records_total = %v, want 1+", c)
	}
	if d := metricSum(t, addr, "rollgate_spool_dropped_rows_total"); d < 1 {
		t.Errorf("rollgate_spool_dropped_rows_total = %v, want the damaged record's rows", d)
	}
	oneFile(t, filepath.Join(spoolDir, "sqlite"), "*.quarantine")
}

// TestDiskHoldsNoSecretAndIsPrivate: with a redact: rule, no file the
// gateway writes (WAL, spool) holds the secret while it runs with calls
// waiting, and every file and folder it creates is 0600 / 0700. On main
// the WAL held the raw sk-… key, and files were 0644 in 0755 folders.
func TestDiskHoldsNoSecretAndIsPrivate(t *testing.T) {
	const secret = "sk-abcdefghijklmnopqrstuvwxyz0123"
	dir := t.TempDir()
	spoolDir, storeDir := filepath.Join(dir, "spool"), filepath.Join(dir, "store")
	db := filepath.Join(storeDir, "q.db")
	if err := os.Mkdir(storeDir, 0o700); err != nil { // the sequence store opens first and does not create it
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cfg, _ := yaml.Marshal(map[string]any{
		"redact": []map[string]any{{"name": "api-keys", "pattern": `sk-[A-Za-z0-9]{20,}`, "replacement": "[REDACTED_KEY]"}}})
	cfgPath := filepath.Join(dir, "rollgate.yaml")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, addr, "/readyz", "serve", "--config", cfgPath, "--listen", addr, "--db", db, "--spool-dir", spoolDir, "--log-level", "warn")
	// The secret as text: followed by the closing quote of the JSON string
	// it is in. (The mock engine's tokenizer is byte-level, and a prompt
	// token id below 128 is one byte in the WAL's and spool's varints, so
	// the prompt's ids spell an ASCII prompt byte for byte; token ids are
	// training data and never redacted.)
	asText := []byte(secret + `"`)
	// The calls are stored at once, but a WAL segment keeps its records
	// until it is full and acknowledged: grep while the gateway runs.
	callMany(t, addr, "secret", 6, "my key is "+secret)
	waitUntil(t, "the calls stored", 15*time.Second, func() bool {
		return sqlCount(t, db, "SELECT count(*) FROM llm_calls") == 6
	})
	if out := runCmd(t, "sql", "--db", db, "SELECT request_body FROM llm_calls"); !strings.Contains(out, "[REDACTED_KEY]") {
		t.Fatalf("rows not redacted:\n%s", out)
	}
	files := 0
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		files++
		if b, _ := os.ReadFile(p); bytes.Contains(b, asText) {
			t.Errorf("%s holds the raw secret while the gateway runs", p)
		}
		return nil
	})
	if wal, _ := filepath.Glob(filepath.Join(spoolDir, "wal", "*.wal")); len(wal) == 0 {
		t.Fatalf("no WAL segment on disk to check (%d files)", files)
	}

	t.Run("files 0600, folders 0700", func(t *testing.T) {
		seen := 0
		for _, root := range []string{spoolDir, storeDir} {
			_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				fi, err := os.Lstat(p)
				if err != nil {
					return nil // removed meanwhile
				}
				want := fs.FileMode(0o600)
				if d.IsDir() {
					want = 0o700
				}
				if fi.Mode().Perm() != want {
					t.Errorf("%s: mode %04o, want %04o", p, fi.Mode().Perm(), want)
				}
				seen++
				return nil
			})
		}
		if seen < 6 { // spool, its sqlite and wal folders, LOCK, a WAL segment, the store folder and file
			t.Fatalf("only %d files and folders checked", seen)
		}
	})
}

// TestSpoolFolderRefused: serve refuses, at start and naming the folder and
// the fix, a spool folder holding a symbolic link, one writable by group or
// others, and one another user owns. On main all three were used (a link
// named ack.tmp was followed and its target truncated).
func TestSpoolFolderRefused(t *testing.T) {
	f := func(name string, prepare func(t *testing.T, spoolDir string), want string) {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			spoolDir := filepath.Join(dir, "spool")
			if err := os.MkdirAll(filepath.Join(spoolDir, "sqlite"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(spoolDir, 0o700); err != nil {
				t.Fatal(err)
			}
			prepare(t, spoolDir)
			addr := freeAddr(t)
			cmd := exec.Command(binary, "serve", "--listen", addr, "--db", filepath.Join(dir, "q.db"), "--spool-dir", spoolDir)
			var out syncBuffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var exit error
			exited := false
			waitUntil(t, "serve to exit or come up", 20*time.Second, func() bool {
				select {
				case exit = <-done:
					exited = true
					return true
				default:
				}
				r, err := http.Get("http://" + addr + "/readyz")
				if err == nil {
					r.Body.Close()
					return r.StatusCode == 200
				}
				return false
			})
			if !exited {
				t.Fatalf("serve started with the spool folder %s (%s)\n%s", spoolDir, name, out.String())
			}
			if exit == nil || !strings.Contains(out.String(), want) {
				t.Fatalf("serve exit %v; want an error containing %q:\n%s", exit, want, out.String())
			}
		})
	}
	target := filepath.Join(t.TempDir(), "precious")
	f("symbolic link inside", func(t *testing.T, spoolDir string) {
		if err := os.WriteFile(target, []byte("precious"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(spoolDir, "sqlite", "ack.tmp")); err != nil {
			t.Fatal(err)
		}
	}, "ack.tmp is a symbolic link")
	if b, err := os.ReadFile(target); err != nil || string(b) != "precious" {
		t.Errorf("the link's target changed: %q %v", b, err)
	}
	f("writable by group", func(t *testing.T, spoolDir string) {
		if err := os.Chmod(spoolDir, 0o770); err != nil {
			t.Fatal(err)
		}
	}, "is writable by group or others (mode 0770)")
	if os.Geteuid() == 0 {
		f("owned by another user", func(t *testing.T, spoolDir string) {
			if err := os.Chown(spoolDir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, "is owned by another user (uid 65534")
	} else { // root's own folder, as a user may not give a folder away
		f("owned by another user", func(t *testing.T, spoolDir string) {
			if err := os.RemoveAll(spoolDir); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/usr", spoolDir); err != nil {
				t.Fatal(err)
			}
		}, "is owned by another user (uid 0")
	}
}
