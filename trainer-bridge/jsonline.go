package bridge

import (
	"encoding/json"
	"math"
	"reflect"
	"strconv"

	"github.com/rollgate/rollgate/export/arrays"
)

// appendJSON appends the sample's JSONL line (without the newline) to b:
// byte for byte what encoding/json makes of jsonRow (TestAppendJSONMatches),
// written directly, because reflection over a sample's hundreds of ids and
// logprobs took a fifth of a streamed export's CPU. Field order is
// encoding/json's: Row's fields, then response_mask (jsonRow's own field).
func (s *Sample) appendJSON(b []byte) ([]byte, error) {
	var err error
	b = appendKeyString(b, `{"rollout_id":`, s.RolloutID)
	b = appendKeyString(b, `,"attempt_id":`, s.AttemptID)
	b = appendKeyString(b, `,"task_id":`, s.TaskID)
	b = appendKeyString(b, `,"agent_name":`, s.AgentName)
	b = appendKeyString(b, `,"policy_version":`, s.PolicyVersion)
	b = appendKeyString(b, `,"uid":`, s.GroupUID)
	b = strconv.AppendUint(append(b, `,"choice_index":`...), uint64(s.ChoiceIndex), 10)
	b = arrays.AppendUint64s(append(b, `,"sequence_ids":`...), s.SequenceIDs)
	b = arrays.AppendUint32s(append(b, `,"prompt_ids":`...), s.Prompt)
	b = arrays.AppendUint32s(append(b, `,"response_ids":`...), s.Response)
	b = append(b, `,"rollout_log_probs":[`...)
	for i, v := range s.Logprobs {
		if i > 0 {
			b = append(b, ',')
		}
		if b, err = appendFloat(b, float64(v), 32); err != nil {
			return nil, err
		}
	}
	if b, err = appendFloat(append(b, `],"reward":`...), s.Reward, 64); err != nil {
		return nil, err
	}
	if b, err = appendFloat(append(b, `,"advantage":`...), s.Advantage, 64); err != nil {
		return nil, err
	}
	b = strconv.AppendBool(append(b, `,"trimmed":`...), s.Trimmed)
	b = strconv.AppendBool(append(b, `,"truncated":`...), s.Truncated)
	b = strconv.AppendBool(append(b, `,"has_logprobs":`...), s.HasLogprobs)
	b = appendKeyString(b, `,"token_source":`, s.TokenSource)
	b = strconv.AppendBool(append(b, `,"mixed_policy":`...), s.MixedPolicy)
	b = append(b, `,"response_mask":[`...)
	for i, v := range s.ResponseMask {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '0'+v%10) // as maskJSON
	}
	return append(b, "]}"...), nil
}

// jsonError is the error appendJSON returns for s, found without writing
// the line: nil unless a reward, advantage or logprob is NaN or infinite.
func (s *Sample) jsonError() error {
	finite := func(f float64) bool { return !math.IsInf(f, 0) && !math.IsNaN(f) }
	ok := finite(s.Reward) && finite(s.Advantage)
	for _, v := range s.Logprobs {
		ok = ok && finite(float64(v))
	}
	if ok {
		return nil
	}
	_, err := s.appendJSON(nil)
	return err
}

// appendKeyString appends key and v as a JSON string: plain printable ASCII
// as it is, anything else through encoding/json (its escapes, HTML-safe).
func appendKeyString(b []byte, key, v string) []byte {
	b = append(b, key...)
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(v) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, v...)
	return append(b, '"')
}

// appendFloat formats f as encoding/json does for a float of the given bits:
// the shortest form, exponent only below 1e-6 or from 1e21, and the same
// error for NaN and infinities.
func appendFloat(b []byte, f float64, bits int) ([]byte, error) {
	if f == 0 { // a token the engine was sure of: logprob 0, often
		if math.Signbit(f) {
			return append(b, '-', '0'), nil
		}
		return append(b, '0'), nil
	}
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, &json.UnsupportedValueError{Value: reflect.ValueOf(f), Str: strconv.FormatFloat(f, 'g', -1, bits)}
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	b = strconv.AppendFloat(b, f, format, -1, bits)
	if format == 'e' {
		// e-09 becomes e-9, as encoding/json writes it.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, nil
}
