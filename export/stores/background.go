package stores

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
)

// States of a store, as Background.State and /readyz report them.
const (
	// StateConnecting: the first connection attempt has not finished yet.
	StateConnecting = "connecting"
	// StateUp: connected, and the last write (if any) succeeded.
	StateUp = "up"
	// StateDown: the last connection attempt or write failed.
	StateDown = "down"
)

// ErrUnavailable is wrapped by every read and write of a Background store
// made before it is connected. The gateway answers such requests with 503.
var ErrUnavailable = errors.New("store not connected yet")

// BackgroundOptions tune Background. Zero values take the documented defaults.
type BackgroundOptions struct {
	// ClickHouse are the store's options. Its DialTimeout defaults to 5s
	// here (not clickhouse-go's 30s), so that a black-holed server is
	// retried at a steady pace.
	ClickHouse clickhouse.Options
	// RetryMin and RetryMax bound the exponential backoff between
	// connection attempts (defaults 200ms and 10s).
	RetryMin, RetryMax time.Duration
	// OnUp, when set, is called (on the connecting goroutine) once the
	// store is connected, e.g. to tell a spool to replay now.
	OnUp func()
}

// Background is a ClickHouse export.Store that connects in the background:
// OpenBackground returns at once and a goroutine calls clickhouse.Open
// (connection and schema creation) until it succeeds, with exponential
// backoff, logging every failure. Until then every read and write fails
// fast with an error wrapping ErrUnavailable, so a spool in front of it
// keeps the captured rows and replays them once it is up. It is safe for
// concurrent use.
type Background struct {
	dsn  string
	log  *slog.Logger
	opt  BackgroundOptions
	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex
	store    *clickhouse.Store // nil until connected
	state    string
	lastErr  error
	since    time.Time // when connecting started
	attempts int
}

var (
	_ export.Store             = (*Background)(nil)
	_ export.OnceWriter        = (*Background)(nil)
	_ export.BulkRolloutReader = (*Background)(nil)
)

// OpenBackground checks dsn (a mistake in it is an error at once) and starts
// connecting to ClickHouse in the background; see Background.
func OpenBackground(dsn string, opt BackgroundOptions, log *slog.Logger) (*Background, error) {
	if err := clickhouse.CheckDSN(dsn); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	if opt.ClickHouse.DialTimeout <= 0 {
		opt.ClickHouse.DialTimeout = 5 * time.Second
	}
	if opt.ClickHouse.Logger == nil {
		opt.ClickHouse.Logger = log
	}
	if opt.RetryMin <= 0 {
		opt.RetryMin = 200 * time.Millisecond
	}
	if opt.RetryMax < opt.RetryMin {
		opt.RetryMax = max(10*time.Second, opt.RetryMin)
	}
	b := &Background{dsn: dsn, log: log, opt: opt, stop: make(chan struct{}), done: make(chan struct{}),
		state: StateConnecting, since: time.Now()}
	go b.connect()
	return b, nil
}

