package air

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
)

// checkSchema validates v (decoded with UseNumber) against the subset of
// JSON Schema that tool declarations use: type (one or a list), properties,
// required, enum, items, additionalProperties (false or a schema). Unknown
// keywords are ignored. It returns "" when v matches, else the first mismatch.
func checkSchema(schema map[string]any, v any, path string) string {
	if schema == nil {
		return ""
	}
	if t, ok := schema["type"]; ok {
		var types []string
		switch x := t.(type) {
		case string:
			types = []string{x}
		case []any:
			for _, e := range x {
				if s, ok := e.(string); ok {
					types = append(types, s)
				}
			}
		}
		if len(types) > 0 {
			matched := false
			for _, ty := range types {
				if hasType(v, ty) {
					matched = true
					break
				}
			}
			if !matched {
				return fmt.Sprintf("%s: want %v, got %s", path, types, typeName(v))
			}
		}
	}
	if enum, ok := schema["enum"].([]any); ok {
		found := false
		for _, e := range enum {
			if equalJSON(e, v) {
				found = true
				break
			}
		}
		if !found {
			return fmt.Sprintf("%s: value not in enum", path)
		}
	}
	switch x := v.(type) {
	case map[string]any:
		props, _ := schema["properties"].(map[string]any)
		if req, ok := schema["required"].([]any); ok {
			for _, r := range req {
				if name, ok := r.(string); ok {
					if _, present := x[name]; !present {
						return fmt.Sprintf("%s: missing required %q", path, name)
					}
				}
			}
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if ps, ok := props[k].(map[string]any); ok {
				if msg := checkSchema(ps, x[k], path+"."+k); msg != "" {
					return msg
				}
				continue
			}
			if _, declared := props[k]; declared {
				continue
			}
			switch ap := schema["additionalProperties"].(type) {
			case bool:
				if !ap {
					return fmt.Sprintf("%s: unexpected property %q", path, k)
				}
			case map[string]any:
				if msg := checkSchema(ap, x[k], path+"."+k); msg != "" {
					return msg
				}
			}
		}
	case []any:
		if items, ok := schema["items"].(map[string]any); ok {
			for i, e := range x {
				if msg := checkSchema(items, e, fmt.Sprintf("%s[%d]", path, i)); msg != "" {
					return msg
				}
			}
		}
	}
	return ""
}

func hasType(v any, t string) bool {
	switch t {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		f, err := n.Float64()
		return err == nil && f == math.Trunc(f)
	}
	return true // unknown type names do not fail
}

func typeName(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case nil:
		return "null"
	case json.Number:
		return "number"
	}
	return fmt.Sprintf("%T", v)
}

func equalJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}
