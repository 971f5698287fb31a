package clickhouse

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2"
)

// The bulk read of llm_calls (readCalls) takes the server's native column
// blocks as they come, through ch-go's protocol package: an Array(UInt32) of
// 640 ids arrives as 2,560 bytes copied into a []uint32, where
// clickhouse-go's row Scan builds the slice by reflection element by element
// and the text route (toString, still used by Query) costs the server
// ≈ 15 µs per call to format (bench/RESULTS.md §5b).
//
// ch-go's own client is not used: it leaves the client info out of a query
// sent to a server older than protocol revision 54420 (ch-go v0.74
// proto/query.go writes it only from FeatureClientWriteInfo, 54420, where
// ClickHouse reads it from revision 54032 on), so ClickHouse 18.16 (54412)
// misreads the query ("Unknown setting"). This client speaks the protocol at
// a fixed revision, nativeRevision, which servers from 18.16 on accept: no
// settings, no compression, no parameters; results are read-only.

// nativeRevision is the protocol revision the native reader announces:
// ClickHouse 18.16's. It has LowCardinality columns sent as such (54405),
// the version patch and quota key in the client info, and none of the later
// packets (profile events, custom serialization, settings as strings).
const nativeRevision = 54412

// nativeClientName is the client name in the hello and the query's client
// info (system.query_log's client_name).
const nativeClientName = "rollgate"

// nativeReader dials the store's server and keeps up to maxIdle idle
// connections.
type nativeReader struct {
	opts *clickhouse.Options
	db   string

	mu   sync.Mutex
	idle []*nativeConn
}

// maxIdle is how many idle connections a nativeReader keeps: one per query
// the trainer bridge has in flight.
const maxIdle = 2

// nativeConn is one connection after the handshake.
type nativeConn struct {
	conn net.Conn
	r    *proto.Reader
	buf  proto.Buffer
	rev  int
}

func newNativeReader(opts *clickhouse.Options, db string) *nativeReader {
	return &nativeReader{opts: opts, db: db}
}

// close closes the idle connections.
func (n *nativeReader) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.idle {
		_ = c.conn.Close()
	}
	n.idle = nil
}

// get returns an idle connection or dials a new one.
func (n *nativeReader) get(ctx context.Context) (*nativeConn, error) {
	n.mu.Lock()
	var c *nativeConn
	if k := len(n.idle); k > 0 {
		c, n.idle = n.idle[k-1], n.idle[:k-1]
	}
	n.mu.Unlock()
	if c != nil {
		return c, nil
	}
	return n.dial(ctx)
}

// put keeps c for a later query, or closes it when maxIdle are kept.
func (n *nativeReader) put(c *nativeConn) {
	n.mu.Lock()
	keep := len(n.idle) < maxIdle
	if keep {
		n.idle = append(n.idle, c)
	}
	n.mu.Unlock()
	if !keep {
		_ = c.conn.Close()
	}
}

