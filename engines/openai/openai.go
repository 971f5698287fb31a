// Package openai is the engine kind "openai": api.openai.com or any other
// hosted OpenAI-compatible API. It rejects unknown fields, so nothing is
// ever injected, and it has no tokenizer, token-in or pause endpoints. A
// replica of kind "auto" whose /models answers without naming a known
// engine is one. It registers itself with package engines.
package openai

import (
	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/internal/openai"
)

func init() { engines.Register(Engine{}) }

// Engine is the hosted-API engine kind.
type Engine struct{}

// Kind is openai.KindOpenAI.
func (Engine) Kind() openai.Kind { return openai.KindOpenAI }

// Inject: nothing.
func (Engine) Inject() engines.Inject { return engines.Inject{Nothing: true} }

// Probe: never certain; engines.Identify falls back to this kind for a
// replica whose /models answers without naming an engine.
func (Engine) Probe(*engines.Docs) int { return engines.ProbeNo }

var _ engines.Engine = Engine{}
