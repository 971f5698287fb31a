package agl

import (
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/rollgate/rollgate/gateway/rewrite"
	"github.com/rollgate/rollgate/internal/config"
	"github.com/rollgate/rollgate/internal/openai"
)

// Config is the `agl:` block of rollgate's YAML config (and its --agl-*
// flags): Agent Lightning v1.0's API-gateway settings (its Hydra keys `key`
// and `default_proxy.*`).
type Config struct {
	// Enabled mounts the Agent Lightning routes (/api/rollouts..., /api/models,
	// /proxy/...). Off by default.
	Enabled bool `yaml:"enabled"`
	// Key, when set, is required on every /api and /proxy route of this
	// surface as "Authorization: Bearer KEY" or "x-api-key: KEY" (AGL's
	// `key`, the agents' AGL_KEY). Empty: no check (logged as a warning).
	Key string `yaml:"key"`
	// ModelName is the model the proxy route serves (AGL's
	// default_proxy.model_name): the name registered with POST /api/models,
	// and the "model" every proxied request is sent with.
	ModelName string `yaml:"model_name"`
	// TrainTemperature and ValTemperature are forced per mode (AGL's
	// default_proxy.train.temperature, default 1.0, and val.temperature,
	// default 0.7).
	TrainTemperature *float64 `yaml:"train_temperature"`
	ValTemperature   *float64 `yaml:"val_temperature"`
	// IncludeLogProbs forces logprobs in train mode (default true).
	IncludeLogProbs *bool `yaml:"include_log_probs"`
	// Force names the fields the proxy route forces, of "model",
	// "temperature", "return_token_ids", "logprobs" (default all four, as
	// AGL does). A field left out passes as the agent sent it.
	Force []string `yaml:"force"`
	// Retries is how many more attempts a proxied call gets after a
	// transport error or an answer of status 408, 409, 429 or 5xx (AGL: 5,
	// six attempts in all; the default), RetryBackoff the first wait,
	// doubled up to 8 s (AGL: 0.5 s, the default).
	Retries      int           `yaml:"retries"`
	RetryBackoff time.Duration `yaml:"retry_backoff"`
	// AllowedEndpoints are the hosts an endpoint registered with POST
	// /api/models may name: "loopback" (127.0.0.0/8, ::1, localhost),
	// "replicas" (the hosts of the operator's replicas, any port), IP
	// addresses, CIDRs (10.0.0.0/8), host names (matched as names, never
	// resolved) or "*" (any host). Unset: loopback and replicas. An
	// endpoint outside them is refused with 422; a stored registration
	// outside them is dropped at start with a warning.
	AllowedEndpoints []string `yaml:"allowed_endpoints"`
}

// Field names Config.Force accepts.
var forceable = []string{"model", "temperature", "return_token_ids", "logprobs"}

// Defaults of Retries and RetryBackoff (Agent Lightning's).
const (
	DefaultRetries      = 5
	DefaultRetryBackoff = 500 * time.Millisecond
)

