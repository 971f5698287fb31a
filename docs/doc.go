// Package docs holds rollgate's documentation (Markdown files beside this
// one) and the tests that keep it true: docs_test.go checks that every route
// the gateway serves is in contract.md, and that no tracked file points
// outside the repository.
package docs
