package deploytest

// The engine kinds, registered as cmd/rollgate registers them (the
// Prometheus test runs a gateway with a vLLM replica).
import (
	_ "github.com/rollgate/rollgate/engines/llamacpp"
	_ "github.com/rollgate/rollgate/engines/openai"
	_ "github.com/rollgate/rollgate/engines/sglang"
	_ "github.com/rollgate/rollgate/engines/vllm"
)
