// Command vllmserver starts one real vLLM (CPU) for a whole test run
// (scripts/test): testenv.StartVLLM on a free loopback port, serving
// SmolLM2-135M-Instruct as testenv.VLLMModel. When it answers it prints two
// lines on stdout, the base URL (http://127.0.0.1:PORT/v1) and the model's
// folder, and stops the server when it receives SIGINT/SIGTERM or its stdin
// closes. Arguments are appended to vLLM's. The server runs with
// VLLM_SERVER_DEV_MODE=1, so the engine's own pause routes (/pause,
// /resume, /is_paused) that TestResumeRealVLLM drives are served, as a
// trainer's engine started for rollgate's engine pause pass-through would.
package main

import (
	"fmt"
	"os"

	"github.com/rollgate/rollgate/testkit/testenv"
)

func main() {
	os.Unsetenv(testenv.EnvVLLMURL) // always start a server of our own
	os.Setenv("VLLM_SERVER_DEV_MODE", "1")
	v, err := testenv.StartVLLM(os.Args[1:]...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vllmserver:", err)
		os.Exit(1)
	}
	fmt.Println(v.URL)
	fmt.Println(v.ModelDir)
	testenv.UntilStopped()
	v.Stop()
}
