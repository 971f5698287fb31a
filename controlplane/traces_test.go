package controlplane_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
	bridge "github.com/rollgate/rollgate/trainer-bridge"
	"github.com/rollgate/rollgate/trainer-bridge/air"
)

// spansOf reads agent_spans rows of a rollout as maps of column → text.
func spansOf(t *testing.T, store export.Store, where string) []map[string]string {
	t.Helper()
	res, err := store.Query(context.Background(), "SELECT rollout_id, attempt_id, trace_id, span_id, parent_span_id, name, kind, service_name, tool_name, tool_call_id, status_code, status_message, attributes, start_time_unix_nano FROM agent_spans WHERE "+where+" ORDER BY start_time_unix_nano, name")
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
	for _, r := range res.Rows {
		m := map[string]string{}
		for i, c := range res.Columns {
			m[c] = r[i]
		}
		out = append(out, m)
	}
	return out
}

// TestOTLPIngest sends agent spans with the real OpenTelemetry Go SDK
// exporter (protobuf, gzip) to the per-rollout path and with resource
// attributes, and a hand-written OTLP/JSON body with hex ids; every span
// lands in agent_spans, attributed, in both stores.
func TestOTLPIngest(t *testing.T) {
	gatewaytest.StoreKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := gatewaytest.NewEnv(t, open(t), nil)
		ctx := context.Background()
		send := func(endpoint string, res *resource.Resource, f func(tr trace.Tracer)) {
			t.Helper()
			exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint), otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
			if err != nil {
				t.Fatal(err)
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
			f(tp.Tracer("agent"))
			if err := tp.Shutdown(ctx); err != nil {
				t.Fatalf("exporting to %s: %v", endpoint, err)
			}
		}
		var rootSC, toolSC trace.SpanContext
		send(e.URL+"/rollout/ro-path/attempt/at-1/v1/traces",
			resource.NewSchemaless(attribute.String("service.name", "my-agent")),
			func(tr trace.Tracer) {
				c, root := tr.Start(ctx, "agent.run")
				_, tool := tr.Start(c, "execute_tool search", trace.WithAttributes(
					attribute.String("gen_ai.tool.name", "search"), attribute.String("gen_ai.tool.call.id", "call_1"),
					attribute.Int("retries", 2)))
				tool.SetStatus(codes.Error, "HTTP 500 from the search API")
				tool.End()
				root.End()
				rootSC, toolSC = root.SpanContext(), tool.SpanContext()
			})
		send(e.URL+"/v1/traces",
			resource.NewSchemaless(attribute.String("service.name", "other"), attribute.String("rollout_id", "ro-res"), attribute.String("attempt_id", "at-9")),
			func(tr trace.Tracer) {
				_, s := tr.Start(ctx, "step")
				s.SetStatus(codes.Ok, "")
				s.End()
			})
		got := spansOf(t, e.Store, "rollout_id = 'ro-path' AND attempt_id = 'at-1'")
		if len(got) != 2 {
			t.Fatalf("spans of ro-path: %+v", got)
		}
		var tool map[string]string
		for _, s := range got {
			if s["name"] == "execute_tool search" {
				tool = s
			}
		}
		if tool == nil || tool["tool_name"] != "search" || tool["tool_call_id"] != "call_1" || tool["status_code"] != "error" ||
			tool["status_message"] != "HTTP 500 from the search API" || tool["span_id"] != toolSC.SpanID().String() ||
			tool["trace_id"] != toolSC.TraceID().String() || tool["parent_span_id"] != rootSC.SpanID().String() ||
			tool["service_name"] != "my-agent" || tool["kind"] != "internal" || gjson.Get(tool["attributes"], "retries").Int() != 2 {
			t.Fatalf("tool span: %+v", tool)
		}
		if res := spansOf(t, e.Store, "rollout_id = 'ro-res'"); len(res) != 1 || res[0]["attempt_id"] != "at-9" || res[0]["status_code"] != "ok" || res[0]["service_name"] != "other" {
			t.Fatalf("span attributed by resource: %+v", res)
		}

		// OTLP/JSON: hex ids, attribution by span attribute, one span with a bad id.
		start := time.Now().UnixNano()
		body := `{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"js-agent"}}]},
			"scopeSpans":[{"scope":{"name":"x"},"spans":[
			{"traceId":"5B8EFFF798038103D269B633813FC60C","spanId":"EEE19B7EC3C1B174","parentSpanId":"EEE19B7EC3C1B173",
			 "name":"tool calculator","kind":3,"startTimeUnixNano":"` + strconv.FormatInt(start, 10) + `","endTimeUnixNano":"` + strconv.FormatInt(start+1000, 10) + `",
			 "attributes":[{"key":"rollout_id","value":{"stringValue":"ro-json"}},{"key":"attempt_id","value":{"stringValue":"at-2"}},
			   {"key":"tool.name","value":{"stringValue":"calculator"}},{"key":"ok","value":{"boolValue":false}}],
			 "status":{"code":2,"message":"division by zero"}},
			{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"01","name":"broken"}]}]}]}`
		r := gatewaytest.Do(t, "POST", e.URL+"/v1/traces", body)
		if r.Status != 200 || gjson.GetBytes(r.Body, "partialSuccess.rejectedSpans").String() != "1" || !strings.Contains(r.Header.Get("Content-Type"), "json") {
			t.Fatalf("JSON export: %d %s", r.Status, r.Body)
		}
		js := spansOf(t, e.Store, "rollout_id = 'ro-json'")
		if len(js) != 1 || js[0]["trace_id"] != "5b8efff798038103d269b633813fc60c" || js[0]["span_id"] != "eee19b7ec3c1b174" ||
			js[0]["parent_span_id"] != "eee19b7ec3c1b173" || js[0]["kind"] != "client" || js[0]["tool_name"] != "calculator" ||
			js[0]["status_code"] != "error" || js[0]["attempt_id"] != "at-2" || js[0]["service_name"] != "js-agent" {
			t.Fatalf("JSON span: %+v", js)
		}
		for _, bad := range []struct{ ct, body string }{
			{"application/json", `{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"}]}]}]}`},
			{"application/json", `{"resourceSpans":`},
			{"application/x-protobuf", "\xff\xff\xff"},
			{"text/plain", "hello"},
		} {
			r := gatewaytest.Do(t, "POST", e.URL+"/v1/traces", bad.body, "Content-Type", bad.ct)
			if r.Status != 400 && r.Status != 415 {
				t.Errorf("%s %q: %d %s", bad.ct, bad.body, r.Status, r.Body)
			}
		}
		if r := gatewaytest.Do(t, "GET", e.URL+"/v1/traces", ""); r.Status != 405 {
			t.Errorf("GET /v1/traces: %d", r.Status)
		}
		m := gatewaytest.Do(t, "GET", e.URL+"/metrics", "")
		if !strings.Contains(string(m.Body), `rollgate_agent_spans_total{attributed="true",result="stored"} 4`) ||
			!strings.Contains(string(m.Body), `rollgate_agent_spans_total{attributed="false",result="rejected"} 1`) {
			t.Fatalf("agent span metrics:\n%s", gatewaytest.GrepLines(string(m.Body), "rollgate_agent_spans_total"))
		}
	})
}

