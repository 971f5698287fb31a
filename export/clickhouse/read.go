package clickhouse

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
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
	return export.CollectRows(func(columns func([]string), row func([]string) error) error {
		return s.queryEach(ctx, query, columns, row)
	})
}

// QueryEach is Query handing out one row at a time (export.RowStreamer).
func (s *Store) QueryEach(ctx context.Context, query string, f func(row []string) error) error {
	return s.queryEach(ctx, query, func([]string) {}, f)
}

// queryEach runs query, tells columns its column names, then calls f with
// each row, freshly allocated.
func (s *Store) queryEach(ctx context.Context, query string, columns func([]string), f func(row []string) error) error {
	rows, err := s.conn.Query(ctx, query)
	if err != nil {
		return fmt.Errorf("clickhouse: query: %w", err)
	}
	defer rows.Close()
	types := rows.ColumnTypes()
	columns(rows.Columns())
	dest := make([]any, len(types))
	for rows.Next() {
		for i, t := range types {
			dest[i] = reflect.New(t.ScanType()).Interface()
		}
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("clickhouse: query: scan: %w", err)
		}
		row := make([]string, len(dest))
		for i, d := range dest {
			row[i] = renderValue(reflect.ValueOf(d).Elem().Interface(), isDateType(types[i].DatabaseTypeName()))
		}
		if err := f(row); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("clickhouse: query: %w", err)
	}
	return nil
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
	where, args := f.Conditions()
	q := "FROM llm_calls"
	if where != "" {
		q += " WHERE " + where
	}
	q += " ORDER BY rollout_id, attempt_id, sequence_id, choice_index, span_id"
	if f.Limit > 0 {
		q += " LIMIT " + strconv.Itoa(f.Limit)
	}
	var out []export.Call
	err := s.readCalls(ctx, q, f.Omit, args, func(c *export.Call) { out = append(out, *c) })
	return out, err
}

// Call reads the row k names: the latest started when several match (an
// attempt not named, or a row written twice), nil when none does. PREWHERE
// on the sorting key's columns: only the granules of that call are read.
func (s *Store) Call(ctx context.Context, k export.CallKey) (*export.Call, error) {
	where, args := k.Conditions()
	var out *export.Call
	err := s.readCalls(ctx, "FROM llm_calls PREWHERE "+where+" ORDER BY start_time_unix_nano DESC, span_id DESC LIMIT 1",
		export.ReadOptions{}, args, func(c *export.Call) { out = c })
	return out, err
}

// nativeBlockSettings ends every native read of llm_calls: blocks of at most
// 256 rows (the server's default is 65,536, cut to about 1 MB by
// preferred_block_size_bytes). A call's arrays are a few KB, and smaller
// blocks keep the server's column buffers in sizes its allocator reuses:
// at 10^5 calls of 640 ids, ClickHouse 18.16's page faults fell from
// 27-69k to about 10k, its CPU per call from 14.6 to 11.6 µs and the
// bridge's from 25.8 to 23.2 µs (bench/RESULTS.md §5g).
const nativeBlockSettings = " SETTINGS max_block_size = 256"

// readCalls runs query (which selects FROM llm_calls and may end in WHERE,
// ORDER BY and LIMIT clauses, not SETTINGS, ? placeholders bound to args) with the select list
// of every column but those opt omits (read as empty strings) and calls f
// with each row; f may keep the call and the pointer. It reads through the
// native reader (native.go): columns as the server holds them, arrays
// copied as blocks of memory. When that reader fails before any row for a
// reason other than a server exception or the caller's cancellation (a
// server that speaks the protocol differently), the read is done again as
// text through clickhouse-go, and so are all later ones (logged once).
func (s *Store) readCalls(ctx context.Context, query string, opt export.ReadOptions, args []any, f func(*export.Call)) error {
	cols := export.CallTable.Columns
	if !s.textReads.Load() {
		body, err := bindArgs("SELECT "+nativeSelectList(cols, opt.Omits)+" "+query, args)
		if err != nil {
			return fmt.Errorf("clickhouse: read llm_calls: %w", err)
		}
		body += nativeBlockSettings
		delivered := false
		err = readNative(ctx, s.native, body, cols, func(c *export.Call) { delivered = true; f(c) })
		var se *serverError
		switch {
		case err == nil:
			return nil
		case delivered || ctx.Err() != nil || errors.As(err, &se):
			return fmt.Errorf("clickhouse: read llm_calls: %w", err)
		}
		if s.textReads.CompareAndSwap(false, true) {
			s.log.Warn("clickhouse: the native reader of llm_calls failed; reading them as text from now on (slower; same rows)", "err", err)
		}
	}
	return s.readCallsText(ctx, query, opt, args, f)
}

