package gateway

import "strconv"

// StoreStatus is the state of the capture store that GET /readyz reports in
// its body (it does not change the status code: the gateway answers agents
// while the store is down when a spool keeps their calls).
type StoreStatus struct {
	// State is "connecting", "up" or "down" (see export/stores).
	State string
	// Spool is true when a spool is in front of the store; SpoolBytes and
	// SpoolRecords are what it holds, waiting for the store.
	Spool        bool
	SpoolBytes   int64
	SpoolRecords int
	// WAL is true when answered calls are logged to capture's write-ahead
	// log; WALBytes is its size and WALPending its calls whose rows are not
	// yet stored or spooled.
	WAL        bool
	WALBytes   int64
	WALPending int
}

// SetStoreStatus makes /readyz report f's answer as "store", "spool_bytes",
// "spool_records", "wal_bytes" and "wal_pending" in its body. Call it
// before serving.
func (s *Server) SetStoreStatus(f func() StoreStatus) { s.storeStatus = f }

// appendStoreStatus appends the store fields of /readyz's body (after a
// comma) to dst, or nothing when SetStoreStatus was not called.
func (s *Server) appendStoreStatus(dst []byte) []byte {
	if s.storeStatus == nil {
		return dst
	}
	st := s.storeStatus()
	dst = append(dst, `,"store":`...)
	dst = strconv.AppendQuote(dst, st.State)
	if st.Spool {
		dst = append(dst, `,"spool_bytes":`...)
		dst = strconv.AppendInt(dst, st.SpoolBytes, 10)
		dst = append(dst, `,"spool_records":`...)
		dst = strconv.AppendInt(dst, int64(st.SpoolRecords), 10)
	}
	if st.WAL {
		dst = append(dst, `,"wal_bytes":`...)
		dst = strconv.AppendInt(dst, st.WALBytes, 10)
		dst = append(dst, `,"wal_pending":`...)
		dst = strconv.AppendInt(dst, int64(st.WALPending), 10)
	}
	return dst
}
