package agl

// SetMaxEventPageBytes sets the byte bound of a page of events for a test
// (which restores it with the value returned).
func SetMaxEventPageBytes(n int64) (old int64) {
	old, maxEventPageBytes = maxEventPageBytes, n
	return old
}