// RegisterFlags adds the --agl-* flags, bound to c's fields (registering
// writes the defaults of Enabled, Key, ModelName, Retries and RetryBackoff
// into c; the optional settings stay nil until a flag, variable or file
// sets them). rollgate serve loads them with internal/config: a flag >
// its ROLLGATE_AGL_* variable > the agl: block > the default.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	d := *c
	d.setDefaults()
	fs.BoolVar(&c.Enabled, "agl", d.Enabled, "serve Agent Lightning v1.0's API gateway routes (/api/rollouts, /api/models, /proxy/...): point AGL's trainer at this gateway's URL")
	fs.StringVar(&c.Key, "agl-key", d.Key, "Agent Lightning's server key (AGL_KEY): required as Authorization: Bearer or x-api-key on its /api and /proxy routes; empty = no check")
	fs.StringVar(&c.ModelName, "agl-model-name", d.ModelName, "Agent Lightning's default_proxy.model_name: the model its proxy route serves and sends")
	config.Float64PtrVar(fs, &c.TrainTemperature, "agl-train-temperature", "temperature forced on train-mode proxy calls (default 1.0)")
	config.Float64PtrVar(fs, &c.ValTemperature, "agl-val-temperature", "temperature forced on val-mode proxy calls (default 0.7)")
	config.BoolPtrVar(fs, &c.IncludeLogProbs, "agl-include-log-probs", "force logprobs on train-mode proxy calls (default true)")
	config.StringListVar(fs, &c.Force, "agl-force", "comma-separated fields the proxy route forces, of model,temperature,return_token_ids,logprobs (default all)")
	fs.IntVar(&c.Retries, "agl-retries", d.Retries, "more attempts a proxied call gets after a transport error or an answer of status 408, 409, 429 or 5xx (as AGL)")
	fs.DurationVar(&c.RetryBackoff, "agl-retry-backoff", d.RetryBackoff, "wait before a proxied call's first retry, doubled up to 8s (as AGL)")
	config.StringListVar(fs, &c.AllowedEndpoints, "agl-allowed-endpoints", "comma-separated hosts the endpoints registered with POST /api/models may name: loopback, replicas (the operator's replica hosts), IPs, CIDRs, host names, or * for any (default loopback,replicas)")
}

// setDefaults fills the zero Retries and RetryBackoff with their defaults.
func (c *Config) setDefaults() {
	if c.Retries == 0 {
		c.Retries = DefaultRetries
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
}

// forceSets are the forced fields of the proxy route, per mode and endpoint.
type forceSets struct {
	train, val [2]*rewrite.ForceSet // [0] chat/completions, [1] completions
}

func (f *forceSets) get(train bool, ep openai.Endpoint) *rewrite.ForceSet {
	i := 0
	if ep == openai.Completions {
		i = 1
	}
	if train {
		return f.train[i]
	}
	return f.val[i]
}

// check validates c and builds the forced-field sets.
func (c *Config) check() (*forceSets, error) {
	if c.ModelName == "" {
		return nil, fmt.Errorf("agl: model_name is empty: set agl.model_name (--agl-model-name), the model name the trainer registers with POST /api/models")
	}
	force := c.Force
	if force == nil {
		force = forceable
	}
	on := map[string]bool{}
	for _, f := range force {
		ok := false
		for _, k := range forceable {
			ok = ok || f == k
		}
		if !ok {
			return nil, fmt.Errorf("agl: force: %q is not one of %s", f, strings.Join(forceable, ", "))
		}
		on[f] = true
	}
	train, val, logprobs := 1.0, 0.7, true
	if c.TrainTemperature != nil {
		train = *c.TrainTemperature
	}
	if c.ValTemperature != nil {
		val = *c.ValTemperature
	}
	if c.IncludeLogProbs != nil {
		logprobs = *c.IncludeLogProbs
	}
	var out forceSets
	for mode := range 2 {
		for ep := range 2 {
			var fields []rewrite.Forced
			add := func(name string, v any) {
				if on[name] {
					b, _ := json.Marshal(v)
					fields = append(fields, rewrite.Forced{Name: name, Value: b})
				}
			}
			add("model", c.ModelName)
			if mode == 0 {
				add("temperature", train)
			} else {
				add("temperature", val)
			}
			add("return_token_ids", true)
			if mode == 0 && logprobs {
				// AGL sends "logprobs": true to both endpoints; vLLM's
				// completions field is an integer count (true passes only
				// through pydantic's lax bool-to-int), so completions get 1:
				// the sampled token's logprob, the same data.
				if ep == 0 {
					add("logprobs", true)
				} else {
					add("logprobs", 1)
				}
			}
			fs, err := rewrite.NewForceSet(fields)
			if err != nil {
				return nil, fmt.Errorf("agl: %w", err)
			}
			if mode == 0 {
				out.train[ep] = fs
			} else {
				out.val[ep] = fs
			}
		}
	}
	return &out, nil
}
