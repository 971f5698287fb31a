// Command rollgate is a transparent OpenAI-compatible gateway that captures
// every LLM call of an agent (request, response, exact token ids) for RL
// training. Run "rollgate --help" for the subcommands.
package main

import (
	"fmt"
	"io"
	"os"
)

const usage = `rollgate — transparent OpenAI-compatible gateway that captures LLM calls for RL training

Usage:
  rollgate serve [flags]        run the gateway (embedded store ./rollgate.db by default;
                                without --upstream it also starts the built-in mock engine)
  rollgate bridge [flags]       turn captured calls and rewards into training samples
                                (JSONL, Parquet, safetensors, or an HTTP lease API with --serve)
  rollgate sql [flags] "QUERY"  run SQL on the configured store and print a table
  rollgate help [command]       show help for a command

Testing and benchmarks:
  rollgate mock [flags]         run the mock vLLM engine (for tests and benchmarks)
  rollgate bench [flags]        generate agent load, report latency/throughput, check the capture

Settings: every flag can also be set through the environment: --some-flag is
ROLLGATE_SOME_FLAG. serve takes each setting from its flag, else its variable, else
--config's file, else its default.

Secrets belong in the environment:
  ROLLGATE_ADMIN_TOKEN       when set, required as Authorization: Bearer on every /api/v1
                             route (reads included), the viewer /ui and bridge --serve's lease
                             API; unset, serve refuses a non-loopback --listen and bridge a
                             non-loopback --serve, unless --insecure-admin
  ROLLGATE_CLIENT_KEYS       "name=key,name2=key2": keys agents must send as their
                             OPENAI_API_KEY; the name is recorded on captured rows
  ROLLGATE_UPSTREAM_API_KEY  sent to --upstream as a bearer token
  ROLLGATE_CLICKHOUSE        a ClickHouse DSN with a password
  and the variables named by api_key_env / key_env in the config file.

Run "rollgate help serve" (or "rollgate serve --help") for the flags of a command.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	if cmd == "help" {
		if len(rest) == 0 {
			fmt.Fprint(stdout, usage)
			return 0
		}
		cmd, rest = rest[0], []string{"--help"}
	}
	switch cmd {
	case "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return 0
	case "serve":
		return runServe(rest, stdout, stderr)
	case "sql":
		return runSQL(rest, stdout, stderr)
	case "mock":
		return runMock(rest, stdout, stderr)
	case "bench":
		return runBench(rest, stdout, stderr)
	case "bridge":
		return runBridge(rest, stdout, stderr)
	}
	msg := fmt.Sprintf("rollgate: unknown command %q", cmd)
	if near := closest(commands, cmd, 2); len(near) > 0 {
		msg += "; did you mean " + oneOf(near) + "?"
	}
	fmt.Fprintln(stderr, msg+` Run "rollgate --help" for the commands.`)
	return 2
}

// commands are rollgate's subcommands, for the closest names to a misspelt one.
var commands = []string{"serve", "bridge", "sql", "help", "mock", "bench"}
