package tokenize

// FillOutcome tells what an id filler did to one call's rows: the
// capture pipeline's IDFiller returns it, and fallback.Client.Fill is one.
// It lives here, beside the checks it names, so that the pipeline asking
// for ids and the code supplying them share it without importing each
// other.
type FillOutcome struct {
	// Prompt and Output are true when prompt ids or output ids were
	// written into the rows.
	Prompt, Output bool
	// Skipped is true when the rows needed nothing (engine ids verified, or a
	// failed call).
	Skipped bool
	// Failed lists the Check* names that still fail with the filled ids; the
	// rows are then left as they were.
	Failed []string
}
