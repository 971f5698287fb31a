// Package storecheck holds only tests: it runs the trainer bridge on the same
// captured rows stored in ClickHouse and in the embedded SQLite store and
// checks that both give the same samples, so that the bridge's selection SQL
// and reading paths agree across stores.
package storecheck
