package capture

import (
	"fmt"
	"regexp"

	"github.com/rollgate/rollgate/export"
)

// Fields a redaction rule may apply to.
const (
	FieldRequestBody     = "request_body"
	FieldResponseBody    = "response_body"
	FieldResponseMessage = "response_message"
	FieldError           = "error"
)

// RedactRule is one redaction of stored text: every match of Pattern (Go
// regexp syntax) in the named fields is replaced by Replacement ($1 etc.
// expand), before rows reach any sink. What the client receives and the
// token ids are never changed.
type RedactRule struct {
	Name        string   `yaml:"name"`
	Pattern     string   `yaml:"pattern"`
	Replacement string   `yaml:"replacement"`
	Fields      []string `yaml:"fields"` // default: request_body, response_body, response_message
}

// Redactor applies compiled rules to rows.
type Redactor struct {
	rules []compiledRule
}

type compiledRule struct {
	name   string
	re     *regexp.Regexp
	repl   string
	fields [4]bool // request_body, response_body, response_message, error
}

// NewRedactor compiles rules; an invalid pattern or unknown field is an error
// naming the rule.
func NewRedactor(rules []RedactRule) (*Redactor, error) {
	r := &Redactor{}
	for i, rule := range rules {
		name := rule.Name
		if name == "" {
			name = fmt.Sprintf("rule %d", i+1)
		}
		if rule.Pattern == "" {
			return nil, fmt.Errorf("redact %s: empty pattern", name)
		}
		re, err := regexp.Compile(rule.Pattern)
		if err != nil {
			return nil, fmt.Errorf("redact %s: pattern %q: %w", name, rule.Pattern, err)
		}
		c := compiledRule{name: name, re: re, repl: rule.Replacement}
		fields := rule.Fields
		if len(fields) == 0 {
			fields = []string{FieldRequestBody, FieldResponseBody, FieldResponseMessage}
		}
		for _, f := range fields {
			switch f {
			case FieldRequestBody:
				c.fields[0] = true
			case FieldResponseBody:
				c.fields[1] = true
			case FieldResponseMessage:
				c.fields[2] = true
			case FieldError:
				c.fields[3] = true
			default:
				return nil, fmt.Errorf("redact %s: unknown field %q (request_body, response_body, response_message, error)", name, f)
			}
		}
		r.rules = append(r.rules, c)
	}
	return r, nil
}

// active reports whether r has rules.
func (r *Redactor) active() bool { return r != nil && len(r.rules) > 0 }

// Apply redacts row in place and calls hit with the name of each rule that
// changed something.
func (r *Redactor) Apply(row *export.Call, hit func(rule string)) {
	if r == nil {
		return
	}
	for _, c := range r.rules {
		changed := false
		for i, f := range []*string{&row.RequestBody, &row.ResponseBody, &row.ResponseMessage, &row.Error} {
			if !c.fields[i] || *f == "" || !c.re.MatchString(*f) {
				continue
			}
			*f = c.re.ReplaceAllString(*f, c.repl)
			changed = true
		}
		if changed && hit != nil {
			hit(c.name)
		}
	}
}
