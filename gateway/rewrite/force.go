package rewrite

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"

	"github.com/tidwall/gjson"
)

// Forced is one top-level request field the gateway sets whatever the
// client sent (sampling enforcement: temperature 1.0 for training, the
// served model name, return_token_ids, logprobs).
type Forced struct {
	// Name is the top-level key.
	Name string `yaml:"name" json:"name"`
	// Value is the JSON value sent.
	Value json.RawMessage `yaml:"value" json:"value"`
}

// ForceSet is a list of forced fields with the JSON object that records
// them in the captured row (llm_calls.overrides), made once.
type ForceSet struct {
	fields []Forced
	record string
}

// NewForceSet checks fields (names unique and non-empty, values JSON) and
// returns them ready for Force. A later field of the same name wins.
func NewForceSet(fields []Forced) (*ForceSet, error) {
	fs := &ForceSet{}
	seen := map[string]int{}
	for _, f := range fields {
		if f.Name == "" {
			return nil, fmt.Errorf("forced field with an empty name")
		}
		v := bytes.TrimSpace(f.Value)
		if !json.Valid(v) {
			return nil, fmt.Errorf("forced field %q: value %q is not JSON", f.Name, f.Value)
		}
		f.Value = append(json.RawMessage(nil), v...)
		if i, ok := seen[f.Name]; ok {
			fs.fields[i] = f
			continue
		}
		seen[f.Name] = len(fs.fields)
		fs.fields = append(fs.fields, f)
	}
	fs.record = string(append(fs.appendFields([]byte{'{'}), '}'))
	return fs, nil
}

// appendFields appends the forced members, comma-separated.
func (fs *ForceSet) appendFields(dst []byte) []byte {
	for i, f := range fs.fields {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendQuote(dst, f.Name)
		dst = append(dst, ':')
		dst = append(dst, f.Value...)
	}
	return dst
}

// Record is the JSON object of the forced fields and their values, for the
// captured row; "" when the set is empty.
func (fs *ForceSet) Record() string {
	if fs == nil || len(fs.fields) == 0 {
		return ""
	}
	return fs.record
}

// Fields returns the forced fields (not to be modified).
func (fs *ForceSet) Fields() []Forced {
	if fs == nil {
		return nil
	}
	return fs.fields
}

// Force appends to dst body (a JSON object) with every forced field set:
// the forced fields first, then the client's members minus those of a
// forced name (all of them, when a key is repeated). body must be a valid
// JSON object (Inspect says so); otherwise body is returned unchanged with
// an error.
func (fs *ForceSet) Force(dst, body []byte) ([]byte, error) {
	if fs == nil || len(fs.fields) == 0 {
		return body, nil
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return body, &RequestError{Reason: "request body is not a JSON object"}
	}
	dst = fs.appendFields(append(dst, '{'))
	root.ForEach(func(k, v gjson.Result) bool {
		for _, f := range fs.fields {
			if k.Str == f.Name {
				return true
			}
		}
		dst = append(dst, ',')
		dst = append(dst, k.Raw...)
		dst = append(dst, ':')
		dst = append(dst, v.Raw...)
		return true
	})
	return append(dst, '}'), nil
}

// ForceMap is NewForceSet of a map from field name to a value that
// encoding/json can encode (a YAML config's mapping), in name order.
func ForceMap(m map[string]any) (*ForceSet, error) {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	fields := make([]Forced, 0, len(m))
	for _, k := range names {
		v, err := json.Marshal(m[k])
		if err != nil {
			return nil, fmt.Errorf("forced field %q: %w", k, err)
		}
		fields = append(fields, Forced{Name: k, Value: v})
	}
	return NewForceSet(fields)
}
