package clickhouse

import (
	"context"
	"fmt"
	"github.com/rollgate/rollgate/export/arrays"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/rollgate/rollgate/export"
)

// Query runs ad-hoc SQL in the store's database and renders every value as
// text: numbers in their shortest exact form, arrays as [1,2,3] (strings
// inside arrays JSON-quoted), NULL as "NULL", DateTime as 2006-01-02 15:04:05.
func (s *Store) Query(ctx context.Context, query string) (*export.Result, error) {
	rows, err := s.conn.Query(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("clickhouse: query: %w", err)
	}
	defer rows.Close()
	types := rows.ColumnTypes()
	res := &export.Result{Columns: rows.Columns()}
	dest := make([]any, len(types))
	for rows.Next() {
		for i, t := range types {
			dest[i] = reflect.New(t.ScanType()).Interface()
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("clickhouse: query: scan: %w", err)
		}
		row := make([]string, len(dest))
		for i, d := range dest {
			row[i] = renderValue(reflect.ValueOf(d).Elem().Interface(), isDateType(types[i].DatabaseTypeName()))
		}
		res.Rows = append(res.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("clickhouse: query: %w", err)
	}
	return res, nil
}

// isDateType reports whether a column type holds dates without a time of day
// (Date, Date32, and Nullable or Array of them).
func isDateType(t string) bool {
	return strings.Contains(t, "Date") && !strings.Contains(t, "DateTime")
}

// renderValue turns one scanned value into text as Query prints it; dateOnly
// prints times as 2006-01-02.
func renderValue(v any, dateOnly bool) string {
	var b strings.Builder
	r := renderer{dateOnly: dateOnly}
	r.render(&b, reflect.ValueOf(v), false)
	return b.String()
}

type renderer struct{ dateOnly bool }

func (r renderer) render(b *strings.Builder, v reflect.Value, nested bool) {
	if !v.IsValid() {
		b.WriteString("NULL")
		return
	}
	if t, ok := v.Interface().(time.Time); ok {
		layout := "2006-01-02 15:04:05.999999999"
		if r.dateOnly {
			layout = "2006-01-02"
		}
		s := t.Format(layout)
		if nested {
			s = strconv.Quote(s)
		}
		b.WriteString(s)
		return
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			b.WriteString("NULL")
			return
		}
		r.render(b, v.Elem(), nested)
	case reflect.String:
		if nested {
			b.WriteString(strconv.Quote(v.String()))
		} else {
			b.WriteString(v.String())
		}
	case reflect.Bool:
		b.WriteString(strconv.FormatBool(v.Bool()))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		b.WriteString(strconv.FormatInt(v.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		b.WriteString(strconv.FormatUint(v.Uint(), 10))
	case reflect.Float32:
		b.WriteString(strconv.FormatFloat(v.Float(), 'g', -1, 32))
	case reflect.Float64:
		b.WriteString(strconv.FormatFloat(v.Float(), 'g', -1, 64))
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8 && !nested {
			// []byte (FixedString and the like): print as text.
			b.Write(v.Bytes())
			return
		}
		b.WriteByte('[')
		for i := 0; i < v.Len(); i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			r.render(b, v.Index(i), true)
		}
		b.WriteByte(']')
	case reflect.Map:
		keys := v.MapKeys()
		parts := make([]string, len(keys))
		for i, k := range keys {
			var kb, vb strings.Builder
			r.render(&kb, k, true)
			r.render(&vb, v.MapIndex(k), true)
			parts[i] = kb.String() + ":" + vb.String()
		}
		sort.Strings(parts)
		b.WriteString("{" + strings.Join(parts, ",") + "}")
	default:
		fmt.Fprint(b, v.Interface())
	}
}

// Calls reads llm_calls rows matching f, ordered by rollout, attempt,
// sequence id and choice.
func (s *Store) Calls(ctx context.Context, f export.CallFilter) ([]export.Call, error) {
	var (
		where []string
		args  []any
	)
	if f.RolloutID != "" {
		where, args = append(where, "rollout_id = ?"), append(args, f.RolloutID)
	}
	if f.AttemptID != "" {
		where, args = append(where, "attempt_id = ?"), append(args, f.AttemptID)
	}
	if f.SpanID != "" {
		where, args = append(where, "span_id = ?"), append(args, f.SpanID)
	}
	q := "FROM llm_calls"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY rollout_id, attempt_id, sequence_id, choice_index, span_id"
	if f.Limit > 0 {
		q += " LIMIT " + strconv.Itoa(f.Limit)
	}
	var out []export.Call
	err := s.readCalls(ctx, q, export.ReadOptions{}, args, func(c *export.Call) { out = append(out, *c) })
	return out, err
}

// callSelect is the select list of llm_calls for readCalls: the arrays as
// text (toString; floats in their shortest round-trip form), which package
// arrays reads several times faster than the driver scans an array through
// reflection, element by element; the bodies opt leaves out as empty
// strings.
func callSelect(opt export.ReadOptions) string {
	var b strings.Builder
	for i, c := range callCols {
		if i > 0 {
			b.WriteString(", ")
		}
		switch {
		case c.name == "request_body" && opt.NoRequestBody, c.name == "response_body" && opt.NoResponseBody:
			b.WriteString("'' AS " + c.name)
		case strings.HasPrefix(c.typ, "Array("):
			b.WriteString("toString(" + c.name + ") AS " + c.name)
		default:
			b.WriteString(c.name)
		}
	}
	return b.String()
}

// readCalls runs query (which selects FROM llm_calls and may end in WHERE
// and ORDER BY clauses) with callSelect(opt) and calls f with each row; f
// may keep the call (not the pointer).
func (s *Store) readCalls(ctx context.Context, query string, opt export.ReadOptions, args []any, f func(*export.Call)) error {
	rows, err := s.conn.Query(ctx, "SELECT "+callSelect(opt)+" "+query, args...)
	if err != nil {
		return fmt.Errorf("clickhouse: read llm_calls: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			c                      export.Call
			stream                 uint8
			prompt, resp, logprobs string
		)
		dest := callDest(&c, &stream)
		for i, col := range callCols {
			switch col.name {
			case "prompt_token_ids":
				dest[i] = &prompt
			case "response_token_ids":
				dest[i] = &resp
			case "response_logprobs":
				dest[i] = &logprobs
			}
		}
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("clickhouse: read llm_calls: %w", err)
		}
		c.Stream = stream != 0
		if c.PromptTokenIDs, err = arrays.ParseUint32s(prompt); err != nil {
			return fmt.Errorf("clickhouse: read llm_calls: span %q prompt_token_ids: %w", c.SpanID, err)
		}
		if c.ResponseTokenIDs, err = arrays.ParseUint32s(resp); err != nil {
			return fmt.Errorf("clickhouse: read llm_calls: span %q response_token_ids: %w", c.SpanID, err)
		}
		if c.ResponseLogprobs, err = arrays.ParseFloat32s(logprobs); err != nil {
			return fmt.Errorf("clickhouse: read llm_calls: span %q response_logprobs: %w", c.SpanID, err)
		}
		f(&c)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("clickhouse: read llm_calls: %w", err)
	}
	return nil
}

