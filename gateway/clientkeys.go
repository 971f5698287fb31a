package gateway

import (
	"crypto/subtle"
	"fmt"
	"os"
	"strings"

	"github.com/valyala/fasthttp"
)

// resolveClientKeys fills Key from KeyEnv and checks every key is usable.
func resolveClientKeys(keys []ClientKey) ([]ClientKey, error) {
	out := make([]ClientKey, 0, len(keys))
	for i, k := range keys {
		if k.Key == "" && k.KeyEnv != "" {
			k.Key = os.Getenv(k.KeyEnv)
		}
		if k.Name == "" || k.Key == "" {
			return nil, fmt.Errorf("client_keys[%d]: needs a name and a key (key_env %q is empty or unset)", i, k.KeyEnv)
		}
		out = append(out, k)
	}
	return out, nil
}

// clientKeyName checks the agent's API key (constant-time against every
// configured key) and returns its name; ok is true when keys are off.
func (s *Server) clientKeyName(ctx *fasthttp.RequestCtx) (name string, ok bool) {
	if len(s.clientKeys) == 0 {
		return "", true
	}
	got := ctx.Request.Header.Peek("Authorization")
	if len(got) > 7 && strings.EqualFold(string(got[:7]), "bearer ") {
		got = got[7:]
	} else if k := ctx.Request.Header.Peek("api-key"); len(k) > 0 {
		got = k
	}
	for _, k := range s.clientKeys {
		if subtle.ConstantTimeCompare(got, []byte(k.Key)) == 1 {
			name, ok = k.Name, true // keep comparing: constant time over the list
		}
	}
	return name, ok
}
