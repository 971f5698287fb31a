package main

// The engine kinds rollgate knows (package engines): each registers
// itself. A new kind is one more package here.
import (
	_ "github.com/rollgate/rollgate/engines/llamacpp"
	_ "github.com/rollgate/rollgate/engines/openai"
	_ "github.com/rollgate/rollgate/engines/sglang"
	_ "github.com/rollgate/rollgate/engines/vllm"
)