// connect calls clickhouse.Open until it succeeds or Close is called.
func (b *Background) connect() {
	defer close(b.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-b.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	backoff := b.opt.RetryMin
	for {
		s, err := clickhouse.Open(ctx, b.dsn, b.opt.ClickHouse)
		b.mu.Lock()
		b.attempts++
		attempts := b.attempts
		if err == nil {
			b.store, b.state, b.lastErr = s, StateUp, nil
			b.mu.Unlock()
			b.log.Info("store connected", "store", "clickhouse", "attempts", attempts, "after", time.Since(b.since).Round(time.Millisecond))
			if b.opt.OnUp != nil {
				b.opt.OnUp()
			}
			return
		}
		b.state, b.lastErr = StateDown, err
		b.mu.Unlock()
		select {
		case <-b.stop:
			return
		default:
		}
		b.log.Warn("store: cannot connect to ClickHouse yet; captured calls are spooled meanwhile (start ClickHouse or fix --clickhouse)",
			"attempt", attempts, "retry_in", backoff, "err", err)
		select {
		case <-time.After(backoff):
		case <-b.stop:
			return
		}
		backoff = min(2*backoff, b.opt.RetryMax)
	}
}

// State is StateConnecting, StateUp or StateDown (see their docs).
func (b *Background) State() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Store returns the connected ClickHouse store, or nil while connecting.
func (b *Background) Store() *clickhouse.Store {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.store
}

// get returns the store, or an error wrapping ErrUnavailable that says why.
func (b *Background) get() (*clickhouse.Store, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.store != nil {
		return b.store, nil
	}
	why := "first attempt in progress"
	if b.lastErr != nil {
		why = "last error: " + b.lastErr.Error()
	}
	return nil, fmt.Errorf("%w: ClickHouse %s, connecting in the background for %s after %d attempts (%s); retry later, GET /readyz shows the store's state",
		ErrUnavailable, clickhouse.RedactDSN(b.dsn), time.Since(b.since).Round(time.Second), b.attempts, why)
}

// note records the outcome of a write for State.
func (b *Background) note(err error) {
	b.mu.Lock()
	if err != nil {
		b.state = StateDown
	} else {
		b.state = StateUp
	}
	b.mu.Unlock()
}

// Name returns "clickhouse".
func (b *Background) Name() string { return "clickhouse" }

// Write implements export.Sink.
func (b *Background) Write(ctx context.Context, batch *export.Batch) error {
	s, err := b.get()
	if err != nil {
		return err
	}
	err = s.Write(ctx, batch)
	b.note(err)
	return err
}

// WriteOnce implements export.OnceWriter.
func (b *Background) WriteOnce(ctx context.Context, batch *export.Batch) error {
	s, err := b.get()
	if err != nil {
		return err
	}
	err = s.WriteOnce(ctx, batch)
	b.note(err)
	return err
}

// Query implements export.Store.
func (b *Background) Query(ctx context.Context, query string) (*export.Result, error) {
	s, err := b.get()
	if err != nil {
		return nil, err
	}
	return s.Query(ctx, query)
}

// QueryEach implements export.RowStreamer.
func (b *Background) QueryEach(ctx context.Context, query string, f func(row []string) error) error {
	s, err := b.get()
	if err != nil {
		return err
	}
	return s.QueryEach(ctx, query, f)
}

// Calls implements export.Store.
func (b *Background) Calls(ctx context.Context, f export.CallFilter) ([]export.Call, error) {
	s, err := b.get()
	if err != nil {
		return nil, err
	}
	return s.Calls(ctx, f)
}

// Call implements export.Store.
func (b *Background) Call(ctx context.Context, k export.CallKey) (*export.Call, error) {
	s, err := b.get()
	if err != nil {
		return nil, err
	}
	return s.Call(ctx, k)
}

// Rollout implements export.Store.
func (b *Background) Rollout(ctx context.Context, rolloutID string) (*export.RolloutDetail, error) {
	s, err := b.get()
	if err != nil {
		return nil, err
	}
	return s.Rollout(ctx, rolloutID)
}

// ReadRollout implements export.Store.
func (b *Background) ReadRollout(ctx context.Context, rolloutID string, opt export.ReadOptions) (*export.RolloutDetail, error) {
	s, err := b.get()
	if err != nil {
		return nil, err
	}
	return s.ReadRollout(ctx, rolloutID, opt)
}

// TrainingSteps implements export.Store.
func (b *Background) TrainingSteps(ctx context.Context, q export.TrainingQuery) ([]export.TrainingStep, error) {
	s, err := b.get()
	if err != nil {
		return nil, err
	}
	return s.TrainingSteps(ctx, q)
}

// Rollouts implements export.BulkRolloutReader.
func (b *Background) Rollouts(ctx context.Context, ids []string, opt export.ReadOptions) (map[string]*export.RolloutDetail, error) {
	s, err := b.get()
	if err != nil {
		return nil, err
	}
	return s.Rollouts(ctx, ids, opt)
}

// Close stops connecting and closes the store if it was connected.
func (b *Background) Close() error {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	<-b.done
	if s := b.Store(); s != nil {
		return s.Close()
	}
	return nil
}
