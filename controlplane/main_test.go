package controlplane_test

import (
	"testing"

	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

func TestMain(m *testing.M) { gatewaytest.Main(m) }
