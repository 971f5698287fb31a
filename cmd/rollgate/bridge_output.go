package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/controlplane"
	"github.com/rollgate/rollgate/controlplane/lease"
	"github.com/rollgate/rollgate/export"
	bridge "github.com/rollgate/rollgate/trainer-bridge"
)

// Where rollgate bridge's samples go: a file (streamed, or written whole),
// stdout, or the lease API (--serve).

// streamSamples builds and writes JSONL or Parquet sample by sample, to a
// temporary file renamed into place at the end (or to stdout for "-").
func streamSamples(ctx context.Context, store export.Store, o bridge.Options, path, format string, stdout io.Writer) (*bridge.Result, error) {
	newWriter := bridge.NewJSONLWriter
	if format == "parquet" {
		po := bridge.ParquetOptions{OmitLogprobs: omitLogprobs(o)}
		newWriter = func(w io.Writer) bridge.SampleWriter { return bridge.NewParquetWriter(w, po) }
	}
	var res *bridge.Result
	build := func(out io.Writer) error {
		w := newWriter(out)
		o.Emit = w.Write
		var err error
		if res, err = bridge.Build(ctx, store, o); err != nil {
			return err
		}
		return w.Close()
	}
	var err error
	if path == "-" {
		err = build(stdout)
	} else {
		err = replaceOutput(path, func(f *os.File) error { return build(f) })
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// replaceOutput writes path with write, to a temporary file (createOutput)
// renamed into place once written and closed, so a reader never sees half
// a batch.
func replaceOutput(path string, write func(f *os.File) error) error {
	tmp, err := createOutput(path)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	err = write(tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// createOutput creates the temporary file a batch is written to before it
// is renamed to path, in path's folder, with mode 0666 less the umask (as
// any file a command writes; os.CreateTemp's 0600 would make the batch
// unreadable to the trainer's other users whatever the umask says).
func createOutput(path string) (*os.File, error) {
	dir := filepath.Dir(path)
	for range 100 {
		name := filepath.Join(dir, ".bridge-"+strconv.FormatUint(rand.Uint64(), 36))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("creating output: %w", err)
		}
		return f, nil
	}
	return nil, fmt.Errorf("creating output in %s: no free temporary name", dir)
}

// writeSamples writes a batch built whole to path (replaceOutput), or as
// JSONL to stdout for "-".
func writeSamples(path, format string, to bridge.TensorOptions, stdout io.Writer, samples []*bridge.Sample) (bridge.TensorStats, error) {
	var ts bridge.TensorStats
	if path == "-" {
		return ts, bridge.WriteJSONL(stdout, samples)
	}
	err := replaceOutput(path, func(f *os.File) error {
		var err error
		switch format {
		case "parquet":
			err = bridge.WriteParquet(f, samples, bridge.ParquetOptions{OmitLogprobs: to.OmitLogprobs})
		case "safetensors":
			ts, err = bridge.WriteSafetensors(f, samples, to)
		default:
			err = bridge.WriteJSONL(f, samples)
		}
		return err
	})
	return ts, err
}

// serveSamples runs the lease API on addr until every sample is acknowledged
// or SIGINT/SIGTERM arrives; with an admin token every request needs it
// (controlplane.AdminAuthorized, as serve's /api/v1).
func serveSamples(addr string, ttl time.Duration, adminToken string, samples []*bridge.Sample, stderr io.Writer) error {
	q := lease.New(ttl, nil)
	for i, s := range samples {
		b, err := json.Marshal(s)
		if err != nil {
			return fmt.Errorf("encoding sample %d: %w", i, err)
		}
		q.Add(b)
	}
	ln, err := listen("--serve", addr)
	if err != nil {
		return err
	}
	handler := func(ctx *fasthttp.RequestCtx) {
		if controlplane.AdminAuthorized(ctx, adminToken, "lease API route") {
			q.Serve(ctx, string(ctx.Path()))
		}
	}
	srv := &fasthttp.Server{Handler: handler,
		ReadTimeout: 10 * time.Second, MaxRequestBodySize: 1 << 20, NoDefaultServerHeader: true}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	defer srv.Shutdown()
	fmt.Fprintf(stderr, "bridge: serving %d samples on http://%s (POST /lease {\"n\":N}, POST /ack {\"lease_id\":...})\n", len(samples), ln.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-sig:
			c := q.Counts()
			fmt.Fprintf(stderr, "bridge: stopped with %d samples pending, %d leased, %d acknowledged\n", c.Pending, c.Leased, c.Acked)
			return nil
		case <-tick.C:
			if c := q.Counts(); c.Acked == len(samples) {
				fmt.Fprintf(stderr, "bridge: all %d samples acknowledged\n", c.Acked)
				return nil
			}
		}
	}
}
