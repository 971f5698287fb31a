package main

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strconv"

	"github.com/rollgate/rollgate/tokenize/hf"
	bridge "github.com/rollgate/rollgate/trainer-bridge"
)

// tensorOptions checks the output flags of rollgate bridge and resolves the
// pad id: --pad-id when given (set holds the flags given on the command
// line or in the environment), else the pad_token of --tokenizer-config,
// else 0.
func tensorOptions(set map[string]bool, format string, serve bool, padID int64, tokenizerConfig string, padPrompt, padResponse, batchMultiple int) (bridge.TensorOptions, error) {
	to := bridge.TensorOptions{PadID: padID, PadPrompt: padPrompt, PadResponse: padResponse, BatchMultiple: batchMultiple}
	for _, f := range []struct {
		name string
		v    int
	}{{"pad-prompt", padPrompt}, {"pad-response", padResponse}, {"batch-multiple", batchMultiple}} {
		if f.v < 0 {
			return to, fmt.Errorf("--%s %d: must be 0 (off) or a positive number of tokens or rows", f.name, f.v)
		}
		if f.v != 0 && (format != "safetensors" || serve) {
			return to, fmt.Errorf("--%s pads safetensors batches only (this run writes %s)", f.name, map[bool]string{true: "leased samples", false: format}[serve])
		}
	}
	if padID < 0 {
		return to, fmt.Errorf("--pad-id %d: must be a token id (>= 0)", padID)
	}
	if tokenizerConfig != "" && !set["pad-id"] {
		id, err := padTokenID(tokenizerConfig)
		if err != nil {
			return to, fmt.Errorf("--tokenizer-config: %w", err)
		}
		to.PadID = id
	}
	return to, nil
}

// padTokenID reads the id of the pad_token of a tokenizer_config.json: its
// pad_token (a string or {"content": ...}) looked up in
// added_tokens_decoder, else in the added_tokens of the tokenizer.json
// beside it.
func padTokenID(path string) (int64, error) {
	data, err := hf.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var cfg struct {
		PadToken json.RawMessage `json:"pad_token"`
		Added    map[string]struct {
			Content string `json:"content"`
		} `json:"added_tokens_decoder"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return 0, fmt.Errorf("parsing %s: %w", path, err)
	}
	var pad string
	if json.Unmarshal(cfg.PadToken, &pad) != nil {
		var o struct {
			Content string `json:"content"`
		}
		if json.Unmarshal(cfg.PadToken, &o) == nil {
			pad = o.Content
		}
	}
	if pad == "" {
		return 0, fmt.Errorf("%s has no pad_token; pass --pad-id", path)
	}
	for k, a := range cfg.Added {
		if a.Content == pad {
			id, err := strconv.ParseInt(k, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: added_tokens_decoder key %q is not an id", path, k)
			}
			return id, nil
		}
	}
	tj := filepath.Join(filepath.Dir(path), "tokenizer.json")
	if b, err := hf.ReadFile(tj); err == nil {
		var tok struct {
			Added []struct {
				ID      int64  `json:"id"`
				Content string `json:"content"`
			} `json:"added_tokens"`
		}
		if json.Unmarshal(b, &tok) == nil {
			for _, a := range tok.Added {
				if a.Content == pad {
					return a.ID, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("%s: pad_token %q is not an added token (added_tokens_decoder, tokenizer.json); pass --pad-id", path, pad)
}

// omitLogprobs says whether the output leaves rollout_log_probs out: as
// bridge.Build resolves Options.Logprobs (empty = keep, omit with Retokenize).
func omitLogprobs(o bridge.Options) bool {
	return o.Logprobs == bridge.LogprobsOmit || (o.Logprobs == "" && o.Retokenize != nil)
}

func printTensorSummary(w io.Writer, ts bridge.TensorStats, to bridge.TensorOptions) {
	lp := "rollout_log_probs kept"
	if to.OmitLogprobs {
		lp = "rollout_log_probs omitted"
	}
	fmt.Fprintf(w, "  safetensors: %d rows x %d prompt + %d response tokens, pad id %d, %d padding rows added for --batch-multiple %d, %s\n",
		ts.Rows, ts.PromptLen, ts.ResponseLen, to.PadID, ts.PaddingRows, to.BatchMultiple, lp)
}
