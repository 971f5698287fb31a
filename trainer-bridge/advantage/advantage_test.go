package advantage

import (
	"math"
	"testing"
)

// The batch used by the golden tests: three groups interleaved.
//
//	index:  0    1    2    3    4    5
//	group:  a    c    a    b    a    c
//	score:  1    0    2    5    3    4
//	tokens: 2    1    1    1    2    3
//
// group a = {1,2,3}: mean 2, unbiased var ((1)+(0)+(1))/2 = 1, std 1
// group b = {5}:     a group of one: mean 0, std 1
// group c = {0,4}:   mean 2, unbiased var (4+4)/1 = 8, std 2*sqrt(2)
var (
	scores = []float64{1, 0, 2, 5, 3, 4}
	groups = []string{"a", "c", "a", "b", "a", "c"}
	tokens = []int{2, 1, 1, 1, 2, 3}
)

func TestGolden(t *testing.T) {
	sqrt2x2 := 2 * math.Sqrt2
	// REINFORCE++-baseline: centred x = s - mean_g = [-1, -2, 0, 5(b: mean 0), 1, 2]
	// token-weighted: N = 2+1+1+1+2+3 = 10, sum = -2-2+0+5+2+6 = 9, mu = 0.9
	// x - mu = [-1.9, -2.9, -0.9, 4.1, 0.1, 1.1]
	// sum w*(x-mu)^2 = 2*3.61 + 8.41 + 0.81 + 16.81 + 2*0.01 + 3*1.21 = 36.9
	// unbiased var = 36.9/9 = 4.1; A = (x - mu) / sqrt(4.1 + 1e-8)
	den := math.Sqrt(4.1 + 1e-8)
	cases := []struct {
		e    Estimator
		want []float64
	}{
		// (s - mean)/(std + 1e-6)
		{GRPO, []float64{-1 / (1 + 1e-6), -2 / (sqrt2x2 + 1e-6), 0, 5 / (1 + 1e-6), 1 / (1 + 1e-6), 2 / (sqrt2x2 + 1e-6)}},
		// s - mean
		{DrGRPO, []float64{-1, -2, 0, 5, 1, 2}},
		// a: s - mean(others): 1-(2+3)/2 = -1.5, 2-(1+3)/2 = 0, 3-(1+2)/2 = 1.5
		// c: 0-4 = -4, 4-0 = 4; b: group of one, A = s = 5
		{RLOO, []float64{-1.5, -4, 0, 5, 1.5, 4}},
		{ReinforcePP, []float64{-1.9 / den, -2.9 / den, -0.9 / den, 4.1 / den, 0.1 / den, 1.1 / den}},
		{None, []float64{1, 0, 2, 5, 3, 4}},
	}
	for _, c := range cases {
		t.Run(string(c.e), func(t *testing.T) {
			r, err := Compute(c.e, Input{Scores: scores, Groups: groups, Tokens: tokens}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range c.want {
				if math.Abs(r.Advantages[i]-w) > 1e-12 || !r.Keep[i] {
					t.Errorf("sample %d: got %v (keep %v), want %v", i, r.Advantages[i], r.Keep[i], w)
				}
			}
		})
	}
}

func TestGRPOSpotValues(t *testing.T) {
	// Literal values, in case the formula in the golden test were wrong in the
	// same way as the code: (0-2)/(2*sqrt(2)+1e-6) = -0.70710653...
	r, err := Compute(GRPO, Input{Scores: scores, Groups: groups}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Advantages[1]; math.Abs(got-(-0.7071065311)) > 1e-9 {
		t.Fatalf("c[0] = %.10f", got)
	}
	if got := r.Advantages[3]; math.Abs(got-4.999995000005) > 1e-9 {
		t.Fatalf("b = %.12f", got)
	}
}

func TestReinforcePPUnitTokens(t *testing.T) {
	// Tokens nil = one token per sample. x = [-1, -2, 0, 5, 1, 2], mu = 5/6,
	// deviations^2 sum = sum x^2 - 6 mu^2 = (1+4+0+25+1+4) - 25/6 = 35 - 4.1666.. = 30.8333..
	// var = 30.8333../5 = 6.1666..; A_3 = (5 - 5/6)/sqrt(6.1666..+1e-8)
	r, err := Compute(ReinforcePP, Input{Scores: scores, Groups: groups}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := (5 - 5.0/6) / math.Sqrt(185.0/30+1e-8)
	if math.Abs(r.Advantages[3]-want) > 1e-12 {
		t.Fatalf("got %v want %v", r.Advantages[3], want)
	}
	var sum float64
	for _, a := range r.Advantages {
		sum += a
	}
	if math.Abs(sum) > 1e-12 {
		t.Fatalf("whitened advantages should sum to 0, got %v", sum)
	}
}

func TestDropZeroVariance(t *testing.T) {
	// group z = {2, 2}: all equal, dropped; s = {7} a group of one, kept.
	in := Input{Scores: []float64{2, 7, 2, 1, 3}, Groups: []string{"z", "s", "z", "y", "y"}}
	r, err := Compute(DrGRPO, in, Options{DropZeroVariance: true})
	if err != nil {
		t.Fatal(err)
	}
	wantKeep := []bool{false, true, false, true, true}
	wantAdv := []float64{0, 7, 0, -1, 1}
	for i := range wantKeep {
		if r.Keep[i] != wantKeep[i] || r.Advantages[i] != wantAdv[i] {
			t.Fatalf("sample %d: keep %v adv %v", i, r.Keep[i], r.Advantages[i])
		}
	}
	if r.DroppedGroups != 1 {
		t.Fatalf("dropped %d", r.DroppedGroups)
	}
	// REINFORCE++ whitens over kept samples only: x = [7, -1, 1], mu = 7/3,
	// dev = [14/3, -10/3, -4/3], ss = (196+100+16)/9 = 312/9, var = 312/18
	r, err = Compute(ReinforcePP, in, Options{DropZeroVariance: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := (14.0 / 3) / math.Sqrt(312.0/18+1e-8); math.Abs(r.Advantages[1]-want) > 1e-12 || r.Advantages[0] != 0 {
		t.Fatalf("got %v, want [1]=%v", r.Advantages, want)
	}
}

func TestRLOOMatchesLeaveOneOut(t *testing.T) {
	s := []float64{0.3, -1.2, 4.5, 2.25, 0, 9}
	g := []string{"x", "x", "x", "x", "x", "x"}
	r, err := Compute(RLOO, Input{Scores: s, Groups: g}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range s {
		var others float64
		for j := range s {
			if j != i {
				others += s[j]
			}
		}
		if want := s[i] - others/5; math.Abs(r.Advantages[i]-want) > 1e-12 {
			t.Fatalf("%d: %v want %v", i, r.Advantages[i], want)
		}
	}
}

func TestErrors(t *testing.T) {
	for name, in := range map[string]Input{
		"groups":  {Scores: []float64{1}, Groups: nil},
		"tokens":  {Scores: []float64{1}, Groups: []string{"a"}, Tokens: []int{1, 2}},
		"nan":     {Scores: []float64{math.NaN()}, Groups: []string{"a"}},
		"whiten1": {Scores: []float64{1}, Groups: []string{"a"}, Tokens: []int{1}},
	} {
		e := GRPO
		if name == "whiten1" {
			e = ReinforcePP
		}
		if _, err := Compute(e, in, Options{}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := Compute("bogus", Input{Scores: []float64{1}, Groups: []string{"a"}}, Options{}); err == nil {
		t.Error("unknown estimator accepted")
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]Estimator{"GRPO": GRPO, "dr_grpo": DrGRPO, "Dr.GRPO": DrGRPO, "rloo": RLOO,
		"reinforce++-baseline": ReinforcePP, "reinforce_plus_plus_baseline": ReinforcePP, "none": None} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := Parse("gae"); err == nil {
		t.Error("gae accepted")
	}
}

func BenchmarkGRPO(b *testing.B) {
	n := 4096
	in := Input{Scores: make([]float64, n), Groups: make([]string, n)}
	for i := range n {
		in.Scores[i] = float64(i % 7)
		in.Groups[i] = string(rune('a' + i%64))
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compute(GRPO, in, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