// dial connects to the first address that answers and says hello.
func (n *nativeReader) dial(ctx context.Context) (*nativeConn, error) {
	timeout := n.opts.DialTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	var errs []error
	for _, addr := range n.opts.Addr {
		dctx, cancel := context.WithTimeout(ctx, timeout)
		var (
			conn net.Conn
			err  error
		)
		if n.opts.DialContext != nil {
			conn, err = n.opts.DialContext(dctx, addr)
		} else {
			var d net.Dialer
			conn, err = d.DialContext(dctx, "tcp", addr)
		}
		if err == nil && n.opts.TLS != nil {
			cfg := n.opts.TLS.Clone()
			if cfg.ServerName == "" { // as tls.Dial does, which clickhouse-go uses
				cfg.ServerName, _, _ = net.SplitHostPort(addr)
			}
			tc := tls.Client(conn, cfg)
			if err = tc.HandshakeContext(dctx); err != nil {
				_ = conn.Close()
			}
			conn = tc
		}
		var c *nativeConn
		if err == nil {
			c, err = n.hello(dctx, conn)
		}
		cancel()
		if err == nil {
			return c, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	return nil, fmt.Errorf("native connection: %w", errors.Join(errs...))
}

// hello runs the handshake on conn.
func (n *nativeReader) hello(ctx context.Context, conn net.Conn) (c *nativeConn, err error) {
	c = &nativeConn{conn: conn, r: proto.NewReader(bufio.NewReaderSize(conn, 1<<20))}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer func() {
		if !stop() && err == nil { // the deadline is set: the connection is spent
			_ = conn.Close()
			c, err = nil, fmt.Errorf("hello: %w", ctx.Err())
		}
	}()
	user := n.opts.Auth.Username
	if user == "" {
		user = "default" // as clickhouse-go
	}
	proto.ClientHello{
		Name: nativeClientName, Major: 1, Minor: 0, ProtocolVersion: nativeRevision,
		Database: n.db, User: user, Password: n.opts.Auth.Password,
	}.Encode(&c.buf)
	err = c.flush()
	var code byte
	if err == nil {
		code, err = c.r.UInt8()
	}
	if err == nil {
		switch proto.ServerCode(code) {
		case proto.ServerCodeHello:
			var h proto.ServerHello
			if err = h.DecodeAware(c.r, nativeRevision); err == nil {
				c.rev = min(nativeRevision, h.Revision)
			}
		case proto.ServerCodeException:
			err = c.exception()
		default:
			err = fmt.Errorf("server sent packet %d instead of hello", code)
		}
	}
	if err == nil && (!proto.FeatureTempTables.In(c.rev) || !proto.FeatureBlockInfo.In(c.rev)) {
		err = fmt.Errorf("server protocol revision %d is too old (ClickHouse 18.16 is the oldest supported)", c.rev)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("hello: %w", err)
	}
	return c, nil
}

func (c *nativeConn) flush() error {
	_, err := c.conn.Write(c.buf.Buf)
	c.buf.Reset()
	return err
}

// exception reads an exception packet (after its code) and returns it as
// an error naming the server's code and message.
func (c *nativeConn) exception() error {
	var e proto.Exception
	if err := e.DecodeAware(c.r, c.rev); err != nil {
		return fmt.Errorf("decode exception: %w", err)
	}
	return &serverError{code: int32(e.Code), msg: e.Message}
}

// serverError is an exception the server sent: the query's fault (or the
// server's state), not the protocol's, so a read that fails with one is not
// retried as text.
type serverError struct {
	code int32
	msg  string
}

func (e *serverError) Error() string { return fmt.Sprintf("server: code %d: %s", e.code, e.msg) }

// query runs a SELECT and calls block with the columns of each block that has
// rows (the columns are reused by the next block: block copies what it
// keeps). The columns are typed from the first block's header (ch-go's
// proto.ColAuto).
func (n *nativeReader) query(ctx context.Context, body string, block func(cols proto.Results, rows int) error) error {
	c, err := n.get(ctx)
	if err != nil {
		return err
	}
	ok := false
	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Now()) })
	defer func() {
		// A connection whose deadline the cancellation set is not reused.
		if stop() && ok {
			n.put(c)
		} else {
			_ = c.conn.Close()
		}
	}()
	if err := c.send(body); err != nil {
		return ctxOr(ctx, fmt.Errorf("send query: %w", err))
	}
	var cols proto.Results
	auto := cols.Auto()
	for {
		code, err := c.r.UInt8()
		if err != nil {
			return ctxOr(ctx, fmt.Errorf("read packet: %w", err))
		}
		switch proto.ServerCode(code) {
		case proto.ServerCodeData, proto.ServerCodeTotals, proto.ServerCodeExtremes:
			if _, err := c.r.Str(); err != nil { // external table name
				return ctxOr(ctx, fmt.Errorf("read block: %w", err))
			}
			for _, col := range cols {
				col.Data.Reset()
			}
			var b proto.Block
			if err := b.DecodeBlock(c.r, c.rev, auto); err != nil {
				return ctxOr(ctx, fmt.Errorf("read block: %w", err))
			}
			if proto.ServerCode(code) == proto.ServerCodeData && b.Rows > 0 {
				if err := block(cols, b.Rows); err != nil {
					return err // the connection is closed mid-result
				}
			}
		case proto.ServerCodeProgress:
			var p proto.Progress
			if err := p.DecodeAware(c.r, c.rev); err != nil {
				return ctxOr(ctx, fmt.Errorf("read progress: %w", err))
			}
		case proto.ServerCodeProfile:
			var p proto.Profile
			if err := p.DecodeAware(c.r, c.rev); err != nil {
				return ctxOr(ctx, fmt.Errorf("read profile: %w", err))
			}
		case proto.ServerCodeException:
			return c.exception()
		case proto.ServerCodeEndOfStream:
			ok = true
			return nil
		default:
			return fmt.Errorf("unexpected packet %d from the server", code)
		}
	}
}

// send writes a query packet, then the empty data block that ends the
// client's (absent) external tables.
func (c *nativeConn) send(body string) error {
	b := &c.buf
	proto.ClientCodeQuery.Encode(b)
	b.PutString("") // query id: the server assigns one
	proto.ClientInfo{
		ProtocolVersion: c.rev,
		Major:           1,
		Interface:       proto.InterfaceTCP,
		Query:           proto.ClientQueryInitial,
		ClientName:      nativeClientName,
		InitialAddress:  c.conn.LocalAddr().String(), // 18.16 parses it even for an initial query
	}.EncodeAware(b, c.rev)
	b.PutString("") // no settings
	proto.StageComplete.Encode(b)
	proto.CompressionDisabled.Encode(b)
	b.PutString(body)
	proto.ClientCodeData.Encode(b)
	proto.ClientData{}.EncodeAware(b, c.rev)
	proto.Block{}.EncodeAware(b, c.rev)
	return c.flush()
}

// ctxOr returns ctx's error, wrapped around err, when ctx is done (the
// deadline set on cancellation is what failed the read).
func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}
