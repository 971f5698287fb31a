package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/rollgate/rollgate/bench/mock"
)

const mockSummary = `rollgate mock — run the mock vLLM engine (deterministic, follows vLLM >= 0.10.2's
OpenAI protocol: token ids, streaming chunks, usage chunk, logprobs, tools, n, /tokenize,
/version). --flavor sglang or --flavor llamacpp imitates SGLang or the llama.cpp server instead.
Per-request knobs: headers x-mock-ttft-ms, x-mock-itl-ms, x-mock-tokens, x-mock-fail.`

func runMock(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("mock", mockSummary, stdout)
	addr := fs.String("listen", "127.0.0.1:8001", "address to serve on")
	var cfg mock.Config
	cfg.RegisterFlags(fs)
	_, err := parseWithEnv(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "rollgate mock:", err)
		return 2
	}
	s, err := mock.NewChecked(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "rollgate mock:", err)
		return 2
	}
	ln, err := listen("--listen", *addr)
	if err != nil {
		fmt.Fprintln(stderr, "rollgate mock:", err)
		return 1
	}
	fmt.Fprintf(stderr, "mock %s engine listening on http://%s/v1\n", s.Config().Flavor, ln.Addr())
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		_ = s.Shutdown()
	}()
	if err := s.Serve(ln); err != nil {
		fmt.Fprintln(stderr, "rollgate mock:", err)
		return 1
	}
	return 0
}