// TestToolSpanErrorBecomesAIR: an agent calls the model through its rollout
// URL, gets a tool call, runs the tool, and reports the failed tool as an
// OTLP span; the bridge turns it into an air_tool_span reward on that call.
func TestToolSpanErrorBecomesAIR(t *testing.T) {
	gatewaytest.StoreKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := gatewaytest.NewEnv(t, open(t), nil)
		ctx := context.Background()
		base := e.URL + "/rollout/ro-air/attempt/at-1"
		c := gatewaytest.Do(t, "POST", base+"/v1/chat/completions", `{"model":"mock-model","messages":[{"role":"user","content":"weather?"}],`+
			`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}`)
		callID := gjson.GetBytes(c.Body, "choices.0.message.tool_calls.0.id").String()
		if c.Status != 200 || callID == "" {
			t.Fatalf("no tool call from the mock: %d %s", c.Status, c.Body)
		}
		e.WaitCalls(c.Header.Get("x-request-id"), 1)
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(base+"/v1/traces"))
		if err != nil {
			t.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		_, sp := tp.Tracer("agent").Start(ctx, "execute_tool get_weather", trace.WithAttributes(
			attribute.String("gen_ai.tool.name", "get_weather"), attribute.String("gen_ai.tool.call.id", callID)))
		sp.SetStatus(codes.Error, "weather API down")
		sp.End()
		if err := tp.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/ro-air/rewards", `{"value":1,"attempt_id":"at-1"}`); r.Status != 200 {
			t.Fatalf("reward: %d %s", r.Status, r.Body)
		}
		eng, err := air.New(air.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		res, err := bridge.Build(ctx, e.Store, bridge.Options{Selection: bridge.Selection{RolloutIDs: []string{"ro-air"}},
			AIR: eng, WriteAIR: true})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stats.AIRHits[air.RuleToolSpan] != 1 {
			t.Fatalf("AIR hits: %+v", res.Stats.AIRHits)
		}
		d, err := e.Store.Rollout(ctx, "ro-air")
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for _, r := range d.Rewards {
			found = found || (r.Source == air.RuleToolSpan && r.SequenceID == 1 && r.AttemptID == "at-1" && r.Value == -0.5)
		}
		if !found {
			t.Fatalf("rewards: %+v", d.Rewards)
		}
	})
}
