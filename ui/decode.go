package ui

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/tokenize/hf"
)

// Decoder turns token ids into the text of each token.
type Decoder interface {
	// Pieces returns the text of each of ids (one string per id) for the
	// model that served call c.
	Pieces(ctx context.Context, c *export.Call, ids []uint32) ([]string, error)
}

// decodeUnique decodes the distinct ids of both sides once.
func decodeUnique(ctx context.Context, d Decoder, c *export.Call, sides ...[]uint32) (map[uint32]string, error) {
	seen := map[uint32]string{}
	var ids []uint32
	for _, side := range sides {
		for _, id := range side {
			if _, ok := seen[id]; !ok {
				seen[id] = ""
				ids = append(ids, id)
			}
		}
	}
	pieces, err := d.Pieces(ctx, c, ids)
	if err != nil {
		return nil, err
	}
	if len(pieces) != len(ids) {
		return nil, fmt.Errorf("decoder gave %d pieces for %d ids", len(pieces), len(ids))
	}
	for i, id := range ids {
		seen[id] = pieces[i]
	}
	return seen, nil
}

// LocalDecoder decodes with a local tokenizer.json (package tokenize/hf):
// every call is taken to use that tokenizer's vocabulary.
type LocalDecoder struct{ T *hf.Tokenizer }

// Pieces implements Decoder. A token that is not a whole UTF-8 character
// (part of an emoji, a rare CJK character) shows its bytes as \xNN.
func (l LocalDecoder) Pieces(_ context.Context, _ *export.Call, ids []uint32) ([]string, error) {
	out := make([]string, len(ids))
	for i, id := range ids {
		b, err := l.T.DecodeBytes([]uint32{id})
		if err != nil {
			return nil, fmt.Errorf("token %d: %w", id, err)
		}
		out[i] = printable(b)
	}
	return out, nil
}

// printable renders bytes as text, invalid UTF-8 bytes as \xNN.
func printable(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			fmt.Fprintf(&sb, `\x%02X`, b[0])
			b = b[1:]
			continue
		}
		sb.Write(b[:n])
		b = b[n:]
	}
	return sb.String()
}

// EngineDecoder decodes through the inference engine that served a call:
// POST {engine}/detokenize {"tokens":[id]} once per distinct id (vLLM
// answers {"prompt"}, SGLang {"text"}, llama.cpp {"content"}), a few at a
// time, remembering the answers per model.
type EngineDecoder struct {
	// Resolve gives the OpenAI base URL (ending in /v1) of the replica
	// named backend serving model, or false when it is unknown.
	Resolve func(backend, model string) (baseURL string, ok bool)
	// Client sends the requests (nil: a client with a 5 s timeout).
	Client *fasthttp.Client
	// Parallel requests (0: 8).
	Parallel int

	mu    sync.Mutex
	cache map[string]map[uint32]string // model -> id -> piece
}

const engineCacheMax = 200_000

// Pieces implements Decoder.
func (e *EngineDecoder) Pieces(ctx context.Context, c *export.Call, ids []uint32) ([]string, error) {
	base, ok := e.Resolve(c.Backend, c.Model)
	if !ok {
		return nil, fmt.Errorf("replica %q of model %q is not in the routing table", c.Backend, c.Model)
	}
	root := strings.TrimSuffix(strings.TrimSuffix(base, "/"), "/v1")
	out := make([]string, len(ids))
	var todo []int
	e.mu.Lock()
	if e.cache == nil {
		e.cache = map[string]map[uint32]string{}
	}
	m := e.cache[c.Model]
	for i, id := range ids {
		if p, ok := m[id]; ok {
			out[i] = p
		} else {
			todo = append(todo, i)
		}
	}
	e.mu.Unlock()
	if len(todo) == 0 {
		return out, nil
	}
	client := e.Client
	if client == nil {
		client = &fasthttp.Client{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
	}
	par := e.Parallel
	if par <= 0 {
		par = 8
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
		next    = make(chan int)
	)
	for w := 0; w < min(par, len(todo)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for i := range next {
				piece, err := detokenizeOne(client, req, resp, root, ids[i], deadline)
				if err != nil {
					errOnce.Do(func() { first = err })
					continue
				}
				out[i] = piece
			}
		}()
	}
	for _, i := range todo {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	if first != nil {
		return nil, first
	}
	e.mu.Lock()
	m = e.cache[c.Model]
	if m == nil || len(m) > engineCacheMax {
		m = map[uint32]string{}
		e.cache[c.Model] = m
	}
	for _, i := range todo {
		m[ids[i]] = out[i]
	}
	e.mu.Unlock()
	return out, nil
}

func detokenizeOne(client *fasthttp.Client, req *fasthttp.Request, resp *fasthttp.Response, root string, id uint32, deadline time.Time) (string, error) {
	req.Reset()
	resp.Reset()
	req.SetRequestURI(root + "/detokenize")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	body, _ := json.Marshal(map[string][]uint32{"tokens": {id}})
	req.SetBody(body)
	if err := client.DoDeadline(req, resp, deadline); err != nil {
		return "", fmt.Errorf("POST /detokenize: %w", err)
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return "", fmt.Errorf("POST /detokenize answered %d", resp.StatusCode())
	}
	r := gjson.ParseBytes(resp.Body())
	for _, k := range []string{"prompt", "text", "content"} {
		if v := r.Get(k); v.Type == gjson.String {
			return v.Str, nil
		}
	}
	return "", fmt.Errorf("POST /detokenize answered no text for token %s", strconv.FormatUint(uint64(id), 10))
}
