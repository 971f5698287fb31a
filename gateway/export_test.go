package gateway

// What external tests (package gateway_test) look at inside the gateway.

// ParkWorkers is how many of the parker's workers run resumed streams at
// once, besides those blocked writing to clients (0 without a parker).
func ParkWorkers() int {
	if !parkSupported {
		return 0
	}
	return parkWorkers
}

// ParkWritersBlocked is how many of the process's parker workers are
// inside a write to a client.
func ParkWritersBlocked() int {
	p, err := streamParker()
	if err != nil || p == nil {
		return 0
	}
	return p.writersBlocked()
}

// ParkAbove sets how many streams must be open before a stream parks
// (parkAbove) and returns a function that restores it.
func ParkAbove(n int) (restore func()) {
	old := parkAbove.Swap(int64(n))
	return func() { parkAbove.Store(old) }
}