// readCallsText is readCalls through clickhouse-go, arrays as the server's
// text (toString) parsed by package arrays.
func (s *Store) readCallsText(ctx context.Context, query string, opt export.ReadOptions, args []any, f func(*export.Call)) error {
	cols := export.CallTable.Columns
	rows, err := s.conn.Query(ctx, "SELECT "+selectList(cols, opt.Omits)+" "+query, args...)
	if err != nil {
		return fmt.Errorf("clickhouse: read llm_calls: %w", err)
	}
	defer rows.Close()
	sc := export.NewScanner(cols, export.IntsNative)
	for rows.Next() {
		if err := sc.Scan(rows, spanOf); err != nil {
			return fmt.Errorf("clickhouse: read llm_calls: %w", err)
		}
		c := sc.Row // the scanner reuses its row; f may keep the pointer
		f(&c)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("clickhouse: read llm_calls: %w", err)
	}
	return nil
}

// TextReads says whether llm_calls are read as text (Options.TextReads, or
// since the native reader failed).
func (s *Store) TextReads() bool { return s.textReads.Load() }

// compareCalls orders calls as Calls's ORDER BY does: by attempt, sequence
// id, choice and span (strings bytewise, as ClickHouse compares them).
func compareCalls(a, b export.Call) int {
	return cmp.Or(strings.Compare(a.AttemptID, b.AttemptID), cmp.Compare(a.SequenceID, b.SequenceID),
		cmp.Compare(a.ChoiceIndex, b.ChoiceIndex), strings.Compare(a.SpanID, b.SpanID))
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

// ReadRollout is Rollout without what opt leaves out.
func (s *Store) ReadRollout(ctx context.Context, rolloutID string, opt export.ReadOptions) (*export.RolloutDetail, error) {
	m, err := s.Rollouts(ctx, []string{rolloutID}, opt)
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
	if !opt.NoAttempts {
		if err := s.readAttempts(ctx, in, out); err != nil {
			return nil, err
		}
	}

	// No ORDER BY: sorting rows of several KB of arrays cost the server
	// more than reading them (×3.7 at 25,000 calls on 18.16); a rollout's
	// few calls are sorted here instead, in the order Calls gives. PREWHERE:
	// the ids are matched before the arrays of a granule are read, which
	// halved the server's time for a chunk of 2,500 calls in 8,192-row
	// granules (llm_calls is a MergeTree, or a Distributed table over them).
	// The calls as they come (pointers, which readCalls lets f keep), then
	// each rollout's copied into its own run of one slice: no rollout's
	// slice of large Call structs grows by reallocation.
	at := make(map[string]int, len(ids)) // rollout -> index in ids
	for k, id := range ids {
		at[id] = k
	}
	var (
		calls []*export.Call
		of    []int32 // index in ids of each call's rollout
		count = make([]int, len(ids)+1)
	)
	var err error
	if !opt.NoCalls {
		err = s.readCalls(ctx, "FROM llm_calls PREWHERE rollout_id IN ?",
			opt, []any{in}, func(c *export.Call) {
				if k, ok := at[c.RolloutID]; ok {
					calls, of = append(calls, c), append(of, int32(k))
					count[k+1]++
				}
			})
	}
	if err != nil {
		return nil, err
	}
	for k := range ids {
		count[k+1] += count[k] // count[k] is now where rollout k's calls start
	}
	all := make([]export.Call, len(calls))
	next := slices.Clone(count[:len(ids)])
	for i, c := range calls {
		all[next[of[i]]] = *c
		next[of[i]]++
	}
	for k, id := range ids {
		if start, end := count[k], count[k+1]; end > start {
			d := out[id]
			d.Calls = all[start:end:end]
			slices.SortFunc(d.Calls, compareCalls)
		}
	}

	rewardCols := export.RewardTable.Columns
	rows, err := s.conn.Query(ctx, "SELECT "+selectList(rewardCols, nil)+
		" FROM rewards WHERE rollout_id IN ? ORDER BY rollout_id, attempt_id, sequence_id, time_unix_nano, name", in)
	if err != nil {
		return nil, fmt.Errorf("clickhouse: read rewards: %w", err)
	}
	defer rows.Close()
	rsc := export.NewScanner(rewardCols, export.IntsNative)
	for rows.Next() {
		if err := rsc.Scan(rows, func(r *export.Reward) string { return fmt.Sprintf("reward %q", r.Name) }); err != nil {
			return nil, fmt.Errorf("clickhouse: read rewards: %w", err)
		}
		if d := out[rsc.Row.RolloutID]; d != nil {
			d.Rewards = append(d.Rewards, rsc.Row)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("clickhouse: read rewards: %w", err)
	}
	return out, nil
}

// readAttempts adds the latest row of every attempt of the rollouts in to
// their details in out.
func (s *Store) readAttempts(ctx context.Context, in clickhouse.GroupSet, out map[string]*export.RolloutDetail) error {
	rolloutCols := export.RolloutTable.Columns
	rows, err := s.conn.Query(ctx, "SELECT "+selectList(rolloutCols, nil)+
		" FROM rollouts WHERE rollout_id IN ? ORDER BY rollout_id, attempt_id, updated_unix_nano DESC LIMIT 1 BY rollout_id, attempt_id", in)
	if err != nil {
		return fmt.Errorf("clickhouse: read rollouts: %w", err)
	}
	defer rows.Close()
	sc := export.NewScanner(rolloutCols, export.IntsNative)
	for rows.Next() {
		if err := sc.Scan(rows, func(r *export.Rollout) string { return fmt.Sprintf("attempt %q", r.AttemptID) }); err != nil {
			return fmt.Errorf("clickhouse: read rollouts: %w", err)
		}
		if d := out[sc.Row.RolloutID]; d != nil {
			d.Attempts = append(d.Attempts, sc.Row)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("clickhouse: read rollouts: %w", err)
	}
	return nil
}

// spanOf names a call in a scan error.
func spanOf(c *export.Call) string { return fmt.Sprintf("span %q", c.SpanID) }

// trainingSources are export.TrainingSQL's per-attempt rows in ClickHouse
// (argMax over unmerged ReplacingMergeTree rows of rollouts); the casts
// give every SELECT of the UNION ALL the same types, as 18.16 requires.
// The rewards part gives one row per attempt: the later of its own latest
// reward and its rollout's latest one posted without attempt_id (joined to
// each of the rollout's attempts; the join holds one row per such rollout),
// its own on a tie.
const trainingSources = "SELECT rollout_id, attempt_id, toUInt64(count()) AS calls, toUInt64(countIf(error != '' OR http_status >= 300)) AS failed," +
	" toUInt64(countIf(token_source IN ('engine', 'tokenize') AND token_check = '' AND error = '' AND http_status < 300)) AS verified," +
	" toUInt64(sum(prompt_tokens)) AS pt, toUInt64(sum(completion_tokens)) AS ct, max(task_id) AS task, min(start_time_unix_nano) AS t0," +
	" max(start_time_unix_nano) AS t1, argMin(policy_version, start_time_unix_nano) AS pv, '' AS st, '' AS grp, '' AS rtask," +
	" toUInt64(0) AS upd, toUInt8(1) AS seen, toUInt64(0) AS tw, toUInt8(0) AS hasrw, toFloat64(0) AS reward FROM llm_calls GROUP BY rollout_id, attempt_id" +
	" UNION ALL SELECT rollout_id, attempt_id, toUInt64(0), toUInt64(0), toUInt64(0), toUInt64(0), toUInt64(0), '', toUInt64(0), toUInt64(0), '', argMax(status, updated_unix_nano)," +
	" argMax(group_id, updated_unix_nano), argMax(task_id, updated_unix_nano), max(updated_unix_nano), toUInt8(1), toUInt64(0), toUInt8(0), toFloat64(0)" +
	" FROM rollouts GROUP BY rollout_id, attempt_id" +
	" UNION ALL SELECT rollout_id, attempt_id, toUInt64(0), toUInt64(0), toUInt64(0), toUInt64(0), toUInt64(0), '', toUInt64(0), toUInt64(0), '', '', '', '', toUInt64(0), toUInt8(0)," +
	" max(tw), toUInt8(1), argMax(value, (tw, own)) FROM (SELECT rollout_id, attempt_id, time_unix_nano AS tw, value, toUInt8(1) AS own FROM rewards" +
	" WHERE sequence_id = 0 AND name = 'primary' AND attempt_id != ''" +
	" UNION ALL SELECT rollout_id, attempt_id, rtw, rvalue, toUInt8(0) FROM (SELECT rollout_id, attempt_id FROM llm_calls GROUP BY rollout_id, attempt_id" +
	" UNION ALL SELECT rollout_id, attempt_id FROM rollouts GROUP BY rollout_id, attempt_id) ALL INNER JOIN (SELECT rollout_id, max(time_unix_nano) AS rtw," +
	" argMax(value, time_unix_nano) AS rvalue FROM rewards WHERE sequence_id = 0 AND name = 'primary' AND attempt_id = '' GROUP BY rollout_id) USING rollout_id)" +
	" GROUP BY rollout_id, attempt_id"

// TrainingSteps implements export.Store: one aggregate query, run by the server.
func (s *Store) TrainingSteps(ctx context.Context, q export.TrainingQuery) ([]export.TrainingStep, error) {
	return export.ReadTrainingSteps(q, trainingSources, func(sql string) (*export.Result, error) { return s.Query(ctx, sql) })
}