// Rollout reads the latest row of every attempt of the rollout (by
// updated_unix_nano; LIMIT 1 BY, so unmerged ReplacingMergeTree parts do not
// matter), its calls and its rewards. An unknown rollout gives an empty
// detail, not an error.
func (s *Store) Rollout(ctx context.Context, rolloutID string) (*export.RolloutDetail, error) {
	m, err := s.Rollouts(ctx, []string{rolloutID}, export.ReadOptions{})
	if err != nil {
		return nil, err
	}
	return m[rolloutID], nil
}

// Rollouts is Rollout for many rollouts in three queries (one per table), for
// readers such as the trainer bridge that would otherwise pay a round trip
// per rollout, without the columns opt leaves out. Every id gets a detail,
// empty when unknown.
func (s *Store) Rollouts(ctx context.Context, ids []string, opt export.ReadOptions) (map[string]*export.RolloutDetail, error) {
	out := make(map[string]*export.RolloutDetail, len(ids))
	for _, id := range ids {
		out[id] = &export.RolloutDetail{}
	}
	if len(ids) == 0 {
		return out, nil
	}
	set := make([]any, len(ids))
	for i, id := range ids {
		set[i] = id
	}
	in := clickhouse.GroupSet{Value: set} // binds as ('a', 'b', ...)
	rows, err := s.conn.Query(ctx, "SELECT "+names(rolloutCols)+
		" FROM rollouts WHERE rollout_id IN ? ORDER BY rollout_id, attempt_id, updated_unix_nano DESC LIMIT 1 BY rollout_id, attempt_id", in)
	if err != nil {
		return nil, fmt.Errorf("clickhouse: read rollouts: %w", err)
	}
	for rows.Next() {
		var r export.Rollout
		if err := rows.Scan(rolloutDest(&r)...); err != nil {
			rows.Close()
			return nil, fmt.Errorf("clickhouse: read rollouts: %w", err)
		}
		if d := out[r.RolloutID]; d != nil {
			d.Attempts = append(d.Attempts, r)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("clickhouse: read rollouts: %w", err)
	}

	err = s.readCalls(ctx, "FROM llm_calls WHERE rollout_id IN ? ORDER BY rollout_id, attempt_id, sequence_id, choice_index, span_id",
		opt, []any{in}, func(c *export.Call) {
			if d := out[c.RolloutID]; d != nil {
				d.Calls = append(d.Calls, *c)
			}
		})
	if err != nil {
		return nil, err
	}

	rows, err = s.conn.Query(ctx, "SELECT "+names(rewardCols)+
		" FROM rewards WHERE rollout_id IN ? ORDER BY rollout_id, attempt_id, sequence_id, time_unix_nano, name", in)
	if err != nil {
		return nil, fmt.Errorf("clickhouse: read rewards: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var r export.Reward
		if err := rows.Scan(rewardDest(&r)...); err != nil {
			return nil, fmt.Errorf("clickhouse: read rewards: %w", err)
		}
		if d := out[r.RolloutID]; d != nil {
			d.Rewards = append(d.Rewards, r)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("clickhouse: read rewards: %w", err)
	}
	return out, nil
}
