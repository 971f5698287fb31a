package otlp

import (
	"flag"

	"github.com/rollgate/rollgate/internal/config"
)

// RegisterFlags registers the --otlp-* flags on fs, bound to c's fields,
// with the defaults New applies; registering writes them into c.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	d := *c
	d.setDefaults()
	fs.StringVar(&c.Endpoint, "otlp-endpoint", d.Endpoint, "export captured calls as OpenTelemetry spans to this OTLP receiver (host:port or URL); empty = off")
	fs.StringVar(&c.Protocol, "otlp-protocol", d.Protocol, "OTLP protocol: http or grpc")
	config.StringMapVar(fs, &c.Headers, "otlp-headers", "extra OTLP headers, `k=v,...` (prefer ROLLGATE_OTLP_HEADERS for tokens)")
	fs.BoolVar(&c.Insecure, "otlp-insecure", d.Insecure, "plain-text gRPC / http:// without TLS")
	fs.DurationVar(&c.Timeout, "otlp-timeout", d.Timeout, "longest one OTLP export request may take")
	fs.StringVar(&c.Compression, "otlp-compression", d.Compression, "compression of OTLP export requests: gzip or none (empty)")
	fs.StringVar(&c.ServiceName, "otlp-service-name", d.ServiceName, "the spans' resource service.name")
	fs.StringVar(&c.ProviderName, "otlp-provider-name", d.ProviderName, "recorded as gen_ai.provider.name on every span when set (e.g. openai)")
}
