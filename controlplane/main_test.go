package controlplane_test

import (
	"testing"

	"github.com/rollgate/rollgate/internal/gatewaytest"
)

func TestMain(m *testing.M) { gatewaytest.Main(m) }
