package credit

import (
	"math"
	"testing"
)

func TestAssign(t *testing.T) {
	// Four calls, episode reward R = 1, process rewards p = [0, -0.5, 0, 0.25].
	// r = p + [t=last]R = [0, -0.5, 0, 1.25]
	p := []float64{0, -0.5, 0, 0.25}
	cases := []struct {
		m     Mode
		gamma float64
		want  []float64
	}{
		// R + p_t
		{Identical, 0, []float64{1, 0.5, 1, 1.25}},
		// r_t
		{LastOnly, 0, []float64{0, -0.5, 0, 1.25}},
		// G3 = 1.25; G2 = 0 + 0.5*1.25 = 0.625; G1 = -0.5 + 0.5*0.625 = -0.1875;
		// G0 = 0 + 0.5*(-0.1875) = -0.09375
		{Discounted, 0.5, []float64{-0.09375, -0.1875, 0.625, 1.25}},
		// gamma 1: suffix sums of r: [0.75, 0.75, 1.25, 1.25]
		{Discounted, 1, []float64{0.75, 0.75, 1.25, 1.25}},
		// gamma 0: G_t = r_t
		{Discounted, 0, []float64{0, -0.5, 0, 1.25}},
	}
	for _, c := range cases {
		got, err := Assign(c.m, 1, p, c.gamma)
		if err != nil {
			t.Fatal(err)
		}
		for i := range c.want {
			if math.Abs(got[i]-c.want[i]) > 1e-15 {
				t.Fatalf("%s gamma %v: got %v want %v", c.m, c.gamma, got, c.want)
			}
		}
	}
	// Without process rewards Identical is LightningRL: every call gets R.
	got, err := AssignN(Identical, 3, 0.7, nil, 0)
	if err != nil || got[0] != 0.7 || got[1] != 0.7 || got[2] != 0.7 {
		t.Fatalf("lightning: %v %v", got, err)
	}
	// Shorter process slice: missing entries are 0; discounted 0.9: G1 = 2, G0 = -1 + 0.9*2 = 0.8
	got, err = AssignN(Discounted, 2, 2, []float64{-1}, 0.9)
	if err != nil || math.Abs(got[0]-0.8) > 1e-15 || got[1] != 2 {
		t.Fatalf("short: %v %v", got, err)
	}
	if e := Episode(1, p); e != 0.75 {
		t.Fatalf("episode %v", e)
	}
	if _, err := Assign(Discounted, 1, p, 1.5); err == nil {
		t.Fatal("gamma 1.5 accepted")
	}
	if _, err := AssignN(Identical, 1, 1, p, 0); err == nil {
		t.Fatal("too many process rewards accepted")
	}
	if _, err := Assign("x", 1, p, 0); err == nil {
		t.Fatal("unknown mode accepted")
	}
	if out, err := AssignN(LastOnly, 0, 1, nil, 0); err != nil || len(out) != 0 {
		t.Fatal("empty rollout")
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"identical": Identical, "": Identical, "Discounted": Discounted, "last-call-only": LastOnly, "last": LastOnly} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q %v", in, got, err)
		}
	}
	if _, err := ParseMode("gae"); err == nil {
		t.Error("gae accepted")
	}
}
